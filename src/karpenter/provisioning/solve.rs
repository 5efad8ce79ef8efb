//! The provisioning scheduler (core's `Scheduler.Solve`): pods one at a time, largest first,
//! each onto the first in-flight node that takes it, else the first new node being built,
//! else a new node of the first NodePool (by weight) that can take it.
//!
//! A new node keeps core's NodeClaim state: its requirements (the template's, narrowed by each
//! pod's node selector and affinity, S55, and by topology, S56) and the instance types that
//! still fit them, its pods' requests and `minValues` (a pod whose addition leaves fewer
//! distinct values of a key than its `minValues` is not added). It holds one host of its
//! cheapest remaining type and offering from the moment it opens (budgets never let two nodes
//! count on one host) and its share of the NodePool's limits.

use std::collections::{BTreeMap, BTreeSet};

use super::pack::{Choice, NewClaim, PoolOffer, capacity_with_node, offering_ok, within};
use crate::api::karpenter::{INSTANCE_TYPE_LABEL, NODEPOOL_LABEL};
use crate::api::requirements::{Requirement, Requirements};
use crate::karpenter::scheduling::{
    HOSTNAME_KEY, HostPort, PodInfo, SimNode, fits_resources, shapes,
};
use crate::karpenter::topology::{NodeView, Topology};

/// Free hosts per (instance type, offering index).
pub type Budgets = BTreeMap<(String, usize), i64>;

#[derive(Debug, Default)]
pub struct PackOutcome<'a> {
    pub claims: Vec<NewClaim>,
    /// Pods placed on in-flight nodes.
    pub absorbed: usize,
    /// The in-flight node each absorbed pod was placed on.
    pub placed: Vec<((String, String), String)>,
    pub unplaced: Vec<(&'a PodInfo, String)>,
}

/// Why a node refused a pod; `permanent` when it refuses every later pod of the same shape
/// too (nodes only fill up and narrow; topology counts move).
#[derive(Debug)]
struct Refusal {
    why: Why,
    permanent: bool,
}

/// Reasons, least specific first: the most specific over every NodePool is told.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
enum Why {
    Incompatible,
    NoType,
    NoHost,
    Limits,
    Topology(String),
    MinValues(String),
}

impl Why {
    fn text(&self) -> String {
        match self {
            Why::Incompatible => {
                "incompatible with every NodePool (requirements, taints or resources)".into()
            }
            Why::NoType => "no fitting instance type".into(),
            Why::NoHost => {
                "no free host of a fitting class (all claimable hosts are spoken for)".into()
            }
            Why::Limits => "NodePool limits exceeded".into(),
            Why::Topology(t) => t.clone(),
            Why::MinValues(t) => t.clone(),
        }
    }
}

fn refuse(why: Why, permanent: bool) -> Refusal {
    Refusal { why, permanent }
}

/// A pod's node requirements: its node selector with each term of its required node affinity
/// (terms are ORed: one alternative each) and of each of its volumes' node affinity.
pub fn alternatives(p: &PodInfo) -> Vec<Requirements> {
    let mut alts = vec![Requirements::from_labels(&p.node_selector)];
    let terms = std::iter::once(&p.terms).chain(p.volume_terms.iter());
    for t in terms.filter(|t| !t.is_empty()) {
        let mut next = vec![];
        for a in &alts {
            for term in t {
                let mut r = a.clone();
                for q in term {
                    r.add(Requirement::new(&q.key, &q.operator, &q.values, None));
                }
                next.push(r);
            }
        }
        next.truncate(64);
        alts = next;
    }
    alts
}

/// A node being built.
struct Bin {
    offer: usize,
    reqs: Requirements,
    /// Indices into the offer's choices that still fit.
    options: Vec<usize>,
    used: BTreeMap<String, i128>,
    pods: Vec<usize>,
    ports: Vec<HostPort>,
    /// The host it holds: (choice, offering of that choice's type).
    held: (usize, usize),
    /// Its share of the NodePool's limits.
    charged: BTreeMap<String, i128>,
}

/// What adding a pod to a bin would make of it.
struct Grown {
    reqs: Requirements,
    options: Vec<usize>,
    held: (usize, usize),
    charged: BTreeMap<String, i128>,
}

