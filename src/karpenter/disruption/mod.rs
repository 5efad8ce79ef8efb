//! Disruption (S38, S39, S46-S51) and repair (S43): emptiness and under-utilisation
//! consolidation after `consolidateAfter` and drift (ProfileDrift, NodeClassDrift, the NodePool
//! template hash, RequirementsDrifted), each within the NodePool's budgets and never for nodes
//! that `karpenter.sh/do-not-disrupt` or a PodDisruptionBudget protects; `expireAfter` is
//! forceful (deleted, as core v1); repair is bounded and off unless enabled.
//!
//! A decision is validated again against the API just before it is executed, then carried out
//! by marking the NodeClaim (annotation + disrupted taint): the termination controller drains
//! it and deletes it. See docs/concepts.md, "Disruption" and "Repair".
//!
//! One module per concern: [`candidates`] (who could be disrupted, and why), [`blockers`]
//! (do-not-disrupt, PodDisruptionBudgets), [`consolidation`] (the room on other nodes),
//! [`volumes`] (where a pod's volumes let it go), [`replacement`] and [`exchange`] (a
//! replacement node first), [`multinode`] (several nodes at once, S57), [`validation`] (the
//! check just before acting), [`expiration`] and [`repair`].

mod blockers;
mod candidates;
mod consolidation;
mod exchange;
mod expiration;
mod multinode;
mod observe;
pub mod repair;
pub mod replacement;
mod validation;
mod volumes;

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use jiff::Timestamp;
use k8s_openapi::api::core::v1::Node;
use serde_json::json;
use tokio::task::JoinHandle;

use super::scheduling::{PodInfo, sort_pods};
use super::state::{ClusterState, Inner, NsKey};
use super::termination::taint_node;
use super::{KarpenterConfig, KarpenterError, budgets, pods};
use crate::api::DISRUPTION_ANNOTATION;
use crate::api::{NodeClaim, NodePool, SSHJoinProfile, SSHNodeClass};
use crate::k8s::events;
use crate::k8s::{Cluster, EventType};
use crate::provider::Context;
use crate::ssh::Transport;

pub use blockers::DISRUPTION_BLOCKED;
pub use consolidation::{Elsewhere, Plan, fits_elsewhere, moving_pods};
pub use exchange::{REPLACEMENT_TIMED_OUT, REPLACEMENT_TIMEOUT};
pub use observe::UNCONSOLIDATABLE;

use blockers::Pdbs;
use candidates::{PoolSettings, PoolView};
use validation::{Decision, Verdict, validate};
use volumes::VolumeAffinity;

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
        let mut d = Disrupter::default();
        loop {
            tokio::time::sleep(cfg.disruption_interval).await;
            if let Err(e) = d.round(&ctx, &state, &cfg).await {
                tracing::warn!(error = %e, "disruption round failed");
            }
        }
    })
}

/// How often an event that a round would repeat (a candidate blocked, repair held back) is
/// recorded again while nothing about it changes.
const NOTICE_REPEAT: Duration = Duration::from_secs(10 * 60);

/// Events that every round would record again while a situation lasts: recorded once per
/// NodeClaim, reason and message, then again only after [`NOTICE_REPEAT`].
#[derive(Debug, Default)]
pub struct Notices {
    last: BTreeMap<(String, String), (String, Timestamp)>,
}

impl Notices {
    /// Whether to record `message` with `reason` about `claim` now (and note that it was).
    pub fn due(&mut self, claim: &str, reason: &str, message: &str, now: Timestamp) -> bool {
        let key = (claim.to_string(), reason.to_string());
        let repeat = jiff::SignedDuration::try_from(NOTICE_REPEAT).unwrap_or_default();
        let due = self
            .last
            .get(&key)
            .is_none_or(|(m, at)| m != message || now.duration_since(*at) >= repeat);
        if due {
            self.last.insert(key, (message.to_string(), now));
        }
        due
    }

    /// Prefix of a key about a NodePool rather than a NodeClaim.
    pub const NODEPOOL: &'static str = "nodepool/";

    /// Forget the NodeClaims (and NodePools) that are gone.
    fn prune(&mut self, st: &Inner) {
        self.last
            .retain(|(key, _), _| match key.strip_prefix(Self::NODEPOOL) {
                Some(pool) => st.nodepools.contains_key(pool),
                None => st.nodeclaims.contains_key(key),
            });
    }
}

/// The disruption controller's memory between rounds.
#[derive(Debug, Default)]
pub struct Disrupter {
    notices: Notices,
    volumes: VolumeAffinity,
}

/// What one round works with, built at the first need and shared by every NodePool's turn, so
/// that what one pool's disruptions take is seen by the next.
#[derive(Default)]
struct Round {
    /// Candidates per reason, over every pool (`karpenter_voluntary_disruption_eligible_nodes`).
    eligible: BTreeMap<&'static str, i64>,
    elsewhere: Option<Elsewhere>,
    /// The pods bound to each node (keys), so that a candidate's pods are a look-up.
    bound: Option<HashMap<String, Vec<NsKey>>>,
}

