//! Topology spread and pod (anti-)affinity on any topology key (S56), as Karpenter core's
//! `Topology` (`pkg/controllers/provisioning/scheduling/topology*.go`): per constraint a group
//! counting the pods it selects per domain (a value of the topology key on a node), and for a
//! pod about to be placed the domains it may go to, as a requirement that narrows the node.
//!
//! Provisioning uses it to pin a new node to a zone (or rack…) and to keep skew and
//! anti-affinity across the nodes of a round; the simulated kube-scheduler uses the same groups
//! over the Ready nodes ([`Mode::Kube`]), so bindings honour what provisioning planned.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use k8s_openapi::api::core::v1::{PodAffinityTerm, PodSpec, Taint};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, LabelSelectorRequirement};
use kube::core::{Selector, SelectorExt};

use super::scheduling::{HOSTNAME_KEY, PodInfo, tolerates_all};
use crate::api::karpenter::NodeSelectorRequirement;
use crate::api::requirements::{Requirement, Requirements};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Spread,
    Affinity,
    AntiAffinity,
}

/// The namespaces a term selects pods in, as written.
#[derive(Debug, Clone, PartialEq)]
pub enum Namespaces {
    /// The listed ones (the pod's own when the term lists none and has no selector).
    Listed(BTreeSet<String>),
    /// The listed ones and those whose labels match (`{}`: every namespace).
    Selected(BTreeSet<String>, Selector),
}

/// One required constraint of a pod on a topology key.
#[derive(Debug, Clone)]
pub struct TopologyTerm {
    pub kind: Kind,
    pub key: String,
    /// `None`: the term selects no pod (a nil label selector).
    pub selector: Option<Selector>,
    pub namespaces: Namespaces,
    pub max_skew: i32,
    pub min_domains: Option<i32>,
    /// Spread only: the node affinity of the pod decides which nodes count
    /// (`nodeAffinityPolicy: Honor`, the default) and whether taints do (`nodeTaintsPolicy`).
    pub honor_affinity: bool,
    pub honor_taints: bool,
}

fn selector_with(
    sel: Option<&LabelSelector>,
    pod_labels: &BTreeMap<String, String>,
    match_keys: &[String],
    mismatch_keys: &[String],
) -> Result<Option<Selector>, String> {
    let Some(sel) = sel else { return Ok(None) };
    let mut sel = sel.clone();
    let mut extra = |keys: &[String], op: &str| {
        for k in keys {
            if let Some(v) = pod_labels.get(k) {
                sel.match_expressions
                    .get_or_insert_default()
                    .push(LabelSelectorRequirement {
                        key: k.clone(),
                        operator: op.into(),
                        values: Some(vec![v.clone()]),
                    });
            }
        }
    };
    extra(match_keys, "In");
    extra(mismatch_keys, "NotIn");
    Selector::try_from(sel)
        .map(Some)
        .map_err(|e| format!("invalid label selector: {e}"))
}

fn affinity_term(
    kind: Kind,
    t: &PodAffinityTerm,
    namespace: &str,
    labels: &BTreeMap<String, String>,
) -> Result<TopologyTerm, String> {
    let selector = selector_with(
        t.label_selector.as_ref(),
        labels,
        t.match_label_keys.as_deref().unwrap_or_default(),
        t.mismatch_label_keys.as_deref().unwrap_or_default(),
    )?;
    let listed: BTreeSet<String> = t.namespaces.iter().flatten().cloned().collect();
    let namespaces = match &t.namespace_selector {
        Some(s) => Namespaces::Selected(
            listed,
            Selector::try_from(s.clone()).map_err(|e| format!("invalid namespaceSelector: {e}"))?,
        ),
        None if listed.is_empty() => Namespaces::Listed(BTreeSet::from([namespace.to_string()])),
        None => Namespaces::Listed(listed),
    };
    Ok(TopologyTerm {
        kind,
        key: t.topology_key.clone(),
        selector,
        namespaces,
        max_skew: i32::MAX,
        min_domains: None,
        honor_affinity: false,
        honor_taints: false,
    })
}

