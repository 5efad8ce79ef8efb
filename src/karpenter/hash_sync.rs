//! Karpenter core's `nodepool.hash` controller (sigs.k8s.io/karpenter
//! `pkg/controllers/nodepool/hash`), for kpssh's NodePools: each pool carries
//! `karpenter.sh/nodepool-hash` and `karpenter.sh/nodepool-hash-version` of its current
//! template. When a pool's version annotation is not the current hash version (a pool stamped
//! by an older hash algorithm, or never stamped), its NodeClaims whose version differs are
//! re-stamped first, as core does: the version always, the hash only on a claim without a
//! `Drifted` condition (a claim already drifted stays drifted). So a change of hash algorithm
//! never drifts a fleet, and a rollback to the Go provider finds the annotations core itself
//! would have written.

use std::sync::Arc;

use serde_json::json;
use tokio::task::JoinHandle;

use super::KarpenterConfig;
use super::nodepool_hash::{
    NODEPOOL_HASH_ANNOTATION, NODEPOOL_HASH_VERSION, NODEPOOL_HASH_VERSION_ANNOTATION,
    nodepool_hash,
};
use super::state::{ClusterState, Inner};
use crate::api::{NodeClaim, NodePool};
use crate::k8s::{Cluster, ClusterError};
use crate::provider::Context;
use crate::ssh::Transport;

pub fn spawn<C: Cluster, T: Transport>(
    ctx: Context<C, T>,
    state: ClusterState,
    cfg: KarpenterConfig,
) -> JoinHandle<()> {
    tokio::spawn(async move {
        loop {
            tokio::time::sleep(cfg.reconcile_interval).await;
            let work = due(&state.read());
            for (pool, hash) in work {
                if let Err(e) = reconcile(&ctx, &state, &pool, &hash).await {
                    tracing::debug!(nodepool = ?pool.metadata.name, error = %e, "nodepool hash retry");
                }
            }
        }
    })
}

/// Pools whose annotations are not their current hash and version, with that hash (pools are
/// few and the hash is cheap, so every pool is looked at on every tick).
pub fn due(st: &Inner) -> Vec<(NodePool, String)> {
    st.nodepools
        .values()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .filter_map(|p| {
            let hash = nodepool_hash(p);
            let a = p.metadata.annotations.as_ref();
            let stamped = a.and_then(|a| a.get(NODEPOOL_HASH_ANNOTATION)) == Some(&hash)
                && a.and_then(|a| a.get(NODEPOOL_HASH_VERSION_ANNOTATION))
                    .map(String::as_str)
                    == Some(NODEPOOL_HASH_VERSION);
            (!stamped).then(|| (p.clone(), hash))
        })
        .collect()
}

/// The patch that re-stamps `nc` for a pool whose hash version changed, or `None` when the
/// claim already carries the current version (core's `updateNodeClaimHash`).
pub fn restamp_patch(nc: &NodeClaim, hash: &str) -> Option<serde_json::Value> {
    let a = nc.metadata.annotations.as_ref();
    if a.and_then(|a| a.get(NODEPOOL_HASH_VERSION_ANNOTATION))
        .map(String::as_str)
        == Some(NODEPOOL_HASH_VERSION)
    {
        return None;
    }
    let drifted = nc
        .status
        .as_ref()
        .is_some_and(|s| s.conditions.iter().any(|c| c.type_ == "Drifted"));
    let mut annotations = json!({ NODEPOOL_HASH_VERSION_ANNOTATION: NODEPOOL_HASH_VERSION });
    if !drifted {
        annotations[NODEPOOL_HASH_ANNOTATION] = json!(hash);
    }
    Some(json!({ "metadata": { "annotations": annotations } }))
}

