//! Event reasons (stable: users alert on them) and the helper that records them.

use crate::k8s::{Cluster, EventRecord, EventType, Object, ObjectRef};

pub const CAPACITY_DRIFT: &str = "CapacityDrift";
pub const ZOMBIE_KUBELET: &str = "ZombieKubelet";
pub const ZOMBIE_LEFT: &str = "ZombieLeft";
pub const ZOMBIE_LEAVE_FAILED: &str = "ZombieLeaveFailed";
pub const FOREIGN_KUBELET: &str = "ForeignKubelet";
pub const PROBE_FAILED: &str = "ProbeFailed";
pub const STALE_CLAIM: &str = "StaleClaimReleased";
pub const CLAIMED: &str = "Claimed";
pub const INSUFFICIENT_CAPACITY: &str = "InsufficientCapacity";
pub const LAUNCH_FAILED: &str = "LaunchFailed";
pub const CONFIGURATION_ERROR: &str = "ConfigurationError";
pub const JOINED: &str = "Joined";
pub const RELEASED: &str = "Released";
pub const LEAVE_FAILED: &str = "LeaveFailed";
/// A host selected by node classes of two shards (`--node-classes`): left alone until fixed.
pub const SHARD_OVERLAP: &str = "ShardOverlap";

/// Record an event about `obj`. `message` must already be redacted.
pub async fn record<C: Cluster, K: Object>(
    cluster: &C,
    obj: &K,
    type_: EventType,
    reason: &str,
    message: impl Into<String>,
) {
    cluster
        .record_event(EventRecord {
            regarding: ObjectRef::of(obj),
            type_,
            reason: reason.to_string(),
            message: message.into(),
        })
        .await;
}
