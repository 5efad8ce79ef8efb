//! Rendering one phase of a profile for one host: script bytes, environment, timeout, redactor.

use std::collections::BTreeMap;
use std::fmt;
use std::time::Duration;

use super::ProfileError;
use super::env::{Env, build_env};
use super::raw::{PhaseLock, RawPlan, build_raw_plan};
use super::redact::Redactor;
use super::template::{ContextData, Template, Value};
use super::validate::{MAX_SCRIPT_BYTES, check_verified_script, phase_timeout};
use crate::secret::Secret;

/// A profile phase.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Phase {
    /// Once per host per profile version (cached in `status.installedProfile`).
    Install,
    /// Every claim.
    Join,
    /// Every release; must keep the warm-pool invariant and survive a reboot.
    Leave,
    /// Never run by the controller.
    Uninstall,
}

impl Phase {
    pub const ALL: [Phase; 4] = [Phase::Install, Phase::Join, Phase::Leave, Phase::Uninstall];

    pub fn as_str(self) -> &'static str {
        match self {
            Phase::Install => "install",
            Phase::Join => "join",
            Phase::Leave => "leave",
            Phase::Uninstall => "uninstall",
        }
    }
}

impl fmt::Display for Phase {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A taint from the NodeClaim (`spec.taints` and `spec.startupTaints`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Taint {
    pub key: String,
    /// Empty for a taint without a value.
    pub value: String,
    /// `NoSchedule`, `PreferNoSchedule` or `NoExecute`.
    pub effect: String,
}

/// Everything a phase may learn about the claim, the cluster and the host. Plain inputs: the
/// caller fills it from the node class, the NodeClaim, the host and the join Secret. `Debug`
/// never shows the token or secret values ([`Secret`]).
#[derive(Debug, Clone, Default)]
pub struct PhaseContext {
    /// API server URL: `spec.cluster.endpoint`, else `kube-public/cluster-info`. // S22
    pub cluster_endpoint: String,
    /// Base64 cluster CA (same source).
    pub cluster_ca_b64: String,
    /// `<id>.<secret>`; exported in `join` only.
    pub bootstrap_token: Option<Secret>,
    /// NodeClaim name.
    pub node_name: String,
    /// `kpssh://<namespace>/<host>` in Static mode, empty in Adopt mode.
    pub provider_id: String,
    /// NodeClaim labels (filtered to what a kubelet may set on itself).
    pub node_labels: BTreeMap<String, String>,
    /// NodeClaim taints (the unregistered taint is prepended).
    pub taints: Vec<Taint>,
    /// `SSHHost.spec.address`.
    pub host_address: String,
    /// `SSHHost.spec.nodeAddress`, else the address.
    pub node_address: String,
    /// `SSHNodeClass.spec.vars`.
    pub vars: BTreeMap<String, String>,
    /// The `joinSecretRef` Secret's data.
    pub secrets: BTreeMap<String, Secret>,
}

impl PhaseContext {
    /// The context a phase really sees: `leave` keeps only the host's addresses, `install` and
    /// `uninstall` lose the token.
    pub fn for_phase(&self, phase: Phase) -> PhaseContext {
        match phase {
            Phase::Join => self.clone(),
            Phase::Install | Phase::Uninstall => PhaseContext {
                bootstrap_token: None,
                ..self.clone()
            },
            Phase::Leave => PhaseContext {
                host_address: self.host_address.clone(),
                node_address: self.node_address.clone(),
                ..PhaseContext::default()
            },
        }
    }

    /// The Go-template data of `phase` (see `docs/join-profiles.md`): the Go provider's
    /// `profile.Context` — `ClusterEndpoint`, `ClusterCACert`, `BootstrapToken`, `NodeName`,
    /// `ProviderID`, `NodeLabels`, `RegisterWithTaints`, `HostAddress`, `NodeAddress`, `Vars`,
    /// `Secrets`. `NodeLabels` and `RegisterWithTaints` are the strings of `KPSSH_NODE_LABELS` /
    /// `KPSSH_TAINTS`. The data is restricted like the environment: no token outside `join`,
    /// only the addresses in `leave` (everything else empty, the maps nil, as the Go provider
    /// renders leave).
    pub fn template_data(&self, phase: Phase) -> Result<Value, super::env::EnvError> {
        let ctx = self.for_phase(phase);
        let leave = phase == Phase::Leave;
        let (node_labels, register_with_taints) = if leave {
            (String::new(), String::new())
        } else {
            (
                super::env::node_labels_value(&ctx.node_labels)?,
                super::env::taints_value(&ctx.taints)?,
            )
        };
        Ok(ContextData {
            cluster_endpoint: ctx.cluster_endpoint,
            cluster_ca_cert: ctx.cluster_ca_b64,
            bootstrap_token: ctx.bootstrap_token.unwrap_or_default(),
            node_name: ctx.node_name,
            provider_id: ctx.provider_id,
            node_labels,
            register_with_taints,
            host_address: ctx.host_address,
            node_address: ctx.node_address,
            vars: (!leave).then_some(ctx.vars),
            secrets: (!leave).then_some(ctx.secrets),
        }
        .into_value())
    }

    /// A redactor for everything secret in this context (token, its secret half, secrets ≥ 8
    /// characters).
    pub fn redactor(&self) -> Redactor {
        Redactor::new(self.bootstrap_token.as_ref(), self.secrets.values())
    }
}

/// The scripts of a profile, as written (`None` or empty = missing).
#[derive(Debug, Clone, Default)]
pub struct Scripts {
    pub install: Option<String>,
    pub join: Option<String>,
    pub leave: Option<String>,
    pub uninstall: Option<String>,
}

/// `spec.timeouts`, as written (Go durations restricted to `^([0-9]+(s|m|h))+$`).
#[derive(Debug, Clone, Default)]
pub struct Timeouts {
    pub install: Option<String>,
    pub join: Option<String>,
    pub leave: Option<String>,
}

/// A join profile as plain data (filled from an `SSHJoinProfile`).
#[derive(Debug, Clone, Default)]
pub struct ProfileSource {
    /// `metadata.name`.
    pub name: String,
    /// `spec.version`; `None` or empty = `"1"`.
    pub version: Option<String>,
    pub scripts: Scripts,
    pub timeouts: Timeouts,
}

impl ProfileSource {
    /// The script of `phase`; `None` when unset or empty.
    pub fn script(&self, phase: Phase) -> Option<&str> {
        let s = match phase {
            Phase::Install => &self.scripts.install,
            Phase::Join => &self.scripts.join,
            Phase::Leave => &self.scripts.leave,
            Phase::Uninstall => &self.scripts.uninstall,
        };
        s.as_deref().filter(|s| !s.is_empty())
    }

    /// `spec.version` with its default.
    pub fn version(&self) -> &str {
        self.version
            .as_deref()
            .filter(|v| !v.is_empty())
            .unwrap_or("1")
    }

    /// `<profile>@<version>`, the install cache key stored in `SSHHost.status.installedProfile`.
    // S16
    pub fn installed_marker(&self) -> String {
        format!("{}@{}", self.name, self.version())
    }
}

/// How the host runs scripts (`SSHHost.spec.execMode`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ExecMode {
    /// Scripts are rendered and run as `sudo bash -s` with the env preamble.
    #[default]
    Raw,
    /// Signed bytes run verbatim through the host shim; no templates allowed.
    Verified,
}

/// One phase ready to run.
#[derive(Clone)]
pub struct RenderedPhase {
    pub profile: String,
    pub phase: Phase,
    /// Raw mode: the rendered script. Verified mode: the script exactly as signed.
    pub script: Vec<u8>,
    pub env: Env,
    pub timeout: Duration,
    /// Apply to anything quoted from this phase's output before it leaves the controller.
    pub redactor: Redactor,
}

impl fmt::Debug for RenderedPhase {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // The rendered script may hold secrets ({{ .Secrets.x }}); show its size only.
        f.debug_struct("RenderedPhase")
            .field("profile", &self.profile)
            .field("phase", &self.phase)
            .field("script_len", &self.script.len())
            .field("env", &self.env)
            .field("timeout", &self.timeout)
            .finish()
    }
}

