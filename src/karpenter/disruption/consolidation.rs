//! Consolidation's view of the room on other nodes: the Ready, schedulable nodes not being
//! disrupted, with the pods bound to them, built once per round.

use std::collections::{BTreeMap, HashMap};

use k8s_openapi::api::core::v1::Pod;

use super::super::lifecycle::node_ready;
use super::super::scheduling::{PodInfo, SimNode, sort_pods};
use super::super::state::Inner;
use super::super::termination::is_marked;
use super::super::{pods, quantity};
use crate::api::NodeClaim;
use crate::api::karpenter::DISRUPTED_TAINT_KEY;

/// Pods bound to each node, built once per evaluation ([`Inner::pods_on`] scans every pod).
pub(super) fn pods_by_node(st: &Inner) -> HashMap<&str, Vec<&Pod>> {
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
