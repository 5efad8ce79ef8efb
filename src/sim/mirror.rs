//! The runner's view of the API, fed by its watches, and the indexes the per-step checks and
//! the demand driver ask of it. Every index is kept as events arrive: a 10,000-host day has
//! 1,440 steps, and a pass over every host or claim at each one was a tenth of the run.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;

use k8s_openapi::api::core::v1::{Node, Secret as KubeSecret};

use super::run::name_of;
use crate::api::{HostState, NodeClaim, SSHHost};

/// The runner's view of the API, fed by watches (no polling of the store).
#[derive(Default)]
pub(super) struct Mirror {
    /// Shared with the store and the controller's view (no copy per write).
    pub hosts: BTreeMap<String, Arc<SSHHost>>,
    /// What the per-step checks ask of all hosts, kept as hosts change.
    pub host_index: HostIndex,
    pub claims: BTreeMap<String, Arc<NodeClaim>>,
    /// Name of each mirrored NodeClaim, by UID.
    claim_names: HashMap<String, String>,
    /// Live claims and unbound ones per class (see [`ClaimCounts`]).
    claim_counts: HashMap<String, ClaimCounts>,
    pub nodes: BTreeMap<String, Arc<Node>>,
    pub tokens: BTreeMap<String, KubeSecret>,
}

/// Indexes over the mirrored hosts, updated per host event instead of rebuilt every step.
#[derive(Default)]
pub(super) struct HostIndex {
    /// Host names by the NodeClaim UID their claim carries.
    pub holders: HashMap<String, BTreeSet<String>>,
    /// UIDs held by more than one host (an invariant violation).
    pub shared: BTreeSet<String>,
    /// Claimable hosts (Available, unclaimed, not in maintenance) per class.
    pub free: HashMap<String, u32>,
    /// The claim (name, UID) each host carries.
    pub claim_of: HashMap<String, (String, String)>,
    /// Host names by the bootstrap token ID their status records.
    pub token_holders: BTreeMap<String, BTreeSet<String>>,
}

/// NodeClaims of one class not being deleted (`live`), and how many of those no host holds
/// yet (`unbound`: no UID, or a UID no mirrored host's claim carries).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(super) struct ClaimCounts {
    pub live: u32,
    pub unbound: u32,
}

/// What `drive_demand` needs to know of one class.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct ClassCensus {
    pub live: u32,
    pub unbound: u32,
    pub free: u32,
}

impl HostIndex {
    fn free_of(h: &SSHHost) -> bool {
        h.state() == HostState::Available && h.claim().is_none() && !h.in_maintenance()
    }
    fn add(&mut self, name: &str, h: &SSHHost) {
        if let Some(c) = h.claim() {
            let names = self.holders.entry(c.uid.clone()).or_default();
            names.insert(name.to_string());
            if names.len() > 1 {
                self.shared.insert(c.uid.clone());
            }
            self.claim_of
                .insert(name.to_string(), (c.name.clone(), c.uid.clone()));
        }
        if let Some(id) = token_id(h) {
            self.token_holders
                .entry(id.to_string())
                .or_default()
                .insert(name.to_string());
        }
        if Self::free_of(h) {
            *self.free.entry(h.class().to_string()).or_default() += 1;
        }
    }

    fn drop_host(&mut self, name: &str, h: &SSHHost) {
        if let Some(c) = h.claim()
            && let Some(names) = self.holders.get_mut(&c.uid)
        {
            names.remove(name);
            if names.len() < 2 {
                self.shared.remove(&c.uid);
            }
            if names.is_empty() {
                self.holders.remove(&c.uid);
            }
        }
        self.claim_of.remove(name);
        if let Some(id) = token_id(h)
            && let Some(names) = self.token_holders.get_mut(id)
        {
            names.remove(name);
            if names.is_empty() {
                self.token_holders.remove(id);
            }
        }
        if Self::free_of(h)
            && let Some(n) = self.free.get_mut(h.class())
        {
            *n = n.saturating_sub(1);
        }
    }
}

fn token_id(h: &SSHHost) -> Option<&str> {
    h.status.as_ref()?.bootstrap_token_id.as_deref()
}

fn bump(n: &mut u32, add: bool) {
    *n = if add {
        n.saturating_add(1)
    } else {
        n.saturating_sub(1)
    };
}

