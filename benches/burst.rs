//! Issue #10 item 3, S15 at scale: a burst of NodeClaims against as many Available hosts. The
//! real actor core and router (spawn_controller) with simulated hosts (SimTransport), on two
//! API tiers:
//! - `apiserver`: the real kube-apiserver/etcd of the control-plane tier, through KubeCluster;
//! - `memory`: the simulation's MemoryCluster, in real time.
//!
//! Figures: CAS conflicts counted by the router itself (`kpssh_claim_conflicts`) per claim, and
//! the time from the last NodeClaim created to every claim recorded (the router's
//! `kpssh_claims` counter reaching N, i.e. every claim CAS accepted by the API).
//!
//! `cargo bench --bench burst`; `KPSSH_BENCH_CLAIMS` (1000) sets both hosts and claims,
//! `KPSSH_BENCH_TIERS` (`apiserver,memory`) picks the tiers, `KPSSH_BENCH_CLAIM_CONCURRENCY`
//! sets the router's `max_concurrent_claims` (128).

#[path = "../tests/support/controlplane.rs"]
mod controlplane;
#[path = "support/report.rs"]
mod report;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::{Namespace, Secret};
use kpssh::actors::spawn_controller;
use kpssh::api::{HostState, SSHHost, crds};
use kpssh::clock::Clock;
use kpssh::k8s::{Cluster, ClusterError, KubeCluster, MemoryCluster};
use kpssh::provider::{Config, Context};
use kpssh::sim::world::{host_object, node_claim, node_class, sim_profile};
use kpssh::sim::{SimHost, SimTransport};
use kube::api::ObjectMeta;
use report::{Mode, Target, secs};
use serde_json::{Value, json};

const NS: &str = "kpssh-bench";
/// Bound on hosts becoming Available and on claims being recorded; past it the run fails.
const LIMIT: Duration = Duration::from_secs(600);
/// Concurrent creates (hosts and NodeClaims): a burst, as Karpenter's provisioner writes it.
const CREATE_PARALLELISM: usize = 32;

struct Burst {
    tier: &'static str,
    claims: usize,
    hosts_available: Duration,
    create_all: Duration,
    after_last_created: Duration,
    first_to_all: Duration,
    conflicts: u64,
    api_conflicts: Option<u64>,
}

fn main() {
    let mode = Mode::detect();
    let n = mode.pick("KPSSH_BENCH_CLAIMS", 1000, 20);
    let tiers = std::env::var("KPSSH_BENCH_TIERS").unwrap_or_else(|_| "apiserver,memory".into());
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("tokio runtime");
    let mut results = vec![];
    for tier in tiers.split(',').map(str::trim) {
        println!("burst: {n} NodeClaims on {n} hosts, tier {tier}");
        let r = match tier {
            "apiserver" => rt.block_on(apiserver_tier(n)),
            "memory" => rt.block_on(memory_tier(n)),
            other => panic!("unknown tier {other:?} (apiserver, memory)"),
        };
        results.push(r);
    }

    let rows: Vec<Vec<String>> = results
        .iter()
        .map(|r| {
            vec![
                r.tier.to_string(),
                r.claims.to_string(),
                format!("{:.2}", secs(r.hosts_available)),
                format!("{:.2}", secs(r.create_all)),
                format!("{:.3}", secs(r.after_last_created)),
                format!("{:.3}", secs(r.first_to_all)),
                r.conflicts.to_string(),
                format!("{:.2}%", ratio(r) * 100.0),
                r.api_conflicts.map_or("-".into(), |c| c.to_string()),
            ]
        })
        .collect();
    report::print_table(
        "burst claims (seconds, real time)",
        &[
            "tier",
            "claims",
            "hosts Available",
            "create all",
            "last created -> all recorded",
            "first created -> all recorded",
            "CAS conflicts",
            "per claim",
            "API 409s (memory stats)",
        ],
        &rows,
    );
    let mut targets = vec![];
    for r in &results {
        targets.push(Target {
            name: format!("{}: CAS conflicts per claim", r.tier),
            measured: ratio(r),
            bound: 0.02,
            at_least: false,
        });
        if r.tier == "apiserver" {
            targets.push(Target {
                name: "apiserver: last created -> all recorded (s)".into(),
                measured: r.after_last_created.as_secs_f64(),
                bound: 5.0,
                at_least: false,
            });
        }
    }
    report::print_targets(&targets);
    report::write_json(
        mode,
        "burst",
        json!({
            "benchmark": "burst",
            "tiers": results.iter().map(|r| json!({
                "tier": r.tier,
                "claims": r.claims,
                "hosts_available_s": secs(r.hosts_available),
                "create_all_s": secs(r.create_all),
                "last_created_to_all_recorded_s": secs(r.after_last_created),
                "first_created_to_all_recorded_s": secs(r.first_to_all),
                "cas_conflicts": r.conflicts,
                "cas_conflicts_per_claim": ratio(r),
                "api_conflicts": r.api_conflicts,
            })).collect::<Vec<Value>>(),
            "targets": targets.iter().map(Target::json).collect::<Vec<_>>(),
        }),
    );
}

fn ratio(r: &Burst) -> f64 {
    r.conflicts as f64 / r.claims.max(1) as f64
}

async fn apiserver_tier(n: usize) -> Burst {
    let cp = controlplane::ControlPlane::shared();
    let yaml = format!(
        "{}{}",
        crds::to_yaml(&crds::kpssh_crds()).expect("yaml"),
        crds::to_yaml(&crds::karpenter_crds()).expect("yaml")
    );
    cp.install_crds(&yaml).await;
    let cluster = KubeCluster::new(cp.client().await);
    let ns = Namespace {
        metadata: ObjectMeta {
            name: Some(NS.into()),
            ..Default::default()
        },
        ..Default::default()
    };
    create(&cluster, &ns).await;
    // Joins register their Nodes in this throwaway cluster; the burst only needs the claims.
    let transport = SimTransport::new(MemoryCluster::new(Clock::system()));
    let r = burst("apiserver", cluster, transport, n, None).await;
    cp.shutdown();
    r
}

