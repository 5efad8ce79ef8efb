//! [`RusshTransport`]: the [`Transport`] port over russh, with pooled connections.
//!
//! - Host key: checked in russh's `check_server_key` callback, i.e. during key exchange, before
//!   authentication and before any channel is opened. A mismatch aborts the handshake.
//! - Auth: public key only (ed25519, ECDSA, RSA with rsa-sha2-512/256).
//! - Jump host: the target's SSH stream is a `direct-tcpip` channel of the bastion's (pooled)
//!   connection.
//! - Timeouts: TCP dial ([`TransportConfig::dial_timeout`]), SSH handshake + auth
//!   ([`TransportConfig::handshake_timeout`], catches tarpits that accept and never speak), and
//!   per command ([`RemoteCommand::timeout`]). Commands are prefixed with an exported run marker
//!   (`KPSSH_RUN=<random>`); on timeout a second channel kills every process session holding a
//!   marked process or a descendant of one (this reaches `sudo`'s root session too), an SSH
//!   `signal` KILL is sent (honoured by OpenSSH for non-root sessions) and the channel is
//!   closed. Verbatim commands (`ForceCommand` shims) get only the signal and the close: the
//!   shim must stop its child when its stdin/stdout close.
//! - A command is done at its exit status; output still arriving (e.g. a background child that
//!   keeps stdout open) is collected for at most [`TransportConfig::exit_grace`], then the
//!   channel is closed.
//! - stdout/stderr are capped ([`TransportConfig::stdout_cap`]/`stderr_cap`): the last `cap`
//!   bytes are kept, the earlier ones dropped and counted, so memory stays bounded whatever the
//!   host prints and what is quoted is the end of the output.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use russh::client::{self, Handle, Msg};
use russh::keys::{HashAlg, PrivateKeyWithHashAlg};
use russh::{ChannelMsg, ChannelReadHalf, ChannelWriteHalf, Disconnect, Sig};
use tokio::net::TcpStream;
use tokio::time::{Instant, timeout, timeout_at};
use tracing::debug;

use crate::ssh::capped::Capped;
use crate::ssh::known_host::{PinCheck, fingerprint};
use crate::ssh::pool::{Origin, Pool, PoolConfig, Pooled};
use crate::ssh::probe::{self, PROBE_SCRIPT, ProbeError, VERIFIED_PROBE_ENVELOPE};
use crate::ssh::transport::{
    CommandOutput, HostTarget, JumpKey, ProbeReport, RemoteCommand, Transport, TransportError,
};

/// Tunables of the real transport.
#[derive(Clone, Debug)]
pub struct TransportConfig {
    /// TCP connect bound (also bounds opening the bastion's `direct-tcpip` channel).
    pub dial_timeout: Duration,
    /// SSH version exchange + key exchange + authentication bound.
    pub handshake_timeout: Duration,
    /// Bound of a probe command (after the connection is available).
    pub probe_timeout: Duration,
    /// Pooled connections unused this long are closed.
    pub idle_timeout: Duration,
    /// Cap on pooled connections (LRU eviction of idle ones).
    pub max_connections: usize,
    /// SSH keepalive period on pooled connections (dead peers are detected after 3 misses).
    pub keepalive_interval: Duration,
    /// Bytes of stdout kept per command (the last ones); the earlier ones are dropped and counted.
    pub stdout_cap: usize,
    /// Bytes of stderr kept per command (the last ones).
    pub stderr_cap: usize,
    /// After the exit status arrives, how long to wait for remaining output / EOF.
    pub exit_grace: Duration,
}

impl Default for TransportConfig {
    fn default() -> Self {
        TransportConfig {
            dial_timeout: Duration::from_secs(15),
            handshake_timeout: Duration::from_secs(15),
            probe_timeout: Duration::from_secs(30),
            idle_timeout: Duration::from_secs(300),
            max_connections: 4096,
            keepalive_interval: Duration::from_secs(30),
            stdout_cap: 1 << 20,
            stderr_cap: 1 << 20,
            exit_grace: Duration::from_millis(500),
        }
    }
}

