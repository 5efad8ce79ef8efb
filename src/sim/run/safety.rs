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

use super::{Violation, name_of};
use crate::api::NodeClaim;
use crate::clock::Clock;
use crate::k8s::{Cluster, MemoryCluster, WatchEvent, WatchStream};
use crate::karpenter::disruption::repair::REPAIR;
use crate::karpenter::lifecycle::node_ready;
use crate::karpenter::state::older_than;
use crate::karpenter::termination::deadline::{Recorded, pod_delete_at, recorded};
use crate::karpenter::{DISRUPTION_ANNOTATION, pods};
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
            }
            Change::Claim(WatchEvent::Applied(c)) => {
                let name = name_of(&c.metadata);
                let before = self.claims.get(&name).cloned();
                self.claim_changed(before.as_deref(), &c);
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
        let owner = n.and_then(|n| owner_uid(n));
        let by_owner = owner.and_then(|uid| {
            (self.claims.values()).find(|c| c.metadata.uid.as_deref() == Some(uid))
        });
        by_owner
            .or_else(|| {
                (self.claims.values())
                    .find(|c| c.status.as_ref().and_then(|s| s.node_name.as_deref()) == Some(node))
            })
            .or_else(|| {
                (self.claims.values()).find(|c| {
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
mod tests {
    use super::*;
    use crate::actors::events;
    use crate::k8s::EventType;
    use crate::sim::scenario::{IntOrPercent, SimPdb};
    use crate::sim::workload::{group, pdb};
    use crate::sim::world::{node_claim, workload_pod};
    use k8s_openapi::api::core::v1::{NodeCondition, NodeStatus, PodStatus};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

    struct Bench {
        cluster: MemoryCluster,
        clock: Clock,
        own: OwnDeletions,
        log: SafetyLog,
    }

    async fn bench() -> Bench {
        let clock = Clock::simulated("2026-01-01T00:00:00Z".parse().expect("time"));
        let cluster = MemoryCluster::new(clock.clone());
        let own = OwnDeletions::default();
        let (log, _task) = spawn(
            &cluster,
            clock.clone(),
            SimTransport::new(cluster.clone()),
            own.clone(),
            Duration::from_secs(1800),
        );
        Bench {
            cluster,
            clock,
            own,
            log,
        }
    }

    impl Bench {
        async fn settle(&self) {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }

        fn found(&self) -> Vec<String> {
            lock(&self.log.violations)
                .iter()
                .map(|v| format!("{}: {}", v.invariant, v.message))
                .collect()
        }

        /// A running pod of demand entry 0 on `node`, with do-not-disrupt if asked.
        async fn pod(&self, name: &str, node: &str, dnd: bool) {
            let mut p = workload_pod(name, ("p", &group(0)), "1", "1Gi");
            p.spec.as_mut().expect("spec").node_name = Some(node.into());
            if dnd {
                (p.metadata.annotations.get_or_insert_with(Default::default))
                    .insert("karpenter.sh/do-not-disrupt".into(), "true".into());
            }
            let p = self.cluster.create(&p).await.expect("pod");
            let mut p2 = p.clone();
            p2.status = Some(PodStatus {
                phase: Some("Running".into()),
                ..Default::default()
            });
            self.cluster.replace_status(&p2).await.expect("running");
        }

        async fn node(&self, name: &str, ready: &str, since: Timestamp) {
            let node = Node {
                metadata: kube::api::ObjectMeta {
                    name: Some(name.into()),
                    ..Default::default()
                },
                spec: None,
                status: None,
            };
            let mut n = self.cluster.create(&node).await.expect("node");
            n.status = Some(NodeStatus {
                conditions: Some(vec![NodeCondition {
                    type_: "Ready".into(),
                    status: ready.into(),
                    last_transition_time: Some(Time(since)),
                    ..Default::default()
                }]),
                ..Default::default()
            });
            self.cluster.replace_status(&n).await.expect("node status");
        }
    }

    fn max_unavailable(n: i32) -> PodDisruptionBudget {
        pdb(
            0,
            &SimPdb {
                max_unavailable: Some(IntOrPercent::Int(n)),
                min_available: None,
            },
        )
    }

    /// A pod deleted beyond its PDB is a violation; one the budget allows, one the simulation
    /// deletes itself, and one past its NodeClaim's deadline are not.
    #[tokio::test(start_paused = true)]
    async fn pdb_respected_judges_each_deletion_against_the_budget() {
        let b = bench().await;
        b.cluster.create(&max_unavailable(1)).await.expect("pdb");
        for n in ["a", "b", "c"] {
            b.pod(n, "n1", false).await;
        }
        b.settle().await;
        // Allowed: one of three may go.
        b.cluster
            .delete::<Pod>(Some("default"), "a", None)
            .await
            .expect("a");
        b.settle().await;
        assert!(b.found().is_empty(), "{:?}", b.found());
        // The simulation's own scale-down is not the controller's doing.
        b.own.note("b");
        b.cluster
            .delete::<Pod>(Some("default"), "b", None)
            .await
            .expect("b");
        b.settle().await;
        assert!(b.found().is_empty(), "{:?}", b.found());
        // "c" and a pod "d" not yet Running: maxUnavailable 1 with one unhealthy allows none.
        let d = workload_pod("d", ("p", &group(0)), "1", "1Gi");
        b.cluster.create(&d).await.expect("d");
        b.cluster
            .delete::<Pod>(Some("default"), "c", None)
            .await
            .expect("c");
        b.settle().await;
        let found = b.found();
        assert_eq!(found.len(), 1, "{found:?}");
        assert!(
            found[0].starts_with("pdb-respected: default/c evicted or deleted"),
            "{found:?}"
        );
        // Past the claim's terminationGracePeriod deadline the budget no longer holds.
        let mut nc = node_claim("n1", "class", "1", "1Gi");
        nc.metadata.annotations = Some(std::collections::BTreeMap::from([(
            "karpenter.sh/nodeclaim-termination-timestamp".to_string(),
            "2026-01-01T00:00:00Z".to_string(),
        )]));
        b.cluster.create(&nc).await.expect("claim");
        // "e" on n1, "d" still pending: the budget allows nothing, but the deadline has come.
        b.pod("e", "n1", true).await;
        b.settle().await;
        b.cluster
            .delete::<Pod>(Some("default"), "e", None)
            .await
            .expect("e");
        b.settle().await;
        assert_eq!(b.found().len(), 1, "{:?}", b.found());
        // The same on a node whose claim has no deadline is judged (twice: PDB, do-not-disrupt).
        b.pod("f", "n9", true).await;
        b.settle().await;
        b.cluster
            .delete::<Pod>(Some("default"), "f", None)
            .await
            .expect("f");
        b.settle().await;
        assert_eq!(b.found().len(), 3, "{:?}", b.found());
    }

    /// Seeds 1057, 2228, 3572, 9513 and more: nodeadm names the Node after the machine, and a
    /// claim deleted before registration recorded `status.nodeName` is tied to its Node by
    /// provider ID only (as core ties them). Its deadline must still exempt the pods the
    /// terminationGracePeriod deletes; the checker found no claim and blamed the controller.
    #[tokio::test(start_paused = true)]
    async fn a_claim_is_found_by_provider_id_for_its_deadline() {
        let b = bench().await;
        b.cluster.create(&max_unavailable(0)).await.expect("pdb");
        let mut n = Node::default();
        n.metadata.name = Some("mi-7".into());
        n.spec = Some(k8s_openapi::api::core::v1::NodeSpec {
            provider_id: Some("sim://adopted/10.0.0.7".into()),
            ..Default::default()
        });
        b.cluster.create(&n).await.expect("node");
        let mut nc = node_claim("c7", "class", "1", "1Gi");
        nc.metadata.annotations = Some(std::collections::BTreeMap::from([(
            "karpenter.sh/nodeclaim-termination-timestamp".to_string(),
            "2026-01-01T00:00:00Z".to_string(),
        )]));
        let mut nc = b.cluster.create(&nc).await.expect("claim");
        nc.status.get_or_insert_with(Default::default).provider_id =
            Some("sim://adopted/10.0.0.7".into());
        b.cluster.replace_status(&nc).await.expect("provider id");
        b.pod("a", "mi-7", true).await;
        b.settle().await;
        b.cluster
            .delete::<Pod>(Some("default"), "a", None)
            .await
            .expect("a");
        b.settle().await;
        assert!(b.found().is_empty(), "past the deadline: {:?}", b.found());
        // The same pod on a Node of that provider ID created before the claim is not its.
        let mut old = n.clone();
        old.metadata.name = Some("mi-old".into());
        old.metadata.creation_timestamp = Some(Time("2025-12-31T00:00:00Z".parse().expect("t")));
        b.cluster.create(&old).await.expect("old node");
        b.pod("b", "mi-old", false).await;
        b.settle().await;
        b.cluster
            .delete::<Pod>(Some("default"), "b", None)
            .await
            .expect("b");
        b.settle().await;
        assert_eq!(b.found().len(), 1, "{:?}", b.found());
    }

    /// Deleting a Node with a PDB-covered or do-not-disrupt pod on it loses them: both
    /// invariants see it, unless the NodeClaim was force-deleted by the simulation.
    #[tokio::test(start_paused = true)]
    async fn a_node_deleted_under_its_pods_is_seen() {
        let b = bench().await;
        b.cluster.create(&max_unavailable(0)).await.expect("pdb");
        let now = b.clock.now();
        b.node("n1", "True", now).await;
        b.node("n2", "True", now).await;
        b.pod("a", "n1", true).await;
        b.pod("b", "n2", false).await;
        b.settle().await;
        b.own.note_claim("n2");
        b.cluster
            .delete::<Node>(None, "n2", None)
            .await
            .expect("n2");
        b.settle().await;
        assert!(b.found().is_empty(), "force-deleted: {:?}", b.found());
        // A Node that names itself (nodeadm's `mi-*`) of a force-deleted claim, which is gone
        // by then: its owner reference names the claim.
        b.node("mi-3", "True", now).await;
        let mut mi: Node = b
            .cluster
            .get(None, "mi-3")
            .await
            .expect("get")
            .expect("mi-3");
        mi.metadata.owner_references = Some(vec![
            k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference {
                api_version: "karpenter.sh/v1".into(),
                kind: "NodeClaim".into(),
                name: "c3".into(),
                uid: "u3".into(),
                ..Default::default()
            },
        ]);
        b.cluster.replace(&mi).await.expect("owned");
        b.pod("c", "mi-3", true).await;
        b.settle().await;
        b.own.note_claim("c3");
        b.cluster
            .delete::<Node>(None, "mi-3", None)
            .await
            .expect("mi-3");
        b.settle().await;
        assert!(b.found().is_empty(), "force-deleted, mi-*: {:?}", b.found());
        b.cluster
            .delete::<Node>(None, "n1", None)
            .await
            .expect("n1");
        b.settle().await;
        let found = b.found().join("\n");
        assert!(
            found.contains("do-not-disrupt-respected: pod default/a"),
            "{found}"
        );
        assert!(
            found.contains("pdb-respected: default/a lost with their Node"),
            "{found}"
        );
    }

    /// A voluntary disruption mark on a NodeClaim whose Node holds a do-not-disrupt pod is a
    /// violation; an expiry mark (forceful) and drift of a claim with a grace period (core's
    /// eventual class) are not.
    #[tokio::test(start_paused = true)]
    async fn do_not_disrupt_respected_judges_the_mark() {
        let b = bench().await;
        let cases = [
            ("n1", "Expired", None),
            ("n2", "Underutilized", None),
            ("n3", "Drifted", Some("10m")),
            ("n4", "Drifted", None),
        ];
        for (n, reason, grace) in cases {
            b.node(n, "True", b.clock.now()).await;
            b.pod(&format!("p-{n}"), n, true).await;
            let mut nc = node_claim(n, "class", "1", "1Gi");
            nc.spec.termination_grace_period = grace.map(String::from);
            b.cluster.create(&nc).await.expect("claim");
            b.settle().await;
            let patch =
                serde_json::json!({"metadata": {"annotations": {DISRUPTION_ANNOTATION: reason}}});
            b.cluster
                .patch::<NodeClaim>(None, n, &patch)
                .await
                .expect("mark");
            b.settle().await;
        }
        let found = b.found();
        assert_eq!(found.len(), 2, "{found:?}");
        assert!(
            found[0].contains("NodeClaim n2 marked for disruption (Underutilized)"),
            "{found:?}"
        );
        assert!(
            found[1].contains("NodeClaim n4 marked for disruption (Drifted)"),
            "{found:?}"
        );
    }

    /// A repair of a Node unhealthy for less than the toleration, or in a NodePool with more
    /// than 20% of its nodes unhealthy, is a violation; one within both bounds is not.
    #[tokio::test(start_paused = true)]
    async fn repair_bounded_judges_toleration_and_share() {
        let b = bench().await;
        let long_ago = b.clock.now();
        tokio::time::sleep(Duration::from_secs(3600)).await;
        let recent = b.clock.now();
        // Five nodes of one pool: n0 unhealthy for an hour, n1 for a second; the rest Ready.
        for i in 0..5 {
            let (ready, since) = match i {
                0 => ("Unknown", long_ago),
                1 => ("False", recent),
                _ => ("True", long_ago),
            };
            let name = format!("n{i}");
            b.node(&name, ready, since).await;
            let mut nc = node_claim(&name, "class", "1", "1Gi");
            nc.metadata.labels = Some(std::collections::BTreeMap::from([(
                "karpenter.sh/nodepool".to_string(),
                "pool".to_string(),
            )]));
            b.cluster.create(&nc).await.expect("claim");
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
        let repair = |name: &str| {
            let cluster = b.cluster.clone();
            let name = name.to_string();
            async move {
                let nc: NodeClaim = cluster.get(None, &name).await.expect("get").expect("claim");
                events::record(&cluster, &nc, EventType::Warning, REPAIR, "repair").await;
                cluster
                    .delete::<NodeClaim>(None, &name, None)
                    .await
                    .expect("delete");
            }
        };
        // Two of five unhealthy: more than 20% (one).
        repair("n0").await;
        b.settle().await;
        let found = b.found().join("\n");
        assert!(
            found.contains("repair-bounded: NodeClaim n0 repaired while 2 of 5"),
            "{found}"
        );
        assert!(
            !found.contains("toleration 1800s"),
            "n0 was unhealthy long enough: {found}"
        );
        repair("n1").await;
        b.settle().await;
        let found = b.found().join("\n");
        assert!(
            found.contains("NodeClaim n1 repaired while its Node is unhealthy for 1s only"),
            "{found}"
        );
        // A deletion that is no repair is not judged.
        let before = b.found().len();
        b.cluster
            .delete::<NodeClaim>(None, "n2", None)
            .await
            .expect("n2");
        b.settle().await;
        assert_eq!(b.found().len(), before);
    }
}
