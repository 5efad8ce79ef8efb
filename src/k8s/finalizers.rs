//! Adding and removing one finalizer, as a merge patch guarded by the object's
//! resourceVersion (a lost race is reported as a conflict, never a lost finalizer).

use serde_json::json;

use super::{Cluster, ClusterError, Object};

/// Make `finalizer` present (`want`) or absent on `obj`. No write when it already is.
/// A missing object is fine: there is nothing left to hold.
pub async fn set<C: Cluster, K: Object>(
    cluster: &C,
    obj: &K,
    finalizer: &str,
    want: bool,
) -> Result<(), ClusterError> {
    let current = obj.meta().finalizers.clone().unwrap_or_default();
    if current.iter().any(|f| f == finalizer) == want {
        return Ok(());
    }
    let next: Vec<String> = if want {
        current.into_iter().chain([finalizer.to_string()]).collect()
    } else {
        current.into_iter().filter(|f| f != finalizer).collect()
    };
    let meta = obj.meta();
    let patch = json!({"metadata": {"finalizers": next, "resourceVersion": meta.resource_version}});
    let name = meta.name.clone().unwrap_or_default();
    match cluster
        .patch::<K>(meta.namespace.as_deref(), &name, &patch)
        .await
    {
        Ok(_) => Ok(()),
        Err(e) if e.is_not_found() => Ok(()),
        Err(e) => Err(e),
    }
}
