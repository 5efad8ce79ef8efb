//! Random scenarios (`kpssh sim --random-scenario SEED`, the random campaign): a whole
//! scenario drawn from one seed — host classes (count, size, arch, latency, failure and hang
//! rates, bad leaves, MemTotal short of the nominal memory by a per-host amount, node
//! identity: Static, Adopt, or Adopt with nodeadm's `mi-*` names), node and pod demand of every shape (steady, diurnal, bursts, CSV-like
//! series with spikes above supply and to zero), NodePools with any mix of cpu, memory and
//! nodes limits, consolidateAfter, terminationGracePeriod and expireAfter, PodDisruptionBudgets
//! and do-not-disrupt pods, node repair on or off, every fault kind (partitions too) at rates
//! drawn over wide ranges, API conflict and 5xx rates up to 10%. Two hand-written campaign
//! files vary only the faults; these vary the shapes too.
//!
//! The draw is a pure function of the seed, and every value is one the scenario's YAML holds
//! exactly (whole seconds, rounded rates), so `--print-scenario` gives a file that replays the
//! same run, byte for byte.

use std::collections::BTreeMap;
use std::time::Duration;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use super::scenario::{
    Bursts, ControllerLimits, Demand, Diurnal, Faults, HostClass, HostFault, IntOrPercent,
    LatencySpec, NodeIdentity, Partition, PhaseLatencies, PhaseProbabilities, Rate, Scenario,
    SimNodePool, SimPdb, SlowHandshake,
};

/// Separates the generator's stream from the run's, which is seeded with the same number.
const STREAM: u64 = 0x7363_656e_6172_696f;

/// Most pods a pod demand entry asks for (bounds a run's cost).
const MAX_PODS: u32 = 36;

/// The scenario drawn from `seed` (its `seed` field is `seed` too).
pub fn random_scenario(seed: u64) -> Scenario {
    let mut d = Draw(ChaCha8Rng::seed_from_u64(seed ^ STREAM));
    let classes: Vec<HostClass> = (0..d.int(1, 4)).map(|i| d.class(i)).collect();
    let (node_demand, pod_demand) = match d.int(0, 3) {
        0 => (true, false),
        1 => (true, true),
        _ => (false, true),
    };
    let mut demand = vec![];
    if node_demand {
        for c in &classes {
            if demand.is_empty() || d.chance(0.6) {
                let supply = c.count as u32;
                let mut e = d.shape(supply, 2 * supply);
                e.class = Some(c.name.clone());
                e.cpu = d.pick(&["100m", "500m", "1"]).to_string();
                e.memory = d.pick(&["256Mi", "1Gi"]).to_string();
                demand.push(e);
            }
        }
    }
    let mut node_pools = vec![];
    if pod_demand {
        for i in 0..d.int(1, 3) {
            let class = d.pick(&classes).clone();
            let pool = d.pool(i, &class);
            for _ in 0..d.int(1, 2) {
                demand.push(d.pods(&pool.name, &class));
            }
            node_pools.push(pool);
        }
    }
    let mut faults = d.faults();
    let controller = ControllerLimits {
        max_concurrent_phases: *d.pick(&[2, 4, 8, 32]),
        max_concurrent_probes: *d.pick(&[4, 64]),
        ssh_dials_per_second: *d.pick(&[10, 50]),
        node_repair: d.chance(0.5),
        ..ControllerLimits::default()
    };
    // A partition (20–45 minutes) needs a run long enough to see it end, and repair's
    // 30-minute toleration pass.
    let mut duration = *d.pick(&[1200, 1800, 1800, 2400, 3600]);
    if d.chance(0.25) {
        faults.partition = Some(Partition {
            rate_per_hour: d.log(0.5, 2.0),
            duration: d.dur(1200, 2700),
        });
        duration = 3600;
    }
    // Drawn last, so that adding it left every earlier draw of a seed as it was.
    let mut classes = classes;
    for c in &mut classes {
        c.identity = *d.pick(&[
            NodeIdentity::Static,
            NodeIdentity::Static,
            NodeIdentity::Adopt,
            NodeIdentity::Nodeadm,
        ]);
    }
    // MemTotal short of the nominal size, per host (drawn last too), and memory limits that
    // are no multiple of a host: by its smallest hosts a pool may fit one node more than by
    // its largest.
    for c in &mut classes {
        if d.chance(0.5) {
            c.memory_spread_mib = c.memory_gib * 1024 * d.int(1, 8) / 100;
        }
    }
    for p in &mut node_pools {
        let Some(c) = classes.iter().find(|c| c.name == p.class) else {
            continue;
        };
        if c.memory_spread_mib > 0 && d.chance(0.5) {
            let nodes = d.int(1, c.count as u32);
            let limit = nodes * c.memory_gib * 1024 - d.int(0, nodes * c.memory_spread_mib);
            p.limits.insert("memory".into(), format!("{limit}Mi"));
        }
    }
    Scenario {
        name: format!("random-{seed}"),
        seed,
        duration: secs(duration),
        step: secs(*d.pick(&[15, 30])),
        probe_interval: secs(*d.pick(&[60, 120, 120, 180])),
        controller,
        classes,
        node_pools,
        demand,
        faults,
    }
}

