//! `Router`: turns NodeClaim events into host actor messages. A new NodeClaim for an
//! SSHNodeClass gets a host (compare-and-swap of the claim, then `Launch`); a NodeClaim being
//! deleted gets `Release` on the host that holds it (fenced by name and UID) once drained, then
//! its finalizer is removed; the host deletes the Node after leave stopped its kubelet.
//!
//! Claims are made by tasks beside the actor, up to `max_concurrent_claims` at once, each on a
//! host reserved for it ([`burst`]); the actor stays the only owner of its state and applies
//! what each task reports.

pub mod burst;
pub mod choose;
pub mod claim;

use std::collections::{BTreeMap, BTreeSet};
use std::marker::PhantomData;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::Secret;
use ractor::{Actor, ActorProcessingErr, ActorRef};

use super::host::HostMsg;
use super::host::node_identity::{self, Identity};
use super::host::registration::{TOKEN_NAMESPACE, token_secret_name};
use super::supervisor::SupervisorMsg;
use crate::api::karpenter::TERMINATION_FINALIZER;
use crate::api::{ClaimRef, NodeClaim};
use crate::k8s::{Cluster, ClusterError, WatchEvent, finalizers};
use crate::provider::Context;
use crate::ssh::Transport;

const TICK: Duration = Duration::from_secs(1);

#[derive(Debug)]
pub enum RouterMsg {
    Claim(Box<WatchEvent<Arc<NodeClaim>>>),
    /// Re-evaluate claims waiting on something (a release, a transient error).
    Tick,
    /// A claim task finished (see [`claim`]).
    Claimed(Box<claim::ClaimOutcome>),
}

pub struct Router<C: Cluster, T: Transport> {
    _ports: PhantomData<fn() -> (C, T)>,
}

impl<C: Cluster, T: Transport> Default for Router<C, T> {
    fn default() -> Self {
        Router {
            _ports: PhantomData,
        }
    }
}

pub struct RouterState<C: Cluster, T: Transport> {
    ctx: Context<C, T>,
    myself: ActorRef<RouterMsg>,
    supervisor: ActorRef<SupervisorMsg>,
    /// Our NodeClaims by name, as last seen.
    /// Shared with the store and the other watchers (no copy per write or per reconcile).
    claims: BTreeMap<String, Arc<NodeClaim>>,
    /// Claims that need another look on the next tick.
    waiting: BTreeSet<String>,
    /// Releases already sent, by NodeClaim UID (a release is sent once).
    released: BTreeSet<String>,
    /// Launches already sent by this router, by NodeClaim UID. After a controller restart the
    /// set is empty, so a claim whose launch was cut short is resumed once (S20).
    launches: BTreeSet<String>,
    /// Claims queued and in flight, hosts reserved, rankings of the burst in progress.
    burst: burst::Burst,
    tasks: Vec<tokio::task::JoinHandle<()>>,
    /// Counters for the burst benchmark and metrics.
    pub conflicts: u64,
    pub claimed: u64,
}

impl<C: Cluster, T: Transport> Actor for Router<C, T> {
    type Msg = RouterMsg;
    type State = RouterState<C, T>;
    type Arguments = (Context<C, T>, ActorRef<SupervisorMsg>);

    async fn pre_start(
        &self,
        myself: ActorRef<Self::Msg>,
        (ctx, supervisor): Self::Arguments,
    ) -> Result<Self::State, ActorProcessingErr> {
        let mut stream = ctx.cluster.watch_shared::<NodeClaim>(None);
        let me = myself.clone();
        let metrics = ctx.metrics.clone();
        let watch = tokio::spawn(async move {
            while let Some(ev) = stream.next().await {
                match ev {
                    Ok(ev) => {
                        if me.send_message(RouterMsg::Claim(Box::new(ev))).is_err() {
                            return;
                        }
                        metrics.mailbox_in("router");
                    }
                    Err(e) => tracing::warn!(error = %e, "NodeClaim watch error"),
                }
            }
        });
        let me = myself.clone();
        let metrics = ctx.metrics.clone();
        let tick = tokio::spawn(async move {
            loop {
                tokio::time::sleep(TICK).await;
                if me.send_message(RouterMsg::Tick).is_err() {
                    return;
                }
                metrics.mailbox_in("router");
            }
        });
        let burst = burst::Burst::new(ctx.config.max_concurrent_claims);
        Ok(RouterState {
            ctx,
            myself,
            supervisor,
            claims: BTreeMap::new(),
            waiting: BTreeSet::new(),
            released: BTreeSet::new(),
            launches: BTreeSet::new(),
            burst,
            tasks: vec![watch, tick],
            conflicts: 0,
            claimed: 0,
        })
    }

