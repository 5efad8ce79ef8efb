//! Cluster state: the karpenter layer's in-memory view of our NodePools and NodeClaims, every
//! Node, Pod (all namespaces), DaemonSet and PodDisruptionBudget, kept current by watches.
//! Every controller of the layer reads from here instead of listing the API.

use std::borrow::Borrow;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, Mutex, RwLock, RwLockReadGuard, RwLockWriteGuard};

use futures::StreamExt;
use jiff::Timestamp;
use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use tokio::sync::Notify;
use tokio::task::JoinHandle;

use super::pods;
use super::scheduling::PodInfo;
use crate::api::{NodeClaim, NodePool};
use crate::clock::Clock;
use crate::k8s::{Cluster, Object, WatchEvent, WatchStream};

/// `namespace/name`.
pub type NsKey = (String, String);

#[derive(Default, Debug)]
pub struct Inner {
    /// NodePools whose nodeClassRef is an SSHNodeClass, by name.
    pub nodepools: BTreeMap<String, NodePool>,
    /// NodeClaims whose nodeClassRef is an SSHNodeClass, by name; shared with the store and
    /// the other watchers (the claims change often and every controller of the layer reads
    /// them).
    pub nodeclaims: BTreeMap<String, Arc<NodeClaim>>,
    /// Every Node (pods of ours may fit on foreign nodes), by name; shared with the store and
    /// the other watchers, like the claims.
    pub nodes: BTreeMap<String, Arc<Node>>,
    /// Node names by `spec.providerID`, so that finding a launched claim's Node before its
    /// nodeName is recorded is a lookup, not a scan of every Node. Several: a provider ID
    /// names a machine (kpssh's `kpssh://<ns>/<host>`, or the join's under Adopt), so the
    /// Node of an earlier claim of the machine may still be there beside the new one's.
    nodes_by_provider: BTreeMap<String, BTreeSet<String>>,
    pub pods: BTreeMap<NsKey, Pod>,
    /// Each pod's scheduling constraints with the resourceVersion they were read from, built
    /// at the first need and dropped when the pod changes: the simulated scheduler,
    /// provisioning and disruption each read them for every pod every few seconds, and
    /// building them (requests parsed, selectors converted, labels copied) was a fifth of a
    /// simulation's CPU. A mutex: readers hold the view's read lock.
    infos: Mutex<HashMap<NsKey, (String, Arc<PodInfo>)>>,
    pub daemonsets: BTreeMap<NsKey, DaemonSet>,
    pub pdbs: BTreeMap<NsKey, PodDisruptionBudget>,
    /// When a pod was last bound to or removed from each node (consolidateAfter's clock),
    /// persisted in NodeClaim status.lastPodEventTime by [`super::pod_events`].
    pub pod_events: BTreeMap<String, Timestamp>,
    /// Bumped whenever the set of unschedulable pending pods changes (the batcher's signal).
    pub pending_seq: u64,
    /// Names of NodeClaims that changed, or whose Node did, since their consumers (the
    /// lifecycle loop and the startup taint gates) last took them: they look at what moved,
    /// not at the whole fleet.
    touched_claims: Touched,
    /// Nodes whose Ready condition is there and not True, with their provider IDs: node
    /// repair's candidates, so that a healthy fleet costs it no pass over every claim.
    not_ready: BTreeMap<String, Option<String>>,
    /// The claims (not being deleted) that name each Node: repair starts from the few
    /// Nodes not Ready, not from every claim of the fleet, every round.
    claims_by_node: ClaimsByNode,
    /// NodeClaims being deleted or marked for disruption and not yet drained: termination's
    /// work list, kept here so that it does not scan every claim every tick.
    terminating: BTreeSet<String>,
    /// NodeClaims not being deleted and not Registered: the only ones the registration
    /// timeout can delete, so its sweep does not look at every registered claim.
    unregistered: BTreeSet<String>,
    /// NodeClaims not being deleted that carry an `expireAfter`: expiration's candidates,
    /// so that its round (every 10 s) does not walk every claim of the fleet (3.5 % of the
    /// 10,000-host day, whose claims have none).
    expiring: BTreeSet<String>,
    /// NodeClaim name by `status.providerID`, to map a Node change to its claim.
    claims_by_provider: BTreeMap<String, String>,
    /// The node classes this controller owns (`--node-classes`): only NodePools and
    /// NodeClaims of those enter the state, so that no controller of the layer provisions
    /// with, disrupts or terminates another shard's.
    pub shard: crate::provider::shard::Shard,
    /// Kinds whose first list arrived.
    pub synced: u8,
    /// Bumped after every watch event applied: a controller whose output depends on the state
    /// alone skips a round when it has not moved.
    pub changes: u64,
    /// Bumped by [`ClusterState::observe_claim`], which changes the NodeClaims before their
    /// watch event arrives (and so before `changes` moves).
    observed: u64,
}

