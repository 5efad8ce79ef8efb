//! Issue #10 item 6: the karpenter layer's decisions at fleet size, in the simulation, in real
//! time (wall clock, the real actor core running beside it).
//! - Provisioning: P pending pods over H Available hosts; the figure is one provisioning round
//!   (`Provisioner::provision_once`), i.e. from the batch closing to every NodeClaim written.
//! - Consolidation: one disruption evaluation (`disruption::run_once`) over N initialized nodes,
//!   for a packed fleet (nothing can move: every candidate is checked) and a sparse one (the
//!   first candidate moves).
//!
//! `cargo bench --bench provisioning`; `KPSSH_BENCH_PODS` (10000), `KPSSH_BENCH_HOSTS` (1000),
//! `KPSSH_BENCH_NODES` (1000).

#[path = "support/report.rs"]
mod report;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{
    Container, Node, NodeCondition, NodeSpec, NodeStatus, Pod, PodCondition, PodSpec, PodStatus,
    ResourceRequirements,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, OwnerReference, Time};
use kpssh::api::karpenter::{NODEPOOL_LABEL, NodeClaimStatus};
use kpssh::api::{HostState, NodeClaim, NodePool, SSHHost};
use kpssh::clock::Clock;
use kpssh::k8s::{Cluster, MemoryCluster};
use kpssh::karpenter::provisioning::Provisioner;
use kpssh::karpenter::state::ClusterState;
use kpssh::karpenter::{KarpenterConfig, disruption};
use kpssh::provider::{Config, Context};
use kpssh::sim::world::{World, node_claim, node_class, sim_profile};
use kpssh::sim::{SimHost, SimTransport};
use kube::api::ObjectMeta;
use report::{Mode, Target, secs};
use serde_json::json;

/// Bound on every wait of the setup (hosts Available, the state caught up).
const LIMIT: Duration = Duration::from_secs(600);

fn main() {
    let mode = Mode::detect();
    let pods = mode.pick("KPSSH_BENCH_PODS", 10_000, 200);
    let hosts = mode.pick("KPSSH_BENCH_HOSTS", 1000, 20);
    let nodes = mode.pick("KPSSH_BENCH_NODES", 1000, 20);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("tokio runtime");

    let prov = rt.block_on(provisioning(pods, hosts));
    let packed = rt.block_on(consolidation(nodes, 2, 1500));
    let sparse = rt.block_on(consolidation(nodes, 1, 250));

    report::print_table(
        "provisioning and consolidation (seconds, real time)",
        &["decision", "input", "output", "seconds"],
        &[
            vec![
                "provisioning round".into(),
                format!("{pods} pending pods, {hosts} Available hosts"),
                format!(
                    "{} NodeClaims written, {} pods unplaced",
                    prov.created, prov.unplaced
                ),
                format!("{:.3}", secs(prov.first)),
            ],
            vec![
                "provisioning round, nothing new".into(),
                format!("the same pods, absorbed by the claims in flight"),
                format!("{} NodeClaims written", prov.second_created),
                format!("{:.3}", secs(prov.second)),
            ],
            vec![
                "consolidation, packed".into(),
                format!("{nodes} nodes x 2 pods of 1500m on 4 cpu"),
                format!("{} disrupted", packed.decisions),
                format!("{:.3}", secs(packed.took)),
            ],
            vec![
                "consolidation, sparse".into(),
                format!("{nodes} nodes x 1 pod of 250m on 4 cpu"),
                format!("{} disrupted", sparse.decisions),
                format!("{:.3}", secs(sparse.took)),
            ],
        ],
    );
    println!(
        "(setup: {hosts} hosts Available in {:.1}s, {pods} pods in the state in {:.1}s)",
        prov.hosts_available.as_secs_f64(),
        prov.pods_synced.as_secs_f64()
    );
    let targets = vec![
        Target {
            name: "provisioning round (s)".into(),
            measured: prov.first.as_secs_f64(),
            bound: 1.0,
            at_least: false,
        },
        Target {
            name: "consolidation decision, packed (s)".into(),
            measured: packed.took.as_secs_f64(),
            bound: 1.0,
            at_least: false,
        },
        Target {
            name: "consolidation decision, sparse (s)".into(),
            measured: sparse.took.as_secs_f64(),
            bound: 1.0,
            at_least: false,
        },
    ];
    report::print_targets(&targets);
    report::write_json(
        mode,
        "provisioning",
        json!({
            "benchmark": "provisioning",
            "pods": pods,
            "hosts": hosts,
            "nodes": nodes,
            "provisioning_round_s": secs(prov.first),
            "nodeclaims_written": prov.created,
            "pods_unplaced": prov.unplaced,
            "second_round_s": secs(prov.second),
            "consolidation_packed_s": secs(packed.took),
            "consolidation_packed_decisions": packed.decisions,
            "consolidation_sparse_s": secs(sparse.took),
            "consolidation_sparse_decisions": sparse.decisions,
            "targets": targets.iter().map(Target::json).collect::<Vec<_>>(),
        }),
    );
}

