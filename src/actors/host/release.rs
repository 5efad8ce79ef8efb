//! Release (S23–S25): the NodeClaim holding the host is being deleted. Run only leave, then
//! clear claim, provider ID and token in one CAS; the install marker stays (warm pool).

use super::HostActorState;
use super::node_identity::{self, Identity};
use super::probe::write;
use super::registration::{delete_node, delete_token, leave, orphan_record, unrecorded_node};
use crate::actors::events;
use crate::actors::status::ProbeStamp;
use crate::api::{ClaimRef, HostState};
use crate::k8s::{Cluster, EventType};
use crate::ssh::Transport;
use tracing::Instrument;

pub async fn run<C: Cluster, T: Transport>(state: &mut HostActorState<C, T>, claim: &ClaimRef) {
    for _ in 0..3 {
        match try_release(state, claim).await {
            Ok(()) => return,
            Err(e) if e.is_conflict() => {
                let _ = state.refresh().await;
            }
            Err(e) => {
                tracing::warn!(host = %state.key(), error = %e, "release not recorded; retrying");
                tokio::time::sleep(state.ctx.config.retry_base).await;
                let _ = state.refresh().await;
            }
        }
    }
}

async fn try_release<C: Cluster, T: Transport>(
    state: &mut HostActorState<C, T>,
    claim: &ClaimRef,
) -> Result<(), crate::k8s::ClusterError> {
    if state.host.claim() != Some(claim) {
        state.refresh().await?;
    }
    // S25: fenced by name and UID: a delete for a previous holder never touches the successor.
    if state.host.claim() != Some(claim) {
        return Ok(());
    }
    let span = state.lifecycle_span(claim);
    // The drain is over (or its grace period ran out) once the release arrives.
    state.ctx.lifecycles.close(&claim.uid, "drain", "released");
    finish(state, claim).instrument(span).await
}

/// Leave, Node, token and the releasing CAS, inside the claim's lifecycle span.
async fn finish<C: Cluster, T: Transport>(
    state: &mut HostActorState<C, T>,
    claim: &ClaimRef,
) -> Result<(), crate::k8s::ClusterError> {
    // The token goes first: leave may wait minutes for a phase slot, and the token has no
    // use once the claim is ending (S27).
    delete_token(state).await?;
    let outcome = leave(state).await;
    let failure = outcome.as_ref().err().map(|f| f.message.clone());
    // Adopt: a Node that registered while this release was queued is not recorded yet. Record
    // it now (by IP, created since the claim), so that it goes with its claim instead of
    // lingering for a later claim of the host to take (random sweep seeds 6633, 6738).
    let unrecorded = (state.host.status.as_ref()).is_none_or(|s| s.provider_id.is_none());
    if unrecorded
        && state.state() == HostState::Claimed
        && let Err(e) = super::registration::recheck_registration(state).await
    {
        tracing::warn!(host = %state.key(), error = %e, "registration not rechecked before the release");
    }
    // The claim's Node by what identifies it, whatever its name (S53: nodeadm's `mi-*`).
    let recorded = state
        .host
        .status
        .as_ref()
        .and_then(|s| s.provider_id.clone());
    let identity = Identity {
        claim: &claim.name,
        node_name: None,
        provider_id: recorded.as_deref(),
        node_ip: Some(state.host.node_address()),
    };
    let node = match (node_identity::find(&state.ctx, &identity).await?, &recorded) {
        (Some(node), _) => Some(node),
        // Adopt: the Node registered, but its event has not reached this host yet.
        (None, None) => unrecorded_node(state, claim).await?,
        (None, Some(_)) => None,
    };
    // The kubelet may still run after a failed leave: the Node stays until a probe shows it
    // stopped, recorded in the status (a restart must not forget it, its finalizer held).
    let orphan = node
        .as_ref()
        .filter(|_| failure.is_some())
        .and_then(orphan_record);
    if failure.is_none()
        && let Some(node) = node
    {
        // Leave stopped the kubelet, so the Node can go now and will not come back (S40).
        delete_node(state, &node).await?;
    }
    write(state, ProbeStamp::Keep, |s| {
        s.claim_ref = None;
        s.provider_id = None;
        s.bootstrap_token_id = None;
        if orphan.is_some() {
            s.orphan_node = orphan.clone();
        }
        match &failure {
            None => s.state = HostState::Available,
            Some(msg) => {
                s.state = HostState::Unhealthy;
                s.last_probe_error = Some(msg.clone());
            }
        }
    })
    .await?;
    let failed = failure.is_some();
    let result = if failed { "failure" } else { "success" };
    state.ctx.lifecycles.step(&claim.uid, "released", result);
    state.end_lifecycle(
        &claim.uid,
        if failed {
            events::LEAVE_FAILED
        } else {
            events::RELEASED
        },
        failed,
    );
    let (type_, reason, msg) = match failure {
        None => (
            EventType::Normal,
            events::RELEASED,
            format!("leave ran; released from NodeClaim {}", claim.name),
        ),
        Some(m) => (EventType::Warning, events::LEAVE_FAILED, m),
    };
    events::record(&state.ctx.cluster, &*state.host, type_, reason, msg).await;
    Ok(())
}
