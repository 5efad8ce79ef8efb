//! What every actor is handed: the ports, the clock, the settings and the shared limits.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use k8s_openapi::api::core::v1::Node;
use std::sync::{Arc, Mutex, MutexGuard, RwLock};

use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;

use crate::api::{ClaimRef, SSHHost};
use crate::clock::Clock;
use crate::k8s::Cluster;
use crate::ssh::Transport;

use super::Config;
use super::limits::Limits;

pub struct Context<C: Cluster, T: Transport> {
    pub cluster: C,
    pub transport: Arc<T>,
    pub clock: Clock,
    pub config: Arc<Config>,
    pub limits: Limits,
    /// Latest SSHHost objects as the supervisor's watch delivered them, by name. Read by the
    /// router to choose hosts; written only by the supervisor. Ordered for determinism.
    pub hosts: HostView,
    /// UIDs of the NodeClaims that exist, as the router's watch delivered them.
    pub claims: ClaimView,
    /// Node names by InternalIP, as the supervisor's Node watch delivered them.
    pub node_addresses: NodeAddressView,
    pub metrics: super::metrics::SharedMetrics,
    /// Open NodeClaim lifecycle traces, shared by router, host actors and karpenter layer.
    pub lifecycles: crate::telemetry::Lifecycles,
    /// Recent launch outcomes per node class (S63's class-level pause).
    pub launches: super::launches::LaunchLedger,
    /// Every host actor's next periodic probe.
    pub probe_clock: super::probe_clock::ProbeClock,
    /// Host key Secrets as last read, shared by the host actors\' probe targets.
    pub keys: super::key_cache::KeyCache,
    /// The node classes this controller owns (`--node-classes`; all by default) and the
    /// selectors of every class: which hosts, NodePools and NodeClaims are its business.
    pub shard: super::shard::Shard,
    /// The one random source (token values, jitter): seeded, so a simulation run replays.
    rng: Arc<Mutex<ChaCha8Rng>>,
}

impl<C: Cluster, T: Transport> Clone for Context<C, T> {
    fn clone(&self) -> Self {
        Context {
            cluster: self.cluster.clone(),
            transport: self.transport.clone(),
            clock: self.clock.clone(),
            config: self.config.clone(),
            limits: self.limits.clone(),
            hosts: self.hosts.clone(),
            claims: self.claims.clone(),
            node_addresses: self.node_addresses.clone(),
            metrics: self.metrics.clone(),
            lifecycles: self.lifecycles.clone(),
            launches: self.launches.clone(),
            probe_clock: self.probe_clock.clone(),
            keys: self.keys.clone(),
            shard: self.shard.clone(),
            rng: self.rng.clone(),
        }
    }
}

impl<C: Cluster, T: Transport> Context<C, T> {
    /// `seed`: `Some` in the simulation and tests, `None` in production (OS entropy).
    pub fn new(
        cluster: C,
        transport: Arc<T>,
        clock: Clock,
        config: Config,
        seed: Option<u64>,
    ) -> Self {
        let limits = Limits::new(&config);
        let shard = super::shard::Shard::of(config.node_classes.iter().cloned());
        let rng = match seed {
            Some(s) => ChaCha8Rng::seed_from_u64(s),
            None => ChaCha8Rng::from_os_rng(),
        };
        Context {
            cluster,
            transport,
            clock,
            config: Arc::new(config),
            limits,
            hosts: HostView::default(),
            claims: ClaimView::default(),
            node_addresses: NodeAddressView::default(),
            metrics: Arc::new(super::metrics::Metrics::new()),
            lifecycles: Default::default(),
            launches: Default::default(),
            probe_clock: Default::default(),
            keys: Default::default(),
            shard,
            rng: Arc::new(Mutex::new(rng)),
        }
    }

    pub fn rng(&self) -> MutexGuard<'_, ChaCha8Rng> {
        self.rng.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn pool_ns(&self) -> &str {
        &self.config.pool_namespace
    }
}

