//! S58: NodePool status as core v1 writes it. `status.resources` is the capacity of the pool's
//! nodes summed plus a `nodes` resource, over a base of cpu/memory/pods/ephemeral-storage/nodes
//! at zero (core's `nodepool.counter`); `status.nodes` is that count; the status is written
//! only when it changes. A node class that is not Ready (its join profile deleted) blocks the
//! pool's launches — no NodeClaim is created and deleted again — and the pool's
//! NodeClassReady=False names why.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Node;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use kpssh::api::{NodePool, SSHJoinProfile};
use kpssh::k8s::Cluster;
use kpssh::karpenter::quantity;

use super::*;

async fn pool(e: &Env, name: &str) -> NodePool {
    e.w.cluster
        .get(None, name)
        .await
        .expect("get")
        .expect("the NodePool")
}

/// `status.resources` of pool `name` as milli-units, and `status.nodes`.
async fn counted(e: &Env, name: &str) -> (BTreeMap<String, i128>, Option<i64>) {
    let st = pool(e, name).await.status.unwrap_or_default();
    let r = st
        .resources
        .iter()
        .map(|(k, v)| (k.clone(), quantity::parse(v).expect("a quantity")))
        .collect();
    (r, st.nodes)
}

/// What the pool's launched claims recorded as their capacity, summed, with `nodes`.
async fn claim_sum(e: &Env) -> BTreeMap<String, i128> {
    let mut sum = zero();
    for c in claims(e).await {
        let cap = c.status.map(|s| s.capacity).unwrap_or_default();
        for (k, v) in cap {
            *sum.entry(k).or_insert(0) += quantity::parse(&v).expect("capacity");
        }
        *sum.entry("nodes".into()).or_insert(0) += 1000;
    }
    sum
}

fn zero() -> BTreeMap<String, i128> {
    ["cpu", "memory", "pods", "ephemeral-storage", "nodes"]
        .into_iter()
        .map(|k| (k.to_string(), 0))
        .collect()
}

fn pool_writes(e: &Env) -> u64 {
    e.w.cluster
        .stats()
        .status_writes_by_kind
        .get("NodePool")
        .copied()
        .unwrap_or(0)
}

#[tokio::test(start_paused = true)]
async fn s58_nodepool_status_counts_its_nodes_capacity_and_number() {
    let e = env().await;
    hosts(&e, "h", "small", 3, 2, 4, 58).await;
    let mut np = nodepool("default");
    np.spec.disruption.consolidate_after = Some("Never".into());
    e.w.cluster.create(&np).await.expect("nodepool");
    // No node yet: core's base resources at zero, and zero nodes.
    assert!(
        e.w.until(MINUTE, || async {
            counted(&e, "default").await == (zero(), Some(0))
        })
        .await,
        "the base at zero: {:?}",
        counted(&e, "default").await
    );

    // Two pods that need a host each: two nodes, their capacity summed.
    for i in 0..2 {
        e.w.cluster
            .create(&pod(&format!("p{i}"), "1500m", "1Gi"))
            .await
            .expect("pod");
    }
    assert!(
        e.w.until(5 * MINUTE, || async { running(&e).await == 2 })
            .await,
        "both pods run"
    );
    let ok =
        e.w.until(MINUTE, || async {
            let (r, n) = counted(&e, "default").await;
            n == Some(2) && r == claim_sum(&e).await
        })
        .await;
    let (r, n) = counted(&e, "default").await;
    assert!(
        ok,
        "resources {r:?} nodes {n:?}; the claims hold {:?}",
        claim_sum(&e).await
    );
    assert_eq!(r["nodes"], 2000);
    assert_eq!(r["cpu"], 4000, "two hosts of 2 cores: {r:?}");
    assert!(r["memory"] > 0 && r["pods"] > 0, "{r:?}");
    let status = pool(&e, "default").await.status.unwrap_or_default();
    assert_eq!(status.resources["cpu"].0, "4", "a Kubernetes quantity");

    // An initialized Node's own capacity wins over its claim's (core's StateNode.Capacity).
    let nodes: Vec<Node> = e.w.cluster.list(None, None).await.expect("nodes");
    let mut node = nodes
        .into_iter()
        .find(|n| {
            n.metadata.labels.as_ref().is_some_and(|l| {
                l.get("karpenter.sh/nodepool").map(String::as_str) == Some("default")
            })
        })
        .expect("a Node of the pool");
    let status = node.status.get_or_insert_with(Default::default);
    status.capacity = Some(BTreeMap::from([
        ("cpu".to_string(), Quantity("3".into())),
        ("memory".to_string(), Quantity("2Gi".into())),
        ("pods".to_string(), Quantity("50".into())),
    ]));
    e.w.cluster
        .replace_status(&node)
        .await
        .expect("node capacity");
    let other_cpu = r["cpu"] - 2000;
    let ok =
        e.w.until(MINUTE, || async {
            counted(&e, "default").await.0.get("cpu") == Some(&(other_cpu + 3000))
        })
        .await;
    assert!(
        ok,
        "the Node's cpu counted: {:?}",
        counted(&e, "default").await
    );

    // Steady: no write at all while nothing changes.
    let (writes, rv) = (
        pool_writes(&e),
        pool(&e, "default").await.metadata.resource_version,
    );
    tokio::time::sleep(3 * MINUTE).await;
    assert_eq!(pool_writes(&e), writes, "no status write without a change");
    assert_eq!(pool(&e, "default").await.metadata.resource_version, rv);

    // A claim being deleted no longer counts (core's MarkedForDeletion); all gone: zero again.
    let names: Vec<String> = claims(&e)
        .await
        .iter()
        .filter_map(|c| c.metadata.name.clone())
        .collect();
    e.w.cluster
        .delete::<NodeClaim>(None, &names[0], None)
        .await
        .expect("delete one claim");
    let ok =
        e.w.until(MINUTE, || async {
            let (r, n) = counted(&e, "default").await;
            n == Some(1) && r.get("cpu").is_some_and(|c| *c == 2000 || *c == 3000)
        })
        .await;
    assert!(ok, "one node left: {:?}", counted(&e, "default").await);
    e.w.cluster
        .delete::<NodeClaim>(None, &names[1], None)
        .await
        .expect("delete the other");
    let ok =
        e.w.until(MINUTE, || async {
            counted(&e, "default").await == (zero(), Some(0))
        })
        .await;
    assert!(ok, "zero again: {:?}", counted(&e, "default").await);
}

