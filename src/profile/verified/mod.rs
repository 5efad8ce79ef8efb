//! Verified execution: signed profile scripts, checked by the controller before it connects and
//! again on the host by `kpssh-shim` (sshd `ForceCommand`) with stock `ssh-keygen -Y verify`.
//!
//! - [`sshsig`]: parse and verify armored SSHSIG blobs against `spec.trustedSigners`.
//! - [`envelope`]: the v1/v2 wire envelope written to the shim's stdin, and the v2 manifest.
//! - [`prepare`]: the controller's one call — verify, then build the command and stdin.
//!
//! See `docs/verified-exec.md` for the contract.

pub mod envelope;
pub mod sshsig;

pub use envelope::{
    Binding, Envelope, EnvelopeError, Expires, Params, Phase, ProfileRef, manifest_v2, shim_command,
};
pub use sshsig::{SigError, TrustedSigners, VerifiedSigner};

/// Exit codes of `kpssh-shim`.
pub mod exit {
    /// The script ran and exited 0 (or the probe succeeded).
    pub const OK: i32 = 0;
    /// Internal error in the shim (missing tool, unwritable temp dir, …).
    pub const INTERNAL: i32 = 1;
    /// Signature missing or not valid for a trusted signer.
    pub const SIGNATURE: i32 = 2;
    /// A parameter name or value was refused.
    pub const PARAMETER: i32 = 3;
    /// The envelope or the command line is malformed.
    pub const ENVELOPE: i32 = 4;
    /// Unknown phase, or not the phase that was requested.
    pub const PHASE: i32 = 5;
    /// v2: expired, for another profile/version than requested, or an older version replayed;
    /// also a v1 envelope on a shim without `--allow-v1`.
    pub const EXPIRED: i32 = 6;
    /// The script outlived the envelope's `timeout`; the shim's watchdog killed it.
    pub const TIMEOUT: i32 = 7;
    /// Another phase held the host's phase lock for longer than this one could wait.
    pub const BUSY: i32 = 8;
    /// The signed script ran and exited non-zero (its own code is printed on stderr).
    pub const SCRIPT_FAILED: i32 = 10;

    /// A short description of a shim exit code.
    pub fn describe(code: i32) -> &'static str {
        match code {
            OK => "ok",
            INTERNAL => "shim internal error",
            SIGNATURE => "signature refused",
            PARAMETER => "parameter refused",
            ENVELOPE => "malformed envelope",
            PHASE => "phase refused",
            EXPIRED => "signature expired, replayed or v1 refused",
            TIMEOUT => "killed by the shim after its timeout",
            BUSY => "another phase is running on the host",
            SCRIPT_FAILED => "signed script failed",
            _ => "unexpected exit code",
        }
    }
}

/// The controller's Verified-mode settings that are not part of any object.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct VerifiedPolicy {
    /// Run a phase that has no v2 signature with its v1 signature (`--allow-v1-signatures`).
    /// Off by default: v1 is downgradable (see [`PhaseRequest::allow_v1`]).
    pub allow_v1: bool,
}

/// Signatures of one phase as stored on an `SSHJoinProfile`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PhaseSignatures {
    /// `spec.signatures.<phase>`: armored SSHSIG over the script bytes.
    pub v1: Option<String>,
    /// `spec.signaturesV2.expires` and `spec.signaturesV2.<phase>`: armored SSHSIG over the
    /// [`manifest_v2`] text.
    pub v2: Option<(String, String)>,
}

/// Everything the controller knows about one verified phase run.
#[derive(Debug, Clone)]
pub struct PhaseRequest<'a> {
    /// The phase to run.
    pub phase: Phase,
    /// Profile name and `spec.version`.
    pub profile: ProfileRef,
    /// The script text (must be template-free; it is sent byte for byte).
    pub script: &'a str,
    /// Signatures from the profile.
    pub signatures: PhaseSignatures,
    /// Validated `KPSSH_*` parameters.
    pub params: Params,
    /// The host's `spec.shimCommand`.
    pub shim_command: &'a str,
    /// Whether a phase without a v2 signature may run with its v1 signature (the controller's
    /// explicit `--allow-v1-signatures`). Off, such a phase is refused: v1 binds neither
    /// phase, profile version nor expiry.
    pub allow_v1: bool,
    /// The phase timeout, sent in the envelope for the shim's watchdog (whole seconds, at least
    /// 1, at most [`envelope::MAX_TIMEOUT_SECS`]).
    pub timeout: Option<std::time::Duration>,
}

/// What to send: run `command` over SSH and write `stdin` to it. `Debug` shows the stdin's
/// length only (the envelope carries the parameters' values, #23).
#[derive(Clone)]
pub struct PreparedRun {
    /// Command line for the SSH exec request.
    pub command: String,
    /// The encoded envelope.
    pub stdin: Vec<u8>,
    /// Who signed it.
    pub signer: VerifiedSigner,
    /// Envelope version used (2 when v2 signatures exist, else 1).
    pub version: u8,
}

