//! The generated CRDs carry every rule of the v1beta1 contract (DESIGN §1), and the chart's
//! copy is the generator's output. The real API server exercises the rules in tests/admission.

use kpssh::api::crds;
use serde_json::Value;

fn crd(name: &str) -> Value {
    let all = crds::kpssh_crds();
    let found = all
        .into_iter()
        .find(|c| c.metadata.name.as_deref() == Some(name))
        .unwrap_or_else(|| panic!("CRD {name} not generated"));
    serde_json::to_value(found).expect("CRD serializes")
}

fn schema(crd: &Value) -> &Value {
    crd.pointer("/spec/versions/0/schema/openAPIV3Schema")
        .expect("schema present")
}

fn at<'a>(v: &'a Value, path: &str) -> &'a Value {
    v.pointer(path).unwrap_or_else(|| panic!("missing {path}"))
}

fn rules(v: &Value) -> Vec<String> {
    v.get("x-kubernetes-validations")
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(|r| r.get("rule").and_then(Value::as_str).map(str::to_string))
                .collect()
        })
        .unwrap_or_default()
}

#[test]
fn sshhost_schema_holds_the_contract() {
    let c = crd("sshhosts.karpenter.dklesev.github.io");
    assert_eq!(at(&c, "/spec/scope"), "Namespaced");
    assert_eq!(at(&c, "/spec/names/shortNames/0"), "sshh");
    assert_eq!(at(&c, "/spec/names/categories/0"), "karpenter");
    assert!(c.pointer("/spec/versions/0/subresources/status").is_some());
    let spec = at(schema(&c), "/properties/spec");
    let required: Vec<&str> = at(spec, "/required")
        .as_array()
        .expect("array")
        .iter()
        .filter_map(Value::as_str)
        .collect();
    for f in ["address", "sshKeySecretRef", "capacity"] {
        assert!(required.contains(&f), "{f} must be required");
    }
    let p = at(spec, "/properties");
    assert_eq!(at(p, "/address/maxLength"), 253);
    assert!(rules(at(p, "/address")).contains(&"self == oldSelf".to_string()));
    assert_eq!(at(p, "/port/default"), 22);
    assert_eq!(at(p, "/port/minimum").as_f64(), Some(1.0));
    assert_eq!(at(p, "/port/maximum").as_f64(), Some(65535.0));
    assert_eq!(at(p, "/user/default"), "root");
    assert_eq!(at(p, "/user/maxLength"), 32);
    assert_eq!(at(p, "/sshKeySecretRef/properties/name/minLength"), 1);
    assert!(rules(at(p, "/nodeAddress")).contains(&"isIP(self)".to_string()));
    assert!(rules(at(p, "/capacity"))[0].contains("'cpu' in self && 'memory' in self"));
    assert_eq!(at(p, "/execMode/default"), "Raw");
    assert_eq!(
        at(p, "/execMode/enum"),
        &serde_json::json!(["Raw", "Verified"])
    );
    assert_eq!(at(p, "/trustedSigners/maxItems"), 16);
    assert_eq!(at(p, "/shimCommand/default"), "/opt/kpssh/kpssh-shim");
    assert!(
        rules(spec)
            .iter()
            .any(|r| r.contains("Verified") && r.contains("size(self.trustedSigners) >= 1"))
    );
    let status = at(schema(&c), "/properties/status/properties");
    assert_eq!(
        at(status, "/state/enum"),
        &serde_json::json!([
            "Pending",
            "Available",
            "Claimed",
            "InUse",
            "Unhealthy",
            "Leaving",
            "Maintenance"
        ])
    );
    for f in [
        "conditions",
        "claimRef",
        "installedProfile",
        "bootstrapTokenID",
        "providerID",
        "hostKeyFingerprint",
        "observedCapacity",
        "observedArch",
        "observedGeneration",
        "lastProbeTime",
        "lastProbeError",
    ] {
        assert!(status.get(f).is_some(), "status.{f} missing");
    }
    let columns: Vec<&str> = at(&c, "/spec/versions/0/additionalPrinterColumns")
        .as_array()
        .expect("columns")
        .iter()
        .filter_map(|c| c["name"].as_str())
        .collect();
    assert_eq!(
        columns,
        [
            "Address",
            "Port",
            "Class",
            "State",
            "Ready",
            "Claim",
            "Installed",
            "Backoff",
            "Age",
            "Error"
        ]
    );
}

