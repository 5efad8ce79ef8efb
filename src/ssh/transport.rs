//! The `Transport` port: everything the controller does to a host over SSH.
//!
//! The port is deliberately small so that a simulated host can implement it: *probe* a host
//! (verify its host key, report what it is) and *exec* one command on it (stdin in, capped
//! stdout/stderr and exit status out, bounded by a timeout). Connections are an implementation
//! detail of the real transport ([`crate::ssh::RusshTransport`] keeps one per host and reuses
//! it); [`Transport::pooled`] tells whether a call would dial (only dials are paced) and
//! [`Transport::forget`] tells it that a host is gone.
//!
//! Every error names the host (`"ns/name"`) and never contains key material.

use std::future::Future;
use std::hash::{BuildHasher, Hash, Hasher};
use std::time::Duration;

use crate::secret::Secret;
use crate::ssh::probe::{ProbeError, ProbeFacts};

/// Where and how to reach one host.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HostTarget {
    /// `"<namespace>/<name>"` of the SSHHost; the pool key and the name in every error.
    pub host: String,
    /// DNS name or IP literal to dial.
    pub address: String,
    pub port: u16,
    pub user: String,
    /// OpenSSH or PEM private key text (unencrypted).
    pub key: Secret,
    /// How the host key is checked; see [`HostKeyPin::from_sources`] for the precedence.
    pub pin: HostKeyPin,
    /// Bastion to tunnel through (a `direct-tcpip` channel of the bastion's connection).
    pub jump: Option<Box<HostTarget>>,
}

impl HostTarget {
    /// A target with port 22, user `root`, trust-on-first-use and no jump host.
    pub fn new(host: impl Into<String>, address: impl Into<String>, key: Secret) -> Self {
        HostTarget {
            host: host.into(),
            address: address.into(),
            port: 22,
            user: "root".into(),
            key,
            pin: HostKeyPin::TrustOnFirstUse,
            jump: None,
        }
    }

    /// What a pooled connection was dialled for (address, port, user, key, and the same of
    /// each jump host): a call whose target hashes differently dials anew. Computed for every
    /// SSH call (twice for a probe: the limiter asks whether it will dial), so with foldhash:
    /// SipHash over the private key's text was a measurable part of a simulated fleet's probe.
    /// The value never leaves the process.
    pub fn connection_identity(&self) -> u64 {
        let mut h = foldhash::fast::FixedState::default().build_hasher();
        let mut t = Some(self);
        while let Some(x) = t {
            (&x.address, x.port, &x.user, x.key.expose()).hash(&mut h);
            t = x.jump.as_deref();
        }
        h.finish()
    }
}

/// How a host key is accepted.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum HostKeyPin {
    /// The Secret's `knownHost`: a `SHA256:…` fingerprint, a known_hosts line (plain or hashed
    /// `|1|salt|hash`) or a public-key line (`ssh-ed25519 AAAA… [comment]`). Parsed by
    /// [`crate::ssh::known_host::KnownHost`].
    KnownHost(String),
    /// `status.hostKeyFingerprint` pinned on first contact (`SHA256:` + 43 base64 chars).
    Fingerprint(String),
    /// Accept any key; the probe reports the fingerprint so that the caller can pin it.
    TrustOnFirstUse,
}

impl HostKeyPin {
    /// The pin for a host: a non-empty `knownHost` wins over a recorded fingerprint, which wins
    /// over trust-on-first-use.
    pub fn from_sources(known_host: Option<&str>, fingerprint: Option<&str>) -> HostKeyPin {
        match (
            known_host.map(str::trim).filter(|s| !s.is_empty()),
            fingerprint.map(str::trim).filter(|s| !s.is_empty()),
        ) {
            (Some(k), _) => HostKeyPin::KnownHost(k.to_string()),
            (None, Some(f)) => HostKeyPin::Fingerprint(f.to_string()),
            (None, None) => HostKeyPin::TrustOnFirstUse,
        }
    }
}

/// One command to run on a host. `Debug` shows the stdin's length only: it holds the Raw
/// preamble's exported secrets or the envelope's parameters (#23).
#[derive(Clone, PartialEq, Eq)]
pub struct RemoteCommand {
    /// The command string (run by the login shell, or handed to a `ForceCommand` shim as
    /// `SSH_ORIGINAL_COMMAND`).
    pub command: String,
    /// Bytes written to the command's stdin, followed by EOF.
    pub stdin: Vec<u8>,
    /// Wall-clock bound for the whole call once a connection is available. On expiry the remote
    /// processes are killed, the channel closed and [`TransportError::CommandTimeout`] returned.
    pub timeout: Duration,
    /// Send `command` exactly as given (for a `ForceCommand` shim, which parses it). Otherwise
    /// the real transport prefixes it with an exported run marker so that a timed-out command's
    /// whole process session can be found and killed.
    pub verbatim: bool,
    /// Stops the command early: the transport kills it as on a timeout and returns
    /// [`TransportError::Cancelled`] (a join whose NodeClaim went away, S26).
    pub cancel: Cancel,
}

