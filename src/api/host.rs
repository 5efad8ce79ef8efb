//! `SSHHost`: one machine reachable over SSH that can be lent to the cluster as a Node.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::{CustomResource, KubeSchema};
use serde::{Deserialize, Serialize};

use super::{DEFAULT_HOST_CLASS, HOST_CLASS_LABEL, MAINTENANCE_ANNOTATION, PROBE_ANNOTATION};

/// Desired state of a host: how to reach it and what it offers.
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[kube(
    group = "karpenter.dklesev.github.io",
    version = "v1beta1",
    kind = "SSHHost",
    plural = "sshhosts",
    namespaced,
    status = "SSHHostStatus",
    shortname = "sshh",
    category = "karpenter",
    printcolumn = r#"{"name":"Address","type":"string","jsonPath":".spec.address"}"#,
    printcolumn = r#"{"name":"Port","type":"integer","jsonPath":".spec.port"}"#,
    printcolumn = r#"{"name":"Class","type":"string","jsonPath":".metadata.labels.karpenter\\.dklesev\\.github\\.io/host-class"}"#,
    printcolumn = r#"{"name":"State","type":"string","jsonPath":".status.state"}"#,
    printcolumn = r#"{"name":"Ready","type":"string","jsonPath":".status.conditions[?(@.type==\"Ready\")].status"}"#,
    printcolumn = r#"{"name":"Claim","type":"string","jsonPath":".status.claimRef.name"}"#,
    printcolumn = r#"{"name":"Installed","type":"string","jsonPath":".status.installedProfile"}"#,
    printcolumn = r#"{"name":"Backoff","type":"date","jsonPath":".status.launchBackoff.until"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#,
    printcolumn = r#"{"name":"Error","type":"string","jsonPath":".status.conditions[?(@.status==\"False\")].message"}"#
)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new(
    "self.execMode != 'Verified' || (has(self.trustedSigners) && size(self.trustedSigners) >= 1)"
).message("execMode Verified requires at least one entry in trustedSigners"))]
pub struct SSHHostSpec {
    /// DNS name or IP the controller dials ([`valid_address`]). Immutable: a different address
    /// is a different host.
    #[schemars(length(min = 1, max = 253))]
    #[x_kube(validation = Rule::new("self == oldSelf").message("address is immutable; create a new SSHHost instead"))]
    #[x_kube(validation = Rule::new("isIP(self) || self.matches('^[A-Za-z0-9]([-A-Za-z0-9]{0,61}[A-Za-z0-9])?(\\\\.[A-Za-z0-9]([-A-Za-z0-9]{0,61}[A-Za-z0-9])?)*$')").message("address must be an IP literal or a DNS name"))]
    pub address: String,
    #[serde(default = "default_port")]
    #[schemars(range(min = 1, max = 65535))]
    pub port: i32,
    #[serde(default = "default_user")]
    #[schemars(length(min = 1, max = 32))]
    pub user: String,
    /// Secret in the pool namespace with `privateKey` and optionally `knownHost`.
    pub ssh_key_secret_ref: SecretRef,
    /// IP literal the kubelet advertises; falls back to `address`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("isIP(self)").message("nodeAddress must be an IPv4 or IPv6 literal"))]
    pub node_address: Option<String>,
    /// Declared capacity; must hold cpu and memory, extended resources pass through.
    #[x_kube(validation = Rule::new("'cpu' in self && 'memory' in self").message("capacity must hold cpu and memory"))]
    pub capacity: BTreeMap<String, Quantity>,
    #[serde(default)]
    pub exec_mode: ExecMode,
    /// OpenSSH public key lines allowed to sign profiles for a Verified host.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 16))]
    pub trusted_signers: Option<Vec<String>>,
    /// Host-side shim that runs verified scripts (sshd ForceCommand).
    #[serde(default = "default_shim_command")]
    #[schemars(length(min = 1, max = 4096))]
    pub shim_command: String,
    /// Optional bastion the controller connects through.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub proxy_jump: Option<ProxyJump>,
}

/// Reference to a Secret by name (in the namespace the referring object implies).
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Default)]
pub struct SecretRef {
    #[schemars(length(min = 1, max = 253))]
    pub name: String,
}

