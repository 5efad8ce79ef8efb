//! Running one profile phase on the host: render, build the exec plan for the host's mode,
//! run it under the fleet-wide phase limit, and turn any failure into redacted text.

use crate::api::{ExecMode, SSHHost, SSHJoinProfile};
use crate::k8s::Cluster;
use crate::profile::phase::{
    ExecMode as RenderMode, Phase, PhaseContext, ProfileSource, Scripts, Timeouts, raw_plan,
    render_phase,
};
use crate::profile::verified::VerifiedPolicy;
use crate::ssh::{Cancel, CommandOutput, HostTarget, RemoteCommand, Transport};
use crate::telemetry::lifecycle::millis;
use tracing::Instrument;
use tracing::field::Empty;

use super::HostActorState;
use crate::provider::metrics::InFlight;

/// Bytes of a failed script's output kept (after redaction) in a failure message: its end,
/// where the cause is (S64). Events and status stay well under Kubernetes' size limits.
pub const OUTPUT_TAIL: usize = 1536;

/// Why a phase did not succeed. `message` is already redacted.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct PhaseFailure {
    pub message: String,
    /// False when nothing reached the host (rendering or configuration error).
    pub touched_host: bool,
    /// The phase that failed, when one ran (S64).
    pub phase: Option<Phase>,
    /// Its exit status, when it ran to an exit.
    pub exit_status: Option<u32>,
}

impl PhaseFailure {
    pub fn config(message: impl Into<String>) -> Self {
        PhaseFailure {
            message: message.into(),
            touched_host: false,
            ..PhaseFailure::default()
        }
    }

    /// A failure after the host was touched that is not a script's exit (an API error).
    pub fn touched(message: impl Into<String>) -> Self {
        PhaseFailure {
            message: message.into(),
            touched_host: true,
            ..PhaseFailure::default()
        }
    }
}

/// The end of a failed script's output, redacted before it is cut (S35, S64): stderr, where
/// scripts under `set -e` and package managers put the cause, else stdout.
pub fn output_tail(redactor: &crate::profile::redact::Redactor, out: &CommandOutput) -> String {
    let (stream, dropped) = if out.stderr.iter().any(|b| !b.is_ascii_whitespace()) {
        (&out.stderr, out.stderr_dropped)
    } else {
        (&out.stdout, out.stdout_dropped)
    };
    // The transport kept the stream's end; a secret cut where it dropped the beginning is
    // redacted too (tail_output), before the tail is taken.
    let tail = redactor.tail_output(stream, dropped, OUTPUT_TAIL);
    let tail = tail.trim();
    // Start on a line of its own when the cut fell inside one.
    let cut = stream.len() > OUTPUT_TAIL || dropped > 0;
    match (cut, tail.find('\n')) {
        (true, Some(i)) if i + 1 < tail.len() => format!("…\n{}", &tail[i + 1..]),
        (true, _) => format!("…{tail}"),
        (false, _) => tail.to_string(),
    }
}

/// The profile as the renderer sees it.
pub fn profile_source(profile: &SSHJoinProfile) -> ProfileSource {
    let s = &profile.spec;
    ProfileSource {
        name: profile.metadata.name.clone().unwrap_or_default(),
        version: Some(s.version.clone()),
        scripts: Scripts {
            install: Some(s.scripts.install.clone()),
            join: Some(s.scripts.join.clone()),
            leave: Some(s.scripts.leave.clone()),
            uninstall: s.scripts.uninstall.clone(),
        },
        timeouts: Timeouts {
            install: Some(s.timeouts.install.clone()),
            join: Some(s.timeouts.join.clone()),
            leave: Some(s.timeouts.leave.clone()),
        },
    }
}

/// The context `leave` gets: the host's own addresses only (the leave contract).
pub fn leave_context(host: &SSHHost) -> PhaseContext {
    PhaseContext {
        host_address: host.spec.address.clone(),
        node_address: host.node_address().to_string(),
        ..PhaseContext::default()
    }
}