/// The required topology terms of a pod: `DoNotSchedule` spread constraints, required pod
/// affinity and anti-affinity. Preferred terms and `ScheduleAnyway` are not constraints.
pub fn terms_of(
    spec: &PodSpec,
    namespace: &str,
    labels: &BTreeMap<String, String>,
) -> Result<Vec<TopologyTerm>, String> {
    let mut out = vec![];
    for c in spec.topology_spread_constraints.iter().flatten() {
        if c.when_unsatisfiable != "DoNotSchedule" {
            continue;
        }
        let selector = selector_with(
            c.label_selector.as_ref(),
            labels,
            c.match_label_keys.as_deref().unwrap_or_default(),
            &[],
        )?;
        out.push(TopologyTerm {
            kind: Kind::Spread,
            key: c.topology_key.clone(),
            selector,
            namespaces: Namespaces::Listed(BTreeSet::from([namespace.to_string()])),
            max_skew: c.max_skew.max(1),
            min_domains: c.min_domains.filter(|m| *m > 0),
            honor_affinity: c.node_affinity_policy.as_deref() != Some("Ignore"),
            honor_taints: c.node_taints_policy.as_deref() == Some("Honor"),
        });
    }
    let aff = spec.affinity.as_ref();
    let req = |terms: Option<&Vec<PodAffinityTerm>>| terms.cloned().unwrap_or_default();
    let affinity = req(aff.and_then(|a| a.pod_affinity.as_ref()).and_then(|a| {
        a.required_during_scheduling_ignored_during_execution
            .as_ref()
    }));
    let anti = req(aff
        .and_then(|a| a.pod_anti_affinity.as_ref())
        .and_then(|a| {
            a.required_during_scheduling_ignored_during_execution
                .as_ref()
        }));
    for (kind, terms) in [(Kind::Affinity, affinity), (Kind::AntiAffinity, anti)] {
        for t in &terms {
            out.push(affinity_term(kind, t, namespace, labels)?);
        }
    }
    Ok(out)
}

/// Namespace labels by name, for `namespaceSelector`.
pub type NamespaceLabels = BTreeMap<String, BTreeMap<String, String>>;

/// Namespaces resolved against the cluster's: `None` is every namespace.
fn resolve(ns: &Namespaces, all: &NamespaceLabels) -> Option<BTreeSet<String>> {
    match ns {
        Namespaces::Listed(l) => Some(l.clone()),
        Namespaces::Selected(listed, sel) => {
            if sel.selects_all() {
                return None;
            }
            let mut out = listed.clone();
            out.extend(
                all.iter()
                    .filter(|(_, l)| sel.matches(l))
                    .map(|(n, _)| n.clone()),
            );
            Some(out)
        }
    }
}

/// Where a node stands for counting: its labels (an existing node) or its requirements (a
/// node being planned), and its taints.
pub enum NodeView<'a> {
    Labels(&'a BTreeMap<String, String>, &'a [Taint]),
    Planned(&'a Requirements, &'a [Taint]),
}

/// A spread constraint's node filter (core's `TopologyNodeFilter`).
#[derive(Debug, Clone, Default)]
struct NodeFilter {
    selector: BTreeMap<String, String>,
    terms: Vec<Vec<NodeSelectorRequirement>>,
    tolerations: Option<Vec<k8s_openapi::api::core::v1::Toleration>>,
}

impl NodeFilter {
    fn matches(&self, node: &NodeView) -> bool {
        match node {
            NodeView::Labels(labels, taints) => {
                self.selector.iter().all(|(k, v)| labels.get(k) == Some(v))
                    && (self.terms.is_empty()
                        || self
                            .terms
                            .iter()
                            .any(|t| crate::api::requirements::all_match(t, labels)))
                    && self.tolerated(taints)
            }
            NodeView::Planned(reqs, taints) => {
                self.selector
                    .iter()
                    .all(|(k, v)| !reqs.has(k) || reqs.get(k).has(v))
                    && (self.terms.is_empty()
                        || self.terms.iter().any(|t| {
                            reqs.intersects(&Requirements::from_node_selector(t))
                                .is_ok()
                        }))
                    && self.tolerated(taints)
            }
        }
    }

