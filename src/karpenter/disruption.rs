//! Disruption (S38, S39) and repair: emptiness and under-utilisation consolidation after
//! `consolidateAfter`, drift (ProfileDrift, NodeClassDrift, NodePool template hash) and
//! `expireAfter`, each within the NodePool's budgets and never for nodes or pods annotated
//! `karpenter.sh/do-not-disrupt`; repair (Node Ready False/Unknown for 10 minutes) is forceful.
//!
//! A decision is validated again against the API just before it is executed, then carried out
//! by marking the NodeClaim (annotation + disrupted taint): the termination controller drains
//! it and deletes it.

use std::collections::{BTreeMap, HashMap};

use jiff::Timestamp;
use k8s_openapi::api::core::v1::{Node, Pod};
use serde_json::json;
use tokio::task::JoinHandle;

use super::lifecycle::{condition_true, node_ready};
use super::scheduling::{PodInfo, SimNode, sort_pods};
use super::state::{ClusterState, Inner};
use super::termination::{is_marked, parse_duration, taint_node};
use super::{
    DISRUPTION_ANNOTATION, KarpenterConfig, KarpenterError, budgets, nodepool_hash, pods, quantity,
    replacement,
};
use crate::actors::Context;
use crate::actors::drift::drift;
use crate::actors::events;
use crate::api::karpenter::{DISRUPTED_TAINT_KEY, DO_NOT_DISRUPT_ANNOTATION};
use crate::api::{NodeClaim, NodePool, SSHJoinProfile, SSHNodeClass};
use crate::k8s::{Cluster, EventType};
use crate::ssh::Transport;

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

fn annotated(meta: &kube::api::ObjectMeta, key: &str) -> bool {
    meta.annotations
        .as_ref()
        .and_then(|a| a.get(key))
        .is_some_and(|v| v == "true")
}

fn initialized_at(nc: &NodeClaim) -> Option<Timestamp> {
    nc.status
        .as_ref()?
        .conditions
        .iter()
        .find(|c| c.type_ == "Initialized" && c.status == "True")
        .map(|c| c.last_transition_time.0)
}

/// Pods bound to each node, built once per evaluation ([`Inner::pods_on`] scans every pod).
fn pods_by_node(st: &Inner) -> HashMap<&str, Vec<&Pod>> {
    let mut by_node: HashMap<&str, Vec<&Pod>> = HashMap::new();
    for p in st.pods.values() {
        if let Some(n) = pods::node_name(p) {
            by_node.entry(n).or_default().push(p);
        }
    }
    by_node
}

/// Nodes other pods could move to: Ready, schedulable, not being disrupted.
fn other_nodes(st: &Inner) -> Vec<SimNode> {
    let by_node = pods_by_node(st);
    // NodeClaims by node name and provider ID ([`Inner::claim_of_node`] scans every claim).
    let mut claim_by_name: HashMap<&str, &NodeClaim> = HashMap::new();
    let mut claim_by_pid: HashMap<&str, &NodeClaim> = HashMap::new();
    for nc in st.nodeclaims.values() {
        let Some(s) = nc.status.as_ref() else {
            continue;
        };
        if let Some(n) = s.node_name.as_deref() {
            claim_by_name.entry(n).or_insert(nc);
        }
        if let Some(p) = s.provider_id.as_deref().filter(|p| !p.is_empty()) {
            claim_by_pid.entry(p).or_insert(nc);
        }
    }
    let mut out = vec![];
    for node in st.nodes.values() {
        let name = node.metadata.name.clone().unwrap_or_default();
        if node.metadata.deletion_timestamp.is_some() {
            continue;
        }
        if node_ready(node).is_none_or(|c| c.status != "True")
            || node.spec.as_ref().and_then(|s| s.unschedulable) == Some(true)
        {
            continue;
        }
        let pid = node.spec.as_ref().and_then(|s| s.provider_id.as_deref());
        let claim = claim_by_name
            .get(name.as_str())
            .or_else(|| pid.and_then(|p| claim_by_pid.get(p)))
            .copied();
        if claim.is_some_and(|c| c.metadata.deletion_timestamp.is_some() || is_marked(c)) {
            continue;
        }
        let taints = node
            .spec
            .as_ref()
            .and_then(|s| s.taints.clone())
            .unwrap_or_default();
        if taints.iter().any(|t| t.key == DISRUPTED_TAINT_KEY) {
            continue;
        }
        let parse =
            |m: &BTreeMap<String, k8s_openapi::apimachinery::pkg::api::resource::Quantity>| {
                m.iter()
                    .filter_map(|(k, v)| quantity::parse(v).map(|q| (k.clone(), q)))
                    .collect::<BTreeMap<_, _>>()
            };
        let mut alloc = node
            .status
            .as_ref()
            .and_then(|s| s.allocatable.as_ref())
            .map(parse)
            .unwrap_or_default();
        if alloc.is_empty() {
            alloc = claim
                .and_then(|c| c.status.as_ref())
                .map(|s| parse(&s.allocatable))
                .unwrap_or_default();
        }
        alloc.entry("pods".into()).or_insert(110_000);
        let mut sim = SimNode {
            name: name.clone(),
            labels: node.metadata.labels.clone().unwrap_or_default(),
            taints,
            allocatable: alloc,
            ..Default::default()
        };
        let bound = by_node.get(name.as_str()).map(Vec::as_slice).unwrap_or(&[]);
        for p in bound.iter().filter(|p| pods::counts_on_node(p)) {
            sim.add(&PodInfo::new(p));
        }
        out.push(sim);
    }
    out
}