/// The russh implementation of [`Transport`]. Create it inside a tokio runtime (its pool spawns
/// an idle reaper); share it behind an `Arc`.
pub struct RusshTransport {
    config: TransportConfig,
    ssh_config: Arc<client::Config>,
    pool: Pool<Connection>,
}

/// One authenticated SSH connection (plus the bastion connection it tunnels through).
pub struct Connection {
    handle: Arc<Handle<Client>>,
    fingerprint: String,
    jump: Option<Arc<Connection>>,
}

impl Pooled for Connection {
    fn is_open(&self) -> bool {
        !self.handle.is_closed() && self.jump.as_ref().is_none_or(|j| j.is_open())
    }

    fn close(&self) {
        if self.handle.is_closed() {
            return;
        }
        // Best effort: queue a disconnect; the session task ends once the handle is dropped.
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            let handle = self.handle.clone();
            rt.spawn(async move {
                let _ = handle
                    .disconnect(Disconnect::ByApplication, "closed by kpssh", "")
                    .await;
            });
        }
    }
}

/// russh client handler: checks the host key against the pin.
pub struct Client {
    address: String,
    port: u16,
    pin: PinCheck,
    seen: Arc<Mutex<Option<String>>>,
}

/// Errors surfacing from the russh handshake.
#[derive(Debug)]
pub enum ClientError {
    Russh(russh::Error),
    HostKeyMismatch { expected: String, actual: String },
}

impl From<russh::Error> for ClientError {
    fn from(e: russh::Error) -> Self {
        ClientError::Russh(e)
    }
}

impl client::Handler for Client {
    type Error = ClientError;

    async fn check_server_key(
        &mut self,
        key: &russh::keys::ssh_key::PublicKey,
    ) -> Result<bool, Self::Error> {
        let actual = fingerprint(key);
        if let Ok(mut seen) = self.seen.lock() {
            *seen = Some(actual.clone());
        }
        match self.pin.verify(&self.address, self.port, &actual) {
            Ok(()) => Ok(true),
            Err(expected) => Err(ClientError::HostKeyMismatch { expected, actual }),
        }
    }
}

fn identity(target: &HostTarget) -> u64 {
    target.connection_identity()
}

/// The pool key of a bastion connection: who logs in where, and with which key (its public
/// fingerprint), so that hosts reaching one bastion with different keys each keep their own
/// connection instead of replacing each other's on every call.
fn jump_key(j: &HostTarget, key: &russh::keys::PrivateKey) -> String {
    format!(
        "jump {}@{}:{} {}",
        j.user,
        j.address,
        j.port,
        key.public_key().fingerprint(HashAlg::Sha256)
    )
}

fn dial_addr(t: &HostTarget) -> String {
    format!("{}:{}", t.address, t.port)
}

fn protocol(host: &str, e: impl std::fmt::Display) -> TransportError {
    TransportError::Protocol {
        host: host.to_string(),
        reason: e.to_string(),
    }
}

fn channel_err(host: &str, e: impl std::fmt::Display) -> TransportError {
    TransportError::Channel {
        host: host.to_string(),
        reason: e.to_string(),
    }
}

fn load_key(target: &HostTarget) -> Result<russh::keys::PrivateKey, TransportError> {
    match russh::keys::decode_secret_key(target.key.expose(), None) {
        Ok(k) => Ok(k),
        Err(russh::keys::Error::KeyIsEncrypted) => Err(TransportError::KeyEncrypted {
            host: target.host.clone(),
        }),
        Err(e) => {
            // Only the error kind, never the key text.
            let reason = match e {
                russh::keys::Error::UnsupportedKeyType { .. } => "unsupported key type",
                russh::keys::Error::CouldNotReadKey => {
                    "not an OpenSSH or PEM private key (BEGIN … PRIVATE KEY)"
                }
                _ => "cannot decode private key",
            };
            Err(TransportError::KeyInvalid {
                host: target.host.clone(),
                reason: reason.to_string(),
            })
        }
    }
}

