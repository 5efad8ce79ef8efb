//! `SSHNodeClass`: which hosts back a NodePool and how they join.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, LabelSelector};
use kube::{CustomResource, KubeSchema};
use serde::{Deserialize, Serialize};

use super::host::SecretRef;

#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[kube(
    group = "karpenter.dklesev.github.io",
    version = "v1beta1",
    kind = "SSHNodeClass",
    plural = "sshnodeclasses",
    status = "SSHNodeClassStatus",
    shortname = "snc",
    category = "karpenter",
    printcolumn = r#"{"name":"Profile","type":"string","jsonPath":".spec.joinProfileRef.name"}"#,
    printcolumn = r#"{"name":"Ready","type":"string","jsonPath":".status.conditions[?(@.type==\"Ready\")].status"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct SSHNodeClassSpec {
    /// Selects SSHHosts in the pool namespace; empty selects all.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host_selector: Option<LabelSelector>,
    pub join_profile_ref: ProfileRef,
    /// Passed to scripts as `KPSSH_VAR_<key>` and `.Vars`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("maxProperties" = 64))]
    #[x_kube(validation = Rule::new("self.all(k, k.matches('^[A-Za-z_][A-Za-z0-9_]*$'))").message("vars keys must be shell identifiers ([A-Za-z_][A-Za-z0-9_]*)"))]
    #[x_kube(validation = Rule::new("self.all(k, size(self[k]) <= 2048)").message("vars values must be at most 2048 characters"))]
    pub vars: Option<BTreeMap<String, String>>,
    /// Secret in the pool namespace whose keys become `KPSSH_SECRET_<KEY>` at join time.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub join_secret_ref: Option<SecretRef>,
    #[serde(default, rename = "providerIDSource")]
    pub provider_id_source: ProviderIdSource,
    /// Decimal price of one vCPU-hour of attached capacity.
    #[serde(default = "default_price", rename = "pricePerCPUHour")]
    #[schemars(regex(pattern = r"^[0-9]+(\.[0-9]+)?$"), length(max = 32))]
    pub price_per_cpu_hour: String,
    #[serde(default = "default_kube_reserved")]
    #[x_kube(validation = Rule::new("self.all(k, k in ['cpu', 'memory', 'ephemeral-storage'])").message("kubeReserved may only hold cpu, memory and ephemeral-storage"))]
    pub kube_reserved: BTreeMap<String, Quantity>,
    #[serde(default = "default_max_pods")]
    #[schemars(range(min = 1, max = 10000))]
    pub max_pods: i32,
    /// Cluster endpoint and CA; when absent they are read from `kube-public/cluster-info`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cluster: Option<ClusterEndpoint>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 32))]
    #[x_kube(validation = Rule::new("self.all(g, self.exists_one(h, h.taintKey == g.taintKey))").message("startupTaintGates taintKey values must be unique"))]
    pub startup_taint_gates: Option<Vec<StartupTaintGate>>,
}

#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct ProfileRef {
    #[schemars(length(min = 1, max = 253))]
    pub name: String,
}

#[derive(
    schemars::JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Default,
)]
pub enum ProviderIdSource {
    /// kpssh owns node identity: `kpssh://<namespace>/<host>`.
    #[default]
    Static,
    /// The join mechanism sets the provider ID; kpssh adopts it by InternalIP match.
    Adopt,
}

#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct ClusterEndpoint {
    #[schemars(length(min = 9, max = 2048))]
    #[x_kube(validation = Rule::new("self.startsWith('https://')").message("cluster.endpoint must be an https:// URL"))]
    pub endpoint: String,
    /// Base64 PEM bundle of the cluster CA.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 65536))]
    pub ca_bundle: Option<String>,
}

/// Removes `taintKey` (a startup taint) from a node once `removeWhen` holds: the Go provider's
/// v1.1 shape, `taintKey` plus a `removeWhen` union.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct StartupTaintGate {
    #[schemars(length(min = 1, max = 316))]
    pub taint_key: String,
    pub remove_when: GateCondition,
}

/// When a gate opens: exactly one member (a strict union; new kinds become new members).
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("has(self.podsReady) != has(self.nodeCondition)").message("removeWhen needs exactly one of podsReady or nodeCondition"))]
pub struct GateCondition {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pods_ready: Option<PodsReadyGate>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_condition: Option<NodeConditionGate>,
}

#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct PodsReadyGate {
    #[schemars(length(min = 1, max = 63))]
    pub namespace: String,
    #[x_kube(validation = Rule::new("(has(self.matchLabels) && size(self.matchLabels) > 0) || (has(self.matchExpressions) && size(self.matchExpressions) > 0)").message("podsReady.selector must not be empty"))]
    pub selector: LabelSelector,
    #[serde(default = "default_min_ready")]
    #[schemars(range(min = 1))]
    pub min_ready: i32,
}

/// A node condition; `status` is optional and means `True` when absent (as the Go provider).
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct NodeConditionGate {
    #[serde(rename = "type")]
    #[schemars(length(min = 1, max = 316))]
    pub type_: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 32))]
    pub status: Option<String>,
}

impl NodeConditionGate {
    /// The status the condition must have: `status`, or `True` when unset.
    pub fn status_or_default(&self) -> &str {
        self.status.as_deref().unwrap_or("True")
    }
}

#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct SSHNodeClassStatus {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
}

/// Reasons of the node class Ready condition (S32).
pub mod reason {
    pub const READY: &str = "Ready";
    pub const PROFILE_NOT_FOUND: &str = "ProfileNotFound";
    pub const PROFILE_INVALID: &str = "ProfileInvalid";
    pub const SELECTOR_ERROR: &str = "SelectorError";
    pub const NO_HOSTS: &str = "NoHosts";
    /// Neither `spec.cluster` nor `kube-public/cluster-info` names the API server the hosts
    /// join (S22); without it every launch would fail before touching a host.
    pub const NO_CLUSTER_ENDPOINT: &str = "NoClusterEndpoint";
    /// Most recent launches of the class failed the same way: launches are paused (S63).
    pub const LAUNCHES_FAILING: &str = "LaunchesFailing";
}

fn default_price() -> String {
    "0.02".to_string()
}

fn default_kube_reserved() -> BTreeMap<String, Quantity> {
    BTreeMap::from([
        ("cpu".to_string(), Quantity("80m".to_string())),
        ("memory".to_string(), Quantity("300Mi".to_string())),
    ])
}

fn default_max_pods() -> i32 {
    110
}

fn default_min_ready() -> i32 {
    1
}