impl Mirror {
    pub fn reset_hosts(&mut self, all: Vec<Arc<SSHHost>>) {
        self.hosts = all.into_iter().map(|h| (name_of(&h.metadata), h)).collect();
        self.host_index = HostIndex::default();
        for (n, h) in &self.hosts {
            self.host_index.add(n, h);
        }
        self.claim_counts = self.counted_claims();
    }

    pub fn put_host(&mut self, name: String, h: Arc<SSHHost>) {
        let old = self.hosts.get(&name).and_then(|o| o.claim());
        let new = h.claim();
        // Only a host whose claim UID changes can bind or unbind a claim.
        let moved = (old.map(|c| &c.uid) != new.map(|c| &c.uid)).then(|| {
            let was = |u: Option<&String>| u.map(|u| (u.clone(), self.holds(u)));
            [was(old.map(|c| &c.uid)), was(new.map(|c| &c.uid))]
        });
        // Old out before new in: both usually hold the same claim.
        if let Some(old) = self.hosts.get(&name) {
            self.host_index.drop_host(&name, old);
        }
        self.host_index.add(&name, &h);
        self.hosts.insert(name, h);
        for (uid, was_held) in moved.into_iter().flatten().flatten() {
            self.rebind(&uid, was_held);
        }
    }

    pub fn remove_host(&mut self, name: &str) {
        if let Some(old) = self.hosts.remove(name) {
            let uid = old.claim().map(|c| (c.uid.clone(), self.holds(&c.uid)));
            self.host_index.drop_host(name, &old);
            if let Some((uid, was_held)) = uid {
                self.rebind(&uid, was_held);
            }
        }
    }

    pub fn reset_claims(&mut self, all: Vec<Arc<NodeClaim>>) {
        self.claims = all.into_iter().map(|c| (name_of(&c.metadata), c)).collect();
        self.claim_names = self
            .claims
            .iter()
            .filter_map(|(n, c)| Some((c.metadata.uid.clone()?, n.clone())))
            .collect();
        self.claim_counts = self.counted_claims();
    }

    pub fn put_claim(&mut self, name: String, c: Arc<NodeClaim>) {
        if let Some(uid) = &c.metadata.uid {
            self.claim_names.insert(uid.clone(), name.clone());
        }
        self.count_claim(&c, true);
        if let Some(old) = self.claims.insert(name, c) {
            self.count_claim(&old, false);
            if let Some(uid) = &old.metadata.uid {
                self.forget_uid_unless_current(uid);
            }
        }
    }

    pub fn remove_claim(&mut self, name: &str) {
        if let Some(old) = self.claims.remove(name) {
            self.count_claim(&old, false);
            if let Some(uid) = &old.metadata.uid {
                self.forget_uid_unless_current(uid);
            }
        }
    }

    /// Drop `uid` from the index unless a mirrored claim still carries it.
    fn forget_uid_unless_current(&mut self, uid: &str) {
        let current = self
            .claim_names
            .get(uid)
            .and_then(|n| self.claims.get(n))
            .is_some_and(|c| c.metadata.uid.as_deref() == Some(uid));
        if !current {
            self.claim_names.remove(uid);
        }
    }

    /// Whether the claim `(name, uid)` is the mirrored NodeClaim of that name.
    pub fn claim_live(&self, name: &str, uid: &str) -> bool {
        self.claim_names.get(uid).is_some_and(|n| n == name)
    }

    /// Whether host `host` carries a claim that is a mirrored NodeClaim.
    pub fn host_claim_live(&self, host: &str) -> bool {
        (self.host_index.claim_of.get(host)).is_some_and(|(claim, uid)| self.claim_live(claim, uid))
    }

    /// Per class: live NodeClaims, those of them no host holds yet, and free hosts.
    pub fn demand_census(&self) -> HashMap<String, ClassCensus> {
        debug_assert_eq!(
            self.claim_counts,
            self.counted_claims(),
            "the claim counts drifted from the claims"
        );
        let mut census: HashMap<String, ClassCensus> = self
            .claim_counts
            .iter()
            .map(|(class, n)| {
                let c = ClassCensus {
                    live: n.live,
                    unbound: n.unbound,
                    free: 0,
                };
                (class.clone(), c)
            })
            .collect();
        for (class, free) in &self.host_index.free {
            if *free > 0 {
                census.entry(class.clone()).or_default().free += free;
            }
        }
        census
    }

