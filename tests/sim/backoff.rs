//! S63/S64 on the simulation: failed launches back off per host (exponential, persisted,
//! reset by a registered launch, a spec edit or a key Secret edit), a backing-off host is not
//! chosen, a class whose launches keep failing the same way pauses, and a failed phase is
//! recorded as a launch failure, not as a probe error.

use std::time::Duration;

use kpssh::api::{HostState, NodeClaim, SSHHost, SSHNodeClass};
use kpssh::k8s::Cluster;
use kpssh::provider::Config;
use kpssh::sim::world::{World, node_claim};
use kpssh::sim::{SimHost, SimPhase};
use serde_json::json;

use super::{MINUTE, reasons, wait_state, world_with};

/// Probes every 10 s so that a host is Available again well before its backoff ends.
fn config() -> Config {
    Config {
        probe_interval: Duration::from_secs(10),
        ..Config::default()
    }
}

async fn claim(w: &World, name: &str) -> NodeClaim {
    w.cluster
        .create(&node_claim(name, "pool", "1", "1Gi"))
        .await
        .expect("nodeclaim")
}

fn backoff_of(h: &SSHHost) -> (i32, bool) {
    let b = h.status.as_ref().and_then(|s| s.launch_backoff.clone());
    (
        b.as_ref().map_or(0, |b| b.failures),
        b.is_some_and(|b| b.until.is_some()),
    )
}

async fn fail_install_next(w: &World, address: &str, code: u32) {
    w.transport
        .with(address, |h| {
            h.fail_next.insert(SimPhase::Install, code);
        })
        .expect("sim host");
}

/// Wait until `nodeclaim` is gone (its launch failed) and the host holds no claim.
async fn wait_failed(w: &World, host: &str, nodeclaim: &str) -> SSHHost {
    let ok = w
        .until(MINUTE, || async {
            let gone = w
                .cluster
                .get::<NodeClaim>(None, nodeclaim)
                .await
                .expect("get")
                .is_none();
            gone && w.host(host).await.is_some_and(|h| h.claim().is_none())
        })
        .await;
    assert!(ok, "launch of {nodeclaim} did not fail and release");
    w.host(host).await.expect("host")
}

