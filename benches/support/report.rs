//! Shared by the benchmark targets: how they were invoked, the printed table and the JSON file.
//!
//! `cargo bench --bench NAME` passes `--bench` to the binary: the full measurement runs and its
//! JSON lands in `target/bench/NAME.json`. Without it (the binary built by
//! `cargo test --all-targets`, i.e. `make test`) the same code runs at smoke size so that a
//! benchmark that no longer works fails the test run instead of rotting.
#![allow(dead_code)] // each benchmark uses a different subset

use std::path::PathBuf;
use std::time::Duration;

use serde_json::Value;

/// Full measurement (`cargo bench`) or smoke size (`cargo test`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    Full,
    Smoke,
}

impl Mode {
    pub fn detect() -> Mode {
        if std::env::args().any(|a| a == "--bench") {
            Mode::Full
        } else {
            Mode::Smoke
        }
    }

    /// `full` in a benchmark run, `smoke` otherwise; `KPSSH_BENCH_<NAME>` overrides both.
    pub fn pick(self, env: &str, full: usize, smoke: usize) -> usize {
        if let Some(v) = std::env::var(env).ok().and_then(|v| v.trim().parse().ok()) {
            return v;
        }
        match self {
            Mode::Full => full,
            Mode::Smoke => smoke,
        }
    }
}

/// Seconds with millisecond precision, for tables and JSON.
pub fn secs(d: Duration) -> f64 {
    (d.as_secs_f64() * 1000.0).round() / 1000.0
}

/// The median of some measurements (the upper one of an even count).
pub fn median(xs: &[Duration]) -> Duration {
    let mut v = xs.to_vec();
    v.sort();
    v.get(v.len() / 2).copied().unwrap_or_default()
}

/// A fixed-width table: header row, then rows; every cell is already formatted.
pub fn print_table(title: &str, header: &[&str], rows: &[Vec<String>]) {
    let mut width: Vec<usize> = header.iter().map(|h| h.len()).collect();
    for r in rows {
        for (i, c) in r.iter().enumerate() {
            if i < width.len() {
                width[i] = width[i].max(c.len());
            }
        }
    }
    let line = |cells: Vec<&str>| {
        cells
            .iter()
            .enumerate()
            .map(|(i, c)| format!("{c:<w$}", w = width.get(i).copied().unwrap_or(0)))
            .collect::<Vec<_>>()
            .join("  ")
    };
    println!("\n== {title}");
    println!("{}", line(header.to_vec()));
    println!(
        "{}",
        width
            .iter()
            .map(|w| "-".repeat(*w))
            .collect::<Vec<_>>()
            .join("  ")
    );
    for r in rows {
        println!("{}", line(r.iter().map(String::as_str).collect()));
    }
}

/// One target: the measured figure against its bound, printed as MET/MISSED.
pub struct Target {
    pub name: String,
    pub measured: f64,
    pub bound: f64,
    /// `true`: the figure must be at least `bound`; `false`: at most.
    pub at_least: bool,
}

impl Target {
    pub fn met(&self) -> bool {
        if self.at_least {
            self.measured >= self.bound
        } else {
            self.measured <= self.bound
        }
    }

    pub fn row(&self) -> Vec<String> {
        vec![
            self.name.clone(),
            format!("{:.3}", self.measured),
            format!("{} {}", if self.at_least { ">=" } else { "<=" }, self.bound),
            if self.met() { "MET" } else { "MISSED" }.to_string(),
        ]
    }

    pub fn json(&self) -> Value {
        serde_json::json!({
            "name": self.name,
            "measured": self.measured,
            "bound": self.bound,
            "at_least": self.at_least,
            "met": self.met(),
        })
    }
}

pub fn print_targets(targets: &[Target]) {
    let rows: Vec<Vec<String>> = targets.iter().map(Target::row).collect();
    print_table("targets", &["target", "measured", "bound", ""], &rows);
}

/// The machine the figures come from (cores, memory, kernel), for the JSON.
pub fn machine() -> Value {
    let cores = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(0);
    let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
    let mem_kib: u64 = meminfo
        .lines()
        .find_map(|l| l.strip_prefix("MemTotal:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("model name"))
        .map(|v| v.trim_start_matches([' ', '\t', ':']).to_string())
        .unwrap_or_default();
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    serde_json::json!({
        "cores": cores,
        "memory_gib": (mem_kib as f64 / 1024.0 / 1024.0 * 10.0).round() / 10.0,
        "cpu": cpu,
        "kernel": kernel.trim(),
        "loadavg_at_start": load.split_whitespace().take(3).collect::<Vec<_>>().join(" "),
    })
}

/// Write `target/bench/<name>.json` (full runs only) and say where.
pub fn write_json(mode: Mode, name: &str, mut value: Value) {
    if mode != Mode::Full {
        println!("\n(smoke size: run `cargo bench --bench {name}` for the measurement)");
        return;
    }
    if let Some(obj) = value.as_object_mut() {
        obj.insert("machine".into(), machine());
    }
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target/bench");
    let path = dir.join(format!("{name}.json"));
    let text = serde_json::to_string_pretty(&value).unwrap_or_default();
    match std::fs::create_dir_all(&dir).and_then(|()| std::fs::write(&path, text)) {
        Ok(()) => println!("\nwrote {}", path.display()),
        Err(e) => eprintln!("could not write {}: {e}", path.display()),
    }
}
