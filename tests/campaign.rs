//! Fault campaigns over the deterministic simulation (issue #7): many seeds with mixed
//! faults, zero invariant violations; the same seed twice gives one trace hash; `kpssh sim
//! --json` has every key. Random scenarios (issue #24): a whole scenario drawn per seed, from
//! a fixed range that the log prints; a failing one is shrunk and printed as YAML.
//!
//! `KPSSH_CAMPAIGN_SEEDS=5000 cargo test --test campaign -- --nocapture` runs a longer campaign
//! (`KPSSH_CAMPAIGN_FIRST` moves the first seed); `KPSSH_RANDOM_SEEDS=N KPSSH_RANDOM_FIRST=K`
//! sweeps another range of random scenarios.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use kpssh::sim::generate::random_scenario;
use kpssh::sim::run::{RunOptions, Summary, run_blocking};
use kpssh::sim::scenario::{NodeIdentity, Scenario};
use kpssh::sim::shrink::shrink;

/// A small fleet under every fault at once, at rates far above any real fleet's.
const CAMPAIGN: &str = include_str!("../examples/sim/campaign.yaml");
/// Pod demand through a NodePool with a cpu limit, under the same faults.
const POOLS: &str = include_str!("../examples/sim/pools.yaml");

fn env_u64(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// Every seed of the range with the same scenario (see [`campaign_of`]).
fn campaign(scenario: &Scenario, first: u64, seeds: u64) -> Vec<Summary> {
    campaign_of(first, seeds, |_| scenario.clone(), |_| 0)
}

/// `scenario_of(seed)` run with `seed` for each seed of the range, on one thread per core
/// (each simulation is single-threaded and deterministic, so the threads change no trace).
/// The threads take seeds from one shared queue, the most costly first by `cost` (an
/// estimate from the drawn scenario), so that no thread is left alone with a long seed at the
/// end while the other core idles. Summaries come back in seed order.
fn campaign_of(
    first: u64,
    seeds: u64,
    scenario_of: impl Fn(u64) -> Scenario + Sync,
    cost: impl Fn(&Scenario) -> u64,
) -> Vec<Summary> {
    let opts = RunOptions::default();
    let mut queue: Vec<(u64, u64)> = (first..first + seeds)
        .map(|seed| (cost(&scenario_of(seed)), seed))
        .collect();
    // Stable: equal costs keep seed order.
    queue.sort_by_key(|&(c, _)| std::cmp::Reverse(c));
    let lanes = std::thread::available_parallelism()
        .map_or(2, usize::from)
        .min(queue.len().max(1));
    let next = AtomicUsize::new(0);
    let (queue, next, opts, scenario_of) = (&queue, &next, &opts, &scenario_of);
    let mut runs: Vec<Summary> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..lanes)
            .map(|_| {
                s.spawn(move || {
                    let mut out = vec![];
                    while let Some(&(_, seed)) = queue.get(next.fetch_add(1, Ordering::Relaxed)) {
                        let run = run_blocking(&scenario_of(seed), seed, opts)
                            .unwrap_or_else(|e| panic!("seed {seed}: the simulation fails: {e}"));
                        out.push(run.summary);
                    }
                    out
                })
            })
            .collect();
        handles
            .into_iter()
            .flat_map(|h| h.join().expect("lane"))
            .collect()
    });
    runs.sort_by_key(|s| s.seed);
    hashes_to_file(&runs);
    runs
}

/// With `KPSSH_CAMPAIGN_HASHES=FILE`, one line per run is appended to FILE: scenario, seed,
/// trace hash, wall seconds (to check that a change to the simulator left every trace as it
/// was, and to see which seeds cost most).
fn hashes_to_file(runs: &[Summary]) {
    use std::io::Write;
    let Ok(path) = std::env::var("KPSSH_CAMPAIGN_HASHES") else {
        return;
    };
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&path)
        .unwrap_or_else(|e| panic!("{path}: {e}"));
    let mut text = String::new();
    for s in runs {
        text.push_str(&format!(
            "{} {} {} {:.3}\n",
            s.scenario, s.seed, s.trace_hash, s.wall_seconds
        ));
    }
    f.write_all(text.as_bytes())
        .unwrap_or_else(|e| panic!("{path}: {e}"));
}

