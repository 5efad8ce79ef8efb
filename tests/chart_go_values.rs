//! The chart accepts the Go provider's chart values (issue #22): kpssh's chart, rendered by the
//! real `helm` with the Go chart's default values file (`tests/fixtures/go-chart-values.yaml`)
//! and common overrides of its keys, passes the strict schema and turns each key into what it
//! meant there; a key neither chart knows is still refused.

#[path = "support/apply.rs"]
#[allow(dead_code)] // only parse_docs, through helm
mod apply;
#[path = "support/helm.rs"]
mod helm;

use std::path::Path;

use helm::{CHART, render_with_values, run_helm};
use serde_json::{Value, json};

fn go_values() -> &'static Path {
    Path::new(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/go-chart-values.yaml"
    ))
}

fn one<'a>(objs: &'a [Value], kind: &str) -> &'a Value {
    let found: Vec<&Value> = objs.iter().filter(|o| o["kind"] == kind).collect();
    assert_eq!(found.len(), 1, "expected one {kind}, got {}", found.len());
    found[0]
}

fn env<'a>(container: &'a Value, name: &str) -> Option<&'a Value> {
    container["env"]
        .as_array()?
        .iter()
        .find(|e| e["name"] == name)
        .map(|e| &e["value"])
}

#[test]
fn the_go_charts_default_values_render_and_lint() {
    let values = go_values().to_string_lossy().into_owned();
    run_helm(&["lint", "--strict", CHART, "-f", &values])
        .unwrap_or_else(|e| panic!("helm lint with the Go values: {e}"));
    let objs = render_with_values("kpssh", "kpssh-system", go_values(), &[]).expect("render");
    let d = one(&objs, "Deployment");
    let pod = &d["spec"]["template"]["spec"];
    let c = &pod["containers"][0];
    // controller.resources, settings.*, healthProbePort, priorityClassName, the contexts.
    assert_eq!(
        c["resources"],
        json!({"requests": {"cpu": "200m", "memory": "256Mi"}})
    );
    assert_eq!(env(c, "BATCH_MAX_DURATION"), Some(&json!("10s")));
    assert_eq!(env(c, "BATCH_IDLE_DURATION"), Some(&json!("1s")));
    assert_eq!(env(c, "RUST_LOG"), Some(&json!("info")));
    assert_eq!(env(c, "KPSSH_HEALTH_ADDR"), Some(&json!("0.0.0.0:8081")));
    assert_eq!(c["livenessProbe"]["httpGet"]["port"], "http-probes");
    assert_eq!(c["readinessProbe"]["httpGet"]["port"], "http-probes");
    let probes = c["ports"]
        .as_array()
        .expect("ports")
        .iter()
        .find(|p| p["name"] == "http-probes")
        .expect("probe port");
    assert_eq!(probes["containerPort"], 8081);
    assert_eq!(pod["priorityClassName"], "system-cluster-critical");
    assert_eq!(pod["terminationGracePeriodSeconds"], 30);
    assert_eq!(pod["securityContext"]["runAsNonRoot"], true);
    assert_eq!(pod["securityContext"]["runAsUser"], 65532);
    assert_eq!(c["securityContext"]["readOnlyRootFilesystem"], true);
    assert_eq!(pod["nodeSelector"], json!({"kubernetes.io/os": "linux"}));
    // The Go affinity term is kept and kpssh's managed-node rule added to it.
    let terms = &pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
        ["nodeSelectorTerms"][0]["matchExpressions"];
    let keys: Vec<&str> = terms
        .as_array()
        .expect("terms")
        .iter()
        .filter_map(|t| t["key"].as_str())
        .collect();
    assert_eq!(
        keys,
        [
            "karpenter.dklesev.github.io/managed",
            "karpenter.sh/nodepool"
        ]
    );
    assert_eq!(d["spec"]["replicas"], 1);
    one(&objs, "Service");
}

