//! The host actor: the single owner of everything that touches one host. Its mailbox
//! serialises probes, launches and releases, so no second operation can start on a host while
//! a phase is in flight. State lives in the API; a restarted actor rebuilds from the SSHHost
//! object. One task and one [`mailbox`] per host rather than a ractor actor (see the
//! mailbox's module for why); [`spawn`] starts it.

pub mod abort;
pub mod backoff;
pub mod failure;
pub mod launch;
pub mod mailbox;
pub mod node_identity;
pub mod phases;
pub mod probe;
pub mod registration;
pub mod release;
pub mod target;
pub mod token;
pub mod trace;
pub mod verified;

use futures::FutureExt;
use k8s_openapi::api::core::v1::Node;

pub use mailbox::HostRef;

use crate::api::{ClaimRef, HostState, SSHHost};
use crate::k8s::Cluster;
use crate::ssh::Transport;

use crate::provider::Context;

/// Messages a host actor understands.
#[derive(Debug)]
pub enum HostMsg {
    /// The supervisor's watch delivered a new version of the SSHHost.
    Observed(std::sync::Arc<SSHHost>),
    /// Probe now (a new actor, the router's nudge).
    Probe,
    /// The periodic probe scheduled with this ticket is due (see [`crate::provider::probe_clock`]); stale if
    /// another probe ran and rescheduled since.
    ProbeDue(u64),
    /// The router claimed this host for a NodeClaim: install if needed, then join.
    Launch(ClaimRef),
    /// The NodeClaim holding this host is going away: run leave and release the host.
    Release(ClaimRef),
    /// A Node that may be this host's registered (Static provider ID or Adopt IP match).
    NodeSeen(Box<Node>),
    /// Adopt mode: the Node of this claim should have appeared by now (S21).
    AdoptDeadline(ClaimRef),
    /// The launch backoff in the host's status may have run out (S63).
    BackoffDue,
    /// A key Secret of this host changed: reset a launch backoff recorded against its old
    /// version, re-read the key and probe now (S63, re-probe on Secret change).
    SecretChanged,
}

/// The resourceVersion of the newest SSHHost a host actor holds. Only the actor writes it;
/// the supervisor reads it to drop watch events the actor has already seen (mostly its own
/// status writes), which would otherwise cost a message each and change nothing.
#[derive(Clone, Debug, Default)]
pub struct SeenVersion(std::sync::Arc<std::sync::atomic::AtomicU64>);

impl SeenVersion {
    fn get(&self) -> u64 {
        self.0.load(std::sync::atomic::Ordering::Acquire)
    }

    fn publish(&self, version: u64) {
        self.0
            .fetch_max(version, std::sync::atomic::Ordering::Release);
    }

    /// Whether the actor already holds this version or a newer one (never for an unreadable
    /// version, 0: that one is always delivered).
    pub fn has(&self, version: u64) -> bool {
        version != 0 && version <= self.get()
    }
}

/// What the actor owns besides the API object.
pub struct HostActorState<C: Cluster, T: Transport> {
    pub ctx: Context<C, T>,
    pub name: String,
    /// Latest version seen (watch or own write); every write is a CAS against it.
    pub host: std::sync::Arc<SSHHost>,
    /// `host`'s resourceVersion, published so that the supervisor does not forward a version
    /// this actor already has (its own writes come back on the watch).
    pub seen: SeenVersion,
    /// A CapacityDrift event was emitted for the current episode (`None`: no probe has
    /// judged drift since this actor started).
    pub drift_reported: Option<bool>,
    /// The ticket of the periodic probe now scheduled (see [`crate::provider::probe_clock`]).
    pub probe_ticket: u64,
    /// Consecutive failed probes, for backoff.
    pub failures: u32,
    /// This actor, for timers it sets itself.
    pub myself: HostRef,
    /// The transport target, so that a steady probe does not read the key Secret every time.
    pub target: Option<target::CachedTarget>,
    /// The lifecycle trace of the claim this host holds: NodeClaim UID and its root span.
    /// Rebuilt (marked resumed) when the actor restarts mid-lifecycle.
    pub lifecycle: Option<(String, tracing::Span)>,
    /// The phase slot a launch holds from install through join (see `Limits::phase_slot`).
    pub launch_slot: Option<tokio::sync::OwnedSemaphorePermit>,
    /// A probe was asked for (the probe annotation changed): the next probe stamps
    /// `lastProbeTime` even if nothing else changed, so the asker sees it ran.
    pub stamp_next_probe: bool,
    /// The facts the last steady probe found recorded in `host` (see [`probe::Recorded`]);
    /// dropped whenever `host` is replaced.
    pub recorded: Option<probe::Recorded>,
}

