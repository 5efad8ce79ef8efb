//! `kpssh doctor` against a real kube-apiserver: a bare cluster fails the CRD checks; a correct
//! install passes (the binary exits 0); each broken item is then reported with its fix and a
//! non-zero exit.

#[path = "support/apply.rs"]
#[allow(dead_code)]
mod apply;
#[path = "support/controlplane.rs"]
mod controlplane;

use std::process::Command;

use controlplane::ControlPlane;
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::api::core::v1::Namespace;
use k8s_openapi::api::rbac::v1::ClusterRoleBinding;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use kpssh::api::{SSHNodeClass, crds};
use kpssh::cli::doctor::{Check, checks};
use kpssh::k8s::{Cluster, KubeCluster};
use kpssh::sim::SimHost;
use kpssh::sim::world::{host_object, node_class, node_pool, sim_profile};
use kube::api::ObjectMeta;
use serde_json::json;

const NS: &str = "doctor-pool";

fn lease(ns: &str, name: &str, holder: &str) -> Lease {
    Lease {
        metadata: ObjectMeta {
            name: Some(name.into()),
            namespace: Some(ns.into()),
            ..Default::default()
        },
        spec: Some(LeaseSpec {
            holder_identity: Some(holder.into()),
            lease_duration_seconds: Some(15),
            renew_time: Some(MicroTime(jiff::Timestamp::now())),
            ..Default::default()
        }),
    }
}

fn failed(checks: &[Check]) -> Vec<&Check> {
    checks.iter().filter(|c| !c.ok).collect()
}

fn doctor(kubeconfig: &std::path::Path) -> (i32, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_kpssh"))
        .args(["doctor", "-n", NS])
        .env("KUBECONFIG", kubeconfig)
        .env_remove("KPSSH_POOL_NAMESPACE")
        .output()
        .expect("kpssh doctor");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn doctor_passes_a_correct_install_and_names_each_broken_item() {
    let cp = ControlPlane::shared();
    let client = cp.client().await;
    let c = KubeCluster::new(client.clone());
    let kubeconfig = cp.kubeconfig_path().to_path_buf();
    let now = || jiff::Timestamp::now();

    // A bare cluster: the CRDs are missing, with the command that installs them.
    let bare = checks(&c, NS, NS, "kpssh-controller", now()).await;
    let crd = bare
        .iter()
        .find(|x| x.name == "CRD nodepools.karpenter.sh")
        .expect("checked");
    assert!(
        !crd.ok && crd.detail.contains("kpssh crds --karpenter"),
        "{crd:?}"
    );
    let (code, _) = doctor(&kubeconfig);
    assert_eq!(code, 1);

    // A correct install.
    cp.install_crds(&crds::to_yaml(&crds::kpssh_crds()).expect("yaml"))
        .await;
    cp.install_crds(&crds::to_yaml(&crds::karpenter_crds()).expect("yaml"))
        .await;
    c.create(&Namespace {
        metadata: ObjectMeta {
            name: Some(NS.into()),
            ..Default::default()
        },
        ..Default::default()
    })
    .await
    .expect("ns");
    let rbac = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/examples/bootstrap-rbac.yaml"
    ))
    .expect("rbac");
    for obj in apply::parse_docs(&rbac) {
        apply::apply(&client, &obj, false)
            .await
            .expect("apply rbac");
    }
    // The harness runs kube-scheduler without leader election; a scheduler as clusters run it
    // holds this Lease, which is what doctor looks for.
    c.create(&lease("kube-system", "kube-scheduler", "sched-1"))
        .await
        .expect("scheduler lease");
    c.create(&lease(NS, "kpssh-controller", "kpssh-1"))
        .await
        .expect("controller lease");
    c.create(&sim_profile("doc-prof", "1"))
        .await
        .expect("profile");
    c.create(&node_class("doc-class", "doc-prof"))
        .await
        .expect("class");
    c.create(&host_object(
        NS,
        "doc-host",
        "small",
        &SimHost::new("10.9.9.9", 2, 1),
    ))
    .await
    .expect("host");
    c.create(&node_pool("doc-pool", "doc-class"))
        .await
        .expect("nodepool");
    let good = checks(&c, NS, NS, "kpssh-controller", now()).await;
    assert!(failed(&good).is_empty(), "{:#?}", failed(&good));
    let (code, text) = doctor(&kubeconfig);
    assert_eq!(code, 0, "{text}");
    assert!(text.contains("0 failed"), "{text}");

    // Each broken item, reported with its fix.
    let _: SSHNodeClass = c
        .patch(None, "doc-class", &json!({"spec": {"cluster": null}}))
        .await
        .expect("drop spec.cluster");
    c.create(&node_pool("doc-orphan", "no-such-class"))
        .await
        .expect("nodepool");
    c.delete::<ClusterRoleBinding>(None, "kpssh-node-bootstrapper", None)
        .await
        .expect("delete binding");
    c.delete::<Lease>(Some(NS), "kpssh-controller", None)
        .await
        .expect("delete lease");
    c.create(&host_object(
        NS,
        "lonely",
        "gpu",
        &SimHost::new("10.9.9.8", 2, 1),
    ))
    .await
    .expect("host");
    let _: SSHNodeClass = c
        .patch(
            None,
            "doc-class",
            &json!({"spec": {"hostSelector": {"matchLabels": {"karpenter.dklesev.github.io/host-class": "small"}}}}),
        )
        .await
        .expect("selector");
    let broken = checks(&c, NS, NS, "kpssh-controller", now()).await;
    let expect = [
        ("SSHNodeClass doc-class cluster endpoint", "spec.cluster"),
        ("NodePool doc-orphan", "SSHNodeClass no-such-class"),
        ("bootstrap RBAC", "examples/bootstrap-rbac.yaml"),
        (
            "controller Lease doctor-pool/kpssh-controller",
            "start the controller",
        ),
        ("host class gpu", "hostSelector"),
    ];
    for (name, fix) in expect {
        let check = broken
            .iter()
            .find(|x| x.name == name)
            .unwrap_or_else(|| panic!("no check {name}: {broken:#?}"));
        assert!(!check.ok, "{check:?}");
        assert!(check.detail.contains(fix), "{check:?}");
    }
    assert_eq!(
        failed(&broken).len(),
        expect.len(),
        "{:#?}",
        failed(&broken)
    );
    let (code, text) = doctor(&kubeconfig);
    assert_eq!(code, 1, "{text}");
    assert!(text.contains("FAIL NodePool doc-orphan"), "{text}");
}
