//! Scenario files for `kpssh sim` and the fault campaigns (format: `docs/simulation.md`).

use std::collections::BTreeMap;
use std::time::Duration;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

use super::host::{Behaviour, Latency, PerPhase};

/// A whole simulation: fleet, demand, faults, how long, which seed.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Scenario {
    #[serde(default = "default_name")]
    pub name: String,
    #[serde(default)]
    pub seed: u64,
    /// Virtual time simulated.
    #[serde(with = "dur")]
    pub duration: Duration,
    /// Interval between invariant checks and demand updates.
    #[serde(default = "default_step", with = "dur")]
    pub step: Duration,
    /// Controller probe interval (the zombie and token bounds derive from it).
    #[serde(default = "default_probe", with = "dur")]
    pub probe_interval: Duration,
    /// The controller's fleet-wide limits (its flags), defaulting to the controller's.
    #[serde(default)]
    pub controller: ControllerLimits,
    pub classes: Vec<HostClass>,
    /// NodePools that pod demand (`demand[].pool`) goes through: Karpenter's provisioning
    /// turns the pending pods into NodeClaims within each pool's limits.
    #[serde(default)]
    pub node_pools: Vec<SimNodePool>,
    #[serde(default)]
    pub demand: Vec<Demand>,
    #[serde(default)]
    pub faults: Faults,
}

/// The controller flags that bound its work: a planner wants to see its own settings at work.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields, rename_all = "camelCase")]
pub struct ControllerLimits {
    pub max_concurrent_phases: usize,
    pub max_concurrent_probes: usize,
    pub ssh_dials_per_second: u32,
    /// Cap on pooled SSH connections (`--max-ssh-connections`): a probe over a pooled
    /// connection does not dial, so does not wait for `sshDialsPerSecond`.
    pub max_ssh_connections: usize,
    /// Node repair (`--node-repair`, upstream's NodeRepair feature gate; off by default).
    pub node_repair: bool,
}

impl Default for ControllerLimits {
    fn default() -> Self {
        let c = crate::provider::Config::default();
        ControllerLimits {
            max_concurrent_phases: c.max_concurrent_phases,
            max_concurrent_probes: c.max_concurrent_probes,
            ssh_dials_per_second: c.ssh_dials_per_second,
            max_ssh_connections: crate::ssh::pool::PoolConfig::default().max_connections,
            node_repair: crate::karpenter::KarpenterConfig::default().node_repair,
        }
    }
}

/// Share of the SSH dial rate that probes may take; the rest is for phases.
const PROBE_DIAL_SHARE: f64 = 0.8;

fn default_name() -> String {
    "scenario".into()
}
fn default_step() -> Duration {
    Duration::from_secs(30)
}
fn default_probe() -> Duration {
    Duration::from_secs(120)
}

/// A class of identical hosts; one SSHNodeClass selects each class.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct HostClass {
    pub name: String,
    pub count: usize,
    pub cpu: u32,
    /// GiB of memory.
    #[serde(default = "default_mem")]
    pub memory_gib: u32,
    /// `amd64` or `arm64`.
    #[serde(default = "default_arch")]
    pub arch: String,
    /// Price of one vCPU-hour while the host is a cluster member.
    #[serde(default = "default_price")]
    pub price_per_cpu_hour: f64,
    #[serde(default)]
    pub latency: PhaseLatencies,
    #[serde(default)]
    pub failure: PhaseProbabilities,
    #[serde(default)]
    pub hang: PhaseProbabilities,
    /// Fraction of hosts whose profile's leave only stops the kubelet (a reboot brings it
    /// back: a zombie for the guard to catch).
    #[serde(default)]
    pub bad_leave_fraction: f64,
    /// MiB by which each host's MemTotal (what the probe observes) may fall short of
    /// `memoryGib`, drawn per host from 0 to this: real machines of one size report slightly
    /// different memory (firmware, kernel). Each SSHHost declares `memoryGib`.
    #[serde(default, skip_serializing_if = "is_zero_u32")]
    pub memory_spread_mib: u32,
    /// How the class's Nodes get their identity (its SSHNodeClass `providerIDSource`, and
    /// the name the simulated kubelet registers under).
    #[serde(default, skip_serializing_if = "NodeIdentity::is_static")]
    pub identity: NodeIdentity,
}

