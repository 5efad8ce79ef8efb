//! Server-side apply of untyped manifests (any kind the API server knows), for tests that apply
//! rendered or shipped YAML as `kubectl apply --server-side` would.

use std::time::Duration;

use kube::api::{Api, DynamicObject, Patch, PatchParams};
use kube::core::GroupVersionKind;
use kube::discovery::{Scope, pinned_kind};
use serde::Deserialize;
use serde_json::Value;

/// Every non-empty document of a multi-document YAML text.
pub fn parse_docs(text: &str) -> Vec<Value> {
    serde_yaml::Deserializer::from_str(text)
        .map(|d| Value::deserialize(d).unwrap_or_else(|e| panic!("YAML: {e}\n{text}")))
        .filter(|v| !v.is_null())
        .collect()
}

/// Applies `obj` (server-side, field manager `kpssh-tests`, forced). With `dry_run` the API
/// server runs defaulting, validation and admission without persisting.
pub async fn apply(client: &kube::Client, obj: &Value, dry_run: bool) -> Result<(), String> {
    let api_version = obj["apiVersion"].as_str().ok_or("no apiVersion")?;
    let kind = obj["kind"].as_str().ok_or("no kind")?;
    let (group, version) = api_version.rsplit_once('/').unwrap_or(("", api_version));
    let gvk = GroupVersionKind::gvk(group, version, kind);
    let (ar, caps) = tokio::time::timeout(Duration::from_secs(20), pinned_kind(client, &gvk))
        .await
        .map_err(|_| format!("discovery of {api_version} {kind} timed out"))?
        .map_err(|e| format!("discovery of {api_version} {kind}: {e}"))?;
    let name = obj["metadata"]["name"].as_str().ok_or("no metadata.name")?;
    let api: Api<DynamicObject> = match caps.scope {
        Scope::Namespaced => {
            let ns = obj["metadata"]["namespace"].as_str().unwrap_or("default");
            Api::namespaced_with(client.clone(), ns, &ar)
        }
        Scope::Cluster => Api::all_with(client.clone(), &ar),
    };
    let mut pp = PatchParams::apply("kpssh-tests").force();
    pp.dry_run = dry_run;
    tokio::time::timeout(
        Duration::from_secs(20),
        api.patch(name, &pp, &Patch::Apply(obj)),
    )
    .await
    .map_err(|_| format!("apply of {kind} {name} timed out"))?
    .map(|_| ())
    .map_err(|e| format!("{kind} {name}: {e}"))
}