/// Actor-core bugs this campaign found and that are still open. Each is reported with a
/// reproducing seed; the campaign counts them but fails only on anything else, unless
/// `KPSSH_CAMPAIGN_STRICT=1`. None is open. (Six earlier entries — Node deleted after a failed
/// leave, registration not re-checked, Launched not retried, token orphaned by a failed
/// release, a token outliving a NodeClaim force-deleted during a hung join (seed 34), and a
/// join run over the old kubelet of a host that rebooted while claimed (seed 2340; the
/// launch now probes and leaves first, `s9_kubelet_back_on_claimed_host_leaves_before_join`)
/// — were fixed in the actor core and are no longer tolerated.)
const KNOWN_CORE_BUGS: &[(&str, &str, &str)] = &[];

fn known(v: &str) -> Option<&'static str> {
    KNOWN_CORE_BUGS
        .iter()
        .find(|(inv, pat, _)| v.contains(inv) && v.contains(pat))
        .map(|(_, _, what)| *what)
}

/// A line for the CI log: written to stderr directly, because libtest captures `println!`
/// of a passing test, and the campaign's seeds and faults must show in every run.
fn say(line: &str) {
    use std::io::Write;
    let _ = writeln!(std::io::stderr().lock(), "{line}");
}

fn report(label: &str, runs: &[Summary], wall: Duration) -> Vec<String> {
    let mut faults: BTreeMap<String, u64> = BTreeMap::new();
    for s in runs {
        for (k, v) in &s.faults_injected {
            *faults.entry(k.clone()).or_default() += v;
        }
    }
    let total: u64 = faults.values().sum();
    let claims: u64 = runs.iter().map(|s| s.nodeclaims_created).sum();
    say(&format!(
        "{label}: {} seeds, {total} faults injected ({faults:?}), {claims} NodeClaims, {:.1}s wall",
        runs.len(),
        wall.as_secs_f64()
    ));
    let mut violations = vec![];
    for s in runs {
        for v in &s.invariant_violations {
            violations.push(format!(
                "seed {}: {} at {}s: {}",
                s.seed, v.invariant, v.at_seconds, v.message
            ));
        }
    }
    violations
}

#[test]
fn campaign_of_mixed_faults_holds_every_invariant() {
    let scenario = Scenario::from_yaml(CAMPAIGN).expect("campaign scenario");
    let seeds = env_u64("KPSSH_CAMPAIGN_SEEDS", 200);
    let first = env_u64("KPSSH_CAMPAIGN_FIRST", 1);
    let start = Instant::now();
    let runs = campaign(&scenario, first, seeds);
    let all = report("campaign", &runs, start.elapsed());
    assert!(
        runs.iter().map(Summary::faults_total).sum::<u64>() > seeds * 5,
        "faults were injected"
    );
    let strict = std::env::var("KPSSH_CAMPAIGN_STRICT").is_ok_and(|v| v == "1");
    let mut violations = vec![];
    let mut known_hits: BTreeMap<&str, (usize, String)> = BTreeMap::new();
    for v in all {
        match known(&v) {
            Some(what) if !strict => {
                let e = known_hits.entry(what).or_insert((0, v.clone()));
                e.0 += 1;
            }
            _ => violations.push(v),
        }
    }
    for (what, (n, first)) in &known_hits {
        say(&format!(
            "known actor-core bug, {n} hits: {what}\n  first: {first}"
        ));
    }
    assert!(
        violations.is_empty(),
        "{} violations:\n{}",
        violations.len(),
        violations.join("\n")
    );
}