/// A host class's node identity.
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub enum NodeIdentity {
    /// kpssh sets the provider ID; the kubelet registers under the NodeClaim's name.
    #[default]
    Static,
    /// Adopt mode: the join mechanism sets the provider ID (kpssh adopts it by node IP); the
    /// kubelet still registers under the NodeClaim's name.
    Adopt,
    /// Adopt mode with nodeadm's naming (EKS Hybrid): the kubelet registers under a
    /// managed-instance name of the machine's own (`mi-…`), the same for every claim of it.
    Nodeadm,
}

impl NodeIdentity {
    pub fn is_static(&self) -> bool {
        *self == NodeIdentity::Static
    }
}

fn is_zero_u32(n: &u32) -> bool {
    *n == 0
}

fn default_mem() -> u32 {
    8
}
fn default_arch() -> String {
    "amd64".into()
}
fn default_price() -> f64 {
    0.02
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct LatencySpec {
    #[serde(with = "dur")]
    pub median: Duration,
    #[serde(with = "dur")]
    pub p95: Duration,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct PhaseLatencies {
    pub install: LatencySpec,
    pub join: LatencySpec,
    pub leave: LatencySpec,
}

impl Default for PhaseLatencies {
    fn default() -> Self {
        let l = |m, p| LatencySpec {
            median: Duration::from_secs(m),
            p95: Duration::from_secs(p),
        };
        PhaseLatencies {
            install: l(90, 240),
            join: l(20, 60),
            leave: l(10, 30),
        }
    }
}

#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct PhaseProbabilities {
    #[serde(default)]
    pub install: f64,
    #[serde(default)]
    pub join: f64,
    #[serde(default)]
    pub leave: f64,
}

impl HostClass {
    pub fn behaviour(&self) -> Behaviour {
        let l = |s: &LatencySpec| Latency {
            median: s.median,
            p95: s.p95,
        };
        let p = |s: &PhaseProbabilities| PerPhase {
            install: s.install,
            join: s.join,
            leave: s.leave,
        };
        Behaviour {
            latency: PerPhase {
                install: l(&self.latency.install),
                join: l(&self.latency.join),
                leave: l(&self.latency.leave),
            },
            fail: p(&self.failure),
            hang: p(&self.hang),
        }
    }

    /// The architecture as `uname -m` reports it (the probe maps it back).
    pub fn uname_arch(&self) -> &str {
        match self.arch.as_str() {
            "amd64" => "x86_64",
            "arm64" => "aarch64",
            other => other,
        }
    }
}

/// A NodePool over one host class, for pod demand.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct SimNodePool {
    pub name: String,
    /// The host class (its SSHNodeClass) the pool's NodeClaims use.
    pub class: String,
    /// `spec.limits` (e.g. `cpu: "16"`); the `nodepool-limits` invariant holds the pool's
    /// NodeClaims to them.
    #[serde(default)]
    pub limits: BTreeMap<String, String>,
    /// `spec.disruption.consolidateAfter`: how long a node stays empty before it goes
    /// (`Never`: consolidation off).
    #[serde(default = "default_consolidate_after")]
    pub consolidate_after: String,
    /// `spec.template.spec.terminationGracePeriod`: how long a drain may be held up by PDBs
    /// and do-not-disrupt pods (unset: as long as they hold).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub termination_grace_period: Option<String>,
    /// `spec.template.spec.expireAfter`: nodes older than this are replaced (forcefully).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expire_after: Option<String>,
}

fn default_consolidate_after() -> String {
    "5m".into()
}

/// Desired node count of one class over time: the sum of the parts given, or the CSV trace.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Demand {
    /// Host class (and node class) the NodeClaims are for; default: the first class.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub class: Option<String>,
    /// Pods instead of NodeClaims: each unit of demand is one pod with these requests,
    /// pending until Karpenter's provisioning gives this NodePool a node for it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pool: Option<String>,
    /// Requests of each NodeClaim.
    #[serde(default = "default_cpu")]
    pub cpu: String,
    #[serde(default = "default_memory")]
    pub memory: String,
    /// Nodes wanted at all times.
    #[serde(default)]
    pub steady: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub diurnal: Option<Diurnal>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bursts: Option<Bursts>,
    /// A PodDisruptionBudget over this entry's pods (pod demand only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pdb: Option<SimPdb>,
    /// Share of this entry's pods annotated `karpenter.sh/do-not-disrupt: "true"` (each pod
    /// drawn when it is created).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub do_not_disrupt: f64,
    /// `minute,nodes` lines (a header line is allowed); the count holds until the next line.
    /// Replaces steady, diurnal and bursts. A path in the scenario file is relative to it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub csv: Option<String>,
    /// The same as `csv`, inline: `minute: count` (what the scenario generator draws, so
    /// that a printed scenario is one self-contained file).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub series: Option<BTreeMap<u32, u32>>,
}

