//! The workload-safety invariants (issue #20), judged the moment the API changes, by a task
//! that watches pods, PodDisruptionBudgets, NodeClaims and Nodes:
//!
//! - `pdb-respected`: a pod is evicted or deleted (or its Node deleted from under it) only
//!   while every PodDisruptionBudget covering it allows a disruption, reckoned as the Eviction
//!   API does over the pods as they were just before; a pod whose NodeClaim's
//!   terminationGracePeriod deadline has come (minus the pod's own grace) is exempt.
//! - `do-not-disrupt-respected`: no NodeClaim is marked for a voluntary disruption (Empty,
//!   Underutilized, Drifted) while its Node holds a `karpenter.sh/do-not-disrupt` pod, and no
//!   such pod is evicted or deleted before that deadline. Exempt as in core: expiry (forceful,
//!   S51) and drift of a claim with a terminationGracePeriod (core's eventual class).
//! - `repair-bounded`: a NodeClaim deleted by node repair had its Node unhealthy for at least
//!   the toleration, and no more than 20% (rounded up) of its NodePool's nodes were unhealthy.
//!
//! Deletions the simulation makes itself (scale-down, pod GC, force-deleted NodeClaims) are
//! not the controller's and are exempt.

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::{FutureExt, StreamExt};
use jiff::Timestamp;
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::core::{Selector, SelectorExt};
use tokio::task::JoinHandle;

use super::claim_index::ClaimIndex;
use super::{Violation, name_of};
use crate::api::DISRUPTION_ANNOTATION;
use crate::api::NodeClaim;
use crate::clock::Clock;
use crate::k8s::{Cluster, MemoryCluster, WatchEvent, WatchStream};
use crate::karpenter::disruption::repair::REPAIR;
use crate::karpenter::lifecycle::node_ready;
use crate::karpenter::pods;
use crate::karpenter::state::older_than;
use crate::karpenter::termination::deadline::{Recorded, pod_delete_at, recorded};
use crate::sim::transport::SimTransport;

/// What the simulation deletes itself: pods (scale-down, pod GC) and NodeClaims (the force
/// delete fault). Shared with the checker, which exempts them.
#[derive(Clone, Default)]
pub struct OwnDeletions {
    pods: Arc<Mutex<HashSet<String>>>,
    claims: Arc<Mutex<HashSet<String>>>,
}

impl OwnDeletions {
    /// The simulation is about to delete pod `name` (in the workload's namespace).
    pub fn note(&self, name: &str) {
        lock(&self.pods).insert(name.to_string());
    }

    /// The simulation is about to force-delete NodeClaim `name`.
    pub fn note_claim(&self, name: &str) {
        lock(&self.claims).insert(name.to_string());
    }

    fn took_pod(&self, name: &str) -> bool {
        lock(&self.pods).remove(name)
    }

