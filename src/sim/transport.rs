//! `SimTransport`: the `Transport` port over simulated hosts, keyed by address. Host keys are
//! checked against the pin like the real transport does, before any session is counted.
//!
//! Hosts with a [`Behaviour`](super::host::Behaviour) draw latencies, failures and hangs from
//! the transport's seeded random source. Everything the hosts did is written to a
//! [`Journal`] with virtual timestamps (the simulation's trace, counters and the invariants
//! that only the host side can see).

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use k8s_openapi::api::core::v1::Node;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use super::host::{ExecRecord, SimHost, SimPhase, parse_exports};
use super::kubelet::node_from_env;
use super::pool::{Conn, SimPool};
use crate::api::{HostState, NodeClaim, SSHHost};
use crate::k8s::{Cluster, ClusterError, MemoryCluster};
use crate::ssh::pool::PoolConfig;
use crate::ssh::probe::parse_probe_output;
use crate::ssh::{
    CommandOutput, HostKeyPin, HostTarget, ProbeFacts, ProbeReport, RemoteCommand, Transport,
    TransportError,
};

/// Commands kept in the log of a host with a seeded behaviour.
const LOG_KEEP: usize = 8;

/// One thing a simulated host did, at a virtual time (since the transport was created).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SimAction {
    pub at: Duration,
    pub host: String,
    pub what: String,
}

/// A violation seen from the host side.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostViolation {
    pub at: Duration,
    pub invariant: &'static str,
    pub message: String,
}

/// What the hosts did; drained by the simulation runner.
#[derive(Debug, Clone, Default)]
pub struct Journal {
    pub actions: Vec<SimAction>,
    pub violations: Vec<HostViolation>,
    pub joins_warm: u64,
    pub joins_cold: u64,
    pub leaves: u64,
    /// Phase runs that failed or hung because the host's behaviour said so.
    pub injected_phase_failures: u64,
    pub injected_hangs: u64,
    /// Every bootstrap token a join received (to check that none leaks into API text).
    pub tokens_seen: Vec<String>,
}

/// What one session sees of a host when it connects.
struct Link {
    fingerprint: String,
    handshake_delay: Duration,
    /// What the probe reads (an empty text for a phase).
    output: ProbeOutput,
    behaviour: Option<super::host::Behaviour>,
    /// Phases that hang on this host (empty for a probe).
    hang: Vec<SimPhase>,
    phase_latency: Duration,
    /// The host's power cuts when the session opened.
    power_cuts: u64,
    /// The pooled connection in use until the call ends.
    _pooled: PoolUse,
}

/// What a probe's session reads from the host: the facts its output would parse to (see
/// [`SimHost::probe_facts`]), or the text itself for the parser (output set by hand).
enum ProbeOutput {
    Facts(ProbeFacts),
    Text(String),
}

/// A call's use of its host's pooled connection: released (marked used now) when dropped,
/// also when the controller's task running the call is aborted.
struct PoolUse {
    hosts: Arc<Mutex<Fleet>>,
    /// The connection the call used (a crashed controller's calls release nothing of the
    /// next controller's connections).
    conn: Conn,
}

impl Drop for PoolUse {
    fn drop(&mut self) {
        let mut fleet = self.hosts.lock().unwrap_or_else(|p| p.into_inner());
        fleet.pool.release(self.conn);
    }
}

/// The simulated hosts in the order they were added, found by address, and the running
/// kubelets: the zombie check looks at those every step, not at the whole fleet, and reaches
/// each without a lookup by address.
#[derive(Default)]
struct Fleet {
    slots: Vec<SimHost>,
    /// Hashed: every session looks its host up here, and addresses share long prefixes.
    by_address: HashMap<String, usize, foldhash::fast::FixedState>,
    /// Address → slot of every host whose kubelet runs (address order, as before).
    kubelets: BTreeMap<String, usize>,
    /// The controller's SSH connections to the hosts, as the real transport pools them.
    pool: SimPool,
}

impl Fleet {
    fn get(&self, address: &str) -> Option<&SimHost> {
        self.by_address.get(address).map(|i| &self.slots[*i])
    }

    fn get_mut(&mut self, address: &str) -> Option<&mut SimHost> {
        self.by_address.get(address).map(|i| &mut self.slots[*i])
    }

