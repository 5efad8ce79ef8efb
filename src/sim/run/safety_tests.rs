//! Tests of `safety.rs` (kept apart to keep that file short).

use super::*;
use crate::actors::events;
use crate::k8s::EventType;
use crate::sim::scenario::{IntOrPercent, SimPdb};
use crate::sim::workload::{group, pdb};
use crate::sim::world::{node_claim, workload_pod};
use k8s_openapi::api::core::v1::{NodeCondition, NodeStatus, PodStatus};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

struct Bench {
    cluster: MemoryCluster,
    clock: Clock,
    own: OwnDeletions,
    log: SafetyLog,
}

async fn bench() -> Bench {
    let clock = Clock::simulated("2026-01-01T00:00:00Z".parse().expect("time"));
    let cluster = MemoryCluster::new(clock.clone());
    let own = OwnDeletions::default();
    let (log, _task) = spawn(
        &cluster,
        clock.clone(),
        SimTransport::new(cluster.clone()),
        own.clone(),
        Duration::from_secs(1800),
    );
    Bench {
        cluster,
        clock,
        own,
        log,
    }
}

impl Bench {
    async fn settle(&self) {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }

    fn found(&self) -> Vec<String> {
        lock(&self.log.violations)
            .iter()
            .map(|v| format!("{}: {}", v.invariant, v.message))
            .collect()
    }

    /// A running pod of demand entry 0 on `node`, with do-not-disrupt if asked.
    async fn pod(&self, name: &str, node: &str, dnd: bool) {
        let mut p = workload_pod(name, ("p", &group(0)), "1", "1Gi");
        p.spec.as_mut().expect("spec").node_name = Some(node.into());
        if dnd {
            (p.metadata.annotations.get_or_insert_with(Default::default))
                .insert("karpenter.sh/do-not-disrupt".into(), "true".into());
        }
        let p = self.cluster.create(&p).await.expect("pod");
        let mut p2 = p.clone();
        p2.status = Some(PodStatus {
            phase: Some("Running".into()),
            ..Default::default()
        });
        self.cluster.replace_status(&p2).await.expect("running");
    }

    async fn node(&self, name: &str, ready: &str, since: Timestamp) {
        let node = Node {
            metadata: kube::api::ObjectMeta {
                name: Some(name.into()),
                ..Default::default()
            },
            spec: None,
            status: None,
        };
        let mut n = self.cluster.create(&node).await.expect("node");
        n.status = Some(NodeStatus {
            conditions: Some(vec![NodeCondition {
                type_: "Ready".into(),
                status: ready.into(),
                last_transition_time: Some(Time(since)),
                ..Default::default()
            }]),
            ..Default::default()
        });
        self.cluster.replace_status(&n).await.expect("node status");
    }
}

fn max_unavailable(n: i32) -> PodDisruptionBudget {
    pdb(
        0,
        &SimPdb {
            max_unavailable: Some(IntOrPercent::Int(n)),
            min_available: None,
        },
    )
}

/// A pod deleted beyond its PDB is a violation; one the budget allows, one the simulation
/// deletes itself, and one past its NodeClaim's deadline are not.
#[tokio::test(start_paused = true)]
async fn pdb_respected_judges_each_deletion_against_the_budget() {
    let b = bench().await;
    b.cluster.create(&max_unavailable(1)).await.expect("pdb");
    for n in ["a", "b", "c"] {
        b.pod(n, "n1", false).await;
    }
    b.settle().await;
    // Allowed: one of three may go.
    b.cluster
        .delete::<Pod>(Some("default"), "a", None)
        .await
        .expect("a");
    b.settle().await;
    assert!(b.found().is_empty(), "{:?}", b.found());
    // The simulation's own scale-down is not the controller's doing.
    b.own.note("b");
    b.cluster
        .delete::<Pod>(Some("default"), "b", None)
        .await
        .expect("b");
    b.settle().await;
    assert!(b.found().is_empty(), "{:?}", b.found());
    // "c" and a pod "d" not yet Running: maxUnavailable 1 with one unhealthy allows none.
    let d = workload_pod("d", ("p", &group(0)), "1", "1Gi");
    b.cluster.create(&d).await.expect("d");
    b.cluster
        .delete::<Pod>(Some("default"), "c", None)
        .await
        .expect("c");
    b.settle().await;
    let found = b.found();
    assert_eq!(found.len(), 1, "{found:?}");
    assert!(
        found[0].starts_with("pdb-respected: default/c evicted or deleted"),
        "{found:?}"
    );
    // Past the claim's terminationGracePeriod deadline the budget no longer holds.
    let mut nc = node_claim("n1", "class", "1", "1Gi");
    nc.metadata.annotations = Some(std::collections::BTreeMap::from([(
        "karpenter.sh/nodeclaim-termination-timestamp".to_string(),
        "2026-01-01T00:00:00Z".to_string(),
    )]));
    b.cluster.create(&nc).await.expect("claim");
    // "e" on n1, "d" still pending: the budget allows nothing, but the deadline has come.
    b.pod("e", "n1", true).await;
    b.settle().await;
    b.cluster
        .delete::<Pod>(Some("default"), "e", None)
        .await
        .expect("e");
    b.settle().await;
    assert_eq!(b.found().len(), 1, "{:?}", b.found());
    // The same on a node whose claim has no deadline is judged (twice: PDB, do-not-disrupt).
    b.pod("f", "n9", true).await;
    b.settle().await;
    b.cluster
        .delete::<Pod>(Some("default"), "f", None)
        .await
        .expect("f");
    b.settle().await;
    assert_eq!(b.found().len(), 3, "{:?}", b.found());
}