    fn holds(&self, uid: &str) -> bool {
        self.host_index.holders.contains_key(uid)
    }

    /// Add (or take back) what one claim contributes to `claim_counts`, judged by the
    /// holders as they are now.
    fn count_claim(&mut self, c: &NodeClaim, add: bool) {
        if c.metadata.deletion_timestamp.is_some() {
            return;
        }
        let unbound = c.metadata.uid.as_deref().is_none_or(|u| !self.holds(u));
        let class = c.spec.node_class_ref.name.as_str();
        if !self.claim_counts.contains_key(class) {
            self.claim_counts
                .insert(class.to_string(), ClaimCounts::default());
        }
        if let Some(n) = self.claim_counts.get_mut(class) {
            bump(&mut n.live, add);
            if unbound {
                bump(&mut n.unbound, add);
            }
            if n.live == 0 {
                self.claim_counts.remove(class);
            }
        }
    }

    /// A host change may have given `uid` its first holder or taken its last: move the live
    /// claim carrying it between bound and unbound.
    fn rebind(&mut self, uid: &str, was_held: bool) {
        let held = self.holds(uid);
        if held == was_held {
            return;
        }
        let Some(c) = (self.claim_names.get(uid))
            .and_then(|n| self.claims.get(n))
            .filter(|c| c.metadata.uid.as_deref() == Some(uid))
            .filter(|c| c.metadata.deletion_timestamp.is_none())
        else {
            return;
        };
        let class = c.spec.node_class_ref.name.clone();
        if let Some(n) = self.claim_counts.get_mut(&class) {
            bump(&mut n.unbound, !held);
        }
    }

