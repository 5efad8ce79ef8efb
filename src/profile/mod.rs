//! Join profiles: template rendering, the `KPSSH_*` environment contract, Raw-mode execution
//! plans, validation and redaction. See `docs/join-profiles.md`.
//!
//! Typical use (Raw host):
//!
//! ```no_run
//! # use kpssh::profile::*;
//! # fn f(profile: &ProfileSource, ctx: &PhaseContext) -> Result<(), ProfileError> {
//! validate_profile(profile)?; // node class Ready=False/ProfileInvalid with e.to_string()
//! let rendered = render_phase(profile, Phase::Join, ctx, ExecMode::Raw)?;
//! let plan = raw_plan(&rendered, "ubuntu")?; // plan.command, plan.stdin
//! // … run it with rendered.timeout; quote stderr only through
//! // rendered.redactor.tail(&stderr, 2048).
//! # Ok(()) }
//! ```

pub mod env;
pub mod phase;
pub mod raw;
pub mod redact;
pub mod template;
pub mod validate;
pub mod verified;

pub use env::{Env, EnvError, EnvValue, build_env};
pub use phase::{
    ExecMode, Phase, PhaseContext, ProfileSource, RenderedPhase, Scripts, Taint, Timeouts,
    raw_plan, render_phase,
};
pub use raw::RawPlan;
pub use redact::Redactor;
pub use template::TemplateError;
pub use validate::{
    PhaseTimeouts, ValidProfile, check_verified_profile, check_verified_script, validate_profile,
};

/// Everything that can be wrong with a profile or with rendering one of its phases. Messages
/// name the profile and the phase and never contain a secret value; they are fit for a node
/// class `ProfileInvalid` condition, a NodeClaim event or a log line.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProfileError {
    #[error("profile {profile}: {phase} script is missing")]
    MissingScript { profile: String, phase: Phase },
    #[error(
        "profile {profile}: {phase} script is {size} bytes, over the limit of {} bytes (256 KiB)",
        validate::MAX_SCRIPT_BYTES
    )]
    ScriptTooLarge {
        profile: String,
        phase: Phase,
        size: usize,
    },
    #[error("profile {profile}: {phase} script does not parse: {error}")]
    Parse {
        profile: String,
        phase: Phase,
        error: TemplateError,
    },
    #[error("profile {profile}: rendering the {phase} script failed: {error}")]
    Render {
        profile: String,
        phase: Phase,
        error: TemplateError,
    },
    #[error(
        "profile {profile}: timeouts.{phase} {value:?} is not a duration matching ^([0-9]+(s|m|h))+$ (e.g. 90s, 10m, 1h30m)"
    )]
    BadTimeout {
        profile: String,
        phase: Phase,
        value: String,
    },
    #[error("profile {profile}: version {value:?} does not match ^[A-Za-z0-9._-]{{1,63}}$")]
    BadVersion { profile: String, value: String },
    #[error(
        "profile {profile}: leave script {reason}; leave runs with an empty context (release path, zombie guard): only .HostAddress and .NodeAddress have values, .Vars and .Secrets are empty"
    )]
    LeaveNeedsContext { profile: String, reason: String },
    #[error(
        "profile {profile}: {phase} script contains template actions ({{{{) but the host runs Verified: signed bytes run verbatim, per-node values must come from KPSSH_* environment"
    )]
    VerifiedTemplated { profile: String, phase: Phase },
    #[error(
        "profile {profile}: {phase} needs a cluster endpoint: set spec.cluster on the node class or publish kube-public/cluster-info"
    )]
    NoClusterEndpoint { profile: String, phase: Phase },
    #[error("profile {profile}: {phase} environment: {error}")]
    Env {
        profile: String,
        phase: Phase,
        error: EnvError,
    },
}

impl ProfileError {
    /// The phase concerned, when the error is about one.
    pub fn phase(&self) -> Option<Phase> {
        match self {
            ProfileError::MissingScript { phase, .. }
            | ProfileError::ScriptTooLarge { phase, .. }
            | ProfileError::Parse { phase, .. }
            | ProfileError::Render { phase, .. }
            | ProfileError::BadTimeout { phase, .. }
            | ProfileError::VerifiedTemplated { phase, .. }
            | ProfileError::NoClusterEndpoint { phase, .. }
            | ProfileError::Env { phase, .. } => Some(*phase),
            ProfileError::LeaveNeedsContext { .. } => Some(Phase::Leave),
            ProfileError::BadVersion { .. } => None,
        }
    }
}

#[cfg(test)]
mod tests;