    fn tolerated(&self, taints: &[Taint]) -> bool {
        self.tolerations
            .as_ref()
            .is_none_or(|t| tolerates_all(t, taints))
    }
}

/// Pods selected by one constraint, counted per domain.
#[derive(Debug, Clone)]
struct Group {
    kind: Kind,
    key: String,
    namespaces: Option<BTreeSet<String>>,
    selector: Option<Selector>,
    max_skew: i32,
    min_domains: Option<i32>,
    filter: Option<NodeFilter>,
    counts: BTreeMap<String, i64>,
    /// Domains with no pod.
    empty: usize,
}

impl Group {
    fn selects(&self, namespace: &str, labels: &BTreeMap<String, String>) -> bool {
        self.namespaces
            .as_ref()
            .is_none_or(|n| n.contains(namespace))
            && self.selector.as_ref().is_some_and(|s| s.matches(labels))
    }

    fn node_counts(&self, node: &NodeView) -> bool {
        self.filter.as_ref().is_none_or(|f| f.matches(node))
    }

    fn register(&mut self, domain: &str) {
        if !self.counts.contains_key(domain) {
            self.counts.insert(domain.to_string(), 0);
            self.empty += 1;
        }
    }

    fn record(&mut self, domain: &str) {
        let c = self.counts.entry(domain.to_string()).or_insert(0);
        if *c == 0 && self.empty > 0 {
            self.empty -= 1;
        }
        *c += 1;
    }

    /// The domains `node_domains` allows, in order: its values when it lists them (a node's
    /// own hostname), else every known domain.
    fn candidates<'a>(&'a self, node_domains: &'a Requirement) -> Vec<(&'a str, i64)> {
        match node_domains.len() {
            Some(_) => node_domains
                .values()
                .filter_map(|d| self.counts.get(d).map(|c| (d.as_str(), *c)))
                .collect(),
            None => self
                .counts
                .iter()
                .filter(|(d, _)| node_domains.has(d))
                .map(|(d, c)| (d.as_str(), *c))
                .collect(),
        }
    }

    fn min_count(&self, pod_domains: &Requirement, hostname_zero: bool) -> i64 {
        if hostname_zero && self.key == HOSTNAME_KEY {
            return 0;
        }
        let supported: Vec<i64> = self
            .counts
            .iter()
            .filter(|(d, _)| pod_domains.has(d))
            .map(|(_, c)| *c)
            .collect();
        let too_few = self
            .min_domains
            .is_some_and(|m| (supported.len() as i64) < i64::from(m));
        if too_few {
            return 0;
        }
        supported.into_iter().min().unwrap_or(0)
    }

    /// The domains a pod may go to (core's `TopologyGroup.Get`).
    fn next(
        &self,
        pin: bool,
        pod_selected: bool,
        pod_domains: &Requirement,
        node_domains: &Requirement,
        hostname_zero: bool,
    ) -> Requirement {
        let key = &self.key;
        let cands = self.candidates(node_domains);
        let pick = |ds: Vec<String>| Requirement::one_of(key, ds);
        match self.kind {
            Kind::Spread => {
                let min = self.min_count(pod_domains, hostname_zero);
                let own = i64::from(pod_selected);
                let best = cands
                    .iter()
                    .filter(|(d, c)| {
                        pod_domains.has(d) && c + own - min <= i64::from(self.max_skew)
                    })
                    .min_by_key(|(d, c)| (*c, *d));
                pick(best.map(|(d, _)| d.to_string()).into_iter().collect())
            }
            Kind::AntiAffinity => {
                if self.empty == 0 {
                    return pick(vec![]);
                }
                let empty = cands
                    .iter()
                    .filter(|(d, c)| *c == 0 && pod_domains.has(d))
                    .map(|(d, _)| d.to_string());
                // For the pod's own anti-affinity, one empty domain, not all of them (core
                // keeps every empty one and, once the pod is placed, blocks them all, so a
                // second such pod waits for the next round): the node is pinned where the pod
                // goes. Another pod's anti-affinity only rules out the domains it holds.
                if pin {
                    pick(empty.take(1).collect())
                } else {
                    pick(empty.collect())
                }
            }
            Kind::Affinity => {
                let with_pods: Vec<String> = cands
                    .iter()
                    .filter(|(d, c)| *c > 0 && pod_domains.has(d))
                    .map(|(d, _)| d.to_string())
                    .collect();
                if !with_pods.is_empty() || !pod_selected {
                    return pick(with_pods);
                }
                // Self-affinity with no matching pod anywhere: any domain may start it (the
                // node's own first).
                if self.counts.values().any(|c| *c > 0) {
                    return pick(vec![]);
                }
                let first = cands
                    .iter()
                    .find(|(d, _)| pod_domains.has(d))
                    .map(|(d, _)| d.to_string());
                pick(first.into_iter().collect())
            }
        }
    }
}