/// The nodes pods could move to, built once per evaluation. Checking a candidate then costs
/// one pass over these nodes; rebuilding them per candidate (every node's usage from every pod)
/// made a round over a packed 1,000-node fleet, where no candidate fits, take minutes.
pub struct Elsewhere {
    nodes: Vec<SimNode>,
}

impl Elsewhere {
    pub fn new(st: &Inner) -> Self {
        Elsewhere {
            nodes: other_nodes(st),
        }
    }

    /// `node` is being disrupted: nothing may move onto it any more.
    pub fn forget(&mut self, node: &str) {
        self.nodes.retain(|n| n.name != node);
    }

    /// Some pending pod fits on `node` as it is now. Such a node is capacity the scheduler is
    /// about to use (typically a node that was launched for that pod and became Ready before
    /// kube-scheduler bound it), not idle capacity to hand back.
    pub fn wanted_by_pending(&self, pending: &[PodInfo], node: &str) -> bool {
        self.nodes
            .iter()
            .find(|n| n.name == node)
            .is_some_and(|n| pending.iter().any(|p| n.fits(p)))
    }

    /// Every pod that would have to move from `node` fits on the other nodes: first fit in
    /// node order, as [`super::scheduling::place_all`] places them, without changing the cached nodes.
    pub fn fits(&self, st: &Inner, node: &str) -> bool {
        let mut moving: Vec<PodInfo> = st
            .pods_on(node)
            .filter(|p| pods::is_reschedulable(p))
            .map(PodInfo::new)
            .collect();
        sort_pods(&mut moving);
        // Nodes that took a moving pod, with it added.
        let mut taken: HashMap<usize, SimNode> = HashMap::new();
        'pods: for p in &moving {
            for (i, n) in self.nodes.iter().enumerate() {
                if n.name == node {
                    continue;
                }
                if taken.get(&i).unwrap_or(n).fits(p) {
                    taken.entry(i).or_insert_with(|| n.clone()).add(p);
                    continue 'pods;
                }
            }
            return false;
        }
        true
    }
}

/// Every pod that would have to move from `node` fits on the other nodes.
pub fn fits_elsewhere(st: &Inner, node: &str) -> bool {
    Elsewhere::new(st).fits(st, node)
}

struct Candidate {
    claim: NodeClaim,
    node: Node,
    reason: Reason,
    pods: usize,
}

/// One evaluation of every NodePool of ours.
#[tracing::instrument(skip_all)]
pub async fn run_once<C: Cluster, T: Transport>(
    ctx: &Context<C, T>,
    state: &ClusterState,
    cfg: &KarpenterConfig,
) -> Result<Vec<(String, Reason)>, KarpenterError> {
    let now = ctx.clock.now();
    repair(ctx, state, cfg).await?;
    let pools: Vec<NodePool> = state.read().nodepools.values().cloned().collect();
    let mut done = vec![];
    for pool in pools {
        done.extend(disrupt_pool(ctx, state, &pool, now).await?);
    }
    Ok(done)
}

