//! Consolidation safety: S46 (a PodDisruptionBudget that allows no disruption blocks a
//! candidate before anything is done to it), S47 (no double-booking of free space), S48 (every
//! constraint provisioning checks: host ports, PersistentVolume node affinity).

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    Container, ContainerPort, Node, PersistentVolume, PersistentVolumeClaim,
    PersistentVolumeClaimSpec, PersistentVolumeClaimVolumeSource, PersistentVolumeSpec, Pod,
    Volume, VolumeNodeAffinity,
};
use k8s_openapi::api::policy::v1::{PodDisruptionBudget, PodDisruptionBudgetSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kpssh::api::NodePool;
use kpssh::api::karpenter::{Budget, DISRUPTED_TAINT_KEY, DO_NOT_DISRUPT_ANNOTATION};
use kpssh::k8s::Cluster;
use kpssh::karpenter::sim_scheduler::RECREATE_ANNOTATION;

use super::*;

pub(super) fn pool(budget: &str) -> NodePool {
    let mut np = nodepool("default");
    np.spec.disruption.consolidate_after = Some("30s".into());
    np.spec.disruption.budgets = vec![Budget {
        nodes: budget.into(),
        ..Default::default()
    }];
    np
}

/// A pod with its own `app` label that comes back pending when evicted (a ReplicaSet's).
pub(super) fn app(name: &str, cpu: &str) -> Pod {
    let mut p = pod(name, cpu, "256Mi");
    p.metadata.labels = Some(BTreeMap::from([("app".to_string(), name.to_string())]));
    p.metadata.annotations = Some([(RECREATE_ANNOTATION.to_string(), "true".to_string())].into());
    p
}

fn filler(name: &str, cpu: &str) -> Pod {
    let mut p = pod(name, cpu, "256Mi");
    p.metadata.labels = Some(BTreeMap::from([("app".to_string(), "filler".to_string())]));
    p
}

fn node_of(all: &[Pod], name: &str) -> Option<String> {
    all.iter()
        .find(|p| p.metadata.name.as_deref() == Some(name))
        .and_then(|p| p.spec.as_ref().and_then(|s| s.node_name.clone()))
}

/// `ps` on a new node of their own: created in one batch with a filler that takes the rest of
/// the node (deleted later by [`drop_fillers`]). The node's name.
pub(super) async fn on_new_node(e: &Env, ps: Vec<Pod>, filler_cpu: &str, tag: &str) -> String {
    let first = ps[0].metadata.name.clone().expect("name");
    let want = running(e).await + ps.len() + 1;
    for p in ps {
        e.w.cluster.create(&p).await.expect("pod");
    }
    e.w.cluster
        .create(&filler(&format!("filler-{tag}"), filler_cpu))
        .await
        .expect("filler");
    let ok =
        e.w.until(10 * MINUTE, || async { running(e).await == want })
            .await;
    assert!(ok, "batch {tag} runs");
    node_of(&pods(e).await, &first).expect("bound")
}

pub(super) async fn drop_fillers(e: &Env) {
    for p in pods(e).await {
        let name = p.metadata.name.clone().unwrap_or_default();
        if name.starts_with("filler-") {
            e.w.cluster
                .delete::<Pod>(Some("default"), &name, None)
                .await
                .expect("delete filler");
        }
    }
}

pub(super) fn terminating(e: &Env) -> Vec<String> {
    e.w.cluster
        .events()
        .into_iter()
        .filter(|ev| ev.reason == "DisruptionTerminating")
        .map(|ev| ev.message)
        .collect()
}

async fn cordoned(e: &Env, node: &str) -> bool {
    let n: Option<Node> = e.w.cluster.get(None, node).await.expect("get");
    n.and_then(|n| n.spec)
        .and_then(|s| s.taints)
        .unwrap_or_default()
        .iter()
        .any(|t| t.key == DISRUPTED_TAINT_KEY)
}

/// S46: with a budget of one node, the first candidate (fewest pods) runs a pod whose PDB
/// allows no disruption. It is not tainted, not drained and holds no budget slot: a
/// DisruptionBlocked event names the PDB, and the next candidate is consolidated instead.
#[tokio::test(start_paused = true)]
async fn s46_pdb_blocked_candidate_is_not_tainted_and_holds_no_budget_slot() {
    let e = env().await;
    hosts(&e, "h", "big", 3, 8, 16, 84).await;
    e.w.cluster.create(&pool("1")).await.expect("np");
    // A: room, kept by a do-not-disrupt pod. B: one PDB-guarded pod. C: two small pods.
    let mut keep = app("keep", "2");
    keep.metadata
        .annotations
        .get_or_insert_with(Default::default)
        .insert(DO_NOT_DISRUPT_ANNOTATION.into(), "true".into());
    let a = on_new_node(&e, vec![keep], "5500m", "a").await;
    let b = on_new_node(&e, vec![app("guarded", "1")], "6500m", "b").await;
    let c = on_new_node(&e, vec![app("c1", "500m"), app("c2", "500m")], "6", "c").await;
    assert!(a != b && b != c && a != c, "three nodes: {a} {b} {c}");
    let pdb = PodDisruptionBudget {
        metadata: kube::api::ObjectMeta {
            name: Some("guard".into()),
            namespace: Some("default".into()),
            ..Default::default()
        },
        spec: Some(PodDisruptionBudgetSpec {
            min_available: Some(IntOrString::Int(1)),
            selector: Some(LabelSelector {
                match_labels: Some([("app".to_string(), "guarded".to_string())].into()),
                ..Default::default()
            }),
            ..Default::default()
        }),
        status: None,
    };
    e.w.cluster.create(&pdb).await.expect("pdb");
    drop_fillers(&e).await;
    let ok =
        e.w.until(10 * MINUTE, || async {
            let cs = claims(&e).await;
            !cs.iter()
                .any(|nc| nc.metadata.name.as_deref() == Some(c.as_str()))
        })
        .await;
    assert!(
        ok,
        "C consolidated; terminating {:?}, events {:?}",
        terminating(&e),
        reasons(&e)
    );
    assert!(!cordoned(&e, &b).await, "the PDB-blocked node was tainted");
    assert!(
        !terminating(&e).iter().any(|m| m.contains(b.as_str())),
        "the PDB-blocked node was disrupted: {:?}",
        terminating(&e)
    );
    let blocked: Vec<String> =
        e.w.cluster
            .events()
            .into_iter()
            .filter(|ev| ev.reason == "DisruptionBlocked")
            .map(|ev| ev.message)
            .collect();
    assert!(
        blocked
            .iter()
            .any(|m| m.contains(b.as_str()) && m.contains("PodDisruptionBudget default/guard")),
        "{blocked:?}"
    );
    assert!(
        blocked
            .iter()
            .any(|m| m.contains(a.as_str()) && m.contains("do-not-disrupt")),
        "the do-not-disrupt node is told too: {blocked:?}"
    );
    assert!(
        e.w.until(5 * MINUTE, || async { running(&e).await == 4 })
            .await,
        "every pod runs"
    );
}

/// S47: three nodes, one pod each (4, 3 and 3 cpu of 7.92); any one node's pod fits in the free
/// space of the others, but after one node goes, the other two 3-cpu pods cannot both move.
/// The scheduler is slow, so an evicted pod stays pending for a while: its room must stay
/// booked (as a draining node's pod, then as a pending pod). At most one node is disrupted.
#[tokio::test(start_paused = true)]
async fn s47_two_candidates_never_count_on_the_same_free_space() {
    let e = env_scheduling_every(KarpenterConfig::default(), 2 * MINUTE).await;
    hosts(&e, "h", "big", 3, 8, 16, 85).await;
    e.w.cluster.create(&pool("100%")).await.expect("np");
    on_new_node(&e, vec![app("a", "4")], "3500m", "a").await;
    on_new_node(&e, vec![app("b", "3")], "4500m", "b").await;
    on_new_node(&e, vec![app("c", "3")], "4500m", "c").await;
    drop_fillers(&e).await;
    tokio::time::sleep(20 * MINUTE).await;
    let t = terminating(&e);
    assert_eq!(t.len(), 1, "double-booked free space: {t:?}");
    assert!(
        e.w.until(10 * MINUTE, || async { running(&e).await == 3 })
            .await,
        "every pod runs"
    );
    assert_eq!(claims(&e).await.len(), 2);
}

fn with_host_port(mut p: Pod, port: i32) -> Pod {
    if let Some(s) = p.spec.as_mut() {
        for c in s.containers.iter_mut() {
            c.ports = Some(vec![ContainerPort {
                container_port: port,
                host_port: Some(port),
                ..Default::default()
            }]);
        }
    }
    p
}

/// S48: two nodes, each running a pod bound to host port 8080. Either pod fits on the other
/// node by resources, but the port is taken there: neither node is consolidated.
#[tokio::test(start_paused = true)]
async fn s48_pod_whose_host_port_is_taken_elsewhere_keeps_its_node() {
    let e = env().await;
    hosts(&e, "h", "big", 2, 8, 16, 86).await;
    e.w.cluster.create(&pool("100%")).await.expect("np");
    let a = on_new_node(&e, vec![with_host_port(app("a", "1"), 8080)], "6", "a").await;
    let b = on_new_node(&e, vec![with_host_port(app("b", "1"), 8080)], "6", "b").await;
    assert_ne!(a, b);
    drop_fillers(&e).await;
    tokio::time::sleep(15 * MINUTE).await;
    assert!(terminating(&e).is_empty(), "{:?}", terminating(&e));
    assert_eq!(claims(&e).await.len(), 2);
    assert_eq!(running(&e).await, 2);
}

/// S48: a pod whose PersistentVolume is pinned to its node (a local volume) fits on the other
/// node by resources, but its volume is not there: its node is not consolidated. The other
/// node, whose pod may go anywhere, is.
#[tokio::test(start_paused = true)]
async fn s48_pod_whose_volume_is_pinned_to_its_node_keeps_it() {
    use k8s_openapi::api::core::v1::{NodeSelector, NodeSelectorRequirement, NodeSelectorTerm};

    let e = env().await;
    hosts(&e, "h", "big", 2, 8, 16, 87).await;
    e.w.cluster.create(&pool("100%")).await.expect("np");
    let a = on_new_node(&e, vec![app("a", "1")], "6", "a").await;
    let b = on_new_node(&e, vec![app("b", "1")], "6", "b").await;
    assert_ne!(a, b);
    let pv = PersistentVolume {
        metadata: kube::api::ObjectMeta {
            name: Some("local-b".into()),
            ..Default::default()
        },
        spec: Some(PersistentVolumeSpec {
            node_affinity: Some(VolumeNodeAffinity {
                required: Some(NodeSelector {
                    node_selector_terms: vec![NodeSelectorTerm {
                        match_expressions: Some(vec![NodeSelectorRequirement {
                            key: "kubernetes.io/hostname".into(),
                            operator: "In".into(),
                            values: Some(vec![b.clone()]),
                        }]),
                        ..Default::default()
                    }],
                }),
            }),
            ..Default::default()
        }),
        status: None,
    };
    e.w.cluster.create(&pv).await.expect("pv");
    let pvc = PersistentVolumeClaim {
        metadata: kube::api::ObjectMeta {
            name: Some("data-b".into()),
            namespace: Some("default".into()),
            ..Default::default()
        },
        spec: Some(PersistentVolumeClaimSpec {
            volume_name: Some("local-b".into()),
            ..Default::default()
        }),
        status: None,
    };
    e.w.cluster.create(&pvc).await.expect("pvc");
    // Pod b mounts it (as if it had been created so: the volume was bound where b runs).
    let mut pb: Pod =
        e.w.cluster
            .get(Some("default"), "b")
            .await
            .expect("get")
            .expect("pod b");
    if let Some(s) = pb.spec.as_mut() {
        s.volumes = Some(vec![Volume {
            name: "data".into(),
            persistent_volume_claim: Some(PersistentVolumeClaimVolumeSource {
                claim_name: "data-b".into(),
                read_only: None,
            }),
            ..Default::default()
        }]);
        s.containers = vec![Container {
            name: "c".into(),
            ..s.containers[0].clone()
        }];
    }
    e.w.cluster.replace(&pb).await.expect("pod b mounts data-b");
    drop_fillers(&e).await;
    tokio::time::sleep(15 * MINUTE).await;
    let t = terminating(&e);
    assert!(
        !t.iter().any(|m| m.contains(b.as_str())),
        "the node holding b's volume was consolidated: {t:?}"
    );
    assert_eq!(
        node_of(&pods(&e).await, "b").as_deref(),
        Some(b.as_str()),
        "b still on its volume's node"
    );
    assert!(
        t.iter().any(|m| m.contains(a.as_str())),
        "a's node, free to go, was consolidated: {t:?}"
    );
}
