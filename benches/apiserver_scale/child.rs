//! The controller process of the scale bench: `kpssh controller`'s wiring (src/cli/controller.rs:
//! Lease, `spawn_controller`, `karpenter::spawn_with` on `KubeCluster`) with `SimTransport`.
//! It reports on stdout, one `EVENT <name> <unix ms> <value>` line each: `standby` (the Lease is
//! held by another), `leader`, `started`, `first-probe`, `all-probed` (every host probed at
//! least once) and `probes` (the running count, every 5 s).

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::api::core::v1::Node;
use kube::config::{KubeConfigOptions, Kubeconfig};
use tokio_util::sync::CancellationToken;

// Every kpssh path the child uses, in one place (module paths may move).
use kpssh::actors::spawn_controller;
use kpssh::api::SSHHost;
use kpssh::clock::Clock;
use kpssh::k8s::leader::{LeaderElector, LeaseConfig, Role};
use kpssh::k8s::{Cluster, KubeCluster, MemoryCluster};
use kpssh::karpenter::{KarpenterConfig, spawn_with};
use kpssh::provider::{Config, Context};
use kpssh::sim::world::host_object;
use kpssh::sim::{SimHost, SimTransport};
use kpssh::ssh::pool::PoolConfig;
use kpssh::ssh::{
    CommandOutput, HostTarget, ProbeReport, RemoteCommand, Transport, TransportError,
};

pub const CHILD_ENV: &str = "KPSSH_SCALE_CHILD";

/// Simulated host `i` and its SSHHost.
pub fn host(i: usize) -> (SimHost, SSHHost) {
    let sim = SimHost::new(&super::host_address(i), 2, 4_000_000);
    let h = host_object(super::NS, &format!("h{i:05}"), "small", &sim);
    (sim, h)
}

fn emit(name: &str, value: u64) {
    println!("EVENT {name} {} {value}", super::now_ms());
}

/// SimTransport, counting probes and the hosts probed at least once.
struct Counting {
    inner: SimTransport,
    n: usize,
    probes: AtomicU64,
    first: AtomicBool,
    seen: Mutex<Option<HashSet<String>>>,
}

impl Transport for Counting {
    async fn probe(
        &self,
        target: &HostTarget,
        verified_shim: Option<&str>,
    ) -> Result<ProbeReport, TransportError> {
        let r = self.inner.probe(target, verified_shim).await;
        if r.is_ok() {
            self.probes.fetch_add(1, Ordering::Relaxed);
            if !self.first.swap(true, Ordering::Relaxed) {
                emit("first-probe", 1);
            }
            let mut seen = self.seen.lock().unwrap_or_else(|p| p.into_inner());
            if let Some(s) = seen.as_mut() {
                s.insert(target.address.clone());
                if s.len() >= self.n {
                    emit("all-probed", s.len() as u64);
                    *seen = None;
                }
            }
        }
        r
    }

    async fn exec(
        &self,
        target: &HostTarget,
        cmd: RemoteCommand,
    ) -> Result<CommandOutput, TransportError> {
        self.inner.exec(target, cmd).await
    }

    fn pooled(&self, target: &HostTarget) -> bool {
        self.inner.pooled(target)
    }

    async fn forget(&self, host: &str) {
        self.inner.forget(host).await
    }
}

pub fn main(identity: &str) {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .try_init();
    // The controller binary's runtime: `#[tokio::main]`, one worker per core.
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");
    rt.block_on(run(identity));
}

