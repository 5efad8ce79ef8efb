//! `kpssh sign --key KEY profile.yaml`: sign every phase script of an `SSHJoinProfile` for
//! verified execution.
//!
//! Each script is signed with the real `ssh-keygen -Y sign -n kpssh -f KEY`, v2 only by default:
//! - v2, over the manifest binding phase, `<name>@<version>`, the script's SHA-256 and an expiry,
//!   into `spec.signaturesV2.<phase>` next to `spec.signaturesV2.expires`;
//! - v1, over the script bytes, into `spec.signatures.<phase>`, only with `--v1` (for hosts whose
//!   shim is too old for v2; a v1 signature binds neither phase, version nor expiry). Without
//!   `--v1`, v1 signatures already in the document are removed, so an old one can no longer be
//!   replayed once hosts allow v1.
//!
//! `KEY` may be a private key file, or a public key file whose private half is held by the
//! running `ssh-agent` (ssh-keygen then asks the agent). The document is edited as a generic YAML
//! value, so fields kpssh does not know about are kept.

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use anyhow::{Context as _, anyhow, bail};
use serde_yaml::{Mapping, Value};

use crate::profile::verified::envelope::{Expires, Phase, ProfileRef, manifest_v2};
use crate::profile::verified::sshsig::{self, NAMESPACE};

/// Arguments of `kpssh sign`.
#[derive(Debug, Clone, clap::Args)]
pub struct SignArgs {
    /// Signing key for `ssh-keygen -Y sign -f`: a private key, or a public key held by ssh-agent.
    #[arg(long)]
    pub key: PathBuf,
    /// Validity of the v2 signatures from now, as a duration like 720h, 90m or 1h30m.
    #[arg(long, default_value = "720h")]
    pub expires: String,
    /// Expiry of the v2 signatures as a time (`2026-12-31T00:00:00Z`); overrides `--expires`.
    #[arg(long)]
    pub expires_at: Option<String>,
    /// Also write v1 signatures (`spec.signatures`): downgradable, for shims run with
    /// `--allow-v1` only. Prints a warning.
    #[arg(long)]
    pub v1: bool,
    /// Write the signed profile here instead of rewriting the input file.
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// The ssh-keygen program to run.
    #[arg(long, default_value = "ssh-keygen", hide = true)]
    pub ssh_keygen: PathBuf,
    /// The SSHJoinProfile YAML file.
    pub profile: PathBuf,
}

/// Run `kpssh sign`; returns the process exit code.
pub fn run(args: SignArgs) -> anyhow::Result<i32> {
    let text = std::fs::read_to_string(&args.profile)
        .with_context(|| format!("reading {}", args.profile.display()))?;
    let expires = match &args.expires_at {
        Some(at) => at
            .parse::<Expires>()
            .map_err(|e| anyhow!("--expires-at {at:?}: {e}"))?,
        None => {
            let validity = parse_duration(&args.expires)?;
            let expires_at = jiff::Timestamp::now()
                .checked_add(jiff::SignedDuration::from_secs(validity))
                .map_err(|e| anyhow!("--expires {} is out of range: {e}", args.expires))?;
            Expires::from_timestamp(expires_at)?
        }
    };
    if args.v1 {
        eprintln!(
            "warning: --v1 also writes v1 signatures, which bind neither phase, profile version \
             nor expiry; hosts accept them only with kpssh-shim --allow-v1 and the controller \
             only with --allow-v1-signatures"
        );
    }
    let mut doc: Value = serde_yaml::from_str(&text)
        .with_context(|| format!("parsing {} as YAML", args.profile.display()))?;
    let summary = sign_document(&mut doc, &expires, args.v1, &mut |msg| {
        ssh_keygen_sign(&args.ssh_keygen, &args.key, msg)
    })?;
    let out_text = serde_yaml::to_string(&doc).context("serialising the signed profile")?;
    let target = args.out.as_deref().unwrap_or(&args.profile);
    write_file(target, &out_text)?;
    eprintln!(
        "signed {} of {} with {} {}; v2 signatures expire {}; wrote {}",
        summary.phases.join(", "),
        summary.profile,
        summary.algorithm,
        summary.fingerprint,
        expires,
        target.display()
    );
    Ok(0)
}

/// What [`sign_document`] did.
#[derive(Debug, Clone)]
pub struct SignSummary {
    /// `<name>@<version>` of the profile.
    pub profile: ProfileRef,
    /// Phases signed, in profile order.
    pub phases: Vec<&'static str>,
    /// Signer key fingerprint.
    pub fingerprint: String,
    /// Signer key algorithm.
    pub algorithm: String,
}