/// The NodeClaim UIDs the router's watch has seen and not yet seen deleted, each with whether
/// it is being deleted. It lets the probe of a busy host skip the API read that confirms its
/// claim still exists (S26): a UID present here is taken as live; an absent one is confirmed
/// against the API. A view that lags behind a deletion costs one probe interval at most, and
/// not even that, as the router's handling of the deletion sends the holder a probe right
/// after updating it. A running join waits on [`ClaimView::notified`] to stop when its claim
/// goes (S26).
///
/// A `DashMap`: every host actor reads it on each probe while the router writes it, and its
/// sharded locks keep ten thousand readers from queueing behind one lock (or a writer).
/// Hashed with foldhash (seeded per process): the std hasher, SipHash, cost a probe more than
/// the lookup it hashed for.
#[derive(Clone)]
pub struct ClaimView {
    uids: Arc<dashmap::DashMap<String, bool, foldhash::fast::RandomState>>,
    /// One `Notify`, not a `watch` channel: a watch wakes its waiters in an order drawn from a
    /// thread's random source, and two joins stopped in one instant then went on in another
    /// order in each run of the same seed; `notify_waiters` wakes them in the order they
    /// began waiting.
    changed: Arc<tokio::sync::Notify>,
}

impl Default for ClaimView {
    fn default() -> Self {
        ClaimView {
            uids: Arc::default(),
            changed: Arc::new(tokio::sync::Notify::new()),
        }
    }
}

impl ClaimView {
    fn bump(&self) {
        self.changed.notify_waiters();
    }

    /// A claim seen by the watch, and whether it carries a deletion timestamp.
    pub fn insert(&self, uid: &str, deleting: bool) {
        if self.uids.get(uid).map(|d| *d) != Some(deleting) {
            self.uids.insert(uid.to_string(), deleting);
            self.bump();
        }
    }

    pub fn remove(&self, uid: &str) {
        if self.uids.remove(uid).is_some() {
            self.bump();
        }
    }

    /// The view after a relist: UIDs in both stay put (a reader never misses one), the ones
    /// gone are removed and the new ones added.
    pub fn replace_all<'a>(&self, uids: impl IntoIterator<Item = (&'a str, bool)>) {
        let keep: HashMap<&str, bool> = uids.into_iter().collect();
        self.uids.retain(|u, _| keep.contains_key(u.as_str()));
        for (u, d) in keep {
            if self.uids.get(u).map(|x| *x) != Some(d) {
                self.uids.insert(u.to_string(), d);
            }
        }
        self.bump();
    }

    pub fn contains(&self, uid: &str) -> bool {
        self.uids.contains_key(uid)
    }

    /// Present and not being deleted.
    pub fn live(&self, uid: &str) -> bool {
        self.uids.get(uid).map(|d| *d) == Some(false)
    }

    /// Resolves at the next insertion, deletion or deletion timestamp the view records after
    /// it was created and `enable`d (enable it before looking at the view, or a change between
    /// the look and the wait is missed).
    pub fn notified(&self) -> tokio::sync::futures::Notified<'_> {
        self.changed.notified()
    }
}

/// Which Nodes carry an InternalIP: the zombie guard's question (the Node a stray kubelet
/// registered), answered from the watch instead of a list of every Node. A hint only: a Node
/// is re-read before it is acted on, and a miss still asks the API (the watch may lag).
#[derive(Clone, Default)]
pub struct NodeAddressView {
    inner: Arc<RwLock<NodeAddresses>>,
}

#[derive(Default)]
struct NodeAddresses {
    by_ip: HashMap<String, BTreeSet<String>>,
    ips_of: HashMap<String, Vec<String>>,
}

impl NodeAddresses {
    fn remove(&mut self, name: &str) {
        for ip in self.ips_of.remove(name).unwrap_or_default() {
            if let Some(names) = self.by_ip.get_mut(&ip) {
                names.remove(name);
                if names.is_empty() {
                    self.by_ip.remove(&ip);
                }
            }
        }
    }

