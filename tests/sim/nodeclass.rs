//! Node classes and profiles: S32, S33.

use kpssh::api::{HostState, NodeClaim, SSHJoinProfile, SSHNodeClass, TERMINATION_FINALIZER};
use kpssh::k8s::{Cluster, DeleteOutcome};
use kpssh::sim::SimHost;
use kpssh::sim::world::{World, node_claim, node_class};

use super::{MINUTE, wait_state, world};

async fn ready(w: &World, class: &str) -> Option<(String, String)> {
    let c: SSHNodeClass = w.cluster.get(None, class).await.ok()??;
    let cond = c
        .status?
        .conditions
        .into_iter()
        .find(|c| c.type_ == "Ready")?;
    Some((cond.status, cond.reason))
}

async fn wait_ready(w: &World, class: &str, status: &str, reason: &str) {
    let ok = w
        .until(MINUTE, || async {
            ready(w, class).await == Some((status.to_string(), reason.to_string()))
        })
        .await;
    assert!(
        ok,
        "{class}: wanted {status}/{reason}, got {:?}",
        ready(w, class).await
    );
}

#[tokio::test(start_paused = true)]
async fn s32_ready_reasons_follow_profile_selector_and_hosts() {
    let w = world().await;
    wait_ready(&w, "pool", "False", "NoHosts").await;
    w.add_host("h", "small", SimHost::new("10.40.0.1", 2, 4_000_000))
        .await
        .expect("host");
    wait_state(&w, "h", HostState::Available, MINUTE).await;
    wait_ready(&w, "pool", "True", "Ready").await;
    w.cluster
        .create(&node_class("missing", "nope"))
        .await
        .expect("class");
    wait_ready(&w, "missing", "False", "ProfileNotFound").await;
    // A leave that reaches for vars is rejected up front.
    let mut bad = kpssh::sim::world::sim_profile("bad", "1");
    bad.spec.scripts.leave = "echo {{ .Vars.clusterName }}\n".into();
    w.cluster.create(&bad).await.expect("profile");
    w.cluster
        .create(&node_class("uses-bad", "bad"))
        .await
        .expect("class");
    wait_ready(&w, "uses-bad", "False", "ProfileInvalid").await;
    // Fixing the profile re-evaluates the class.
    let mut fixed: SSHJoinProfile = w.cluster.get(None, "bad").await.expect("get").expect("p");
    fixed.spec.scripts.leave = "echo sim-leave\n".into();
    w.cluster.replace(&fixed).await.expect("fix");
    wait_ready(&w, "uses-bad", "True", "Ready").await;
}

#[tokio::test(start_paused = true)]
async fn s33_class_deletion_waits_for_its_nodeclaims() {
    let w = world().await;
    w.add_host("h", "small", SimHost::new("10.40.0.2", 2, 4_000_000))
        .await
        .expect("host");
    wait_state(&w, "h", HostState::Available, MINUTE).await;
    w.cluster
        .create(&node_claim("nc", "pool", "1", "1Gi"))
        .await
        .expect("nc");
    wait_state(&w, "h", HostState::InUse, 2 * MINUTE).await;
    let has_finalizer = w
        .until(MINUTE, || async {
            let c: Option<SSHNodeClass> = w.cluster.get(None, "pool").await.expect("get");
            c.and_then(|c| c.metadata.finalizers)
                .is_some_and(|f| f.iter().any(|f| f == TERMINATION_FINALIZER))
        })
        .await;
    assert!(has_finalizer);
    let outcome = w
        .cluster
        .delete::<SSHNodeClass>(None, "pool", None)
        .await
        .expect("delete");
    assert_eq!(
        outcome,
        DeleteOutcome::Terminating,
        "blocked while referenced"
    );
    // The profile is held too, so that leave can still find its script.
    let p: SSHJoinProfile = w
        .cluster
        .get(None, "p")
        .await
        .expect("get")
        .expect("profile");
    assert!(
        p.metadata
            .finalizers
            .is_some_and(|f| f.iter().any(|f| f == TERMINATION_FINALIZER))
    );
    w.cluster
        .delete::<NodeClaim>(None, "nc", None)
        .await
        .expect("delete claim");
    wait_state(&w, "h", HostState::Available, 2 * MINUTE).await;
    let gone = w
        .until(MINUTE, || async {
            w.cluster
                .get::<SSHNodeClass>(None, "pool")
                .await
                .expect("get")
                .is_none()
        })
        .await;
    assert!(gone, "class deleted once no NodeClaim references it");
}
