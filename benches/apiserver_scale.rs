//! Issue #26 item 1: the controller at fleet scale against the real kube-apiserver + etcd.
//!
//! The real controller as `kpssh controller` wires it (leader election on a Lease, the actor
//! core and router of `spawn_controller`, the karpenter layer of `karpenter::spawn_with`, all
//! on `KubeCluster`) with simulated hosts (`SimTransport`) instead of `RusshTransport`. Each
//! controller is a child process (this binary re-executed with `KPSSH_SCALE_CHILD` set), so
//! that its RSS and CPU are its own and a leader failover is a real SIGKILL.
//!
//! One run: N SSHHosts, N Nodes in all (the joined claims' Nodes plus plain ones) and M
//! steady NodeClaims; figures are cold start to every host probed, steady RSS/CPU of the
//! leader over a window, API requests per host-hour by verb and resource (the API server's own
//! `apiserver_request_total`, the window's delta less an idle baseline), watch (re)starts,
//! and the time from SIGKILL of the leader to the first probe of the standby.
//!
//! `cargo bench --bench apiserver_scale`; sizes by env: `KPSSH_BENCH_HOSTS` (10000),
//! `KPSSH_BENCH_CLAIMS` (N/10), `KPSSH_BENCH_WINDOW_SECS` (240), `KPSSH_BENCH_SETTLE_SECS`
//! (60), `KPSSH_BENCH_BASELINE_SECS` (30), `KPSSH_PROBE_INTERVAL_SECS` (120, the CLI default),
//! `KPSSH_SSH_DIALS_PER_SECOND` (50, the CLI default). Not a smoke test: under `cargo test`
//! it only says how to run it (it needs the control plane and minutes).

#[path = "../tests/support/controlplane.rs"]
mod controlplane;
#[path = "support/report.rs"]
mod report;

#[path = "apiserver_scale/child.rs"]
mod child;
#[path = "apiserver_scale/measure.rs"]
mod measure;

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::{
    Namespace, Node, NodeAddress, NodeCondition, NodeSpec, NodeStatus, Secret,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use kube::api::ObjectMeta;
use serde_json::json;
use tokio::sync::mpsc;

// Every kpssh path this bench uses, in one place (module paths may move).
use kpssh::api::{NodeClaim, crds};
use kpssh::k8s::{Cluster, ClusterError, KubeCluster};
use kpssh::sim::world::{KEY_SECRET, node_claim, node_class, sim_profile};

use measure::{ApiCounts, ProcSample};
use report::{Mode, Target, secs};

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

pub const NS: &str = "kpssh-scale";
pub const CLASS: &str = "pool";
const CREATE_PARALLELISM: usize = 32;
const LIMIT: Duration = Duration::from_secs(1800);

fn env_u64(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(default)
}

/// The address of simulated host `i` (the same in every process).
pub fn host_address(i: usize) -> String {
    format!("10.{}.{}.{}", 100 + i / 65536, (i / 256) % 256, i % 256)
}

fn main() {
    if let Ok(identity) = std::env::var(child::CHILD_ENV) {
        child::main(&identity);
        return;
    }
    let mode = Mode::detect();
    if mode == Mode::Smoke {
        println!(
            "apiserver_scale: not run under `cargo test` (needs the control plane and minutes); \
             `cargo bench --bench apiserver_scale`"
        );
        return;
    }
    let n = env_u64("KPSSH_BENCH_HOSTS", 10_000) as usize;
    let m = env_u64("KPSSH_BENCH_CLAIMS", (n / 10) as u64) as usize;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("tokio runtime");
    rt.block_on(run(n, m));
}

/// A line from a child: `EVENT <name> <unix ms> <value>`.
#[derive(Debug, Clone)]
struct Event {
    who: &'static str,
    name: String,
    at_ms: u128,
    value: u64,
}

struct Children {
    rx: mpsc::UnboundedReceiver<Event>,
    tx: mpsc::UnboundedSender<Event>,
    seen: Vec<Event>,
}

impl Children {
    fn spawn(
        &self,
        who: &'static str,
        kubeconfig: &std::path::Path,
        n: usize,
        log: &std::path::Path,
    ) -> Child {
        let exe = std::env::current_exe().expect("current exe");
        let mut cmd = Command::new(exe);
        cmd.arg("--bench")
            .env(child::CHILD_ENV, who)
            .env("KUBECONFIG", kubeconfig)
            .env("KPSSH_BENCH_HOSTS", n.to_string())
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::from(std::fs::File::create(log).expect("child log")));
        // SAFETY: prctl is async-signal-safe; the child dies with this process.
        unsafe {
            use std::os::unix::process::CommandExt;
            cmd.pre_exec(|| {
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
                Ok(())
            });
        }
        let mut c = cmd.spawn().expect("spawn controller child");
        let out = c.stdout.take().expect("child stdout");
        let tx = self.tx.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(out).lines().map_while(Result::ok) {
                let f: Vec<&str> = line.split_whitespace().collect();
                if let ["EVENT", name, at, value] = f[..] {
                    let _ = tx.send(Event {
                        who,
                        name: name.to_string(),
                        at_ms: at.parse().unwrap_or(0),
                        value: value.parse().unwrap_or(0),
                    });
                }
            }
        });
        c
    }

    fn drain(&mut self) {
        while let Ok(e) = self.rx.try_recv() {
            self.seen.push(e);
        }
    }

    fn latest(&mut self, who: &str, name: &str) -> Option<Event> {
        self.drain();
        self.seen
            .iter()
            .rev()
            .find(|e| e.who == who && e.name == name)
            .cloned()
    }

    async fn wait(&mut self, who: &str, name: &str, limit: Duration) -> Event {
        let deadline = tokio::time::Instant::now() + limit;
        loop {
            if let Some(e) = self.seen.iter().find(|e| e.who == who && e.name == name) {
                return e.clone();
            }
            match tokio::time::timeout_at(deadline, self.rx.recv()).await {
                Ok(Some(e)) => self.seen.push(e),
                Ok(None) => panic!("children gone before {who} {name}"),
                Err(_) => panic!("{who}: no {name} within {limit:?}"),
            }
        }
    }
}