/// Seeds 1057, 2228, 3572, 9513 and more: nodeadm names the Node after the machine, and a
/// claim deleted before registration recorded `status.nodeName` is tied to its Node by
/// provider ID only (as core ties them). Its deadline must still exempt the pods the
/// terminationGracePeriod deletes; the checker found no claim and blamed the controller.
#[tokio::test(start_paused = true)]
async fn a_claim_is_found_by_provider_id_for_its_deadline() {
    let b = bench().await;
    b.cluster.create(&max_unavailable(0)).await.expect("pdb");
    let mut n = Node::default();
    n.metadata.name = Some("mi-7".into());
    n.spec = Some(k8s_openapi::api::core::v1::NodeSpec {
        provider_id: Some("sim://adopted/10.0.0.7".into()),
        ..Default::default()
    });
    b.cluster.create(&n).await.expect("node");
    let mut nc = node_claim("c7", "class", "1", "1Gi");
    nc.metadata.annotations = Some(std::collections::BTreeMap::from([(
        "karpenter.sh/nodeclaim-termination-timestamp".to_string(),
        "2026-01-01T00:00:00Z".to_string(),
    )]));
    let mut nc = b.cluster.create(&nc).await.expect("claim");
    nc.status.get_or_insert_with(Default::default).provider_id =
        Some("sim://adopted/10.0.0.7".into());
    b.cluster.replace_status(&nc).await.expect("provider id");
    b.pod("a", "mi-7", true).await;
    b.settle().await;
    b.cluster
        .delete::<Pod>(Some("default"), "a", None)
        .await
        .expect("a");
    b.settle().await;
    assert!(b.found().is_empty(), "past the deadline: {:?}", b.found());
    // The same pod on a Node of that provider ID created before the claim is not its.
    let mut old = n.clone();
    old.metadata.name = Some("mi-old".into());
    old.metadata.creation_timestamp = Some(Time("2025-12-31T00:00:00Z".parse().expect("t")));
    b.cluster.create(&old).await.expect("old node");
    b.pod("b", "mi-old", false).await;
    b.settle().await;
    b.cluster
        .delete::<Pod>(Some("default"), "b", None)
        .await
        .expect("b");
    b.settle().await;
    assert_eq!(b.found().len(), 1, "{:?}", b.found());
}

/// Deleting a Node with a PDB-covered or do-not-disrupt pod on it loses them: both
/// invariants see it, unless the NodeClaim was force-deleted by the simulation.
#[tokio::test(start_paused = true)]
async fn a_node_deleted_under_its_pods_is_seen() {
    let b = bench().await;
    b.cluster.create(&max_unavailable(0)).await.expect("pdb");
    let now = b.clock.now();
    b.node("n1", "True", now).await;
    b.node("n2", "True", now).await;
    b.pod("a", "n1", true).await;
    b.pod("b", "n2", false).await;
    b.settle().await;
    b.own.note_claim("n2");
    b.cluster
        .delete::<Node>(None, "n2", None)
        .await
        .expect("n2");
    b.settle().await;
    assert!(b.found().is_empty(), "force-deleted: {:?}", b.found());
    // A Node that names itself (nodeadm's `mi-*`) of a force-deleted claim, which is gone
    // by then: its owner reference names the claim.
    b.node("mi-3", "True", now).await;
    let mut mi: Node = b
        .cluster
        .get(None, "mi-3")
        .await
        .expect("get")
        .expect("mi-3");
    mi.metadata.owner_references = Some(vec![
        k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference {
            api_version: "karpenter.sh/v1".into(),
            kind: "NodeClaim".into(),
            name: "c3".into(),
            uid: "u3".into(),
            ..Default::default()
        },
    ]);
    b.cluster.replace(&mi).await.expect("owned");
    b.pod("c", "mi-3", true).await;
    b.settle().await;
    b.own.note_claim("c3");
    b.cluster
        .delete::<Node>(None, "mi-3", None)
        .await
        .expect("mi-3");
    b.settle().await;
    assert!(b.found().is_empty(), "force-deleted, mi-*: {:?}", b.found());
    b.cluster
        .delete::<Node>(None, "n1", None)
        .await
        .expect("n1");
    b.settle().await;
    let found = b.found().join("\n");
    assert!(
        found.contains("do-not-disrupt-respected: pod default/a"),
        "{found}"
    );
    assert!(
        found.contains("pdb-respected: default/a lost with their Node"),
        "{found}"
    );
}