/// A cancellation signal for a [`RemoteCommand`]. Not part of what the command *is*: two
/// commands that differ only in it compare equal.
#[derive(Clone, Default)]
pub struct Cancel(Option<tokio_util::sync::CancellationToken>);

impl Cancel {
    pub fn new(token: tokio_util::sync::CancellationToken) -> Self {
        Cancel(Some(token))
    }

    /// Resolves once cancelled; never for a command without a signal.
    pub async fn cancelled(&self) {
        match &self.0 {
            Some(t) => t.cancelled().await,
            None => std::future::pending().await,
        }
    }
}

impl PartialEq for Cancel {
    fn eq(&self, _: &Self) -> bool {
        true
    }
}

impl Eq for Cancel {}

impl std::fmt::Debug for RemoteCommand {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RemoteCommand")
            .field("command", &self.command)
            .field("stdin_len", &self.stdin.len())
            .field("timeout", &self.timeout)
            .field("verbatim", &self.verbatim)
            .field("cancellable", &self.cancel.0.is_some())
            .finish()
    }
}

impl RemoteCommand {
    pub fn new(command: impl Into<String>, timeout: Duration) -> Self {
        RemoteCommand {
            command: command.into(),
            stdin: Vec::new(),
            timeout,
            verbatim: false,
            cancel: Cancel::default(),
        }
    }

    /// A command handed to a `ForceCommand` shim unchanged (see [`RemoteCommand::verbatim`]).
    pub fn verbatim(command: impl Into<String>, timeout: Duration) -> Self {
        RemoteCommand {
            verbatim: true,
            ..RemoteCommand::new(command, timeout)
        }
    }

    pub fn with_stdin(mut self, stdin: impl Into<Vec<u8>>) -> Self {
        self.stdin = stdin.into();
        self
    }

    pub fn with_cancel(mut self, cancel: Cancel) -> Self {
        self.cancel = cancel;
        self
    }
}

/// What a command produced. Output beyond the transport's caps is dropped from the **front**
/// and counted: `stdout`/`stderr` are the last bytes the command wrote, and a non-zero
/// `*_dropped` means they start mid-stream (redact them with
/// [`crate::profile::redact::Redactor::redact_window`] / `tail_output`, which also remove the
/// end of a secret cut there).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CommandOutput {
    /// The remote exit status; a command killed by a signal reports `128 + signal number`.
    pub exit_status: u32,
    pub stdout: Vec<u8>,
    pub stderr: Vec<u8>,
    /// Bytes written before `stdout` that were dropped.
    pub stdout_dropped: u64,
    /// Bytes written before `stderr` that were dropped.
    pub stderr_dropped: u64,
}

impl CommandOutput {
    pub fn success(&self) -> bool {
        self.exit_status == 0
    }
}

/// Result of a successful probe.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProbeReport {
    pub facts: ProbeFacts,
    /// The host key fingerprint seen (and verified against the pin), `SHA256:…`.
    pub fingerprint: String,
    /// The bastion's host key, when the host is reached through a jump host (verified against
    /// the bastion's pin), so that it can be pinned on first use like the host's own.
    pub jump: Option<JumpKey>,
}

/// The host key a bastion presented, and which bastion (`address:port`) it belongs to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct JumpKey {
    pub endpoint: String,
    pub fingerprint: String,
}

impl JumpKey {
    /// The `address:port` a pin recorded for `target` (a bastion) must name.
    pub fn endpoint_of(target: &HostTarget) -> String {
        format!("{}:{}", target.address, target.port)
    }
}

/// Why a transport call failed. Every variant names the host.
#[derive(Debug, thiserror::Error, Clone, PartialEq, Eq)]
pub enum TransportError {
    #[error("{host}: private key is encrypted (passphrase-protected keys are not supported)")]
    KeyEncrypted { host: String },
    #[error("{host}: private key is invalid: {reason}")]
    KeyInvalid { host: String, reason: String },
    #[error("{host}: knownHost is invalid: {reason}")]
    PinInvalid { host: String, reason: String },
    #[error("{host}: connection to {address} refused")]
    DialRefused { host: String, address: String },
    #[error("{host}: connecting to {address} timed out after {after:?}")]
    DialTimeout {
        host: String,
        address: String,
        after: Duration,
    },
    #[error("{host}: cannot connect to {address}: {reason}")]
    DialFailed {
        host: String,
        address: String,
        reason: String,
    },
    #[error("{host}: SSH handshake timed out after {after:?}")]
    HandshakeTimeout { host: String, after: Duration },
    #[error("{host}: host key mismatch: expected {expected}, host presented {actual}")]
    HostKeyMismatch {
        host: String,
        expected: String,
        actual: String,
    },
    #[error("{host}: public key authentication refused for user {user}")]
    AuthRefused { host: String, user: String },
    #[error("{host}: command timed out after {after:?}")]
    CommandTimeout { host: String, after: Duration },
    #[error("{host}: command cancelled (killed before it finished)")]
    Cancelled { host: String },
    #[error("{host}: channel error: {reason}")]
    Channel { host: String, reason: String },
    #[error("{host}: SSH protocol error: {reason}")]
    Protocol { host: String, reason: String },
    #[error("{host}: probe failed: {source}")]
    Probe {
        host: String,
        #[source]
        source: ProbeError,
    },
}

