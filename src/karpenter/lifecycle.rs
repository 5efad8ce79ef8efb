//! NodeClaim lifecycle (S37): Registered when a Node with the NodeClaim's provider ID exists
//! (labels, taints, owner reference and finalizer synced onto it, `karpenter.sh/unregistered`
//! removed, `karpenter.sh/registered` set); Initialized when that Node is Ready and the startup
//! taints are gone; a NodeClaim not registered within the registration timeout is deleted.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use k8s_openapi::api::core::v1::{Node, Taint};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use serde_json::json;
use tokio::task::JoinHandle;

use super::state::ClusterState;
use super::{KarpenterConfig, KarpenterError};
use crate::api::NodeClaim;
use crate::api::karpenter::{
    INITIALIZED_LABEL, REGISTERED_LABEL, TERMINATION_FINALIZER, UNREGISTERED_TAINT_KEY,
};
use crate::k8s::conditions::upsert_condition;
use crate::k8s::events;
use crate::k8s::{Cluster, EventType};
use crate::provider::Context;
use crate::ssh::Transport;

pub fn spawn<C: Cluster, T: Transport>(
    ctx: Context<C, T>,
    state: ClusterState,
    cfg: KarpenterConfig,
) -> JoinHandle<()> {
    tokio::spawn(async move {
        let mut retry: BTreeSet<String> = BTreeSet::new();
        let mut sweeps = Sweeps::new(tokio::time::Instant::now());
        loop {
            tokio::time::sleep(cfg.reconcile_interval).await;
            let mut names = state.take_touched_claims();
            names.append(&mut retry);
            let sweep = sweeps.due(tokio::time::Instant::now(), cfg.idle_resync);
            let expiry = Expiry::new(ctx.clock.now(), cfg.registration_timeout);
            for nc in due(&state, &names, sweep, expiry) {
                if let Err(e) = reconcile(&ctx, &state, &cfg, &nc).await {
                    tracing::debug!(nodeclaim = ?nc.metadata.name, error = %e, "lifecycle retry");
                    // Retry on the next tick, not after the next sweep.
                    if let Some(name) = nc.metadata.name.clone() {
                        retry.insert(name);
                    }
                }
            }
        }
    })
}

/// A full pass every this many idle resyncs (30 minutes by default). It only catches an
/// event that was missed; each one reconciles (and copies) every NodeClaim of the fleet,
/// which at 10,000 hosts every 5 minutes cost as much as all probing.
const ALL_SWEEP_EVERY: u32 = 60;

/// Which claims a pass takes besides those that moved.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Sweep {
    /// Only what moved.
    None,
    /// Also every claim without a Node: the registration timeout is a rule of time.
    Unregistered,
    /// Every claim: a safety net for a missed event, much rarer.
    All,
}

struct Sweeps {
    unregistered: tokio::time::Instant,
    all: tokio::time::Instant,
}

impl Sweeps {
    fn new(now: tokio::time::Instant) -> Self {
        Sweeps {
            unregistered: now,
            all: now,
        }
    }

    fn due(&mut self, now: tokio::time::Instant, every: Duration) -> Sweep {
        if now >= self.all + every * ALL_SWEEP_EVERY {
            self.all = now;
            self.unregistered = now;
            return Sweep::All;
        }
        if now >= self.unregistered + every {
            self.unregistered = now;
            return Sweep::Unregistered;
        }
        Sweep::None
    }
}

/// When an unregistered NodeClaim is due for deletion: created at or before `cutoff`
/// (`None`: a zero timeout, every claim is due).
#[derive(Debug, Clone, Copy)]
struct Expiry {
    cutoff: Option<jiff::Timestamp>,
}

impl Expiry {
    fn new(now: jiff::Timestamp, timeout: Duration) -> Self {
        // Same rule as reconcile's `since(created) >= timeout` (a negative age is zero). A
        // timeout too large to subtract makes nothing due.
        let cutoff = if timeout.is_zero() {
            None
        } else {
            Some(
                jiff::SignedDuration::try_from(timeout)
                    .ok()
                    .and_then(|d| now.checked_sub(d).ok())
                    .unwrap_or(jiff::Timestamp::MIN),
            )
        };
        Expiry { cutoff }
    }

    /// Whether a claim of the unregistered set (not being deleted, never Registered) is older
    /// than the timeout, so that [`reconcile`] would delete it if it had no Node. Claims
    /// waiting for a host in a burst are many and young; they are not copied every sweep
    /// only to be found not due.
    fn expired(&self, nc: &NodeClaim) -> bool {
        (nc.metadata.creation_timestamp.as_ref())
            .is_some_and(|t| self.cutoff.is_none_or(|c| t.0 <= c))
    }
}

