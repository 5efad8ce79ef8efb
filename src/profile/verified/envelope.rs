//! The wire envelope the controller writes to the host shim's stdin.
//!
//! The format is line based, ASCII, LF-terminated and strict: headers appear in a fixed order,
//! each exactly once, as `<key>: <value>` with exactly one space after the colon, no CR, no
//! trailing data after the last line. Binary or multi-line data travels base64-encoded (standard
//! alphabet, padded, unwrapped). The single character `-` stands for "absent/empty" in
//! `params-b64` and `sig-b64`.
//!
//! ```text
//! v1                                  v2
//! kpssh-envelope: 1                   kpssh-envelope: 2
//! phase: join                         phase: join
//! timeout: 300          (optional)    timeout: 300          (optional)
//! params-b64: <b64 | ->               profile: tls-bootstrap@3
//! sig-b64: <b64 | ->                  expires: 2026-12-31T00:00:00Z
//! script-b64: <b64>                   params-b64: <b64 | ->
//!                                     sig-b64: <b64 | ->
//!                                     script-b64: <b64>
//! ```
//!
//! `timeout` is the phase's timeout in whole seconds (1 to [`MAX_TIMEOUT_SECS`]): the shim's
//! watchdog kills the script's process group once it ran that long, so a phase the controller
//! gave up on does not keep running on the host. It is not signed (the controller chooses it,
//! as it chooses which signed script runs); without it the shim uses its `--default-timeout`.
//!
//! In v1 the signature (`sig-b64` decodes to the armored SSHSIG text) covers the script bytes.
//! In v2 it covers the manifest built by [`manifest_v2`], which binds the phase, the profile name
//! and version, the script's SHA-256 and the expiry, so that a signed script cannot be replayed
//! in another phase, for another profile version or after it expired.
//!
//! Parameters (`params-b64` decoded) are `NAME=value` lines, each LF-terminated, names matching
//! `KPSSH_[A-Za-z0-9_]+`, each name at most once, values without LF, CR or NUL.

use std::fmt;
use std::str::FromStr;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as B64;
use sha2::{Digest, Sha256};

use super::exit;
use super::sshsig::{SigError, TrustedSigners, VerifiedSigner};

/// Largest script the envelope carries (the profile contract's per-script limit).
pub const MAX_SCRIPT_LEN: usize = 256 * 1024;
/// Largest decoded parameter block.
pub const MAX_PARAMS_LEN: usize = 256 * 1024;
/// Largest envelope the shim reads from stdin.
pub const MAX_ENVELOPE_LEN: usize = 1024 * 1024;
/// Largest `timeout` header (7 days), as the shim's `MAX_TIMEOUT`.
pub const MAX_TIMEOUT_SECS: u32 = 604_800;

/// A profile phase.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Phase {
    /// Install binaries (once per host per profile version).
    Install,
    /// Join the cluster (every claim).
    Join,
    /// Leave the cluster (every release).
    Leave,
    /// Remove everything (never run by the controller).
    Uninstall,
}

impl Phase {
    /// All phases in profile order.
    pub const ALL: [Phase; 4] = [Phase::Install, Phase::Join, Phase::Leave, Phase::Uninstall];

    /// The phase name as it appears in profiles and envelopes.
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

impl FromStr for Phase {
    type Err = EnvelopeError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Phase::ALL
            .into_iter()
            .find(|p| p.as_str() == s)
            .ok_or_else(|| EnvelopeError::Phase(format!("unknown phase {s:?}")))
    }
}

/// Everything that can be wrong with an envelope; [`EnvelopeError::exit_code`] gives the shim
/// exit code for the same failure.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EnvelopeError {
    /// Framing, header, base64 or size problem (shim exit 4).
    #[error("malformed envelope: {0}")]
    Format(String),
    /// A parameter name or value is not allowed (shim exit 3).
    #[error("parameter refused: {0}")]
    Param(String),
    /// Unknown phase or not the phase that was requested (shim exit 5).
    #[error("phase refused: {0}")]
    Phase(String),
    /// The signature is missing or does not verify (shim exit 2).
    #[error("signature refused: {0}")]
    Signature(#[from] SigError),
    /// The v2 signature expired (shim exit 6).
    #[error("signature expired at {0}")]
    Expired(String),
    /// The v2 envelope is for another profile or version than requested (shim exit 6).
    #[error("replay refused: {0}")]
    Replay(String),
    /// Only a v1 signature exists and v1 was not explicitly allowed (shim exit 6).
    #[error("v1 signature refused: {0}")]
    V1Refused(String),
}

