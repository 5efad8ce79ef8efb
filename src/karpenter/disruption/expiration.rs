//! Expiration (S51), forceful as core v1's NodeClaim expiration controller: a NodeClaim older
//! than its `expireAfter` is deleted — no disruption budget, no `karpenter.sh/do-not-disrupt`,
//! no replacement first. Its drain then holds for PodDisruptionBudgets and do-not-disrupt pods
//! only until the NodeClaim's `terminationGracePeriod`, counted from the deletion.

use std::sync::Arc;

use super::super::termination::parse_duration;
use super::super::{KarpenterError, state::ClusterState};
use super::Reason;
use crate::api::NodeClaim;
use crate::k8s::events;
use crate::k8s::{Cluster, EventType};
use crate::provider::Context;
use crate::ssh::Transport;

/// Delete every expired NodeClaim of ours; their names.
pub(super) async fn expire<C: Cluster, T: Transport>(
    ctx: &Context<C, T>,
    state: &ClusterState,
) -> Result<Vec<(String, Reason)>, KarpenterError> {
    let expired: Vec<(Arc<NodeClaim>, String)> = {
        let st = state.read();
        (st.expiring_claims().iter())
            // The index holds only claims not being deleted.
            .filter_map(|name| st.nodeclaims.get(name))
            .filter_map(|nc| {
                let after = nc.spec.expire_after.as_deref()?;
                let created = nc.metadata.creation_timestamp.as_ref()?.0;
                let Some(limit) = parse_duration(after).filter(|_| after != "Never") else {
                    if after != "Never" {
                        tracing::error!(nodeclaim = ?nc.metadata.name, expire_after = after, "expireAfter is not a duration like 720h (or Never); this NodeClaim does not expire until it is fixed");
                    }
                    return None;
                };
                (ctx.clock.since(created) >= limit).then(|| (nc.clone(), after.to_string()))
            })
            .collect()
    };
    let mut done = vec![];
    for (nc, after) in expired {
        let name = nc.metadata.name.clone().unwrap_or_default();
        match ctx.cluster.delete::<NodeClaim>(None, &name, None).await {
            Ok(_) => {}
            Err(e) if e.is_not_found() => continue,
            Err(e) => return Err(e.into()),
        }
        let msg = format!("disrupting NodeClaim {name} (Expired: older than expireAfter {after})");
        events::record(
            &ctx.cluster,
            &*nc,
            EventType::Normal,
            "DisruptionTerminating",
            msg,
        )
        .await;
        ctx.metrics.disruption(Reason::Expired.as_str());
        ctx.metrics.core.disrupted(Reason::Expired.as_str(), &nc);
        done.push((name, Reason::Expired));
    }
    Ok(done)
}
