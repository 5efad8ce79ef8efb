//! Raw-mode execution plan: what is sent to a host that runs profile scripts without signature
//! verification (the default `execMode`).
//!
//! The command is `sudo bash -s` (`bash -s` when the SSH user is `root`); stdin is, byte for byte:
//!
//! ```text
//! set -euo pipefail\n
//! export NAME='value'\n        (one line per variable, sorted by name)
//! <lock block>                  (take the host's phase lock, see below)
//! IFS= read -r -d '' kpssh_script <<'KPSSH_END_<16 hex>' || true\n
//! <script bytes>[\n]
//! KPSSH_END_<16 hex>\n
//! eval "$kpssh_script" </dev/null 9>&-\n
//! ```
//!
//! Values are single-quoted, with `'` written as `'\''`, so they are inert: no expansion, no
//! command substitution, newlines kept literally. Names must be shell identifiers and values must
//! not contain NUL (bash cannot hold it). // S35
//!
//! **The script is read whole before it runs.** `bash -s` reads its commands from stdin as it
//! goes, so a command of the script that reads stdin (`cat`, `read`, `ssh`, `apt-get` asking a
//! question) would swallow the rest of the script and the phase would "succeed" having run half
//! of it. The script therefore travels in a quoted here-document (no expansion; the delimiter
//! holds the script's SHA-256, so no line of the script can end it) and runs through `eval`
//! with stdin from `/dev/null`. `eval` parses and runs one command at a time like a script file,
//! so `shopt -s extglob` and the like still take effect for the lines after them.
//!
//! **One phase at a time.** Before the script, the host's phase lock (`flock` on
//! `/run/kpssh-phase-<address>.lock`, fd 9) is taken; a phase that finds it held waits up to
//! half its own timeout, then exits 75 with a message. The lock is held by this bash only: the
//! script runs with fd 9 closed, so a daemon it starts cannot keep it. A phase the controller
//! timed out is killed through its run marker (`crate::ssh::client`); until then a retry or the
//! next phase waits instead of running beside it.

use std::fmt;

use sha2::{Digest, Sha256};

use super::env::{Env, EnvError, is_valid_env_name};

/// The first line of every Raw-mode stdin.
pub const STRICT_MODE: &str = "set -euo pipefail\n";

/// Exit status of a Raw phase that could not take the host's phase lock (EX_TEMPFAIL).
pub const EXIT_BUSY: u32 = 75;

/// Command and stdin for one phase on one host. `Debug` shows the command and stdin length only
/// (stdin holds the bootstrap token and secrets).
#[derive(Clone, PartialEq, Eq)]
pub struct RawPlan {
    pub command: String,
    pub stdin: Vec<u8>,
}

impl fmt::Debug for RawPlan {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RawPlan")
            .field("command", &self.command)
            .field("stdin_len", &self.stdin.len())
            .finish()
    }
}

/// The host's phase lock for one Raw phase.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PhaseLock {
    /// Lock file on the host.
    pub path: String,
    /// How long to wait for a running phase before giving up (at least 1 s).
    pub wait_secs: u64,
}

impl PhaseLock {
    /// `/run/kpssh-phase-<address>.lock`, waiting half of `timeout` (the phase's own).
    pub fn for_host(address: &str, timeout: std::time::Duration) -> PhaseLock {
        let name: String = address
            .chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() || c == '.' || c == '-' {
                    c
                } else {
                    '_'
                }
            })
            .collect();
        PhaseLock {
            path: format!("/run/kpssh-phase-{name}.lock"),
            wait_secs: (timeout.as_secs() / 2).max(1),
        }
    }
}

/// `bash -s` for `root`, `sudo bash -s` for anyone else.
pub fn raw_command(user: &str) -> &'static str {
    if user == "root" {
        "bash -s"
    } else {
        "sudo bash -s"
    }
}

/// `value` in single quotes, each `'` written as `'\''`.
pub fn single_quote(value: &str) -> String {
    let mut out = String::with_capacity(value.len() + 2);
    out.push('\'');
    for c in value.chars() {
        if c == '\'' {
            out.push_str("'\\''");
        } else {
            out.push(c);
        }
    }
    out.push('\'');
    out
}