/// A bastion host: the controller dials `address` and opens a TCP channel to the host from it.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ProxyJump {
    /// DNS name or IP of the bastion ([`valid_address`]).
    #[schemars(length(min = 1, max = 253))]
    #[x_kube(validation = Rule::new("isIP(self) || self.matches('^[A-Za-z0-9]([-A-Za-z0-9]{0,61}[A-Za-z0-9])?(\\\\.[A-Za-z0-9]([-A-Za-z0-9]{0,61}[A-Za-z0-9])?)*$')").message("address must be an IP literal or a DNS name"))]
    pub address: String,
    #[serde(default = "default_port")]
    #[schemars(range(min = 1, max = 65535))]
    pub port: i32,
    #[serde(default = "default_user")]
    #[schemars(length(min = 1, max = 32))]
    pub user: String,
    pub ssh_key_secret_ref: SecretRef,
}

#[derive(
    schemars::JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Default,
)]
pub enum ExecMode {
    /// Scripts run as `sudo bash -s` with an exported environment preamble.
    #[default]
    Raw,
    /// Signed scripts run unchanged through the host shim, which re-verifies them.
    Verified,
}

/// Observed state; written only by the host's actor, always as a compare-and-swap.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct SSHHostStatus {
    #[serde(default)]
    pub state: HostState,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub claim_ref: Option<ClaimRef>,
    /// Install marker `<profile>@<version>`; kept across leave so the next join is warm.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub installed_profile: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[serde(rename = "bootstrapTokenID")]
    pub bootstrap_token_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[serde(rename = "providerID")]
    pub provider_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host_key_fingerprint: Option<String>,
    /// The bastion's host key, pinned on first use like `hostKeyFingerprint` (unless the
    /// bastion's key Secret carries `knownHost`, which wins); for the bastion at `endpoint`
    /// only: a `spec.proxyJump` pointing elsewhere is pinned anew.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub proxy_jump_host_key: Option<PinnedHostKey>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_capacity: Option<BTreeMap<String, Quantity>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_arch: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_probe_time: Option<Time>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_probe_error: Option<String>,
    /// The last failed launch (S64): its phase, exit status and the end of its output.
    /// Probe errors stay in `lastProbeError`; this field carries launch failures only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_launch_failure: Option<LaunchFailure>,
    /// Backoff after failed launches (S63): the router does not choose this host before
    /// `until`. Cleared by a launch whose Node registered, or by a spec or key Secret change.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub launch_backoff: Option<LaunchBackoff>,
    /// A Node this host backed whose claim ended while its kubelet may still run (a release
    /// whose leave failed, a claim that vanished): kpssh deletes it, dropping its
    /// `karpenter.sh/termination` finalizer, once a probe shows the kubelet stopped, and the
    /// zombie guard counts it as this host's. Cleared when the Node is gone. Kept here rather
    /// than in memory so that a controller restart cannot leave the Node wedged.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub orphan_node: Option<OrphanNode>,
}

/// The Node a host backed after its claim ended ([`SSHHostStatus::orphan_node`]).
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct OrphanNode {
    /// The Node's name.
    #[schemars(length(min = 1, max = 253))]
    pub name: String,
    /// The Node's `spec.providerID` when it was recorded: a Node of that name with another
    /// provider ID is another machine's and is never touched.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[serde(rename = "providerID")]
    #[schemars(length(max = 512))]
    pub provider_id: Option<String>,
}

/// A launch that failed, as the host's status records it (S64). Never holds secret values:
/// the output is redacted before it is cut to its end.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct LaunchFailure {
    /// `install`, `join`, `registration` (joined, but no Node registered in time) or
    /// `configuration` (nothing reached the host).
    pub phase: String,
    /// The event reason: LaunchFailed, RegistrationTimeout, ConfigurationError.
    pub reason: String,
    /// The script's exit status, when it ran to an exit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exit_status: Option<i32>,
    /// What went wrong: for a script, the end of its (redacted) output.
    #[schemars(length(max = 4096))]
    pub message: String,
    /// The NodeClaim the launch was for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_claim: Option<String>,
    pub time: Time,
}

/// Consecutive failed launches of a host and when it may be claimed again (S63).
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct LaunchBackoff {
    /// Failed launches since the last one that succeeded (or since a spec or Secret change).
    pub failures: i32,
    /// The host is not claimed before this time. Cleared when it has passed; `failures` stays,
    /// so the next failure waits twice as long.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub until: Option<Time>,
    /// resourceVersions of the key Secret(s) (host, then bastion) when the last failure was
    /// recorded: a Secret edited since then resets the backoff.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secret_version: Option<String>,
}

/// A host key pinned for one SSH endpoint.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct PinnedHostKey {
    /// `address:port` the key was seen at.
    #[schemars(length(min = 1, max = 260))]
    pub endpoint: String,
    /// `SHA256:` and 43 base64 characters.
    #[schemars(length(min = 1, max = 128))]
    pub fingerprint: String,
}

