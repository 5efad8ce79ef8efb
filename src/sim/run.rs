//! The simulation runner: a [`Scenario`] and a seed in, a [`Summary`] (and optionally the
//! trace and a timeline for the HTML report) out. It runs the real actor core through
//! [`World`], drives demand with NodeClaims, injects the scenario's faults on a schedule drawn
//! from the seed, and checks the invariants after every step.
//!
//! Call [`run`] on a paused, current-thread tokio runtime, or [`run_blocking`], which builds
//! one.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::fmt::Write as _;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::{FutureExt, StreamExt};
use k8s_openapi::api::core::v1::{Node, Secret as KubeSecret};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::Serialize;
use serde_json::json;
use sha2::{Digest, Sha256};

use super::host::SimHost;
use super::mirror::Mirror;
use super::scenario::{Demand, Scenario};
use super::workload::{self, Workload};
use super::world::{World, node_claim, node_class, node_pool, sim_profile};
use crate::actors::Config;
use crate::api::{HOST_CLASS_LABEL, HostState, NodeClaim, SSHHost, SSHHostStatus, SSHJoinProfile};
use crate::k8s::memory::WriteKind;
use crate::k8s::{Cluster, ClusterError, MemoryCluster, WatchEvent, WatchStream};

pub const PROFILE: &str = "sim";
const TOKEN_NS: &str = "kube-system";

/// Options that do not change what is simulated (and so not the trace).
#[derive(Debug, Clone, Default)]
pub struct RunOptions {
    /// Keep every trace line in the outcome (the hash is always computed).
    pub keep_trace: bool,
    /// Record per-host state changes and pool samples for the HTML report.
    pub timeline: bool,
    /// Draw a progress bar on stderr.
    pub progress: bool,
    /// Base directory for relative CSV paths in the demand.
    pub base_dir: Option<std::path::PathBuf>,
}

#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Percentiles {
    pub p50: f64,
    pub p95: f64,
    pub p99: f64,
}

#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct Violation {
    pub invariant: String,
    pub at_seconds: u64,
    pub message: String,
}

/// What `kpssh sim --json` prints.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Summary {
    pub scenario: String,
    pub seed: u64,
    pub hosts: usize,
    pub virtual_hours: f64,
    pub wall_seconds: f64,
    pub joins_warm: u64,
    pub joins_cold: u64,
    pub leaves: u64,
    pub zombies_cleaned: u64,
    pub pending_to_running_seconds: Percentiles,
    pub attached_vcpu_hours: f64,
    pub always_attached_vcpu_hours: f64,
    pub cost: f64,
    pub always_attached_cost: f64,
    pub api_writes: u64,
    pub api_writes_per_host_hour: f64,
    pub ssh_sessions_opened: u64,
    pub nodeclaims_created: u64,
    pub launch_failures: u64,
    /// Pods that Karpenter's provisioning left pending because their NodePool was at its
    /// limits (`FailedProvisioning` events): pod demand that met the limits.
    pub provisioning_blocked_by_limits: u64,
    pub faults_injected: BTreeMap<String, u64>,
    pub invariant_violations: Vec<Violation>,
    pub trace_hash: String,
}

impl Summary {
    pub fn faults_total(&self) -> u64 {
        self.faults_injected.values().sum()
    }
}

/// One sample of the pool for the report.
#[derive(Debug, Clone, Serialize)]
pub struct Sample {
    pub t: u64,
    /// Hosts per state, in [`STATES`] order.
    pub counts: Vec<u32>,
    pub cost: f64,
    pub always_attached_cost: f64,
}

pub const STATES: [HostState; 7] = [
    HostState::Pending,
    HostState::Available,
    HostState::Claimed,
    HostState::InUse,
    HostState::Leaving,
    HostState::Unhealthy,
    HostState::Maintenance,
];

/// Host name, class, and its state changes `(seconds, state)`.
pub type HostRow = (String, String, Vec<(u64, String)>);

#[derive(Debug, Clone, Default, Serialize)]
pub struct Timeline {
    /// Host name, class, and its state changes `(seconds, state)`.
    pub hosts: Vec<HostRow>,
    pub samples: Vec<Sample>,
    pub duration: u64,
}

pub struct Outcome {
    pub summary: Summary,
    pub trace: Vec<String>,
    pub timeline: Timeline,
}

/// Run on a fresh paused current-thread runtime (deterministic scheduling, virtual time).
/// Timers only: nothing in a simulation touches a socket, and with an I/O driver every idle
/// moment of the runtime (millions in a fleet day) costs an `epoll_wait` system call before
/// the paused clock may jump ahead.
pub fn run_blocking(scenario: &Scenario, seed: u64, opts: &RunOptions) -> Result<Outcome, String> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .map_err(|e| e.to_string())?;
    let out = rt.block_on(run(scenario, seed, opts));
    rt.shutdown_background();
    out
}

