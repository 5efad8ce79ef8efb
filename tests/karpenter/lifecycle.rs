//! S37: registration, initialization, registration timeout.

use k8s_openapi::api::core::v1::{Node, Taint};
use kpssh::api::NodeClaim;
use kpssh::api::karpenter::{REGISTERED_LABEL, UNREGISTERED_TAINT_KEY};
use kpssh::k8s::Cluster;
use kpssh::sim::world::node_claim;

use super::*;

fn cond(nc: &NodeClaim, t: &str) -> Option<(String, String)> {
    nc.status.as_ref().and_then(|s| {
        s.conditions
            .iter()
            .find(|c| c.type_ == t)
            .map(|c| (c.status.clone(), c.reason.clone()))
    })
}

#[tokio::test(start_paused = true)]
async fn s37_registered_then_initialized_when_startup_taints_go() {
    let e = env().await;
    hosts(&e, "h", "small", 1, 2, 4, 50).await;
    let mut np = nodepool("default");
    np.spec.template.spec.startup_taints = Some(vec![Taint {
        key: "example.com/warming".into(),
        value: None,
        effect: "NoSchedule".into(),
        time_added: None,
    }]);
    e.w.cluster.create(&np).await.expect("np");
    e.w.cluster
        .create(&pod("p", "500m", "256Mi"))
        .await
        .expect("pod");
    let ok =
        e.w.until(3 * MINUTE, || async {
            claims(&e)
                .await
                .first()
                .and_then(|nc| cond(nc, "Registered"))
                == Some(("True".into(), "Registered".into()))
        })
        .await;
    assert!(ok, "registered");
    let nc = claims(&e).await.remove(0);
    let name = nc.metadata.name.clone().expect("name");
    assert_eq!(
        nc.status.as_ref().and_then(|s| s.node_name.clone()),
        Some(name.clone())
    );
    assert_eq!(
        cond(&nc, "Initialized").map(|c| c.1),
        Some("StartupTaintsExist".into())
    );
    let node: Node =
        e.w.cluster
            .get(None, &name)
            .await
            .expect("get")
            .expect("node");
    let labels = node.metadata.labels.clone().unwrap_or_default();
    assert_eq!(
        labels.get(REGISTERED_LABEL).map(String::as_str),
        Some("true")
    );
    let taints = node
        .spec
        .as_ref()
        .and_then(|s| s.taints.clone())
        .unwrap_or_default();
    assert!(!taints.iter().any(|t| t.key == UNREGISTERED_TAINT_KEY));
    assert!(
        node.metadata
            .owner_references
            .iter()
            .flatten()
            .any(|o| o.kind == "NodeClaim")
    );
    // The startup taint goes (as a gate or a daemon would remove it): Initialized.
    let rest: Vec<Taint> = taints
        .into_iter()
        .filter(|t| t.key != "example.com/warming")
        .collect();
    e.w.cluster
        .patch::<Node>(None, &name, &serde_json::json!({"spec": {"taints": rest}}))
        .await
        .expect("untaint");
    let ok =
        e.w.until(MINUTE, || async {
            let nc: Option<NodeClaim> = e.w.cluster.get(None, &name).await.expect("get");
            nc.and_then(|nc| cond(&nc, "Ready")).map(|c| c.0) == Some("True".into())
        })
        .await;
    assert!(ok, "initialized and Ready");
    assert!(e.w.until(MINUTE, || async { running(&e).await == 1 }).await);
}

#[tokio::test(start_paused = true)]
async fn s37_not_registered_within_15_minutes_is_deleted() {
    let e = env().await;
    let mut sim = kpssh::sim::SimHost::new("10.51.0.1", 2, 4 * 1024 * 1024);
    sim.registers = false;
    e.w.add_host("h", "small", sim).await.expect("host");
    wait_available(&e, 1).await;
    e.w.cluster
        .create(&node_claim("nc", "pool", "1", "1Gi"))
        .await
        .expect("nc");
    tokio::time::sleep(10 * MINUTE).await;
    assert_eq!(claims(&e).await.len(), 1, "still waiting at 10m");
    let ok =
        e.w.until(7 * MINUTE, || async { claims(&e).await.is_empty() })
            .await;
    assert!(ok, "deleted after 15m");
    assert!(reasons(&e).iter().any(|r| r == "RegistrationTimeout"));
    let ok =
        e.w.until(5 * MINUTE, || async {
            host_states(&e).await.get(&kpssh::api::HostState::Available) == Some(&1)
        })
        .await;
    assert!(ok, "host released");
}
