//! CRDs generated from the Rust types: `kpssh crds` prints them, the chart ships them.

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::CustomResourceExt;

use super::{NodeClaim, NodePool, SSHHost, SSHJoinProfile, SSHNodeClass};

/// kpssh's own CRDs (what the Helm chart ships).
pub fn kpssh_crds() -> Vec<CustomResourceDefinition> {
    vec![SSHHost::crd(), SSHNodeClass::crd(), SSHJoinProfile::crd()]
}

/// `karpenter.sh/v1` CRDs for clusters without Karpenter's own (and for the test control plane).
pub fn karpenter_crds() -> Vec<CustomResourceDefinition> {
    vec![NodePool::crd(), NodeClaim::crd()]
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
