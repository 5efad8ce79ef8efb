//! Disruption (S38, S39) and repair: emptiness and under-utilisation consolidation after
//! `consolidateAfter`, drift (ProfileDrift, NodeClassDrift, NodePool template hash) and
//! `expireAfter`, each within the NodePool's budgets and never for nodes or pods annotated
//! `karpenter.sh/do-not-disrupt`; repair (Node Ready False/Unknown for 10 minutes) is forceful.
//!
//! A decision is validated again against the API just before it is executed, then carried out
//! by marking the NodeClaim (annotation + disrupted taint): the termination controller drains
//! it and deletes it.
//!
//! One module per concern: [`candidates`] (who could be disrupted, and why), [`consolidation`]
//! (the room on other nodes), [`replacement`] (a replacement node first), [`validation`] (the
//! check just before acting) and [`repair`].

mod candidates;
mod consolidation;
mod repair;
pub mod replacement;
mod validation;

use jiff::Timestamp;
use k8s_openapi::api::core::v1::Node;
use serde_json::json;
use tokio::task::JoinHandle;

use super::state::ClusterState;
use super::termination::taint_node;
use super::{DISRUPTION_ANNOTATION, KarpenterConfig, KarpenterError, budgets};
use crate::actors::Context;
use crate::actors::events;
use crate::api::{NodeClaim, NodePool, SSHJoinProfile, SSHNodeClass};
use crate::k8s::{Cluster, EventType};
use crate::ssh::Transport;

pub use consolidation::{Elsewhere, fits_elsewhere};

use candidates::{PoolSettings, PoolView};
use replacement::{finish_replacements, replace_first};
use validation::validate;

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Reason {
    Expired,
    Drifted,
    Empty,
    Underutilized,
}

impl Reason {
    pub fn as_str(self) -> &'static str {
        match self {
            Reason::Expired => "Expired",
            Reason::Drifted => "Drifted",
            Reason::Empty => "Empty",
            Reason::Underutilized => "Underutilized",
        }
    }
}

pub fn spawn<C: Cluster, T: Transport>(
    ctx: Context<C, T>,
    state: ClusterState,
    cfg: KarpenterConfig,
) -> JoinHandle<()> {
    tokio::spawn(async move {
        loop {
            tokio::time::sleep(cfg.disruption_interval).await;
            if let Err(e) = run_once(&ctx, &state, &cfg).await {
                tracing::warn!(error = %e, "disruption round failed");
            }
        }
    })
}

/// One evaluation of every NodePool of ours.
#[tracing::instrument(skip_all)]
pub async fn run_once<C: Cluster, T: Transport>(
    ctx: &Context<C, T>,
    state: &ClusterState,
    cfg: &KarpenterConfig,
) -> Result<Vec<(String, Reason)>, KarpenterError> {
    let now = ctx.clock.now();
    repair::repair(ctx, state, cfg).await?;
    let pools: Vec<NodePool> = state.read().nodepools.values().cloned().collect();
    let mut done = vec![];
    for pool in pools {
        done.extend(disrupt_pool(ctx, state, &pool, now).await?);
    }
    Ok(done)
}