impl EnvelopeError {
    /// The exit code the host shim uses for the same failure.
    pub fn exit_code(&self) -> i32 {
        match self {
            EnvelopeError::Format(_) => exit::ENVELOPE,
            EnvelopeError::Param(_) => exit::PARAMETER,
            EnvelopeError::Phase(_) => exit::PHASE,
            EnvelopeError::Signature(_) => exit::SIGNATURE,
            EnvelopeError::Expired(_) | EnvelopeError::Replay(_) | EnvelopeError::V1Refused(_) => {
                exit::EXPIRED
            }
        }
    }
}

fn format_err(msg: impl Into<String>) -> EnvelopeError {
    EnvelopeError::Format(msg.into())
}

/// True for names of the form `KPSSH_[A-Za-z0-9_]+`.
pub fn is_valid_param_name(name: &str) -> bool {
    name.strip_prefix("KPSSH_").is_some_and(|rest| {
        !rest.is_empty() && rest.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_')
    })
}

fn check_param(name: &str, value: &str) -> Result<(), EnvelopeError> {
    if !is_valid_param_name(name) {
        return Err(EnvelopeError::Param(format!(
            "name {name:?} is not KPSSH_[A-Za-z0-9_]+"
        )));
    }
    if value.bytes().any(|b| b == b'\n' || b == b'\r' || b == 0) {
        return Err(EnvelopeError::Param(format!(
            "value of {name} contains a newline, carriage return or NUL"
        )));
    }
    Ok(())
}

/// Validated shim parameters, in insertion order. `Debug` names them without their values
/// (the bootstrap token and `joinSecretRef` values travel here, #23).
#[derive(Clone, Default, PartialEq, Eq)]
pub struct Params {
    entries: Vec<(String, String)>,
}

impl fmt::Debug for Params {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Params")
            .field(
                "names",
                &self
                    .entries
                    .iter()
                    .map(|(n, _)| n.as_str())
                    .collect::<Vec<_>>(),
            )
            .finish_non_exhaustive()
    }
}

impl Params {
    /// No parameters.
    pub fn new() -> Self {
        Self::default()
    }

    /// Add one parameter; refuses bad names, bad values and duplicates.
    pub fn insert(
        &mut self,
        name: impl Into<String>,
        value: impl Into<String>,
    ) -> Result<(), EnvelopeError> {
        let (name, value) = (name.into(), value.into());
        check_param(&name, &value)?;
        if self.get(&name).is_some() {
            return Err(EnvelopeError::Param(format!("{name} given twice")));
        }
        self.entries.push((name, value));
        Ok(())
    }

    /// Value of a parameter.
    pub fn get(&self, name: &str) -> Option<&str> {
        self.entries
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }

    /// Parameters in order.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &str)> {
        self.entries.iter().map(|(n, v)| (n.as_str(), v.as_str()))
    }

    /// Number of parameters.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// True when there are none.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The `NAME=value\n…` text carried (base64-encoded) in `params-b64`.
    pub fn to_text(&self) -> String {
        self.entries
            .iter()
            .map(|(n, v)| format!("{n}={v}\n"))
            .collect()
    }

    /// Parse the decoded `params-b64` text.
    pub fn parse(text: &[u8]) -> Result<Self, EnvelopeError> {
        if text.len() > MAX_PARAMS_LEN {
            return Err(EnvelopeError::Param("parameter block too large".into()));
        }
        if text.contains(&0) {
            return Err(EnvelopeError::Param("parameter block contains NUL".into()));
        }
        let text = std::str::from_utf8(text)
            .map_err(|_| EnvelopeError::Param("parameter block is not UTF-8".into()))?;
        let mut params = Params::new();
        if text.is_empty() {
            return Ok(params);
        }
        let Some(body) = text.strip_suffix('\n') else {
            return Err(EnvelopeError::Param(
                "last parameter line is not terminated by a newline".into(),
            ));
        };
        for line in body.split('\n') {
            let Some((name, value)) = line.split_once('=') else {
                return Err(EnvelopeError::Param(format!(
                    "line {line:?} is not NAME=value"
                )));
            };
            params.insert(name, value)?;
        }
        Ok(params)
    }
}

