//! S60: Karpenter core's hash controller. NodeClaims stamped by an older NodePool hash
//! algorithm (another `karpenter.sh/nodepool-hash-version`) are re-stamped with the current
//! version and hash, not drifted, and the NodePool carries core's annotations.

use kpssh::karpenter::nodepool_hash::{
    NODEPOOL_HASH_ANNOTATION, NODEPOOL_HASH_VERSION, NODEPOOL_HASH_VERSION_ANNOTATION,
    nodepool_hash,
};
use serde_json::json;

use super::*;

fn annotation(
    meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta,
    k: &str,
) -> Option<String> {
    meta.annotations.as_ref().and_then(|a| a.get(k).cloned())
}

#[tokio::test(start_paused = true)]
async fn s60_claims_of_an_older_hash_version_are_restamped_not_drifted() {
    let e = env().await;
    hosts(&e, "h", "small", 1, 2, 4, 91).await;
    let mut np = nodepool("default");
    np.spec.disruption.consolidate_after = Some("Never".into());
    e.w.cluster.create(&np).await.expect("np");
    e.w.cluster
        .create(&pod("p", "500m", "256Mi"))
        .await
        .expect("pod");
    assert!(
        e.w.until(3 * MINUTE, || async { running(&e).await == 1 })
            .await
    );
    let name = claims(&e).await[0].metadata.name.clone().expect("name");
    // The pool and its claim as an older hash algorithm left them: another version, another hash.
    let old = json!({"metadata": {"annotations": {
        NODEPOOL_HASH_ANNOTATION: "1", NODEPOOL_HASH_VERSION_ANNOTATION: "v2"}}});
    let _: NodePool =
        e.w.cluster
            .patch(None, "default", &old)
            .await
            .expect("pool");
    let _: NodeClaim = e.w.cluster.patch(None, &name, &old).await.expect("claim");

    let current = |np: &NodePool| nodepool_hash(np);
    assert!(
        e.w.until(MINUTE, || async {
            let np: NodePool =
                e.w.cluster
                    .get(None, "default")
                    .await
                    .ok()
                    .flatten()
                    .expect("np");
            let nc: NodeClaim =
                e.w.cluster
                    .get(None, &name)
                    .await
                    .ok()
                    .flatten()
                    .expect("nc");
            let want = current(&np);
            annotation(&nc.metadata, NODEPOOL_HASH_VERSION_ANNOTATION).as_deref()
                == Some(NODEPOOL_HASH_VERSION)
                && annotation(&nc.metadata, NODEPOOL_HASH_ANNOTATION) == Some(want.clone())
                && annotation(&np.metadata, NODEPOOL_HASH_VERSION_ANNOTATION).as_deref()
                    == Some(NODEPOOL_HASH_VERSION)
                && annotation(&np.metadata, NODEPOOL_HASH_ANNOTATION) == Some(want)
        })
        .await,
        "claim and pool re-stamped with the current hash and version"
    );
    // And nothing was disrupted for it.
    tokio::time::sleep(10 * MINUTE).await;
    assert_eq!(claims(&e).await.len(), 1);
    assert_eq!(
        claims(&e).await[0].metadata.name.as_deref(),
        Some(name.as_str())
    );
    assert!(
        !reasons(&e).iter().any(|r| r.contains("Disruption")),
        "{:?}",
        reasons(&e)
    );
}
