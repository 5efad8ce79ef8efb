//! The shim's parsing of what a client controls, driven through the real `/bin/sh` (#23):
//! the SSH command line (`SSH_ORIGINAL_COMMAND`) and the envelope on stdin. 10,000 generated
//! cases each, run on a pool of workers (one shim process per case; the cases are generated
//! up front by proptest from a fixed seed, and a failing case is printed whole).
//!
//! Invariants: the exit status is one of the shim's documented refusals (2 signature,
//! 3 parameter, 4 envelope, 5 phase, 6 expired/v1) or 0; a refusal says why on stderr
//! (`kpssh-shim: …`); nothing in the command line is ever executed; exit 0 only for a command
//! line that asks for the envelope's own phase and profile (or nothing, or `probe`), and only
//! for an envelope whose signed lines (version, phase, profile, expiry, script) are the
//! signed ones.

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use kpssh::profile::verified::sshsig::allowed_signers_line;
use kpssh::profile::verified::{
    Expires, Params, Phase, PhaseRequest, PhaseSignatures, ProfileRef, TrustedSigners, manifest_v2,
    prepare,
};
use proptest::prelude::*;
use proptest::strategy::ValueTree as _;
use proptest::test_runner::{Config, TestRunner};

use crate::CASES;
use crate::sshd::keygen;

fn shim() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("shim/kpssh-shim")
}

/// Exit statuses a refusal may have (see the shim's header).
const REFUSALS: [i32; 5] = [2, 3, 4, 5, 6];

struct Host {
    dir: tempfile::TempDir,
    envelope: Vec<u8>,
}

impl Host {
    /// A host directory with allowed signers, and a valid v2 `join` envelope for `demo@1`.
    fn new() -> Host {
        let dir = tempfile::tempdir().expect("tempdir");
        let signer = keygen(dir.path(), "signer", "ed25519", None);
        let line = allowed_signers_line(&signer.public).expect("allowed line");
        std::fs::write(dir.path().join("allowed_signers"), format!("{line}\n")).expect("write");
        // Exits 0 whatever its (unsigned) parameters say: a run that gets this far is one the
        // shim accepted, which is what the properties look at.
        let script = ": \"$KPSSH_NOTE\"\n";
        let profile: ProfileRef = "demo@1".parse().expect("profile");
        let expires =
            Expires::from_timestamp(jiff::Timestamp::now() + jiff::SignedDuration::from_hours(24))
                .expect("expires");
        let manifest = manifest_v2(Phase::Join, &profile, script.as_bytes(), &expires);
        let sig = signer.sign("kpssh", manifest.as_bytes());
        let trusted = TrustedSigners::parse(&[signer.public.as_str()]).expect("trusted");
        let mut params = Params::new();
        params.insert("KPSSH_NOTE", "a note").expect("param");
        let run = prepare(
            &trusted,
            PhaseRequest {
                phase: Phase::Join,
                profile,
                script,
                signatures: PhaseSignatures {
                    v1: None,
                    v2: Some((expires.to_string(), sig)),
                },
                params,
                shim_command: "/opt/kpssh/kpssh-shim",
                allow_v1: false,
                timeout: Some(Duration::from_secs(30)),
            },
            jiff::Timestamp::now(),
        )
        .expect("prepare");
        Host {
            dir,
            envelope: run.stdin,
        }
    }

    /// Runs the shim as its ForceCommand would (worker `w`'s own state, lock and temp dir).
    fn run(&self, w: usize, command: &str, stdin: &[u8]) -> (i32, String) {
        let d = self.dir.path().join(format!("w{w}"));
        let tmp = d.join("tmp");
        std::fs::create_dir_all(&tmp).expect("worker dir");
        let mut child = Command::new("timeout")
            .args(["-k", "5", "60", "/bin/sh"])
            .arg(shim())
            .arg("--no-sudo")
            .arg("--allowed-signers")
            .arg(self.dir.path().join("allowed_signers"))
            .arg("--state-dir")
            .arg(d.join("state"))
            .arg("--lock-file")
            .arg(d.join("phase.lock"))
            .env("SSH_ORIGINAL_COMMAND", command)
            .env("TMPDIR", &tmp)
            .current_dir(&d)
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn the shim");
        let mut input = child.stdin.take().expect("stdin");
        // The shim may stop reading early: a broken pipe is fine.
        let _ = input.write_all(stdin);
        drop(input);
        let out = child.wait_with_output().expect("wait for the shim");
        let code = out.status.code().unwrap_or(-1);
        (code, String::from_utf8_lossy(&out.stderr).into_owned())
    }
}