/// `<profile>@<version>`: the profile's object name and its `spec.version`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ProfileRef {
    name: String,
    version: String,
}

impl ProfileRef {
    /// Validate a profile name (DNS-1123 subdomain) and version (`^[A-Za-z0-9._-]{1,63}$`).
    pub fn new(name: &str, version: &str) -> Result<Self, EnvelopeError> {
        let name_ok = !name.is_empty()
            && name.len() <= 253
            && name
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'.')
            && name
                .as_bytes()
                .first()
                .is_some_and(u8::is_ascii_alphanumeric)
            && name
                .as_bytes()
                .last()
                .is_some_and(u8::is_ascii_alphanumeric);
        if !name_ok {
            return Err(format_err(format!("invalid profile name {name:?}")));
        }
        let version_ok = !version.is_empty()
            && version.len() <= 63
            && version
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'.' || b == b'_' || b == b'-');
        if !version_ok {
            return Err(format_err(format!("invalid profile version {version:?}")));
        }
        Ok(Self {
            name: name.to_owned(),
            version: version.to_owned(),
        })
    }

    /// Profile object name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Profile `spec.version`.
    pub fn version(&self) -> &str {
        &self.version
    }
}

impl fmt::Display for ProfileRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}@{}", self.name, self.version)
    }
}

impl FromStr for ProfileRef {
    type Err = EnvelopeError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let (name, version) = s
            .split_once('@')
            .ok_or_else(|| format_err(format!("profile {s:?} is not <name>@<version>")))?;
        ProfileRef::new(name, version)
    }
}

/// A v2 expiry: a UTC instant with whole seconds, written `YYYY-MM-DDTHH:MM:SSZ`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Expires(jiff::Timestamp);

impl Expires {
    /// Truncate an instant to whole seconds.
    pub fn from_timestamp(ts: jiff::Timestamp) -> Result<Self, EnvelopeError> {
        jiff::Timestamp::from_second(ts.as_second())
            .map(Self)
            .map_err(|e| format_err(e.to_string()))
    }

    /// The instant.
    pub fn timestamp(&self) -> jiff::Timestamp {
        self.0
    }

    /// True when `now` is past the expiry.
    pub fn is_expired(&self, now: jiff::Timestamp) -> bool {
        now.as_second() > self.0.as_second()
    }
}

impl fmt::Display for Expires {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0.strftime("%Y-%m-%dT%H:%M:%SZ"))
    }
}

impl FromStr for Expires {
    type Err = EnvelopeError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let bad = || format_err(format!("expiry {s:?} is not YYYY-MM-DDTHH:MM:SSZ"));
        let b = s.as_bytes();
        if b.len() != 20 {
            return Err(bad());
        }
        for (i, c) in b.iter().enumerate() {
            let ok = match i {
                4 | 7 => *c == b'-',
                10 => *c == b'T',
                13 | 16 => *c == b':',
                19 => *c == b'Z',
                _ => c.is_ascii_digit(),
            };
            if !ok {
                return Err(bad());
            }
        }
        let ts: jiff::Timestamp = s.parse().map_err(|_| bad())?;
        let e = Expires::from_timestamp(ts)?;
        // Refuse values jiff normalised (e.g. a leap second) so both sides agree on the text.
        if e.to_string() != s {
            return Err(bad());
        }
        Ok(e)
    }
}

/// Lowercase hex SHA-256 of `bytes`.
pub fn sha256_hex(bytes: &[u8]) -> String {
    Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// The exact text a v2 signature covers:
///
/// ```text
/// kpssh-manifest: 2
/// phase: <phase>
/// profile: <name>@<version>
/// script-sha256: <64 lowercase hex digits>
/// expires: <YYYY-MM-DDTHH:MM:SSZ>
/// ```
///
/// Every line, including the last, ends with a single LF; nothing else is part of it.
pub fn manifest_v2(phase: Phase, profile: &ProfileRef, script: &[u8], expires: &Expires) -> String {
    format!(
        "kpssh-manifest: 2\nphase: {phase}\nprofile: {profile}\nscript-sha256: {}\nexpires: {expires}\n",
        sha256_hex(script)
    )
}

/// Version-specific envelope fields.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Binding {
    /// v1: the signature covers the script bytes only.
    V1,
    /// v2: the signature covers [`manifest_v2`].
    V2 {
        /// Profile name and version the script was signed for.
        profile: ProfileRef,
        /// When the signature stops being accepted.
        expires: Expires,
    },
}

