//! `SSHJoinProfile`: the four scripts that make a host a node and take it back out.

use kube::{CustomResource, KubeSchema};
use serde::{Deserialize, Serialize};

/// Scripts are Go-template text; each is at most 256 KiB.
pub const MAX_SCRIPT_BYTES: usize = 256 * 1024;

#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[kube(
    group = "karpenter.dklesev.github.io",
    version = "v1beta1",
    kind = "SSHJoinProfile",
    plural = "sshjoinprofiles",
    shortname = "sjp",
    category = "karpenter",
    printcolumn = r#"{"name":"Version","type":"string","jsonPath":".spec.version"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct SSHJoinProfileSpec {
    /// Bumped whenever `install` changes behaviour: the only install-cache invalidation.
    #[serde(default = "default_version")]
    #[schemars(regex(pattern = r"^[A-Za-z0-9._-]{1,63}$"))]
    pub version: String,
    pub scripts: Scripts,
    #[serde(default)]
    pub timeouts: Timeouts,
    /// v1 signatures: armored SSHSIG (namespace `kpssh`) over each script's exact bytes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub signatures: Option<PhaseSignatures>,
    /// v2 signatures: over a manifest binding phase, profile@version, script digest and expiry.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        rename = "signaturesV2"
    )]
    pub signatures_v2: Option<ManifestSignatures>,
}

#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct Scripts {
    /// At most 256 KiB in bytes (`maxLength` counts characters; the rule counts UTF-8 bytes,
    /// as the controller does).
    #[schemars(length(min = 1, max = 262144))]
    #[x_kube(validation = Rule::new("size(bytes(self)) <= 262144").message("a script must be at most 262144 bytes (256 KiB) of UTF-8"))]
    pub install: String,
    #[schemars(length(min = 1, max = 262144))]
    #[x_kube(validation = Rule::new("size(bytes(self)) <= 262144").message("a script must be at most 262144 bytes (256 KiB) of UTF-8"))]
    pub join: String,
    #[schemars(length(min = 1, max = 262144))]
    #[x_kube(validation = Rule::new("size(bytes(self)) <= 262144").message("a script must be at most 262144 bytes (256 KiB) of UTF-8"))]
    pub leave: String,
    /// Never run by the controller; kept for operators.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 262144))]
    #[x_kube(validation = Rule::new("size(bytes(self)) <= 262144").message("a script must be at most 262144 bytes (256 KiB) of UTF-8"))]
    pub uninstall: Option<String>,
}

#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct Timeouts {
    #[serde(default = "default_install_timeout")]
    #[schemars(regex(pattern = r"^([0-9]+(s|m|h))+$"), length(max = 32))]
    pub install: String,
    #[serde(default = "default_join_timeout")]
    #[schemars(regex(pattern = r"^([0-9]+(s|m|h))+$"), length(max = 32))]
    pub join: String,
    #[serde(default = "default_leave_timeout")]
    #[schemars(regex(pattern = r"^([0-9]+(s|m|h))+$"), length(max = 32))]
    pub leave: String,
}

impl Default for Timeouts {
    fn default() -> Self {
        Timeouts {
            install: default_install_timeout(),
            join: default_join_timeout(),
            leave: default_leave_timeout(),
        }
    }
}

#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Default)]
pub struct PhaseSignatures {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 16384))]
    pub install: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 16384))]
    pub join: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 16384))]
    pub leave: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 16384))]
    pub uninstall: Option<String>,
}

#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Default)]
pub struct ManifestSignatures {
    /// UTC time after which hosts refuse these signatures, exactly `YYYY-MM-DDTHH:MM:SSZ` (the
    /// manifest carries this string; the controller and the shim accept no other shape).
    #[schemars(length(min = 20, max = 20))]
    #[x_kube(validation = Rule::new("self.matches('^[0-9]{4}-(0[1-9]|1[0-2])-(0[1-9]|[12][0-9]|3[01])T([01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9]Z$')").message("signaturesV2.expires must be a UTC time YYYY-MM-DDTHH:MM:SSZ (whole seconds, no offset)"))]
    pub expires: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 16384))]
    pub install: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 16384))]
    pub join: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 16384))]
    pub leave: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 16384))]
    pub uninstall: Option<String>,
}

impl SSHJoinProfile {
    /// The install marker this profile writes: `<name>@<version>`.
    pub fn marker(&self) -> String {
        format!(
            "{}@{}",
            self.metadata.name.as_deref().unwrap_or_default(),
            self.spec.version
        )
    }
}

fn default_version() -> String {
    "1".to_string()
}
fn default_install_timeout() -> String {
    "10m".to_string()
}
fn default_join_timeout() -> String {
    "5m".to_string()
}
fn default_leave_timeout() -> String {
    "3m".to_string()
}