/// Pod demand (`demand[].pool`): pending pods become NodeClaims through Karpenter's
/// provisioning, the simulated kube-scheduler binds them, consolidation hands empty nodes
/// back, all under every fault. The pool's limit (four nodes) is met — pods are held pending
/// by it in many runs — and never exceeded (`nodepool-limits`), nor any other invariant.
#[test]
fn pod_demand_campaign_holds_nodepool_limits() {
    let scenario = Scenario::from_yaml(POOLS).expect("pools scenario");
    let seeds = env_u64("KPSSH_POOLS_SEEDS", 100);
    let first = env_u64("KPSSH_CAMPAIGN_FIRST", 1);
    let start = Instant::now();
    let runs = campaign(&scenario, first, seeds);
    let violations = report("pod-demand campaign", &runs, start.elapsed());
    let held: u64 = runs.iter().map(|s| s.provisioning_blocked_by_limits).sum();
    let limited = runs
        .iter()
        .filter(|s| s.provisioning_blocked_by_limits > 0)
        .count();
    say(&format!(
        "pod-demand campaign: the NodePool limit held pods pending {held} times, in {limited} of {} runs",
        runs.len()
    ));
    assert!(
        limited * 4 >= runs.len(),
        "the limit must bind in a good share of runs, or the invariant tests nothing"
    );
    assert!(
        runs.iter().map(|s| s.nodeclaims_created).sum::<u64>() > seeds,
        "provisioning created NodeClaims for the pods"
    );
    assert!(
        violations.is_empty(),
        "{} violations:\n{}",
        violations.len(),
        violations.join("\n")
    );
}

/// Adopt mode (S53) under the pod-demand campaign's faults: the kubelets register as nodeadm
/// does on EKS Hybrid, under the machine's own `mi-*` name (the same for every claim of the
/// machine), so nothing may find a Node by its NodeClaim's name. Nodes come and go under
/// those names only, and every invariant holds.
#[test]
fn nodeadm_named_nodes_hold_every_invariant() {
    let mut scenario = Scenario::from_yaml(POOLS).expect("pools scenario");
    for c in &mut scenario.classes {
        c.identity = NodeIdentity::Nodeadm;
    }
    let opts = RunOptions {
        keep_trace: true,
        ..Default::default()
    };
    let (mut added, mut deleted, mut violations) = (0, 0, vec![]);
    for seed in 1..=6 {
        let out = run_blocking(&scenario, seed, &opts).expect("simulation runs");
        for line in &out.trace {
            if let Some(rest) = line.split(" api rv=").nth(1) {
                let mut w = rest.split_whitespace().skip(1);
                let (op, kind, name) = (w.next(), w.next(), w.next().unwrap_or_default());
                if kind == Some("Node") {
                    assert!(name.starts_with("mi-"), "seed {seed}: Node {name}: {line}");
                    added += usize::from(op == Some("A"));
                    deleted += usize::from(op == Some("D"));
                }
            }
        }
        violations.extend((out.summary.invariant_violations.iter()).map(|v| {
            format!(
                "seed {seed}: {} at {}s: {}",
                v.invariant, v.at_seconds, v.message
            )
        }));
    }
    say(&format!(
        "nodeadm names: {added} Node writes, {deleted} deletions over 6 seeds"
    ));
    assert!(
        added > 20 && deleted > 3,
        "Nodes registered and went: {added}, {deleted}"
    );
    assert!(violations.is_empty(), "{}", violations.join("\n"));
}

/// Seeds past the CI range that found actor-core bugs, fixed since: a NodeClaim force-deleted
/// while its join ran kept its token until the next probe (2488), and a token a failed launch
/// could not delete outlived the probe interval while the host stayed unreachable (1139, 1278,
/// 2023).
#[test]
fn regression_seeds_hold_every_invariant() {
    let scenario = Scenario::from_yaml(CAMPAIGN).expect("campaign scenario");
    for seed in [1139, 1278, 2023, 2488] {
        let summary = run_blocking(&scenario, seed, &RunOptions::default())
            .expect("simulation runs")
            .summary;
        assert!(
            summary.faults_total() > 0,
            "seed {seed}: faults were injected"
        );
        assert!(
            summary.invariant_violations.is_empty(),
            "seed {seed}: {:?}",
            summary.invariant_violations
        );
    }
}

/// What a drawn scenario costs to run, roughly (for the order of the queue only): virtual
/// seconds times hosts, times one more than its pod demand entries (every one adds the
/// scheduler, provisioning and disruption over its pods). Over seeds 1–300 this follows the
/// measured wall time with a correlation of 0.77 (hosts times seconds alone: 0.54).
fn expected_cost(sc: &Scenario) -> u64 {
    let pod_demand = sc.demand.iter().filter(|d| d.pool.is_some()).count() as u64;
    sc.duration.as_secs() * sc.hosts() as u64 * (1 + pod_demand)
}

