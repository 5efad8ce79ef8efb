//! S26/S27: a join stops when its NodeClaim goes, as core deletes the instance of a deleted
//! NodeClaim at once. The pod-demand campaign (pools.yaml seed 84) found a token that outlived
//! its force-deleted claim by the hung join's whole timeout: the router's one delete of it
//! failed with an API error, and the host's actor was busy in the join.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use kpssh::api::{HostState, NodeClaim};
use kpssh::k8s::memory::WriteKind;
use kpssh::k8s::{Cluster, ClusterError, Precondition};
use kpssh::sim::world::{World, node_claim};
use kpssh::sim::{SimHost, SimPhase};
use serde_json::json;

use super::{MINUTE, reasons, token_secrets, wait_state, world};

/// A host whose join hangs (to the profile's 5-minute timeout), claimed, installed and joining
/// with its token minted.
async fn hung_join(w: &World) -> NodeClaim {
    let mut sim = SimHost::new("10.11.0.1", 2, 4_000_000);
    sim.hang.push(SimPhase::Join);
    w.add_host("h", "small", sim).await.expect("host");
    wait_state(w, "h", HostState::Available, MINUTE).await;
    let nc: NodeClaim = w
        .cluster
        .create(&node_claim("nc", "pool", "1", "1Gi"))
        .await
        .expect("nodeclaim");
    let joining = w
        .until(MINUTE, || async {
            token_secrets(w).await.len() == 1
                && (w.host("h").await)
                    .and_then(|h| h.status.and_then(|s| s.installed_profile))
                    .is_some()
        })
        .await;
    assert!(joining, "installed, token minted");
    tokio::time::sleep(Duration::from_secs(20)).await;
    assert_eq!(token_secrets(w).await.len(), 1, "the join hangs");
    nc
}

/// The host is free again (no claim, Available), its token deleted, and no launch failure
/// was charged to it: the join was stopped for its claim, not failed by the host.
async fn released_without_failure(w: &World, within: Duration) {
    let free = w
        .until(within, || async {
            token_secrets(w).await.is_empty()
                && w.host("h")
                    .await
                    .is_some_and(|h| h.claim().is_none() && h.state() == HostState::Available)
        })
        .await;
    assert!(
        free,
        "released within {within:?}; host {:?}, tokens {:?}",
        w.host("h").await.and_then(|h| h.status),
        token_secrets(w).await
    );
    let r = reasons(w);
    for bad in ["LaunchFailed", "LaunchBackoff", "Unhealthy"] {
        assert!(!r.iter().any(|x| x == bad), "{bad} in {r:?}");
    }
    assert!(!w.transport.host("10.11.0.1").expect("sim").kubelet_active);
}

/// Force-deleted (finalizers stripped) while the join hangs, and the router's delete of the
/// token refused by the API: the actor kills the join and deletes the token itself, seconds
/// after the claim went, not when the join times out.
#[tokio::test(start_paused = true)]
async fn s26_s27_hung_join_of_a_force_deleted_claim_is_killed_and_its_token_deleted() {
    let w = world().await;
    let nc = hung_join(&w).await;
    let refused = Arc::new(AtomicBool::new(false));
    let once = refused.clone();
    w.cluster
        .set_fault_injector(Some(Arc::new(move |kind, obj_kind, key: &str| {
            let first = kind == WriteKind::Delete
                && obj_kind == "Secret"
                && key.contains("bootstrap-token-")
                && !once.swap(true, Ordering::SeqCst);
            first.then(|| ClusterError::Transient {
                kind: obj_kind.into(),
                key: key.into(),
                message: "injected: etcdserver: request timed out".into(),
            })
        })));
    let name = nc.metadata.name.clone().unwrap_or_default();
    let _: NodeClaim = w
        .cluster
        .patch(None, &name, &json!({"metadata": {"finalizers": null}}))
        .await
        .expect("strip");
    let pre = Precondition {
        uid: nc.metadata.uid.clone(),
        resource_version: None,
    };
    (w.cluster.delete::<NodeClaim>(None, &name, Some(pre)).await).expect("delete");
    released_without_failure(&w, Duration::from_secs(15)).await;
    assert!(refused.load(Ordering::SeqCst), "a token delete was refused");
    assert!(
        reasons(&w).iter().any(|r| r == "StaleClaimReleased"),
        "{:?}",
        reasons(&w)
    );
}

/// Deleted the ordinary way (its finalizer holds it) while the join hangs: the join is killed
/// and the host released at once, and the NodeClaim goes, rather than after the join's
/// timeout.
#[tokio::test(start_paused = true)]
async fn s26_claim_deleted_during_a_hung_join_releases_the_host_at_once() {
    let w = world().await;
    let nc = hung_join(&w).await;
    let name = nc.metadata.name.clone().unwrap_or_default();
    (w.cluster.delete::<NodeClaim>(None, &name, None).await).expect("delete");
    released_without_failure(&w, Duration::from_secs(30)).await;
    let gone = w
        .until(Duration::from_secs(30), || async {
            (w.cluster.get::<NodeClaim>(None, &name).await)
                .expect("get")
                .is_none()
        })
        .await;
    assert!(gone, "the NodeClaim's finalizer was removed");
}
