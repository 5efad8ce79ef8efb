//! Issue #21, S57: multi-node consolidation at fleet size, in real time (wall clock).
//!
//! A fleet of N initialized NodeClaims with Ready Nodes (4 cpu, 16 GiB), each running three
//! 800m pods (60% of its cpu), in one NodePool with the default budget (10%). The figures:
//! - decision time: one disruption evaluation (`disruption::run_once`) over the fleet, with
//!   multi-node consolidation (the default) and with single-node consolidation only, each on
//!   a fresh copy of the same fleet; and over a packed fleet where nothing can move (two 1500m
//!   pods per node: every prefix the search tries fails);
//! - nodes saved: the same fleet consolidated round after round (each decision carried out at
//!   once: the disrupted nodes deleted, their pods bound first-fit to the nodes left) until a
//!   round decides nothing, with and without multi-node consolidation: nodes left after the
//!   first decision, after 60 rounds (10 minutes at the default 10 s interval) and at the end.
//!
//! `cargo bench --bench consolidation` (a release build); `KPSSH_BENCH_NODES` (1000),
//! `KPSSH_BENCH_ROUNDS` (cap on rounds per run, 2000).

#[path = "support/report.rs"]
mod report;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{
    Container, Node, NodeCondition, NodeSpec, NodeStatus, Pod, PodSpec, PodStatus,
    ResourceRequirements,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, OwnerReference, Time};
use kpssh::actors::{Config, Context};
use kpssh::api::NodeClaim;
use kpssh::api::karpenter::{NODEPOOL_LABEL, NodeClaimStatus};
use kpssh::clock::Clock;
use kpssh::k8s::{Cluster, MemoryCluster};
use kpssh::karpenter::state::ClusterState;
use kpssh::karpenter::{KarpenterConfig, disruption};
use kpssh::sim::SimTransport;
use kpssh::sim::world::{node_claim, node_class, node_pool, sim_profile};
use kube::api::ObjectMeta;
use report::{Mode, Target, secs};
use serde_json::json;

const LIMIT: Duration = Duration::from_secs(600);
const NODE_CPU_M: u32 = 4000;

fn main() {
    let mode = Mode::detect();
    let nodes = mode.pick("KPSSH_BENCH_NODES", 1000, 30);
    let max_rounds = mode.pick("KPSSH_BENCH_ROUNDS", 2000, 200);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("tokio runtime");
    let multi = rt.block_on(run(nodes, 3, 800, true, max_rounds));
    let single = rt.block_on(run(nodes, 3, 800, false, max_rounds));
    let packed = rt.block_on(run(nodes, 2, 1500, true, 1));
    let row = |what: &str, r: &Run| {
        vec![
            what.to_string(),
            format!("{:.3}", secs(r.first_took)),
            r.first_decided.to_string(),
            r.after(1).to_string(),
            r.after(60).to_string(),
            format!("{} ({} rounds)", r.left(), r.rounds()),
        ]
    };
    report::print_table(
        &format!("consolidation of {nodes} nodes x 3 pods of 800m on 4 cpu (real time)"),
        &[
            "consolidation",
            "first decision (s)",
            "disrupted",
            "nodes after 1",
            "after 60 rounds",
            "at the end",
        ],
        &[
            row("multi-node + single-node", &multi),
            row("single-node only", &single),
        ],
    );
    println!(
        "packed ({nodes} nodes x 2 pods of 1500m, nothing can move): one decision {:.3} s, {} disrupted",
        secs(packed.first_took),
        packed.first_decided
    );
    let targets = vec![
        Target {
            name: "multi-node decision over the fleet (s)".into(),
            measured: multi.first_took.as_secs_f64(),
            bound: 2.0,
            at_least: false,
        },
        Target {
            name: "multi-node decision, packed fleet (s)".into(),
            measured: packed.first_took.as_secs_f64(),
            bound: 2.0,
            at_least: false,
        },
    ];
    report::print_targets(&targets);
    report::write_json(
        mode,
        "consolidation",
        json!({
            "benchmark": "consolidation",
            "nodes": nodes,
            "multi": multi.json(),
            "single": single.json(),
            "packed_first_decision_s": secs(packed.first_took),
            "packed_first_disrupted": packed.first_decided,
            "targets": targets.iter().map(Target::json).collect::<Vec<_>>(),
        }),
    );
    assert!(
        multi.left() <= single.left(),
        "multi-node consolidation ended with more nodes ({}) than single-node only ({})",
        multi.left(),
        single.left()
    );
}

struct Run {
    first_took: Duration,
    first_decided: usize,
    /// Nodes left after each round (index 0: before the first).
    nodes: Vec<usize>,
    /// Wall time of each evaluation.
    took: Vec<Duration>,
}

impl Run {
    fn after(&self, rounds: usize) -> usize {
        self.nodes[rounds.min(self.nodes.len() - 1)]
    }
    fn left(&self) -> usize {
        self.nodes.last().copied().unwrap_or(0)
    }
    fn rounds(&self) -> usize {
        self.nodes.len() - 1
    }
    fn json(&self) -> serde_json::Value {
        let max = self.took.iter().max().copied().unwrap_or_default();
        json!({
            "first_decision_s": secs(self.first_took),
            "first_disrupted": self.first_decided,
            "nodes_before": self.nodes[0],
            "nodes_after_1": self.after(1),
            "nodes_after_60": self.after(60),
            "nodes_at_end": self.left(),
            "rounds": self.rounds(),
            "slowest_decision_s": secs(max),
        })
    }
}