impl Drop for Host {
    /// A script that ends at once may leave the watchdog's nap (`sleep <timeout>`) behind; it
    /// holds no lock and no pipe, and would end on its own. End those of this run now: they
    /// carry this run's TMPDIR in their environment.
    fn drop(&mut self) {
        let needle = self.dir.path().to_string_lossy().into_owned();
        let Ok(procs) = std::fs::read_dir("/proc") else {
            return;
        };
        for p in procs.flatten() {
            let Ok(pid) = p.file_name().to_string_lossy().parse::<i32>() else {
                continue;
            };
            let environ = std::fs::read(p.path().join("environ")).unwrap_or_default();
            if String::from_utf8_lossy(&environ).contains(&needle) {
                // SAFETY: kill(2) on a pid we just read; no memory is involved.
                unsafe {
                    libc::kill(pid, libc::SIGKILL);
                }
            }
        }
    }
}

/// Generates `CASES` values of `strategy` (deterministic seed) and checks each on a pool of
/// workers; panics listing the first failures.
fn check_all<S, F>(what: &str, strategy: S, check: F)
where
    S: Strategy,
    S::Value: Send + Sync + std::fmt::Debug,
    F: Fn(usize, &S::Value) -> Result<(), String> + Sync,
{
    let mut runner = TestRunner::new_with_rng(
        Config::default(),
        proptest::test_runner::TestRng::deterministic_rng(
            proptest::test_runner::RngAlgorithm::ChaCha,
        ),
    );
    let mut cases: Vec<S::Value> = (0..CASES)
        .map(|_| strategy.new_tree(&mut runner).expect("generate").current())
        .collect();
    // `KPSSH_SHIM_CASE=<n>` re-runs one case of the fixed sequence (as a failure names it).
    if let Some(n) = std::env::var("KPSSH_SHIM_CASE")
        .ok()
        .and_then(|n| n.parse::<usize>().ok())
    {
        cases = cases.into_iter().skip(n).take(1).collect();
    }
    let workers = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(2)
        .clamp(2, 8);
    let started = Instant::now();
    let next = std::sync::atomic::AtomicUsize::new(0);
    let failures = std::sync::Mutex::new(Vec::new());
    std::thread::scope(|s| {
        for w in 0..workers {
            let (next, failures, cases, check) = (&next, &failures, &cases, &check);
            s.spawn(move || {
                loop {
                    let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    let Some(case) = cases.get(i) else { break };
                    if let Err(e) = check(w, case) {
                        // A machine stalled by other work can make a case time out; such a
                        // case must pass when run again, or it counts as a failure.
                        match check(w, case) {
                            Ok(()) => eprintln!("case {i} passed on its second run: {e}"),
                            Err(_) => failures
                                .lock()
                                .expect("lock")
                                .push(format!("case {i} {case:?}: {e}")),
                        }
                    }
                }
            });
        }
    });
    let failures = failures.into_inner().expect("lock");
    eprintln!(
        "{what}: {} cases on {workers} workers in {:.1}s",
        cases.len(),
        started.elapsed().as_secs_f64()
    );
    assert!(
        failures.is_empty(),
        "{what}: {} of {} cases failed; first ones:\n{}",
        failures.len(),
        cases.len(),
        failures
            .iter()
            .take(5)
            .cloned()
            .collect::<Vec<_>>()
            .join("\n")
    );
}

fn refusal(code: i32, stderr: &str) -> Result<(), String> {
    if !REFUSALS.contains(&code) {
        return Err(format!("exit {code} is no documented refusal: {stderr}"));
    }
    if !stderr.starts_with("kpssh-shim: ") || stderr.trim().len() < "kpssh-shim: ".len() + 8 {
        return Err(format!("exit {code} without a clear message: {stderr:?}"));
    }
    Ok(())
}

/// What the shim must make of a command line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Verdict {
    /// `probe`, alone.
    Probe,
    /// Nothing, or a phase with an optional `<profile>@<version>`: the envelope is read next.
    Envelope,
    /// Anything else.
    Refused,
}