/// A host as the runner knows it.
struct HostInfo {
    name: String,
    class: String,
    address: String,
    cpu: u32,
    price: f64,
    fingerprint: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum FaultKind {
    Reboot,
    PowerLoss,
    SshRefusal,
    HostKeyChange,
    SlowHandshake,
    ControllerCrash,
    ForceDelete,
    ProfileBump,
}

impl FaultKind {
    fn name(self) -> &'static str {
        match self {
            FaultKind::Reboot => "reboot",
            FaultKind::PowerLoss => "power_loss",
            FaultKind::SshRefusal => "ssh_refusal",
            FaultKind::HostKeyChange => "host_key_change",
            FaultKind::SlowHandshake => "slow_handshake",
            FaultKind::ControllerCrash => "controller_crash",
            FaultKind::ForceDelete => "force_delete",
            FaultKind::ProfileBump => "profile_bump",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
enum Agenda {
    /// A fault strikes (host index for host faults).
    Fault(FaultKind, usize),
    /// A host fault ends.
    End(FaultKind, usize),
}

/// Poisson arrivals of `rate_per_hour` over `duration`.
fn arrivals(rng: &mut ChaCha8Rng, rate_per_hour: f64, duration: Duration) -> Vec<Duration> {
    let mut out = vec![];
    if rate_per_hour <= 0.0 {
        return out;
    }
    let mut t = 0.0;
    let end = duration.as_secs_f64();
    loop {
        let u: f64 = rng.random::<f64>().max(f64::MIN_POSITIVE);
        t += -u.ln() * 3600.0 / rate_per_hour;
        if t >= end {
            return out;
        }
        out.push(Duration::from_secs_f64(t));
    }
}

/// The desired node count of one demand entry at `t`.
struct DemandCurve {
    class: String,
    /// Pods for this NodePool rather than NodeClaims of `class`.
    pool: Option<String>,
    cpu: String,
    memory: String,
    steady: u32,
    /// Amplitude, peak hour, period in hours.
    diurnal: Option<(u32, f64, f64)>,
    bursts: Vec<(Duration, Duration, u32)>,
    csv: Option<Vec<(Duration, u32)>>,
}

impl DemandCurve {
    fn new(
        d: &Demand,
        default_class: &str,
        rng: &mut ChaCha8Rng,
        duration: Duration,
        base: Option<&std::path::Path>,
    ) -> Result<DemandCurve, String> {
        let bursts = match &d.bursts {
            Some(b) => arrivals(rng, b.rate_per_hour, duration)
                .into_iter()
                .map(|t| (t, t + b.duration, b.size))
                .collect(),
            None => vec![],
        };
        let csv = match &d.csv {
            Some(path) => {
                let p = match base {
                    Some(b) => b.join(path),
                    None => path.into(),
                };
                let text = std::fs::read_to_string(&p)
                    .map_err(|e| format!("demand csv {}: {e}", p.display()))?;
                Some(parse_csv(&text)?)
            }
            None => d.series.as_ref().map(|rows| {
                rows.iter()
                    .map(|(minute, n)| (Duration::from_secs(u64::from(*minute) * 60), *n))
                    .collect()
            }),
        };
        Ok(DemandCurve {
            class: d.class.clone().unwrap_or_else(|| default_class.to_string()),
            pool: d.pool.clone(),
            cpu: d.cpu.clone(),
            memory: d.memory.clone(),
            steady: d.steady,
            diurnal: d
                .diurnal
                .as_ref()
                .map(|x| (x.amplitude, x.peak_hour, x.period_hours)),
            bursts,
            csv,
        })
    }

    fn at(&self, t: Duration) -> u32 {
        if let Some(rows) = &self.csv {
            return rows
                .iter()
                .take_while(|(at, _)| *at <= t)
                .last()
                .map_or(0, |(_, n)| *n);
        }
        let mut n = f64::from(self.steady);
        if let Some((amp, peak, period)) = self.diurnal {
            let hour = t.as_secs_f64() / 3600.0;
            let phase = 2.0 * std::f64::consts::PI * (hour - peak) / period;
            n += f64::from(amp) * (1.0 + phase.cos()) / 2.0;
        }
        for (from, to, size) in &self.bursts {
            if *from <= t && t < *to {
                n += f64::from(*size);
            }
        }
        n.round() as u32
    }
}

/// `minute,nodes` rows; a header and blank or `#` lines are skipped.
pub fn parse_csv(text: &str) -> Result<Vec<(Duration, u32)>, String> {
    let mut rows = vec![];
    for (i, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let Some((m, n)) = line.split_once(',') else {
            return Err(format!("demand csv line {}: expected minute,nodes", i + 1));
        };
        let (Ok(m), Ok(n)) = (m.trim().parse::<f64>(), n.trim().parse::<u32>()) else {
            if i == 0 {
                continue;
            }
            return Err(format!(
                "demand csv line {}: {line:?} is not minute,nodes",
                i + 1
            ));
        };
        rows.push((Duration::from_secs_f64(m.max(0.0) * 60.0), n));
    }
    rows.sort_by_key(|r| r.0);
    Ok(rows)
}

struct Watches {
    hosts: WatchStream<Arc<SSHHost>>,
    claims: WatchStream<Arc<NodeClaim>>,
    nodes: WatchStream<Node>,
    tokens: WatchStream<KubeSecret>,
}

fn rv_of(m: &kube::api::ObjectMeta) -> u64 {
    m.resource_version
        .as_deref()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0)
}

pub(super) fn name_of(m: &kube::api::ObjectMeta) -> String {
    m.name.clone().unwrap_or_default()
}

/// Every event already queued on a watch. `unconstrained`: tokio's cooperative budget would
/// otherwise report an empty channel after a hundred-odd receives in one task poll, and the
/// mirror would fall further behind the API at every step of a busy run.
fn drain<K: Clone>(s: &mut WatchStream<K>) -> Vec<WatchEvent<K>> {
    let mut out = vec![];
    while let Some(Some(ev)) = tokio::task::unconstrained(s.next()).now_or_never() {
        if let Ok(ev) = ev {
            out.push(ev);
        }
    }
    out
}

fn launched(nc: &NodeClaim) -> Option<&str> {
    nc.status.as_ref().and_then(|s| {
        s.conditions
            .iter()
            .find(|c| c.type_ == "Launched")
            .map(|c| c.status.as_str())
    })
}

/// An API event's trace line, formatted only when written (see `Runner::line_with`).
enum ApiLine {
    Host(Arc<SSHHost>),
    Claim(Arc<NodeClaim>),
    /// A deletion: kind and name.
    Gone(&'static str, String),
    Text(String),
}

impl ApiLine {
    fn write(&self, out: &mut String) {
        let _ = match self {
            ApiLine::Host(h) => {
                let empty = SSHHostStatus::default();
                let s = h.status.as_ref().unwrap_or(&empty);
                write!(
                    out,
                    "A SSHHost {} {} claim={} marker={} token={}",
                    h.metadata.name.as_deref().unwrap_or_default(),
                    s.state,
                    s.claim_ref.as_ref().map_or("-", |c| c.name.as_str()),
                    s.installed_profile.as_deref().unwrap_or("-"),
                    if s.bootstrap_token_id.is_some() {
                        "set"
                    } else {
                        "-"
                    }
                )
            }
            ApiLine::Claim(nc) => write!(
                out,
                "A NodeClaim {} launched={} deleting={} finalizers={}",
                nc.metadata.name.as_deref().unwrap_or_default(),
                launched(nc).unwrap_or("-"),
                nc.metadata.deletion_timestamp.is_some(),
                nc.metadata.finalizers.as_ref().map_or(0, Vec::len)
            ),
            ApiLine::Gone(kind, name) => write!(out, "D {kind} {name}"),
            ApiLine::Text(t) => {
                out.push_str(t);
                Ok(())
            }
        };
    }

    fn text(&self) -> String {
        let mut s = String::new();
        self.write(&mut s);
        s
    }
}

/// Everything the invariants need between steps.
#[derive(Default)]
struct Checks {
    violations: Vec<Violation>,
    reported: BTreeSet<(String, String)>,
    zombie_since: BTreeMap<String, Duration>,
    disturbed: BTreeMap<String, Duration>,
    token_owed: BTreeMap<String, Duration>,
    secrets: HashSet<String>,
}

impl Checks {
    fn violate(&mut self, invariant: &str, key: &str, at: Duration, message: String) {
        if self
            .reported
            .insert((invariant.to_string(), key.to_string()))
        {
            self.violations.push(Violation {
                invariant: invariant.to_string(),
                at_seconds: at.as_secs(),
                message,
            });
        }
    }

