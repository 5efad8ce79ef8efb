//! The periodic probe: reachability and facts (S1–S5), maintenance (S7), capacity drift (S6),
//! and the checks that ride on it: stale claims (S26), token collection (S27) and the zombie
//! guard (S9–S12).

use std::collections::BTreeMap;

use super::{HostActorState, registration};
use crate::actors::status::{
    ProbeStamp, ready_condition_synced, stamp_due, write_status_if_changed,
};
use crate::api::host::PinnedHostKey;
use crate::api::{ExecMode, HostState, SSHHost, SSHHostStatus};
use crate::k8s::events;
use crate::k8s::{Cluster, ClusterError, EventType};
use crate::ssh::{ProbeReport, Transport};
use crate::telemetry::lifecycle::millis;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use tracing::Instrument;
use tracing::field::Empty;

/// Probe once, write what changed, schedule the next probe.
pub async fn run<C: Cluster, T: Transport>(state: &mut HostActorState<C, T>) {
    // Each probe is a trace of its own (zombie actions it triggers are children).
    let span = tracing::info_span!(
        parent: None,
        "probe",
        host = %state.key(),
        class = %state.host.class(),
        state = state.state().as_str(),
        outcome = Empty,
        duration_ms = Empty,
    );
    let started = tokio::time::Instant::now();
    let result = probe_once(state).instrument(span.clone()).await;
    if result.is_ok() {
        state.stamp_next_probe = false;
    }
    span.record("duration_ms", millis(started));
    span.record(
        "outcome",
        match &result {
            Ok(()) => "ok",
            Err(ClusterError::Conflict { .. }) => "conflict",
            Err(_) => "error",
        },
    );
    let next = match result {
        Ok(()) => {
            state.failures = 0;
            state.ctx.config.probe_interval
        }
        Err(ClusterError::Conflict { .. }) => {
            // Someone else wrote the host (a claim, most likely): re-read and look again soon.
            let _ = state.refresh().await;
            std::time::Duration::from_secs(1)
        }
        Err(e) => {
            state.failures = state.failures.saturating_add(1);
            tracing::warn!(host = %state.key(), error = %e, "probe bookkeeping failed");
            backoff(state)
        }
    };
    schedule(state, next);
}

/// Exponential backoff with up to 20% jitter (from the seeded random source), so that hosts
/// failing together do not retry in lockstep.
fn backoff<C: Cluster, T: Transport>(state: &HostActorState<C, T>) -> std::time::Duration {
    use rand::Rng;
    let cfg = &state.ctx.config;
    let exp = state.failures.min(16);
    let base = cfg
        .retry_base
        .saturating_mul(1u32 << exp.saturating_sub(1))
        .min(cfg.retry_max)
        .min(cfg.probe_interval);
    let jitter = state.ctx.rng().random_range(0.0..0.2);
    base.mul_f64(1.0 + jitter)
}

/// The next periodic probe, `after` from now (any one scheduled before is void).
fn schedule<C: Cluster, T: Transport>(
    state: &mut HostActorState<C, T>,
    after: std::time::Duration,
) {
    state.probe_ticket = state.probe_ticket.wrapping_add(1);
    state.ctx.probe_clock.schedule(
        tokio::time::Instant::now() + after,
        Box::new(state.myself.clone()),
        state.probe_ticket,
        &state.ctx.metrics,
    );
}