    fn took_claim(&self, name: &str) -> bool {
        lock(&self.claims).contains(name)
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Share of a NodePool's nodes that may be unhealthy while repair acts (core's, rounded up).
const REPAIR_UNHEALTHY_PERCENT: usize = 20;

/// The checker's results, and how far it has read the API's events (the runner forgets
/// only events both have read).
#[derive(Clone, Default)]
pub(super) struct SafetyLog {
    pub violations: Arc<Mutex<Vec<Violation>>>,
    pub events_read: Arc<AtomicUsize>,
}

enum Change {
    Pod(WatchEvent<Arc<Pod>>),
    Pdb(WatchEvent<Arc<PodDisruptionBudget>>),
    Claim(WatchEvent<Arc<NodeClaim>>),
    Node(WatchEvent<Arc<Node>>),
}

/// The resourceVersion an event carries (a restart sorts first).
fn rv(c: &Change) -> u64 {
    fn of<K: kube::Resource>(e: &WatchEvent<Arc<K>>) -> u64 {
        match e {
            WatchEvent::Applied(o) | WatchEvent::Deleted(o) => o
                .meta()
                .resource_version
                .as_deref()
                .and_then(|s| s.parse().ok())
                .unwrap_or(0),
            WatchEvent::Restarted(_) => 0,
        }
    }
    match c {
        Change::Pod(e) => of(e),
        Change::Pdb(e) => of(e),
        Change::Claim(e) => of(e),
        Change::Node(e) => of(e),
    }
}

struct Checker {
    cluster: MemoryCluster,
    clock: Clock,
    transport: SimTransport,
    own: OwnDeletions,
    repair_toleration: Duration,
    log: SafetyLog,
    pods: BTreeMap<String, Arc<Pod>>,
    pdbs: BTreeMap<String, (Option<Selector>, Arc<PodDisruptionBudget>)>,
    claims: BTreeMap<String, Arc<NodeClaim>>,
    /// `claims` by uid, Node name and provider ID.
    index: ClaimIndex,
    nodes: BTreeMap<String, Arc<Node>>,
    /// NodeClaims a `Repair` event names, not yet seen deleted.
    repaired: BTreeSet<String>,
    reported: BTreeSet<(&'static str, String)>,
}

/// Start the checker (it runs until the runtime stops).
pub(super) fn spawn(
    cluster: &MemoryCluster,
    clock: Clock,
    transport: SimTransport,
    own: OwnDeletions,
    repair_toleration: Duration,
) -> (SafetyLog, JoinHandle<()>) {
    let log = SafetyLog::default();
    let mut pods: WatchStream<Arc<Pod>> = cluster.watch_shared(None);
    let mut pdbs: WatchStream<Arc<PodDisruptionBudget>> = cluster.watch_shared(None);
    let mut claims: WatchStream<Arc<NodeClaim>> = cluster.watch_shared(None);
    let mut nodes: WatchStream<Arc<Node>> = cluster.watch_shared(None);
    let mut c = Checker {
        cluster: cluster.clone(),
        clock,
        transport,
        own,
        repair_toleration,
        log: log.clone(),
        pods: BTreeMap::new(),
        pdbs: BTreeMap::new(),
        claims: BTreeMap::new(),
        index: ClaimIndex::default(),
        nodes: BTreeMap::new(),
        repaired: BTreeSet::new(),
        reported: BTreeSet::new(),
    };
    let task = tokio::spawn(async move {
        loop {
            let first = tokio::select! {
                Some(Ok(e)) = pods.next() => Change::Pod(e),
                Some(Ok(e)) = pdbs.next() => Change::Pdb(e),
                Some(Ok(e)) = claims.next() => Change::Claim(e),
                Some(Ok(e)) = nodes.next() => Change::Node(e),
                else => return,
            };
            // Everything committed by now, in the order the API committed it.
            let mut batch = vec![first];
            drain(&mut pods, &mut batch, Change::Pod);
            drain(&mut pdbs, &mut batch, Change::Pdb);
            drain(&mut claims, &mut batch, Change::Claim);
            drain(&mut nodes, &mut batch, Change::Node);
            batch.sort_by_key(rv);
            c.read_events();
            for change in batch {
                c.apply(change);
            }
        }
    });
    (log, task)
}

fn drain<K>(
    s: &mut WatchStream<Arc<K>>,
    out: &mut Vec<Change>,
    wrap: fn(WatchEvent<Arc<K>>) -> Change,
) {
    while let Some(Some(ev)) = tokio::task::unconstrained(s.next()).now_or_never() {
        if let Ok(ev) = ev {
            out.push(wrap(ev));
        }
    }
}

impl Checker {
    fn violate(&mut self, invariant: &'static str, key: &str, message: String) {
        if self.reported.insert((invariant, key.to_string())) {
            lock(&self.log.violations).push(Violation {
                invariant: invariant.into(),
                at_seconds: self.transport.elapsed().as_secs(),
                message,
            });
        }
    }

    /// Repairs decided since the last read (the event comes just before the deletion).
    fn read_events(&mut self) {
        let seen = self.log.events_read.load(Ordering::SeqCst);
        let events = self.cluster.events_since(seen);
        for e in &events {
            if e.reason == REPAIR && e.regarding.kind == "NodeClaim" {
                self.repaired.insert(e.regarding.name.clone());
            }
        }
        self.log
            .events_read
            .store(seen + events.len(), Ordering::SeqCst);
    }

