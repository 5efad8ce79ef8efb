//! One simulated machine: what the probe sees and what the phases do to it.

use std::collections::BTreeMap;
use std::time::Duration;

/// Which profile phase a script is, told by a marker word in the simulation's profiles
/// (`sim-install`, `sim-join`, `sim-leave`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum SimPhase {
    Install,
    Join,
    Leave,
}

impl SimPhase {
    pub fn detect(script: &str) -> Option<SimPhase> {
        if script.contains("sim-install") {
            Some(SimPhase::Install)
        } else if script.contains("sim-join") {
            Some(SimPhase::Join)
        } else if script.contains("sim-leave") {
            Some(SimPhase::Leave)
        } else {
            None
        }
    }
}

/// One command as the host received it (on a host with seeded `behaviour`, only its phase:
/// the script and environment are left empty to keep fleet simulations small).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExecRecord {
    pub phase: Option<SimPhase>,
    pub command: String,
    pub env: BTreeMap<String, String>,
}

#[derive(Debug, Clone)]
pub struct SimHost {
    pub address: String,
    pub fingerprint: String,
    pub reachable: bool,
    pub cpu: u32,
    pub memory_kib: u64,
    pub arch: String,
    pub kubelet_active: bool,
    pub kubelet_enabled: bool,
    /// Exit status the next run of a phase returns instead of 0 (consumed once).
    pub fail_next: BTreeMap<SimPhase, u32>,
    /// Phases that hang until the command times out.
    pub hang: Vec<SimPhase>,
    pub phase_latency: Duration,
    /// Whether the kubelet started by join registers its Node (false: a broken join mechanism).
    pub registers: bool,
    /// Probe stdout override (to test unparsable output).
    pub probe_output: Option<String>,
    /// Every command received, oldest first.
    pub log: Vec<ExecRecord>,
    /// SSH sessions opened (probes and phases).
    pub sessions: u64,
    /// Mains power: off means unreachable and no kubelet running (power loss).
    pub powered: bool,
    /// Times the power went off: a session open across one was cut, even if the power is
    /// back by the time the command would have finished.
    pub power_cuts: u64,
    /// Extra time every SSH handshake takes (slow handshakes).
    pub handshake_delay: Duration,
    /// Seeded behaviour (latency distributions, failure and hang probabilities); `None`
    /// keeps the fixed `phase_latency` and the explicit `fail_next`/`hang` switches.
    pub behaviour: Option<Behaviour>,
    /// Whether this host's leave disables the kubelet (the warm-pool invariant) or only
    /// stops it (a bad profile: a reboot brings it back as a zombie).
    pub leave_disables_kubelet: bool,
    /// The node name and join environment the kubelet was started with (it re-registers
    /// its Node from them when it comes back after a reboot). Set with
    /// [`SimHost::set_kubelet_env`].
    kubelet_env: Option<BTreeMap<String, String>>,
    /// The Node name that environment makes the kubelet run as, if it names a NodeClaim:
    /// asked of every running kubelet at every step of a run, so worked out once per join.
    kubelet_as: Option<String>,
    /// A leave is running on the host right now.
    pub leave_in_flight: bool,
    /// The next join follows an install of the same launch (a cold join).
    pub cold: bool,
    /// Whether the last leave sent to this host succeeded (`None`: none was sent).
    pub last_leave_ok: Option<bool>,
}

/// Per-phase numbers.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct PerPhase<T> {
    pub install: T,
    pub join: T,
    pub leave: T,
}

impl<T: Copy> PerPhase<T> {
    pub fn get(&self, phase: SimPhase) -> T {
        match phase {
            SimPhase::Install => self.install,
            SimPhase::Join => self.join,
            SimPhase::Leave => self.leave,
        }
    }
}

/// A log-normal latency given by its median and 95th percentile.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Latency {
    pub median: Duration,
    pub p95: Duration,
}

impl Default for Latency {
    fn default() -> Self {
        Latency {
            median: Duration::from_secs(1),
            p95: Duration::from_secs(1),
        }
    }
}