pub fn now_ms() -> u128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis())
        .unwrap_or(0)
}

fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .unwrap_or_default()
        .split_whitespace()
        .take(3)
        .collect::<Vec<_>>()
        .join(" ")
}

async fn create<K: kpssh::k8s::Object>(c: &KubeCluster, obj: &K) {
    match c.create(obj).await {
        Ok(_) | Err(ClusterError::AlreadyExists { .. }) => {}
        Err(e) => panic!("create: {e}"),
    }
}

fn other_node(i: usize) -> Node {
    Node {
        metadata: ObjectMeta {
            name: Some(format!("other-{i:05}")),
            labels: Some(BTreeMap::from([(
                "kubernetes.io/hostname".to_string(),
                format!("other-{i:05}"),
            )])),
            ..Default::default()
        },
        spec: Some(NodeSpec::default()),
        status: Some(NodeStatus {
            addresses: Some(vec![NodeAddress {
                type_: "InternalIP".into(),
                address: format!("10.{}.{}.{}", 200 + i / 65536, (i / 256) % 256, i % 256),
            }]),
            capacity: Some(node_resources()),
            allocatable: Some(node_resources()),
            conditions: Some(vec![NodeCondition {
                type_: "Ready".into(),
                status: "True".into(),
                reason: Some("KubeletReady".into()),
                ..Default::default()
            }]),
            ..Default::default()
        }),
    }
}

pub fn node_resources() -> BTreeMap<String, Quantity> {
    BTreeMap::from([
        ("cpu".to_string(), Quantity("2".into())),
        ("memory".to_string(), Quantity("4000000Ki".into())),
        ("pods".to_string(), Quantity("110".into())),
    ])
}

fn initialized(nc: &NodeClaim) -> bool {
    nc.status.as_ref().is_some_and(|s| {
        s.conditions
            .iter()
            .any(|c| c.type_ == "Initialized" && c.status == "True")
    })
}