// The rare branches of a probe (zombies, failures, a registration to recheck, an orphaned
// Node) are boxed: inline, their futures made every probe's future several kilobytes, built
// and moved for each of the millions of steady probes a large fleet runs a day.
async fn probe_once<C: Cluster, T: Transport>(
    state: &mut HostActorState<C, T>,
) -> Result<(), ClusterError> {
    if handle_maintenance(state).await? {
        return Ok(());
    }
    super::backoff::expire(state).await?;
    match state.state() {
        // A zombie leave was cut short (crash, restart): finish it.
        HostState::Leaving => return Box::pin(registration::zombie_leave(state)).await,
        HostState::Claimed | HostState::InUse if registration::release_if_stale(state).await? => {
            return Ok(());
        }
        _ => {}
    }
    let target = match state.target().await {
        Ok(t) => t,
        Err(e) => return Box::pin(record_failure(state, e.to_string())).await,
    };
    let shim = (state.host.spec.exec_mode == ExecMode::Verified)
        .then(|| state.host.spec.shim_command.clone());
    let result = {
        let waiting = tokio::time::Instant::now();
        let transport = &state.ctx.transport;
        let _permit = state.ctx.limits.probe(|| !transport.pooled(&target)).await;
        state.ctx.metrics.limiter_waited("probe", waiting.elapsed());
        let started = tokio::time::Instant::now();
        let ssh = tracing::info_span!(
            "ssh.probe",
            host = %state.key(),
            outcome = Empty,
            duration_ms = Empty
        );
        let probe = state
            .ctx
            .transport
            .probe(&target, shim.as_deref())
            .instrument(ssh.clone());
        let result = match tokio::time::timeout(state.ctx.config.probe_timeout, probe).await {
            Ok(r) => r.map_err(|e| e.to_string()),
            Err(_) => Err(format!(
                "{}: probe timed out after {:?}",
                state.key(),
                state.ctx.config.probe_timeout
            )),
        };
        let outcome = if result.is_ok() { "success" } else { "failure" };
        ssh.record("outcome", outcome);
        ssh.record("duration_ms", millis(started));
        (state.ctx.metrics).probe_observed(result.is_ok(), started.elapsed().as_secs_f64());
        result
    };
    match result {
        Ok(report) => record_success(state, &report).await,
        Err(message) => {
            // The key or pin may have changed in the Secret: read it again next time.
            state.forget_target();
            Box::pin(record_failure(state, message)).await
        }
    }
}

/// S7: an unclaimed host with the annotation is parked without any SSH; removing it sends the
/// host back to Pending, and the probe goes on. Returns true when the probe must stop here.
async fn handle_maintenance<C: Cluster, T: Transport>(
    state: &mut HostActorState<C, T>,
) -> Result<bool, ClusterError> {
    let parked = state.state() == HostState::Maintenance;
    let unclaimed = matches!(
        state.state(),
        HostState::Pending | HostState::Available | HostState::Unhealthy | HostState::Maintenance
    );
    if state.host.in_maintenance() && unclaimed {
        if !parked {
            write(state, ProbeStamp::Keep, |s| {
                s.state = HostState::Maintenance
            })
            .await?;
        }
        return Ok(true);
    }
    if parked && !state.host.in_maintenance() {
        write(state, ProbeStamp::Keep, |s| s.state = HostState::Pending).await?;
    }
    Ok(false)
}

async fn record_success<C: Cluster, T: Transport>(
    state: &mut HostActorState<C, T>,
    report: &ProbeReport,
) -> Result<(), ClusterError> {
    let generation = state.host.metadata.generation;
    let unclaimed = matches!(
        state.state(),
        HostState::Pending | HostState::Available | HostState::Unhealthy
    );
    // A kubelet on an unclaimed host: the zombie guard decides the state, not the probe.
    let zombie = report.facts.kubelet_active && unclaimed;
    let stamp = state_stamp(state);
    // The steady probe of an unchanged host: nothing to copy, compare or write.
    let recorded = !zombie
        && (state
            .recorded
            .as_ref()
            .is_some_and(|r| r.holds(&state.host, report))
            || state.host.status.as_ref().is_some_and(|s| {
                let yes = facts_recorded(s, report, generation);
                if yes {
                    state.recorded = Recorded::of(&state.host, report);
                }
                yes
            }));
    let unchanged = recorded
        && state
            .host
            .status
            .as_ref()
            .is_some_and(|s| !stamp_due(s, stamp, &state.ctx.clock));
    if !unchanged {
        let was = state.state();
        write(state, stamp, |s| apply_facts(s, report, generation, zombie)).await?;
        if was != state.state() {
            tracing::info!(host = %state.key(), from = was.as_str(), to = state.state().as_str(), "probe succeeded");
        }
    }
    // Capacity and generation as they were: the drift verdict is the one already known.
    if !unchanged || state.drift_reported.is_none() {
        report_capacity_drift(state).await;
    }
    if zombie {
        // A token that a failed launch or release could not delete goes first: the zombie
        // leave below may run for minutes, and the token must not outlive its claim by that
        // long (S27; found by the random campaign, examples/sim/regress/).
        registration::collect_token(state).await?;
        Box::pin(registration::zombie_check(state)).await?;
    }
    match state.state() {
        HostState::InUse => registration::collect_token(state).await?,
        // A registration whose recording failed earlier: look for the Node again.
        HostState::Claimed => Box::pin(registration::recheck_registration(state)).await?,
        // A token a failed release could not delete (S27: never orphaned).
        HostState::Available | HostState::Unhealthy | HostState::Pending => {
            registration::collect_token(state).await?;
            let orphan = (state.host.status.as_ref()).is_some_and(|s| s.orphan_node.is_some());
            if orphan {
                Box::pin(registration::cleanup_orphan_node(
                    state,
                    report.facts.kubelet_active,
                ))
                .await?;
            }
        }
        _ => {}
    }
    Ok(())
}