/// Provisioning's view (hostname spread counts from 0, since a new node can always be made)
/// or the kube-scheduler's (only the nodes there are).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    Provisioning,
    Kube,
}

/// The groups of a round.
pub struct Topology {
    mode: Mode,
    groups: Vec<Group>,
    by_sig: HashMap<String, usize>,
    /// Groups each pending pod owns (by the pod's index).
    owned: Vec<Vec<usize>>,
    /// Anti-affinity terms, seen from the pods they repel: each group counts where the pods
    /// with the term are (those on nodes, and its owners: the round's pods with the term, by
    /// index, as they are placed). One group per distinct term.
    inverse: Vec<(Group, BTreeSet<usize>)>,
    inverse_by_sig: HashMap<String, usize>,
    /// Every domain seen per key.
    domains: BTreeMap<String, BTreeSet<String>>,
}

impl Topology {
    /// Groups for the terms of `pending` (namespace selectors resolved with `namespaces`).
    pub fn new(mode: Mode, pending: &[PodInfo], namespaces: &NamespaceLabels) -> Topology {
        let mut t = Topology {
            mode,
            groups: vec![],
            by_sig: HashMap::new(),
            owned: vec![vec![]; pending.len()],
            inverse: vec![],
            inverse_by_sig: HashMap::new(),
            domains: BTreeMap::new(),
        };
        for (i, p) in pending.iter().enumerate() {
            for term in &p.topology {
                let g = group_of(term, p, namespaces);
                if term.kind == Kind::AntiAffinity {
                    let gi = t.inverse_of(g.clone());
                    t.inverse[gi].1.insert(i);
                }
                let sig = format!(
                    "{:?}|{}|{:?}|{:?}|{}|{:?}|{:?}",
                    g.kind, g.key, g.namespaces, g.selector, g.max_skew, g.min_domains, g.filter
                );
                let gi = *t.by_sig.entry(sig).or_insert_with(|| {
                    t.groups.push(g);
                    t.groups.len() - 1
                });
                if !t.owned[i].contains(&gi) {
                    t.owned[i].push(gi);
                }
            }
        }
        t
    }

    /// The inverse group of an anti-affinity term (made, with the domains known so far, the
    /// first time).
    fn inverse_of(&mut self, g: Group) -> usize {
        let sig = format!("{}|{:?}|{:?}", g.key, g.namespaces, g.selector);
        if let Some(gi) = self.inverse_by_sig.get(&sig) {
            return *gi;
        }
        let mut g = g;
        for known in self.domains.get(&g.key).into_iter().flatten() {
            g.register(known);
        }
        self.inverse.push((g, BTreeSet::new()));
        self.inverse_by_sig.insert(sig, self.inverse.len() - 1);
        self.inverse.len() - 1
    }