    async fn post_stop(
        &self,
        _myself: ActorRef<Self::Msg>,
        state: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        for t in state.tasks.drain(..) {
            t.abort();
        }
        state.burst.abort();
        Ok(())
    }

    async fn handle(
        &self,
        _myself: ActorRef<Self::Msg>,
        msg: Self::Msg,
        state: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        state.ctx.metrics.mailbox_out("router");
        match msg {
            RouterMsg::Claim(ev) => on_event(state, *ev).await,
            RouterMsg::Tick => {
                let names: Vec<String> = std::mem::take(&mut state.waiting).into_iter().collect();
                for n in names {
                    reconcile(state, &n).await;
                }
            }
            RouterMsg::Claimed(outcome) => burst::apply(state, *outcome).await,
        }
        burst::pump(state).await;
        Ok(())
    }
}

async fn on_event<C: Cluster, T: Transport>(
    state: &mut RouterState<C, T>,
    ev: WatchEvent<Arc<NodeClaim>>,
) {
    // Another shard's NodeClaims (`--node-classes`) are not this router's: it never claims
    // for them, releases their hosts or touches their finalizers.
    let shard = state.ctx.shard.clone();
    match ev {
        WatchEvent::Restarted(all) => {
            state
                .ctx
                .claims
                .replace_all(all.iter().filter(|c| shard.owns_claim(c)).filter_map(|c| {
                    let deleting = c.metadata.deletion_timestamp.is_some();
                    c.metadata.uid.as_deref().map(|u| (u, deleting))
                }));
            state.claims = all
                .into_iter()
                .filter(|c| shard.owns_claim(c))
                .filter_map(|c| c.metadata.name.clone().map(|n| (n, c)))
                .collect();
            let names: Vec<String> = state.claims.keys().cloned().collect();
            for n in names {
                reconcile(state, &n).await;
            }
        }
        WatchEvent::Applied(nc) if shard.owns_claim(&nc) => {
            if let Some(uid) = nc.metadata.uid.as_deref() {
                let deleting = nc.metadata.deletion_timestamp.is_some();
                state.ctx.claims.insert(uid, deleting);
            }
            let name = nc.metadata.name.clone().unwrap_or_default();
            state.claims.insert(name.clone(), nc);
            reconcile(state, &name).await;
        }
        WatchEvent::Deleted(nc) if shard.owns_claim(&nc) => {
            if let Some(uid) = nc.metadata.uid.as_deref() {
                state.ctx.claims.remove(uid);
            }
            let name = nc.metadata.name.clone().unwrap_or_default();
            state.claims.remove(&name);
            state.waiting.remove(&name);
            state.burst.forget(&name, nc.metadata.uid.as_deref());
            // A force-deleted claim (S26): let the holder notice now rather than next probe.
            if let Some(h) = holder(&state.ctx, &nc) {
                revoke_token(&state.ctx, &h, &name).await;
                send(state, &h, HostMsg::Probe);
            }
        }
        _ => {}
    }
}

/// S27 for a NodeClaim that vanished (finalizer stripped) while its host is busy, e.g. in a
/// join that hangs until the phase timeout: the actor would delete the token only after the
/// phase, so the router deletes it now. The token joins no one once its claim is gone, and a
/// join still in flight must not register a Node for a claim that no longer exists. The host's
/// actor deletes the same Secret again later; that delete finds nothing, which it accepts.
async fn revoke_token<C: Cluster, T: Transport>(ctx: &Context<C, T>, host: &str, claim: &str) {
    let Some(id) = ctx
        .hosts
        .get(host)
        .and_then(|h| h.status.as_ref().and_then(|s| s.bootstrap_token_id.clone()))
    else {
        return;
    };
    let secret = token_secret_name(&id);
    match ctx
        .cluster
        .delete::<Secret>(Some(TOKEN_NAMESPACE), &secret, None)
        .await
    {
        Ok(_) => {
            tracing::info!(nodeclaim = %claim, host, "deleted the bootstrap token of a NodeClaim that is gone")
        }
        Err(e) if e.is_not_found() => {}
        // The host's actor deletes it after its phase or at its next probe.
        Err(e) => {
            tracing::warn!(nodeclaim = %claim, host, error = %e, "could not delete the bootstrap token of a gone NodeClaim")
        }
    }
}

fn send<C: Cluster, T: Transport>(state: &RouterState<C, T>, host: &str, msg: HostMsg) {
    let _ = state
        .supervisor
        .send_message(SupervisorMsg::ToHost(host.to_string(), msg));
}