async fn repair<C: Cluster, T: Transport>(
    ctx: &Context<C, T>,
    state: &ClusterState,
    cfg: &KarpenterConfig,
) -> Result<(), KarpenterError> {
    let unhealthy: Vec<std::sync::Arc<NodeClaim>> = {
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
    let policy = pool
        .spec
        .disruption
        .consolidation_policy
        .clone()
        .unwrap_or_else(|| "WhenEmptyOrUnderutilized".into());
    let consolidate_after = match pool.spec.disruption.consolidate_after.as_deref() {
        Some("Never") => None,
        Some(s) => Some(parse_duration(s).unwrap_or_default()),
        None => Some(std::time::Duration::ZERO),
    };
    let hash = nodepool_hash::nodepool_hash(pool);
    let mut done = finish_replacements(ctx, state, &pool_name).await?;
    let (total, mut disrupting, mut candidates, pending) = {
        let st = state.read();
        let pending: Vec<PodInfo> = st
            .pods
            .values()
            .filter(|p| pods::is_provisionable(p))
            .map(PodInfo::new)
            .collect();
        let mine: Vec<&NodeClaim> = st
            .nodeclaims
            .values()
            .map(|nc| &**nc)
            .filter(|nc| nc.nodepool() == Some(pool_name.as_str()))
            .collect();
        let total = mine
            .iter()
            .filter(|nc| nc.metadata.deletion_timestamp.is_none())
            .count();
        let disrupting = mine
            .iter()
            .filter(|nc| {
                nc.metadata.deletion_timestamp.is_some()
                    || is_marked(nc)
                    || replacement::replaced_by(nc).is_some()
            })
            .count() as i64;
        let by_node = pods_by_node(&st);
        let mut cands = vec![];
        for nc in mine {
            if nc.metadata.deletion_timestamp.is_some()
                || is_marked(nc)
                || replacement::replaced_by(nc).is_some()
                || replacement::awaits_pods(&st, nc)
                || !condition_true(nc, "Initialized")
                || annotated(&nc.metadata, DO_NOT_DISRUPT_ANNOTATION)
            {
                continue;
            }
            let Some(node) = st.node_of(nc) else { continue };
            let node_name = node.metadata.name.clone().unwrap_or_default();
            let bound = by_node
                .get(node_name.as_str())
                .map(Vec::as_slice)
                .unwrap_or(&[]);
            if annotated(&node.metadata, DO_NOT_DISRUPT_ANNOTATION)
                || bound
                    .iter()
                    .any(|p| pods::counts_on_node(p) && pods::do_not_disrupt(p))
            {
                continue;
            }
            let moving = bound.iter().filter(|p| pods::is_reschedulable(p)).count();
            let age = nc
                .metadata
                .creation_timestamp
                .as_ref()
                .map_or(std::time::Duration::ZERO, |t| ctx.clock.since(t.0));
            let expired = nc
                .spec
                .expire_after
                .as_deref()
                .and_then(parse_duration)
                .is_some_and(|e| age >= e);
            let host_marker = nc
                .metadata
                .uid
                .as_deref()
                .and_then(|u| ctx.hosts.holder(u))
                .and_then(|h| ctx.hosts.get(&h))
                .and_then(|h| h.status.and_then(|s| s.installed_profile));
            let class_drift = match (&class, &marker) {
                (Some(c), Some(m)) => drift(nc, &c.spec, host_marker.as_deref(), m).is_some(),
                _ => false,
            };
            let pool_drift = nodepool_hash::drifted(nc, &hash);
            let quiet_since = [st.pod_events.get(&node_name).copied(), initialized_at(nc)]
                .into_iter()
                .flatten()
                .max();
            let quiet = match (consolidate_after, quiet_since) {
                (Some(after), Some(t)) => ctx.clock.since(t) >= after,
                (Some(_), None) => true,
                (None, _) => false,
            };
            let reason = if expired {
                Some(Reason::Expired)
            } else if class_drift || pool_drift {
                Some(Reason::Drifted)
            } else if quiet && moving == 0 {
                Some(Reason::Empty)
            } else if quiet && policy == "WhenEmptyOrUnderutilized" {
                Some(Reason::Underutilized)
            } else {
                None
            };
            if let Some(reason) = reason {
                cands.push(Candidate {
                    claim: nc.clone(),
                    node: node.clone(),
                    reason,
                    pods: moving,
                });
            }
        }
        (total, disrupting, cands, pending)
    };
    candidates.sort_by(|a, b| {
        a.reason
            .cmp(&b.reason)
            .then_with(|| a.pods.cmp(&b.pods))
            .then_with(|| a.claim.metadata.name.cmp(&b.claim.metadata.name))
    });
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
async fn mark<C: Cluster, T: Transport>(
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

/// Claims of `pool` waiting for a replacement: disrupt those whose replacement is Initialized,
/// call off those whose replacement went away.
async fn finish_replacements<C: Cluster, T: Transport>(
    ctx: &Context<C, T>,
    state: &ClusterState,
    pool: &str,
) -> Result<Vec<(String, Reason)>, KarpenterError> {
    let waiting: Vec<(
        std::sync::Arc<NodeClaim>,
        Option<Node>,
        replacement::Progress,
    )> = {
        let st = state.read();
        st.nodeclaims
            .values()
            .filter(|nc| nc.nodepool() == Some(pool) && nc.metadata.deletion_timestamp.is_none())
            .filter(|nc| !is_marked(nc))
            .filter_map(|nc| {
                let p = replacement::progress(&st, nc)?;
                Some((nc.clone(), st.node_of(nc).cloned(), p))
            })
            .collect()
    };
    let mut done = vec![];
    for (old, node, p) in waiting {
        let name = old.metadata.name.clone().unwrap_or_default();
        match (p, node) {
            (replacement::Progress::Ready(by), Some(node)) => {
                let reason = match replacement::reason(&old) {
                    Some("Expired") => Reason::Expired,
                    Some("Drifted") => Reason::Drifted,
                    _ => Reason::Underutilized,
                };
                let detail = format!("replaced by NodeClaim {by}");
                if mark(ctx, state, &old, &node, reason, Some(&detail)).await? {
                    done.push((name, reason));
                }
            }
            (replacement::Progress::Abandoned, _) => replacement::abandon(ctx, &old).await?,
            _ => {}
        }
    }
    Ok(done)
}

/// Launch a replacement for the candidate's pods (S38: on a cheaper instance type; S39: a
/// drifted node, on any type with a free host); the candidate is disrupted once the
/// replacement is Initialized ([`finish_replacements`]). False when no host can take them.
async fn replace_first<C: Cluster, T: Transport>(
    ctx: &Context<C, T>,
    state: &ClusterState,
    pool: &NodePool,
    class: &SSHNodeClass,
    c: &Candidate,
    replacer: &mut Option<Option<replacement::Replacer>>,
) -> Result<bool, KarpenterError> {
    let cheaper = c.reason == Reason::Underutilized;
    if replacer.is_none() {
        *replacer = Some(replacement::Replacer::new(ctx, state, pool, class));
    }
    let Some(Some(r)) = replacer.as_mut() else {
        return Ok(false);
    };
    let node_name = c.node.metadata.name.clone().unwrap_or_default();
    let new = {
        let st = state.read();
        r.node_for(&st, &c.claim, &node_name, cheaper)
    };
    let Some(new) = new else {
        return Ok(false);
    };
    if !validate(ctx, state, c).await? {
        return Ok(false);
    }
    let launched = replacement::launch(ctx, pool, &c.claim, &new, c.reason.as_str()).await?;
    if launched.is_some() {
        r.reserve(&new.instance_type);
    }
    Ok(launched.is_some())
}

/// Re-read the NodeClaim and its Node: still ours to disrupt, still no do-not-disrupt, and an
/// empty node still empty.
async fn validate<C: Cluster, T: Transport>(
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
