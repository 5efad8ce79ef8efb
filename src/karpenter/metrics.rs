//! Karpenter core's metric names and labels (S59), beside kpssh's own `kpssh_*`: dashboards
//! and alerts written for core keep working. Counters move where core moves them; the gauges
//! that describe the cluster (NodePool usage and limits, pods, cluster state) are computed
//! from the karpenter layer's state at scrape time.
//!
//! | name | labels | kpssh |
//! |---|---|---|
//! | `karpenter_nodeclaims_created_total` | reason, nodepool, min_values_relaxed | provisioning (`provisioned`), replacements (the disruption reason, lower case) |
//! | `karpenter_nodeclaims_disrupted_total` | reason, nodepool, capacity_type | empty, underutilized, drifted, expired, unhealthy |
//! | `karpenter_nodeclaims_terminated_total` | nodepool, capacity_type | a NodeClaim's finalizer removed |
//! | `karpenter_voluntary_disruption_decisions_total` | decision, reason, consolidation_type | delete / replace; empty, underutilized, drifted; empty, single, multi, "" |
//! | `karpenter_voluntary_disruption_eligible_nodes` | reason | candidates in the last round |
//! | `karpenter_nodepools_allowed_disruptions` | nodepool, reason | the budget in the last round |
//! | `karpenter_nodepools_usage`, `karpenter_nodepools_limit` | nodepool, resource_type | at scrape time |
//! | `karpenter_pods_state` | name, namespace, owner, node, nodepool, zone, arch, capacity_type, instance_type, phase, scheduled | at scrape time |
//! | `karpenter_cluster_state_node_count`, `karpenter_cluster_state_synced` | | at scrape time |

