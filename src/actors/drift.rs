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
