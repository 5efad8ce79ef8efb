//! One claim in flight: the API writes for a NodeClaim and the host reserved for it, run as a
//! task beside the router so that a burst of claims overlaps its round trips. The task owns
//! nothing of the router's: it reports a [`ClaimOutcome`] back by message and the router
//! applies it.

use ractor::ActorRef;

use super::RouterMsg;
use crate::actors::host::launch::set_launched;
use crate::api::karpenter::TERMINATION_FINALIZER;
use crate::api::{ClaimRef, HostState, NodeClaim, SSHHost};
use crate::k8s::events;
use crate::k8s::{Cluster, ClusterError, EventType, finalizers};
use crate::provider::Context;
use crate::ssh::Transport;

/// What a claim task did, for the router to apply.
#[derive(Debug)]
pub struct ClaimOutcome {
    pub claim: ClaimRef,
    /// The host reserved for the task, if any.
    pub host: Option<String>,
    /// The termination finalizer is on the NodeClaim (set by this task or before it).
    pub finalized: bool,
    pub result: ClaimResult,
}

#[derive(Debug)]
pub enum ClaimResult {
    /// The CAS was accepted: the host as written.
    Won(Box<SSHHost>),
    /// Someone else changed the host first (S15): not an error. The host as re-read, if the
    /// read worked.
    Lost(Option<Box<SSHHost>>),
    /// Nothing fits (S19): the NodeClaim was marked and deleted.
    Insufficient,
    /// An API error: the claim is looked at again on a later tick.
    Failed(ClusterError),
}

/// Set the finalizer (once) and compare-and-swap the claim onto `host` (name and UID, S13,
/// S15); report, then record the event.
pub async fn run<C: Cluster, T: Transport>(
    ctx: Context<C, T>,
    router: ActorRef<RouterMsg>,
    nc: NodeClaim,
    claim: ClaimRef,
    host: SSHHost,
    finalized: bool,
) {
    let host_name = host.metadata.name.clone().unwrap_or_default();
    let mut outcome = ClaimOutcome {
        claim: claim.clone(),
        host: Some(host_name.clone()),
        finalized,
        result: ClaimResult::Insufficient,
    };
    outcome.result = match claim_once(&ctx, &nc, &claim, &host, &mut outcome.finalized).await {
        Ok(updated) => {
            // The claim is on the API: the router may launch and take the next claim while
            // the event is written.
            outcome.result = ClaimResult::Won(Box::new(updated));
            report(&ctx, &router, outcome);
            tracing::info!(nodeclaim = %claim.name, host = %host_name, "claimed");
            let msg = format!("claimed SSHHost {}/{host_name}", ctx.pool_ns());
            events::record(&ctx.cluster, &nc, EventType::Normal, events::CLAIMED, msg).await;
            return;
        }
        Err(e) if e.is_conflict() && outcome.finalized => {
            let fresh = ctx
                .cluster
                .get::<SSHHost>(Some(ctx.pool_ns()), &host_name)
                .await
                .ok()
                .flatten();
            ClaimResult::Lost(fresh.map(Box::new))
        }
        Err(e) => ClaimResult::Failed(e),
    };
    report(&ctx, &router, outcome);
}

async fn claim_once<C: Cluster, T: Transport>(
    ctx: &Context<C, T>,
    nc: &NodeClaim,
    claim: &ClaimRef,
    host: &SSHHost,
    finalized: &mut bool,
) -> Result<SSHHost, ClusterError> {
    if !*finalized {
        finalizers::set(&ctx.cluster, nc, TERMINATION_FINALIZER, true).await?;
        *finalized = true;
    }
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

/// S19 as a task: mark and delete the NodeClaim, then report.
pub async fn run_insufficient<C: Cluster, T: Transport>(
    ctx: Context<C, T>,
    router: ActorRef<RouterMsg>,
    nc: NodeClaim,
    claim: ClaimRef,
    why: String,
) {
    let result = match insufficient(&ctx, &nc, &why).await {
        Ok(()) => ClaimResult::Insufficient,
        Err(e) => ClaimResult::Failed(e),
    };
    report(
        &ctx,
        &router,
        ClaimOutcome {
            claim,
            host: None,
            finalized: false,
            result,
        },
    );
}

fn report<C: Cluster, T: Transport>(
    ctx: &Context<C, T>,
    router: &ActorRef<RouterMsg>,
    outcome: ClaimOutcome,
) {
    // A stopped router has nothing left to apply the outcome to; the watch replays the
    // NodeClaim to the next one.
    if router
        .send_message(RouterMsg::Claimed(Box::new(outcome)))
        .is_ok()
    {
        ctx.metrics.mailbox_in("router");
    }
}

/// S19: nothing fits. No claim is written; the NodeClaim says why and is deleted so that
/// provisioning can try again (Karpenter's insufficient-capacity semantics).
async fn insufficient<C: Cluster, T: Transport>(
    ctx: &Context<C, T>,
    nc: &NodeClaim,
    why: &str,
) -> Result<(), ClusterError> {
    let cluster = &ctx.cluster;
    let msg = format!("insufficient capacity: {why}");
    tracing::info!(nodeclaim = ?nc.metadata.name, %why, "no host to claim; NodeClaim deleted");
    events::record(
        cluster,
        nc,
        EventType::Warning,
        events::INSUFFICIENT_CAPACITY,
        msg.clone(),
    )
    .await;
    set_launched(
        cluster,
        nc,
        false,
        events::INSUFFICIENT_CAPACITY,
        &msg,
        &ctx.clock,
    )
    .await?;
    let name = nc.metadata.name.clone().unwrap_or_default();
    cluster.delete::<NodeClaim>(None, &name, None).await?;
    if let Some(current) = cluster.get::<NodeClaim>(None, &name).await? {
        finalizers::set(cluster, &current, TERMINATION_FINALIZER, false).await?;
    }
    Ok(())
}
