//! Issue #6 acceptance, grown by #21 (S55, S56): 5,000 pending pods with zone spread,
//! anti-affinity and minValues over 500 hosts in 4 classes and 3 zones; every constraint is
//! checked from the final bindings; then demand drops to zero and every host returns to the
//! warm pool.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use kpssh::api::karpenter::{Budget, INSTANCE_TYPE_LABEL};
use kpssh::api::quantity;
use kpssh::api::{HostState, NodeClaim};
use kpssh::k8s::Cluster;

use super::scheduling::{ZONE, anti, app_pod, node_labels, req, spread};
use super::*;

const PODS: usize = 5000;
const HOSTNAME: &str = "kubernetes.io/hostname";

/// The workload: (app, pods, cpu, memory, what it asks for).
/// - web: zone spread, maxSkew 1;
/// - api: zone spread, maxSkew 2, and at most 4 per node (hostname spread);
/// - db: one per node (hostname anti-affinity);
/// - lead: one per zone (zone anti-affinity);
/// - batch: nothing.
const APPS: [(&str, usize, &str, &str); 5] = [
    ("web", 2500, "500m", "512Mi"),
    ("api", 1200, "500m", "512Mi"),
    ("db", 150, "1", "1Gi"),
    ("lead", 3, "1", "1Gi"),
    ("batch", 1147, "500m", "256Mi"),
];

