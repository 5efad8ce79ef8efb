//! Node repair (S43), as core's node health controller: a NodeClaim whose Node has shown an
//! unhealthy condition for longer than that condition's toleration is deleted (forcefully: no
//! budget, no do-not-disrupt, and its drain's deadline — `karpenter.sh/nodeclaim-termination-
//! timestamp` — is now, so PodDisruptionBudgets do not hold it either), unless more than 20% of its NodePool's nodes are unhealthy —
//! then nothing of that pool is repaired and a `NodeRepairBlocked` event says why. In an API or
//! network partition every node goes NotReady at once; draining the whole fleet then would
//! turn an outage into lost workloads. Off unless enabled ([`KarpenterConfig::node_repair`]),
//! as upstream's NodeRepair feature gate.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Node, NodeCondition};
use serde_json::json;

use super::super::lifecycle::node_ready;
use super::super::state::{ClusterState, Inner};
use super::super::termination::deadline::{self, Recorded, TERMINATION_TIMESTAMP_ANNOTATION};
use super::super::{KarpenterConfig, KarpenterError};
use super::Notices;
use crate::actors::Context;
use crate::actors::events;
use crate::api::{NodeClaim, NodePool};
use crate::k8s::{Cluster, EventType};
use crate::ssh::Transport;

/// Event on the NodeClaim (and its NodePool) when repair holds back.
pub const NODE_REPAIR_BLOCKED: &str = "NodeRepairBlocked";
/// Event on a NodeClaim deleted by repair.
pub const REPAIR: &str = "Repair";

/// Share of a NodePool's nodes that may be unhealthy before repair stops (core's
/// `allowedUnhealthyPercent`); rounded up, so one node of three may be repaired.
const ALLOWED_UNHEALTHY_PERCENT: usize = 20;

/// The toleration of `node`'s unhealthy condition, if it has one: kpssh's repair policies are
/// core's for the Ready condition, `False` and `Unknown`, each [`KarpenterConfig::repair_toleration`].
fn unhealthy(node: &Node) -> Option<&NodeCondition> {
    node_ready(node).filter(|c| c.status == "False" || c.status == "Unknown")
}

/// How many of the nodes may be unhealthy while repair still acts.
fn allowed_unhealthy(nodes: usize) -> usize {
    (nodes * ALLOWED_UNHEALTHY_PERCENT).div_ceil(100)
}

/// Nodes and unhealthy nodes per NodePool (claims without one count under `""`), over the
/// claims that have a Node: core counts a pool's Nodes by their nodepool label.
fn health_by_pool(st: &Inner) -> BTreeMap<String, (usize, usize)> {
    let mut by_pool: BTreeMap<String, (usize, usize)> = BTreeMap::new();
    for nc in st.nodeclaims.values() {
        let Some(node) = st.node_of(nc) else { continue };
        let e = by_pool
            .entry(nc.nodepool().unwrap_or_default().to_string())
            .or_default();
        e.0 += 1;
        if unhealthy(node).is_some() {
            e.1 += 1;
        }
    }
    by_pool
}

pub(super) async fn repair<C: Cluster, T: Transport>(
    ctx: &Context<C, T>,
    state: &ClusterState,
    cfg: &KarpenterConfig,
    notices: &mut Notices,
) -> Result<(), KarpenterError> {
    if !cfg.node_repair {
        return Ok(());
    }
    let toleration = cfg.repair_toleration;
    let (due, health): (Vec<(Arc<NodeClaim>, String)>, _) = {
        let st = state.read();
        let due: Vec<_> = st
            .repair_candidates()
            .into_iter()
            .filter(|nc| nc.metadata.deletion_timestamp.is_none())
            .filter_map(|nc| {
                let cond = st.node_of(nc).and_then(unhealthy)?;
                let since = cond.last_transition_time.as_ref()?.0;
                (ctx.clock.since(since) >= toleration)
                    .then(|| (nc.clone(), format!("Ready={}", cond.status)))
            })
            .collect();
        // Only counted when some node is due: a healthy fleet costs no pass over every claim.
        let health = if due.is_empty() {
            BTreeMap::new()
        } else {
            health_by_pool(&st)
        };
        (due, health)
    };
    for (nc, condition) in due {
        let name = nc.metadata.name.clone().unwrap_or_default();
        let pool = nc.nodepool().unwrap_or_default().to_string();
        let (nodes, bad) = health.get(&pool).copied().unwrap_or_default();
        if bad > allowed_unhealthy(nodes) {
            let msg = format!(
                "not repairing NodeClaim {name} ({condition} for over {}): {bad} of {nodes} \
                 nodes of NodePool {pool} are unhealthy, more than {ALLOWED_UNHEALTHY_PERCENT}%",
                minutes(toleration)
            );
            if notices.due(&name, NODE_REPAIR_BLOCKED, &msg, ctx.clock.now()) {
                tracing::warn!(nodeclaim = %name, nodepool = %pool, bad, nodes, "node repair blocked");
                events::record(
                    &ctx.cluster,
                    &*nc,
                    EventType::Warning,
                    NODE_REPAIR_BLOCKED,
                    msg.clone(),
                )
                .await;
                let np = state.read().nodepools.get(&pool).cloned();
                if let Some(np) = np {
                    events::record::<_, NodePool>(
                        &ctx.cluster,
                        &np,
                        EventType::Warning,
                        NODE_REPAIR_BLOCKED,
                        msg,
                    )
                    .await;
                }
            }
            continue;
        }
        // As core: an unhealthy node goes forcefully, its drain's deadline is now (PDBs and
        // do-not-disrupt pods no longer hold it; an earlier deadline stands).
        let now = ctx.clock.now();
        if !matches!(deadline::recorded(&nc), Recorded::At(t) if t <= now) {
            let patch = json!({"metadata": {"annotations": {
                TERMINATION_TIMESTAMP_ANNOTATION: deadline::format(now),
            }}});
            match ctx.cluster.patch::<NodeClaim>(None, &name, &patch).await {
                Ok(updated) => state.observe_claim(updated),
                Err(e) if e.is_not_found() => continue,
                Err(e) => return Err(e.into()),
            }
        }
        let msg = format!(
            "Node {condition} for over {}; deleting NodeClaim {name}",
            minutes(toleration)
        );
        events::record(&ctx.cluster, &*nc, EventType::Warning, REPAIR, msg).await;
        ctx.metrics.disruption("Unhealthy");
        ctx.metrics.core.disrupted("Unhealthy", &nc);
        match ctx.cluster.delete::<NodeClaim>(None, &name, None).await {
            Ok(_) => {}
            Err(e) if e.is_not_found() => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}

fn minutes(d: Duration) -> String {
    if d.as_secs().is_multiple_of(60) {
        format!("{}m", d.as_secs() / 60)
    } else {
        format!("{}s", d.as_secs())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Core rounds the 20% up: one node of three (or of five) may be repaired, two of five not.
    #[test]
    fn s43_threshold_rounds_up_as_core() {
        assert_eq!(allowed_unhealthy(0), 0);
        assert_eq!(allowed_unhealthy(1), 1);
        assert_eq!(allowed_unhealthy(3), 1);
        assert_eq!(allowed_unhealthy(5), 1);
        assert_eq!(allowed_unhealthy(6), 2);
        assert_eq!(allowed_unhealthy(10), 2);
        assert_eq!(allowed_unhealthy(11), 3);
    }
}