fn claim_ref(nc: &NodeClaim) -> Option<ClaimRef> {
    Some(ClaimRef {
        name: nc.metadata.name.clone()?,
        uid: nc.metadata.uid.clone()?,
    })
}

/// The host whose claim is this NodeClaim (name and UID).
fn holder<C: Cluster, T: Transport>(ctx: &Context<C, T>, nc: &NodeClaim) -> Option<String> {
    ctx.hosts.holder_of(&claim_ref(nc)?)
}

fn launched(nc: &NodeClaim) -> bool {
    nc.status
        .as_ref()
        .is_some_and(|s| s.conditions.iter().any(|c| c.type_ == "Launched"))
}

async fn reconcile<C: Cluster, T: Transport>(state: &mut RouterState<C, T>, name: &str) {
    if state.burst.in_flight(name) {
        // The task's report looks at the claim again.
        return;
    }
    let Some(nc) = state.claims.get(name).cloned() else {
        return;
    };
    let result = if nc.metadata.deletion_timestamp.is_some() {
        terminate(state, &nc).await
    } else if launched(&nc) {
        Ok(())
    } else if let Some(host) = holder(&state.ctx, &nc) {
        // Claimed but not launched: a launch cut short by a restart is resumed (S20).
        if let Some(c) = claim_ref(&nc)
            && state.launches.insert(c.uid.clone())
        {
            send(state, &host, HostMsg::Launch(c));
        }
        Ok(())
    } else {
        state.burst.enqueue(name);
        Ok(())
    };
    if let Err(e) = result {
        tracing::warn!(nodeclaim = %name, error = %e, "will retry");
        state.waiting.insert(name.to_string());
    }
}

/// Release the host (once, after the drain); when it no longer holds the claim, drop the
/// finalizer. The host itself deletes the Node once leave stopped its kubelet.
async fn terminate<C: Cluster, T: Transport>(
    state: &mut RouterState<C, T>,
    nc: &NodeClaim,
) -> Result<(), ClusterError> {
    let name = nc.metadata.name.clone().unwrap_or_default();
    let uid = nc.metadata.uid.clone().unwrap_or_default();
    if let Some(host) = holder(&state.ctx, nc) {
        // S40/S44: leave only after the drain (the karpenter layer marks the NodeClaim
        // drained, also when its terminationGracePeriod ran out, once it has deleted the pods
        // still there: as core, whose drain deletes them before the instance goes); a Node
        // that never registered has nothing to drain. A deadline already past does not skip
        // the drain (seed 7296: repair writes "now", the host was released before the pods
        // were deleted, and they stayed bound to the Node). Without a grace period a drain
        // blocked by a PDB or a do-not-disrupt pod holds the host for as long as it takes,
        // as in core.
        let drain_pending = !drained(nc) && claim_node_exists(&state.ctx, nc, &host).await?;
        if drain_pending {
            state.waiting.insert(name);
            return Ok(());
        }
        if state.released.insert(uid)
            && let Some(c) = claim_ref(nc)
        {
            send(state, &host, HostMsg::Release(c));
        }
        state.waiting.insert(name);
        return Ok(());
    }
    // The host deleted the Node after a successful leave; after a failed one it keeps it until
    // the kubelet is seen stopped. Either way the NodeClaim may go now.
    finalizers::set(&state.ctx.cluster, nc, TERMINATION_FINALIZER, false).await?;
    state.ctx.metrics.core.terminated(nc);
    Ok(())
}

/// Whether the claim's Node exists, found by `status.nodeName` or provider ID (S53: under
/// Adopt the Node has a name of its own), not by the claim's name.
async fn claim_node_exists<C: Cluster, T: Transport>(
    ctx: &Context<C, T>,
    nc: &NodeClaim,
    host: &str,
) -> Result<bool, ClusterError> {
    let status = nc.status.as_ref();
    let host = ctx.hosts.get(host);
    let host_pid = host
        .as_ref()
        .and_then(|h| h.status.as_ref())
        .and_then(|s| s.provider_id.as_deref());
    let identity = Identity {
        claim: nc.metadata.name.as_deref().unwrap_or_default(),
        node_name: status.and_then(|s| s.node_name.as_deref()),
        provider_id: status
            .and_then(|s| s.provider_id.as_deref())
            .filter(|p| !p.is_empty())
            .or(host_pid),
        node_ip: host.as_ref().map(|h| h.node_address()),
    };
    Ok(node_identity::find(ctx, &identity).await?.is_some())
}

fn drained(nc: &NodeClaim) -> bool {
    nc.metadata
        .annotations
        .as_ref()
        .is_some_and(|a| a.contains_key(crate::api::DRAINED_ANNOTATION))
}
