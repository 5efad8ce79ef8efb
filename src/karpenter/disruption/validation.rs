//! Validation just before a decision is carried out: the API is read again.

use k8s_openapi::api::core::v1::Node;

use super::super::state::ClusterState;
use super::super::termination::is_marked;
use super::super::{KarpenterError, pods};
use super::Reason;
use super::candidates::{Candidate, annotated};
use crate::actors::Context;
use crate::api::NodeClaim;
use crate::api::karpenter::DO_NOT_DISRUPT_ANNOTATION;
use crate::k8s::Cluster;
use crate::ssh::Transport;

/// Re-read the NodeClaim and its Node: still ours to disrupt, still no do-not-disrupt, and an
/// empty node still empty.
pub(super) async fn validate<C: Cluster, T: Transport>(
    ctx: &Context<C, T>,
    state: &ClusterState,
    c: &Candidate,
) -> Result<bool, KarpenterError> {
    let name = c.claim.metadata.name.clone().unwrap_or_default();
    let Some(fresh) = ctx.cluster.get::<NodeClaim>(None, &name).await? else {
        return Ok(false);
    };
    if fresh.metadata.uid != c.claim.metadata.uid
        || fresh.metadata.deletion_timestamp.is_some()
        || is_marked(&fresh)
        || annotated(&fresh.metadata, DO_NOT_DISRUPT_ANNOTATION)
    {
        return Ok(false);
    }
    let node_name = c.node.metadata.name.clone().unwrap_or_default();
    let Some(node) = ctx.cluster.get::<Node>(None, &node_name).await? else {
        return Ok(false);
    };
    if annotated(&node.metadata, DO_NOT_DISRUPT_ANNOTATION) {
        return Ok(false);
    }
    let st = state.read();
    let blocking = st
        .pods_on(&node_name)
        .any(|p| pods::counts_on_node(p) && pods::do_not_disrupt(p));
    let moving = st
        .pods_on(&node_name)
        .filter(|p| pods::is_reschedulable(p))
        .count();
    if blocking || (c.reason == Reason::Empty && moving > 0) {
        return Ok(false);
    }
    Ok(true)
}
