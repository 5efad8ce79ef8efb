//! Launch backoff (S63): a host whose launches fail (install or join exits non-zero, or the
//! join ran and no Node registered in time) is not claimed again at once. Each consecutive
//! failure doubles the wait (`launch_backoff_base` up to `launch_backoff_max`, with up to 20%
//! jitter from the seeded random source). The backoff lives in the host's status, so a
//! restarted controller keeps it, and the router skips a host whose `until` is set
//! (`SSHHost::backing_off`). The actor clears `until` when it has passed (a timer, and every
//! probe as a safety net); a launch whose Node registered, a spec edit or a key Secret edit
//! clears the whole backoff.

use std::time::Duration;

use k8s_openapi::api::core::v1::Secret as KubeSecret;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use rand::Rng;

use super::probe::write;
use super::{HostActorState, HostMsg};
use crate::actors::status::ProbeStamp;
use crate::api::{LaunchBackoff, SSHHost, SSHHostStatus};
use crate::k8s::{Cluster, ClusterError, EventType};
use crate::ssh::Transport;

/// Event reason when a host's launch backoff starts or grows.
pub const BACKING_OFF: &str = "LaunchBackoff";

/// The wait after `failures` consecutive failed launches, before jitter: `base`, doubled for
/// each further failure, never above `max`.
pub fn delay(failures: u32, base: Duration, max: Duration) -> Duration {
    let doublings = failures.saturating_sub(1).min(20);
    base.saturating_mul(1u32 << doublings).min(max)
}

/// The backoff a new failure starts, from the one in `status` (if any).
pub fn next(
    status: Option<&SSHHostStatus>,
    now: jiff::Timestamp,
    wait: impl FnOnce(u32) -> Duration,
    secret_version: Option<String>,
) -> LaunchBackoff {
    let failures = status
        .and_then(|s| s.launch_backoff.as_ref())
        .map_or(0, |b| b.failures.max(0))
        .saturating_add(1);
    let wait = wait(u32::try_from(failures).unwrap_or(u32::MAX));
    let until = now + jiff::SignedDuration::try_from(wait).unwrap_or(jiff::SignedDuration::MAX);
    LaunchBackoff {
        failures,
        until: Some(Time(until)),
        secret_version,
    }
}

/// The wait for the `failures`-th failure with this actor's settings and jitter.
pub fn wait_for<C: Cluster, T: Transport>(state: &HostActorState<C, T>, failures: u32) -> Duration {
    let cfg = &state.ctx.config;
    let base = delay(failures, cfg.launch_backoff_base, cfg.launch_backoff_max);
    let jitter = state.ctx.rng().random_range(0.0..0.2);
    base.mul_f64(1.0 + jitter)
}

/// The resourceVersions of the host's key Secret and its bastion's, joined by `,` (what a
/// backoff is reset against). `None` when a Secret cannot be read: then no edit is detected,
/// and the backoff runs out by time.
pub async fn secret_version<C: Cluster>(cluster: &C, ns: &str, host: &SSHHost) -> Option<String> {
    let mut names = vec![host.spec.ssh_key_secret_ref.name.as_str()];
    if let Some(j) = &host.spec.proxy_jump {
        names.push(j.ssh_key_secret_ref.name.as_str());
    }
    let mut versions = vec![];
    for n in names {
        let s: KubeSecret = cluster.get(Some(ns), n).await.ok().flatten()?;
        versions.push(s.metadata.resource_version.unwrap_or_default());
    }
    Some(versions.join(","))
}

/// Wake the actor when the backoff in its status runs out.
pub fn arm<C: Cluster, T: Transport>(state: &HostActorState<C, T>) {
    let Some(until) = until(&state.host) else {
        return;
    };
    let after =
        Duration::try_from(until.duration_since(state.ctx.clock.now())).unwrap_or(Duration::ZERO);
    let me = state.myself.clone();
    let metrics = state.ctx.metrics.clone();
    tokio::spawn(async move {
        tokio::time::sleep(after).await;
        if me.send_message(HostMsg::BackoffDue).is_ok() {
            metrics.mailbox_in("host");
        }
    });
}