#[tokio::test(start_paused = true)]
async fn s63_failed_launches_back_off_exponentially_and_a_success_resets() {
    let w = world_with(config()).await;
    w.add_host("h", "small", SimHost::new("10.40.0.1", 2, 4_000_000))
        .await
        .expect("host");
    wait_state(&w, "h", HostState::Available, MINUTE).await;

    fail_install_next(&w, "10.40.0.1", 100).await;
    claim(&w, "a").await;
    let h = wait_failed(&w, "h", "a").await;
    assert_eq!(backoff_of(&h), (1, true), "{:?}", h.status);
    let status = h.status.clone().expect("status");
    // S64: the phase failure is a launch failure, not a probe error.
    assert!(status.last_probe_error.is_none(), "{status:?}");
    let failure = status.last_launch_failure.expect("lastLaunchFailure");
    assert_eq!(failure.phase, "install");
    assert_eq!(failure.exit_status, Some(100));
    assert_eq!(failure.node_claim.as_deref(), Some("a"));
    assert!(
        failure.message.contains("install exited with status 100"),
        "{}",
        failure.message
    );
    let until = |h: &SSHHost| {
        h.status
            .as_ref()
            .and_then(|s| s.launch_backoff.as_ref())
            .and_then(|b| b.until.clone())
            .map(|t| t.0)
    };
    let first_wait = until(&h).expect("until").duration_since(w.ctx.clock.now());
    assert!(
        (55..=73).contains(&first_wait.as_secs()),
        "first backoff ≈ 60 s (+ ≤ 20% jitter): {first_wait:?}"
    );

    // The probe makes it Available again, but the router does not choose it meanwhile.
    let h = wait_state(&w, "h", HostState::Available, Duration::from_secs(30)).await;
    assert!(h.backing_off());
    let ready = h
        .status
        .as_ref()
        .and_then(|s| s.conditions.iter().find(|c| c.type_ == "Ready").cloned())
        .expect("Ready");
    assert!(
        ready.message.contains("not claimed before"),
        "{}",
        ready.message
    );
    claim(&w, "b").await;
    let insufficient = w
        .until(Duration::from_secs(20), || async {
            reasons(&w).iter().any(|r| r == "InsufficientCapacity")
        })
        .await;
    assert!(insufficient, "a backing-off host is not claimed");
    assert!(w.host("h").await.expect("host").claim().is_none());

    // The backoff runs out on time; the next failure waits twice as long.
    let ok = w
        .until(Duration::from_secs(60), || async {
            w.host("h").await.is_some_and(|h| !h.backing_off())
        })
        .await;
    assert!(ok, "backoff ran out");
    fail_install_next(&w, "10.40.0.1", 100).await;
    claim(&w, "c").await;
    let h = wait_failed(&w, "h", "c").await;
    assert_eq!(backoff_of(&h), (2, true));
    let second_wait = until(&h).expect("until").duration_since(w.ctx.clock.now());
    assert!(
        (115..=145).contains(&second_wait.as_secs()),
        "second backoff ≈ 120 s: {second_wait:?}"
    );

    // Persisted: a restarted controller still holds the host back.
    let mut w = w;
    w.crash_and_restart(8).await.expect("restart");
    let h = w.host("h").await.expect("host");
    assert_eq!(backoff_of(&h), (2, true), "kept across a restart");

    // A launch whose Node registers resets it.
    let ok = w
        .until(Duration::from_secs(200), || async {
            w.host("h").await.is_some_and(|h| !h.backing_off())
                && w.host("h")
                    .await
                    .is_some_and(|h| h.state() == HostState::Available)
        })
        .await;
    assert!(ok, "backoff ran out after the restart");
    claim(&w, "d").await;
    let h = wait_state(&w, "h", HostState::InUse, 2 * MINUTE).await;
    let status = h.status.expect("status");
    assert!(status.launch_backoff.is_none(), "{status:?}");
    assert!(status.last_launch_failure.is_none());
}

#[tokio::test(start_paused = true)]
async fn s63_a_spec_or_key_secret_edit_resets_the_backoff() {
    let w = world_with(config()).await;
    w.add_host("h", "small", SimHost::new("10.41.0.1", 2, 4_000_000))
        .await
        .expect("host");
    wait_state(&w, "h", HostState::Available, MINUTE).await;
    fail_install_next(&w, "10.41.0.1", 7).await;
    claim(&w, "a").await;
    let h = wait_failed(&w, "h", "a").await;
    assert_eq!(backoff_of(&h), (1, true));
    // Rotate the key: the backoff goes, and the host is probed at once.
    let secret = h.spec.ssh_key_secret_ref.name.clone();
    let patch = json!({"metadata": {"annotations": {"rotated": "1"}}});
    let _: k8s_openapi::api::core::v1::Secret = w
        .cluster
        .patch(Some(&w.ns()), &secret, &patch)
        .await
        .expect("edit secret");
    let ok = w
        .until(Duration::from_secs(5), || async {
            w.host("h")
                .await
                .is_some_and(|h| backoff_of(&h) == (0, false))
        })
        .await;
    assert!(ok, "key Secret edit resets the backoff");
    assert!(reasons(&w).iter().any(|r| r == "LaunchBackoff"));

    // A spec edit resets it too.
    fail_install_next(&w, "10.41.0.1", 7).await;
    wait_state(&w, "h", HostState::Available, MINUTE).await;
    claim(&w, "b").await;
    let h = wait_failed(&w, "h", "b").await;
    assert_eq!(backoff_of(&h), (1, true));
    let patch = json!({"spec": {"user": "admin"}});
    let _: SSHHost = w
        .cluster
        .patch(Some(&w.ns()), "h", &patch)
        .await
        .expect("edit spec");
    let ok = w
        .until(Duration::from_secs(5), || async {
            w.host("h")
                .await
                .is_some_and(|h| backoff_of(&h) == (0, false))
        })
        .await;
    assert!(ok, "spec edit resets the backoff");
}

