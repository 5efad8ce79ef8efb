//! SSHHost status writes: always a compare-and-swap, never a write that changes nothing, and
//! the Ready condition derived from the state in the same write (S8).

use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};

use crate::api::{HostState, SSHHost, SSHHostStatus};
use crate::clock::Clock;
use crate::k8s::{Cluster, ClusterError};

/// How a write treats `lastProbeTime`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProbeStamp {
    /// Leave it as it is.
    Keep,
    /// A probe just ran: stamp it when the write happens anyway, or when the stored stamp is
    /// older than `refresh` (so an unchanged host costs one write per `refresh`, not per probe).
    Probed { refresh: Duration },
}

/// Apply `change` to the host's status and write it as a CAS on the host's resourceVersion.
/// Returns the stored object, or the input unchanged when there was nothing to write.
pub async fn write_status<C: Cluster>(
    cluster: &C,
    clock: &Clock,
    host: &SSHHost,
    stamp: ProbeStamp,
    change: impl FnOnce(&mut SSHHostStatus),
) -> Result<SSHHost, ClusterError> {
    Ok(write_status_if_changed(cluster, clock, host, stamp, change)
        .await?
        .unwrap_or_else(|| host.clone()))
}

/// [`write_status`], returning `None` when nothing needed writing: the steady probe's path,
/// where copying the whole host only to hand it back would be most of the work.
pub async fn write_status_if_changed<C: Cluster>(
    cluster: &C,
    clock: &Clock,
    host: &SSHHost,
    stamp: ProbeStamp,
    change: impl FnOnce(&mut SSHHostStatus),
) -> Result<Option<SSHHost>, ClusterError> {
    let empty = SSHHostStatus::default();
    let old = host.status.as_ref().unwrap_or(&empty);
    let mut new = old.clone();
    change(&mut new);
    sync_ready_condition(&mut new, host.metadata.generation, clock);
    let changed = new != *old;
    let stale_stamp = match stamp {
        ProbeStamp::Keep => false,
        ProbeStamp::Probed { refresh } => old
            .last_probe_time
            .as_ref()
            .is_none_or(|t| clock.since(t.0) >= refresh),
    };
    if !changed && !stale_stamp {
        return Ok(None);
    }
    if matches!(stamp, ProbeStamp::Probed { .. }) {
        new.last_probe_time = Some(Time(clock.now()));
    }
    // Built field by field: cloning the host would copy the old status only to drop it.
    let updated = SSHHost {
        metadata: host.metadata.clone(),
        spec: host.spec.clone(),
        status: Some(new),
    };
    cluster.replace_status(&updated).await.map(Some)
}

/// Keep the Ready condition equal to what the state implies; its transition time moves only
/// when its status does.
pub fn sync_ready_condition(status: &mut SSHHostStatus, generation: Option<i64>, clock: &Clock) {
    let (cond_status, reason) = status.state.ready_condition();
    let message = match (status.state, &status.last_probe_error) {
        (HostState::Unhealthy, Some(err)) => err.clone(),
        (state, _) => format!("host is {state}"),
    };
    let existing = status.conditions.iter().position(|c| c.type_ == "Ready");
    let transition = existing
        .map(|i| &status.conditions[i])
        .filter(|c| c.status == cond_status)
        .map(|c| c.last_transition_time.clone())
        .unwrap_or_else(|| Time(clock.now()));
    let cond = Condition {
        type_: "Ready".into(),
        status: cond_status.into(),
        reason: reason.into(),
        message,
        observed_generation: generation,
        last_transition_time: transition,
    };
    match existing {
        Some(i) => {
            if status.conditions[i] != cond {
                status.conditions[i] = cond;
            }
        }
        None => status.conditions.push(cond),
    }
}
