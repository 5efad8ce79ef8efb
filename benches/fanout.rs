//! Issue #10 item 2: fleet fan-out over real SSH. N real OpenSSH `sshd` hosts on loopback
//! addresses; the probe runs on every host per sweep, at the same parallelism, by
//! - kpssh warm: one `RusshTransport` whose pooled sessions stay open between sweeps,
//! - kpssh cold: a fresh transport (so a fresh connection to every host) per sweep,
//! - `parallel-ssh` (Debian `pssh`): one `ssh` process per host,
//! - Ansible ad-hoc (`ansible all -m shell`) with `--forks` = the parallelism.
//!
//! `cargo bench --bench fanout` (scripts/bench.sh installs pssh and ansible first). Sizes:
//! `KPSSH_BENCH_HOSTS` (200), `KPSSH_BENCH_PARALLELISM` (32), `KPSSH_BENCH_SWEEPS` (5, for the
//! kpssh and pssh rows), `KPSSH_BENCH_SLOW_SWEEPS` (2 warm Ansible sweeps after its first).

#[path = "support/heap.rs"]
mod heap;
#[path = "support/report.rs"]
mod report;
#[path = "../tests/support/sshd.rs"]
mod sshd;

use std::fmt::Write as _;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use futures::StreamExt;
use kpssh::secret::Secret;
use kpssh::ssh::probe::PROBE_SCRIPT;
use kpssh::ssh::{HostKeyPin, HostTarget, RusshTransport, Transport, TransportConfig};
use report::{Mode, Target, median, secs};
use serde_json::json;

/// Bound on one external sweep (pssh or Ansible); a hung tool fails the run.
const EXTERNAL_SWEEP_LIMIT: Duration = Duration::from_secs(900);

struct Fleet {
    user: &'static str,
    hosts: Vec<sshd::Sshd>,
    _keys: tempfile::TempDir,
    key: sshd::KeyPair,
    work: tempfile::TempDir,
}

struct Row {
    tool: &'static str,
    what: String,
    sweeps: Vec<Duration>,
}

#[global_allocator]
static ALLOC: heap::Counting = heap::Counting;

