//! A launch that failed (S17, S18, S21, S63, S64): release the host, record the failure in
//! `lastLaunchFailure` (its phase, exit status and the end of its output), start or grow the
//! host's launch backoff when the host was touched, tell the class's launch ledger, and fail
//! the NodeClaim so that provisioning tries again.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

use super::HostActorState;
use super::launch::set_launched;
use super::phases::PhaseFailure;
use super::probe::write;
use super::registration::{delete_token, static_provider_id};
use crate::actors::status::ProbeStamp;
use crate::api::{ClaimRef, HostState, NodeClaim};
use crate::k8s::events;
use crate::k8s::{Cluster, EventType};
use crate::ssh::Transport;

/// S17/S18: release the host (Unhealthy if the host was touched, else Available), delete the
/// token, and fail the NodeClaim with a redacted explanation. A failure that touched the host
/// starts or grows its launch backoff (S63) and is recorded in `lastLaunchFailure` (S64).
pub async fn fail<C: Cluster, T: Transport>(
    state: &mut HostActorState<C, T>,
    claim: &ClaimRef,
    nodeclaim: Option<&NodeClaim>,
    failure: PhaseFailure,
) {
    fail_as(state, claim, nodeclaim, failure, None).await
}

/// [`fail`], with the phase named by the caller when no script's exit says it (`registration`).
pub async fn fail_as<C: Cluster, T: Transport>(
    state: &mut HostActorState<C, T>,
    claim: &ClaimRef,
    nodeclaim: Option<&NodeClaim>,
    failure: PhaseFailure,
    phase: Option<&str>,
) {
    let nodeclaim = match nodeclaim {
        Some(n) => Some(n.clone()),
        None => state
            .ctx
            .cluster
            .get::<NodeClaim>(None, &claim.name)
            .await
            .ok()
            .flatten(),
    }
    .filter(|n| n.metadata.uid.as_deref() == Some(&claim.uid));
    // A token that could not be deleted stays recorded, so a later probe deletes it (S27).
    let token_gone = delete_token(state).await.is_ok();
    // A phase that could not even connect is the host's failure too (unreachable, refused):
    // it backs off like one that ran, or an unreachable host would be claimed in a loop.
    // Only configuration errors, found before any connection, leave the host Available.
    let touched = failure.touched_host || failure.phase.is_some();
    let reason = if touched {
        events::LAUNCH_FAILED
    } else {
        events::CONFIGURATION_ERROR
    };
    let record = launch_failure(state, claim, &failure, phase, reason);
    let backoff = if touched {
        Some(next_backoff(state).await)
    } else {
        None
    };
    let released = write(state, ProbeStamp::Keep, |s| {
        s.claim_ref = None;
        s.provider_id = None;
        if token_gone {
            s.bootstrap_token_id = None;
        }
        s.last_launch_failure = Some(record.clone());
        if let Some(b) = &backoff {
            s.launch_backoff = Some(b.clone());
        }
        s.state = if touched {
            HostState::Unhealthy
        } else {
            HostState::Available
        };
    })
    .await;
    if let Err(e) = released {
        tracing::warn!(host = %state.key(), error = %e, "could not release host after failed launch");
    }
    after_failure(state, claim, nodeclaim.as_ref(), &record, backoff.as_ref()).await;
    state.end_lifecycle(&claim.uid, reason, true);
    if let Some(nc) = nodeclaim {
        events::record(
            &state.ctx.cluster,
            &nc,
            EventType::Warning,
            reason,
            failure.message.clone(),
        )
        .await;
        let _ = set_launched(
            &state.ctx.cluster,
            &nc,
            false,
            reason,
            &failure.message,
            &state.ctx.clock,
        )
        .await;
        // Karpenter semantics: a NodeClaim whose launch failed is deleted and provisioning
        // tries again; its Release finds the host already released (fenced by UID).
        let _ = state
            .ctx
            .cluster
            .delete::<NodeClaim>(
                None,
                &claim.name,
                Some(crate::k8s::Precondition {
                    uid: Some(claim.uid.clone()),
                    resource_version: None,
                }),
            )
            .await;
    }
}

/// The backoff a failure that touched the host starts or grows (S63).
async fn next_backoff<C: Cluster, T: Transport>(
    state: &HostActorState<C, T>,
) -> crate::api::LaunchBackoff {
    let ns = state.ctx.pool_ns().to_string();
    let version = super::backoff::secret_version(&state.ctx.cluster, &ns, &state.host).await;
    let now = state.ctx.clock.now();
    super::backoff::next(
        state.host.status.as_ref(),
        now,
        |n| super::backoff::wait_for(state, n),
        version,
    )
}

