//! E3 reboot of a warm host, E4 force-deleted NodeClaim, E5 power loss during leave.

use std::time::Duration;

use k8s_openapi::api::core::v1::Event;
use kpssh::api::{HostState, NodeClaim};
use kube::api::{DeleteParams, ListParams, Patch, PatchParams};

use crate::scale::check_warm_and_disabled;
use crate::testhost::ExecMode;
use crate::world::{POOL_NS, Sc, profile};

/// Successful sessions the host ran so far (`exit 0 …` lines of its command log).
fn ok_sessions(sc: &Sc, h: usize) -> usize {
    sc.hosts[h]
        .command_log()
        .lines()
        .filter(|l| l.starts_with("exit 0 "))
        .count()
}

/// No Node for host `h`, no running kubelet, no NodeClaim of this scenario, host Available.
async fn stays_out(sc: &Sc, h: usize) -> Result<Option<String>, String> {
    if let Some(n) = sc.node_of(h).await? {
        return Ok(Some(format!("a Node came back: {:?}", n.metadata.name)));
    }
    if sc.hosts[h].unit_active("kubelet") {
        return Ok(Some("the kubelet runs again".into()));
    }
    if let Some(nc) = sc.nodeclaims().await?.first() {
        return Ok(Some(format!(
            "a NodeClaim appeared: {:?}",
            nc.metadata.name
        )));
    }
    let state = sc.host_state(h).await?;
    if state != HostState::Available {
        return Ok(Some(format!("host went {state:?}")));
    }
    Ok(None)
}

/// E3: a host that joined and left (warm: kubelet installed, credentials on disk, units
/// disabled) is rebooted: enabled units start, nothing else; it never rejoins on its own and
/// keeps probing Available.
pub async fn e3(sc: &mut Sc) -> Result<(), String> {
    let h = sc.add_host(ExecMode::Raw, None).await;
    sc.class_and_profile(profile(&format!("e2e-{}", sc.id), &sc.world.base))
        .await;
    sc.nodepool("0s").await;
    let node = sc.scale_up(h).await?;
    sc.scale(0).await?;
    sc.consolidated(h, &node).await?;
    check_warm_and_disabled(sc, h)?;
    if sc.hosts[h].read("etc/units/kubelet").is_empty() {
        return Err("the kubelet unit should stay installed (warm pool)".into());
    }

    sc.hosts[h].reboot();
    let before = ok_sessions(sc, h);
    sc.wait(
        "probes succeed after the reboot",
        Duration::from_secs(60),
        || async { Ok((ok_sessions(sc, h) >= before + 2).then_some(())) },
    )
    .await?;
    sc.hold(
        "E3: the rebooted warm host stays out of the cluster",
        Duration::from_secs(90),
        || stays_out(sc, h),
    )
    .await?;
    if ok_sessions(sc, h) < before + 10 {
        return Err("the host was not probed every interval after the reboot".into());
    }
    Ok(())
}

/// E4: the NodeClaim is force-deleted (finalizers stripped) while its Node runs. The claim is
/// released as stale, the zombie guard sees a kubelet on an unclaimed host that kpssh
/// installed, runs leave and deletes the orphan Node; the host is Available and nothing
/// rejoins (the fake kubelet re-registers a deleted Node while it runs, so a kubelet that
/// was not stopped would show).
pub async fn e4(sc: &mut Sc) -> Result<(), String> {
    let h = sc.add_host(ExecMode::Raw, None).await;
    sc.class_and_profile(profile(&format!("e2e-{}", sc.id), &sc.world.base))
        .await;
    sc.nodepool("Never").await;
    sc.wait("host Available", Duration::from_secs(90), || async {
        Ok((sc.host_state(h).await? == HostState::Available).then_some(()))
    })
    .await?;
    // A bare pod: once its Node is gone nothing re-creates it, so no new claim is wanted.
    sc.bare_pod().await;
    let node = sc.up_after_pending(h).await?;

    let claims = sc.api::<NodeClaim>();
    let strip = Patch::Merge(serde_json::json!({"metadata": {"finalizers": null}}));
    let _ = claims.patch(&node, &PatchParams::default(), &strip).await;
    let _ = claims.delete(&node, &DeleteParams::default()).await;
    sc.wait(
        "the NodeClaim force-deleted",
        Duration::from_secs(20),
        || async {
            match claims.get_opt(&node).await.map_err(|e| e.to_string())? {
                None => Ok(Some(())),
                Some(_) => {
                    let _ = claims.patch(&node, &PatchParams::default(), &strip).await;
                    Ok(None)
                }
            }
        },
    )
    .await?;

    sc.wait(
        "the orphan Node deleted by the zombie guard",
        Duration::from_secs(120),
        || async { Ok(sc.node_of(h).await?.is_none().then_some(())) },
    )
    .await?;
    sc.wait("host Available", Duration::from_secs(60), || async {
        let host = sc.host(h).await?;
        Ok((host.state() == HostState::Available && host.claim().is_none()).then_some(()))
    })
    .await?;
    check_warm_and_disabled(sc, h)?;
    expect_host_events(sc, h, &["ZombieKubelet", "ZombieLeft"]).await?;
    sc.hold("E4: nothing rejoins", Duration::from_secs(20), || {
        stays_out(sc, h)
    })
    .await
}

