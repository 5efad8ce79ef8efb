//! Demand: the desired count of each demand entry over time, and the drivers that create and
//! delete NodeClaims (node demand) and pods (pod demand) to follow it.

use std::collections::BTreeMap;
use std::time::Duration;

use rand::Rng;
use rand_chacha::ChaCha8Rng;

use super::{Runner, arrivals, name_of};
use crate::api::NodeClaim;
use crate::k8s::Cluster;
use crate::sim::scenario::Demand;
use crate::sim::world::node_claim;

/// The desired node count of one demand entry at `t`.
pub(super) struct DemandCurve {
    class: String,
    /// Pods for this NodePool rather than NodeClaims of `class`.
    pool: Option<String>,
    cpu: String,
    memory: String,
    steady: u32,
    /// Amplitude, peak hour, period in hours.
    diurnal: Option<(u32, f64, f64)>,
    bursts: Vec<(Duration, Duration, u32)>,
    csv: Option<Vec<(Duration, u32)>>,
}

impl DemandCurve {
    pub(super) fn new(
        d: &Demand,
        default_class: &str,
        rng: &mut ChaCha8Rng,
        duration: Duration,
        base: Option<&std::path::Path>,
    ) -> Result<DemandCurve, String> {
        let bursts = match &d.bursts {
            Some(b) => arrivals(rng, b.rate_per_hour, duration)
                .into_iter()
                .map(|t| (t, t + b.duration, b.size))
                .collect(),
            None => vec![],
        };
        let csv = match &d.csv {
            Some(path) => {
                let p = match base {
                    Some(b) => b.join(path),
                    None => path.into(),
                };
                let text = std::fs::read_to_string(&p)
                    .map_err(|e| format!("demand csv {}: {e}", p.display()))?;
                Some(parse_csv(&text)?)
            }
            None => d.series.as_ref().map(|rows| {
                rows.iter()
                    .map(|(minute, n)| (Duration::from_secs(u64::from(*minute) * 60), *n))
                    .collect()
            }),
        };
        Ok(DemandCurve {
            class: d.class.clone().unwrap_or_else(|| default_class.to_string()),
            pool: d.pool.clone(),
            cpu: d.cpu.clone(),
            memory: d.memory.clone(),
            steady: d.steady,
            diurnal: d
                .diurnal
                .as_ref()
                .map(|x| (x.amplitude, x.peak_hour, x.period_hours)),
            bursts,
            csv,
        })
    }

    pub(super) fn at(&self, t: Duration) -> u32 {
        if let Some(rows) = &self.csv {
            return rows
                .iter()
                .take_while(|(at, _)| *at <= t)
                .last()
                .map_or(0, |(_, n)| *n);
        }
        let mut n = f64::from(self.steady);
        if let Some((amp, peak, period)) = self.diurnal {
            let hour = t.as_secs_f64() / 3600.0;
            let phase = 2.0 * std::f64::consts::PI * (hour - peak) / period;
            n += f64::from(amp) * (1.0 + phase.cos()) / 2.0;
        }
        for (from, to, size) in &self.bursts {
            if *from <= t && t < *to {
                n += f64::from(*size);
            }
        }
        n.round() as u32
    }
}

/// `minute,nodes` rows; a header and blank or `#` lines are skipped.
pub fn parse_csv(text: &str) -> Result<Vec<(Duration, u32)>, String> {
    let mut rows = vec![];
    for (i, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let Some((m, n)) = line.split_once(',') else {
            return Err(format!("demand csv line {}: expected minute,nodes", i + 1));
        };
        let (Ok(m), Ok(n)) = (m.trim().parse::<f64>(), n.trim().parse::<u32>()) else {
            if i == 0 {
                continue;
            }
            return Err(format!(
                "demand csv line {}: {line:?} is not minute,nodes",
                i + 1
            ));
        };
        rows.push((Duration::from_secs_f64(m.max(0.0) * 60.0), n));
    }
    rows.sort_by_key(|r| r.0);
    Ok(rows)
}

impl Runner<'_> {
    /// Create and delete pods so that each entry of pod demand (a Deployment of one pod
    /// shape, for one NodePool) has its desired count.
    pub(super) async fn drive_pods(&mut self, now: Duration, curves: &[DemandCurve]) {
        let Some(mut w) = self.workload.take() else {
            return;
        };
        let cluster = self.cluster();
        self.suspend(true);
        for (i, curve) in curves.iter().enumerate() {
            let Some(pool) = &curve.pool else { continue };
            let requests = (curve.cpu.as_str(), curve.memory.as_str());
            let group = format!("d{i}");
            let lines = w
                .follow(
                    &cluster,
                    &mut self.rng,
                    (pool, &group),
                    curve.at(now),
                    requests,
                )
                .await;
            for l in lines {
                self.line(now, l);
            }
        }
        self.suspend(false);
        self.workload = Some(w);
    }

    /// Create and delete NodeClaims so that each class has its desired count.
    pub(super) async fn drive_demand(&mut self, now: Duration, curves: &[DemandCurve]) {
        let mut desired: BTreeMap<&str, (u32, &DemandCurve)> = BTreeMap::new();
        for c in curves.iter().filter(|c| c.pool.is_none()) {
            let e = desired.entry(c.class.as_str()).or_insert((0, c));
            e.0 += c.at(now);
        }
        let census = self.mirror.demand_census();
        let cluster = self.cluster();
        self.suspend(true);
        for (class, (want, curve)) in desired {
            let counts = census.get(class).copied().unwrap_or_default();
            let have = counts.live;
            if want > have {
                let room = counts.free.saturating_sub(counts.unbound);
                for _ in 0..(want - have).min(room) {
                    self.nc_seq += 1;
                    let name = format!("nc-{:06}", self.nc_seq);
                    let nc = node_claim(&name, class, &curve.cpu, &curve.memory);
                    if cluster.create(&nc).await.is_ok() {
                        self.created.insert(name.clone(), now);
                        self.nodeclaims_created += 1;
                        self.line(now, format!("demand {class} create {name}"));
                    }
                }
            } else if want < have {
                // In the mirror's (name) order, as the random picks below index into it.
                let mut names: Vec<String> = self
                    .mirror
                    .claims
                    .values()
                    .filter(|c| c.spec.node_class_ref.name == class)
                    .filter(|c| c.metadata.deletion_timestamp.is_none())
                    .map(|c| name_of(&c.metadata))
                    .collect();
                for _ in 0..(have - want) {
                    if names.is_empty() {
                        break;
                    }
                    let i = self.rng.random_range(0..names.len());
                    let name = names.swap_remove(i);
                    if cluster.delete::<NodeClaim>(None, &name, None).await.is_ok() {
                        self.line(now, format!("demand {class} delete {name}"));
                    }
                }
            }
        }
        self.suspend(false);
    }
}
