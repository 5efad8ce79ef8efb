//! S44: terminationGracePeriod. Unset, a drain blocked by a PDB waits as long as it takes and
//! the host stays InUse; set, the deadline is persisted on the NodeClaim (it survives a
//! controller restart) and each pod is deleted its own grace period before it.

use std::time::Duration;

use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kpssh::api::karpenter::DO_NOT_DISRUPT_ANNOTATION;
use kpssh::api::{HostState, NodeClaim};
use kpssh::k8s::Cluster;
use kpssh::karpenter::KarpenterConfig;
use kpssh::karpenter::termination::deadline::TERMINATION_TIMESTAMP_ANNOTATION;

use super::termination::{one_node, one_node_in, pdb};
use super::*;

const SECOND: Duration = Duration::from_secs(1);

async fn pod_exists(e: &Env, name: &str) -> bool {
    let p: Option<Pod> = e.w.cluster.get(Some("default"), name).await.expect("get");
    p.is_some()
}

async fn claim(e: &Env, name: &str) -> Option<NodeClaim> {
    e.w.cluster.get(None, name).await.expect("get")
}

fn recorded_deadline(nc: &NodeClaim) -> Option<jiff::Timestamp> {
    nc.metadata
        .annotations
        .as_ref()?
        .get(TERMINATION_TIMESTAMP_ANNOTATION)?
        .parse()
        .ok()
}

/// A pod of the `app=web` PDB with its own grace period.
fn web_pod(name: &str, grace_seconds: i64) -> Pod {
    let mut p = pod(name, "500m", "256Mi");
    if let Some(s) = p.spec.as_mut() {
        s.termination_grace_period_seconds = Some(grace_seconds);
    }
    p
}

#[tokio::test(start_paused = true)]
async fn s44_unset_grace_period_a_pdb_blocked_drain_holds_the_host_for_an_hour() {
    let e = env().await;
    hosts(&e, "h", "small", 1, 2, 4, 62).await;
    let name = one_node(&e, pod("web-0", "500m", "256Mi")).await;
    e.w.cluster.create(&pdb()).await.expect("pdb");
    // `kubectl delete nodeclaim`: the claim is deleted, its drain blocked by the PDB.
    e.w.cluster
        .delete::<NodeClaim>(None, &name, None)
        .await
        .expect("delete claim");
    for minute in 1..=60 {
        tokio::time::sleep(MINUTE).await;
        let nc = claim(&e, &name).await;
        let node: Option<Node> = e.w.cluster.get(None, &name).await.expect("get");
        assert!(
            nc.is_some(),
            "minute {minute}: the NodeClaim is still there"
        );
        assert!(node.is_some(), "minute {minute}: the Node is still there");
        assert!(pod_exists(&e, "web-0").await, "minute {minute}: PDB holds");
        assert_eq!(
            host_states(&e).await.get(&HostState::InUse),
            Some(&1),
            "minute {minute}: no leave, nothing force-released"
        );
    }
    let nc = claim(&e, &name).await.expect("claim");
    assert_eq!(recorded_deadline(&nc), None, "no grace period: no deadline");
    e.w.cluster
        .delete::<PodDisruptionBudget>(Some("default"), "web", None)
        .await
        .expect("drop pdb");
    let ok =
        e.w.until(5 * MINUTE, || async {
            host_states(&e).await.get(&HostState::Available) == Some(&1)
                && claims(&e).await.is_empty()
        })
        .await;
    assert!(ok, "the PDB gone, the drain finishes and the host is warm");
}

#[tokio::test(start_paused = true)]
async fn s44_grace_period_deletes_each_pod_its_own_grace_before_the_deadline() {
    let e = env().await;
    hosts(&e, "h", "small", 1, 2, 4, 63).await;
    let mut np = nodepool("default");
    np.spec.template.spec.termination_grace_period = Some("10m".into());
    let name = one_node_in(&e, np, web_pod("web-0", 120)).await;
    e.w.cluster.create(&pdb()).await.expect("pdb");
    e.w.cluster
        .delete::<NodeClaim>(None, &name, None)
        .await
        .expect("delete claim");
    let nc = claim(&e, &name).await.expect("claim");
    let deleted = nc.metadata.deletion_timestamp.clone().expect("deleting").0;
    assert!(
        e.w.until(10 * SECOND, || async {
            claim(&e, &name)
                .await
                .is_some_and(|nc| recorded_deadline(&nc).is_some())
        })
        .await,
        "the deadline is recorded on the NodeClaim"
    );
    let recorded = recorded_deadline(&claim(&e, &name).await.expect("claim")).expect("deadline");
    assert_eq!(
        recorded,
        deleted + jiff::SignedDuration::from_mins(10),
        "deletion + terminationGracePeriod"
    );
    // Deleted at deadline − 120 s = deletion + 8 m; not before.
    tokio::time::sleep(7 * MINUTE + 50 * SECOND).await;
    assert!(pod_exists(&e, "web-0").await, "the PDB holds until then");
    assert_eq!(host_states(&e).await.get(&HostState::InUse), Some(&1));
    tokio::time::sleep(20 * SECOND).await;
    assert!(
        !pod_exists(&e, "web-0").await,
        "deleted with its own 120 s before the deadline, PDB notwithstanding"
    );
    assert!(
        reasons(&e)
            .iter()
            .any(|r| r == "PodDeletedForTerminationGracePeriod")
    );
    let ok =
        e.w.until(2 * MINUTE, || async {
            host_states(&e).await.get(&HostState::Available) == Some(&1)
                && claims(&e).await.is_empty()
        })
        .await;
    assert!(ok, "then drained, left, released");
}