    /// Add a host (or replace the one at its address).
    fn add(&mut self, host: SimHost) {
        let address = host.address.clone();
        match self.by_address.get(&address) {
            Some(&i) => self.slots[i] = host,
            None => {
                self.slots.push(host);
                self.by_address
                    .insert(address.clone(), self.slots.len() - 1);
            }
        }
        self.track(&address);
    }

    /// Call after any change to the host at `address`.
    fn track(&mut self, address: &str) {
        let Some(&slot) = self.by_address.get(address) else {
            return;
        };
        let running = self.slots[slot].kubelet_running();
        if running != self.kubelets.contains_key(address) {
            if running {
                self.kubelets.insert(address.to_string(), slot);
            } else {
                self.kubelets.remove(address);
            }
        }
    }
}

#[derive(Clone)]
pub struct SimTransport {
    hosts: Arc<Mutex<Fleet>>,
    cluster: MemoryCluster,
    /// Delay between a successful join and the Node registering.
    pub registration_delay: Duration,
    rng: Arc<Mutex<ChaCha8Rng>>,
    journal: Arc<Mutex<Journal>>,
    origin: tokio::time::Instant,
    /// Node name → addresses of every host that ever joined as it: the candidates
    /// `kubelet_host` looks at, instead of every host of the fleet per deleted Node.
    joined_as: Arc<Mutex<HashMap<String, Vec<String>>>>,
    /// Leaves running on hosts now, fleet-wide (each holds one of the controller's leave
    /// slots).
    leaves_running: Arc<AtomicUsize>,
}

/// Marks a leave running on a host (and counts it) until dropped: also when the controller's
/// task running it is aborted (a crash).
struct LeaveRunning<'a> {
    transport: &'a SimTransport,
    address: String,
}

impl Drop for LeaveRunning<'_> {
    fn drop(&mut self) {
        self.transport
            .with(&self.address, |h| h.leave_in_flight = false);
        self.transport.leaves_running.fetch_sub(1, Ordering::SeqCst);
    }
}

impl SimTransport {
    pub fn new(cluster: MemoryCluster) -> Self {
        SimTransport {
            hosts: Arc::new(Mutex::new(Fleet::default())),
            cluster,
            registration_delay: Duration::from_secs(5),
            rng: Arc::new(Mutex::new(ChaCha8Rng::seed_from_u64(0))),
            journal: Arc::new(Mutex::new(Journal::default())),
            origin: tokio::time::Instant::now(),
            joined_as: Arc::new(Mutex::new(HashMap::new())),
            leaves_running: Arc::new(AtomicUsize::new(0)),
        }
    }

    /// The connection pool's limits (the real transport's `--max-ssh-connections` and idle
    /// timeout; [`PoolConfig::default`] unless set).
    pub fn set_pool(&self, config: PoolConfig) {
        self.lock().pool.set_config(config);
    }

    /// SSH connections dialled so far (calls that found no pooled connection to reuse).
    pub fn dials(&self) -> u64 {
        self.lock().pool.dials()
    }

    /// SSH connections pooled now.
    pub fn pooled_connections(&self) -> usize {
        self.lock().pool.len()
    }

    /// The controller process died: its pooled connections went with it.
    pub fn drop_connections(&self) {
        self.lock().pool.clear();
    }

    /// Leaves running on hosts now, fleet-wide.
    pub fn leaves_running(&self) -> usize {
        self.leaves_running.load(Ordering::SeqCst)
    }

    /// Reseed the hosts' random source (latencies, failures, hangs).
    pub fn seed(&self, seed: u64) {
        *self.rng.lock().unwrap_or_else(|p| p.into_inner()) = ChaCha8Rng::seed_from_u64(seed);
    }

    /// Add a host (or replace the one at its address). Hosts are numbered in the order they
    /// were first added (see [`SimTransport::filter_map_kubelet_running`]).
    pub fn add(&self, host: SimHost) {
        self.lock().add(host);
    }

    /// Read or change a host.
    pub fn with<R>(&self, address: &str, f: impl FnOnce(&mut SimHost) -> R) -> Option<R> {
        let mut fleet = self.lock();
        let out = fleet.get_mut(address).map(f);
        fleet.track(address);
        out
    }

    pub fn host(&self, address: &str) -> Option<SimHost> {
        self.lock().get(address).cloned()
    }

    /// Visit every host, in the order they were added.
    pub fn each<R>(&self, f: impl FnMut(&SimHost) -> R) -> Vec<R> {
        self.lock().slots.iter().map(f).collect()
    }

