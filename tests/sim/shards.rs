//! Sharding (issue #26 item 2): a controller started with `--node-classes` manages only the
//! hosts its classes select and the NodeClaims of its classes; two shards on one cluster never
//! touch each other's hosts or NodeClaims; a host selected by classes of two shards is left
//! alone and reported.

use std::collections::BTreeMap;
use std::sync::Arc;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use kpssh::api::{HOST_CLASS_LABEL, HostState, NodeClaim, SSHHost, SSHNodeClass};
use kpssh::k8s::Cluster;
use kpssh::provider::{Config, Context};
use kpssh::sim::SimHost;
use kpssh::sim::world::{World, node_claim, node_class, sim_profile};

use super::{MINUTE, reasons, wait_state};

/// Class `name` selecting the hosts labelled with host class `h<name>`; `None`: every host.
fn class(name: &str, selects: Option<&str>) -> SSHNodeClass {
    let mut c = node_class(name, "p");
    c.spec.host_selector = selects.map(|h| LabelSelector {
        match_labels: Some(BTreeMap::from([(
            HOST_CLASS_LABEL.to_string(),
            h.to_string(),
        )])),
        ..Default::default()
    });
    c
}

async fn shard_world(owned: &[&str]) -> World {
    let config = Config {
        node_classes: owned.iter().map(|s| s.to_string()).collect(),
        ..Config::default()
    };
    let w = World::start(config, 7).await.expect("world starts");
    w.cluster
        .create(&sim_profile("p", "1"))
        .await
        .expect("profile");
    w
}

async fn holder_of(w: &World, host: &str) -> Option<String> {
    w.host(host)
        .await
        .and_then(|h| h.claim().map(|c| c.name.clone()))
}

#[tokio::test(start_paused = true)]
async fn a_shard_probes_and_claims_only_for_its_own_node_classes() {
    let w = shard_world(&["a"]).await;
    w.cluster.create(&class("a", Some("ha"))).await.expect("a");
    w.cluster.create(&class("b", Some("hb"))).await.expect("b");
    w.add_host("ha-1", "ha", SimHost::new("10.1.0.1", 4, 8_000_000))
        .await
        .expect("host");
    w.add_host("hb-1", "hb", SimHost::new("10.1.0.2", 4, 8_000_000))
        .await
        .expect("host");
    wait_state(&w, "ha-1", HostState::Available, MINUTE).await;
    for nc in [
        node_claim("nc-a", "a", "1", "1Gi"),
        node_claim("nc-b", "b", "1", "1Gi"),
    ] {
        w.cluster.create(&nc).await.expect("nodeclaim");
    }
    w.until(2 * MINUTE, || async {
        holder_of(&w, "ha-1").await.is_some()
    })
    .await;
    assert_eq!(holder_of(&w, "ha-1").await.as_deref(), Some("nc-a"));
    tokio::time::sleep(10 * MINUTE).await;
    // Another shard's host: never probed, never claimed, its status never written.
    let hb = w.host("hb-1").await.expect("hb-1");
    assert_eq!(hb.status, None, "hb-1 was touched: {:?}", hb.status);
    // Another shard's NodeClaim: no finalizer, no launch, no status from this shard.
    let nc: NodeClaim = w
        .cluster
        .get(None, "nc-b")
        .await
        .expect("get")
        .expect("nc-b");
    assert!(
        nc.metadata.finalizers.as_ref().is_none_or(|f| f.is_empty()),
        "{nc:?}"
    );
    assert_eq!(nc.status, None);
    // Another shard's class: its status is that shard's to write.
    let b: SSHNodeClass = w.cluster.get(None, "b").await.expect("get").expect("b");
    assert_eq!(b.status, None);
    let a: SSHNodeClass = w.cluster.get(None, "a").await.expect("get").expect("a");
    assert!(
        a.status.is_some(),
        "the shard's own class has its Ready condition"
    );
}

