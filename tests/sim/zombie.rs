//! Zombie guard: S9–S11.

use kpssh::api::{HostState, SSHHost};
use kpssh::k8s::Cluster;
use kpssh::sim::{SimHost, SimPhase};

use super::{MINUTE, reasons, wait_state, world};

/// An Available host that kpssh installed (marker `p@1`), kubelet stopped for now.
async fn installed_host(w: &kpssh::sim::world::World, name: &str, address: &str) {
    w.add_host(name, "small", SimHost::new(address, 2, 4_000_000))
        .await
        .expect("host");
    let h = wait_state(w, name, HostState::Available, MINUTE).await;
    let mut marked: SSHHost = h.clone();
    marked.status.as_mut().expect("status").installed_profile = Some("p@1".into());
    w.cluster.replace_status(&marked).await.expect("marker");
}

#[tokio::test(start_paused = true)]
async fn s9_zombie_kubelet_on_installed_host_is_disconnected() {
    let w = world().await;
    installed_host(&w, "z", "10.20.0.1").await;
    // A bad profile only stopped the kubelet; a reboot brought it back.
    w.transport.with("10.20.0.1", |s| {
        s.kubelet_enabled = true;
        s.reboot();
    });
    let ok = w
        .until(5 * MINUTE, || async {
            reasons(&w).contains(&"ZombieLeft".to_string())
        })
        .await;
    assert!(ok, "{:?}", reasons(&w));
    let h = wait_state(&w, "z", HostState::Available, MINUTE).await;
    assert_eq!(
        h.status.and_then(|s| s.installed_profile),
        Some("p@1".into()),
        "marker kept"
    );
    let sim = w.transport.host("10.20.0.1").expect("sim");
    assert_eq!(sim.phases(), vec![SimPhase::Leave]);
    assert!(!sim.kubelet_active);
}

#[tokio::test(start_paused = true)]
async fn s10_foreign_kubelet_is_left_alone() {
    let w = world().await;
    let mut sim = SimHost::new("10.20.0.2", 2, 4_000_000);
    sim.kubelet_active = true;
    w.add_host("f", "small", sim).await.expect("host");
    let h = wait_state(&w, "f", HostState::Unhealthy, MINUTE).await;
    let err = h
        .status
        .and_then(|s| s.last_probe_error)
        .expect("explained");
    assert!(err.contains("never installed"), "{err}");
    assert!(reasons(&w).contains(&"ForeignKubelet".to_string()));
    assert!(
        w.transport.host("10.20.0.2").expect("sim").log.is_empty(),
        "nothing sent"
    );
}

#[tokio::test(start_paused = true)]
async fn s11_failed_zombie_leave_is_retried_next_probe() {
    let w = world().await;
    installed_host(&w, "z", "10.20.0.3").await;
    w.transport.with("10.20.0.3", |s| {
        s.kubelet_active = true;
        s.fail_next.insert(SimPhase::Leave, 1);
    });
    let failed = w
        .until(5 * MINUTE, || async {
            reasons(&w).contains(&"ZombieLeaveFailed".to_string())
        })
        .await;
    assert!(failed);
    wait_state(&w, "z", HostState::Unhealthy, MINUTE).await;
    // Unhealthy hosts are not Available, so the guard acts once the probe brings it back.
    let ok = w
        .until(10 * MINUTE, || async {
            reasons(&w).contains(&"ZombieLeft".to_string())
        })
        .await;
    assert!(ok, "{:?}", reasons(&w));
}

/// S12: the probe that will find a zombie kubelet is slow; a NodeClaim claims the host while it
/// runs. The zombie check's Leaving CAS is fenced by the claim's resourceVersion, so the host
/// never enters Leaving, and the claim goes on to join (its launch clears the kubelet first).
#[tokio::test(start_paused = true)]
async fn s12_claim_landing_during_zombie_check_wins() {
    use futures::StreamExt as _;
    use kpssh::k8s::WatchEvent;
    use kpssh::sim::world::node_claim;

    let w = world().await;
    installed_host(&w, "z", "10.20.0.4").await;
    // Every state the host passes through, as the API saw it.
    let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::<HostState>::new()));
    let mut stream = w.cluster.watch::<SSHHost>(Some(&w.ns()));
    let record = seen.clone();
    let watcher = tokio::spawn(async move {
        while let Some(ev) = stream.next().await {
            if let Ok(WatchEvent::Applied(h)) = ev {
                record.lock().expect("lock").push(h.state());
            }
        }
    });
    let sessions_before = w.transport.host("10.20.0.4").expect("sim").sessions;
    w.transport.with("10.20.0.4", |s| {
        s.kubelet_active = true;
        // Inside the probe timeout (30 s), so the probe succeeds and sees the kubelet.
        s.handshake_delay = std::time::Duration::from_secs(20);
    });
    // The next probe has connected and is stuck in its slow handshake.
    let probing = w
        .until(5 * MINUTE, || async {
            w.transport.host("10.20.0.4").expect("sim").sessions > sessions_before
        })
        .await;
    assert!(probing, "the probe started");
    let nc = w
        .cluster
        .create(&node_claim("nc-s12", "pool", "1", "1Gi"))
        .await
        .expect("nodeclaim");
    let uid = nc.metadata.uid.clone().expect("uid");
    let claimed = w
        .until(std::time::Duration::from_secs(15), || async {
            w.host("z")
                .await
                .and_then(|h| h.claim().map(|c| c.uid.clone()))
                == Some(uid.clone())
        })
        .await;
    assert!(claimed, "the claim landed while the probe was in flight");
    let zombie_seen = w
        .until(MINUTE, || async {
            w.transport.host("10.20.0.4").expect("sim").sessions > sessions_before + 1
        })
        .await;
    assert!(
        zombie_seen,
        "the slow probe finished and the host was used again"
    );
    w.transport.with("10.20.0.4", |s| {
        s.handshake_delay = std::time::Duration::ZERO
    });
    let h = wait_state(&w, "z", HostState::InUse, 10 * MINUTE).await;
    assert_eq!(
        h.claim().map(|c| c.uid.clone()),
        Some(uid),
        "the claim survived the zombie check"
    );
    watcher.abort();
    let states = seen.lock().expect("lock").clone();
    assert!(
        !states.contains(&HostState::Leaving),
        "the host entered Leaving: {states:?}"
    );
    // The kubelet is still there when the claim's launch comes to join: the launch, not the
    // zombie check, runs leave first (never through the Leaving state), then joins.
    let sim = w.transport.host("10.20.0.4").expect("sim");
    assert_eq!(sim.phases(), vec![SimPhase::Leave, SimPhase::Join]);
}