const KINDS: u8 = 6;

/// One set of touched NodeClaim names per consumer: each takes its own.
#[derive(Default, Debug)]
struct Touched {
    lifecycle: BTreeSet<String>,
    gates: BTreeSet<String>,
}

impl Touched {
    fn insert(&mut self, name: String) {
        self.gates.insert(name.clone());
        self.lifecycle.insert(name);
    }

    fn extend(&mut self, names: impl IntoIterator<Item = String>) {
        for n in names {
            self.insert(n);
        }
    }
}

/// Whether `a` was created before `b` (both timestamps known): a claim's Node never is.
pub fn older_than(a: &kube::api::ObjectMeta, b: &kube::api::ObjectMeta) -> bool {
    match (&a.creation_timestamp, &b.creation_timestamp) {
        (Some(a), Some(b)) => a.0 < b.0,
        _ => false,
    }
}

impl Inner {
    pub fn synced(&self) -> bool {
        self.synced >= KINDS
    }

    /// Pods bound to `node`.
    pub fn pods_on<'a>(&'a self, node: &'a str) -> impl Iterator<Item = &'a Pod> + 'a {
        self.pods
            .values()
            .filter(move |p| pods::node_name(p) == Some(node))
    }

    /// The Node of a NodeClaim: by `status.nodeName`, else by provider ID.
    pub fn node_of(&self, nc: &NodeClaim) -> Option<&Node> {
        let status = nc.status.as_ref()?;
        if let Some(n) = status.node_name.as_ref().and_then(|n| self.nodes.get(n)) {
            return Some(&**n);
        }
        let pid = status.provider_id.as_deref().filter(|p| !p.is_empty())?;
        // Of the Nodes with the claim's provider ID, the one it owns, else the one named
        // after it, else one no claim owns; never one another claim owns (an earlier claim
        // of the same machine whose Node is still there), nor one created before the claim
        // (an earlier claim's, left behind: its old NotReady made repair delete a fresh
        // claim, seed 9437).
        let uid = nc.metadata.uid.as_deref();
        let claim = nc.metadata.name.as_deref();
        (self.nodes_by_provider.get(pid).into_iter().flatten())
            .filter_map(|name| {
                let node: &Node = self.nodes.get(name)?;
                if older_than(&node.metadata, &nc.metadata) {
                    return None;
                }
                let owner = (node.metadata.owner_references.iter().flatten())
                    .find(|o| o.kind == "NodeClaim")
                    .map(|o| o.uid.as_str());
                let rank = match owner {
                    Some(o) if Some(o) == uid => 0,
                    Some(_) => return None,
                    None if Some(name.as_str()) == claim => 1,
                    None => 2,
                };
                Some((rank, node))
            })
            .min_by_key(|(rank, _)| *rank)
            .map(|(_, node)| node)
    }

    /// `PodInfo::new(p)`, kept per pod and resourceVersion for a pod this view holds (a pod
    /// without a resourceVersion, or one the view does not hold as it is, is read afresh).
    pub fn pod_info(&self, p: &Pod) -> Arc<PodInfo> {
        let key = ns_key(p);
        let rv = p.metadata.resource_version.as_deref();
        let held = self
            .pods
            .get(&key)
            .map(|q| q.metadata.resource_version.as_deref());
        let (Some(rv), true) = (rv, held == Some(rv)) else {
            return Arc::new(PodInfo::new(p));
        };
        let mut infos = self.infos.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((at, info)) = infos.get(&key)
            && at == rv
            && info.uid.as_str() == p.metadata.uid.as_deref().unwrap_or_default()
        {
            return info.clone();
        }
        let info = Arc::new(PodInfo::new(p));
        infos.insert(key, (rv.to_string(), info.clone()));
        info
    }

    /// Every change to this view so far: watch events, and NodeClaims this controller wrote
    /// and recorded ahead of their events. The same version is the same view.
    pub fn version(&self) -> (u64, u64) {
        (self.changes, self.observed)
    }

    /// Names of NodeClaims neither being deleted nor Registered (see `unregistered`).
    pub fn unregistered_claims(&self) -> &BTreeSet<String> {
        &self.unregistered
    }

    /// Names of NodeClaims not being deleted that have `spec.expireAfter` (see `expiring`).
    pub fn expiring_claims(&self) -> &BTreeSet<String> {
        &self.expiring
    }

    /// The names of the claims (not being deleted) whose `status.nodeName` is `node`.
    pub fn claims_on_node<'a>(&'a self, node: &str) -> impl Iterator<Item = &'a String> + 'a {
        self.claims_by_node.by_name.get(node).into_iter().flatten()
    }

    /// The claims (not being deleted) that name a Node whose Ready condition is there and
    /// not True, by `status.nodeName` or provider ID, in name order: node repair's candidates,
    /// a superset of the claims whose [`Inner::node_of`] is such a Node.
    pub fn repair_candidates(&self) -> Vec<&Arc<NodeClaim>> {
        let index = &self.claims_by_node;
        let mut names: BTreeSet<&String> = BTreeSet::new();
        for (node, pid) in &self.not_ready {
            names.extend(index.by_name.get(node).into_iter().flatten());
            let by_pid = pid.as_ref().and_then(|p| index.by_pid.get(p));
            names.extend(by_pid.into_iter().flatten());
        }
        names
            .into_iter()
            .filter_map(|n| self.nodeclaims.get(n))
            .collect()
    }

    /// The NodeClaim whose node is `node` (by nodeName or provider ID).
    pub fn claim_of_node(&self, node: &Node) -> Option<&NodeClaim> {
        let name = node.metadata.name.as_deref()?;
        let pid = node.spec.as_ref().and_then(|s| s.provider_id.as_deref());
        self.nodeclaims.values().map(|nc| &**nc).find(|nc| {
            nc.status.as_ref().is_some_and(|s| {
                s.node_name.as_deref() == Some(name)
                    || (pid.is_some_and(|p| !p.is_empty()) && s.provider_id.as_deref() == pid)
            })
        })
    }
}