fn state_stamp<C: Cluster, T: Transport>(state: &HostActorState<C, T>) -> ProbeStamp {
    // A probe someone asked for is stamped, so that they see it ran.
    let refresh = if state.stamp_next_probe {
        std::time::Duration::ZERO
    } else {
        state.ctx.config.probe_refresh
    };
    ProbeStamp::Probed { refresh }
}

/// The status a successful probe implies (pure; unit-tested).
pub fn apply_facts(
    s: &mut SSHHostStatus,
    report: &ProbeReport,
    generation: Option<i64>,
    zombie: bool,
) {
    if s.host_key_fingerprint.is_none() {
        // Trust on first use: pin what we saw; the transport enforces the pin from now on.
        s.host_key_fingerprint = Some(report.fingerprint.clone());
    }
    // The bastion likewise, per bastion endpoint (target.rs hands the pin back).
    if !jump_key_recorded(s, report) {
        s.proxy_jump_host_key = report.jump.as_ref().map(|j| PinnedHostKey {
            endpoint: j.endpoint.clone(),
            fingerprint: j.fingerprint.clone(),
        });
    }
    s.observed_capacity = Some(BTreeMap::from([
        ("cpu".to_string(), Quantity(report.facts.cpu.to_string())),
        (
            "memory".to_string(),
            Quantity(format!("{}Ki", report.facts.memory_kib)),
        ),
    ]));
    s.observed_arch = Some(report.facts.arch.clone());
    s.observed_generation = generation;
    if zombie {
        return;
    }
    s.last_probe_error = None;
    if matches!(s.state, HostState::Pending | HostState::Unhealthy) {
        s.state = HostState::Available;
    }
}

/// Whether [`apply_facts`] (not for a zombie) and the Ready condition's sync would leave this
/// status as it is: the probe saw what is recorded.
fn facts_recorded(s: &SSHHostStatus, report: &ProbeReport, generation: Option<i64>) -> bool {
    // Compared without formatting: this runs for every probe of every host.
    let capacity_same = s.observed_capacity.as_ref().is_some_and(|c| {
        c.len() == 2
            && c.get("cpu")
                .is_some_and(|q| spells(&q.0, u64::from(report.facts.cpu)))
            && c.get("memory").is_some_and(|q| {
                q.0.strip_suffix("Ki")
                    .is_some_and(|n| spells(n, report.facts.memory_kib))
            })
    });
    s.host_key_fingerprint.is_some()
        && jump_key_recorded(s, report)
        && capacity_same
        && s.observed_arch.as_deref() == Some(report.facts.arch.as_str())
        && s.observed_generation == generation
        && s.last_probe_error.is_none()
        && !matches!(s.state, HostState::Pending | HostState::Unhealthy)
        && ready_condition_synced(s, generation)
}

/// What a steady probe found already recorded in one host object ([`facts_recorded`] held):
/// a later probe reporting the same facts of the same object finds them recorded too, as
/// [`facts_recorded`] is a function of the two alone. Kept so that the steady probe does not
/// read the status again (millions of times a fleet day, over status fields that are cold in
/// the cache by the time the host comes round again): the object by address, the facts inline.
pub struct Recorded {
    /// The object judged, held so that its address cannot be reused while this lives.
    host: std::sync::Arc<SSHHost>,
    cpu: u32,
    memory_kib: u64,
    /// The architecture's bytes (inline: a `String` would be one more cold read).
    arch: [u8; ARCH_INLINE],
    arch_len: u8,
    /// The bastion's endpoint, if the probe went through one.
    jump: Option<String>,
}

const ARCH_INLINE: usize = 16;