#[test]
fn common_overrides_of_the_go_keys_take_effect() {
    let objs = render_with_values(
        "kpssh",
        "kpssh-system",
        go_values(),
        &[
            "image.repository=registry.example/kpssh",
            "image.digest=sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef",
            "settings.logLevel=debug",
            "settings.batchMaxDuration=20s",
            "controller.healthProbePort=9443",
            "controller.env[0].name=EXTRA",
            "controller.env[0].value=yes",
            "rbac.extraRules[0].apiGroups[0]=example.com",
            "rbac.extraRules[0].resources[0]=widgets",
            "rbac.extraRules[0].verbs[0]=get",
            "service.enabled=false",
            "serviceMonitor.enabled=true",
            "serviceMonitor.additionalLabels.release=prom",
            "serviceMonitor.metricRelabelings[0].action=labeldrop",
            "serviceMonitor.metricRelabelings[0].regex=pod",
            "networkPolicy.enabled=true",
            "networkPolicy.sshEgressCIDRs[0]=10.0.0.0/16",
            "networkPolicy.sshPort=2222",
            "networkPolicy.apiServerCIDRs[0]=10.96.0.1/32",
            "podSecurityContext.fsGroup=2000",
            "securityContext.readOnlyRootFilesystem=false",
            "topologySpreadConstraints[0].maxSkew=1",
            "topologySpreadConstraints[0].topologyKey=kubernetes.io/hostname",
            "topologySpreadConstraints[0].whenUnsatisfiable=ScheduleAnyway",
            "terminationGracePeriodSeconds=90",
            "poolNamespace=pool",
        ],
    )
    .expect("render");
    let d = one(&objs, "Deployment");
    let pod = &d["spec"]["template"]["spec"];
    let c = &pod["containers"][0];
    assert_eq!(
        c["image"],
        "registry.example/kpssh@sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
    );
    assert_eq!(env(c, "RUST_LOG"), Some(&json!("debug")));
    assert_eq!(env(c, "BATCH_MAX_DURATION"), Some(&json!("20s")));
    assert_eq!(env(c, "KPSSH_HEALTH_ADDR"), Some(&json!("0.0.0.0:9443")));
    assert_eq!(env(c, "EXTRA"), Some(&json!("yes")));
    assert_eq!(env(c, "KPSSH_POOL_NAMESPACE"), Some(&json!("pool")));
    assert_eq!(pod["securityContext"]["fsGroup"], 2000);
    assert_eq!(
        pod["securityContext"]["runAsUser"], 65532,
        "merged, not replaced"
    );
    assert_eq!(c["securityContext"]["readOnlyRootFilesystem"], false);
    assert_eq!(c["securityContext"]["allowPrivilegeEscalation"], false);
    assert_eq!(pod["topologySpreadConstraints"][0]["maxSkew"], 1);
    assert_eq!(pod["terminationGracePeriodSeconds"], 90);
    assert!(
        objs.iter().all(|o| o["kind"] != "Service"),
        "service.enabled=false"
    );
    let role = objs
        .iter()
        .find(|o| o["kind"] == "ClusterRole")
        .expect("ClusterRole");
    let rules = role["rules"].as_array().expect("rules");
    assert_eq!(
        rules.last(),
        Some(&json!({"apiGroups": ["example.com"], "resources": ["widgets"], "verbs": ["get"]}))
    );
    let sm = one(&objs, "ServiceMonitor");
    assert_eq!(sm["metadata"]["labels"]["release"], "prom");
    assert_eq!(
        sm["spec"]["endpoints"][0]["metricRelabelings"],
        json!([{"action": "labeldrop", "regex": "pod"}])
    );
    let np = one(&objs, "NetworkPolicy");
    let egress = np["spec"]["egress"].as_array().expect("egress");
    let ssh = egress
        .iter()
        .find(|e| {
            e["ports"]
                .as_array()
                .is_some_and(|p| p.iter().any(|p| p["port"] == 2222))
        })
        .expect("an SSH egress rule with port 2222");
    assert_eq!(ssh["to"], json!([{"ipBlock": {"cidr": "10.0.0.0/16"}}]));
    assert_eq!(
        ssh["ports"],
        json!([{"port": 2222, "protocol": "TCP"}]),
        "sshPort replaces 22"
    );
    let api = egress
        .iter()
        .find(|e| {
            e["ports"]
                .as_array()
                .is_some_and(|p| p.iter().any(|p| p["port"] == 6443))
        })
        .expect("the API server rule");
    assert_eq!(api["to"], json!([{"ipBlock": {"cidr": "10.96.0.1/32"}}]));
    let ingress_ports: Vec<&Value> = np["spec"]["ingress"][0]["ports"]
        .as_array()
        .expect("ingress ports")
        .iter()
        .map(|p| &p["port"])
        .collect();
    assert_eq!(
        ingress_ports,
        [&json!("http-metrics"), &json!("http-probes")]
    );
}

#[test]
fn a_key_neither_chart_knows_is_still_refused() {
    let err = render_with_values("kpssh", "kpssh-system", go_values(), &["settings.bogus=1"])
        .expect_err("unknown key");
    assert!(err.contains("bogus"), "{err}");
}