/// Shared handle to the view.
#[derive(Clone)]
pub struct ClusterState {
    inner: Arc<RwLock<Inner>>,
    changed: Arc<Notify>,
    clock: Clock,
}

impl ClusterState {
    pub fn new(clock: Clock) -> Self {
        Self::of_shard(clock, Default::default())
    }

    /// The state of a shard's NodePools and NodeClaims (`--node-classes`).
    pub fn of_shard(clock: Clock, shard: crate::provider::shard::Shard) -> Self {
        ClusterState {
            inner: Arc::new(RwLock::new(Inner {
                shard,
                ..Inner::default()
            })),
            changed: Arc::new(Notify::new()),
            clock,
        }
    }

    /// The state's clock's now.
    pub fn now(&self) -> Timestamp {
        self.clock.now()
    }

    pub fn read(&self) -> RwLockReadGuard<'_, Inner> {
        self.inner.read().unwrap_or_else(|p| p.into_inner())
    }

    fn write(&self) -> RwLockWriteGuard<'_, Inner> {
        self.inner.write().unwrap_or_else(|p| p.into_inner())
    }

    /// Resolves after the next change of any watched kind.
    pub async fn changed(&self) {
        self.changed.notified().await;
    }

    pub fn pending_seq(&self) -> u64 {
        self.read().pending_seq
    }

    /// The NodeClaims termination has work on (see `Inner::terminating`), copied.
    pub fn terminating_claims(&self) -> Vec<Arc<NodeClaim>> {
        let st = self.read();
        st.terminating
            .iter()
            .filter_map(|n| st.nodeclaims.get(n).cloned())
            .collect()
    }

    /// The NodeClaims touched since the last call (see `Inner::touched_claims`).
    pub fn take_touched_claims(&self) -> BTreeSet<String> {
        std::mem::take(&mut self.write().touched_claims.lifecycle)
    }

    /// The NodeClaims touched since the startup taint gates last asked.
    pub fn take_touched_gates(&self) -> BTreeSet<String> {
        std::mem::take(&mut self.write().touched_claims.gates)
    }

    /// Record a NodeClaim this controller just wrote, before its watch event arrives, so that
    /// the next provisioning round already counts it (never provision a batch twice).
    pub fn observe_claim(&self, nc: NodeClaim) {
        let Some(name) = nc.metadata.name.clone() else {
            return;
        };
        let mut st = self.write();
        let newer = st
            .nodeclaims
            .get(&name)
            .is_none_or(|old| rv(&**old) <= rv(&nc));
        if newer {
            index_claim(&mut st, &nc);
            st.touched_claims.insert(name.clone());
            st.nodeclaims.insert(name.clone(), Arc::new(nc));
            track_claim(&mut st, &name);
            st.observed += 1;
        }
    }

    /// Start one watch per kind. The tasks run until aborted.
    pub fn start<C: Cluster>(&self, cluster: &C) -> Vec<JoinHandle<()>> {
        vec![
            self.track::<NodePool, _>(cluster.watch(None), apply_nodepool),
            self.track::<NodeClaim, _>(cluster.watch_shared(None), apply_nodeclaim),
            self.track::<Node, _>(cluster.watch_shared(None), apply_node),
            self.track::<Pod, _>(cluster.watch(None), apply_pod),
            self.track::<DaemonSet, _>(cluster.watch(None), apply_daemonset),
            self.track::<PodDisruptionBudget, _>(cluster.watch(None), apply_pdb),
        ]
    }

    /// Apply a watch of kind `K` (objects `V`: `K` or `Arc<K>`) to the state.
    fn track<K: Object, V: Send + 'static>(
        &self,
        mut stream: WatchStream<V>,
        apply: fn(&mut Inner, Change<V>, Timestamp),
    ) -> JoinHandle<()> {
        let me = self.clone();
        tokio::spawn(async move {
            let mut first = true;
            while let Some(ev) = stream.next().await {
                let ev = match ev {
                    Ok(ev) => ev,
                    Err(e) => {
                        tracing::warn!(kind = %K::kind(&()), error = %e, "watch error");
                        continue;
                    }
                };
                let now = me.clock.now();
                {
                    let mut st = me.write();
                    match ev {
                        WatchEvent::Restarted(all) => {
                            apply(&mut st, Change::Reset(all), now);
                            if first {
                                st.synced += 1;
                                first = false;
                            }
                        }
                        WatchEvent::Applied(o) => apply(&mut st, Change::Upsert(o), now),
                        WatchEvent::Deleted(o) => apply(&mut st, Change::Delete(o), now),
                    }
                    st.changes += 1;
                }
                me.changed.notify_waiters();
            }
        })
    }
}