async fn disrupt_pool<C: Cluster, T: Transport>(
    ctx: &Context<C, T>,
    state: &ClusterState,
    pool: &NodePool,
    now: Timestamp,
) -> Result<Vec<(String, Reason)>, KarpenterError> {
    let pool_name = pool.metadata.name.clone().unwrap_or_default();
    let class_name = &pool.spec.template.spec.node_class_ref.name;
    let class = ctx.cluster.get::<SSHNodeClass>(None, class_name).await?;
    let marker = match &class {
        Some(c) => ctx
            .cluster
            .get::<SSHJoinProfile>(None, &c.spec.join_profile_ref.name)
            .await?
            .map(|p| p.marker()),
        None => None,
    };
    let settings = PoolSettings::new(pool, class.as_ref(), marker.as_deref());
    let mut done = finish_replacements(ctx, state, &pool_name).await?;
    let PoolView {
        total,
        mut disrupting,
        candidates,
        pending,
    } = candidates::collect(ctx, &state.read(), &settings);
    let mut underutilized_done = false;
    // Built at the first check that needs it; nodes marked after that are forgotten in it.
    let mut elsewhere: Option<Elsewhere> = None;
    // Priced once per round, at the first candidate that could only be replaced.
    let mut replacer: Option<Option<replacement::Replacer>> = None;
    for c in candidates {
        let budget_reason = match c.reason {
            Reason::Expired | Reason::Drifted => "Drifted",
            Reason::Empty => "Empty",
            Reason::Underutilized => "Underutilized",
        };
        let allowed = budgets::allowed(pool, budget_reason, total, now);
        if disrupting >= allowed {
            continue;
        }
        let node_name = c.node.metadata.name.clone().unwrap_or_default();
        let voluntary = matches!(c.reason, Reason::Empty | Reason::Underutilized);
        if voluntary && !pending.is_empty() {
            let wanted = {
                let st = state.read();
                elsewhere
                    .get_or_insert_with(|| Elsewhere::new(&st))
                    .wanted_by_pending(&pending, &node_name)
            };
            if wanted {
                continue;
            }
        }
        if c.reason == Reason::Underutilized {
            // One consolidation move per round; its pods must all fit on the other nodes.
            if underutilized_done {
                continue;
            }
            let fits = {
                let st = state.read();
                elsewhere
                    .get_or_insert_with(|| Elsewhere::new(&st))
                    .fits(&st, &node_name)
            };
            if !fits {
                if let Some(class) = &class
                    && replace_first(ctx, state, pool, class, &c, &mut replacer).await?
                {
                    underutilized_done = true;
                    disrupting += 1;
                }
                continue;
            }
        }
        // Drift is graceful as upstream: replacement first. Expiry is forceful (upstream does not
        // wait for a replacement either).
        if c.reason == Reason::Drifted
            && c.pods > 0
            && let Some(class) = &class
            && replace_first(ctx, state, pool, class, &c, &mut replacer).await?
        {
            disrupting += 1;
            continue;
        }
        // Expired, or no host for a replacement, or nothing to move: disrupt now; the pods go
        // pending and provisioning finds them room when there is some.
        if !validate(ctx, state, &c).await? {
            continue;
        }
        let name = c.claim.metadata.name.clone().unwrap_or_default();
        if !mark(ctx, state, &c.claim, &c.node, c.reason, None).await? {
            continue;
        }
        if let Some(e) = elsewhere.as_mut() {
            e.forget(&node_name);
        }
        disrupting += 1;
        if c.reason == Reason::Underutilized {
            underutilized_done = true;
        }
        done.push((name, c.reason));
    }
    Ok(done)
}

/// Mark a NodeClaim for disruption (CAS on its resourceVersion), taint its Node, tell. False
/// when the claim changed or went away meanwhile.
pub(super) async fn mark<C: Cluster, T: Transport>(
    ctx: &Context<C, T>,
    state: &ClusterState,
    claim: &NodeClaim,
    node: &Node,
    reason: Reason,
    detail: Option<&str>,
) -> Result<bool, KarpenterError> {
    let name = claim.metadata.name.clone().unwrap_or_default();
    let patch = json!({"metadata": {
        "resourceVersion": claim.metadata.resource_version,
        "annotations": {DISRUPTION_ANNOTATION: reason.as_str()},
    }});
    match ctx.cluster.patch::<NodeClaim>(None, &name, &patch).await {
        Ok(nc) => state.observe_claim(nc),
        Err(e) if e.is_conflict() || e.is_not_found() => return Ok(false),
        Err(e) => return Err(e.into()),
    }
    taint_node(&ctx.cluster, node).await?;
    let msg = match detail {
        Some(d) => format!("disrupting NodeClaim {name} ({}; {d})", reason.as_str()),
        None => format!("disrupting NodeClaim {name} ({})", reason.as_str()),
    };
    events::record(
        &ctx.cluster,
        claim,
        EventType::Normal,
        "DisruptionTerminating",
        msg,
    )
    .await;
    ctx.metrics.disruption(reason.as_str());
    Ok(true)
}
