//! Leader election through a `coordination.k8s.io/v1` Lease, so that several controller replicas
//! can run while exactly one of them works (issue 6, item 7).
//!
//! The rules are client-go's `leaderelection` package, written against the `Cluster` port:
//! - a candidate takes the Lease when it is absent, released (no holder) or expired, and
//!   every write is a compare-and-swap on `resourceVersion`, so two candidates racing for the
//!   same Lease never both win;
//! - "expired" is judged on this process's monotonic clock, never on the `renewTime` written by
//!   another machine: a Lease is expired when its `resourceVersion` has not changed for its
//!   `leaseDurationSeconds` since this process first saw that version (clock skew between
//!   machines cannot make a live leader look dead);
//! - the leader renews every retry period and gives up once it could not renew for the renew
//!   deadline, which is shorter than the lease duration: it stops before anyone else may start;
//! - releasing (on shutdown, after the work stopped) clears the holder and shortens the duration
//!   to one second, so a standby takes over at its next retry instead of a full lease duration.

use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use kube::api::ObjectMeta;
use thiserror::Error;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::{Cluster, ClusterError};
use crate::clock::Clock;

/// client-go's defaults (and Karpenter's, kube-controller-manager's).
pub const DEFAULT_LEASE_DURATION: Duration = Duration::from_secs(15);
pub const DEFAULT_RENEW_DEADLINE: Duration = Duration::from_secs(10);
pub const DEFAULT_RETRY_PERIOD: Duration = Duration::from_secs(2);
/// What a released Lease declares, so that a standby's expiry check passes at once.
const RELEASED_LEASE_SECONDS: i32 = 1;

#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum LeaderError {
    #[error("leader election is misconfigured: {0}")]
    Config(String),
    #[error("lost the Lease {lease}: {reason}")]
    Lost { lease: String, reason: String },
    #[error("Lease {lease}: {source}")]
    Api {
        lease: String,
        #[source]
        source: ClusterError,
    },
    #[error("Lease {lease}: the API server did not answer within {limit:?}")]
    TimedOut { lease: String, limit: Duration },
}

/// Where the Lease is, who this candidate is, and the timing rules.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseConfig {
    pub namespace: String,
    pub name: String,
    /// Unique per process: a restarted process must not think it still holds its old Lease.
    pub identity: String,
    pub lease_duration: Duration,
    pub renew_deadline: Duration,
    pub retry_period: Duration,
}

impl LeaseConfig {
    pub fn new(namespace: &str, name: &str, identity: &str) -> Self {
        LeaseConfig {
            namespace: namespace.into(),
            name: name.into(),
            identity: identity.into(),
            lease_duration: DEFAULT_LEASE_DURATION,
            renew_deadline: DEFAULT_RENEW_DEADLINE,
            retry_period: DEFAULT_RETRY_PERIOD,
        }
    }

    /// The ordering the safety argument needs: a leader gives up (renew deadline) before its
    /// Lease can expire for the others (lease duration), and retries more than once in between.
    pub fn validate(&self) -> Result<(), LeaderError> {
        if self.namespace.is_empty() || self.name.is_empty() || self.identity.is_empty() {
            return Err(LeaderError::Config(
                "the Lease namespace, name and holder identity must not be empty".into(),
            ));
        }
        if self.lease_duration <= self.renew_deadline {
            return Err(LeaderError::Config(format!(
                "lease duration {:?} must be longer than the renew deadline {:?}",
                self.lease_duration, self.renew_deadline
            )));
        }
        if self.renew_deadline < self.retry_period * 2 {
            return Err(LeaderError::Config(format!(
                "renew deadline {:?} must allow at least two retries of {:?}",
                self.renew_deadline, self.retry_period
            )));
        }
        if self.lease_duration.as_secs() < 1
            || i32::try_from(self.lease_duration.as_secs()).is_err()
        {
            return Err(LeaderError::Config(format!(
                "lease duration {:?} is not a whole number of seconds the Lease can hold",
                self.lease_duration
            )));
        }
        Ok(())
    }

    fn key(&self) -> String {
        format!("{}/{}", self.namespace, self.name)
    }
}

/// What this process currently is, for /readyz, /metrics and logs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Role {
    /// Has not read the Lease yet.
    Starting,
    /// Read the Lease and waits: someone else holds it (`holder`), or it just lost a race.
    Standby { holder: Option<String> },
    /// Holds the Lease and may work.
    Leader,
    /// Held the Lease and lost it; the process must stop working.
    Lost,
}