/// The NodeClaims to reconcile this tick: those that moved (object or Node), plus the sweep.
/// A fleet of steady claims costs nothing between sweeps, not even a comparison.
fn due(
    state: &ClusterState,
    moved: &BTreeSet<String>,
    sweep: Sweep,
    expiry: Expiry,
) -> Vec<std::sync::Arc<NodeClaim>> {
    let st = state.read();
    match sweep {
        Sweep::All => st.nodeclaims.values().cloned().collect(),
        Sweep::Unregistered => {
            // In name order, as a pass over all claims would take them.
            let mut names: BTreeSet<&String> = (st.unregistered_claims().iter())
                .filter(|n| {
                    (st.nodeclaims.get(*n))
                        .is_some_and(|nc| expiry.expired(nc) && st.node_of(nc).is_none())
                })
                .collect();
            names.extend(moved);
            names
                .into_iter()
                .filter_map(|n| st.nodeclaims.get(n).cloned())
                .collect()
        }
        Sweep::None => moved
            .iter()
            .filter_map(|name| st.nodeclaims.get(name).cloned())
            .collect(),
    }
}

pub fn condition_true(nc: &NodeClaim, type_: &str) -> bool {
    nc.status.as_ref().is_some_and(|s| {
        s.conditions
            .iter()
            .any(|c| c.type_ == type_ && c.status == "True")
    })
}

pub fn node_ready(node: &Node) -> Option<&k8s_openapi::api::core::v1::NodeCondition> {
    node.status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == "Ready")
}

fn taints(node: &Node) -> Vec<Taint> {
    node.spec
        .as_ref()
        .and_then(|s| s.taints.clone())
        .unwrap_or_default()
}

/// What a lifecycle pass needs of a claim's Node, taken under the state's read lock: the
/// whole Node only when it still has to be registered (rare), a few facts otherwise.
enum NodeSeen {
    /// Deleted (`kubectl delete node`) and held by our termination finalizer (S52).
    Deleting(String),
    Unregistered(Box<Node>),
    Registered {
        name: String,
        taints: Vec<Taint>,
        ready: bool,
        initialized_label: bool,
    },
}

impl NodeSeen {
    fn of(node: &Node) -> NodeSeen {
        let labels = node.metadata.labels.as_ref();
        let has = |k: &str| labels.is_some_and(|l| l.contains_key(k));
        let held = (node.metadata.finalizers.iter().flatten()).any(|f| f == TERMINATION_FINALIZER);
        if node.metadata.deletion_timestamp.is_some() && held {
            return NodeSeen::Deleting(node.metadata.name.clone().unwrap_or_default());
        }
        let taints = taints(node);
        if taints.iter().any(|t| t.key == UNREGISTERED_TAINT_KEY) || !has(REGISTERED_LABEL) {
            return NodeSeen::Unregistered(Box::new(node.clone()));
        }
        NodeSeen::Registered {
            name: node.metadata.name.clone().unwrap_or_default(),
            taints,
            ready: node_ready(node).is_some_and(|c| c.status == "True"),
            initialized_label: has(INITIALIZED_LABEL),
        }
    }
}

/// Registration: sync once, as Karpenter does (later Node edits are the user's).
async fn register<C: Cluster, T: Transport>(
    ctx: &Context<C, T>,
    nc: &NodeClaim,
    name: &str,
    node: &Node,
) -> Result<(), KarpenterError> {
    let node_name = node.metadata.name.clone().unwrap_or_default();
    let node_labels = node.metadata.labels.clone().unwrap_or_default();
    let current = taints(node);
    let mut labels: BTreeMap<String, String> = nc.metadata.labels.clone().unwrap_or_default();
    labels.insert(REGISTERED_LABEL.into(), "true".into());
    let mut new_taints: Vec<Taint> = current
        .iter()
        .filter(|t| t.key != UNREGISTERED_TAINT_KEY)
        .cloned()
        .collect();
    if !node_labels.contains_key(REGISTERED_LABEL) {
        for t in nc.spec.taints.iter().chain(nc.spec.startup_taints.iter()) {
            if !new_taints
                .iter()
                .any(|x| x.key == t.key && x.effect == t.effect)
            {
                new_taints.push(t.clone());
            }
        }
    }
    let mut owners = node.metadata.owner_references.clone().unwrap_or_default();
    if !owners.iter().any(|o| o.kind == "NodeClaim") {
        owners.push(OwnerReference {
            api_version: "karpenter.sh/v1".into(),
            kind: "NodeClaim".into(),
            name: name.to_string(),
            uid: nc.metadata.uid.clone().unwrap_or_default(),
            block_owner_deletion: Some(true),
            controller: None,
        });
    }
    let mut fins = node.metadata.finalizers.clone().unwrap_or_default();
    if !fins.iter().any(|f| f == TERMINATION_FINALIZER) {
        fins.push(TERMINATION_FINALIZER.into());
    }
    // As core's registration: the NodeClaim's annotations (its NodePool template's among them)
    // reach the Node too.
    let annotations = nc.metadata.annotations.clone().unwrap_or_default();
    let patch = json!({
        "metadata": {
            "labels": labels,
            "annotations": annotations,
            "ownerReferences": owners,
            "finalizers": fins,
            "resourceVersion": node.metadata.resource_version,
        },
        "spec": {"taints": new_taints},
    });
    ctx.cluster.patch::<Node>(None, &node_name, &patch).await?;
    Ok(())
}