impl Round {
    fn elsewhere(&mut self, state: &ClusterState) -> &mut Elsewhere {
        self.elsewhere
            .get_or_insert_with(|| Elsewhere::new(&state.read()))
    }

    /// The pods a disruption of `node` would move, largest first.
    fn moving(&mut self, state: &ClusterState, node: &str) -> Vec<PodInfo> {
        let st = state.read();
        let bound = self.bound.get_or_insert_with(|| {
            let mut by_node: HashMap<String, Vec<NsKey>> = HashMap::new();
            for (key, p) in &st.pods {
                if let Some(n) = pods::node_name(p) {
                    by_node.entry(n.to_string()).or_default().push(key.clone());
                }
            }
            by_node
        });
        let mut moving: Vec<PodInfo> = bound
            .get(node)
            .into_iter()
            .flatten()
            .filter_map(|k| st.pods.get(k))
            .filter(|p| pods::is_reschedulable(p) && pods::node_name(p) == Some(node))
            .map(|p| PodInfo::clone(&st.pod_info(p)))
            .collect();
        sort_pods(&mut moving);
        moving
    }
}

impl Disrupter {
    /// One evaluation: repair, expiry, then every NodePool of ours.
    #[tracing::instrument(skip_all)]
    pub async fn round<C: Cluster, T: Transport>(
        &mut self,
        ctx: &Context<C, T>,
        state: &ClusterState,
        cfg: &KarpenterConfig,
    ) -> Result<Vec<(String, Reason)>, KarpenterError> {
        let now = ctx.clock.now();
        self.notices.prune(&state.read());
        self.volumes.prune(now);
        repair::repair(ctx, state, cfg, &mut self.notices).await?;
        let mut done = expiration::expire(ctx, state).await?;
        let pools: Vec<NodePool> = state.read().nodepools.values().cloned().collect();
        let mut round = Round::default();
        for pool in pools {
            done.extend(
                self.disrupt_pool(ctx, state, &pool, now, &mut round, cfg)
                    .await?,
            );
        }
        for reason in observe::BUDGET_REASONS {
            ctx.metrics
                .core
                .eligible_nodes
                .get_or_create(&crate::telemetry::core_metrics::ReasonLabels {
                    reason: reason.to_lowercase(),
                })
                .set(round.eligible.get(reason).copied().unwrap_or(0));
        }
        Ok(done)
    }

    /// Tell why a node that would be disrupted is not (once per situation).
    async fn tell_blocked<C: Cluster, T: Transport>(
        &mut self,
        ctx: &Context<C, T>,
        claim: &NodeClaim,
        node: Option<&Node>,
        reason: Reason,
        why: &str,
    ) {
        let name = claim.metadata.name.clone().unwrap_or_default();
        let msg = format!(
            "not disrupting NodeClaim {name} ({}): {why}",
            reason.as_str()
        );
        if !self
            .notices
            .due(&name, DISRUPTION_BLOCKED, &msg, ctx.clock.now())
        {
            return;
        }
        tracing::info!(nodeclaim = %name, reason = reason.as_str(), %why, "disruption blocked");
        events::record(
            &ctx.cluster,
            claim,
            EventType::Normal,
            DISRUPTION_BLOCKED,
            msg.clone(),
        )
        .await;
        if let Some(node) = node {
            events::record(
                &ctx.cluster,
                node,
                EventType::Normal,
                DISRUPTION_BLOCKED,
                msg,
            )
            .await;
        }
    }