    fn upsert(&mut self, node: &Node) {
        let Some(name) = node.metadata.name.as_deref() else {
            return;
        };
        self.remove(name);
        let ips = internal_ips(node);
        for ip in &ips {
            self.by_ip
                .entry(ip.clone())
                .or_default()
                .insert(name.to_string());
        }
        self.ips_of.insert(name.to_string(), ips);
    }
}

/// A Node's InternalIP addresses.
pub fn internal_ips(node: &Node) -> Vec<String> {
    node.status
        .as_ref()
        .and_then(|s| s.addresses.as_ref())
        .map(|a| {
            a.iter()
                .filter(|a| a.type_ == "InternalIP")
                .map(|a| a.address.clone())
                .collect()
        })
        .unwrap_or_default()
}

impl NodeAddressView {
    fn write(&self) -> std::sync::RwLockWriteGuard<'_, NodeAddresses> {
        self.inner.write().unwrap_or_else(|p| p.into_inner())
    }

    pub fn upsert(&self, node: &Node) {
        self.write().upsert(node);
    }

    pub fn remove(&self, name: &str) {
        self.write().remove(name);
    }

    pub fn replace_all(&self, nodes: &[Node]) {
        let mut view = self.write();
        *view = NodeAddresses::default();
        for n in nodes {
            view.upsert(n);
        }
    }

    /// Names of the Nodes seen with this InternalIP, in name order.
    pub fn named_with_ip(&self, ip: &str) -> Vec<String> {
        self.inner
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .by_ip
            .get(ip)
            .map(|n| n.iter().cloned().collect())
            .unwrap_or_default()
    }
}

/// A read-mostly snapshot of the pool, kept current by the SSHHost watch and by the writes
/// of the controller itself, with an index from claim UID to host.
#[derive(Clone, Default)]
pub struct HostView {
    inner: Arc<RwLock<ViewInner>>,
}

#[derive(Default)]
struct ViewInner {
    /// Bumped on every change, so that passes over the whole pool can be skipped when nothing
    /// moved.
    version: u64,
    /// Bumped when a host is added or removed or its labels, usability, arch or capacity
    /// change: what node class selection and instance types are computed from.
    membership: u64,
    /// Shared, immutable copies: a snapshot of ten thousand hosts is ten thousand pointer
    /// copies, not ten thousand deep clones.
    hosts: BTreeMap<String, Arc<SSHHost>>,
    by_claim: BTreeMap<String, String>,
    /// How many hosts carry an install marker of each SSHJoinProfile: the profile finalizer's
    /// question, answered without a pass over the pool every resync.
    by_profile: BTreeMap<String, usize>,
    /// Whether the view was ever filled (the supervisor's first list, or any host put in):
    /// before that, an empty view says nothing about the pool.
    listed: bool,
}

/// Nothing a node class's selection or instance types read changed: labels (selector and
/// class), arch and capacity, hence usability too (it is read from those). Probes and claims
/// leave all of them alone.
fn same_offering(old: &SSHHost, new: &SSHHost) -> bool {
    fn arch(h: &SSHHost) -> Option<&String> {
        h.status.as_ref()?.observed_arch.as_ref()
    }
    fn observed(
        h: &SSHHost,
    ) -> Option<&BTreeMap<String, k8s_openapi::apimachinery::pkg::api::resource::Quantity>> {
        h.status.as_ref()?.observed_capacity.as_ref()
    }
    old.metadata.labels == new.metadata.labels
        && old.spec.capacity == new.spec.capacity
        && arch(old) == arch(new)
        && observed(old) == observed(new)
}

/// The SSHJoinProfile an install marker (`name@version`) names.
/// The SSHJoinProfile installed on a host (its install marker's name part).
pub fn installed_profile(host: &SSHHost) -> Option<&str> {
    let marker = host.status.as_ref()?.installed_profile.as_deref()?;
    marker.split('@').next()
}