/// S52, as core's node termination: a deleted Node of ours deletes its NodeClaim, whose
/// termination then drains the Node, runs leave and releases the host; the host deletes the
/// Node (dropping the finalizer) once leave stopped its kubelet.
async fn node_deleted<C: Cluster, T: Transport>(
    ctx: &Context<C, T>,
    nc: &NodeClaim,
    name: &str,
    node: &str,
) -> Result<(), KarpenterError> {
    let msg =
        format!("Node {node} was deleted; deleting its NodeClaim to drain it and release the host");
    events::record(&ctx.cluster, nc, EventType::Normal, "NodeDeleted", msg).await;
    let uid = nc.metadata.uid.clone();
    let precondition = crate::k8s::Precondition {
        uid,
        resource_version: None,
    };
    match ctx
        .cluster
        .delete::<NodeClaim>(None, name, Some(precondition))
        .await
    {
        Ok(_) => Ok(()),
        Err(e) if e.is_not_found() => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// One NodeClaim.
#[tracing::instrument(skip_all, fields(nodeclaim = ?nc.metadata.name))]
pub async fn reconcile<C: Cluster, T: Transport>(
    ctx: &Context<C, T>,
    state: &ClusterState,
    cfg: &KarpenterConfig,
    nc: &NodeClaim,
) -> Result<(), KarpenterError> {
    if nc.metadata.deletion_timestamp.is_some() {
        return Ok(());
    }
    let name = nc.metadata.name.clone().unwrap_or_default();
    let seen = state.read().node_of(nc).map(NodeSeen::of);
    let Some(seen) = seen else {
        let registered = condition_true(nc, "Registered");
        let created = nc.metadata.creation_timestamp.as_ref().map(|t| t.0);
        if !registered && created.is_some_and(|t| ctx.clock.since(t) >= cfg.registration_timeout) {
            let msg = format!(
                "no Node registered within {:?}; deleting the NodeClaim",
                cfg.registration_timeout
            );
            events::record(
                &ctx.cluster,
                nc,
                EventType::Warning,
                "RegistrationTimeout",
                msg,
            )
            .await;
            ctx.cluster.delete::<NodeClaim>(None, &name, None).await?;
        }
        return Ok(());
    };
    let (node_name, current, ready, initialized_label) = match seen {
        NodeSeen::Deleting(node) => return node_deleted(ctx, nc, &name, &node).await,
        NodeSeen::Unregistered(node) => return register(ctx, nc, &name, &node).await,
        NodeSeen::Registered {
            name,
            taints,
            ready,
            initialized_label,
        } => (name, taints, ready, initialized_label),
    };
    let startup_left: Vec<&str> = nc
        .spec
        .startup_taints
        .iter()
        .filter(|s| {
            current
                .iter()
                .any(|t| t.key == s.key && t.effect == s.effect)
        })
        .map(|s| s.key.as_str())
        .collect();
    let initialized = ready && startup_left.is_empty();
    if initialized && !initialized_label {
        let patch = json!({"metadata": {"labels": {INITIALIZED_LABEL: "true"}}});
        ctx.cluster.patch::<Node>(None, &node_name, &patch).await?;
    }
    // The status alone: most passes change nothing, and the claim's metadata and spec are
    // copied only for a write.
    let mut status = nc.status.clone().unwrap_or_default();
    status.node_name = Some(node_name.clone());
    upsert_condition(
        &mut status.conditions,
        "Registered",
        true,
        "Registered",
        "",
        &ctx.clock,
    );
    let (reason, msg) = if initialized {
        ("Initialized", String::new())
    } else if !ready {
        ("NodeNotReady", format!("Node {node_name} is not Ready"))
    } else {
        (
            "StartupTaintsExist",
            format!(
                "startup taints {} still on the Node",
                startup_left.join(",")
            ),
        )
    };
    upsert_condition(
        &mut status.conditions,
        "Initialized",
        initialized,
        reason,
        &msg,
        &ctx.clock,
    );
    let launched = status
        .conditions
        .iter()
        .any(|c| c.type_ == "Launched" && c.status == "True");
    let all = launched && initialized;
    let (r, m) = if all {
        ("Ready", String::new())
    } else {
        (
            "NotReady",
            "not launched, registered and initialized yet".to_string(),
        )
    };
    upsert_condition(&mut status.conditions, "Ready", all, r, &m, &ctx.clock);
    if nc.status.as_ref() != Some(&status) {
        let updated = NodeClaim {
            metadata: nc.metadata.clone(),
            spec: nc.spec.clone(),
            status: Some(status),
        };
        let written = ctx.cluster.replace_status(&updated).await?;
        state.observe_claim(written);
        if initialized && !condition_true(nc, "Initialized") {
            if let Some(uid) = nc.metadata.uid.as_deref() {
                ctx.lifecycles.step(uid, "initialized", "success");
            }
            if let Some(created) = &nc.metadata.creation_timestamp {
                ctx.metrics.nodeclaim_initialized(
                    nc.metadata.name.as_deref().unwrap_or_default(),
                    created.0,
                    ctx.clock.now(),
                );
            }
            let msg = format!("Node {node_name} initialized");
            events::record(&ctx.cluster, nc, EventType::Normal, "Initialized", msg).await;
        }
    }
    Ok(())
}