    async fn disrupt_pool<C: Cluster, T: Transport>(
        &mut self,
        ctx: &Context<C, T>,
        state: &ClusterState,
        pool: &NodePool,
        now: Timestamp,
        round: &mut Round,
        cfg: &KarpenterConfig,
    ) -> Result<Vec<(String, Reason)>, KarpenterError> {
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
        let mut done = exchange::finish(ctx, state, pool, now, &mut self.notices).await?;
        let PoolView {
            total,
            mut disrupting,
            candidates,
            blocked,
            pending,
        } = {
            let st = state.read();
            let mut pdbs = Pdbs::new(&st);
            candidates::collect(ctx, &st, &settings, &mut pdbs)
        };
        for b in &blocked {
            self.tell_blocked(ctx, &b.claim, Some(&b.node), b.reason, &b.why)
                .await;
        }
        observe::budgets(ctx, &mut self.notices, pool, total, now).await;
        for c in &candidates {
            *round
                .eligible
                .entry(observe::budget_reason(c.reason))
                .or_default() += 1;
        }
        let mut underutilized_done = false;
        // Priced once per round, at the first candidate that could only be replaced.
        let mut replacer: Option<Option<replacement::Replacer>> = None;
        let mut multi_tried = !cfg.multi_node_consolidation;
        for (i, c) in candidates.iter().enumerate() {
            // S57: before single-node consolidation, the pool's under-utilised candidates
            // together (core runs multi-node consolidation before single-node).
            if c.reason == Reason::Underutilized && !multi_tried {
                multi_tried = true;
                let rest: Vec<&candidates::Candidate> = candidates[i..]
                    .iter()
                    .filter(|c| c.reason == Reason::Underutilized)
                    .collect();
                let left = budgets::allowed(pool, "Underutilized", total, now) - disrupting;
                let out = multinode::consolidate(
                    self,
                    ctx,
                    state,
                    pool,
                    class.as_ref(),
                    &rest,
                    &pending,
                    left,
                    round,
                    &mut replacer,
                )
                .await?;
                if out.acted() > 0 {
                    let decision = if out.replaced > 0 {
                        "replace"
                    } else {
                        "delete"
                    };
                    observe::decided(ctx, decision, Reason::Underutilized, "multi");
                    disrupting += out.acted() as i64;
                    underutilized_done = true;
                    done.extend(out.marked);
                    continue;
                }
            }
            let budget_reason = observe::budget_reason(c.reason);
            if disrupting >= budgets::allowed(pool, budget_reason, total, now) {
                continue;
            }
            // One consolidation move per round.
            if c.reason == Reason::Underutilized && underutilized_done {
                continue;
            }
            let node_name = c.node.metadata.name.clone().unwrap_or_default();
            let voluntary = matches!(c.reason, Reason::Empty | Reason::Underutilized);
            if voluntary
                && round
                    .elsewhere(state)
                    .wanted_by_pending(&pending, &node_name)
            {
                continue;
            }
            // Where its pods would go (S47, S48): on the other nodes, in the room left by
            // pending pods, draining nodes and this round's decisions.
            let mut moving = round.moving(state, &node_name);
            self.volumes.resolve(ctx, &mut moving).await?;
            let plan = round.elsewhere(state).plan(&node_name, &moving);
            let Some(plan) = plan else {
                // No room on the nodes there are: a replacement first (S38 cheaper, S50 for a
                // drifted node), or the node stays.
                let started = match &class {
                    Some(class) => {
                        exchange::start(ctx, state, pool, class, c, &moving, &mut replacer).await?
                    }
                    None => exchange::Started::NoRoom,
                };
                match started {
                    exchange::Started::Launched => {
                        let ctype = observe::consolidation_type(c.reason);
                        observe::decided(ctx, "replace", c.reason, ctype);
                        round.elsewhere(state).forget(&node_name);
                        disrupting += 1;
                        underutilized_done |= c.reason == Reason::Underutilized;
                    }
                    exchange::Started::NoRoom if c.reason == Reason::Drifted => {
                        let why = "its pods fit on no other node and no free host of the \
                                   NodePool's instance types can take them within its limits";
                        self.tell_blocked(ctx, &c.claim, Some(&c.node), c.reason, why)
                            .await;
                    }
                    exchange::Started::Blocked(why) => {
                        self.tell_blocked(ctx, &c.claim, Some(&c.node), c.reason, &why)
                            .await;
                    }
                    exchange::Started::NoRoom if c.reason == Reason::Underutilized => {
                        // Core's words for a node whose pods need a node of its own.
                        let why = "Can't replace with a cheaper node";
                        observe::unconsolidatable(ctx, &mut self.notices, &c.claim, &c.node, why)
                            .await;
                    }
                    exchange::Started::NoRoom | exchange::Started::Changed => {}
                }
                continue;
            };
            let decision = Decision {
                claim: &c.claim,
                node_name: &node_name,
                reason: c.reason,
                replaced: false,
            };
            match validate(ctx, state, &decision).await? {
                Verdict::Go => {}
                Verdict::Changed => continue,
                Verdict::Blocked(why) => {
                    self.tell_blocked(ctx, &c.claim, Some(&c.node), c.reason, &why)
                        .await;
                    continue;
                }
            }
            let name = c.claim.metadata.name.clone().unwrap_or_default();
            if !mark(ctx, state, &c.claim, &c.node, c.reason, None).await? {
                continue;
            }
            round.elsewhere(state).commit(plan);
            observe::decided(
                ctx,
                "delete",
                c.reason,
                observe::consolidation_type(c.reason),
            );
            disrupting += 1;
            underutilized_done |= c.reason == Reason::Underutilized;
            done.push((name, c.reason));
        }
        Ok(done)
    }
}

/// One evaluation of every NodePool of ours, by a disruption controller without memory (its
/// events are not deduplicated against earlier rounds).
pub async fn run_once<C: Cluster, T: Transport>(
    ctx: &Context<C, T>,
    state: &ClusterState,
    cfg: &KarpenterConfig,
) -> Result<Vec<(String, Reason)>, KarpenterError> {
    Disrupter::default().round(ctx, state, cfg).await
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
    ctx.metrics.core.disrupted(reason.as_str(), claim);
    Ok(true)
}
