//! S51: expireAfter is forceful, as core v1: not gated by disruption budgets, not blocked by
//! `karpenter.sh/do-not-disrupt`; the drain holds such pods until terminationGracePeriod.

use k8s_openapi::api::core::v1::Pod;
use kpssh::api::NodePool;
use kpssh::api::karpenter::{Budget, DO_NOT_DISRUPT_ANNOTATION};
use kpssh::k8s::Cluster;

use super::*;

#[tokio::test(start_paused = true)]
async fn s51_expired_claim_is_deleted_despite_budget_0_and_do_not_disrupt() {
    let e = env().await;
    hosts(&e, "h", "small", 2, 2, 4, 83).await;
    let mut np: NodePool = nodepool("default");
    np.spec.disruption.consolidate_after = Some("Never".into());
    // No voluntary disruption at all.
    np.spec.disruption.budgets = vec![Budget {
        nodes: "0".into(),
        ..Default::default()
    }];
    np.spec.template.spec.expire_after = Some("30m".into());
    np.spec.template.spec.termination_grace_period = Some("5m".into());
    e.w.cluster.create(&np).await.expect("np");
    let mut p = pod("keep", "1500m", "256Mi");
    p.metadata.annotations = Some(
        [
            (DO_NOT_DISRUPT_ANNOTATION.to_string(), "true".to_string()),
            (
                kpssh::sim::scheduler::RECREATE_ANNOTATION.to_string(),
                "true".to_string(),
            ),
        ]
        .into(),
    );
    e.w.cluster.create(&p).await.expect("pod");
    assert!(
        e.w.until(3 * MINUTE, || async { running(&e).await == 1 })
            .await
    );
    let first = claims(&e).await[0].metadata.name.clone().expect("name");
    // do-not-disrupt on the NodeClaim too.
    e.w.cluster
        .patch::<NodeClaim>(
            None,
            &first,
            &serde_json::json!({"metadata": {"annotations": {DO_NOT_DISRUPT_ANNOTATION: "true"}}}),
        )
        .await
        .expect("annotate");
    tokio::time::sleep(25 * MINUTE).await;
    assert!(
        claims(&e)
            .await
            .iter()
            .any(|c| c.metadata.name.as_deref() == Some(first.as_str())
                && c.metadata.deletion_timestamp.is_none()),
        "not before expireAfter"
    );
    let deleting = |cs: Vec<NodeClaim>| {
        !cs.iter().any(|c| {
            c.metadata.name.as_deref() == Some(first.as_str())
                && c.metadata.deletion_timestamp.is_none()
        })
    };
    let ok =
        e.w.until(7 * MINUTE, || async { deleting(claims(&e).await) })
            .await;
    assert!(
        ok,
        "expired NodeClaim deleted despite budget 0 and do-not-disrupt: {:?}",
        reasons(&e)
    );
    assert!(
        e.w.cluster
            .events()
            .iter()
            .any(|ev| ev.reason == "DisruptionTerminating"
                && ev.message.contains(&first)
                && ev.message.contains("Expired")),
        "{:?}",
        reasons(&e)
    );
    // The do-not-disrupt pod holds its node for terminationGracePeriod (5m), then goes, and
    // runs again on a new node.
    let ok =
        e.w.until(15 * MINUTE, || async {
            let cs = claims(&e).await;
            !cs.iter()
                .any(|c| c.metadata.name.as_deref() == Some(first.as_str()))
                && running(&e).await == 1
        })
        .await;
    assert!(ok, "the expired node left and the pod runs again");
    let ps: Vec<Pod> = pods(&e).await;
    assert_eq!(ps.len(), 1, "one pod: {ps:?}");
}