    /// Whether any pod of the round has a topology term, or any placed pod an anti-affinity.
    pub fn is_empty(&self) -> bool {
        self.groups.is_empty() && self.inverse.is_empty()
    }

    /// The keys the groups count by.
    pub fn keys(&self) -> BTreeSet<String> {
        self.groups
            .iter()
            .map(|g| g.key.clone())
            .chain(self.inverse.iter().map(|(g, _)| g.key.clone()))
            .collect()
    }

    /// A domain a node could be in: known to every group of its key whose node filter the node
    /// passes.
    pub fn register(&mut self, key: &str, domain: &str, node: &NodeView) {
        self.domains
            .entry(key.to_string())
            .or_default()
            .insert(domain.to_string());
        for g in self.groups.iter_mut().filter(|g| g.key == key) {
            if g.node_counts(node) {
                g.register(domain);
            }
        }
        for (g, _) in self.inverse.iter_mut().filter(|(g, _)| g.key == key) {
            g.register(domain);
        }
    }

    /// A pod already on a node (not one of the round's): counted where it runs, and its
    /// anti-affinity terms repel the pods they select from that domain.
    pub fn count_existing(
        &mut self,
        pod: &PodInfo,
        node_name: &str,
        labels: &BTreeMap<String, String>,
        taints: &[Taint],
        namespaces: &NamespaceLabels,
    ) {
        let view = NodeView::Labels(labels, taints);
        let domain_of = |key: &str| {
            labels
                .get(key)
                .cloned()
                .or_else(|| (key == HOSTNAME_KEY).then(|| node_name.to_string()))
        };
        for g in &mut self.groups {
            if g.selects(&pod.namespace, &pod.labels)
                && g.node_counts(&view)
                && let Some(d) = domain_of(&g.key)
            {
                g.record(&d);
            }
        }
        for term in pod.topology.iter().filter(|t| t.kind == Kind::AntiAffinity) {
            let Some(d) = domain_of(&term.key) else {
                continue;
            };
            let gi = self.inverse_of(group_of(term, pod, namespaces));
            self.inverse[gi].0.record(&d);
        }
    }

    /// A fast answer for a node already in one domain of a key pod `i`'s own spread or
    /// anti-affinity counts by: `Some(permanent)` when that domain refuses the pod (an
    /// anti-affinity refusal is for good: counts only grow), `None` when
    /// [`Topology::add_requirements`] must decide.
    pub fn quick_reject(&self, i: usize, pod: &PodInfo, node: &Requirements) -> Option<bool> {
        let hostname_zero = self.mode == Mode::Provisioning;
        let plain = pod.terms.is_empty() && pod.volume_terms.is_empty();
        for g in self
            .owned
            .get(i)
            .into_iter()
            .flatten()
            .map(|g| &self.groups[*g])
        {
            let Some(r) = node.get_ref(&g.key).filter(|r| r.len() == Some(1)) else {
                continue;
            };
            let Some(c) = r.values().next().and_then(|d| g.counts.get(d)) else {
                continue;
            };
            match g.kind {
                Kind::AntiAffinity if *c > 0 => return Some(true),
                Kind::Spread if plain && !pod.node_selector.contains_key(&g.key) => {
                    let min = g.min_count(&Requirement::exists(&g.key), hostname_zero);
                    let own = i64::from(g.selects(&pod.namespace, &pod.labels));
                    if c + own - min > i64::from(g.max_skew) {
                        return Some(false);
                    }
                }
                _ => {}
            }
        }
        None
    }

