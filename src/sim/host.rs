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

/// One command as the host received it.
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
        }
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

    /// A reboot: services come back only if enabled (the warm-pool invariant).
    pub fn reboot(&mut self) {
        self.kubelet_active = self.kubelet_enabled;
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