async fn run(n: usize, m: usize) {
    let load_start = loadavg();
    println!("apiserver_scale: {n} hosts, {m} steady NodeClaims, load {load_start}");
    let cp = controlplane::ControlPlane::start();
    let yaml = format!(
        "{}{}",
        crds::to_yaml(&crds::kpssh_crds()).expect("yaml"),
        crds::to_yaml(&crds::karpenter_crds()).expect("yaml")
    );
    cp.install_crds(&yaml).await;
    let client = cp.client().await;
    let cluster = KubeCluster::new(client.clone());
    create(
        &cluster,
        &Namespace {
            metadata: ObjectMeta {
                name: Some(NS.into()),
                ..Default::default()
            },
            ..Default::default()
        },
    )
    .await;
    create(
        &cluster,
        &Secret {
            metadata: ObjectMeta {
                name: Some(KEY_SECRET.into()),
                namespace: Some(NS.into()),
                ..Default::default()
            },
            data: Some(BTreeMap::from([(
                "privateKey".to_string(),
                ByteString(b"simulated".to_vec()),
            )])),
            ..Default::default()
        },
    )
    .await;
    create(&cluster, &sim_profile("p", "1")).await;
    create(&cluster, &node_class(CLASS, "p")).await;

    let t = Instant::now();
    let hosts: Vec<_> = (0..n).map(|i| child::host(i).1).collect();
    futures::stream::StreamExt::for_each_concurrent(
        futures::stream::iter(&hosts),
        CREATE_PARALLELISM,
        |h| create(&cluster, h),
    )
    .await;
    drop(hosts);
    let others: Vec<usize> = (0..n.saturating_sub(m)).collect();
    futures::stream::StreamExt::for_each_concurrent(
        futures::stream::iter(others),
        CREATE_PARALLELISM,
        |i| {
            let cluster = &cluster;
            async move { create(cluster, &other_node(i)).await }
        },
    )
    .await;
    println!(
        "created {n} SSHHosts and {} other Nodes in {:.1}s",
        n.saturating_sub(m),
        t.elapsed().as_secs_f64()
    );

    // The API server's own requests (its leases, controllers) with nothing else running.
    let apiserver_pid = pid_of(&cp, "kube-apiserver");
    let etcd_pid = pid_of(&cp, "etcd");
    let baseline_secs = env_u64("KPSSH_BENCH_BASELINE_SECS", 30);
    let b0 = ApiCounts::scrape(&client).await;
    tokio::time::sleep(Duration::from_secs(baseline_secs)).await;
    let b1 = ApiCounts::scrape(&client).await;
    let baseline = b1.minus(&b0);

    // Cold start: leader A from process start to every host probed; B stands by.
    let (tx, rx) = mpsc::unbounded_channel();
    let mut kids = Children {
        rx,
        tx,
        seen: vec![],
    };
    let dir = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target/bench");
    std::fs::create_dir_all(&dir).expect("target/bench");
    let load_cold = loadavg();
    let spawned_a = now_ms();
    let mut a = kids.spawn(
        "a",
        cp.kubeconfig_path(),
        n,
        &dir.join("apiserver_scale-a.log"),
    );
    let a_leader = kids.wait("a", "leader", LIMIT).await;
    let a_started = kids.wait("a", "started", LIMIT).await;
    let a_first = kids.wait("a", "first-probe", LIMIT).await;
    let a_all = kids.wait("a", "all-probed", LIMIT).await;
    let cold = Duration::from_millis((a_all.at_ms - spawned_a) as u64);
    println!(
        "cold start: leader +{:.1}s, started +{:.1}s, first probe +{:.1}s, all {n} probed +{:.1}s (load {load_cold})",
        (a_leader.at_ms - spawned_a) as f64 / 1000.0,
        (a_started.at_ms - spawned_a) as f64 / 1000.0,
        (a_first.at_ms - spawned_a) as f64 / 1000.0,
        cold.as_secs_f64()
    );
    let a_pid = a.id();
    let cold_rss = ProcSample::read(a_pid).rss_kib;
    let mut b = kids.spawn(
        "b",
        cp.kubeconfig_path(),
        n,
        &dir.join("apiserver_scale-b.log"),
    );
    kids.wait("b", "standby", LIMIT).await;

    // The steady NodeClaims: claimed, launched, their Nodes registered and initialized.
    let t = Instant::now();
    let names: Vec<String> = (0..m).map(|i| format!("steady-{i:05}")).collect();
    futures::stream::StreamExt::for_each_concurrent(
        futures::stream::iter(&names),
        CREATE_PARALLELISM,
        |name| {
            let cluster = &cluster;
            async move { create(cluster, &node_claim(name, CLASS, "1", "1Gi")).await }
        },
    )
    .await;
    let deadline = Instant::now() + LIMIT;
    let mut ready = 0;
    while Instant::now() < deadline {
        let ncs: Vec<NodeClaim> = cluster.list(None, None).await.expect("list NodeClaims");
        ready = ncs.iter().filter(|nc| initialized(nc)).count();
        if ready >= m {
            break;
        }
        tokio::time::sleep(Duration::from_secs(5)).await;
    }
    let claims_ready = t.elapsed();
    println!(
        "{ready}/{m} NodeClaims initialized after {:.1}s",
        claims_ready.as_secs_f64()
    );

    // The steady window.
    tokio::time::sleep(Duration::from_secs(env_u64("KPSSH_BENCH_SETTLE_SECS", 60))).await;
    let window = Duration::from_secs(env_u64("KPSSH_BENCH_WINDOW_SECS", 240));
    let load_w0 = loadavg();
    let w0 = ApiCounts::scrape(&client).await;
    let (a0, api0, etcd0) = (
        ProcSample::read(a_pid),
        ProcSample::read(apiserver_pid),
        ProcSample::read(etcd_pid),
    );
    let probes0 = kids.latest("a", "probes").map_or(0, |e| e.value);
    let dials0 = kids.latest("a", "dials").map_or(0, |e| e.value);
    let started = Instant::now();
    let mut rss = vec![];
    while started.elapsed() < window {
        tokio::time::sleep(Duration::from_secs(5)).await;
        rss.push(ProcSample::read(a_pid).rss_kib);
    }
    let elapsed = started.elapsed();
    let (a1, api1, etcd1) = (
        ProcSample::read(a_pid),
        ProcSample::read(apiserver_pid),
        ProcSample::read(etcd_pid),
    );
    let w1 = ApiCounts::scrape(&client).await;
    let load_w1 = loadavg();
    let probes1 = kids.latest("a", "probes").map_or(0, |e| e.value);
    let dials1 = kids.latest("a", "dials").map_or(0, |e| e.value);
    let pooled = kids.latest("a", "pooled").map_or(0, |e| e.value);
    let fleet_kib = kids.latest("a", "rss-fleet-kib").map_or(0, |e| e.value);
    let scale = elapsed.as_secs_f64() / baseline_secs as f64;
    let delta = w1.minus(&w0).less_scaled(&baseline, scale);
    let host_hours = n as f64 * elapsed.as_secs_f64() / 3600.0;
    let cpu = a1.cpu_secs(&a0) / elapsed.as_secs_f64();
    let rss_mean = rss.iter().sum::<u64>() as f64 / rss.len().max(1) as f64 / 1024.0;
    let rss_max = rss.iter().copied().max().unwrap_or(0) as f64 / 1024.0;
    let total = delta.total();
    let leases = delta.resource_total("coordination.k8s.io/leases");
    let watches = delta.verb_total("WATCH");
    let probe_rate = (probes1 - probes0) as f64 / host_hours;

    // Failover: SIGKILL the leader; the standby takes the Lease and probes.
    let load_fail = loadavg();
    let killed = now_ms();
    a.kill().expect("SIGKILL a");
    let _ = a.wait();
    let b_leader = kids.wait("b", "leader", LIMIT).await;
    let b_first = kids.wait("b", "first-probe", LIMIT).await;
    let failover = Duration::from_millis((b_first.at_ms.saturating_sub(killed)) as u64);
    println!(
        "failover: lease taken +{:.1}s, first probe +{:.1}s after SIGKILL (load {load_fail})",
        (b_leader.at_ms.saturating_sub(killed)) as f64 / 1000.0,
        failover.as_secs_f64()
    );
    let _ = b.kill();
    let _ = b.wait();

    let per_hh = |x: f64| x / host_hours;
    let mut rows: Vec<(String, f64)> = delta.by_key().into_iter().collect();
    rows.sort_by(|x, y| y.1.total_cmp(&x.1));
    report::print_table(
        &format!(
            "API requests in the steady window ({:.0}s, {n} hosts, less the idle API server)",
            elapsed.as_secs_f64()
        ),
        &["verb resource", "requests", "per host-hour"],
        &rows
            .iter()
            .filter(|r| r.1 >= 0.5)
            .map(|(k, v)| vec![k.clone(), format!("{v:.0}"), format!("{:.3}", per_hh(*v))])
            .collect::<Vec<_>>(),
    );
    let figures = vec![
        ("hosts", n.to_string()),
        ("steady NodeClaims (initialized)", format!("{m} ({ready})")),
        (
            "cold start to all hosts probed (s)",
            format!("{:.1}", secs(cold)),
        ),
        (
            "claims created to initialized (s)",
            format!("{:.1}", secs(claims_ready)),
        ),
        (
            "leader RSS after cold start (MiB)",
            format!("{:.0}", cold_rss as f64 / 1024.0),
        ),
        (
            "leader RSS steady mean / max (MiB)",
            format!("{rss_mean:.0} / {rss_max:.0}"),
        ),
        (
            "leader RSS peak, VmHWM (MiB)",
            format!("{:.0}", a1.hwm_kib as f64 / 1024.0),
        ),
        (
            "leader CPU steady (% of one core)",
            format!("{:.1}", cpu * 100.0),
        ),
        (
            "kube-apiserver CPU / RSS",
            format!(
                "{:.1}% / {:.0} MiB",
                api1.cpu_secs(&api0) / elapsed.as_secs_f64() * 100.0,
                api1.rss_kib as f64 / 1024.0
            ),
        ),
        (
            "etcd CPU / RSS",
            format!(
                "{:.1}% / {:.0} MiB",
                etcd1.cpu_secs(&etcd0) / elapsed.as_secs_f64() * 100.0,
                etcd1.rss_kib as f64 / 1024.0
            ),
        ),
        ("probes per host-hour (window)", format!("{probe_rate:.1}")),
        (
            "SSH dials in the window; pooled connections at its end",
            format!("{}; {pooled}", dials1.saturating_sub(dials0)),
        ),
        (
            "simulated fleet in the leader's RSS (SimHosts, MiB)",
            format!("{:.1}", fleet_kib as f64 / 1024.0),
        ),
        (
            "API requests per host-hour (all)",
            format!("{:.3}", per_hh(total)),
        ),
        (
            "API requests per host-hour (less leader election)",
            format!("{:.3}", per_hh(total - leases)),
        ),
        (
            "watch requests in the window (restarts)",
            format!("{watches:.0}"),
        ),
        (
            "failover: SIGKILL to first probe of the standby (s)",
            format!("{:.1}", secs(failover)),
        ),
        (
            "load average: start / cold / window / failover",
            format!("{load_start} / {load_cold} / {load_w0} → {load_w1} / {load_fail}"),
        ),
    ];
    report::print_table(
        "apiserver scale",
        &["figure", "measured"],
        &figures
            .iter()
            .map(|(k, v)| vec![k.to_string(), v.clone()])
            .collect::<Vec<_>>(),
    );
    let targets = vec![
        Target {
            name: "cold start (s)".into(),
            measured: cold.as_secs_f64(),
            bound: 60.0,
            at_least: false,
        },
        Target {
            name: "steady RSS max (MiB)".into(),
            measured: rss_max,
            bound: 512.0,
            at_least: false,
        },
        Target {
            name: "steady CPU (% of one core)".into(),
            measured: cpu * 100.0,
            bound: 10.0,
            at_least: false,
        },
        Target {
            name: "API requests per host-hour".into(),
            measured: per_hh(total),
            bound: 5.0,
            at_least: false,
        },
        Target {
            name: "failover to first probe (s)".into(),
            measured: failover.as_secs_f64(),
            bound: 30.0,
            at_least: false,
        },
    ];
    report::print_targets(&targets);
    report::write_json(
        Mode::Full,
        "apiserver_scale",
        json!({
            "benchmark": "apiserver_scale",
            "hosts": n,
            "claims": m,
            "claims_initialized": ready,
            "figures": figures.iter().map(|(k, v)| (k.to_string(), json!(v))).collect::<serde_json::Map<_, _>>(),
            "requests": rows.iter().map(|(k, v)| (k.clone(), json!(v))).collect::<serde_json::Map<_, _>>(),
            "baseline_requests": baseline.by_key(),
            "window_s": elapsed.as_secs_f64(),
            "targets": targets.iter().map(Target::json).collect::<Vec<_>>(),
        }),
    );
    cp.shutdown();
}

fn pid_of(cp: &controlplane::ControlPlane, name: &str) -> u32 {
    cp.pids()
        .into_iter()
        .find(|(n, _)| *n == name)
        .map(|(_, p)| p)
        .unwrap_or_else(|| panic!("no {name} process"))
}