fn pod(name: &str, cpu_m: u32, node: &str) -> Pod {
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
            node_name: Some(node.into()),
            containers: vec![Container {
                name: "c".into(),
                resources: Some(ResourceRequirements {
                    requests: Some(BTreeMap::from([
                        ("cpu".to_string(), Quantity(format!("{cpu_m}m"))),
                        ("memory".to_string(), Quantity("1Gi".into())),
                    ])),
                    ..Default::default()
                }),
                ..Default::default()
            }],
            ..Default::default()
        }),
        status: Some(PodStatus {
            phase: Some("Running".into()),
            ..Default::default()
        }),
    }
}

async fn wait(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + LIMIT;
    while !done() {
        assert!(Instant::now() < deadline, "{what}: not within {LIMIT:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Build the fleet, then run disruption rounds (at most `max_rounds`), carrying each decision
/// out at once, until a round decides nothing.
async fn run(nodes: usize, per_node: usize, cpu_m: u32, multi: bool, max_rounds: usize) -> Run {
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
    cluster
        .create(&node_pool("default", "pool"))
        .await
        .expect("nodepool");
    let an_hour_ago = Time(clock.now() - jiff::SignedDuration::from_hours(1));
    let alloc = BTreeMap::from([
        ("cpu".to_string(), Quantity("4".into())),
        ("memory".to_string(), Quantity("16Gi".into())),
        ("pods".to_string(), Quantity("110".into())),
    ]);
    // Node name → cpu used (milli), as the bench's own scheduler sees it.
    let mut used: BTreeMap<String, u32> = BTreeMap::new();
    let mut serial = 0usize;
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
        for _ in 0..per_node {
            serial += 1;
            cluster
                .create(&pod(&format!("p{serial:06}"), cpu_m, &name))
                .await
                .expect("pod");
        }
        used.insert(name, per_node as u32 * cpu_m);
    }
    let state = ClusterState::new(clock.clone());
    let tasks = state.start(&cluster);
    let pods_total = nodes * per_node;
    wait("state synced", || {
        let st = state.read();
        st.synced() && st.pods.len() >= pods_total && st.nodeclaims.len() >= nodes
    })
    .await;
    let ctx = Context::new(
        cluster.clone(),
        Arc::new(SimTransport::new(cluster.clone())),
        clock,
        Config::default(),
        Some(3),
    );
    let cfg = KarpenterConfig {
        multi_node_consolidation: multi,
        ..KarpenterConfig::default()
    };
    let mut out = Run {
        first_took: Duration::ZERO,
        first_decided: 0,
        nodes: vec![nodes],
        took: vec![],
    };
    for round in 0..max_rounds {
        let t = Instant::now();
        let done = disruption::run_once(&ctx, &state, &cfg)
            .await
            .expect("disruption round");
        let took = t.elapsed();
        out.took.push(took);
        if round == 0 {
            out.first_took = took;
            out.first_decided = done.len();
        }
        if done.is_empty() {
            break;
        }
        carry_out(&cluster, &state, &mut used, &mut serial, &done, cpu_m).await;
        let left = used.len();
        wait("state caught up", || {
            let st = state.read();
            st.nodeclaims.len() == left && st.pods.len() == pods_total
        })
        .await;
        out.nodes.push(left);
    }
    for t in tasks {
        t.abort();
    }
    out
}

/// What the termination controller and kube-scheduler would do with the disrupted claims:
/// their nodes and claims deleted, their pods created again, bound first-fit to the nodes
/// left.
async fn carry_out(
    cluster: &MemoryCluster,
    state: &ClusterState,
    used: &mut BTreeMap<String, u32>,
    serial: &mut usize,
    done: &[(String, disruption::Reason)],
    cpu_m: u32,
) {
    let mut moving = 0usize;
    for (claim, _) in done {
        let node = state
            .read()
            .nodeclaims
            .get(claim)
            .and_then(|nc| nc.status.as_ref()?.node_name.clone())
            .expect("the claim's node");
        let on: Vec<String> = state
            .read()
            .pods_on(&node)
            .filter_map(|p| p.metadata.name.clone())
            .collect();
        for p in &on {
            cluster
                .delete::<Pod>(Some("default"), p, None)
                .await
                .expect("delete pod");
        }
        moving += on.len();
        cluster
            .delete::<Node>(None, &node, None)
            .await
            .expect("delete node");
        let _ = cluster
            .patch::<NodeClaim>(None, claim, &json!({"metadata": {"finalizers": null}}))
            .await;
        let _ = cluster.delete::<NodeClaim>(None, claim, None).await;
        used.remove(&node);
    }
    for _ in 0..moving {
        let target = used
            .iter()
            .find(|(_, u)| **u + cpu_m <= NODE_CPU_M)
            .map(|(n, _)| n.clone())
            .expect("the disrupted pods fit on the nodes left");
        *serial += 1;
        cluster
            .create(&pod(&format!("p{serial:06}"), cpu_m, &target))
            .await
            .expect("pod");
        *used.entry(target).or_default() += cpu_m;
    }
}