impl Recorded {
    /// `None` for an architecture name too long to keep inline (such a host is judged from
    /// its status every time).
    fn of(host: &std::sync::Arc<SSHHost>, report: &ProbeReport) -> Option<Self> {
        let bytes = report.facts.arch.as_bytes();
        let mut arch = [0u8; ARCH_INLINE];
        arch.get_mut(..bytes.len())?.copy_from_slice(bytes);
        Some(Recorded {
            host: host.clone(),
            cpu: report.facts.cpu,
            memory_kib: report.facts.memory_kib,
            arch,
            arch_len: u8::try_from(bytes.len()).ok()?,
            jump: report.jump.as_ref().map(|j| j.endpoint.clone()),
        })
    }

    /// Whether this was found of `host` (the same object) with the facts `report` has.
    fn holds(&self, host: &std::sync::Arc<SSHHost>, report: &ProbeReport) -> bool {
        std::sync::Arc::ptr_eq(&self.host, host)
            && self.cpu == report.facts.cpu
            && self.memory_kib == report.facts.memory_kib
            && self.arch.get(..usize::from(self.arch_len)) == Some(report.facts.arch.as_bytes())
            && self.jump.as_deref() == report.jump.as_ref().map(|j| j.endpoint.as_str())
    }
}

/// Whether the status pins the bastion this probe went through (at the same endpoint), or
/// records none when there was no bastion. A pin for another endpoint is replaced: a different
/// bastion is a different machine, first used now.
fn jump_key_recorded(s: &SSHHostStatus, report: &ProbeReport) -> bool {
    match (&report.jump, &s.proxy_jump_host_key) {
        (None, None) => true,
        (Some(j), Some(p)) => p.endpoint == j.endpoint,
        _ => false,
    }
}

/// Whether `text` is exactly `n` in decimal, as `n.to_string()` would write it: digits only,
/// as many as `n` has (so no leading zero or sign), and the same value.
fn spells(text: &str, n: u64) -> bool {
    text.len() == n.checked_ilog10().map_or(1, |d| d as usize + 1)
        && text.bytes().all(|b| b.is_ascii_digit())
        && text.parse::<u64>() == Ok(n)
}

async fn record_failure<C: Cluster, T: Transport>(
    state: &mut HostActorState<C, T>,
    message: String,
) -> Result<(), ClusterError> {
    let was = state.state();
    let generation = state.host.metadata.generation;
    let stamp = state_stamp(state);
    write(state, stamp, |s| {
        s.last_probe_error = Some(message.clone());
        s.observed_generation = generation;
        if matches!(
            s.state,
            HostState::Pending | HostState::Available | HostState::Unhealthy
        ) {
            s.state = HostState::Unhealthy;
        }
    })
    .await?;
    if was != state.state() {
        tracing::info!(host = %state.key(), from = was.as_str(), to = state.state().as_str(), error = %message, "probe failed");
    }
    if was != HostState::Unhealthy && state.state() == HostState::Unhealthy {
        state
            .event(EventType::Warning, events::PROBE_FAILED, message)
            .await;
    }
    // S27: a token a failed launch could not delete is an API object, not a host's: it goes
    // at this probe even if the host stays unreachable for longer than the probe interval.
    match state.state() {
        HostState::Available | HostState::Unhealthy | HostState::Pending => {
            registration::collect_token(state).await?;
        }
        // S27/S37: so is a registration whose recording failed (a lost write when the Node
        // appeared): the Node is in the API, and with it the token's end, whether or not the
        // host answers now (random campaign seed 9220: a host that lost power after its Node
        // registered kept its token until the Node next changed).
        HostState::Claimed => Box::pin(registration::recheck_registration(state)).await?,
        _ => {}
    }
    Ok(())
}

/// S6: one warning per episode of observed capacity below the declared one.
async fn report_capacity_drift<C: Cluster, T: Transport>(state: &mut HostActorState<C, T>) {
    let drifted = capacity_below_spec(&state.host);
    if drifted && state.drift_reported != Some(true) {
        let msg = format!(
            "observed capacity {:?} is below spec.capacity {:?}",
            observed_summary(&state.host),
            declared_summary(&state.host)
        );
        Box::pin(state.event(EventType::Warning, events::CAPACITY_DRIFT, msg)).await;
    }
    state.drift_reported = Some(drifted);
}

/// Observed cpu or memory below the declared value.
pub fn capacity_below_spec(host: &SSHHost) -> bool {
    let Some(observed) = host
        .status
        .as_ref()
        .and_then(|s| s.observed_capacity.as_ref())
    else {
        return false;
    };
    ["cpu", "memory"].iter().any(|r| {
        let declared = host
            .spec
            .capacity
            .get(*r)
            .and_then(crate::api::quantity::parse);
        let seen = observed.get(*r).and_then(crate::api::quantity::parse);
        matches!((declared, seen), (Some(d), Some(s)) if s < d)
    })
}