/// A parsed or to-be-sent envelope. `Debug` hides parameter values and shows the signature
/// and script by length (#23).
#[derive(Clone, PartialEq, Eq)]
pub struct Envelope {
    /// Which phase the script is for.
    pub phase: Phase,
    /// v1 or v2 fields.
    pub binding: Binding,
    /// Shim parameters.
    pub params: Params,
    /// Armored SSHSIG text; empty when the envelope is unsigned (`sig-b64: -`).
    pub signature: String,
    /// The script bytes exactly as signed.
    pub script: Vec<u8>,
    /// The phase timeout in seconds for the shim's watchdog (`timeout` header).
    pub timeout_secs: Option<u32>,
}

impl fmt::Debug for Envelope {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Envelope")
            .field("phase", &self.phase)
            .field("binding", &self.binding)
            .field("params", &self.params)
            .field("signature_len", &self.signature.len())
            .field("script_len", &self.script.len())
            .field("timeout_secs", &self.timeout_secs)
            .finish()
    }
}

fn b64_or_dash(bytes: &[u8]) -> String {
    if bytes.is_empty() {
        "-".to_owned()
    } else {
        B64.encode(bytes)
    }
}

/// The header lines of an envelope, read in order.
struct Headers<'a> {
    lines: std::iter::Peekable<std::str::Split<'a, char>>,
}

impl<'a> Headers<'a> {
    fn value(line: &'a str, key: &str) -> Option<&'a str> {
        line.strip_prefix(key)
            .and_then(|rest| rest.strip_prefix(": "))
            .filter(|v| !v.is_empty() && !v.contains(' '))
    }

    /// The next line, which must be `<key>: <value>`.
    fn next(&mut self, key: &str) -> Result<&'a str, EnvelopeError> {
        let line = self
            .lines
            .next()
            .ok_or_else(|| format_err(format!("missing {key} line")))?;
        Self::value(line, key)
            .ok_or_else(|| format_err(format!("expected `{key}: <value>`, got {line:?}")))
    }

    /// The next line if it is a `<key>: …` header (then it must be well-formed).
    fn optional(&mut self, key: &str) -> Result<Option<&'a str>, EnvelopeError> {
        let prefix = format!("{key}: ");
        match self.lines.next_if(|l| l.starts_with(&prefix)) {
            None => Ok(None),
            Some(line) => Self::value(line, key)
                .map(Some)
                .ok_or_else(|| format_err(format!("expected `{key}: <value>`, got {line:?}"))),
        }
    }
}

fn decode_b64(key: &str, value: &str, allow_dash: bool) -> Result<Vec<u8>, EnvelopeError> {
    if allow_dash && value == "-" {
        return Ok(Vec::new());
    }
    if value.is_empty() {
        return Err(format_err(format!("{key} is empty")));
    }
    B64.decode(value)
        .map_err(|e| format_err(format!("{key} is not valid base64: {e}")))
}

impl Envelope {
    /// A v1 envelope; checks sizes and that the script is non-empty.
    pub fn v1(
        phase: Phase,
        params: Params,
        signature: &str,
        script: &[u8],
    ) -> Result<Self, EnvelopeError> {
        Self::checked(Envelope {
            phase,
            binding: Binding::V1,
            params,
            signature: signature.to_owned(),
            script: script.to_vec(),
            timeout_secs: None,
        })
    }

    /// A v2 envelope.
    pub fn v2(
        phase: Phase,
        profile: ProfileRef,
        expires: Expires,
        params: Params,
        signature: &str,
        script: &[u8],
    ) -> Result<Self, EnvelopeError> {
        Self::checked(Envelope {
            phase,
            binding: Binding::V2 { profile, expires },
            params,
            signature: signature.to_owned(),
            script: script.to_vec(),
            timeout_secs: None,
        })
    }

