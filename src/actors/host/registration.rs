//! Claims, tokens and the zombie guard: the checks that keep a host's API record and its real
//! kubelet in agreement (S9–S12, S26, S27, S21).

use k8s_openapi::api::core::v1::{Node, Secret as KubeSecret};

use super::phases::{PhaseFailure, leave_context, marker_profile, run_phase};
use super::probe::write;
use super::{HostActorState, node_identity, target};
use crate::actors::status::ProbeStamp;
use crate::api::host::OrphanNode;
use crate::api::karpenter::TERMINATION_FINALIZER;
use crate::api::{ClaimRef, ExecMode, HostState, NodeClaim};
use crate::k8s::events;
use crate::k8s::{Cluster, ClusterError, EventType, finalizers};
use crate::profile::phase::Phase;
use crate::ssh::{HostTarget, Transport};
use tracing::Instrument;
use tracing::field::Empty;

pub const TOKEN_NAMESPACE: &str = "kube-system";

pub fn token_secret_name(id: &str) -> String {
    format!("bootstrap-token-{id}")
}

/// The Static provider ID of a host.
pub fn static_provider_id(ns: &str, host: &str) -> String {
    format!("kpssh://{ns}/{host}")
}

/// S26: the NodeClaim holding the host is gone or its name now has another UID. Release the
/// claim as stale (token deleted, host Pending); the zombie guard then handles any kubelet.
pub async fn release_if_stale<C: Cluster, T: Transport>(
    state: &mut HostActorState<C, T>,
) -> Result<bool, ClusterError> {
    // Looked at before anything is copied: every probe of a claimed host comes here.
    let Some(claim) = state.host.claim() else {
        return Ok(false);
    };
    if state.ctx.claims.contains(&claim.uid) {
        return Ok(false);
    }
    let claim = claim.clone();
    // Boxed: the probe's future would otherwise carry this rare path's API calls.
    Box::pin(release_stale(state, claim)).await
}

/// [`release_if_stale`] past its quick check: the claim is not one the router's watch holds.
async fn release_stale<C: Cluster, T: Transport>(
    state: &mut HostActorState<C, T>,
    claim: crate::api::ClaimRef,
) -> Result<bool, ClusterError> {
    let current: Option<NodeClaim> = state.ctx.cluster.get(None, &claim.name).await?;
    if current.is_some_and(|nc| nc.metadata.uid.as_deref() == Some(claim.uid.as_str())) {
        return Ok(false);
    }
    delete_token(state).await?;
    // The claim's Node (if any) outlives it while its kubelet runs: record it, so that the
    // zombie guard knows it as this host's once the provider ID below is cleared (Adopt).
    let orphan = stale_claim_node(state, &claim.name).await?;
    write(state, ProbeStamp::Keep, |s| {
        s.state = HostState::Pending;
        s.claim_ref = None;
        s.provider_id = None;
        s.bootstrap_token_id = None;
        if orphan.is_some() {
            s.orphan_node = orphan.clone();
        }
    })
    .await?;
    state.end_lifecycle(&claim.uid, events::STALE_CLAIM, true);
    let msg = format!(
        "NodeClaim {} (uid {}) no longer exists; claim released",
        claim.name, claim.uid
    );
    state
        .event(EventType::Warning, events::STALE_CLAIM, msg)
        .await;
    Ok(true)
}

/// The Node of the stale claim `name` as [`OrphanNode`], found by what identifies it (S53).
async fn stale_claim_node<C: Cluster, T: Transport>(
    state: &HostActorState<C, T>,
    name: &str,
) -> Result<Option<OrphanNode>, ClusterError> {
    let recorded = (state.host.status.as_ref()).and_then(|s| s.provider_id.clone());
    let identity = node_identity::Identity {
        claim: name,
        node_name: None,
        provider_id: recorded.as_deref(),
        node_ip: Some(state.host.node_address()),
    };
    let node = node_identity::find(&state.ctx, &identity).await?;
    Ok(node.as_ref().and_then(orphan_record))
}

/// What `status.orphanNode` records of a Node.
pub fn orphan_record(node: &Node) -> Option<OrphanNode> {
    Some(OrphanNode {
        name: node.metadata.name.clone()?,
        provider_id: node_identity::provider_id(node).map(str::to_string),
    })
}

/// S27: delete the bootstrap token once the Node of this host's NodeClaim has registered.
pub async fn collect_token<C: Cluster, T: Transport>(
    state: &mut HostActorState<C, T>,
) -> Result<(), ClusterError> {
    if state
        .host
        .status
        .as_ref()
        .and_then(|s| s.bootstrap_token_id.as_ref())
        .is_none()
    {
        return Ok(());
    }
    delete_token(state).await?;
    write(state, ProbeStamp::Keep, |s| s.bootstrap_token_id = None).await
}