fn until(host: &SSHHost) -> Option<jiff::Timestamp> {
    host.status
        .as_ref()
        .and_then(|s| s.launch_backoff.as_ref())
        .and_then(|b| b.until.as_ref())
        .map(|t| t.0)
}

/// The backoff ran out: the host may be claimed again (`failures` stays, so the next failure
/// waits longer). Also run by every probe, so a lost timer (a restart) costs at most one
/// probe interval.
pub async fn expire<C: Cluster, T: Transport>(
    state: &mut HostActorState<C, T>,
) -> Result<(), ClusterError> {
    let Some(until) = until(&state.host) else {
        return Ok(());
    };
    if until > state.ctx.clock.now() {
        return Ok(());
    }
    write(state, ProbeStamp::Keep, |s| {
        if let Some(b) = s.launch_backoff.as_mut() {
            b.until = None;
        }
    })
    .await?;
    tracing::info!(host = %state.key(), "launch backoff over; the host may be claimed again");
    Ok(())
}

/// Forget the backoff (and the last launch failure, when `failure_too`): a spec or key
/// Secret edit, or a launch whose Node registered.
pub async fn reset<C: Cluster, T: Transport>(
    state: &mut HostActorState<C, T>,
    why: &str,
) -> Result<(), ClusterError> {
    let had = state
        .host
        .status
        .as_ref()
        .is_some_and(|s| s.launch_backoff.is_some());
    if !had {
        return Ok(());
    }
    write(state, ProbeStamp::Keep, |s| s.launch_backoff = None).await?;
    tracing::info!(host = %state.key(), why, "launch backoff reset");
    state
        .event(
            EventType::Normal,
            BACKING_OFF,
            format!("launch backoff reset: {why}"),
        )
        .await;
    Ok(())
}

/// A key Secret changed (or the watch restarted): reset the backoff if the versions it was
/// recorded against are no longer the current ones.
pub async fn secret_changed<C: Cluster, T: Transport>(
    state: &mut HostActorState<C, T>,
) -> Result<(), ClusterError> {
    let recorded = state
        .host
        .status
        .as_ref()
        .and_then(|s| s.launch_backoff.as_ref())
        .map(|b| b.secret_version.clone());
    let Some(recorded) = recorded else {
        return Ok(());
    };
    let ns = state.ctx.pool_ns().to_string();
    let current = secret_version(&state.ctx.cluster, &ns, &state.host).await;
    if current.is_some() && current != recorded {
        reset(state, "the host's key Secret changed").await?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn s63_delay_doubles_from_the_base_and_is_capped() {
        let base = Duration::from_secs(60);
        let max = Duration::from_secs(3600);
        let waits: Vec<u64> = (1..=9).map(|n| delay(n, base, max).as_secs()).collect();
        assert_eq!(waits, [60, 120, 240, 480, 960, 1920, 3600, 3600, 3600]);
        assert_eq!(delay(u32::MAX, base, max), max, "no overflow");
        assert_eq!(delay(0, base, max), base);
    }

    #[test]
    fn s63_next_counts_consecutive_failures_and_sets_until() {
        let now = jiff::Timestamp::from_second(1_000_000).expect("time");
        let first = next(None, now, |n| Duration::from_secs(60 * u64::from(n)), None);
        assert_eq!(first.failures, 1);
        assert_eq!(
            first.until.as_ref().map(|t| t.0.as_second()),
            Some(1_000_060)
        );
        let status = SSHHostStatus {
            launch_backoff: Some(LaunchBackoff {
                failures: 3,
                until: None,
                secret_version: Some("7".into()),
            }),
            ..Default::default()
        };
        let fourth = next(
            Some(&status),
            now,
            |n| Duration::from_secs(60 * u64::from(n)),
            Some("8".into()),
        );
        assert_eq!(fourth.failures, 4);
        assert_eq!(
            fourth.until.as_ref().map(|t| t.0.as_second()),
            Some(1_000_240)
        );
        assert_eq!(fourth.secret_version.as_deref(), Some("8"));
    }
}
