//! Cluster state: the karpenter layer's in-memory view of our NodePools and NodeClaims, every
//! Node, Pod (all namespaces), DaemonSet and PodDisruptionBudget, kept current by watches.
//! Every controller of the layer reads from here instead of listing the API.

use std::collections::BTreeMap;
use std::sync::{Arc, RwLock, RwLockReadGuard, RwLockWriteGuard};

use futures::StreamExt;
use jiff::Timestamp;
use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use tokio::sync::Notify;
use tokio::task::JoinHandle;

use super::pods;
use crate::api::{NodeClaim, NodePool};
use crate::clock::Clock;
use crate::k8s::{Cluster, Object, WatchEvent};

/// `namespace/name`.
pub type NsKey = (String, String);

#[derive(Default, Debug)]
pub struct Inner {
    /// NodePools whose nodeClassRef is an SSHNodeClass, by name.
    pub nodepools: BTreeMap<String, NodePool>,
    /// NodeClaims whose nodeClassRef is an SSHNodeClass, by name.
    pub nodeclaims: BTreeMap<String, NodeClaim>,
    /// Every Node (pods of ours may fit on foreign nodes), by name.
    pub nodes: BTreeMap<String, Node>,
    pub pods: BTreeMap<NsKey, Pod>,
    pub daemonsets: BTreeMap<NsKey, DaemonSet>,
    pub pdbs: BTreeMap<NsKey, PodDisruptionBudget>,
    /// When a pod was last bound to or removed from each node (consolidateAfter's clock).
    pub pod_events: BTreeMap<String, Timestamp>,
    /// Bumped whenever the set of unschedulable pending pods changes (the batcher's signal).
    pub pending_seq: u64,
    /// Bumped on every NodeClaim or Node change (the lifecycle loop's signal).
    pub claims_seq: u64,
    /// Kinds whose first list arrived.
    pub synced: u8,
}

const KINDS: u8 = 6;

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
            return Some(n);
        }
        let pid = status.provider_id.as_deref().filter(|p| !p.is_empty())?;
        self.nodes
            .values()
            .find(|n| n.spec.as_ref().and_then(|s| s.provider_id.as_deref()) == Some(pid))
    }

    /// The NodeClaim whose node is `node` (by nodeName or provider ID).
    pub fn claim_of_node(&self, node: &Node) -> Option<&NodeClaim> {
        let name = node.metadata.name.as_deref()?;
        let pid = node.spec.as_ref().and_then(|s| s.provider_id.as_deref());
        self.nodeclaims.values().find(|nc| {
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
        ClusterState {
            inner: Arc::new(RwLock::new(Inner::default())),
            changed: Arc::new(Notify::new()),
            clock,
        }
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
            .is_none_or(|old| rv(old) <= rv(&nc));
        if newer {
            st.claims_seq += 1;
            st.nodeclaims.insert(name, nc);
        }
    }

    /// Start one watch per kind. The tasks run until aborted.
    pub fn start<C: Cluster>(&self, cluster: &C) -> Vec<JoinHandle<()>> {
        vec![
            self.track::<C, NodePool>(cluster, apply_nodepool),
            self.track::<C, NodeClaim>(cluster, apply_nodeclaim),
            self.track::<C, Node>(cluster, apply_node),
            self.track::<C, Pod>(cluster, apply_pod),
            self.track::<C, DaemonSet>(cluster, apply_daemonset),
            self.track::<C, PodDisruptionBudget>(cluster, apply_pdb),
        ]
    }

    fn track<C: Cluster, K: Object>(
        &self,
        cluster: &C,
        apply: fn(&mut Inner, Change<K>, Timestamp),
    ) -> JoinHandle<()> {
        let mut stream = cluster.watch::<K>(None);
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

fn apply_named<K: kube::Resource + Clone>(
    map: &mut BTreeMap<String, K>,
    change: Change<K>,
    keep: fn(&K) -> bool,
) {
    match change {
        Change::Reset(all) => {
            *map = all
                .into_iter()
                .filter(keep)
                .map(|o| (name_of(&o), o))
                .collect();
        }
        Change::Upsert(o) => {
            let name = name_of(&o);
            if !keep(&o) {
                map.remove(&name);
            } else if map.get(&name).is_none_or(|old| rv(old) <= rv(&o)) {
                map.insert(name, o);
            }
        }
        Change::Delete(o) => {
            map.remove(&name_of(&o));
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
    apply_named(&mut st.nodepools, c, NodePool::is_ours);
}

fn apply_nodeclaim(st: &mut Inner, c: Change<NodeClaim>, _: Timestamp) {
    st.claims_seq += 1;
    apply_named(&mut st.nodeclaims, c, NodeClaim::is_ours);
}

fn apply_node(st: &mut Inner, c: Change<Node>, _: Timestamp) {
    st.claims_seq += 1;
    apply_named(&mut st.nodes, c, |_| true);
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
            for p in all {
                if let Some(n) = pods::node_name(p) {
                    st.pod_events.insert(n.to_string(), now);
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
            if let Some(n) = pods::node_name(p)
                && (old_node.as_deref() != Some(n) || old_live != pods::counts_on_node(p))
            {
                st.pod_events.insert(n.to_string(), now);
            }
        }
        Change::Delete(p) => {
            pending_changed = pods::is_provisionable(p);
            if let Some(n) = pods::node_name(p) {
                st.pod_events.insert(n.to_string(), now);
            }
        }
    }
    apply_namespaced(&mut st.pods, c);
    if pending_changed {
        st.pending_seq += 1;
    }
}
