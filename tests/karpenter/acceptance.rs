//! Issue #6 acceptance: 5,000 pending pods over 500 hosts in 4 classes; then demand drops to
//! zero and every host returns to the warm pool.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use kpssh::api::karpenter::{Budget, INSTANCE_TYPE_LABEL};
use kpssh::api::{HostState, NodeClaim};
use kpssh::k8s::Cluster;
use kpssh::karpenter::quantity;

use super::*;

const PODS: usize = 5000;

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
    for (i, (class, cpu, gib)) in classes.iter().enumerate() {
        hosts(
            &e,
            &format!("{class}-"),
            class,
            125,
            *cpu,
            *gib,
            80 + i as u8,
        )
        .await;
    }
    wait_available(&e, 500).await;
    // Two pools: a heavier one capped at 1000 cpu, and an uncapped fallback.
    let mut capped = nodepool("capped");
    capped.spec.weight = Some(10);
    capped
        .spec
        .limits
        .insert("cpu".into(), Quantity("1000".into()));
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
    for i in 0..PODS {
        e.w.cluster
            .create(&pod(&format!("p{i:04}"), "500m", "512Mi"))
            .await
            .expect("pod");
    }
    let ok =
        e.w.until(30 * MINUTE, || async { running(&e).await == PODS })
            .await;
    let up = e.w.ctx.clock.since(t0);
    let cs: Vec<NodeClaim> = claims(&e).await;
    assert!(
        ok,
        "all pods running: {} of {PODS}; {} claims",
        running(&e).await,
        cs.len()
    );
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
         per class {per_class:?}; cpu per pool {per_pool:?} (milli); {used_cpu} cpu for {} requested",
        cs.len(),
        PODS / 2
    );
    assert!(
        unused <= 1,
        "no batch provisioned twice: {unused} idle claims"
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