fn command_verdict(command: &str) -> Verdict {
    let words: Vec<&str> = command
        .split([' ', '\t', '\n'])
        .filter(|w| !w.is_empty())
        .collect();
    let skip = (words.iter())
        .rposition(|w| *w == "kpssh-shim" || w.ends_with("/kpssh-shim"))
        .map_or(0, |i| i + 1);
    let mut words = &words[skip..];
    if words == ["probe"] {
        return Verdict::Probe;
    }
    if words.first() == Some(&"run") {
        words = &words[1..];
    }
    let phase = |w: &str| ["install", "join", "leave", "uninstall"].contains(&w);
    match words {
        [] => Verdict::Envelope,
        [p] | [p, _] if phase(p) => Verdict::Envelope,
        _ => Verdict::Refused,
    }
}

fn command_line() -> impl Strategy<Value = String> {
    let word = prop_oneof![
        Just("probe".to_string()),
        Just("run".to_string()),
        Just("join".to_string()),
        Just("leave".to_string()),
        Just("install".to_string()),
        Just("demo@1".to_string()),
        Just("demo@2".to_string()),
        Just("kpssh-shim".to_string()),
        Just("/opt/kpssh/kpssh-shim".to_string()),
        Just("--allow-v1".to_string()),
        Just("--no-sudo".to_string()),
        Just("--state-dir=/".to_string()),
        Just("--".to_string()),
        Just("*".to_string()),
        Just("$(touch INJECTED)".to_string()),
        Just("`touch INJECTED`".to_string()),
        Just(";touch INJECTED".to_string()),
        Just("&&".to_string()),
        Just("'".to_string()),
        Just("\"".to_string()),
        Just("${IFS}".to_string()),
        Just("../../etc/passwd".to_string()),
        "[ -~]{0,12}",
        "\\PC{0,6}",
    ];
    let sep = prop_oneof![Just(" "), Just("  "), Just("\t"), Just("\n")];
    prop::collection::vec((word, sep), 0..5)
        .prop_map(|ws| ws.iter().map(|(w, s)| format!("{w}{s}")).collect())
}

/// The command line with an empty stdin: a line the shim accepts gets as far as reading the
/// envelope (refused: empty, exit 4), or runs the probe (exit 0); any other is refused before
/// that. (The full runs of accepted lines are `shim_envelope_through_sh`'s and tests/shim.rs'.)
#[test]
fn shim_command_line_through_sh() {
    let host = Host::new();
    check_all("shim command line", command_line(), |w, command| {
        let (code, stderr) = host.run(w, command, b"");
        let injected = host.dir.path().join(format!("w{w}")).join("INJECTED");
        if injected.exists() {
            return Err("a word of the command line was executed".into());
        }
        let verdict = command_verdict(command);
        match (verdict, code) {
            (Verdict::Probe, 0) => return Ok(()),
            (Verdict::Probe, _) => return Err(format!("the probe failed: {code} {stderr}")),
            (_, 0) => return Err("exit 0 without an envelope".into()),
            (Verdict::Envelope, c) if c != 4 || !stderr.contains("empty envelope") => {
                return Err(format!(
                    "an accepted command line must get to the envelope: {code} {stderr}"
                ));
            }
            (Verdict::Refused, 4) if stderr.contains("empty envelope") => {
                return Err(format!(
                    "a command line it must refuse got to the envelope: {stderr}"
                ));
            }
            _ => {}
        }
        refusal(code, &stderr)
    });
}

/// One change to the valid envelope's lines.
#[derive(Debug, Clone)]
enum Op {
    Delete(usize),
    Duplicate(usize),
    Swap(usize, usize),
    SetValue(usize, String),
    FlipByte(usize, u8),
    Truncate(usize),
    Insert(usize, String),
    Append(String),
    FlipB64(usize, usize),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        any::<usize>().prop_map(Op::Delete),
        any::<usize>().prop_map(Op::Duplicate),
        (any::<usize>(), any::<usize>()).prop_map(|(a, b)| Op::Swap(a, b)),
        (
            any::<usize>(),
            prop_oneof![
                "[ -~]{0,20}",
                Just("1".to_string()),
                Just("leave".to_string()),
                Just("demo@2".to_string()),
                Just("2000-01-01T00:00:00Z".to_string()),
                Just("-".to_string()),
                Just("9999999".to_string()),
                Just("0".to_string()),
            ]
        )
            .prop_map(|(i, v)| Op::SetValue(i, v)),
        (any::<usize>(), any::<u8>()).prop_map(|(i, b)| Op::FlipByte(i, b)),
        any::<usize>().prop_map(Op::Truncate),
        (any::<usize>(), "[ -~]{0,30}").prop_map(|(i, l)| Op::Insert(i, l)),
        "[ -~\n]{0,30}".prop_map(Op::Append),
        (any::<usize>(), any::<usize>()).prop_map(|(i, j)| Op::FlipB64(i, j)),
    ]
}

