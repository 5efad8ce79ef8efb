//! The kube-rs `Cluster` port against a real kube-apiserver and etcd: the same semantics the
//! in-memory implementation promises (tests/memory_cluster.rs).

#[path = "support/controlplane.rs"]
mod controlplane;

use std::collections::BTreeMap;
use std::time::Duration;

use controlplane::ControlPlane;
use futures::StreamExt;
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::{Container, Namespace, Pod, PodSpec, Secret};
use k8s_openapi::api::policy::v1::{PodDisruptionBudget, PodDisruptionBudgetSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kpssh::api::{HostState, NodePool, SSHHost, SSHHostStatus, crds};
use kpssh::k8s::{
    Cluster, ClusterError, DeleteOutcome, EvictOutcome, KubeCluster, Precondition, WatchEvent,
};
use kpssh::sim::SimHost;
use kpssh::sim::world::host_object;
use kube::api::ObjectMeta;
use serde_json::json;

async fn cluster(ns: &str) -> KubeCluster {
    let cp = ControlPlane::shared();
    cp.install_crds(&crds::to_yaml(&crds::kpssh_crds()).expect("yaml"))
        .await;
    let c = KubeCluster::new(cp.client().await);
    let namespace = Namespace {
        metadata: ObjectMeta {
            name: Some(ns.into()),
            ..Default::default()
        },
        ..Default::default()
    };
    match c.create(&namespace).await {
        Ok(_) | Err(ClusterError::AlreadyExists { .. }) => {}
        Err(e) => panic!("namespace {ns}: {e}"),
    }
    c
}

fn host(ns: &str, name: &str) -> SSHHost {
    host_object(
        ns,
        name,
        "default",
        &SimHost::new("10.0.0.1", 2, 4 * 1024 * 1024),
    )
}

#[tokio::test]
async fn cas_conflict_and_status_subresource() {
    let c = cluster("kc-cas").await;
    let v1 = c.create(&host("kc-cas", "a")).await.expect("create");
    let mut fresh = v1.clone();
    fresh.spec.user = "admin".into();
    fresh.status = Some(SSHHostStatus {
        state: HostState::InUse,
        ..Default::default()
    });
    let v2 = c.replace(&fresh).await.expect("fresh replace");
    assert_eq!(v2.spec.user, "admin");
    assert!(v2.status.is_none(), "replace does not write status");
    assert_eq!(v2.metadata.generation, Some(2));
    let mut stale = v1.clone();
    stale.spec.user = "other".into();
    assert!(c.replace(&stale).await.expect_err("stale").is_conflict());
    let mut st = v2.clone();
    st.spec.user = "ignored".into();
    st.status = Some(SSHHostStatus {
        state: HostState::Available,
        ..Default::default()
    });
    let v3 = c.replace_status(&st).await.expect("status");
    assert_eq!(v3.state(), HostState::Available);
    assert_eq!(v3.spec.user, "admin", "status write does not touch spec");
    assert_eq!(
        v3.metadata.generation,
        Some(2),
        "status write keeps generation"
    );
    assert!(
        c.replace_status(&st)
            .await
            .expect_err("stale status")
            .is_conflict()
    );
}

#[tokio::test]
async fn watch_delivers_changes_in_order_and_a_new_watch_starts_from_the_current_set() {
    let c = cluster("kc-watch").await;
    let mut w = c.watch::<SSHHost>(Some("kc-watch"));
    assert!(matches!(w.next().await, Some(Ok(WatchEvent::Restarted(v))) if v.is_empty()));
    let a = c.create(&host("kc-watch", "a")).await.expect("create");
    let mut edited = a.clone();
    edited.spec.port = 2222;
    c.replace(&edited).await.expect("replace");
    c.delete::<SSHHost>(Some("kc-watch"), "a", None)
        .await
        .expect("delete");
    c.create(&host("kc-watch", "b")).await.expect("create b");
    let mut seen = vec![];
    while seen.len() < 4 {
        let ev = tokio::time::timeout(Duration::from_secs(20), w.next())
            .await
            .expect("event in time");
        match ev {
            Some(Ok(WatchEvent::Applied(h))) => seen.push(format!(
                "applied {} {}",
                h.metadata.name.unwrap_or_default(),
                h.spec.port
            )),
            Some(Ok(WatchEvent::Deleted(h))) => {
                seen.push(format!("deleted {}", h.metadata.name.unwrap_or_default()))
            }
            other => panic!("unexpected {other:?}"),
        }
    }
    assert_eq!(
        seen,
        [
            "applied a 22",
            "applied a 2222",
            "deleted a",
            "applied b 22"
        ]
    );
    drop(w);
    let mut again = c.watch::<SSHHost>(Some("kc-watch"));
    match again.next().await {
        Some(Ok(WatchEvent::Restarted(v))) => {
            let names: Vec<_> = v.into_iter().filter_map(|h| h.metadata.name).collect();
            assert_eq!(names, ["b"]);
        }
        other => panic!("unexpected {other:?}"),
    }
}

#[tokio::test]
async fn finalizers_hold_deletion_and_preconditions_fence() {
    let c = cluster("kc-fin").await;
    let mut h = host("kc-fin", "held");
    h.metadata.finalizers = Some(vec!["example.com/hold".into()]);
    let created = c.create(&h).await.expect("create");
    let wrong = Precondition {
        uid: Some("00000000-0000-0000-0000-000000000000".into()),
        resource_version: None,
    };
    assert!(
        c.delete::<SSHHost>(Some("kc-fin"), "held", Some(wrong))
            .await
            .expect_err("uid")
            .is_conflict()
    );
    let right = Precondition {
        uid: created.metadata.uid.clone(),
        resource_version: None,
    };
    let outcome = c
        .delete::<SSHHost>(Some("kc-fin"), "held", Some(right))
        .await
        .expect("delete");
    assert_eq!(outcome, DeleteOutcome::Terminating);
    let held: SSHHost = c
        .get(Some("kc-fin"), "held")
        .await
        .expect("get")
        .expect("still there");
    assert!(held.metadata.deletion_timestamp.is_some());
    let _: SSHHost = c
        .patch(
            Some("kc-fin"),
            "held",
            &json!({"metadata": {"finalizers": null}}),
        )
        .await
        .expect("drop finalizer");
    assert!(
        c.get::<SSHHost>(Some("kc-fin"), "held")
            .await
            .expect("get")
            .is_none()
    );
    assert_eq!(
        c.delete::<SSHHost>(Some("kc-fin"), "held", None)
            .await
            .expect("again"),
        DeleteOutcome::NotFound
    );
}

#[tokio::test]
async fn bootstrap_token_secrets_are_created_and_deleted() {
    let c = cluster("kube-system").await;
    let data = |v: &str| ByteString(v.as_bytes().to_vec());
    let secret = Secret {
        metadata: ObjectMeta {
            name: Some("bootstrap-token-kc0tst".into()),
            namespace: Some("kube-system".into()),
            ..Default::default()
        },
        type_: Some("bootstrap.kubernetes.io/token".into()),
        data: Some(BTreeMap::from([
            ("token-id".to_string(), data("kc0tst")),
            ("token-secret".to_string(), data("0123456789abcdef")),
            ("usage-bootstrap-authentication".to_string(), data("true")),
            (
                "auth-extra-groups".to_string(),
                data("system:bootstrappers:kpssh"),
            ),
        ])),
        ..Default::default()
    };
    c.create(&secret).await.expect("create token");
    assert!(
        c.get::<Secret>(Some("kube-system"), "bootstrap-token-kc0tst")
            .await
            .expect("get")
            .is_some()
    );
    let outcome = c
        .delete::<Secret>(Some("kube-system"), "bootstrap-token-kc0tst", None)
        .await
        .expect("delete");
    assert_eq!(outcome, DeleteOutcome::Deleted);
    assert!(
        c.get::<Secret>(Some("kube-system"), "bootstrap-token-kc0tst")
            .await
            .expect("get")
            .is_none()
    );
}

fn pod(ns: &str, name: &str, app: &str) -> Pod {
    Pod {
        metadata: ObjectMeta {
            name: Some(name.into()),
            namespace: Some(ns.into()),
            labels: Some(BTreeMap::from([("app".into(), app.into())])),
            ..Default::default()
        },
        spec: Some(PodSpec {
            containers: vec![Container {
                name: "c".into(),
                image: Some("registry.invalid/pause".into()),
                ..Default::default()
            }],
            ..Default::default()
        }),
        status: None,
    }
}

#[tokio::test]
async fn eviction_is_refused_by_a_disruption_budget_and_allowed_without() {
    let ns = "kc-evict";
    let c = cluster(ns).await;
    // No controller-manager here to create the namespace's default ServiceAccount.
    let sa = k8s_openapi::api::core::v1::ServiceAccount {
        metadata: ObjectMeta {
            name: Some("default".into()),
            namespace: Some(ns.into()),
            ..Default::default()
        },
        ..Default::default()
    };
    match c.create(&sa).await {
        Ok(_) | Err(ClusterError::AlreadyExists { .. }) => {}
        Err(e) => panic!("service account: {e}"),
    }
    for (name, app) in [("guarded", "web"), ("free", "batch")] {
        let mut p = c.create(&pod(ns, name, app)).await.expect("pod");
        // No kubelet: mark it Running ourselves (the Eviction API lets Pending pods go freely).
        p.status = Some(k8s_openapi::api::core::v1::PodStatus {
            phase: Some("Running".into()),
            ..Default::default()
        });
        c.replace_status(&p).await.expect("running");
    }
    let pdb = PodDisruptionBudget {
        metadata: ObjectMeta {
            name: Some("web".into()),
            namespace: Some(ns.into()),
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
    match c.evict(ns, "guarded").await {
        Err(ClusterError::TooManyRequests { .. }) => {}
        other => panic!("the budget must refuse eviction (429), got {other:?}"),
    }
    assert_eq!(
        c.evict(ns, "free").await.expect("evict"),
        EvictOutcome::Evicted
    );
    assert_eq!(
        c.evict(ns, "missing").await.expect("evict"),
        EvictOutcome::NotFound
    );
}

/// S58: a merge patch of the status subresource on a NodePool under upstream's CRD: status
/// only (spec and generation stay), no resourceVersion needed, `null` removes a resource, and
/// the schema takes `status.nodes` and `status.resources` as kpssh writes them.
#[tokio::test]
async fn s58_patch_status_merges_the_status_subresource_of_a_nodepool() {
    let c = cluster("kc-np-status").await;
    ControlPlane::shared()
        .install_crds(&crds::karpenter_crds_yaml())
        .await;
    let name = "kc-np-status";
    let mut np = kpssh::sim::world::node_pool(name, "default");
    np.spec.weight = Some(5);
    let _ = c.delete::<NodePool>(None, name, None).await;
    let created = c.create(&np).await.expect("create");
    let first = json!({"status": {
        "resources": {"cpu": "4", "memory": "8Gi", "pods": "220", "ephemeral-storage": "0",
                      "nodes": "2", "nvidia.com/gpu": "1"},
        "nodes": 2,
    }, "spec": {"weight": 9}});
    let v2: NodePool = c.patch_status(None, name, &first).await.expect("patch");
    let st = v2.status.clone().expect("status");
    assert_eq!(st.nodes, Some(2));
    assert_eq!(st.resources["memory"].0, "8Gi");
    assert_eq!(v2.spec.weight, Some(5), "spec stays");
    assert_eq!(v2.metadata.generation, created.metadata.generation);
    let second = json!({"status": {"resources": {"cpu": "2", "nvidia.com/gpu": null}, "nodes": 1}});
    let v3: NodePool = c.patch_status(None, name, &second).await.expect("patch");
    let st = v3.status.expect("status");
    assert_eq!(st.nodes, Some(1));
    assert_eq!(st.resources["cpu"].0, "2");
    assert_eq!(st.resources["memory"].0, "8Gi", "merged, not replaced");
    assert!(!st.resources.contains_key("nvidia.com/gpu"), "null removes");
    let bad = json!({"status": {"nodes": "many"}});
    let err = c
        .patch_status::<NodePool>(None, name, &bad)
        .await
        .expect_err("the schema refuses a non-integer node count");
    assert!(matches!(err, ClusterError::Invalid { .. }), "{err}");
    c.delete::<NodePool>(None, name, None)
        .await
        .expect("delete");
}

/// Issue #26 (leader memory at 10,000 hosts): what the port hands on carries no
/// `managedFields` (a tree of JSON maps per field manager, held for every object in the
/// watch-fed stores), whether read, listed, watched or returned by a write; and writing such an
/// object back keeps the server's field ownership (the API server keeps the live object's
/// managedFields when an update carries none).
#[tokio::test]
async fn objects_come_without_managed_fields_and_writing_them_back_keeps_the_servers() {
    let ns = "kc-lean";
    let c = cluster(ns).await;
    let mut w = c.watch::<SSHHost>(Some(ns));
    assert!(matches!(w.next().await, Some(Ok(WatchEvent::Restarted(_)))));
    let created = c.create(&host(ns, "a")).await.expect("create");
    assert_eq!(created.metadata.managed_fields, None, "create's result");
    let got: SSHHost = c.get(Some(ns), "a").await.expect("get").expect("a");
    assert_eq!(got.metadata.managed_fields, None, "get");
    let listed: Vec<SSHHost> = c.list(Some(ns), None).await.expect("list");
    assert!(!listed.is_empty());
    assert!(
        listed.iter().all(|h| h.metadata.managed_fields.is_none()),
        "list"
    );
    match tokio::time::timeout(Duration::from_secs(20), w.next()).await {
        Ok(Some(Ok(WatchEvent::Applied(h)))) => {
            assert_eq!(h.metadata.managed_fields, None, "watch")
        }
        other => panic!("unexpected {other:?}"),
    }
    let mut edited = got.clone();
    edited.spec.port = 2222;
    let replaced = c.replace(&edited).await.expect("replace");
    assert_eq!(replaced.metadata.managed_fields, None, "replace's result");
    let raw: SSHHost = kube::Api::namespaced(c.client().clone(), ns)
        .get("a")
        .await
        .expect("raw get");
    let managers: Vec<String> = (raw.metadata.managed_fields.unwrap_or_default().iter())
        .filter_map(|m| m.manager.clone())
        .collect();
    assert!(
        !managers.is_empty(),
        "the server still tracks who owns the fields"
    );
    assert_eq!(raw.spec.port, 2222);
}
