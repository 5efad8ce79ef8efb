//! A node exchanged for its replacement (S38 cheaper, S39/S50 drifted, S49), as core's
//! orchestration queue runs a command with replacements: the old node is cordoned (the
//! `karpenter.sh/disrupted:NoSchedule` taint) before the replacement is launched, so nothing
//! new lands on it meanwhile; once the replacement is Initialized, the old NodeClaim is
//! validated again (do-not-disrupt, PodDisruptionBudgets, the NodePool's budget) and only then
//! disrupted. A replacement not Initialized within [`REPLACEMENT_TIMEOUT`] is deleted and the
//! old node un-cordoned; so is the old node of an exchange called off for any other reason.
//! A cordon that no exchange explains any more (a crash between cordon and launch) is lifted.

use std::sync::Arc;
use std::time::Duration;

use jiff::Timestamp;
use k8s_openapi::api::core::v1::Node;
use serde_json::json;

use super::super::scheduling::PodInfo;
use super::super::state::ClusterState;
use super::super::termination::is_marked;
use super::super::{KarpenterError, budgets};
use super::blockers::DISRUPTION_BLOCKED;
use super::candidates::Candidate;
use super::replacement::{self, Progress, Replacer, abandon, launch};
use super::validation::{Decision, Verdict, validate};
use super::{Notices, Reason, mark};
use crate::actors::Context;
use crate::actors::events;
use crate::api::karpenter::DISRUPTED_TAINT_KEY;
use crate::api::{NodeClaim, NodePool, SSHNodeClass};
use crate::k8s::{Cluster, EventType};
use crate::ssh::Transport;

/// A replacement not Initialized this long after it was created is given up (core's
/// orchestration queue gives a command 10 minutes).
pub const REPLACEMENT_TIMEOUT: Duration = Duration::from_secs(10 * 60);
/// Event on the old NodeClaim when its replacement is given up.
pub const REPLACEMENT_TIMED_OUT: &str = "ReplacementTimedOut";

/// What starting an exchange did.
pub(super) enum Started {
    /// The old node is cordoned and its replacement launched.
    Launched,
    /// No instance type with a free host takes the pods (within the NodePool's limits).
    NoRoom,
    /// Something blocks the disruption now; why.
    Blocked(String),
    /// The claim changed meanwhile.
    Changed,
}

/// Cordon the candidate's node and launch a replacement for its pods (`moving`): on a cheaper
/// instance type for an under-utilised node, on any type for a drifted one.
pub(super) async fn start<C: Cluster, T: Transport>(
    ctx: &Context<C, T>,
    state: &ClusterState,
    pool: &NodePool,
    class: &SSHNodeClass,
    c: &Candidate,
    moving: &[PodInfo],
    replacer: &mut Option<Option<Replacer>>,
) -> Result<Started, KarpenterError> {
    let cheaper = c.reason == Reason::Underutilized;
    if replacer.is_none() {
        *replacer = Some(Replacer::new(ctx, state, pool, class));
    }
    let Some(Some(r)) = replacer.as_mut() else {
        return Ok(Started::NoRoom);
    };
    let Some(new) = r.node_for(&c.claim, moving, cheaper) else {
        return Ok(Started::NoRoom);
    };
    let node_name = c.node.metadata.name.clone().unwrap_or_default();
    let decision = Decision {
        claim: &c.claim,
        node_name: &node_name,
        reason: c.reason,
        replaced: false,
    };
    match validate(ctx, state, &decision).await? {
        Verdict::Go => {}
        Verdict::Changed => return Ok(Started::Changed),
        Verdict::Blocked(why) => return Ok(Started::Blocked(why)),
    }
    if !cordon(ctx, &node_name).await? {
        return Ok(Started::Changed);
    }
    match launch(ctx, state, pool, &c.claim, &new, c.reason.as_str()).await {
        Ok(Some(_)) => {
            r.reserve(&new.instance_type);
            Ok(Started::Launched)
        }
        Ok(None) => {
            uncordon(ctx, &node_name).await?;
            Ok(Started::Changed)
        }
        Err(e) => {
            // Nothing was launched: the old node must not stay cordoned.
            uncordon(ctx, &node_name).await?;
            Err(e)
        }
    }
}