impl std::fmt::Debug for PreparedRun {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PreparedRun")
            .field("command", &self.command)
            .field("stdin_len", &self.stdin.len())
            .field("signer", &self.signer)
            .field("version", &self.version)
            .finish()
    }
}

/// Verify a phase's signature against the host's trusted signers and build the shim invocation.
/// Uses v2 (phase/profile/expiry-bound) when the profile carries a v2 signature for the phase;
/// v1 only when [`PhaseRequest::allow_v1`] says so, and never when a v2 signature exists (an
/// expired or bad v2 signature is an error, not a reason to fall back). Refuses unsigned and
/// templated scripts. Nothing here touches the network.
pub fn prepare(
    trusted: &TrustedSigners,
    req: PhaseRequest<'_>,
    now: jiff::Timestamp,
) -> Result<PreparedRun, EnvelopeError> {
    if req.script.contains("{{") {
        return Err(EnvelopeError::Format(
            "verified scripts must be template-free (found `{{`)".into(),
        ));
    }
    let script = req.script.as_bytes();
    let (env, profile) = match req.signatures.v2 {
        Some((expires, sig)) => {
            let expires: Expires = expires.parse()?;
            let env = Envelope::v2(
                req.phase,
                req.profile.clone(),
                expires,
                req.params,
                &sig,
                script,
            )?;
            (env, Some(req.profile))
        }
        None if req.allow_v1 => {
            let sig = req.signatures.v1.unwrap_or_default();
            (Envelope::v1(req.phase, req.params, &sig, script)?, None)
        }
        None if req.signatures.v1.is_none() => return Err(SigError::Missing.into()),
        None => {
            return Err(EnvelopeError::V1Refused(format!(
                "{} of {} has only a v1 signature (spec.signatures.{}), which binds neither the \
                 phase, the profile version nor an expiry: re-sign the profile with `kpssh sign` \
                 (writes spec.signaturesV2), or start the controller with \
                 --allow-v1-signatures to accept v1",
                req.phase, req.profile, req.phase
            )));
        }
    };
    let env = match req.timeout {
        Some(t) => {
            let secs = u32::try_from(t.as_secs().max(1))
                .unwrap_or(u32::MAX)
                .min(envelope::MAX_TIMEOUT_SECS);
            env.with_timeout(secs)?
        }
        None => env,
    };
    let signer = env.verify(trusted, now)?;
    Ok(PreparedRun {
        command: shim_command(req.shim_command, req.phase, profile.as_ref()),
        stdin: env.encode(),
        signer,
        version: env.version(),
    })
}

#[cfg(test)]
mod debug_tests {
    use super::*;
    use crate::ssh::RemoteCommand;

    /// #23: `Debug` of what carries phase parameters never shows their values (these types
    /// derived `Debug` and printed the bootstrap token).
    #[test]
    fn debug_never_shows_parameter_values() {
        const TOKEN: &str = "abcdef.0123456789abcdef";
        let mut params = Params::new();
        params
            .insert("KPSSH_BOOTSTRAP_TOKEN", TOKEN)
            .expect("param");
        params.insert("KPSSH_NODE_NAME", "n1").expect("param");
        let envelope = Envelope {
            phase: Phase::Join,
            binding: Binding::V1,
            params: params.clone(),
            signature: String::new(),
            script: b"echo hi\n".to_vec(),
            timeout_secs: Some(30),
        };
        let stdin = envelope.encode();
        let run = PreparedRun {
            command: "/opt/kpssh/kpssh-shim join".into(),
            stdin: stdin.clone(),
            signer: VerifiedSigner {
                fingerprint: "SHA256:x".into(),
                algorithm: "ssh-ed25519".into(),
                index: 0,
            },
            version: 1,
        };
        let command = RemoteCommand::new("sudo bash -s", std::time::Duration::from_secs(5))
            .with_stdin(format!("export KPSSH_BOOTSTRAP_TOKEN='{TOKEN}'\n").into_bytes());
        for (what, text) in [
            ("Params", format!("{params:?}")),
            ("Envelope", format!("{envelope:?}")),
            ("PreparedRun", format!("{run:?}")),
            ("RemoteCommand", format!("{command:?}")),
        ] {
            assert!(!text.contains(TOKEN), "{what}: {text}");
            assert!(!text.contains("0123456789abcdef"), "{what}: {text}");
        }
        assert!(
            format!("{params:?}").contains("KPSSH_BOOTSTRAP_TOKEN"),
            "names stay visible"
        );
        assert!(format!("{command:?}").contains("stdin_len"));
    }
}