    /// A minted token's secret half (and the whole token) must never appear in API text.
    fn scan(&mut self, at: Duration, what: &str, text: &str) {
        if self.secrets.is_empty() {
            return;
        }
        let b = text.as_bytes();
        let ok = |c: &u8| c.is_ascii_lowercase() || c.is_ascii_digit();
        for w in b.windows(16) {
            if w.iter().all(ok)
                && let Ok(s) = std::str::from_utf8(w)
                && self.secrets.contains(s)
            {
                self.violate(
                    "no-secret-in-text",
                    what,
                    at,
                    format!("a bootstrap token secret appears in {what}"),
                );
                return;
            }
        }
    }
}

struct Runner<'a> {
    sc: &'a Scenario,
    opts: &'a RunOptions,
    world: World,
    seed: u64,
    rng: ChaCha8Rng,
    infos: Vec<HostInfo>,
    by_name: HashMap<String, usize>,
    by_addr: HashMap<String, usize>,
    watches: Watches,
    mirror: Mirror,
    /// Whether each host's claim (by `infos` index) is a mirrored NodeClaim
    /// ([`Mirror::claim_live`]): what the zombie check asks of every running kubelet at
    /// every step, refreshed only for the hosts an observed event can change.
    claim_live: Vec<bool>,
    checks: Checks,
    node_deletions: Arc<Mutex<Vec<Violation>>>,
    suspended: Arc<AtomicBool>,
    api_faults: Arc<AtomicU64>,
    hasher: Sha256,
    trace: Vec<String>,
    /// The buffer trace lines are formatted in.
    line_buf: String,
    events_seen: usize,
    faults: BTreeMap<String, u64>,
    fault_active: BTreeMap<usize, Duration>,
    created: BTreeMap<String, Duration>,
    nc_seq: u64,
    nodeclaims_created: u64,
    p2r: Vec<f64>,
    p2r_done: BTreeSet<String>,
    /// Nodes seen and not yet in `p2r_done`: the only ones `account` looks at for it.
    p2r_pending: BTreeSet<String>,
    /// Host (index in `infos`) of each Node, by Node name: what the cost is summed over.
    attached: BTreeMap<String, usize>,
    attached_vcpu_s: f64,
    cost_s: f64,
    timeline: Timeline,
    host_states: BTreeMap<String, HostState>,
    zombies_cleaned: u64,
    launch_failures: u64,
    provisioning_blocked_by_limits: u64,
    profile_version: u64,
    /// The pods of pod demand and their scheduler, if the scenario has pod demand.
    workload: Option<Workload>,
}

impl Runner<'_> {
    fn line(&mut self, t: Duration, text: String) {
        self.line_with(t, |out| out.push_str(&text));
    }

    /// A trace line written by `text` into a reused buffer: a 10,000-host day has millions.
    fn line_with(&mut self, t: Duration, text: impl FnOnce(&mut String)) {
        let mut line = std::mem::take(&mut self.line_buf);
        line.clear();
        let _ = write!(line, "{:>9.3} ", t.as_secs_f64());
        text(&mut line);
        self.hasher.update(line.as_bytes());
        self.hasher.update(b"\n");
        if self.opts.keep_trace {
            self.trace.push(line.clone());
        }
        self.line_buf = line;
    }

    /// Run a write of the simulation itself (demand, fault actions) past the fault injector.
    fn suspend(&self, on: bool) {
        self.suspended.store(on, Ordering::SeqCst);
    }

    fn cluster(&self) -> MemoryCluster {
        self.world.cluster.clone()
    }

