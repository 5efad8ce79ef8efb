//! The Helm chart `charts/kpssh`, checked with the real `helm` (built by scripts/helm.sh) and the
//! real kube-apiserver: lint, render with defaults and with every optional object, assertions on
//! the rendered objects, server-side dry-run of every object, and the chart's RBAC applied for
//! real with the controller binary running under the chart's service account identity.

#[path = "support/apply.rs"]
mod apply;
#[path = "support/controlplane.rs"]
mod controlplane;
#[path = "support/helm.rs"]
mod helm;
#[path = "chart/network_policy.rs"]
mod network_policy;
#[path = "chart/shards.rs"]
mod shards;

use std::collections::BTreeSet;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use apply::apply;
use controlplane::ControlPlane;
use helm::{CHART, render, run_helm};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Secret};
use kpssh::api::{SSHHost, SSHJoinProfile, crds};
use kpssh::k8s::{Cluster, ClusterError, KubeCluster};
use serde_json::{Value, json};

/// Every optional object of the chart switched on.
const ALL_ON: &[&str] = &[
    "serviceMonitor.enabled=true",
    "prometheusRule.enabled=true",
    "networkPolicy.enabled=true",
    "networkPolicy.sshCIDRs={10.20.0.0/16,192.0.2.7/32}",
    "networkPolicy.apiServerCIDRs={172.18.0.2/32}",
    "podDisruptionBudget.enabled=true",
    "dashboard.enabled=true",
];
fn of_kind<'a>(objs: &'a [Value], kind: &str) -> Vec<&'a Value> {
    objs.iter().filter(|o| o["kind"] == kind).collect()
}

fn one<'a>(objs: &'a [Value], kind: &str) -> &'a Value {
    let found = of_kind(objs, kind);
    assert_eq!(found.len(), 1, "expected one {kind}, got {}", found.len());
    found[0]
}

fn kinds(objs: &[Value]) -> Vec<String> {
    let mut k: Vec<String> = objs
        .iter()
        .map(|o| o["kind"].as_str().unwrap_or("?").to_string())
        .collect();
    k.sort();
    k
}

