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
        let at = nc.status.as_ref().and_then(|s| s.last_pod_event_time.clone());
        assert!(
            at.as_ref().is_some_and(|t| t.0.as_second() >= t0.as_second() - 1),
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

