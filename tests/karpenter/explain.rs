//! S63/S64 on the provisioning side: a NodePool whose node class cannot launch (no cluster
//! endpoint) creates no NodeClaim at all, instead of creating and deleting one every round;
//! the pending pod's event names the NodePool and tells "class not Ready", "no host" and
//! "hosts unhealthy or backing off" apart; a NodePool that is not valid or names a missing node
//! class says so in its conditions (core's ValidationSucceeded / NodeClassReady / Ready).

use kpssh::api::{NodeClaim, SSHNodeClass};
use kpssh::k8s::Cluster;
use serde_json::json;

use super::*;

/// The FailedProvisioning event of pod `name`, once there is one.
async fn pod_event(e: &Env, name: &str) -> Option<String> {
    e.w.cluster
        .events()
        .into_iter()
        .find(|ev| ev.reason == "FailedProvisioning" && ev.regarding.name == name)
        .map(|ev| ev.message)
}

async fn ready_reason(e: &Env) -> Option<String> {
    let class: Option<SSHNodeClass> = e.w.cluster.get(None, "pool").await.expect("get");
    class
        .and_then(|c| c.status)
        .and_then(|s| s.conditions.into_iter().find(|c| c.type_ == "Ready"))
        .map(|c| c.reason)
}

#[tokio::test(start_paused = true)]
async fn s63_s64_a_class_without_cluster_endpoint_creates_no_nodeclaims_and_says_why() {
    let e = env().await;
    hosts(&e, "h", "small", 1, 2, 4, 50).await;
    // Neither spec.cluster nor kube-public/cluster-info: every launch would fail.
    let _: SSHNodeClass =
        e.w.cluster
            .patch(None, "pool", &json!({"spec": {"cluster": null}}))
            .await
            .expect("drop spec.cluster");
    let ok =
        e.w.until(MINUTE, || async {
            ready_reason(&e).await.as_deref() == Some("NoClusterEndpoint")
        })
        .await;
    assert!(
        ok,
        "class Ready=False NoClusterEndpoint: {:?}",
        ready_reason(&e).await
    );
    assert!(
        e.w.cluster
            .events()
            .iter()
            .any(|ev| ev.reason == "NoClusterEndpoint"),
        "an event on the class"
    );
    e.w.cluster
        .create(&nodepool("default"))
        .await
        .expect("nodepool");
    e.w.cluster
        .create(&pod("p0", "1", "1Gi"))
        .await
        .expect("pod");
    // Five minutes of provisioning rounds: not one NodeClaim.
    for _ in 0..30 {
        tokio::time::sleep(std::time::Duration::from_secs(10)).await;
        let claims: Vec<NodeClaim> = e.w.cluster.list(None, None).await.expect("list");
        assert!(
            claims.is_empty(),
            "no NodeClaim for a class that cannot launch"
        );
    }
    assert!(
        !e.w.cluster
            .events()
            .iter()
            .any(|ev| ev.reason == "Launching"),
        "nothing launched"
    );
    let msg = pod_event(&e, "p0").await.expect("an event on the pod");
    assert!(
        msg.contains("NodePool default: SSHNodeClass pool is not Ready (NoClusterEndpoint)"),
        "{msg}"
    );
    assert!(msg.contains("spec.cluster"), "the fix is named: {msg}");
    // Publishing kube-public/cluster-info makes the class Ready and the pod gets its node.
    let cm = k8s_openapi::api::core::v1::ConfigMap {
        metadata: kube::api::ObjectMeta {
            name: Some("cluster-info".into()),
            namespace: Some("kube-public".into()),
            ..Default::default()
        },
        data: Some(std::collections::BTreeMap::from([(
            "kubeconfig".to_string(),
            "clusters:\n- cluster:\n    server: https://10.0.0.1:6443\n    certificate-authority-data: Q0E=\n  name: ''\n".to_string(),
        )])),
        ..Default::default()
    };
    e.w.cluster.create(&cm).await.expect("cluster-info");
    let ok =
        e.w.until(2 * MINUTE, || async {
            ready_reason(&e).await.as_deref() == Some("Ready")
        })
        .await;
    assert!(
        ok,
        "Ready once cluster-info exists: {:?}",
        ready_reason(&e).await
    );
    let ok =
        e.w.until(3 * MINUTE, || async { running(&e).await == 1 })
            .await;
    assert!(ok, "the pod runs");
}