#[tokio::test(start_paused = true)]
async fn s63_a_class_whose_launches_fail_the_same_way_pauses() {
    let w = world_with(config()).await;
    for i in 1..=4 {
        let address = format!("10.42.0.{i}");
        let mut sim = SimHost::new(&address, 2, 4_000_000);
        sim.fail_next.insert(SimPhase::Install, 100);
        w.add_host(&format!("h{i}"), "small", sim)
            .await
            .expect("host");
    }
    for i in 1..=4 {
        wait_state(&w, &format!("h{i}"), HostState::Available, MINUTE).await;
    }
    for name in ["a", "b", "c"] {
        claim(&w, name).await;
        let ok = w
            .until(MINUTE, || async {
                w.cluster
                    .get::<NodeClaim>(None, name)
                    .await
                    .expect("get")
                    .is_none()
            })
            .await;
        assert!(ok, "{name} failed and went");
    }
    let ok = w
        .until(Duration::from_secs(30), || async {
            let class: Option<SSHNodeClass> = w.cluster.get(None, "pool").await.expect("get");
            class
                .and_then(|c| c.status)
                .and_then(|s| s.conditions.into_iter().find(|c| c.type_ == "Ready"))
                .is_some_and(|c| c.status == "False" && c.reason == "LaunchesFailing")
        })
        .await;
    assert!(ok, "three install failures with status 100 pause the class");
    let event = w
        .cluster
        .events()
        .into_iter()
        .find(|e| e.reason == "LaunchesFailing")
        .expect("an event on the class");
    assert!(
        event.message.contains("install exited with status 100"),
        "{}",
        event.message
    );
    // The pause runs out (5 minutes) and the class is Ready again.
    let ok = w
        .until(Duration::from_secs(6 * 60), || async {
            let class: Option<SSHNodeClass> = w.cluster.get(None, "pool").await.expect("get");
            class
                .and_then(|c| c.status)
                .and_then(|s| s.conditions.into_iter().find(|c| c.type_ == "Ready"))
                .is_some_and(|c| c.status == "True")
        })
        .await;
    assert!(ok, "the pause runs out");
}

#[tokio::test(start_paused = true)]
async fn s63_s64_a_join_without_a_node_waits_visibly_then_backs_off() {
    let w = super::world().await;
    let mut sim = SimHost::new("10.43.0.1", 2, 4_000_000);
    sim.registers = false;
    w.add_host("h", "small", sim).await.expect("host");
    wait_state(&w, "h", HostState::Available, MINUTE).await;
    claim(&w, "silent").await;
    // S64: while the Node is awaited the NodeClaim says so, with its deadline.
    let ok = w
        .until(MINUTE, || async {
            let nc: Option<NodeClaim> = w.cluster.get(None, "silent").await.expect("get");
            nc.and_then(|n| n.status).is_some_and(|s| {
                s.conditions
                    .iter()
                    .any(|c| c.type_ == "Registered" && c.reason == "AwaitingNode")
            })
        })
        .await;
    assert!(ok, "Registered=Unknown AwaitingNode");
    let nc: NodeClaim = w
        .cluster
        .get(None, "silent")
        .await
        .expect("get")
        .expect("nc");
    let created = nc.metadata.creation_timestamp.clone().expect("created").0;
    let cond = nc
        .status
        .expect("status")
        .conditions
        .into_iter()
        .find(|c| c.type_ == "Registered")
        .expect("condition");
    assert_eq!(cond.status, "Unknown");
    let deadline = (created + jiff::SignedDuration::from_mins(15))
        .strftime("%Y-%m-%dT%H:%M:%SZ")
        .to_string();
    assert!(cond.message.contains(&deadline), "{}", cond.message);
    assert!(cond.message.contains("kpssh://"), "{}", cond.message);
    // The karpenter layer is not running in this world: give the NodeClaim up as it would
    // after the registration timeout.
    tokio::time::sleep(15 * MINUTE).await;
    w.cluster
        .delete::<NodeClaim>(None, "silent", None)
        .await
        .expect("delete");
    let ok = w
        .until(2 * MINUTE, || async {
            w.host("h").await.is_some_and(|h| {
                h.status
                    .as_ref()
                    .and_then(|s| s.last_launch_failure.as_ref())
                    .is_some_and(|f| f.phase == "registration" && f.reason == "RegistrationTimeout")
            })
        })
        .await;
    let h = w.host("h").await.expect("host");
    assert!(ok, "registration failure recorded: {:?}", h.status);
    assert_eq!(backoff_of(&h).0, 1, "{:?}", h.status);
    assert!(h.claim().is_none(), "released");
}