async fn reconcile<C: Cluster, T: Transport>(
    ctx: &Context<C, T>,
    state: &ClusterState,
    pool: &NodePool,
    hash: &str,
) -> Result<(), ClusterError> {
    let name = pool.metadata.name.clone().unwrap_or_default();
    let version = pool
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(NODEPOOL_HASH_VERSION_ANNOTATION));
    if version.map(String::as_str) != Some(NODEPOOL_HASH_VERSION) {
        let claims: Vec<Arc<NodeClaim>> = state
            .read()
            .nodeclaims
            .values()
            .filter(|nc| nc.nodepool() == Some(name.as_str()))
            .cloned()
            .collect();
        let mut failed = None;
        for nc in claims {
            let Some(patch) = restamp_patch(&nc, hash) else {
                continue;
            };
            let nc_name = nc.metadata.name.clone().unwrap_or_default();
            match ctx.cluster.patch::<NodeClaim>(None, &nc_name, &patch).await {
                Ok(updated) => state.observe_claim(updated),
                Err(ClusterError::NotFound { .. }) => {}
                Err(e) => failed = Some(e),
            }
        }
        // As core: the pool keeps its old version until every claim was re-stamped, so a
        // failure is retried on the next tick.
        if let Some(e) = failed {
            return Err(e);
        }
        tracing::info!(nodepool = %name, from = ?version, to = NODEPOOL_HASH_VERSION, "NodeClaims re-stamped with the current nodepool hash version");
    }
    let patch = json!({ "metadata": { "annotations": {
        NODEPOOL_HASH_ANNOTATION: hash,
        NODEPOOL_HASH_VERSION_ANNOTATION: NODEPOOL_HASH_VERSION,
    }}});
    match ctx.cluster.patch::<NodePool>(None, &name, &patch).await {
        Ok(_) | Err(ClusterError::NotFound { .. }) => Ok(()),
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::karpenter::NodeClaimStatus;
    use crate::sim::world::{node_claim, node_pool};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
    use std::collections::BTreeMap;

    fn annotated(version: Option<&str>, hash: &str) -> BTreeMap<String, String> {
        let mut a = BTreeMap::from([(NODEPOOL_HASH_ANNOTATION.to_string(), hash.to_string())]);
        if let Some(v) = version {
            a.insert(NODEPOOL_HASH_VERSION_ANNOTATION.into(), v.into());
        }
        a
    }

    #[test]
    fn s60_claims_of_another_hash_version_are_restamped_as_core_does() {
        let mut nc = node_claim("nc", "class", "1", "1Gi");
        nc.metadata.annotations = Some(annotated(Some("v2"), "111"));
        assert_eq!(
            restamp_patch(&nc, "222"),
            Some(json!({"metadata": {"annotations": {
                NODEPOOL_HASH_ANNOTATION: "222",
                NODEPOOL_HASH_VERSION_ANNOTATION: NODEPOOL_HASH_VERSION,
            }}}))
        );
        // No version at all is another version too.
        nc.metadata.annotations = Some(annotated(None, "111"));
        assert!(restamp_patch(&nc, "222").is_some());
        // A claim already drifted keeps its hash (it stays drifted): only the version moves.
        nc.status = Some(NodeClaimStatus {
            conditions: vec![Condition {
                type_: "Drifted".into(),
                status: "True".into(),
                reason: "NodePoolDrifted".into(),
                message: String::new(),
                last_transition_time: Time(jiff::Timestamp::UNIX_EPOCH),
                observed_generation: None,
            }],
            ..Default::default()
        });
        assert_eq!(
            restamp_patch(&nc, "222"),
            Some(json!({"metadata": {"annotations": {
                NODEPOOL_HASH_VERSION_ANNOTATION: NODEPOOL_HASH_VERSION,
            }}}))
        );
        // The current version: left alone, whatever its hash (that is drift, not a restamp).
        nc.metadata.annotations = Some(annotated(Some(NODEPOOL_HASH_VERSION), "111"));
        assert_eq!(restamp_patch(&nc, "222"), None);
    }

    #[test]
    fn s60_a_pool_is_due_until_it_carries_its_hash_and_version() {
        let mut st = Inner::default();
        let mut pool = node_pool("p", "class");
        st.nodepools.insert("p".into(), pool.clone());
        let due_now = due(&st);
        assert_eq!(due_now.len(), 1);
        assert_eq!(due_now[0].1, nodepool_hash(&pool));
        pool.metadata.annotations = Some(annotated(Some("v2"), &nodepool_hash(&pool)));
        st.nodepools.insert("p".into(), pool.clone());
        assert_eq!(due(&st).len(), 1, "another version");
        pool.metadata.annotations = Some(annotated(Some(NODEPOOL_HASH_VERSION), "1"));
        st.nodepools.insert("p".into(), pool.clone());
        assert_eq!(due(&st).len(), 1, "a stale hash");
        pool.metadata.annotations = Some(annotated(
            Some(NODEPOOL_HASH_VERSION),
            &nodepool_hash(&pool),
        ));
        st.nodepools.insert("p".into(), pool);
        assert!(due(&st).is_empty());
    }
}
