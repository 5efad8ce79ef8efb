//! Claims, join, release and fencing: S13–S19, S23, S25–S27.

use std::time::Duration;

use k8s_openapi::api::core::v1::{Node, Taint};
use kpssh::api::{HostState, MAINTENANCE_ANNOTATION, NodeClaim, SSHHost, SSHJoinProfile};
use kpssh::k8s::{Cluster, Precondition};
use kpssh::sim::world::{World, node_claim};
use kpssh::sim::{SimHost, SimPhase};
use serde_json::json;

use super::{MINUTE, reasons, wait_state, world};

async fn claim(w: &World, name: &str, cpu: &str) -> NodeClaim {
    w.cluster
        .create(&node_claim(name, "pool", cpu, "1Gi"))
        .await
        .expect("nodeclaim")
}

async fn holder(w: &World, nc: &str) -> Option<String> {
    let hosts: Vec<SSHHost> = w.cluster.list(Some(&w.ns()), None).await.expect("list");
    hosts
        .into_iter()
        .find(|h| h.claim().is_some_and(|c| c.name == nc))
        .and_then(|h| h.metadata.name)
}

/// Strip the finalizers and delete: the controller never sees a graceful termination.
async fn force_delete(w: &World, nc: &NodeClaim) {
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
    w.cluster
        .delete::<NodeClaim>(None, &name, Some(pre))
        .await
        .expect("delete");
}

async fn tokens(w: &World) -> usize {
    super::token_secrets(w).await.len()
}

async fn two_classes(w: &World) {
    w.add_host("big-old", "big", SimHost::new("10.1.0.1", 8, 16_000_000))
        .await
        .expect("host");
    tokio::time::sleep(Duration::from_secs(1)).await;
    w.add_host("small-old", "small", SimHost::new("10.1.0.2", 2, 4_000_000))
        .await
        .expect("host");
    tokio::time::sleep(Duration::from_secs(1)).await;
    w.add_host("small-new", "small", SimHost::new("10.1.0.3", 2, 4_000_000))
        .await
        .expect("host");
    for h in ["big-old", "small-old", "small-new"] {
        wait_state(w, h, HostState::Available, MINUTE).await;
    }
}

#[tokio::test(start_paused = true)]
async fn s13_s14_cheapest_class_oldest_host_join_env() {
    let w = world().await;
    two_classes(&w).await;
    let mut nc = node_claim("nc-1", "pool", "1", "1Gi");
    nc.spec.taints = vec![Taint {
        key: "team".into(),
        value: Some("a".into()),
        effect: "NoSchedule".into(),
        time_added: None,
    }];
    w.cluster.create(&nc).await.expect("nodeclaim");
    let h = wait_state(&w, "small-old", HostState::InUse, 2 * MINUTE).await;
    assert_eq!(h.claim().map(|c| c.name.as_str()), Some("nc-1"));
    assert_eq!(
        h.status
            .as_ref()
            .and_then(|s| s.installed_profile.as_deref()),
        Some("p@1")
    );
    let sim = w.transport.host("10.1.0.2").expect("sim");
    assert_eq!(sim.phases(), vec![SimPhase::Install, SimPhase::Join]);
    let join = sim
        .log
        .iter()
        .find(|r| r.phase == Some(SimPhase::Join))
        .expect("join ran");
    let token = join.env.get("KPSSH_BOOTSTRAP_TOKEN").expect("token in env");
    assert_eq!(token.len(), 23, "id.secret");
    assert_eq!(
        join.env["KPSSH_PROVIDER_ID"],
        format!("kpssh://{}/small-old", w.ns())
    );
    assert_eq!(join.env["KPSSH_NODE_NAME"], "nc-1");
    // The simulation's own index (node-deleted-after-kubelet-stopped) finds the kubelet.
    assert_eq!(
        w.transport.kubelet_host("nc-1"),
        Some(("10.1.0.2".to_string(), false))
    );
    assert_eq!(w.transport.kubelet_host("nc-2"), None);
    assert!(
        join.env["KPSSH_TAINTS"]
            .starts_with("karpenter.sh/unregistered:NoExecute,team=a:NoSchedule")
    );
    assert!(join.env["KPSSH_NODE_LABELS"].contains("node.kubernetes.io/instance-type=small"));
    let nc: NodeClaim = w.cluster.get(None, "nc-1").await.expect("get").expect("nc");
    assert_eq!(
        nc.status.as_ref().and_then(|s| s.provider_id.clone()),
        Some(format!("kpssh://{}/small-old", w.ns()))
    );
    assert!(
        w.cluster
            .get::<Node>(None, "nc-1")
            .await
            .expect("get")
            .is_some()
    );
}