fn strings(v: &Value) -> BTreeSet<String> {
    v.as_array()
        .map(|a| {
            a.iter()
                .filter_map(|s| s.as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default()
}

#[test]
fn helm_lint_passes_with_defaults_and_every_optional_object() {
    run_helm(&["lint", "--strict", CHART]).unwrap_or_else(|e| panic!("helm lint: {e}"));
    let mut args = vec!["lint", "--strict", CHART];
    for s in ALL_ON {
        args.extend(["--set", s]);
    }
    run_helm(&args).unwrap_or_else(|e| panic!("helm lint (all on): {e}"));
}

#[test]
fn defaults_render_a_hardened_elected_controller() {
    let objs = render("kpssh", "kpssh-system", &[]).expect("render");
    let mut want = vec![
        "ClusterRole",
        "ClusterRoleBinding",
        "Deployment",
        "Role",
        "Role",
        "Role",
        "Role",
        "RoleBinding",
        "RoleBinding",
        "RoleBinding",
        "RoleBinding",
        "Service",
        "ServiceAccount",
        "ValidatingAdmissionPolicy",
        "ValidatingAdmissionPolicy",
        "ValidatingAdmissionPolicyBinding",
        "ValidatingAdmissionPolicyBinding",
    ];
    want.sort();
    assert_eq!(
        kinds(&objs),
        want,
        "optional objects must be off by default"
    );

    let dep = one(&objs, "Deployment");
    // HA: two replicas elect a leader through a Lease, so pods are replaced one at a time.
    assert_eq!(dep["spec"]["replicas"], 2);
    assert_eq!(
        dep["spec"]["strategy"],
        json!({"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}})
    );
    let pod = &dep["spec"]["template"]["spec"];
    // Replicas prefer different nodes, so losing one node leaves a standby.
    assert_eq!(
        pod["affinity"]["podAntiAffinity"],
        json!({"preferredDuringSchedulingIgnoredDuringExecution": [{"weight": 100,
            "podAffinityTerm": {"topologyKey": "kubernetes.io/hostname", "labelSelector":
                {"matchLabels": {"app.kubernetes.io/name": "kpssh",
                                 "app.kubernetes.io/instance": "kpssh"}}}}]})
    );
    assert_eq!(pod["securityContext"]["runAsNonRoot"], true);
    assert_eq!(
        pod["securityContext"]["seccompProfile"]["type"],
        "RuntimeDefault"
    );
    assert!(pod["securityContext"]["runAsUser"].as_i64().unwrap_or(0) > 0);
    // Shutdown grace 60 s plus 15 s, so SIGKILL never cuts a phase the controller still allows.
    assert_eq!(pod["terminationGracePeriodSeconds"], 75);
    let c = &pod["containers"][0];
    assert_eq!(c["args"], json!(["controller"]));
    let sc = &c["securityContext"];
    assert_eq!(sc["allowPrivilegeEscalation"], false);
    assert_eq!(sc["readOnlyRootFilesystem"], true);
    assert_eq!(sc["privileged"], false);
    assert_eq!(sc["capabilities"]["drop"], json!(["ALL"]));
    assert_eq!(sc["seccompProfile"]["type"], "RuntimeDefault");
    assert_eq!(c["livenessProbe"]["httpGet"]["path"], "/healthz");
    assert_eq!(c["readinessProbe"]["httpGet"]["path"], "/readyz");
    // The controller stays off nodes any Karpenter manages (they can be drained by it).
    let terms = &pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
        ["nodeSelectorTerms"];
    assert_eq!(
        terms,
        &json!([{"matchExpressions": [{"key": "karpenter.sh/nodepool", "operator": "DoesNotExist"}]}])
    );

    // Every KPSSH_* variable the chart sets is one `kpssh controller` reads.
    let help = Command::new(env!("CARGO_BIN_EXE_kpssh"))
        .args(["controller", "--help"])
        .output()
        .expect("kpssh controller --help");
    let help = String::from_utf8_lossy(&help.stdout);
    let env = c["env"].as_array().expect("env");
    let mut names = Vec::new();
    for e in env {
        let name = e["name"].as_str().expect("env name");
        if name.starts_with("KPSSH_") {
            assert!(
                help.contains(&format!("[env: {name}=")),
                "`kpssh controller` has no flag reading {name}:\n{help}"
            );
            names.push(name);
        }
    }
    assert_eq!(names.len(), 14, "{names:?}");
    let value = |name: &str| {
        env.iter()
            .find(|e| e["name"] == name)
            .map(|e| e["value"].clone())
            .unwrap_or_else(|| panic!("no {name}"))
    };
    assert_eq!(value("KPSSH_LEADER_ELECT"), "true");
    // S43: node repair is off unless enabled, as upstream's NodeRepair feature gate.
    assert_eq!(value("KPSSH_NODE_REPAIR"), "false");
    assert_eq!(value("KPSSH_LEADER_ELECTION_NAMESPACE"), "kpssh-system");
    assert_eq!(value("KPSSH_LEADER_ELECTION_ID"), "kpssh-controller");
    // The Lease holder identity starts with the pod's name.
    assert_eq!(
        env.iter()
            .find(|e| e["name"] == "POD_NAME")
            .map(|e| &e["valueFrom"]),
        Some(&json!({"fieldRef": {"fieldPath": "metadata.name"}}))
    );
    let pool = env
        .iter()
        .find(|e| e["name"] == "KPSSH_POOL_NAMESPACE")
        .expect("pool namespace");
    assert_eq!(
        pool["value"], "kpssh-system",
        "defaults to the release namespace"
    );
    let port_of = |var: &str| {
        env.iter()
            .find(|e| e["name"] == var)
            .and_then(|e| e["value"].as_str())
            .and_then(|a| a.rsplit(':').next())
            .and_then(|p| p.parse::<i64>().ok())
    };
    assert_eq!(
        c["ports"][0]["containerPort"].as_i64(),
        port_of("KPSSH_METRICS_ADDR")
    );
    // The kubelet probes /healthz and /readyz on their own port, 8081 as the Go provider's.
    assert_eq!(c["ports"][1]["name"], "http-probes");
    assert_eq!(c["ports"][1]["containerPort"].as_i64(), Some(8081));
    assert_eq!(port_of("KPSSH_HEALTH_ADDR"), Some(8081));
    assert_eq!(c["livenessProbe"]["httpGet"]["port"], "http-probes");
    assert_eq!(c["readinessProbe"]["httpGet"]["port"], "http-probes");
}

#[test]
fn without_leader_election_one_controller_is_replaced_by_recreate() {
    let set = ["leaderElection.enabled=false", "replicas=1"];
    let objs = render("kpssh", "kpssh-system", &set).expect("render");
    let dep = one(&objs, "Deployment");
    assert_eq!(dep["spec"]["replicas"], 1);
    assert_eq!(dep["spec"]["strategy"], json!({"type": "Recreate"}));
    let pod = &dep["spec"]["template"]["spec"];
    assert!(pod["affinity"]["podAntiAffinity"].is_null());
    let env = pod["containers"][0]["env"].as_array().expect("env");
    let elect = env
        .iter()
        .find(|e| e["name"] == "KPSSH_LEADER_ELECT")
        .expect("KPSSH_LEADER_ELECT");
    assert_eq!(elect["value"], "false");
    assert!(!env.iter().any(|e| e["name"] == "KPSSH_LEADER_ELECTION_ID"));
    assert_eq!(of_kind(&objs, "Role").len(), 3, "no Lease Role");
    // Without the Lease a second replica would work on the same hosts: refused.
    let err = render(
        "kpssh",
        "kpssh-system",
        &["leaderElection.enabled=false", "replicas=2"],
    )
    .expect_err("two replicas without leader election");
    assert!(err.contains("leaderElection.enabled"), "{err}");
    // Two releases in one namespace get two Leases; an explicit id is used as given.
    let other = render("other", "kpssh-system", &[]).expect("render");
    let id = |objs: &[Value]| {
        one(objs, "Deployment")["spec"]["template"]["spec"]["containers"][0]["env"]
            .as_array()
            .and_then(|env| env.iter().find(|e| e["name"] == "KPSSH_LEADER_ELECTION_ID"))
            .map(|e| e["value"].clone())
    };
    assert_eq!(id(&other), Some(json!("other-kpssh-controller")));
    let named = render("kpssh", "kpssh-system", &["leaderElection.id=fleet-a"]).expect("render");
    assert_eq!(id(&named), Some(json!("fleet-a")));
    let err = render("kpssh", "kpssh-system", &["leaderElection.id=Not_A_Name"])
        .expect_err("invalid Lease name");
    assert!(err.contains("leaderElection"), "{err}");
}

#[test]
fn rbac_is_least_privilege() {
    let objs = render("kp", "ops", &["poolNamespace=fleet"]).expect("render");
    let cluster_role = one(&objs, "ClusterRole");
    let rules = cluster_role["rules"].as_array().expect("rules");
    let verbs_for = |group: &str, resource: &str| -> BTreeSet<String> {
        rules
            .iter()
            .filter(|r| strings(&r["apiGroups"]).contains(group))
            .filter(|r| strings(&r["resources"]).contains(resource))
            .flat_map(|r| strings(&r["verbs"]))
            .collect()
    };
    let set = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<BTreeSet<_>>();
    for r in rules {
        assert!(!strings(&r["verbs"]).contains("*"), "wildcard verb: {r}");
        assert!(
            !strings(&r["resources"]).contains("*"),
            "wildcard resource: {r}"
        );
        assert!(
            !strings(&r["apiGroups"]).contains("*"),
            "wildcard group: {r}"
        );
    }
    // No Secret or ConfigMap access cluster-wide: those are in namespaced Roles only.
    assert!(verbs_for("", "secrets").is_empty());
    assert!(verbs_for("", "configmaps").is_empty());
    let g = "karpenter.dklesev.github.io";
    // SSHHost spec: read-only; status writable.
    assert_eq!(verbs_for(g, "sshhosts"), set(&["get", "list", "watch"]));
    assert_eq!(
        verbs_for(g, "sshhosts/status"),
        set(&["get", "update", "patch"])
    );
    // SSHJoinProfile: read plus patch for the finalizer (the spec guard below covers spec).
    assert_eq!(
        verbs_for(g, "sshjoinprofiles"),
        set(&["get", "list", "watch", "patch"])
    );
    assert!(verbs_for(g, "sshjoinprofiles/status").is_empty());
    assert_eq!(
        verbs_for(g, "sshnodeclasses/status"),
        set(&["get", "update", "patch"])
    );
    assert_eq!(
        verbs_for("karpenter.sh", "nodepools"),
        set(&["get", "list", "watch"])
    );
    // NodePool status: the Ready, ValidationSucceeded and NodeClassReady conditions.
    assert_eq!(
        verbs_for("karpenter.sh", "nodepools/status"),
        set(&["get", "update", "patch"])
    );
    assert_eq!(
        verbs_for("karpenter.sh", "nodeclaims"),
        set(&["get", "list", "watch", "create", "patch", "delete"])
    );
    assert_eq!(verbs_for("", "pods/eviction"), set(&["create"]));
    // S56: volume topology and namespaceSelector, read only.
    assert_eq!(verbs_for("storage.k8s.io", "storageclasses"), set(&["get"]));
    assert_eq!(verbs_for("", "namespaces"), set(&["list"]));
    assert!(!verbs_for("", "pods").contains("create"));
    assert!(verbs_for("coordination.k8s.io", "leases").is_empty());

    let roles = of_kind(&objs, "Role");
    let role_in = |ns: &str| -> &Value {
        let found: Vec<_> = roles
            .iter()
            .filter(|r| r["metadata"]["namespace"] == ns)
            .collect();
        assert_eq!(found.len(), 1, "one Role in {ns}");
        found[0]
    };
    // The leader Lease, in the release namespace only: create, then read and renew this
    // release's Lease by name.
    let leases = role_in("ops");
    assert_eq!(
        leases["rules"],
        json!([
            {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["create"]},
            {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"],
             "resourceNames": ["kp-kpssh-controller"], "verbs": ["get", "update"]}
        ])
    );
    let pool = role_in("fleet");
    assert_eq!(
        pool["rules"],
        json!([{"apiGroups": [""], "resources": ["secrets"], "verbs": ["get", "list", "watch"]}])
    );
    // kube-system: create and delete bootstrap tokens, never read a Secret there (#23); the
    // bootstrap-token guard narrows which Secrets (tests/token_guard.rs).
    let tokens = role_in("kube-system");
    assert_eq!(tokens["rules"].as_array().map(Vec::len), Some(1));
    assert_eq!(strings(&tokens["rules"][0]["resources"]), set(&["secrets"]));
    assert_eq!(
        strings(&tokens["rules"][0]["verbs"]),
        set(&["create", "delete"])
    );
    let public = role_in("kube-public");
    assert_eq!(
        public["rules"],
        json!([{"apiGroups": [""], "resources": ["configmaps"],
                "resourceNames": ["cluster-info"], "verbs": ["get"]}])
    );
    // Every binding names the chart's service account in the release namespace.
    for b in of_kind(&objs, "RoleBinding")
        .into_iter()
        .chain(of_kind(&objs, "ClusterRoleBinding"))
    {
        assert_eq!(
            b["subjects"],
            json!([{"kind": "ServiceAccount", "name": "kp-kpssh", "namespace": "ops"}])
        );
    }
    // The spec guard and the bootstrap-token guard match the same identity, each bound.
    let vaps = of_kind(&objs, "ValidatingAdmissionPolicy");
    let names: BTreeSet<String> = vaps
        .iter()
        .filter_map(|v| v["metadata"]["name"].as_str().map(str::to_string))
        .collect();
    assert_eq!(
        names,
        set(&["kp-kpssh-spec-guard", "kp-kpssh-bootstrap-tokens"])
    );
    for vap in vaps {
        let cond = vap["spec"]["matchConditions"][0]["expression"]
            .as_str()
            .expect("expression");
        assert!(
            cond.contains("system:serviceaccount:ops:kp-kpssh"),
            "{cond}"
        );
    }
    let bound: BTreeSet<String> = of_kind(&objs, "ValidatingAdmissionPolicyBinding")
        .iter()
        .filter_map(|b| b["spec"]["policyName"].as_str().map(str::to_string))
        .collect();
    assert_eq!(bound, names);
}

#[test]
fn every_optional_object_renders_and_affinity_is_merged() {
    let mut set: Vec<&str> = ALL_ON.to_vec();
    set.push("affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms[0].matchExpressions[0].key=example.com/ops");
    set.push("affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms[0].matchExpressions[0].operator=Exists");
    let objs = render("kpssh", "kpssh-system", &set).expect("render");
    for kind in [
        "ServiceMonitor",
        "PrometheusRule",
        "NetworkPolicy",
        "PodDisruptionBudget",
    ] {
        one(&objs, kind);
    }
    let dashboards = of_kind(&objs, "ConfigMap");
    assert_eq!(dashboards.len(), 1, "the dashboard ConfigMap");
    assert_eq!(
        dashboards[0]["metadata"]["labels"]["grafana_dashboard"], "1",
        "the label Grafana's sidecar looks for"
    );
    let shipped: Value = serde_json::from_str(&dashboard_text()).expect("dashboard JSON");
    let in_map: Value = serde_json::from_str(
        dashboards[0]["data"]["kpssh.json"]
            .as_str()
            .expect("kpssh.json key"),
    )
    .expect("the ConfigMap holds valid JSON");
    assert_eq!(
        in_map, shipped,
        "the ConfigMap carries the shipped dashboard unchanged"
    );
    // The user's term keeps its expression and gains the managed-node rule (terms are ORed, so
    // the rule must be in each of them).
    let terms = &one(&objs, "Deployment")["spec"]["template"]["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
        ["nodeSelectorTerms"];
    assert_eq!(
        terms,
        &json!([{"matchExpressions": [
            {"key": "example.com/ops", "operator": "Exists"},
            {"key": "karpenter.sh/nodepool", "operator": "DoesNotExist"}
        ]}])
    );
    let np = one(&objs, "NetworkPolicy");
    assert_eq!(np["spec"]["policyTypes"], json!(["Ingress", "Egress"]));
    let pdb = one(&objs, "PodDisruptionBudget");
    assert_eq!(pdb["spec"]["maxUnavailable"], 1);
    let sm = one(&objs, "ServiceMonitor");
    assert_eq!(sm["spec"]["endpoints"][0]["path"], "/metrics");
}

#[test]
fn pdb_refuses_settings_that_would_block_drains() {
    let base = ["podDisruptionBudget.enabled=true"];
    let refused: &[&[&str]] = &[
        &["podDisruptionBudget.maxUnavailable=0"],
        &["podDisruptionBudget.maxUnavailable=0%"],
        // One replica: it must be allowed to go.
        &[
            "replicas=1",
            "podDisruptionBudget.maxUnavailable=null",
            "podDisruptionBudget.minAvailable=1",
        ],
        // Two replicas (the default): at least one must be allowed to go.
        &[
            "podDisruptionBudget.maxUnavailable=null",
            "podDisruptionBudget.minAvailable=2",
        ],
        &[
            "podDisruptionBudget.maxUnavailable=null",
            "podDisruptionBudget.minAvailable=100%",
        ],
        &[
            "podDisruptionBudget.maxUnavailable=null",
            "podDisruptionBudget.minAvailable=60%",
        ],
        // Both set: ambiguous, refused.
        &["podDisruptionBudget.minAvailable=0"],
    ];
    for extra in refused {
        let set: Vec<&str> = base.iter().chain(extra.iter()).copied().collect();
        let err = render("kpssh", "kpssh-system", &set)
            .err()
            .unwrap_or_else(|| panic!("{set:?} must be refused"));
        assert!(err.contains("podDisruptionBudget"), "{set:?}: {err}");
    }
    let accepted: &[&[&str]] = &[
        &[],
        &["podDisruptionBudget.maxUnavailable=2"],
        &[
            "podDisruptionBudget.maxUnavailable=null",
            "podDisruptionBudget.minAvailable=0",
        ],
        // With two replicas a standby stays up while the other pod is evicted.
        &[
            "podDisruptionBudget.maxUnavailable=null",
            "podDisruptionBudget.minAvailable=1",
        ],
        &[
            "podDisruptionBudget.maxUnavailable=null",
            "podDisruptionBudget.minAvailable=50%",
        ],
    ];
    for extra in accepted {
        let set: Vec<&str> = base.iter().chain(extra.iter()).copied().collect();
        let objs = render("kpssh", "kpssh-system", &set)
            .unwrap_or_else(|e| panic!("{set:?} must be accepted: {e}"));
        one(&objs, "PodDisruptionBudget");
    }
    // No replica at all is refused by the schema (replicas without leader election: see
    // `without_leader_election_one_controller_is_replaced_by_recreate`).
    let err = render("kpssh", "kpssh-system", &["replicas=0"]).expect_err("replicas=0");
    assert!(err.contains("replicas"), "{err}");
    // So does a value the controller would reject at start.
    let err =
        render("kpssh", "kpssh-system", &["controller.probeInterval=1.5h"]).expect_err("1.5h");
    assert!(err.contains("probeInterval"), "{err}");
}

/// Minimal prometheus-operator CRDs, so the dry run validates the ServiceMonitor and
/// PrometheusRule kinds, their group/version and their metadata (their specs are open).
fn monitoring_crds() -> String {
    let crd = |kind: &str, plural: &str| {
        format!(
            r#"apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata:
  name: {plural}.monitoring.coreos.com
spec:
  group: monitoring.coreos.com
  scope: Namespaced
  names:
    kind: {kind}
    plural: {plural}
    singular: {singular}
  versions:
    - name: v1
      served: true
      storage: true
      schema:
        openAPIV3Schema:
          type: object
          properties:
            spec:
              type: object
              x-kubernetes-preserve-unknown-fields: true
"#,
            singular = kind.to_lowercase()
        )
    };
    format!(
        "{}---\n{}",
        crd("ServiceMonitor", "servicemonitors"),
        crd("PrometheusRule", "prometheusrules")
    )
}

async fn install_all_crds(cp: &ControlPlane) {
    let yaml = format!(
        "{}{}---\n{}",
        crds::to_yaml(&crds::kpssh_crds()).expect("yaml"),
        crds::to_yaml(&crds::karpenter_crds()).expect("yaml"),
        monitoring_crds()
    );
    cp.install_crds(&yaml).await;
}

async fn ensure_namespace(c: &KubeCluster, name: &str) {
    let ns: Namespace = serde_json::from_value(json!({"metadata": {"name": name}})).expect("ns");
    match c.create(&ns).await {
        Ok(_) | Err(ClusterError::AlreadyExists { .. }) => {}
        Err(e) => panic!("namespace {name}: {e}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rendered_manifests_pass_server_side_dry_run() {
    let cp = ControlPlane::shared();
    install_all_crds(cp).await;
    let client = cp.client().await;
    let c = KubeCluster::new(client.clone());
    ensure_namespace(&c, "kpssh-dry").await;
    ensure_namespace(&c, "kube-public").await;
    for set in [&[][..], ALL_ON] {
        let objs = render("dry", "kpssh-dry", set).expect("render");
        for obj in &objs {
            apply(&client, obj, true).await.unwrap_or_else(|e| {
                panic!("the API server refused a rendered object (set {set:?}): {e}")
            });
        }
    }
    // The dry run validates for real: a broken object is refused, not waved through.
    let mut objs = render("dry", "kpssh-dry", ALL_ON).expect("render");
    let dep = objs
        .iter_mut()
        .find(|o| o["kind"] == "Deployment")
        .expect("deployment");
    dep["spec"]["template"]["spec"]["containers"][0]["securityContext"]["runAsUser"] =
        json!("not-a-number");
    let err = apply(&client, dep, true).await.expect_err("invalid object");
    assert!(err.contains("runAsUser"), "{err}");
}

/// `GET path` on the controller's endpoint: (status code, body), or None if it does not answer.
async fn http_get(addr: &str, path: &str) -> Option<(u16, String)> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let exchange = async {
        let mut s = tokio::net::TcpStream::connect(addr).await.ok()?;
        let req = format!("GET {path} HTTP/1.1\r\nhost: {addr}\r\nconnection: close\r\n\r\n");
        s.write_all(req.as_bytes()).await.ok()?;
        let mut buf = Vec::new();
        s.read_to_end(&mut buf).await.ok()?;
        let text = String::from_utf8_lossy(&buf).into_owned();
        let code = text.split_whitespace().nth(1)?.parse().ok()?;
        let body = text.split_once("\r\n\r\n").map(|(_, b)| b.to_string())?;
        Some((code, body))
    };
    tokio::time::timeout(Duration::from_secs(5), exchange)
        .await
        .ok()
        .flatten()
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

/// The metric sample names a Prometheus text exposition offers: a gauge `x` as `x`, a counter
/// as `x_total`, a histogram as `x_bucket`, `x_sum` and `x_count`.
pub fn exposed_names(exposition: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    for line in exposition.lines() {
        let mut words = line.split_whitespace();
        if (words.next(), words.next()) != (Some("#"), Some("TYPE")) {
            continue;
        }
        let (Some(name), Some(kind)) = (words.next(), words.next()) else {
            continue;
        };
        let name = name.trim_end_matches("_total");
        match kind {
            "counter" => {
                names.insert(format!("{name}_total"));
            }
            "histogram" => {
                for suffix in ["bucket", "sum", "count"] {
                    names.insert(format!("{name}_{suffix}"));
                }
            }
            _ => {
                names.insert(name.to_string());
            }
        }
    }
    names
}

/// Every `kpssh_…` identifier in a PromQL text.
pub fn referenced_names(promql: &str) -> BTreeSet<String> {
    let mut out = referenced_with(promql, "kpssh_");
    // S59: Karpenter core's names, which kpssh exposes beside its own.
    out.extend(referenced_with(promql, "karpenter_"));
    out
}

fn referenced_with(promql: &str, prefix: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let bytes = promql.as_bytes();
    let mut i = 0;
    while let Some(pos) = promql[i..].find(prefix) {
        let start = i + pos;
        let boundary =
            start == 0 || !(bytes[start - 1].is_ascii_alphanumeric() || bytes[start - 1] == b'_');
        let mut end = start;
        while end < bytes.len() && (bytes[end].is_ascii_alphanumeric() || bytes[end] == b'_') {
            end += 1;
        }
        if boundary {
            out.insert(promql[start..end].to_string());
        }
        i = end;
    }
    out
}

/// The alert expressions of the rendered PrometheusRule.
fn alert_exprs(objs: &[Value]) -> Vec<String> {
    one(objs, "PrometheusRule")["spec"]["groups"]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|g| g["rules"].as_array().cloned().unwrap_or_default())
        .filter_map(|r| r["expr"].as_str().map(str::to_string))
        .collect()
}

struct Killed(std::process::Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The chart's RBAC and spec guard, applied for real: the controller binary, running as the
/// chart's service account, gets through its start (every watch it needs lists and watches) and
/// serves metrics, while everything the chart does not grant is refused by the API server.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chart_rbac_runs_the_controller_and_refuses_everything_else() {
    const NS: &str = "kpssh-ops";
    const POOL: &str = "kpssh-fleet";
    let cp = ControlPlane::shared();
    install_all_crds(cp).await;
    let client = cp.client().await;
    let admin = KubeCluster::new(client.clone());
    for ns in [NS, POOL, "kube-public"] {
        ensure_namespace(&admin, ns).await;
    }
    let mut set: Vec<&str> = ALL_ON.to_vec();
    set.push("poolNamespace=kpssh-fleet");
    let objs = render("rbac", NS, &set).expect("render");
    for obj in &objs {
        let kind = obj["kind"].as_str().unwrap_or_default();
        if kind.contains("Role")
            || kind.starts_with("ValidatingAdmissionPolicy")
            || kind == "ServiceAccount"
        {
            apply(&client, obj, false)
                .await
                .unwrap_or_else(|e| panic!("apply: {e}"));
        }
    }
    let user = format!("system:serviceaccount:{NS}:rbac-kpssh");
    let groups = ["system:serviceaccounts", "system:serviceaccounts:kpssh-ops"];
    let sa = KubeCluster::new(cp.client_for(&user, &groups).await);

    // Objects the checks below touch, created by the admin.
    let secret = |ns: &str, name: &str| -> Secret {
        serde_json::from_value(json!({
            "metadata": {"name": name, "namespace": ns},
            "stringData": {"privateKey": "not a key"}
        }))
        .expect("secret")
    };
    let cm = |name: &str| -> ConfigMap {
        serde_json::from_value(json!({
            "metadata": {"name": name, "namespace": "kube-public"},
            "data": {"kubeconfig": "clusters: []\n"}
        }))
        .expect("configmap")
    };
    for obj in [secret(POOL, "host-key"), secret("kube-system", "unrelated")] {
        match admin.create(&obj).await {
            Ok(_) | Err(ClusterError::AlreadyExists { .. }) => {}
            Err(e) => panic!("{e}"),
        }
    }
    for obj in [cm("cluster-info"), cm("other")] {
        match admin.create(&obj).await {
            Ok(_) | Err(ClusterError::AlreadyExists { .. }) => {}
            Err(e) => panic!("{e}"),
        }
    }
    let profile = kpssh::sim::world::sim_profile("rbac-profile", "1");
    match admin.create(&profile).await {
        Ok(_) | Err(ClusterError::AlreadyExists { .. }) => {}
        Err(e) => panic!("{e}"),
    }
    let mut host = kpssh::sim::world::host_object(
        POOL,
        "rbac-host",
        "rbac-class",
        &kpssh::sim::SimHost::new("127.0.0.1", 2, 1),
    );
    // Nothing listens on port 1: the probe fails fast and the host goes Unhealthy.
    host.spec.port = 1;
    host.spec.ssh_key_secret_ref.name = "host-key".into();
    match admin.create(&host).await {
        Ok(_) | Err(ClusterError::AlreadyExists { .. }) => {}
        Err(e) => panic!("{e}"),
    }

    let forbidden = |r: Result<(), ClusterError>, what: &str| match r {
        Err(ClusterError::Forbidden { message, .. }) => message,
        other => panic!("{what} must be forbidden, got {other:?}"),
    };
    // Secrets: read in the pool namespace, nothing else there.
    let got: Option<Secret> = sa
        .get(Some(POOL), "host-key")
        .await
        .expect("get pool secret");
    assert!(got.is_some());
    // Listed and watched in the pool namespace only: a rotated key or pin is probed at once (S63).
    sa.list::<Secret>(Some(POOL), None)
        .await
        .expect("list pool secrets");
    forbidden(
        sa.create(&secret(POOL, "planted")).await.map(|_| ()),
        "creating a secret in the pool namespace",
    );
    forbidden(
        sa.list::<Secret>(Some("kube-system"), None)
            .await
            .map(|_| ()),
        "listing kube-system secrets",
    );
    forbidden(
        sa.get::<Secret>(Some("default"), "anything")
            .await
            .map(|_| ()),
        "reading a secret outside the pool and kube-system",
    );
    // Bootstrap tokens: create and delete the controller's own in kube-system, never read.
    let token = kpssh::actors::host::launch::token_secret(
        "rbac01",
        "0123456789abcdef",
        jiff::Timestamp::now() + jiff::SignedDuration::from_hours(1),
        "chart RBAC test",
    );
    sa.create(&token).await.expect("create a token secret");
    forbidden(
        sa.get::<Secret>(Some("kube-system"), "bootstrap-token-rbac01")
            .await
            .map(|_| ()),
        "reading a token secret",
    );
    sa.delete::<Secret>(Some("kube-system"), "bootstrap-token-rbac01", None)
        .await
        .expect("delete a token secret");
    // kube-public: cluster-info and nothing else.
    let info: Option<ConfigMap> = sa
        .get(Some("kube-public"), "cluster-info")
        .await
        .expect("cluster-info");
    assert!(info.is_some());
    forbidden(
        sa.get::<ConfigMap>(Some("kube-public"), "other")
            .await
            .map(|_| ()),
        "another kube-public ConfigMap",
    );
    // SSHJoinProfile: the finalizer may change, the spec may not (spec guard), no create.
    sa.patch::<SSHJoinProfile>(
        None,
        "rbac-profile",
        &json!({"metadata": {"finalizers": ["karpenter.dklesev.github.io/termination"]}}),
    )
    .await
    .expect("the finalizer patch is allowed");
    let denied = forbidden(
        sa.patch::<SSHJoinProfile>(None, "rbac-profile", &json!({"spec": {"version": "2"}}))
            .await
            .map(|_| ()),
        "a profile spec change",
    );
    assert!(
        denied.contains("never their spec"),
        "the spec guard said: {denied}"
    );
    forbidden(
        sa.create(&kpssh::sim::world::sim_profile("planted", "1"))
            .await
            .map(|_| ()),
        "creating a profile",
    );
    sa.patch::<SSHJoinProfile>(
        None,
        "rbac-profile",
        &json!({"metadata": {"finalizers": []}}),
    )
    .await
    .expect("the finalizer comes off again");
    // SSHHost: no spec writes at all (RBAC), status writes allowed.
    forbidden(
        sa.patch::<SSHHost>(Some(POOL), "rbac-host", &json!({"spec": {"user": "admin"}}))
            .await
            .map(|_| ()),
        "a host spec change",
    );
    // Leases: only this release's, only in the release namespace.
    let lease = |ns: &str, name: &str| -> Lease {
        serde_json::from_value(json!({"metadata": {"name": name, "namespace": ns}})).expect("lease")
    };
    forbidden(
        sa.create(&lease("default", "rbac-kpssh-controller"))
            .await
            .map(|_| ()),
        "creating a Lease outside the release namespace",
    );
    admin
        .create(&lease(NS, "someone-elses"))
        .await
        .map(|_| ())
        .or_else(|e| {
            if matches!(e, ClusterError::AlreadyExists { .. }) {
                Ok(())
            } else {
                Err(e)
            }
        })
        .expect("another Lease");
    forbidden(
        sa.get::<Lease>(Some(NS), "someone-elses").await.map(|_| ()),
        "reading another Lease",
    );

    // The controller binary under the same identity.
    let dir = tempfile::tempdir().expect("tempdir");
    let kubeconfig = dir.path().join("kubeconfig");
    std::fs::write(&kubeconfig, cp.kubeconfig_for(&user, &groups)).expect("kubeconfig");
    let log_path = dir.path().join("controller.log");
    let log = std::fs::File::create(&log_path).expect("log file");
    let addr = format!("127.0.0.1:{}", free_port());
    // The Lease settings exactly as the chart passes them.
    let chart_env = |name: &str| -> String {
        one(&objs, "Deployment")["spec"]["template"]["spec"]["containers"][0]["env"]
            .as_array()
            .and_then(|env| env.iter().find(|e| e["name"] == name))
            .and_then(|e| e["value"].as_str())
            .unwrap_or_else(|| panic!("the chart sets no {name}"))
            .to_string()
    };
    let _controller = Killed(
        Command::new(env!("CARGO_BIN_EXE_kpssh"))
            .args([
                "controller",
                "--metrics-addr",
                &addr,
                "--probe-interval",
                "5s",
            ])
            .env("KUBECONFIG", &kubeconfig)
            .env("KPSSH_POOL_NAMESPACE", POOL)
            .env("KPSSH_LEADER_ELECT", chart_env("KPSSH_LEADER_ELECT"))
            .env(
                "KPSSH_LEADER_ELECTION_NAMESPACE",
                chart_env("KPSSH_LEADER_ELECTION_NAMESPACE"),
            )
            .env(
                "KPSSH_LEADER_ELECTION_ID",
                chart_env("KPSSH_LEADER_ELECTION_ID"),
            )
            .env("RUST_LOG", "info")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("kpssh controller"),
    );
    let logs = || std::fs::read_to_string(&log_path).unwrap_or_default();
    let deadline = Instant::now() + Duration::from_secs(60);
    let metrics = loop {
        assert!(
            Instant::now() < deadline,
            "the controller did not become ready with the chart's RBAC within 60 s:\n{}",
            logs()
        );
        if let Some((200, _)) = http_get(&addr, "/readyz").await {
            // Ready means every watch delivered its first list; wait for the host's first probe
            // to be counted too, so the pool gauge has samples.
            if let Some((200, body)) = http_get(&addr, "/metrics").await
                && body.contains(r#"class="rbac-class""#)
                && body.contains(r#"kpssh_host_probe_duration_seconds_count{"#)
            {
                break body;
            }
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    };
    assert_eq!(http_get(&addr, "/healthz").await.map(|r| r.0), Some(200));
    // The probe's status write went through (sshhosts/status), as Unhealthy: nothing listens.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let h: Option<SSHHost> = admin.get(Some(POOL), "rbac-host").await.expect("host");
        let state = h.and_then(|h| h.status).map(|s| s.state);
        if state == Some(kpssh::api::HostState::Unhealthy) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "host state {state:?}:\n{}",
            logs()
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    // It works because it holds the chart's Lease.
    let held: Option<Lease> = admin
        .get(Some(NS), "rbac-kpssh-controller")
        .await
        .expect("lease");
    assert!(
        held.and_then(|l| l.spec)
            .and_then(|s| s.holder_identity)
            .is_some_and(|h| !h.is_empty()),
        "the controller holds the Lease"
    );
    assert!(metrics.contains("\nkpssh_leader 1\n"), "{metrics}");
    let text = logs();
    assert!(
        !text.to_lowercase().contains("forbidden"),
        "the controller hit a permission error with the chart's RBAC:\n{text}"
    );

    // Every name the live controller exposes is also in the full exposition used below, so that
    // one is the controller's real encoder and registry, not a list kept by hand.
    let live = exposed_names(&metrics);
    let full = exposed_names(&full_exposition());
    assert!(live.contains("kpssh_pool_hosts"), "{live:?}");
    let stray: Vec<_> = live.difference(&full).collect();
    assert!(
        stray.is_empty(),
        "the full exposition misses live names {stray:?}"
    );
}

/// The controller's exposition with every metric family holding a sample: the real `Metrics`
/// registry and encoder (`kpssh::provider::metrics`), with one observation per labelled family,
/// because the encoder leaves a family without samples out entirely (a live controller that
/// never ran a join does not show the join histogram). When a family is added there, touch it
/// here too; the live check above fails if a live name is missing from this one.
fn full_exposition() -> String {
    use kpssh::provider::context::HostView;
    use kpssh::provider::metrics::{
        ActionLabels, ActorLabels, LimitLabels, Metrics, NodePoolLabels, OutcomeLabels,
        PhaseLabels, ReasonLabels, StageLabels,
    };
    let m = Metrics::new();
    m.launch_failed("small", "install");
    let view = HostView::default();
    view.upsert(kpssh::sim::world::host_object(
        "pool",
        "a",
        "small",
        &kpssh::sim::SimHost::new("10.0.0.1", 2, 1),
    ));
    m.probe_duration
        .get_or_create(&OutcomeLabels {
            outcome: "success".into(),
        })
        .observe(0.1);
    m.phase_duration
        .get_or_create(&PhaseLabels {
            phase: "join".into(),
            outcome: "success".into(),
        })
        .observe(1.0);
    m.zombie_actions
        .get_or_create(&ActionLabels {
            action: "leave".into(),
        })
        .inc();
    m.limiter_wait
        .get_or_create(&LimitLabels {
            limit: "phases".into(),
        })
        .observe(0.1);
    m.mailbox_depth
        .get_or_create(&ActorLabels {
            actor: "host".into(),
        })
        .set(1);
    m.provisioning_latency
        .get_or_create(&StageLabels {
            stage: "pod_to_ready".into(),
        })
        .observe(30.0);
    m.disruption_decisions
        .get_or_create(&ReasonLabels {
            reason: "Empty".into(),
        })
        .inc();
    let pool = NodePoolLabels {
        nodepool: "default".into(),
    };
    m.attached_vcpus.get_or_create(&pool).set(4.0);
    m.cost_per_hour.get_or_create(&pool).set(0.08);
    // S59: Karpenter core's families (the scrape-time gauges come from the karpenter layer's
    // state in a live controller; set here directly).
    {
        use kpssh::telemetry::core_metrics::{PodLabels, PoolReasonLabels, PoolResourceLabels};
        let nc = kpssh::sim::world::node_claim("default-1", "pool", "1", "1Gi");
        m.core.created("provisioned", "default");
        m.core.disrupted("Underutilized", &nc);
        m.core.terminated(&nc);
        m.core.decision("delete", "Underutilized", "multi");
        m.core
            .eligible_nodes
            .get_or_create(&kpssh::telemetry::core_metrics::ReasonLabels {
                reason: "underutilized".into(),
            })
            .set(1);
        m.core
            .allowed_disruptions
            .get_or_create(&PoolReasonLabels {
                nodepool: "default".into(),
                reason: "underutilized".into(),
            })
            .set(1);
        let cpu = PoolResourceLabels {
            nodepool: "default".into(),
            resource_type: "cpu".into(),
        };
        m.core.nodepool_usage.get_or_create(&cpu).set(4.0);
        m.core.nodepool_limit.get_or_create(&cpu).set(100.0);
        m.core
            .pods_state
            .get_or_create(&PodLabels {
                name: "p".into(),
                namespace: "default".into(),
                owner: String::new(),
                node: "n".into(),
                nodepool: "default".into(),
                zone: "pool".into(),
                arch: "amd64".into(),
                capacity_type: "on-demand".into(),
                instance_type: "small".into(),
                phase: "Running".into(),
                scheduled: "true".into(),
            })
            .set(1);
    }
    // `kpssh controller` appends the leader gauge to the registry's text.
    let mut text = m.encode(&view);
    text.push_str(&kpssh::k8s::leader::exposition(true));
    // ... and the shard's node classes (`--node-classes`).
    text.push_str(&kpssh::cli::controller::shard_exposition(
        &kpssh::provider::shard::Shard::all(),
    ));
    text
}

/// Label names each exposed sample name carries in an exposition.
fn exposed_labels(exposition: &str) -> std::collections::BTreeMap<String, BTreeSet<String>> {
    let mut out: std::collections::BTreeMap<String, BTreeSet<String>> = Default::default();
    for line in exposition.lines().filter(|l| !l.starts_with('#')) {
        let Some((name, rest)) = line.split_once('{') else {
            continue;
        };
        let labels = rest.split('}').next().unwrap_or_default();
        let entry = out.entry(name.to_string()).or_default();
        for pair in labels.split(',') {
            if let Some((k, _)) = pair.split_once('=') {
                entry.insert(k.trim().to_string());
            }
        }
    }
    out
}

/// `(metric, label)` for every `kpssh_x{label="…"}`-style matcher in a PromQL text.
fn selector_labels(promql: &str) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for name in referenced_names(promql) {
        for (i, _) in promql.match_indices(&format!("{name}{{")) {
            let rest = &promql[i + name.len() + 1..];
            let inner = rest.split('}').next().unwrap_or_default();
            for matcher in inner.split(',') {
                let label: String = matcher
                    .trim()
                    .chars()
                    .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                    .collect();
                if !label.is_empty() {
                    out.push((name.clone(), label));
                }
            }
        }
    }
    out
}

/// Fails with the offending names unless every `kpssh_…` metric and selector label in `exprs`
/// is one the controller exposes.
fn check_references(source: &str, exprs: &[String]) {
    let text = full_exposition();
    let exposed = exposed_names(&text);
    let labels = exposed_labels(&text);
    let mut referenced = BTreeSet::new();
    for expr in exprs {
        referenced.extend(referenced_names(expr));
        for (metric, label) in selector_labels(expr) {
            let known = labels.get(&metric).cloned().unwrap_or_default();
            assert!(
                known.contains(&label),
                "{source}: {metric} has no label {label:?} (it has {known:?}) in {expr}"
            );
        }
    }
    assert!(
        !referenced.is_empty(),
        "{source} references no kpssh metric"
    );
    let missing: Vec<_> = referenced.difference(&exposed).collect();
    assert!(
        missing.is_empty(),
        "{source} references metrics the controller does not expose: {missing:?}\nexposed: {exposed:?}"
    );
}

#[test]
fn alerts_use_only_metrics_the_controller_exposes() {
    let objs = render("kpssh", "kpssh-system", &["prometheusRule.enabled=true"]).expect("render");
    let exprs = alert_exprs(&objs);
    assert_eq!(
        exprs.len(),
        8,
        "unhealthy, zombies, launch failure rate, launches failing, backing off, flapping, no claimable host, nodepool near limit"
    );
    check_references("the PrometheusRule", &exprs);
}

fn dashboard_text() -> String {
    let path = format!("{CHART}/dashboards/kpssh.json");
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"))
}

/// Every panel (rows included) of a dashboard, nested rows flattened.
fn dashboard_panels(d: &Value) -> Vec<Value> {
    let mut out = Vec::new();
    for p in d["panels"].as_array().into_iter().flatten() {
        out.push(p.clone());
        out.extend(p["panels"].as_array().cloned().unwrap_or_default());
    }
    out
}

#[test]
fn dashboard_uses_only_metrics_the_controller_exposes() {
    let d: Value = serde_json::from_str(&dashboard_text()).expect("dashboard JSON");
    assert_eq!(d["uid"], "kpssh-overview");
    let panels = dashboard_panels(&d);
    let mut ids = BTreeSet::new();
    let mut exprs = Vec::new();
    for p in &panels {
        let id = p["id"].as_i64().expect("panel id");
        assert!(ids.insert(id), "panel id {id} twice");
        let grid = &p["gridPos"];
        let width = grid["x"].as_i64().unwrap_or(-1) + grid["w"].as_i64().unwrap_or(99);
        assert!(
            width <= 24,
            "panel {} overflows the 24-column grid",
            p["title"]
        );
        if p["type"] == "row" {
            continue;
        }
        assert_eq!(p["datasource"]["uid"], "${datasource}", "{}", p["title"]);
        let targets = p["targets"].as_array().expect("targets");
        assert!(!targets.is_empty(), "panel {} has no query", p["title"]);
        for t in targets {
            exprs.push(t["expr"].as_str().expect("expr").to_string());
        }
    }
    // What the issue asks the dashboard to show, each by the metric that carries it.
    let all = exprs.join("\n");
    for needle in [
        "sum by (class, state) (kpssh_pool_hosts",
        r#"kpssh_instance_phase_duration_seconds_bucket{phase="join""#,
        r#"kpssh_instance_phase_duration_seconds_bucket{phase="leave""#,
        r#"kpssh_instance_phase_duration_seconds_count{outcome!="success"}"#,
        "kpssh_host_zombie_actions_total",
        // S59: Karpenter core's names.
        "karpenter_nodeclaims_created_total",
        "karpenter_nodeclaims_disrupted_total",
        "karpenter_voluntary_disruption_decisions_total",
        "karpenter_nodepools_usage",
        "karpenter_pods_state",
    ] {
        assert!(all.contains(needle), "no panel shows {needle}");
    }
    for v in d["templating"]["list"].as_array().into_iter().flatten() {
        if let Some(q) = v["definition"].as_str() {
            exprs.push(q.to_string());
        }
    }
    check_references("the Grafana dashboard", &exprs);
}

#[test]
fn metric_name_extraction_is_strict() {
    let exposition = "# HELP kpssh_claims x\n# TYPE kpssh_claims counter\nkpssh_claims_total 1\n\
        # TYPE kpssh_pool_hosts gauge\n# TYPE kpssh_phase_seconds histogram\n";
    let names = exposed_names(exposition);
    for n in [
        "kpssh_claims_total",
        "kpssh_pool_hosts",
        "kpssh_phase_seconds_count",
        "kpssh_phase_seconds_bucket",
    ] {
        assert!(names.contains(n), "{n}");
    }
    assert!(!names.contains("kpssh_claims"));
    assert_eq!(
        selector_labels(r#"sum by (class) (kpssh_pool_hosts{state="Unhealthy", class!~"x"})"#),
        vec![
            ("kpssh_pool_hosts".to_string(), "state".to_string()),
            ("kpssh_pool_hosts".to_string(), "class".to_string())
        ]
    );
    let labels = exposed_labels(&full_exposition());
    assert!(labels["kpssh_instance_phase_duration_seconds_count"].contains("outcome"));
    let refs = referenced_names("sum(rate(kpssh_a_total[5m])) / xkpssh_b + kpssh_c{x=\"kpssh_d\"}");
    assert_eq!(
        refs,
        ["kpssh_a_total", "kpssh_c", "kpssh_d"]
            .iter()
            .map(|s| s.to_string())
            .collect()
    );
}