/// Renders `phase` of `profile` for a host. Fails — before any host is touched — on a missing or
/// oversized script, a bad timeout, a template that does not parse or render, a templated script
/// for a Verified host, or a bad environment (colliding secret keys, invalid names, NUL). // S18
///
/// The profile should have passed [`super::validate::validate_profile`]; this re-checks what it
/// needs. Error texts never contain secret values.
pub fn render_phase(
    profile: &ProfileSource,
    phase: Phase,
    ctx: &PhaseContext,
    mode: ExecMode,
) -> Result<RenderedPhase, ProfileError> {
    let name = profile.name.clone();
    let src = profile.script(phase).ok_or(ProfileError::MissingScript {
        profile: name.clone(),
        phase,
    })?;
    if src.len() > MAX_SCRIPT_BYTES {
        return Err(ProfileError::ScriptTooLarge {
            profile: name,
            phase,
            size: src.len(),
        });
    }
    let timeout = phase_timeout(profile, phase)?;
    if phase == Phase::Join && ctx.cluster_endpoint.is_empty() {
        // S22
        return Err(ProfileError::NoClusterEndpoint {
            profile: name,
            phase,
        });
    }
    let redactor = ctx.redactor();
    let ctx = ctx.for_phase(phase);
    let env = build_env(phase, &ctx).map_err(|error| ProfileError::Env {
        profile: name.clone(),
        phase,
        error,
    })?;
    let script = match mode {
        ExecMode::Verified => {
            check_verified_script(&name, phase, src)?;
            src.as_bytes().to_vec()
        }
        ExecMode::Raw => {
            let tpl = Template::parse_named(src, phase.as_str()).map_err(|error| {
                ProfileError::Parse {
                    profile: name.clone(),
                    phase,
                    error,
                }
            })?;
            let data = ctx
                .template_data(phase)
                .map_err(|error| ProfileError::Env {
                    profile: name.clone(),
                    phase,
                    error,
                })?;
            tpl.render(&data).map_err(|mut error| {
                error.msg = redactor.redact(&error.msg);
                ProfileError::Render {
                    profile: name.clone(),
                    phase,
                    error,
                }
            })?
        }
    };
    Ok(RenderedPhase {
        profile: name,
        phase,
        script,
        env,
        timeout,
        redactor,
    })
}

/// The Raw-mode command and stdin for a rendered phase (see [`super::raw`]); the host's phase
/// lock is keyed by its address (`KPSSH_HOST_ADDRESS`, which every phase gets).
pub fn raw_plan(rendered: &RenderedPhase, user: &str) -> Result<RawPlan, ProfileError> {
    let address = rendered
        .env
        .get("KPSSH_HOST_ADDRESS")
        .map(|v| v.expose().to_string())
        .unwrap_or_default();
    let lock = PhaseLock::for_host(&address, rendered.timeout);
    build_raw_plan(&rendered.env, &rendered.script, user, &lock).map_err(|error| {
        ProfileError::Env {
            profile: rendered.profile.clone(),
            phase: rendered.phase,
            error,
        }
    })
}