fn signal_number(sig: &Sig) -> u32 {
    match sig {
        Sig::HUP => 1,
        Sig::INT => 2,
        Sig::QUIT => 3,
        Sig::ILL => 4,
        Sig::ABRT => 6,
        Sig::FPE => 8,
        Sig::KILL => 9,
        Sig::USR1 => 10,
        Sig::SEGV => 11,
        Sig::PIPE => 13,
        Sig::ALRM => 14,
        Sig::TERM => 15,
        _ => 0,
    }
}

/// Host key signature algorithms the client accepts: russh's defaults without SHA-1 `ssh-rsa`
/// (#23). A host offering only `ssh-rsa` fails the key exchange; its RSA key still works with
/// `rsa-sha2-256`/`rsa-sha2-512` (OpenSSH 7.2 and later).
pub const HOST_KEY_ALGORITHMS: &[russh::keys::Algorithm] = &[
    russh::keys::Algorithm::Ed25519,
    russh::keys::Algorithm::Ecdsa {
        curve: russh::keys::EcdsaCurve::NistP256,
    },
    russh::keys::Algorithm::Ecdsa {
        curve: russh::keys::EcdsaCurve::NistP384,
    },
    russh::keys::Algorithm::Ecdsa {
        curve: russh::keys::EcdsaCurve::NistP521,
    },
    russh::keys::Algorithm::Rsa {
        hash: Some(HashAlg::Sha512),
    },
    russh::keys::Algorithm::Rsa {
        hash: Some(HashAlg::Sha256),
    },
];

/// The hash an RSA user key signs with, given what the host's `server-sig-algs` names as its
/// best (`None`: no list; `Some(None)`: SHA-1 `ssh-rsa` only). SHA-2 always (#23): a host that
/// accepts nothing but SHA-1 is refused with the reason rather than sent a SHA-1 signature.
pub fn rsa_user_hash(offered: Option<Option<HashAlg>>) -> Result<Option<HashAlg>, &'static str> {
    match offered {
        Some(Some(h)) => Ok(Some(h)),
        Some(None) => Err(
            "the host accepts only SHA-1 RSA signatures (ssh-rsa) for public keys; kpssh signs \
             with rsa-sha2-256/512 only: enable them in the host's PubkeyAcceptedAlgorithms or \
             use an ed25519 or ECDSA key",
        ),
        None => Ok(Some(HashAlg::Sha512)),
    }
}

impl RusshTransport {
    pub fn new(config: TransportConfig) -> Self {
        let ssh_config = client::Config {
            keepalive_interval: Some(config.keepalive_interval),
            keepalive_max: 3,
            inactivity_timeout: None,
            nodelay: true,
            preferred: russh::Preferred {
                key: std::borrow::Cow::Borrowed(HOST_KEY_ALGORITHMS),
                ..Default::default()
            },
            ..Default::default()
        };
        let pool = Pool::new(PoolConfig {
            idle_timeout: config.idle_timeout,
            max_connections: config.max_connections,
        });
        RusshTransport {
            config,
            ssh_config: Arc::new(ssh_config),
            pool,
        }
    }

    pub fn config(&self) -> &TransportConfig {
        &self.config
    }

    /// Number of pooled connections (targets and bastions).
    pub fn pooled_connections(&self) -> usize {
        self.pool.len()
    }

