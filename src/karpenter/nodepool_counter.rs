//! NodePool `status.resources` and `status.nodes`, as core's `nodepool.counter` controller
//! computes them (sigs.k8s.io/karpenter v1): the capacity of the pool's nodes summed, plus a
//! `nodes` resource counting them, over core's base of `cpu`, `memory`, `pods`,
//! `ephemeral-storage` and `nodes` at zero; `status.nodes` is that `nodes` count.
//!
//! A node counts as core's cluster state counts one: a NodeClaim once launched (it has a
//! provider ID) or registered, and a Node carrying `karpenter.sh/nodepool` that no claim of
//! ours holds. Not counted: a claim or Node being deleted, or a claim marked for disruption
//! (core's `MarkedForDeletion`). The capacity is the Node's once the claim is Initialized;
//! before, the Node's where it reports a non-zero value, else the claim's; without a Node (or
//! with a Node that reports no capacity at all), the claim's `status.capacity`.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::core::v1::Node;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use serde_json::{Map, Value, json};

use super::DISRUPTION_ANNOTATION;
use super::lifecycle::condition_true;
use super::quantity;
use super::state::Inner;
use crate::api::karpenter::{INITIALIZED_LABEL, NODEPOOL_LABEL};
use crate::api::{NodeClaim, NodePool};

/// The `nodes` resource (core's `resources.Node`).
pub const NODES: &str = "nodes";

/// Resources every NodePool's status carries, at zero when it has no node.
pub const BASE: [&str; 5] = ["cpu", "memory", "pods", "ephemeral-storage", NODES];

/// Per NodePool name, the milli-units its counted nodes hold (`nodes`: 1000 per node).
pub fn pool_resources(st: &Inner) -> BTreeMap<String, BTreeMap<String, i128>> {
    let mut out: BTreeMap<String, BTreeMap<String, i128>> = BTreeMap::new();
    let mut held: BTreeSet<&str> = BTreeSet::new();
    for nc in st.nodeclaims.values() {
        let node = st.node_of(nc);
        if let Some(name) = node.and_then(|n| n.metadata.name.as_deref()) {
            held.insert(name);
        }
        let launched = (nc.status.as_ref())
            .and_then(|s| s.provider_id.as_deref())
            .is_some_and(|p| !p.is_empty());
        if !launched && node.is_none() {
            continue;
        }
        let disrupting = (nc.metadata.annotations.as_ref())
            .is_some_and(|a| a.contains_key(DISRUPTION_ANNOTATION));
        if nc.metadata.deletion_timestamp.is_some()
            || disrupting
            || node.is_some_and(|n| n.metadata.deletion_timestamp.is_some())
        {
            continue;
        }
        let pool = node
            .and_then(|n| label(n, NODEPOOL_LABEL))
            .or_else(|| nc.nodepool());
        let Some(pool) = pool else { continue };
        add(
            out.entry(pool.to_string()).or_default(),
            claim_capacity(nc, node),
        );
    }
    for node in st.nodes.values() {
        let name = node.metadata.name.as_deref().unwrap_or_default();
        if held.contains(name) || node.metadata.deletion_timestamp.is_some() {
            continue;
        }
        let Some(pool) = label(node, NODEPOOL_LABEL) else {
            continue;
        };
        add(
            out.entry(pool.to_string()).or_default(),
            node_capacity(node),
        );
    }
    out
}

/// The status of `pool` as the counter writes it: `resources` (the base at zero, overlaid with
/// what its nodes hold) and `nodes`.
pub fn counted(used: Option<&BTreeMap<String, i128>>) -> (BTreeMap<String, Quantity>, Option<i64>) {
    let mut all: BTreeMap<String, i128> = BASE.iter().map(|k| (k.to_string(), 0)).collect();
    for (k, v) in used.into_iter().flatten() {
        all.insert(k.clone(), *v);
    }
    let nodes = all
        .get(NODES)
        .map(|m| i64::try_from(m / 1000).unwrap_or(i64::MAX));
    let resources = all
        .into_iter()
        .map(|(k, v)| {
            let q = format(&k, v);
            (k, Quantity(q))
        })
        .collect();
    (resources, nodes)
}

/// The `status` part of a merge patch that turns `pool`'s resources and node count into
/// `resources`/`nodes`, or `None` when they are already those (semantically: `1024Mi` is
/// `1Gi`). Resources the pool no longer has are removed (`null`).
pub fn patch(
    pool: &NodePool,
    resources: &BTreeMap<String, Quantity>,
    nodes: Option<i64>,
) -> Option<Map<String, Value>> {
    let status = pool.status.as_ref();
    let current = status.map(|s| &s.resources);
    let same_resources = current.is_some_and(|c| {
        c.len() == resources.len()
            && c.iter().all(|(k, v)| {
                resources.get(k).is_some_and(|w| {
                    quantity::parse(v).is_some() && quantity::parse(v) == quantity::parse(w)
                })
            })
    });
    let same_nodes = status.and_then(|s| s.nodes) == nodes;
    if same_resources && same_nodes {
        return None;
    }
    let mut out = Map::new();
    if !same_resources {
        let mut r: Map<String, Value> = resources
            .iter()
            .map(|(k, v)| (k.clone(), json!(v.0)))
            .collect();
        for k in current.into_iter().flatten().map(|(k, _)| k) {
            if !resources.contains_key(k) {
                r.insert(k.clone(), Value::Null);
            }
        }
        out.insert("resources".into(), Value::Object(r));
    }
    if !same_nodes {
        out.insert("nodes".into(), json!(nodes));
    }
    Some(out)
}

