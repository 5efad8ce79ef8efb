//! The in-memory `Cluster` honours the API server rules the controller depends on.

use std::collections::BTreeMap;

use futures::StreamExt;
use k8s_openapi::api::core::v1::{Pod, PodStatus};
use k8s_openapi::api::policy::v1::{PodDisruptionBudget, PodDisruptionBudgetSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kpssh::api::{HostState, SSHHost, SSHHostStatus};
use kpssh::clock::Clock;
use kpssh::k8s::{
    Cluster, ClusterError, DeleteOutcome, EvictOutcome, MemoryCluster, Precondition, WatchEvent,
};
use kpssh::sim::SimHost;
use kpssh::sim::world::host_object;
use kube::api::ObjectMeta;
use kube::core::Selector;
use serde_json::json;

const NS: &str = "kpssh-system";

fn cluster() -> MemoryCluster {
    MemoryCluster::new(Clock::simulated(
        "2026-01-01T00:00:00Z".parse().expect("timestamp"),
    ))
}

fn host(name: &str, class: &str) -> SSHHost {
    host_object(
        NS,
        name,
        class,
        &SimHost::new(&format!("10.0.0.{}", name.len()), 4, 8 * 1024 * 1024),
    )
}

#[tokio::test]
async fn create_sets_server_fields_and_rejects_duplicates() {
    let c = cluster();
    let created = c.create(&host("a", "small")).await.expect("create");
    assert!(created.metadata.uid.is_some());
    assert_eq!(created.metadata.generation, Some(1));
    assert!(created.metadata.resource_version.is_some());
    assert!(created.metadata.creation_timestamp.is_some());
    let again = c.create(&host("a", "small")).await;
    assert!(matches!(again, Err(ClusterError::AlreadyExists { .. })));
}

#[tokio::test]
async fn stale_resource_version_is_a_conflict() {
    let c = cluster();
    let v1 = c.create(&host("a", "small")).await.expect("create");
    let mut first = v1.clone();
    first.spec.port = 2222;
    let v2 = c.replace(&first).await.expect("fresh write succeeds");
    assert_ne!(v2.metadata.resource_version, v1.metadata.resource_version);
    let mut stale = v1.clone();
    stale.spec.port = 2223;
    let err = c.replace(&stale).await.expect_err("stale write must fail");
    assert!(err.is_conflict(), "{err}");
    let mut stale_status = v1.clone();
    stale_status.status = Some(SSHHostStatus {
        state: HostState::Available,
        ..Default::default()
    });
    assert!(
        c.replace_status(&stale_status)
            .await
            .expect_err("stale")
            .is_conflict()
    );
    assert_eq!(c.stats().conflicts, 2);
}

#[tokio::test]
async fn generation_moves_with_spec_only() {
    let c = cluster();
    let v1 = c.create(&host("a", "small")).await.expect("create");
    let mut labelled = v1.clone();
    labelled
        .metadata
        .labels
        .get_or_insert_default()
        .insert("x".into(), "y".into());
    let v2 = c.replace(&labelled).await.expect("label change");
    assert_eq!(
        v2.metadata.generation,
        Some(1),
        "metadata change keeps generation"
    );
    let mut with_status = v2.clone();
    with_status.status = Some(SSHHostStatus {
        state: HostState::Available,
        ..Default::default()
    });
    let v3 = c.replace_status(&with_status).await.expect("status");
    assert_eq!(
        v3.metadata.generation,
        Some(1),
        "status change keeps generation"
    );
    let mut spec = v3.clone();
    spec.spec.user = "admin".into();
    let v4 = c.replace(&spec).await.expect("spec");
    assert_eq!(v4.metadata.generation, Some(2));
}

#[tokio::test]
async fn status_and_spec_travel_separate_paths() {
    let c = cluster();
    let v1 = c.create(&host("a", "small")).await.expect("create");
    let mut both = v1.clone();
    both.spec.user = "admin".into();
    both.status = Some(SSHHostStatus {
        state: HostState::InUse,
        ..Default::default()
    });
    let after_replace = c.replace(&both).await.expect("replace");
    assert_eq!(after_replace.spec.user, "admin");
    assert_eq!(after_replace.status, None, "replace must ignore status");
    let mut both = after_replace.clone();
    both.spec.user = "other".into();
    both.status = Some(SSHHostStatus {
        state: HostState::InUse,
        ..Default::default()
    });
    let after_status = c.replace_status(&both).await.expect("status");
    assert_eq!(
        after_status.spec.user, "admin",
        "status write must ignore spec"
    );
    assert_eq!(after_status.state(), HostState::InUse);
}

#[tokio::test]
async fn unchanged_write_is_a_no_op() {
    let c = cluster();
    let v1 = c.create(&host("a", "small")).await.expect("create");
    let v2 = c.replace(&v1).await.expect("replace");
    assert_eq!(v1.metadata.resource_version, v2.metadata.resource_version);
}

#[tokio::test]
async fn status_write_moves_the_version_only_when_the_status_changes() {
    use futures::FutureExt;
    let c = cluster();
    let v1 = c.create(&host("a", "small")).await.expect("create");
    let mut watch = c.watch::<SSHHost>(Some(NS));
    assert!(matches!(
        watch.next().await,
        Some(Ok(WatchEvent::Restarted(_)))
    ));
    let mut probed = v1.clone();
    probed.status = Some(SSHHostStatus {
        state: HostState::Available,
        ..Default::default()
    });
    let v2 = c.replace_status(&probed).await.expect("status");
    assert_ne!(v1.metadata.resource_version, v2.metadata.resource_version);
    assert_eq!(v2.metadata.generation, v1.metadata.generation);
    assert_eq!(v2.spec, v1.spec);
    assert!(matches!(
        watch.next().await,
        Some(Ok(WatchEvent::Applied(h))) if h.state() == HostState::Available
    ));
    // The same status again: nothing stored, nothing sent, the version stays.
    let v3 = c.replace_status(&v2).await.expect("same status");
    assert_eq!(v3.metadata.resource_version, v2.metadata.resource_version);
    assert_eq!(v3.status, v2.status);
    assert!(
        watch.next().now_or_never().is_none(),
        "a no-op write sent an event"
    );
    // And a stale version is still refused, changed status or not.
    let mut stale = v1.clone();
    stale.status = Some(SSHHostStatus {
        state: HostState::Unhealthy,
        ..Default::default()
    });
    assert!(matches!(
        c.replace_status(&stale).await,
        Err(ClusterError::Conflict { .. })
    ));
}

#[tokio::test]
async fn finalizers_hold_deletion_until_removed() {
    let c = cluster();
    let mut h = host("a", "small");
    h.metadata.finalizers = Some(vec!["example.com/hold".into()]);
    c.create(&h).await.expect("create");
    let mut watch = c.watch::<SSHHost>(Some(NS));
    assert!(matches!(watch.next().await, Some(Ok(WatchEvent::Restarted(v))) if v.len() == 1));
    let outcome = c
        .delete::<SSHHost>(Some(NS), "a", None)
        .await
        .expect("delete");
    assert_eq!(outcome, DeleteOutcome::Terminating);
    let held: SSHHost = c
        .get(Some(NS), "a")
        .await
        .expect("get")
        .expect("still there");
    assert!(held.metadata.deletion_timestamp.is_some());
    assert!(matches!(
        watch.next().await,
        Some(Ok(WatchEvent::Applied(_)))
    ));
    let _: SSHHost = c
        .patch(Some(NS), "a", &json!({"metadata": {"finalizers": null}}))
        .await
        .expect("patch");
    assert!(
        c.get::<SSHHost>(Some(NS), "a")
            .await
            .expect("get")
            .is_none()
    );
    assert!(matches!(
        watch.next().await,
        Some(Ok(WatchEvent::Deleted(_)))
    ));
    let again = c
        .delete::<SSHHost>(Some(NS), "a", None)
        .await
        .expect("delete");
    assert_eq!(again, DeleteOutcome::NotFound);
}

#[tokio::test]
async fn delete_preconditions_fence_on_uid() {
    let c = cluster();
    c.create(&host("a", "small")).await.expect("create");
    let wrong = Precondition {
        uid: Some("someone-else".into()),
        resource_version: None,
    };
    let err = c
        .delete::<SSHHost>(Some(NS), "a", Some(wrong))
        .await
        .expect_err("uid mismatch");
    assert!(err.is_conflict());
    assert!(
        c.get::<SSHHost>(Some(NS), "a")
            .await
            .expect("get")
            .is_some()
    );
}

#[tokio::test]
async fn list_evaluates_label_selectors() {
    let c = cluster();
    for (n, class) in [("a", "small"), ("b", "big"), ("c", "small")] {
        c.create(&host(n, class)).await.expect("create");
    }
    let sel: Selector = Selector::from_iter([("karpenter.dklesev.github.io/host-class", "small")]);
    let small: Vec<SSHHost> = c.list(Some(NS), Some(&sel)).await.expect("list");
    let names: Vec<_> = small
        .iter()
        .filter_map(|h| h.metadata.name.clone())
        .collect();
    assert_eq!(names, vec!["a".to_string(), "c".to_string()]);
    let other_ns: Vec<SSHHost> = c.list(Some("elsewhere"), None).await.expect("list");
    assert!(other_ns.is_empty());
}

#[tokio::test]
async fn watch_streams_changes_in_commit_order() {
    let c = cluster();
    let mut watch = c.watch::<SSHHost>(None);
    assert!(matches!(watch.next().await, Some(Ok(WatchEvent::Restarted(v))) if v.is_empty()));
    let a = c.create(&host("a", "small")).await.expect("create");
    let mut edited = a.clone();
    edited.spec.port = 2200;
    c.replace(&edited).await.expect("replace");
    c.delete::<SSHHost>(Some(NS), "a", None)
        .await
        .expect("delete");
    let mut seen = vec![];
    for _ in 0..3 {
        match watch.next().await {
            Some(Ok(WatchEvent::Applied(h))) => seen.push(format!("applied:{}", h.spec.port)),
            Some(Ok(WatchEvent::Deleted(_))) => seen.push("deleted".into()),
            other => panic!("unexpected {other:?}"),
        }
    }
    assert_eq!(seen, ["applied:22", "applied:2200", "deleted"]);
}

fn pod(name: &str, app: &str) -> Pod {
    Pod {
        metadata: ObjectMeta {
            name: Some(name.into()),
            namespace: Some("default".into()),
            labels: Some(BTreeMap::from([("app".into(), app.into())])),
            ..Default::default()
        },
        spec: None,
        status: Some(PodStatus {
            phase: Some("Running".into()),
            ..Default::default()
        }),
    }
}

#[tokio::test]
async fn eviction_honours_disruption_budgets() {
    let c = cluster();
    for (n, app) in [("web-1", "web"), ("web-2", "web"), ("batch-1", "batch")] {
        c.create(&pod(n, app)).await.expect("pod");
    }
    let pdb = PodDisruptionBudget {
        metadata: ObjectMeta {
            name: Some("web".into()),
            namespace: Some("default".into()),
            ..Default::default()
        },
        spec: Some(PodDisruptionBudgetSpec {
            max_unavailable: Some(IntOrString::Int(0)),
            selector: Some(LabelSelector {
                match_labels: Some(BTreeMap::from([("app".into(), "web".into())])),
                ..Default::default()
            }),
            ..Default::default()
        }),
        status: None,
    };
    c.create(&pdb).await.expect("pdb");
    let blocked = c
        .evict("default", "web-1")
        .await
        .expect_err("budget blocks");
    assert!(
        matches!(blocked, ClusterError::TooManyRequests { .. }),
        "{blocked}"
    );
    assert_eq!(
        c.evict("default", "batch-1").await.expect("no budget"),
        EvictOutcome::Evicted
    );
    assert!(
        c.get::<Pod>(Some("default"), "batch-1")
            .await
            .expect("get")
            .is_none()
    );
    assert_eq!(
        c.evict("default", "gone").await.expect("missing"),
        EvictOutcome::NotFound
    );
}

/// S58: a merge patch of the status subresource, as on a real API server
/// (tests/kube_cluster.rs): status only, merged, `null` removes, a patch that changes nothing
/// keeps the resourceVersion.
#[tokio::test]
async fn s58_patch_status_merges_status_only() {
    use kpssh::api::NodePool;
    let c = cluster();
    let mut np = kpssh::sim::world::node_pool("np", "default");
    np.spec.weight = Some(5);
    let created = c.create(&np).await.expect("create");
    let first = json!({"status": {"resources": {"cpu": "4", "memory": "8Gi"}, "nodes": 2},
                       "spec": {"weight": 9}});
    let v2: NodePool = c.patch_status(None, "np", &first).await.expect("patch");
    assert_eq!(v2.status.as_ref().and_then(|s| s.nodes), Some(2));
    assert_eq!(v2.spec.weight, Some(5), "spec stays");
    assert_eq!(v2.metadata.generation, created.metadata.generation);
    assert_ne!(
        v2.metadata.resource_version,
        created.metadata.resource_version
    );
    let second = json!({"status": {"resources": {"cpu": null}, "nodes": 1}});
    let v3: NodePool = c.patch_status(None, "np", &second).await.expect("patch");
    let st = v3.status.clone().expect("status");
    assert_eq!(st.nodes, Some(1));
    assert!(!st.resources.contains_key("cpu"), "null removes");
    assert_eq!(st.resources["memory"].0, "8Gi", "merged");
    let v4: NodePool = c.patch_status(None, "np", &second).await.expect("again");
    assert_eq!(v4.metadata.resource_version, v3.metadata.resource_version);
    let missing = c.patch_status::<NodePool>(None, "nope", &second).await;
    assert!(matches!(missing, Err(ClusterError::NotFound { .. })));
}
