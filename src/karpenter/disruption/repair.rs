//! Node repair: a NodeClaim whose Node has been unhealthy too long is deleted.

use std::sync::Arc;

use super::super::lifecycle::node_ready;
use super::super::state::ClusterState;
use super::super::{KarpenterConfig, KarpenterError};
use crate::actors::Context;
use crate::actors::events;
use crate::api::NodeClaim;
use crate::k8s::{Cluster, EventType};
use crate::ssh::Transport;

pub(super) async fn repair<C: Cluster, T: Transport>(
    ctx: &Context<C, T>,
    state: &ClusterState,
    cfg: &KarpenterConfig,
) -> Result<(), KarpenterError> {
    let unhealthy: Vec<Arc<NodeClaim>> = {
        let st = state.read();
        st.repair_candidates()
            .into_iter()
            .filter(|nc| {
                st.node_of(nc).and_then(node_ready).is_some_and(|c| {
                    c.status != "True"
                        && c.last_transition_time
                            .as_ref()
                            .is_some_and(|t| ctx.clock.since(t.0) >= cfg.repair_after)
                })
            })
            .cloned()
            .collect()
    };
    for nc in unhealthy {
        let name = nc.metadata.name.clone().unwrap_or_default();
        let msg = format!(
            "Node not Ready for {:?}; deleting NodeClaim",
            cfg.repair_after
        );
        events::record(&ctx.cluster, &*nc, EventType::Warning, "Repair", msg).await;
        ctx.metrics.disruption("Unhealthy");
        ctx.cluster.delete::<NodeClaim>(None, &name, None).await?;
    }
    Ok(())
}
