//! The real `helm` (built by scripts/helm.sh) for tests that render the chart `charts/kpssh`.
//! Include next to `support/apply.rs` (as `mod apply`).

#![allow(dead_code)] // each test binary uses a different subset

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::apply::parse_docs;

/// The chart's directory.
pub const CHART: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/charts/kpssh");
/// A bound on every helm invocation.
const HELM_LIMIT: Duration = Duration::from_secs(120);

/// The helm binary: `KPSSH_HELM` (exported by scripts/test.sh), else built by scripts/helm.sh.
pub fn helm() -> &'static Path {
    static HELM: OnceLock<PathBuf> = OnceLock::new();
    HELM.get_or_init(|| {
        if let Some(p) = std::env::var_os("KPSSH_HELM") {
            return PathBuf::from(p);
        }
        let script = concat!(env!("CARGO_MANIFEST_DIR"), "/scripts/helm.sh");
        let out = Command::new("timeout")
            .args(["1800", script])
            .stderr(Stdio::inherit())
            .output()
            .unwrap_or_else(|e| panic!("{script}: {e}"));
        assert!(out.status.success(), "{script} failed: {:?}", out.status);
        let stdout = String::from_utf8_lossy(&out.stdout);
        let last = stdout
            .lines()
            .last()
            .unwrap_or_else(|| panic!("{script} printed nothing"));
        PathBuf::from(last.trim())
    })
}

/// Runs helm under a time limit; Ok(stdout) or Err(stderr). Its output is read while it runs:
/// a rendered chart larger than a pipe's buffer (64 KiB) would otherwise block helm on its
/// write until the limit.
pub fn run_helm(args: &[&str]) -> Result<String, String> {
    let mut child = Command::new(helm())
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("{}: {e}", helm().display()));
    let drain = |pipe: Option<Box<dyn Read + Send>>| {
        std::thread::spawn(move || {
            let mut text = String::new();
            if let Some(mut p) = pipe {
                let _ = p.read_to_string(&mut text);
            }
            text
        })
    };
    let out = drain(
        child
            .stdout
            .take()
            .map(|p| Box::new(p) as Box<dyn Read + Send>),
    );
    let err = drain(
        child
            .stderr
            .take()
            .map(|p| Box::new(p) as Box<dyn Read + Send>),
    );
    let deadline = Instant::now() + HELM_LIMIT;
    let status = loop {
        if let Some(s) = child.try_wait().expect("wait for helm") {
            break s;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("helm {args:?} ran longer than {HELM_LIMIT:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let out = out.join().unwrap_or_default();
    let err = err.join().unwrap_or_default();
    if status.success() { Ok(out) } else { Err(err) }
}

/// `helm template <release> charts/kpssh -n <ns> --set …`, parsed into objects.
pub fn render(release: &str, ns: &str, set: &[&str]) -> Result<Vec<Value>, String> {
    let mut args = vec!["template", release, CHART, "--namespace", ns];
    for s in set {
        args.extend(["--set", s]);
    }
    let text = run_helm(&args)?;
    Ok(parse_docs(&text))
}

/// `helm template` with a values file (`-f`) and `--set` overrides.
pub fn render_with_values(
    release: &str,
    ns: &str,
    values: &Path,
    set: &[&str],
) -> Result<Vec<Value>, String> {
    let values = values.to_string_lossy().into_owned();
    let mut args = vec!["template", release, CHART, "--namespace", ns, "-f", &values];
    for s in set {
        args.extend(["--set", s]);
    }
    let text = run_helm(&args)?;
    Ok(parse_docs(&text))
}