    /// Narrow `node` (the requirements of the node being considered, the pod's own merged in)
    /// by every group that constrains pod `i` (core's `AddRequirements`). `Err` says which
    /// constraint has no domain left.
    pub fn add_requirements(
        &self,
        i: usize,
        pod: &PodInfo,
        pod_reqs: &Requirements,
        node: &Requirements,
        taints: &[Taint],
    ) -> Result<Requirements, String> {
        let mut out = node.clone();
        let view = NodeView::Planned(node, taints);
        let owned = self
            .owned
            .get(i)
            .into_iter()
            .flatten()
            .map(|g| &self.groups[*g]);
        let repelled = self
            .inverse
            .iter()
            .filter(|(g, _)| g.selects(&pod.namespace, &pod.labels) && g.node_counts(&view))
            .map(|(g, _)| g);
        let hostname_zero = self.mode == Mode::Provisioning;
        let owned = owned.map(|g| (g, true));
        for (g, pin) in owned.chain(repelled.map(|g| (g, false))) {
            let pod_domains = pod_reqs.get(&g.key);
            let node_domains = node.get(&g.key);
            let selected = g.selects(&pod.namespace, &pod.labels);
            let domains = g.next(pin, selected, &pod_domains, &node_domains, hostname_zero);
            if domains.len() == Some(0) {
                return Err(format!(
                    "{} on {} cannot be satisfied{}",
                    match g.kind {
                        Kind::Spread => "topology spread",
                        Kind::Affinity => "pod affinity",
                        Kind::AntiAffinity => "pod anti-affinity",
                    },
                    g.key,
                    if node.has(&g.key) {
                        format!(" in {}", values_of(&node_domains))
                    } else {
                        String::new()
                    }
                ));
            }
            out.add(domains);
        }
        Ok(out)
    }

    /// Pod `i` goes to a node with `reqs` (core's `Record`): each group that selects it counts
    /// the domain once the node has one; anti-affinity blocks every domain the node may be in.
    pub fn record(&mut self, i: usize, pod: &PodInfo, reqs: &Requirements, taints: &[Taint]) {
        let view = NodeView::Planned(reqs, taints);
        for g in &mut self.groups {
            if !g.selects(&pod.namespace, &pod.labels) || !g.node_counts(&view) {
                continue;
            }
            for d in domains_of(g, reqs, g.kind == Kind::AntiAffinity) {
                g.record(&d);
            }
        }
        for (g, owners) in &mut self.inverse {
            if owners.contains(&i) {
                for d in domains_of(g, reqs, true) {
                    g.record(&d);
                }
            }
        }
    }
}

/// The domains a node with `reqs` is (or, with `all`, may be) in.
fn domains_of(g: &Group, reqs: &Requirements, all: bool) -> Vec<String> {
    let r = reqs.get(&g.key);
    match r.len() {
        Some(1) => r.values().cloned().collect(),
        Some(_) if all => r.values().cloned().collect(),
        None if all && reqs.has(&g.key) => g.counts.keys().filter(|d| r.has(d)).cloned().collect(),
        None if all => g.counts.keys().cloned().collect(),
        _ => vec![],
    }
}

fn values_of(r: &Requirement) -> String {
    let v: Vec<&str> = r.values().map(String::as_str).collect();
    format!("[{}]", v.join(", "))
}

fn group_of(term: &TopologyTerm, pod: &PodInfo, namespaces: &NamespaceLabels) -> Group {
    let filter = (term.kind == Kind::Spread).then(|| NodeFilter {
        selector: if term.honor_affinity {
            pod.node_selector.clone()
        } else {
            BTreeMap::new()
        },
        terms: if term.honor_affinity {
            pod.terms.clone()
        } else {
            vec![]
        },
        tolerations: term.honor_taints.then(|| pod.tolerations.clone()),
    });
    Group {
        kind: term.kind,
        key: term.key.clone(),
        namespaces: resolve(&term.namespaces, namespaces),
        selector: term.selector.clone(),
        max_skew: term.max_skew,
        min_domains: term.min_domains,
        filter,
        counts: BTreeMap::new(),
        empty: 0,
    }
}

/// Whether any pod of `pods` needs namespace labels (a `namespaceSelector`).
pub fn needs_namespaces<'a>(mut pods: impl Iterator<Item = &'a PodInfo>) -> bool {
    pods.any(|p| {
        p.topology
            .iter()
            .any(|t| matches!(t.namespaces, Namespaces::Selected(..)))
    })
}