/// The exchanges of `pool`: disrupt the old claims whose replacement is Initialized (if still
/// valid), call off the others that cannot finish, and lift cordons no exchange explains.
pub(super) async fn finish<C: Cluster, T: Transport>(
    ctx: &Context<C, T>,
    state: &ClusterState,
    pool: &NodePool,
    now: Timestamp,
    notices: &mut Notices,
) -> Result<Vec<(String, Reason)>, KarpenterError> {
    let pool_name = pool.metadata.name.clone().unwrap_or_default();
    type Waiting = (Arc<NodeClaim>, Option<String>, Progress);
    let (waiting, stale, total, mut draining): (Vec<Waiting>, Vec<String>, usize, i64) = {
        let st = state.read();
        let mine: Vec<&Arc<NodeClaim>> = st
            .nodeclaims
            .values()
            .filter(|nc| nc.nodepool() == Some(pool_name.as_str()))
            .collect();
        let live = mine
            .iter()
            .filter(|nc| nc.metadata.deletion_timestamp.is_none());
        // S59: core's count; the claims waiting for their replacement are the ones decided
        // on here, one by one.
        let usage = budgets::usage(&st, &pool_name);
        let (total, draining) = (usage.total, usage.disrupting);
        let mut waiting = vec![];
        let mut stale = vec![];
        for nc in live.filter(|nc| !is_marked(nc)) {
            let node = st.node_of(nc);
            let node_name = node.and_then(|n| n.metadata.name.clone());
            if let Some(p) = replacement::progress(&st, nc) {
                waiting.push(((*nc).clone(), node_name, p));
            } else if let Some(n) = node
                && n.metadata.deletion_timestamp.is_none()
                && cordoned(n)
                && let Some(name) = node_name
            {
                stale.push(name);
            }
        }
        (waiting, stale, total, draining)
    };
    for node in stale {
        tracing::info!(node = %node, "lifting a disruption cordon no exchange explains");
        uncordon(ctx, &node).await?;
    }
    let mut done = vec![];
    for (old, node, progress) in waiting {
        let name = old.metadata.name.clone().unwrap_or_default();
        let reason = match replacement::reason(&old) {
            Some("Drifted") => Reason::Drifted,
            Some("Expired") => Reason::Expired,
            _ => Reason::Underutilized,
        };
        let (Some(node), Progress::Ready(by)) = (node.as_deref(), &progress) else {
            match progress {
                // Gone, or ready while the old claim has no Node to drain: nothing to exchange.
                Progress::Abandoned | Progress::Ready(_) => {
                    call_off(ctx, &old, node.as_deref()).await?
                }
                Progress::Waiting(by, created)
                    if created.is_some_and(|t| ctx.clock.since(t) >= REPLACEMENT_TIMEOUT) =>
                {
                    let msg = format!(
                        "replacement NodeClaim {by} not Initialized within {}m: deleting it; \
                         NodeClaim {name} stays",
                        REPLACEMENT_TIMEOUT.as_secs() / 60
                    );
                    tracing::warn!(nodeclaim = %name, replacement = %by, "replacement timed out");
                    events::record(
                        &ctx.cluster,
                        &*old,
                        EventType::Warning,
                        REPLACEMENT_TIMED_OUT,
                        msg,
                    )
                    .await;
                    match ctx.cluster.delete::<NodeClaim>(None, &by, None).await {
                        Ok(_) => {}
                        Err(e) if e.is_not_found() => {}
                        Err(e) => return Err(e.into()),
                    }
                    call_off(ctx, &old, node.as_deref()).await?;
                }
                _ => {}
            }
            continue;
        };
        let decision = Decision {
            claim: &old,
            node_name: node,
            reason,
            replaced: true,
        };
        match validate(ctx, state, &decision).await? {
            Verdict::Go => {}
            Verdict::Changed => continue,
            Verdict::Blocked(why) => {
                let msg = format!(
                    "not disrupting NodeClaim {name} ({}): {why}; replacement NodeClaim {by} \
                     stays, the exchange is called off",
                    reason.as_str()
                );
                if notices.due(&name, DISRUPTION_BLOCKED, &msg, now) {
                    events::record(
                        &ctx.cluster,
                        &*old,
                        EventType::Normal,
                        DISRUPTION_BLOCKED,
                        msg,
                    )
                    .await;
                }
                call_off(ctx, &old, Some(node)).await?;
                continue;
            }
        }
        // The budget at the moment of disruption: the nodes being drained now, this one added.
        let budget_reason = if reason == Reason::Underutilized {
            "Underutilized"
        } else {
            "Drifted"
        };
        if draining + 1 > budgets::allowed(pool, budget_reason, total, now) {
            let waited = state
                .read()
                .nodeclaims
                .get(by.as_str())
                .and_then(|r| r.metadata.creation_timestamp.as_ref().map(|t| t.0))
                .is_some_and(|t| ctx.clock.since(t) >= REPLACEMENT_TIMEOUT);
            if waited {
                // As core: a command not done in time is given up; the replacement stays.
                call_off(ctx, &old, Some(node)).await?;
            }
            continue;
        }
        let Some(node_obj) = state.read().nodes.get(node).cloned() else {
            continue;
        };
        let detail = format!("replaced by NodeClaim {by}");
        if mark(ctx, state, &old, &node_obj, reason, Some(&detail)).await? {
            draining += 1;
            done.push((name, reason));
        }
    }
    Ok(done)
}