/// An in-flight node.
struct Existing {
    node: SimNode,
    reqs: Requirements,
}

pub struct Solver<'a> {
    offers: &'a [PoolOffer],
    budgets: Budgets,
    usage: BTreeMap<String, BTreeMap<String, i128>>,
    topo: Topology,
    existing: Vec<Existing>,
    bins: Vec<Bin>,
    next_host: usize,
    /// Skip nodes that refused a shape for good (off in the test that checks it changes
    /// nothing).
    pub skip: bool,
    /// The in-flight node each pod was planned onto by an earlier round, by pod: tried first,
    /// so that a round re-places a batch as it was planned (in-flight nodes come in name
    /// order, which is not the order they were packed in).
    pub planned: BTreeMap<(String, String), String>,
}

fn key_of(c: &Choice, o: usize) -> (String, usize) {
    (c.it.name.clone(), o)
}

impl<'a> Solver<'a> {
    pub fn new(
        offers: &'a [PoolOffer],
        budgets: Budgets,
        usage: BTreeMap<String, BTreeMap<String, i128>>,
        mut topo: Topology,
        inflight: Vec<SimNode>,
    ) -> Solver<'a> {
        // Every domain a new node could be in, per key the round's topology counts by.
        for key in topo.keys() {
            for offer in offers {
                for c in &offer.choices {
                    for &o in &c.offerings {
                        if let Some(v) = c.it.offerings[o].labels.get(&key) {
                            let mut reqs = offer.reqs.clone();
                            reqs.add(Requirement::one_of(&key, [v.clone()]));
                            topo.register(&key, v, &NodeView::Planned(&reqs, &offer.taints));
                        }
                    }
                }
            }
        }
        let existing = inflight
            .into_iter()
            .map(|node| {
                let mut reqs = Requirements::from_labels(&node.labels);
                if !node.labels.contains_key(HOSTNAME_KEY) {
                    reqs.add(Requirement::one_of(HOSTNAME_KEY, [node.name.clone()]));
                }
                for key in topo.keys() {
                    if let Some(r) = reqs.has(&key).then(|| reqs.get(&key))
                        && let Some(v) = r.values().next()
                    {
                        let view = NodeView::Labels(&node.labels, &node.taints);
                        topo.register(&key, &v.clone(), &view);
                    }
                }
                Existing { node, reqs }
            })
            .collect();
        Solver {
            offers,
            budgets,
            usage,
            topo,
            existing,
            bins: vec![],
            next_host: 0,
            skip: true,
            planned: BTreeMap::new(),
        }
    }

    /// Place `pods` (sorted largest first; indices as given to the [`Topology`]).
    pub fn solve(mut self, pods: &'a [PodInfo]) -> PackOutcome<'a> {
        let mut out = PackOutcome::default();
        let shape = shapes(pods);
        let n = shape.iter().max().map_or(0, |m| m + 1);
        let mut first_existing = vec![0usize; n];
        let mut first_bin = vec![0usize; n];
        let by_name: BTreeMap<String, usize> = self
            .existing
            .iter()
            .enumerate()
            .map(|(e, x)| (x.node.name.clone(), e))
            .collect();
        'pods: for (i, pod) in pods.iter().enumerate() {
            let s = shape[i];
            let alts = alternatives(pod);
            // Where an earlier round planned it, first.
            if let Some(&e) = self.planned.get(&pod.key()).and_then(|n| by_name.get(n))
                && let Ok(reqs) = self.try_existing(e, i, pod, &alts)
            {
                self.topo
                    .record(i, pod, &reqs, &self.existing[e].node.taints);
                self.existing[e].node.add(pod);
                out.absorbed += 1;
                out.placed
                    .push((pod.key(), self.existing[e].node.name.clone()));
                continue 'pods;
            }
            // In-flight nodes first.
            let mut prefix = true;
            for e in first_existing[s]..self.existing.len() {
                match self.try_existing(e, i, pod, &alts) {
                    Ok(reqs) => {
                        self.topo
                            .record(i, pod, &reqs, &self.existing[e].node.taints);
                        self.existing[e].node.add(pod);
                        if prefix && self.skip {
                            first_existing[s] = e;
                        }
                        out.absorbed += 1;
                        out.placed
                            .push((pod.key(), self.existing[e].node.name.clone()));
                        continue 'pods;
                    }
                    Err(r) if r.permanent && prefix && self.skip => first_existing[s] = e + 1,
                    Err(_) => prefix = false,
                }
            }
            // Then the nodes being built.
            let mut prefix = true;
            for b in first_bin[s]..self.bins.len() {
                match self.try_bin(b, i, pod, &alts) {
                    Ok(g) => {
                        self.commit(b, i, pod, g);
                        if prefix && self.skip {
                            first_bin[s] = b;
                        }
                        continue 'pods;
                    }
                    Err(r) if r.permanent && prefix && self.skip => first_bin[s] = b + 1,
                    Err(_) => prefix = false,
                }
            }
            // Then a new node.
            match self.open(i, pod, &alts) {
                Ok(()) => {}
                Err(why) => out.unplaced.push((pod, why.text())),
            }
        }
        for b in std::mem::take(&mut self.bins) {
            out.claims.push(self.finish(b, pods));
        }
        out
    }

    fn try_existing(
        &self,
        e: usize,
        i: usize,
        pod: &PodInfo,
        alts: &[Requirements],
    ) -> Result<Requirements, Refusal> {
        let ex = &self.existing[e];
        if !ex.node.fits(pod) {
            return Err(refuse(Why::NoType, true));
        }
        if self.topo.is_empty() {
            return Ok(ex.reqs.clone());
        }
        if let Some(permanent) = self.topo.quick_reject(i, pod, &ex.reqs) {
            return Err(refuse(Why::Topology("topology".into()), permanent));
        }
        let mut last = refuse(Why::Incompatible, true);
        for pod_reqs in alts {
            match self
                .topo
                .add_requirements(i, pod, pod_reqs, &ex.reqs, &ex.node.taints)
            {
                Ok(t) if labels_satisfy(&ex.node.labels, &t) => return Ok(t),
                Ok(_) => last = refuse(Why::Topology("topology".into()), false),
                Err(why) => last = refuse(Why::Topology(why), false),
            }
        }
        Err(last)
    }

    fn try_bin(
        &self,
        b: usize,
        i: usize,
        pod: &PodInfo,
        alts: &[Requirements],
    ) -> Result<Grown, Refusal> {
        let bin = &self.bins[b];
        let offer = &self.offers[bin.offer];
        if !pod.tolerates(&offer.taints) {
            return Err(refuse(Why::Incompatible, true));
        }
        if bin
            .ports
            .iter()
            .any(|h| pod.host_ports.iter().any(|mine| mine.collides(h)))
        {
            return Err(refuse(Why::Incompatible, true));
        }
        // Resources first: the cheap, common refusal.
        if !bin
            .options
            .iter()
            .any(|c| fits_resources(&pod.requests, &bin.used, &offer.choices[*c].avail))
        {
            return Err(refuse(Why::NoType, true));
        }
        if let Some(permanent) = self.topo.quick_reject(i, pod, &bin.reqs) {
            return Err(refuse(Why::Topology("topology".into()), permanent));
        }
        let mut best: Option<Refusal> = None;
        for pod_reqs in alts {
            match self.grow(b, i, pod, pod_reqs) {
                Ok(g) => return Ok(g),
                Err(r) => {
                    if best.as_ref().is_none_or(|b| r.why > b.why) {
                        best = Some(r);
                    }
                }
            }
        }
        Err(best.unwrap_or(refuse(Why::Incompatible, true)))
    }

    /// `bin` with `pod` added under `pod_reqs`, if it can take it.
    fn grow(
        &self,
        b: usize,
        i: usize,
        pod: &PodInfo,
        pod_reqs: &Requirements,
    ) -> Result<Grown, Refusal> {
        let bin = &self.bins[b];
        let offer = &self.offers[bin.offer];
        bin.reqs
            .compatible_allowing(pod_reqs, |k| offer.undefined_ok(k))
            .map_err(|_| refuse(Why::Incompatible, true))?;
        let mut merged = bin.reqs.clone();
        for r in pod_reqs.iter() {
            merged.add(r.clone());
        }
        let mut requests = bin.used.clone();
        for (k, v) in &pod.requests {
            *requests.entry(k.clone()).or_insert(0) += v;
        }
        // What the remaining options can still offer, for each key topology counts by: a
        // spread then picks a domain that has a host.
        if !self.topo.is_empty() {
            for key in self.topo.keys() {
                if !offer.host_keys.contains(&key) {
                    continue;
                }
                let values: BTreeSet<String> = bin
                    .options
                    .iter()
                    .map(|c| &offer.choices[*c])
                    .filter(|c| fits_resources(&requests, &BTreeMap::new(), &c.avail))
                    .flat_map(|c| {
                        c.offerings
                            .iter()
                            .filter(|o| self.free(c, **o, bin.held, bin.offer))
                            .map(|o| &c.it.offerings[*o])
                            .filter(|o| offering_ok(o, &merged, &offer.host_keys))
                            .filter_map(|o| o.labels.get(&key).cloned())
                            .collect::<Vec<_>>()
                    })
                    .collect();
                merged.add(Requirement::one_of(&key, values));
            }
            merged = self
                .topo
                .add_requirements(i, pod, pod_reqs, &merged, &offer.taints)
                .map_err(|why| refuse(Why::Topology(why), false))?;
        }
        let mut fitting = false;
        let mut no_host = false;
        let mut limited = false;
        let mut options = vec![];
        // The cheapest option with a free host: (choice, offering), its charge, its price.
        type Held = ((usize, usize), BTreeMap<String, i128>, f64);
        let mut held: Option<Held> = None;
        let others = self.usage_without(bin);
        for &ci in &bin.options {
            let c = &offer.choices[ci];
            if c.type_reqs.intersects(&merged).is_err()
                || !fits_resources(&requests, &BTreeMap::new(), &c.avail)
            {
                continue;
            }
            fitting = true;
            let Some(&o) = c.offerings.iter().find(|o| {
                self.free(c, **o, bin.held, bin.offer)
                    && offering_ok(&c.it.offerings[**o], &merged, &offer.host_keys)
            }) else {
                no_host = true;
                continue;
            };
            let cap = capacity_with_node(&c.it);
            if !within(offer, Some(&others), &cap) {
                limited = true;
                continue;
            }
            options.push(ci);
            if held.as_ref().is_none_or(|(_, _, p)| c.it.price < *p) {
                held = Some(((ci, o), cap, c.it.price));
            }
        }
        let Some((hold, mut charged, _)) = held else {
            let why = if limited {
                Why::Limits
            } else if no_host {
                Why::NoHost
            } else if fitting {
                Why::NoType
            } else {
                Why::Incompatible
            };
            return Err(refuse(why, true));
        };
        if merged.has_min_values() {
            min_values(offer, &options, &merged).map_err(|w| refuse(Why::MinValues(w), true))?;
            // Any listed type may be launched: the largest counts against the limits.
            charged = max_capacity(offer, &options);
            if !within(offer, Some(&others), &charged) {
                return Err(refuse(Why::Limits, true));
            }
        }
        Ok(Grown {
            reqs: merged,
            options,
            held: hold,
            charged,
        })
    }

    /// Whether a host of `c`'s offering `o` is free for a node (its own held one counts).
    fn free(&self, c: &Choice, o: usize, held: (usize, usize), offer: usize) -> bool {
        let mine = self
            .offers
            .get(offer)
            .and_then(|of| of.choices.get(held.0))
            .is_some_and(|h| h.it.name == c.it.name && held.1 == o);
        mine || self.budgets.get(&key_of(c, o)).copied().unwrap_or(0) > 0
    }

    fn usage_without(&self, bin: &Bin) -> BTreeMap<String, i128> {
        let pool = &self.offers[bin.offer].pool;
        let mut u = self.usage.get(pool).cloned().unwrap_or_default();
        for (k, v) in &bin.charged {
            *u.entry(k.clone()).or_insert(0) -= v;
        }
        u
    }

    fn commit(&mut self, b: usize, i: usize, pod: &PodInfo, g: Grown) {
        let offer = &self.offers[self.bins[b].offer];
        let old = self.bins[b].held;
        if old != g.held {
            let oc = &offer.choices[old.0];
            *self.budgets.entry(key_of(oc, old.1)).or_insert(0) += 1;
            let nc = &offer.choices[g.held.0];
            *self.budgets.entry(key_of(nc, g.held.1)).or_insert(0) -= 1;
        }
        let u = self.usage.entry(offer.pool.clone()).or_default();
        for (k, v) in &self.bins[b].charged {
            *u.entry(k.clone()).or_insert(0) -= v;
        }
        for (k, v) in &g.charged {
            *u.entry(k.clone()).or_insert(0) += v;
        }
        self.topo.record(i, pod, &g.reqs, &offer.taints);
        let bin = &mut self.bins[b];
        bin.held = g.held;
        bin.charged = g.charged;
        bin.reqs = g.reqs;
        bin.options = g.options;
        for (k, v) in &pod.requests {
            *bin.used.entry(k.clone()).or_insert(0) += v;
        }
        bin.pods.push(i);
        bin.ports.extend(pod.host_ports.iter().cloned());
    }

    /// A new node of the first NodePool that takes `pod`.
    fn open(&mut self, i: usize, pod: &PodInfo, alts: &[Requirements]) -> Result<(), Why> {
        let hostname = format!("hostname-placeholder-{:04}", self.next_host);
        let mut best = Why::Incompatible;
        for (oi, offer) in self.offers.iter().enumerate() {
            if !pod.tolerates(&offer.taints) || offer.choices.is_empty() {
                continue;
            }
            let mut reqs = offer.reqs.clone();
            reqs.add(Requirement::one_of(HOSTNAME_KEY, [hostname.clone()]));
            self.topo.register(
                HOSTNAME_KEY,
                &hostname,
                &NodeView::Planned(&reqs, &offer.taints),
            );
            // Held: the cheapest free host of any type, for the moment.
            let mut held = None;
            for (ci, c) in offer.choices.iter().enumerate() {
                if let Some(&o) = c
                    .offerings
                    .iter()
                    .find(|o| self.budgets.get(&key_of(c, **o)).copied().unwrap_or(0) > 0)
                    && held.is_none_or(|(p, _)| c.it.price < p)
                {
                    held = Some((c.it.price, (ci, o)));
                }
            }
            let Some((_, held)) = held else {
                best = best.max(Why::NoHost);
                continue;
            };
            self.bins.push(Bin {
                offer: oi,
                reqs,
                options: (0..offer.choices.len()).collect(),
                used: BTreeMap::new(),
                pods: vec![],
                ports: vec![],
                held,
                charged: BTreeMap::new(),
            });
            let b = self.bins.len() - 1;
            // Taken for the attempt; given back if the pod does not fit.
            let c = &offer.choices[held.0];
            *self.budgets.entry(key_of(c, held.1)).or_insert(0) -= 1;
            match self.try_bin(b, i, pod, alts) {
                Ok(g) => {
                    self.commit(b, i, pod, g);
                    self.next_host += 1;
                    return Ok(());
                }
                Err(r) => {
                    *self.budgets.entry(key_of(c, held.1)).or_insert(0) += 1;
                    self.bins.pop();
                    best = best.max(r.why);
                }
            }
        }
        Err(best)
    }

    /// The NodeClaim of a finished node.
    fn finish(&self, bin: Bin, pods: &[PodInfo]) -> NewClaim {
        let offer = &self.offers[bin.offer];
        let (ci, o) = bin.held;
        let best = &offer.choices[ci];
        let mut reqs = bin.reqs.clone();
        let mut listed: Vec<&Choice> = bin.options.iter().map(|c| &offer.choices[*c]).collect();
        listed.sort_by(|a, b| {
            a.it.price
                .total_cmp(&b.it.price)
                .then_with(|| a.it.name.cmp(&b.it.name))
        });
        let min_types = reqs.get(INSTANCE_TYPE_LABEL).min_values;
        let names: Vec<String> = if reqs.has_min_values() {
            listed.iter().map(|c| c.it.name.clone()).collect()
        } else {
            // One type: the host it holds decides the rest (its zone and other labels), so the
            // budgets stay exact.
            for (k, v) in &best.it.offerings[o].labels {
                if reqs.get(k).min_values.is_none() {
                    reqs.add(Requirement::one_of(k, [v.clone()]));
                }
            }
            vec![best.it.name.clone()]
        };
        let mut it = Requirement::one_of(INSTANCE_TYPE_LABEL, names);
        it.min_values = min_types;
        reqs.add(it);
        reqs.add(Requirement::one_of(NODEPOOL_LABEL, [offer.pool.clone()]));
        let labels = super::pack::resolve_labels(&reqs, &offer.host_keys, &offer.labels);
        let mut requests = bin.used.clone();
        for (k, v) in &best.daemon_overhead {
            *requests.entry(k.clone()).or_insert(0) += v;
        }
        let mut requirements: Vec<_> = reqs
            .iter()
            .filter(|r| r.key != HOSTNAME_KEY)
            .flat_map(Requirement::to_node_selector)
            .collect();
        // Cheapest first, as core orders a NodeClaim's instance types.
        for r in requirements.iter_mut() {
            if r.key == INSTANCE_TYPE_LABEL && r.operator == "In" {
                r.values
                    .sort_by_key(|v| listed.iter().position(|c| c.it.name == *v));
            }
        }
        NewClaim {
            pool: offer.pool.clone(),
            instance_type: best.it.name.clone(),
            requests,
            pods: bin.pods.iter().map(|p| pods[*p].key()).collect(),
            requirements: Some(requirements),
            labels,
        }
    }
}