#[tokio::test(start_paused = true)]
async fn s13_warm_host_before_cold() {
    let w = world().await;
    w.add_host("cold-old", "small", SimHost::new("10.2.0.1", 2, 4_000_000))
        .await
        .expect("host");
    tokio::time::sleep(Duration::from_secs(1)).await;
    w.add_host("warm-new", "small", SimHost::new("10.2.0.2", 2, 4_000_000))
        .await
        .expect("host");
    let h = wait_state(&w, "warm-new", HostState::Available, MINUTE).await;
    wait_state(&w, "cold-old", HostState::Available, MINUTE).await;
    let mut warm = h.clone();
    warm.status.as_mut().expect("status").installed_profile = Some("p@1".into());
    w.cluster.replace_status(&warm).await.expect("mark warm");
    claim(&w, "nc-warm", "1").await;
    let h = wait_state(&w, "warm-new", HostState::InUse, 2 * MINUTE).await;
    assert_eq!(h.claim().map(|c| c.name.as_str()), Some("nc-warm"));
    let sim = w.transport.host("10.2.0.2").expect("sim");
    assert_eq!(
        sim.phases(),
        vec![SimPhase::Join],
        "S16: warm host skips install"
    );
}

#[tokio::test(start_paused = true)]
async fn s15_burst_of_claims_each_get_one_host() {
    let w = world().await;
    for i in 0..20 {
        w.add_host(
            &format!("h{i:02}"),
            "small",
            SimHost::new(&format!("10.3.0.{i}"), 2, 4_000_000),
        )
        .await
        .expect("host");
    }
    for i in 0..20 {
        wait_state(&w, &format!("h{i:02}"), HostState::Available, MINUTE).await;
    }
    for i in 0..20 {
        claim(&w, &format!("burst-{i}"), "1").await;
    }
    let all_held = w
        .until(3 * MINUTE, || async {
            let hosts: Vec<SSHHost> = w.cluster.list(Some(&w.ns()), None).await.expect("list");
            hosts
                .iter()
                .filter(|h| h.state() == HostState::InUse)
                .count()
                == 20
        })
        .await;
    assert!(all_held, "every claim got a host");
    let hosts: Vec<SSHHost> = w.cluster.list(Some(&w.ns()), None).await.expect("list");
    let mut names: Vec<String> = hosts
        .iter()
        .filter_map(|h| h.claim().map(|c| c.name.clone()))
        .collect();
    names.sort();
    names.dedup();
    assert_eq!(
        names.len(),
        20,
        "no host claimed twice, no claim on two hosts"
    );
}

/// `n` Available hosts `h00`.., all added at the same instant (ranked by name).
async fn pool_of(w: &World, n: usize, net: u8) {
    for i in 0..n {
        w.add_host(
            &format!("h{i:02}"),
            "small",
            SimHost::new(&format!("10.{net}.0.{i}"), 2, 4_000_000),
        )
        .await
        .expect("host");
    }
    for i in 0..n {
        wait_state(w, &format!("h{i:02}"), HostState::Available, MINUTE).await;
    }
}

/// Every claim holds a distinct host once `n` hosts are InUse.
async fn all_claims_land(w: &World, n: usize) {
    let all_held = w
        .until(3 * MINUTE, || async {
            let hosts: Vec<SSHHost> = w.cluster.list(Some(&w.ns()), None).await.expect("list");
            hosts
                .iter()
                .filter(|h| h.state() == HostState::InUse)
                .count()
                == n
        })
        .await;
    assert!(all_held, "every claim got a host");
    let hosts: Vec<SSHHost> = w.cluster.list(Some(&w.ns()), None).await.expect("list");
    let held: std::collections::BTreeSet<String> = hosts
        .iter()
        .filter_map(|h| h.claim().map(|c| c.name.clone()))
        .collect();
    assert_eq!(
        held.len(),
        n,
        "no host claimed twice, no claim on two hosts"
    );
}