fn label<'a>(node: &'a Node, key: &str) -> Option<&'a str> {
    (node.metadata.labels.as_ref())
        .and_then(|l| l.get(key))
        .map(String::as_str)
}

fn add(into: &mut BTreeMap<String, i128>, cap: BTreeMap<String, i128>) {
    for (k, v) in cap {
        *into.entry(k).or_insert(0) += v;
    }
    *into.entry(NODES.into()).or_insert(0) += 1000;
}

fn parse_map(m: &BTreeMap<String, Quantity>) -> BTreeMap<String, i128> {
    m.iter()
        .filter_map(|(k, v)| quantity::parse(v).map(|q| (k.clone(), q)))
        .collect()
}

fn node_capacity(node: &Node) -> BTreeMap<String, i128> {
    (node.status.as_ref())
        .and_then(|s| s.capacity.as_ref())
        .map(parse_map)
        .unwrap_or_default()
}

/// Core's `StateNode.Capacity`: the Node's once initialized; before, the Node's non-zero
/// values with the claim's filling the rest; without a Node, the claim's.
fn claim_capacity(nc: &NodeClaim, node: Option<&Node>) -> BTreeMap<String, i128> {
    let claimed = nc
        .status
        .as_ref()
        .map(|s| parse_map(&s.capacity))
        .unwrap_or_default();
    let Some(node) = node else { return claimed };
    let initialized =
        condition_true(nc, "Initialized") || label(node, INITIALIZED_LABEL) == Some("true");
    let mut cap = node_capacity(node);
    // A Node that reports no capacity at all (not a kubelet's: a test's or a sim's) does not
    // zero its claim.
    if !initialized || cap.is_empty() {
        for (k, v) in claimed {
            let e = cap.entry(k).or_insert(0);
            if *e == 0 {
                *e = v;
            }
        }
    }
    cap
}

/// A sum as a quantity: bytes in the largest binary unit that divides them (`6Gi`), other
/// resources in units or milli-units (`2`, `600m`).
fn format(key: &str, milli: i128) -> String {
    let bytes =
        matches!(key, "memory" | "ephemeral-storage" | "storage") || key.starts_with("hugepages-");
    if !bytes || milli % 1000 != 0 || milli == 0 {
        return quantity::format_cpu(milli);
    }
    let mut n = milli / 1000;
    let mut unit = 0;
    const UNITS: [&str; 7] = ["", "Ki", "Mi", "Gi", "Ti", "Pi", "Ei"];
    while unit + 1 < UNITS.len() && n % 1024 == 0 {
        n /= 1024;
        unit += 1;
    }
    format!("{n}{}", UNITS[unit])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sums_format_as_kubernetes_quantities() {
        assert_eq!(format("cpu", 600), "600m");
        assert_eq!(format("cpu", 4000), "4");
        assert_eq!(format("memory", 6 * 1024 * 1024 * 1024 * 1000), "6Gi");
        assert_eq!(format("memory", 1536 * 1024 * 1024 * 1000), "1536Mi");
        assert_eq!(format("memory", 1000 * 1000), "1000");
        assert_eq!(format("memory", 0), "0");
        assert_eq!(format("pods", 1_256_000), "1256");
    }

    #[test]
    fn the_base_resources_are_zero_without_nodes() {
        let (r, n) = counted(None);
        assert_eq!(n, Some(0));
        assert_eq!(r.keys().collect::<Vec<_>>().len(), BASE.len());
        assert!(r.values().all(|q| q.0 == "0"), "{r:?}");
    }

    #[test]
    fn a_patch_only_when_something_changed_and_removed_keys_are_nulled() {
        let mut pool = NodePool::new("p", Default::default());
        let used = BTreeMap::from([("cpu".to_string(), 2000), (NODES.to_string(), 1000)]);
        let (r, n) = counted(Some(&used));
        let p = patch(&pool, &r, n).expect("a first write");
        assert_eq!(p["nodes"], json!(1));
        assert_eq!(p["resources"]["cpu"], json!("2"));
        let status = pool.status.get_or_insert_with(Default::default);
        status.resources = r.clone();
        status
            .resources
            .insert("cpu".into(), Quantity("2000m".into()));
        status.nodes = n;
        assert_eq!(patch(&pool, &r, n), None, "2000m is 2: no write");
        let status = pool.status.get_or_insert_with(Default::default);
        status
            .resources
            .insert("nvidia.com/gpu".into(), Quantity("1".into()));
        let p = patch(&pool, &r, n).expect("a stale key");
        assert_eq!(p["resources"]["nvidia.com/gpu"], Value::Null);
        assert!(!p.contains_key("nodes"));
    }
}