/// Random scenarios (issue #24): each seed of a fixed range draws a whole scenario (fleet,
/// demand shapes, NodePools and limits, every fault kind at its own rate) and runs it; no
/// invariant may break. A failing seed is shrunk to the smallest scenario that still fails,
/// printed as YAML: save it under examples/sim/regress/ once the cause is fixed.
#[test]
fn random_scenarios_hold_every_invariant() {
    let seeds = env_u64("KPSSH_RANDOM_SEEDS", 300);
    let first = env_u64("KPSSH_RANDOM_FIRST", 1);
    say(&format!(
        "random scenarios: seeds {first}..={} (KPSSH_RANDOM_FIRST={first} KPSSH_RANDOM_SEEDS={seeds}; one: kpssh sim --random-scenario SEED)",
        first + seeds - 1
    ));
    let start = Instant::now();
    let runs = campaign_of(first, seeds, random_scenario, expected_cost);
    let violations = report("random scenarios", &runs, start.elapsed());
    let hosts: usize = runs.iter().map(|s| s.hosts).sum();
    let limited = runs
        .iter()
        .filter(|s| s.provisioning_blocked_by_limits > 0)
        .count();
    say(&format!(
        "random scenarios: {hosts} hosts in all, NodePool limits held pods pending in {limited} runs"
    ));
    assert!(
        runs.iter().filter(|s| s.faults_total() > 0).count() * 10 >= runs.len() * 9,
        "faults strike in almost every run"
    );
    if violations.is_empty() {
        return;
    }
    // Shrink the first failing seed of each invariant (a few, to keep the log readable).
    let mut shrunk = BTreeMap::new();
    for s in &runs {
        for v in &s.invariant_violations {
            if shrunk.len() < 3 && !shrunk.contains_key(&v.invariant) {
                let sc = random_scenario(s.seed);
                if let Some(small) = shrink(&sc, s.seed, &v.invariant, 60) {
                    let yaml = kpssh::cli::sim::scenario_yaml(&small.scenario).unwrap_or_default();
                    say(&format!(
                        "seed {} ({}) shrunk in {} runs to:\n{yaml}  -> {} at {}s: {}",
                        s.seed,
                        v.invariant,
                        small.runs,
                        small.violation.invariant,
                        small.violation.at_seconds,
                        small.violation.message
                    ));
                }
                shrunk.insert(v.invariant.clone(), s.seed);
            }
        }
    }
    panic!(
        "{} violations (shrunk scenarios above):\n{}",
        violations.len(),
        violations.join("\n")
    );
}

/// Every regression scenario that a campaign found (examples/sim/regress/, each with the seed
/// it failed with) runs clean.
#[test]
fn regression_files_hold_every_invariant() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/sim/regress");
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .map(|d| d.filter_map(|e| e.ok().map(|e| e.path())).collect())
        .unwrap_or_default();
    files.retain(|p| p.extension().is_some_and(|e| e == "yaml"));
    files.sort();
    let mut failed = vec![];
    for path in &files {
        let text = std::fs::read_to_string(path).expect("read regression scenario");
        let sc = Scenario::from_yaml(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        let summary = run_blocking(&sc, sc.seed, &RunOptions::default())
            .expect("simulation runs")
            .summary;
        for v in summary.invariant_violations {
            failed.push(format!(
                "{}: {} at {}s: {}",
                path.display(),
                v.invariant,
                v.at_seconds,
                v.message
            ));
        }
    }
    say(&format!("regression scenarios: {} files", files.len()));
    assert!(failed.is_empty(), "{}", failed.join("\n"));
}

