//! S45: drain order as core: non-critical pods, then non-critical daemonset pods, then
//! critical pods, then critical daemonset pods, each group only once the one before is gone;
//! daemonset pods are evicted; pods tolerating `karpenter.sh/disrupted:NoSchedule` and mirror
//! pods are left where they are.

use std::sync::{Arc, Mutex};

use futures::StreamExt;
use k8s_openapi::api::core::v1::{Pod, Toleration};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kpssh::api::HostState;
use kpssh::k8s::{Cluster, WatchEvent};

use super::termination::{one_node, pdb};
use super::*;

fn owner(api_version: &str, kind: &str, name: &str) -> OwnerReference {
    OwnerReference {
        api_version: api_version.into(),
        kind: kind.into(),
        name: name.into(),
        uid: format!("uid-{name}"),
        controller: Some(true),
        ..Default::default()
    }
}

/// A small pod bound to `node` already (daemonset and static pods are not scheduled by
/// kube-scheduler).
fn bound(name: &str, node: &str, critical: bool, daemon: bool) -> Pod {
    let mut p = kpssh::sim::world::pod(name, "50m", "32Mi");
    let spec = p.spec.as_mut().expect("spec");
    spec.node_name = Some(node.into());
    if critical {
        spec.priority_class_name = Some("system-node-critical".into());
    }
    if daemon {
        p.metadata.owner_references = Some(vec![owner("apps/v1", "DaemonSet", name)]);
    }
    p
}

#[tokio::test(start_paused = true)]
async fn s45_drain_goes_group_by_group_and_evicts_daemonset_pods() {
    let e = env().await;
    hosts(&e, "h", "small", 1, 4, 8, 65).await;
    let name = one_node(&e, pod("web-0", "500m", "256Mi")).await;
    let mut tolerant = bound("tolerant", &name, false, false);
    tolerant.spec.as_mut().expect("spec").tolerations = Some(vec![Toleration {
        key: Some("karpenter.sh/disrupted".into()),
        operator: Some("Exists".into()),
        effect: Some("NoSchedule".into()),
        ..Default::default()
    }]);
    let mut mirror = bound("mirror", &name, true, false);
    mirror.metadata.owner_references = Some(vec![owner("v1", "Node", &name)]);
    mirror.metadata.annotations = Some(
        [(
            "kubernetes.io/config.mirror".to_string(),
            "hash".to_string(),
        )]
        .into(),
    );
    for p in [
        bound("crit-ds", &name, true, true),
        bound("crit", &name, true, false),
        bound("ds", &name, false, true),
        tolerant,
        mirror,
    ] {
        e.w.cluster.create(&p).await.expect("pod");
    }
    assert!(
        e.w.until(MINUTE, || async { running(&e).await == 6 }).await,
        "all six pods Running"
    );
    // Deletions in the order the API saw them.
    let gone = Arc::new(Mutex::new(Vec::<String>::new()));
    let seen = gone.clone();
    let mut stream = e.w.cluster.watch::<Pod>(None);
    let recorder = tokio::spawn(async move {
        while let Some(ev) = stream.next().await {
            if let Ok(WatchEvent::Deleted(p)) = ev {
                let n = p.metadata.name.clone().unwrap_or_default();
                seen.lock().expect("lock").push(n);
            }
        }
    });
    // The PDB holds the first group: nothing of the later groups may go meanwhile.
    e.w.cluster.create(&pdb()).await.expect("pdb");
    mark(&e, &name).await;
    tokio::time::sleep(3 * MINUTE).await;
    assert!(
        gone.lock().expect("lock").is_empty(),
        "the first group is blocked, so no later group starts: {:?}",
        gone.lock().expect("lock")
    );
    e.w.cluster
        .delete::<PodDisruptionBudget>(Some("default"), "web", None)
        .await
        .expect("drop pdb");
    let ok =
        e.w.until(5 * MINUTE, || async {
            host_states(&e).await.get(&HostState::Available) == Some(&1)
                && claims(&e).await.is_empty()
        })
        .await;
    assert!(ok, "drained, left, released: {:?}", host_states(&e).await);
    recorder.abort();
    assert_eq!(
        *gone.lock().expect("lock"),
        vec!["web-0", "ds", "crit", "crit-ds"],
        "core's order; the tolerating pod and the mirror pod are not evicted"
    );
}