    fn apply(&mut self, change: Change) {
        match change {
            Change::Pod(WatchEvent::Restarted(all)) => {
                self.pods = all.into_iter().map(|p| (key(&p.metadata), p)).collect();
            }
            Change::Pod(WatchEvent::Applied(p)) => {
                self.pods.insert(key(&p.metadata), p);
            }
            Change::Pod(WatchEvent::Deleted(p)) => {
                let k = key(&p.metadata);
                if !self.own.took_pod(name_of(&p.metadata).as_str()) {
                    self.pods_leaving(std::slice::from_ref(&p), "evicted or deleted");
                }
                self.pods.remove(&k);
            }
            Change::Pdb(WatchEvent::Restarted(all)) => {
                self.pdbs = all
                    .into_iter()
                    .map(|b| (key(&b.metadata), budget(b)))
                    .collect();
            }
            Change::Pdb(WatchEvent::Applied(b)) => {
                self.pdbs.insert(key(&b.metadata), budget(b));
            }
            Change::Pdb(WatchEvent::Deleted(b)) => {
                self.pdbs.remove(&key(&b.metadata));
            }
            Change::Claim(WatchEvent::Restarted(all)) => {
                self.claims = all.into_iter().map(|c| (name_of(&c.metadata), c)).collect();
                self.index.rebuild(&self.claims);
            }
            Change::Claim(WatchEvent::Applied(c)) => {
                let name = name_of(&c.metadata);
                let before = self.claims.get(&name).cloned();
                self.claim_changed(before.as_deref(), &c);
                self.index.set(&name, Some(&c));
                self.claims.insert(name, c);
            }
            Change::Claim(WatchEvent::Deleted(c)) => {
                let name = name_of(&c.metadata);
                let unseen = (self.claims.get(&name))
                    .is_some_and(|b| b.metadata.deletion_timestamp.is_none());
                if unseen {
                    self.claim_deleted(&c);
                }
                self.claims.remove(&name);
                self.index.set(&name, None);
                self.repaired.remove(&name);
            }
            Change::Node(WatchEvent::Restarted(all)) => {
                self.nodes = all.into_iter().map(|n| (name_of(&n.metadata), n)).collect();
            }
            Change::Node(WatchEvent::Applied(n)) => {
                self.nodes.insert(name_of(&n.metadata), n);
            }
            Change::Node(WatchEvent::Deleted(n)) => {
                let name = name_of(&n.metadata);
                let bound: Vec<Arc<Pod>> = (self.pods.values())
                    .filter(|p| pods::node_name(p) == Some(name.as_str()))
                    .filter(|p| pods::counts_on_node(p) && p.metadata.deletion_timestamp.is_none())
                    .cloned()
                    .collect();
                // The NodeClaim that records the Node, else (a force-deleted one is gone) the
                // one that owns it, else the one it is named after.
                let owner = (n.metadata.owner_references.iter().flatten())
                    .find(|o| o.kind == "NodeClaim")
                    .map(|o| o.name.clone());
                let claim = (self.claim_of_node(&name).map(|c| name_of(&c.metadata)))
                    .or(owner)
                    .unwrap_or_else(|| name.clone());
                let forced = self.own.took_claim(&claim);
                if !bound.is_empty() && !forced {
                    self.pods_leaving(&bound, "lost with their Node");
                }
                self.nodes.remove(&name);
            }
        }
    }

    /// The NodeClaim whose Node is `node`: the one its owner reference names, else the one
    /// whose `status.nodeName` it is, else the one whose Node it is by provider ID (a claim
    /// deleted before registration recorded the name: core finds Nodes by provider ID), else
    /// the one it is named after.
    fn claim_of_node(&self, node: &str) -> Option<&Arc<NodeClaim>> {
        let n = self.nodes.get(node);
        let claim = |name: &String| self.claims.get(name);
        let by_owner = (n.and_then(|n| owner_uid(n)))
            .and_then(|uid| self.index.by_uid(uid))
            .and_then(claim);
        by_owner
            .or_else(|| self.index.by_node(node).find_map(claim))
            .or_else(|| {
                // Only a claim with the Node's provider ID, or named after it, can have it as
                // its Node by provider ID: those, in name order.
                let pid = n.and_then(|n| n.spec.as_ref()?.provider_id.as_deref());
                let mut names: BTreeSet<&String> = pid
                    .map(|p| self.index.by_provider(p).collect())
                    .unwrap_or_default();
                let own = node.to_string();
                names.insert(&own);
                names.into_iter().filter_map(claim).find(|c| {
                    provider_id_of_claim(c).is_some()
                        && self
                            .node_of_claim(c)
                            .and_then(|m| m.metadata.name.as_deref())
                            == Some(node)
                })
            })
            .or_else(|| self.claims.get(node))
    }