fn main() {
    let mode = Mode::detect();
    let n = mode.pick("KPSSH_BENCH_HOSTS", 200, 3);
    let par = mode.pick("KPSSH_BENCH_PARALLELISM", 32, 2).max(1);
    let sweeps = mode.pick("KPSSH_BENCH_SWEEPS", 5, 1).max(1);
    let slow_sweeps = mode.pick("KPSSH_BENCH_SLOW_SWEEPS", 2, 1).max(1);
    raise_fd_limit();
    println!(
        "fan-out: {n} sshd hosts, parallelism {par}, {sweeps} sweeps ({slow_sweeps} for Ansible)"
    );

    let started = Instant::now();
    // A plain account (login shell /bin/sh): root's ~/.bashrc on a developer machine may run
    // slow initialisation (pyenv init costs ~0.4 s here) that every tool would pay per command.
    let user = sshd::ensure_test_user();
    let fleet = start_fleet(n, user);
    println!(
        "started {n} sshd in {:.1}s",
        started.elapsed().as_secs_f64()
    );

    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("tokio runtime");
    let targets = targets(&fleet);

    let mut rows = vec![];
    // Cold: a new transport per sweep, so every probe dials, exchanges keys and authenticates.
    let mut cold = vec![];
    for _ in 0..sweeps {
        cold.push(rt.block_on(async {
            let t = RusshTransport::new(TransportConfig::default());
            let took = sweep(&t, &targets, par).await;
            drop(t);
            // Let the closed sessions' sshd children exit before the next measurement.
            tokio::time::sleep(Duration::from_millis(500)).await;
            took
        }));
    }
    // Warm: one transport; the first sweep fills its pool (not counted), the rest reuse it.
    let mut per_session = 0.0;
    let warm = rt.block_on(async {
        let t = RusshTransport::new(TransportConfig::default());
        let before = heap::live();
        sweep(&t, &targets, par).await;
        assert_eq!(t.pooled_connections(), n, "one pooled connection per host");
        // What the open, idle pooled sessions hold once the sweep's own work is freed.
        tokio::time::sleep(Duration::from_millis(200)).await;
        per_session = (heap::live() - before) as f64 / n as f64;
        let mut v = vec![];
        for _ in 0..sweeps {
            v.push(sweep(&t, &targets, par).await);
        }
        assert_eq!(
            t.pooled_connections(),
            n,
            "warm sweeps reuse the pooled connections"
        );
        v
    });
    rows.push(Row {
        tool: "kpssh-warm",
        what: "RusshTransport, pooled sessions (pool filled by an uncounted sweep)".into(),
        sweeps: warm,
    });
    rows.push(Row {
        tool: "kpssh-cold",
        what: "RusshTransport, fresh connection per host each sweep".into(),
        sweeps: cold,
    });

    let mut external = true;
    if mode == Mode::Full {
        rows.push(Row {
            tool: "pssh",
            what: "parallel-ssh -p P, one ssh process per host".into(),
            sweeps: (0..sweeps).map(|_| pssh_sweep(&fleet, par)).collect(),
        });
        // Ansible keeps ssh ControlPersist masters for 60 s: its first sweep connects, the
        // following ones reuse the masters (its own "warm" case).
        let first = ansible_sweep(&fleet, par);
        rows.push(Row {
            tool: "ansible-warm",
            what: "ansible all -m shell -f P, pipelining, ControlPersist masters alive".into(),
            sweeps: (0..slow_sweeps)
                .map(|_| ansible_sweep(&fleet, par))
                .collect(),
        });
        rows.push(Row {
            tool: "ansible-cold",
            what: "the same, first sweep (no ControlPersist master yet)".into(),
            sweeps: vec![first],
        });
    } else {
        external = false;
    }

    let base = median(&rows[0].sweeps).as_secs_f64().max(1e-6);
    let table: Vec<Vec<String>> = rows
        .iter()
        .map(|r| {
            let m = median(&r.sweeps);
            let min = r.sweeps.iter().min().copied().unwrap_or_default();
            vec![
                r.tool.to_string(),
                r.sweeps.len().to_string(),
                format!("{:.3}", secs(m)),
                format!("{:.3}", secs(min)),
                format!("{:.2}", m.as_secs_f64() * 1000.0 / n as f64),
                format!("{:.1}x", m.as_secs_f64() / base),
            ]
        })
        .collect();
    println!(
        "controller memory per open SSH session (live heap, {n} pooled sessions): {:.1} KiB",
        per_session / 1024.0
    );
    report::print_table(
        &format!("fan-out sweep over {n} hosts at parallelism {par} (wall time)"),
        &[
            "tool",
            "sweeps",
            "median s",
            "min s",
            "ms/host",
            "vs kpssh-warm",
        ],
        &table,
    );
    let med = |tool: &str| {
        rows.iter()
            .find(|r| r.tool == tool)
            .map(|r| median(&r.sweeps).as_secs_f64())
    };
    let mut targets = vec![];
    if let (Some(w), Some(c), Some(p), Some(a)) = (
        med("kpssh-warm"),
        med("kpssh-cold"),
        med("pssh"),
        med("ansible-warm"),
    ) {
        targets.push(Target {
            name: "pssh / kpssh-warm".into(),
            measured: p / w,
            bound: 3.0,
            at_least: true,
        });
        targets.push(Target {
            name: "ansible-warm / kpssh-warm".into(),
            measured: a / w,
            bound: 10.0,
            at_least: true,
        });
        targets.push(Target {
            name: "pssh / kpssh-cold".into(),
            measured: p / c,
            bound: 1.0,
            at_least: true,
        });
        report::print_targets(&targets);
    }
    report::write_json(
        mode,
        "fanout",
        json!({
            "benchmark": "fanout",
            "hosts": n,
            "parallelism": par,
            "external_tools_run": external,
            "memory_per_open_session_bytes": per_session.round(),
            "rows": rows.iter().map(|r| json!({
                "tool": r.tool,
                "what": r.what,
                "sweeps_s": r.sweeps.iter().map(|d| secs(*d)).collect::<Vec<_>>(),
                "median_s": secs(median(&r.sweeps)),
                "ratio_to_kpssh_warm": median(&r.sweeps).as_secs_f64() / base,
            })).collect::<Vec<_>>(),
            "targets": targets.iter().map(Target::json).collect::<Vec<_>>(),
        }),
    );
    drop(fleet);
}