fn is_zero(x: &f64) -> bool {
    *x == 0.0
}

/// A PodDisruptionBudget: exactly one of the two, a count or a percentage (`"50%"`).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct SimPdb {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_unavailable: Option<IntOrPercent>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_available: Option<IntOrPercent>,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(untagged)]
pub enum IntOrPercent {
    Int(i32),
    Percent(String),
}

impl IntOrPercent {
    pub fn to_k8s(&self) -> k8s_openapi::apimachinery::pkg::util::intstr::IntOrString {
        use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
        match self {
            IntOrPercent::Int(n) => IntOrString::Int(*n),
            IntOrPercent::Percent(p) => IntOrString::String(p.clone()),
        }
    }

    fn valid(&self) -> bool {
        match self {
            IntOrPercent::Int(n) => *n >= 0,
            IntOrPercent::Percent(p) => p
                .strip_suffix('%')
                .and_then(|n| n.parse::<u32>().ok())
                .is_some_and(|n| n <= 100),
        }
    }
}

fn default_cpu() -> String {
    "1".into()
}
fn default_memory() -> String {
    "1Gi".into()
}

/// A cosine day: `amplitude` more nodes at `peakHour`, none at the opposite hour. The
/// period is a day unless `periodHours` compresses it (a short run still sees a whole cycle).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Diurnal {
    pub amplitude: u32,
    #[serde(default = "default_peak")]
    pub peak_hour: f64,
    #[serde(default = "default_period")]
    pub period_hours: f64,
}

fn default_peak() -> f64 {
    14.0
}
fn default_period() -> f64 {
    24.0
}

/// Bursts of `size` extra nodes for `duration`, arriving at `ratePerHour` (Poisson).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Bursts {
    pub rate_per_hour: f64,
    pub size: u32,
    #[serde(with = "dur")]
    pub duration: Duration,
}

/// A host fault: how often it strikes one host, and how long it lasts.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct HostFault {
    pub rate_per_host_hour: f64,
    #[serde(default = "default_fault_duration", with = "dur")]
    pub duration: Duration,
}

fn default_fault_duration() -> Duration {
    Duration::from_secs(300)
}

/// A fleet-wide fault: how often per virtual hour.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Rate {
    pub rate_per_hour: f64,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Faults {
    /// Reboot: down for `duration`, then services come back if enabled.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reboot: Option<HostFault>,
    /// Power loss: down (kubelet gone, commands cut off) for `duration`, then a cold boot.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub power_loss: Option<HostFault>,
    /// sshd refuses connections for `duration`; the machine keeps running.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ssh_refusal: Option<HostFault>,
    /// The host presents another key for `duration` (a re-key that was then rolled back).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host_key_change: Option<HostFault>,
    /// Every handshake takes `delay` longer for `duration`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub slow_handshake: Option<SlowHandshake>,
    /// The controller process dies (every actor, mid-phase included) and restarts.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub controller_crash: Option<Rate>,
    /// A NodeClaim is force-deleted: finalizers stripped, then deleted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub force_delete: Option<Rate>,
    /// The join profile's version is bumped (every host becomes cold).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub profile_bump: Option<Rate>,
    /// Every Node on the hosts of one class (so every node of its NodePools) loses contact
    /// with the API server for `duration`: Ready goes Unknown while the machines run on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub partition: Option<Partition>,
    /// Probability that any controller write fails with a 409 conflict.
    #[serde(default)]
    pub api_conflict: f64,
    /// Probability that any controller write fails with a transient (5xx) error.
    #[serde(default)]
    pub api_transient: f64,
}

/// A partition: how often per virtual hour, and how long it lasts.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Partition {
    pub rate_per_hour: f64,
    #[serde(default = "default_partition", with = "dur")]
    pub duration: Duration,
}

