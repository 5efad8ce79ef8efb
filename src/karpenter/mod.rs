//! The parts of Karpenter core that kpssh provides itself (DESIGN §2, "karpenter layer"):
//! cluster state, provisioning, NodeClaim lifecycle, termination, disruption and repair, for
//! `karpenter.sh/v1` NodePools whose nodeClassRef is an SSHNodeClass (and only those, S31).
//!
//! [`spawn`] starts every controller of the layer next to the actor core. Each controller is a
//! tokio task that reads [`state::ClusterState`] and writes through the `Cluster` port.

pub mod budgets;
pub mod cron;
pub mod disruption;
pub mod hash_sync;
pub mod lifecycle;
pub mod metrics;
pub mod nodepool_counter;
pub mod nodepool_hash;
pub mod nodepool_status;
pub mod nodepool_validation;
pub mod pod_events;
pub mod pods;
pub mod provisioning;
pub mod scheduling;
pub mod state;
pub mod taint_gates;
pub mod termination;
pub mod topology;

use std::time::Duration;

use tokio::task::JoinHandle;

use crate::k8s::{Cluster, ClusterError};
use crate::provider::Context;
use crate::provider::instance_types::InstanceTypeError;
use crate::ssh::Transport;

/// Errors of the karpenter layer.
#[derive(Debug, thiserror::Error)]
pub enum KarpenterError {
    #[error(transparent)]
    Cluster(#[from] ClusterError),
    #[error(transparent)]
    InstanceType(#[from] InstanceTypeError),
    #[error("NodePool {pool}: {message}")]
    NodePool { pool: String, message: String },
}

/// Settings of the layer; defaults follow upstream Karpenter.
#[derive(Debug, Clone)]
pub struct KarpenterConfig {
    /// A batch of pending pods closes after this long without a new one…
    pub batch_idle: Duration,
    /// …or after this long in total.
    pub batch_max: Duration,
    /// Provisioning looks again this often while pods stay pending.
    pub provision_retry: Duration,
    /// Lifecycle and termination reconcile period.
    pub reconcile_interval: Duration,
    /// A NodeClaim whose object and Node did not change is reconciled again after this long
    /// (for the time-based rules), not on every tick.
    pub idle_resync: Duration,
    /// A NodeClaim whose Node has not registered after this long is deleted (S37).
    pub registration_timeout: Duration,
    /// Node repair (S43), off by default as upstream's `NodeRepair` feature gate.
    pub node_repair: bool,
    /// Toleration of each repair condition (Node Ready `False`, Ready `Unknown`) before the
    /// NodeClaim is repaired: 30 minutes, as core's.
    pub repair_toleration: Duration,
    /// Disruption evaluation period.
    pub disruption_interval: Duration,
    /// First retry after an eviction refused by a PDB; doubles up to `eviction_backoff_max`.
    pub eviction_backoff: Duration,
    pub eviction_backoff_max: Duration,
    /// Multi-node consolidation (S57): several under-utilised nodes deleted, or replaced by
    /// one cheaper node, in one decision, before single-node consolidation (core's order). On
    /// by default, as in core; off leaves single-node consolidation only.
    pub multi_node_consolidation: bool,
}

impl Default for KarpenterConfig {
    fn default() -> Self {
        KarpenterConfig {
            batch_idle: Duration::from_secs(1),
            batch_max: Duration::from_secs(10),
            provision_retry: Duration::from_secs(10),
            reconcile_interval: Duration::from_secs(1),
            idle_resync: Duration::from_secs(30),
            registration_timeout: Duration::from_secs(15 * 60),
            node_repair: false,
            repair_toleration: Duration::from_secs(30 * 60),
            disruption_interval: Duration::from_secs(10),
            eviction_backoff: Duration::from_secs(1),
            eviction_backoff_max: Duration::from_secs(30),
            multi_node_consolidation: true,
        }
    }
}

/// The running layer. Dropping it stops every task.
pub struct KarpenterHandles {
    pub state: state::ClusterState,
    tasks: Vec<JoinHandle<()>>,
}

impl KarpenterHandles {
    pub fn stop(&mut self) {
        for t in self.tasks.drain(..) {
            t.abort();
        }
    }
}

impl Drop for KarpenterHandles {
    fn drop(&mut self) {
        self.stop();
    }
}

impl KarpenterConfig {
    /// The defaults, with the registration timeout of the actor config.
    pub fn for_actors(config: &crate::provider::Config) -> Self {
        KarpenterConfig {
            registration_timeout: config.registration_timeout,
            ..KarpenterConfig::default()
        }
    }
}

/// Start the layer with default settings (registration timeout from the actor config).
pub async fn spawn<C: Cluster, T: Transport>(
    ctx: &Context<C, T>,
) -> Result<KarpenterHandles, KarpenterError> {
    spawn_with(ctx, KarpenterConfig::for_actors(&ctx.config)).await
}

/// Start cluster state, provisioning, lifecycle, the NodePool hash, termination and disruption.
pub async fn spawn_with<C: Cluster, T: Transport>(
    ctx: &Context<C, T>,
    config: KarpenterConfig,
) -> Result<KarpenterHandles, KarpenterError> {
    let state = state::ClusterState::of_shard(ctx.clock.clone(), ctx.shard.clone());
    ctx.metrics.core.watch(std::sync::Arc::new(state.clone()));
    let mut tasks = state.start(&ctx.cluster);
    // Wait for the first list of every kind so no controller acts on a partial view.
    while !state.read().synced() {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    tasks.push(provisioning::spawn(
        ctx.clone(),
        state.clone(),
        config.clone(),
    ));
    tasks.push(lifecycle::spawn(ctx.clone(), state.clone(), config.clone()));
    tasks.push(hash_sync::spawn(ctx.clone(), state.clone(), config.clone()));
    tasks.push(taint_gates::spawn(
        ctx.clone(),
        state.clone(),
        config.clone(),
    ));
    tasks.push(termination::spawn(
        ctx.clone(),
        state.clone(),
        config.clone(),
    ));
    tasks.push(nodepool_status::spawn(
        ctx.clone(),
        state.clone(),
        config.clone(),
    ));
    tasks.push(pod_events::spawn(
        ctx.clone(),
        state.clone(),
        config.clone(),
    ));
    tasks.push(disruption::spawn(ctx.clone(), state.clone(), config));
    Ok(KarpenterHandles { state, tasks })
}
