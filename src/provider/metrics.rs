//! Prometheus metrics. Names kept from the Go provider (DESIGN §1) plus kpssh's own, and
//! Karpenter core's (`karpenter_*`, [`crate::telemetry::core_metrics`]). The Go
//! provider's four series also keep its label values (`outcome` `success` | `error`, zombie
//! `action` `left` | `parked_foreign` | `leave_failed`) and its histogram buckets
//! ([`SSH_BUCKETS`]), so that dashboards and alerts written for it keep working.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicI64, AtomicU64};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

use super::context::HostView;
use crate::api::HostState;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PoolLabels {
    pub state: String,
    pub class: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OutcomeLabels {
    pub outcome: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PhaseLabels {
    pub phase: String,
    pub outcome: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ActionLabels {
    pub action: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct LimitLabels {
    pub limit: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ActorLabels {
    pub actor: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct StageLabels {
    pub stage: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReasonLabels {
    pub reason: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ClassPhaseLabels {
    pub class: String,
    pub phase: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ClassLabels {
    pub class: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct NodePoolLabels {
    pub nodepool: String,
}

/// What one attached host costs (the billing view): recorded when its join succeeded,
/// dropped when its claim ends.
#[derive(Clone, Debug, PartialEq)]
pub struct Billing {
    pub nodepool: String,
    pub vcpus: f64,
    pub price_per_cpu_hour: f64,
}

/// Provisioning latency stages (`kpssh_provisioning_latency_seconds{stage}`).
pub const STAGE_POD_TO_NODECLAIM: &str = "pod_to_nodeclaim";
pub const STAGE_NODECLAIM_TO_READY: &str = "nodeclaim_to_ready";
pub const STAGE_POD_TO_READY: &str = "pod_to_ready";

pub struct Metrics {
    pub pool_hosts: Family<PoolLabels, Gauge>,
    pub probe_duration: Family<OutcomeLabels, Histogram>,
    pub phase_duration: Family<PhaseLabels, Histogram>,
    pub zombie_actions: Family<ActionLabels, Counter>,
    pub claims: Counter,
    pub claim_conflicts: Counter,
    pub host_actors: Gauge,
    /// Hosts selected both by a node class of this shard and by one it does not own (left
    /// alone until the selectors are disjoint; 0 without `--node-classes`).
    pub shard_overlapping_hosts: Gauge,
    pub phases_in_flight: Gauge<i64, AtomicI64>,
    /// Open (pooled) SSH connections, set by the transport's owner at scrape time.
    pub ssh_connections: Gauge,
    /// Time spent waiting for a fleet-wide limit (`probe`, `phase`).
    pub limiter_wait: Family<LimitLabels, Histogram>,
    /// Messages sent to and not yet handled by actors of a kind (`host`, `router`,
    /// `supervisor`): counted in at the send sites, out when handled.
    pub mailbox_depth: Family<ActorLabels, Gauge<i64, AtomicI64>>,
    pub provisioning_latency: Family<StageLabels, Histogram>,
    /// Disruption decisions by reason (Empty, Underutilized, Drifted, Expired, Unhealthy).
    pub disruption_decisions: Family<ReasonLabels, Counter>,
    pub attached_vcpus: Family<NodePoolLabels, Gauge<f64, AtomicU64>>,
    pub cost_per_hour: Family<NodePoolLabels, Gauge<f64, AtomicU64>>,
    /// S63: failed launches by host class and phase (install, join, registration,
    /// configuration, launch).
    pub launch_failures: Family<ClassPhaseLabels, Counter>,
    /// S63: hosts whose launch backoff runs now, by class (set at scrape time).
    pub hosts_backing_off: Family<ClassLabels, Gauge>,
    /// S59: Karpenter core's `karpenter_*` metrics, beside these.
    pub core: crate::telemetry::core_metrics::CoreMetrics,
    /// Claim UID → its billing line.
    billing: Mutex<BTreeMap<String, Billing>>,
    /// NodePools ever billed, kept at zero when empty (flat lines, not gaps).
    billed_pools: Mutex<BTreeSet<String>>,
    /// NodeClaim name → when its oldest pending pod was created.
    pending_since: Mutex<BTreeMap<String, jiff::Timestamp>>,
    /// The series that move on every probe, looked up (and created) once: a family lookup
    /// builds its label set, a string, each time.
    host_mailbox: OnceLock<Gauge<i64, AtomicI64>>,
    probe_outcomes: [OnceLock<Histogram>; 2],
    probe_wait: OnceLock<Histogram>,
    registry: Registry,
}

/// The series `lookup` finds, kept in `hot` (looked up once) when `is_hot`: a family lookup
/// builds its label set, a string, each time, too much for a series every probe moves.
fn hot_or<'a, M: Clone>(
    hot: &'a OnceLock<M>,
    is_hot: bool,
    lookup: impl FnOnce() -> M,
) -> std::borrow::Cow<'a, M> {
    if is_hot {
        std::borrow::Cow::Borrowed(hot.get_or_init(lookup))
    } else {
        std::borrow::Cow::Owned(lookup())
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// The Go provider's `sshBuckets` (seconds): probes land below a second, joins in seconds,
/// installs in minutes. Used by the probe and phase duration histograms.
pub const SSH_BUCKETS: [f64; 11] = [
    0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0,
];

/// The Go provider's outcome label values.
pub const OUTCOME_SUCCESS: &str = "success";
pub const OUTCOME_ERROR: &str = "error";

/// Zombie guard actions (`kpssh_host_zombie_actions_total{action}`), the Go provider's values.
pub mod zombie {
    /// A kubelet on an unclaimed host was disconnected (leave ran, its Node deleted).
    pub const LEFT: &str = "left";
    /// A kubelet kpssh cannot attribute: the host is parked Unhealthy, untouched.
    pub const PARKED_FOREIGN: &str = "parked_foreign";
    /// The forced leave failed.
    pub const LEAVE_FAILED: &str = "leave_failed";
}

fn ssh_histogram() -> Histogram {
    Histogram::new(SSH_BUCKETS)
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    pub fn new() -> Self {
        let pool_hosts = Family::<PoolLabels, Gauge>::default();
        let probe_duration =
            Family::<OutcomeLabels, Histogram>::new_with_constructor(ssh_histogram);
        let phase_duration = Family::<PhaseLabels, Histogram>::new_with_constructor(ssh_histogram);
        let zombie_actions = Family::<ActionLabels, Counter>::default();
        let claims = Counter::default();
        let claim_conflicts = Counter::default();
        let host_actors = Gauge::default();
        let shard_overlapping_hosts = Gauge::default();
        let phases_in_flight = Gauge::<i64, AtomicI64>::default();
        let ssh_connections = Gauge::default();
        let limiter_wait = Family::<LimitLabels, Histogram>::new_with_constructor(|| {
            Histogram::new(exponential_buckets(0.001, 4.0, 10))
        });
        let mailbox_depth = Family::<ActorLabels, Gauge<i64, AtomicI64>>::default();
        let provisioning_latency = Family::<StageLabels, Histogram>::new_with_constructor(|| {
            Histogram::new(exponential_buckets(0.5, 2.0, 14))
        });
        let disruption_decisions = Family::<ReasonLabels, Counter>::default();
        let attached_vcpus = Family::<NodePoolLabels, Gauge<f64, AtomicU64>>::default();
        let cost_per_hour = Family::<NodePoolLabels, Gauge<f64, AtomicU64>>::default();
        let launch_failures = Family::<ClassPhaseLabels, Counter>::default();
        let hosts_backing_off = Family::<ClassLabels, Gauge>::default();
        let mut registry = Registry::with_prefix("kpssh");
        registry.register(
            "launch_failures",
            "Failed launches by host class and phase (install, join, registration, configuration, launch)",
            launch_failures.clone(),
        );
        registry.register(
            "pool_hosts_backing_off",
            "SSHHosts not claimed because their launch backoff runs, by class",
            hosts_backing_off.clone(),
        );
        registry.register(
            "ssh_connections",
            "Open (pooled) SSH connections",
            ssh_connections.clone(),
        );
        registry.register(
            "limiter_wait_seconds",
            "Time waiting for a fleet-wide limit (probe, phase, leave, dial)",
            limiter_wait.clone(),
        );
        registry.register(
            "mailbox_depth",
            "Messages queued for actors of a kind (sent, not yet handled)",
            mailbox_depth.clone(),
        );
        registry.register(
            "provisioning_latency_seconds",
            "Pod pending to NodeClaim, NodeClaim to node initialized, pod pending to node initialized",
            provisioning_latency.clone(),
        );
        registry.register(
            "disruption_decisions",
            "NodeClaims chosen for disruption, by reason",
            disruption_decisions.clone(),
        );
        registry.register(
            "attached_vcpus",
            "vCPUs of hosts joined to the cluster, by NodePool (the billing view)",
            attached_vcpus.clone(),
        );
        registry.register(
            "cost_per_hour",
            "Cost rate of attached hosts (vCPUs x pricePerCPUHour), by NodePool",
            cost_per_hour.clone(),
        );
        registry.register(
            "pool_hosts",
            "SSHHosts by state and class",
            pool_hosts.clone(),
        );
        registry.register(
            "host_probe_duration_seconds",
            "Probe duration by outcome",
            probe_duration.clone(),
        );
        registry.register(
            "instance_phase_duration_seconds",
            "Profile phase duration by phase and outcome",
            phase_duration.clone(),
        );
        registry.register(
            "host_zombie_actions",
            "Zombie guard actions (left, parked_foreign, leave_failed)",
            zombie_actions.clone(),
        );
        registry.register("claims", "Hosts claimed for NodeClaims", claims.clone());
        registry.register(
            "claim_conflicts",
            "Claim compare-and-swaps lost to another writer (not errors)",
            claim_conflicts.clone(),
        );
        registry.register("host_actors", "Running host actors", host_actors.clone());
        registry.register(
            "shard_overlapping_hosts",
            "SSHHosts selected by a node class of this shard and by one of another (left alone)",
            shard_overlapping_hosts.clone(),
        );
        registry.register(
            "phases_in_flight",
            "Profile phases running now",
            phases_in_flight.clone(),
        );
        Metrics {
            pool_hosts,
            probe_duration,
            phase_duration,
            zombie_actions,
            claims,
            claim_conflicts,
            host_actors,
            shard_overlapping_hosts,
            phases_in_flight,
            ssh_connections,
            limiter_wait,
            mailbox_depth,
            provisioning_latency,
            disruption_decisions,
            attached_vcpus,
            cost_per_hour,
            launch_failures,
            hosts_backing_off,
            core: crate::telemetry::core_metrics::CoreMetrics::new(),
            billing: Mutex::new(BTreeMap::new()),
            billed_pools: Mutex::new(BTreeSet::new()),
            pending_since: Mutex::new(BTreeMap::new()),
            host_mailbox: OnceLock::new(),
            probe_outcomes: [OnceLock::new(), OnceLock::new()],
            probe_wait: OnceLock::new(),
            registry,
        }
    }

    /// A probe took `seconds` and succeeded or failed (`host_probe_duration_seconds`).
    pub fn probe_observed(&self, success: bool, seconds: f64) {
        let outcome = if success {
            OUTCOME_SUCCESS
        } else {
            OUTCOME_ERROR
        };
        self.probe_outcomes[usize::from(success)]
            .get_or_init(|| {
                self.probe_duration
                    .get_or_create(&OutcomeLabels {
                        outcome: outcome.into(),
                    })
                    .clone()
            })
            .observe(seconds);
    }

    /// A profile phase ran for `seconds` (`instance_phase_duration_seconds`): `error` when the
    /// script failed or the session did, as the Go provider counts it.
    pub fn phase_observed(&self, phase: &str, success: bool, seconds: f64) {
        let outcome = if success {
            OUTCOME_SUCCESS
        } else {
            OUTCOME_ERROR
        };
        self.phase_duration
            .get_or_create(&PhaseLabels {
                phase: phase.into(),
                outcome: outcome.into(),
            })
            .observe(seconds);
    }

    /// The zombie guard acted ([`zombie`] values).
    pub fn zombie_action(&self, action: &str) {
        self.zombie_actions
            .get_or_create(&ActionLabels {
                action: action.into(),
            })
            .inc();
    }

    /// A fleet-wide limit was waited for.
    pub fn limiter_waited(&self, limit: &str, waited: std::time::Duration) {
        // The probe's histogram is kept at hand: every probe of the fleet records its wait.
        let series = hot_or(&self.probe_wait, limit == "probe", || {
            self.limiter_wait
                .get_or_create(&LimitLabels {
                    limit: limit.into(),
                })
                .clone()
        });
        series.observe(waited.as_secs_f64());
    }

    /// A message was queued for an actor of `actor` kind.
    pub fn mailbox_in(&self, actor: &str) {
        self.with_mailbox(actor, |g| {
            g.inc();
        });
    }

    /// An actor of `actor` kind took a message off its queue.
    pub fn mailbox_out(&self, actor: &str) {
        self.with_mailbox(actor, |g| {
            g.dec();
        });
    }

    fn with_mailbox(&self, actor: &str, f: impl FnOnce(&Gauge<i64, AtomicI64>)) {
        f(&hot_or(&self.host_mailbox, actor == "host", || {
            self.mailbox_depth
                .get_or_create(&ActorLabels {
                    actor: actor.into(),
                })
                .clone()
        }));
    }

    pub fn disruption(&self, reason: &str) {
        self.disruption_decisions
            .get_or_create(&ReasonLabels {
                reason: reason.into(),
            })
            .inc();
    }

    /// Provisioning: a NodeClaim was created for pods pending since `oldest`.
    pub fn nodeclaim_created(
        &self,
        nodeclaim: &str,
        oldest: jiff::Timestamp,
        now: jiff::Timestamp,
    ) {
        self.observe_stage(STAGE_POD_TO_NODECLAIM, now.duration_since(oldest));
        let mut pending = lock(&self.pending_since);
        // Bounded: a claim that never initializes is forgotten with the oldest entries.
        if pending.len() >= 10_000
            && let Some(first) = pending.keys().next().cloned()
        {
            pending.remove(&first);
        }
        pending.insert(nodeclaim.to_string(), oldest);
    }

    /// Provisioning: the NodeClaim created at `created` is initialized (its node Ready).
    pub fn nodeclaim_initialized(
        &self,
        nodeclaim: &str,
        created: jiff::Timestamp,
        now: jiff::Timestamp,
    ) {
        self.observe_stage(STAGE_NODECLAIM_TO_READY, now.duration_since(created));
        if let Some(oldest) = lock(&self.pending_since).remove(nodeclaim) {
            self.observe_stage(STAGE_POD_TO_READY, now.duration_since(oldest));
        }
    }

    fn observe_stage(&self, stage: &str, d: jiff::SignedDuration) {
        self.provisioning_latency
            .get_or_create(&StageLabels {
                stage: stage.into(),
            })
            .observe(d.as_secs_f64().max(0.0));
    }

    /// A host joined for the claim `uid`: it is attached (and billed) from now.
    pub fn attach(&self, uid: &str, billing: Billing) {
        lock(&self.billed_pools).insert(billing.nodepool.clone());
        lock(&self.billing).insert(uid.to_string(), billing);
    }

    /// The claim `uid` ended: its host is no longer attached.
    pub fn detach(&self, uid: &str) {
        lock(&self.billing).remove(uid);
    }

    /// Recompute the billing gauges from the attached claims.
    fn refresh_billing(&self) {
        let mut sums: BTreeMap<String, (f64, f64)> = lock(&self.billed_pools)
            .iter()
            .map(|p| (p.clone(), (0.0, 0.0)))
            .collect();
        for b in lock(&self.billing).values() {
            let e = sums.entry(b.nodepool.clone()).or_default();
            e.0 += b.vcpus;
            e.1 += b.vcpus * b.price_per_cpu_hour;
        }
        for (nodepool, (vcpus, cost)) in sums {
            let labels = NodePoolLabels { nodepool };
            self.attached_vcpus.get_or_create(&labels).set(vcpus);
            self.cost_per_hour.get_or_create(&labels).set(cost);
        }
    }

    /// Prometheus text exposition, with the pool gauge recomputed from the host view.
    pub fn encode(&self, hosts: &HostView) -> String {
        self.pool_hosts.clear();
        self.hosts_backing_off.clear();
        for h in hosts.snapshot() {
            let labels = PoolLabels {
                state: h.state().as_str().to_string(),
                class: h.class().to_string(),
            };
            self.pool_hosts.get_or_create(&labels).inc();
            let backing_off = self.hosts_backing_off.get_or_create(&ClassLabels {
                class: h.class().to_string(),
            });
            if h.backing_off() {
                backing_off.inc();
            }
        }
        // Keep zero series for states with no host, so dashboards show flat lines, not gaps.
        let classes: std::collections::BTreeSet<String> = hosts
            .snapshot()
            .iter()
            .map(|h| h.class().to_string())
            .collect();
        for class in classes {
            for state in HostState::ALL {
                let _ = self.pool_hosts.get_or_create(&PoolLabels {
                    state: state.as_str().to_string(),
                    class: class.clone(),
                });
            }
        }
        self.refresh_billing();
        let mut out = String::new();
        let encoded = prometheus_client::encoding::text::encode_registry(&mut out, &self.registry)
            .and_then(|()| self.core.encode_into(&mut out))
            .and_then(|()| prometheus_client::encoding::text::encode_eof(&mut out));
        if encoded.is_err() {
            out.clear();
        }
        out
    }
}

impl Metrics {
    /// S63: one failed launch of a host of `class` in `phase`.
    pub fn launch_failed(&self, class: &str, phase: &str) {
        self.launch_failures
            .get_or_create(&ClassPhaseLabels {
                class: class.to_string(),
                phase: phase.to_string(),
            })
            .inc();
    }
}

pub type SharedMetrics = Arc<Metrics>;

/// Records a phase as in flight for as long as the guard lives.
pub struct InFlight<'a>(&'a Gauge<i64, AtomicI64>);

impl<'a> InFlight<'a> {
    pub fn new(g: &'a Gauge<i64, AtomicI64>) -> Self {
        g.inc();
        InFlight(g)
    }
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.0.dec();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::SSHHostStatus;
    use crate::sim::SimHost;
    use crate::sim::world::host_object;

    #[test]
    fn exposition_keeps_the_compatible_names_and_counts_the_pool() {
        let m = Metrics::new();
        let view = HostView::default();
        let mut a = host_object("pool", "a", "small", &SimHost::new("10.0.0.1", 2, 1));
        a.status = Some(SSHHostStatus {
            state: HostState::InUse,
            ..Default::default()
        });
        view.upsert(a);
        view.upsert(host_object(
            "pool",
            "b",
            "small",
            &SimHost::new("10.0.0.2", 2, 1),
        ));
        m.claims.inc();
        m.zombie_action(zombie::LEFT);
        m.probe_observed(true, 0.2);
        m.probe_observed(false, 0.3);
        m.phase_observed("join", true, 3.0);
        m.phase_observed("join", false, 700.0);
        let text = m.encode(&view);
        assert!(
            text.contains(r#"kpssh_pool_hosts{state="InUse",class="small"} 1"#),
            "{text}"
        );
        assert!(
            text.contains(r#"kpssh_pool_hosts{state="Pending",class="small"} 1"#),
            "{text}"
        );
        assert!(
            text.contains(r#"kpssh_pool_hosts{state="Maintenance",class="small"} 0"#),
            "{text}"
        );
        assert!(
            text.contains(r#"kpssh_host_zombie_actions_total{action="left"} 1"#),
            "{text}"
        );
        // S62/issue #22: the Go provider's label values and buckets.
        for want in [
            r#"kpssh_host_probe_duration_seconds_count{outcome="error"} 1"#,
            r#"kpssh_instance_phase_duration_seconds_count{phase="join",outcome="error"} 1"#,
            r#"kpssh_instance_phase_duration_seconds_bucket{le="600.0",phase="join",outcome="success"} 1"#,
            r#"kpssh_host_probe_duration_seconds_bucket{le="0.25",outcome="success"} 1"#,
            r#"kpssh_instance_phase_duration_seconds_bucket{le="+Inf",phase="join",outcome="error"} 1"#,
        ] {
            assert!(text.contains(want), "{want} in {text}");
        }
        let buckets: Vec<&str> = text
            .lines()
            .filter(|l| {
                l.starts_with("kpssh_host_probe_duration_seconds_bucket{")
                    && l.contains(r#"outcome="success""#)
            })
            .filter_map(|l| l.split("le=\"").nth(1)?.split('"').next())
            .collect();
        assert_eq!(
            buckets,
            [
                "0.25", "0.5", "1.0", "2.5", "5.0", "10.0", "30.0", "60.0", "120.0", "300.0",
                "600.0", "+Inf"
            ]
        );
        assert!(!text.contains(r#"outcome="failure""#), "{text}");
        assert!(text.contains("kpssh_claims_total 1"), "{text}");
        assert!(
            text.contains("# TYPE kpssh_host_probe_duration_seconds histogram"),
            "{text}"
        );
        assert!(
            text.contains("# TYPE kpssh_instance_phase_duration_seconds histogram"),
            "{text}"
        );
    }
}
