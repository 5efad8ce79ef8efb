//! S57: multi-node consolidation, as core's — several under-utilised nodes deleted in one
//! decision when their pods fit on the others, or replaced by one node cheaper than they are
//! together; against single-node consolidation only (`multi_node_consolidation: false`) on
//! the same cluster.

use k8s_openapi::api::core::v1::Pod;
use kpssh::k8s::Cluster;
use kpssh::karpenter::sim_scheduler::RECREATE_ANNOTATION;
use kpssh::sim::SimHost;

use super::consolidation::{app, drop_fillers, on_new_node, pool, terminating};
use super::*;

/// Four nodes of 8 cpu with one 1-cpu pod each. Multi-node consolidation deletes three of them
/// in one decision (their pods fit on the fourth); single-node consolidation deletes one per
/// decision.
#[tokio::test(start_paused = true)]
async fn s57_multi_node_consolidation_deletes_several_nodes_in_one_decision() {
    let e = env().await;
    hosts(&e, "h", "big", 4, 8, 16, 91).await;
    e.w.cluster.create(&pool("100%")).await.expect("np");
    for tag in ["a", "b", "c", "d"] {
        on_new_node(&e, vec![app(tag, "1")], "6500m", tag).await;
    }
    assert_eq!(claims(&e).await.len(), 4);
    drop_fillers(&e).await;
    let one =
        e.w.until(5 * MINUTE, || async { !terminating(&e).is_empty() })
            .await;
    assert!(one, "consolidated: {:?}", reasons(&e));
    let t = terminating(&e);
    assert_eq!(t.len(), 3, "three nodes in the first decision: {t:?}");
    assert!(
        t.iter()
            .all(|m| m.contains("multi-node consolidation of 3 nodes")),
        "{t:?}"
    );
    let settled =
        e.w.until(10 * MINUTE, || async {
            claims(&e).await.len() == 1 && running(&e).await == 4
        })
        .await;
    assert!(settled, "one node runs the four pods: {:?}", reasons(&e));
}

/// The same cluster with single-node consolidation only: the first decision takes one node.
#[tokio::test(start_paused = true)]
async fn s57_single_node_only_takes_one_node_per_decision() {
    let e = env_with(KarpenterConfig {
        multi_node_consolidation: false,
        ..KarpenterConfig::default()
    })
    .await;
    hosts(&e, "h", "big", 4, 8, 16, 92).await;
    e.w.cluster.create(&pool("100%")).await.expect("np");
    for tag in ["a", "b", "c", "d"] {
        on_new_node(&e, vec![app(tag, "1")], "6500m", tag).await;
    }
    drop_fillers(&e).await;
    let one =
        e.w.until(5 * MINUTE, || async { !terminating(&e).is_empty() })
            .await;
    assert!(one, "consolidated: {:?}", reasons(&e));
    assert_eq!(terminating(&e).len(), 1, "{:?}", terminating(&e));
}

/// A ReplicaSet's pod of `cpu` created alone, so that it gets a node of its own (the cheapest
/// type that fits it).
async fn alone(e: &Env, name: &str, cpu: &str) {
    let mut p: Pod = pod(name, cpu, "256Mi");
    p.metadata.annotations = Some([(RECREATE_ANNOTATION.to_string(), "true".to_string())].into());
    let want = running(e).await + 1;
    e.w.cluster.create(&p).await.expect("pod");
    let ok =
        e.w.until(5 * MINUTE, || async { running(e).await == want })
            .await;
    assert!(ok, "{name} runs");
}

/// Two 4-cpu nodes each run a 3-cpu pod that fits on no other node and on no cheaper type
/// alone; one 7-cpu node takes both for less than the two cost. Multi-node consolidation
/// replaces the two by one (cordoned, replacement Initialized, both disrupted); single-node
/// consolidation leaves both.
async fn two_into_one(multi: bool, net: u8) -> (usize, Vec<String>) {
    let e = env_with(KarpenterConfig {
        multi_node_consolidation: multi,
        ..KarpenterConfig::default()
    })
    .await;
    hosts(&e, "b", "big", 2, 4, 8, net).await;
    e.w.add_host(
        "m000",
        "mid",
        SimHost::new(&format!("10.{net}.9.1"), 7, 8 * 1024 * 1024),
    )
    .await
    .expect("host");
    wait_available(&e, 3).await;
    e.w.cluster.create(&pool("100%")).await.expect("np");
    alone(&e, "x", "3").await;
    alone(&e, "y", "3").await;
    let types: Vec<String> = claims(&e)
        .await
        .iter()
        .filter_map(|nc| {
            nc.metadata
                .labels
                .as_ref()?
                .get("node.kubernetes.io/instance-type")
                .cloned()
        })
        .collect();
    assert_eq!(types, ["big", "big"], "one big node each");
    tokio::time::sleep(15 * MINUTE).await;
    let settled =
        e.w.until(10 * MINUTE, || async { running(&e).await == 2 })
            .await;
    assert!(settled, "both pods run: {:?}", reasons(&e));
    let types = claims(&e)
        .await
        .iter()
        .filter_map(|nc| {
            nc.metadata
                .labels
                .as_ref()?
                .get("node.kubernetes.io/instance-type")
                .cloned()
        })
        .collect();
    (claims(&e).await.len(), types)
}

#[tokio::test(start_paused = true)]
async fn s57_two_nodes_replaced_by_one_cheaper_node() {
    let (multi, types) = two_into_one(true, 93).await;
    assert_eq!(multi, 1, "two big nodes became one mid node: {types:?}");
    assert_eq!(types, ["mid"]);
    let (single, types) = two_into_one(false, 94).await;
    assert_eq!(single, 2, "single-node consolidation keeps both: {types:?}");
}
