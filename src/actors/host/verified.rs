//! Verified mode (S41, S42): the controller checks the signature against the host's
//! `trustedSigners` before any connection, then sends the signed bytes unchanged, with the
//! `KPSSH_*` parameters, as an envelope to the host shim, which verifies again.

use super::phases::PhaseFailure;
use crate::api::{SSHHost, SSHJoinProfile};
use crate::profile::phase::{Phase as RenderPhase, RenderedPhase};
use crate::profile::verified::{
    Params, Phase, PhaseRequest, PhaseSignatures, ProfileRef, TrustedSigners, VerifiedPolicy, exit,
    prepare,
};
use crate::ssh::RemoteCommand;

/// The shim invocation for one phase, or a configuration error that never touched the host.
pub fn command(
    host: &SSHHost,
    profile: &SSHJoinProfile,
    rendered: &RenderedPhase,
    now: jiff::Timestamp,
    policy: VerifiedPolicy,
) -> Result<RemoteCommand, PhaseFailure> {
    let host_name = host.metadata.name.clone().unwrap_or_default();
    let refuse = |why: String| {
        PhaseFailure::config(rendered.redactor.redact(&format!(
            "SSHHost {host_name}: verified {} refused before connecting: {why}",
            rendered.phase
        )))
    };
    let signers = host.spec.trusted_signers.clone().unwrap_or_default();
    let trusted = TrustedSigners::parse(&signers).map_err(|e| refuse(e.to_string()))?;
    let phase = phase(rendered.phase);
    let profile_name = profile.metadata.name.clone().unwrap_or_default();
    let profile_ref =
        ProfileRef::new(&profile_name, &profile.spec.version).map_err(|e| refuse(e.to_string()))?;
    let mut params = Params::new();
    for (name, value) in &rendered.env {
        params
            .insert(name.clone(), value.expose().to_string())
            .map_err(|e| refuse(e.to_string()))?;
    }
    let script = std::str::from_utf8(&rendered.script)
        .map_err(|_| refuse("the script is not UTF-8".into()))?;
    let request = PhaseRequest {
        phase,
        profile: profile_ref,
        script,
        signatures: signatures(profile, rendered.phase),
        params,
        shim_command: &host.spec.shim_command,
        allow_v1: policy.allow_v1,
        timeout: Some(rendered.timeout),
    };
    let run = prepare(&trusted, request, now).map_err(|e| refuse(e.to_string()))?;
    if run.version == 1 {
        // Allowed only by the explicit flag; say so every time, it is a downgrade.
        tracing::warn!(
            host = %host_name,
            profile = %profile_name,
            phase = %phase,
            "running a v1-signed script (not bound to phase, profile version or expiry) because \
             --allow-v1-signatures is set"
        );
    }
    // The shim parses the command line itself: send it unchanged.
    Ok(RemoteCommand::verbatim(run.command, rendered.timeout).with_stdin(run.stdin))
}

/// What a shim exit code means, for failure messages.
pub fn describe_exit(code: u32) -> &'static str {
    i32::try_from(code)
        .map(exit::describe)
        .unwrap_or("unexpected exit code")
}

fn phase(p: RenderPhase) -> Phase {
    match p {
        RenderPhase::Install => Phase::Install,
        RenderPhase::Join => Phase::Join,
        RenderPhase::Leave => Phase::Leave,
        RenderPhase::Uninstall => Phase::Uninstall,
    }
}

fn signatures(profile: &SSHJoinProfile, p: RenderPhase) -> PhaseSignatures {
    let pick = |install: &Option<String>,
                join: &Option<String>,
                leave: &Option<String>,
                uninstall: &Option<String>| match p {
        RenderPhase::Install => install.clone(),
        RenderPhase::Join => join.clone(),
        RenderPhase::Leave => leave.clone(),
        RenderPhase::Uninstall => uninstall.clone(),
    };
    let v1 = profile
        .spec
        .signatures
        .as_ref()
        .and_then(|s| pick(&s.install, &s.join, &s.leave, &s.uninstall));
    let v2 = profile.spec.signatures_v2.as_ref().and_then(|s| {
        pick(&s.install, &s.join, &s.leave, &s.uninstall).map(|sig| (s.expires.clone(), sig))
    });
    PhaseSignatures { v1, v2 }
}
