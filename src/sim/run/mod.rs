//! The simulation runner: a [`Scenario`] and a seed in, a [`Summary`] (and optionally the
//! trace and a timeline for the HTML report) out. It runs the real actor core through
//! [`World`], drives demand with NodeClaims, injects the scenario's faults on a schedule drawn
//! from the seed, and checks the invariants after every step.
//!
//! Call [`run`] on a paused, current-thread tokio runtime, or [`run_blocking`], which builds
//! one.

use std::collections::{BTreeMap, BTreeSet, HashMap};
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
use sha2::{Digest, Sha256};

mod account;
mod checks;
mod claim_index;
mod control_plane;
mod demand;
mod faults;
mod observe;
pub mod safety;

use self::account::percentile;
use self::checks::Checks;
use self::demand::DemandCurve;
use self::faults::arrivals;
use super::host::SimHost;
use super::kubelet::REGISTER_AS_VAR;
use super::mirror::Mirror;
use super::scenario::{NodeIdentity, Scenario};
use super::workload::{self, Workload};
use super::world::{World, host_object, node_class, node_pool, sim_profile};
use crate::api::{HOST_CLASS_LABEL, HostState, NodeClaim, ProviderIdSource, SSHHost};
use crate::k8s::memory::WriteKind;
use crate::k8s::{Cluster, ClusterError, MemoryCluster, WatchEvent, WatchStream};
use crate::karpenter::KarpenterConfig;
use crate::provider::Config;
use crate::ssh::pool::PoolConfig;

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
    let out = without_log_shim(|| rt.block_on(run(scenario, seed, opts)));
    rt.shutdown_background();
    out
}

/// Run `f` with tracing's spans off when nothing listens to them (no subscriber set, as in
/// `kpssh sim`), instead of leaving that to tracing's `log` compatibility, which kube-client
/// turns on: with no dispatcher ever set, it builds every span's fields for the `log` crate
/// (whose own check then drops them), and a fleet day opens millions of spans, each with a
/// formatted host key. A subscriber the caller set is left as it is.
fn without_log_shim<R>(f: impl FnOnce() -> R) -> R {
    use tracing::subscriber::NoSubscriber;
    let listened = tracing::dispatcher::get_default(|d| !d.is::<NoSubscriber>());
    if listened {
        f()
    } else {
        tracing::subscriber::with_default(NoSubscriber::default(), f)
    }
}

