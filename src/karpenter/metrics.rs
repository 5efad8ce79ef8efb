//! Karpenter core's cluster gauges (`karpenter_nodepools_usage`, `_limit`, `karpenter_pods_state`,
//! `karpenter_cluster_state_*`; S59), computed from the layer's state at scrape time. The
//! counters and the registry are in [`crate::telemetry::core_metrics`].

use std::collections::BTreeMap;

use super::pods;
use super::state::{ClusterState, Inner};
use crate::api::karpenter::{
    ARCH_LABEL, CAPACITY_TYPE_LABEL, INSTANCE_TYPE_LABEL, NODEPOOL_LABEL, ZONE_LABEL,
};
use crate::api::quantity;
use crate::telemetry::core_metrics::{CoreMetrics, PodLabels, PoolResourceLabels, ScrapeGauges};

impl ScrapeGauges for ClusterState {
    /// The scrape-time gauges, recomputed from the state.
    fn refresh(&self, m: &CoreMetrics) {
        let st = self.read();
        m.synced.set(i64::from(st.synced()));
        m.node_count.set(st.nodes.len() as i64);
        m.nodepool_usage.clear();
        m.nodepool_limit.clear();
        for (name, pool) in &st.nodepools {
            let labels = |r: &str| PoolResourceLabels {
                nodepool: name.clone(),
                resource_type: r.to_string(),
            };
            for (r, q) in &pool.spec.limits {
                if let Some(v) = quantity::parse(q) {
                    m.nodepool_limit
                        .get_or_create(&labels(r))
                        .set(v as f64 / 1000.0);
                }
            }
            for (r, v) in pool_usage(&st, name) {
                m.nodepool_usage.get_or_create(&labels(&r)).set(v);
            }
        }
        m.pods_state.clear();
        for p in st.pods.values() {
            m.pods_state.get_or_create(&pod_labels(&st, p)).set(1);
        }
    }
}

/// What a NodePool's NodeClaims hold (their capacity, as core's NodePool status.resources),
/// in core's units: cores, bytes, counts; and `nodes`.
fn pool_usage(st: &Inner, pool: &str) -> BTreeMap<String, f64> {
    let mut out: BTreeMap<String, f64> = BTreeMap::new();
    let mut nodes = 0.0;
    for nc in st.nodeclaims.values() {
        if nc.nodepool() != Some(pool) || nc.metadata.deletion_timestamp.is_some() {
            continue;
        }
        nodes += 1.0;
        for (r, q) in nc.status.iter().flat_map(|s| s.capacity.iter()) {
            if let Some(v) = quantity::parse(q) {
                *out.entry(r.clone()).or_default() += v as f64 / 1000.0;
            }
        }
    }
    out.insert("nodes".into(), nodes);
    out
}

/// `karpenter_pods_state`'s labels of one pod: its node's labels for the node's part.
fn pod_labels(st: &Inner, p: &k8s_openapi::api::core::v1::Pod) -> PodLabels {
    let node_name = pods::node_name(p).unwrap_or_default().to_string();
    let node_labels = st
        .nodes
        .get(&node_name)
        .and_then(|n| n.metadata.labels.as_ref());
    let label = |k: &str| {
        node_labels
            .and_then(|l| l.get(k).cloned())
            .unwrap_or_default()
    };
    let namespace = p.metadata.namespace.clone().unwrap_or_default();
    let owner = p
        .metadata
        .owner_references
        .iter()
        .flatten()
        .next()
        .map(|o| {
            format!(
                "/apis/{}/namespaces/{namespace}/{}s/{}",
                o.api_version,
                o.kind.to_lowercase(),
                o.name
            )
        })
        .unwrap_or_default();
    let scheduled = p
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .and_then(|cs| cs.iter().find(|c| c.type_ == "PodScheduled"))
        .map(|c| c.status.clone())
        .unwrap_or_else(|| "False".into());
    PodLabels {
        name: p.metadata.name.clone().unwrap_or_default(),
        namespace,
        owner,
        nodepool: label(NODEPOOL_LABEL),
        zone: label(ZONE_LABEL),
        arch: label(ARCH_LABEL),
        capacity_type: label(CAPACITY_TYPE_LABEL),
        instance_type: label(INSTANCE_TYPE_LABEL),
        node: node_name,
        phase: pods::phase(p).to_string(),
        scheduled: scheduled.to_lowercase(),
    }
}
