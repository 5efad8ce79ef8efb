//! The simulated kubelet: after a successful join it registers the Node (named after the
//! NodeClaim, with the provider ID, node IP, labels and taints from the join environment) and
//! marks it Ready.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Node, NodeAddress, NodeCondition, NodeSpec, NodeStatus, Taint};
use kube::api::ObjectMeta;

/// The Node a kubelet started with this join environment registers.
pub fn node_from_env(env: &BTreeMap<String, String>, adopt_id: &str) -> Node {
    let get = |k: &str| env.get(k).cloned().unwrap_or_default();
    let provider = match get("KPSSH_PROVIDER_ID") {
        p if p.is_empty() => adopt_id.to_string(),
        p => p,
    };
    let labels: BTreeMap<String, String> = get("KPSSH_NODE_LABELS")
        .split(',')
        .filter_map(|kv| kv.split_once('='))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    let taints: Vec<Taint> = get("KPSSH_TAINTS")
        .split(',')
        .filter(|t| !t.is_empty())
        .filter_map(parse_taint)
        .collect();
    Node {
        metadata: ObjectMeta {
            name: Some(get("KPSSH_NODE_NAME")),
            labels: Some(labels),
            ..Default::default()
        },
        spec: Some(NodeSpec {
            provider_id: Some(provider),
            taints: Some(taints),
            ..Default::default()
        }),
        status: Some(NodeStatus {
            addresses: Some(vec![NodeAddress {
                type_: "InternalIP".into(),
                address: get("KPSSH_NODE_ADDRESS"),
            }]),
            conditions: Some(vec![NodeCondition {
                type_: "Ready".into(),
                status: "True".into(),
                reason: Some("KubeletReady".into()),
                ..Default::default()
            }]),
            ..Default::default()
        }),
    }
}

/// `key=value:Effect` or `key:Effect`.
fn parse_taint(text: &str) -> Option<Taint> {
    let (kv, effect) = text.rsplit_once(':')?;
    let (key, value) = match kv.split_once('=') {
        Some((k, v)) => (k.to_string(), Some(v.to_string())),
        None => (kv.to_string(), None),
    };
    Some(Taint {
        key,
        value,
        effect: effect.to_string(),
        time_added: None,
    })
}