/// `set -euo pipefail` and one `export NAME='value'` line per variable, sorted by name.
pub fn preamble(env: &Env) -> Result<Vec<u8>, EnvError> {
    let mut out = String::from(STRICT_MODE);
    // `Env` is a BTreeMap: iteration is sorted by name (byte order).
    for (name, value) in env {
        if !is_valid_env_name(name) {
            return Err(EnvError::InvalidName { name: name.clone() });
        }
        let v = value.expose();
        if v.contains('\0') {
            return Err(EnvError::NulInValue { name: name.clone() });
        }
        out.push_str("export ");
        out.push_str(name);
        out.push('=');
        out.push_str(&single_quote(v));
        out.push('\n');
    }
    Ok(out.into_bytes())
}

/// The lines that take the host's phase lock on fd 9 (or end the phase with [`EXIT_BUSY`]).
pub fn lock_block(lock: &PhaseLock) -> String {
    let path = single_quote(&lock.path);
    let wait = lock.wait_secs;
    format!(
        "exec 9>>{path}\n\
         if ! command -v flock >/dev/null 2>&1; then echo 'kpssh: flock (util-linux) is required on this host: it keeps two phases from overlapping' >&2; exit {EXIT_BUSY}; fi\n\
         if ! flock -n 9; then\n\
         \techo 'kpssh: another phase is running on this host; waiting up to {wait}s for it' >&2\n\
         \tkpssh_waited=0\n\
         \tuntil flock -n 9; do\n\
         \t\tif [ \"$kpssh_waited\" -ge {wait} ]; then echo 'kpssh: another phase is still running on this host after {wait}s (lock {}); refused' >&2; exit {EXIT_BUSY}; fi\n\
         \t\tsleep 1\n\
         \t\tkpssh_waited=$((kpssh_waited + 1))\n\
         \tdone\n\
         \tunset kpssh_waited\n\
         fi\n",
        lock.path.replace('\'', "")
    )
}

/// The here-document delimiter for `script`: `KPSSH_END_` and the first 16 hex digits of its
/// SHA-256. A line of the script equal to it would have to contain a prefix of its own hash.
pub fn delimiter(script: &[u8]) -> String {
    let digest = Sha256::digest(script);
    let hex: String = digest.iter().take(8).map(|b| format!("{b:02x}")).collect();
    format!("KPSSH_END_{hex}")
}