/// S15 at burst scale: the router claims for many NodeClaims at once, and a host reserved by
/// a claim in flight is offered to no other, so a burst of N claims all created together
/// spreads over N hosts with (almost) no lost CAS instead of racing for the best host.
#[tokio::test(start_paused = true)]
async fn s15_concurrent_burst_spreads_over_the_pool_without_conflicts() {
    const N: usize = 64;
    let w = world().await;
    pool_of(&w, N, 6).await;
    let conflicts_before = w.ctx.metrics.claim_conflicts.get();
    let names: Vec<String> = (0..N).map(|i| format!("burst-{i:02}")).collect();
    futures::future::join_all(names.iter().map(|n| claim(&w, n, "1"))).await;
    all_claims_land(&w, N).await;
    let conflicts = w.ctx.metrics.claim_conflicts.get() - conflicts_before;
    assert!(
        conflicts as f64 <= 0.02 * N as f64,
        "{conflicts} lost CASes for {N} claims"
    );
    assert!(
        !reasons(&w).iter().any(|r| r == "InsufficientCapacity"),
        "no claim went without a host"
    );
}

/// S15: a lost CAS is not an error; the claim takes a host again and every claim lands.
#[tokio::test(start_paused = true)]
async fn s15_lost_cas_is_retried_not_an_error() {
    const N: usize = 8;
    let w = world().await;
    pool_of(&w, N, 7).await;
    let conflicts_before = w.ctx.metrics.claim_conflicts.get();
    // The first status write to the best host after this point (the router's CAS) loses.
    let refused = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let once = refused.clone();
    w.cluster
        .set_fault_injector(Some(std::sync::Arc::new(move |kind, obj_kind, key| {
            let first = kind == kpssh::k8s::memory::WriteKind::ReplaceStatus
                && obj_kind == "SSHHost"
                && key.ends_with("/h00")
                && !once.swap(true, std::sync::atomic::Ordering::SeqCst);
            first.then(|| kpssh::k8s::ClusterError::Conflict {
                kind: obj_kind.to_string(),
                key: key.to_string(),
            })
        })));
    let names: Vec<String> = (0..N).map(|i| format!("burst-{i:02}")).collect();
    futures::future::join_all(names.iter().map(|n| claim(&w, n, "1"))).await;
    all_claims_land(&w, N).await;
    assert!(
        refused.load(std::sync::atomic::Ordering::SeqCst),
        "the CAS was refused once"
    );
    assert_eq!(w.ctx.metrics.claim_conflicts.get() - conflicts_before, 1);
    assert!(
        !reasons(&w).iter().any(|r| r == "InsufficientCapacity"),
        "no claim went without a host"
    );
}

#[tokio::test(start_paused = true)]
async fn s16_profile_version_bump_reruns_install() {
    let w = world().await;
    w.add_host("h", "small", SimHost::new("10.4.0.1", 2, 4_000_000))
        .await
        .expect("host");
    wait_state(&w, "h", HostState::Available, MINUTE).await;
    claim(&w, "first", "1").await;
    wait_state(&w, "h", HostState::InUse, 2 * MINUTE).await;
    w.cluster
        .delete::<NodeClaim>(None, "first", None)
        .await
        .expect("delete");
    wait_state(&w, "h", HostState::Available, 2 * MINUTE).await;
    let mut p: SSHJoinProfile = w
        .cluster
        .get(None, "p")
        .await
        .expect("get")
        .expect("profile");
    p.spec.version = "2".into();
    w.cluster.replace(&p).await.expect("bump");
    claim(&w, "second", "1").await;
    let h = wait_state(&w, "h", HostState::InUse, 2 * MINUTE).await;
    assert_eq!(
        h.status.and_then(|s| s.installed_profile),
        Some("p@2".into())
    );
    let phases = w.transport.host("10.4.0.1").expect("sim").phases();
    use SimPhase::*;
    assert_eq!(phases, vec![Install, Join, Leave, Install, Join]);
}

#[tokio::test(start_paused = true)]
async fn s17_failing_join_releases_unhealthy_and_deletes_token() {
    let w = world().await;
    let mut sim = SimHost::new("10.5.0.1", 2, 4_000_000);
    sim.fail_next.insert(SimPhase::Join, 3);
    w.add_host("h", "small", sim).await.expect("host");
    wait_state(&w, "h", HostState::Available, MINUTE).await;
    claim(&w, "doomed", "1").await;
    let h = wait_state(&w, "h", HostState::Unhealthy, 2 * MINUTE).await;
    assert!(h.claim().is_none());
    assert_eq!(tokens(&w).await, 0, "token deleted");
    let sim = w.transport.host("10.5.0.1").expect("sim");
    let join = sim
        .log
        .iter()
        .find(|r| r.phase == Some(SimPhase::Join))
        .expect("join ran");
    let token = join
        .env
        .get("KPSSH_BOOTSTRAP_TOKEN")
        .cloned()
        .expect("token");
    assert_eq!(token.len(), 23);
    let failed: Vec<_> = w
        .cluster
        .events()
        .into_iter()
        .filter(|e| e.reason == "LaunchFailed")
        .collect();
    assert_eq!(failed.len(), 1);
    assert!(
        !failed[0].message.contains(&token[7..]),
        "no secret in the event"
    );
    assert!(
        failed[0].message.contains("exited with status 3"),
        "{}",
        failed[0].message
    );
}

