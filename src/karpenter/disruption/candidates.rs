//! Disruption candidates: the NodeClaims of a NodePool that could be disrupted now, and why.

use std::time::Duration;

use jiff::Timestamp;
use k8s_openapi::api::core::v1::Node;

use super::super::lifecycle::condition_true;
use super::super::scheduling::PodInfo;
use super::super::state::Inner;
use super::super::termination::{is_marked, parse_duration};
use super::super::{budgets, nodepool_hash, pods};
use super::blockers::{Pdbs, blocker};
use super::consolidation::pods_by_node;
use super::{Reason, replacement};
use crate::api::requirements;
use crate::api::{NodeClaim, NodePool, SSHNodeClass};
use crate::k8s::Cluster;
use crate::provider::Context;
use crate::provider::drift::drift;
use crate::ssh::Transport;

pub(super) fn annotated(meta: &kube::api::ObjectMeta, key: &str) -> bool {
    meta.annotations
        .as_ref()
        .and_then(|a| a.get(key))
        .is_some_and(|v| v == "true")
}

pub(super) fn initialized_at(nc: &NodeClaim) -> Option<Timestamp> {
    nc.status
        .as_ref()?
        .conditions
        .iter()
        .find(|c| c.type_ == "Initialized" && c.status == "True")
        .map(|c| c.last_transition_time.0)
}

pub(super) struct Candidate {
    pub claim: NodeClaim,
    pub node: Node,
    pub reason: Reason,
    /// How many pods its disruption would move.
    pub pods: usize,
}

/// A node that would be disrupted for `reason`, were it not for `why`.
pub(super) struct Blocked {
    pub claim: NodeClaim,
    pub node: Node,
    pub reason: Reason,
    pub why: String,
}

/// What a NodePool's disruption settings and its node class say, read once per round.
pub(super) struct PoolSettings<'a> {
    pub pool: &'a NodePool,
    pub class: Option<&'a SSHNodeClass>,
    /// The class's current `<profile>@<version>`.
    pub marker: Option<&'a str>,
    pub policy: String,
    /// `None`: `consolidateAfter: Never`.
    pub consolidate_after: Option<Duration>,
    pub hash: String,
}

impl<'a> PoolSettings<'a> {
    pub fn new(
        pool: &'a NodePool,
        class: Option<&'a SSHNodeClass>,
        marker: Option<&'a str>,
    ) -> Self {
        let policy = pool
            .spec
            .disruption
            .consolidation_policy
            .clone()
            .unwrap_or_else(|| "WhenEmptyOrUnderutilized".into());
        let consolidate_after = match pool.spec.disruption.consolidate_after.as_deref() {
            Some("Never") => None,
            // An unparsable duration is an error, never 0 (immediate consolidation): the
            // generated CRDs reject it at admission; one that got in anyway (an older CRD)
            // stops consolidation of this pool and says so.
            Some(s) => match parse_duration(s) {
                Some(d) => Some(d),
                None => {
                    tracing::error!(nodepool = ?pool.metadata.name, consolidate_after = s, "consolidateAfter is not a duration like 30s, 5m or 1h30m (or Never); this NodePool is not consolidated until it is fixed");
                    None
                }
            },
            None => Some(Duration::ZERO),
        };
        PoolSettings {
            pool,
            class,
            marker,
            policy,
            consolidate_after,
            hash: nodepool_hash::nodepool_hash(pool),
        }
    }
}

/// A NodePool's claims as disruption sees them in one round.
pub(super) struct PoolView {
    /// Initialized claims (the budget's denominator, as core's).
    pub total: usize,
    /// Of those, the ones NotReady, being deleted, marked or waiting for their replacement.
    pub disrupting: i64,
    pub candidates: Vec<Candidate>,
    /// Nodes that would be disrupted but for a blocker (do-not-disrupt, a PDB).
    pub blocked: Vec<Blocked>,
    /// Unschedulable pending pods.
    pub pending: Vec<PodInfo>,
}