/// The full Raw-mode plan: command for `user`, stdin = preamble, lock, then the script read
/// whole and run with stdin from `/dev/null` (see the module documentation).
pub fn build_raw_plan(
    env: &Env,
    script: &[u8],
    user: &str,
    lock: &PhaseLock,
) -> Result<RawPlan, EnvError> {
    let mut stdin = preamble(env)?;
    stdin.extend_from_slice(lock_block(lock).as_bytes());
    let end = delimiter(script);
    stdin.extend_from_slice(
        format!("IFS= read -r -d '' kpssh_script <<'{end}' || true\n").as_bytes(),
    );
    stdin.extend_from_slice(script);
    if !script.is_empty() && !script.ends_with(b"\n") {
        stdin.push(b'\n');
    }
    stdin.extend_from_slice(format!("{end}\neval \"$kpssh_script\" </dev/null 9>&-\n").as_bytes());
    Ok(RawPlan {
        command: raw_command(user).to_string(),
        stdin,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::profile::env::EnvValue;
    use crate::secret::Secret;
    use std::io::Write as _;
    use std::process::{Command, Output, Stdio};
    use std::time::{Duration, Instant};

    fn env(pairs: &[(&str, &str)]) -> Env {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), EnvValue::Plain(v.to_string())))
            .collect()
    }

    fn lock(path: &str, wait_secs: u64) -> PhaseLock {
        PhaseLock {
            path: path.into(),
            wait_secs,
        }
    }

    fn plan(script: &[u8], lock: &PhaseLock) -> Vec<u8> {
        build_raw_plan(&Env::new(), script, "root", lock)
            .expect("plan")
            .stdin
    }

    /// Runs `stdin` through the local `bash -s`, as the host would.
    fn bash(stdin: &[u8]) -> Output {
        let mut child = Command::new("bash")
            .arg("-s")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("bash");
        let mut input = child.stdin.take().expect("stdin");
        let data = stdin.to_vec();
        let writer = std::thread::spawn(move || {
            let _ = input.write_all(&data);
        });
        let out = child.wait_with_output().expect("wait");
        writer.join().expect("writer");
        out
    }

    #[test]
    fn exact_bytes() {
        let mut e = env(&[
            ("KPSSH_NODE_NAME", "n1"),
            ("KPSSH_HOST_ADDRESS", "192.0.2.1"),
            ("KPSSH_VAR_msg", "it's $(rm -rf /) `x` \"y\"\nline2"),
        ]);
        e.insert(
            "KPSSH_BOOTSTRAP_TOKEN".into(),
            EnvValue::Secret(Secret::new("abcdef.0123456789abcdef")),
        );
        let l = PhaseLock::for_host("192.0.2.1", Duration::from_secs(300));
        assert_eq!(l, lock("/run/kpssh-phase-192.0.2.1.lock", 150));
        let plan = build_raw_plan(&e, b"echo hi\n", "ubuntu", &l).unwrap();
        assert_eq!(plan.command, "sudo bash -s");
        let end = delimiter(b"echo hi\n");
        assert!(end.starts_with("KPSSH_END_") && end.len() == 26, "{end}");
        let want = format!(
            "set -euo pipefail\n\
export KPSSH_BOOTSTRAP_TOKEN='abcdef.0123456789abcdef'\n\
export KPSSH_HOST_ADDRESS='192.0.2.1'\n\
export KPSSH_NODE_NAME='n1'\n\
export KPSSH_VAR_msg='it'\\''s $(rm -rf /) `x` \"y\"\nline2'\n\
{}\
IFS= read -r -d '' kpssh_script <<'{end}' || true\n\
echo hi\n\
{end}\n\
eval \"$kpssh_script\" </dev/null 9>&-\n",
            lock_block(&l)
        );
        assert_eq!(String::from_utf8(plan.stdin).unwrap(), want);
        // IPv6 and odd characters make a plain file name.
        assert_eq!(
            PhaseLock::for_host("fd00::1", Duration::from_secs(1)),
            lock("/run/kpssh-phase-fd00__1.lock", 1)
        );
    }

    #[test]
    fn root_runs_plain_bash() {
        let plan = build_raw_plan(&Env::new(), b"true", "root", &lock("/tmp/x", 1)).unwrap();
        assert_eq!(plan.command, "bash -s");
        assert!(plan.stdin.starts_with(b"set -euo pipefail\n"));
        // A script without a final newline gets one before the delimiter.
        let text = String::from_utf8(plan.stdin).unwrap();
        assert!(
            text.contains(&format!("\ntrue\n{}\n", delimiter(b"true"))),
            "{text}"
        );
    }

    #[test]
    fn empty_values_and_quotes() {
        assert_eq!(single_quote(""), "''");
        assert_eq!(single_quote("'"), "''\\'''");
        assert_eq!(single_quote("a'b'c"), "'a'\\''b'\\''c'");
        let e = env(&[("KPSSH_PROVIDER_ID", "")]);
        assert_eq!(
            preamble(&e).unwrap(),
            b"set -euo pipefail\nexport KPSSH_PROVIDER_ID=''\n"
        );
    }

    #[test]
    fn script_bytes_are_carried_verbatim() {
        let script = b"#!/bin/bash\n\xffbinary-ish\n";
        let stdin = plan(script, &lock("/tmp/x", 1));
        let end = delimiter(script);
        let mut framed = format!("<<'{end}' || true\n").into_bytes();
        framed.extend_from_slice(script);
        framed.extend_from_slice(end.as_bytes());
        assert!(stdin.windows(framed.len()).any(|w| w == framed));
    }

    #[test]
    fn bad_names_and_nul_values_are_refused() {
        // S35
        let e = env(&[("BASH ENV", "x")]);
        assert!(matches!(preamble(&e), Err(EnvError::InvalidName { .. })));
        let e = env(&[("X", "a\0b")]);
        assert!(matches!(preamble(&e), Err(EnvError::NulInValue { .. })));
    }

    #[test]
    fn debug_hides_stdin() {
        let mut e = Env::new();
        e.insert(
            "KPSSH_BOOTSTRAP_TOKEN".into(),
            EnvValue::Secret(Secret::new("abcdef.0123456789abcdef")),
        );
        let plan = build_raw_plan(&e, b"", "root", &lock("/tmp/x", 1)).unwrap();
        assert!(!format!("{plan:?}").contains("0123456789"));
    }

    /// S35: the quoting really is inert — bash gets back exactly the value.
    #[test]
    fn quoting_round_trips_through_bash() {
        let dir = tempfile::tempdir().unwrap();
        let l = lock(&dir.path().join("lock").to_string_lossy(), 1);
        let tricky = "a'b\"c$HOME`id`\\n\n\t!*?[x] ' '' end'";
        let e = env(&[("KPSSH_VAR_t", tricky)]);
        let plan = build_raw_plan(&e, b"printf '%s' \"$KPSSH_VAR_t\"\n", "root", &l).unwrap();
        let out = bash(&plan.stdin);
        assert!(out.status.success(), "{out:?}");
        assert_eq!(String::from_utf8(out.stdout).unwrap(), tricky);
    }

    /// #23: a command that reads stdin gets EOF instead of the rest of the script; the script
    /// still runs to its end, `set -e` still stops it, and shell options set by one line apply
    /// to the lines after it. (Before, `cat` printed the rest of the script and nothing after
    /// it ran.)
    #[test]
    fn a_command_reading_stdin_cannot_swallow_the_rest_of_the_script() {
        let dir = tempfile::tempdir().unwrap();
        let l = lock(&dir.path().join("lock").to_string_lossy(), 1);
        let script = b"echo one\ncat\nread -r line || echo read-eof\nshopt -s extglob\n\
case abc in @(abc|def)) echo extglob ;; esac\necho two\n";
        let out = bash(&plan(script, &l));
        assert!(out.status.success(), "{out:?}");
        assert_eq!(
            String::from_utf8(out.stdout).unwrap(),
            "one\nread-eof\nextglob\ntwo\n"
        );
        let out = bash(&plan(b"echo before\nfalse\necho after\n", &l));
        assert_eq!(out.status.code(), Some(1));
        assert_eq!(String::from_utf8(out.stdout).unwrap(), "before\n");
        // A line equal to another script's delimiter is just text.
        let other = delimiter(b"x");
        let tricky = format!("echo start\n: <<'{other}'\n{other}\necho end\n");
        let out = bash(&plan(tricky.as_bytes(), &l));
        assert_eq!(String::from_utf8(out.stdout).unwrap(), "start\nend\n");
    }

    /// #23: two phases never overlap: the second waits for the lock, or gives up with exit 75
    /// after its wait; a daemon the first started does not keep the lock.
    #[test]
    fn a_second_phase_waits_for_the_first_or_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("lock").to_string_lossy().into_owned();
        let log = dir.path().join("log");
        let step = |name: &str, secs: u32| {
            format!(
                "echo {name}-start >> '{log}'\nsleep {secs}\necho {name}-end >> '{log}'\n",
                log = log.display()
            )
        };
        let first = plan(step("a", 2).as_bytes(), &lock(&path, 1));
        let waiting = plan(step("b", 0).as_bytes(), &lock(&path, 10));
        let running = std::thread::spawn(move || bash(&first));
        std::thread::sleep(Duration::from_millis(500));
        let out = bash(&waiting);
        assert!(out.status.success(), "{out:?}");
        assert!(String::from_utf8_lossy(&out.stderr).contains("another phase is running"));
        assert!(running.join().unwrap().status.success());
        assert_eq!(
            std::fs::read_to_string(&log).unwrap(),
            "a-start\na-end\nb-start\nb-end\n",
            "the phases overlapped"
        );
        // Refused after its wait.
        std::fs::remove_file(&log).unwrap();
        let first = plan(step("a", 4).as_bytes(), &lock(&path, 1));
        let impatient = plan(step("c", 0).as_bytes(), &lock(&path, 1));
        let running = std::thread::spawn(move || bash(&first));
        std::thread::sleep(Duration::from_millis(500));
        let started = Instant::now();
        let out = bash(&impatient);
        assert_eq!(out.status.code(), Some(EXIT_BUSY as i32), "{out:?}");
        assert!(String::from_utf8_lossy(&out.stderr).contains("refused"));
        assert!(started.elapsed() < Duration::from_secs(4));
        assert!(running.join().unwrap().status.success());
        assert!(!std::fs::read_to_string(&log).unwrap().contains("c-start"));
        // A background daemon started by a phase does not hold the lock after it ended.
        let daemon = plan(b"nohup sleep 5 >/dev/null 2>&1 &\n", &lock(&path, 1));
        assert!(bash(&daemon).status.success());
        let started = Instant::now();
        let out = bash(&plan(b"true\n", &lock(&path, 3)));
        assert!(out.status.success(), "{out:?}");
        assert!(
            started.elapsed() < Duration::from_secs(2),
            "the daemon held the lock"
        );
    }
}