    /// Take the watches' news: mirror, trace, per-host state changes, secret scan.
    fn observe(&mut self, now: Duration) {
        let mut items: Vec<(u64, ApiLine)> = vec![];
        let mut texts: Vec<(String, String)> = vec![];
        // Hosts whose claim liveness an event may have changed (`None`: all of them).
        let mut moved: Option<Vec<String>> = Some(vec![]);
        for ev in drain(&mut self.watches.hosts) {
            match ev {
                WatchEvent::Restarted(all) => {
                    self.mirror.reset_hosts(all);
                    moved = None;
                }
                WatchEvent::Applied(h) => {
                    let n = name_of(&h.metadata);
                    items.push((rv_of(&h.metadata), ApiLine::Host(h.clone())));
                    if let Some(e) = h.status.as_ref().and_then(|s| s.last_probe_error.clone()) {
                        texts.push((format!("SSHHost {n} status"), e));
                    }
                    if let Some(moved) = &mut moved {
                        moved.push(n.clone());
                    }
                    self.mirror.put_host(n, h);
                }
                WatchEvent::Deleted(h) => {
                    let n = name_of(&h.metadata);
                    items.push((rv_of(&h.metadata), ApiLine::Gone("SSHHost", n.clone())));
                    self.mirror.remove_host(&n);
                    if let Some(moved) = &mut moved {
                        moved.push(n);
                    }
                }
            }
        }
        for ev in drain(&mut self.watches.claims) {
            match ev {
                WatchEvent::Restarted(all) => {
                    self.mirror.reset_claims(all);
                    moved = None;
                }
                WatchEvent::Applied(c) => {
                    let n = name_of(&c.metadata);
                    if workload::from_pool(&c) && !self.created.contains_key(&n) {
                        // Karpenter's provisioning made it, for pod demand.
                        self.created.insert(n.clone(), now);
                        self.nodeclaims_created += 1;
                    }
                    items.push((rv_of(&c.metadata), ApiLine::Claim(c.clone())));
                    for cond in c.status.iter().flat_map(|s| s.conditions.iter()) {
                        texts.push((format!("NodeClaim {n} condition"), cond.message.clone()));
                    }
                    self.mirror.put_claim(n, c.clone());
                    self.claim_moved(&c, &mut moved);
                }
                WatchEvent::Deleted(c) => {
                    let n = name_of(&c.metadata);
                    items.push((rv_of(&c.metadata), ApiLine::Gone("NodeClaim", n.clone())));
                    self.mirror.remove_claim(&n);
                    self.claim_moved(&c, &mut moved);
                }
            }
        }
        self.refresh_claim_live(moved);
        for ev in drain(&mut self.watches.nodes) {
            match ev {
                WatchEvent::Restarted(all) => {
                    self.mirror.nodes =
                        all.into_iter().map(|c| (name_of(&c.metadata), c)).collect();
                    self.attached.clear();
                    self.p2r_pending.clear();
                    let names: Vec<String> = self.mirror.nodes.keys().cloned().collect();
                    for n in names {
                        self.track_node(&n);
                    }
                }
                WatchEvent::Applied(c) => {
                    let n = name_of(&c.metadata);
                    let deleting = c.metadata.deletion_timestamp.is_some();
                    items.push((
                        rv_of(&c.metadata),
                        ApiLine::Text(format!("A Node {n} deleting={deleting}")),
                    ));
                    self.mirror.nodes.insert(n.clone(), c);
                    self.track_node(&n);
                }
                WatchEvent::Deleted(c) => {
                    let n = name_of(&c.metadata);
                    items.push((rv_of(&c.metadata), ApiLine::Text(format!("D Node {n}"))));
                    self.mirror.nodes.remove(&n);
                    self.track_node(&n);
                }
            }
        }
        for ev in drain(&mut self.watches.tokens) {
            match ev {
                WatchEvent::Restarted(all) => {
                    self.mirror.tokens =
                        all.into_iter().map(|c| (name_of(&c.metadata), c)).collect();
                }
                WatchEvent::Applied(c) => {
                    let n = name_of(&c.metadata);
                    items.push((
                        rv_of(&c.metadata),
                        ApiLine::Text(format!("A Secret {TOKEN_NS}/{n}")),
                    ));
                    if let Some(half) = c.data.as_ref().and_then(|d| d.get("token-secret")) {
                        self.checks
                            .secrets
                            .insert(String::from_utf8_lossy(&half.0).into_owned());
                    }
                    self.mirror.tokens.insert(n, c);
                }
                WatchEvent::Deleted(c) => {
                    let n = name_of(&c.metadata);
                    items.push((
                        rv_of(&c.metadata),
                        ApiLine::Text(format!("D Secret {TOKEN_NS}/{n}")),
                    ));
                    self.mirror.tokens.remove(&n);
                }
            }
        }
        // In resourceVersion order, ties by text (as sorting the formatted lines did).
        items.sort_by(|a, b| a.0.cmp(&b.0).then_with(|| a.1.text().cmp(&b.1.text())));
        for (rv, item) in items {
            self.line_with(now, |out| {
                let _ = write!(out, "api rv={rv} ");
                item.write(out);
            });
        }
        let journal = self.world.transport.drain_journal();
        for t in &journal.tokens_seen {
            if let Some((_, half)) = t.split_once('.') {
                self.checks.secrets.insert(half.to_string());
            }
        }
        for a in &journal.actions {
            let failed = a.what.contains("hung")
                || a.what.contains("cut off")
                || !a.what.ends_with("exit=0");
            if failed && let Some(i) = self.by_addr.get(&a.host) {
                self.checks
                    .disturbed
                    .insert(self.infos[*i].name.clone(), a.at);
            }
        }
        for a in journal.actions {
            let host = self
                .by_addr
                .get(&a.host)
                .map_or(a.host.clone(), |i| self.infos[*i].name.clone());
            self.line(a.at, format!("sim {host} {}", a.what));
        }
        for v in journal.violations {
            self.checks
                .violate(v.invariant, &v.message, v.at, v.message.clone());
        }
        let events = self.world.cluster.events_since(self.events_seen);
        for e in &events {
            match e.reason.as_str() {
                crate::actors::events::ZOMBIE_LEFT => self.zombies_cleaned += 1,
                crate::actors::events::LAUNCH_FAILED => self.launch_failures += 1,
                "FailedProvisioning" if e.message.contains("NodePool limits") => {
                    self.provisioning_blocked_by_limits += 1;
                }
                _ => {}
            }
            texts.push((
                format!("event {} on {}", e.reason, e.regarding),
                e.message.clone(),
            ));
            let line = format!(
                "event {} {} {}: {}",
                e.reason, e.regarding.kind, e.regarding.name, e.message
            );
            self.line(now, line);
        }
        self.events_seen += events.len();
        self.world.cluster.forget_events_before(self.events_seen);
        for (what, text) in texts {
            self.checks.scan(now, &what, &text);
        }
        let deletions: Vec<Violation> = std::mem::take(
            &mut *self
                .node_deletions
                .lock()
                .unwrap_or_else(|p| p.into_inner()),
        );
        for v in deletions {
            let at = Duration::from_secs(v.at_seconds);
            self.checks
                .violate(&v.invariant, &v.message, at, v.message.clone());
        }
        if self.opts.timeline {
            for (name, h) in &self.mirror.hosts {
                let st = h.state();
                if self.host_states.get(name) != Some(&st) {
                    self.host_states.insert(name.clone(), st);
                    if let Some(i) = self.by_name.get(name) {
                        self.timeline.hosts[*i]
                            .2
                            .push((now.as_secs(), st.to_string()));
                    }
                }
            }
        }
    }

    /// A NodeClaim came or went: the hosts whose claim carries its UID may have changed
    /// liveness (hosts are mirrored before claims, so the holders are current).
    fn claim_moved(&self, c: &NodeClaim, moved: &mut Option<Vec<String>>) {
        let (Some(moved), Some(uid)) = (moved.as_mut(), c.metadata.uid.as_deref()) else {
            return;
        };
        if let Some(holders) = self.mirror.host_index.holders.get(uid) {
            moved.extend(holders.iter().cloned());
        }
    }

    /// Recompute [`Runner::claim_live`] for the hosts that moved (all when `None`).
    fn refresh_claim_live(&mut self, moved: Option<Vec<String>>) {
        let names: Vec<String> =
            moved.unwrap_or_else(|| self.infos.iter().map(|i| i.name.clone()).collect());
        for name in names {
            let Some(&i) = self.by_name.get(&name) else {
                continue;
            };
            self.claim_live[i] = self.mirror.host_claim_live(&name);
        }
    }

    /// NodeClaim UIDs held by more than one host, with the hosts.
    fn shared_claims(&self) -> Vec<(String, Vec<String>)> {
        let index = &self.mirror.host_index;
        index
            .shared
            .iter()
            .filter_map(|uid| {
                let hosts = index.holders.get(uid)?;
                Some((uid.clone(), hosts.iter().cloned().collect()))
            })
            .collect()
    }

    /// Create and delete pods so that each entry of pod demand (a Deployment of one pod
    /// shape, for one NodePool) has its desired count.
    async fn drive_pods(&mut self, now: Duration, curves: &[DemandCurve]) {
        let Some(mut w) = self.workload.take() else {
            return;
        };
        let cluster = self.cluster();
        self.suspend(true);
        for (i, curve) in curves.iter().enumerate() {
            let Some(pool) = &curve.pool else { continue };
            let requests = (curve.cpu.as_str(), curve.memory.as_str());
            let group = format!("d{i}");
            let lines = w
                .follow(
                    &cluster,
                    &mut self.rng,
                    (pool, &group),
                    curve.at(now),
                    requests,
                )
                .await;
            for l in lines {
                self.line(now, l);
            }
        }
        self.suspend(false);
        self.workload = Some(w);
    }