impl Latency {
    /// Draw one latency (Box-Muller on two uniforms), capped at 100 × the median.
    pub fn sample(&self, rng: &mut impl rand::Rng) -> Duration {
        let median = self.median.as_secs_f64().max(0.001);
        let p95 = self.p95.as_secs_f64().max(median);
        let sigma = (p95 / median).ln() / 1.644_853_6;
        let u1: f64 = rng.random::<f64>().max(f64::MIN_POSITIVE);
        let u2: f64 = rng.random::<f64>();
        let z = (-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos();
        let secs = (median * (sigma * z).exp()).min(median * 100.0);
        Duration::from_millis((secs * 1000.0) as u64)
    }
}

/// What a host class does, drawn per command from the transport's seeded random source.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Behaviour {
    pub latency: PerPhase<Latency>,
    /// Probability that a run of the phase exits non-zero.
    pub fail: PerPhase<f64>,
    /// Probability that a run of the phase hangs until its timeout.
    pub hang: PerPhase<f64>,
}

impl SimHost {
    pub fn new(address: &str, cpu: u32, memory_kib: u64) -> Self {
        SimHost {
            address: address.to_string(),
            fingerprint: format!("SHA256:{:0<43}", address.replace('.', "x")),
            reachable: true,
            cpu,
            memory_kib,
            arch: "x86_64".into(),
            kubelet_active: false,
            kubelet_enabled: false,
            fail_next: BTreeMap::new(),
            hang: vec![],
            phase_latency: Duration::from_secs(1),
            registers: true,
            probe_output: None,
            log: vec![],
            sessions: 0,
            powered: true,
            power_cuts: 0,
            handshake_delay: Duration::ZERO,
            behaviour: None,
            leave_disables_kubelet: true,
            kubelet_env: None,
            kubelet_as: None,
            leave_in_flight: false,
            cold: false,
            last_leave_ok: None,
        }
    }

    /// What the probe parses out of [`SimHost::probe_stdout`], without writing and parsing
    /// the text: the steady probe of a simulated fleet (millions a day). `None` when the
    /// output is set by hand or the facts would not parse as written (a zero, an arch that
    /// is not one plain word): those go through the real parser. A unit test holds the two
    /// paths to the same answer.
    pub fn probe_facts(&self) -> Option<crate::ssh::ProbeFacts> {
        let plain_arch =
            !self.arch.is_empty() && self.arch.bytes().all(|b| b.is_ascii_graphic() && b != b'=');
        if self.probe_output.is_some() || self.cpu == 0 || self.memory_kib == 0 || !plain_arch {
            return None;
        }
        Some(crate::ssh::ProbeFacts {
            cpu: self.cpu,
            memory_kib: self.memory_kib,
            arch: crate::ssh::probe::normalize_arch(&self.arch),
            kubelet_active: self.kubelet_active,
        })
    }

    pub fn probe_stdout(&self) -> String {
        if let Some(o) = &self.probe_output {
            return o.clone();
        }
        format!(
            "kpssh-probe=1\ncpu={}\nmemory_kib={}\narch={}\nkubelet={}\n",
            self.cpu,
            self.memory_kib,
            self.arch,
            if self.kubelet_active {
                "active"
            } else {
                "inactive"
            }
        )
    }

    /// Phases this host ran, in order.
    pub fn phases(&self) -> Vec<SimPhase> {
        self.log.iter().filter_map(|r| r.phase).collect()
    }

    /// The power goes off (a reboot or a power loss begins).
    pub fn power_off(&mut self) {
        self.powered = false;
        self.power_cuts += 1;
    }

    /// A reboot: services come back only if enabled (the warm-pool invariant).
    pub fn reboot(&mut self) {
        self.kubelet_active = self.kubelet_enabled;
    }

    /// A kubelet process is running (and talking to the API server).
    pub fn kubelet_running(&self) -> bool {
        self.powered && self.kubelet_active
    }

