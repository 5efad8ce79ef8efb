//! S26/S27: a join stops when its NodeClaim goes. Core's lifecycle deletes the instance (and
//! with it the credentials it was given) as soon as a NodeClaim is deleted, launched or not.
//! Here the join is killed as on its timeout, so that the host's actor is free at once to
//! delete the bootstrap token and release the host, instead of after the join's timeout
//! (minutes, for a join that hangs). The router's own delete of the token when the claim
//! vanishes is one attempt; this is the one the actor retries.

use std::future::Future;

use tokio_util::sync::CancellationToken;

use crate::actors::Context;
use crate::api::{ClaimRef, NodeClaim};
use crate::k8s::Cluster;
use crate::ssh::Transport;

/// Run `phase` (a command carrying `cancel`) and cancel it once `claim` is gone or being
/// deleted. The phase's result, and whether it was cancelled (it may still have finished
/// first: the result says).
pub async fn while_wanted<C: Cluster, T: Transport, R>(
    ctx: &Context<C, T>,
    claim: &ClaimRef,
    cancel: &CancellationToken,
    phase: impl Future<Output = R>,
) -> (R, bool) {
    tokio::pin!(phase);
    tokio::select! {
        biased;
        r = &mut phase => (r, false),
        () = unwanted(ctx, claim) => {
            cancel.cancel();
            (phase.await, true)
        }
    }
}

/// Resolves once the router's view says the claim is gone or being deleted and the API agrees
/// (a read that fails leaves the view's word standing: it comes from the watch).
async fn unwanted<C: Cluster, T: Transport>(ctx: &Context<C, T>, claim: &ClaimRef) {
    loop {
        let change = ctx.claims.notified();
        tokio::pin!(change);
        change.as_mut().enable();
        if !ctx.claims.live(&claim.uid) && !wanted(ctx, claim).await.unwrap_or(false) {
            return;
        }
        change.await;
    }
}

/// The NodeClaim exists with this UID and is not being deleted.
pub async fn wanted<C: Cluster, T: Transport>(
    ctx: &Context<C, T>,
    claim: &ClaimRef,
) -> Result<bool, crate::k8s::ClusterError> {
    let current: Option<NodeClaim> = ctx.cluster.get(None, &claim.name).await?;
    Ok(current.is_some_and(|nc| {
        nc.metadata.uid.as_deref() == Some(claim.uid.as_str())
            && nc.metadata.deletion_timestamp.is_none()
    }))
}