/// Delete the token Secret recorded on the host, if any. Idempotent.
pub async fn delete_token<C: Cluster, T: Transport>(
    state: &HostActorState<C, T>,
) -> Result<(), ClusterError> {
    let Some(id) = state
        .host
        .status
        .as_ref()
        .and_then(|s| s.bootstrap_token_id.clone())
    else {
        return Ok(());
    };
    state
        .ctx
        .cluster
        .delete::<KubeSecret>(Some(TOKEN_NAMESPACE), &token_secret_name(&id), None)
        .await
        .map(|_| ())
}

/// A Claimed host whose Node may have registered while recording it failed (S37, S27).
pub async fn recheck_registration<C: Cluster, T: Transport>(
    state: &mut HostActorState<C, T>,
) -> Result<(), ClusterError> {
    let Some(claim) = state.host.claim().cloned() else {
        return Ok(());
    };
    // Named after the claim (Static), or under a name of the join mechanism's own with this
    // host's IP (Adopt, S53): try_node_seen tells whether it is this claim's.
    let ip = state.host.node_address().to_string();
    let mut names = vec![claim.name.clone()];
    names.extend(
        (state.ctx.node_addresses.named_with_ip(&ip).into_iter()).filter(|n| *n != claim.name),
    );
    for name in names {
        if state.state() != HostState::Claimed {
            break;
        }
        if let Some(node) = state.ctx.cluster.get::<Node>(None, &name).await? {
            try_node_seen(state, &node).await?;
        }
    }
    Ok(())
}

/// After a release whose leave failed (or a stale claim), the Node is kept while its kubelet
/// may run (`status.orphanNode`). Once a probe shows the kubelet stopped, delete it (dropping
/// its finalizer) and forget it; a running kubelet is the zombie guard's. The record is in the
/// status, so a restarted controller finishes the cleanup.
pub async fn cleanup_orphan_node<C: Cluster, T: Transport>(
    state: &mut HostActorState<C, T>,
    kubelet_active: bool,
) -> Result<(), ClusterError> {
    if kubelet_active {
        return Ok(());
    }
    let Some(orphan) = (state.host.status.as_ref()).and_then(|s| s.orphan_node.clone()) else {
        return Ok(());
    };
    if let Some(node) = state.ctx.cluster.get::<Node>(None, &orphan.name).await?
        && node_identity::tied_to_host(&node, state.ctx.pool_ns(), &state.name, &state.host)
    {
        delete_node(state, &node).await?;
    }
    write(state, ProbeStamp::Keep, |s| {
        if s.orphan_node.as_ref() == Some(&orphan) {
            s.orphan_node = None;
        }
    })
    .await
}

/// A Node appeared or changed: if it is this host's claim's node, the host is InUse (S37) and
/// its token can go (S27). Adopt mode takes the Node's provider ID (S21).
pub async fn node_seen<C: Cluster, T: Transport>(state: &mut HostActorState<C, T>, node: &Node) {
    if let Err(e) = try_node_seen(state, node).await {
        tracing::warn!(host = %state.key(), error = %e, "could not record registration");
        if e.is_conflict() {
            let _ = state.refresh().await;
        }
    }
}

async fn try_node_seen<C: Cluster, T: Transport>(
    state: &mut HostActorState<C, T>,
    node: &Node,
) -> Result<(), ClusterError> {
    let Some(claim) = state.host.claim().cloned() else {
        return Ok(());
    };
    if state.state() != HostState::Claimed || node.metadata.deletion_timestamp.is_some() {
        return Ok(());
    }
    let expected = state
        .host
        .status
        .as_ref()
        .and_then(|s| s.provider_id.clone());
    let Some(provider_id) = registered_for(state, node, &claim) else {
        return Ok(());
    };
    // Adopt: and not a Node an earlier claim of the host left behind (see registered_since).
    if expected.is_none() && !registered_since(state, node, &claim).await? {
        return Ok(());
    }
    delete_token(state).await?;
    write(state, ProbeStamp::Keep, |s| {
        s.state = HostState::InUse;
        s.provider_id = Some(provider_id.clone());
        s.bootstrap_token_id = None;
        // S63: a launch whose Node registered ends the host's launch backoff.
        s.launch_backoff = None;
        s.last_launch_failure = None;
    })
    .await?;
    state
        .ctx
        .lifecycles
        .step(&claim.uid, "registered", "success");
    if expected.is_none() {
        adopt_into_claim(state, &claim.name, &provider_id).await?;
    }
    Ok(())
}