/// Sign every phase script of the `SSHJoinProfile` in `doc` with `sign` (which returns an armored
/// SSHSIG over the bytes it is given) and store the v2 signatures in the document; the v1 ones
/// too when `with_v1`, else any v1 signature of a phase is removed.
pub fn sign_document(
    doc: &mut Value,
    expires: &Expires,
    with_v1: bool,
    sign: &mut dyn FnMut(&[u8]) -> anyhow::Result<String>,
) -> anyhow::Result<SignSummary> {
    if let Some(kind) = doc.get("kind")
        && kind.as_str() != Some("SSHJoinProfile")
    {
        bail!("kind is {kind:?}, expected SSHJoinProfile");
    }
    let name = doc
        .get("metadata")
        .and_then(|m| m.get("name"))
        .and_then(Value::as_str)
        .ok_or_else(|| anyhow!("metadata.name is missing (v2 signatures bind the profile name)"))?
        .to_owned();
    let spec = doc
        .get_mut("spec")
        .and_then(Value::as_mapping_mut)
        .ok_or_else(|| anyhow!("spec is missing or not a mapping"))?;
    let version = match spec.get("version") {
        None => "1".to_owned(),
        Some(Value::String(s)) => s.clone(),
        Some(Value::Number(n)) => n.to_string(),
        Some(other) => bail!("spec.version must be a string, got {other:?}"),
    };
    let profile = ProfileRef::new(&name, &version)?;
    let scripts = spec
        .get("scripts")
        .and_then(Value::as_mapping)
        .ok_or_else(|| anyhow!("spec.scripts is missing or not a mapping"))?;

    let mut found: Vec<(Phase, String)> = Vec::new();
    for phase in Phase::ALL {
        match scripts.get(phase.as_str()) {
            Some(Value::String(s)) => {
                if s.contains("{{") {
                    bail!(
                        "spec.scripts.{phase} contains a template (`{{{{`); verified scripts must be \
                         template-free — pass variable data as KPSSH_* environment instead"
                    );
                }
                if s.is_empty() {
                    bail!("spec.scripts.{phase} is empty");
                }
                found.push((phase, s.clone()));
            }
            Some(Value::Null) | None if phase == Phase::Uninstall => {}
            Some(Value::Null) | None => bail!("spec.scripts.{phase} is required"),
            Some(other) => bail!("spec.scripts.{phase} must be a string, got {other:?}"),
        }
    }

    let mut v1 = Mapping::new();
    let mut v2 = Mapping::new();
    v2.insert("expires".into(), Value::String(expires.to_string()));
    let mut signer: Option<(String, String)> = None;
    for (phase, script) in &found {
        let manifest = manifest_v2(*phase, &profile, script.as_bytes(), expires);
        let mut messages = vec![(manifest.as_bytes(), &mut v2)];
        if with_v1 {
            messages.push((script.as_bytes(), &mut v1));
        }
        for (message, map) in messages {
            let armored = sign(message)?;
            let who = check_own_signature(&armored, message)
                .with_context(|| format!("checking the signature ssh-keygen made for {phase}"))?;
            if let Some(prev) = &signer
                && prev.0 != who.0
            {
                bail!("the signing key changed while signing");
            }
            signer = Some(who);
            map.insert(phase.as_str().into(), Value::String(armored));
        }
    }

    // v1: keep unrelated keys under spec.signatures, replace/remove the per-phase ones; drop
    // the field when nothing is left in it.
    let signatures = spec
        .entry("signatures".into())
        .or_insert_with(|| Value::Mapping(Mapping::new()));
    if !signatures.is_mapping() {
        *signatures = Value::Mapping(Mapping::new());
    }
    if let Some(sigs) = signatures.as_mapping_mut() {
        for phase in Phase::ALL {
            match v1.remove(phase.as_str()) {
                Some(sig) => {
                    sigs.insert(phase.as_str().into(), sig);
                }
                None => {
                    sigs.remove(phase.as_str());
                }
            }
        }
    }
    if signatures.as_mapping().is_some_and(Mapping::is_empty) {
        spec.remove("signatures");
    }
    spec.insert("signaturesV2".into(), Value::Mapping(v2));

    let (fingerprint, algorithm) = signer.ok_or_else(|| anyhow!("no scripts to sign"))?;
    Ok(SignSummary {
        profile,
        phases: found.iter().map(|(p, _)| p.as_str()).collect(),
        fingerprint,
        algorithm,
    })
}

