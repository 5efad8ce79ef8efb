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
    /// more than 1.1 × `refresh` old (so an unchanged host costs one write per `refresh` and
    /// at most one probe interval more, not one per probe).
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
        .map_or_else(|| host.clone(), std::sync::Arc::unwrap_or_clone))
}

/// [`write_status`], returning `None` when nothing needed writing: the steady probe's path,
/// where copying the whole host only to hand it back would be most of the work. The written
/// host comes back shared with the watchers (no copy per consumer in memory).
pub async fn write_status_if_changed<C: Cluster>(
    cluster: &C,
    clock: &Clock,
    host: &SSHHost,
    stamp: ProbeStamp,
    change: impl FnOnce(&mut SSHHostStatus),
) -> Result<Option<std::sync::Arc<SSHHost>>, ClusterError> {
    let empty = SSHHostStatus::default();
    let old = host.status.as_ref().unwrap_or(&empty);
    let mut new = old.clone();
    change(&mut new);
    sync_ready_condition(&mut new, host.metadata.generation, clock);
    let changed = new != *old;
    if !changed && !stamp_due(old, stamp, clock) {
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
    cluster.replace_status_shared(&updated).await.map(Some)
}

/// Whether `stamp` asks for `lastProbeTime` to be rewritten even if nothing else changed.
pub fn stamp_due(old: &SSHHostStatus, stamp: ProbeStamp, clock: &Clock) -> bool {
    match stamp {
        ProbeStamp::Keep => false,
        ProbeStamp::Probed { refresh } => old
            .last_probe_time
            .as_ref()
            // A tenth of slack: probes run every interval *after the last one finished*, so
            // with a refresh that is a multiple of the interval (15 m and 5 m) the due probe
            // lands a few milliseconds late, and without slack the one before it would be
            // the one to write: four writes an hour instead of three.
            .is_none_or(|t| clock.since(t.0) > refresh + refresh / 10),
    }
}

/// Whether the stored Ready condition is exactly what [`sync_ready_condition`] would make of
/// this status (checked without building one).
pub fn ready_condition_synced(status: &SSHHostStatus, generation: Option<i64>) -> bool {
    let (cond_status, reason) = ready_of(status);
    let Some(c) = status.conditions.iter().find(|c| c.type_ == "Ready") else {
        return false;
    };
    // The steady host's message is checked without building it (this runs every probe).
    let message_ok = match (unhealthy_because(status), backoff_note(status)) {
        (Some(err), _) => c.message == *err,
        (None, Some(note)) => c.message == format!("host is {}; {note}", status.state),
        (None, None) => c.message.strip_prefix("host is ") == Some(status.state.as_str()),
    };
    c.status == cond_status
        && c.reason == reason
        && c.observed_generation == generation
        && message_ok
}

/// The Ready condition's (status, reason): the state's, except that a host made Unhealthy by
/// a failed launch (and not by a probe) says so (S64: a phase failure is not a probe failure).
fn ready_of(status: &SSHHostStatus) -> (&'static str, &'static str) {
    let by_state = status.state.ready_condition();
    match (
        status.state,
        &status.last_probe_error,
        &status.last_launch_failure,
    ) {
        (HostState::Unhealthy, None, Some(_)) => ("False", "LaunchFailed"),
        _ => by_state,
    }
}

/// S63: what the Ready message adds while a launch backoff runs.
fn backoff_note(status: &SSHHostStatus) -> Option<String> {
    let b = status.launch_backoff.as_ref()?;
    let until = b.until.as_ref()?;
    Some(format!(
        "not claimed before {} after {} failed launch(es)",
        until.0.strftime("%Y-%m-%dT%H:%M:%SZ"),
        b.failures
    ))
}

/// Why an Unhealthy host is unhealthy: its probe error, else its last launch failure.
fn unhealthy_because(status: &SSHHostStatus) -> Option<&String> {
    if status.state != HostState::Unhealthy {
        return None;
    }
    status
        .last_probe_error
        .as_ref()
        .or(status.last_launch_failure.as_ref().map(|f| &f.message))
}

/// Keep the Ready condition equal to what the state implies; its transition time moves only
/// when its status does.
pub fn sync_ready_condition(status: &mut SSHHostStatus, generation: Option<i64>, clock: &Clock) {
    let (cond_status, reason) = ready_of(status);
    let message = match (unhealthy_because(status), backoff_note(status)) {
        (Some(err), _) => err.clone(),
        (None, Some(note)) => format!("host is {}; {note}", status.state),
        (None, None) => format!("host is {}", status.state),
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

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::{ProbeStamp, write_status_if_changed};
    use crate::api::HostState;
    use crate::clock::Clock;
    use crate::k8s::{Cluster, MemoryCluster};
    use crate::sim::SimHost;
    use crate::sim::world::host_object;

    /// S8's write discipline: an unchanged probe result rewrites `lastProbeTime` only once
    /// the stored stamp is more than 1.1 × the refresh period old.
    #[tokio::test(start_paused = true)]
    async fn unchanged_probe_stamps_only_after_the_refresh_period() {
        let clock = Clock::simulated(jiff::Timestamp::UNIX_EPOCH);
        let cluster = MemoryCluster::new(clock.clone());
        let sim = SimHost::new("10.9.0.1", 2, 4_000_000);
        let host = cluster
            .create(&host_object("pool", "h", "small", &sim))
            .await
            .expect("create");
        let refresh = Duration::from_secs(15 * 60);
        let probed = ProbeStamp::Probed { refresh };
        let available = |s: &mut crate::api::SSHHostStatus| s.state = HostState::Available;
        let host = write_status_if_changed(&cluster, &clock, &host, probed, available)
            .await
            .expect("first write")
            .expect("a new status is written");
        let stamped = host.status.as_ref().and_then(|s| s.last_probe_time.clone());
        assert!(stamped.is_some());
        // Probes run late by their own duration: a stamp just over `refresh` old is kept.
        tokio::time::advance(refresh + Duration::from_secs(3)).await;
        let same = write_status_if_changed(&cluster, &clock, &host, probed, available)
            .await
            .expect("write");
        assert!(same.is_none(), "a stamp just over `refresh` old is kept");
        let kept = write_status_if_changed(&cluster, &clock, &host, ProbeStamp::Keep, available)
            .await
            .expect("write");
        assert!(kept.is_none(), "Keep never writes an unchanged status");
        tokio::time::advance(refresh / 10).await;
        let later = write_status_if_changed(&cluster, &clock, &host, probed, available)
            .await
            .expect("write")
            .expect("a stamp older than `refresh` is rewritten");
        let restamped = later
            .status
            .as_ref()
            .and_then(|s| s.last_probe_time.clone());
        assert!(restamped > stamped);
        assert_ne!(
            later.metadata.resource_version,
            host.metadata.resource_version
        );
    }
}