/// What follows a recorded launch failure: the class's ledger, the metric, an info log, the
/// backoff timer and its event.
async fn after_failure<C: Cluster, T: Transport>(
    state: &mut HostActorState<C, T>,
    claim: &ClaimRef,
    nodeclaim: Option<&NodeClaim>,
    record: &crate::api::LaunchFailure,
    backoff: Option<&crate::api::LaunchBackoff>,
) {
    let now = state.ctx.clock.now();
    let outcome = crate::provider::launches::Outcome::failed(record);
    state
        .ctx
        .launches
        .record(&class_of(nodeclaim), outcome, now);
    state
        .ctx
        .metrics
        .launch_failed(state.host.class(), &record.phase);
    tracing::info!(
        host = %state.key(),
        nodeclaim = %claim.name,
        phase = %record.phase,
        exit_status = ?record.exit_status,
        backoff_failures = backoff.map(|b| b.failures),
        "launch failed"
    );
    if let Some(b) = backoff {
        super::backoff::arm(state);
        let until = b
            .until
            .as_ref()
            .map(|t| t.0.strftime("%Y-%m-%dT%H:%M:%SZ").to_string());
        let msg = format!(
            "{} failed launch(es) in a row (last: {} of NodeClaim {}); not claimed before {}",
            b.failures,
            record.phase,
            claim.name,
            until.unwrap_or_default()
        );
        state
            .event(EventType::Warning, super::backoff::BACKING_OFF, msg)
            .await;
    }
}

/// S63: the NodeClaim of a release that is a registration failure: the host's join ran
/// (Static: its provider ID is recorded), no Node registered, and the NodeClaim is at least
/// the registration timeout old (so the karpenter layer gave it up, not a user in a hurry).
pub async fn unregistered_claim<C: Cluster, T: Transport>(
    state: &HostActorState<C, T>,
    claim: &ClaimRef,
) -> Option<NodeClaim> {
    let joined = state.host.claim() == Some(claim)
        && state.state() == HostState::Claimed
        && state
            .host
            .status
            .as_ref()
            .is_some_and(|s| s.provider_id.is_some());
    if !joined {
        return None;
    }
    let nc: NodeClaim = state
        .ctx
        .cluster
        .get(None, &claim.name)
        .await
        .ok()
        .flatten()?;
    let created = nc.metadata.creation_timestamp.as_ref()?.0;
    let old_enough = state.ctx.clock.since(created) >= state.ctx.config.registration_timeout;
    (nc.metadata.uid.as_deref() == Some(claim.uid.as_str()) && old_enough).then_some(nc)
}

/// S63: record a registration failure on a host its release has just freed.
pub async fn registration_failed<C: Cluster, T: Transport>(
    state: &mut HostActorState<C, T>,
    claim: &ClaimRef,
    nodeclaim: &NodeClaim,
) {
    let failure = PhaseFailure::touched(format!(
        "{}: join ran, but no Node registered for NodeClaim {} within {:?} (RegistrationTimeout): check that the kubelet reaches the API server and registers under the NodeClaim's name with provider ID {}",
        state.key(),
        claim.name,
        state.ctx.config.registration_timeout,
        static_provider_id(state.ctx.pool_ns(), &state.name),
    ));
    let mut record = launch_failure(
        state,
        claim,
        &failure,
        Some("registration"),
        "RegistrationTimeout",
    );
    record.reason = "RegistrationTimeout".into();
    let backoff = next_backoff(state).await;
    let written = write(state, ProbeStamp::Keep, |s| {
        s.last_launch_failure = Some(record.clone());
        s.launch_backoff = Some(backoff.clone());
    })
    .await;
    if let Err(e) = written {
        tracing::warn!(host = %state.key(), error = %e, "could not record the registration failure");
        return;
    }
    after_failure(state, claim, Some(nodeclaim), &record, Some(&backoff)).await;
}

/// The node class a NodeClaim asks for ("" when unknown).
fn class_of(nodeclaim: Option<&NodeClaim>) -> String {
    nodeclaim.map_or_else(String::new, |n| n.spec.node_class_ref.name.clone())
}

/// What `lastLaunchFailure` records for a failure (S64).
fn launch_failure<C: Cluster, T: Transport>(
    state: &HostActorState<C, T>,
    claim: &ClaimRef,
    failure: &PhaseFailure,
    phase: Option<&str>,
    reason: &str,
) -> crate::api::LaunchFailure {
    let phase = match (phase, failure.phase, failure.touched_host) {
        (Some(p), _, _) => p.to_string(),
        (None, Some(p), _) => p.as_str().to_string(),
        (None, None, true) => "launch".to_string(),
        (None, None, false) => "configuration".to_string(),
    };
    crate::api::LaunchFailure {
        phase,
        reason: reason.to_string(),
        exit_status: failure.exit_status.and_then(|e| i32::try_from(e).ok()),
        message: crate::profile::redact::tail_str(&failure.message, 4000).to_string(),
        node_claim: Some(claim.name.clone()),
        time: Time(state.ctx.clock.now()),
    }
}