/// A cold host `name` whose phases take a minute each, claimed by a NodeClaim: returns once
/// it is Claimed, its install under way.
async fn claimed_while_installing(w: &kpssh::sim::world::World, name: &str, address: &str) {
    let mut sim = SimHost::new(address, 2, 4_000_000);
    sim.phase_latency = MINUTE;
    w.add_host(name, "small", sim).await.expect("host");
    wait_state(w, name, HostState::Available, MINUTE).await;
    let claim = kpssh::sim::world::node_claim(&format!("nc-{name}"), "pool", "1", "1Gi");
    w.cluster.create(&claim).await.expect("nodeclaim");
    wait_state(w, name, HostState::Claimed, MINUTE).await;
}

/// S9 on a claimed host (found by the fault campaign): a host rebooted while claimed, and the
/// kubelet of its last Node, left enabled by a bad leave profile, came back before the new
/// claim's join. The launch probes before it joins: leave runs first, the Node the old
/// kubelet ran as is deleted once it is stopped, and only then does the join run — the host
/// never backs two Nodes.
#[tokio::test(start_paused = true)]
async fn s9_kubelet_back_on_claimed_host_leaves_before_join() {
    use k8s_openapi::api::core::v1::Node;

    let w = world().await;
    // The install takes a minute: the window in which the old kubelet returns.
    claimed_while_installing(&w, "z", "10.20.0.5").await;
    // The kubelet of this host's earlier (Static) claim: its Node carries the host's provider
    // ID, which is what ties it to the host (an IP alone would not).
    let old_env = std::collections::BTreeMap::from([
        ("KPSSH_NODE_NAME".to_string(), "old-node".to_string()),
        ("KPSSH_NODE_ADDRESS".to_string(), "10.20.0.5".to_string()),
        (
            "KPSSH_PROVIDER_ID".to_string(),
            format!("kpssh://{}/z", kpssh::api::DEFAULT_POOL_NAMESPACE),
        ),
    ]);
    w.transport.with("10.20.0.5", |s| {
        s.kubelet_enabled = true;
        s.kubelet_active = true;
        s.set_kubelet_env(Some(old_env.clone()));
    });
    // The returning kubelet registers its old Node again.
    w.transport.kubelet_restarted("10.20.0.5");
    let old_node_exists = || async {
        w.cluster
            .get::<Node>(None, "old-node")
            .await
            .ok()
            .flatten()
            .is_some()
    };
    let old_registered = w.until(MINUTE, old_node_exists).await;
    assert!(old_registered, "the old kubelet registered its Node");

    wait_state(&w, "z", HostState::InUse, 5 * MINUTE).await;
    let sim = w.transport.host("10.20.0.5").expect("sim");
    assert_eq!(
        sim.phases(),
        vec![SimPhase::Install, SimPhase::Leave, SimPhase::Join],
        "leave ran between install and join"
    );
    let new_node = sim
        .kubelet_node()
        .expect("the new kubelet runs")
        .to_string();
    assert_ne!(new_node, "old-node");
    let old_gone = w.until(MINUTE, || async { !old_node_exists().await }).await;
    assert!(old_gone, "the old kubelet's Node is deleted");
    assert!(reasons(&w).contains(&"ZombieKubelet".to_string()));
    let violations = w.transport.drain_journal().violations;
    assert!(violations.is_empty(), "{violations:?}");
}

/// The simulated host's side of the same fault: a reboot that begins and ends while a phase
/// runs cuts that phase's session, even though the host is up again when the command would
/// have finished. (Before, the session survived and the join ran over the kubelet the reboot
/// had brought back.)
#[tokio::test(start_paused = true)]
async fn reboot_during_a_phase_cuts_its_session() {
    let w = world().await;
    claimed_while_installing(&w, "r", "10.20.0.6").await;
    // The install is in flight for a minute; the host reboots for ten seconds inside it.
    w.transport.with("10.20.0.6", |s| s.power_off());
    tokio::time::sleep(std::time::Duration::from_secs(10)).await;
    w.transport.with("10.20.0.6", |s| {
        s.powered = true;
        s.reboot();
    });
    let cut = w
        .until(2 * MINUTE, || async {
            w.transport
                .drain_journal()
                .actions
                .iter()
                .any(|a| a.host == "10.20.0.6" && a.what == "install cut off by power loss")
        })
        .await;
    assert!(cut, "the install's session was cut by the reboot");
}