/// Every key the requirements pin to values (after topology narrowing) is one the node's
/// labels carry with an allowed value; keys it lacks must allow absence.
fn labels_satisfy(labels: &BTreeMap<String, String>, reqs: &Requirements) -> bool {
    reqs.iter().all(|r| match labels.get(&r.key) {
        Some(v) => r.has(v),
        None => r.key == HOSTNAME_KEY || r.allows_absent(),
    })
}

/// Distinct values of each `minValues` key over the remaining instance types (core's
/// `SatisfiesMinValues`): the type's own label, or the values its admitted offerings give.
fn min_values(offer: &PoolOffer, options: &[usize], reqs: &Requirements) -> Result<(), String> {
    for r in reqs.iter() {
        let Some(min) = r.min_values else { continue };
        let mut seen: BTreeSet<String> = BTreeSet::new();
        for c in options.iter().map(|c| &offer.choices[*c]) {
            if let Some(v) = c.type_reqs.get(&r.key).values().next()
                && c.type_reqs.has(&r.key)
            {
                seen.insert(v.clone());
                continue;
            }
            for o in &c.offerings {
                let of = &c.it.offerings[*o];
                if offering_ok(of, reqs, &offer.host_keys)
                    && let Some(v) = of.labels.get(&r.key)
                {
                    seen.insert(v.clone());
                }
            }
        }
        if (seen.len() as i64) < min {
            return Err(format!(
                "minValues requirement is not met for {} ({} of {min} distinct values)",
                r.key,
                seen.len()
            ));
        }
    }
    Ok(())
}

/// Per resource, the largest of the options' nodes (with one `nodes`).
fn max_capacity(offer: &PoolOffer, options: &[usize]) -> BTreeMap<String, i128> {
    let mut out: BTreeMap<String, i128> = BTreeMap::new();
    for c in options.iter().map(|c| &offer.choices[*c]) {
        for (k, v) in capacity_with_node(&c.it) {
            let e = out.entry(k).or_insert(v);
            *e = (*e).max(v);
        }
    }
    out
}

/// Pack `pods` (sorted largest first) into new nodes, with free hosts per instance type (on
/// its first offering), no in-flight nodes and no pods already running: for tests.
pub fn pack<'a>(
    pods: &'a [PodInfo],
    offers: &'a [PoolOffer],
    budgets: BTreeMap<String, i64>,
    usage: BTreeMap<String, BTreeMap<String, i128>>,
) -> PackOutcome<'a> {
    let budgets = budgets.into_iter().map(|(t, n)| ((t, 0usize), n)).collect();
    let topo = Topology::new(
        crate::karpenter::topology::Mode::Provisioning,
        pods,
        &BTreeMap::new(),
    );
    Solver::new(offers, budgets, usage, topo, vec![]).solve(pods)
}