struct Provisioned {
    hosts_available: Duration,
    pods_synced: Duration,
    first: Duration,
    created: usize,
    unplaced: usize,
    second: Duration,
    second_created: usize,
}

fn nodepool() -> NodePool {
    kpssh::sim::world::node_pool("default", "pool")
}

fn resources(cpu_m: u32, mem_mi: u32) -> ResourceRequirements {
    ResourceRequirements {
        requests: Some(BTreeMap::from([
            ("cpu".to_string(), Quantity(format!("{cpu_m}m"))),
            ("memory".to_string(), Quantity(format!("{mem_mi}Mi"))),
        ])),
        ..Default::default()
    }
}

/// A ReplicaSet's pod (reschedulable), pending-unschedulable or bound and running.
fn pod(name: &str, cpu_m: u32, mem_mi: u32, node: Option<&str>) -> Pod {
    let status = match node {
        None => PodStatus {
            phase: Some("Pending".into()),
            conditions: Some(vec![PodCondition {
                type_: "PodScheduled".into(),
                status: "False".into(),
                reason: Some("Unschedulable".into()),
                ..Default::default()
            }]),
            ..Default::default()
        },
        Some(_) => PodStatus {
            phase: Some("Running".into()),
            ..Default::default()
        },
    };
    Pod {
        metadata: ObjectMeta {
            name: Some(name.into()),
            namespace: Some("default".into()),
            labels: Some(BTreeMap::from([("app".to_string(), "web".to_string())])),
            owner_references: Some(vec![OwnerReference {
                api_version: "apps/v1".into(),
                kind: "ReplicaSet".into(),
                name: "web".into(),
                uid: "rs-web".into(),
                controller: Some(true),
                block_owner_deletion: None,
            }]),
            ..Default::default()
        },
        spec: Some(PodSpec {
            node_name: node.map(str::to_string),
            containers: vec![Container {
                name: "c".into(),
                resources: Some(resources(cpu_m, mem_mi)),
                ..Default::default()
            }],
            ..Default::default()
        }),
        status: Some(status),
    }
}