#[test]
fn sshnodeclass_schema_holds_the_contract() {
    let c = crd("sshnodeclasses.karpenter.dklesev.github.io");
    assert_eq!(at(&c, "/spec/scope"), "Cluster");
    assert_eq!(at(&c, "/spec/names/shortNames/0"), "snc");
    let spec = at(schema(&c), "/properties/spec");
    let p = at(spec, "/properties");
    assert_eq!(
        at(spec, "/required"),
        &serde_json::json!(["joinProfileRef"])
    );
    assert_eq!(at(p, "/joinProfileRef/properties/name/minLength"), 1);
    assert_eq!(at(p, "/joinSecretRef/properties/name/minLength"), 1);
    assert_eq!(at(p, "/vars/maxProperties"), 64);
    let var_rules = rules(at(p, "/vars"));
    assert!(
        var_rules
            .iter()
            .any(|r| r.contains("^[A-Za-z_][A-Za-z0-9_]*$"))
    );
    assert!(var_rules.iter().any(|r| r.contains("<= 2048")));
    assert_eq!(at(p, "/providerIDSource/default"), "Static");
    assert_eq!(
        at(p, "/providerIDSource/enum"),
        &serde_json::json!(["Static", "Adopt"])
    );
    assert_eq!(at(p, "/pricePerCPUHour/default"), "0.02");
    assert_eq!(at(p, "/pricePerCPUHour/pattern"), r"^[0-9]+(\.[0-9]+)?$");
    assert_eq!(
        at(p, "/kubeReserved/default"),
        &serde_json::json!({"cpu": "80m", "memory": "300Mi"})
    );
    assert!(rules(at(p, "/kubeReserved"))[0].contains("ephemeral-storage"));
    assert_eq!(at(p, "/maxPods/default"), 110);
    assert!(rules(at(p, "/cluster/properties/endpoint"))[0].contains("https://"));
    let gates = at(p, "/startupTaintGates");
    assert!(rules(gates)[0].contains("exists_one"), "taintKey unique");
    let gate = at(gates, "/items/properties/removeWhen");
    assert!(rules(gate)[0].contains("has(self.podsReady) != has(self.nodeCondition)"));
    assert_eq!(
        at(gates, "/items/required"),
        &serde_json::json!(["removeWhen", "taintKey"])
    );
    assert_eq!(
        at(gate, "/properties/nodeCondition/required"),
        &serde_json::json!(["type"])
    );
    assert!(
        rules(at(gate, "/properties/podsReady/properties/selector"))[0]
            .contains("size(self.matchLabels) > 0")
    );
    assert_eq!(
        at(gate, "/properties/podsReady/properties/minReady/minimum").as_f64(),
        Some(1.0)
    );
}

#[test]
fn sshjoinprofile_schema_holds_the_contract() {
    let c = crd("sshjoinprofiles.karpenter.dklesev.github.io");
    assert_eq!(at(&c, "/spec/scope"), "Cluster");
    assert_eq!(at(&c, "/spec/names/shortNames/0"), "sjp");
    let p = at(schema(&c), "/properties/spec/properties");
    assert_eq!(at(p, "/version/default"), "1");
    assert_eq!(at(p, "/version/pattern"), "^[A-Za-z0-9._-]{1,63}$");
    assert_eq!(
        at(p, "/scripts/required"),
        &serde_json::json!(["install", "join", "leave"])
    );
    for s in ["install", "join", "leave", "uninstall"] {
        assert_eq!(at(p, &format!("/scripts/properties/{s}/maxLength")), 262144);
        assert!(at(p, &format!("/signatures/properties/{s}/maxLength")).is_number());
    }
    for (phase, default) in [("install", "10m"), ("join", "5m"), ("leave", "3m")] {
        assert_eq!(
            at(p, &format!("/timeouts/properties/{phase}/default")),
            default
        );
        assert_eq!(
            at(p, &format!("/timeouts/properties/{phase}/pattern")),
            "^([0-9]+(s|m|h))+$"
        );
    }
}