/// A voluntary disruption mark on a NodeClaim whose Node holds a do-not-disrupt pod is a
/// violation; an expiry mark (forceful) and drift of a claim with a grace period (core's
/// eventual class) are not.
#[tokio::test(start_paused = true)]
async fn do_not_disrupt_respected_judges_the_mark() {
    let b = bench().await;
    let cases = [
        ("n1", "Expired", None),
        ("n2", "Underutilized", None),
        ("n3", "Drifted", Some("10m")),
        ("n4", "Drifted", None),
    ];
    for (n, reason, grace) in cases {
        b.node(n, "True", b.clock.now()).await;
        b.pod(&format!("p-{n}"), n, true).await;
        let mut nc = node_claim(n, "class", "1", "1Gi");
        nc.spec.termination_grace_period = grace.map(String::from);
        b.cluster.create(&nc).await.expect("claim");
        b.settle().await;
        let patch =
            serde_json::json!({"metadata": {"annotations": {DISRUPTION_ANNOTATION: reason}}});
        b.cluster
            .patch::<NodeClaim>(None, n, &patch)
            .await
            .expect("mark");
        b.settle().await;
    }
    let found = b.found();
    assert_eq!(found.len(), 2, "{found:?}");
    assert!(
        found[0].contains("NodeClaim n2 marked for disruption (Underutilized)"),
        "{found:?}"
    );
    assert!(
        found[1].contains("NodeClaim n4 marked for disruption (Drifted)"),
        "{found:?}"
    );
}

/// A repair of a Node unhealthy for less than the toleration, or in a NodePool with more
/// than 20% of its nodes unhealthy, is a violation; one within both bounds is not.
#[tokio::test(start_paused = true)]
async fn repair_bounded_judges_toleration_and_share() {
    let b = bench().await;
    let long_ago = b.clock.now();
    tokio::time::sleep(Duration::from_secs(3600)).await;
    let recent = b.clock.now();
    // Five nodes of one pool: n0 unhealthy for an hour, n1 for a second; the rest Ready.
    for i in 0..5 {
        let (ready, since) = match i {
            0 => ("Unknown", long_ago),
            1 => ("False", recent),
            _ => ("True", long_ago),
        };
        let name = format!("n{i}");
        b.node(&name, ready, since).await;
        let mut nc = node_claim(&name, "class", "1", "1Gi");
        nc.metadata.labels = Some(std::collections::BTreeMap::from([(
            "karpenter.sh/nodepool".to_string(),
            "pool".to_string(),
        )]));
        b.cluster.create(&nc).await.expect("claim");
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    let repair = |name: &str| {
        let cluster = b.cluster.clone();
        let name = name.to_string();
        async move {
            let nc: NodeClaim = cluster.get(None, &name).await.expect("get").expect("claim");
            events::record(&cluster, &nc, EventType::Warning, REPAIR, "repair").await;
            cluster
                .delete::<NodeClaim>(None, &name, None)
                .await
                .expect("delete");
        }
    };
    // Two of five unhealthy: more than 20% (one).
    repair("n0").await;
    b.settle().await;
    let found = b.found().join("\n");
    assert!(
        found.contains("repair-bounded: NodeClaim n0 repaired while 2 of 5"),
        "{found}"
    );
    assert!(
        !found.contains("toleration 1800s"),
        "n0 was unhealthy long enough: {found}"
    );
    repair("n1").await;
    b.settle().await;
    let found = b.found().join("\n");
    assert!(
        found.contains("NodeClaim n1 repaired while its Node is unhealthy for 1s only"),
        "{found}"
    );
    // A deletion that is no repair is not judged.
    let before = b.found().len();
    b.cluster
        .delete::<NodeClaim>(None, "n2", None)
        .await
        .expect("n2");
    b.settle().await;
    assert_eq!(b.found().len(), before);
}
