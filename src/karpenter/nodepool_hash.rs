//! The NodePool template hash a NodeClaim carries (`karpenter.sh/nodepool-hash`): a NodeClaim
//! whose hash differs from its NodePool's current one is Drifted.
//!
//! One module for stamping (provisioning, replacements) and comparing (disruption), so the
//! hash and its version annotation are defined in one place.

use std::collections::BTreeMap;

use sha2::{Digest, Sha256};

use crate::api::{NodeClaim, NodePool};

pub const NODEPOOL_HASH_ANNOTATION: &str = "karpenter.sh/nodepool-hash";

/// Hash of a NodePool's template (what a NodeClaim was made from).
pub fn nodepool_hash(pool: &NodePool) -> String {
    let text = serde_json::to_string(&pool.spec.template).unwrap_or_default();
    Sha256::digest(text.as_bytes())
        .iter()
        .take(8)
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// The annotations a NodeClaim made from `pool` gets, besides the template's own.
pub fn stamp(pool: &NodePool, annotations: &mut BTreeMap<String, String>) {
    annotations.insert(NODEPOOL_HASH_ANNOTATION.into(), nodepool_hash(pool));
}

/// The claim was made from another version of its NodePool's template than `current`
/// (the pool's [`nodepool_hash`]). A claim without the annotation is not drifted.
pub fn drifted(claim: &NodeClaim, current: &str) -> bool {
    claim
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(NODEPOOL_HASH_ANNOTATION))
        .is_some_and(|h| h != current)
}
