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
use kpssh::api::{HostState, SSHHost, SSHHostStatus, crds};
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
