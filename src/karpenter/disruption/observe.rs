//! What disruption tells (S59), in core's words where core has them: the NodePool's budget
//! (`karpenter_nodepools_allowed_disruptions`, and a `DisruptionBlocked` event on the NodePool
//! when a budget allows nothing for a reason), candidates that cannot be consolidated
//! (`Unconsolidatable` on the Node and the NodeClaim), decisions
//! (`karpenter_voluntary_disruption_decisions_total`) and the candidates of a round
//! (`karpenter_voluntary_disruption_eligible_nodes`).

use jiff::Timestamp;
use k8s_openapi::api::core::v1::Node;

use super::super::budgets;
use super::blockers::DISRUPTION_BLOCKED;
use super::{Notices, Reason};
use crate::actors::Context;
use crate::actors::events;
use crate::api::{NodeClaim, NodePool};
use crate::k8s::{Cluster, EventType};
use crate::ssh::Transport;

/// Core's event reason for a candidate consolidation cannot act on.
pub const UNCONSOLIDATABLE: &str = "Unconsolidatable";

/// Core's budget reasons, in the order its methods run.
pub const BUDGET_REASONS: [&str; 3] = ["Empty", "Drifted", "Underutilized"];

/// Core's `consolidation_type` label of a decision for `reason`.
pub fn consolidation_type(reason: Reason) -> &'static str {
    match reason {
        Reason::Empty => "empty",
        Reason::Underutilized => "single",
        Reason::Expired | Reason::Drifted => "",
    }
}

/// The budget reason a candidate's disruption counts against.
pub fn budget_reason(reason: Reason) -> &'static str {
    match reason {
        Reason::Expired | Reason::Drifted => "Drifted",
        Reason::Empty => "Empty",
        Reason::Underutilized => "Underutilized",
    }
}

/// A voluntary disruption decision was carried out.
pub fn decided<C: Cluster, T: Transport>(
    ctx: &Context<C, T>,
    decision: &str,
    reason: Reason,
    consolidation_type: &str,
) {
    ctx.metrics
        .core
        .decision(decision, budget_reason(reason), consolidation_type);
}

/// Publish `pool`'s allowed disruptions per reason; a budget that allows none while the pool
/// has nodes is told on the NodePool (core's `NodePoolBlockedForDisruptionReason`).
pub async fn budgets<C: Cluster, T: Transport>(
    ctx: &Context<C, T>,
    notices: &mut Notices,
    pool: &NodePool,
    total: usize,
    now: Timestamp,
) {
    let name = pool.metadata.name.clone().unwrap_or_default();
    for reason in BUDGET_REASONS {
        let allowed = budgets::allowed(pool, reason, total, now);
        ctx.metrics
            .core
            .allowed_disruptions
            .get_or_create(&crate::karpenter::metrics::PoolReasonLabels {
                nodepool: name.clone(),
                reason: reason.to_lowercase(),
            })
            .set(allowed.min(i64::from(i32::MAX)));
        if total == 0 || allowed > 0 {
            continue;
        }
        let msg = match budgets::allowed_or_error(pool, reason, total, now) {
            Err(e) => format!(
                "No allowed disruptions for disruption reason {reason} due to blocking budget \
                 (an invalid budget allows none: {e})"
            ),
            Ok(_) => format!(
                "No allowed disruptions for disruption reason {reason} due to blocking budget"
            ),
        };
        let key = format!("{}{name}", Notices::NODEPOOL);
        if notices.due(&key, &format!("{DISRUPTION_BLOCKED}/{reason}"), &msg, now) {
            events::record(
                &ctx.cluster,
                pool,
                EventType::Normal,
                DISRUPTION_BLOCKED,
                msg,
            )
            .await;
        }
    }
}

/// Core's `Unconsolidatable` event, on the Node and the NodeClaim (once per situation).
pub async fn unconsolidatable<C: Cluster, T: Transport>(
    ctx: &Context<C, T>,
    notices: &mut Notices,
    claim: &NodeClaim,
    node: &Node,
    msg: &str,
) {
    let name = claim.metadata.name.clone().unwrap_or_default();
    if !notices.due(&name, UNCONSOLIDATABLE, msg, ctx.clock.now()) {
        return;
    }
    events::record(&ctx.cluster, node, EventType::Normal, UNCONSOLIDATABLE, msg).await;
    events::record(
        &ctx.cluster,
        claim,
        EventType::Normal,
        UNCONSOLIDATABLE,
        msg,
    )
    .await;
}
