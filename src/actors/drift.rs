//! Drift (S30): what makes a claimed node out of date with its node class or profile.

use sha2::{Digest, Sha256};

use crate::api::nodeclass::SSHNodeClassSpec;
use crate::api::{
    NODECLASS_HASH_ANNOTATION, NODECLASS_HASH_VERSION, NODECLASS_HASH_VERSION_ANNOTATION, NodeClaim,
};

/// Hash of the node class fields that change how a host joins: vars, joinSecretRef,
/// providerIDSource, cluster. Price, selector, kubeReserved, maxPods and gates never drift.
pub fn nodeclass_hash(spec: &SSHNodeClassSpec) -> String {
    let relevant = serde_json::json!({
        "vars": spec.vars,
        "joinSecretRef": spec.join_secret_ref,
        "providerIDSource": spec.provider_id_source,
        "cluster": spec.cluster,
    });
    // serde_json maps are ordered (BTreeMap), so the text is canonical.
    let digest = Sha256::digest(relevant.to_string().as_bytes());
    digest.iter().take(8).map(|b| format!("{b:02x}")).collect()
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Drift {
    /// The host's install marker is not the class's current `<profile>@<version>`.
    Profile,
    /// The NodeClaim's nodeclass-hash annotation (v1) differs from the class's hash.
    NodeClass,
}

impl Drift {
    pub fn reason(self) -> &'static str {
        match self {
            Drift::Profile => "ProfileDrift",
            Drift::NodeClass => "NodeClassDrift",
        }
    }
}

/// Drift of a NodeClaim against its class and the host's marker.
pub fn drift(
    claim: &NodeClaim,
    class: &SSHNodeClassSpec,
    host_marker: Option<&str>,
    profile_marker: &str,
) -> Option<Drift> {
    if host_marker.is_some_and(|m| m != profile_marker) {
        return Some(Drift::Profile);
    }
    let ann = claim.metadata.annotations.as_ref()?;
    if ann
        .get(NODECLASS_HASH_VERSION_ANNOTATION)
        .map(String::as_str)
        != Some(NODECLASS_HASH_VERSION)
    {
        return None;
    }
    let hash = ann.get(NODECLASS_HASH_ANNOTATION)?;
    (hash != &nodeclass_hash(class)).then_some(Drift::NodeClass)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::host::SecretRef;
    use crate::sim::world::{node_claim, node_class};
    use std::collections::BTreeMap;

    fn stamped(class: &SSHNodeClassSpec) -> NodeClaim {
        let mut nc = node_claim("nc", "pool", "1", "1Gi");
        nc.metadata.annotations = Some(BTreeMap::from([
            (NODECLASS_HASH_ANNOTATION.to_string(), nodeclass_hash(class)),
            (
                NODECLASS_HASH_VERSION_ANNOTATION.to_string(),
                NODECLASS_HASH_VERSION.to_string(),
            ),
        ]));
        nc
    }

    #[test]
    fn s30_profile_and_nodeclass_drift() {
        let class = node_class("pool", "p").spec;
        let nc = stamped(&class);
        assert_eq!(drift(&nc, &class, Some("p@1"), "p@1"), None);
        assert_eq!(drift(&nc, &class, Some("p@1"), "p@2"), Some(Drift::Profile));
        let mut vars = class.clone();
        vars.vars = Some(BTreeMap::from([("k".to_string(), "v".to_string())]));
        assert_eq!(
            drift(&nc, &vars, Some("p@1"), "p@1"),
            Some(Drift::NodeClass)
        );
        let mut secret = class.clone();
        secret.join_secret_ref = Some(SecretRef {
            name: "activation".into(),
        });
        assert_eq!(
            drift(&nc, &secret, Some("p@1"), "p@1"),
            Some(Drift::NodeClass)
        );
    }

    #[test]
    fn s30_price_selector_reserved_maxpods_gates_never_drift() {
        let class = node_class("pool", "p").spec;
        let nc = stamped(&class);
        let mut other = class.clone();
        other.price_per_cpu_hour = "9.99".into();
        other.max_pods = 12;
        other.kube_reserved.clear();
        other.host_selector = Some(Default::default());
        other.startup_taint_gates = Some(vec![]);
        assert_eq!(drift(&nc, &other, Some("p@1"), "p@1"), None);
        let mut old_version = nc.clone();
        if let Some(a) = old_version.metadata.annotations.as_mut() {
            a.insert(NODECLASS_HASH_VERSION_ANNOTATION.into(), "v0".into());
        }
        let mut vars = class.clone();
        vars.vars = Some(BTreeMap::from([("k".to_string(), "v".to_string())]));
        assert_eq!(
            drift(&old_version, &vars, Some("p@1"), "p@1"),
            None,
            "another hash version is not compared"
        );
    }
}
