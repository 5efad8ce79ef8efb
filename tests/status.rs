//! `kpssh status` against the real test API server: SSHHosts in every interesting state, a
//! node class and profile, a NodeClaim held by a host and a claim whose NodeClaim is gone
//! (S26's stale claim as the operator sees it). Both the table and `-o json` are checked, and
//! the binary is also run as the kubectl plugin `kubectl-kpssh`.

#[path = "support/controlplane.rs"]
mod controlplane;

use std::process::Command;
use std::time::Duration;

use controlplane::ControlPlane;
use k8s_openapi::api::core::v1::Namespace;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kpssh::api::{ClaimRef, HostState, LaunchBackoff, LaunchFailure, SSHHost, SSHHostStatus, crds};
use kpssh::k8s::{Cluster, KubeCluster};
use kpssh::sim::SimHost;
use kpssh::sim::world::{host_object, node_claim, node_class, sim_profile};
use kube::api::ObjectMeta;

const NS: &str = "kpssh-status";

async fn host(c: &KubeCluster, name: &str, class: &str, status: SSHHostStatus) {
    let sim = SimHost::new("10.77.0.1", 2, 2_000_000);
    let created = c
        .create(&host_object(NS, name, class, &sim))
        .await
        .expect("host");
    let mut h: SSHHost = created;
    h.status = Some(status);
    c.replace_status(&h).await.expect("status");
}