impl ViewInner {
    fn insert(&mut self, host: Arc<SSHHost>) {
        let name = host.metadata.name.as_deref().unwrap_or_default();
        let old = self.hosts.get_mut(name);
        if !old.as_ref().is_some_and(|old| same_offering(old, &host)) {
            self.membership += 1;
        }
        // Most versions (a probe's stamp, a phase's progress) keep the claim and the install
        // marker: replace the host and leave the indexes be.
        let claim = host.claim().map(|c| c.uid.as_str());
        let indexed =
            claim.is_none_or(|uid| self.by_claim.get(uid).map(String::as_str) == Some(name));
        if let Some(old) = old
            && old.claim().map(|c| c.uid.as_str()) == claim
            && indexed
            && installed_profile(old) == installed_profile(&host)
        {
            *old = host;
            return;
        }
        let name = name.to_string();
        self.remove(&name);
        if let Some(c) = host.claim() {
            self.by_claim.insert(c.uid.clone(), name.clone());
        }
        if let Some(p) = installed_profile(&host) {
            *self.by_profile.entry(p.to_string()).or_default() += 1;
        }
        self.hosts.insert(name, host);
    }

    fn remove(&mut self, name: &str) {
        let Some(old) = self.hosts.remove(name) else {
            return;
        };
        if let Some(c) = old.claim()
            && self.by_claim.get(&c.uid).is_some_and(|h| h == name)
        {
            self.by_claim.remove(&c.uid);
        }
        if let Some(p) = installed_profile(&old)
            && let Some(n) = self.by_profile.get_mut(p)
        {
            *n -= 1;
            if *n == 0 {
                self.by_profile.remove(p);
            }
        }
    }
}

impl HostView {
    fn write(&self) -> std::sync::RwLockWriteGuard<'_, ViewInner> {
        self.inner.write().unwrap_or_else(|p| p.into_inner())
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, ViewInner> {
        self.inner.read().unwrap_or_else(|p| p.into_inner())
    }

    pub fn upsert(&self, host: impl Into<Arc<SSHHost>>) {
        let host = host.into();
        let name = host.metadata.name.clone().unwrap_or_default();
        let mut view = self.write();
        // Never go back in time: a stale event must not overwrite a newer write we saw. The
        // same resourceVersion is the same object: nothing to do.
        let newer = view.hosts.get(&name).is_none_or(|old| rv(old) < rv(&host));
        if newer {
            view.insert(host);
            view.version += 1;
            view.listed = true;
        }
    }

    /// Like [`HostView::upsert`], and returns the copy the view holds for this version so that
    /// a host's actor keeps the same allocation instead of a second one (~4 KiB per host).
    /// An object older than the view's is returned as it is, unshared.
    pub fn share(&self, host: impl Into<Arc<SSHHost>>) -> Arc<SSHHost> {
        let host = host.into();
        let name = host.metadata.name.clone().unwrap_or_default();
        let mut view = self.write();
        match view.hosts.get(&name) {
            Some(old) if rv(old) == rv(&host) => return old.clone(),
            Some(old) if rv(old) > rv(&host) => return host,
            _ => {}
        }
        view.insert(host.clone());
        view.version += 1;
        view.listed = true;
        host
    }

    pub fn remove(&self, name: &str) {
        let mut view = self.write();
        view.remove(name);
        view.version += 1;
        view.membership += 1;
    }

    pub fn replace_all(&self, hosts: Vec<Arc<SSHHost>>) {
        let mut view = self.write();
        let version = view.version + 1;
        let membership = view.membership + 1;
        *view = ViewInner::default();
        view.version = version;
        view.membership = membership;
        view.listed = true;
        for h in hosts {
            view.insert(h);
        }
    }

    /// Changes so far (any host added, updated or removed).
    pub fn version(&self) -> u64 {
        self.read().version
    }

    /// Whether the pool's hosts were listed yet: a router that finds no host in a view never
    /// filled must wait, not call the NodeClaim unsatisfiable (a controller taking over
    /// would otherwise delete every NodeClaim waiting for it).
    pub fn listed(&self) -> bool {
        self.read().listed
    }

    /// Whether the view holds `name` (without copying it).
    pub fn contains(&self, name: &str) -> bool {
        self.read().hosts.contains_key(name)
    }

    pub fn get(&self, name: &str) -> Option<SSHHost> {
        self.read().hosts.get(name).map(|h| SSHHost::clone(h))
    }

