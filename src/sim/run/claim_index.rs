//! The safety checker's NodeClaims, filed by what a Node may name them by (uid, Node name,
//! provider ID), so that finding the claim of a deleted Node is a lookup, not a pass over
//! every claim: at 100,000 hosts the passes were most of the checker's time.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;

use crate::api::NodeClaim;
use crate::karpenter::state::unfile;

type Keys = (Option<String>, Option<String>, Option<String>);

#[derive(Default)]
pub(super) struct ClaimIndex {
    /// What each claim is filed under now: (uid, `status.nodeName`, provider ID).
    of: HashMap<String, Keys>,
    by_uid: HashMap<String, String>,
    by_node: BTreeMap<String, BTreeSet<String>>,
    by_pid: BTreeMap<String, BTreeSet<String>>,
}

fn keys(nc: &NodeClaim) -> Keys {
    let status = nc.status.as_ref();
    (
        nc.metadata.uid.clone(),
        status.and_then(|s| s.node_name.clone()),
        status
            .and_then(|s| s.provider_id.clone())
            .filter(|p| !p.is_empty()),
    )
}

impl ClaimIndex {
    pub(super) fn rebuild(&mut self, claims: &BTreeMap<String, Arc<NodeClaim>>) {
        *self = ClaimIndex::default();
        for (name, nc) in claims {
            self.set(name, Some(nc));
        }
    }

    /// File claim `name` as `nc` is now (`None`: gone).
    pub(super) fn set(&mut self, name: &str, nc: Option<&NodeClaim>) {
        let now = nc.map(keys);
        if self.of.get(name) == now.as_ref() {
            return;
        }
        if let Some((uid, node, pid)) = self.of.remove(name) {
            if let Some(uid) = uid {
                self.by_uid.remove(&uid);
            }
            unfile(&mut self.by_node, node, name);
            unfile(&mut self.by_pid, pid, name);
        }
        if let Some((uid, node, pid)) = now {
            if let Some(uid) = &uid {
                self.by_uid.insert(uid.clone(), name.to_string());
            }
            for (map, key) in [(&mut self.by_node, &node), (&mut self.by_pid, &pid)] {
                if let Some(k) = key {
                    map.entry(k.clone()).or_default().insert(name.to_string());
                }
            }
            self.of.insert(name.to_string(), (uid, node, pid));
        }
    }

    /// The claim with this uid.
    pub(super) fn by_uid(&self, uid: &str) -> Option<&String> {
        self.by_uid.get(uid)
    }

    /// The claims whose `status.nodeName` is `node`, in name order.
    pub(super) fn by_node(&self, node: &str) -> impl Iterator<Item = &String> {
        self.by_node.get(node).into_iter().flatten()
    }

    /// The claims with this provider ID, in name order.
    pub(super) fn by_provider(&self, pid: &str) -> impl Iterator<Item = &String> {
        self.by_pid.get(pid).into_iter().flatten()
    }
}