#[test]
fn chart_crds_equal_generated_output() {
    let generated = crds::to_yaml(&crds::kpssh_crds()).expect("yaml");
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/charts/kpssh/crds/crds.yaml");
    let shipped = std::fs::read_to_string(path).expect("charts/kpssh/crds/crds.yaml exists");
    assert!(
        shipped == generated,
        "charts/kpssh/crds/crds.yaml drifted from the types: run `cargo run -- crds > charts/kpssh/crds/crds.yaml`"
    );
}

/// Every field of `value` has a place in `schema` (else the API server would prune it
/// silently: kpssh would lose what it wrote); the path of each one that has none.
fn unknown_fields(value: &Value, schema: &Value, path: &str, out: &mut Vec<String>) {
    if schema.get("x-kubernetes-preserve-unknown-fields") == Some(&Value::Bool(true)) {
        return;
    }
    match value {
        Value::Object(map) => {
            for (k, v) in map {
                // `metadata` is `type: object` without properties: the API server's own.
                if path.is_empty() && k == "metadata" {
                    continue;
                }
                let sub = schema
                    .pointer(&format!(
                        "/properties/{}",
                        k.replace('~', "~0").replace('/', "~1")
                    ))
                    .or_else(|| schema.get("additionalProperties"));
                match sub {
                    Some(sub) => unknown_fields(v, sub, &format!("{path}.{k}"), out),
                    None => out.push(format!("{path}.{k}")),
                }
            }
        }
        Value::Array(items) => {
            for (i, v) in items.iter().enumerate() {
                match schema.get("items") {
                    Some(sub) => unknown_fields(v, sub, &format!("{path}[{i}]"), out),
                    None => out.push(format!("{path}[{i}]")),
                }
            }
        }
        _ => {}
    }
}

fn karpenter_schema(name: &str) -> Value {
    let found = crds::karpenter_crds()
        .into_iter()
        .find(|c| c.metadata.name.as_deref() == Some(name))
        .unwrap_or_else(|| panic!("{name}"));
    schema(&serde_json::to_value(found).expect("serializes")).clone()
}

/// `kpssh crds --karpenter` is upstream's NodePool and NodeClaim, with upstream's validation
/// (the oracle tier compares them with the module's files byte for byte).
#[test]
fn karpenter_crds_are_upstreams_with_their_validation() {
    let all = crds::karpenter_crds();
    let names: Vec<_> = all.iter().filter_map(|c| c.metadata.name.clone()).collect();
    assert_eq!(names, ["nodepools.karpenter.sh", "nodeclaims.karpenter.sh"]);
    let np = karpenter_schema("nodepools.karpenter.sh");
    let tmpl = "/properties/spec/properties/template/properties/spec/properties";
    assert_eq!(
        at(&np, &format!("{tmpl}/expireAfter/pattern")),
        "^(([0-9]+(s|m|h))+|Never)$"
    );
    assert_eq!(at(&np, &format!("{tmpl}/expireAfter/default")), "720h");
    assert_eq!(
        at(
            &np,
            "/properties/spec/properties/disruption/properties/consolidateAfter/pattern"
        ),
        "^(([0-9]+(s|m|h))+|Never)$"
    );
    let ops = at(
        &np,
        &format!("{tmpl}/requirements/items/properties/operator/enum"),
    );
    assert_eq!(ops.as_array().map(Vec::len), Some(8), "{ops}");
    assert!(!rules(at(&np, &format!("{tmpl}/requirements"))).is_empty());
    for c in crds::karpenter_crds() {
        let v = serde_json::to_value(&c).expect("serializes");
        assert!(
            v.pointer("/spec/versions/0/schema/openAPIV3Schema/properties/spec/x-kubernetes-preserve-unknown-fields")
                .is_none(),
            "{names:?}: the spec is validated, not passed through"
        );
    }
    let printed = std::process::Command::new(env!("CARGO_BIN_EXE_kpssh"))
        .args(["crds", "--karpenter"])
        .output()
        .expect("kpssh crds --karpenter");
    assert!(printed.status.success());
    assert_eq!(
        String::from_utf8_lossy(&printed.stdout),
        crds::karpenter_crds_yaml()
    );
}