    /// Visit every host whose kubelet runs, in address order, with its number (the order it
    /// was first added in, from 0), keeping what `f` returns.
    pub fn filter_map_kubelet_running<R>(
        &self,
        mut f: impl FnMut(usize, &SimHost) -> Option<R>,
    ) -> Vec<R> {
        let fleet = self.lock();
        (fleet.kubelets.values())
            .filter_map(|i| f(*i, &fleet.slots[*i]))
            .collect()
    }

    /// The host whose running kubelet is Node `node`: its address and whether the last leave
    /// sent to it failed.
    pub fn kubelet_host(&self, node: &str) -> Option<(String, bool)> {
        let candidates = self
            .joined_as
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(node)
            .cloned()
            .unwrap_or_default();
        let fleet = self.lock();
        candidates
            .iter()
            .filter_map(|a| fleet.get(a))
            .find(|h| h.kubelet_runs_as(node))
            .map(|h| (h.address.clone(), h.last_leave_ok == Some(false)))
    }

    /// Take what the hosts did since the last call (counters stay).
    pub fn drain_journal(&self) -> Journal {
        let mut j = self.journal();
        Journal {
            actions: std::mem::take(&mut j.actions),
            violations: std::mem::take(&mut j.violations),
            tokens_seen: std::mem::take(&mut j.tokens_seen),
            ..j.clone()
        }
    }

    /// Virtual time since the transport was created.
    pub fn elapsed(&self) -> Duration {
        tokio::time::Instant::now().saturating_duration_since(self.origin)
    }

    /// Record a simulation action (a fault, a demand change) in the journal.
    pub fn note(&self, host: &str, what: impl Into<String>) {
        let at = self.elapsed();
        self.journal().actions.push(SimAction {
            at,
            host: host.to_string(),
            what: what.into(),
        });
    }

    fn lock(&self) -> MutexGuard<'_, Fleet> {
        self.hosts.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn journal(&self) -> MutexGuard<'_, Journal> {
        self.journal.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn violation(&self, invariant: &'static str, message: String) {
        let at = self.elapsed();
        self.journal().violations.push(HostViolation {
            at,
            invariant,
            message,
        });
    }

    /// Connect: power, reachability and the host-key pin (S3: a mismatch opens no session).
    /// Returns what the session sees of the host, not a copy of all of it (its command log
    /// included): a probe is the simulation's hottest path.
    ///
    /// The session reuses the host's pooled connection or dials one (see [`SimPool`]);
    /// either way it takes as long (`handshake_delay` is a slow or hanging host, which a
    /// pooled connection meets on its channel open too).
    fn connect(&self, target: &HostTarget, probe: bool) -> Result<Link, TransportError> {
        let mut fleet = self.lock();
        let identity = target.connection_identity();
        let slot = fleet.by_address.get(&target.address).copied();
        let Fleet { slots, pool, .. } = &mut *fleet;
        let host = slot.and_then(|i| slots.get_mut(i));
        let connects = host.as_ref().map(|h| {
            let up = h.reachable && h.powered;
            (up, h.power_cuts, up && pin_matches(target, h))
        });
        let (up, cuts, ok) = connects.unwrap_or((false, 0, false));
        let (_, conn) = pool.checkout(&target.host, identity, up, cuts, ok);
        let host = host.ok_or_else(|| TransportError::DialRefused {
            host: target.host.clone(),
            address: target.address.clone(),
        })?;
        if !host.reachable || !host.powered {
            return Err(TransportError::DialRefused {
                host: target.host.clone(),
                address: target.address.clone(),
            });
        }
        if let Some(e) = expected_fingerprint(target).filter(|e| *e != host.fingerprint) {
            return Err(TransportError::HostKeyMismatch {
                host: target.host.clone(),
                expected: e.to_string(),
                actual: host.fingerprint.clone(),
            });
        }
        host.sessions += 1;
        Ok(Link {
            fingerprint: host.fingerprint.clone(),
            handshake_delay: host.handshake_delay,
            output: match probe.then(|| host.probe_facts()) {
                None => ProbeOutput::Text(String::new()),
                Some(Some(facts)) => ProbeOutput::Facts(facts),
                Some(None) => ProbeOutput::Text(host.probe_stdout()),
            },
            behaviour: host.behaviour,
            hang: if probe { Vec::new() } else { host.hang.clone() },
            phase_latency: host.phase_latency,
            power_cuts: host.power_cuts,
            _pooled: PoolUse {
                hosts: self.hosts.clone(),
                conn,
            },
        })
    }