/// Every candidate of the pool, with its reason, sorted: expired and drifted first, then by
/// the number of pods to move, then by name.
pub(super) fn collect<C: Cluster, T: Transport>(
    ctx: &Context<C, T>,
    st: &Inner,
    s: &PoolSettings<'_>,
    pdbs: &mut Pdbs<'_>,
) -> PoolView {
    let pool_name = s.pool.metadata.name.clone().unwrap_or_default();
    let pending: Vec<PodInfo> = st
        .pods
        .values()
        .filter(|p| pods::is_provisionable(p))
        .map(|p| PodInfo::clone(&st.pod_info(p)))
        .collect();
    let mine: Vec<&NodeClaim> = st
        .nodeclaims
        .values()
        .map(|nc| &**nc)
        .filter(|nc| nc.nodepool() == Some(pool_name.as_str()))
        .collect();
    // S59: core's count (initialized nodes; NotReady, deleting, marked and cordoned for a
    // replacement use the budget).
    let usage = budgets::usage(st, &pool_name);
    let total = usage.total;
    let disrupting = usage.disrupting + usage.waiting;
    let by_node = pods_by_node(st);
    let mut candidates = vec![];
    let mut blocked = vec![];
    for nc in mine {
        if nc.metadata.deletion_timestamp.is_some()
            || is_marked(nc)
            || replacement::replaced_by(nc).is_some()
            || replacement::awaits_pods(st, nc)
            || !condition_true(nc, "Initialized")
        {
            continue;
        }
        let Some(node) = st.node_of(nc) else { continue };
        let node_name = node.metadata.name.clone().unwrap_or_default();
        let bound = by_node
            .get(node_name.as_str())
            .map(Vec::as_slice)
            .unwrap_or(&[]);
        let moving = bound.iter().filter(|p| pods::is_reschedulable(p)).count();
        let host_marker = nc
            .metadata
            .uid
            .as_deref()
            .and_then(|u| ctx.hosts.holder(u))
            .and_then(|h| ctx.hosts.get(&h))
            .and_then(|h| h.status.and_then(|s| s.installed_profile));
        let class_drift = match (s.class, s.marker) {
            (Some(c), Some(m)) => drift(nc, &c.spec, host_marker.as_deref(), m).is_some(),
            _ => false,
        };
        let pool_drift =
            nodepool_hash::drifted(nc, &s.hash) || requirements_drifted(s.pool, nc, node);
        // S59, as core: from the last pod event (persisted in status.lastPodEventTime, so a
        // restart does not reset it), else from initialization.
        let quiet_since = super::super::pod_events::last_pod_event(st, nc).or(initialized_at(nc));
        let quiet = match (s.consolidate_after, quiet_since) {
            (Some(after), Some(t)) => ctx.clock.since(t) >= after,
            (Some(_), None) => true,
            (None, _) => false,
        };
        // Expiry is not a candidate's reason: it is forceful ([`super::expiration`]).
        let reason = if class_drift || pool_drift {
            Some(Reason::Drifted)
        } else if quiet && moving == 0 {
            Some(Reason::Empty)
        } else if quiet && s.policy == "WhenEmptyOrUnderutilized" {
            Some(Reason::Underutilized)
        } else {
            None
        };
        let Some(reason) = reason else { continue };
        // Checked only for nodes that would be disrupted: the PDB arithmetic is not free.
        if let Some(why) = blocker(st, pdbs, nc, node, bound, reason) {
            blocked.push(Blocked {
                claim: nc.clone(),
                node: node.clone(),
                reason,
                why,
            });
            continue;
        }
        candidates.push(Candidate {
            claim: nc.clone(),
            node: node.clone(),
            reason,
            pods: moving,
        });
    }
    candidates.sort_by(|a, b| {
        a.reason
            .cmp(&b.reason)
            .then_with(|| a.pods.cmp(&b.pods))
            .then_with(|| a.claim.metadata.name.cmp(&b.claim.metadata.name))
    });
    PoolView {
        total,
        disrupting,
        candidates,
        blocked,
        pending,
    }
}

/// Core's RequirementsDrifted (S50): the NodePool's requirements no longer admit the labels the
/// NodeClaim was made with — its labels, the single values its own requirements pin (instance
/// type, nodepool) and, for keys neither has, its Node's (arch, os, zone as the kubelet set
/// them). A requirement edit the node still satisfies drifts nothing.
pub(super) fn requirements_drifted(pool: &NodePool, nc: &NodeClaim, node: &Node) -> bool {
    let mut labels = node.metadata.labels.clone().unwrap_or_default();
    for r in &nc.spec.requirements {
        if r.operator == "In"
            && let [only] = r.values.as_slice()
        {
            labels.insert(r.key.clone(), only.clone());
        }
    }
    labels.extend(nc.metadata.labels.clone().unwrap_or_default());
    !requirements::all_match(&pool.spec.template.spec.requirements, &labels)
}