async fn run(identity: &str) {
    let n = super::env_u64("KPSSH_BENCH_HOSTS", 10_000) as usize;
    let path = std::env::var("KUBECONFIG").expect("KUBECONFIG");
    let kc = Kubeconfig::read_from(&path).expect("kubeconfig");
    let mut config = kube::Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default())
        .await
        .expect("kubeconfig");
    config.default_retry = false;
    let client = kube::Client::try_from(config).expect("client");
    let cluster = KubeCluster::new(client);

    // The hosts' side: simulated machines whose kubelets register into `kubelets`; their
    // Nodes are copied to the API server below.
    let kubelets = MemoryCluster::new(Clock::system());
    let sim = SimTransport::new(kubelets.clone());
    // The real transport's pool (`--max-ssh-connections`, 4096 by default; 5-minute idle
    // timeout): which probes dial, and so wait for the dial pacer.
    sim.set_pool(PoolConfig {
        max_connections: super::env_u64("KPSSH_MAX_SSH_CONNECTIONS", 4096) as usize,
        ..PoolConfig::default()
    });
    let rss_empty = super::measure::ProcSample::read(std::process::id()).rss_kib;
    for i in 0..n {
        sim.add(host(i).0);
    }
    // The simulated fleet lives in this process but is not the controller's: what it holds
    // at the start (the joined hosts' kubelet Nodes come later, 1,000 small objects).
    let rss_fleet = super::measure::ProcSample::read(std::process::id()).rss_kib;
    emit("rss-fleet-kib", rss_fleet.saturating_sub(rss_empty));
    let transport = Counting {
        inner: sim,
        n,
        probes: AtomicU64::new(0),
        first: AtomicBool::new(false),
        seen: Mutex::new(Some(HashSet::new())),
    };
    let config = Config {
        pool_namespace: super::NS.into(),
        probe_interval: Duration::from_secs(super::env_u64("KPSSH_PROBE_INTERVAL_SECS", 120)),
        ssh_dials_per_second: super::env_u64("KPSSH_SSH_DIALS_PER_SECOND", 50) as u32,
        ..Config::default()
    };
    let ctx = Context::new(
        cluster.clone(),
        Arc::new(transport),
        Clock::system(),
        config,
        None,
    );

    let lease = LeaseConfig::new(super::NS, "kpssh-controller", identity);
    let elector = LeaderElector::new(cluster.clone(), lease, Clock::system()).expect("elector");
    let mut role = elector.role();
    tokio::spawn(async move {
        while role.changed().await.is_ok() {
            if matches!(*role.borrow(), Role::Standby { .. }) {
                emit("standby", 0);
                return;
            }
        }
    });
    let cancel = CancellationToken::new();
    let mut held = elector.acquire(&cancel).await.expect("leadership");
    emit("leader", 0);
    let _controller = spawn_controller(&ctx).await.expect("controller");
    let _karpenter = spawn_with(&ctx, KarpenterConfig::for_actors(&ctx.config))
        .await
        .expect("karpenter");
    emit("started", 0);

    tokio::spawn(mirror_nodes(kubelets, cluster.clone()));
    let transport = ctx.transport.clone();
    tokio::spawn(async move {
        loop {
            tokio::time::sleep(Duration::from_secs(5)).await;
            emit("probes", transport.probes.load(Ordering::Relaxed));
            emit("dials", transport.inner.dials());
            emit("pooled", transport.inner.pooled_connections() as u64);
        }
    });
    let e = held.lost().await;
    eprintln!("{identity}: lost the Lease: {e}");
    std::process::exit(1);
}

/// The simulated kubelets register their Nodes in an in-memory cluster; copy each new one to
/// the API server (with capacity, as a kubelet reports it).
async fn mirror_nodes(kubelets: MemoryCluster, cluster: KubeCluster) {
    let mut copied = HashSet::new();
    loop {
        tokio::time::sleep(Duration::from_secs(2)).await;
        let Ok(nodes) = kubelets.list::<Node>(None, None).await else {
            continue;
        };
        for mut node in nodes {
            let Some(name) = node.metadata.name.clone() else {
                continue;
            };
            if copied.contains(&name) {
                continue;
            }
            node.metadata.resource_version = None;
            node.metadata.uid = None;
            node.metadata.creation_timestamp = None;
            node.metadata.managed_fields = None;
            if let Some(s) = node.status.as_mut() {
                s.capacity = Some(super::node_resources());
                s.allocatable = Some(super::node_resources());
            }
            match cluster.create(&node).await {
                Ok(_) | Err(kpssh::k8s::ClusterError::AlreadyExists { .. }) => {
                    copied.insert(name);
                }
                Err(e) => eprintln!("mirror Node {name}: {e}"),
            }
        }
    }
}