/// Adopt: a Node owned by no claim is this claim's only if a kubelet registered it since the
/// claim was made: created since, or (a kubelet that re-uses an existing object, as nodeadm's
/// per-machine names allow) its Ready heartbeat posted since. A Node an earlier claim of the
/// host left behind (its registration not recorded before its release, so the release could
/// not find it) carries the host's IP too, and taken for this claim it made the host InUse
/// without a join (random sweep seeds 6633, 6738).
async fn registered_since<C: Cluster, T: Transport>(
    state: &HostActorState<C, T>,
    node: &Node,
    claim: &ClaimRef,
) -> Result<bool, ClusterError> {
    if node_identity::owner_claim(node) == Some(claim.uid.as_str()) {
        return Ok(true);
    }
    let nc: Option<NodeClaim> = state.ctx.cluster.get(None, &claim.name).await?;
    // The claim gone (the stale-claim check releases the host), or no timestamp (never from
    // an API server): not known to be this claim's.
    let Some(claim_at) = nc
        .filter(|nc| nc.metadata.uid.as_deref() == Some(claim.uid.as_str()))
        .and_then(|nc| nc.metadata.creation_timestamp)
    else {
        return Ok(false);
    };
    let heartbeat = (node.status.as_ref())
        .and_then(|s| s.conditions.as_ref())
        .and_then(|cs| cs.iter().find(|c| c.type_ == "Ready"))
        .and_then(|c| c.last_heartbeat_time.as_ref());
    let since = |t: &k8s_openapi::apimachinery::pkg::apis::meta::v1::Time| t.0 >= claim_at.0;
    Ok(
        node.metadata.creation_timestamp.as_ref().is_some_and(since)
            || heartbeat.is_some_and(since),
    )
}

/// The provider ID of `node` if it is the Node of the host's claim `claim`, as registration
/// judges it: not owned by another claim, and, Static (a provider ID recorded on the host):
/// that ID, under the claim's name or owned by it; Adopt (none recorded yet): any name
/// (nodeadm's `mi-*`, S53) carrying this host's IP.
fn registered_for<C: Cluster, T: Transport>(
    state: &HostActorState<C, T>,
    node: &Node,
    claim: &ClaimRef,
) -> Option<String> {
    let provider_id = node_identity::provider_id(node)?;
    // A Node registered for another (earlier) claim of this host is not this one's.
    if node_identity::owner_claim(node).is_some_and(|uid| uid != claim.uid) {
        return None;
    }
    let expected = (state.host.status.as_ref()).and_then(|s| s.provider_id.as_deref());
    let ours = match expected {
        Some(p) => p == provider_id && node_identity::is_claims(node, &claim.name, &claim.uid),
        None => crate::provider::context::internal_ips(node)
            .contains(&state.host.node_address().to_string()),
    };
    ours.then(|| provider_id.to_string())
}

/// The Node of the host's claim that registered while the host had not seen it yet (the Node
/// event still queued behind the claim's deletion; Adopt mode records no provider ID until
/// then): the release must still find it and delete it, or it stays behind, unowned, with
/// the machine's provider ID, and a later claim of the machine is taken for it (seed 9437:
/// node repair deleted a fresh claim for a leaked Node NotReady for 45 minutes). Looked up
/// as `recheck_registration` does, judged as registration does.
pub async fn unrecorded_node<C: Cluster, T: Transport>(
    state: &HostActorState<C, T>,
    claim: &ClaimRef,
) -> Result<Option<Node>, ClusterError> {
    let ip = state.host.node_address().to_string();
    let mut names = vec![claim.name.clone()];
    names.extend(
        (state.ctx.node_addresses.named_with_ip(&ip).into_iter()).filter(|n| *n != claim.name),
    );
    for name in names {
        if let Some(node) = state.ctx.cluster.get::<Node>(None, &name).await?
            && node.metadata.deletion_timestamp.is_none()
            && registered_for(state, &node, claim).is_some()
        {
            return Ok(Some(node));
        }
    }
    Ok(None)
}

