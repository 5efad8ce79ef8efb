//! The `karpenter.sh/v1` CRDs kpssh prints (`kpssh crds --karpenter`, upstream's own) against a
//! real kube-apiserver: durations the controller cannot parse (`consolidateAfter: 5min`,
//! `expireAfter: 30d`), unknown operators and upstream's CEL rules are rejected at admission
//! with 422 Invalid instead of being misread as 0 or "never" later; and what kpssh writes
//! (a NodeClaim built from a NodePool, its status) is admitted and read back unchanged.

#[path = "support/controlplane.rs"]
mod controlplane;

use controlplane::ControlPlane;
use kpssh::api::crds;
use kube::api::{Api, DynamicObject, PostParams};
use kube::core::{ApiResource, GroupVersionKind};
use serde_json::{Value, json};

/// A valid NodePool (upstream's required `requirements` and `consolidateAfter` filled in)
/// with `disruption` and `template_spec` merged over it; a `null` removes a key.
fn nodepool(name: &str, disruption: Value, template_spec: Value) -> DynamicObject {
    let mut spec = json!({
        "nodeClassRef": {"group": "karpenter.dklesev.github.io", "kind": "SSHNodeClass", "name": "c"},
        "requirements": [],
    });
    let mut disruption_base = json!({"consolidateAfter": "0s"});
    for (base, over) in [
        (&mut spec, &template_spec),
        (&mut disruption_base, &disruption),
    ] {
        if let (Some(b), Some(o)) = (base.as_object_mut(), over.as_object()) {
            for (k, v) in o {
                if v.is_null() {
                    b.remove(k);
                } else {
                    b.insert(k.clone(), v.clone());
                }
            }
        }
    }
    let disruption = disruption_base;
    serde_json::from_value(json!({
        "apiVersion": "karpenter.sh/v1",
        "kind": "NodePool",
        "metadata": {"name": name},
        "spec": {"template": {"spec": spec}, "disruption": disruption},
    }))
    .expect("nodepool")
}

async fn create(api: &Api<DynamicObject>, o: &DynamicObject) -> Result<(), String> {
    match api.create(&PostParams::default(), o).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(e)) if e.code == 422 => Err(e.message),
        Err(e) => panic!("unexpected error: {e}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn karpenter_crds_reject_unparsable_durations_and_operators_at_admission() {
    let cp = ControlPlane::shared();
    cp.install_crds(&crds::to_yaml(&crds::karpenter_crds()).expect("yaml"))
        .await;
    let client = cp.client().await;
    let ar = ApiResource::from_gvk(&GroupVersionKind::gvk("karpenter.sh", "v1", "NodePool"));
    let api: Api<DynamicObject> = Api::all_with(client, &ar);

    let ok = nodepool(
        "ka-ok",
        json!({"consolidateAfter": "1h30m", "consolidationPolicy": "WhenEmpty",
               "budgets": [{"nodes": "10%", "duration": "1h30m", "schedule": "@daily"}]}),
        json!({"expireAfter": "720h", "terminationGracePeriod": "48h",
               "requirements": [{"key": "kubernetes.io/arch", "operator": "In", "values": ["amd64"]}]}),
    );
    create(&api, &ok)
        .await
        .expect("a valid NodePool is accepted");
    let never = nodepool(
        "ka-never",
        json!({"consolidateAfter": "Never"}),
        json!({"expireAfter": "Never"}),
    );
    create(&api, &never).await.expect("Never is accepted");
    // Karpenter's own operators beyond the scheduler's.
    let gte = nodepool(
        "ka-gte",
        json!({"consolidateAfter": "0s"}),
        json!({"requirements": [{"key": "cores", "operator": "Gte", "values": ["4"]}]}),
    );
    create(&api, &gte).await.expect("Gte is accepted");

    let cases = [
        (
            "ka-5min",
            json!({"consolidateAfter": "5min"}),
            json!({}),
            "consolidateAfter",
        ),
        (
            "ka-30d",
            json!({}),
            json!({"expireAfter": "30d"}),
            "expireAfter",
        ),
        (
            "ka-tgp",
            json!({}),
            json!({"terminationGracePeriod": "1d"}),
            "terminationGracePeriod",
        ),
        (
            "ka-op",
            json!({}),
            json!({"requirements": [{"key": "k", "operator": "Equals", "values": ["x"]}]}),
            "operator",
        ),
        (
            "ka-policy",
            json!({"consolidationPolicy": "Always"}),
            json!({}),
            "consolidationPolicy",
        ),
        (
            "ka-budget",
            json!({"budgets": [{"nodes": "150%"}]}),
            json!({}),
            "nodes",
        ),
        // Upstream's CEL rules, which a schema of patterns alone did not have.
        (
            "ka-in-empty",
            json!({}),
            json!({"requirements": [{"key": "k", "operator": "In", "values": []}]}),
            "must have a value defined",
        ),
        (
            "ka-restricted",
            json!({}),
            json!({"requirements": [{"key": "karpenter.sh/custom", "operator": "Exists"}]}),
            "restricted",
        ),
        (
            "ka-no-after",
            json!({"consolidationPolicy": "WhenEmpty", "consolidateAfter": null}),
            json!({}),
            "consolidateAfter",
        ),
    ];
    for (name, disruption, template, field) in cases {
        let err = create(&api, &nodepool(name, disruption, template))
            .await
            .expect_err(name);
        assert!(err.contains(field), "{name}: {err}");
    }
}