    /// The Node of a NodeClaim: by `status.nodeName`, else of the Nodes with its provider ID
    /// (nodeadm and Adopt name a Node after the machine) the one it owns, else one named after
    /// it, else one no claim owns, never one created before the claim (an earlier claim's
    /// left behind), else the one named after it.
    fn node_of_claim(&self, nc: &NodeClaim) -> Option<&Arc<Node>> {
        let by_status = nc.status.as_ref().and_then(|s| s.node_name.as_deref());
        if let Some(n) = by_status.and_then(|n| self.nodes.get(n)) {
            return Some(n);
        }
        let name = name_of(&nc.metadata);
        let by_provider = provider_id_of_claim(nc).and_then(|pid| {
            (self.nodes.values())
                .filter(|n| n.spec.as_ref().and_then(|s| s.provider_id.as_deref()) == Some(pid))
                .filter(|n| !older_than(&n.metadata, &nc.metadata))
                .filter_map(|n| {
                    let rank = match owner_uid(n) {
                        Some(o) if Some(o) == nc.metadata.uid.as_deref() => 0,
                        Some(_) => return None,
                        None if name_of(&n.metadata) == name => 1,
                        None => 2,
                    };
                    Some((rank, n))
                })
                .min_by_key(|(rank, _)| *rank)
                .map(|(_, n)| n)
        });
        by_provider.or_else(|| self.nodes.get(&name))
    }

    /// Whether the pod's NodeClaim deadline (terminationGracePeriod) lets it go now.
    fn past_deadline(&self, p: &Pod, now: Timestamp) -> bool {
        let Some(node) = pods::node_name(p) else {
            return false;
        };
        let Some(nc) = self.claim_of_node(node) else {
            return false;
        };
        match recorded(nc) {
            Recorded::At(deadline) => now >= pod_delete_at(deadline, pods::termination_grace(p)),
            _ => false,
        }
    }

    /// `gone` leave their nodes at once (evicted, deleted, or lost with their Node): each must
    /// be past its claim's deadline, or carry no do-not-disrupt and fit in every PDB.
    fn pods_leaving(&mut self, gone: &[Arc<Pod>], how: &str) {
        let now = self.clock.now();
        let due: Vec<&Arc<Pod>> = gone
            .iter()
            .filter(|p| pods::node_name(p).is_some() && !self.past_deadline(p, now))
            .collect();
        let mut found = vec![];
        for p in &due {
            if pods::do_not_disrupt(p) {
                let n = key(&p.metadata);
                found.push((
                    "do-not-disrupt-respected",
                    n.clone(),
                    format!(
                        "pod {n} (karpenter.sh/do-not-disrupt) {how} on Node {}",
                        pods::node_name(p).unwrap_or_default()
                    ),
                ));
            }
        }
        for (name, (selector, pdb)) in &self.pdbs {
            let Some(sel) = selector else { continue };
            let ns = pdb.metadata.namespace.as_deref().unwrap_or_default();
            let in_scope = |p: &Pod| {
                p.metadata.namespace.as_deref() == Some(ns)
                    && sel.matches(&p.metadata.labels.clone().unwrap_or_default())
            };
            let leaving: Vec<String> = due
                .iter()
                .filter(|p| in_scope(p))
                .map(|p| key(&p.metadata))
                .collect();
            if leaving.is_empty() {
                continue;
            }
            let covered: Vec<&Pod> = self
                .pods
                .values()
                .map(|p| &**p)
                .filter(|p| in_scope(p))
                .collect();
            let allowed = disruptions_allowed(pdb, &covered);
            if (leaving.len() as i64) > allowed {
                found.push((
                    "pdb-respected",
                    format!("{name}@{}", leaving.join(",")),
                    format!(
                        "{} {how} while PodDisruptionBudget {name} allowed {} disruption(s) ({} pods covered)",
                        leaving.join(", "),
                        allowed.max(0),
                        covered.len()
                    ),
                ));
            }
        }
        for (inv, key, msg) in found {
            self.violate(inv, &key, msg);
        }
    }

    /// A NodeClaim changed: a new voluntary-disruption mark must find no do-not-disrupt pod on
    /// its Node; a new deletion may be a repair.
    fn claim_changed(&mut self, before: Option<&NodeClaim>, nc: &NodeClaim) {
        let mark = |c: &NodeClaim| {
            (c.metadata.annotations.as_ref())
                .and_then(|a| a.get(DISRUPTION_ANNOTATION))
                .cloned()
        };
        let name = name_of(&nc.metadata);
        if let Some(reason) = mark(nc)
            && before.and_then(mark).is_none()
            && reason != "Expired"
            // Core's eventual class: a drifted claim with a terminationGracePeriod is disrupted
            // whatever its pods say; the grace period bounds them.
            && !(reason == "Drifted" && nc.spec.termination_grace_period.is_some())
            && let Some(node) = self.node_of_claim(nc)
        {
            let node = name_of(&node.metadata);
            let held: Vec<String> = (self.pods.values())
                .filter(|p| pods::node_name(p) == Some(node.as_str()))
                .filter(|p| pods::counts_on_node(p) && pods::do_not_disrupt(p))
                .map(|p| key(&p.metadata))
                .collect();
            if !held.is_empty() {
                self.violate(
                    "do-not-disrupt-respected",
                    &format!("{name}@mark"),
                    format!(
                        "NodeClaim {name} marked for disruption ({reason}) while its Node {node} holds do-not-disrupt pod(s) {}",
                        held.join(", ")
                    ),
                );
            }
        }
        let newly_deleted = nc.metadata.deletion_timestamp.is_some()
            && before.is_none_or(|b| b.metadata.deletion_timestamp.is_none());
        if newly_deleted {
            self.claim_deleted(nc);
        }
    }