    /// Create and delete NodeClaims so that each class has its desired count.
    async fn drive_demand(&mut self, now: Duration, curves: &[DemandCurve]) {
        let mut desired: BTreeMap<&str, (u32, &DemandCurve)> = BTreeMap::new();
        for c in curves.iter().filter(|c| c.pool.is_none()) {
            let e = desired.entry(c.class.as_str()).or_insert((0, c));
            e.0 += c.at(now);
        }
        let census = self.mirror.demand_census();
        let cluster = self.cluster();
        self.suspend(true);
        for (class, (want, curve)) in desired {
            let counts = census.get(class).copied().unwrap_or_default();
            let have = counts.live;
            if want > have {
                let room = counts.free.saturating_sub(counts.unbound);
                for _ in 0..(want - have).min(room) {
                    self.nc_seq += 1;
                    let name = format!("nc-{:06}", self.nc_seq);
                    let nc = node_claim(&name, class, &curve.cpu, &curve.memory);
                    if cluster.create(&nc).await.is_ok() {
                        self.created.insert(name.clone(), now);
                        self.nodeclaims_created += 1;
                        self.line(now, format!("demand {class} create {name}"));
                    }
                }
            } else if want < have {
                // In the mirror's (name) order, as the random picks below index into it.
                let mut names: Vec<String> = self
                    .mirror
                    .claims
                    .values()
                    .filter(|c| c.spec.node_class_ref.name == class)
                    .filter(|c| c.metadata.deletion_timestamp.is_none())
                    .map(|c| name_of(&c.metadata))
                    .collect();
                for _ in 0..(have - want) {
                    if names.is_empty() {
                        break;
                    }
                    let i = self.rng.random_range(0..names.len());
                    let name = names.swap_remove(i);
                    if cluster.delete::<NodeClaim>(None, &name, None).await.is_ok() {
                        self.line(now, format!("demand {class} delete {name}"));
                    }
                }
            }
        }
        self.suspend(false);
    }

    /// Strike or end a fault.
    async fn apply(&mut self, now: Duration, item: &Agenda) -> Option<(Duration, Agenda)> {
        let tr = self.world.transport.clone();
        match item {
            Agenda::Fault(kind, i) if (*kind as u8) <= FaultKind::SlowHandshake as u8 => {
                let info = &self.infos[*i];
                if self.fault_active.get(i).is_some_and(|until| *until > now) {
                    return None;
                }
                let f = &self.sc.faults;
                let (duration, delay) = match kind {
                    FaultKind::Reboot => (f.reboot.as_ref().map(|x| x.duration), None),
                    FaultKind::PowerLoss => (f.power_loss.as_ref().map(|x| x.duration), None),
                    FaultKind::SshRefusal => (f.ssh_refusal.as_ref().map(|x| x.duration), None),
                    FaultKind::HostKeyChange => {
                        (f.host_key_change.as_ref().map(|x| x.duration), None)
                    }
                    _ => (
                        f.slow_handshake.as_ref().map(|x| x.duration),
                        f.slow_handshake.as_ref().map(|x| x.delay),
                    ),
                };
                let duration = duration.unwrap_or(Duration::from_secs(300));
                let address = info.address.clone();
                let name = info.name.clone();
                tr.with(&address, |h| match kind {
                    FaultKind::Reboot | FaultKind::PowerLoss => h.power_off(),
                    FaultKind::SshRefusal => h.reachable = false,
                    FaultKind::HostKeyChange => {
                        h.fingerprint = format!("SHA256:{:0<43}", "rekeyed")
                    }
                    _ => h.handshake_delay = delay.unwrap_or(Duration::from_secs(45)),
                });
                tr.note(&address, format!("fault {} for {duration:?}", kind.name()));
                *self.faults.entry(kind.name().to_string()).or_default() += 1;
                self.fault_active.insert(*i, now + duration);
                self.checks.disturbed.insert(name, now + duration);
                Some((now + duration, Agenda::End(*kind, *i)))
            }
            Agenda::End(kind, i) => {
                let info = &self.infos[*i];
                let (address, fp) = (info.address.clone(), info.fingerprint.clone());
                tr.with(&address, |h| match kind {
                    FaultKind::Reboot | FaultKind::PowerLoss => {
                        h.powered = true;
                        h.reboot();
                    }
                    FaultKind::SshRefusal => h.reachable = true,
                    FaultKind::HostKeyChange => h.fingerprint = fp,
                    _ => h.handshake_delay = Duration::ZERO,
                });
                if matches!(kind, FaultKind::Reboot | FaultKind::PowerLoss) {
                    tr.kubelet_restarted(&address);
                }
                tr.note(&address, format!("fault {} ends", kind.name()));
                None
            }
            Agenda::Fault(FaultKind::ControllerCrash, _) => {
                *self.faults.entry("controller_crash".into()).or_default() += 1;
                self.line(now, "fault controller_crash".into());
                let seed = self.seed.wrapping_add(self.faults["controller_crash"]);
                if let Err(e) = self.world.crash_and_restart(seed).await {
                    self.line(now, format!("controller restart failed: {e}"));
                }
                None
            }
            Agenda::Fault(FaultKind::ForceDelete, _) => {
                let live: Vec<String> = self
                    .mirror
                    .claims
                    .iter()
                    .filter(|(_, c)| c.is_ours())
                    .map(|(n, _)| n.clone())
                    .collect();
                if live.is_empty() {
                    return None;
                }
                let name = live[self.rng.random_range(0..live.len())].clone();
                let cluster = self.cluster();
                self.suspend(true);
                let patch = json!({"metadata": {"finalizers": null}});
                let _ = cluster.patch::<NodeClaim>(None, &name, &patch).await;
                let _ = cluster.delete::<NodeClaim>(None, &name, None).await;
                self.suspend(false);
                *self.faults.entry("force_delete".into()).or_default() += 1;
                self.line(now, format!("fault force_delete {name}"));
                None
            }
            Agenda::Fault(_, _) => {
                let cluster = self.cluster();
                self.suspend(true);
                if let Ok(Some(mut p)) = cluster.get::<SSHJoinProfile>(None, PROFILE).await {
                    self.profile_version += 1;
                    p.spec.version = self.profile_version.to_string();
                    if cluster.replace(&p).await.is_ok() {
                        *self.faults.entry("profile_bump".into()).or_default() += 1;
                        self.line(now, format!("fault profile_bump to {}", p.spec.version));
                    }
                }
                self.suspend(false);
                None
            }
        }
    }

