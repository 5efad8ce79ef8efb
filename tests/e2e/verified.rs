//! E6–E8: Verified execution. Hosts run every command through the real `kpssh-shim`
//! (ForceCommand) with a local `allowed_signers`; profiles are signed with `kpssh sign`.

use std::time::Duration;

use k8s_openapi::api::core::v1::Event;
use kpssh::api::{HostState, SSHJoinProfile};
use kpssh::profile::verified::sshsig::allowed_signers_line;
use kube::api::ListParams;

use crate::scale::check_warm_and_disabled;
use crate::sshd::KeyPair;
use crate::testhost::ExecMode;
use crate::world::{Sc, profile, sign};

/// A Verified host whose shim trusts only the signer; the controller trusts `trusted`.
async fn verified_host(sc: &mut Sc, trusted: &[&KeyPair]) -> Result<usize, String> {
    let allowed = allowed_signers_line(&sc.world.signer.public).map_err(|e| e.to_string())?;
    let signers = trusted.iter().map(|k| k.public.clone()).collect();
    Ok(sc
        .add_host(
            ExecMode::Verified {
                allowed_signers: format!("{allowed}\n"),
            },
            Some(signers),
        )
        .await)
}

fn sessions(sc: &Sc, h: usize, prefix: &str) -> Vec<String> {
    sc.hosts[h]
        .command_log()
        .lines()
        .filter(|l| l.starts_with(prefix))
        .map(str::to_string)
        .collect()
}

pub fn profile_dir(sc: &Sc) -> std::path::PathBuf {
    let dir = sc.world.base.join(format!("profiles-{}", sc.id));
    let _ = std::fs::create_dir_all(&dir);
    dir
}

/// E6: a signed profile joins and leaves a Verified host through the shim: the Node comes up
/// with the pod Running, consolidation runs leave, the host is warm and disabled again.
pub async fn e6(sc: &mut Sc) -> Result<(), String> {
    let signer = &sc.world.signer;
    let h = verified_host(sc, &[signer]).await?;
    let signed = sign(
        &profile(&format!("e2e-{}", sc.id), &sc.world.base),
        signer,
        &profile_dir(sc),
    );
    if signed.spec.signatures_v2.is_none() {
        return Err("kpssh sign wrote no v2 signatures".into());
    }
    sc.class_and_profile(signed).await;
    sc.nodepool("0s").await;
    let node = sc.scale_up(h).await?;
    sc.scale(0).await?;
    sc.consolidated(h, &node).await?;
    check_warm_and_disabled(sc, h)?;
    let ok = sessions(sc, h, "exit 0 ");
    for phase in ["install", "join", "leave"] {
        let want = format!("run {phase} e2e-{}@1", sc.id);
        if !ok.iter().any(|l| l.contains(&want)) {
            return Err(format!(
                "S41: no successful shim session `{want}` (v2 envelope): {ok:?}"
            ));
        }
    }
    Ok(())
}

/// E7: the controller is configured to trust a rogue key as well (think: a compromised
/// controller configuration) and the join is rogue-signed; the host's shim trusts only the
/// real signer and refuses it (exit 2). The join never runs: no kubelet, no Node.
pub async fn e7(sc: &mut Sc) -> Result<(), String> {
    let (signer, rogue) = (&sc.world.signer, &sc.world.rogue);
    let h = verified_host(sc, &[signer, rogue]).await?;
    let name = format!("e2e-{}", sc.id);
    let dir = profile_dir(sc);
    let mut good = sign(&profile(&name, &sc.world.base), signer, &dir);
    // The same profile (name, version, scripts and v2 expiry) signed by the rogue key: install
    // and leave keep the real signer's v2 signatures, join gets the rogue's.
    let bad = sign(&profile(&name, &sc.world.base), rogue, &dir);
    let rogue_join = bad
        .spec
        .signatures_v2
        .and_then(|s| s.join)
        .ok_or("no rogue join signature")?;
    let sigs = good.spec.signatures_v2.as_mut().ok_or("no v2 signatures")?;
    sigs.join = Some(rogue_join);
    sc.class_and_profile(good).await;
    sc.nodepool("Never").await;
    sc.wait("host Available", Duration::from_secs(90), || async {
        Ok((sc.host_state(h).await? == HostState::Available).then_some(()))
    })
    .await?;
    sc.deployment(1).await;
    let refused = sc
        .wait(
            "the shim refused the rogue join (exit 2)",
            Duration::from_secs(120),
            || async {
                Ok(sessions(sc, h, "exit 2 ")
                    .into_iter()
                    .find(|l| l.contains("run join")))
            },
        )
        .await?;
    let _ = refused;
    if !sessions(sc, h, "exit 0 ")
        .iter()
        .any(|l| l.contains("run install"))
    {
        return Err("the properly signed install should have run".into());
    }
    sc.wait(
        "S17: the failed join released the host",
        Duration::from_secs(60),
        || async {
            let host = sc.host(h).await?;
            let token = host
                .status
                .as_ref()
                .and_then(|s| s.bootstrap_token_id.clone());
            Ok((host.claim().is_none() && token.is_none()).then_some(()))
        },
    )
    .await?;
    sc.hold(
        "E7: no Node, no kubelet",
        Duration::from_secs(10),
        || async {
            if let Some(n) = sc.node_of(h).await? {
                return Ok(Some(format!("a Node registered: {:?}", n.metadata.name)));
            }
            if sc.hosts[h].unit_enabled("kubelet") || sc.hosts[h].unit_active("kubelet") {
                return Ok(Some("the kubelet was enabled or started".into()));
            }
            if sc.hosts[h].read("var/log/phases").contains("join") {
                return Ok(Some("the rogue join script ran".into()));
            }
            Ok(None)
        },
    )
    .await?;
    let events = launch_events(sc, "LaunchFailed").await?;
    if events.is_empty() {
        return Err("no LaunchFailed event on the NodeClaim".into());
    }
    Ok(())
}

