//! The generated `karpenter.sh/v1` CRDs (`kpssh crds --karpenter`) against a real
//! kube-apiserver: durations the controller cannot parse (`consolidateAfter: 5min`,
//! `expireAfter: 30d`) and unknown operators are rejected at admission with 422 Invalid, as
//! upstream's CRDs reject them, instead of being misread as 0 or "never" later.

#[path = "support/controlplane.rs"]
mod controlplane;

use controlplane::ControlPlane;
use kpssh::api::crds;
use kube::api::{Api, DynamicObject, PostParams};
use kube::core::{ApiResource, GroupVersionKind};
use serde_json::{Value, json};

fn nodepool(name: &str, disruption: Value, template_spec: Value) -> DynamicObject {
    let mut spec = json!({
        "nodeClassRef": {"group": "karpenter.dklesev.github.io", "kind": "SSHNodeClass", "name": "c"},
    });
    if let (Some(s), Some(extra)) = (spec.as_object_mut(), template_spec.as_object()) {
        s.extend(extra.clone());
    }
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
    ];
    for (name, disruption, template, field) in cases {
        let err = create(&api, &nodepool(name, disruption, template))
            .await
            .expect_err(name);
        assert!(err.contains(field), "{name}: {err}");
    }
}