#[tokio::test(start_paused = true)]
async fn s64_the_pod_is_told_no_host_apart_from_unhealthy_hosts() {
    let e = env().await;
    e.w.cluster
        .create(&nodepool("default"))
        .await
        .expect("nodepool");
    e.w.cluster
        .create(&pod("lonely", "1", "1Gi"))
        .await
        .expect("pod");
    let ok =
        e.w.until(MINUTE, || async { pod_event(&e, "lonely").await.is_some() })
            .await;
    assert!(ok, "an event on the pod");
    let msg = pod_event(&e, "lonely").await.unwrap_or_default();
    assert!(
        msg.contains("NodePool default: no SSHHost matches SSHNodeClass pool's hostSelector"),
        "{msg}"
    );
    // A host that cannot be reached: Unhealthy, and the next pod is told so.
    hosts(&e, "h", "small", 1, 2, 4, 51).await;
    e.w.transport
        .with("10.51.0.1", |h| h.reachable = false)
        .expect("sim host");
    let ok =
        e.w.until(5 * MINUTE, || async {
            host_states(&e).await.get(&HostState::Unhealthy) == Some(&1)
        })
        .await;
    assert!(ok, "host Unhealthy");
    e.w.cluster
        .create(&pod("unlucky", "1", "1Gi"))
        .await
        .expect("pod");
    let ok =
        e.w.until(MINUTE, || async {
            pod_event(&e, "unlucky").await.is_some()
        })
        .await;
    assert!(ok, "an event on the second pod");
    let msg = pod_event(&e, "unlucky").await.unwrap_or_default();
    assert!(
        msg.contains(
            "NodePool default: none of the 1 hosts of SSHNodeClass pool is free (1 Unhealthy)"
        ),
        "{msg}"
    );
}

/// The NodePool's conditions (Karpenter core's readiness and validation controllers).
async fn pool_conditions(e: &Env, name: &str) -> BTreeMap<String, (String, String, String)> {
    let pool: Option<kpssh::api::NodePool> = e.w.cluster.get(None, name).await.expect("get");
    pool.and_then(|p| p.status)
        .map(|s| s.conditions)
        .unwrap_or_default()
        .into_iter()
        .map(|c| (c.type_, (c.status, c.reason, c.message)))
        .collect()
}

async fn pool_ready(e: &Env, name: &str) -> bool {
    pool_conditions(e, name)
        .await
        .get("Ready")
        .is_some_and(|c| c.0 == "True")
}