/// A host as the runner knows it.
struct HostInfo {
    name: String,
    class: String,
    address: String,
    cpu: u32,
    /// MemTotal, as the probe observes it.
    memory_kib: u64,
    price: f64,
    fingerprint: String,
}
struct Watches {
    hosts: WatchStream<Arc<SSHHost>>,
    claims: WatchStream<Arc<NodeClaim>>,
    nodes: WatchStream<Arc<Node>>,
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
    /// The workload-safety checker's findings (`safety`).
    safety: safety::SafetyLog,
    /// What the simulation deletes itself (exempt from the safety invariants).
    own: safety::OwnDeletions,
    /// Classes cut off from the API by a partition fault, until when.
    partitioned: BTreeMap<String, Duration>,
    /// Nodes whose kubelet is not running as them, since when (node lifecycle).
    kubelet_down: HashMap<String, Duration>,
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
    /// Per class, the most capacity any of its hosts has (what a NodeClaim not launched yet
    /// may come to hold, for `nodepool-limits`).
    largest: BTreeMap<String, BTreeMap<String, i128>>,
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
    let karpenter = KarpenterConfig {
        node_repair: sc.controller.node_repair,
        ..KarpenterConfig::for_actors(&config)
    };
    let world = World::start_with(config, karpenter, seed)
        .await
        .map_err(|e| e.to_string())?;
    world.transport.seed(seed ^ 0x5151_5151);
    world.transport.set_pool(PoolConfig {
        max_connections: sc.controller.max_ssh_connections,
        ..PoolConfig::default()
    });
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
        if c.identity != NodeIdentity::Static {
            nc.spec.provider_id_source = ProviderIdSource::Adopt;
        }
        if c.identity == NodeIdentity::Nodeadm {
            nc.spec.vars = Some(BTreeMap::from([(
                REGISTER_AS_VAR.to_string(),
                "nodeadm".to_string(),
            )]));
        }
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
        np.spec.template.spec.termination_grace_period = p.termination_grace_period.clone();
        np.spec.template.spec.expire_after = p.expire_after.clone();
        cluster.create(&np).await.map_err(e)?;
    }
    for (i, d) in sc.demand.iter().enumerate() {
        if let Some(b) = &d.pdb {
            cluster.create(&workload::pdb(i, b)).await.map_err(e)?;
        }
    }
    let mut infos = vec![];
    for c in &sc.classes {
        for i in 0..c.count {
            let n = infos.len();
            let address = format!("10.{}.{}.{}", 64 + n / 65536, (n / 256) % 256, n % 256);
            let declared_kib = u64::from(c.memory_gib) * 1024 * 1024;
            let mut sim = SimHost::new(&address, c.cpu, declared_kib);
            sim.arch = c.uname_arch().to_string();
            sim.behaviour = Some(c.behaviour());
            sim.leave_disables_kubelet = !rng.random_bool(c.bad_leave_fraction.clamp(0.0, 1.0));
            if c.memory_spread_mib > 0 {
                let short = rng.random_range(0..=u64::from(c.memory_spread_mib)) * 1024;
                sim.memory_kib = declared_kib.saturating_sub(short).max(1024);
            }
            let name = format!("{}-{i:04}", c.name);
            infos.push(HostInfo {
                name: name.clone(),
                class: c.name.clone(),
                address: address.clone(),
                cpu: c.cpu,
                memory_kib: sim.memory_kib,
                price: c.price_per_cpu_hour,
                fingerprint: sim.fingerprint.clone(),
            });
            let mut host = host_object(&world.ns(), &name, &c.name, &sim);
            host.spec
                .capacity
                .insert("memory".into(), Quantity(format!("{declared_kib}Ki")));
            world.transport.add(sim);
            cluster.create(&host).await.map_err(e)?;
        }
    }
    let own = safety::OwnDeletions::default();
    let workload = if sc.demand.iter().any(|d| d.pool.is_some()) {
        Some(Workload::start(&cluster, world.ctx.clock.clone(), own.clone()).await)
    } else {
        None
    };
    let (safety_log, _safety) = safety::spawn(
        &cluster,
        world.ctx.clock.clone(),
        world.transport.clone(),
        own.clone(),
        KarpenterConfig::default().repair_toleration,
    );
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
        nodes: cluster.watch_shared::<Node>(None),
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
    let hosts = infos.len();
    let (mut agenda, mut seq) = faults::schedule(sc, &mut rng, hosts);
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
    let mut largest = BTreeMap::<String, BTreeMap<String, i128>>::new();
    for i in &infos {
        let cap = largest.entry(i.class.clone()).or_default();
        let memory = crate::api::quantity::parse_str(&format!("{}Ki", i.memory_kib));
        for (k, v) in [("cpu", Some(i128::from(i.cpu) * 1000)), ("memory", memory)] {
            let e = cap.entry(k.to_string()).or_insert(0);
            *e = (*e).max(v.unwrap_or(0));
        }
    }
    let mut r = Runner {
        largest,
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
        safety: safety_log,
        own,
        partitioned: BTreeMap::new(),
        kubelet_down: HashMap::new(),
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
        r.node_lifecycle(at).await;
        r.pod_gc(at).await;
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

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    /// Inside a simulation run no span builds its fields when nobody listens (with no
    /// dispatcher set, tracing's `log` compatibility would format each of them).
    #[test]
    fn a_run_builds_no_span_fields_for_a_logger_that_is_not_there() {
        let built = AtomicUsize::new(0);
        let field = || {
            built.fetch_add(1, Ordering::SeqCst);
            "h"
        };
        super::without_log_shim(|| {
            let span = tracing::info_span!("probe", host = %field());
            span.record("outcome", "ok");
        });
        assert_eq!(built.load(Ordering::SeqCst), 0, "a span's field was built");
    }
}
