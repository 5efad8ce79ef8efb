//! Raw-mode execution plan: what is sent to a host that runs profile scripts without signature
//! verification (the default `execMode`).
//!
//! The command is `sudo bash -s` (`bash -s` when the SSH user is `root`); stdin is, byte for byte:
//!
//! ```text
//! set -euo pipefail\n
//! export NAME='value'\n        (one line per variable, sorted by name)
//! <script bytes>
//! ```
//!
//! Values are single-quoted, with `'` written as `'\''`, so they are inert: no expansion, no
//! command substitution, newlines kept literally. Names must be shell identifiers and values must
//! not contain NUL (bash cannot hold it). // S35

use std::fmt;

use super::env::{Env, EnvError, is_valid_env_name};

/// The first line of every Raw-mode stdin.
pub const STRICT_MODE: &str = "set -euo pipefail\n";

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

/// The full Raw-mode plan: command for `user`, stdin = preamble + script.
pub fn build_raw_plan(env: &Env, script: &[u8], user: &str) -> Result<RawPlan, EnvError> {
    let mut stdin = preamble(env)?;
    stdin.extend_from_slice(script);
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

    fn env(pairs: &[(&str, &str)]) -> Env {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), EnvValue::Plain(v.to_string())))
            .collect()
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
        let plan = build_raw_plan(&e, b"echo hi\n", "ubuntu").unwrap();
        assert_eq!(plan.command, "sudo bash -s");
        let want = "set -euo pipefail\n\
export KPSSH_BOOTSTRAP_TOKEN='abcdef.0123456789abcdef'\n\
export KPSSH_HOST_ADDRESS='192.0.2.1'\n\
export KPSSH_NODE_NAME='n1'\n\
export KPSSH_VAR_msg='it'\\''s $(rm -rf /) `x` \"y\"\nline2'\n\
echo hi\n";
        assert_eq!(String::from_utf8(plan.stdin).unwrap(), want);
    }

    #[test]
    fn root_runs_plain_bash() {
        let plan = build_raw_plan(&Env::new(), b"true", "root").unwrap();
        assert_eq!(plan.command, "bash -s");
        assert_eq!(plan.stdin, b"set -euo pipefail\ntrue");
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
    fn script_bytes_are_appended_verbatim() {
        let script = b"#!/bin/bash\n\xff\x00binary-ish\n";
        let plan = build_raw_plan(&Env::new(), script, "root").unwrap();
        assert!(plan.stdin.ends_with(script));
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
        let plan = build_raw_plan(&e, b"", "root").unwrap();
        assert!(!format!("{plan:?}").contains("0123456789"));
    }

    /// S35: the quoting really is inert — bash gets back exactly the value.
    #[test]
    fn quoting_round_trips_through_bash() {
        let Ok(out) = std::process::Command::new("bash").arg("--version").output() else {
            return; // no bash on this machine
        };
        if !out.status.success() {
            return;
        }
        let tricky = "a'b\"c$HOME`id`\\n\n\t!*?[x] ' '' end'";
        let e = env(&[("KPSSH_VAR_t", tricky)]);
        let plan = build_raw_plan(&e, b"printf '%s' \"$KPSSH_VAR_t\"\n", "root").unwrap();
        let mut child = std::process::Command::new("bash")
            .arg("-s")
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        use std::io::Write;
        child.stdin.take().unwrap().write_all(&plan.stdin).unwrap();
        let out = child.wait_with_output().unwrap();
        assert!(out.status.success());
        assert_eq!(String::from_utf8(out.stdout).unwrap(), tricky);
    }
}