/// A candidate for one Lease. [`LeaderElector::acquire`] waits until it leads.
pub struct LeaderElector<C: Cluster> {
    cluster: C,
    config: LeaseConfig,
    clock: Clock,
    observed: Option<Observed>,
    /// The Lease as this process last wrote it while leading: the next renewal writes over it
    /// without reading first (client-go's optimistic fast path), as long as the Lease is still
    /// valid by this process's clock; a conflict or any error falls back to read-then-write.
    written: Option<Lease>,
    role: watch::Sender<Role>,
}

/// The Lease version last seen and when this process first saw it.
struct Observed {
    resource_version: Option<String>,
    at: Instant,
    duration: Duration,
}

/// The result of one round against the Lease.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Round {
    /// This process holds the Lease (acquired or renewed).
    Leading,
    /// Someone else holds it and it has not expired, or another candidate won the race.
    HeldBy(Option<String>),
    /// The Lease is gone (only matters to a leader).
    Absent,
}

impl<C: Cluster> LeaderElector<C> {
    pub fn new(cluster: C, config: LeaseConfig, clock: Clock) -> Result<Self, LeaderError> {
        config.validate()?;
        let (role, _) = watch::channel(Role::Starting);
        Ok(LeaderElector {
            cluster,
            config,
            clock,
            observed: None,
            written: None,
            role,
        })
    }

    pub fn config(&self) -> &LeaseConfig {
        &self.config
    }

    /// Follows the role for as long as the elector or its [`Leadership`] lives.
    pub fn role(&self) -> watch::Receiver<Role> {
        self.role.subscribe()
    }

    /// Retries every retry period (with up to 20 % jitter, so candidates do not move in
    /// lockstep) until this process leads, or returns `None` once `cancel` fires.
    pub async fn acquire(mut self, cancel: &CancellationToken) -> Option<Leadership<C>> {
        let mut last_holder: Option<Option<String>> = None;
        loop {
            let started = Instant::now();
            match self.bounded_round(false, self.config.renew_deadline).await {
                Ok(Round::Leading) => {
                    tracing::info!(lease = %self.config.key(), identity = %self.config.identity,
                        "acquired the leader Lease: this controller works now");
                    self.role.send_replace(Role::Leader);
                    return Some(self.hold(started));
                }
                Ok(Round::HeldBy(holder)) => {
                    if last_holder.as_ref() != Some(&holder) {
                        tracing::info!(lease = %self.config.key(),
                            holder = holder.as_deref().unwrap_or(""),
                            "standing by: another controller holds the leader Lease");
                        last_holder = Some(holder.clone());
                    }
                    self.role.send_replace(Role::Standby { holder });
                }
                Ok(Round::Absent) => {}
                Err(e) => log_round_error(&e),
            }
            let jitter = self
                .config
                .retry_period
                .mul_f64(rand::random::<f64>() * 0.2);
            tokio::select! {
                _ = cancel.cancelled() => return None,
                _ = tokio::time::sleep(self.config.retry_period + jitter) => {}
            }
        }
    }

    /// Renews in a task of its own until stopped ([`Leadership::release`]) or lost.
    fn hold(self, renewed_at: Instant) -> Leadership<C> {
        let stop = CancellationToken::new();
        let (lost_tx, lost_rx) = watch::channel(None);
        let role = self.role.subscribe();
        let lease = self.config.key();
        let task = tokio::spawn(renew_loop(self, renewed_at, stop.clone(), lost_tx));
        Leadership {
            lease,
            stop,
            lost: lost_rx,
            role,
            task,
        }
    }

    /// One round, bounded: `limit` covers the read and the write together.
    async fn bounded_round(
        &mut self,
        leading: bool,
        limit: Duration,
    ) -> Result<Round, LeaderError> {
        match tokio::time::timeout(limit, self.round(leading)).await {
            Ok(r) => r.map_err(|source| LeaderError::Api {
                lease: self.config.key(),
                source,
            }),
            Err(_) => Err(LeaderError::TimedOut {
                lease: self.config.key(),
                limit,
            }),
        }
    }