    /// What a run of `phase` does on `host`: (hangs, exit status, latency).
    fn outcome(&self, host: &Link, phase: Option<SimPhase>) -> (bool, Option<u32>, Duration) {
        let Some(b) = (match phase {
            Some(_) => host.behaviour,
            None => None,
        }) else {
            let hang = phase.is_some_and(|p| host.hang.contains(&p));
            return (hang, None, host.phase_latency);
        };
        let Some(p) = phase else {
            return (false, None, host.phase_latency);
        };
        let mut rng = self.rng.lock().unwrap_or_else(|p| p.into_inner());
        let hang = rng.random_bool(b.hang.get(p).clamp(0.0, 1.0));
        let fail = rng.random_bool(b.fail.get(p).clamp(0.0, 1.0));
        let latency = b.latency.get(p).sample(&mut *rng);
        (hang, fail.then_some(1), latency)
    }

    /// Leave is about to run: it must not hit a host whose claim is a live, running node of
    /// a NodeClaim that is not being deleted (S25).
    async fn check_leave_fence(&self, target: &HostTarget) {
        let Some((ns, name)) = target.host.split_once('/') else {
            return;
        };
        let Ok(Some(host)) = self.cluster.get::<SSHHost>(Some(ns), name).await else {
            return;
        };
        let Some(claim) = host.claim().cloned() else {
            return;
        };
        if host.state() != HostState::InUse {
            return;
        }
        let Ok(Some(nc)) = self.cluster.get::<NodeClaim>(None, &claim.name).await else {
            return;
        };
        let live = nc.metadata.uid.as_deref() == Some(claim.uid.as_str())
            && nc.metadata.deletion_timestamp.is_none();
        if live {
            self.violation(
                "leave-fenced",
                format!(
                    "leave sent to {} while it is InUse for live NodeClaim {} (uid {})",
                    target.host, claim.name, claim.uid
                ),
            );
        }
    }

    /// The kubelet registers its Node a little after it starts, if it is still running; it
    /// retries until the API server takes it.
    pub fn register_later(&self, address: &str, env: BTreeMap<String, String>) {
        let this = self.clone();
        let address = address.to_string();
        tokio::spawn(async move {
            let node_name = super::kubelet::node_name(&env);
            tokio::time::sleep(this.registration_delay).await;
            loop {
                let running = this
                    .with(&address, |h| h.registers && h.kubelet_runs_as(&node_name))
                    .unwrap_or(false);
                if !running {
                    return;
                }
                let node: Node = node_from_env(&env, &format!("sim://adopted/{address}"));
                match this.cluster.create(&node).await {
                    Ok(_) => return,
                    // A kubelet re-uses a Node of its name (nodeadm's are per machine): it
                    // posts its status at once, Ready with a fresh heartbeat.
                    Err(ClusterError::AlreadyExists { .. }) => {
                        if this.post_ready(&node_name).await.is_ok() {
                            return;
                        }
                    }
                    Err(_) => {}
                }
                tokio::time::sleep(Duration::from_secs(10)).await;
            }
        });
    }

    /// The kubelet's status post for an existing Node: Ready, heartbeat now.
    async fn post_ready(&self, name: &str) -> Result<(), ClusterError> {
        let Some(mut node) = self.cluster.get::<Node>(None, name).await? else {
            return Err(ClusterError::Transient {
                kind: "Node".into(),
                key: name.into(),
                message: "gone meanwhile".into(),
            });
        };
        let at = k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(self.cluster.clock().now());
        super::kubelet::set_ready(&mut node, "True", at);
        self.cluster.replace_status(&node).await.map(|_| ())
    }

    /// After a reboot or power return: a kubelet that came back registers its Node again.
    pub fn kubelet_restarted(&self, address: &str) {
        let env = self
            .with(address, |h| {
                if h.kubelet_running() {
                    h.kubelet_env().cloned()
                } else {
                    None
                }
            })
            .flatten();
        if let Some(env) = env {
            self.register_later(address, env);
        }
    }
}