/// What kpssh writes passes upstream's schema and comes back as written: the shipped example
/// NodePool, a NodeClaim built from it as provisioning builds one, and a NodeClaim status as
/// the lifecycle writes it (nothing pruned, nothing refused).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn what_kpssh_writes_is_admitted_and_read_back_unchanged() {
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
    use kpssh::api::karpenter::{INSTANCE_TYPE_LABEL, NodeSelectorRequirement, ZONE_LABEL};
    use kpssh::api::{NodeClaim, NodeClaimStatus, NodePool};
    use kpssh::k8s::{Cluster, KubeCluster};
    use kpssh::karpenter::provisioning::solve::pack;
    use kpssh::karpenter::provisioning::{PoolOffer, build_claim};
    use kpssh::karpenter::scheduling::PodInfo;
    use kpssh::provider::instance_types::{InstanceType, Offering};

    let cp = ControlPlane::shared();
    cp.install_crds(&crds::karpenter_crds_yaml()).await;
    let cluster = KubeCluster::new(cp.client().await);
    let text = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/examples/nodepool.yaml"
    ))
    .expect("examples/nodepool.yaml");
    let mut pool: NodePool = serde_yaml::from_str(&text).expect("example NodePool");
    pool.metadata.name = Some("ka-roundtrip".into());
    // S55: requirements a NodeClaim gets narrowed, minValues and bounds included.
    let req = |k: &str, op: &str, v: &[&str], min: Option<i32>| NodeSelectorRequirement {
        key: k.into(),
        operator: op.into(),
        values: v.iter().map(|s| s.to_string()).collect(),
        min_values: min,
    };
    pool.spec.template.spec.requirements.extend([
        req("team", "In", &["a", "b"], None),
        req("example.com/gen", "Gt", &["3"], None),
        req("example.com/tier", "Exists", &[], None),
        req(INSTANCE_TYPE_LABEL, "In", &["c8-m32", "c4-m16"], Some(2)),
    ]);
    let pool = cluster
        .create(&pool)
        .await
        .expect("example NodePool admitted");
    // As provisioning builds one: the solver's NodeClaim for a pod that asks for team b, over
    // two instance types in two zones.
    let it = |name: &str, cpu: i128| InstanceType {
        name: name.into(),
        arch: "amd64".into(),
        capacity: [("cpu".to_string(), cpu), ("memory".to_string(), cpu << 32)].into(),
        largest: [("cpu".to_string(), cpu), ("memory".to_string(), cpu << 32)].into(),
        max_pods: 110,
        price: cpu as f64,
        claimable: 2,
        usable: 2,
        offerings: ["a", "b"]
            .iter()
            .map(|z| Offering {
                labels: [(ZONE_LABEL.to_string(), z.to_string())].into(),
                claimable: 1,
                usable: 1,
            })
            .collect(),
    };
    let class = kpssh::sim::world::node_class("bare-metal", "p");
    let offers = [PoolOffer::new(
        &pool,
        &class,
        vec![it("c8-m32", 8000), it("c4-m16", 4000)],
        &[],
    )];
    let mut p = kpssh::sim::world::pod("p", "1500m", "2Gi");
    p.spec.as_mut().expect("spec").node_selector =
        Some([("team".to_string(), "b".to_string())].into());
    let pods = [PodInfo::new(&p)];
    let budgets = [("c8-m32".to_string(), 2), ("c4-m16".to_string(), 2)].into();
    let outcome = pack(&pods, &offers, budgets, Default::default());
    assert!(outcome.unplaced.is_empty(), "{:?}", outcome.unplaced);
    let built = build_claim(&pool, "ka-roundtrip-x1y2z", &outcome.claims[0]);
    let reqs = &built.spec.requirements;
    assert!(
        reqs.iter().any(|r| r.key == "team" && r.values == ["b"]),
        "{reqs:?}"
    );
    assert!(
        reqs.iter().any(|r| r.key == INSTANCE_TYPE_LABEL
            && r.values == ["c4-m16", "c8-m32"]
            && r.min_values == Some(2)),
        "{reqs:?}"
    );
    let created = cluster
        .create(&built)
        .await
        .expect("built NodeClaim admitted");
    assert_eq!(created.spec, built.spec, "the API server changed the spec");
    assert_eq!(created.metadata.labels, built.metadata.labels);

    let at = Time(jiff::Timestamp::from_second(1_780_000_000).expect("time"));
    let cond = |t: &str, s: &str, r: &str, m: &str| Condition {
        type_: t.into(),
        status: s.into(),
        reason: r.into(),
        message: m.into(),
        observed_generation: None,
        last_transition_time: at.clone(),
    };
    let mut with_status = created.clone();
    with_status.status = Some(NodeClaimStatus {
        node_name: Some("node-7".into()),
        provider_id: Some("kpssh://kpssh-system/node-7".into()),
        image_id: Some("tls-bootstrap@1".into()),
        capacity: [("cpu".to_string(), Quantity("8".into()))].into(),
        allocatable: [("cpu".to_string(), Quantity("7920m".into()))].into(),
        conditions: vec![
            cond("Launched", "True", "Launched", ""),
            cond(
                "Registered",
                "Unknown",
                "AwaitingNode",
                "waiting for Node node-7 until 2026-05-28T20:00:00Z",
            ),
            cond(
                "Ready",
                "False",
                "NotReady",
                "not launched, registered and initialized yet",
            ),
        ],
        last_pod_event_time: Some(at.clone()),
        ..Default::default()
    });
    let written = cluster
        .replace_status(&with_status)
        .await
        .expect("status admitted");
    let read: NodeClaim = cluster
        .get(None, "ka-roundtrip-x1y2z")
        .await
        .expect("get")
        .expect("there");
    assert_eq!(
        read.status, with_status.status,
        "the API server pruned status"
    );
    assert_eq!(written.status, with_status.status);
}