/// Open files: every pooled session and every sshd listener holds descriptors.
fn raise_fd_limit() {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: plain syscalls on a local struct.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) == 0 {
            lim.rlim_cur = lim.rlim_max;
            libc::setrlimit(libc::RLIMIT_NOFILE, &lim);
        }
    }
}

fn start_fleet(n: usize, user: &'static str) -> Fleet {
    let keys = tempfile::tempdir().expect("tempdir");
    let key = sshd::keygen(keys.path(), "client", "ed25519", None);
    let hosts: Vec<sshd::Sshd> = (0..n)
        .map(|_| {
            // The test harness's sshd (LogLevel DEBUG1): every tool pays the same logging.
            let h = sshd::Sshd::start();
            h.authorize(&key.public);
            h
        })
        .collect();
    let work = tempfile::tempdir().expect("tempdir");
    // known_hosts for the OpenSSH-based tools: the same pins kpssh uses.
    let mut known = String::new();
    for h in &hosts {
        let _ = writeln!(known, "{} {}", h.known_hosts_name(), h.host_public_key());
    }
    std::fs::write(work.path().join("known_hosts"), known).expect("known_hosts");
    Fleet {
        user,
        hosts,
        _keys: keys,
        key,
        work,
    }
}

fn targets(fleet: &Fleet) -> Vec<HostTarget> {
    fleet
        .hosts
        .iter()
        .enumerate()
        .map(|(i, h)| {
            let mut t = HostTarget::new(
                format!("bench/h{i:04}"),
                h.address.clone(),
                Secret::new(fleet.key.private.clone()),
            );
            t.port = h.port;
            t.user = fleet.user.to_string();
            t.pin = HostKeyPin::Fingerprint(h.fingerprint());
            t
        })
        .collect()
}

/// Probe every host, `par` at a time; every probe must succeed.
async fn sweep(t: &RusshTransport, targets: &[HostTarget], par: usize) -> Duration {
    let start = Instant::now();
    let results: Vec<_> = futures::stream::iter(targets)
        .map(|target| t.probe(target, None))
        .buffer_unordered(par)
        .collect()
        .await;
    let took = start.elapsed();
    for r in &results {
        if let Err(e) = r {
            panic!("probe failed: {e}");
        }
    }
    took
}

fn ssh_options(fleet: &Fleet) -> Vec<String> {
    let kh = fleet.work.path().join("known_hosts");
    vec![
        format!("UserKnownHostsFile={}", kh.display()),
        "StrictHostKeyChecking=yes".into(),
        "BatchMode=yes".into(),
        "IdentitiesOnly=yes".into(),
        format!("IdentityFile={}", fleet.key.private_path.display()),
    ]
}

fn require(tool: &str) {
    assert!(
        Path::new(tool).exists(),
        "{tool} is missing: run scripts/bench.sh (installs pssh and ansible)"
    );
}