    /// `claim_counts` from scratch: after a watch restart, and to check the kept one.
    fn counted_claims(&self) -> HashMap<String, ClaimCounts> {
        let mut counts: HashMap<String, ClaimCounts> = HashMap::new();
        for c in self.claims.values() {
            if c.metadata.deletion_timestamp.is_some() {
                continue;
            }
            let n = counts
                .entry(c.spec.node_class_ref.name.clone())
                .or_default();
            n.live += 1;
            if c.metadata.uid.as_deref().is_none_or(|u| !self.holds(u)) {
                n.unbound += 1;
            }
        }
        counts
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;
    use std::sync::Arc;

    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

    use super::{HostIndex, Mirror};
    use crate::api::{ClaimRef, HostState, NodeClaim, SSHHost, SSHHostStatus};
    use crate::sim::SimHost;
    use crate::sim::world::host_object;

    fn host(name: &str, state: HostState, claim: Option<&str>) -> Arc<SSHHost> {
        let mut h = host_object(
            "pool",
            name,
            "small",
            &SimHost::new("10.0.0.1", 4, 8_000_000),
        );
        h.status = Some(SSHHostStatus {
            state,
            claim_ref: claim.map(|uid| ClaimRef {
                name: format!("nc-{uid}"),
                uid: uid.into(),
            }),
            ..Default::default()
        });
        Arc::new(h)
    }

    fn free(index: &HostIndex) -> u32 {
        index.free.get("small").copied().unwrap_or(0)
    }

    #[test]
    fn host_index_follows_updates_that_keep_or_move_a_claim() {
        let mut m = Mirror::default();
        m.put_host("a".into(), host("a", HostState::Available, None));
        m.put_host("b".into(), host("b", HostState::Available, None));
        assert_eq!(free(&m.host_index), 2);
        m.put_host("a".into(), host("a", HostState::Claimed, Some("u1")));
        // A status write that keeps the claim must keep the holder (old out, new in).
        m.put_host("a".into(), host("a", HostState::InUse, Some("u1")));
        assert_eq!(free(&m.host_index), 1);
        assert!(m.host_index.holders["u1"].contains("a"));
        assert!(m.host_index.shared.is_empty());
        m.put_host("b".into(), host("b", HostState::Claimed, Some("u1")));
        assert_eq!(
            m.host_index.shared.iter().collect::<Vec<_>>(),
            ["u1"],
            "two hosts, one claim"
        );
        m.remove_host("b");
        assert!(m.host_index.shared.is_empty());
        m.put_host("a".into(), host("a", HostState::Available, None));
        assert!(!m.host_index.holders.contains_key("u1"));
        assert_eq!(free(&m.host_index), 1);
    }

    fn claim(name: &str, uid: &str) -> Arc<NodeClaim> {
        let mut nc = NodeClaim::new(name, Default::default());
        nc.metadata.uid = Some(uid.into());
        Arc::new(nc)
    }

    /// The zombie check's question (is this host's claim the live NodeClaim of that name?)
    /// and the token check's (which host records this token ID?) follow every event.
    #[test]
    fn claim_and_token_indexes_follow_host_and_claim_events() {
        let mut m = Mirror::default();
        let mut a = Arc::unwrap_or_clone(host("a", HostState::Claimed, Some("u1")));
        if let Some(s) = a.status.as_mut() {
            s.bootstrap_token_id = Some("tok1".into());
        }
        m.put_host("a".into(), Arc::new(a));
        assert_eq!(m.host_index.claim_of["a"], ("nc-u1".into(), "u1".into()));
        assert!(!m.claim_live("nc-u1", "u1"), "no such NodeClaim yet");
        m.put_claim("nc-u1".into(), claim("nc-u1", "u1"));
        assert!(m.claim_live("nc-u1", "u1"));
        // Recreated under the same name: the old UID is no longer live.
        m.put_claim("nc-u1".into(), claim("nc-u1", "u2"));
        assert!(!m.claim_live("nc-u1", "u1"));
        assert!(m.claim_live("nc-u1", "u2"));
        m.remove_claim("nc-u1");
        assert!(!m.claim_live("nc-u1", "u2"));
        m.reset_claims(vec![claim("nc-u1", "u1")]);
        assert!(m.claim_live("nc-u1", "u1"));
        let holders = |m: &Mirror| m.host_index.token_holders.get("tok1").cloned();
        assert_eq!(holders(&m), Some(BTreeSet::from(["a".to_string()])));
        m.put_host("a".into(), host("a", HostState::Available, None));
        assert!(!m.host_index.claim_of.contains_key("a"));
        assert_eq!(holders(&m), None, "the token ID left the host's status");
    }

    /// `drive_demand`'s census is kept as claims and hosts change; each step below is checked
    /// against a count from scratch (in `demand_census`) and against the expected figures.
    #[test]
    fn demand_census_follows_claims_and_their_holders() {
        let mut m = Mirror::default();
        let counts = |m: &Mirror| {
            let c = m.demand_census().get("").copied().unwrap_or_default();
            (c.live, c.unbound)
        };
        m.put_claim("nc-u1".into(), claim("nc-u1", "u1"));
        m.put_claim("nc-u2".into(), claim("nc-u2", "u2"));
        assert_eq!(counts(&m), (2, 2));
        m.put_host("a".into(), host("a", HostState::Claimed, Some("u1")));
        assert_eq!(counts(&m), (2, 1), "a holds nc-u1");
        m.put_host("a".into(), host("a", HostState::InUse, Some("u1")));
        assert_eq!(counts(&m), (2, 1), "a status write that keeps the claim");
        m.put_host("b".into(), host("b", HostState::Claimed, Some("u1")));
        assert_eq!(counts(&m), (2, 1), "a second holder binds nothing more");
        m.put_host("a".into(), host("a", HostState::Claimed, Some("u2")));
        assert_eq!(counts(&m), (2, 0), "a moved to nc-u2, b still holds nc-u1");
        m.remove_host("b");
        assert_eq!(counts(&m), (2, 1));
        // Recreated under the same name with a new UID: nobody holds the new one.
        m.put_claim("nc-u2".into(), claim("nc-u2", "u3"));
        assert_eq!(counts(&m), (2, 2));
        let mut deleting = Arc::unwrap_or_clone(claim("nc-u1", "u1"));
        deleting.metadata.deletion_timestamp = Some(Time(jiff::Timestamp::UNIX_EPOCH));
        m.put_claim("nc-u1".into(), Arc::new(deleting));
        assert_eq!(counts(&m), (1, 1), "a claim being deleted is not live");
        m.put_host("c".into(), host("c", HostState::Claimed, Some("u3")));
        assert_eq!(counts(&m), (1, 0));
        m.reset_hosts(vec![]);
        assert_eq!(counts(&m), (1, 1), "a watch restart recounts");
        m.remove_claim("nc-u2");
        m.remove_claim("nc-u1");
        assert_eq!(counts(&m), (0, 0));
        m.reset_claims(vec![claim("nc-u4", "u4")]);
        assert_eq!(counts(&m), (1, 1));
    }
}
