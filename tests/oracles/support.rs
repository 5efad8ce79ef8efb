//! The oracle process: one per property test, JSON lines in and out, every answer under a
//! deadline.

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::OnceLock;
use std::sync::mpsc::{Receiver, channel};
use std::time::Duration;

use serde::Serialize;
use serde::de::DeserializeOwned;

/// How long one answer may take (the oracles answer in microseconds; this only catches a hang).
const ANSWER_TIMEOUT: Duration = Duration::from_secs(60);

/// Cases per property: at least 1,000, more through `PROPTEST_CASES`.
pub fn cases() -> u32 {
    std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|c| c.parse().ok())
        .map_or(1000, |c: u32| c.max(1000))
}

/// The oracle binary: `KPSSH_ORACLE`, else the last stdout line of `scripts/oracle.sh` (which
/// builds it once). Panics with the reason when it cannot be had: this tier is never skipped.
pub fn binary() -> &'static str {
    static PATH: OnceLock<String> = OnceLock::new();
    PATH.get_or_init(|| {
        if let Ok(p) = std::env::var("KPSSH_ORACLE") {
            return p;
        }
        let script = concat!(env!("CARGO_MANIFEST_DIR"), "/scripts/oracle.sh");
        let out = Command::new(script)
            .stderr(Stdio::inherit())
            .output()
            .unwrap_or_else(|e| panic!("running {script}: {e}"));
        assert!(out.status.success(), "{script} failed: {}", out.status);
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .last()
            .unwrap_or_else(|| panic!("{script} printed no path"))
            .to_string()
    })
}

/// One running oracle.
pub struct Oracle {
    mode: &'static str,
    child: Child,
    stdin: ChildStdin,
    lines: Receiver<std::io::Result<String>>,
}

impl Oracle {
    pub fn start(mode: &'static str) -> Oracle {
        let mut child = Command::new(binary())
            .arg(mode)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap_or_else(|e| panic!("starting the {mode} oracle {}: {e}", binary()));
        let stdin = child.stdin.take().expect("piped stdin");
        let stdout = child.stdout.take().expect("piped stdout");
        let (tx, lines) = channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        Oracle {
            mode,
            child,
            stdin,
            lines,
        }
    }

    /// Sends one case and waits for its answer.
    pub fn ask<Q: Serialize, A: DeserializeOwned>(&mut self, question: &Q) -> A {
        let mut line = serde_json::to_vec(question).expect("a question serializes");
        line.push(b'\n');
        let mode = self.mode;
        self.stdin
            .write_all(&line)
            .and_then(|()| self.stdin.flush())
            .unwrap_or_else(|e| panic!("writing to the {mode} oracle: {e}"));
        let answer = match self.lines.recv_timeout(ANSWER_TIMEOUT) {
            Ok(Ok(a)) => a,
            Ok(Err(e)) => panic!("reading from the {mode} oracle: {e}"),
            Err(e) => panic!("the {mode} oracle did not answer within {ANSWER_TIMEOUT:?}: {e}"),
        };
        serde_json::from_str(&answer)
            .unwrap_or_else(|e| panic!("the {mode} oracle answered {answer:?}: {e}"))
    }
}

impl Drop for Oracle {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Strings that stress Go's JSON encoder and byte-wise sorting: HTML characters, U+2028/9,
/// controls, non-ASCII, quotes and backslashes.
pub fn tricky_string() -> impl proptest::strategy::Strategy<Value = String> {
    proptest::string::string_regex(
        "([a-z0-9._-]|[<>&\"\\\\]|\u{2028}|\u{2029}|[\u{0}-\u{1f}]|\u{7f}|é|ß|日|😀| ){0,12}",
    )
    .expect("a valid regex")
}
