//! S49: replace-by-cheaper as core's orchestration queue runs it — the old node is cordoned
//! while its replacement launches, a replacement not Initialized within 10 minutes is deleted
//! and the old node un-cordoned, and the old claim is validated again (do-not-disrupt, PDBs,
//! budgets) at the moment of its disruption.

use k8s_openapi::api::core::v1::{Node, Pod};
use kpssh::api::karpenter::{Budget, DISRUPTED_TAINT_KEY, DO_NOT_DISRUPT_ANNOTATION};
use kpssh::api::{NodeClaim, NodePool};
use kpssh::k8s::Cluster;
use kpssh::sim::SimHost;
use kpssh::sim::host::{Behaviour, Latency, PerPhase};
use kpssh::sim::scheduler::RECREATE_ANNOTATION;

use super::*;

/// A big node running one 1-cpu pod (`c`), which fits nowhere else but on one node of the
/// cheaper small class: the setting of a replace-by-cheaper. The small host is `small`.
/// Returns the big NodeClaim's name once the replacement was launched.
async fn replacing(e: &Env, small: SimHost) -> String {
    hosts(e, "b", "big", 1, 8, 16, 88).await;
    e.w.add_host("s000", "small", small).await.expect("host");
    wait_available(e, 2).await;
    let mut np: NodePool = nodepool("default");
    np.spec.disruption.consolidate_after = Some("1m".into());
    np.spec.disruption.budgets = vec![Budget {
        nodes: "100%".into(),
        ..Default::default()
    }];
    e.w.cluster.create(&np).await.expect("np");
    e.w.cluster
        .create(&pod("a", "5", "256Mi"))
        .await
        .expect("pod");
    let mut c = pod("c", "1", "256Mi");
    c.metadata.annotations = Some([(RECREATE_ANNOTATION.to_string(), "true".to_string())].into());
    e.w.cluster.create(&c).await.expect("pod");
    assert!(
        e.w.until(3 * MINUTE, || async { running(e).await == 2 })
            .await
    );
    let cs = claims(e).await;
    assert_eq!(cs.len(), 1, "both pods on one big node");
    let old = cs[0].metadata.name.clone().expect("name");
    e.w.cluster
        .delete::<Pod>(Some("default"), "a", None)
        .await
        .expect("del");
    let launched =
        e.w.until(5 * MINUTE, || async {
            reasons(e).iter().any(|r| r == "DisruptionLaunching")
        })
        .await;
    assert!(launched, "a cheaper replacement launched: {:?}", reasons(e));
    old
}

async fn cordoned(e: &Env, node: &str) -> bool {
    let n: Option<Node> = e.w.cluster.get(None, node).await.expect("get");
    n.and_then(|n| n.spec)
        .and_then(|s| s.taints)
        .unwrap_or_default()
        .iter()
        .any(|t| t.key == DISRUPTED_TAINT_KEY)
}

fn said(e: &Env, reason: &str) -> Vec<String> {
    e.w.cluster
        .events()
        .into_iter()
        .filter(|ev| ev.reason == reason)
        .map(|ev| ev.message)
        .collect()
}

fn slow_join(address: &str) -> SimHost {
    let mut sim = SimHost::new(address, 2, 4 * 1024 * 1024);
    sim.behaviour = Some(Behaviour {
        latency: PerPhase {
            join: Latency {
                median: 3 * MINUTE,
                p95: 3 * MINUTE,
            },
            ..Default::default()
        },
        ..Default::default()
    });
    sim
}