#[tokio::test(start_paused = true)]
async fn s18_configuration_error_never_touches_the_host() {
    let w = world().await;
    w.add_host("h", "small", SimHost::new("10.6.0.1", 2, 4_000_000))
        .await
        .expect("host");
    wait_state(&w, "h", HostState::Available, MINUTE).await;
    w.cluster
        .delete::<SSHJoinProfile>(None, "p", None)
        .await
        .expect("delete profile");
    let sessions = w.transport.host("10.6.0.1").expect("sim").sessions;
    claim(&w, "misconfigured", "1").await;
    let ok = w
        .until(MINUTE, || async {
            reasons(&w).iter().any(|r| r == "ConfigurationError")
        })
        .await;
    assert!(ok, "ConfigurationError event");
    let h = wait_state(&w, "h", HostState::Available, MINUTE).await;
    assert!(h.claim().is_none());
    assert_eq!(tokens(&w).await, 0, "no token minted");
    let sim = w.transport.host("10.6.0.1").expect("sim");
    assert!(sim.log.is_empty(), "no phase ran");
    assert!(sim.sessions <= sessions + 1, "at most the periodic probe");
    let msg = w
        .cluster
        .events()
        .into_iter()
        .find(|e| e.reason == "ConfigurationError")
        .expect("event")
        .message;
    assert!(msg.contains("SSHJoinProfile p"), "{msg}");
}

#[tokio::test(start_paused = true)]
async fn s19_no_free_host_is_insufficient_capacity() {
    let w = world().await;
    let h = w
        .add_host("busy", "small", SimHost::new("10.7.0.1", 2, 4_000_000))
        .await
        .expect("host");
    wait_state(&w, "busy", HostState::Available, MINUTE).await;
    let patch = json!({"metadata": {"annotations": {MAINTENANCE_ANNOTATION: ""}}});
    w.cluster
        .patch::<SSHHost>(Some(&w.ns()), "busy", &patch)
        .await
        .expect("park"); // S7
    drop(h);
    claim(&w, "nothing-fits", "1").await;
    let ok = w
        .until(MINUTE, || async {
            reasons(&w).iter().any(|r| r == "InsufficientCapacity")
        })
        .await;
    assert!(ok);
    assert!(
        holder(&w, "nothing-fits").await.is_none(),
        "no claim written"
    );
    assert!(
        w.cluster
            .get::<NodeClaim>(None, "nothing-fits")
            .await
            .expect("get")
            .is_none()
    );
}

#[tokio::test(start_paused = true)]
async fn s23_s27_delete_runs_leave_and_clears_claim_in_one_write() {
    let w = world().await;
    w.add_host("h", "small", SimHost::new("10.8.0.1", 2, 4_000_000))
        .await
        .expect("host");
    wait_state(&w, "h", HostState::Available, MINUTE).await;
    claim(&w, "nc", "1").await;
    let h = wait_state(&w, "h", HostState::InUse, 2 * MINUTE).await;
    assert!(
        h.status
            .as_ref()
            .and_then(|s| s.bootstrap_token_id.as_ref())
            .is_none(),
        "S27: collected"
    );
    assert_eq!(tokens(&w).await, 0, "S27: token gone after registration");
    w.cluster
        .delete::<NodeClaim>(None, "nc", None)
        .await
        .expect("delete");
    let h = wait_state(&w, "h", HostState::Available, 2 * MINUTE).await;
    let s = h.status.expect("status");
    assert!(s.claim_ref.is_none() && s.provider_id.is_none() && s.bootstrap_token_id.is_none());
    assert_eq!(s.installed_profile.as_deref(), Some("p@1"), "marker kept");
    let sim = w.transport.host("10.8.0.1").expect("sim");
    assert_eq!(sim.phases().last(), Some(&SimPhase::Leave));
    assert!(!sim.kubelet_enabled);
    let gone = w
        .until(MINUTE, || async {
            w.cluster
                .get::<NodeClaim>(None, "nc")
                .await
                .expect("get")
                .is_none()
        })
        .await;
    assert!(gone, "finalizer removed after release");
    assert!(
        w.cluster
            .get::<Node>(None, "nc")
            .await
            .expect("get")
            .is_none(),
        "Node deleted"
    );
}

