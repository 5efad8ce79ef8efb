//! The parts of Karpenter's `karpenter.sh/v1` NodePool and NodeClaim that kpssh uses.
//!
//! Fields kpssh does not model are kept in `extra` so a read-modify-write never drops them.
//! The generated CRDs are only for clusters without Karpenter's own (and for tests): they
//! preserve unknown fields rather than restating Karpenter's full schema.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Taint;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::{CustomResource, KubeSchema};
use serde::{Deserialize, Serialize};
use serde_json::Value;

pub const KARPENTER_GROUP: &str = "karpenter.sh";
pub const NODEPOOL_LABEL: &str = "karpenter.sh/nodepool";
pub const REGISTERED_LABEL: &str = "karpenter.sh/registered";
pub const INITIALIZED_LABEL: &str = "karpenter.sh/initialized";
pub const CAPACITY_TYPE_LABEL: &str = "karpenter.sh/capacity-type";
pub const UNREGISTERED_TAINT_KEY: &str = "karpenter.sh/unregistered";
pub const DISRUPTED_TAINT_KEY: &str = "karpenter.sh/disrupted";
pub const DO_NOT_DISRUPT_ANNOTATION: &str = "karpenter.sh/do-not-disrupt";
pub const TERMINATION_FINALIZER: &str = "karpenter.sh/termination";
pub const INSTANCE_TYPE_LABEL: &str = "node.kubernetes.io/instance-type";
pub const ARCH_LABEL: &str = "kubernetes.io/arch";
pub const OS_LABEL: &str = "kubernetes.io/os";
pub const ZONE_LABEL: &str = "topology.kubernetes.io/zone";

/// NodeClaim: a request for one node, fulfilled by claiming one host.
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[kube(
    group = "karpenter.sh",
    version = "v1",
    kind = "NodeClaim",
    plural = "nodeclaims",
    status = "NodeClaimStatus",
    category = "karpenter",
    printcolumn = r#"{"name":"Type","type":"string","jsonPath":".metadata.labels.node\\.kubernetes\\.io/instance-type"}"#,
    printcolumn = r#"{"name":"Node","type":"string","jsonPath":".status.nodeName"}"#,
    printcolumn = r#"{"name":"Ready","type":"string","jsonPath":".status.conditions[?(@.type==\"Ready\")].status"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-preserve-unknown-fields" = true))]
pub struct NodeClaimSpec {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub taints: Vec<Taint>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub startup_taints: Vec<Taint>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub requirements: Vec<NodeSelectorRequirement>,
    #[serde(default)]
    pub resources: ResourceRequests,
    pub node_class_ref: NodeClassRef,
    /// Upstream's pattern: a Go duration of s/m/h units, or `Never` (`30d`, `5min` are
    /// rejected at admission rather than misread).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = r"^(([0-9]+(s|m|h))+|Never)$"))]
    pub expire_after: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = r"^([0-9]+(s|m|h))+$"))]
    pub termination_grace_period: Option<String>,
    #[serde(flatten)]
    #[schemars(skip)]
    pub extra: BTreeMap<String, Value>,
}

#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-preserve-unknown-fields" = true))]
pub struct NodeClaimStatus {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_name: Option<String>,
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        rename = "providerID"
    )]
    pub provider_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none", rename = "imageID")]
    pub image_id: Option<String>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub capacity: BTreeMap<String, Quantity>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub allocatable: BTreeMap<String, Quantity>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_pod_event_time: Option<Time>,
    #[serde(flatten)]
    #[schemars(skip)]
    pub extra: BTreeMap<String, Value>,
}

/// A node selector requirement with Karpenter's optional `minValues`.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Default)]
#[serde(rename_all = "camelCase")]
pub struct NodeSelectorRequirement {
    #[schemars(length(max = 316))]
    pub key: String,
    /// Upstream's operators; anything else is rejected at admission.
    #[schemars(extend("enum" = ["In", "NotIn", "Exists", "DoesNotExist", "Gt", "Lt"]))]
    pub operator: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub values: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_values: Option<i32>,
}

#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
pub struct ResourceRequests {
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub requests: BTreeMap<String, Quantity>,
}

#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Default)]
pub struct NodeClassRef {
    pub group: String,
    pub kind: String,
    pub name: String,
}

impl NodeClassRef {
    /// True when the reference names an SSHNodeClass: only those are kpssh's (S31).
    pub fn is_ours(&self) -> bool {
        self.group == super::GROUP && self.kind == "SSHNodeClass"
    }
}

impl NodeClaim {
    pub fn is_ours(&self) -> bool {
        self.spec.node_class_ref.is_ours()
    }

    pub fn nodepool(&self) -> Option<&str> {
        self.metadata
            .labels
            .as_ref()
            .and_then(|l| l.get(NODEPOOL_LABEL))
            .map(String::as_str)
    }
}

