//! `Router`: turns NodeClaim events into host actor messages. A new NodeClaim for an
//! SSHNodeClass gets a host (compare-and-swap of the claim, then `Launch`); a NodeClaim being
//! deleted gets `Release` on the host that holds it (fenced by name and UID) once drained, then
//! its finalizer is removed; the host deletes the Node after leave stopped its kubelet.

pub mod choose;
pub mod instance_types;
pub mod requirements;

use std::collections::{BTreeMap, BTreeSet};
use std::marker::PhantomData;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::{Node, Secret};
use ractor::{Actor, ActorProcessingErr, ActorRef};

use super::Context;
use super::events;
use super::host::HostMsg;
use super::host::launch::set_launched;
use super::host::registration::{TOKEN_NAMESPACE, token_secret_name};
use super::supervisor::SupervisorMsg;
use crate::api::karpenter::TERMINATION_FINALIZER;
use crate::api::{ClaimRef, HostState, NodeClaim, SSHHost, SSHJoinProfile, SSHNodeClass};
use crate::k8s::{Cluster, ClusterError, EventType, WatchEvent, finalizers};
use crate::ssh::Transport;

/// How many hosts a claim tries before it gives up for this round (lost CASes are not errors).
const CLAIM_ATTEMPTS: usize = 8;
const TICK: Duration = Duration::from_secs(1);

