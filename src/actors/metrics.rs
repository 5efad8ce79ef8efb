//! Prometheus metrics. Names kept from the Go provider (DESIGN §1) plus kpssh's own.

use std::sync::Arc;
use std::sync::atomic::AtomicI64;

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

pub struct Metrics {
    pub pool_hosts: Family<PoolLabels, Gauge>,
    pub probe_duration: Family<OutcomeLabels, Histogram>,
    pub phase_duration: Family<PhaseLabels, Histogram>,
    pub zombie_actions: Family<ActionLabels, Counter>,
    pub claims: Counter,
    pub claim_conflicts: Counter,
    pub host_actors: Gauge,
    pub phases_in_flight: Gauge<i64, AtomicI64>,
    /// Open (pooled) SSH connections, set by the transport's owner at scrape time.
    pub ssh_connections: Gauge,
    registry: Registry,
}

fn seconds_buckets() -> Family<OutcomeLabels, Histogram> {
    Family::new_with_constructor(|| Histogram::new(exponential_buckets(0.05, 2.0, 14)))
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    pub fn new() -> Self {
        let pool_hosts = Family::<PoolLabels, Gauge>::default();
        let probe_duration = seconds_buckets();
        let phase_duration = Family::<PhaseLabels, Histogram>::new_with_constructor(|| {
            Histogram::new(exponential_buckets(0.5, 2.0, 14))
        });
        let zombie_actions = Family::<ActionLabels, Counter>::default();
        let claims = Counter::default();
        let claim_conflicts = Counter::default();
        let host_actors = Gauge::default();
        let phases_in_flight = Gauge::<i64, AtomicI64>::default();
        let ssh_connections = Gauge::default();
        let mut registry = Registry::with_prefix("kpssh");
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
            "Zombie guard actions (leave, foreign, failed)",
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
            phases_in_flight,
            ssh_connections,
            registry,
        }
    }

    /// Prometheus text exposition, with the pool gauge recomputed from the host view.
    pub fn encode(&self, hosts: &HostView) -> String {
        self.pool_hosts.clear();
        for h in hosts.snapshot() {
            let labels = PoolLabels {
                state: h.state().as_str().to_string(),
                class: h.class().to_string(),
            };
            self.pool_hosts.get_or_create(&labels).inc();
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
        let mut out = String::new();
        if prometheus_client::encoding::text::encode(&mut out, &self.registry).is_err() {
            out.clear();
        }
        out
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
        m.zombie_actions
            .get_or_create(&ActionLabels {
                action: "leave".into(),
            })
            .inc();
        m.probe_duration
            .get_or_create(&OutcomeLabels {
                outcome: "success".into(),
            })
            .observe(0.2);
        let join = PhaseLabels {
            phase: "join".into(),
            outcome: "success".into(),
        };
        m.phase_duration.get_or_create(&join).observe(3.0);
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
            text.contains(r#"kpssh_host_zombie_actions_total{action="leave"} 1"#),
            "{text}"
        );
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