    /// The same envelope with a `timeout` header of `secs` seconds (1 to [`MAX_TIMEOUT_SECS`]).
    pub fn with_timeout(self, secs: u32) -> Result<Self, EnvelopeError> {
        Self::checked(Envelope {
            timeout_secs: Some(secs),
            ..self
        })
    }

    fn checked(env: Envelope) -> Result<Self, EnvelopeError> {
        if let Some(t) = env.timeout_secs
            && !(1..=MAX_TIMEOUT_SECS).contains(&t)
        {
            return Err(format_err(format!(
                "timeout {t} s is outside 1..={MAX_TIMEOUT_SECS}"
            )));
        }
        if env.script.is_empty() {
            return Err(format_err("script is empty"));
        }
        if env.script.len() > MAX_SCRIPT_LEN {
            return Err(format_err(format!(
                "script is {} bytes, the limit is {MAX_SCRIPT_LEN}",
                env.script.len()
            )));
        }
        if env.params.to_text().len() > MAX_PARAMS_LEN {
            return Err(EnvelopeError::Param("parameter block too large".into()));
        }
        if env.signature.len() > super::sshsig::MAX_ARMORED_LEN {
            return Err(SigError::TooLarge {
                len: env.signature.len(),
                max: super::sshsig::MAX_ARMORED_LEN,
            }
            .into());
        }
        Ok(env)
    }

    /// Envelope format version (1 or 2).
    pub fn version(&self) -> u8 {
        match self.binding {
            Binding::V1 => 1,
            Binding::V2 { .. } => 2,
        }
    }

    /// The bytes the signature must cover: the script (v1) or the manifest (v2).
    pub fn signed_message(&self) -> Vec<u8> {
        match &self.binding {
            Binding::V1 => self.script.clone(),
            Binding::V2 { profile, expires } => {
                manifest_v2(self.phase, profile, &self.script, expires).into_bytes()
            }
        }
    }

    /// Serialise to the wire format.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = format!(
            "kpssh-envelope: {}\nphase: {}\n",
            self.version(),
            self.phase
        );
        if let Some(t) = self.timeout_secs {
            out.push_str(&format!("timeout: {t}\n"));
        }
        if let Binding::V2 { profile, expires } = &self.binding {
            out.push_str(&format!("profile: {profile}\nexpires: {expires}\n"));
        }
        out.push_str(&format!(
            "params-b64: {}\nsig-b64: {}\nscript-b64: {}\n",
            b64_or_dash(self.params.to_text().as_bytes()),
            b64_or_dash(self.signature.as_bytes()),
            B64.encode(&self.script)
        ));
        out.into_bytes()
    }

    /// Parse the wire format strictly (no signature check; see [`Envelope::verify`]).
    pub fn parse(bytes: &[u8]) -> Result<Self, EnvelopeError> {
        if bytes.len() > MAX_ENVELOPE_LEN {
            return Err(format_err("envelope too large"));
        }
        if bytes.iter().any(|&b| b == b'\r' || b == 0) {
            return Err(format_err("envelope contains CR or NUL"));
        }
        let text = std::str::from_utf8(bytes).map_err(|_| format_err("envelope is not UTF-8"))?;
        let body = text
            .strip_suffix('\n')
            .ok_or_else(|| format_err("envelope does not end with a newline"))?;
        let mut lines = Headers {
            lines: body.split('\n').peekable(),
        };
        let version = lines.next("kpssh-envelope")?;
        if version != "1" && version != "2" {
            return Err(format_err(format!(
                "unsupported envelope version {version:?}"
            )));
        }
        let phase: Phase = lines.next("phase")?.parse()?;
        let timeout_secs = lines
            .optional("timeout")?
            .map(|v| {
                (!v.starts_with('0') && v.len() <= 6 && v.bytes().all(|b| b.is_ascii_digit()))
                    .then(|| v.parse::<u32>().ok())
                    .flatten()
                    .ok_or_else(|| {
                        format_err(format!("timeout {v:?} is not a whole number of seconds"))
                    })
            })
            .transpose()?;
        let binding = if version == "2" {
            let profile: ProfileRef = lines.next("profile")?.parse()?;
            let expires: Expires = lines.next("expires")?.parse()?;
            Binding::V2 { profile, expires }
        } else {
            Binding::V1
        };
        // The Go provider's controller leaves params-b64 out of a v1 envelope without
        // parameters; kpssh always writes it.
        let params_b64 = match binding {
            Binding::V1 => lines.optional("params-b64")?.unwrap_or("-"),
            Binding::V2 { .. } => lines.next("params-b64")?,
        };
        let params_raw = decode_b64("params-b64", params_b64, true)?;
        let sig_raw = decode_b64("sig-b64", lines.next("sig-b64")?, true)?;
        let script = decode_b64("script-b64", lines.next("script-b64")?, false)?;
        if lines.lines.next().is_some() {
            return Err(format_err("trailing data after script-b64"));
        }
        let signature =
            String::from_utf8(sig_raw).map_err(|_| format_err("signature is not UTF-8"))?;
        let params = Params::parse(&params_raw)?;
        Self::checked(Envelope {
            phase,
            binding,
            params,
            signature,
            script,
            timeout_secs,
        })
    }

    /// What the shim checks, done in Rust: signature by a trusted signer over
    /// [`Envelope::signed_message`], then (v2) the expiry against `now`.
    pub fn verify(
        &self,
        trusted: &TrustedSigners,
        now: jiff::Timestamp,
    ) -> Result<VerifiedSigner, EnvelopeError> {
        if self.signature.is_empty() {
            return Err(SigError::Missing.into());
        }
        let signer = trusted.verify(&self.signature, &self.signed_message())?;
        if let Binding::V2 { expires, .. } = &self.binding
            && expires.is_expired(now)
        {
            return Err(EnvelopeError::Expired(expires.to_string()));
        }
        Ok(signer)
    }
}