/// `kpssh probe --host`: the annotation makes the actor probe now (probe interval 2 min) and
/// stamp lastProbeTime; the command reports the outcome. A key Secret edit probes at once too.
#[tokio::test(start_paused = true)]
async fn s63_a_probe_can_be_asked_for_and_a_secret_edit_probes_at_once() {
    let w = super::world().await;
    w.add_host("h", "small", SimHost::new("10.44.0.1", 2, 4_000_000))
        .await
        .expect("host");
    wait_state(&w, "h", HostState::Available, MINUTE).await;
    tokio::time::sleep(Duration::from_secs(10)).await;
    let sessions = w.transport.host("10.44.0.1").expect("sim").sessions;
    let now = w.ctx.clock.now();
    let out =
        kpssh::cli::probe_request::request(&w.cluster, &w.ns(), "h", Duration::from_secs(5), now)
            .await
            .expect("request");
    assert!(out.healthy, "{out:?}");
    assert_eq!(out.text, format!("SSHHost {}/h: Available", w.ns()));
    assert!(
        w.transport.host("10.44.0.1").expect("sim").sessions > sessions,
        "probed over SSH now, not at the next interval"
    );
    // The host is unreachable now: the asked-for probe says so.
    w.transport
        .with("10.44.0.1", |h| h.reachable = false)
        .expect("sim");
    tokio::time::sleep(Duration::from_secs(2)).await;
    let now = w.ctx.clock.now();
    let out =
        kpssh::cli::probe_request::request(&w.cluster, &w.ns(), "h", Duration::from_secs(5), now)
            .await
            .expect("request");
    assert!(!out.healthy);
    assert!(out.text.contains("probe error:"), "{}", out.text);
    // Reachable again, and the key Secret edited: probed at once (no 2-minute wait).
    w.transport
        .with("10.44.0.1", |h| h.reachable = true)
        .expect("sim");
    let h = w.host("h").await.expect("host");
    let patch = json!({"metadata": {"annotations": {"rotated": "1"}}});
    let _: k8s_openapi::api::core::v1::Secret = w
        .cluster
        .patch(Some(&w.ns()), &h.spec.ssh_key_secret_ref.name, &patch)
        .await
        .expect("edit secret");
    let h = wait_state(&w, "h", HostState::Available, Duration::from_secs(5)).await;
    assert!(h.status.and_then(|s| s.last_probe_error).is_none());
    let missing = kpssh::cli::probe_request::request(
        &w.cluster,
        &w.ns(),
        "nope",
        Duration::from_secs(1),
        now,
    )
    .await;
    let err = missing.expect_err("no such host").to_string();
    assert!(
        err.contains("SSHHost") && err.contains("not found"),
        "{err}"
    );
}