#[tokio::test(start_paused = true)]
async fn s25_delete_of_a_previous_holder_never_runs_leave_on_the_successor() {
    let w = world().await;
    w.add_host("h", "small", SimHost::new("10.9.0.1", 2, 4_000_000))
        .await
        .expect("host");
    wait_state(&w, "h", HostState::Available, MINUTE).await;
    claim(&w, "nc", "1").await;
    wait_state(&w, "h", HostState::InUse, 2 * MINUTE).await;
    let leaves_before = w
        .transport
        .host("10.9.0.1")
        .expect("sim")
        .phases()
        .iter()
        .filter(|p| **p == SimPhase::Leave)
        .count();
    // A release for the same name but another UID must not touch the host.
    w.supervisor
        .send_message(kpssh::actors::supervisor::SupervisorMsg::ToHost(
            "h".into(),
            kpssh::actors::host::HostMsg::Release(kpssh::api::ClaimRef {
                name: "nc".into(),
                uid: "someone-else".into(),
            }),
        ))
        .expect("send");
    tokio::time::sleep(MINUTE).await;
    let sim = w.transport.host("10.9.0.1").expect("sim");
    assert_eq!(
        sim.phases()
            .iter()
            .filter(|p| **p == SimPhase::Leave)
            .count(),
        leaves_before
    );
    assert_eq!(w.host("h").await.expect("host").state(), HostState::InUse);
}

/// S26/S27: the NodeClaim is force-deleted while its host's join hangs (the actor is busy until
/// the phase timeout). The router deletes the claim's bootstrap token at once rather than after
/// the phase; the campaign found it outliving the claim by minutes (campaign.yaml seed 34).
#[tokio::test(start_paused = true)]
async fn s27_token_of_claim_force_deleted_during_a_hung_join_is_deleted_at_once() {
    let w = world().await;
    let mut sim = SimHost::new("10.10.0.9", 2, 4_000_000);
    sim.hang.push(SimPhase::Join);
    w.add_host("h", "small", sim).await.expect("host");
    wait_state(&w, "h", HostState::Available, MINUTE).await;
    let nc = claim(&w, "nc", "1").await;
    let joining = w
        .until(MINUTE, || async {
            tokens(&w).await == 1
                && w.host("h")
                    .await
                    .and_then(|h| h.status.and_then(|s| s.installed_profile))
                    .is_some()
        })
        .await;
    assert!(joining, "installed, token minted");
    // The join now hangs; its phase timeout is far away.
    tokio::time::sleep(Duration::from_secs(20)).await;
    assert_eq!(
        tokens(&w).await,
        1,
        "the token stays while the claim exists"
    );
    force_delete(&w, &nc).await;
    let gone = w
        .until(Duration::from_secs(10), || async { tokens(&w).await == 0 })
        .await;
    assert!(gone, "token still there 10 s after its NodeClaim vanished");
    // The hung join runs into its timeout; the host ends up free again.
    let free = w
        .until(15 * MINUTE, || async {
            w.host("h").await.is_some_and(|h| h.claim().is_none())
        })
        .await;
    assert!(free, "host released after the hung phase");
}

#[tokio::test(start_paused = true)]
async fn s26_force_deleted_claim_is_released_as_stale_and_zombie_cleaned() {
    let w = world().await;
    w.add_host("h", "small", SimHost::new("10.10.0.1", 2, 4_000_000))
        .await
        .expect("host");
    wait_state(&w, "h", HostState::Available, MINUTE).await;
    let nc = claim(&w, "nc", "1").await;
    wait_state(&w, "h", HostState::InUse, 2 * MINUTE).await;
    // Strip the finalizers and delete: the controller never sees a graceful termination.
    force_delete(&w, &nc).await;
    // Stale release → Pending, then the zombie guard runs leave and deletes the orphan Node.
    let ok = w
        .until(5 * MINUTE, || async {
            let h = w.host("h").await.expect("host");
            h.state() == HostState::Available && h.claim().is_none()
        })
        .await;
    assert!(ok, "host back to Available");
    let r = reasons(&w);
    assert!(r.contains(&"StaleClaimReleased".to_string()), "{r:?}");
    assert!(
        r.contains(&"ZombieKubelet".to_string()) && r.contains(&"ZombieLeft".to_string()),
        "{r:?}"
    );
    assert!(
        w.cluster
            .get::<Node>(None, "nc")
            .await
            .expect("get")
            .is_none(),
        "orphan Node deleted"
    );
    assert!(!w.transport.host("10.10.0.1").expect("sim").kubelet_active);
    assert_eq!(tokens(&w).await, 0);
}