pub enum Change<K> {
    Reset(Vec<K>),
    Upsert(K),
    Delete(K),
}

fn rv<K: kube::Resource>(o: &K) -> u64 {
    o.meta()
        .resource_version
        .as_deref()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0)
}

fn name_of<K: kube::Resource>(o: &K) -> String {
    o.meta().name.clone().unwrap_or_default()
}

fn ns_key<K: kube::Resource>(o: &K) -> NsKey {
    (o.meta().namespace.clone().unwrap_or_default(), name_of(o))
}

/// Apply a change to a map by name; `V` is the object `K` or an `Arc<K>`.
fn apply_named<K: kube::Resource, V: Borrow<K>>(
    map: &mut BTreeMap<String, V>,
    change: Change<V>,
    keep: impl Fn(&K) -> bool,
) {
    match change {
        Change::Reset(all) => {
            *map = all
                .into_iter()
                .filter(|o| keep(o.borrow()))
                .map(|o| (name_of(o.borrow()), o))
                .collect();
        }
        Change::Upsert(o) => {
            let name = name_of(o.borrow());
            if !keep(o.borrow()) {
                map.remove(&name);
            } else if map
                .get(&name)
                .is_none_or(|old| rv(old.borrow()) <= rv(o.borrow()))
            {
                map.insert(name, o);
            }
        }
        Change::Delete(o) => {
            map.remove(&name_of(o.borrow()));
        }
    }
}

