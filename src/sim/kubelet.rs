//! The simulated kubelet: after a successful join it registers the Node (with the provider ID,
//! node IP, labels and taints from the join environment) and marks it Ready. It is named after
//! the NodeClaim (`KPSSH_NODE_NAME`), unless the node class sets the var
//! [`REGISTER_AS_VAR`]` = nodeadm`: then it registers as nodeadm does on EKS Hybrid, under a
//! managed-instance name of its own (`mi-` and 17 hex digits, one per machine), so that
//! nothing may find the Node by the claim's name (S53).

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Node, NodeAddress, NodeCondition, NodeSpec, NodeStatus, Taint};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::ObjectMeta;

/// Node class var naming how the simulated kubelet picks its Node's name.
pub const REGISTER_AS_VAR: &str = "SIM_REGISTER_AS";
/// The join environment's name for [`REGISTER_AS_VAR`] (`KPSSH_VAR_` and the var's name).
const REGISTER_AS_ENV: &str = "KPSSH_VAR_SIM_REGISTER_AS";

/// The name nodeadm would register the machine at `address` under: `mi-` and 17 hex digits,
/// stable for the machine (an FNV-1a hash of the address stands in for the SSM activation).
pub fn managed_instance_name(address: &str) -> String {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in address.bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    format!("mi-{:017x}", u128::from(h) << 4 | u128::from(h >> 60))
}

/// Whether a kubelet started with this join environment names its Node itself (nodeadm).
pub fn names_itself(env: &BTreeMap<String, String>) -> bool {
    env.get(REGISTER_AS_ENV).is_some_and(|v| v == "nodeadm")
}

/// The name the kubelet registers its Node under.
pub fn node_name(env: &BTreeMap<String, String>) -> String {
    let get = |k: &str| env.get(k).cloned().unwrap_or_default();
    if names_itself(env) {
        return managed_instance_name(&get("KPSSH_NODE_ADDRESS"));
    }
    get("KPSSH_NODE_NAME")
}

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
            name: Some(node_name(env)),
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

/// Set the Node's Ready condition to `status` (transition at `at`).
pub fn set_ready(node: &mut Node, status: &str, at: Time) {
    let (reason, message) = if status == "True" {
        ("KubeletReady", "kubelet is posting ready status")
    } else {
        ("NodeStatusUnknown", "Kubelet stopped posting node status.")
    };
    let cond = NodeCondition {
        type_: "Ready".into(),
        status: status.into(),
        reason: Some(reason.into()),
        message: Some(message.into()),
        last_transition_time: Some(at.clone()),
        last_heartbeat_time: Some(at),
    };
    let conditions = node
        .status
        .get_or_insert_with(Default::default)
        .conditions
        .get_or_insert_with(Vec::new);
    match conditions.iter_mut().find(|c| c.type_ == "Ready") {
        Some(c) => *c = cond,
        None => conditions.push(cond),
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nodeadm_names_are_per_machine_and_not_the_claims() {
        let mut env = BTreeMap::from([
            ("KPSSH_NODE_NAME".to_string(), "default-abc12".to_string()),
            ("KPSSH_NODE_ADDRESS".to_string(), "10.0.0.7".to_string()),
        ]);
        assert_eq!(node_name(&env), "default-abc12");
        assert_eq!(REGISTER_AS_ENV, format!("KPSSH_VAR_{REGISTER_AS_VAR}"));
        env.insert(format!("KPSSH_VAR_{REGISTER_AS_VAR}"), "nodeadm".into());
        let name = node_name(&env);
        assert!(name.starts_with("mi-") && name.len() == 20, "{name}");
        assert!(name[3..].chars().all(|c| c.is_ascii_hexdigit()));
        assert_eq!(
            name,
            managed_instance_name("10.0.0.7"),
            "stable per machine"
        );
        assert_ne!(name, managed_instance_name("10.0.0.8"));
        let node = node_from_env(&env, "sim://adopted/10.0.0.7");
        assert_eq!(node.metadata.name.as_deref(), Some(name.as_str()));
    }
}