    /// The Node name the kubelet runs as, if it runs: the NodeClaim's, or with nodeadm's
    /// naming the machine's own (`super::kubelet::node_name`).
    pub fn kubelet_node(&self) -> Option<String> {
        if !self.kubelet_running() {
            return None;
        }
        self.kubelet_env.as_ref().map(super::kubelet::node_name)
    }

    /// Whether the kubelet runs, as Node `node` (what `kubelet_node` says, without a copy).
    pub fn kubelet_runs_as(&self, node: &str) -> bool {
        self.kubelet_running() && self.kubelet_as.as_deref() == Some(node)
    }

    /// The join environment the kubelet was last started with.
    pub fn kubelet_env(&self) -> Option<&BTreeMap<String, String>> {
        self.kubelet_env.as_ref()
    }

    /// Start the kubelet's configuration from a join environment (`None`: none).
    pub fn set_kubelet_env(&mut self, env: Option<BTreeMap<String, String>>) {
        // A kubelet whose environment names no NodeClaim runs as no Node of ours.
        self.kubelet_as = env
            .as_ref()
            .filter(|e| e.contains_key("KPSSH_NODE_NAME"))
            .map(super::kubelet::node_name);
        self.kubelet_env = env;
    }

    /// The NodeClaim the running kubelet was joined for (`KPSSH_NODE_NAME`), if it runs.
    pub fn kubelet_claim(&self) -> Option<&str> {
        if !self.kubelet_running() {
            return None;
        }
        self.kubelet_env
            .as_ref()
            .and_then(|e| e.get("KPSSH_NODE_NAME"))
            .map(String::as_str)
    }
}

/// Parse the `export NAME='value'` lines of a Raw-mode preamble.
pub fn parse_exports(stdin: &str) -> BTreeMap<String, String> {
    let mut env = BTreeMap::new();
    for line in stdin.lines() {
        let Some(rest) = line.strip_prefix("export ") else {
            continue;
        };
        let Some((name, quoted)) = rest.split_once('=') else {
            continue;
        };
        env.insert(name.to_string(), unquote(quoted));
    }
    env
}

fn unquote(q: &str) -> String {
    let inner = q
        .strip_prefix('\'')
        .and_then(|s| s.strip_suffix('\''))
        .unwrap_or(q);
    inner.replace("'\\''", "'")
}

#[cfg(test)]
mod tests {
    use super::SimHost;
    use crate::ssh::probe::parse_probe_output;

    /// The steady probe's facts without text must be what the parser makes of the text the
    /// host would have written, and every host whose facts would not parse as written must
    /// take the parser's path.
    #[test]
    fn probe_facts_agree_with_parsing_the_probe_output() {
        let archs = [
            "amd64", "x86_64", "aarch64", "arm64", "riscv64", "", " amd64", "amd64 ", "a=b", "x y",
            "ünï", "arm\n64",
        ];
        let mut direct = 0;
        for cpu in [0u32, 1, 4, 64] {
            for memory_kib in [0u64, 1, 16 * 1024 * 1024] {
                for arch in archs {
                    for kubelet in [false, true] {
                        let mut h = SimHost::new("10.0.0.1", cpu, memory_kib);
                        h.arch = arch.to_string();
                        h.kubelet_active = kubelet;
                        let parsed = parse_probe_output(h.probe_stdout().as_bytes());
                        if let Some(facts) = h.probe_facts() {
                            direct += 1;
                            assert_eq!(parsed.as_ref(), Ok(&facts), "{cpu} {memory_kib} {arch:?}");
                        }
                        h.probe_output = Some("kpssh-probe=1\ncpu=2\n".into());
                        assert_eq!(h.probe_facts(), None, "output set by hand is parsed");
                    }
                }
            }
        }
        // The fleet's ordinary hosts take the direct path: 3 × 2 non-zero sizes, 5 plain archs.
        assert_eq!(direct, 3 * 2 * 5 * 2);
    }
}
