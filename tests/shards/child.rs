//! One shard controller process of tests/shards.rs: `kpssh controller --node-classes <class>`'s
//! wiring (its own Lease named as the CLI derives it, `spawn_controller`, the karpenter layer,
//! all on `KubeCluster`) with `SimTransport` hosts instead of SSH, as the apiserver_scale
//! bench's children. It reports on stdout, one `EVENT <name> <unix ms> <value>` line each:
//! `standby`, `leader`, `started`, `first-probe`, `all-probed` (every host of its class probed),
//! `probes` (the running count, every second) and `foreign-probe` (a probe of a host of another
//! class: must never happen).

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::api::core::v1::Node;
use kube::config::{KubeConfigOptions, Kubeconfig};
use tokio_util::sync::CancellationToken;

use kpssh::actors::spawn_controller;
use kpssh::clock::Clock;
use kpssh::k8s::leader::{LeaderElector, LeaseConfig, Role};
use kpssh::k8s::{Cluster, KubeCluster, MemoryCluster};
use kpssh::karpenter::{KarpenterConfig, spawn_with};
use kpssh::provider::{Config, Context};
use kpssh::sim::SimTransport;
use kpssh::ssh::{
    CommandOutput, HostTarget, ProbeReport, RemoteCommand, Transport, TransportError,
};

pub const CHILD_ENV: &str = "KPSSH_SHARD_CHILD";

/// Straight to the stdout handle, not `println!`: the child runs inside the test harness, whose
/// output capture takes `print!`s of test threads (and of the threads they spawn).
fn emit(name: &str, value: u64) {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "EVENT {name} {} {value}", super::now_ms());
    let _ = out.flush();
}

/// SimTransport over every host of the pool, counting probes of this shard's hosts and
/// reporting any probe of another shard's.
struct Counting {
    inner: SimTransport,
    mine: HashSet<String>,
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
        if !self.mine.contains(&target.address) {
            emit("foreign-probe", 1);
        }
        let r = self.inner.probe(target, verified_shim).await;
        if r.is_ok() {
            self.probes.fetch_add(1, Ordering::Relaxed);
            if !self.first.swap(true, Ordering::Relaxed) {
                emit("first-probe", 1);
            }
            let mut seen = self.seen.lock().unwrap_or_else(|p| p.into_inner());
            if let Some(s) = seen.as_mut() {
                s.insert(target.address.clone());
                if s.len() >= self.mine.len() {
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

/// Run the shard controller of `class` as `identity` until killed.
pub fn main(identity: &str, class: &str) {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .try_init();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("tokio runtime");
    rt.block_on(run(identity, class));
}

async fn run(identity: &str, class: &str) {
    let n = super::hosts();
    let path = std::env::var("KUBECONFIG").expect("KUBECONFIG");
    let kc = Kubeconfig::read_from(&path).expect("kubeconfig");
    let mut config = kube::Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default())
        .await
        .expect("kubeconfig");
    config.default_retry = false;
    let client = kube::Client::try_from(config).expect("client");
    let cluster = KubeCluster::new(client);

    let kubelets = MemoryCluster::new(Clock::system());
    let sim = SimTransport::new(kubelets.clone());
    let mut mine = HashSet::new();
    for i in 0..n {
        let (host, c) = super::sim_host(i);
        if c == class {
            mine.insert(host.address.clone());
        }
        sim.add(host);
    }
    let transport = Counting {
        inner: sim,
        mine,
        probes: AtomicU64::new(0),
        first: AtomicBool::new(false),
        seen: Mutex::new(Some(HashSet::new())),
    };
    let config = Config {
        pool_namespace: super::NS.into(),
        probe_interval: Duration::from_secs(super::probe_secs()),
        // As `kpssh controller --node-classes <class>`.
        node_classes: vec![class.to_string()],
        ..Config::default()
    };
    let ctx = Context::new(
        cluster.clone(),
        Arc::new(transport),
        Clock::system(),
        config,
        None,
    );
    let lease_name = kpssh::cli::controller::shard_lease_name("kpssh-controller", &[class.into()])
        .expect("lease name");
    let lease = LeaseConfig::new(super::NS, &lease_name, identity);
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
            tokio::time::sleep(Duration::from_secs(1)).await;
            emit("probes", transport.probes.load(Ordering::Relaxed));
        }
    });
    let e = held.lost().await;
    eprintln!("{identity}: lost the Lease: {e}");
    std::process::exit(1);
}

/// The simulated kubelets register their Nodes in an in-memory cluster; copy each new one to
/// the API server, as a kubelet would register it.
async fn mirror_nodes(kubelets: MemoryCluster, cluster: KubeCluster) {
    let mut copied = HashSet::new();
    loop {
        tokio::time::sleep(Duration::from_secs(1)).await;
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
            match cluster.create(&node).await {
                Ok(_) | Err(kpssh::k8s::ClusterError::AlreadyExists { .. }) => {
                    copied.insert(name);
                }
                Err(e) => eprintln!("mirror Node {name}: {e}"),
            }
        }
    }
}
