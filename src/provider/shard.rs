//! Sharding (issue #26): several controller deployments share one cluster, each owning a
//! disjoint set of SSHNodeClasses (`--node-classes`). A shard manages only
//!
//! - the SSHHosts its classes select (host actors, probes, claims, stale-claim releases),
//! - the NodePools whose `nodeClassRef` names one of its classes (provisioning, disruption),
//! - the NodeClaims of its classes (claims, finalizers, lifecycle, termination),
//! - the status of its own SSHNodeClasses.
//!
//! No shard set (`--node-classes` empty) owns everything: today's single controller.
//!
//! A host selected by a class of this shard and by a class it does not own is an *overlap*:
//! this shard cannot know which of the two should have it, so it leaves the host alone (no
//! actor, never claimed) and reports it; the other shard, seeing the same overlap from its
//! side, does the same. Two shards therefore never both claim a host through a selection
//! they disagree on, and the claim itself is a compare-and-swap on the host's
//! resourceVersion, so even two shards acting on the same stale view could not both land one.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, RwLock};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;

use crate::api::{NodeClaim, NodePool, SSHHost, SSHNodeClass};

use super::instance_types::ClassSelector;

/// Which node classes this controller owns, and the selectors of every class in the cluster
/// (the shard must know the classes it does not own to see an overlap).
#[derive(Clone, Default)]
pub struct Shard {
    /// `None`: every class (no sharding).
    owned: Option<Arc<BTreeSet<String>>>,
    classes: Arc<RwLock<BTreeMap<String, Selecting>>>,
}

/// A class's selector as written (to tell a change) and parsed.
struct Selecting {
    written: Option<LabelSelector>,
    parsed: ClassSelector,
}

impl Selecting {
    fn of(c: &SSHNodeClass) -> Option<Self> {
        Some(Selecting {
            written: c.spec.host_selector.clone(),
            parsed: ClassSelector::of(c).ok()?,
        })
    }
}

impl std::fmt::Debug for Shard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Shard").field("owned", &self.owned).finish()
    }
}

/// Whose a host is, as this shard sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Ownership {
    /// Selected by classes of this shard only (or no sharding).
    Ours,
    /// Selected by no class of this shard.
    NotOurs,
    /// Selected by classes of this shard (`ours`) and by classes it does not own (`theirs`):
    /// left alone by both sides until the selectors are made disjoint.
    Overlap {
        ours: Vec<String>,
        theirs: Vec<String>,
    },
}

impl Shard {
    /// Owns every class: no sharding.
    pub fn all() -> Self {
        Shard::default()
    }

    /// Owns exactly the classes named (an empty list is no sharding).
    pub fn of<I: IntoIterator<Item = S>, S: Into<String>>(classes: I) -> Self {
        let owned: BTreeSet<String> = classes
            .into_iter()
            .map(Into::into)
            .filter(|s: &String| !s.trim().is_empty())
            .collect();
        Shard {
            owned: (!owned.is_empty()).then(|| Arc::new(owned)),
            classes: Arc::default(),
        }
    }

    pub fn is_sharded(&self) -> bool {
        self.owned.is_some()
    }

    /// The classes owned, `None` for all.
    pub fn owned(&self) -> Option<&BTreeSet<String>> {
        self.owned.as_deref()
    }

    /// The owned classes as the flag spells them (`a,b`), or `*`.
    pub fn describe(&self) -> String {
        match &self.owned {
            None => "*".into(),
            Some(o) => o.iter().cloned().collect::<Vec<_>>().join(","),
        }
    }

    pub fn owns_class(&self, name: &str) -> bool {
        self.owned.as_ref().is_none_or(|o| o.contains(name))
    }

    /// A NodeClaim of an owned SSHNodeClass.
    pub fn owns_claim(&self, nc: &NodeClaim) -> bool {
        nc.is_ours() && self.owns_class(&nc.spec.node_class_ref.name)
    }

    /// A NodePool whose nodeClassRef names an owned SSHNodeClass.
    pub fn owns_pool(&self, np: &NodePool) -> bool {
        np.is_ours() && self.owns_class(&np.spec.template.spec.node_class_ref.name)
    }

    /// Record every class's selector (after a relist). A class with an invalid selector
    /// selects nothing here; its owner reports the error on the class's status.
    pub fn set_classes(&self, classes: &[SSHNodeClass]) {
        let mut map = self.classes.write().unwrap_or_else(|p| p.into_inner());
        map.clear();
        for c in classes {
            if let (Some(name), Some(sel)) = (c.metadata.name.clone(), Selecting::of(c)) {
                map.insert(name, sel);
            }
        }
    }

