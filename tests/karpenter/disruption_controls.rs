//! S59: consolidateAfter measured from the last pod event that core keeps in NodeClaim
//! status.lastPodEventTime, so that a controller restart does not start the wait again.

use kpssh::k8s::Cluster;

use super::consolidation::{app, drop_fillers, on_new_node, pool, terminating};
use super::*;

/// Two nodes of 8 cpu with a 1-cpu pod each (either fits on the other), consolidateAfter 10m.
/// The last pod events are the fillers' deletion (t0). The controller restarts 6 minutes
/// later: the wait is not started again, a node is consolidated 10 minutes after t0, not 16.
#[tokio::test(start_paused = true)]
async fn s59_consolidate_after_survives_a_controller_restart() {
    let mut e = env().await;
    hosts(&e, "h", "big", 2, 8, 16, 96).await;
    let mut np = pool("100%");
    np.spec.disruption.consolidate_after = Some("10m".into());
    e.w.cluster.create(&np).await.expect("np");
    on_new_node(&e, vec![app("a", "1")], "6500m", "a").await;
    on_new_node(&e, vec![app("b", "1")], "6500m", "b").await;
    drop_fillers(&e).await;
    let t0 = e.w.ctx.clock.now();
    tokio::time::sleep(6 * MINUTE).await;
    for nc in claims(&e).await {
        let at = nc
            .status
            .as_ref()
            .and_then(|s| s.last_pod_event_time.clone());
        assert!(
            at.as_ref()
                .is_some_and(|t| t.0.as_second() >= t0.as_second() - 1),
            "status.lastPodEventTime of {:?} is the fillers' deletion: {at:?}",
            nc.metadata.name
        );
    }
    e.restart(KarpenterConfig::default()).await;
    let since = |e: &Env| e.w.ctx.clock.since(t0);
    if let Some(left) = (9 * MINUTE).checked_sub(since(&e)) {
        tokio::time::sleep(left).await;
    }
    assert!(
        terminating(&e).is_empty(),
        "consolidated before consolidateAfter: {:?}",
        terminating(&e)
    );
    let done =
        e.w.until(3 * MINUTE, || async { !terminating(&e).is_empty() })
            .await;
    assert!(
        done,
        "not consolidated {:?} after the last pod event (the restart started the wait again): {:?}",
        since(&e),
        reasons(&e)
    );
    assert!(since(&e) <= 12 * MINUTE, "{:?}", since(&e));
}

/// The lines of `text` of metric `name` whose labels include every one of `labels`.
fn series(text: &str, name: &str, labels: &[&str]) -> Vec<f64> {
    text.lines()
        .filter(|l| l.starts_with(&format!("{name}{{")))
        .filter(|l| labels.iter().all(|f| l.contains(f)))
        .filter_map(|l| l.rsplit(' ').next()?.parse().ok())
        .collect()
}

fn told(e: &Env, reason: &str, kind: &str) -> Vec<String> {
    e.w.cluster
        .events()
        .into_iter()
        .filter(|ev| ev.reason == reason && ev.regarding.kind == kind)
        .map(|ev| ev.message)
        .collect()
}

/// S59: core's events and metric names beside kpssh's. Pods are Nominated to their new
/// NodeClaims (karpenter_nodeclaims_created_total{reason="provisioned"}); a budget of 0 is
/// told on the NodePool (DisruptionBlocked) and in karpenter_nodepools_allowed_disruptions;
/// with the budget lifted one node is consolidated (karpenter_nodeclaims_disrupted_total,
/// karpenter_voluntary_disruption_decisions_total); the node left, whose pods need a node of
/// their own and no cheaper type exists, is Unconsolidatable.
#[tokio::test(start_paused = true)]
async fn s59_core_events_and_metric_names() {
    let e = env().await;
    hosts(&e, "h", "big", 2, 8, 16, 97).await;
    e.w.cluster.create(&pool("0")).await.expect("np");
    on_new_node(&e, vec![app("a", "1")], "6500m", "a").await;
    on_new_node(&e, vec![app("b", "1")], "6500m", "b").await;
    drop_fillers(&e).await;
    let nominated = told(&e, "Nominated", "Pod");
    assert!(
        nominated
            .iter()
            .any(|m| m.starts_with("Pod should schedule on: nodeclaim/")),
        "{nominated:?}"
    );
    let blocked =
        e.w.until(3 * MINUTE, || async {
            !told(&e, "DisruptionBlocked", "NodePool").is_empty()
        })
        .await;
    assert!(blocked, "{:?}", reasons(&e));
    let msgs = told(&e, "DisruptionBlocked", "NodePool");
    assert!(
        msgs.iter().any(|m| m
            == "No allowed disruptions for disruption reason Underutilized due to blocking budget"),
        "{msgs:?}"
    );
    let text = e.w.ctx.metrics.encode(&e.w.ctx.hosts);
    let allowed = series(
        &text,
        "karpenter_nodepools_allowed_disruptions",
        &[r#"nodepool="default""#, r#"reason="underutilized""#],
    );
    assert_eq!(allowed, [0.0], "{text}");
    let created = series(
        &text,
        "karpenter_nodeclaims_created_total",
        &[
            r#"reason="provisioned""#,
            r#"nodepool="default""#,
            "min_values_relaxed",
        ],
    );
    assert_eq!(created, [2.0], "{text}");
    assert_eq!(
        series(
            &text,
            "karpenter_pods_state",
            &[r#"name="a""#, r#"phase="Running""#]
        ),
        [1.0],
        "{text}"
    );
    assert!(
        series(
            &text,
            "karpenter_nodepools_usage",
            &[r#"resource_type="cpu""#]
        )
        .iter()
        .any(|v| *v >= 16.0),
        "{text}"
    );
    assert!(terminating(&e).is_empty());
    let patch = serde_json::json!({"spec": {"disruption": {"budgets": [{"nodes": "100%"}]}}});
    e.w.cluster
        .patch::<kpssh::api::NodePool>(None, "default", &patch)
        .await
        .expect("budget");
    let unconsolidatable =
        e.w.until(5 * MINUTE, || async {
            !told(&e, "Unconsolidatable", "NodeClaim").is_empty()
        })
        .await;
    assert!(unconsolidatable, "{:?}", reasons(&e));
    assert_eq!(terminating(&e).len(), 1, "{:?}", terminating(&e));
    assert!(
        told(&e, "Unconsolidatable", "Node")
            .iter()
            .any(|m| m == "Can't replace with a cheaper node"),
        "{:?}",
        told(&e, "Unconsolidatable", "Node")
    );
    let text = e.w.ctx.metrics.encode(&e.w.ctx.hosts);
    assert_eq!(
        series(
            &text,
            "karpenter_nodeclaims_disrupted_total",
            &[
                r#"reason="underutilized""#,
                r#"nodepool="default""#,
                "capacity_type"
            ],
        ),
        [1.0],
        "{text}"
    );
    assert_eq!(
        series(
            &text,
            "karpenter_voluntary_disruption_decisions_total",
            &[
                r#"decision="delete""#,
                r#"reason="underutilized""#,
                r#"consolidation_type="single""#
            ],
        ),
        [1.0],
        "{text}"
    );
}