fn mutate(envelope: &[u8], ops: &[Op]) -> Vec<u8> {
    let text = String::from_utf8_lossy(envelope).into_owned();
    let mut lines: Vec<String> = text.lines().map(str::to_string).collect();
    let mut tail: Vec<u8> = Vec::new();
    let mut flips: Vec<(usize, u8)> = Vec::new();
    let mut cut = None;
    for op in ops {
        let n = lines.len().max(1);
        match op {
            Op::Delete(i) if !lines.is_empty() => {
                lines.remove(i % n);
            }
            Op::Duplicate(i) if !lines.is_empty() => {
                let l = lines[i % n].clone();
                lines.insert(i % n, l);
            }
            Op::Swap(a, b) if !lines.is_empty() => lines.swap(a % n, b % n),
            Op::SetValue(i, v) if !lines.is_empty() => {
                let l = &mut lines[i % n];
                let key = l
                    .split_once(": ")
                    .map_or(l.as_str(), |(k, _)| k)
                    .to_string();
                *l = format!("{key}: {v}");
            }
            Op::FlipByte(i, b) => flips.push((*i, *b)),
            Op::Truncate(i) => cut = Some(*i),
            Op::Insert(i, l) => lines.insert(i % (lines.len() + 1), l.clone()),
            Op::Append(t) => tail.extend_from_slice(t.as_bytes()),
            Op::FlipB64(i, j) if !lines.is_empty() => {
                let l = &mut lines[i % n];
                if let Some(pos) = l.find(": ") {
                    let mut bytes = l.clone().into_bytes();
                    let at = pos + 2 + j % (bytes.len() - pos - 1).max(1);
                    if at < bytes.len() {
                        bytes[at] = if bytes[at] == b'A' { b'B' } else { b'A' };
                    }
                    *l = String::from_utf8_lossy(&bytes).into_owned();
                }
            }
            _ => {}
        }
    }
    let mut out: Vec<u8> = lines
        .iter()
        .flat_map(|l| format!("{l}\n").into_bytes())
        .collect();
    out.extend_from_slice(&tail);
    for (i, b) in flips {
        if !out.is_empty() {
            let at = i % out.len();
            out[at] = b;
        }
    }
    if let Some(i) = cut {
        out.truncate(i % (out.len() + 1));
    }
    out
}

/// The lines a signature covers, as they appear in `envelope`.
fn signed_lines(envelope: &[u8]) -> Vec<String> {
    String::from_utf8_lossy(envelope)
        .lines()
        .filter(|l| {
            [
                "kpssh-envelope: ",
                "phase: ",
                "profile: ",
                "expires: ",
                "script-b64: ",
            ]
            .iter()
            .any(|k| l.starts_with(k))
        })
        .map(str::to_string)
        .collect()
}

#[test]
fn shim_envelope_through_sh() {
    let host = Host::new();
    // The unchanged envelope runs (else every refusal below would prove nothing).
    let (code, stderr) = host.run(0, "join demo@1", &host.envelope);
    assert_eq!(code, 0, "the valid envelope must run: {stderr}");
    let signed = signed_lines(&host.envelope);
    let strategy = prop::collection::vec(op(), 1..4);
    check_all("shim envelope", strategy, |w, ops| {
        let envelope = mutate(&host.envelope, ops);
        let (code, stderr) = host.run(w, "join demo@1", &envelope);
        if code == 0 {
            // Parameters and the timeout are not signed; everything else must be as signed.
            return if signed_lines(&envelope) == signed {
                Ok(())
            } else {
                Err(format!(
                    "a changed signed line was accepted: {:?}",
                    String::from_utf8_lossy(&envelope)
                ))
            };
        }
        refusal(code, &stderr)
    });
}