fn default_partition() -> Duration {
    Duration::from_secs(20 * 60)
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct SlowHandshake {
    pub rate_per_host_hour: f64,
    #[serde(default = "default_fault_duration", with = "dur")]
    pub duration: Duration,
    #[serde(default = "default_delay", with = "dur")]
    pub delay: Duration,
}

fn default_delay() -> Duration {
    Duration::from_secs(45)
}

impl Scenario {
    pub fn from_yaml(text: &str) -> Result<Scenario, String> {
        let s: Scenario = serde_yaml::from_str(text).map_err(|e| e.to_string())?;
        s.validate()?;
        Ok(s)
    }

    pub fn validate(&self) -> Result<(), String> {
        if self.classes.is_empty() {
            return Err("classes: at least one host class is required".into());
        }
        let mut names = BTreeMap::new();
        for c in &self.classes {
            if names.insert(c.name.clone(), ()).is_some() {
                return Err(format!("classes: {} appears twice", c.name));
            }
            let ok = !c.name.is_empty()
                && c.name.len() <= 50
                && c.name
                    .chars()
                    .all(|ch| ch.is_ascii_lowercase() || ch.is_ascii_digit() || ch == '-');
            if !ok {
                return Err(format!(
                    "classes: name {:?} must be lower-case letters, digits and '-'",
                    c.name
                ));
            }
            if c.cpu == 0 {
                return Err(format!("classes: {} needs cpu > 0", c.name));
            }
        }
        self.validate_pools(&names)?;
        for d in &self.demand {
            if let Some(c) = &d.class
                && !names.contains_key(c)
            {
                return Err(format!("demand: unknown class {c}"));
            }
            if let Some(x) = &d.diurnal
                && (x.period_hours.is_nan() || x.period_hours <= 0.0)
            {
                return Err("demand: diurnal.periodHours must be positive".into());
            }
            if (d.pdb.is_some() || d.do_not_disrupt > 0.0) && d.pool.is_none() {
                return Err("demand: pdb and doNotDisrupt are for pod demand (give a pool)".into());
            }
            if !(0.0..=1.0).contains(&d.do_not_disrupt) {
                return Err("demand: doNotDisrupt is a share of the pods, 0 to 1".into());
            }
            if let Some(b) = &d.pdb {
                let one = match (&b.max_unavailable, &b.min_available) {
                    (Some(x), None) | (None, Some(x)) => x.valid(),
                    _ => false,
                };
                if !one {
                    return Err("demand: pdb needs exactly one of maxUnavailable and minAvailable, a count or a percentage like \"50%\"".into());
                }
            }
            if d.csv.is_some() && d.series.is_some() {
                return Err("demand: give csv (a file) or series (inline), not both".into());
            }
            match (&d.class, &d.pool) {
                (Some(_), Some(_)) => {
                    return Err(
                        "demand: give a class (NodeClaims) or a pool (pods), not both".into(),
                    );
                }
                (None, Some(p)) if !self.node_pools.iter().any(|np| &np.name == p) => {
                    return Err(format!(
                        "demand: unknown pool {p}; declare it under nodePools"
                    ));
                }
                _ => {}
            }
        }
        if self.step.is_zero() || self.duration.is_zero() {
            return Err("duration and step must be positive".into());
        }
        self.validate_limits()
    }

    fn validate_pools(&self, classes: &BTreeMap<String, ()>) -> Result<(), String> {
        let mut seen = BTreeMap::new();
        for p in &self.node_pools {
            if seen.insert(p.name.clone(), ()).is_some() {
                return Err(format!("nodePools: {} appears twice", p.name));
            }
            if !classes.contains_key(&p.class) {
                return Err(format!("nodePools: {}: unknown class {}", p.name, p.class));
            }
            for (k, v) in &p.limits {
                if crate::api::quantity::parse_str(v).is_none() {
                    return Err(format!(
                        "nodePools: {}: limits.{k} {v:?} is not a quantity (e.g. \"16\", \"64Gi\")",
                        p.name
                    ));
                }
            }
            for (field, value) in [
                ("terminationGracePeriod", &p.termination_grace_period),
                ("expireAfter", &p.expire_after),
            ] {
                if let Some(v) = value {
                    parse_duration(v)
                        .map_err(|e| format!("nodePools: {}: {field}: {e}", p.name))?;
                }
            }
            if p.consolidate_after != "Never" {
                parse_duration(&p.consolidate_after).map_err(|e| {
                    format!(
                        "nodePools: {}: consolidateAfter: {e} (or \"Never\")",
                        p.name
                    )
                })?;
            }
        }
        Ok(())
    }

    /// Probing every host once per interval must fit in the dial rate, with room left for
    /// phases; otherwise every probe, and with it every zombie and token check, runs late.
    /// Only probes that dial count: when every host's connection stays pooled between two
    /// probes (the fleet within `maxSshConnections`, the interval under the pool's idle
    /// timeout), a steady fleet dials only after faults and restarts, and the dial rate bounds
    /// the first sweep only. Otherwise the pool keeps the least recently used out, which is
    /// the next host a round-robin sweep probes: every probe dials.
    fn validate_limits(&self) -> Result<(), String> {
        let l = &self.controller;
        if l.max_concurrent_phases == 0
            || l.max_concurrent_probes == 0
            || l.ssh_dials_per_second == 0
            || l.max_ssh_connections == 0
        {
            return Err("controller: maxConcurrentPhases, maxConcurrentProbes, sshDialsPerSecond and maxSshConnections must be positive".into());
        }
        if self.probe_interval.is_zero() {
            return Err("probeInterval must be positive".into());
        }
        let idle = crate::ssh::pool::PoolConfig::default().idle_timeout;
        if self.hosts() <= l.max_ssh_connections && self.probe_interval < idle {
            return Ok(());
        }
        let needed = self.hosts() as f64 / self.probe_interval.as_secs_f64();
        let budget = f64::from(l.ssh_dials_per_second) * PROBE_DIAL_SHARE;
        if needed > budget {
            return Err(format!(
                "probing {} hosts every {:?} needs {needed:.1} SSH dials per second (the pool of {} connections, idle {}s, cannot keep them all), more than {:.0}% of controller.sshDialsPerSecond ({}); raise sshDialsPerSecond to at least {}, probeInterval to at least {}s, or maxSshConnections to at least {} with probeInterval under {}s",
                self.hosts(),
                self.probe_interval,
                l.max_ssh_connections,
                idle.as_secs(),
                PROBE_DIAL_SHARE * 100.0,
                l.ssh_dials_per_second,
                (needed / PROBE_DIAL_SHARE).ceil(),
                (self.hosts() as f64 / budget).ceil(),
                self.hosts(),
                idle.as_secs(),
            ));
        }
        Ok(())
    }

    pub fn hosts(&self) -> usize {
        self.classes.iter().map(|c| c.count).sum()
    }

    /// The scenario `kpssh sim` runs without `--scenario`: a few hundred hosts in three
    /// classes, a virtual day of diurnal demand with bursts, and a few faults.
    pub fn builtin() -> Scenario {
        Scenario::from_yaml(BUILTIN).unwrap_or_else(|e| unreachable_builtin(&e))
    }
}

#[allow(clippy::panic)]
fn unreachable_builtin(e: &str) -> Scenario {
    panic!("the built-in scenario does not parse: {e}")
}

/// The built-in scenario (also `examples/sim/day.yaml`).
pub const BUILTIN: &str = include_str!("../../examples/sim/day.yaml");

/// Parse `90s`, `5m`, `1h30m`, `2d`, `250ms`.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let t = text.trim();
    if t.is_empty() {
        return Err("empty duration".into());
    }
    let mut total = Duration::ZERO;
    let mut num = String::new();
    let mut chars = t.chars().peekable();
    while let Some(c) = chars.next() {
        if c.is_ascii_digit() || c == '.' {
            num.push(c);
            continue;
        }
        let mut unit = c.to_string();
        if c == 'm' && chars.peek() == Some(&'s') {
            unit.push('s');
            chars.next();
        }
        let n: f64 = num
            .parse()
            .map_err(|_| format!("{text:?}: expected a number before {unit:?}"))?;
        num.clear();
        let secs = match unit.as_str() {
            "ms" => n / 1000.0,
            "s" => n,
            "m" => n * 60.0,
            "h" => n * 3600.0,
            "d" => n * 86400.0,
            _ => return Err(format!("{text:?}: unknown unit {unit:?} (ms, s, m, h, d)")),
        };
        total += Duration::from_secs_f64(secs);
    }
    if !num.is_empty() {
        return Err(format!("{text:?}: a unit is required (ms, s, m, h, d)"));
    }
    Ok(total)
}