fn kpssh(bin: &std::path::Path, kubeconfig: &std::path::Path, args: &[&str]) -> String {
    let out = Command::new(bin)
        .args(args)
        .env("KUBECONFIG", kubeconfig)
        .env_remove("KPSSH_POOL_NAMESPACE")
        .output()
        .expect("run kpssh");
    assert!(
        out.status.success(),
        "{args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("utf8")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_table_and_json_from_a_real_api_server() {
    let cp = ControlPlane::shared();
    let yaml = format!(
        "{}{}",
        crds::to_yaml(&crds::kpssh_crds()).expect("yaml"),
        crds::to_yaml(&crds::karpenter_crds()).expect("yaml")
    );
    cp.install_crds(&yaml).await;
    let c = KubeCluster::new(cp.client().await);
    c.create(&Namespace {
        metadata: ObjectMeta {
            name: Some(NS.into()),
            ..Default::default()
        },
        ..Default::default()
    })
    .await
    .expect("ns");
    c.create(&sim_profile("st-prof", "3"))
        .await
        .expect("profile");
    c.create(&node_class("st-class", "st-prof"))
        .await
        .expect("class");
    let nc = c
        .create(&node_claim("st-claim-1", "st-class", "1", "1Gi"))
        .await
        .expect("nodeclaim");
    let held = ClaimRef {
        name: "st-claim-1".into(),
        uid: nc.metadata.uid.clone().expect("uid"),
    };
    let available = |marker: Option<&str>| SSHHostStatus {
        state: HostState::Available,
        installed_profile: marker.map(str::to_string),
        ..Default::default()
    };
    host(&c, "warm-1", "small", available(Some("st-prof@3"))).await;
    host(&c, "cold-1", "small", available(None)).await;
    host(&c, "old-1", "small", available(Some("st-prof@2"))).await;
    host(
        &c,
        "sick-1",
        "small",
        SSHHostStatus {
            state: HostState::Unhealthy,
            last_probe_error: Some("kpssh-status/sick-1: connection refused".into()),
            ..Default::default()
        },
    )
    .await;
    // S63: Available, but backing off after two failed installs: not claimable.
    host(
        &c,
        "flaky-1",
        "small",
        SSHHostStatus {
            state: HostState::Available,
            launch_backoff: Some(LaunchBackoff {
                failures: 2,
                until: Some(Time("2030-01-02T03:04:05Z".parse().expect("time"))),
                secret_version: None,
            }),
            last_launch_failure: Some(LaunchFailure {
                phase: "install".into(),
                reason: "LaunchFailed".into(),
                exit_status: Some(100),
                message: "E: Unable to locate package kubelet".into(),
                node_claim: Some("gone-claim".into()),
                time: Time("2030-01-02T03:02:05Z".parse().expect("time")),
            }),
            ..Default::default()
        },
    )
    .await;
    host(
        &c,
        "busy-1",
        "big",
        SSHHostStatus {
            state: HostState::InUse,
            installed_profile: Some("st-prof@3".into()),
            claim_ref: Some(held),
            ..Default::default()
        },
    )
    .await;
    host(
        &c,
        "stale-1",
        "big",
        SSHHostStatus {
            state: HostState::Claimed,
            claim_ref: Some(ClaimRef {
                name: "st-gone".into(),
                uid: "0000".into(),
            }),
            ..Default::default()
        },
    )
    .await;
    tokio::time::sleep(Duration::from_millis(100)).await;

    let bin = std::path::PathBuf::from(env!("CARGO_BIN_EXE_kpssh"));
    let kubeconfig = cp.kubeconfig_path().to_path_buf();
    let json = kpssh(&bin, &kubeconfig, &["status", "-n", NS, "-o", "json"]);
    let v: serde_json::Value = serde_json::from_str(&json).expect("json");
    assert_eq!(v["namespace"], NS);
    let classes = v["classes"].as_array().expect("classes");
    assert_eq!(classes.len(), 2, "{json}");
    let small = classes
        .iter()
        .find(|c| c["class"] == "small")
        .expect("small");
    assert_eq!(small["hosts"], 5);
    assert_eq!(small["states"]["Available"], 4);
    assert_eq!(small["states"]["Unhealthy"], 1);
    assert_eq!(small["states"]["InUse"], 0, "zero states are listed");
    assert_eq!(small["backing_off"], 1);
    assert_eq!(
        small["claimable"], 3,
        "the backing-off host is not claimable"
    );
    assert_eq!(
        small["warm"], 1,
        "only the current marker st-prof@3 is warm: {json}"
    );
    let ratio = small["warm_ratio"].as_f64().expect("ratio");
    assert!((ratio - 1.0 / 3.0).abs() < 1e-9);
    let errors = small["errors"].as_array().expect("errors");
    let sick = errors
        .iter()
        .find(|e| e["host"] == "sick-1")
        .expect("sick-1");
    assert_eq!(sick["error"], "kpssh-status/sick-1: connection refused");
    assert_eq!(sick["kind"], "probe");
    let flaky = errors
        .iter()
        .find(|e| e["host"] == "flaky-1")
        .expect("flaky-1");
    assert_eq!(flaky["kind"], "launch");
    assert_eq!(
        flaky["error"],
        "install failed: E: Unable to locate package kubelet"
    );
    assert_eq!(flaky["failed_launches"], 2);
    assert_eq!(flaky["backoff_until"], "2030-01-02T03:04:05Z");
    let big = classes.iter().find(|c| c["class"] == "big").expect("big");
    assert_eq!(big["claimable"], 0);
    assert_eq!(big["warm_ratio"], 0.0);
    let claims = big["claims"].as_array().expect("claims");
    assert_eq!(claims.len(), 2);
    let busy = claims.iter().find(|r| r["host"] == "busy-1").expect("busy");
    assert_eq!(busy["nodeclaim"], "st-claim-1");
    assert_eq!(busy["nodeclaim_found"], true);
    let age = busy["age_seconds"].as_i64().expect("age");
    assert!((0..600).contains(&age), "{age}");
    let stale = claims
        .iter()
        .find(|r| r["host"] == "stale-1")
        .expect("stale");
    assert_eq!(stale["nodeclaim_found"], false);

    let text = kpssh(&bin, &kubeconfig, &["status", "--namespace", NS]);
    let small_line = text
        .lines()
        .find(|l| l.starts_with("small "))
        .expect("small row");
    let cols: Vec<&str> = small_line.split_whitespace().collect();
    // CLASS HOSTS AVAILABLE CLAIMED INUSE LEAVING UNHEALTHY PENDING MAINTENANCE BACKOFF
    // CLAIMABLE WARM
    assert_eq!(
        cols,
        [
            "small", "5", "4", "0", "0", "0", "1", "0", "0", "1", "3", "33%"
        ],
        "{text}"
    );
    assert!(
        text.contains("flaky-1  (small, Available, backing off until 2030-01-02T03:04:05Z after 2 failed launch(es))  install failed: E: Unable to locate package kubelet"),
        "{text}"
    );
    assert!(text.contains("Hosts with errors:"), "{text}");
    assert!(
        text.contains("sick-1  (small, Unhealthy)  kpssh-status/sick-1: connection refused"),
        "{text}"
    );
    let busy_line = text
        .lines()
        .find(|l| l.contains("busy-1"))
        .expect("claim row");
    assert!(
        busy_line.contains("st-claim-1") && busy_line.contains("InUse"),
        "{text}"
    );
    let stale_line = text
        .lines()
        .find(|l| l.contains("stale-1"))
        .expect("stale row");
    assert!(stale_line.contains("gone (stale claim)"), "{text}");

    // The kubectl plugin: same binary, named kubectl-kpssh on PATH.
    let dir = tempfile::tempdir().expect("tempdir");
    let plugin = dir.path().join("kubectl-kpssh");
    std::os::unix::fs::symlink(&bin, &plugin).expect("symlink");
    let as_plugin = kpssh(&plugin, &kubeconfig, &["status", "-n", NS]);
    assert_eq!(without_ages("  busy-1  1s"), without_ages("  busy-1  0s"));
    assert_ne!(without_ages("  busy-1  1s"), without_ages("  busy-2  1s"));
    assert_eq!(
        without_ages(&as_plugin),
        without_ages(&text),
        "the plugin prints the same report"
    );
    let help = kpssh(&plugin, &kubeconfig, &["--help"]);
    assert!(help.contains("kubectl kpssh"), "{help}");
}

/// The report with each row's age (`0s`, `12m`, …) masked: two runs a second apart differ
/// there and nowhere else.
fn without_ages(report: &str) -> String {
    report
        .lines()
        .map(|l| match l.rsplit_once(' ') {
            Some((head, age))
                if age.len() > 1
                    && age[..age.len() - 1].bytes().all(|b| b.is_ascii_digit())
                    && age.ends_with(['s', 'm', 'h', 'd']) =>
            {
                format!("{head} <age>")
            }
            _ => l.to_string(),
        })
        .collect::<Vec<_>>()
        .join("\n")
}