async fn wait(what: &str, mut done: impl AsyncFnMut() -> bool) {
    let deadline = Instant::now() + LIMIT;
    while !done().await {
        assert!(Instant::now() < deadline, "{what}: not within {LIMIT:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn provisioning(pods: usize, hosts: usize) -> Provisioned {
    let w = World::start_bare(Config::default(), 11)
        .await
        .expect("world");
    w.add_profile_and_class("p", "pool")
        .await
        .expect("profile and class");
    let start = Instant::now();
    for i in 0..hosts {
        let addr = format!("10.{}.{}.{}", 100 + i / 65536, (i / 256) % 256, i % 256);
        w.add_host(
            &format!("h{i:05}"),
            "standard",
            SimHost::new(&addr, 16, 64 * 1024 * 1024),
        )
        .await
        .expect("host");
    }
    wait("hosts Available", async || {
        let hs: Vec<SSHHost> = w.cluster.list(Some(&w.ns()), None).await.expect("list");
        hs.iter()
            .filter(|h| h.state() == HostState::Available)
            .count()
            >= hosts
    })
    .await;
    let hosts_available = start.elapsed();
    w.cluster.create(&nodepool()).await.expect("nodepool");
    let start = Instant::now();
    let sizes = [(250, 512), (500, 1024), (1000, 2048), (2000, 4096)];
    for i in 0..pods {
        let (cpu, mem) = sizes[i % sizes.len()];
        w.cluster
            .create(&pod(&format!("p{i:05}"), cpu, mem, None))
            .await
            .expect("pod");
    }
    let state = ClusterState::new(w.ctx.clock.clone());
    let tasks = state.start(&w.cluster);
    wait("state synced", async || {
        let st = state.read();
        st.synced() && st.pods.len() >= pods && !st.nodepools.is_empty()
    })
    .await;
    let pods_synced = start.elapsed();

    let mut p = Provisioner::new(w.ctx.clone(), state.clone(), KarpenterConfig::default());
    let t = Instant::now();
    let first = p.provision_once().await.expect("provisioning round");
    let first_took = t.elapsed();
    assert!(!first.created.is_empty(), "NodeClaims written");
    let t = Instant::now();
    let second = p.provision_once().await.expect("second round");
    let second_took = t.elapsed();
    for t in tasks {
        t.abort();
    }
    w.stop().await;
    Provisioned {
        hosts_available,
        pods_synced,
        first: first_took,
        created: first.created.len(),
        unplaced: first.unplaced.len(),
        second: second_took,
        second_created: second.created.len(),
    }
}

struct Consolidated {
    took: Duration,
    decisions: usize,
}

/// `nodes` initialized nodes of 4 cpu / 16 GiB, each with `per_node` pods of `cpu_m`.
async fn consolidation(nodes: usize, per_node: usize, cpu_m: u32) -> Consolidated {
    let clock = Clock::system();
    let cluster = MemoryCluster::new(clock.clone());
    cluster
        .create(&sim_profile("p", "1"))
        .await
        .expect("profile");
    cluster
        .create(&node_class("pool", "p"))
        .await
        .expect("class");
    cluster.create(&nodepool()).await.expect("nodepool");
    let an_hour_ago = Time(clock.now() - jiff::SignedDuration::from_hours(1));
    let alloc = BTreeMap::from([
        ("cpu".to_string(), Quantity("4".into())),
        ("memory".to_string(), Quantity("16Gi".into())),
        ("pods".to_string(), Quantity("110".into())),
    ]);
    for i in 0..nodes {
        let name = format!("n{i:05}");
        let provider = format!("kpssh://kpssh/h{i:05}");
        let node = Node {
            metadata: ObjectMeta {
                name: Some(name.clone()),
                labels: Some(BTreeMap::from([
                    ("kubernetes.io/hostname".to_string(), name.clone()),
                    (NODEPOOL_LABEL.to_string(), "default".to_string()),
                ])),
                ..Default::default()
            },
            spec: Some(NodeSpec {
                provider_id: Some(provider.clone()),
                ..Default::default()
            }),
            status: Some(NodeStatus {
                allocatable: Some(alloc.clone()),
                capacity: Some(alloc.clone()),
                conditions: Some(vec![NodeCondition {
                    type_: "Ready".into(),
                    status: "True".into(),
                    last_transition_time: Some(an_hour_ago.clone()),
                    ..Default::default()
                }]),
                ..Default::default()
            }),
        };
        cluster.create(&node).await.expect("node");
        let mut nc: NodeClaim = node_claim(&format!("default-{i:05}"), "pool", "1", "1Gi");
        nc.metadata.labels = Some(BTreeMap::from([(
            NODEPOOL_LABEL.to_string(),
            "default".to_string(),
        )]));
        nc.status = Some(NodeClaimStatus {
            node_name: Some(name.clone()),
            provider_id: Some(provider),
            allocatable: alloc.clone(),
            conditions: ["Launched", "Registered", "Initialized"]
                .into_iter()
                .map(|t| Condition {
                    type_: t.into(),
                    status: "True".into(),
                    reason: t.into(),
                    message: String::new(),
                    last_transition_time: an_hour_ago.clone(),
                    observed_generation: None,
                })
                .collect(),
            ..Default::default()
        });
        cluster.create(&nc).await.expect("nodeclaim");
        for j in 0..per_node {
            cluster
                .create(&pod(&format!("{name}-{j}"), cpu_m, 1024, Some(&name)))
                .await
                .expect("pod");
        }
    }
    let state = ClusterState::new(clock.clone());
    let tasks = state.start(&cluster);
    wait("state synced", async || {
        let st = state.read();
        st.synced() && st.pods.len() >= nodes * per_node && st.nodeclaims.len() >= nodes
    })
    .await;
    let ctx = Context::new(
        cluster.clone(),
        Arc::new(SimTransport::new(cluster.clone())),
        clock,
        Config::default(),
        Some(3),
    );
    let t = Instant::now();
    let done = disruption::run_once(&ctx, &state, &KarpenterConfig::default())
        .await
        .expect("disruption round");
    let took = t.elapsed();
    for t in tasks {
        t.abort();
    }
    Consolidated {
        took,
        decisions: done.len(),
    }
}