#[tokio::test(start_paused = true)]
async fn s58_a_class_without_its_profile_blocks_launches_and_the_pool_says_why() {
    let e = env().await;
    hosts(&e, "h", "small", 1, 2, 4, 59).await;
    e.w.cluster
        .delete::<SSHJoinProfile>(None, "p", None)
        .await
        .expect("delete the profile");
    e.w.cluster
        .create(&nodepool("default"))
        .await
        .expect("nodepool");
    e.w.cluster
        .create(&pod("p0", "1", "1Gi"))
        .await
        .expect("pod");
    let class_ready = || async {
        let conds = pool(&e, "default")
            .await
            .status
            .map(|s| s.conditions)
            .unwrap_or_default();
        let get = |t: &str| {
            conds
                .iter()
                .find(|c| c.type_ == t)
                .map(|c| (c.status.clone(), c.reason.clone(), c.message.clone()))
        };
        (get("NodeClassReady"), get("Ready"))
    };
    let ok =
        e.w.until(MINUTE, || async {
            class_ready().await.0.is_some_and(|c| c.0 == "False")
        })
        .await;
    let (ncr, ready) = class_ready().await;
    assert!(ok, "NodeClassReady=False: {ncr:?}");
    let (_, reason, msg) = ncr.expect("NodeClassReady");
    assert_eq!(reason, "ProfileNotFound");
    assert!(
        msg.contains("SSHNodeClass pool") && msg.contains("SSHJoinProfile p not found"),
        "{msg}"
    );
    let ready = ready.expect("Ready");
    assert_eq!(
        (ready.0.as_str(), ready.2.as_str()),
        ("False", "NodeClassReady=False")
    );
    // Five minutes of provisioning rounds: no NodeClaim created (and deleted) at all.
    let creates = e.w.cluster.stats().creates;
    for _ in 0..30 {
        tokio::time::sleep(std::time::Duration::from_secs(10)).await;
        assert!(claims(&e).await.is_empty(), "no NodeClaim");
    }
    assert!(
        !reasons(&e).iter().any(|r| r == "Launching"),
        "nothing launched"
    );
    assert_eq!(
        e.w.cluster.stats().creates,
        creates,
        "no object created (a NodeClaim created and deleted again would count)"
    );
    assert!(
        e.w.cluster
            .events()
            .iter()
            .any(|ev| ev.regarding.kind == "NodePool" && ev.reason == "ProfileNotFound"),
        "a Warning event on the NodePool"
    );
    // The profile back: the class and the pool go Ready and the pod runs.
    e.w.cluster
        .create(&kpssh::sim::world::sim_profile("p", "1"))
        .await
        .expect("profile again");
    let ok =
        e.w.until(3 * MINUTE, || async { running(&e).await == 1 })
            .await;
    assert!(ok, "the pod runs once the profile exists");
    assert_eq!(
        class_ready().await.1.map(|r| r.0).as_deref(),
        Some("True"),
        "the pool is Ready"
    );
}