/// Format a duration the way `parse_duration` reads it.
pub fn format_duration(d: Duration) -> String {
    let s = d.as_secs();
    if d.subsec_millis() != 0 {
        return format!("{}ms", d.as_millis());
    }
    let (h, m, sec) = (s / 3600, (s % 3600) / 60, s % 60);
    let mut out = String::new();
    if h > 0 {
        out.push_str(&format!("{h}h"));
    }
    if m > 0 {
        out.push_str(&format!("{m}m"));
    }
    if sec > 0 || out.is_empty() {
        out.push_str(&format!("{sec}s"));
    }
    out
}

mod dur {
    use super::*;

    pub fn serialize<S: Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&format_duration(*d))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Raw {
            Text(String),
            Secs(f64),
        }
        match Raw::deserialize(d)? {
            Raw::Text(t) => parse_duration(&t).map_err(serde::de::Error::custom),
            Raw::Secs(n) if n >= 0.0 => Ok(Duration::from_secs_f64(n)),
            Raw::Secs(_) => Err(serde::de::Error::custom("negative duration")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_example_scenario_is_valid() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/sim");
        let mut seen = 0;
        for entry in std::fs::read_dir(&dir).expect("examples/sim") {
            let path = entry.expect("entry").path();
            if path.extension().is_some_and(|e| e == "yaml") {
                let text = std::fs::read_to_string(&path).expect("read");
                if let Err(e) = Scenario::from_yaml(&text) {
                    panic!("{}: {e}", path.display());
                }
                seen += 1;
            }
        }
        assert!(seen >= 4, "only {seen} scenarios under {}", dir.display());
    }

    #[test]
    fn a_probe_interval_the_dial_rate_cannot_keep_is_rejected_with_the_fix() {
        let mut s = Scenario::builtin();
        s.classes[0].count = 9_900; // 10,000 hosts with the other classes
        s.probe_interval = Duration::from_secs(120);
        let err = s
            .validate()
            .expect_err("10,000 hosts every 2m at 50 dials/s");
        assert!(err.contains("sshDialsPerSecond"), "{err}");
        assert!(
            err.contains("raise sshDialsPerSecond to at least 105"),
            "{err}"
        );
        assert!(err.contains("maxSshConnections to at least 10000"), "{err}");
        s.controller.ssh_dials_per_second = 105;
        s.validate().expect("enough dials");
        s.controller.ssh_dials_per_second = 50;
        s.probe_interval = Duration::from_secs(300);
        s.validate().expect("5m fits 50 dials/s");
        // Every host's connection stays pooled between its probes: steady probes dial not.
        s.probe_interval = Duration::from_secs(120);
        s.controller.max_ssh_connections = 10_000;
        s.validate()
            .expect("a pooled fleet probes without dialling");
        s.controller.ssh_dials_per_second = 1;
        s.validate()
            .expect("the dial rate bounds only the first sweep");
        s.probe_interval = Duration::from_secs(300);
        let err = s
            .validate()
            .expect_err("idle past the pool's timeout: every probe dials");
        assert!(err.contains("sshDialsPerSecond"), "{err}");
        // Fields left out keep the controller's defaults.
        let yaml = "duration: 1h\ncontroller: {maxConcurrentPhases: 256}\nclasses: [{name: a, count: 1, cpu: 1}]";
        let parsed = Scenario::from_yaml(yaml).expect("partial controller section");
        assert_eq!(parsed.controller.max_concurrent_phases, 256);
        assert_eq!(parsed.controller.ssh_dials_per_second, 50);
    }

    #[test]
    fn durations_parse_and_format() {
        assert_eq!(parse_duration("90s"), Ok(Duration::from_secs(90)));
        assert_eq!(parse_duration("1h30m"), Ok(Duration::from_secs(5400)));
        assert_eq!(parse_duration("250ms"), Ok(Duration::from_millis(250)));
        assert_eq!(parse_duration("1d"), Ok(Duration::from_secs(86400)));
        assert!(parse_duration("10").is_err());
        assert!(parse_duration("5x").is_err());
        assert_eq!(format_duration(Duration::from_secs(5400)), "1h30m");
    }

    #[test]
    fn builtin_scenario_parses() {
        let s = Scenario::builtin();
        assert!(s.hosts() >= 200, "a few hundred hosts");
        assert_eq!(s.duration, Duration::from_secs(86400));
    }
}