#[derive(Debug)]
pub enum RouterMsg {
    Claim(Box<WatchEvent<NodeClaim>>),
    /// Re-evaluate claims waiting on something (a release, a transient error).
    Tick,
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
    supervisor: ActorRef<SupervisorMsg>,
    /// Our NodeClaims by name, as last seen.
    claims: BTreeMap<String, NodeClaim>,
    /// Claims that need another look on the next tick.
    waiting: BTreeSet<String>,
    /// Releases already sent, by NodeClaim UID (a release is sent once).
    released: BTreeSet<String>,
    /// Launches already sent by this router, by NodeClaim UID. After a controller restart the
    /// set is empty, so a claim whose launch was cut short is resumed once (S20).
    launches: BTreeSet<String>,
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
        let mut stream = ctx.cluster.watch::<NodeClaim>(None);
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
        Ok(RouterState {
            ctx,
            supervisor,
            claims: BTreeMap::new(),
            waiting: BTreeSet::new(),
            released: BTreeSet::new(),
            launches: BTreeSet::new(),
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
        Ok(())
    }

    async fn handle(
        &self,
        _myself: ActorRef<Self::Msg>,
        msg: Self::Msg,
        state: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        state.ctx.metrics.mailbox_out("router");
        let msg = match msg {
            RouterMsg::Claim(ev) => Some(*ev),
            RouterMsg::Tick => None,
        };
        match msg {
            Some(WatchEvent::Restarted(all)) => {
                state.claims = all
                    .into_iter()
                    .filter(NodeClaim::is_ours)
                    .filter_map(|c| c.metadata.name.clone().map(|n| (n, c)))
                    .collect();
                let names: Vec<String> = state.claims.keys().cloned().collect();
                for n in names {
                    reconcile(state, &n).await;
                }
            }
            Some(WatchEvent::Applied(nc)) if nc.is_ours() => {
                let name = nc.metadata.name.clone().unwrap_or_default();
                state.claims.insert(name.clone(), nc);
                reconcile(state, &name).await;
            }
            Some(WatchEvent::Deleted(nc)) if nc.is_ours() => {
                let name = nc.metadata.name.clone().unwrap_or_default();
                state.claims.remove(&name);
                state.waiting.remove(&name);
                // A force-deleted claim (S26): let the holder notice now rather than next probe.
                if let Some(h) = holder(&state.ctx, &nc) {
                    revoke_token(&state.ctx, &h, &name).await;
                    send(state, &h, HostMsg::Probe);
                }
            }
            Some(_) => {}
            None => {
                let names: Vec<String> = std::mem::take(&mut state.waiting).into_iter().collect();
                for n in names {
                    reconcile(state, &n).await;
                }
            }
        }
        Ok(())
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
    let want = claim_ref(nc)?;
    let name = ctx.hosts.holder(&want.uid)?;
    // The index is by UID; the name must match too (a reused name is another claim).
    ctx.hosts
        .get(&name)
        .filter(|h| h.claim() == Some(&want))
        .map(|_| name)
}

fn launched(nc: &NodeClaim) -> bool {
    nc.status
        .as_ref()
        .is_some_and(|s| s.conditions.iter().any(|c| c.type_ == "Launched"))
}

async fn reconcile<C: Cluster, T: Transport>(state: &mut RouterState<C, T>, name: &str) {
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
        claim_host(state, &nc).await
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
        // S40: leave only after the drain (the karpenter layer marks the NodeClaim drained);
        // a Node that never registered has nothing to drain, and a drain stuck past the
        // termination grace period does not hold the host forever.
        let drain_pending = !drained(nc)
            && !grace_expired(nc, &state.ctx.clock)
            && state.ctx.cluster.get::<Node>(None, &name).await?.is_some();
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
    Ok(())
}

fn drained(nc: &NodeClaim) -> bool {
    nc.metadata
        .annotations
        .as_ref()
        .is_some_and(|a| a.contains_key(crate::karpenter::DRAINED_ANNOTATION))
}

/// Deletion older than the NodeClaim's terminationGracePeriod (15 minutes when unset).
fn grace_expired(nc: &NodeClaim, clock: &crate::clock::Clock) -> bool {
    let grace = nc
        .spec
        .termination_grace_period
        .as_deref()
        .and_then(crate::profile::validate::parse_timeout)
        .unwrap_or(Duration::from_secs(15 * 60));
    nc.metadata
        .deletion_timestamp
        .as_ref()
        .is_some_and(|t| clock.since(t.0) >= grace)
}

/// Choose a host and claim it with a CAS carrying the NodeClaim's name and UID (S13, S15).
async fn claim_host<C: Cluster, T: Transport>(
    state: &mut RouterState<C, T>,
    nc: &NodeClaim,
) -> Result<(), ClusterError> {
    let Some(claim) = claim_ref(nc) else {
        return Ok(());
    };
    let cluster = state.ctx.cluster.clone();
    let class_name = &nc.spec.node_class_ref.name;
    let Some(class) = cluster.get::<SSHNodeClass>(None, class_name).await? else {
        return insufficient(state, nc, &format!("SSHNodeClass {class_name} not found")).await;
    };
    let profile_name = &class.spec.join_profile_ref.name;
    let marker = match cluster.get::<SSHJoinProfile>(None, profile_name).await? {
        Some(p) => p.marker(),
        None => format!("{profile_name}@?"),
    };
    let hosts = state.ctx.hosts.snapshot();
    let candidates = match choose::candidates(nc, &class, &marker, &hosts) {
        Ok(c) => c,
        Err(e) => return insufficient(state, nc, &e.to_string()).await,
    };
    if candidates.is_empty() {
        return insufficient(state, nc, "no Available host of any fitting class").await;
    }
    finalizers::set(&cluster, nc, TERMINATION_FINALIZER, true).await?;
    for name in candidates.iter().take(CLAIM_ATTEMPTS) {
        let Some(host) = state.ctx.hosts.get(name) else {
            continue;
        };
        match cas_claim(&state.ctx, &host, &claim).await {
            Ok(updated) => {
                state.ctx.hosts.upsert(updated);
                state.claimed += 1;
                state.ctx.metrics.claims.inc();
                state.launches.insert(claim.uid.clone());
                let subject = crate::telemetry::lifecycle::Subject::new(
                    &format!("{}/{name}", state.ctx.pool_ns()),
                    host.class(),
                    &claim,
                    crate::telemetry::lifecycle::nodepool_of(nc),
                );
                state.ctx.lifecycles.begin(&subject);
                state.ctx.lifecycles.step(&claim.uid, "claim", "success");
                send(state, name, HostMsg::Launch(claim.clone()));
                let msg = format!("claimed SSHHost {}/{name}", state.ctx.pool_ns());
                events::record(&cluster, nc, EventType::Normal, events::CLAIMED, msg).await;
                return Ok(());
            }
            Err(e) if e.is_conflict() => {
                // S15: someone else got there first; that is not an error. Try the next one.
                state.conflicts += 1;
                state.ctx.metrics.claim_conflicts.inc();
                if let Ok(Some(fresh)) = cluster
                    .get::<SSHHost>(Some(state.ctx.pool_ns()), name)
                    .await
                {
                    state.ctx.hosts.upsert(fresh);
                }
            }
            Err(e) => return Err(e),
        }
    }
    state.waiting.insert(claim.name.clone());
    Ok(())
}

async fn cas_claim<C: Cluster, T: Transport>(
    ctx: &Context<C, T>,
    host: &SSHHost,
    claim: &ClaimRef,
) -> Result<SSHHost, ClusterError> {
    crate::actors::status::write_status(
        &ctx.cluster,
        &ctx.clock,
        host,
        crate::actors::status::ProbeStamp::Keep,
        |s| {
            s.state = HostState::Claimed;
            s.claim_ref = Some(claim.clone());
        },
    )
    .await
}

/// S19: nothing fits. No claim is written; the NodeClaim says why and is deleted so that
/// provisioning can try again (Karpenter's insufficient-capacity semantics).
async fn insufficient<C: Cluster, T: Transport>(
    state: &mut RouterState<C, T>,
    nc: &NodeClaim,
    why: &str,
) -> Result<(), ClusterError> {
    let cluster = state.ctx.cluster.clone();
    let msg = format!("insufficient capacity: {why}");
    events::record(
        &cluster,
        nc,
        EventType::Warning,
        events::INSUFFICIENT_CAPACITY,
        msg.clone(),
    )
    .await;
    set_launched(
        &cluster,
        nc,
        false,
        events::INSUFFICIENT_CAPACITY,
        &msg,
        &state.ctx.clock,
    )
    .await?;
    let name = nc.metadata.name.clone().unwrap_or_default();
    cluster.delete::<NodeClaim>(None, &name, None).await?;
    if let Some(current) = cluster.get::<NodeClaim>(None, &name).await? {
        finalizers::set(&cluster, &current, TERMINATION_FINALIZER, false).await?;
    }
    Ok(())
}
