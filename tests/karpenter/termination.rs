//! S40: termination drains through the Eviction API honouring PDBs before leave.

use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::policy::v1::{PodDisruptionBudget, PodDisruptionBudgetSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kpssh::api::HostState;
use kpssh::api::karpenter::{DISRUPTED_TAINT_KEY, DO_NOT_DISRUPT_ANNOTATION};
use kpssh::k8s::Cluster;

use super::*;

/// `minAvailable: 1` over the `app=web` pods of `default`.
pub fn pdb() -> PodDisruptionBudget {
    PodDisruptionBudget {
        metadata: kube::api::ObjectMeta {
            name: Some("web".into()),
            namespace: Some("default".into()),
            ..Default::default()
        },
        spec: Some(PodDisruptionBudgetSpec {
            min_available: Some(IntOrString::Int(1)),
            selector: Some(LabelSelector {
                match_labels: Some([("app".to_string(), "web".to_string())].into()),
                ..Default::default()
            }),
            ..Default::default()
        }),
        status: None,
    }
}

/// A NodePool `default` and one node running `p`; the NodeClaim's name.
pub async fn one_node(e: &Env, p: k8s_openapi::api::core::v1::Pod) -> String {
    one_node_in(e, nodepool("default"), p).await
}

/// NodePool `np` and one node of it running `p`; the NodeClaim's name.
pub async fn one_node_in(
    e: &Env,
    np: kpssh::api::NodePool,
    p: k8s_openapi::api::core::v1::Pod,
) -> String {
    e.w.cluster.create(&np).await.expect("np");
    e.w.cluster.create(&p).await.expect("pod");
    assert!(
        e.w.until(3 * MINUTE, || async { running(e).await == 1 })
            .await
    );
    claims(e).await[0].metadata.name.clone().expect("name")
}

#[tokio::test(start_paused = true)]
async fn s40_pdb_blocks_eviction_and_leave_waits_for_the_drain() {
    let e = env().await;
    hosts(&e, "h", "small", 1, 2, 4, 60).await;
    let name = one_node(&e, pod("web-0", "500m", "256Mi")).await;
    e.w.cluster.create(&pdb()).await.expect("pdb");
    mark(&e, &name).await;
    tokio::time::sleep(2 * MINUTE).await;
    let node: Node =
        e.w.cluster
            .get(None, &name)
            .await
            .expect("get")
            .expect("node");
    let taints = node.spec.and_then(|s| s.taints).unwrap_or_default();
    assert!(
        taints
            .iter()
            .any(|t| t.key == DISRUPTED_TAINT_KEY && t.effect == "NoSchedule")
    );
    assert_eq!(pods(&e).await.len(), 1, "the PDB holds the pod");
    assert_eq!(
        host_states(&e).await.get(&HostState::InUse),
        Some(&1),
        "no leave yet"
    );
    e.w.cluster
        .delete::<PodDisruptionBudget>(Some("default"), "web", None)
        .await
        .expect("drop pdb");
    let ok =
        e.w.until(5 * MINUTE, || async {
            host_states(&e).await.get(&HostState::Available) == Some(&1)
                && claims(&e).await.is_empty()
        })
        .await;
    assert!(ok, "drained, left, released: {:?}", host_states(&e).await);
    let node: Option<Node> = e.w.cluster.get(None, &name).await.expect("get");
    assert!(node.is_none(), "Node deleted after leave");
    assert!(pods(&e).await.is_empty(), "pod evicted");
    assert!(reasons(&e).iter().any(|r| r == "Drained"));
}

#[tokio::test(start_paused = true)]
async fn s40_do_not_disrupt_pod_waits_for_termination_grace_period() {
    let e = env().await;
    hosts(&e, "h", "small", 1, 2, 4, 61).await;
    let mut p = pod("batch", "500m", "256Mi");
    p.metadata.annotations =
        Some([(DO_NOT_DISRUPT_ANNOTATION.to_string(), "true".to_string())].into());
    let mut np = nodepool("default");
    np.spec.template.spec.termination_grace_period = Some("5m".into());
    e.w.cluster.create(&np).await.expect("np");
    e.w.cluster.create(&p).await.expect("pod");
    assert!(
        e.w.until(3 * MINUTE, || async { running(&e).await == 1 })
            .await
    );
    let name = claims(&e).await[0].metadata.name.clone().expect("name");
    mark(&e, &name).await;
    tokio::time::sleep(3 * MINUTE).await;
    assert_eq!(
        pods(&e).await.len(),
        1,
        "do-not-disrupt holds within the grace period"
    );
    let ok =
        e.w.until(6 * MINUTE, || async {
            pods(&e).await.is_empty()
                && host_states(&e).await.get(&HostState::Available) == Some(&1)
        })
        .await;
    assert!(ok, "grace period over: pod deleted, host back");
}