    /// The pooled (or a freshly dialled) connection for `target`, re-verified against its pin.
    async fn connection(
        &self,
        target: &HostTarget,
    ) -> Result<(Arc<Connection>, Origin), TransportError> {
        // Validate configuration before touching the network.
        let key = load_key(target)?;
        let pin = PinCheck::from_pin(&target.pin).map_err(|reason| TransportError::PinInvalid {
            host: target.host.clone(),
            reason,
        })?;
        let (conn, origin) = self
            .pool
            .get_or_dial(&target.host, identity(target), || {
                self.dial(target, key, pin.clone())
            })
            .await?;
        if origin == Origin::Reused
            && let Err(expected) = pin.verify(&target.address, target.port, &conn.fingerprint)
        {
            // The pin changed since this connection was verified: never use it.
            self.pool.forget_if(&target.host, &conn);
            return Err(TransportError::HostKeyMismatch {
                host: target.host.clone(),
                expected,
                actual: conn.fingerprint.clone(),
            });
        }
        Ok((conn, origin))
    }

    fn dial<'a>(
        &'a self,
        target: &'a HostTarget,
        key: russh::keys::PrivateKey,
        pin: PinCheck,
    ) -> std::pin::Pin<Box<dyn Future<Output = Result<Connection, TransportError>> + Send + 'a>>
    {
        Box::pin(async move {
            let host = target.host.as_str();
            let seen = Arc::new(Mutex::new(None));
            let handler = Client {
                address: target.address.clone(),
                port: target.port,
                pin,
                seen: seen.clone(),
            };
            let (handle, jump) = match &target.jump {
                None => {
                    let addr = dial_addr(target);
                    let stream = match timeout(
                        self.config.dial_timeout,
                        TcpStream::connect((target.address.as_str(), target.port)),
                    )
                    .await
                    {
                        Err(_) => {
                            return Err(TransportError::DialTimeout {
                                host: host.into(),
                                address: addr,
                                after: self.config.dial_timeout,
                            });
                        }
                        Ok(Err(e)) if e.kind() == std::io::ErrorKind::ConnectionRefused => {
                            return Err(TransportError::DialRefused {
                                host: host.into(),
                                address: addr,
                            });
                        }
                        Ok(Err(e)) => {
                            return Err(TransportError::DialFailed {
                                host: host.into(),
                                address: addr,
                                reason: e.to_string(),
                            });
                        }
                        Ok(Ok(s)) => s,
                    };
                    let _ = stream.set_nodelay(true);
                    (self.handshake(target, stream, handler, key).await?, None)
                }
                Some(bastion) => {
                    let (bconn, _) = self.bastion(bastion).await.map_err(|e| match e {
                        // The bastion's key or credentials are wrong: a configuration problem
                        // (never retried as a network error), named after the bastion.
                        TransportError::HostKeyMismatch { .. }
                        | TransportError::PinInvalid { .. }
                        | TransportError::KeyInvalid { .. }
                        | TransportError::KeyEncrypted { .. }
                        | TransportError::AuthRefused { .. } => e,
                        // Name the target host; keep the bastion's error text.
                        e => TransportError::DialFailed {
                            host: host.into(),
                            address: dial_addr(target),
                            reason: format!("via jump host: {e}"),
                        },
                    })?;
                    let addr = dial_addr(target);
                    let channel = match timeout(
                        self.config.dial_timeout,
                        bconn.handle.channel_open_direct_tcpip(
                            target.address.clone(),
                            u32::from(target.port),
                            "127.0.0.1",
                            0,
                        ),
                    )
                    .await
                    {
                        Err(_) => {
                            return Err(TransportError::DialTimeout {
                                host: host.into(),
                                address: addr,
                                after: self.config.dial_timeout,
                            });
                        }
                        Ok(Err(e)) => {
                            return Err(TransportError::DialFailed {
                                host: host.into(),
                                address: addr,
                                reason: format!("jump host could not open a tunnel: {e}"),
                            });
                        }
                        Ok(Ok(c)) => c,
                    };
                    let stream = channel.into_stream();
                    (
                        self.handshake(target, stream, handler, key).await?,
                        Some(bconn),
                    )
                }
            };
            let fingerprint = seen
                .lock()
                .ok()
                .and_then(|s| s.clone())
                .ok_or_else(|| protocol(host, "no host key seen"))?;
            debug!(host, %fingerprint, "ssh connection established");
            Ok(Connection {
                handle: Arc::new(handle),
                fingerprint,
                jump,
            })
        })
    }

    async fn bastion(
        &self,
        bastion: &HostTarget,
    ) -> Result<(Arc<Connection>, Origin), TransportError> {
        let key = load_key(bastion)?;
        let pin =
            PinCheck::from_pin(&bastion.pin).map_err(|reason| TransportError::PinInvalid {
                host: bastion.host.clone(),
                reason,
            })?;
        let pool_key = jump_key(bastion, &key);
        let (conn, origin) = self
            .pool
            .get_or_dial(&pool_key, identity(bastion), || {
                self.dial(bastion, key, pin.clone())
            })
            .await?;
        if origin == Origin::Reused
            && let Err(expected) = pin.verify(&bastion.address, bastion.port, &conn.fingerprint)
        {
            self.pool.forget_if(&pool_key, &conn);
            return Err(TransportError::HostKeyMismatch {
                host: bastion.host.clone(),
                expected,
                actual: conn.fingerprint.clone(),
            });
        }
        Ok((conn, origin))
    }

    async fn handshake<S>(
        &self,
        target: &HostTarget,
        stream: S,
        handler: Client,
        key: russh::keys::PrivateKey,
    ) -> Result<Handle<Client>, TransportError>
    where
        S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
    {
        let host = target.host.as_str();
        let work = async {
            let mut handle = client::connect_stream(self.ssh_config.clone(), stream, handler)
                .await
                .map_err(|e| match e {
                    ClientError::HostKeyMismatch { expected, actual } => {
                        TransportError::HostKeyMismatch {
                            host: host.into(),
                            expected,
                            actual,
                        }
                    }
                    ClientError::Russh(e) => protocol(host, e),
                })?;
            let key = Arc::new(key);
            let hash = if key.algorithm().is_rsa() {
                let offered = handle.best_supported_rsa_hash().await.ok().flatten();
                rsa_user_hash(offered).map_err(|reason| TransportError::Protocol {
                    host: host.into(),
                    reason: reason.into(),
                })?
            } else {
                None
            };
            let auth = handle
                .authenticate_publickey(target.user.clone(), PrivateKeyWithHashAlg::new(key, hash))
                .await
                .map_err(|e| protocol(host, e))?;
            if !auth.success() {
                return Err(TransportError::AuthRefused {
                    host: host.into(),
                    user: target.user.clone(),
                });
            }
            Ok(handle)
        };
        match timeout(self.config.handshake_timeout, work).await {
            Ok(r) => r,
            Err(_) => Err(TransportError::HandshakeTimeout {
                host: host.into(),
                after: self.config.handshake_timeout,
            }),
        }
    }

    /// Run `cmd` on a connection, bounded by `cmd.timeout`.
    async fn run(
        &self,
        target: &HostTarget,
        conn: &Connection,
        cmd: &RemoteCommand,
    ) -> Result<Finished, RunError> {
        let host = target.host.as_str();
        let deadline = Instant::now() + cmd.timeout;
        // A pooled connection to a host that silently went away hangs here: bound the open
        // separately so that the caller can re-dial (and then see a dial error).
        let open_bound = cmd.timeout.min(self.config.handshake_timeout);
        let channel = match timeout(open_bound, conn.handle.channel_open_session()).await {
            Err(_) => {
                return Err(RunError::Open(channel_err(
                    host,
                    format!("opening a session channel timed out after {open_bound:?}"),
                )));
            }
            Ok(Err(e)) => return Err(RunError::Open(channel_err(host, e))),
            Ok(Ok(c)) => c,
        };
        let (mut read, write) = channel.split();
        let marker = (!cmd.verbatim).then(|| format!("{:016x}", rand::random::<u64>()));
        let command = match &marker {
            Some(m) => format!("{RUN_MARKER}={m}; export {RUN_MARKER}; {}", cmd.command),
            None => cmd.command.clone(),
        };
        // The timeout and a cancellation end the command alike: killed, channel closed.
        let stop = async {
            tokio::select! {
                biased;
                () = cmd.cancel.cancelled() => true,
                () = tokio::time::sleep_until(deadline) => false,
            }
        };
        let result = tokio::select! {
            biased;
            r = self.drive(host, &mut read, &write, &command, &cmd.stdin) => Ok(r),
            cancelled = stop => Err(cancelled),
        };
        match result {
            Ok(Ok((out, fed))) => {
                // A command that exited without reading all of its stdin leaves data queued
                // behind the remote window; russh then holds the close back (and can block on
                // it) and the host keeps the channel open. Bound the close and retire such a
                // connection, so that no call waits on it and the host frees the session.
                let closed = fed && timeout(TEARDOWN_WAIT, write.close()).await.is_ok();
                Ok(Finished {
                    out,
                    reusable: closed,
                })
            }
            Ok(Err(e)) => {
                let _ = timeout(TEARDOWN_WAIT, write.close()).await;
                Err(RunError::Failed(e))
            }
            Err(cancelled) => {
                // Kill the remote processes (marker kill, then an SSH `signal` request, which
                // OpenSSH honours only for privilege-separated, i.e. non-root, sessions), close
                // the channel and wait briefly for the host to acknowledge, so that the
                // teardown has left this machine before the call returns.
                let teardown = async {
                    if let Some(m) = &marker {
                        kill_marked(conn, m).await;
                    }
                    let _ = write.signal(Sig::KILL).await;
                    let _ = write.close().await;
                    while let Some(msg) = read.wait().await {
                        if matches!(msg, ChannelMsg::Close) {
                            break;
                        }
                    }
                };
                let acknowledged = timeout(TEARDOWN_WAIT, teardown).await.is_ok();
                if !acknowledged {
                    debug!(host, "teardown of a timed-out command was not acknowledged");
                }
                Err(RunError::Timeout {
                    connection_alive: acknowledged,
                    cancelled,
                })
            }
        }
    }

    async fn drive(
        &self,
        host: &str,
        read: &mut ChannelReadHalf,
        write: &ChannelWriteHalf<Msg>,
        command: &str,
        stdin: &[u8],
    ) -> Result<(CommandOutput, bool), TransportError> {
        write
            .exec(true, command.as_bytes())
            .await
            .map_err(|e| channel_err(host, e))?;
        let feed = async {
            if !stdin.is_empty() {
                // The command may exit without reading its stdin; that is not an error.
                let _ = write.data(stdin).await;
            }
            let _ = write.eof().await;
        };
        let collect = async {
            let mut out = Capped::new(self.config.stdout_cap);
            let mut err = Capped::new(self.config.stderr_cap);
            let mut status: Option<u32> = None;
            let mut grace_until: Option<Instant> = None;
            loop {
                let msg = match grace_until {
                    None => read.wait().await,
                    Some(t) => match timeout_at(t, read.wait()).await {
                        Ok(m) => m,
                        Err(_) => break,
                    },
                };
                match msg {
                    None | Some(ChannelMsg::Close) => break,
                    Some(ChannelMsg::Data { data }) => out.push(&data),
                    Some(ChannelMsg::ExtendedData { data, ext }) => {
                        if ext == 1 {
                            err.push(&data)
                        }
                    }
                    Some(ChannelMsg::ExitStatus { exit_status }) => {
                        status = Some(exit_status);
                        grace_until.get_or_insert(Instant::now() + self.config.exit_grace);
                    }
                    Some(ChannelMsg::ExitSignal { signal_name, .. }) => {
                        status = Some(128 + signal_number(&signal_name));
                        grace_until.get_or_insert(Instant::now() + self.config.exit_grace);
                    }
                    Some(ChannelMsg::Failure) => {
                        return Err(channel_err(host, "the host refused to run the command"));
                    }
                    Some(_) => {}
                }
            }
            let status =
                status.ok_or_else(|| channel_err(host, "channel closed without an exit status"))?;
            let (stdout, stdout_dropped) = out.into_parts();
            let (stderr, stderr_dropped) = err.into_parts();
            Ok(CommandOutput {
                exit_status: status,
                stdout,
                stderr,
                stdout_dropped,
                stderr_dropped,
            })
        };
        // Stop feeding once the command is done (it may exit without reading all of stdin).
        tokio::pin!(feed, collect);
        let mut fed = false;
        loop {
            tokio::select! {
                result = &mut collect => return result.map(|out| (out, fed)),
                () = &mut feed, if !fed => fed = true,
            }
        }
    }
}