/// Everything kpssh writes to a NodePool or NodeClaim (every field its types model, filled
/// in) has a place in upstream's schema: nothing kpssh relies on is pruned by the API server.
#[test]
fn every_field_kpssh_writes_is_in_upstreams_schema() {
    let pool: kpssh::api::NodePool = serde_yaml::from_str(
        r#"
apiVersion: karpenter.sh/v1
kind: NodePool
metadata: {name: p}
spec:
  weight: 10
  limits: {cpu: "64", memory: 256Gi}
  disruption:
    consolidationPolicy: WhenEmpty
    consolidateAfter: 5m
    budgets: [{nodes: "10%", schedule: "@daily", duration: 1h, reasons: [Empty]}]
  template:
    metadata: {labels: {team: a}, annotations: {note: b}}
    spec:
      nodeClassRef: {group: karpenter.dklesev.github.io, kind: SSHNodeClass, name: c}
      requirements: [{key: kubernetes.io/arch, operator: In, values: [amd64], minValues: 1}]
      taints: [{key: dedicated, value: a, effect: NoSchedule}]
      startupTaints: [{key: starting, effect: NoExecute}]
      expireAfter: 720h
      terminationGracePeriod: 48h
status:
  resources: {cpu: "8"}
  conditions:
  - {type: Ready, status: "True", reason: Ready, message: "", lastTransitionTime: "2026-01-01T00:00:00Z"}
"#,
    )
    .expect("pool");
    let mut out = vec![];
    unknown_fields(
        &serde_json::to_value(&pool).expect("json"),
        &karpenter_schema("nodepools.karpenter.sh"),
        "",
        &mut out,
    );
    assert!(out.is_empty(), "NodePool fields upstream prunes: {out:?}");

    let claim = kpssh::karpenter::provisioning::build_claim(
        &pool,
        "p-abcde",
        &kpssh::karpenter::provisioning::NewClaim {
            pool: "p".into(),
            instance_type: "c8-m32".into(),
            requests: [("cpu".to_string(), 2000), ("memory".to_string(), 1 << 40)].into(),
            pods: vec![],
            ..Default::default()
        },
    );
    let mut claim = serde_json::to_value(&claim).expect("json");
    claim["status"] = serde_json::json!({
        "nodeName": "n", "providerID": "kpssh://ns/h", "imageID": "i",
        "capacity": {"cpu": "8"}, "allocatable": {"cpu": "7"},
        "lastPodEventTime": "2026-01-01T00:00:00Z",
        "conditions": [{"type": "Registered", "status": "Unknown", "reason": "AwaitingNode",
            "message": "m", "lastTransitionTime": "2026-01-01T00:00:00Z"}],
    });
    let typed: kpssh::api::NodeClaim = serde_json::from_value(claim).expect("claim");
    let mut out = vec![];
    unknown_fields(
        &serde_json::to_value(&typed).expect("json"),
        &karpenter_schema("nodeclaims.karpenter.sh"),
        "",
        &mut out,
    );
    assert!(out.is_empty(), "NodeClaim fields upstream prunes: {out:?}");
}