/// E8: an unsigned profile for a Verified host is refused by the controller before any SSH
/// session for a phase: the host only ever sees probes, no token is minted, the host stays
/// Available and the NodeClaim says why.
pub async fn e8(sc: &mut Sc) -> Result<(), String> {
    let signer = &sc.world.signer;
    let h = verified_host(sc, &[signer]).await?;
    let unsigned: SSHJoinProfile = profile(&format!("e2e-{}", sc.id), &sc.world.base);
    sc.class_and_profile(unsigned).await;
    sc.nodepool("Never").await;
    sc.wait("host Available", Duration::from_secs(90), || async {
        Ok((sc.host_state(h).await? == HostState::Available).then_some(()))
    })
    .await?;
    sc.deployment(1).await;
    let events = sc
        .wait(
            "S18: a ConfigurationError on the NodeClaim",
            Duration::from_secs(120),
            || async {
                let e = launch_events(sc, "ConfigurationError").await?;
                Ok((!e.is_empty()).then_some(e))
            },
        )
        .await?;
    if !events.iter().any(|m| m.to_lowercase().contains("sign")) {
        return Err(format!(
            "the NodeClaim event should name the signature: {events:?}"
        ));
    }
    sc.hold(
        "E8: no phase session, no token, host Available",
        Duration::from_secs(15),
        || async {
            let host = sc.host(h).await?;
            if host
                .status
                .as_ref()
                .and_then(|s| s.bootstrap_token_id.as_ref())
                .is_some()
            {
                return Ok(Some("a bootstrap token was minted".into()));
            }
            if host.state() != HostState::Available && host.state() != HostState::Claimed {
                return Ok(Some(format!("host went {:?}", host.state())));
            }
            let phase_sessions: Vec<String> = sessions(sc, h, "start ")
                .into_iter()
                .filter(|l| l.split_whitespace().last() != Some("probe"))
                .collect();
            if !phase_sessions.is_empty() {
                return Ok(Some(format!(
                    "sessions other than probes: {phase_sessions:?}"
                )));
            }
            Ok(None)
        },
    )
    .await?;
    if sessions(sc, h, "exit 0 ").is_empty() {
        return Err("the verified probe (through the shim) should have run".into());
    }
    Ok(())
}

/// Messages of events with `reason` on this scenario's NodeClaims (cluster-scoped objects:
/// their events are in `default`).
pub async fn launch_events(sc: &Sc, reason: &str) -> Result<Vec<String>, String> {
    let events = sc
        .ns_api::<Event>("default")
        .list(&ListParams::default())
        .await
        .map_err(|e| e.to_string())?;
    Ok(events
        .items
        .into_iter()
        .filter(|e| e.involved_object.kind.as_deref() == Some("NodeClaim"))
        .filter(|e| {
            e.involved_object
                .name
                .as_deref()
                .is_some_and(|n| n.starts_with(&sc.id))
        })
        .filter(|e| e.reason.as_deref() == Some(reason))
        .filter_map(|e| e.message)
        .collect())
}
