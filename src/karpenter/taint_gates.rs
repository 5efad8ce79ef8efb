//! Startup taint gates (S34): an SSHNodeClass may name startup taints that kpssh itself removes
//! once a condition holds — enough Ready pods of a selector on that node (`podsReady`), or a
//! node condition (`nodeCondition`). Only taints the NodeClaim declares as startup taints, only
//! on Nodes of our NodeClaims.

use std::collections::BTreeSet;

use k8s_openapi::api::core::v1::{Node, Pod};
use kube::core::{Selector, SelectorExt};
use tokio::task::JoinHandle;

use super::KarpenterConfig;
use super::state::{ClusterState, Inner};
use crate::api::SSHNodeClass;
use crate::api::nodeclass::StartupTaintGate;
use crate::k8s::{Cluster, ClusterError};
use crate::provider::Context;
use crate::ssh::Transport;

pub fn spawn<C: Cluster, T: Transport>(
    ctx: Context<C, T>,
    state: ClusterState,
    cfg: KarpenterConfig,
) -> JoinHandle<()> {
    tokio::spawn(async move {
        // NodeClaims that may have a gate to open: those that moved, kept while their Node
        // still carries a startup taint (a podsReady gate waits on pods, which touch no claim).
        let mut pending: BTreeSet<String> = BTreeSet::new();
        let mut swept = tokio::time::Instant::now();
        loop {
            tokio::time::sleep(cfg.reconcile_interval).await;
            pending.append(&mut state.take_touched_gates());
            let now = tokio::time::Instant::now();
            if now >= swept + SWEEP {
                // A safety net for a missed event.
                swept = now;
                pending.extend(state.read().nodeclaims.keys().cloned());
            }
            let work = due(&state.read(), &mut pending);
            for (node_name, class_name, keys) in work {
                if let Err(e) = open_gates(&ctx, &state, &node_name, &class_name, &keys).await {
                    tracing::debug!(node = %node_name, error = %e, "taint gate retry");
                }
            }
        }
    })
}

/// How often every NodeClaim is looked at, not only those that moved.
const SWEEP: std::time::Duration = std::time::Duration::from_secs(300);

/// Nodes of the `pending` NodeClaims that still carry one of their declared startup taints;
/// claims with nothing left to open (or no Node yet: its arrival touches them) leave `pending`.
fn due(s: &Inner, pending: &mut BTreeSet<String>) -> Vec<(String, String, Vec<String>)> {
    let mut work = vec![];
    pending.retain(|name| {
        let Some(nc) = s.nodeclaims.get(name) else {
            return false;
        };
        // Most claims declare no startup taint: skip them before looking up their Node.
        if nc.spec.startup_taints.is_empty() {
            return false;
        }
        let Some(node) = s.node_of(nc) else {
            return false;
        };
        let on_node = node_taint_keys(node);
        let keys: Vec<String> = nc
            .spec
            .startup_taints
            .iter()
            .map(|t| t.key.clone())
            .filter(|k| on_node.contains(k))
            .collect();
        let Some(node_name) = node.metadata.name.clone() else {
            return false;
        };
        if keys.is_empty() {
            return false;
        }
        work.push((node_name, nc.spec.node_class_ref.name.clone(), keys));
        true
    });
    work
}

fn node_taint_keys(node: &Node) -> Vec<String> {
    node.spec
        .as_ref()
        .and_then(|s| s.taints.as_ref())
        .map(|t| t.iter().map(|t| t.key.clone()).collect())
        .unwrap_or_default()
}

async fn open_gates<C: Cluster, T: Transport>(
    ctx: &Context<C, T>,
    state: &ClusterState,
    node_name: &str,
    class_name: &str,
    startup_keys: &[String],
) -> Result<(), ClusterError> {
    let Some(class) = ctx.cluster.get::<SSHNodeClass>(None, class_name).await? else {
        return Ok(());
    };
    let gates = class.spec.startup_taint_gates.unwrap_or_default();
    let open: Vec<String> = {
        let s = state.read();
        let Some(node) = s.nodes.get(node_name) else {
            return Ok(());
        };
        gates
            .iter()
            .filter(|g| startup_keys.contains(&g.taint_key))
            .filter(|g| gate_holds(g, node, &s))
            .map(|g| g.taint_key.clone())
            .collect()
    };
    if open.is_empty() {
        return Ok(());
    }
    let Some(mut node) = ctx.cluster.get::<Node>(None, node_name).await? else {
        return Ok(());
    };
    if let Some(taints) = node.spec.as_mut().and_then(|s| s.taints.as_mut()) {
        taints.retain(|t| !open.contains(&t.key));
    }
    // A CAS on the Node: a kubelet or another controller writing meanwhile makes us retry.
    ctx.cluster.replace(&node).await.map(|_| ())
}

