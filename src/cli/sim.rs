//! `kpssh sim`: the deterministic capacity and savings planner. Runs the real controller
//! against simulated hosts and an in-memory API on a paused clock (`docs/simulation.md`).

use std::io::IsTerminal;
use std::path::PathBuf;

use anyhow::Context as _;
use clap::Args;

use crate::sim::run::{RunOptions, Summary, run_blocking};
use crate::sim::scenario::Scenario;
use crate::sim::{generate, report};

#[derive(Args, Debug, Clone)]
pub struct SimArgs {
    /// Scenario file (YAML); without it the built-in scenario runs (a few hundred hosts, a
    /// virtual day of diurnal demand with bursts and a few faults).
    #[arg(long, value_name = "FILE", conflicts_with = "random_scenario")]
    pub scenario: Option<PathBuf>,
    /// Draw a whole scenario from SEED (fleet, demand shapes, NodePools, faults); the run's
    /// seed is SEED too unless `--seed` is given. `--print-scenario` shows what was drawn.
    #[arg(long, value_name = "SEED")]
    pub random_scenario: Option<u64>,
    /// Print the scenario as YAML on stdout and exit without running it: a drawn scenario
    /// becomes a file that `--scenario` replays exactly (same trace hash).
    #[arg(long)]
    pub print_scenario: bool,
    /// Seed of every random draw (default: the scenario's `seed`).
    #[arg(long)]
    pub seed: Option<u64>,
    /// Write the summary as JSON to FILE (`-` for stdout).
    #[arg(long, value_name = "FILE")]
    pub json: Option<PathBuf>,
    /// Write a self-contained HTML report to FILE.
    #[arg(long, value_name = "FILE.html")]
    pub report: Option<PathBuf>,
    /// Write the full trace (one line per API event and host action) to FILE.
    #[arg(long, value_name = "FILE")]
    pub trace: Option<PathBuf>,
    /// No progress bar (there is none either when stderr is not a terminal: `\r` frames
    /// would fill a redirected log).
    #[arg(long, short)]
    pub quiet: bool,
}

pub fn run(args: SimArgs) -> anyhow::Result<i32> {
    let (scenario, base_dir) = match &args.scenario {
        Some(path) => {
            let text = std::fs::read_to_string(path)
                .with_context(|| format!("reading {}", path.display()))?;
            let sc = Scenario::from_yaml(&text)
                .map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
            (sc, path.parent().map(PathBuf::from))
        }
        None => match args.random_scenario {
            Some(seed) => (generate::random_scenario(seed), None),
            None => (Scenario::builtin(), None),
        },
    };
    if args.print_scenario {
        print!("{}", scenario_yaml(&scenario)?);
        return Ok(0);
    }
    let seed = args.seed.unwrap_or(scenario.seed);
    let opts = RunOptions {
        keep_trace: args.trace.is_some(),
        timeline: args.report.is_some(),
        progress: progress_bar(args.quiet, std::io::stderr().is_terminal()),
        base_dir,
    };
    // The simulation needs its own paused, single-threaded runtime: run it on a thread of
    // its own so that it is not nested in the command's runtime.
    let handle = std::thread::Builder::new()
        .name("kpssh-sim".into())
        .spawn(move || run_blocking(&scenario, seed, &opts))
        .context("starting the simulation thread")?;
    let outcome = handle
        .join()
        .map_err(|_| anyhow::anyhow!("the simulation panicked"))?
        .map_err(|e| anyhow::anyhow!(e))?;
    let s = &outcome.summary;
    print!("{}", table(s));
    if let Some(path) = &args.json {
        let text = serde_json::to_string_pretty(s)? + "\n";
        if path.as_os_str() == "-" {
            print!("{text}");
        } else {
            std::fs::write(path, text).with_context(|| format!("writing {}", path.display()))?;
        }
    }
    if let Some(path) = &args.report {
        std::fs::write(path, report::html(s, &outcome.timeline))
            .with_context(|| format!("writing {}", path.display()))?;
    }
    if let Some(path) = &args.trace {
        let mut text = outcome.trace.join("\n");
        text.push('\n');
        std::fs::write(path, text).with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(if s.invariant_violations.is_empty() {
        0
    } else {
        3
    })
}

/// The scenario as a file `--scenario` reads back to the same scenario.
pub fn scenario_yaml(scenario: &Scenario) -> anyhow::Result<String> {
    let body = serde_yaml::to_string(scenario).context("writing the scenario as YAML")?;
    Ok(format!(
        "# kpssh sim scenario {:?} (replay: kpssh sim --scenario FILE)\n{body}",
        scenario.name
    ))
}

/// The summary table printed on stdout.
pub fn table(s: &Summary) -> String {
    let p = &s.pending_to_running_seconds;
    let saving = if s.always_attached_cost > 0.0 {
        100.0 * (1.0 - s.cost / s.always_attached_cost)
    } else {
        0.0
    };
    let faults = s
        .faults_injected
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join(" ");
    let rows: Vec<(&str, String)> = vec![
        ("scenario", s.scenario.clone()),
        ("seed", s.seed.to_string()),
        ("hosts", s.hosts.to_string()),
        ("virtual hours", format!("{:.1}", s.virtual_hours)),
        ("wall seconds", format!("{:.1}", s.wall_seconds)),
        ("NodeClaims created", s.nodeclaims_created.to_string()),
        (
            "joins warm / cold",
            format!("{} / {}", s.joins_warm, s.joins_cold),
        ),
        ("leaves", s.leaves.to_string()),
        ("launch failures", s.launch_failures.to_string()),
        (
            "pods held by limits",
            s.provisioning_blocked_by_limits.to_string(),
        ),
        ("zombies cleaned", s.zombies_cleaned.to_string()),
        (
            "NodeClaim -> running (s)",
            format!("p50 {:.0}  p95 {:.0}  p99 {:.0}", p.p50, p.p95, p.p99),
        ),
        (
            "attached vCPU-hours",
            format!(
                "{:.1} of {:.1} always attached",
                s.attached_vcpu_hours, s.always_attached_vcpu_hours
            ),
        ),
        (
            "cost",
            format!(
                "{:.2} vs {:.2} always attached ({saving:.0}% saved)",
                s.cost, s.always_attached_cost
            ),
        ),
        (
            "API writes",
            format!(
                "{} ({:.2} per host-hour)",
                s.api_writes, s.api_writes_per_host_hour
            ),
        ),
        ("SSH sessions opened", s.ssh_sessions_opened.to_string()),
        (
            "faults injected",
            if faults.is_empty() {
                "none".into()
            } else {
                faults
            },
        ),
        (
            "invariant violations",
            s.invariant_violations.len().to_string(),
        ),
        ("trace hash", s.trace_hash.clone()),
    ];
    let mut out = String::new();
    for (k, v) in rows {
        out.push_str(&format!("{k:<26} {v}\n"));
    }
    for v in &s.invariant_violations {
        out.push_str(&format!(
            "  VIOLATION {} at {}s: {}\n",
            v.invariant, v.at_seconds, v.message
        ));
    }
    out
}

/// Whether `kpssh sim` draws its progress bar: only on a terminal, and not with `--quiet`.
fn progress_bar(quiet: bool, stderr_is_terminal: bool) -> bool {
    !quiet && stderr_is_terminal
}

#[cfg(test)]
mod progress_tests {
    use super::progress_bar;

    #[test]
    fn the_progress_bar_is_drawn_only_on_a_terminal() {
        assert!(progress_bar(false, true));
        assert!(
            !progress_bar(false, false),
            "redirected stderr gets no \\r frames"
        );
        assert!(!progress_bar(true, true));
    }
}