/// NodePool: a template for NodeClaims plus limits and disruption rules.
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[kube(
    group = "karpenter.sh",
    version = "v1",
    kind = "NodePool",
    plural = "nodepools",
    status = "NodePoolStatus",
    category = "karpenter",
    printcolumn = r#"{"name":"NodeClass","type":"string","jsonPath":".spec.template.spec.nodeClassRef.name"}"#,
    printcolumn = r#"{"name":"Weight","type":"integer","jsonPath":".spec.weight"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-preserve-unknown-fields" = true))]
pub struct NodePoolSpec {
    pub template: NodeClaimTemplate,
    #[serde(default)]
    pub disruption: Disruption,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub limits: BTreeMap<String, Quantity>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub weight: Option<i32>,
    #[serde(flatten)]
    #[schemars(skip)]
    pub extra: BTreeMap<String, Value>,
}

#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[schemars(extend("x-kubernetes-preserve-unknown-fields" = true))]
pub struct NodeClaimTemplate {
    #[serde(default)]
    pub metadata: TemplateMetadata,
    pub spec: NodeClaimTemplateSpec,
}

// Labels and annotations of a NodePool's template. Absent and empty (`{}`) are kept apart:
// Karpenter core's NodePool hash tells a nil map from an empty one, and so must kpssh's, or a
// NodeClaim core stamped would look drifted (crate::karpenter::nodepool_hash). (Not a doc
// comment: it would become the CRD's description.)
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
pub struct TemplateMetadata {
    // The schema is core's (not nullable); only the Rust side keeps absent apart from empty.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(with = "BTreeMap<String, String>")]
    pub labels: Option<BTreeMap<String, String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(with = "BTreeMap<String, String>")]
    pub annotations: Option<BTreeMap<String, String>>,
}

static NO_STRINGS: BTreeMap<String, String> = BTreeMap::new();

impl TemplateMetadata {
    /// The template's labels (none when absent).
    pub fn labels(&self) -> &BTreeMap<String, String> {
        self.labels.as_ref().unwrap_or(&NO_STRINGS)
    }

    /// The template's annotations (none when absent).
    pub fn annotations(&self) -> &BTreeMap<String, String> {
        self.annotations.as_ref().unwrap_or(&NO_STRINGS)
    }
}

#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-preserve-unknown-fields" = true))]
pub struct NodeClaimTemplateSpec {
    // Absent and `[]` differ in core's hash, as for TemplateMetadata.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(with = "Vec<Taint>")]
    pub taints: Option<Vec<Taint>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(with = "Vec<Taint>")]
    pub startup_taints: Option<Vec<Taint>>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub requirements: Vec<NodeSelectorRequirement>,
    pub node_class_ref: NodeClassRef,
    /// Upstream's pattern: a Go duration of s/m/h units, or `Never` (`30d`, `5min` are
    /// rejected at admission rather than misread).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = r"^(([0-9]+(s|m|h))+|Never)$"))]
    pub expire_after: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = r"^([0-9]+(s|m|h))+$"))]
    pub termination_grace_period: Option<String>,
    #[serde(flatten)]
    #[schemars(skip)]
    pub extra: BTreeMap<String, Value>,
}

impl NodeClaimTemplateSpec {
    /// The template's taints (none when absent).
    pub fn taints(&self) -> &[Taint] {
        self.taints.as_deref().unwrap_or_default()
    }

    /// The template's startup taints (none when absent).
    pub fn startup_taints(&self) -> &[Taint] {
        self.startup_taints.as_deref().unwrap_or_default()
    }
}

#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct Disruption {
    /// `WhenEmpty` or `WhenEmptyOrUnderutilized` (Karpenter's default).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("enum" = ["WhenEmpty", "WhenEmptyOrUnderutilized"]))]
    pub consolidation_policy: Option<String>,
    /// Duration string (s/m/h units) or `Never`, upstream's pattern.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = r"^(([0-9]+(s|m|h))+|Never)$"))]
    pub consolidate_after: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub budgets: Vec<Budget>,
}

#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Default)]
pub struct Budget {
    /// A count (`"5"`) or a percentage (`"10%"`).
    #[schemars(regex(pattern = r"^((100|[0-9]{1,2})%|[0-9]+)$"))]
    pub nodes: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub schedule: Option<String>,
    /// Hours and minutes, upstream's pattern (`1h`, `30m`, `1h30m`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = r"^((([0-9]+(h|m))|([0-9]+h[0-9]+m))(0s)?)$"))]
    pub duration: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reasons: Option<Vec<String>>,
}

#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[schemars(extend("x-kubernetes-preserve-unknown-fields" = true))]
pub struct NodePoolStatus {
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub resources: BTreeMap<String, Quantity>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
    #[serde(flatten)]
    #[schemars(skip)]
    pub extra: BTreeMap<String, Value>,
}

impl NodePool {
    pub fn is_ours(&self) -> bool {
        self.spec.template.spec.node_class_ref.is_ours()
    }
}