/// The command that runs `phase` on the host: rendered and planned, not yet sent.
pub fn plan(
    host: &SSHHost,
    profile: &SSHJoinProfile,
    phase: Phase,
    ctx: &PhaseContext,
    now: jiff::Timestamp,
    policy: VerifiedPolicy,
) -> Result<(RemoteCommand, crate::profile::redact::Redactor), PhaseFailure> {
    let mode = match host.spec.exec_mode {
        ExecMode::Raw => RenderMode::Raw,
        ExecMode::Verified => RenderMode::Verified,
    };
    let source = profile_source(profile);
    let rendered =
        render_phase(&source, phase, ctx, mode).map_err(|e| PhaseFailure::config(e.to_string()))?;
    let redactor = rendered.redactor.clone();
    let cmd = match host.spec.exec_mode {
        ExecMode::Raw => {
            let plan = raw_plan(&rendered, &host.spec.user)
                .map_err(|e| PhaseFailure::config(e.to_string()))?;
            RemoteCommand::new(plan.command, rendered.timeout).with_stdin(plan.stdin)
        }
        ExecMode::Verified => super::verified::command(host, profile, &rendered, now, policy)?,
    };
    Ok((cmd, redactor))
}

/// Run `phase` and succeed only on exit status 0, as a span named after the phase (a child
/// of the current span: the claim's lifecycle or a zombie action) with an `ssh.exec` child.
pub async fn run_phase<C: Cluster, T: Transport>(
    state: &HostActorState<C, T>,
    target: &HostTarget,
    profile: &SSHJoinProfile,
    phase: Phase,
    ctx: &PhaseContext,
) -> Result<(), PhaseFailure> {
    run_phase_cancellable(state, target, profile, phase, ctx, Cancel::default()).await
}

/// [`run_phase`], killed (as on its timeout) when `cancel` fires.
pub async fn run_phase_cancellable<C: Cluster, T: Transport>(
    state: &HostActorState<C, T>,
    target: &HostTarget,
    profile: &SSHJoinProfile,
    phase: Phase,
    ctx: &PhaseContext,
    cancel: Cancel,
) -> Result<(), PhaseFailure> {
    let span = tracing::info_span!(
        "phase",
        otel.name = phase.as_str(),
        phase = phase.as_str(),
        host = %state.key(),
        profile = %profile.marker(),
        outcome = Empty,
        exit_code = Empty,
        limiter_wait_ms = Empty,
        duration_ms = Empty,
        otel.status_code = Empty,
    );
    let result = run_phase_inner(state, target, profile, phase, ctx, cancel)
        .instrument(span.clone())
        .await;
    if let Err(f) = &result {
        span.record("otel.status_code", "ERROR");
        if !f.touched_host {
            span.record("outcome", "config_error");
        }
    }
    result
}

async fn run_phase_inner<C: Cluster, T: Transport>(
    state: &HostActorState<C, T>,
    target: &HostTarget,
    profile: &SSHJoinProfile,
    phase: Phase,
    ctx: &PhaseContext,
    cancel: Cancel,
) -> Result<(), PhaseFailure> {
    let span = tracing::Span::current();
    let (cmd, redactor) = plan(
        &state.host,
        profile,
        phase,
        ctx,
        state.ctx.clock.now(),
        state.ctx.config.verified,
    )?;
    let cmd = cmd.with_cancel(cancel);
    let waiting = tokio::time::Instant::now();
    let limits = &state.ctx.limits;
    // Under a launch's slot only the dial rate is waited for; counting that as a phase wait
    // would report one launch as several waits for the phase limit. Only a call that opens a
    // new connection waits for the dial rate (a launch's join reuses its install's).
    let dials = || !state.ctx.transport.pooled(target);
    let (_permit, limit) = match (phase, &state.launch_slot) {
        (Phase::Leave, _) => (Some(limits.leave(dials).await), "leave"),
        (_, Some(_)) => {
            limits.pace(dials).await;
            (None, "dial")
        }
        (_, None) => (Some(limits.phase(dials).await), "phase"),
    };
    span.record("limiter_wait_ms", millis(waiting));
    state.ctx.metrics.limiter_waited(limit, waiting.elapsed());
    let metrics = &state.ctx.metrics;
    let _in_flight = InFlight::new(&metrics.phases_in_flight);
    let started = tokio::time::Instant::now();
    let exec = tracing::info_span!(
        "ssh.exec",
        host = %state.key(),
        phase = phase.as_str(),
        outcome = Empty,
        exit_code = Empty,
        duration_ms = Empty,
    );
    let result = state
        .ctx
        .transport
        .exec(target, cmd)
        .instrument(exec.clone())
        .await;
    let outcome = match &result {
        Ok(o) if o.success() => "success",
        Ok(_) => "failure",
        Err(_) => "error",
    };
    for s in [&span, &exec] {
        s.record("outcome", outcome);
        s.record("duration_ms", millis(started));
        if let Ok(o) = &result {
            s.record("exit_code", i64::from(o.exit_status));
        }
    }
    metrics.phase_observed(
        phase.as_str(),
        outcome == "success",
        started.elapsed().as_secs_f64(),
    );
    let out = result.map_err(|e| PhaseFailure {
        message: redactor.redact(&e.to_string()),
        touched_host: e.touched_host(),
        phase: Some(phase),
        exit_status: None,
    })?;
    if out.success() {
        tracing::info!(host = %state.key(), phase = phase.as_str(), duration_ms = millis(started), "phase succeeded");
        return Ok(());
    }
    let tail = output_tail(&redactor, &out);
    let meaning = match state.host.spec.exec_mode {
        ExecMode::Verified => format!(" ({})", super::verified::describe_exit(out.exit_status)),
        ExecMode::Raw => String::new(),
    };
    let message = format!(
        "{}: {phase} exited with status {}{meaning}; its output ends: {tail}",
        state.key(),
        out.exit_status,
    );
    tracing::info!(host = %state.key(), phase = phase.as_str(), exit_status = out.exit_status, "phase failed");
    Err(PhaseFailure {
        message,
        touched_host: true,
        phase: Some(phase),
        exit_status: Some(out.exit_status),
    })
}

