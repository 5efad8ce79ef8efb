//! Startup taint gates: S34.

use k8s_openapi::api::core::v1::{Node, NodeCondition, Taint};
use kpssh::api::nodeclass::{GateCondition, NodeConditionGate, StartupTaintGate};
use kpssh::api::{HostState, SSHNodeClass};
use kpssh::k8s::Cluster;
use kpssh::sim::SimHost;
use kpssh::sim::world::node_claim;

use super::{MINUTE, wait_state, world};

fn taint(key: &str) -> Taint {
    Taint {
        key: key.into(),
        value: None,
        effect: "NoSchedule".into(),
        time_added: None,
    }
}

fn keys(node: &Node) -> Vec<String> {
    node.spec
        .as_ref()
        .and_then(|s| s.taints.clone())
        .unwrap_or_default()
        .into_iter()
        .map(|t| t.key)
        .collect()
}

#[tokio::test(start_paused = true)]
async fn s34_gate_removes_only_declared_startup_taints_when_its_condition_holds() {
    let w = world().await;
    let mut class: SSHNodeClass = w
        .cluster
        .get(None, "pool")
        .await
        .expect("get")
        .expect("class");
    class.spec.startup_taint_gates = Some(vec![StartupTaintGate {
        taint_key: "example.com/network-not-ready".into(),
        remove_when: GateCondition {
            pods_ready: None,
            node_condition: Some(NodeConditionGate {
                type_: "NetworkReady".into(),
                status: None,
            }),
        },
    }]);
    w.cluster.replace(&class).await.expect("gates");
    w.add_host("h", "small", SimHost::new("10.50.0.1", 2, 4_000_000))
        .await
        .expect("host");
    wait_state(&w, "h", HostState::Available, MINUTE).await;
    let mut nc = node_claim("gated", "pool", "1", "1Gi");
    nc.spec.startup_taints = vec![taint("example.com/network-not-ready")];
    nc.spec.taints = vec![taint("team")];
    w.cluster.create(&nc).await.expect("nodeclaim");
    wait_state(&w, "h", HostState::InUse, 2 * MINUTE).await;
    let node = |w: &kpssh::sim::world::World| {
        let c = w.cluster.clone();
        async move {
            c.get::<Node>(None, "gated")
                .await
                .expect("get")
                .expect("node")
        }
    };
    tokio::time::sleep(MINUTE).await;
    let before = keys(&node(&w).await);
    assert!(
        before.contains(&"example.com/network-not-ready".to_string()),
        "gate closed: {before:?}"
    );
    let mut n = node(&w).await;
    n.status
        .get_or_insert_with(Default::default)
        .conditions
        .get_or_insert_with(Vec::new)
        .push(NodeCondition {
            type_: "NetworkReady".into(),
            status: "True".into(),
            ..Default::default()
        });
    w.cluster.replace_status(&n).await.expect("condition");
    let opened = w
        .until(MINUTE, || async {
            !keys(&node(&w).await).contains(&"example.com/network-not-ready".to_string())
        })
        .await;
    assert!(opened, "startup taint removed once NetworkReady=True");
    assert!(
        keys(&node(&w).await).contains(&"team".to_string()),
        "a regular taint stays"
    );
}