fn apply_namespaced<K: kube::Resource + Clone>(map: &mut BTreeMap<NsKey, K>, change: Change<K>) {
    match change {
        Change::Reset(all) => *map = all.into_iter().map(|o| (ns_key(&o), o)).collect(),
        Change::Upsert(o) => {
            map.insert(ns_key(&o), o);
        }
        Change::Delete(o) => {
            map.remove(&ns_key(&o));
        }
    }
}

fn apply_nodepool(st: &mut Inner, c: Change<NodePool>, _: Timestamp) {
    let shard = st.shard.clone();
    apply_named(&mut st.nodepools, c, |np| shard.owns_pool(np));
}

fn apply_nodeclaim(st: &mut Inner, c: Change<Arc<NodeClaim>>, _: Timestamp) {
    let shard = st.shard.clone();
    match &c {
        Change::Reset(all) => {
            st.claims_by_provider.clear();
            st.touched_claims.extend(st.nodeclaims.keys().cloned());
            for nc in all.iter().filter(|nc| shard.owns_claim(nc)) {
                index_claim(st, nc);
                st.touched_claims.insert(name_of(&**nc));
            }
        }
        // A stale event (older than what we hold) is dropped by apply_named below.
        Change::Upsert(nc)
            if st
                .nodeclaims
                .get(&name_of(&**nc))
                .is_some_and(|old| rv(&**old) > rv(&**nc)) => {}
        Change::Upsert(nc) | Change::Delete(nc) => {
            let name = name_of(&**nc);
            let old = st.nodeclaims.get(&name).and_then(|old| claim_provider(old));
            if let Some(pid) = old.map(str::to_string)
                && st.claims_by_provider.get(&pid) == Some(&name)
            {
                st.claims_by_provider.remove(&pid);
            }
            if matches!(c, Change::Upsert(_)) && shard.owns_claim(nc) {
                index_claim(st, nc);
            }
            st.touched_claims.insert(name);
        }
    }
    let changed = match &c {
        Change::Reset(_) => None,
        Change::Upsert(nc) | Change::Delete(nc) => Some(name_of(&**nc)),
    };
    apply_named(&mut st.nodeclaims, c, |nc| shard.owns_claim(nc));
    match changed {
        Some(name) => track_claim(st, &name),
        None => {
            let all: Vec<String> = st.nodeclaims.keys().cloned().collect();
            st.terminating.clear();
            st.unregistered.clear();
            st.expiring.clear();
            st.claims_by_node.clear();
            for name in all {
                track_claim(st, &name);
            }
        }
    }
}

/// Keep `name` in the termination work list exactly while it has termination work, and in
/// the unregistered set exactly while it is neither being deleted nor Registered, and in the
/// expiring set exactly while it is not being deleted and has an `expireAfter`.
fn track_claim(st: &mut Inner, name: &str) {
    let nc = st.nodeclaims.get(name);
    let work = nc.is_some_and(|nc| {
        (nc.metadata.deletion_timestamp.is_some() || super::termination::is_marked(nc))
            && !super::termination::is_drained(nc)
    });
    let unregistered = nc.is_some_and(|nc| {
        nc.metadata.deletion_timestamp.is_none()
            && !super::lifecycle::condition_true(nc, "Registered")
    });
    let expiring = nc.is_some_and(|nc| {
        nc.metadata.deletion_timestamp.is_none() && nc.spec.expire_after.is_some()
    });
    keep(&mut st.terminating, name, work);
    keep(&mut st.unregistered, name, unregistered);
    keep(&mut st.expiring, name, expiring);
    st.claims_by_node.set(name, nc.map(|nc| &**nc));
}