/// `kpssh sim --random-scenario N --print-scenario` writes a file that `--scenario` replays
/// to the same trace hash as the drawn scenario itself.
#[test]
fn a_printed_random_scenario_replays_exactly() {
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("drawn.yaml");
    let kpssh = |args: &[&str]| {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_kpssh"))
            .args(args)
            .output()
            .expect("kpssh runs");
        assert!(
            out.status.success() || out.status.code() == Some(3),
            "{args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let seed = "11";
    let yaml = kpssh(&["sim", "--random-scenario", seed, "--print-scenario"]);
    assert!(
        yaml.contains("name: random-11") && yaml.contains("seed: 11"),
        "{yaml}"
    );
    std::fs::write(&file, &yaml).expect("write");
    let hash = |table: &str| {
        table
            .lines()
            .find_map(|l| l.strip_prefix("trace hash"))
            .map(|h| h.trim().to_string())
            .unwrap_or_else(|| panic!("no trace hash in {table}"))
    };
    let drawn = hash(&kpssh(&["sim", "-q", "--random-scenario", seed]));
    let file_arg = file.to_string_lossy().into_owned();
    let replayed = hash(&kpssh(&["sim", "-q", "--scenario", &file_arg]));
    assert_eq!(
        drawn, replayed,
        "the printed scenario replays the drawn run"
    );
    let other = hash(&kpssh(&["sim", "-q", "--random-scenario", "12"]));
    assert_ne!(drawn, other, "another seed draws another run");
}

#[test]
fn same_seed_same_trace() {
    // Node demand, and pod demand (with its scheduler and the karpenter layer's provisioning).
    for text in [CAMPAIGN, POOLS] {
        same_trace_twice(&Scenario::from_yaml(text).expect("scenario"), 42);
    }
    // Two joins stopped in one instant (their claims deleted together): the actors went on in
    // an order drawn from tokio's random source (a `watch` channel's wake order), so this
    // seed gave another trace on every run.
    same_trace_twice(&random_scenario(65), 65);
}

fn same_trace_twice(scenario: &Scenario, seed: u64) {
    let opts = RunOptions {
        keep_trace: true,
        ..Default::default()
    };
    let a = run_blocking(scenario, seed, &opts).expect("first run");
    let b = run_blocking(scenario, seed, &opts).expect("second run");
    say(&format!(
        "{}: trace hash {} ({} lines)",
        scenario.name,
        a.summary.trace_hash,
        a.trace.len()
    ));
    assert!(a.trace.len() > 100, "a real trace");
    if a.summary.trace_hash != b.summary.trace_hash {
        let first = a
            .trace
            .iter()
            .zip(&b.trace)
            .position(|(x, y)| x != y)
            .unwrap_or(a.trace.len().min(b.trace.len()));
        panic!(
            "traces differ at line {first}:\n{:?}\n{:?}",
            a.trace.get(first),
            b.trace.get(first)
        );
    }
    let c = run_blocking(scenario, seed + 1, &opts).expect("other seed");
    assert_ne!(
        a.summary.trace_hash, c.summary.trace_hash,
        "the seed matters"
    );
}

#[test]
fn kpssh_sim_json_has_every_key() {
    let dir = tempfile::tempdir().expect("tempdir");
    let scenario = dir.path().join("s.yaml");
    std::fs::write(&scenario, CAMPAIGN).expect("write scenario");
    let json = dir.path().join("out.json");
    let html = dir.path().join("out.html");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_kpssh"))
        .args(["sim", "--quiet", "--seed", "7", "--scenario"])
        .arg(&scenario)
        .arg("--json")
        .arg(&json)
        .arg("--report")
        .arg(&html)
        .output()
        .expect("kpssh runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("trace hash"), "summary table: {stdout}");
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).expect("json written"))
            .expect("valid json");
    for key in [
        "seed",
        "hosts",
        "virtual_hours",
        "wall_seconds",
        "joins_warm",
        "joins_cold",
        "leaves",
        "zombies_cleaned",
        "pending_to_running_seconds",
        "attached_vcpu_hours",
        "always_attached_vcpu_hours",
        "cost",
        "always_attached_cost",
        "api_writes",
        "api_writes_per_host_hour",
        "ssh_sessions_opened",
        "invariant_violations",
        "trace_hash",
    ] {
        assert!(v.get(key).is_some(), "missing key {key} in {v}");
    }
    for p in ["p50", "p95", "p99"] {
        assert!(v["pending_to_running_seconds"].get(p).is_some(), "{p}");
    }
    assert_eq!(v["seed"], 7);
    assert!(v["invariant_violations"].is_array());
    let page = std::fs::read_to_string(&html).expect("report written");
    assert!(
        page.contains("<svg") && !page.contains("<script"),
        "self-contained SVG page"
    );
}