/// Adopt mode: the NodeClaim takes the provider ID the join mechanism gave the Node (S21).
async fn adopt_into_claim<C: Cluster, T: Transport>(
    state: &HostActorState<C, T>,
    name: &str,
    provider_id: &str,
) -> Result<(), ClusterError> {
    for _ in 0..5 {
        let Some(mut nc) = state.ctx.cluster.get::<NodeClaim>(None, name).await? else {
            return Ok(());
        };
        nc.status.get_or_insert_with(Default::default).provider_id = Some(provider_id.to_string());
        match state.ctx.cluster.replace_status(&nc).await {
            Ok(_) => return Ok(()),
            Err(e) if e.is_conflict() => continue,
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// S9/S10/S12: a kubelet runs on an unclaimed host. Attributable to us (install marker, or a
/// Node tied to this host: `node_identity::tied_to_host`, never an IP alone) → fence with the
/// Leaving CAS and run leave, then delete only a tied Node; otherwise park the host Unhealthy
/// and touch nothing.
pub async fn zombie_check<C: Cluster, T: Transport>(
    state: &mut HostActorState<C, T>,
) -> Result<(), ClusterError> {
    let span = zombie_span(state);
    zombie_check_inner(state).instrument(span).await
}

/// A zombie action: a child of the probe that found the kubelet, `action` recorded as it is
/// decided (`foreign`, `leave`, `leave_failed`).
fn zombie_span<C: Cluster, T: Transport>(state: &HostActorState<C, T>) -> tracing::Span {
    tracing::info_span!(
        "zombie",
        host = %state.key(),
        class = %state.host.class(),
        action = Empty,
        outcome = Empty,
    )
}

async fn zombie_check_inner<C: Cluster, T: Transport>(
    state: &mut HostActorState<C, T>,
) -> Result<(), ClusterError> {
    let marker = state
        .host
        .status
        .as_ref()
        .and_then(|s| s.installed_profile.clone());
    let node = node_identity::host_node(&state.ctx, &state.name, &state.host).await?;
    if marker.is_none() && node.is_none() {
        let msg = format!(
            "a kubelet is active on {} but kpssh never installed it and no Node is this \
             host's (provider ID {}, or one recorded in its status; a Node that merely has IP \
             {} is not); stop it by hand or delete this SSHHost",
            state.key(),
            static_provider_id(state.ctx.pool_ns(), &state.name),
            state.host.node_address()
        );
        let already = state.state() == HostState::Unhealthy
            && state
                .host
                .status
                .as_ref()
                .and_then(|s| s.last_probe_error.as_ref())
                == Some(&msg);
        tracing::Span::current().record("action", "foreign");
        if already {
            tracing::Span::current().record("outcome", "unchanged");
            return Ok(());
        }
        write(state, ProbeStamp::Keep, |s| {
            s.state = HostState::Unhealthy;
            s.last_probe_error = Some(msg.clone());
        })
        .await?;
        zombie_action(state, "foreign");
        state
            .event(EventType::Warning, events::FOREIGN_KUBELET, msg)
            .await;
        return Ok(());
    }
    // The fence: if a claim landed since we read the host, this CAS fails and the claim wins.
    write(state, ProbeStamp::Keep, |s| s.state = HostState::Leaving).await?;
    let msg = format!(
        "kubelet active on unclaimed host {}; running leave",
        state.key()
    );
    state
        .event(EventType::Warning, events::ZOMBIE_KUBELET, msg)
        .await;
    zombie_leave(state).await
}

/// Run leave on a Leaving host, then delete the orphan Node (its kubelet is stopped now).
pub async fn zombie_leave<C: Cluster, T: Transport>(
    state: &mut HostActorState<C, T>,
) -> Result<(), ClusterError> {
    let current = tracing::Span::current();
    let span = if current.metadata().is_some_and(|m| m.name() == "zombie") {
        current
    } else {
        // A Leaving host found by the probe after a restart: the action resumes here.
        zombie_span(state)
    };
    zombie_leave_inner(state).instrument(span).await
}

async fn zombie_leave_inner<C: Cluster, T: Transport>(
    state: &mut HostActorState<C, T>,
) -> Result<(), ClusterError> {
    match leave(state).await {
        Ok(()) => {
            let node = node_identity::host_node(&state.ctx, &state.name, &state.host).await?;
            if let Some(node) = node {
                delete_node(state, &node).await?;
            }
            write(state, ProbeStamp::Keep, |s| {
                s.state = HostState::Available;
                s.last_probe_error = None;
                s.orphan_node = None;
            })
            .await?;
            zombie_action(state, "leave");
            let msg = format!("leave ran on {}; the orphan kubelet is gone", state.key());
            state
                .event(EventType::Normal, events::ZOMBIE_LEFT, msg)
                .await;
        }
        Err(f) => {
            zombie_action(state, "leave_failed");
            write(state, ProbeStamp::Keep, |s| {
                s.state = HostState::Unhealthy;
                s.last_probe_error = Some(f.message.clone());
            })
            .await?;
            state
                .event(EventType::Warning, events::ZOMBIE_LEAVE_FAILED, f.message)
                .await;
        }
    }
    Ok(())
}

/// The zombie guard on a claimed host, right before its join. A host that rebooted while
/// claimed comes back with the kubelet of its last Node running if a leave profile only
/// stopped it; joining over it would leave one host backing two Nodes. So: probe, and if a
/// kubelet runs that is not this claim's own (a launch resumed after its join: the Node named
/// after the claim, or registered for it under any name, S53), run leave, then delete the
/// Node it ran as (its kubelet is stopped now). A probe that fails changes nothing: the join's
/// own session meets the same host.
pub async fn leave_stale_kubelet<C: Cluster, T: Transport>(
    state: &HostActorState<C, T>,
    target: &HostTarget,
    claim: &NodeClaim,
) -> Result<(), PhaseFailure> {
    let node_name = claim.metadata.name.as_deref().unwrap_or_default();
    let uid = claim.metadata.uid.as_deref().unwrap_or_default();
    let shim = (state.host.spec.exec_mode == ExecMode::Verified)
        .then_some(state.host.spec.shim_command.as_str());
    let probe = state.ctx.transport.probe(target, shim);
    let Ok(Ok(report)) = tokio::time::timeout(state.ctx.config.probe_timeout, probe).await else {
        return Ok(());
    };
    if !report.facts.kubelet_active {
        return Ok(());
    }
    let node = node_identity::host_node(&state.ctx, &state.name, &state.host)
        .await
        .map_err(touched)?;
    let own = (node.as_ref()).is_some_and(|n| node_identity::is_claims(n, node_name, uid));
    if own {
        return Ok(());
    }
    let span = zombie_span(state);
    leave_before_join(state, node).instrument(span).await
}

async fn leave_before_join<C: Cluster, T: Transport>(
    state: &HostActorState<C, T>,
    node: Option<Node>,
) -> Result<(), PhaseFailure> {
    let msg = format!(
        "kubelet active on claimed host {} before its join (running as Node {}); running leave first",
        state.key(),
        node.as_ref()
            .and_then(|n| n.metadata.name.as_deref())
            .unwrap_or("not registered")
    );
    state
        .event(EventType::Warning, events::ZOMBIE_KUBELET, msg)
        .await;
    if let Err(f) = leave(state).await {
        zombie_action(state, "leave_failed");
        return Err(f);
    }
    zombie_action(state, "leave");
    if let Some(node) = &node {
        delete_node(state, node).await.map_err(touched)?;
    }
    Ok(())
}

/// An API error after the host was touched.
fn touched(e: ClusterError) -> PhaseFailure {
    PhaseFailure::touched(e.to_string())
}

fn zombie_action<C: Cluster, T: Transport>(state: &HostActorState<C, T>, action: &str) {
    let span = tracing::Span::current();
    span.record("action", action);
    let outcome = match action {
        "leave" => "success",
        "leave_failed" => "failure",
        _ => "parked",
    };
    span.record("outcome", outcome);
    use crate::provider::metrics::zombie;
    state.ctx.metrics.zombie_action(match action {
        "leave" => zombie::LEFT,
        "foreign" => zombie::PARKED_FOREIGN,
        _ => zombie::LEAVE_FAILED,
    });
}

/// Run the marker profile's leave on this host.
pub async fn leave<C: Cluster, T: Transport>(
    state: &HostActorState<C, T>,
) -> Result<(), PhaseFailure> {
    let profile = marker_profile(state).await?;
    let ns = state.ctx.pool_ns().to_string();
    let target = target::host_target(&state.ctx.cluster, &ns, &state.host)
        .await
        .map_err(|e| PhaseFailure::config(e.to_string()))?;
    run_phase(
        state,
        &target,
        &profile,
        Phase::Leave,
        &leave_context(&state.host),
    )
    .await
}

/// Delete a Node whose kubelet is known stopped, dropping our termination finalizer first.
pub async fn delete_node<C: Cluster, T: Transport>(
    state: &HostActorState<C, T>,
    node: &Node,
) -> Result<(), ClusterError> {
    let name = node.metadata.name.clone().unwrap_or_default();
    finalizers::set(&state.ctx.cluster, node, TERMINATION_FINALIZER, false).await?;
    state
        .ctx
        .cluster
        .delete::<Node>(None, &name, None)
        .await
        .map(|_| ())
}
