//! #23: a phase never outlives its timeout on the host, and two phases never overlap there,
//! through real OpenSSH `sshd` and the real transport.
//!
//! - Verified: the envelope carries the phase timeout; the shim's watchdog kills the script's
//!   process group when it runs out, even after the controller gave up (OpenSSH refuses the
//!   controller's `signal` request for root sessions, and the shim does not notice its channel
//!   closing). The shim holds the host's phase lock while a phase runs.
//! - Raw: the preamble takes the host's phase lock; a timed-out phase is killed through the
//!   transport's run marker, after which the next phase runs. The script is read whole
//!   before it runs, so a command reading stdin cannot swallow the rest of it.

#[path = "support/sshd.rs"]
mod sshd;

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use kpssh::profile::env::Env;
use kpssh::profile::raw::{EXIT_BUSY, PhaseLock, build_raw_plan};
use kpssh::profile::verified::sshsig::allowed_signers_line;
use kpssh::profile::verified::{
    Expires, Params, Phase, PhaseRequest, PhaseSignatures, ProfileRef, TrustedSigners, exit,
    manifest_v2, prepare,
};
use kpssh::secret::Secret;
use kpssh::ssh::{
    CommandOutput, HostKeyPin, HostTarget, RemoteCommand, RusshTransport, Transport,
    TransportConfig, TransportError,
};
use sshd::{KeyPair, Sshd, SshdOptions, keygen};

fn shim() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("shim/kpssh-shim")
}

fn target(sshd: &Sshd, key: &KeyPair) -> HostTarget {
    HostTarget {
        host: format!("kpssh-system/{}", sshd.address),
        address: sshd.address.clone(),
        port: sshd.port,
        user: "root".into(),
        key: Secret::new(key.private.clone()),
        pin: HostKeyPin::TrustOnFirstUse,
        jump: None,
    }
}

fn transport() -> RusshTransport {
    RusshTransport::new(TransportConfig::default())
}

fn pid_alive(pid: u32) -> bool {
    Path::new(&format!("/proc/{pid}")).exists()
        && !std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .unwrap_or_default()
            .contains(") Z ")
}