impl Transport for SimTransport {
    async fn probe(
        &self,
        target: &HostTarget,
        _verified_shim: Option<&str>,
    ) -> Result<ProbeReport, TransportError> {
        let host = self.connect(target, true)?;
        if !host.handshake_delay.is_zero() {
            tokio::time::sleep(host.handshake_delay).await;
        }
        let facts = match host.output {
            ProbeOutput::Facts(facts) => facts,
            ProbeOutput::Text(stdout) => {
                parse_probe_output(stdout.as_bytes()).map_err(|source| TransportError::Probe {
                    host: target.host.clone(),
                    source,
                })?
            }
        };
        Ok(ProbeReport {
            facts,
            fingerprint: host.fingerprint,
            jump: None,
        })
    }

    async fn exec(
        &self,
        target: &HostTarget,
        cmd: RemoteCommand,
    ) -> Result<CommandOutput, TransportError> {
        let stdin = String::from_utf8_lossy(&cmd.stdin).into_owned();
        let phase = SimPhase::detect(&stdin);
        if phase == Some(SimPhase::Leave) {
            self.with(&target.address, |h| h.last_leave_ok = Some(false));
        }
        let host = self.connect(target, false)?;
        if !host.handshake_delay.is_zero() {
            tokio::time::sleep(host.handshake_delay).await;
        }
        let env = parse_exports(&stdin);
        let _leave = if phase == Some(SimPhase::Leave) {
            self.check_leave_fence(target).await;
            self.with(&target.address, |h| h.leave_in_flight = true);
            self.leaves_running.fetch_add(1, Ordering::SeqCst);
            Some(LeaveRunning {
                transport: self,
                address: target.address.clone(),
            })
        } else {
            None
        };
        let (hang, injected_exit, latency) = self.outcome(&host, phase);
        self.finish(
            target,
            &host,
            &cmd,
            phase,
            env,
            hang,
            injected_exit,
            latency,
        )
        .await
    }

    fn pooled(&self, target: &HostTarget) -> bool {
        let fleet = self.lock();
        fleet.get(&target.address).is_some_and(|h| {
            let identity = target.connection_identity();
            fleet.pool.holds(
                &target.host,
                identity,
                h.reachable && h.powered,
                h.power_cuts,
            )
        })
    }

    async fn forget(&self, host: &str) {
        self.lock().pool.remove(host);
    }
}

/// Whether the host presents the key `target` pins (trust-on-first-use and known_host lines
/// other than a fingerprint accept any).
fn pin_matches(target: &HostTarget, host: &SimHost) -> bool {
    expected_fingerprint(target).is_none_or(|e| e == host.fingerprint)
}

fn expected_fingerprint(target: &HostTarget) -> Option<&str> {
    match &target.pin {
        HostKeyPin::Fingerprint(f) => Some(f.as_str()),
        HostKeyPin::KnownHost(k) if k.starts_with("SHA256:") => Some(k.as_str()),
        _ => None,
    }
}

impl SimTransport {
    /// Sleep for `d` unless `cmd` is cancelled first (then noted, and false).
    async fn sleep_unless_cancelled(
        &self,
        d: Duration,
        cmd: &RemoteCommand,
        target: &HostTarget,
        label: &str,
    ) -> bool {
        let done = tokio::select! {
            biased;
            () = tokio::time::sleep(d) => true,
            () = cmd.cancel.cancelled() => false,
        };
        if !done {
            self.note(&target.address, format!("{label} cancelled and killed"));
        }
        done
    }