/// How long a timed-out command's teardown may take before the call returns anyway.
const TEARDOWN_WAIT: Duration = Duration::from_millis(1500);

/// Environment variable exported in front of non-verbatim commands; inherited by everything the
/// command starts (it does not survive `sudo`'s env_reset, which is why whole sessions are
/// killed below, not just the marked processes).
const RUN_MARKER: &str = "KPSSH_RUN";

/// Kill a timed-out command: every process session holding a process whose environment carries
/// `KPSSH_RUN=<marker>` or that descends from one (`sudo` may start the command in a new,
/// root-owned session), over a fresh channel of the same connection. The sweep runs as root
/// (directly, or through `sudo -n` for other users, since setuid processes' environments are
/// unreadable to them), else as the user, which can only reach the user's own processes.
async fn kill_marked(conn: &Connection, marker: &str) {
    let script = format!(
        r#"marked=$(grep -lzx '{RUN_MARKER}={marker}' /proc/[0-9]*/environ 2>/dev/null | sed 's,^/proc/,,;s,/environ$,,' | tr '\n' ' ')
[ -n "$marked" ] || exit 0
sids=$(cat /proc/[0-9]*/stat 2>/dev/null | awk -v m="$marked" '
  BEGIN {{ n = split(m, a, " "); for (i = 1; i <= n; i++) keep[a[i]] = 1 }}
  {{ s = $0; sub(/^.*\) /, "", s); split(s, f, " "); pp[$1] = f[2]; sid[$1] = f[4] }}
  END {{
    changed = 1
    while (changed) {{ changed = 0; for (p in pp) if (!(p in keep) && (pp[p] in keep)) {{ keep[p] = 1; changed = 1 }} }}
    for (p in keep) if ((p in sid) && sid[p] > 1) out[sid[p]] = 1
    for (x in out) print x
  }}')
for s in $sids; do pkill -KILL -s "$s" || kill -KILL -- "-$s"; done >/dev/null 2>&1
exit 0
"#
    );
    let runner = "if [ \"$(id -u)\" != 0 ] && sudo -n true 2>/dev/null; then exec sudo -n sh -s; else exec sh -s; fi";
    let Ok(channel) = conn.handle.channel_open_session().await else {
        return;
    };
    if channel.exec(true, runner).await.is_err() {
        return;
    }
    let (mut read, write) = channel.split();
    let _ = write.data(script.as_bytes()).await;
    let _ = write.eof().await;
    while let Some(msg) = read.wait().await {
        if matches!(msg, ChannelMsg::ExitStatus { .. } | ChannelMsg::Close) {
            break;
        }
    }
    let _ = write.close().await;
}