    /// The invariants over the mirror and the sim hosts, after a step.
    fn check(&mut self, now: Duration) {
        let probe = self.sc.probe_interval;
        let slack = self.sc.step;
        // one-claim-per-host: a NodeClaim holds at most one host.
        for (uid, hosts) in self.shared_claims() {
            self.checks.violate(
                "one-claim-per-host",
                &uid,
                now,
                format!("NodeClaim uid {uid} holds hosts {}", hosts.join(", ")),
            );
        }
        // zombie-lifetime: a kubelet on a host nobody holds is gone within 2 probe intervals.
        // Only hosts with a kubelet running on a clean link can be zombies; the others just
        // end any zombie episode they had.
        let infos = &self.infos;
        // The transport numbers hosts in the order they were added, which is `infos` order
        // (the address comparison keeps that honest without a lookup per host).
        let running: Vec<usize> = self.world.transport.filter_map_kubelet_running(|i, h| {
            let clean = h.reachable && h.handshake_delay.is_zero() && !h.leave_in_flight;
            let info = infos.get(i).filter(|info| info.address == h.address)?;
            (clean && h.fingerprint == info.fingerprint).then_some(i)
        });
        if !self.checks.zombie_since.is_empty() {
            let running_names: HashSet<&str> = running
                .iter()
                .map(|i| self.infos[*i].name.as_str())
                .collect();
            self.checks
                .zombie_since
                .retain(|name, _| running_names.contains(name.as_str()));
        }
        for i in running {
            let name = &self.infos[i].name;
            debug_assert_eq!(
                self.claim_live[i],
                self.mirror.host_claim_live(name),
                "claim liveness of {name} is stale"
            );
            if self.claim_live[i] {
                self.checks.zombie_since.remove(name);
                continue;
            }
            let since = *self.checks.zombie_since.entry(name.clone()).or_insert(now);
            let from = self
                .checks
                .disturbed
                .get(name)
                .map_or(since, |d| (*d).max(since));
            if now.saturating_sub(from) > 2 * probe + slack {
                let h = self.mirror.hosts.get(name);
                self.checks.violate(
                    "zombie-lifetime",
                    &format!("{name}@{}", since.as_secs()),
                    now,
                    format!(
                        "{name}: kubelet running unclaimed since {}s (state {}), more than 2 probe intervals",
                        from.as_secs(),
                        h.map_or("gone".to_string(), |h| h.state().to_string())
                    ),
                );
            }
        }
        // token-lifetime: deleted within a probe interval of registration, failure, release
        // or stale claim.
        let tokens: Vec<String> = self.mirror.tokens.keys().cloned().collect();
        let mut owed_now = BTreeSet::new();
        for t in tokens {
            let Some(id) = t.strip_prefix("bootstrap-token-") else {
                continue;
            };
            // Of several hosts recording one ID, the last by name (as a map built in name
            // order would keep).
            let holder = (self.mirror.host_index.token_holders.get(id))
                .and_then(|names| names.last())
                .and_then(|n| self.mirror.hosts.get(n));
            let owed = match holder {
                None => Some("no host records it"),
                Some(h) => match h.claim() {
                    None => Some("its host holds no claim"),
                    Some(c) if self.mirror.nodes.contains_key(&c.name) => {
                        Some("its node registered")
                    }
                    Some(c) if !self.mirror.claims.contains_key(&c.name) => {
                        Some("its NodeClaim is gone")
                    }
                    Some(_) => None,
                },
            };
            let Some(why) = owed else {
                continue;
            };
            owed_now.insert(t.clone());
            let since = *self.checks.token_owed.entry(t.clone()).or_insert(now);
            if now.saturating_sub(since) > probe + slack {
                self.checks.violate(
                    "token-lifetime",
                    &t,
                    now,
                    format!(
                        "{TOKEN_NS}/{t} still exists {}s after it was due ({why})",
                        now.saturating_sub(since).as_secs()
                    ),
                );
            }
        }
        self.checks.token_owed.retain(|t, _| owed_now.contains(t));
        // claim-launched-in-time.
        let limit = Config::default().registration_timeout + slack;
        for (name, nc) in &self.mirror.claims {
            // Launched=False is a decision (the launch failed); the NodeClaim's deletion is
            // the karpenter layer's registration timeout if the controller's own fails.
            if nc.metadata.deletion_timestamp.is_some() || launched(nc).is_some() {
                continue;
            }
            let Some(at) = self.created.get(name) else {
                continue;
            };
            if now.saturating_sub(*at) > limit {
                let msg = format!(
                    "NodeClaim {name} created at {}s is not launched after {}s",
                    at.as_secs(),
                    now.saturating_sub(*at).as_secs()
                );
                self.checks
                    .violate("claim-launched-in-time", name, now, msg);
            }
        }
        for (pool, msg) in workload::limit_breaches(self.sc, &self.mirror.claims) {
            self.checks.violate("nodepool-limits", &pool, now, msg);
        }
    }

    /// Billing, latency samples and the report's pool sample.
    /// Keep the Node's entries in `attached` (the host it runs on) and `p2r_pending` as the
    /// mirror now has it (or no longer has it).
    fn track_node(&mut self, name: &str) {
        let Some(node) = self.mirror.nodes.get(name) else {
            self.attached.remove(name);
            self.p2r_pending.remove(name);
            return;
        };
        let by_provider = node
            .spec
            .as_ref()
            .and_then(|s| s.provider_id.as_deref())
            .and_then(|p| p.rsplit_once('/'))
            .and_then(|(_, h)| self.by_name.get(h));
        let by_ip = || {
            node.status
                .as_ref()
                .and_then(|s| s.addresses.as_ref())
                .and_then(|a| a.first())
                .and_then(|a| self.by_addr.get(&a.address))
        };
        match by_provider.or_else(by_ip).copied() {
            Some(i) => self.attached.insert(name.to_string(), i),
            None => self.attached.remove(name),
        };
        if !self.p2r_done.contains(name) {
            self.p2r_pending.insert(name.to_string());
        }
    }