    /// Record one class's selector; `None`: deleted. Whether the selection changed (a
    /// status write of the class changes nothing here).
    pub fn upsert_class(&self, name: &str, class: Option<&SSHNodeClass>) -> bool {
        let mut map = self.classes.write().unwrap_or_else(|p| p.into_inner());
        match class.and_then(Selecting::of) {
            Some(sel) => {
                let same = map.get(name).is_some_and(|old| old.written == sel.written);
                map.insert(name.to_string(), sel);
                !same
            }
            None => map.remove(name).is_some(),
        }
    }

    /// Whose `host` is. Without sharding every host is ours (as before sharding existed).
    pub fn host(&self, host: &SSHHost) -> Ownership {
        if self.owned.is_none() {
            return Ownership::Ours;
        }
        let map = self.classes.read().unwrap_or_else(|p| p.into_inner());
        let (mut ours, mut theirs) = (Vec::new(), Vec::new());
        for (name, _) in map.iter().filter(|(_, s)| s.parsed.matches(host)) {
            if self.owns_class(name) {
                ours.push(name.clone());
            } else {
                theirs.push(name.clone());
            }
        }
        match (ours.is_empty(), theirs.is_empty()) {
            (true, _) => Ownership::NotOurs,
            (false, true) => Ownership::Ours,
            (false, false) => Ownership::Overlap { ours, theirs },
        }
    }
}

/// The message of an overlap: the objects and the fix.
pub fn overlap_message(
    host: &str,
    ns: &str,
    shard: &Shard,
    ours: &[String],
    theirs: &[String],
) -> String {
    format!(
        "SSHHost {ns}/{host} is selected by SSHNodeClass {} (owned by this controller, \
         --node-classes={}) and by SSHNodeClass {} (not owned by it): no shard probes or claims \
         this host until the hostSelectors are disjoint; change the host's labels or the \
         hostSelector of one of these classes so that exactly one shard's classes select it",
        ours.join(", "),
        shard.describe(),
        theirs.join(", "),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sim::world::{host_object, node_claim, node_class};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;

    fn class(name: &str, host_class: &str) -> SSHNodeClass {
        let mut c = node_class(name, "p");
        c.spec.host_selector = Some(LabelSelector {
            match_labels: Some(BTreeMap::from([(
                crate::api::HOST_CLASS_LABEL.to_string(),
                host_class.to_string(),
            )])),
            ..Default::default()
        });
        c
    }

    fn host(name: &str, host_class: &str) -> SSHHost {
        let sim = crate::sim::SimHost::new("10.0.0.1", 2, 4_000_000);
        host_object("pool", name, host_class, &sim)
    }

    #[test]
    fn without_node_classes_every_host_claim_and_pool_is_ours() {
        let s = Shard::of(Vec::<String>::new());
        assert!(!s.is_sharded());
        s.set_classes(&[class("a", "a")]);
        assert_eq!(s.host(&host("h", "zzz")), Ownership::Ours);
        assert!(s.owns_claim(&node_claim("nc", "anything", "1", "1Gi")));
        assert!(s.owns_class("anything"));
    }

    #[test]
    fn a_shard_owns_the_hosts_claims_and_pools_of_its_classes_only() {
        let s = Shard::of(["a", "b"]);
        s.set_classes(&[class("a", "ha"), class("b", "hb"), class("c", "hc")]);
        assert_eq!(s.host(&host("h1", "ha")), Ownership::Ours);
        assert_eq!(s.host(&host("h2", "hb")), Ownership::Ours);
        assert_eq!(s.host(&host("h3", "hc")), Ownership::NotOurs);
        // Selected by no class at all: not this shard's business.
        assert_eq!(s.host(&host("h4", "none")), Ownership::NotOurs);
        assert!(s.owns_claim(&node_claim("x", "a", "1", "1Gi")));
        assert!(!s.owns_claim(&node_claim("y", "c", "1", "1Gi")));
        // A class deleted: its hosts are no longer ours.
        assert!(s.upsert_class("a", None));
        assert!(!s.upsert_class("a", None));
        assert_eq!(s.host(&host("h1", "ha")), Ownership::NotOurs);
    }

    #[test]
    fn a_host_selected_by_two_shards_classes_is_an_overlap_naming_both() {
        let s = Shard::of(["a"]);
        let mut wide = node_class("c", "p");
        wide.spec.host_selector = None; // selects every host
        s.set_classes(&[class("a", "ha"), wide]);
        let o = s.host(&host("h1", "ha"));
        assert_eq!(
            o,
            Ownership::Overlap {
                ours: vec!["a".into()],
                theirs: vec!["c".into()]
            }
        );
        let msg = overlap_message("h1", "pool", &s, &["a".into()], &["c".into()]);
        for needle in [
            "pool/h1",
            "SSHNodeClass a",
            "SSHNodeClass c",
            "--node-classes=a",
            "hostSelector",
        ] {
            assert!(msg.contains(needle), "{needle}: {msg}");
        }
    }
}