/// A command that ran to its exit.
struct Finished {
    out: CommandOutput,
    /// False when the channel could not be closed cleanly: the connection is retired.
    reusable: bool,
}

enum RunError {
    /// The channel could not be opened: nothing ran, the call may be retried on a new connection.
    Open(TransportError),
    Failed(TransportError),
    /// The command outlived its timeout or was cancelled, and was killed; `connection_alive`
    /// tells whether the host still answered the teardown.
    Timeout {
        connection_alive: bool,
        /// Stopped by [`RemoteCommand::cancel`], not by its timeout.
        cancelled: bool,
    },
}

impl Default for RusshTransport {
    fn default() -> Self {
        RusshTransport::new(TransportConfig::default())
    }
}

impl Transport for RusshTransport {
    async fn probe(
        &self,
        target: &HostTarget,
        verified_shim: Option<&str>,
    ) -> Result<ProbeReport, TransportError> {
        let cmd = match verified_shim {
            None => RemoteCommand::new("sh -s", self.config.probe_timeout)
                .with_stdin(PROBE_SCRIPT.as_bytes()),
            Some(shim) => RemoteCommand::verbatim(
                probe::verified_probe_command(shim),
                self.config.probe_timeout,
            )
            .with_stdin(VERIFIED_PROBE_ENVELOPE.as_bytes()),
        };
        let (out, fingerprint, jump) = self.exec_with_fingerprint(target, cmd).await?;
        let probe_err = |source| TransportError::Probe {
            host: target.host.clone(),
            source,
        };
        if out.exit_status != 0 {
            return Err(probe_err(ProbeError::Failed {
                exit_status: out.exit_status,
                stderr_excerpt: probe::excerpt(&out.stderr),
            }));
        }
        let facts = probe::parse_probe_output(&out.stdout).map_err(probe_err)?;
        let jump = match (&target.jump, jump) {
            (Some(bastion), Some(fingerprint)) => Some(JumpKey {
                endpoint: JumpKey::endpoint_of(bastion),
                fingerprint,
            }),
            _ => None,
        };
        Ok(ProbeReport {
            facts,
            fingerprint,
            jump,
        })
    }

