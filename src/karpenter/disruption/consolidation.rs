//! Consolidation's view of the room on other nodes (S38, S47, S48): the Ready, schedulable
//! nodes not being disrupted, with the pods bound to them, built once per round — and with the
//! room that pods already on their way take: pending pods, and the pods of nodes being drained.
//! A candidate's pods are placed by the same rules provisioning packs by; when the candidate is
//! disrupted its placement is kept, so two candidates never count on the same free space.

use std::collections::{BTreeMap, HashMap};

use k8s_openapi::api::core::v1::Pod;

use super::super::lifecycle::node_ready;
use super::super::pods;
use super::super::scheduling::{PodInfo, SimNode, shape_key, shapes, sort_pods};
use super::super::state::Inner;
use super::super::termination::{is_drained, is_marked};
use crate::api::NodeClaim;
use crate::api::karpenter::DISRUPTED_TAINT_KEY;
use crate::api::quantity;

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

/// The pods a disruption of `node` would have to move, largest first.
pub fn moving_pods(st: &Inner, node: &str) -> Vec<PodInfo> {
    let mut moving: Vec<PodInfo> = st
        .pods_on(node)
        .filter(|p| pods::is_reschedulable(p))
        .map(|p| PodInfo::clone(&st.pod_info(p)))
        .collect();
    sort_pods(&mut moving);
    moving
}

/// A pod no node runs yet that the scheduler will place: unbound, alive, not a DaemonSet's
/// (those are pinned to their node) — whether or not the scheduler has tried it yet.
fn awaiting_a_node(p: &Pod) -> bool {
    pods::node_name(p).is_none()
        && p.metadata.deletion_timestamp.is_none()
        && !pods::is_finished(p)
        && !pods::is_daemonset_pod(p)
}

