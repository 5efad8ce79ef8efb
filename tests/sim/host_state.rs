//! Probe and host state: S1–S8.

use std::time::Duration;

use kpssh::api::{HostState, MAINTENANCE_ANNOTATION, SSHHost};
use kpssh::k8s::Cluster;
use kpssh::sim::SimHost;
use serde_json::json;

use super::{MINUTE, reasons, wait_state, world};

fn ready(h: &SSHHost) -> (String, String) {
    let c = h
        .status
        .as_ref()
        .and_then(|s| s.conditions.iter().find(|c| c.type_ == "Ready"))
        .expect("Ready condition");
    (c.status.clone(), c.reason.clone())
}

#[tokio::test(start_paused = true)]
async fn s1_new_host_becomes_available_with_pinned_key_and_facts() {
    let w = world().await;
    let mut sim = SimHost::new("10.0.0.1", 4, 8_000_000);
    sim.arch = "aarch64".into();
    let fingerprint = sim.fingerprint.clone();
    w.add_host("h1", "small", sim).await.expect("host");
    let h = wait_state(&w, "h1", HostState::Available, MINUTE).await;
    let s = h.status.clone().expect("status");
    assert_eq!(
        s.host_key_fingerprint.as_deref(),
        Some(fingerprint.as_str())
    );
    assert_eq!(s.observed_arch.as_deref(), Some("arm64"));
    let cap = s.observed_capacity.expect("observed capacity");
    assert_eq!(cap["cpu"].0, "4");
    assert_eq!(cap["memory"].0, "8000000Ki");
    assert_eq!(ready(&h), ("True".into(), "ProbeSucceeded".into())); // S8
}

#[tokio::test(start_paused = true)]
async fn s2_unreachable_host_goes_unhealthy_and_recovers() {
    let w = world().await;
    let mut sim = SimHost::new("10.0.0.2", 2, 4_000_000);
    sim.reachable = false;
    w.add_host("h2", "small", sim).await.expect("host");
    let h = wait_state(&w, "h2", HostState::Unhealthy, MINUTE).await;
    let err = h
        .status
        .as_ref()
        .and_then(|s| s.last_probe_error.clone())
        .expect("error recorded");
    assert!(err.contains("refused"), "{err}");
    assert_eq!(ready(&h), ("False".into(), "ProbeFailed".into())); // S8
    w.transport.with("10.0.0.2", |s| s.reachable = true);
    let h = wait_state(&w, "h2", HostState::Available, 3 * MINUTE).await;
    assert!(h.status.expect("status").last_probe_error.is_none());
}

#[tokio::test(start_paused = true)]
async fn s3_changed_host_key_fails_before_any_session() {
    let w = world().await;
    w.add_host("h3", "small", SimHost::new("10.0.0.3", 2, 4_000_000))
        .await
        .expect("host");
    wait_state(&w, "h3", HostState::Available, MINUTE).await;
    let sessions = w.transport.host("10.0.0.3").expect("sim").sessions;
    w.transport.with("10.0.0.3", |s| {
        s.fingerprint = format!("SHA256:{:z<43}", "")
    });
    let h = wait_state(&w, "h3", HostState::Unhealthy, 3 * MINUTE).await;
    let err = h.status.and_then(|s| s.last_probe_error).expect("error");
    assert!(err.contains("host key mismatch"), "{err}");
    assert_eq!(
        w.transport.host("10.0.0.3").expect("sim").sessions,
        sessions,
        "no session opened"
    );
}

#[tokio::test(start_paused = true)]
async fn s4_unchanged_probe_writes_nothing_and_spec_edit_probes_at_once() {
    let w = world().await;
    w.add_host("h4", "small", SimHost::new("10.0.0.4", 2, 4_000_000))
        .await
        .expect("host");
    wait_state(&w, "h4", HostState::Available, MINUTE).await;
    let before = w.cluster.stats().status_writes;
    let sessions = w.transport.host("10.0.0.4").expect("sim").sessions;
    tokio::time::sleep(10 * MINUTE).await;
    let probes = w.transport.host("10.0.0.4").expect("sim").sessions - sessions;
    assert!(
        (4..=6).contains(&probes),
        "probed {probes} times in 10 minutes at a 2m interval"
    );
    assert_eq!(
        w.cluster.stats().status_writes,
        before,
        "unchanged probes wrote nothing"
    );
    let mut h: SSHHost = w.host("h4").await.expect("host");
    h.spec.user = "admin".into();
    w.cluster.replace(&h).await.expect("spec edit");
    let sessions = w.transport.host("10.0.0.4").expect("sim").sessions;
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert!(
        w.transport.host("10.0.0.4").expect("sim").sessions > sessions,
        "probed at once"
    );
    let h = w.host("h4").await.expect("host");
    assert_eq!(h.status.and_then(|s| s.observed_generation), Some(2));
}

#[tokio::test(start_paused = true)]
async fn s5_unparsable_probe_output_is_unhealthy_never_zero_capacity() {
    let w = world().await;
    let mut sim = SimHost::new("10.0.0.5", 2, 4_000_000);
    sim.probe_output = Some("kpssh-probe=1\ncpu=\nmemory_kib=abc\n".into());
    w.add_host("h5", "small", sim).await.expect("host");
    let h = wait_state(&w, "h5", HostState::Unhealthy, MINUTE).await;
    let s = h.status.expect("status");
    assert!(s.last_probe_error.expect("error").contains("unparsable"));
    assert!(s.observed_capacity.is_none());
}

#[tokio::test(start_paused = true)]
async fn s6_capacity_drift_is_reported_once_per_episode() {
    let w = world().await;
    w.add_host("h6", "small", SimHost::new("10.0.0.6", 4, 8_000_000))
        .await
        .expect("host");
    wait_state(&w, "h6", HostState::Available, MINUTE).await;
    w.transport.with("10.0.0.6", |s| s.cpu = 2);
    tokio::time::sleep(10 * MINUTE).await;
    let drift = reasons(&w).iter().filter(|r| *r == "CapacityDrift").count();
    assert_eq!(drift, 1, "one warning for the episode");
}

#[tokio::test(start_paused = true)]
async fn s7_maintenance_parks_without_ssh_and_release_probes_again() {
    let w = world().await;
    w.add_host("h7", "small", SimHost::new("10.0.0.7", 2, 4_000_000))
        .await
        .expect("host");
    wait_state(&w, "h7", HostState::Available, MINUTE).await;
    let patch = json!({"metadata": {"annotations": {MAINTENANCE_ANNOTATION: ""}}});
    w.cluster
        .patch::<SSHHost>(Some(&w.ns()), "h7", &patch)
        .await
        .expect("annotate");
    let h = wait_state(&w, "h7", HostState::Maintenance, MINUTE).await;
    assert_eq!(ready(&h), ("False".into(), "Maintenance".into())); // S8
    let sessions = w.transport.host("10.0.0.7").expect("sim").sessions;
    tokio::time::sleep(10 * MINUTE).await;
    assert_eq!(
        w.transport.host("10.0.0.7").expect("sim").sessions,
        sessions,
        "no SSH while parked"
    );
    let patch = json!({"metadata": {"annotations": {MAINTENANCE_ANNOTATION: null}}});
    w.cluster
        .patch::<SSHHost>(Some(&w.ns()), "h7", &patch)
        .await
        .expect("remove");
    wait_state(&w, "h7", HostState::Available, MINUTE).await;
    assert!(w.transport.host("10.0.0.7").expect("sim").sessions > sessions);
}