    /// The host whose claim carries this NodeClaim UID.
    pub fn holder(&self, claim_uid: &str) -> Option<String> {
        self.read().by_claim.get(claim_uid).cloned()
    }

    /// The host holding exactly this claim (UID and name), without copying any host.
    pub fn holder_of(&self, claim: &ClaimRef) -> Option<String> {
        let view = self.read();
        let name = view.by_claim.get(&claim.uid)?;
        // The index is by UID; the name must match too (a reused name is another claim).
        view.hosts
            .get(name)
            .filter(|h| h.claim() == Some(claim))
            .map(|_| name.clone())
    }

    /// Changes that can move a node class's selection or instance types: a host added or
    /// removed, or its labels, usability, arch or capacity changed. Status churn (probes,
    /// claims, installs) leaves it alone.
    pub fn membership_version(&self) -> u64 {
        self.read().membership
    }

    /// Whether any host carries an install marker of this SSHJoinProfile.
    pub fn profile_in_use(&self, profile: &str) -> bool {
        self.read().by_profile.contains_key(profile)
    }

    /// Every host, in name order, with the membership version it was taken at (read under
    /// the same lock: the same version always means the same hosts in the same order).
    pub fn snapshot_at(&self) -> (u64, Vec<Arc<SSHHost>>) {
        let view = self.read();
        (view.membership, view.hosts.values().cloned().collect())
    }

    /// Every host, in name order.
    pub fn snapshot(&self) -> Vec<Arc<SSHHost>> {
        self.read().hosts.values().cloned().collect()
    }