/// Run a command with a bound; returns its wall time and stdout.
fn timed(cmd: &mut Command) -> (Duration, String) {
    let start = Instant::now();
    let child = cmd
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("spawn");
    let pid = child.id();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(child.wait_with_output());
    });
    let out = match rx.recv_timeout(EXTERNAL_SWEEP_LIMIT) {
        Ok(out) => out.expect("wait"),
        Err(_) => {
            // SAFETY: signalling the child we spawned.
            unsafe {
                libc::kill(pid as i32, libc::SIGKILL);
            }
            panic!("{cmd:?} did not finish within {EXTERNAL_SWEEP_LIMIT:?}");
        }
    };
    let took = start.elapsed();
    let stdout = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(
        out.status.success(),
        "{cmd:?} failed ({}): {}\n{}",
        out.status,
        tail(&stdout),
        tail(&String::from_utf8_lossy(&out.stderr))
    );
    (took, stdout)
}

fn tail(s: &str) -> String {
    let lines: Vec<&str> = s.lines().collect();
    lines[lines.len().saturating_sub(20)..].join("\n")
}

fn pssh_sweep(fleet: &Fleet, par: usize) -> Duration {
    const PSSH: &str = "/usr/bin/parallel-ssh";
    require(PSSH);
    let hosts_file = fleet.work.path().join("pssh_hosts");
    let lines: String = fleet
        .hosts
        .iter()
        .map(|h| format!("{}@{}:{}\n", fleet.user, h.address, h.port))
        .collect();
    std::fs::write(&hosts_file, lines).expect("pssh hosts");
    let mut cmd = Command::new(PSSH);
    cmd.arg("-h")
        .arg(&hosts_file)
        .args(["-p", &par.to_string(), "-t", "120"]);
    for o in ssh_options(fleet) {
        cmd.args(["-O", &o]);
    }
    cmd.arg(PROBE_SCRIPT);
    let (took, out) = timed(&mut cmd);
    let ok = out.lines().filter(|l| l.contains("[SUCCESS]")).count();
    assert_eq!(
        ok,
        fleet.hosts.len(),
        "pssh succeeded on every host:\n{out}"
    );
    took
}

fn ansible_sweep(fleet: &Fleet, par: usize) -> Duration {
    const ANSIBLE: &str = "/usr/bin/ansible";
    require(ANSIBLE);
    let dir = fleet.work.path();
    let mut inv = String::from("[fleet]\n");
    for (i, h) in fleet.hosts.iter().enumerate() {
        let _ = writeln!(
            inv,
            "h{i:04} ansible_host={} ansible_port={}",
            h.address, h.port
        );
    }
    let args: Vec<String> = ssh_options(fleet)
        .into_iter()
        .map(|o| format!("-o {o}"))
        .collect();
    let _ = write!(
        inv,
        "[fleet:vars]\nansible_user={}\nansible_python_interpreter=/usr/bin/python3\n\
         ansible_ssh_common_args='{}'\n",
        fleet.user,
        args.join(" ")
    );
    let inventory = dir.join("inventory.ini");
    std::fs::write(&inventory, inv).expect("inventory");
    let home = dir.join("ansible-home");
    let mut cmd = Command::new(ANSIBLE);
    cmd.arg("all")
        .arg("-i")
        .arg(&inventory)
        .args(["-m", "shell", "-a", PROBE_SCRIPT, "-f", &par.to_string()])
        .arg("--private-key")
        .arg(&fleet.key.private_path)
        .env("ANSIBLE_HOME", &home)
        .env("ANSIBLE_LOCAL_TEMP", home.join("tmp"))
        .env("ANSIBLE_SSH_CONTROL_PATH_DIR", home.join("cp"))
        .env("ANSIBLE_PIPELINING", "True")
        .env("ANSIBLE_HOST_KEY_CHECKING", "True")
        .env("ANSIBLE_NOCOLOR", "1")
        .env("ANSIBLE_DEPRECATION_WARNINGS", "False");
    let (took, out) = timed(&mut cmd);
    let ok = out.lines().filter(|l| l.contains("| CHANGED |")).count();
    assert_eq!(ok, fleet.hosts.len(), "ansible succeeded on every host");
    took
}