    #[allow(clippy::too_many_arguments)]
    async fn finish(
        &self,
        target: &HostTarget,
        session: &Link,
        cmd: &RemoteCommand,
        phase: Option<SimPhase>,
        env: BTreeMap<String, String>,
        hang: bool,
        injected_exit: Option<u32>,
        latency: Duration,
    ) -> Result<CommandOutput, TransportError> {
        let label = phase.map_or("command".to_string(), |p| format!("{p:?}").to_lowercase());
        if hang || (injected_exit.is_none() && latency >= cmd.timeout && phase.is_some()) {
            if hang {
                self.journal().injected_hangs += 1;
            }
            if !self
                .sleep_unless_cancelled(cmd.timeout, cmd, target, &label)
                .await
            {
                return Err(TransportError::Cancelled {
                    host: target.host.clone(),
                });
            }
            self.note(&target.address, format!("{label} hung until its timeout"));
            return Err(TransportError::CommandTimeout {
                host: target.host.clone(),
                after: cmd.timeout,
            });
        }
        if !(self)
            .sleep_unless_cancelled(latency.min(cmd.timeout), cmd, target, &label)
            .await
        {
            // Killed as the real transport kills it: the run has no effect on the host.
            return Err(TransportError::Cancelled {
                host: target.host.clone(),
            });
        }
        let token = env.get("KPSSH_BOOTSTRAP_TOKEN").cloned();
        if let Some(t) = &token {
            self.journal().tokens_seen.push(t.clone());
        }
        let mut double_join = None;
        let exit = self
            .with(&target.address, |h| {
                if !h.powered || h.power_cuts != session.power_cuts {
                    // The machine lost power while the command ran (and may be back up by
                    // now, its services started from their boot state): the session dropped.
                    return None;
                }
                // A seeded fleet host (a long simulation) keeps which phases ran, not each
                // command's script and environment: nobody reads them there, and at 100,000
                // hosts they were a tenth of the peak memory.
                let (command, env_kept) = match h.behaviour {
                    Some(_) => (String::new(), BTreeMap::new()),
                    None => (cmd.command.clone(), env.clone()),
                };
                h.log.push(ExecRecord {
                    phase,
                    command,
                    env: env_kept,
                });
                if h.behaviour.is_some() && h.log.len() > LOG_KEEP {
                    // Long simulations keep only the latest commands of a host.
                    h.log.drain(..h.log.len() - LOG_KEEP);
                }
                let exit = injected_exit
                    .or_else(|| phase.and_then(|p| h.fail_next.remove(&p)))
                    .unwrap_or(0);
                let cold = phase == Some(SimPhase::Join) && std::mem::take(&mut h.cold);
                if exit == 0 {
                    match phase {
                        Some(SimPhase::Install) => h.cold = true,
                        Some(SimPhase::Join) => {
                            let name = env.get("KPSSH_NODE_NAME").cloned().unwrap_or_default();
                            if let Some(old) = h.kubelet_claim().filter(|n| *n != name) {
                                double_join = Some(old.to_string());
                            }
                            h.kubelet_active = true;
                            h.kubelet_enabled = true;
                            h.set_kubelet_env(Some(env.clone()));
                        }
                        Some(SimPhase::Leave) => {
                            h.last_leave_ok = Some(true);
                            h.kubelet_active = false;
                            if h.leave_disables_kubelet {
                                h.kubelet_enabled = false;
                            }
                        }
                        None => {}
                    }
                }
                Some((exit, cold))
            })
            .flatten();
        let Some((exit, cold)) = exit else {
            self.note(&target.address, format!("{label} cut off by power loss"));
            return Err(TransportError::Channel {
                host: target.host.clone(),
                reason: "connection lost".into(),
            });
        };
        {
            let mut j = self.journal();
            if injected_exit.is_some() {
                j.injected_phase_failures += 1;
            }
            if exit == 0 {
                match phase {
                    Some(SimPhase::Join) if cold => j.joins_cold += 1,
                    Some(SimPhase::Join) => j.joins_warm += 1,
                    Some(SimPhase::Leave) => j.leaves += 1,
                    _ => {}
                }
            }
        }
        if let Some(old) = double_join {
            self.violation(
                "one-claim-per-host",
                format!(
                    "{} joined as {} while its kubelet still ran as {old}",
                    target.host,
                    env.get("KPSSH_NODE_NAME").cloned().unwrap_or_default()
                ),
            );
        }
        let node = env.get("KPSSH_NODE_NAME").cloned().unwrap_or_default();
        if exit == 0 && phase == Some(SimPhase::Join) {
            let mut index = self.joined_as.lock().unwrap_or_else(|p| p.into_inner());
            let addresses = index.entry(super::kubelet::node_name(&env)).or_default();
            if !addresses.contains(&target.address) {
                addresses.push(target.address.clone());
            }
        }
        let what = match phase {
            Some(SimPhase::Join) => format!("{label} as {node} exit={exit}"),
            _ => format!("{label} exit={exit}"),
        };
        self.note(&target.address, what);
        if exit == 0 && phase == Some(SimPhase::Join) {
            self.register_later(&target.address, env);
        }
        let stderr = match (exit, &token) {
            (0, _) => vec![],
            // A script traced with `set -x` echoes its command lines: the controller must
            // redact the token before the text reaches an event or a status (S35).
            (_, Some(t)) => format!("+ kubeadm join --token {t}\n{label} failed").into_bytes(),
            (_, None) => format!("{phase:?} failed").into_bytes(),
        };
        Ok(CommandOutput {
            exit_status: exit,
            stderr,
            ..Default::default()
        })
    }
}