#[tokio::test(start_paused = true)]
async fn acceptance_5000_pods_500_hosts_4_classes_then_back_to_warm() {
    let wall = Instant::now();
    let e = env().await;
    let classes = [
        ("c2", 2u32, 4u64),
        ("c4", 4, 8),
        ("c8", 8, 16),
        ("c16", 16, 32),
    ];
    // Each class spreads over three zones (the hosts' topology.kubernetes.io/zone label).
    let zones = ["a", "b", "c"];
    for (i, (class, cpu, gib)) in classes.iter().enumerate() {
        for (j, z) in zones.iter().enumerate() {
            let n = 125 / 3 + usize::from(j < 125 % 3);
            hosts_labelled(
                &e,
                &format!("{class}-{z}-"),
                class,
                n,
                *cpu,
                *gib,
                80 + (i * 3 + j) as u8,
                &[(ZONE, z)],
            )
            .await;
        }
    }
    wait_available(&e, 500).await;
    // Two pools: a heavier one capped at 1000 cpu whose nodes must be able to take any of at
    // least two instance types (minValues), and an uncapped fallback.
    let mut capped = nodepool("capped");
    capped.spec.weight = Some(10);
    capped
        .spec
        .limits
        .insert("cpu".into(), Quantity("1000".into()));
    capped.spec.template.spec.requirements = vec![req(
        INSTANCE_TYPE_LABEL,
        "In",
        &["c2", "c4", "c8", "c16"],
        Some(2),
    )];
    let mut rest = nodepool("rest");
    for np in [&mut capped, &mut rest] {
        np.spec.disruption.consolidate_after = Some("5m".into());
        np.spec.disruption.budgets = vec![Budget {
            nodes: "100%".into(),
            ..Default::default()
        }];
    }
    e.w.cluster.create(&capped).await.expect("np");
    e.w.cluster.create(&rest).await.expect("np");
    let t0 = e.w.ctx.clock.now();
    let mut n = 0;
    for (app, count, cpu, mem) in APPS {
        for _ in 0..count {
            let mut p = app_pod(&format!("p{n:04}"), app, cpu);
            let c = p.spec.as_mut().and_then(|s| s.containers.first_mut());
            if let Some(r) = c
                .and_then(|c| c.resources.as_mut())
                .and_then(|r| r.requests.as_mut())
            {
                r.insert("memory".into(), Quantity(mem.into()));
            }
            match app {
                "web" => spread(&mut p, ZONE, 1),
                "api" => {
                    spread(&mut p, ZONE, 2);
                    spread(&mut p, HOSTNAME, 4);
                }
                "db" => anti(&mut p, HOSTNAME, "db"),
                "lead" => anti(&mut p, ZONE, "lead"),
                _ => {}
            }
            e.w.cluster.create(&p).await.expect("pod");
            n += 1;
        }
    }
    assert_eq!(n, PODS);
    let ok =
        e.w.until(30 * MINUTE, || async { running(&e).await == PODS })
            .await;
    let up = e.w.ctx.clock.since(t0);
    let cs: Vec<NodeClaim> = claims(&e).await;
    assert!(
        ok,
        "all pods running: {} of {PODS}; {} claims; {:?}",
        running(&e).await,
        cs.len(),
        reasons(&e)
            .iter()
            .filter(|r| r.contains("Fail") || r.contains("Unsupported"))
            .collect::<BTreeSet<_>>()
    );
    // Every constraint, from the final bindings.
    let labels = node_labels(&e).await;
    let all = pods(&e).await;
    let app_of = |p: &k8s_openapi::api::core::v1::Pod| {
        p.metadata
            .labels
            .as_ref()
            .and_then(|l| l.get("app"))
            .cloned()
            .unwrap_or_default()
    };
    let mut per: BTreeMap<(String, String, String), usize> = BTreeMap::new();
    for p in &all {
        let node = p
            .spec
            .as_ref()
            .and_then(|s| s.node_name.clone())
            .unwrap_or_default();
        let zone = labels
            .get(&node)
            .and_then(|l| l.get(ZONE))
            .cloned()
            .unwrap_or_default();
        assert!(
            zones.contains(&zone.as_str()),
            "node {node} has its host's zone: {zone:?}"
        );
        *per.entry((app_of(p), "zone".into(), zone)).or_default() += 1;
        *per.entry((app_of(p), "node".into(), node)).or_default() += 1;
    }
    let counts = |app: &str, kind: &str| -> Vec<usize> {
        per.iter()
            .filter(|((a, k, _), _)| a == app && k == kind)
            .map(|(_, n)| *n)
            .collect()
    };
    let skew = |app: &str| {
        let c = counts(app, "zone");
        assert_eq!(c.len(), 3, "{app} in every zone");
        c.iter().max().copied().unwrap_or(0) - c.iter().min().copied().unwrap_or(0)
    };
    assert!(skew("web") <= 1, "web zone skew {}", skew("web"));
    assert!(skew("api") <= 2, "api zone skew {}", skew("api"));
    assert!(
        counts("api", "node").iter().all(|n| *n <= 4),
        "api: at most 4 per node"
    );
    assert!(
        counts("db", "node").iter().all(|n| *n == 1),
        "db: one per node"
    );
    assert!(
        counts("lead", "zone").iter().all(|n| *n == 1),
        "lead: one per zone"
    );
    for nc in cs.iter().filter(|c| c.nodepool() == Some("capped")) {
        let it = nc
            .spec
            .requirements
            .iter()
            .find(|r| r.key == INSTANCE_TYPE_LABEL)
            .expect("instance types");
        assert!(it.values.len() >= 2 && it.min_values == Some(2), "{it:?}");
    }
    // No limit exceeded, no class over-claimed, no pod provisioned twice.
    let mut per_pool: BTreeMap<String, i128> = BTreeMap::new();
    let mut per_class: BTreeMap<String, usize> = BTreeMap::new();
    for nc in &cs {
        let cpu = nc
            .status
            .as_ref()
            .and_then(|s| s.capacity.get("cpu"))
            .and_then(quantity::parse)
            .unwrap_or(0);
        *per_pool
            .entry(nc.nodepool().unwrap_or_default().to_string())
            .or_default() += cpu;
        let class = nc
            .metadata
            .labels
            .as_ref()
            .and_then(|l| l.get(INSTANCE_TYPE_LABEL))
            .cloned()
            .unwrap_or_default();
        *per_class.entry(class).or_default() += 1;
    }
    assert!(
        per_pool.get("capped").copied().unwrap_or(0) <= 1_000_000,
        "{per_pool:?}"
    );
    for (class, n) in &per_class {
        assert!(*n <= 125, "class {class} over-claimed: {n}");
    }
    let nodes: BTreeSet<String> = pods(&e)
        .await
        .iter()
        .filter_map(|p| p.spec.as_ref().and_then(|s| s.node_name.clone()))
        .collect();
    let unused = cs.len() - nodes.len();
    let used_cpu: usize = per_pool.values().map(|v| (*v / 1000) as usize).sum();
    println!(
        "scale-up: {PODS} pods running in {up:?} virtual on {} NodeClaims ({unused} without pods); \
         per class {per_class:?}; cpu per pool {per_pool:?} (milli); {used_cpu} cpu for {} requested; \
         wall time {:?}",
        cs.len(),
        APPS.iter()
            .map(|(_, n, cpu, _)| *n as f64 * if *cpu == "1" { 1.0 } else { 0.5 })
            .sum::<f64>(),
        wall.elapsed()
    );
    // No batch is provisioned twice: a round re-places pending pods where an earlier one
    // planned them first. Some claims still end idle: the scheduler binds pods first fit as
    // nodes come up, not as planned (unconstrained pods take room planned for spread ones,
    // whose zone is then full), and the pods displaced get new nodes; consolidation removes
    // the idle ones. Measured: 12 of 447 (debug build: 49 s wall, 41 s CPU on the shared 2-core machine).
    assert!(
        unused * 100 <= cs.len() * 4,
        "at most 4% of the claims idle: {unused} of {}",
        cs.len()
    );

    // Demand drops to zero.
    let t1 = e.w.ctx.clock.now();
    for i in 0..PODS {
        e.w.cluster
            .delete::<k8s_openapi::api::core::v1::Pod>(Some("default"), &format!("p{i:04}"), None)
            .await
            .expect("delete");
    }
    let limit = Duration::from_secs(5 * 60) + 10 * MINUTE;
    let ok =
        e.w.until(limit, || async {
            host_states(&e).await.get(&HostState::Available) == Some(&500)
                && claims(&e).await.is_empty()
        })
        .await;
    let down = e.w.ctx.clock.since(t1);
    assert!(
        ok,
        "all hosts warm again: {:?}, {} claims left",
        host_states(&e).await,
        claims(&e).await.len()
    );
    println!(
        "scale-down: 500 hosts Available {down:?} virtual after demand went to zero \
         (consolidateAfter 5m); wall time {:?}",
        wall.elapsed()
    );
}