    /// Renew from the Lease last written (no read) if it is still valid, else read the Lease
    /// and create, take over or renew it as the rules allow.
    async fn round(&mut self, leading: bool) -> Result<Round, ClusterError> {
        let written = self.written.take();
        if let Some(mut next) = written.filter(|_| leading && !self.observed_expired()) {
            let duration_secs =
                i32::try_from(self.config.lease_duration.as_secs()).unwrap_or(i32::MAX);
            if let Some(spec) = next.spec.as_mut() {
                spec.lease_duration_seconds = Some(duration_secs);
                spec.renew_time = Some(MicroTime(self.clock.now()));
            }
            match self.cluster.replace(&next).await {
                Ok(written) => {
                    self.observe(&written);
                    self.written = Some(written);
                    return Ok(Round::Leading);
                }
                Err(e) => {
                    tracing::debug!(lease = %self.config.key(), error = %e,
                        "optimistic Lease renewal failed; reading the Lease");
                }
            }
        }
        let round = self.read_and_write(leading).await;
        if !matches!(round, Ok(Round::Leading)) {
            self.written = None;
        }
        round
    }

    /// Read the Lease, then create, take over or renew it as the rules allow.
    async fn read_and_write(&mut self, leading: bool) -> Result<Round, ClusterError> {
        let ns = self.config.namespace.clone();
        let now = MicroTime(self.clock.now());
        let duration_secs = i32::try_from(self.config.lease_duration.as_secs()).unwrap_or(i32::MAX);
        let Some(current) = self
            .cluster
            .get::<Lease>(Some(&ns), &self.config.name)
            .await?
        else {
            if leading {
                // Someone deleted it under us; a standby may be creating it right now.
                return Ok(Round::Absent);
            }
            let lease = Lease {
                metadata: ObjectMeta {
                    name: Some(self.config.name.clone()),
                    namespace: Some(ns),
                    ..Default::default()
                },
                spec: Some(LeaseSpec {
                    holder_identity: Some(self.config.identity.clone()),
                    lease_duration_seconds: Some(duration_secs),
                    acquire_time: Some(now.clone()),
                    renew_time: Some(now),
                    lease_transitions: Some(0),
                    ..Default::default()
                }),
            };
            return match self.cluster.create(&lease).await {
                Ok(created) => {
                    self.observe(&created);
                    self.written = Some(created);
                    Ok(Round::Leading)
                }
                // Another candidate created it first: it leads.
                Err(ClusterError::AlreadyExists { .. }) => Ok(Round::HeldBy(None)),
                Err(e) => Err(e),
            };
        };
        self.observe(&current);
        let spec = current.spec.clone().unwrap_or_default();
        let holder = spec.holder_identity.clone().filter(|h| !h.is_empty());
        let mine = holder.as_deref() == Some(self.config.identity.as_str());
        if leading && !mine {
            return Ok(Round::HeldBy(holder));
        }
        if !mine && holder.is_some() && !self.observed_expired() {
            return Ok(Round::HeldBy(holder));
        }
        let mut next = current;
        let mut spec = spec;
        if !mine {
            spec.acquire_time = Some(now.clone());
            spec.lease_transitions = Some(spec.lease_transitions.unwrap_or(0).saturating_add(1));
        }
        spec.holder_identity = Some(self.config.identity.clone());
        spec.lease_duration_seconds = Some(duration_secs);
        spec.renew_time = Some(now);
        next.spec = Some(spec);
        // `next` carries the resourceVersion just read: the write is a compare-and-swap.
        match self.cluster.replace(&next).await {
            Ok(written) => {
                self.observe(&written);
                self.written = Some(written);
                Ok(Round::Leading)
            }
            Err(ClusterError::Conflict { .. }) => Ok(Round::HeldBy(None)),
            Err(e) => Err(e),
        }
    }

    /// Clear the holder if it is still this process; `true` when released.
    async fn release(&mut self) -> Result<bool, LeaderError> {
        let lease = self.config.key();
        let limit = self.config.renew_deadline;
        let attempt = async {
            let ns = self.config.namespace.clone();
            let Some(mut current) = self
                .cluster
                .get::<Lease>(Some(&ns), &self.config.name)
                .await?
            else {
                return Ok(false);
            };
            let mut spec = current.spec.clone().unwrap_or_default();
            if spec.holder_identity.as_deref() != Some(self.config.identity.as_str()) {
                return Ok(false);
            }
            spec.holder_identity = None;
            spec.lease_duration_seconds = Some(RELEASED_LEASE_SECONDS);
            spec.renew_time = Some(MicroTime(self.clock.now()));
            current.spec = Some(spec);
            match self.cluster.replace(&current).await {
                Ok(_) => Ok(true),
                Err(ClusterError::Conflict { .. }) => Ok(false),
                Err(e) => Err(e),
            }
        };
        match tokio::time::timeout(limit, attempt).await {
            Ok(r) => r.map_err(|source| LeaderError::Api { lease, source }),
            Err(_) => Err(LeaderError::TimedOut { lease, limit }),
        }
    }

