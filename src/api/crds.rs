//! CRDs: kpssh's own are generated from the Rust types (`kpssh crds`, the chart ships them);
//! Karpenter's `karpenter.sh/v1` NodePool and NodeClaim are upstream's files, embedded
//! unchanged (`kpssh crds --karpenter`; see `src/api/upstream/README.md`).

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::CustomResourceExt;

use super::{SSHHost, SSHJoinProfile, SSHNodeClass};

/// The `sigs.k8s.io/karpenter` release whose CRDs are embedded (and whose semantics kpssh
/// follows; the reference oracle pins the same module version).
pub const KARPENTER_VERSION: &str = "v1.14.1";

/// Upstream's `pkg/apis/crds/karpenter.sh_nodepools.yaml` at [`KARPENTER_VERSION`].
pub const UPSTREAM_NODEPOOLS: &str = include_str!("upstream/karpenter.sh_nodepools.yaml");
/// Upstream's `pkg/apis/crds/karpenter.sh_nodeclaims.yaml` at [`KARPENTER_VERSION`].
pub const UPSTREAM_NODECLAIMS: &str = include_str!("upstream/karpenter.sh_nodeclaims.yaml");

/// kpssh's own CRDs (what the Helm chart ships).
pub fn kpssh_crds() -> Vec<CustomResourceDefinition> {
    vec![SSHHost::crd(), SSHNodeClass::crd(), SSHJoinProfile::crd()]
}

/// Upstream's `karpenter.sh/v1` CRDs as one multi-document YAML stream, byte for byte
/// (NodePool, then NodeClaim): what `kpssh crds --karpenter` prints.
pub fn karpenter_crds_yaml() -> String {
    format!("{UPSTREAM_NODEPOOLS}{UPSTREAM_NODECLAIMS}")
}

/// `karpenter.sh/v1` CRDs for clusters without Karpenter's own (and for the test control
/// plane): upstream's, parsed.
pub fn karpenter_crds() -> Vec<CustomResourceDefinition> {
    [UPSTREAM_NODEPOOLS, UPSTREAM_NODECLAIMS]
        .iter()
        .map(|text| {
            // Embedded at build time and parsed by a unit test: not outside data.
            serde_yaml::from_str(text).expect("embedded upstream CRD parses")
        })
        .collect()
}

/// CRDs as one multi-document YAML stream.
pub fn to_yaml(crds: &[CustomResourceDefinition]) -> Result<String, serde_yaml::Error> {
    let mut out = String::new();
    for crd in crds {
        out.push_str("---\n");
        out.push_str(&serde_yaml::to_string(crd)?);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The embedded files parse, and nothing of them is lost in `CustomResourceDefinition`
    /// (what the tests install is what `kpssh crds --karpenter` prints).
    #[test]
    fn upstream_crds_parse_without_loss() {
        let parsed = karpenter_crds();
        let names: Vec<_> = parsed
            .iter()
            .filter_map(|c| c.metadata.name.as_deref())
            .collect();
        assert_eq!(names, ["nodepools.karpenter.sh", "nodeclaims.karpenter.sh"]);
        for (crd, text) in parsed.iter().zip([UPSTREAM_NODEPOOLS, UPSTREAM_NODECLAIMS]) {
            let raw: serde_json::Value = serde_yaml::from_str(text).expect("yaml");
            let typed = serde_json::to_value(crd).expect("json");
            assert!(
                numbers_as_floats(raw) == numbers_as_floats(typed),
                "{:?} loses fields when typed",
                crd.metadata.name
            );
        }
    }

    /// `minimum: 0` comes back as `0.0` (the schema's bounds are floats): the same number.
    fn numbers_as_floats(v: serde_json::Value) -> serde_json::Value {
        use serde_json::Value;
        match v {
            Value::Number(n) => n.as_f64().map_or(Value::Number(n), Value::from),
            Value::Array(a) => Value::Array(a.into_iter().map(numbers_as_floats).collect()),
            Value::Object(m) => Value::Object(
                m.into_iter()
                    .map(|(k, v)| (k, numbers_as_floats(v)))
                    .collect(),
            ),
            other => other,
        }
    }
}