/// The command line the controller sends over SSH for a verified phase:
/// `<shim> run <phase>` (v1) or `<shim> run <phase> <profile>@<version>` (v2). With sshd's
/// `ForceCommand` it arrives in `SSH_ORIGINAL_COMMAND`; the shim ignores everything up to and
/// including the word naming itself.
pub fn shim_command(shim: &str, phase: Phase, profile: Option<&ProfileRef>) -> String {
    match profile {
        Some(p) => format!("{shim} run {phase} {p}"),
        None => format!("{shim} run {phase}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params() -> Params {
        let mut p = Params::new();
        p.insert("KPSSH_NODE_NAME", "n1").expect("ok");
        p.insert("KPSSH_VAR_x", "a=b c").expect("ok");
        p
    }

    #[test]
    fn v1_round_trip_and_exact_text() {
        let env = Envelope::v1(Phase::Join, params(), "SIG", b"echo hi\n").expect("env");
        let wire = env.encode();
        let text = String::from_utf8(wire.clone()).expect("utf8");
        assert_eq!(
            text,
            format!(
                "kpssh-envelope: 1\nphase: join\nparams-b64: {}\nsig-b64: U0lH\nscript-b64: ZWNobyBoaQo=\n",
                B64.encode("KPSSH_NODE_NAME=n1\nKPSSH_VAR_x=a=b c\n")
            )
        );
        assert_eq!(Envelope::parse(&wire).expect("parse"), env);
    }

    /// S62: the Go provider's controller writes no params-b64 line when there are no
    /// parameters (and never a timeout); such a v1 envelope parses, a v2 one does not.
    #[test]
    fn s62_go_v1_envelope_without_params_parses() {
        let go = "kpssh-envelope: 1\nphase: leave\nsig-b64: U0lH\nscript-b64: eA==\n";
        let env = Envelope::parse(go.as_bytes()).expect("Go v1 envelope");
        assert!(env.params.is_empty());
        assert_eq!(env.script, b"x");
        assert_eq!(env.signature, "SIG");
        let v2 = "kpssh-envelope: 2\nphase: leave\nprofile: p@1\nexpires: 2030-01-02T03:04:05Z\nsig-b64: U0lH\nscript-b64: eA==\n";
        assert!(Envelope::parse(v2.as_bytes()).is_err());
    }

    #[test]
    fn v2_round_trip_and_manifest() {
        let profile = ProfileRef::new("tls-bootstrap", "3").expect("p");
        let expires: Expires = "2030-01-02T03:04:05Z".parse().expect("exp");
        let env = Envelope::v2(
            Phase::Leave,
            profile.clone(),
            expires,
            Params::new(),
            "",
            b"x",
        )
        .expect("env");
        let wire = env.encode();
        let text = String::from_utf8(wire.clone()).expect("utf8");
        assert!(text.contains("\nparams-b64: -\nsig-b64: -\n"));
        assert_eq!(Envelope::parse(&wire).expect("parse"), env);
        assert_eq!(
            String::from_utf8(env.signed_message()).expect("utf8"),
            format!(
                "kpssh-manifest: 2\nphase: leave\nprofile: tls-bootstrap@3\nscript-sha256: {}\nexpires: 2030-01-02T03:04:05Z\n",
                sha256_hex(b"x")
            )
        );
    }

    #[test]
    fn param_names() {
        for bad in [
            "BASH_ENV",
            "LD_PRELOAD",
            "PATH",
            "IFS",
            "KPSSH_",
            "KPSSH_A-B",
            "kpssh_x",
            "KPSSH_X Y",
            "",
        ] {
            assert!(!is_valid_param_name(bad), "{bad}");
            assert!(matches!(
                Params::new().insert(bad, "v"),
                Err(EnvelopeError::Param(_))
            ));
        }
        assert!(is_valid_param_name("KPSSH_a_1"));
        for v in ["a\nb", "a\rb", "a\0b"] {
            assert!(Params::new().insert("KPSSH_X", v).is_err());
        }
        let mut p = Params::new();
        p.insert("KPSSH_X", "1").expect("ok");
        assert!(p.insert("KPSSH_X", "2").is_err());
        assert!(Params::parse(b"KPSSH_X=1").is_err());
        assert!(Params::parse(b"BASH_ENV=/x\n").is_err());
        assert!(Params::parse(b"KPSSH_X\n").is_err());
        assert_eq!(Params::parse(b"").expect("empty"), Params::new());
    }

    #[test]
    fn strict_framing() {
        let good = Envelope::v1(Phase::Join, Params::new(), "S", b"x")
            .expect("env")
            .encode();
        let s = String::from_utf8(good).expect("utf8");
        for bad in [
            s.replace("phase: join", "phase:  join"),
            s.replace("phase: join", "phase: join "),
            s.replace('\n', "\r\n"),
            s.trim_end().to_owned(),
            format!("{s}extra\n"),
            s.replace("kpssh-envelope: 1", "kpssh-envelope: 3"),
            s.replace("script-b64: eA==", "script-b64: eA"),
            s.replace("script-b64: eA==", "script-b64: -"),
        ] {
            let err = Envelope::parse(bad.as_bytes()).expect_err(&bad);
            assert_eq!(err.exit_code(), exit::ENVELOPE, "{bad:?}: {err}");
        }
        let err = Envelope::parse(s.replace("phase: join", "phase: reboot").as_bytes())
            .expect_err("phase");
        assert_eq!(err.exit_code(), exit::PHASE);
    }

    #[test]
    fn expires_strict() {
        for bad in [
            "2030-01-02T03:04:05.5Z",
            "2030-01-02 03:04:05Z",
            "2030-01-02T03:04:05+00:00",
            "2030-13-02T03:04:05Z",
            "2030-01-02T03:04:60Z",
        ] {
            assert!(bad.parse::<Expires>().is_err(), "{bad}");
        }
        let e: Expires = "2030-01-02T03:04:05Z".parse().expect("ok");
        assert!(!e.is_expired(e.timestamp()));
        let later = e.timestamp() + jiff::SignedDuration::from_secs(1);
        assert!(e.is_expired(later));
    }

    #[test]
    fn command_line() {
        let p = ProfileRef::new("p", "1.2").expect("p");
        assert_eq!(
            shim_command("/opt/kpssh/kpssh-shim", Phase::Join, Some(&p)),
            "/opt/kpssh/kpssh-shim run join p@1.2"
        );
        assert!("p@".parse::<ProfileRef>().is_err());
        assert!("P@1".parse::<ProfileRef>().is_err());
    }

    mod props {
        use super::*;
        use proptest::prelude::*;
        use russh::keys::ssh_key::private::{Ed25519Keypair, KeypairData};
        use russh::keys::ssh_key::{HashAlg, LineEnding, PrivateKey};

        fn phase() -> impl Strategy<Value = Phase> {
            prop::sample::select(Phase::ALL.to_vec())
        }

        fn params() -> impl Strategy<Value = Params> {
            proptest::collection::btree_map("KPSSH_[A-Za-z0-9_]{1,12}", "[^\n\r\u{0}]{0,24}", 0..5)
                .prop_map(|m| {
                    let mut p = Params::new();
                    for (k, v) in m {
                        p.insert(k, v).expect("valid by construction");
                    }
                    p
                })
        }

        fn envelope() -> impl Strategy<Value = Envelope> {
            (
                phase(),
                params(),
                proptest::collection::vec(any::<u8>(), 1..300),
                "[ -~]{0,40}",
                any::<bool>(),
                0i64..4_000_000_000,
            )
                .prop_map(|(phase, params, script, sig, v2, secs)| {
                    if v2 {
                        let expires = Expires::from_timestamp(
                            jiff::Timestamp::from_second(secs).expect("ts"),
                        )
                        .expect("expires");
                        let profile = ProfileRef::new("demo", "1.0").expect("p");
                        Envelope::v2(phase, profile, expires, params, &sig, &script)
                    } else {
                        Envelope::v1(phase, params, &sig, &script)
                    }
                    .expect("valid by construction")
                })
        }

        fn signed() -> (TrustedSigners, Envelope, jiff::Timestamp) {
            let key = PrivateKey::new(
                KeypairData::Ed25519(Ed25519Keypair::from_seed(&[5; 32])),
                "",
            )
            .expect("key");
            let trusted =
                TrustedSigners::parse(&[key.public_key().to_openssh().expect("ssh")]).expect("t");
            let expires: Expires = "2030-01-01T00:00:00Z".parse().expect("e");
            let profile = ProfileRef::new("demo", "2").expect("p");
            let script = b"#!/bin/bash\nset -euo pipefail\ntrue\n";
            let manifest = manifest_v2(Phase::Join, &profile, script, &expires);
            let sig = key
                .sign("kpssh", HashAlg::Sha512, manifest.as_bytes())
                .expect("sign")
                .to_pem(LineEnding::LF)
                .expect("pem");
            let mut p = Params::new();
            p.insert("KPSSH_NODE_NAME", "n").expect("p");
            let env = Envelope::v2(Phase::Join, profile, expires, p, &sig, script).expect("env");
            let now: jiff::Timestamp = "2029-01-01T00:00:00Z".parse().expect("now");
            (trusted, env, now)
        }

        proptest! {
            #[test]
            fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..400)) {
                let _ = Envelope::parse(&bytes);
                let _ = Params::parse(&bytes);
            }

            #[test]
            fn arbitrary_header_lines_never_panic(lines in proptest::collection::vec("[ -~]{0,40}", 0..9)) {
                let text: String = lines.iter().map(|l| format!("{l}\n")).collect();
                let _ = Envelope::parse(text.as_bytes());
            }

            #[test]
            fn encode_parse_round_trip(env in envelope()) {
                prop_assert_eq!(Envelope::parse(&env.encode()).expect("parses"), env);
            }

            #[test]
            fn mutated_envelopes_only_verify_as_signed(idx in any::<usize>(), byte in any::<u8>()) {
                let (trusted, env, now) = signed();
                let mut wire = env.encode();
                let i = idx % wire.len();
                wire[i] = byte;
                if let Ok(parsed) = Envelope::parse(&wire)
                    && parsed.verify(&trusted, now).is_ok()
                {
                    prop_assert_eq!(&parsed.script, &env.script);
                    prop_assert_eq!(parsed.phase, env.phase);
                    prop_assert_eq!(&parsed.binding, &env.binding);
                    prop_assert_eq!(parsed.signed_message(), env.signed_message());
                }
            }
        }

        #[test]
        fn signed_fixture_verifies() {
            let (trusted, env, now) = signed();
            let parsed = Envelope::parse(&env.encode()).expect("parse");
            parsed.verify(&trusted, now).expect("verifies");
            let late: jiff::Timestamp = "2031-01-01T00:00:00Z".parse().expect("late");
            assert!(matches!(
                parsed.verify(&trusted, late),
                Err(EnvelopeError::Expired(_))
            ));
        }
    }
}