impl<C: Cluster, T: Transport> HostActorState<C, T> {
    pub fn key(&self) -> String {
        format!("{}/{}", self.ctx.pool_ns(), self.name)
    }

    /// Adopt a newer object (our own write, or a watch event), never an older one.
    pub fn observe(&mut self, host: impl Into<std::sync::Arc<SSHHost>>) {
        use crate::provider::context::rv;
        let host = host.into();
        let version = rv(&host);
        // `seen` is the held host's version (published here and only here), so the held
        // object's resourceVersion string is not parsed again for every write.
        if version >= self.seen.get() {
            self.host = self.ctx.hosts.share(host);
            self.seen.publish(version);
            self.recorded = None;
        }
    }

    /// The transport target: cached for `target_refresh`, rebuilt at once when the spec or the
    /// pinned fingerprint changed (key rotation is picked up within that period).
    pub async fn target(
        &mut self,
    ) -> Result<std::sync::Arc<crate::ssh::HostTarget>, target::TargetError> {
        let ns = self.ctx.pool_ns().to_string();
        let refresh = self.ctx.config.target_refresh;
        if let Some(t) = self
            .target
            .as_ref()
            .filter(|t| t.valid_for(&self.host, refresh))
        {
            return Ok(t.target.clone());
        }
        // Boxed: a rebuild (every `target_refresh`) would otherwise size every probe's future.
        let built = Box::pin(target::cached_host_target(
            &self.ctx.cluster,
            &self.ctx.keys,
            refresh,
            &ns,
            &self.host,
        ))
        .await?;
        let cached = target::CachedTarget::new(&self.host, built);
        let shared = cached.target.clone();
        self.target = Some(cached);
        Ok(shared)
    }

    /// Forget the cached target (e.g. after an authentication failure).
    pub fn forget_target(&mut self) {
        self.target = None;
    }

    /// Record an event about this host. `message` must already be redacted.
    pub async fn event(
        &self,
        type_: crate::k8s::EventType,
        reason: &str,
        message: impl Into<String>,
    ) {
        crate::k8s::events::record(&self.ctx.cluster, &*self.host, type_, reason, message).await;
    }

    /// Re-read the host after a lost CAS.
    pub async fn refresh(&mut self) -> Result<bool, crate::k8s::ClusterError> {
        let ns = self.ctx.pool_ns().to_string();
        match self
            .ctx
            .cluster
            .get::<SSHHost>(Some(&ns), &self.name)
            .await?
        {
            Some(h) => {
                self.observe(h);
                Ok(true)
            }
            None => Ok(false),
        }
    }

    pub fn state(&self) -> HostState {
        self.host.state()
    }

    /// A spec edit (S4), a maintenance annotation flip (S7) or a probe asked for with the
    /// probe annotation is acted on at once.
    fn needs_probe_now(&self, old: &SSHHost) -> bool {
        old.metadata.generation != self.host.metadata.generation
            || old.in_maintenance() != self.host.in_maintenance()
            || old.probe_requested() != self.host.probe_requested()
    }
}

