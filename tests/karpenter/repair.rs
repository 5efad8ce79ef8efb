//! S43: node repair bounded as core's node health controller — off unless enabled, each
//! condition's toleration (Ready False/Unknown: 30 minutes), and nothing repaired in a NodePool
//! with more than 20% of its nodes unhealthy.

use k8s_openapi::api::core::v1::{Node, NodeCondition, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kpssh::api::karpenter::{Budget, DO_NOT_DISRUPT_ANNOTATION};
use kpssh::k8s::Cluster;

use super::*;

/// `n` nodes of one pod each in a NodePool that never consolidates; their NodeClaim names.
async fn fleet(e: &Env, n: usize, net: u8) -> Vec<String> {
    hosts(e, "h", "small", n, 2, 4, net).await;
    let mut np = nodepool("default");
    np.spec.disruption.consolidate_after = Some("Never".into());
    np.spec.disruption.budgets = vec![Budget {
        nodes: "100%".into(),
        ..Default::default()
    }];
    e.w.cluster.create(&np).await.expect("np");
    for i in 0..n {
        e.w.cluster
            .create(&pod(&format!("p{i}"), "1500m", "256Mi"))
            .await
            .expect("pod");
    }
    assert!(
        e.w.until(5 * MINUTE, || async { running(e).await == n })
            .await,
        "one node per pod"
    );
    let mut names: Vec<String> = claims(e)
        .await
        .iter()
        .filter_map(|c| c.metadata.name.clone())
        .collect();
    names.sort();
    assert_eq!(names.len(), n);
    names
}

/// The Node of claim `name` reports Ready=`status` from now on (a partition: the kubelet's
/// heartbeats stop reaching the API server).
async fn set_ready(e: &Env, name: &str, status: &str) {
    let mut node: Node =
        e.w.cluster
            .get(None, name)
            .await
            .expect("get")
            .expect("node");
    if let Some(s) = node.status.as_mut() {
        s.conditions = Some(vec![NodeCondition {
            type_: "Ready".into(),
            status: status.into(),
            reason: Some("NodeStatusUnknown".into()),
            last_transition_time: Some(Time(e.w.ctx.clock.now())),
            ..Default::default()
        }]);
    }
    e.w.cluster.replace_status(&node).await.expect("not ready");
}

async fn exists(e: &Env, name: &str) -> bool {
    claims(e).await.iter().any(|c| {
        c.metadata.name.as_deref() == Some(name) && c.metadata.deletion_timestamp.is_none()
    })
}

fn repairing() -> KarpenterConfig {
    KarpenterConfig {
        node_repair: true,
        ..KarpenterConfig::default()
    }
}

/// One node of five NotReady (20%, within the threshold): repaired after Ready's 30-minute
/// toleration, not before (the old rule repaired after 10 minutes).
#[tokio::test(start_paused = true)]
async fn s43_not_ready_node_is_repaired_after_its_30_minute_toleration() {
    let e = env_with(repairing()).await;
    let names = fleet(&e, 5, 80).await;
    // Its pod says do-not-disrupt, and the pool sets no terminationGracePeriod: repair is
    // forceful all the same (core records the drain's deadline as now).
    let held = pods(&e)
        .await
        .into_iter()
        .find(|p| p.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(names[0].as_str()))
        .and_then(|p| p.metadata.name)
        .expect("a pod on the node");
    e.w.cluster
        .patch::<Pod>(
            Some("default"),
            &held,
            &serde_json::json!({"metadata": {"annotations": {DO_NOT_DISRUPT_ANNOTATION: "true"}}}),
        )
        .await
        .expect("annotate");
    set_ready(&e, &names[0], "Unknown").await;
    tokio::time::sleep(25 * MINUTE).await;
    assert!(exists(&e, &names[0]).await, "repaired before 30 minutes");
    assert!(!reasons(&e).iter().any(|r| r == "Repair"));
    let ok =
        e.w.until(10 * MINUTE, || async { !exists(&e, &names[0]).await })
            .await;
    assert!(ok, "repaired once Ready=Unknown lasted 30 minutes");
    assert!(reasons(&e).iter().any(|r| r == "Repair"));
    let gone =
        e.w.until(5 * MINUTE, || async {
            !claims(&e)
                .await
                .iter()
                .any(|c| c.metadata.name.as_deref() == Some(names[0].as_str()))
        })
        .await;
    assert!(gone, "the do-not-disrupt pod held the repaired node");
    for n in &names[1..] {
        assert!(exists(&e, n).await, "healthy node {n} kept");
    }
}

/// Two nodes of five NotReady (40% > 20%): a partition, not broken machines. Nothing is
/// repaired, a NodeRepairBlocked event says why; once one recovers (20%), the other is.
#[tokio::test(start_paused = true)]
async fn s43_pool_with_more_than_20_percent_unhealthy_repairs_none() {
    let e = env_with(repairing()).await;
    let names = fleet(&e, 5, 81).await;
    set_ready(&e, &names[0], "False").await;
    set_ready(&e, &names[1], "Unknown").await;
    tokio::time::sleep(45 * MINUTE).await;
    for n in &names {
        assert!(exists(&e, n).await, "{n} repaired in a 40%-unhealthy pool");
    }
    let blocked: Vec<String> =
        e.w.cluster
            .events()
            .into_iter()
            .filter(|ev| ev.reason == "NodeRepairBlocked")
            .map(|ev| ev.message)
            .collect();
    assert!(
        blocked.iter().any(|m| m.contains("2 of 5 nodes")),
        "{blocked:?}"
    );
    // Deduplicated: not one event per claim every 10 s round for 15 minutes.
    assert!(
        blocked.len() <= 16,
        "{} NodeRepairBlocked events",
        blocked.len()
    );
    set_ready(&e, &names[1], "True").await;
    let ok =
        e.w.until(2 * MINUTE, || async { !exists(&e, &names[0]).await })
            .await;
    assert!(ok, "with one node of five unhealthy, repair resumes");
    assert!(exists(&e, &names[1]).await, "the recovered node is kept");
}

/// Repair is off unless enabled, as upstream's NodeRepair feature gate.
#[tokio::test(start_paused = true)]
async fn s43_node_repair_is_off_by_default() {
    let e = env().await;
    let names = fleet(&e, 1, 82).await;
    set_ready(&e, &names[0], "False").await;
    tokio::time::sleep(45 * MINUTE).await;
    assert!(
        exists(&e, &names[0]).await,
        "repaired without --node-repair"
    );
    assert!(!reasons(&e).iter().any(|r| r == "Repair"));
}