#[tokio::test(start_paused = true)]
async fn a_host_selected_by_two_shards_classes_is_left_alone_and_reported() {
    let w = shard_world(&["a"]).await;
    w.cluster.create(&class("a", Some("ha"))).await.expect("a");
    // Class `c` (another shard's) selects every host, `ha-1` among them.
    w.cluster.create(&class("c", None)).await.expect("c");
    w.add_host("ha-1", "ha", SimHost::new("10.1.0.1", 4, 8_000_000))
        .await
        .expect("host");
    // A NodeClaim of the shard's class finds no host of its own (the only candidate overlaps)
    // and is not given the overlapping one.
    w.cluster
        .create(&node_claim("nc-a", "a", "1", "1Gi"))
        .await
        .expect("nodeclaim");
    tokio::time::sleep(5 * MINUTE).await;
    let h = w.host("ha-1").await.expect("ha-1");
    assert_eq!(h.status, None, "an overlapping host is left alone");
    let events = w.cluster.events();
    let overlap: Vec<_> = events
        .iter()
        .filter(|e| e.reason == "ShardOverlap")
        .collect();
    assert_eq!(overlap.len(), 1, "reported once: {:?}", reasons(&w));
    for needle in [
        "ha-1",
        "SSHNodeClass a",
        "SSHNodeClass c",
        "--node-classes=a",
    ] {
        assert!(
            overlap[0].message.contains(needle),
            "{needle}: {}",
            overlap[0].message
        );
    }
    assert_eq!(w.ctx.metrics.shard_overlapping_hosts.get(), 1);

    // The fix the event names: class `c` no longer selects it. The host becomes the shard's.
    let mut c: SSHNodeClass = w.cluster.get(None, "c").await.expect("get").expect("c");
    c.spec.host_selector = class("c", Some("hc")).spec.host_selector;
    w.cluster.replace(&c).await.expect("narrow c");
    wait_state(&w, "ha-1", HostState::Available, 5 * MINUTE).await;
    w.cluster
        .create(&node_claim("nc-a2", "a", "1", "1Gi"))
        .await
        .expect("nodeclaim");
    wait_state(&w, "ha-1", HostState::InUse, 5 * MINUTE).await;
    assert_eq!(holder_of(&w, "ha-1").await.as_deref(), Some("nc-a2"));
    assert_eq!(w.ctx.metrics.shard_overlapping_hosts.get(), 0);
}

#[tokio::test(start_paused = true)]
async fn two_shards_on_one_cluster_never_touch_each_others_hosts_or_nodeclaims() {
    let w = shard_world(&["a"]).await;
    // Shard B: a second controller (actor core and karpenter layer) on the same cluster and
    // hosts, owning class `b`.
    let config_b = Config {
        node_classes: vec!["b".into()],
        ..Config::default()
    };
    let ctx_b = Context::new(
        w.cluster.clone(),
        Arc::new(w.transport.clone()),
        w.ctx.clock.clone(),
        config_b,
        Some(8),
    );
    let _b = kpssh::actors::spawn_controller(&ctx_b)
        .await
        .expect("shard b");
    let _kb = kpssh::karpenter::spawn(&ctx_b)
        .await
        .expect("shard b karpenter");
    w.cluster.create(&class("a", Some("ha"))).await.expect("a");
    w.cluster.create(&class("b", Some("hb"))).await.expect("b");
    for i in 0..3 {
        for hc in ["ha", "hb"] {
            let ip = format!("10.1.{}.{i}", if hc == "ha" { 1 } else { 2 });
            w.add_host(&format!("{hc}-{i}"), hc, SimHost::new(&ip, 4, 8_000_000))
                .await
                .expect("host");
        }
    }
    for i in 0..3 {
        for hc in ["ha", "hb"] {
            wait_state(&w, &format!("{hc}-{i}"), HostState::Available, 2 * MINUTE).await;
        }
    }
    for i in 0..2 {
        for c in ["a", "b"] {
            let nc = node_claim(&format!("nc-{c}-{i}"), c, "1", "1Gi");
            w.cluster.create(&nc).await.expect("nodeclaim");
        }
    }
    let claimed = || async {
        let hosts: Vec<SSHHost> = w.cluster.list(Some(&w.ns()), None).await.expect("list");
        hosts
            .iter()
            .filter(|h| h.state() == HostState::InUse)
            .count()
    };
    assert!(
        w.until(10 * MINUTE, || async { claimed().await == 4 })
            .await,
        "4 NodeClaims in use"
    );
    tokio::time::sleep(20 * MINUTE).await;
    let hosts: Vec<SSHHost> = w.cluster.list(Some(&w.ns()), None).await.expect("list");
    for h in &hosts {
        if let Some(c) = h.claim() {
            // nc-<class>-i on a host of class h<class>.
            let class = c.name.split('-').nth(1).unwrap_or_default();
            assert_eq!(
                h.class(),
                format!("h{class}"),
                "{} holds {}",
                h.metadata.name.as_deref().unwrap_or(""),
                c.name
            );
        }
    }
    let ncs: Vec<NodeClaim> = w.cluster.list(None, None).await.expect("list");
    assert_eq!(ncs.len(), 4, "no shard deleted another's NodeClaim");
    assert_eq!(claimed().await, 4, "claims held: none released as stale");
    // Each shard runs the actors of its own three hosts and made the claims of its own two
    // NodeClaims.
    assert_eq!(w.ctx.metrics.host_actors.get(), 3, "shard a's host actors");
    assert_eq!(ctx_b.metrics.host_actors.get(), 3, "shard b's host actors");
    assert_eq!(w.ctx.metrics.claims.get(), 2, "shard a's claims");
    assert_eq!(ctx_b.metrics.claims.get(), 2, "shard b's claims");
    let r = reasons(&w);
    assert!(!r.iter().any(|r| r == "StaleClaimReleased"), "{r:?}");
    assert!(!r.iter().any(|r| r == "ShardOverlap"), "{r:?}");
}