/// The profile named by the host's install marker `<profile>@<version>` (leave's source).
pub async fn marker_profile<C: Cluster, T: Transport>(
    state: &HostActorState<C, T>,
) -> Result<SSHJoinProfile, PhaseFailure> {
    let marker = state
        .host
        .status
        .as_ref()
        .and_then(|s| s.installed_profile.clone())
        .ok_or_else(|| {
            PhaseFailure::config(format!(
                "{}: no install marker, so no profile to take the leave script from",
                state.key()
            ))
        })?;
    let name = marker.split('@').next().unwrap_or_default().to_string();
    match state.ctx.cluster.get::<SSHJoinProfile>(None, &name).await {
        Ok(Some(p)) => Ok(p),
        Ok(None) => Err(PhaseFailure::config(format!(
            "SSHJoinProfile {name} (from install marker {marker}) not found"
        ))),
        Err(e) => Err(PhaseFailure::config(e.to_string())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::profile::redact::Redactor;
    use crate::secret::Secret;

    fn output(stderr: &str, stdout: &str) -> CommandOutput {
        CommandOutput {
            exit_status: 100,
            stdout: stdout.as_bytes().to_vec(),
            stderr: stderr.as_bytes().to_vec(),
            ..Default::default()
        }
    }

    /// S64: the cause sits at the end of apt's output; the start is noise.
    #[test]
    fn s64_the_end_of_the_output_is_kept_redacted_and_cut_on_a_line() {
        let token = "abcdef.0123456789abcdef";
        let redactor = Redactor::new(Some(&Secret::new(token)), &[]);
        let mut stderr = String::from(
            "debconf: delaying package configuration, since apt-utils is not installed\n",
        );
        for i in 0..200 {
            stderr.push_str(&format!(
                "Get:{i} http://deb.example/debian bookworm/main amd64 pkg{i}\n"
            ));
        }
        stderr.push_str(&format!("+ kubeadm join --token {token}\n"));
        stderr.push_str("E: Unable to locate package kubelet\n");
        let tail = output_tail(&redactor, &output(&stderr, "ignored"));
        assert!(
            tail.ends_with("E: Unable to locate package kubelet"),
            "{tail}"
        );
        assert!(!tail.contains("debconf"), "the start is dropped: {tail}");
        assert!(
            tail.starts_with("…\nGet:"),
            "cut on a line boundary: {tail}"
        );
        assert!(tail.contains("--token <redacted>"), "{tail}");
        assert!(!tail.contains("0123456789abcdef"), "the token never shows");
        assert!(tail.len() <= OUTPUT_TAIL + 8);
        // Nothing on stderr: stdout's end.
        let tail = output_tail(&redactor, &output("  \n", "step 1\nstep 2: failed\n"));
        assert_eq!(tail, "step 1\nstep 2: failed");
    }
}