/// The nodes pods could move to (Ready, schedulable, not being disrupted), and the pods
/// already on their way: those of nodes being drained.
fn other_nodes(st: &Inner) -> (Vec<SimNode>, Vec<PodInfo>) {
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
    let mut draining = vec![];
    for node in st.nodes.values() {
        let name = node.metadata.name.clone().unwrap_or_default();
        let pid = node.spec.as_ref().and_then(|s| s.provider_id.as_deref());
        let claim = claim_by_name
            .get(name.as_str())
            .or_else(|| pid.and_then(|p| claim_by_pid.get(p)))
            .copied();
        let bound = by_node.get(name.as_str()).map(Vec::as_slice).unwrap_or(&[]);
        let leaving = node.metadata.deletion_timestamp.is_some()
            || claim.is_some_and(|c| c.metadata.deletion_timestamp.is_some() || is_marked(c));
        if leaving {
            // Its pods will need room elsewhere (once drained, they are pending pods).
            if !claim.is_some_and(is_drained) {
                draining.extend(
                    bound
                        .iter()
                        .filter(|p| pods::is_reschedulable(p))
                        .filter(|p| p.metadata.deletion_timestamp.is_none())
                        .map(|p| PodInfo::clone(&st.pod_info(p))),
                );
            }
            continue;
        }
        if node_ready(node).is_none_or(|c| c.status != "True")
            || node.spec.as_ref().and_then(|s| s.unschedulable) == Some(true)
        {
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
        for p in bound.iter().filter(|p| pods::counts_on_node(p)) {
            sim.add(&st.pod_info(p));
        }
        out.push(sim);
    }
    (out, draining)
}

/// The nodes pods could move to, built once per evaluation, with the room that pods already
/// on their way take. Checking a candidate then costs one pass over these nodes; rebuilding
/// them per candidate (every node's usage from every pod) made a round over a packed
/// 1,000-node fleet, where no candidate fits, take minutes.
pub struct Elsewhere {
    nodes: Vec<SimNode>,
    by_name: HashMap<String, usize>,
    /// Nodes being disrupted since the view was built: nothing may move onto them.
    gone: Vec<bool>,
    /// Per node, the pods on their way to it (pending, draining elsewhere, or moved there by a
    /// disruption this round): placed again if the node is forgotten.
    reserved: Vec<Vec<PodInfo>>,
    /// Nodes holding a pending pod's reservation: capacity the scheduler is about to use.
    pending_on: Vec<bool>,
    /// Per pod shape ([`shape_key`]), the first node that may still take it: every node
    /// before it refused the shape. Nodes only fill up (or go) while the view lives, so a
    /// refusal holds for the rest of the round, and a packed fleet, where no candidate's pods
    /// fit, costs one pass over the nodes per shape instead of one per candidate.
    refused: HashMap<String, usize>,
}

/// Where each pod of one or more candidates would go: node index and pod.
pub struct Plan {
    /// The candidates' nodes that are in the view.
    nodes: Vec<usize>,
    moves: Vec<(usize, PodInfo)>,
}

impl Plan {
    /// How many pods the plan moves onto other nodes.
    pub fn moved(&self) -> usize {
        self.moves.len()
    }
}

impl Elsewhere {
    pub fn new(st: &Inner) -> Self {
        let (nodes, draining) = other_nodes(st);
        let n = nodes.len();
        let by_name = nodes
            .iter()
            .enumerate()
            .map(|(i, node)| (node.name.clone(), i))
            .collect();
        let mut view = Elsewhere {
            nodes,
            by_name,
            gone: vec![false; n],
            reserved: vec![vec![]; n],
            pending_on: vec![false; n],
            refused: HashMap::new(),
        };
        let mut pending: Vec<PodInfo> = st
            .pods
            .values()
            .filter(|p| awaiting_a_node(p))
            .map(|p| PodInfo::clone(&st.pod_info(p)))
            .collect();
        sort_pods(&mut pending);
        for i in view.reserve(pending) {
            view.pending_on[i] = true;
        }
        let mut draining = draining;
        sort_pods(&mut draining);
        view.reserve(draining);
        view
    }

    /// Place pods first fit (largest first, as the scheduler would meet them) and keep them
    /// there; pods that fit nowhere reserve nothing. The nodes that took a pod.
    fn reserve(&mut self, pods: Vec<PodInfo>) -> Vec<usize> {
        let shape = shapes(&pods);
        // Per shape, the first node that may still take it: nodes only fill up.
        let mut first: Vec<usize> = vec![0; shape.iter().max().map_or(0, |m| m + 1)];
        let mut took = vec![];
        for (p, &s) in pods.into_iter().zip(&shape) {
            let from = first[s];
            let found =
                (from..self.nodes.len()).find(|&i| !self.gone[i] && room_for(&self.nodes[i], &p));
            match found {
                Some(i) => {
                    first[s] = i;
                    self.nodes[i].add(&p);
                    self.reserved[i].push(p);
                    took.push(i);
                }
                None => first[s] = self.nodes.len(),
            }
        }
        took
    }

    /// `node` is being disrupted: nothing may move onto it any more, and what was on its way
    /// to it looks for room again.
    pub fn forget(&mut self, node: &str) {
        let Some(&i) = self.by_name.get(node) else {
            return;
        };
        if self.gone[i] {
            return;
        }
        self.gone[i] = true;
        let mut again = std::mem::take(&mut self.reserved[i]);
        sort_pods(&mut again);
        self.reserve(again);
    }

    /// Some pending pod is on its way to `node`, or fits on it as it is now. Such a node is
    /// capacity the scheduler is about to use (typically a node that was launched for that pod
    /// and became Ready before kube-scheduler bound it), not idle capacity to hand back.
    pub fn wanted_by_pending(&self, pending: &[PodInfo], node: &str) -> bool {
        self.by_name
            .get(node)
            .is_some_and(|&i| self.pending_on[i] || pending.iter().any(|p| self.nodes[i].fits(p)))
    }

    /// Where every pod that would have to move from `node` (`moving`, largest first) goes on
    /// the other nodes, first fit in node order without changing the view; `None` when one
    /// fits nowhere, or has a constraint this layer cannot check (then it keeps its node). The
    /// pods on their way to `node` (from a node being drained) must find room too.
    pub fn plan(&mut self, node: &str, moving: &[PodInfo]) -> Option<Plan> {
        match self.plan_many(&[node], moving, false)? {
            (plan, left) if left.is_empty() => Some(plan),
            _ => None,
        }
    }

    /// [`Elsewhere::plan`] for several nodes at once (S57, multi-node consolidation): `moving`
    /// holds the pods of all of them, and none of them takes a pod. With `partial`, the pods
    /// that fit nowhere are handed back (for a replacement node to take) instead of failing
    /// the plan; `None` still when a pod has a constraint this layer cannot check.
    pub fn plan_many(
        &mut self,
        nodes: &[&str],
        moving: &[PodInfo],
        partial: bool,
    ) -> Option<(Plan, Vec<PodInfo>)> {
        if moving.iter().any(|p| p.unsupported.is_some()) {
            return None;
        }
        let own: Vec<usize> = nodes
            .iter()
            .filter_map(|n| self.by_name.get(*n).copied())
            .collect();
        let is_own: std::collections::HashSet<usize> = own.iter().copied().collect();
        let mut all: Vec<PodInfo>;
        let pods = if own.iter().any(|&i| !self.reserved[i].is_empty()) {
            all = moving
                .iter()
                .chain(own.iter().flat_map(|&i| &self.reserved[i]))
                .cloned()
                .collect();
            sort_pods(&mut all);
            all.as_slice()
        } else {
            moving
        };
        // Nodes that took a moving pod, with it added.
        let mut taken: HashMap<usize, SimNode> = HashMap::new();
        let mut moves = Vec::with_capacity(pods.len());
        let mut left = vec![];
        for p in pods {
            let key = shape_key(p);
            let from = self.refused.get(&key).copied().unwrap_or(0);
            // Nodes from `from` up to here all refuse this shape as they are in the view.
            let mut refusing = from;
            let mut found = None;
            for i in from..self.nodes.len() {
                if self.gone[i] || !self.nodes[i].fits(p) {
                    if refusing == i {
                        refusing = i + 1;
                    }
                    continue;
                }
                if !is_own.contains(&i) && taken.get(&i).is_none_or(|t| t.fits(p)) {
                    found = Some(i);
                    break;
                }
            }
            if refusing > from {
                self.refused.insert(key, refusing);
            }
            match found {
                Some(i) => {
                    taken
                        .entry(i)
                        .or_insert_with(|| self.nodes[i].clone())
                        .add(p);
                    moves.push((i, p.clone()));
                }
                None if partial => left.push(p.clone()),
                None => return None,
            }
        }
        Some((Plan { nodes: own, moves }, left))
    }

    /// The nodes of `plan` are being disrupted: nothing may move onto them any more, and their
    /// pods (and those that were on their way to them) take the room planned for them.
    pub fn commit(&mut self, plan: Plan) {
        for own in plan.nodes {
            self.gone[own] = true;
            self.reserved[own].clear();
        }
        for (i, p) in plan.moves {
            self.nodes[i].add(&p);
            self.reserved[i].push(p);
        }
    }

    /// Every pod that would have to move from `node` fits on the other nodes.
    pub fn fits(&mut self, st: &Inner, node: &str) -> bool {
        self.plan(node, &moving_pods(st, node)).is_some()
    }
}

/// Room for a pod on its way: by resources, node constraints and taints. Pod-to-pod
/// constraints are left out (a reservation errs towards taking room, never towards freeing it),
/// and so are constraints this layer cannot check.
fn room_for(node: &SimNode, p: &PodInfo) -> bool {
    super::super::scheduling::fits_resources(&p.requests, &node.used, &node.allocatable)
        && p.labels_match(&node.labels)
        && p.tolerates(&node.taints)
}

/// Every pod that would have to move from `node` fits on the other nodes.
pub fn fits_elsewhere(st: &Inner, node: &str) -> bool {
    Elsewhere::new(st).fits(st, node)
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{
        Container, NodeCondition, NodeSpec, NodeStatus, PodSpec, ResourceRequirements,
    };
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

    pub(in super::super) fn node(name: &str, cpu: &str) -> k8s_openapi::api::core::v1::Node {
        k8s_openapi::api::core::v1::Node {
            metadata: kube::api::ObjectMeta {
                name: Some(name.into()),
                labels: Some(BTreeMap::from([(
                    "kubernetes.io/hostname".to_string(),
                    name.to_string(),
                )])),
                ..Default::default()
            },
            spec: Some(NodeSpec::default()),
            status: Some(NodeStatus {
                allocatable: Some(BTreeMap::from([("cpu".into(), Quantity(cpu.into()))])),
                conditions: Some(vec![NodeCondition {
                    type_: "Ready".into(),
                    status: "True".into(),
                    ..Default::default()
                }]),
                ..Default::default()
            }),
        }
    }

    pub(in super::super) fn pod(name: &str, cpu: &str, on: Option<&str>) -> Pod {
        Pod {
            metadata: kube::api::ObjectMeta {
                name: Some(name.into()),
                namespace: Some("default".into()),
                ..Default::default()
            },
            spec: Some(PodSpec {
                node_name: on.map(str::to_string),
                containers: vec![Container {
                    name: "c".into(),
                    resources: Some(ResourceRequirements {
                        requests: Some(BTreeMap::from([("cpu".into(), Quantity(cpu.into()))])),
                        ..Default::default()
                    }),
                    ..Default::default()
                }],
                ..Default::default()
            }),
            status: None,
        }
    }

    pub(in super::super) fn state(nodes: &[(&str, &str)], pods: Vec<Pod>) -> Inner {
        let mut st = Inner::default();
        for (n, cpu) in nodes {
            st.nodes
                .insert(n.to_string(), std::sync::Arc::new(node(n, cpu)));
        }
        for p in pods {
            let key = (
                "default".to_string(),
                p.metadata.name.clone().unwrap_or_default(),
            );
            st.pods.insert(key, p);
        }
        st
    }

    /// S47: a pending pod takes the free space it fits in; a candidate whose pod needs that
    /// same space does not fit. Disrupting one candidate books its pods' room for the next.
    #[test]
    fn s47_pending_pods_and_committed_plans_book_room() {
        let st = state(
            &[("a", "4"), ("b", "4"), ("c", "4")],
            vec![
                pod("on-a", "1", Some("a")),
                pod("on-b", "3", Some("b")),
                pod("on-c", "3", Some("c")),
            ],
        );
        let mut view = Elsewhere::new(&st);
        // a has 3 free: b's pod fits there (c's too, but not both).
        let plan = view.plan("b", &moving_pods(&st, "b")).expect("b fits on a");
        view.commit(plan);
        assert!(
            view.plan("c", &moving_pods(&st, "c")).is_none(),
            "c counted on the room b's pod took"
        );
        // A pending 3-cpu pod books a's room before any candidate.
        let mut with_pending = state(
            &[("a", "4"), ("b", "4")],
            vec![pod("on-a", "1", Some("a")), pod("on-b", "3", Some("b"))],
        );
        with_pending
            .pods
            .insert(("default".into(), "new".into()), pod("new", "3", None));
        let mut view = Elsewhere::new(&with_pending);
        assert!(view.plan("b", &moving_pods(&with_pending, "b")).is_none());
        assert!(
            view.wanted_by_pending(&[], "a"),
            "a is booked by the pending pod"
        );
    }

    /// S48: a pod with a constraint this layer cannot check keeps its node, whatever room
    /// there is elsewhere.
    #[test]
    fn s48_a_pod_with_an_unchecked_constraint_keeps_its_node() {
        let st = state(&[("a", "8"), ("b", "8")], vec![pod("on-b", "1", Some("b"))]);
        let mut view = Elsewhere::new(&st);
        let mut moving = moving_pods(&st, "b");
        assert!(view.plan("b", &moving).is_some());
        moving[0].unsupported = Some("topology spread on topology key zone".into());
        assert!(view.plan("b", &moving).is_none());
    }
}