/// E5: power loss while leave runs. The leave fails, the claim is released anyway and the
/// host is Unhealthy; when power returns the still-enabled kubelet comes back, and the
/// zombie guard cleans the host up to Available (leave, Node deleted).
pub async fn e5(sc: &mut Sc) -> Result<(), String> {
    let h = sc.add_host(ExecMode::Raw, None).await;
    sc.class_and_profile(profile(&format!("e2e-{}", sc.id), &sc.world.base))
        .await;
    sc.nodepool("0s").await;
    let node = sc.scale_up(h).await?;
    let hold = sc.hosts[h].root.join("hold-leave");
    std::fs::write(&hold, "").map_err(|e| e.to_string())?;
    sc.scale(0).await?;
    sc.wait(
        "leave started (held on the host)",
        Duration::from_secs(150),
        || async {
            Ok(sc.hosts[h]
                .read("var/log/phases")
                .lines()
                .any(|l| l == "leave")
                .then_some(()))
        },
    )
    .await?;
    sc.hosts[h].power_off();
    sc.wait(
        "S24: host Unhealthy with its claim released",
        Duration::from_secs(120),
        || async {
            let host = sc.host(h).await?;
            Ok((host.state() == HostState::Unhealthy && host.claim().is_none()).then_some(()))
        },
    )
    .await?;
    if sc.hosts[h].read("var/log/phases").contains("left") {
        return Err("leave must not have finished before the power went".into());
    }
    std::fs::remove_file(&hold).map_err(|e| e.to_string())?;
    sc.hosts[h].power_on();
    if !sc.hosts[h].unit_active("kubelet") {
        return Err("the still-enabled kubelet should start at boot".into());
    }
    if sc.node_of(h).await?.is_none() {
        return Err("the Node must be kept after a failed leave (its kubelet may run)".into());
    }
    sc.wait(
        "the Node deleted after the cleanup",
        Duration::from_secs(150),
        || async { Ok(sc.node_of(h).await?.is_none().then_some(())) },
    )
    .await?;
    sc.wait(
        "host cleaned up to Available",
        Duration::from_secs(60),
        || async {
            let host = sc.host(h).await?;
            Ok((host.state() == HostState::Available && host.claim().is_none()).then_some(()))
        },
    )
    .await?;
    for unit in crate::testhost::UNITS {
        if sc.hosts[h].unit_enabled(unit) || sc.hosts[h].unit_active(unit) {
            return Err(format!("{unit} still enabled or running after the cleanup"));
        }
    }
    let _ = node;
    expect_host_events(sc, h, &["ZombieKubelet", "ZombieLeft"]).await?;
    sc.hold("E5: nothing rejoins", Duration::from_secs(15), || {
        stays_out(sc, h)
    })
    .await
}

/// S9: the zombie guard's events on the SSHHost.
async fn expect_host_events(sc: &Sc, h: usize, wanted: &[&str]) -> Result<(), String> {
    let events = sc
        .ns_api::<Event>(POOL_NS)
        .list(&ListParams::default())
        .await
        .map_err(|e| e.to_string())?;
    let reasons: Vec<String> = events
        .items
        .iter()
        .filter(|e| e.involved_object.name.as_deref() == Some(sc.host_name(h).as_str()))
        .filter_map(|e| e.reason.clone())
        .collect();
    for want in wanted {
        if !reasons.iter().any(|r| r == want) {
            return Err(format!(
                "S9: event {want} missing; host events: {reasons:?}"
            ));
        }
    }
    Ok(())
}