fn observed_summary(host: &SSHHost) -> BTreeMap<String, String> {
    host.status
        .as_ref()
        .and_then(|s| s.observed_capacity.as_ref())
        .map(|m| m.iter().map(|(k, v)| (k.clone(), v.0.clone())).collect())
        .unwrap_or_default()
}

fn declared_summary(host: &SSHHost) -> BTreeMap<String, String> {
    host.spec
        .capacity
        .iter()
        .filter(|(k, _)| *k == "cpu" || *k == "memory")
        .map(|(k, v)| (k.clone(), v.0.clone()))
        .collect()
}

/// CAS-write the host's status and adopt the result.
pub async fn write<C: Cluster, T: Transport>(
    state: &mut HostActorState<C, T>,
    stamp: ProbeStamp,
    change: impl FnOnce(&mut SSHHostStatus),
) -> Result<(), ClusterError> {
    // Boxed: the write's future (the API call in it) is kilobytes, and inline it would make
    // every future that may write as large: the steady probe's among them, built, copied and
    // dropped for each of the millions of probes a fleet runs a day, most of which write
    // nothing.
    let updated = Box::pin(write_status_if_changed(
        &state.ctx.cluster,
        &state.ctx.clock,
        &state.host,
        stamp,
        change,
    ))
    .await?;
    if let Some(updated) = updated {
        state.observe(updated);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::spells;

    /// The steady probe's memo holds only for the very object it judged and the very facts:
    /// a new version of the host (even an equal one), or any fact that differs, sends the
    /// probe back to the status.
    #[test]
    fn what_a_probe_found_recorded_holds_for_that_object_and_those_facts_only() {
        use super::Recorded;
        use crate::ssh::{JumpKey, ProbeFacts, ProbeReport};
        use std::sync::Arc;
        let sim = crate::sim::host::SimHost::new("10.0.0.1", 4, 16 << 20);
        let host = Arc::new(crate::sim::world::host_object("ns", "h", "small", &sim));
        let report = |cpu: u32, arch: &str, jump: Option<&str>| ProbeReport {
            facts: ProbeFacts {
                cpu,
                memory_kib: 16 << 20,
                arch: arch.into(),
                kubelet_active: false,
            },
            fingerprint: "SHA256:x".into(),
            jump: jump.map(|e| JumpKey {
                endpoint: e.into(),
                fingerprint: "SHA256:j".into(),
            }),
        };
        let seen = report(4, "amd64", None);
        let r = Recorded::of(&host, &seen).expect("a short arch is kept");
        assert!(r.holds(&host, &seen));
        assert!(r.holds(&host, &report(4, "amd64", None)), "equal facts");
        let equal_copy = Arc::new((*host).clone());
        assert!(!r.holds(&equal_copy, &seen), "another object");
        assert!(!r.holds(&host, &report(8, "amd64", None)), "cpu");
        assert!(!r.holds(&host, &report(4, "arm64", None)), "arch");
        assert!(!r.holds(&host, &report(4, "amd6", None)), "arch prefix");
        assert!(
            !r.holds(&host, &report(4, "amd64", Some("b:22"))),
            "bastion"
        );
        let mut more = seen.clone();
        more.facts.memory_kib -= 1;
        assert!(!r.holds(&host, &more), "memory");
        let long = report(4, "a-very-long-architecture", None);
        assert!(Recorded::of(&host, &long).is_none(), "too long to keep");
    }

    /// The steady probe's "nothing changed" test must agree with what `apply_facts` would
    /// write (`to_string`), or an unchanged host would be written every probe, or a changed
    /// one never.
    #[test]
    fn spells_agrees_with_to_string() {
        for n in [0u64, 7, 10, 16, 99, 100, 65_536, 16_777_216, u64::MAX] {
            assert!(spells(&n.to_string(), n), "{n}");
            assert!(!spells(&format!("0{n}"), n), "leading zero for {n}");
            assert!(!spells(&format!("+{n}"), n), "sign for {n}");
            assert!(!spells(&n.wrapping_add(1).to_string(), n), "{n} + 1");
        }
        assert!(!spells("", 0));
        assert!(!spells("4 ", 4));
        assert!(!spells("5", 4));
    }
}