#[tokio::test(start_paused = true)]
async fn s18_s41_unsigned_verified_profile_is_refused_before_connecting() {
    let w = world().await;
    let h = w
        .add_host("v", "small", SimHost::new("10.11.0.1", 2, 4_000_000))
        .await
        .expect("host");
    let mut verified = h.clone();
    verified.spec.exec_mode = kpssh::api::ExecMode::Verified;
    verified.spec.trusted_signers = Some(vec![
        "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIAWfSAneVrZ6NSmgRKdnm/6LL3XV0dUDPM+ShIQN5RyL signer"
            .into(),
    ]);
    let current: SSHHost = w.host("v").await.expect("host");
    verified.metadata.resource_version = current.metadata.resource_version;
    w.cluster.replace(&verified).await.expect("verified");
    wait_state(&w, "v", HostState::Available, MINUTE).await;
    claim(&w, "unsigned", "1").await;
    let ok = w
        .until(MINUTE, || async {
            reasons(&w).iter().any(|r| r == "ConfigurationError")
        })
        .await;
    assert!(ok, "{:?}", reasons(&w));
    let msg = w
        .cluster
        .events()
        .into_iter()
        .find(|e| e.reason == "ConfigurationError")
        .expect("event")
        .message;
    assert!(msg.contains("refused before connecting"), "{msg}");
    assert!(
        w.transport.host("10.11.0.1").expect("sim").log.is_empty(),
        "no phase sent"
    );
    assert_eq!(tokens(&w).await, 0, "no token minted");
    wait_state(&w, "v", HostState::Available, MINUTE).await;
}

/// S29 with `--split-mixed-arch`: a class whose hosts are amd64 and arm64 is offered as
/// `small-amd64` and `small-arm64`; a NodeClaim for the arm64 type lands on the arm64 host and
/// its Node carries that instance type. Without the flag the same class is not offered at all.
#[tokio::test(start_paused = true)]
async fn s29_mixed_arch_class_split_per_arch_when_asked() {
    use kpssh::api::karpenter::NodeSelectorRequirement;
    for split in [true, false] {
        let w = super::world_with(kpssh::provider::Config {
            split_mixed_arch: split,
            ..Default::default()
        })
        .await;
        w.add_host("x86", "small", SimHost::new("10.12.0.1", 2, 4_000_000))
            .await
            .expect("host");
        let mut arm = SimHost::new("10.12.0.2", 2, 4_000_000);
        arm.arch = "arm64".into();
        w.add_host("arm", "small", arm).await.expect("host");
        for h in ["x86", "arm"] {
            wait_state(&w, h, HostState::Available, MINUTE).await;
        }
        let mut nc = node_claim("nc-arm", "pool", "1", "1Gi");
        nc.spec.requirements = vec![NodeSelectorRequirement {
            key: "node.kubernetes.io/instance-type".into(),
            operator: "In".into(),
            values: vec!["small-arm64".into()],
            min_values: None,
        }];
        w.cluster.create(&nc).await.expect("nodeclaim");
        if !split {
            let refused = w
                .until(MINUTE, || async {
                    reasons(&w).iter().any(|r| r == "InsufficientCapacity")
                })
                .await;
            assert!(
                refused,
                "without the flag the mixed class is not offered: {:?}",
                reasons(&w)
            );
            assert_eq!(holder(&w, "nc-arm").await, None);
            continue;
        }
        let h = wait_state(&w, "arm", HostState::InUse, 2 * MINUTE).await;
        assert_eq!(h.claim().map(|c| c.name.as_str()), Some("nc-arm"));
        let node = w
            .cluster
            .get::<Node>(None, "nc-arm")
            .await
            .expect("get")
            .expect("node registered");
        let labels = node.metadata.labels.unwrap_or_default();
        assert_eq!(
            labels
                .get("node.kubernetes.io/instance-type")
                .map(String::as_str),
            Some("small-arm64")
        );
        assert_eq!(
            labels.get("kubernetes.io/arch").map(String::as_str),
            Some("arm64")
        );
    }
}