/// Start the actor of `host`: it probes at once (a new host, or an actor rebuilt after a
/// crash, learns where it stands). `failed` is told, with the panic's message, when a message
/// panics; the actor is gone then and its supervisor rebuilds it from the API. A stopped actor
/// ([`HostRef::stop`]) finishes the message in hand and lets go of its pooled connection; an
/// aborted task (a killed controller) stops at once.
pub fn spawn<C: Cluster, T: Transport>(
    ctx: Context<C, T>,
    host: std::sync::Arc<SSHHost>,
    seen: SeenVersion,
    failed: impl FnOnce(String) + Send + 'static,
) -> (HostRef, tokio::task::JoinHandle<()>) {
    let (myself, inbox) = mailbox::mailbox();
    let _ = myself.send_message(HostMsg::Probe);
    ctx.metrics.mailbox_in("host");
    let name = host.metadata.name.clone().unwrap_or_default();
    let host = ctx.hosts.share(host);
    seen.publish(crate::provider::context::rv(&host));
    let state = HostActorState {
        ctx,
        name,
        host,
        seen,
        drift_reported: None,
        probe_ticket: 0,
        failures: 0,
        myself: myself.clone(),
        target: None,
        lifecycle: None,
        launch_slot: None,
        stamp_next_probe: false,
        recorded: None,
    };
    // A backoff recorded before a restart runs out on time (the probe clears it too).
    backoff::arm(&state);
    // One catch_unwind around the actor's life, not one per message: a panic ends the actor
    // (its state goes with it, as a failed actor's does) and is reported.
    let task = tokio::spawn(async move {
        if let Err(panic) = std::panic::AssertUnwindSafe(run(inbox, state))
            .catch_unwind()
            .await
        {
            failed(panic_message(panic.as_ref()));
        }
    });
    (myself, task)
}

/// The actor's life: one message at a time until it is stopped.
async fn run<C: Cluster, T: Transport>(inbox: mailbox::Inbox, mut state: HostActorState<C, T>) {
    while let Some(msg) = inbox.next().await {
        handle(msg, &mut state).await;
    }
    state.ctx.transport.forget(&state.key()).await;
}

fn panic_message(panic: &(dyn std::any::Any + Send)) -> String {
    match (panic.downcast_ref::<&str>(), panic.downcast_ref::<String>()) {
        (Some(s), _) => (*s).to_string(),
        (_, Some(s)) => s.clone(),
        _ => "panicked".to_string(),
    }
}

// Debug level: each message is not a trace of its own; probes and lifecycles are.
#[tracing::instrument(level = "debug", skip_all, fields(host = %state.name))]
async fn handle<C: Cluster, T: Transport>(msg: HostMsg, state: &mut HostActorState<C, T>) {
    state.ctx.metrics.mailbox_out("host");
    // Each arm is boxed: the actor's task holds this future for its whole life, and inline
    // it would be as large as the largest arm (a launch), in every one of 10,000 hosts.
    match msg {
        HostMsg::Observed(host) => {
            let old = state.host.clone();
            state.observe(host);
            if old.metadata.generation != state.host.metadata.generation
                && let Err(e) = Box::pin(backoff::reset(state, "the host's spec changed")).await
            {
                tracing::warn!(host = %state.key(), error = %e, "launch backoff not reset");
            }
            if old.probe_requested() != state.host.probe_requested() {
                state.stamp_next_probe = true;
            }
            if state.needs_probe_now(&old) {
                Box::pin(probe::run(state)).await;
            }
        }
        HostMsg::BackoffDue => {
            if let Err(e) = Box::pin(backoff::expire(state)).await {
                tracing::warn!(host = %state.key(), error = %e, "launch backoff not cleared; the next probe retries");
            }
        }
        HostMsg::SecretChanged => {
            if let Err(e) = Box::pin(backoff::secret_changed(state)).await {
                tracing::warn!(host = %state.key(), error = %e, "launch backoff not reset");
            }
            state.forget_target();
            Box::pin(probe::run(state)).await;
        }
        HostMsg::Probe => Box::pin(probe::run(state)).await,
        HostMsg::ProbeDue(ticket) => {
            if ticket == state.probe_ticket {
                Box::pin(probe::run(state)).await;
            }
        }
        HostMsg::Launch(claim) => Box::pin(launch::run(state, &claim)).await,
        HostMsg::Release(claim) => Box::pin(release_claim(state, &claim)).await,
        HostMsg::NodeSeen(node) => Box::pin(registration::node_seen(state, &node)).await,
        HostMsg::AdoptDeadline(claim) => Box::pin(launch::adopt_deadline(state, &claim)).await,
    }
}