impl TransportError {
    /// The host this error is about.
    pub fn host(&self) -> &str {
        match self {
            TransportError::KeyEncrypted { host }
            | TransportError::KeyInvalid { host, .. }
            | TransportError::PinInvalid { host, .. }
            | TransportError::DialRefused { host, .. }
            | TransportError::DialTimeout { host, .. }
            | TransportError::DialFailed { host, .. }
            | TransportError::HandshakeTimeout { host, .. }
            | TransportError::HostKeyMismatch { host, .. }
            | TransportError::AuthRefused { host, .. }
            | TransportError::CommandTimeout { host, .. }
            | TransportError::Cancelled { host, .. }
            | TransportError::Channel { host, .. }
            | TransportError::Protocol { host, .. }
            | TransportError::Probe { host, .. } => host,
        }
    }

    /// Whether the call got as far as talking SSH to the host. `false` means nothing reached
    /// the host at all (bad key or pin text, dial refused or timed out): a configuration error
    /// of this kind leaves the host as it was.
    pub fn touched_host(&self) -> bool {
        !matches!(
            self,
            TransportError::KeyEncrypted { .. }
                | TransportError::KeyInvalid { .. }
                | TransportError::PinInvalid { .. }
                | TransportError::DialRefused { .. }
                | TransportError::DialTimeout { .. }
                | TransportError::DialFailed { .. }
        )
    }

    /// Whether a later attempt may succeed without anyone changing configuration (network
    /// trouble, a host that is down or hanging): worth a re-probe with backoff. Host-key
    /// mismatches, refused or unusable keys and unparsable probe output are not.
    pub fn is_transient(&self) -> bool {
        matches!(
            self,
            TransportError::DialRefused { .. }
                | TransportError::DialTimeout { .. }
                | TransportError::DialFailed { .. }
                | TransportError::HandshakeTimeout { .. }
                | TransportError::CommandTimeout { .. }
                | TransportError::Channel { .. }
                | TransportError::Protocol { .. }
        )
    }
}

/// The SSH port. Implemented by [`crate::ssh::RusshTransport`] and by simulated hosts.
///
/// Implementations verify the host key against [`HostTarget::pin`] before authenticating or
/// opening any session, may keep connections alive between calls, and bound every call in time.
pub trait Transport: Send + Sync + 'static {
    /// Verify the host key and read the host's facts. Raw hosts (`verified_shim == None`) run the
    /// fixed probe script ([`crate::ssh::probe::PROBE_SCRIPT`]); Verified hosts get
    /// `<verified_shim> probe` with the Go provider's probe envelope on stdin
    /// ([`crate::ssh::probe::VERIFIED_PROBE_ENVELOPE`]), answered by kpssh's shim or the Go
    /// provider's (`verified_shim` is the shim command from the spec, which `ForceCommand` runs).
    fn probe(
        &self,
        target: &HostTarget,
        verified_shim: Option<&str>,
    ) -> impl Future<Output = Result<ProbeReport, TransportError>> + Send;

    /// Run one command and collect its (capped) output. A non-zero exit status is a successful
    /// call; only transport failures and timeouts are errors.
    fn exec(
        &self,
        target: &HostTarget,
        cmd: RemoteCommand,
    ) -> impl Future<Output = Result<CommandOutput, TransportError>> + Send;

    /// Whether a call to `target` now would reuse a pooled connection instead of dialling a
    /// new one. The controller paces only dials (`--ssh-dials-per-second`) and asks this once
    /// it holds a probe or phase slot. A hint: the connection may still be evicted or found
    /// dead before the call uses it (the call then dials unpaced, once).
    fn pooled(&self, target: &HostTarget) -> bool;

    /// Drop any pooled connection to `host` (`"ns/name"`), e.g. when the SSHHost was deleted or
    /// its spec changed.
    fn forget(&self, host: &str) -> impl Future<Output = ()> + Send;
}
