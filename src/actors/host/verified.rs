//! Verified mode: how a signed phase travels to the host shim.

use super::phases::PhaseFailure;
use crate::api::{SSHHost, SSHJoinProfile};
use crate::profile::phase::RenderedPhase;
use crate::ssh::RemoteCommand;

/// The command and envelope for a Verified host. Until the envelope builder lands, Verified
/// hosts are refused before any connection (a configuration error, S18).
pub fn command(
    host: &SSHHost,
    _profile: &SSHJoinProfile,
    rendered: &RenderedPhase,
) -> Result<RemoteCommand, PhaseFailure> {
    Err(PhaseFailure::config(format!(
        "SSHHost {}: execMode Verified is not available in this build; {} not run",
        host.metadata.name.as_deref().unwrap_or_default(),
        rendered.phase
    )))
}