use std::collections::BTreeMap;
use std::sync::atomic::AtomicU64;
use std::sync::{Mutex, MutexGuard};

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use super::state::{ClusterState, Inner};
use super::{pods, quantity};
use crate::api::karpenter::{
    ARCH_LABEL, CAPACITY_TYPE_LABEL, INSTANCE_TYPE_LABEL, NODEPOOL_LABEL, ZONE_LABEL,
};

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct CreatedLabels {
    pub reason: String,
    pub nodepool: String,
    pub min_values_relaxed: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct DisruptedLabels {
    pub reason: String,
    pub nodepool: String,
    pub capacity_type: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct TerminatedLabels {
    pub nodepool: String,
    pub capacity_type: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct DecisionLabels {
    pub decision: String,
    pub reason: String,
    pub consolidation_type: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReasonLabels {
    pub reason: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PoolReasonLabels {
    pub nodepool: String,
    pub reason: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PoolResourceLabels {
    pub nodepool: String,
    pub resource_type: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PodLabels {
    pub name: String,
    pub namespace: String,
    pub owner: String,
    pub node: String,
    pub nodepool: String,
    pub zone: String,
    pub arch: String,
    pub capacity_type: String,
    pub instance_type: String,
    pub phase: String,
    pub scheduled: String,
}

type FloatGauge = Gauge<f64, AtomicU64>;

/// Core's metrics, registered without kpssh's prefix.
pub struct CoreMetrics {
    pub nodeclaims_created: Family<CreatedLabels, Counter>,
    pub nodeclaims_disrupted: Family<DisruptedLabels, Counter>,
    pub nodeclaims_terminated: Family<TerminatedLabels, Counter>,
    pub decisions: Family<DecisionLabels, Counter>,
    pub eligible_nodes: Family<ReasonLabels, Gauge>,
    pub allowed_disruptions: Family<PoolReasonLabels, Gauge>,
    pub nodepool_usage: Family<PoolResourceLabels, FloatGauge>,
    pub nodepool_limit: Family<PoolResourceLabels, FloatGauge>,
    pub pods_state: Family<PodLabels, Gauge>,
    pub node_count: Gauge,
    pub synced: Gauge,
    /// The karpenter layer's state, for the gauges computed at scrape time.
    state: Mutex<Option<ClusterState>>,
    registry: Registry,
}

impl Default for CoreMetrics {
    fn default() -> Self {
        Self::new()
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Core's reason label values are its reasons in snake case (`Underutilized` →
/// `underutilized`).
pub fn snake(reason: &str) -> String {
    let mut out = String::with_capacity(reason.len() + 2);
    for (i, c) in reason.chars().enumerate() {
        if c.is_ascii_uppercase() {
            if i > 0 {
                out.push('_');
            }
            out.push(c.to_ascii_lowercase());
        } else {
            out.push(c);
        }
    }
    out
}

impl CoreMetrics {
    pub fn new() -> Self {
        let m = CoreMetrics {
            nodeclaims_created: Family::default(),
            nodeclaims_disrupted: Family::default(),
            nodeclaims_terminated: Family::default(),
            decisions: Family::default(),
            eligible_nodes: Family::default(),
            allowed_disruptions: Family::default(),
            nodepool_usage: Family::default(),
            nodepool_limit: Family::default(),
            pods_state: Family::default(),
            node_count: Gauge::default(),
            synced: Gauge::default(),
            state: Mutex::new(None),
            registry: Registry::with_prefix("karpenter"),
        };
        let mut registry = Registry::with_prefix("karpenter");
        registry.register(
            "nodeclaims_created",
            "Number of nodeclaims created in total by Karpenter. Labeled by reason the nodeclaim was created, the owning nodepool, and if min values was relaxed for this nodeclaim.",
            m.nodeclaims_created.clone(),
        );
        registry.register(
            "nodeclaims_disrupted",
            "Number of nodeclaims disrupted in total by Karpenter. Labeled by reason the nodeclaim was disrupted and the owning nodepool.",
            m.nodeclaims_disrupted.clone(),
        );
        registry.register(
            "nodeclaims_terminated",
            "Number of nodeclaims terminated in total by Karpenter. Labeled by the owning nodepool.",
            m.nodeclaims_terminated.clone(),
        );
        registry.register(
            "voluntary_disruption_decisions",
            "Number of disruption decisions performed. Labeled by disruption decision, reason, and consolidation type.",
            m.decisions.clone(),
        );
        registry.register(
            "voluntary_disruption_eligible_nodes",
            "Number of nodes eligible for disruption by Karpenter. Labeled by disruption reason.",
            m.eligible_nodes.clone(),
        );
        registry.register(
            "nodepools_allowed_disruptions",
            "The number of nodes for a given NodePool that can be concurrently disrupting at a point in time. Labeled by NodePool.",
            m.allowed_disruptions.clone(),
        );
        registry.register(
            "nodepools_usage",
            "The amount of resources that have been provisioned for a nodepool. Labeled by nodepool name and resource type.",
            m.nodepool_usage.clone(),
        );
        registry.register(
            "nodepools_limit",
            "Limits specified on the nodepool that restrict the quantity of resources provisioned. Labeled by nodepool name and resource type.",
            m.nodepool_limit.clone(),
        );
        registry.register(
            "pods_state",
            "Pod state is the current state of pods. Labeled by the pod name, namespace, owner, node, nodepool name, zone, architecture, capacity type, instance type and pod phase.",
            m.pods_state.clone(),
        );
        registry.register(
            "cluster_state_node_count",
            "Current count of nodes in cluster state",
            m.node_count.clone(),
        );
        registry.register(
            "cluster_state_synced",
            "Returns 1 if cluster state is synced and 0 otherwise.",
            m.synced.clone(),
        );
        CoreMetrics { registry, ..m }
    }

    /// The karpenter layer (re)started with `state`: the scrape-time gauges read it.
    pub fn watch_state(&self, state: ClusterState) {
        *lock(&self.state) = Some(state);
    }

    /// A NodeClaim was created: `provisioned`, or a replacement's disruption reason.
    pub fn created(&self, reason: &str, nodepool: &str) {
        self.nodeclaims_created
            .get_or_create(&CreatedLabels {
                reason: reason.to_string(),
                nodepool: nodepool.to_string(),
                min_values_relaxed: "false".to_string(),
            })
            .inc();
    }

    /// A NodeClaim was disrupted (marked, deleted) for `reason` (core's name, any case).
    pub fn disrupted(&self, reason: &str, nc: &crate::api::NodeClaim) {
        let label = |k: &str| {
            nc.metadata
                .labels
                .as_ref()
                .and_then(|l| l.get(k).cloned())
                .unwrap_or_default()
        };
        self.nodeclaims_disrupted
            .get_or_create(&DisruptedLabels {
                reason: snake(reason),
                nodepool: label(NODEPOOL_LABEL),
                capacity_type: label(CAPACITY_TYPE_LABEL),
            })
            .inc();
    }

    /// A NodeClaim is gone (its finalizer removed).
    pub fn terminated(&self, nc: &crate::api::NodeClaim) {
        let label = |k: &str| {
            nc.metadata
                .labels
                .as_ref()
                .and_then(|l| l.get(k).cloned())
                .unwrap_or_default()
        };
        self.nodeclaims_terminated
            .get_or_create(&TerminatedLabels {
                nodepool: label(NODEPOOL_LABEL),
                capacity_type: label(CAPACITY_TYPE_LABEL),
            })
            .inc();
    }

    /// A voluntary disruption command: `delete` or `replace`, for `reason`, by
    /// `consolidation_type` (`empty`, `single`, `multi`, or "" for drift).
    pub fn decision(&self, decision: &str, reason: &str, consolidation_type: &str) {
        self.decisions
            .get_or_create(&DecisionLabels {
                decision: decision.to_string(),
                reason: reason.to_lowercase(),
                consolidation_type: consolidation_type.to_string(),
            })
            .inc();
    }

    /// The scrape-time gauges, recomputed from the state.
    fn refresh(&self) {
        let Some(state) = lock(&self.state).clone() else {
            return;
        };
        let st = state.read();
        self.synced.set(i64::from(st.synced()));
        self.node_count.set(st.nodes.len() as i64);
        self.nodepool_usage.clear();
        self.nodepool_limit.clear();
        for (name, pool) in &st.nodepools {
            let labels = |r: &str| PoolResourceLabels {
                nodepool: name.clone(),
                resource_type: r.to_string(),
            };
            for (r, q) in &pool.spec.limits {
                if let Some(v) = quantity::parse(q) {
                    self.nodepool_limit
                        .get_or_create(&labels(r))
                        .set(v as f64 / 1000.0);
                }
            }
            for (r, v) in pool_usage(&st, name) {
                self.nodepool_usage.get_or_create(&labels(&r)).set(v);
            }
        }
        self.pods_state.clear();
        for p in st.pods.values() {
            self.pods_state.get_or_create(&pod_labels(&st, p)).set(1);
        }
    }

    /// Append core's exposition (without an `# EOF`).
    pub fn encode_into(&self, out: &mut String) -> std::fmt::Result {
        self.refresh();
        prometheus_client::encoding::text::encode_registry(out, &self.registry)
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reasons_in_core_snake_case() {
        assert_eq!(snake("Underutilized"), "underutilized");
        assert_eq!(snake("Empty"), "empty");
        assert_eq!(snake("NodeClaimNotFound"), "node_claim_not_found");
    }
}