    fn observe(&mut self, lease: &Lease) {
        let rv = lease.metadata.resource_version.clone();
        if self
            .observed
            .as_ref()
            .is_some_and(|o| o.resource_version == rv)
        {
            return;
        }
        let secs = lease
            .spec
            .as_ref()
            .and_then(|s| s.lease_duration_seconds)
            .and_then(|s| u64::try_from(s).ok())
            .map(Duration::from_secs)
            .unwrap_or(self.config.lease_duration);
        self.observed = Some(Observed {
            resource_version: rv,
            at: Instant::now(),
            duration: secs,
        });
    }

    fn observed_expired(&self) -> bool {
        self.observed
            .as_ref()
            .is_none_or(|o| o.at.elapsed() >= o.duration)
    }
}

fn log_round_error(e: &LeaderError) {
    match e {
        LeaderError::Api {
            source: ClusterError::Forbidden { .. },
            ..
        } => {
            tracing::error!(error = %e, "leader election: RBAC refuses the Lease (coordination.k8s.io leases get/create/update)")
        }
        _ => tracing::warn!(error = %e, "leader election: will retry"),
    }
}

/// The leader's side: renew every retry period; give up when a renew has not succeeded for
/// the renew deadline, or when the Lease names someone else or is gone.
async fn renew_loop<C: Cluster>(
    mut elector: LeaderElector<C>,
    mut renewed_at: Instant,
    stop: CancellationToken,
    lost: watch::Sender<Option<LeaderError>>,
) -> Option<LeaderElector<C>> {
    let lease = elector.config.key();
    let deadline = elector.config.renew_deadline;
    loop {
        tokio::select! {
            _ = stop.cancelled() => return Some(elector),
            _ = tokio::time::sleep(elector.config.retry_period) => {}
        }
        let remaining = deadline.saturating_sub(renewed_at.elapsed());
        let reason = if remaining.is_zero() {
            Some(format!("not renewed for {deadline:?}"))
        } else {
            let started = Instant::now();
            let round = tokio::select! {
                // A renewal in flight is abandoned on stop: release reads the Lease afresh.
                _ = stop.cancelled() => return Some(elector),
                r = elector.bounded_round(true, remaining) => r,
            };
            match round {
                Ok(Round::Leading) => {
                    // The renewTime written is at or after `started`; counting from `started`
                    // errs on the side of giving up early.
                    renewed_at = started;
                    None
                }
                Ok(Round::HeldBy(Some(holder))) => Some(format!("{holder} holds it now")),
                Ok(Round::HeldBy(None)) => {
                    tracing::warn!(lease = %lease, "renewing the leader Lease lost a race; retrying");
                    None
                }
                Ok(Round::Absent) => Some("the Lease was deleted".into()),
                Err(e) => {
                    log_round_error(&e);
                    None
                }
            }
        };
        let reason = reason.or_else(|| {
            (renewed_at.elapsed() >= deadline).then(|| format!("not renewed for {deadline:?}"))
        });
        if let Some(reason) = reason {
            elector.role.send_replace(Role::Lost);
            lost.send_replace(Some(LeaderError::Lost {
                lease: lease.clone(),
                reason,
            }));
            return None;
        }
    }
}

/// Held leadership: renewed in the background until released or lost.
pub struct Leadership<C: Cluster> {
    /// `namespace/name`, for errors.
    lease: String,
    stop: CancellationToken,
    lost: watch::Receiver<Option<LeaderError>>,
    role: watch::Receiver<Role>,
    task: JoinHandle<Option<LeaderElector<C>>>,
}

impl<C: Cluster> Leadership<C> {
    /// Resolves once leadership is lost; pending while it is held. The caller must stop all
    /// work at once: another candidate may take the Lease after its duration.
    pub async fn lost(&mut self) -> LeaderError {
        match self.lost.wait_for(Option::is_some).await {
            Ok(reason) => reason.clone().unwrap_or_else(|| LeaderError::Lost {
                lease: self.lease.clone(),
                reason: "renewal stopped".into(),
            }),
            // The renewal task is gone (it panicked): nothing renews the Lease any more.
            Err(_) => LeaderError::Lost {
                lease: self.lease.clone(),
                reason: "the renewal task ended".into(),
            },
        }
    }

    pub fn role(&self) -> watch::Receiver<Role> {
        self.role.clone()
    }