    /// `repair-bounded`, when the deletion is a repair's.
    fn claim_deleted(&mut self, nc: &NodeClaim) {
        let name = name_of(&nc.metadata);
        if !self.repaired.remove(&name) {
            return;
        }
        let now = self.clock.now();
        let since = |n: &Node| {
            node_ready(n)
                .filter(|c| c.status != "True")
                .map(|c| c.last_transition_time.as_ref().map_or(now, |t| t.0))
        };
        match self.node_of_claim(nc).map(|n| since(n)) {
            Some(Some(t)) if self.clock.since(t) >= self.repair_toleration => {}
            other => {
                let what = match other {
                    None => "it has no Node".to_string(),
                    Some(None) => "its Node is Ready".to_string(),
                    Some(Some(t)) => format!(
                        "its Node is unhealthy for {}s only",
                        self.clock.since(t).as_secs()
                    ),
                };
                self.violate(
                    "repair-bounded",
                    &format!("{name}@toleration"),
                    format!(
                        "NodeClaim {name} repaired while {what} (toleration {}s)",
                        self.repair_toleration.as_secs()
                    ),
                );
            }
        }
        // Core counts a NodePool's nodes; a node that turned unhealthy this very instant may
        // not have reached the controller yet, so only earlier transitions count.
        let pool = nc.nodepool().unwrap_or_default().to_string();
        let (mut nodes, mut bad) = (0usize, 0usize);
        for c in self
            .claims
            .values()
            .filter(|c| c.nodepool().unwrap_or_default() == pool)
        {
            let Some(n) = self.node_of_claim(c) else {
                continue;
            };
            nodes += 1;
            if since(n).is_some_and(|t| t < now) {
                bad += 1;
            }
        }
        let allowed = (nodes * REPAIR_UNHEALTHY_PERCENT).div_ceil(100);
        if bad > allowed {
            self.violate(
                "repair-bounded",
                &format!("{name}@share"),
                format!(
                    "NodeClaim {name} repaired while {bad} of {nodes} nodes of NodePool {pool:?} are unhealthy (at most {allowed} may be)"
                ),
            );
        }
    }
}

/// The UID of the NodeClaim a Node's owner reference names.
fn owner_uid(n: &Node) -> Option<&str> {
    (n.metadata.owner_references.iter().flatten())
        .find(|o| o.kind == "NodeClaim")
        .map(|o| o.uid.as_str())
}

fn provider_id_of_claim(nc: &NodeClaim) -> Option<&str> {
    (nc.status.as_ref())
        .and_then(|s| s.provider_id.as_deref())
        .filter(|p| !p.is_empty())
}

fn key(m: &kube::api::ObjectMeta) -> String {
    format!(
        "{}/{}",
        m.namespace.as_deref().unwrap_or_default(),
        m.name.as_deref().unwrap_or_default()
    )
}

fn budget(b: Arc<PodDisruptionBudget>) -> (Option<Selector>, Arc<PodDisruptionBudget>) {
    let sel = (b.spec.as_ref())
        .and_then(|s| s.selector.clone())
        .and_then(|s| Selector::try_from(s).ok());
    (sel, b)
}

/// Disruptions a budget allows over the pods it covers, as the Eviction API reckons them
/// (`k8s::memory`): healthy = Running and not being deleted; percentages round up.
fn disruptions_allowed(pdb: &PodDisruptionBudget, covered: &[&Pod]) -> i64 {
    let expected = covered.len() as i64;
    let healthy = covered
        .iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none() && pods::phase(p) == "Running")
        .count() as i64;
    let resolve = |v: &IntOrString| -> i64 {
        match v {
            IntOrString::Int(i) => i64::from(*i),
            IntOrString::String(s) => {
                let pct: i64 = s.trim_end_matches('%').parse().unwrap_or(100);
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

#[cfg(test)]
#[path = "safety_tests.rs"]
mod tests;