    async fn exec(
        &self,
        target: &HostTarget,
        cmd: RemoteCommand,
    ) -> Result<CommandOutput, TransportError> {
        self.exec_with_fingerprint(target, cmd)
            .await
            .map(|(o, _, _)| o)
    }

    fn pooled(&self, target: &HostTarget) -> bool {
        // A host behind a bastion reuses the bastion's connection when it dials, but that
        // dial still opens a new SSH session to the host: only the host's own entry counts.
        self.pool.holds(&target.host, identity(target))
    }

    async fn forget(&self, host: &str) {
        self.pool.forget(host);
    }
}

impl RusshTransport {
    async fn exec_with_fingerprint(
        &self,
        target: &HostTarget,
        cmd: RemoteCommand,
    ) -> Result<(CommandOutput, String, Option<String>), TransportError> {
        let mut attempt = 0;
        loop {
            attempt += 1;
            let (conn, origin) = self.connection(target).await?;
            let result = self.run(target, &conn, &cmd).await;
            self.pool.touch(&target.host);
            match result {
                Ok(Finished { out, reusable }) => {
                    if !reusable {
                        debug!(host = %target.host, "retiring a connection whose channel did not close cleanly");
                        self.pool.forget_if(&target.host, &conn);
                    }
                    let jump = conn.jump.as_ref().map(|j| j.fingerprint.clone());
                    return Ok((out, conn.fingerprint.clone(), jump));
                }
                Err(RunError::Open(e)) => {
                    self.pool.forget_if(&target.host, &conn);
                    // A reused connection may have died silently: nothing ran, dial once more.
                    if origin == Origin::Reused && attempt == 1 {
                        debug!(host = %target.host, "pooled connection unusable, re-dialling");
                        continue;
                    }
                    return Err(e);
                }
                Err(RunError::Failed(e)) => {
                    if !conn.is_open() {
                        self.pool.forget_if(&target.host, &conn);
                    }
                    return Err(e);
                }
                Err(RunError::Timeout {
                    connection_alive,
                    cancelled,
                }) => {
                    if !connection_alive {
                        // The host did not even acknowledge the channel close: do not reuse.
                        self.pool.forget_if(&target.host, &conn);
                    }
                    if cancelled {
                        let host = target.host.clone();
                        return Err(TransportError::Cancelled { host });
                    }
                    return Err(TransportError::CommandTimeout {
                        host: target.host.clone(),
                        after: cmd.timeout,
                    });
                }
            }
        }
    }
}