fn keep(set: &mut BTreeSet<String>, name: &str, member: bool) {
    if !member {
        set.remove(name);
    } else if !set.contains(name) {
        set.insert(name.to_string());
    }
}

fn claim_provider(nc: &NodeClaim) -> Option<&str> {
    nc.status
        .as_ref()?
        .provider_id
        .as_deref()
        .filter(|p| !p.is_empty())
}

fn index_claim(st: &mut Inner, nc: &NodeClaim) {
    if let Some(pid) = claim_provider(nc) {
        st.claims_by_provider.insert(pid.to_string(), name_of(nc));
    }
}

fn apply_node(st: &mut Inner, c: Change<Arc<Node>>, _: Timestamp) {
    match &c {
        Change::Reset(all) => {
            st.nodes_by_provider.clear();
            for n in all {
                if let Some(pid) = provider_of(n) {
                    (st.nodes_by_provider.entry(pid.to_string()).or_default())
                        .insert(name_of(&**n));
                }
            }
            st.touched_claims.extend(st.nodeclaims.keys().cloned());
        }
        // A stale event (older than what we hold) is dropped by apply_named below.
        Change::Upsert(n)
            if st
                .nodes
                .get(&name_of(&**n))
                .is_some_and(|old| rv(&**old) > rv(&**n)) => {}
        Change::Upsert(n) | Change::Delete(n) => {
            let name = name_of(&**n);
            let old = st
                .nodes
                .get(&name)
                .and_then(|n| provider_of(n))
                .map(str::to_string);
            if let Some(pid) = &old
                && let Some(names) = st.nodes_by_provider.get_mut(pid)
            {
                names.remove(&name);
                if names.is_empty() {
                    st.nodes_by_provider.remove(pid);
                }
            }
            if let (Change::Upsert(_), Some(pid)) = (&c, provider_of(n)) {
                (st.nodes_by_provider.entry(pid.to_string()).or_default()).insert(name.clone());
            }
            // The claim of this Node: named alike (Static), or by provider ID (Adopt).
            let by_pid = [old.as_deref(), provider_of(n)]
                .into_iter()
                .flatten()
                .filter_map(|pid| st.claims_by_provider.get(pid).cloned())
                .collect::<Vec<_>>();
            st.touched_claims.extend(by_pid);
            if st.nodeclaims.contains_key(&name) {
                st.touched_claims.insert(name);
            }
        }
    }
    let changed = match &c {
        Change::Reset(_) => None,
        Change::Upsert(n) | Change::Delete(n) => Some(name_of(&**n)),
    };
    apply_named(&mut st.nodes, c, |_: &Node| true);
    match changed {
        Some(name) => track_not_ready(st, &name),
        None => {
            st.not_ready.clear();
            let all: Vec<String> = st.nodes.keys().cloned().collect();
            for name in all {
                track_not_ready(st, &name);
            }
        }
    }
}

fn track_not_ready(st: &mut Inner, name: &str) {
    let not_ready = st
        .nodes
        .get(name)
        .filter(|n| super::lifecycle::node_ready(n).is_some_and(|c| c.status != "True"));
    match not_ready {
        Some(n) => {
            let pid = provider_of(n).map(str::to_string);
            st.not_ready.insert(name.to_string(), pid);
        }
        None => {
            st.not_ready.remove(name);
        }
    }
}

/// NodeClaim names by the Node name (`status.nodeName`) and by the provider ID
/// (`status.providerID`) they carry; a claim being deleted is in neither. Sets, not single
/// names: a host claimed again carries its provider ID in the new claim while the old one
/// may still be there.
#[derive(Default, Debug)]
struct ClaimsByNode {
    /// What each claim is filed under now: (node name, provider ID).
    of: BTreeMap<String, (Option<String>, Option<String>)>,
    by_name: BTreeMap<String, BTreeSet<String>>,
    by_pid: BTreeMap<String, BTreeSet<String>>,
}