/// A NodePool with an unknown requirement operator, and one whose node class does not exist:
/// neither launches; each says why in its conditions (ValidationSucceeded / NodeClassReady,
/// and Ready=False naming them), with a Warning event on the NodePool, and the pending pod's
/// event names both NodePools and why. Fixed, the NodePool goes Ready and the pod runs.
#[tokio::test(start_paused = true)]
async fn s64_an_invalid_nodepool_or_a_missing_class_says_why_in_its_conditions() {
    let e = env().await;
    hosts(&e, "h", "small", 1, 2, 4, 52).await;
    let mut bad_op = nodepool("bad-op");
    bad_op.spec.template.spec.requirements = vec![kpssh::api::karpenter::NodeSelectorRequirement {
        key: "kubernetes.io/arch".into(),
        operator: "Equals".into(),
        values: vec!["amd64".into()],
        min_values: None,
    }];
    e.w.cluster.create(&bad_op).await.expect("nodepool");
    let mut orphan = nodepool("orphan");
    orphan.spec.template.spec.node_class_ref.name = "missing".into();
    e.w.cluster.create(&orphan).await.expect("nodepool");
    e.w.cluster
        .create(&pod("p0", "1", "1Gi"))
        .await
        .expect("pod");
    let ok =
        e.w.until(MINUTE, || async {
            // The class goes Ready once it has seen its probed host; the NodePool follows.
            pool_conditions(&e, "bad-op")
                .await
                .get("NodeClassReady")
                .is_some_and(|c| c.0 == "True")
                && pool_conditions(&e, "orphan").await.contains_key("Ready")
                && pod_event(&e, "p0").await.is_some()
        })
        .await;
    assert!(ok, "conditions and the pod's event");
    let bad = pool_conditions(&e, "bad-op").await;
    let (status, reason, msg) = &bad["ValidationSucceeded"];
    assert_eq!(
        (status.as_str(), reason.as_str()),
        ("False", "NodePoolValidationFailed")
    );
    assert!(msg.contains("unsupported operator Equals"), "{msg}");
    assert_eq!(bad["NodeClassReady"].0, "True", "{bad:?}");
    assert_eq!(
        bad["Ready"],
        (
            "False".into(),
            "UnhealthyDependents".into(),
            "ValidationSucceeded=False".into()
        )
    );
    let orphan = pool_conditions(&e, "orphan").await;
    let (status, reason, msg) = &orphan["NodeClassReady"];
    assert_eq!(
        (status.as_str(), reason.as_str()),
        ("False", "NodeClassNotFound")
    );
    assert!(msg.contains("SSHNodeClass missing"), "{msg}");
    assert_eq!(orphan["ValidationSucceeded"].0, "True");
    assert_eq!(orphan["Ready"].2, "NodeClassReady=False");
    // A Warning event on each NodePool, of the failing condition's reason.
    let events = e.w.cluster.events();
    for (pool, reason) in [
        ("bad-op", "NodePoolValidationFailed"),
        ("orphan", "NodeClassNotFound"),
    ] {
        assert!(
            events.iter().any(|ev| ev.regarding.kind == "NodePool"
                && ev.regarding.name == pool
                && ev.reason == reason),
            "{pool}: {reason} event"
        );
    }
    let msg = pod_event(&e, "p0").await.unwrap_or_default();
    assert!(
        msg.contains("NodePool bad-op is not valid (ValidationSucceeded=False): invalid value: key kubernetes.io/arch has an unsupported operator Equals"),
        "{msg}"
    );
    assert!(
        msg.contains(
            "NodePool orphan: SSHNodeClass missing (spec.template.spec.nodeClassRef) not found"
        ),
        "{msg}"
    );
    assert!(claims(&e).await.is_empty(), "nothing launched");

    // Fixed: the operator corrected, the NodePool goes Ready and the pod gets its node.
    let _: kpssh::api::NodePool =
        e.w.cluster
            .patch(
                None,
                "bad-op",
                &json!({"spec": {"template": {"spec": {"requirements": [
                {"key": "kubernetes.io/arch", "operator": "In", "values": ["amd64"]}]}}}}),
            )
            .await
            .expect("fix");
    let ok =
        e.w.until(MINUTE, || async {
            pool_conditions(&e, "bad-op")
                .await
                .get("Ready")
                .map(|c| c.0.as_str())
                == Some("True")
        })
        .await;
    assert!(
        ok,
        "Ready once valid: {:?}",
        pool_conditions(&e, "bad-op").await
    );
    let ok =
        e.w.until(3 * MINUTE, || async { running(&e).await == 1 })
            .await;
    assert!(ok, "the pod runs");
}

/// A restarted controller (the karpenter layer started again, as after a crash) never calls an
/// existing node class missing while its first list of classes is on the way: the NodePool
/// stays Ready, without a `NodeClassNotFound` condition or event in between.
#[tokio::test(start_paused = true)]
async fn s64_a_restarted_controller_does_not_call_an_existing_class_missing() {
    let mut e = env().await;
    hosts(&e, "h", "small", 1, 2, 4, 53).await;
    e.w.cluster
        .create(&nodepool("default"))
        .await
        .expect("nodepool");
    assert!(
        e.w.until(MINUTE, || pool_ready(&e, "default")).await,
        "Ready at first"
    );
    for _ in 0..5 {
        e.k.stop();
        e.k = kpssh::karpenter::spawn_with(&e.w.ctx, KarpenterConfig::default())
            .await
            .expect("karpenter again");
        tokio::time::sleep(std::time::Duration::from_secs(5)).await;
        assert!(
            pool_ready(&e, "default").await,
            "{:?}",
            pool_conditions(&e, "default").await
        );
    }
    assert!(
        !reasons(&e).iter().any(|r| r == "NodeClassNotFound"),
        "{:?}",
        reasons(&e)
    );
}