    pub fn len(&self) -> usize {
        self.read().hosts.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// resourceVersion as a number for ordering; the API server's are opaque, but etcd's and the
/// in-memory store's are monotonically increasing integers.
pub(crate) fn rv(h: &SSHHost) -> u64 {
    h.metadata
        .resource_version
        .as_deref()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::{ClaimView, HostView, NodeAddressView};
    use crate::api::{HostState, SSHHostStatus};
    use crate::sim::SimHost;
    use crate::sim::world::host_object;
    use k8s_openapi::api::core::v1::{Node, NodeAddress, NodeStatus};

    fn node(name: &str, ips: &[&str]) -> Node {
        let mut n = Node::default();
        n.metadata.name = Some(name.into());
        n.status = Some(NodeStatus {
            addresses: Some(
                ips.iter()
                    .map(|ip| NodeAddress {
                        type_: "InternalIP".into(),
                        address: (*ip).into(),
                    })
                    .collect(),
            ),
            ..Default::default()
        });
        n
    }

    #[test]
    fn node_addresses_follow_ip_changes_deletions_and_restarts() {
        let view = NodeAddressView::default();
        view.upsert(&node("b", &["10.0.0.1"]));
        view.upsert(&node("a", &["10.0.0.1", "10.0.0.2"]));
        assert_eq!(view.named_with_ip("10.0.0.1"), ["a", "b"], "name order");
        // A Node whose address changed is no longer found under the old one.
        view.upsert(&node("a", &["10.0.0.3"]));
        assert_eq!(view.named_with_ip("10.0.0.1"), ["b"]);
        assert!(view.named_with_ip("10.0.0.2").is_empty());
        view.remove("b");
        assert!(view.named_with_ip("10.0.0.1").is_empty());
        view.replace_all(&[node("c", &["10.0.0.3"])]);
        assert_eq!(
            view.named_with_ip("10.0.0.3"),
            ["c"],
            "a restart replaces all"
        );
    }

    /// Host `name` at resourceVersion `rv` in `state`, its status then edited by `edit`.
    fn versioned(
        name: &str,
        rv: u64,
        state: HostState,
        edit: impl FnOnce(&mut SSHHostStatus),
    ) -> crate::api::SSHHost {
        let mut h = host_object("pool", name, "small", &SimHost::new("10.0.0.1", 2, 1));
        h.metadata.resource_version = Some(rv.to_string());
        let mut status = SSHHostStatus {
            state,
            ..Default::default()
        };
        edit(&mut status);
        h.status = Some(status);
        h
    }

    /// A version that keeps its claim takes the shortcut past the indexes; one that moves,
    /// drops or contests a claim goes through them, with the same outcome as before.
    #[test]
    fn claim_holders_follow_versions_that_keep_move_or_contest_a_claim() {
        use crate::api::ClaimRef;
        let view = HostView::default();
        let host = |name: &str, rv: u64, uid: Option<&str>| {
            let claim_ref = uid.map(|u| ClaimRef {
                name: format!("nc-{u}"),
                uid: u.into(),
            });
            versioned(name, rv, HostState::Claimed, |s| s.claim_ref = claim_ref)
        };
        view.upsert(host("a", 1, Some("u1")));
        view.upsert(host("a", 2, Some("u1")));
        assert_eq!(view.holder("u1").as_deref(), Some("a"), "kept");
        assert_eq!(
            view.get("a").and_then(|h| h.metadata.resource_version),
            Some("2".into())
        );
        // b takes the same claim (a conflict the router resolves): the latest holder is indexed,
        // and a's next version with the claim takes it back, shortcut or not.
        view.upsert(host("b", 3, Some("u1")));
        assert_eq!(view.holder("u1").as_deref(), Some("b"));
        view.upsert(host("a", 4, Some("u1")));
        assert_eq!(view.holder("u1").as_deref(), Some("a"));
        view.upsert(host("a", 5, Some("u2")));
        assert_eq!(
            view.holder("u1"),
            None,
            "a moved on; b's entry was replaced"
        );
        assert_eq!(view.holder("u2").as_deref(), Some("a"));
        view.upsert(host("a", 6, None));
        assert_eq!(view.holder("u2"), None);
    }

    #[test]
    fn profile_use_is_counted_per_install_marker() {
        let view = HostView::default();
        let host = |name: &str, rv: u64, marker: Option<&str>| {
            versioned(name, rv, HostState::Available, |s| {
                s.installed_profile = marker.map(str::to_string)
            })
        };
        view.upsert(host("a", 1, Some("p@1")));
        view.upsert(host("b", 1, Some("p@2")));
        assert!(view.profile_in_use("p") && !view.profile_in_use("q"));
        view.upsert(host("a", 2, Some("q@1")));
        assert!(view.profile_in_use("p"), "b still has p");
        view.remove("b");
        assert!(!view.profile_in_use("p") && view.profile_in_use("q"));
        view.upsert(host("a", 3, None));
        assert!(!view.profile_in_use("q"), "marker gone (a leave)");
    }

    #[test]
    fn claim_view_follows_inserts_removals_and_restarts() {
        let view = ClaimView::default();
        let woken = |view: &ClaimView, change: &dyn Fn(&ClaimView)| {
            let n = view.notified();
            futures::pin_mut!(n);
            n.as_mut().enable();
            change(view);
            futures::FutureExt::now_or_never(n).is_some()
        };
        assert!(!view.contains("u1"));
        assert!(
            woken(&view, &|v| v.insert("u1", false)),
            "an insertion wakes"
        );
        assert!(
            !woken(&view, &|v| v.insert("u1", false)),
            "a repeat does not"
        );
        view.insert("u2", false);
        assert!(view.contains("u1") && view.contains("u2"));
        assert!(view.live("u1"));
        // A deletion timestamp: still present (not stale), no longer live; it wakes waiters.
        assert!(woken(&view, &|v| v.insert("u1", true)));
        assert!(view.contains("u1") && !view.live("u1"));
        view.remove("u1");
        assert!(!view.contains("u1") && !view.live("u1"));
        // A watch restart replaces the view: a UID deleted while the watch was down is gone.
        view.replace_all([("u3", false), ("u5", true)]);
        assert!(!view.contains("u2"));
        assert!(view.live("u3") && view.contains("u5") && !view.live("u5"));
        // Clones share one view (router writes, host actors read).
        let reader = view.clone();
        view.insert("u4", false);
        assert!(reader.contains("u4"));
    }
}
