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
use crate::actors::Context;
use crate::api::SSHNodeClass;
use crate::api::nodeclass::StartupTaintGate;
use crate::k8s::{Cluster, ClusterError};
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

/// Whether a gate's condition holds for this node.
pub fn gate_holds(gate: &StartupTaintGate, node: &Node, s: &Inner) -> bool {
    if let Some(cond) = &gate.node_condition {
        return node
            .status
            .as_ref()
            .and_then(|st| st.conditions.as_ref())
            .is_some_and(|cs| {
                cs.iter()
                    .any(|c| c.type_ == cond.type_ && c.status == cond.status)
            });
    }
    let Some(pods) = &gate.pods_ready else {
        return false;
    };
    let Ok(selector) = Selector::try_from(pods.selector.clone()) else {
        return false;
    };
    let name = node.metadata.name.as_deref().unwrap_or_default();
    let ready = s
        .pods_on(name)
        .filter(|p| p.metadata.namespace.as_deref() == Some(pods.namespace.as_str()))
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