/// The old node is cordoned while the replacement joins; a do-not-disrupt pod annotated in
/// that time is seen when the replacement is ready: the old claim is not disrupted, a
/// DisruptionBlocked event says why, and the old node is un-cordoned.
#[tokio::test(start_paused = true)]
async fn s49_old_node_is_cordoned_while_replaced_and_validated_again_at_disruption() {
    let e = env().await;
    let old = replacing(&e, slow_join("10.89.0.1")).await;
    assert!(
        cordoned(&e, &old).await,
        "the old node was not cordoned while its replacement launches"
    );
    e.w.cluster
        .patch::<Pod>(
            Some("default"),
            "c",
            &serde_json::json!({"metadata": {"annotations": {DO_NOT_DISRUPT_ANNOTATION: "true"}}}),
        )
        .await
        .expect("annotate");
    let ready =
        e.w.until(10 * MINUTE, || async {
            claims(&e).await.iter().any(|nc| {
                nc.metadata.name.as_deref() != Some(old.as_str())
                    && nc.status.as_ref().is_some_and(|s| {
                        s.conditions
                            .iter()
                            .any(|c| c.type_ == "Initialized" && c.status == "True")
                    })
            })
        })
        .await;
    assert!(ready, "the replacement became Initialized");
    tokio::time::sleep(2 * MINUTE).await;
    let t = said(&e, "DisruptionTerminating");
    assert!(
        !t.iter().any(|m| m.contains(old.as_str())),
        "the old claim was disrupted with a do-not-disrupt pod: {t:?}"
    );
    let still: Vec<NodeClaim> = claims(&e).await;
    assert!(
        still
            .iter()
            .any(|nc| nc.metadata.name.as_deref() == Some(old.as_str())
                && nc.metadata.deletion_timestamp.is_none()),
        "the old claim is kept"
    );
    let blocked = said(&e, "DisruptionBlocked");
    assert!(
        blocked
            .iter()
            .any(|m| m.contains(old.as_str()) && m.contains("do-not-disrupt")),
        "{blocked:?}"
    );
    assert!(!cordoned(&e, &old).await, "the old node stays cordoned");
}

/// A replacement that never registers: after 10 minutes it is deleted (before the 15-minute
/// registration timeout would) and the old node is un-cordoned; the old claim is never
/// disrupted.
#[tokio::test(start_paused = true)]
async fn s49_replacement_not_initialized_in_10_minutes_is_deleted_and_old_node_uncordoned() {
    let e = env().await;
    let mut broken = SimHost::new("10.89.1.1", 2, 4 * 1024 * 1024);
    broken.registers = false;
    let old = replacing(&e, broken).await;
    assert!(
        cordoned(&e, &old).await,
        "cordoned while the replacement launches"
    );
    let replacement = claims(&e)
        .await
        .iter()
        .filter_map(|nc| nc.metadata.name.clone())
        .find(|n| *n != old)
        .expect("replacement");
    let gone =
        e.w.until(11 * MINUTE, || async {
            !claims(&e).await.iter().any(|nc| {
                nc.metadata.name.as_deref() == Some(replacement.as_str())
                    && nc.metadata.deletion_timestamp.is_none()
            })
        })
        .await;
    assert!(
        gone,
        "the replacement was not given up within 10 minutes: {:?}",
        reasons(&e)
    );
    assert!(
        said(&e, "ReplacementTimedOut")
            .iter()
            .any(|m| m.contains(replacement.as_str())),
        "{:?}",
        reasons(&e)
    );
    let uncordoned =
        e.w.until(MINUTE, || async { !cordoned(&e, &old).await })
            .await;
    assert!(uncordoned, "the old node was un-cordoned");
    assert!(
        !said(&e, "DisruptionTerminating")
            .iter()
            .any(|m| m.contains(old.as_str())),
        "the old claim was disrupted"
    );
    assert_eq!(running(&e).await, 1, "its pod runs on");
}

/// The NodePool's budget drops to 0 while the replacement launches: once it is Initialized the
/// old claim waits (the budget is checked at the moment of disruption), and after 10 minutes the
/// exchange is given up: the old node un-cordoned, the replacement kept, nothing disrupted.
#[tokio::test(start_paused = true)]
async fn s49_budget_is_checked_again_at_the_moment_of_disruption() {
    let e = env().await;
    let old = replacing(&e, slow_join("10.89.2.1")).await;
    let mut np: NodePool =
        e.w.cluster
            .get(None, "default")
            .await
            .expect("get")
            .expect("np");
    np.spec.disruption.budgets = vec![Budget {
        nodes: "0".into(),
        ..Default::default()
    }];
    e.w.cluster.replace(&np).await.expect("budget 0");
    tokio::time::sleep(8 * MINUTE).await;
    assert!(
        !said(&e, "DisruptionTerminating")
            .iter()
            .any(|m| m.contains(old.as_str())),
        "disrupted with a budget of 0"
    );
    assert!(cordoned(&e, &old).await, "still exchanging, still cordoned");
    let uncordoned =
        e.w.until(4 * MINUTE, || async { !cordoned(&e, &old).await })
            .await;
    assert!(uncordoned, "the exchange was not given up after 10 minutes");
    let cs = claims(&e).await;
    assert_eq!(cs.len(), 2, "old claim and its replacement both kept");
    assert!(cs.iter().all(|nc| nc.metadata.deletion_timestamp.is_none()));
    assert!(
        !said(&e, "DisruptionTerminating")
            .iter()
            .any(|m| m.contains(old.as_str()))
    );
}