/// Waits (bounded) until `path` holds a pid, and returns it.
fn read_pid(path: &Path) -> u32 {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if let Some(pid) = std::fs::read_to_string(path)
            .ok()
            .and_then(|s| s.trim().parse().ok())
        {
            return pid;
        }
        assert!(
            Instant::now() < deadline,
            "{} never written",
            path.display()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A Verified host: sshd whose ForceCommand is the shim, with its own allowed signers, state
/// dir and lock.
struct VerifiedHost {
    sshd: Sshd,
    client: KeyPair,
    signer: KeyPair,
    dir: PathBuf,
}

impl VerifiedHost {
    fn start() -> VerifiedHost {
        let dir = tempfile::tempdir().expect("tempdir").keep();
        let signer = keygen(&dir, "signer", "ed25519", None);
        let line = allowed_signers_line(&signer.public).expect("allowed line");
        std::fs::write(dir.join("allowed_signers"), format!("{line}\n")).expect("write");
        for d in ["state", "tmp", "out"] {
            std::fs::create_dir_all(dir.join(d)).expect("mkdir");
        }
        let sshd = Sshd::start_with(SshdOptions {
            extra: vec![format!(
                "ForceCommand env TMPDIR={d}/tmp {shim} --allowed-signers {d}/allowed_signers --state-dir {d}/state",
                d = dir.display(),
                shim = shim().display()
            )],
            ..SshdOptions::default()
        });
        let client = keygen(sshd.dir.path(), "client", "ed25519", None);
        sshd.authorize(&client.public);
        VerifiedHost {
            sshd,
            client,
            signer,
            dir,
        }
    }

    fn out(&self, name: &str) -> PathBuf {
        self.dir.join("out").join(name)
    }

    /// The controller's command for `script` as phase `phase` of `demo@1`, with `timeout`.
    fn command(&self, phase: Phase, script: &str, timeout: Duration) -> RemoteCommand {
        let profile: ProfileRef = "demo@1".parse().expect("profile");
        let expires =
            Expires::from_timestamp(jiff::Timestamp::now() + jiff::SignedDuration::from_hours(1))
                .expect("expires");
        let manifest = manifest_v2(phase, &profile, script.as_bytes(), &expires);
        let sig = self.signer.sign("kpssh", manifest.as_bytes());
        let trusted = TrustedSigners::parse(&[self.signer.public.as_str()]).expect("trusted");
        let mut params = Params::new();
        params
            .insert("KPSSH_OUT", self.dir.join("out").to_string_lossy())
            .expect("param");
        let run = prepare(
            &trusted,
            PhaseRequest {
                phase,
                profile,
                script,
                signatures: PhaseSignatures {
                    v1: None,
                    v2: Some((expires.to_string(), sig)),
                },
                params,
                shim_command: "/opt/kpssh/kpssh-shim",
                allow_v1: false,
                timeout: Some(timeout),
            },
            jiff::Timestamp::now(),
        )
        .expect("prepare");
        // The controller's own bound on the call is the same timeout.
        RemoteCommand::verbatim(run.command, timeout).with_stdin(run.stdin)
    }
}

impl Drop for VerifiedHost {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn stderr(out: &CommandOutput) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// The shim's watchdog kills a phase that outlives the envelope's timeout, although the
/// controller's transport gave up first and the host ignored its signal. Before the watchdog,
/// the script ran on for its full 30 seconds.
#[tokio::test]
async fn verified_phase_outliving_its_timeout_is_killed_on_the_host() {
    let host = VerifiedHost::start();
    let t = transport();
    let tg = target(&host.sshd, &host.client);
    let script = "#!/usr/bin/env bash\nset -euo pipefail\necho $$ > \"$KPSSH_OUT/pid\"\nsleep 30\ntouch \"$KPSSH_OUT/finished\"\n";
    let mut cmd = host.command(Phase::Join, script, Duration::from_secs(3));
    // The controller gives up after one second; the envelope still says three.
    cmd.timeout = Duration::from_secs(1);
    let started = Instant::now();
    let err = t.exec(&tg, cmd).await.expect_err("times out");
    assert!(
        matches!(err, TransportError::CommandTimeout { .. }),
        "{err}"
    );
    let pid = read_pid(&host.out("pid"));
    assert!(
        pid_alive(pid),
        "the script should still run right after the controller gave up"
    );
    let deadline = started + Duration::from_secs(15);
    while pid_alive(pid) {
        assert!(
            Instant::now() < deadline,
            "the script (pid {pid}) still runs {:?} after it started, its timeout was 3 s",
            started.elapsed()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        started.elapsed() >= Duration::from_secs(3),
        "killed before its timeout: {:?}",
        started.elapsed()
    );
    assert!(!host.out("finished").exists());
    // The lock went with it: the next phase runs at once.
    let quick = host.command(
        Phase::Leave,
        "#!/usr/bin/env bash\nset -euo pipefail\ntouch \"$KPSSH_OUT/left\"\n",
        Duration::from_secs(20),
    );
    let out = t.exec(&tg, quick).await.expect("leave");
    assert_eq!(out.exit_status, 0, "{}", stderr(&out));
    assert!(host.out("left").exists());

    // When the controller waits as long as the envelope says, the shim reports the kill.
    let mut cmd = host.command(Phase::Join, script, Duration::from_secs(2));
    cmd.timeout = Duration::from_secs(20);
    let out = t.exec(&tg, cmd).await.expect("exec");
    assert_eq!(out.exit_status, exit::TIMEOUT as u32, "{}", stderr(&out));
    assert!(
        stderr(&out).contains("outlived its 2s timeout"),
        "{}",
        stderr(&out)
    );
}

/// A second phase on a Verified host waits for the one running, or is refused (exit 8) when it
/// cannot wait long enough; the two never overlap.
#[tokio::test]
async fn verified_phases_never_overlap() {
    let host = VerifiedHost::start();
    let t = std::sync::Arc::new(transport());
    let tg = target(&host.sshd, &host.client);
    let log = host.out("log");
    let step = |name: &str, secs: u32| {
        format!(
            "#!/usr/bin/env bash\nset -euo pipefail\necho {name}-start >> \"$KPSSH_OUT/log\"\nsleep {secs}\necho {name}-end >> \"$KPSSH_OUT/log\"\n"
        )
    };
    let first = host.command(Phase::Install, &step("a", 3), Duration::from_secs(30));
    let second = host.command(Phase::Join, &step("b", 0), Duration::from_secs(30));
    let (t1, tg1) = (t.clone(), tg.clone());
    let running = tokio::spawn(async move { t1.exec(&tg1, first).await });
    tokio::time::sleep(Duration::from_millis(800)).await;
    let out = t.exec(&tg, second).await.expect("second");
    assert_eq!(out.exit_status, 0, "{}", stderr(&out));
    assert!(
        stderr(&out).contains("another phase is running"),
        "{}",
        stderr(&out)
    );
    let first = running.await.expect("join").expect("first");
    assert_eq!(first.exit_status, 0, "{}", stderr(&first));
    assert_eq!(
        std::fs::read_to_string(&log).expect("log"),
        "a-start\na-end\nb-start\nb-end\n",
        "the phases overlapped"
    );

    // A phase that can wait only 1 s (half its 2 s timeout) is refused.
    std::fs::remove_file(&log).expect("rm");
    let first = host.command(Phase::Install, &step("a", 5), Duration::from_secs(30));
    let impatient = host.command(Phase::Join, &step("c", 0), Duration::from_secs(2));
    let (t1, tg1) = (t.clone(), tg.clone());
    let running = tokio::spawn(async move { t1.exec(&tg1, first).await });
    tokio::time::sleep(Duration::from_millis(800)).await;
    let mut impatient = impatient;
    impatient.timeout = Duration::from_secs(20);
    let out = t.exec(&tg, impatient).await.expect("impatient");
    assert_eq!(out.exit_status, exit::BUSY as u32, "{}", stderr(&out));
    assert!(stderr(&out).contains("join refused"), "{}", stderr(&out));
    running.await.expect("join").expect("first");
    assert!(
        !std::fs::read_to_string(&log)
            .expect("log")
            .contains("c-start")
    );
}

/// Raw mode: the same lock through `bash -s` on a real host, and a Raw phase the controller
/// timed out is killed through its run marker, after which the next phase takes the lock.
#[tokio::test]
async fn raw_phases_never_overlap_and_a_timed_out_one_frees_the_lock() {
    let sshd = Sshd::start();
    let key = keygen(sshd.dir.path(), "client", "ed25519", None);
    sshd.authorize(&key.public);
    let t = std::sync::Arc::new(transport());
    let tg = target(&sshd, &key);
    let dir = tempfile::tempdir().expect("tempdir");
    let lock = |wait_secs| PhaseLock {
        path: dir.path().join("phase.lock").to_string_lossy().into_owned(),
        wait_secs,
    };
    let log = dir.path().join("log");
    let cmd = |name: &str, secs: u32, wait: u64, timeout: u64| {
        let script = format!(
            "echo {name}-start >> '{log}'\nsleep {secs}\necho {name}-end >> '{log}'\n",
            log = log.display()
        );
        let plan =
            build_raw_plan(&Env::new(), script.as_bytes(), "root", &lock(wait)).expect("plan");
        RemoteCommand::new(plan.command, Duration::from_secs(timeout)).with_stdin(plan.stdin)
    };
    // Waits, then runs after the first.
    let (t1, tg1, first) = (t.clone(), tg.clone(), cmd("a", 3, 1, 30));
    let running = tokio::spawn(async move { t1.exec(&tg1, first).await });
    tokio::time::sleep(Duration::from_millis(800)).await;
    let out = t.exec(&tg, cmd("b", 0, 10, 30)).await.expect("second");
    assert_eq!(out.exit_status, 0, "{}", stderr(&out));
    running.await.expect("join").expect("first");
    assert_eq!(
        std::fs::read_to_string(&log).expect("log"),
        "a-start\na-end\nb-start\nb-end\n"
    );
    // Refused after its wait.
    let (t1, tg1, first) = (t.clone(), tg.clone(), cmd("c", 4, 1, 30));
    let running = tokio::spawn(async move { t1.exec(&tg1, first).await });
    tokio::time::sleep(Duration::from_millis(800)).await;
    let out = t.exec(&tg, cmd("d", 0, 1, 30)).await.expect("refused");
    assert_eq!(out.exit_status, EXIT_BUSY, "{}", stderr(&out));
    running.await.expect("join").expect("first");
    // Timed out: the transport kills it on the host, and the next phase does not wait for it.
    let err = t
        .exec(&tg, cmd("e", 30, 1, 1))
        .await
        .expect_err("times out");
    assert!(
        matches!(err, TransportError::CommandTimeout { .. }),
        "{err}"
    );
    let started = Instant::now();
    let out = t.exec(&tg, cmd("f", 0, 10, 30)).await.expect("next");
    assert_eq!(out.exit_status, 0, "{}", stderr(&out));
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "waited {:?}",
        started.elapsed()
    );
    let text = std::fs::read_to_string(&log).expect("log");
    assert!(
        !text.contains("d-start") && !text.contains("e-end"),
        "{text}"
    );
}

/// Processes (pid, command name) holding an open file description of `path`.
fn holders(path: &Path) -> Vec<(u32, String)> {
    let mut found = vec![];
    for entry in std::fs::read_dir("/proc").expect("/proc").flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let Ok(fds) = std::fs::read_dir(entry.path().join("fd")) else {
            continue;
        };
        if fds
            .flatten()
            .any(|fd| std::fs::read_link(fd.path()).is_ok_and(|l| l == path))
        {
            let comm = std::fs::read_to_string(entry.path().join("comm")).unwrap_or_default();
            found.push((pid, comm.trim().to_string()));
        }
    }
    found
}

/// The phase lock is held by the shim and its watchdog shell only, never by the watchdog's
/// `sleep`: a phase that ended while its watchdog was starting left that `sleep` (and with it
/// the lock) behind for the whole phase timeout, and the next phase waited half its own timeout
/// and was refused as busy (S62's sudo test failed that way about one run in five). Checked
/// while a phase runs, then over back-to-back quick phases.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_the_shim_and_its_watchdog_hold_the_phase_lock() {
    let host = VerifiedHost::start();
    let t = std::sync::Arc::new(transport());
    let tg = target(&host.sshd, &host.client);
    let lock = host.dir.join("state/phase.lock");
    let slow = "echo $$ > \"$KPSSH_OUT/slow.pid\"\nsleep 3\n";
    let cmd = host.command(Phase::Join, slow, Duration::from_secs(60));
    let run = tokio::spawn({
        let t = t.clone();
        let tg = tg.clone();
        async move { t.exec(&tg, cmd).await }
    });
    read_pid(&host.out("slow.pid"));
    // The watchdog started with the script; give it a moment to be in its sleep.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let held = holders(&lock);
    assert!(!held.is_empty(), "the running phase holds the lock");
    assert!(
        held.iter().all(|(_, comm)| comm != "sleep"),
        "a sleep holds the phase lock: {held:?}"
    );
    let out = run.await.expect("join").expect("exec");
    assert_eq!(out.exit_status, 0, "{}", stderr(&out));

    for i in 0..25 {
        let cmd = host.command(Phase::Join, "true\n", Duration::from_secs(20));
        let started = Instant::now();
        let out = t
            .exec(&tg, cmd)
            .await
            .unwrap_or_else(|e| panic!("phase {i}: {e}; lock held by {:?}", holders(&lock)));
        assert_eq!(out.exit_status, 0, "phase {i}: {}", stderr(&out));
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "phase {i} waited for the lock: {}",
            stderr(&out)
        );
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    let left: Vec<_> = holders(&lock)
        .into_iter()
        .filter(|(_, comm)| comm == "sleep")
        .collect();
    assert!(left.is_empty(), "sleeps left holding the lock: {left:?}");
}

/// #23: Raw mode under `bash -s` on a real host. A command of the script that reads stdin
/// (`cat`, `read`, `head`, an installer asking a question) gets end-of-file and cannot swallow
/// the rest of the script: every line runs, in order, and the phase's exit status is the
/// script's (before, `cat` ate the lines after it and the phase "succeeded" half-run).
#[tokio::test]
async fn raw_script_reading_stdin_runs_whole() {
    let sshd = Sshd::start();
    let key = keygen(sshd.dir.path(), "client", "ed25519", None);
    sshd.authorize(&key.public);
    let t = transport();
    let tg = target(&sshd, &key);
    let dir = tempfile::tempdir().expect("tempdir");
    let log = dir.path().join("log");
    let lock = PhaseLock {
        path: dir.path().join("phase.lock").to_string_lossy().into_owned(),
        wait_secs: 5,
    };
    let script = format!(
        "echo one >> '{log}'\n\
         seen=$(cat)\n\
         echo \"two [$seen]\" >> '{log}'\n\
         read -r line || line=eof\n\
         echo \"three [$line]\" >> '{log}'\n\
         head -c 16 >/dev/null\n\
         echo four >> '{log}'\n\
         exit 5\n",
        log = log.display()
    );
    let plan = build_raw_plan(&Env::new(), script.as_bytes(), "root", &lock).expect("plan");
    let out = t
        .exec(
            &tg,
            RemoteCommand::new(plan.command, Duration::from_secs(20)).with_stdin(plan.stdin),
        )
        .await
        .expect("exec");
    assert_eq!(
        std::fs::read_to_string(&log).unwrap_or_default(),
        "one\ntwo []\nthree [eof]\nfour\n",
        "the whole script ran, its stdin empty: {}",
        stderr(&out)
    );
    assert_eq!(out.exit_status, 5, "the script's own exit status");
}

/// #23 (found by tests/parsers.rs): the watchdog's nap never holds the host's phase lock. A
/// TERM that lands between the watchdog starting its `sleep` and recording its pid (a script
/// that ends at once) leaves that `sleep` behind; holding the lock's fd, it made every later
/// phase on the host wait half its timeout and fail (exit 8) for as long as the timeout. While
/// a phase runs, only the shim and its watchdog shell may hold the lock.
#[test]
fn the_watchdogs_sleep_never_holds_the_phase_lock() {
    let host = VerifiedHost::start();
    let run = host.command(Phase::Join, "sleep 3\n", Duration::from_secs(40));
    let lock = host.dir.join("state").join("phase.lock");
    let mut child = Command::new("/bin/sh")
        .arg(shim())
        .arg("--allowed-signers")
        .arg(host.dir.join("allowed_signers"))
        .arg("--state-dir")
        .arg(host.dir.join("state"))
        .env("TMPDIR", host.dir.join("tmp"))
        .env("SSH_ORIGINAL_COMMAND", &run.command)
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("shim");
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(&run.stdin)
        .expect("envelope");
    // The script is sleeping now; look at who holds the lock file.
    let deadline = Instant::now() + Duration::from_secs(10);
    let holders = loop {
        let holders = holders_of(&lock);
        if holders.len() >= 2 || Instant::now() > deadline {
            break holders;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let out = child.wait_with_output().expect("shim");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!holders.is_empty(), "the running phase holds the lock");
    for (pid, cmd) in &holders {
        assert!(
            !cmd.starts_with("sleep"),
            "process {pid} ({cmd}) holds the phase lock: {holders:?}"
        );
    }
}

/// Processes with `path` open: (pid, command line).
fn holders_of(path: &Path) -> Vec<(u32, String)> {
    let mut found = Vec::new();
    let Ok(procs) = std::fs::read_dir("/proc") else {
        return found;
    };
    for p in procs.flatten() {
        let Ok(pid) = p.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let Ok(fds) = std::fs::read_dir(p.path().join("fd")) else {
            continue;
        };
        if fds
            .flatten()
            .any(|fd| std::fs::read_link(fd.path()).is_ok_and(|t| t == path))
        {
            let cmd = std::fs::read(p.path().join("cmdline")).unwrap_or_default();
            let cmd = String::from_utf8_lossy(&cmd).replace('\0', " ");
            found.push((pid, cmd.trim().to_string()));
        }
    }
    found
}