#[tokio::test(start_paused = true)]
async fn s44_grace_period_of_a_marked_claim_survives_a_controller_restart() {
    let mut e = env().await;
    hosts(&e, "h", "small", 1, 2, 4, 64).await;
    let mut np = nodepool("default");
    np.spec.template.spec.termination_grace_period = Some("10m".into());
    let mut p = web_pod("batch", 60);
    p.metadata.annotations =
        Some([(DO_NOT_DISRUPT_ANNOTATION.to_string(), "true".to_string())].into());
    let name = one_node_in(&e, np, p).await;
    let marked_at = e.w.ctx.clock.now();
    mark(&e, &name).await;
    assert!(
        e.w.until(10 * SECOND, || async {
            claim(&e, &name)
                .await
                .is_some_and(|nc| recorded_deadline(&nc).is_some())
        })
        .await
    );
    let recorded = recorded_deadline(&claim(&e, &name).await.expect("claim")).expect("deadline");
    let expected = marked_at + jiff::SignedDuration::from_mins(10);
    assert!(
        recorded >= expected && recorded <= expected + jiff::SignedDuration::from_secs(3),
        "the drain's start + terminationGracePeriod: {recorded} vs {expected}"
    );
    tokio::time::sleep(5 * MINUTE).await;
    e.restart(KarpenterConfig::default()).await;
    // Deleted at deadline − 60 s = mark + 9 m, counted from the mark, not from the restart.
    tokio::time::sleep(3 * MINUTE + 45 * SECOND).await;
    assert!(
        pod_exists(&e, "batch").await,
        "do-not-disrupt holds until then"
    );
    let ok =
        e.w.until(30 * SECOND, || async { !pod_exists(&e, "batch").await })
            .await;
    assert!(
        ok,
        "deleted at mark + 9 m despite the restart at mark + 5 m"
    );
    let ok =
        e.w.until(2 * MINUTE, || async {
            host_states(&e).await.get(&HostState::Available) == Some(&1)
                && claims(&e).await.is_empty()
        })
        .await;
    assert!(ok, "then drained, left, released");
}

/// Found by the random campaign (seed 7296, `examples/sim/regress/release-after-expiring-pods.yaml`):
/// a claim whose deadline has already come when it is deleted (node repair writes "now"). The
/// router released the host at once, before the drain had deleted the pods; leave failed (the
/// machine was off), the claim went, and its pods stayed bound to the Node, never deleted,
/// until the zombie guard deleted that Node under them when the machine came back. As core, the pods past the deadline are deleted first (their PDB
/// notwithstanding), and the host is released after that.
#[tokio::test(start_paused = true)]
async fn a_claim_past_its_deadline_has_its_pods_deleted_before_release() {
    let e = env().await;
    hosts(&e, "h", "small", 1, 2, 4, 69).await;
    let name = one_node(&e, web_pod("web-0", 30)).await;
    e.w.cluster.create(&pdb()).await.expect("pdb");
    // As in the seed: the machine is off (repair's case), so leave fails at once.
    e.w.transport.with("10.69.0.1", |h| h.power_off());
    // As repair: the deadline is now, then the deletion.
    let now = kpssh::karpenter::termination::deadline::format(e.w.ctx.clock.now());
    let patch =
        serde_json::json!({"metadata": {"annotations": {TERMINATION_TIMESTAMP_ANNOTATION: now}}});
    e.w.cluster
        .patch::<NodeClaim>(None, &name, &patch)
        .await
        .expect("deadline");
    e.w.cluster
        .delete::<NodeClaim>(None, &name, None)
        .await
        .expect("delete claim");
    let gone =
        e.w.until(5 * MINUTE, || async { claim(&e, &name).await.is_none() })
            .await;
    assert!(gone, "claim gone: {:?}", host_states(&e).await);
    assert!(
        !pod_exists(&e, "web-0").await,
        "the pod past the deadline was deleted, not left bound to the claim's Node"
    );
    assert!(
        reasons(&e)
            .iter()
            .any(|r| r == "PodDeletedForTerminationGracePeriod"),
        "{:?}",
        reasons(&e)
    );
}