async fn memory_tier(n: usize) -> Burst {
    let cluster = MemoryCluster::new(Clock::system());
    let transport = SimTransport::new(cluster.clone());
    let stats = cluster.clone();
    burst("memory", cluster, transport, n, Some(stats)).await
}

async fn create<C: Cluster, K: kpssh::k8s::Object>(c: &C, obj: &K) {
    match c.create(obj).await {
        Ok(_) | Err(ClusterError::AlreadyExists { .. }) => {}
        Err(e) => panic!("create: {e}"),
    }
}

async fn burst<C: Cluster>(
    tier: &'static str,
    cluster: C,
    transport: SimTransport,
    n: usize,
    stats: Option<MemoryCluster>,
) -> Burst {
    let key = Secret {
        metadata: ObjectMeta {
            name: Some(kpssh::sim::world::KEY_SECRET.into()),
            namespace: Some(NS.into()),
            ..Default::default()
        },
        data: Some(BTreeMap::from([(
            "privateKey".to_string(),
            ByteString(b"simulated".to_vec()),
        )])),
        ..Default::default()
    };
    create(&cluster, &key).await;
    create(&cluster, &sim_profile("p", "1")).await;
    create(&cluster, &node_class("pool", "p")).await;

    let start = Instant::now();
    let hosts: Vec<SSHHost> = (0..n)
        .map(|i| {
            let addr = format!("10.{}.{}.{}", 100 + i / 65536, (i / 256) % 256, i % 256);
            let sim = SimHost::new(&addr, 2, 4_000_000);
            let h = host_object(NS, &format!("h{i:05}"), "small", &sim);
            transport.add(sim);
            h
        })
        .collect();
    futures::stream::iter(&hosts)
        .for_each_concurrent(CREATE_PARALLELISM, |h| create(&cluster, h))
        .await;
    let mut config = Config {
        pool_namespace: NS.into(),
        ..Config::default()
    };
    if let Some(c) = std::env::var("KPSSH_BENCH_CLAIM_CONCURRENCY")
        .ok()
        .and_then(|v| v.trim().parse().ok())
    {
        config.max_concurrent_claims = c;
    }
    let ctx = Context::new(
        cluster.clone(),
        Arc::new(transport),
        Clock::system(),
        config,
        Some(15),
    );
    let controller = spawn_controller(&ctx).await.expect("controller");
    let deadline = Instant::now() + LIMIT;
    loop {
        let hs: Vec<SSHHost> = cluster.list(Some(NS), None).await.expect("list hosts");
        let up = hs
            .iter()
            .filter(|h| h.state() == HostState::Available)
            .count();
        if up >= n {
            break;
        }
        assert!(Instant::now() < deadline, "only {up}/{n} hosts Available");
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let hosts_available = start.elapsed();
    // Let the probes' status writes settle: the burst starts on a quiet fleet.
    tokio::time::sleep(Duration::from_secs(2)).await;

    let conflicts_before = ctx.metrics.claim_conflicts.get();
    let claims_before = ctx.metrics.claims.get();
    let api_before = stats.as_ref().map(|s| s.stats().conflicts);
    let stats_before = stats.as_ref().map(|s| s.stats());
    let t0 = Instant::now();
    let names: Vec<String> = (0..n).map(|i| format!("burst-{i:05}")).collect();
    futures::stream::iter(&names)
        .for_each_concurrent(CREATE_PARALLELISM, |name| {
            let cluster = &cluster;
            async move {
                cluster
                    .create(&node_claim(name, "pool", "1", "1Gi"))
                    .await
                    .expect("create NodeClaim");
            }
        })
        .await;
    let last_created = Instant::now();
    let deadline = last_created + LIMIT;
    while ctx.metrics.claims.get() - claims_before < n as u64 {
        assert!(
            Instant::now() < deadline,
            "only {} of {n} claims recorded",
            ctx.metrics.claims.get() - claims_before
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let done = Instant::now();
    let conflicts = ctx.metrics.claim_conflicts.get() - conflicts_before;
    let api_conflicts = stats
        .as_ref()
        .zip(api_before)
        .map(|(s, before)| s.stats().conflicts - before);
    if let (Some(s), Some(before)) = (stats.as_ref(), stats_before.as_ref()) {
        let after = s.stats();
        println!(
            "memory tier, API calls from first NodeClaim created to all recorded: \
             creates {} replaces {} status writes {} patches {} deletes {} lists {}",
            after.creates - before.creates,
            after.replaces - before.replaces,
            after.status_writes - before.status_writes,
            after.patches - before.patches,
            after.deletes - before.deletes,
            after.lists - before.lists,
        );
    }

    // Every claim is on the API: each host holds exactly one, each NodeClaim one host.
    let hs: Vec<SSHHost> = cluster.list(Some(NS), None).await.expect("list hosts");
    let held: BTreeSet<String> = hs
        .iter()
        .filter_map(|h| h.claim().map(|c| c.name.clone()))
        .collect();
    assert_eq!(held.len(), n, "every NodeClaim holds a distinct host");
    controller.shutdown(Duration::from_secs(5)).await;
    Burst {
        tier,
        claims: n,
        hosts_available,
        create_all: last_created - t0,
        after_last_created: done - last_created,
        first_to_all: done - t0,
        conflicts,
        api_conflicts,
    }
}