/// Call an exchange off: un-cordon the old node, then drop the old claim's mark (in this
/// order: without the mark, no later round would lift the cordon).
async fn call_off<C: Cluster, T: Transport>(
    ctx: &Context<C, T>,
    old: &NodeClaim,
    node: Option<&str>,
) -> Result<(), KarpenterError> {
    if let Some(node) = node
        && !uncordon(ctx, node).await?
    {
        return Ok(());
    }
    abandon(ctx, old).await
}

fn cordoned(node: &Node) -> bool {
    node.spec
        .as_ref()
        .and_then(|s| s.taints.as_ref())
        .is_some_and(|ts| ts.iter().any(|t| t.key == DISRUPTED_TAINT_KEY))
}

/// Put the disrupted taint on `node` (a compare-and-swap on the Node as the API has it now).
/// False when the Node is gone or changed meanwhile.
pub(super) async fn cordon<C: Cluster, T: Transport>(
    ctx: &Context<C, T>,
    node: &str,
) -> Result<bool, KarpenterError> {
    let Some(n) = ctx.cluster.get::<Node>(None, node).await? else {
        return Ok(false);
    };
    if cordoned(&n) {
        return Ok(true);
    }
    match super::super::termination::taint_node(&ctx.cluster, &n).await {
        Ok(()) => Ok(true),
        Err(e) if e.is_conflict() || e.is_not_found() => Ok(false),
        Err(e) => Err(e.into()),
    }
}

/// Take the disrupted taint off `node`. False when the Node changed meanwhile (tried again
/// next round); true when it is gone, being deleted, or not cordoned.
pub(super) async fn uncordon<C: Cluster, T: Transport>(
    ctx: &Context<C, T>,
    node: &str,
) -> Result<bool, KarpenterError> {
    let Some(n) = ctx.cluster.get::<Node>(None, node).await? else {
        return Ok(true);
    };
    if !cordoned(&n) || n.metadata.deletion_timestamp.is_some() {
        return Ok(true);
    }
    let taints: Vec<_> = n
        .spec
        .as_ref()
        .and_then(|s| s.taints.clone())
        .unwrap_or_default()
        .into_iter()
        .filter(|t| t.key != DISRUPTED_TAINT_KEY)
        .collect();
    let patch = json!({
        "metadata": {"resourceVersion": n.metadata.resource_version},
        "spec": {"taints": taints},
    });
    match ctx.cluster.patch::<Node>(None, node, &patch).await {
        Ok(_) => Ok(true),
        Err(e) if e.is_conflict() => Ok(false),
        Err(e) if e.is_not_found() => Ok(true),
        Err(e) => Err(e.into()),
    }
}
