//! S59: consolidateAfter is measured from the last pod event of a node (a pod bound to it, or
//! one leaving it), which core keeps in NodeClaim `status.lastPodEventTime` so that a restart
//! does not start the wait again. The cluster state notes the events as the pod watch delivers
//! them; this controller writes each NodeClaim's latest one into its status (at most once per
//! reconcile period and claim, never backwards), and the disruption controller reads the later
//! of the two.

use std::collections::BTreeSet;

use jiff::Timestamp;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use tokio::task::JoinHandle;

use super::state::{ClusterState, Inner};
use super::{KarpenterConfig, KarpenterError};
use crate::api::NodeClaim;
use crate::k8s::Cluster;
use crate::provider::Context;
use crate::ssh::Transport;

pub fn spawn<C: Cluster, T: Transport>(
    ctx: Context<C, T>,
    state: ClusterState,
    cfg: KarpenterConfig,
) -> JoinHandle<()> {
    tokio::spawn(async move {
        loop {
            tokio::time::sleep(cfg.reconcile_interval).await;
            if let Err(e) = persist(&ctx, &state).await {
                tracing::debug!(error = %e, "persisting pod event times failed; will retry");
            }
        }
    })
}

/// The last pod event of `nc`'s node as far as anyone knows: the one seen since this process
/// started, or the one persisted before.
pub fn last_pod_event(st: &Inner, nc: &NodeClaim) -> Option<Timestamp> {
    let persisted = nc
        .status
        .as_ref()
        .and_then(|s| s.last_pod_event_time.as_ref())
        .map(|t| t.0);
    let seen = nc
        .status
        .as_ref()
        .and_then(|s| s.node_name.as_deref())
        .and_then(|n| st.pod_events.get(n).copied());
    persisted.max(seen)
}

/// Write the newer event times into the NodeClaims' status. How many were written.
pub async fn persist<C: Cluster, T: Transport>(
    ctx: &Context<C, T>,
    state: &ClusterState,
) -> Result<usize, KarpenterError> {
    let due: Vec<NodeClaim> = {
        let st = state.read();
        // Only the claims of nodes that had a pod event can be due: a fleet of idle nodes
        // (or one whose demand is NodeClaims) costs this second-by-second loop nothing. Name
        // order, as a pass over every claim wrote them.
        let names: BTreeSet<&String> = st
            .pod_events
            .keys()
            .flat_map(|node| st.claims_on_node(node))
            .collect();
        names
            .into_iter()
            .filter_map(|name| st.nodeclaims.get(name))
            .filter(|nc| nc.metadata.deletion_timestamp.is_none())
            .filter_map(|nc| {
                let status = nc.status.as_ref()?;
                let seen = st.pod_events.get(status.node_name.as_deref()?)?;
                let stored = status.last_pod_event_time.as_ref().map(|t| t.0.as_second());
                // Whole seconds: what the API keeps of a time.
                if stored.is_some_and(|s| s >= seen.as_second()) {
                    return None;
                }
                let mut fresh = (**nc).clone();
                if let Some(s) = fresh.status.as_mut() {
                    s.last_pod_event_time = Some(Time(*seen));
                }
                Some(fresh)
            })
            .collect()
    };
    let mut written = 0;
    for nc in due {
        match ctx.cluster.replace_status(&nc).await {
            Ok(stored) => {
                state.observe_claim(stored);
                written += 1;
            }
            // Changed meanwhile (tried again next period with the claim as it is now) or gone.
            Err(e) if e.is_conflict() || e.is_not_found() => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(written)
}