/// Parse the armored output and verify it against the key embedded in it: catches a wrong
/// namespace, SHA-1 RSA or a corrupted signature before it lands in the profile.
fn check_own_signature(armored: &str, message: &[u8]) -> anyhow::Result<(String, String)> {
    let sig = sshsig::parse_armored(armored)?;
    let key = russh::keys::ssh_key::PublicKey::from(sig.public_key().clone());
    let line = key.to_openssh().context("encoding the signer key")?;
    let trusted = sshsig::TrustedSigners::parse(&[line])?;
    let who = trusted.verify(armored, message)?;
    Ok((who.fingerprint, who.algorithm))
}

/// `^([0-9]+(s|m|h))+$` → seconds, more than zero (a validity).
pub fn parse_duration(s: &str) -> anyhow::Result<i64> {
    crate::api::duration::pattern(s)
        .filter(|d| !d.is_zero())
        .and_then(|d| i64::try_from(d.as_secs()).ok())
        .ok_or_else(|| anyhow!("duration {s:?} must look like 720h, 90m or 1h30m"))
}

/// Sign `message` (on stdin) with `ssh-keygen -Y sign -n kpssh -f key`; returns the armored
/// signature (stdout). A passphrase prompt, if any, goes to the terminal.
pub fn ssh_keygen_sign(ssh_keygen: &Path, key: &Path, message: &[u8]) -> anyhow::Result<String> {
    let mut child = Command::new(ssh_keygen)
        .args(["-Y", "sign", "-n", NAMESPACE, "-f"])
        .arg(key)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .with_context(|| format!("running {}", ssh_keygen.display()))?;
    let mut stdin = child
        .stdin
        .take()
        .ok_or_else(|| anyhow!("ssh-keygen stdin unavailable"))?;
    let writer = {
        let message = message.to_vec();
        std::thread::spawn(move || stdin.write_all(&message))
    };
    let output = child.wait_with_output().context("waiting for ssh-keygen")?;
    let write_result = writer
        .join()
        .map_err(|_| anyhow!("writer thread panicked"))?;
    if !output.status.success() {
        bail!(
            "ssh-keygen -Y sign failed ({}): {}",
            output.status,
            String::from_utf8_lossy(&output.stderr).trim()
        );
    }
    write_result.context("writing the message to ssh-keygen")?;
    let armored = String::from_utf8(output.stdout).context("ssh-keygen output is not UTF-8")?;
    if !armored.contains("-----BEGIN SSH SIGNATURE-----") {
        bail!("ssh-keygen produced no signature");
    }
    Ok(armored)
}

fn write_file(path: &Path, text: &str) -> anyhow::Result<()> {
    let dir = path
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let file_name = path
        .file_name()
        .ok_or_else(|| anyhow!("{} is not a file path", path.display()))?;
    let tmp = dir.join(format!(
        ".{}.kpssh-sign.{}",
        file_name.to_string_lossy(),
        std::process::id()
    ));
    std::fs::write(&tmp, text).with_context(|| format!("writing {}", tmp.display()))?;
    std::fs::rename(&tmp, path).with_context(|| {
        let _ = std::fs::remove_file(&tmp);
        format!("replacing {}", path.display())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        assert_eq!(parse_duration("720h").expect("ok"), 720 * 3600);
        assert_eq!(parse_duration("1h30m").expect("ok"), 5400);
        assert_eq!(parse_duration("90s").expect("ok"), 90);
        for bad in ["", "1.5h", "500ms", "h", "10", "0h", "1d", "-1h"] {
            assert!(parse_duration(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn refuses_templates_and_wrong_kind() {
        let exp: Expires = "2030-01-01T00:00:00Z".parse().expect("exp");
        let mut never = |_: &[u8]| -> anyhow::Result<String> { bail!("must not sign") };
        let mut doc: Value = serde_yaml::from_str(
            "kind: SSHJoinProfile\nmetadata: {name: p}\nspec:\n  scripts:\n    install: x\n    join: 'echo {{ .Vars.a }}'\n    leave: y\n",
        )
        .expect("yaml");
        let err = sign_document(&mut doc, &exp, false, &mut never).expect_err("template");
        assert!(err.to_string().contains("template"), "{err}");
        let mut doc: Value =
            serde_yaml::from_str("kind: SSHHost\nmetadata: {name: p}\nspec: {}\n").expect("yaml");
        assert!(sign_document(&mut doc, &exp, false, &mut never).is_err());
        let mut doc: Value = serde_yaml::from_str(
            "kind: SSHJoinProfile\nmetadata: {name: p}\nspec:\n  scripts:\n    install: x\n    leave: y\n",
        )
        .expect("yaml");
        let err = sign_document(&mut doc, &exp, false, &mut never).expect_err("join missing");
        assert!(err.to_string().contains("join"), "{err}");
    }
}