    fn account(&mut self, now: Duration, dt: Duration) {
        let mut vcpu = 0.0;
        let mut cost = 0.0;
        // In Node name order, as the sums always were.
        for i in self.attached.values() {
            let info = &self.infos[*i];
            vcpu += f64::from(info.cpu);
            cost += f64::from(info.cpu) * info.price;
        }
        let mut done = vec![];
        for name in &self.p2r_pending {
            if let Some(nc) = self.mirror.claims.get(name)
                && let Some(node) = self.mirror.nodes.get(name)
                && let (Some(a), Some(b)) = (
                    nc.metadata.creation_timestamp.as_ref(),
                    node.metadata.creation_timestamp.as_ref(),
                )
            {
                done.push(name.clone());
                let secs = b.0.duration_since(a.0).as_secs_f64();
                self.p2r.push(secs.max(0.0));
            }
        }
        for name in done {
            self.p2r_pending.remove(&name);
            self.p2r_done.insert(name);
        }
        self.attached_vcpu_s += vcpu * dt.as_secs_f64();
        self.cost_s += cost * dt.as_secs_f64();
        if self.opts.timeline {
            let mut counts = vec![0u32; STATES.len()];
            for h in self.mirror.hosts.values() {
                if let Some(i) = STATES.iter().position(|s| *s == h.state()) {
                    counts[i] += 1;
                }
            }
            let always: f64 = self.infos.iter().map(|i| f64::from(i.cpu) * i.price).sum();
            self.timeline.samples.push(Sample {
                t: now.as_secs(),
                counts,
                cost: self.cost_s / 3600.0,
                always_attached_cost: always * now.as_secs_f64() / 3600.0,
            });
        }
    }
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

/// Run `scenario` with `seed` (the scenario's own seed is ignored here).
pub async fn run(scenario: &Scenario, seed: u64, opts: &RunOptions) -> Result<Outcome, String> {
    scenario.validate()?;
    let wall = std::time::Instant::now();
    let sc = scenario;
    let config = Config {
        probe_interval: sc.probe_interval,
        max_concurrent_phases: sc.controller.max_concurrent_phases,
        max_concurrent_probes: sc.controller.max_concurrent_probes,
        ssh_dials_per_second: sc.controller.ssh_dials_per_second,
        ..Config::default()
    };
    let world = World::start(config, seed)
        .await
        .map_err(|e| e.to_string())?;
    world.transport.seed(seed ^ 0x5151_5151);
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let cluster = world.cluster.clone();
    let e = |e: ClusterError| e.to_string();
    cluster
        .create(&sim_profile(PROFILE, "1"))
        .await
        .map_err(e)?;
    for c in &sc.classes {
        let mut nc = node_class(&c.name, PROFILE);
        nc.spec.host_selector = Some(LabelSelector {
            match_labels: Some(BTreeMap::from([(
                HOST_CLASS_LABEL.to_string(),
                c.name.clone(),
            )])),
            ..Default::default()
        });
        nc.spec.price_per_cpu_hour = format!("{}", c.price_per_cpu_hour);
        cluster.create(&nc).await.map_err(e)?;
    }
    for p in &sc.node_pools {
        let mut np = node_pool(&p.name, &p.class);
        np.spec.limits = p
            .limits
            .iter()
            .map(|(k, v)| (k.clone(), Quantity(v.clone())))
            .collect();
        np.spec.disruption.consolidate_after = Some(p.consolidate_after.clone());
        cluster.create(&np).await.map_err(e)?;
    }
    let mut infos = vec![];
    for c in &sc.classes {
        for i in 0..c.count {
            let n = infos.len();
            let address = format!("10.{}.{}.{}", 64 + n / 65536, (n / 256) % 256, n % 256);
            let mut sim = SimHost::new(&address, c.cpu, u64::from(c.memory_gib) * 1024 * 1024);
            sim.arch = c.uname_arch().to_string();
            sim.behaviour = Some(c.behaviour());
            sim.leave_disables_kubelet = !rng.random_bool(c.bad_leave_fraction.clamp(0.0, 1.0));
            let name = format!("{}-{i:04}", c.name);
            infos.push(HostInfo {
                name: name.clone(),
                class: c.name.clone(),
                address: address.clone(),
                cpu: c.cpu,
                price: c.price_per_cpu_hour,
                fingerprint: sim.fingerprint.clone(),
            });
            world.add_host(&name, &c.name, sim).await.map_err(e)?;
        }
    }
    let workload = if sc.demand.iter().any(|d| d.pool.is_some()) {
        Some(Workload::start(&cluster, world.ctx.clock.clone()).await)
    } else {
        None
    };
    // API faults, drawn from their own stream so they do not shift the others.
    let suspended = Arc::new(AtomicBool::new(false));
    let api_faults = Arc::new(AtomicU64::new(0));
    if sc.faults.api_conflict > 0.0 || sc.faults.api_transient > 0.0 {
        let frng = Arc::new(Mutex::new(ChaCha8Rng::seed_from_u64(seed ^ 0xA91)));
        let (pc, pt) = (sc.faults.api_conflict, sc.faults.api_transient);
        let (s, n) = (suspended.clone(), api_faults.clone());
        cluster.set_fault_injector(Some(Arc::new(
            move |_w: WriteKind, kind: &str, key: &str| {
                if s.load(Ordering::SeqCst) {
                    return None;
                }
                let mut r = frng.lock().unwrap_or_else(|p| p.into_inner());
                let x: f64 = r.random();
                if x < pc {
                    n.fetch_add(1, Ordering::SeqCst);
                    return Some(ClusterError::Conflict {
                        kind: kind.into(),
                        key: key.into(),
                    });
                }
                if x < pc + pt {
                    n.fetch_add(1, Ordering::SeqCst);
                    return Some(ClusterError::Transient {
                        kind: kind.into(),
                        key: key.into(),
                        message: "injected: etcdserver: request timed out".into(),
                    });
                }
                None
            },
        )));
    }
    // node-deleted-after-kubelet-stopped: judged the moment the Node goes.
    let node_deletions = Arc::new(Mutex::new(Vec::new()));
    {
        let mut stream = cluster.watch::<Node>(None);
        let tr = world.transport.clone();
        let out = node_deletions.clone();
        tokio::spawn(async move {
            while let Some(ev) = stream.next().await {
                if let Ok(WatchEvent::Deleted(n)) = ev {
                    let name = name_of(&n.metadata);
                    if let Some((addr, leave_failed)) = tr.kubelet_host(&name) {
                        let why = if leave_failed {
                            " after a failed leave"
                        } else {
                            ""
                        };
                        let at = tr.elapsed().as_secs();
                        out.lock()
                            .unwrap_or_else(|p| p.into_inner())
                            .push(Violation {
                                invariant: "node-deleted-after-kubelet-stopped".into(),
                                at_seconds: at,
                                message: format!(
                                    "Node {name} deleted while the kubelet on {addr} still runs{why}"
                                ),
                            });
                    }
                }
            }
        });
    }
    let ns = world.ns();
    let watches = Watches {
        hosts: cluster.watch_shared::<SSHHost>(Some(&ns)),
        claims: cluster.watch_shared::<NodeClaim>(None),
        nodes: cluster.watch::<Node>(None),
        tokens: cluster.watch::<KubeSecret>(Some(TOKEN_NS)),
    };
    // The schedule: demand curves and faults, all drawn from the seed up front.
    let default_class = sc.classes[0].name.clone();
    let mut curves = vec![];
    for d in &sc.demand {
        curves.push(DemandCurve::new(
            d,
            &default_class,
            &mut rng,
            sc.duration,
            opts.base_dir.as_deref(),
        )?);
    }
    let mut agenda: BTreeMap<(Duration, u64), Agenda> = BTreeMap::new();
    let mut seq = 0u64;
    let hosts = infos.len();
    let f = &sc.faults;
    let host_faults = [
        (
            FaultKind::Reboot,
            f.reboot.as_ref().map(|x| x.rate_per_host_hour),
        ),
        (
            FaultKind::PowerLoss,
            f.power_loss.as_ref().map(|x| x.rate_per_host_hour),
        ),
        (
            FaultKind::SshRefusal,
            f.ssh_refusal.as_ref().map(|x| x.rate_per_host_hour),
        ),
        (
            FaultKind::HostKeyChange,
            f.host_key_change.as_ref().map(|x| x.rate_per_host_hour),
        ),
        (
            FaultKind::SlowHandshake,
            f.slow_handshake.as_ref().map(|x| x.rate_per_host_hour),
        ),
    ];
    for (kind, rate) in host_faults {
        let Some(rate) = rate else { continue };
        for t in arrivals(&mut rng, rate * hosts as f64, sc.duration) {
            let h = rng.random_range(0..hosts.max(1));
            seq += 1;
            agenda.insert((t, seq), Agenda::Fault(kind, h));
        }
    }
    let fleet_faults = [
        (FaultKind::ControllerCrash, f.controller_crash.as_ref()),
        (FaultKind::ForceDelete, f.force_delete.as_ref()),
        (FaultKind::ProfileBump, f.profile_bump.as_ref()),
    ];
    for (kind, rate) in fleet_faults {
        let Some(rate) = rate else { continue };
        for t in arrivals(&mut rng, rate.rate_per_hour, sc.duration) {
            seq += 1;
            agenda.insert((t, seq), Agenda::Fault(kind, 0));
        }
    }
    let timeline = Timeline {
        hosts: infos
            .iter()
            .map(|i| (i.name.clone(), i.class.clone(), vec![]))
            .collect(),
        samples: vec![],
        duration: sc.duration.as_secs(),
    };
    let by_name = infos
        .iter()
        .enumerate()
        .map(|(i, h)| (h.name.clone(), i))
        .collect();
    let by_addr = infos
        .iter()
        .enumerate()
        .map(|(i, h)| (h.address.clone(), i))
        .collect();
    let mut r = Runner {
        sc,
        opts,
        world,
        seed,
        rng,
        infos,
        by_name,
        by_addr,
        watches,
        mirror: Mirror::default(),
        claim_live: vec![false; hosts],
        checks: Checks::default(),
        node_deletions,
        suspended,
        api_faults,
        hasher: Sha256::new(),
        trace: vec![],
        line_buf: String::new(),
        events_seen: 0,
        faults: BTreeMap::new(),
        fault_active: BTreeMap::new(),
        created: BTreeMap::new(),
        nc_seq: 0,
        nodeclaims_created: 0,
        p2r: vec![],
        p2r_done: BTreeSet::new(),
        p2r_pending: BTreeSet::new(),
        attached: BTreeMap::new(),
        attached_vcpu_s: 0.0,
        cost_s: 0.0,
        timeline,
        host_states: BTreeMap::new(),
        zombies_cleaned: 0,
        launch_failures: 0,
        provisioning_blocked_by_limits: 0,
        profile_version: 1,
        workload,
    };
    let origin = tokio::time::Instant::now();
    let mut next_step = Duration::ZERO;
    let mut last_progress = 0;
    loop {
        let next_fault = agenda.keys().next().map(|k| k.0);
        let at = match next_fault {
            Some(t) if t < next_step => t,
            _ => next_step,
        };
        if at > sc.duration {
            break;
        }
        tokio::time::sleep_until(origin + at).await;
        if next_fault == Some(at) && at < next_step {
            let Some((_, item)) = agenda.pop_first() else {
                continue;
            };
            r.observe(at);
            if let Some((end, follow)) = r.apply(at, &item).await {
                seq += 1;
                agenda.insert((end, seq), follow);
            }
            continue;
        }
        r.observe(at);
        r.check(at);
        r.account(at, sc.step);
        r.drive_demand(at, &curves).await;
        r.drive_pods(at, &curves).await;
        if opts.progress {
            let pct = (at.as_secs_f64() / sc.duration.as_secs_f64() * 100.0) as u32;
            if pct != last_progress {
                last_progress = pct;
                let bar = (pct / 4) as usize;
                eprint!(
                    "\r[{}{}] {pct:>3}% {:>6.1}h virtual, {:>5.1}s wall",
                    "#".repeat(bar),
                    " ".repeat(25 - bar.min(25)),
                    at.as_secs_f64() / 3600.0,
                    wall.elapsed().as_secs_f64()
                );
            }
        }
        next_step += sc.step;
    }
    if opts.progress {
        eprintln!();
    }
    r.observe(sc.duration);
    r.check(sc.duration);
    let journal = r.world.transport.drain_journal();
    let stats = r.world.cluster.stats();
    let sessions: u64 = r.world.transport.each(|h| h.sessions).iter().sum();
    let api_writes =
        stats.creates + stats.replaces + stats.status_writes + stats.patches + stats.deletes;
    let hours = sc.duration.as_secs_f64() / 3600.0;
    let mut p2r = std::mem::take(&mut r.p2r);
    p2r.sort_by(f64::total_cmp);
    let mut faults = std::mem::take(&mut r.faults);
    let api = r.api_faults.load(Ordering::SeqCst);
    if api > 0 {
        faults.insert("api_write_errors".into(), api);
    }
    if journal.injected_phase_failures > 0 {
        faults.insert("phase_failures".into(), journal.injected_phase_failures);
    }
    if journal.injected_hangs > 0 {
        faults.insert("phase_hangs".into(), journal.injected_hangs);
    }
    let always_vcpu: f64 = r.infos.iter().map(|i| f64::from(i.cpu)).sum::<f64>() * hours;
    let always_cost: f64 = r
        .infos
        .iter()
        .map(|i| f64::from(i.cpu) * i.price)
        .sum::<f64>()
        * hours;
    let hash = format!("{:x}", r.hasher.clone().finalize());
    let round = |x: f64| (x * 1000.0).round() / 1000.0;
    let summary = Summary {
        scenario: sc.name.clone(),
        seed,
        hosts,
        virtual_hours: round(hours),
        wall_seconds: round(wall.elapsed().as_secs_f64()),
        joins_warm: journal.joins_warm,
        joins_cold: journal.joins_cold,
        leaves: journal.leaves,
        zombies_cleaned: r.zombies_cleaned,
        pending_to_running_seconds: Percentiles {
            p50: percentile(&p2r, 50.0),
            p95: percentile(&p2r, 95.0),
            p99: percentile(&p2r, 99.0),
        },
        attached_vcpu_hours: round(r.attached_vcpu_s / 3600.0),
        always_attached_vcpu_hours: round(always_vcpu),
        cost: round(r.cost_s / 3600.0),
        always_attached_cost: round(always_cost),
        api_writes,
        api_writes_per_host_hour: round(api_writes as f64 / (hosts.max(1) as f64 * hours)),
        ssh_sessions_opened: sessions,
        nodeclaims_created: r.nodeclaims_created,
        launch_failures: r.launch_failures,
        provisioning_blocked_by_limits: r.provisioning_blocked_by_limits,
        faults_injected: faults,
        invariant_violations: r.checks.violations.clone(),
        trace_hash: hash,
    };
    let trace = std::mem::take(&mut r.trace);
    let timeline = std::mem::take(&mut r.timeline);
    r.world.stop().await;
    Ok(Outcome {
        summary,
        trace,
        timeline,
    })
}