/// The NodeClaim holding a host, by name and UID (a reused name is a different claim).
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Hash)]
pub struct ClaimRef {
    #[schemars(length(min = 1, max = 253))]
    pub name: String,
    #[schemars(length(min = 1, max = 128))]
    pub uid: String,
}

/// Closed set of host states (DESIGN §2 state machine).
#[derive(
    schemars::JsonSchema,
    Serialize,
    Deserialize,
    Clone,
    Copy,
    Debug,
    PartialEq,
    Eq,
    Hash,
    PartialOrd,
    Ord,
    Default,
)]
pub enum HostState {
    #[default]
    Pending,
    Available,
    Claimed,
    InUse,
    Unhealthy,
    Leaving,
    Maintenance,
}

impl HostState {
    pub const ALL: [HostState; 7] = [
        HostState::Pending,
        HostState::Available,
        HostState::Claimed,
        HostState::InUse,
        HostState::Unhealthy,
        HostState::Leaving,
        HostState::Maintenance,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            HostState::Pending => "Pending",
            HostState::Available => "Available",
            HostState::Claimed => "Claimed",
            HostState::InUse => "InUse",
            HostState::Unhealthy => "Unhealthy",
            HostState::Leaving => "Leaving",
            HostState::Maintenance => "Maintenance",
        }
    }

    /// The Ready condition's (status, reason) that mirrors a state (S8).
    pub fn ready_condition(self) -> (&'static str, &'static str) {
        match self {
            HostState::Available | HostState::Claimed | HostState::InUse | HostState::Leaving => {
                ("True", "ProbeSucceeded")
            }
            HostState::Unhealthy => ("False", "ProbeFailed"),
            HostState::Maintenance => ("False", "Maintenance"),
            HostState::Pending => ("Unknown", "AwaitingProbe"),
        }
    }
}

impl std::fmt::Display for HostState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl SSHHost {
    /// Host class (= instance type) from the label; `default` when the label is missing.
    pub fn class(&self) -> &str {
        self.metadata
            .labels
            .as_ref()
            .and_then(|l| l.get(HOST_CLASS_LABEL))
            .map(String::as_str)
            .unwrap_or(DEFAULT_HOST_CLASS)
    }

    pub fn in_maintenance(&self) -> bool {
        self.metadata
            .annotations
            .as_ref()
            .is_some_and(|a| a.contains_key(MAINTENANCE_ANNOTATION))
    }

    /// The probe annotation's value: a new value asks the host's actor for a probe now.
    pub fn probe_requested(&self) -> Option<&str> {
        self.metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(PROBE_ANNOTATION))
            .map(String::as_str)
    }

    pub fn state(&self) -> HostState {
        self.status.as_ref().map(|s| s.state).unwrap_or_default()
    }

    /// S63: a failed launch's backoff has not run out yet (the router does not choose it).
    pub fn backing_off(&self) -> bool {
        self.status
            .as_ref()
            .and_then(|s| s.launch_backoff.as_ref())
            .is_some_and(|b| b.until.is_some())
    }

    pub fn claim(&self) -> Option<&ClaimRef> {
        self.status.as_ref().and_then(|s| s.claim_ref.as_ref())
    }

    /// The IP the kubelet advertises: `nodeAddress`, else `address`.
    pub fn node_address(&self) -> &str {
        self.spec
            .node_address
            .as_deref()
            .unwrap_or(self.spec.address.as_str())
    }
}

/// An address the controller dials: an IPv4 or IPv6 literal, or a DNS name (labels of 1–63
/// letters, digits and inner hyphens, separated by dots), at most 253 characters. The CRD's
/// rule on `address` and `proxyJump.address` is the same (tests/admission.rs compares them).
pub fn valid_address(address: &str) -> bool {
    if address.parse::<std::net::IpAddr>().is_ok() {
        return true;
    }
    !address.is_empty()
        && address.len() <= 253
        && address.split('.').all(|label| {
            let b = label.as_bytes();
            !b.is_empty()
                && b.len() <= 63
                && b.iter().all(|c| c.is_ascii_alphanumeric() || *c == b'-')
                && b[0] != b'-'
                && b[b.len() - 1] != b'-'
        })
}

fn default_port() -> i32 {
    22
}

fn default_user() -> String {
    "root".to_string()
}

fn default_shim_command() -> String {
    "/opt/kpssh/kpssh-shim".to_string()
}
