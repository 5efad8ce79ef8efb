//! Validation at the moment of disruption (S46, S49): the NodeClaim and its Node are read
//! again from the API, and what could block the disruption is checked again (do-not-disrupt on
//! the claim, the Node or a pod; a PodDisruptionBudget that allows no eviction now) — a pod or
//! a budget may have changed since the candidate was chosen, or while a replacement launched.

use k8s_openapi::api::core::v1::Node;

use super::super::state::ClusterState;
use super::super::termination::is_marked;
use super::super::{KarpenterError, pods};
use super::blockers::{Pdbs, blocker};
use super::{Reason, replacement};
use crate::api::NodeClaim;
use crate::k8s::Cluster;
use crate::provider::Context;
use crate::ssh::Transport;

/// What validation found.
#[derive(Debug, Clone, PartialEq)]
pub(super) enum Verdict {
    /// Still to be disrupted, as decided.
    Go,
    /// The claim or its Node changed meanwhile (gone, replaced, being deleted or disrupted, an
    /// empty node no longer empty): the decision no longer applies; nothing to tell.
    Changed,
    /// Something blocks the disruption now; why.
    Blocked(String),
}

/// What is being validated.
pub(super) struct Decision<'a> {
    pub claim: &'a NodeClaim,
    pub node_name: &'a str,
    pub reason: Reason,
    /// The claim is waiting for its replacement (and must still be); else it must not be.
    pub replaced: bool,
}

pub(super) async fn validate<C: Cluster, T: Transport>(
    ctx: &Context<C, T>,
    state: &ClusterState,
    d: &Decision<'_>,
) -> Result<Verdict, KarpenterError> {
    let name = d.claim.metadata.name.clone().unwrap_or_default();
    let Some(fresh) = ctx.cluster.get::<NodeClaim>(None, &name).await? else {
        return Ok(Verdict::Changed);
    };
    if fresh.metadata.uid != d.claim.metadata.uid
        || fresh.metadata.deletion_timestamp.is_some()
        || is_marked(&fresh)
        || replacement::replaced_by(&fresh).is_some() != d.replaced
    {
        return Ok(Verdict::Changed);
    }
    let Some(node) = ctx.cluster.get::<Node>(None, d.node_name).await? else {
        return Ok(Verdict::Changed);
    };
    if node.metadata.deletion_timestamp.is_some() {
        return Ok(Verdict::Changed);
    }
    let st = state.read();
    let bound: Vec<_> = st.pods_on(d.node_name).collect();
    let mut pdbs = Pdbs::new(&st);
    if let Some(why) = blocker(&st, &mut pdbs, &fresh, &node, &bound, d.reason) {
        return Ok(Verdict::Blocked(why));
    }
    if d.reason == Reason::Empty && bound.iter().any(|p| pods::is_reschedulable(p)) {
        return Ok(Verdict::Changed);
    }
    Ok(Verdict::Go)
}