/// Whether a gate's `removeWhen` holds for this node. A node condition is judged by the first
/// condition of its type (as the Go provider); a podsReady gate counts Ready pods of the
/// selector on this node that are not being deleted.
pub fn gate_holds(gate: &StartupTaintGate, node: &Node, s: &Inner) -> bool {
    if let Some(cond) = &gate.remove_when.node_condition {
        return node
            .status
            .as_ref()
            .and_then(|st| st.conditions.as_ref())
            .and_then(|cs| cs.iter().find(|c| c.type_ == cond.type_))
            .is_some_and(|c| c.status == cond.status_or_default());
    }
    let Some(pods) = &gate.remove_when.pods_ready else {
        return false;
    };
    let Ok(selector) = Selector::try_from(pods.selector.clone()) else {
        return false;
    };
    let name = node.metadata.name.as_deref().unwrap_or_default();
    let ready = s
        .pods_on(name)
        .filter(|p| p.metadata.namespace.as_deref() == Some(pods.namespace.as_str()))
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .filter(|p| selector.matches(&p.metadata.labels.clone().unwrap_or_default()))
        .filter(|p| pod_ready(p))
        .count();
    ready >= usize::try_from(pods.min_ready).unwrap_or(usize::MAX)
}

fn pod_ready(p: &Pod) -> bool {
    p.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{NodeCondition, NodeStatus, PodCondition, PodSpec, PodStatus};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};

    /// S62: a gate written for the Go provider v1.1 (`removeWhen`, `status` omitted).
    fn go_gates(yaml: &str) -> Vec<StartupTaintGate> {
        serde_yaml::from_str(yaml).expect("the Go provider's v1.1 shape parses")
    }

    fn node(conditions: &[(&str, &str)]) -> Node {
        Node {
            metadata: ObjectMeta {
                name: Some("n".into()),
                ..Default::default()
            },
            status: Some(NodeStatus {
                conditions: Some(
                    conditions
                        .iter()
                        .map(|(t, s)| NodeCondition {
                            type_: (*t).into(),
                            status: (*s).into(),
                            ..Default::default()
                        })
                        .collect(),
                ),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    fn agent(name: &str, ready: bool, deleting: bool) -> Pod {
        Pod {
            metadata: ObjectMeta {
                name: Some(name.into()),
                namespace: Some("kube-system".into()),
                labels: Some([("app".to_string(), "agent".to_string())].into()),
                deletion_timestamp: deleting.then_some(Time(jiff::Timestamp::UNIX_EPOCH)),
                ..Default::default()
            },
            spec: Some(PodSpec {
                node_name: Some("n".into()),
                ..Default::default()
            }),
            status: Some(PodStatus {
                conditions: Some(vec![PodCondition {
                    type_: "Ready".into(),
                    status: if ready { "True" } else { "False" }.into(),
                    ..Default::default()
                }]),
                ..Default::default()
            }),
        }
    }

    #[test]
    fn s62_node_condition_without_status_means_true() {
        let gates = go_gates(
            "- taintKey: example.com/net\n  removeWhen:\n    nodeCondition:\n      type: NetworkReady\n",
        );
        let s = Inner::default();
        assert!(gate_holds(
            &gates[0],
            &node(&[("NetworkReady", "True")]),
            &s
        ));
        assert!(!gate_holds(
            &gates[0],
            &node(&[("NetworkReady", "False")]),
            &s
        ));
        assert!(!gate_holds(&gates[0], &node(&[]), &s));
        let explicit = go_gates(
            "- taintKey: k\n  removeWhen:\n    nodeCondition: {type: NetworkUnavailable, status: \"False\"}\n",
        );
        assert!(gate_holds(
            &explicit[0],
            &node(&[("NetworkUnavailable", "False")]),
            &s
        ));
        // The first condition of the type decides, as the Go provider's loop.
        assert!(!gate_holds(
            &explicit[0],
            &node(&[
                ("NetworkUnavailable", "True"),
                ("NetworkUnavailable", "False")
            ]),
            &s
        ));
    }

    #[test]
    fn s62_pods_ready_counts_ready_pods_not_being_deleted() {
        let gates = go_gates(
            "- taintKey: k\n  removeWhen:\n    podsReady:\n      namespace: kube-system\n      selector: {matchLabels: {app: agent}}\n      minReady: 2\n",
        );
        let mut s = Inner::default();
        for p in [
            agent("a", true, false),
            agent("b", true, true),
            agent("c", false, false),
        ] {
            let key = (
                "kube-system".to_string(),
                p.metadata.name.clone().unwrap_or_default(),
            );
            s.pods.insert(key, p);
        }
        assert!(
            !gate_holds(&gates[0], &node(&[]), &s),
            "one Ready pod is being deleted"
        );
        let p = agent("d", true, false);
        s.pods.insert(("kube-system".into(), "d".into()), p);
        assert!(gate_holds(&gates[0], &node(&[]), &s));
        let one: Vec<StartupTaintGate> = go_gates(
            "- taintKey: k\n  removeWhen:\n    podsReady: {namespace: kube-system, selector: {matchLabels: {app: agent}}}\n",
        );
        assert_eq!(
            one[0].remove_when.pods_ready.as_ref().map(|p| p.min_ready),
            Some(1)
        );
    }
}