/// A release, and a registration failure reported if the claim never registered. Apart
/// from [`handle`]: the NodeClaim it holds across the release would make every actor's task
/// that much larger for its whole life.
async fn release_claim<C: Cluster, T: Transport>(
    state: &mut HostActorState<C, T>,
    claim: &ClaimRef,
) {
    let unregistered = Box::pin(failure::unregistered_claim(state, claim)).await;
    Box::pin(release::run(state, claim)).await;
    if let Some(nc) = unregistered
        && state.host.claim() != Some(claim)
    {
        Box::pin(failure::registration_failed(state, claim, &nc)).await;
    }
}

/// The probe clock delivers a due periodic probe as a message to the host's actor.
impl crate::provider::probe_clock::ProbeTarget for HostRef {
    fn probe_due(&self, ticket: u64) -> bool {
        self.send_message(HostMsg::ProbeDue(ticket)).is_ok()
    }
}

#[cfg(test)]
mod tests {
    use super::SeenVersion;

    fn returned_size<A, B, R>(_: fn(A, B) -> R) -> usize {
        std::mem::size_of::<R>()
    }

    /// Every host actor's task holds the future of the message in hand for its whole life, so
    /// whatever that future keeps across an await is paid per host: a NodeClaim held across
    /// a release made it 1.9 KiB (in a test build), 190 MB over a 100,000-host fleet.
    #[test]
    fn the_per_message_future_held_by_every_actor_stays_small() {
        type State = super::HostActorState<crate::k8s::MemoryCluster, crate::sim::SimTransport>;
        let handle = returned_size::<super::HostMsg, &mut State, _>(
            super::handle::<crate::k8s::MemoryCluster, crate::sim::SimTransport>,
        );
        assert!(handle <= 768, "handle's future is {handle} bytes");
    }

    /// Each probe builds its future and moves it into a box: a fleet runs millions a day, so
    /// every byte of it is copied millions of times. A status write awaited inline (most
    /// probes write nothing) made it 3,152 bytes in a test build; boxed, 1,160.
    #[test]
    fn the_future_built_for_every_probe_stays_small() {
        type M = crate::k8s::MemoryCluster;
        type S = crate::sim::SimTransport;
        fn returned<A, R>(_: fn(A) -> R) -> usize {
            std::mem::size_of::<R>()
        }
        let probe = returned::<&mut super::HostActorState<M, S>, _>(super::probe::run::<M, S>);
        assert!(probe <= 1536, "a probe's future is {probe} bytes");
    }

    /// The supervisor drops a watch event only when the actor already holds that version or a
    /// newer one; an older publish never lowers the mark, and an unreadable version (0) is
    /// always delivered.
    #[test]
    fn seen_version_holds_the_newest_and_never_hides_an_unreadable_one() {
        let seen = SeenVersion::default();
        assert!(!seen.has(1), "nothing published yet");
        seen.publish(7);
        assert!(seen.has(7) && seen.has(3));
        assert!(!seen.has(8), "a newer version is delivered");
        seen.publish(5);
        assert!(seen.has(7), "an older publish does not lower the mark");
        assert!(!seen.has(0), "an unreadable version is always delivered");
    }
}