impl ClaimsByNode {
    /// File `claim` as `nc` now is (`None`: gone).
    fn set(&mut self, claim: &str, nc: Option<&NodeClaim>) {
        let refs = nc
            .filter(|nc| nc.metadata.deletion_timestamp.is_none())
            .and_then(|nc| nc.status.as_ref())
            .map(|s| (s.node_name.clone(), s.provider_id.clone()))
            .filter(|r| r.0.is_some() || r.1.is_some());
        if self.of.get(claim) == refs.as_ref() {
            return;
        }
        if let Some((name, pid)) = self.of.remove(claim) {
            unfile(&mut self.by_name, name, claim);
            unfile(&mut self.by_pid, pid, claim);
        }
        if let Some((name, pid)) = refs {
            for (map, key) in [(&mut self.by_name, &name), (&mut self.by_pid, &pid)] {
                if let Some(k) = key {
                    map.entry(k.clone()).or_default().insert(claim.to_string());
                }
            }
            self.of.insert(claim.to_string(), (name, pid));
        }
    }

    fn clear(&mut self) {
        *self = ClaimsByNode::default();
    }
}

/// Take `claim` out of the set filed under `key`, and the set out of `map` once empty.
pub(crate) fn unfile(
    map: &mut BTreeMap<String, BTreeSet<String>>,
    key: Option<String>,
    claim: &str,
) {
    if let Some(k) = key
        && let Some(set) = map.get_mut(&k)
    {
        set.remove(claim);
        if set.is_empty() {
            map.remove(&k);
        }
    }
}

fn provider_of(n: &Node) -> Option<&str> {
    n.spec
        .as_ref()?
        .provider_id
        .as_deref()
        .filter(|p| !p.is_empty())
}

fn apply_daemonset(st: &mut Inner, c: Change<DaemonSet>, _: Timestamp) {
    apply_namespaced(&mut st.daemonsets, c);
}

fn apply_pdb(st: &mut Inner, c: Change<PodDisruptionBudget>, _: Timestamp) {
    apply_namespaced(&mut st.pdbs, c);
}

fn apply_pod(st: &mut Inner, c: Change<Pod>, now: Timestamp) {
    let pending_changed;
    match &c {
        Change::Reset(all) => {
            pending_changed = true;
            // S59: a (re)list is not a pod event: a restart must not restart consolidateAfter.
            // The bound pods' binding times are (core's podevents controller takes them too);
            // the events persisted in NodeClaim status.lastPodEventTime cover the rest.
            for p in all
                .iter()
                .filter(|p| pods::counts_on_node(p) && !pods::is_daemonset_pod(p))
            {
                if let (Some(n), Some(at)) = (pods::node_name(p), pods::scheduled_at(p)) {
                    let e = st.pod_events.entry(n.to_string()).or_insert(at);
                    *e = (*e).max(at);
                }
            }
        }
        Change::Upsert(p) => {
            let old = st.pods.get(&ns_key(p));
            let was_pending = old.is_some_and(pods::is_provisionable);
            let is_pending = pods::is_provisionable(p);
            pending_changed = is_pending || was_pending != is_pending;
            let old_node = old.and_then(pods::node_name).map(str::to_string);
            let old_live = old.is_some_and(pods::counts_on_node);
            // DaemonSet pods are no pod events (core's podevents controller skips them).
            if let Some(n) = pods::node_name(p)
                && !pods::is_daemonset_pod(p)
                && (old_node.as_deref() != Some(n) || old_live != pods::counts_on_node(p))
            {
                st.pod_events.insert(n.to_string(), now);
            }
        }
        Change::Delete(p) => {
            pending_changed = pods::is_provisionable(p);
            if let Some(n) = pods::node_name(p).filter(|_| !pods::is_daemonset_pod(p)) {
                st.pod_events.insert(n.to_string(), now);
            }
        }
    }
    let infos = st.infos.get_mut().unwrap_or_else(|e| e.into_inner());
    match &c {
        Change::Reset(_) => infos.clear(),
        Change::Upsert(p) | Change::Delete(p) => {
            infos.remove(&ns_key(p));
        }
    }
    apply_namespaced(&mut st.pods, c);
    if pending_changed {
        st.pending_seq += 1;
    }
}

#[cfg(test)]
#[path = "state_tests.rs"]
mod tests;