fn secs(n: u64) -> Duration {
    Duration::from_secs(n)
}

/// The generator's random source with the draws it needs.
struct Draw(ChaCha8Rng);

impl Draw {
    fn int(&mut self, lo: u32, hi: u32) -> u32 {
        self.0.random_range(lo..=hi)
    }

    fn chance(&mut self, p: f64) -> bool {
        self.0.random_bool(p)
    }

    fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.0.random_range(0..items.len())]
    }

    /// Log-uniform in `[lo, hi]`, to three significant digits (a YAML number that reads back
    /// as the same `f64`).
    fn log(&mut self, lo: f64, hi: f64) -> f64 {
        let x = (lo.ln() + self.0.random::<f64>() * (hi.ln() - lo.ln())).exp();
        let scale = 10f64.powi(2 - x.log10().floor() as i32);
        (x * scale).round() / scale
    }

    /// Whole seconds, log-uniform in `[lo, hi]`.
    fn dur(&mut self, lo: u64, hi: u64) -> Duration {
        secs((self.log(lo as f64, hi as f64).round() as u64).clamp(lo, hi))
    }

    /// 0 with probability `zero`, else log-uniform in `[lo, hi]`.
    fn rate(&mut self, zero: f64, lo: f64, hi: f64) -> f64 {
        if self.chance(zero) {
            0.0
        } else {
            self.log(lo, hi)
        }
    }

    fn latency(&mut self, lo: u64, hi: u64) -> LatencySpec {
        let median = self.dur(lo, hi);
        let spread = f64::from(self.int(12, 40)) / 10.0;
        LatencySpec {
            median,
            p95: secs((median.as_secs() as f64 * spread).round() as u64),
        }
    }

    fn probabilities(&mut self, zero: f64, hi: f64) -> PhaseProbabilities {
        PhaseProbabilities {
            install: self.rate(zero, 0.002, hi),
            join: self.rate(zero, 0.002, hi),
            leave: self.rate(zero, 0.002, hi),
        }
    }

    fn class(&mut self, i: u32) -> HostClass {
        let cpu = *self.pick(&[1, 2, 4, 8, 16]);
        HostClass {
            name: format!("c{i}"),
            count: self.int(1, 6) as usize,
            cpu,
            memory_gib: cpu * *self.pick(&[1, 2, 4, 8]),
            arch: if self.chance(0.25) { "arm64" } else { "amd64" }.into(),
            price_per_cpu_hour: self.log(0.005, 0.08),
            latency: PhaseLatencies {
                install: self.latency(5, 300),
                join: self.latency(2, 120),
                leave: self.latency(1, 60),
            },
            failure: self.probabilities(0.4, 0.2),
            hang: self.probabilities(0.6, 0.05),
            bad_leave_fraction: self.rate(0.5, 0.05, 0.6),
            memory_spread_mib: 0,
            identity: NodeIdentity::Static,
        }
    }

    /// A NodePool over `class` with any mix of cpu, memory and nodes limits (or none).
    fn pool(&mut self, i: u32, class: &HostClass) -> SimNodePool {
        let count = class.count as u32;
        let mut limits = BTreeMap::new();
        if self.chance(0.5) {
            let nodes = self.int(1, count);
            let cpu = if self.chance(0.3) {
                format!("{}m", nodes * class.cpu * 1000 + 500)
            } else {
                (nodes * class.cpu).to_string()
            };
            limits.insert("cpu".to_string(), cpu);
        }
        if self.chance(0.5) {
            let nodes = self.int(1, count);
            let memory = if self.chance(0.3) {
                format!("{}Mi", nodes * class.memory_gib * 1024 + 512)
            } else {
                format!("{}Gi", nodes * class.memory_gib)
            };
            limits.insert("memory".to_string(), memory);
        }
        if self.chance(0.4) {
            limits.insert("nodes".to_string(), self.int(1, count).to_string());
        }
        let consolidate_after = self.pick(&["0s", "30s", "1m", "2m", "5m", "10m", "Never"]);
        let termination_grace_period = self
            .chance(0.4)
            .then(|| super::scenario::format_duration(self.dur(60, 1800)));
        let expire_after = self
            .chance(0.2)
            .then(|| super::scenario::format_duration(self.dur(600, 2400)));
        SimNodePool {
            name: format!("pool{i}"),
            class: class.name.clone(),
            limits,
            consolidate_after: consolidate_after.to_string(),
            termination_grace_period,
            expire_after,
        }
    }

    /// Pods of one shape for `pool`, as many as about `class` holds (sometimes more).
    fn pods(&mut self, pool: &str, class: &HostClass) -> Demand {
        let millis = *self.pick(&[100, 250, 500, 1000, 1500, 2000, 3500]);
        let memory = *self.pick(&[128, 256, 512, 1024, 2048, 4096]);
        let per_node = (class.cpu * 1000 / millis).max(1);
        let supply = (per_node * class.count as u32).clamp(1, MAX_PODS);
        let mut e = self.shape(supply, MAX_PODS.min(2 * supply));
        e.pool = Some(pool.to_string());
        e.cpu = format!("{millis}m");
        e.memory = format!("{memory}Mi");
        if self.chance(0.5) {
            let budget = match self.int(0, 3) {
                0 => IntOrPercent::Int(0),
                1 => IntOrPercent::Int(self.int(1, 3) as i32),
                _ => IntOrPercent::Percent(format!("{}%", 10 * self.int(1, 9))),
            };
            e.pdb = Some(if self.chance(0.5) {
                SimPdb {
                    max_unavailable: Some(budget),
                    min_available: None,
                }
            } else {
                SimPdb {
                    max_unavailable: None,
                    min_available: Some(budget),
                }
            });
        }
        if self.chance(0.3) {
            e.do_not_disrupt = self.log(0.05, 0.5);
        }
        e
    }

    /// A demand curve around `supply` units, never above `most`: a CSV-like series (spikes
    /// above supply and drops to zero), or a sum of steady, diurnal and bursts.
    fn shape(&mut self, supply: u32, most: u32) -> Demand {
        let mut e = Demand {
            class: None,
            pool: None,
            cpu: "1".into(),
            memory: "1Gi".into(),
            steady: 0,
            diurnal: None,
            bursts: None,
            csv: None,
            series: None,
            pdb: None,
            do_not_disrupt: 0.0,
        };
        if self.chance(0.3) {
            let mut rows = BTreeMap::new();
            let mut minute = 0;
            while minute < 90 {
                let n = match self.int(0, 3) {
                    0 => 0,
                    1 => self.int(supply.min(most), most),
                    _ => self.int(0, supply),
                };
                rows.insert(minute, n);
                minute += self.int(3, 15);
            }
            e.series = Some(rows);
            return e;
        }
        if self.chance(0.6) {
            e.steady = self.int(0, supply);
        }
        if self.chance(0.4) {
            e.diurnal = Some(Diurnal {
                amplitude: self.int(1, supply),
                peak_hour: f64::from(self.int(0, 6)) / 4.0,
                period_hours: f64::from(self.int(2, 12)) / 4.0,
            });
        }
        if self.chance(0.5) || (e.steady == 0 && e.diurnal.is_none()) {
            e.bursts = Some(Bursts {
                rate_per_hour: self.log(0.5, 6.0),
                size: self.int(1, most),
                duration: self.dur(120, 1800),
            });
        }
        e
    }

    fn host_fault(&mut self, p: f64) -> Option<HostFault> {
        self.chance(p).then(|| HostFault {
            rate_per_host_hour: self.log(0.01, 0.5),
            duration: self.dur(30, 1200),
        })
    }

    fn fleet_fault(&mut self, p: f64, lo: f64, hi: f64) -> Option<Rate> {
        self.chance(p).then(|| Rate {
            rate_per_hour: self.log(lo, hi),
        })
    }

    fn faults(&mut self) -> Faults {
        Faults {
            reboot: self.host_fault(0.6),
            power_loss: self.chance(0.5).then(|| HostFault {
                rate_per_host_hour: self.log(0.01, 0.5),
                duration: self.dur(30, 2700),
            }),
            ssh_refusal: self.host_fault(0.5),
            host_key_change: self.host_fault(0.4),
            slow_handshake: self.chance(0.4).then(|| SlowHandshake {
                rate_per_host_hour: self.log(0.01, 0.5),
                duration: self.dur(30, 1200),
                delay: self.dur(5, 90),
            }),
            controller_crash: self.fleet_fault(0.6, 0.2, 6.0),
            force_delete: self.fleet_fault(0.5, 0.2, 6.0),
            profile_bump: self.fleet_fault(0.4, 0.1, 3.0),
            api_conflict: self.rate(0.4, 0.001, 0.1),
            api_transient: self.rate(0.4, 0.001, 0.1),
            partition: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every drawn scenario is valid and reads back from its YAML as the same scenario (what
    /// `--print-scenario` relies on); the seed decides it.
    #[test]
    fn drawn_scenarios_are_valid_and_survive_yaml() {
        let mut shapes = std::collections::BTreeSet::new();
        for seed in 0..500 {
            let s = random_scenario(seed);
            s.validate().unwrap_or_else(|e| panic!("seed {seed}: {e}"));
            let yaml = serde_yaml::to_string(&s).expect("yaml");
            let back = Scenario::from_yaml(&yaml).unwrap_or_else(|e| panic!("{e}\n{yaml}"));
            assert_eq!(back, s, "seed {seed} does not survive YAML:\n{yaml}");
            assert_eq!(random_scenario(seed), s, "seed {seed} draws one scenario");
            shapes.insert((s.classes.len(), s.node_pools.len()));
        }
        assert!(shapes.len() >= 10, "the draws vary: {shapes:?}");
    }

    /// Over many seeds every knob the issue names is drawn somewhere.
    #[test]
    fn draws_cover_every_shape_and_fault() {
        let all: Vec<Scenario> = (0..300).map(random_scenario).collect();
        let any = |f: &dyn Fn(&Scenario) -> bool| all.iter().any(f);
        assert!(any(&|s| s.classes.iter().any(|c| c.arch == "arm64")));
        // Memory limits below a multiple of a host over hosts of slightly different memory.
        assert!(any(&|s| s.node_pools.iter().any(|p| {
            let c = s.classes.iter().find(|c| c.name == p.class);
            let spread = c.map_or(0, |c| c.memory_spread_mib);
            let odd = |mi: u32| c.is_some_and(|c| !mi.is_multiple_of(c.memory_gib * 1024));
            spread > 0
                && (p.limits.get("memory"))
                    .and_then(|m| m.strip_suffix("Mi")?.parse().ok())
                    .is_some_and(odd)
        })));
        for identity in [NodeIdentity::Adopt, NodeIdentity::Nodeadm] {
            assert!(any(&|s| s.node_pools.iter().any(|p| {
                (s.classes.iter()).any(|c| c.name == p.class && c.identity == identity)
            })));
        }
        assert!(any(&|s| s.demand.iter().any(|d| d.series.is_some())));
        assert!(any(&|s| s.demand.iter().any(|d| d.diurnal.is_some())));
        assert!(any(&|s| s.demand.iter().any(|d| d.bursts.is_some())));
        assert!(any(&|s| s.demand.iter().any(|d| d.pool.is_some())
            && s.demand.iter().any(|d| d.class.is_some())));
        assert!(any(&|s| s
            .demand
            .iter()
            .filter_map(|d| d.series.as_ref())
            .any(|rows| rows.values().any(|n| *n == 0))));
        let limits = |s: &Scenario, k: &str| s.node_pools.iter().any(|p| p.limits.contains_key(k));
        assert!(any(&|s| limits(s, "cpu")
            && limits(s, "memory")
            && limits(s, "nodes")));
        assert!(any(&|s| s.node_pools.len() >= 2));
        assert!(any(&|s| s
            .node_pools
            .iter()
            .any(|p| p.consolidate_after == "Never")));
        assert!(any(
            &|s| s.faults.api_conflict > 0.05 && s.faults.api_transient > 0.05
        ));
        assert!(all.iter().all(|s| s.faults.api_conflict <= 0.1));
        let f = |s: &Scenario| {
            let x = &s.faults;
            [
                x.reboot.is_some(),
                x.power_loss.is_some(),
                x.ssh_refusal.is_some(),
                x.host_key_change.is_some(),
                x.slow_handshake.is_some(),
                x.controller_crash.is_some(),
                x.force_delete.is_some(),
                x.profile_bump.is_some(),
            ]
        };
        for k in 0..8 {
            assert!(any(&|s| f(s)[k]), "fault kind {k} is drawn");
            assert!(any(&|s| !f(s)[k]), "fault kind {k} is sometimes off");
        }
    }
}