    /// Stop renewing and hand the Lease back. Call only after the work stopped. `Ok(true)` when
    /// the Lease was released, `Ok(false)` when it was no longer this process's.
    pub async fn release(self) -> Result<bool, LeaderError> {
        self.stop.cancel();
        match self.task.await {
            Ok(Some(mut elector)) => {
                let released = elector.release().await;
                elector.role.send_replace(Role::Standby { holder: None });
                released
            }
            Ok(None) => Ok(false),
            Err(e) => Err(LeaderError::Lost {
                lease: self.lease,
                reason: format!("the renewal task failed: {e}"),
            }),
        }
    }
}

/// A holder identity unique to this process: the pod name (`POD_NAME`, else `HOSTNAME`, else
/// the kernel's hostname) and a random suffix, so a restarted container never mistakes the
/// Lease its predecessor held for its own.
pub fn process_identity() -> String {
    let host = std::env::var("POD_NAME")
        .ok()
        .or_else(|| std::env::var("HOSTNAME").ok())
        .or_else(|| std::fs::read_to_string("/proc/sys/kernel/hostname").ok())
        .map(|h| h.trim().to_string())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "kpssh".into());
    format!("{host}_{:08x}", rand::random::<u32>())
}

/// `kpssh_leader` in Prometheus text: 1 while this process works (it holds the Lease, or leader
/// election is off), 0 while it stands by.
pub fn exposition(working: bool) -> String {
    format!(
        "# HELP kpssh_leader 1 while this controller works (holds the leader Lease, or leader election is off), 0 while it stands by.\n# TYPE kpssh_leader gauge\nkpssh_leader {}\n",
        u8::from(working)
    )
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};

    use super::*;
    use crate::k8s::MemoryCluster;
    use crate::k8s::memory::WriteKind;

    const NS: &str = "kpssh-system";
    const NAME: &str = "kpssh-controller";

    fn start() -> Clock {
        Clock::simulated("2026-01-01T00:00:00Z".parse().expect("timestamp"))
    }

    fn elector(c: &MemoryCluster, id: &str) -> LeaderElector<MemoryCluster> {
        LeaderElector::new(c.clone(), LeaseConfig::new(NS, NAME, id), c.clock().clone())
            .expect("valid config")
    }

    async fn holder(c: &MemoryCluster) -> Option<String> {
        c.get::<Lease>(Some(NS), NAME)
            .await
            .expect("get")
            .and_then(|l| l.spec)
            .and_then(|s| s.holder_identity)
    }

    #[test]
    fn config_must_let_the_leader_stop_before_the_lease_expires() {
        let mut c = LeaseConfig::new(NS, NAME, "a");
        assert_eq!(c.validate(), Ok(()));
        c.renew_deadline = c.lease_duration;
        assert!(c.validate().is_err());
        let mut c = LeaseConfig::new(NS, NAME, "a");
        c.retry_period = Duration::from_secs(6);
        assert!(c.validate().is_err());
        assert!(LeaseConfig::new(NS, NAME, "").validate().is_err());
    }

    #[tokio::test(start_paused = true)]
    async fn one_of_two_candidates_leads_and_the_other_waits_for_expiry() {
        let c = MemoryCluster::new(start());
        let cancel = CancellationToken::new();
        let a = elector(&c, "a");
        let b = elector(&c, "b");
        let mut b_role = b.role();
        let mut lead_a = a.acquire(&cancel).await.expect("a leads");
        assert_eq!(holder(&c).await.as_deref(), Some("a"));
        let b_task = tokio::spawn(async move {
            let cancel = CancellationToken::new();
            let at = Instant::now();
            let lead = b.acquire(&cancel).await;
            (lead, at.elapsed())
        });
        b_role
            .wait_for(|r| matches!(r, Role::Standby { .. }))
            .await
            .expect("b stands by");
        // While a renews, b never takes over.
        tokio::time::sleep(Duration::from_secs(60)).await;
        assert!(!b_task.is_finished(), "b took a Lease that a renews");
        assert_eq!(holder(&c).await.as_deref(), Some("a"));
        // a stops renewing without releasing (a crash): b waits the lease duration, no longer
        // than one more retry (with jitter) after it.
        let crashed_at = Instant::now();
        lead_a.task.abort();
        let (lead_b, _) = b_task.await.expect("b task");
        let took = crashed_at.elapsed();
        assert!(lead_b.is_some());
        assert_eq!(holder(&c).await.as_deref(), Some("b"));
        assert!(
            took >= DEFAULT_LEASE_DURATION - DEFAULT_RETRY_PERIOD,
            "b took over after {took:?}, before the Lease could expire"
        );
        assert!(
            took <= DEFAULT_LEASE_DURATION + DEFAULT_RETRY_PERIOD.mul_f64(2.4),
            "b took over after {took:?}"
        );
        let lease = c
            .get::<Lease>(Some(NS), NAME)
            .await
            .expect("get")
            .expect("lease");
        assert_eq!(lease.spec.and_then(|s| s.lease_transitions), Some(1));
        // a's renewal task is gone; it reports loss instead of hanging.
        let lost = lead_a.lost().await;
        assert!(matches!(lost, LeaderError::Lost { .. }));
    }

    #[tokio::test(start_paused = true)]
    async fn release_hands_over_at_the_next_retry() {
        let c = MemoryCluster::new(start());
        let cancel = CancellationToken::new();
        let lead_a = elector(&c, "a").acquire(&cancel).await.expect("a leads");
        let b = elector(&c, "b");
        let b_task = tokio::spawn(async move {
            let cancel = CancellationToken::new();
            b.acquire(&cancel).await.is_some()
        });
        tokio::time::sleep(Duration::from_secs(30)).await;
        let released_at = Instant::now();
        assert_eq!(lead_a.release().await, Ok(true));
        assert_eq!(holder(&c).await, None);
        assert!(b_task.await.expect("b task"));
        let took = released_at.elapsed();
        assert!(
            took <= DEFAULT_RETRY_PERIOD.mul_f64(1.2),
            "released Lease taken after {took:?}"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_leader_that_cannot_renew_gives_up_before_the_lease_expires() {
        let c = MemoryCluster::new(start());
        let cancel = CancellationToken::new();
        let mut lead = elector(&c, "a").acquire(&cancel).await.expect("a leads");
        let failing = Arc::new(AtomicBool::new(false));
        let f = failing.clone();
        c.set_fault_injector(Some(Arc::new(move |kind, _: &str, _: &str| {
            (f.load(Ordering::SeqCst) && kind == WriteKind::Replace).then(|| {
                ClusterError::Transient {
                    kind: "Lease".into(),
                    key: "x".into(),
                    message: "injected".into(),
                }
            })
        })));
        tokio::time::sleep(Duration::from_secs(20)).await;
        let last_ok = Instant::now();
        failing.store(true, Ordering::SeqCst);
        let reason = lead.lost().await;
        let after = last_ok.elapsed();
        assert!(reason.to_string().contains("not renewed"), "{reason}");
        assert!(
            after <= DEFAULT_RENEW_DEADLINE,
            "gave up {after:?} after the last renewal"
        );
        assert!(*lead.role().borrow() == Role::Lost);
        // Another holder appears: the leader notices at its next renewal.
        c.set_fault_injector(None);
        let mut lead = elector(&c, "b").acquire(&cancel).await.expect("b leads");
        let mut lease = c
            .get::<Lease>(Some(NS), NAME)
            .await
            .expect("get")
            .expect("lease");
        if let Some(s) = lease.spec.as_mut() {
            s.holder_identity = Some("intruder".into());
        }
        c.replace(&lease).await.expect("hijack");
        let reason = lead.lost().await;
        assert!(reason.to_string().contains("intruder"), "{reason}");
    }

    #[tokio::test(start_paused = true)]
    async fn a_renewing_leader_writes_the_lease_without_reading_it_first() {
        let c = MemoryCluster::new(start());
        let cancel = CancellationToken::new();
        let lead = elector(&c, "a").acquire(&cancel).await.expect("a leads");
        let gets = c.stats().lease_gets;
        let writes = c.stats().replaces;
        tokio::time::sleep(Duration::from_secs(60)).await;
        let renewals = c.stats().replaces - writes;
        assert!(renewals >= 25, "{renewals} renewals in 60 s");
        // client-go's fast path: a leader renews from the Lease it last wrote; reading it
        // first cost a GET per renewal (1,800 an hour at the 2 s retry period).
        assert_eq!(c.stats().lease_gets, gets, "Lease reads while renewing");
        assert_eq!(holder(&c).await.as_deref(), Some("a"));
        drop(lead);
    }

    #[test]
    fn identity_is_unique_per_process_start() {
        assert_ne!(process_identity(), process_identity());
        assert!(exposition(true).contains("\nkpssh_leader 1\n"));
        assert!(exposition(false).contains("\nkpssh_leader 0\n"));
    }
}
