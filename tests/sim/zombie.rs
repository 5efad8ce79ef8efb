//! Zombie guard: S9–S11.

use kpssh::api::{HostState, SSHHost};
use kpssh::k8s::Cluster;
use kpssh::sim::{SimHost, SimPhase};

use super::{MINUTE, reasons, wait_state, world};

#[tokio::test(start_paused = true)]
async fn s9_zombie_kubelet_on_installed_host_is_disconnected() {
    let w = world().await;
    w.add_host("z", "small", SimHost::new("10.20.0.1", 2, 4_000_000))
        .await
        .expect("host");
    let h = wait_state(&w, "z", HostState::Available, MINUTE).await;
    let mut marked: SSHHost = h.clone();
    marked.status.as_mut().expect("status").installed_profile = Some("p@1".into());
    w.cluster.replace_status(&marked).await.expect("marker");
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
    w.add_host("z", "small", SimHost::new("10.20.0.3", 2, 4_000_000))
        .await
        .expect("host");
    let h = wait_state(&w, "z", HostState::Available, MINUTE).await;
    let mut marked: SSHHost = h.clone();
    marked.status.as_mut().expect("status").installed_profile = Some("p@1".into());
    w.cluster.replace_status(&marked).await.expect("marker");
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
