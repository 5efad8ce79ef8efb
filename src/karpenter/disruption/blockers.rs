//! What blocks a disruption of a node before anything is done to it (S46, S49): the
//! `karpenter.sh/do-not-disrupt` annotation (on the NodeClaim, the Node or a pod), and a pod
//! whose PodDisruptionBudget allows no disruption now (core's `pdb.Limits.CanEvictPods`). A
//! blocked candidate is not tainted, not drained and holds no budget slot; a `DisruptionBlocked`
//! event says what blocks it.
//!
//! Drift is core's "eventual" class: with a `terminationGracePeriod` on the NodeClaim, pods
//! that block eviction do not block it (the grace period bounds their drain).

use std::collections::HashMap;

use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::core::{Selector, SelectorExt};

use super::super::pods;
use super::super::state::Inner;
use super::Reason;
use super::candidates::annotated;
use crate::api::NodeClaim;
use crate::api::karpenter::DO_NOT_DISRUPT_ANNOTATION;

/// Event on a candidate that something blocks.
pub const DISRUPTION_BLOCKED: &str = "DisruptionBlocked";

struct Budget<'a> {
    pdb: &'a PodDisruptionBudget,
    selector: Option<Selector>,
    /// Disruptions allowed now; worked out when first needed.
    allowed: Option<i64>,
}

/// The PodDisruptionBudgets of the cluster by namespace, read once per round.
pub struct Pdbs<'a> {
    by_namespace: HashMap<&'a str, Vec<Budget<'a>>>,
}

impl<'a> Pdbs<'a> {
    pub fn new(st: &'a Inner) -> Self {
        let mut by_namespace: HashMap<&str, Vec<Budget>> = HashMap::new();
        for ((ns, _), pdb) in &st.pdbs {
            // policy/v1: a missing selector selects no pod, an empty one every pod.
            let selector = pdb
                .spec
                .as_ref()
                .and_then(|s| s.selector.clone())
                .and_then(|s| Selector::try_from(s).ok());
            by_namespace.entry(ns.as_str()).or_default().push(Budget {
                pdb,
                selector,
                allowed: None,
            });
        }
        Pdbs { by_namespace }
    }

    /// The PodDisruptionBudget (`namespace/name`) that allows no eviction of `pod` now.
    pub fn blocking(&mut self, st: &Inner, pod: &Pod) -> Option<String> {
        if !evictable(pod) {
            return None;
        }
        let ns = pod.metadata.namespace.as_deref().unwrap_or_default();
        let labels = pod.metadata.labels.clone().unwrap_or_default();
        let budgets = self.by_namespace.get_mut(ns)?;
        for b in budgets.iter_mut() {
            if !b.selector.as_ref().is_some_and(|s| s.matches(&labels)) {
                continue;
            }
            let always_allow_unhealthy = b
                .pdb
                .spec
                .as_ref()
                .and_then(|s| s.unhealthy_pod_eviction_policy.as_deref())
                == Some("AlwaysAllow");
            if always_allow_unhealthy && !pod_ready(pod) {
                continue;
            }
            let allowed = *b
                .allowed
                .get_or_insert_with(|| disruptions_allowed(st, b.pdb, b.selector.as_ref()));
            if allowed <= 0 {
                let name = b.pdb.metadata.name.as_deref().unwrap_or_default();
                return Some(format!("{ns}/{name}"));
            }
        }
        None
    }
}

/// Pods the drain would evict: bound, neither finished nor going, not mirror pods.
fn evictable(p: &Pod) -> bool {
    pods::counts_on_node(p) && p.metadata.deletion_timestamp.is_none() && !pods::is_mirror(p)
}

fn pod_ready(p: &Pod) -> bool {
    p.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .and_then(|cs| cs.iter().find(|c| c.type_ == "Ready"))
        .is_none_or(|c| c.status != "False")
}

/// `status.disruptionsAllowed` once the disruption controller has seen this generation of the
/// budget; before that (or without one, as in the simulation), the same arithmetic over the
/// pods it selects.
fn disruptions_allowed(st: &Inner, pdb: &PodDisruptionBudget, sel: Option<&Selector>) -> i64 {
    if let Some(status) = pdb.status.as_ref()
        && status.observed_generation.is_some()
        && status.observed_generation >= pdb.metadata.generation
    {
        return i64::from(status.disruptions_allowed.unwrap_or(0));
    }
    let Some(sel) = sel else {
        return i64::MAX;
    };
    let ns = pdb.metadata.namespace.as_deref().unwrap_or_default();
    let covered: Vec<&Pod> = st
        .pods
        .range((ns.to_string(), String::new())..)
        .take_while(|((pns, _), _)| pns == ns)
        .map(|(_, p)| p)
        .filter(|p| !pods::is_finished(p))
        .filter(|p| sel.matches(p.metadata.labels.as_ref().unwrap_or(&Default::default())))
        .collect();
    let expected = covered.len() as i64;
    let healthy = covered
        .iter()
        .filter(|p| {
            p.metadata.deletion_timestamp.is_none() && pods::phase(p) == "Running" && pod_ready(p)
        })
        .count() as i64;
    let resolve = |v: &IntOrString| -> i64 {
        match v {
            IntOrString::Int(i) => i64::from(*i),
            IntOrString::String(s) => {
                let pct: i64 = s.trim_end_matches('%').trim().parse().unwrap_or(100);
                (expected * pct + 99) / 100
            }
        }
    };
    let Some(spec) = pdb.spec.as_ref() else {
        return i64::MAX;
    };
    if let Some(max) = &spec.max_unavailable {
        return resolve(max) - (expected - healthy);
    }
    if let Some(min) = &spec.min_available {
        return healthy - resolve(min);
    }
    i64::MAX
}

/// What blocks disrupting `claim` (Node `node`, running `bound`) for `reason`, if anything.
pub fn blocker(
    st: &Inner,
    pdbs: &mut Pdbs<'_>,
    claim: &NodeClaim,
    node: &Node,
    bound: &[&Pod],
    reason: Reason,
) -> Option<String> {
    if reason == Reason::Expired {
        return None;
    }
    if annotated(&claim.metadata, DO_NOT_DISRUPT_ANNOTATION) {
        return Some(format!(
            "NodeClaim is annotated {DO_NOT_DISRUPT_ANNOTATION}"
        ));
    }
    if annotated(&node.metadata, DO_NOT_DISRUPT_ANNOTATION) {
        return Some(format!("Node is annotated {DO_NOT_DISRUPT_ANNOTATION}"));
    }
    // Core's eventual class: a grace period bounds the drain, so pods do not block drift.
    if reason == Reason::Drifted && claim.spec.termination_grace_period.is_some() {
        return None;
    }
    for p in bound {
        let key = format!(
            "{}/{}",
            p.metadata.namespace.as_deref().unwrap_or_default(),
            p.metadata.name.as_deref().unwrap_or_default()
        );
        if pods::counts_on_node(p) && pods::do_not_disrupt(p) {
            return Some(format!(
                "pod {key} is annotated {DO_NOT_DISRUPT_ANNOTATION}"
            ));
        }
        if let Some(pdb) = pdbs.blocking(st, p) {
            return Some(format!(
                "PodDisruptionBudget {pdb} allows no disruption of pod {key} now"
            ));
        }
    }
    None
}
