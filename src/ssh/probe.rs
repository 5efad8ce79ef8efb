//! The probe: what a host is (cpu, memory, arch) and whether a kubelet runs on it.
//!
//! Output contract (shared with the host-side shim, do not change): stdout lines `key=value`,
//! first line `kpssh-probe=1`, then `cpu=<nproc>`, `memory_kib=<MemTotal kB>`,
//! `arch=<uname -m>`, `kubelet=<active | systemctl is-active kubelet | unknown>`: `active` also
//! when the kubelet loop of the shipped profiles' no-systemd path runs (its pid file
//! `/run/kpssh/kubelet.pid` names a live process), so the zombie guard sees a kubelet on a host
//! without systemd. Unknown keys are
//! ignored; missing, unparsable or zero cpu/memory is an error, never a host with zero capacity.
//!
//! The Go provider's shim answers its own probe (an envelope with `phase: probe` on stdin) with
//! four bare lines: nproc, MemTotal kB, `uname -m` and the kubelet unit state (absent without
//! systemctl). A Verified probe sends `<shimCommand> probe` *and* that envelope, so kpssh's shim
//! (which reads the command) and the Go provider's (which reads stdin) both answer; the parser
//! takes either format, strictly.

/// The fixed POSIX-sh probe run on Raw hosts (fed to `sh -s` on stdin).
pub const PROBE_SCRIPT: &str = r#"echo kpssh-probe=1
cpu=$(nproc 2>/dev/null || getconf _NPROCESSORS_ONLN 2>/dev/null)
echo "cpu=$cpu"
mem=
while read -r k v _; do
  if [ "$k" = "MemTotal:" ]; then mem=$v; break; fi
done < /proc/meminfo
echo "memory_kib=$mem"
echo "arch=$(uname -m)"
kubelet=
pid=$(cat /run/kpssh/kubelet.pid 2>/dev/null)
case "$pid" in
  ''|*[!0-9]*) ;;
  *) st=$(sed 's/.*) //' "/proc/$pid/stat" 2>/dev/null | cut -d' ' -f1)
     case "$st" in ''|Z|X) ;; *) kubelet=active ;; esac ;;
esac
if [ -z "$kubelet" ]; then
  if command -v systemctl >/dev/null 2>&1; then
    kubelet=$(systemctl is-active kubelet 2>/dev/null | head -n 1)
  else
    kubelet=unknown
  fi
fi
echo "kubelet=$kubelet"
"#;

/// The stdin of a Verified probe: the Go provider's probe envelope, byte for byte what its
/// controller sends (kpssh's shim, given the `probe` command, does not read it).
pub const VERIFIED_PROBE_ENVELOPE: &str = "kpssh-envelope: 1\nphase: probe\n";

/// The command of a Verified probe: `<shimCommand> probe`. Under `ForceCommand` the shim reads it
/// from `SSH_ORIGINAL_COMMAND`; a host that runs the command itself starts the shim.
pub fn verified_probe_command(shim_command: &str) -> String {
    format!("{shim_command} probe")
}

/// Longest excerpt of bad probe output kept in an error.
pub const EXCERPT_MAX: usize = 256;

/// What the probe observed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProbeFacts {
    pub cpu: u32,
    pub memory_kib: u64,
    /// Normalised: x86_64→amd64, aarch64/arm64→arm64, others as reported.
    pub arch: String,
    pub kubelet_active: bool,
}

/// Probe output that cannot be used.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ProbeError {
    /// The output does not follow the contract; `excerpt` is the start of stdout, capped at
    /// [`EXCERPT_MAX`] bytes (lossy UTF-8, control characters escaped).
    #[error("unparsable probe output ({reason}): {excerpt:?}")]
    Unparsable { reason: String, excerpt: String },
    /// The probe command exited non-zero.
    #[error("probe exited with status {exit_status}: {stderr_excerpt:?}")]
    Failed {
        exit_status: u32,
        stderr_excerpt: String,
    },
}

/// Normalise `uname -m` to Kubernetes' `kubernetes.io/arch` values.
pub fn normalize_arch(raw: &str) -> String {
    match raw.trim() {
        "x86_64" | "amd64" => "amd64".to_string(),
        "aarch64" | "arm64" => "arm64".to_string(),
        other => other.to_string(),
    }
}

/// A capped, printable excerpt of some bytes for error texts.
pub fn excerpt(bytes: &[u8]) -> String {
    let cut = &bytes[..bytes.len().min(EXCERPT_MAX)];
    let text = String::from_utf8_lossy(cut);
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        if c == '\n' || c == '\t' || !c.is_control() {
            out.push(c);
        } else {
            out.push('?');
        }
    }
    if bytes.len() > EXCERPT_MAX {
        out.push('…');
    }
    out
}

/// Parse probe stdout: kpssh's `key=value` format, or the Go provider's four lines.
pub fn parse_probe_output(stdout: &[u8]) -> Result<ProbeFacts, ProbeError> {
    let bad = |reason: &str| ProbeError::Unparsable {
        reason: reason.to_string(),
        excerpt: excerpt(stdout),
    };
    let text = std::str::from_utf8(stdout).map_err(|_| bad("not UTF-8"))?;
    let mut lines = text.lines().map(|l| l.trim_end_matches('\r'));
    match lines.next().map(str::trim) {
        Some("kpssh-probe=1") => {}
        Some(first) if first.bytes().all(|b| b.is_ascii_digit()) && !first.is_empty() => {
            return parse_go_lines(text).map_err(&bad);
        }
        _ => return Err(bad("first line is not kpssh-probe=1")),
    }
    let (mut cpu, mut memory, mut arch, mut kubelet) = (None, None, None, None);
    for line in lines {
        let Some((key, value)) = line.split_once('=') else {
            continue;
        };
        let value = value.trim();
        match key.trim() {
            "cpu" => cpu = Some(value),
            "memory_kib" => memory = Some(value),
            "arch" => arch = Some(value),
            "kubelet" => kubelet = Some(value),
            _ => {}
        }
    }
    facts(cpu, memory, arch, kubelet).map_err(bad)
}

/// The Go provider's probe output: exactly three or four non-empty lines, each one token.
fn parse_go_lines(text: &str) -> Result<ProbeFacts, &'static str> {
    let lines: Vec<&str> = text
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect();
    if !(3..=4).contains(&lines.len()) {
        return Err("not 3 or 4 lines (nproc, MemTotal kB, uname -m, kubelet state)");
    }
    if lines.iter().any(|l| l.contains(char::is_whitespace)) {
        return Err("a line holds more than one word");
    }
    facts(
        Some(lines[0]),
        Some(lines[1]),
        Some(lines[2]),
        lines.get(3).copied(),
    )
}

fn facts(
    cpu: Option<&str>,
    memory: Option<&str>,
    arch: Option<&str>,
    kubelet: Option<&str>,
) -> Result<ProbeFacts, &'static str> {
    let cpu = match cpu.map(str::parse::<u32>) {
        None => return Err("cpu missing"),
        Some(Err(_)) => return Err("cpu is not a number"),
        Some(Ok(0)) => return Err("cpu is zero"),
        Some(Ok(n)) => n,
    };
    let memory_kib = match memory.map(str::parse::<u64>) {
        None => return Err("memory_kib missing"),
        Some(Err(_)) => return Err("memory_kib is not a number"),
        Some(Ok(0)) => return Err("memory_kib is zero"),
        Some(Ok(n)) => n,
    };
    let arch = match arch {
        Some(a) if !a.is_empty() => normalize_arch(a),
        _ => return Err("arch missing"),
    };
    Ok(ProbeFacts {
        cpu,
        memory_kib,
        arch,
        kubelet_active: kubelet == Some("active"),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const GOOD: &str = "kpssh-probe=1\ncpu=4\nmemory_kib=16318412\narch=x86_64\nkubelet=inactive\n";

    /// Run the probe script with `sh` in a mount namespace of its own whose `/run/kpssh` is a
    /// fresh tmpfs prepared by `setup` (so the machine's own `/run/kpssh` is never touched).
    fn probe_with_run_dir(setup: &str) -> ProbeFacts {
        std::fs::create_dir_all("/run/kpssh").expect("mkdir /run/kpssh (the test runs as root)");
        let dir = tempfile::tempdir().expect("tempdir");
        let script = dir.path().join("probe.sh");
        std::fs::write(&script, PROBE_SCRIPT).expect("write probe");
        let inner = format!(
            "set -e\nmount -t tmpfs kpssh-probe-test /run/kpssh\n{setup}\nsh {}\n\
             kill \"$loop\" 2>/dev/null || true\n",
            script.display()
        );
        let out = std::process::Command::new("unshare")
            .args(["-m", "sh", "-c", &inner])
            .output()
            .expect("run unshare");
        assert!(
            out.status.success(),
            "unshare -m (needs root, as the E11 tier does): {}",
            String::from_utf8_lossy(&out.stderr)
        );
        parse_probe_output(&out.stdout).expect("probe output parses")
    }

    #[test]
    fn a_kubelet_loop_without_systemd_is_reported_active() {
        // The no-systemd path of the shipped profiles: a live loop named by its pid file.
        let live = probe_with_run_dir("sleep 30 & loop=$!\necho $loop > /run/kpssh/kubelet.pid");
        assert!(live.kubelet_active, "a live kubelet loop was not seen");
        // A stale pid file (the loop gone, e.g. after a crash) or a hostile one is not a kubelet.
        let dead = probe_with_run_dir(
            "sh -c 'exit 0' & loop=$!\nwait $loop\necho $loop > /run/kpssh/kubelet.pid",
        );
        assert!(!dead.kubelet_active, "a dead pid counted as a kubelet");
        let junk = probe_with_run_dir("loop=\necho '1; touch /tmp/x' > /run/kpssh/kubelet.pid");
        assert!(
            !junk.kubelet_active,
            "a malformed pid file counted as a kubelet"
        );
        let none = probe_with_run_dir("loop=");
        assert!(!none.kubelet_active);
    }

    #[test]
    fn parses_the_contract() {
        let f = parse_probe_output(GOOD.as_bytes()).expect("parses");
        assert_eq!(
            f,
            ProbeFacts {
                cpu: 4,
                memory_kib: 16318412,
                arch: "amd64".into(),
                kubelet_active: false
            }
        );
    }

    #[test]
    fn unknown_keys_ignored_and_kubelet_active() {
        let out = "kpssh-probe=1\r\nfoo=bar\nnoise\ncpu=2\nmemory_kib=1024\narch=aarch64\nkubelet=active\nextra=1\n";
        let f = parse_probe_output(out.as_bytes()).expect("parses");
        assert_eq!(f.arch, "arm64");
        assert!(f.kubelet_active);
        assert_eq!(f.cpu, 2);
    }

    #[test]
    fn s62_the_go_shims_four_lines_parse() {
        let f = parse_probe_output(b"4\n16318412\nx86_64\nactive\n").expect("go format");
        assert_eq!(
            f,
            ProbeFacts {
                cpu: 4,
                memory_kib: 16318412,
                arch: "amd64".into(),
                kubelet_active: true
            }
        );
        // Without systemctl the Go shim prints no fourth line.
        let f = parse_probe_output(b"2\n1024\naarch64\n").expect("three lines");
        assert!(!f.kubelet_active);
        assert_eq!(f.arch, "arm64");
        for bad in [
            "4\n",
            "4\n1024\n",
            "4\n1024\nx86_64\ninactive\nextra\n",
            "0\n1024\nx86_64\n",
            "4\n0\nx86_64\n",
            "4\nlots\nx86_64\n",
            "4\n1024\nx86 64\n",
            "4 1024 x86_64\n",
        ] {
            let err = parse_probe_output(bad.as_bytes()).expect_err(bad);
            assert!(matches!(err, ProbeError::Unparsable { .. }), "{bad:?}");
        }
    }

    #[test]
    fn s62_the_verified_probe_speaks_both_shims() {
        assert_eq!(VERIFIED_PROBE_ENVELOPE, "kpssh-envelope: 1\nphase: probe\n");
        assert_eq!(
            verified_probe_command("/opt/kpssh/kpssh-shim"),
            "/opt/kpssh/kpssh-shim probe"
        );
    }

    #[test]
    fn arch_normalisation() {
        assert_eq!(normalize_arch("x86_64"), "amd64");
        assert_eq!(normalize_arch("aarch64"), "arm64");
        assert_eq!(normalize_arch("arm64"), "arm64");
        assert_eq!(normalize_arch("riscv64"), "riscv64");
        assert_eq!(normalize_arch("armv7l"), "armv7l");
    }

    #[test]
    fn missing_zero_or_garbage_capacity_is_unparsable() {
        for out in [
            "",
            "hello\n",
            "cpu=4\nmemory_kib=10\narch=x86_64\n",
            "kpssh-probe=1\nmemory_kib=10\narch=x86_64\n",
            "kpssh-probe=1\ncpu=0\nmemory_kib=10\narch=x86_64\n",
            "kpssh-probe=1\ncpu=4\nmemory_kib=0\narch=x86_64\n",
            "kpssh-probe=1\ncpu=four\nmemory_kib=10\narch=x86_64\n",
            "kpssh-probe=1\ncpu=4\nmemory_kib=\narch=x86_64\n",
            "kpssh-probe=1\ncpu=-1\nmemory_kib=10\narch=x86_64\n",
            "kpssh-probe=1\ncpu=4\nmemory_kib=10\n",
        ] {
            let err = parse_probe_output(out.as_bytes()).expect_err(out);
            assert!(matches!(err, ProbeError::Unparsable { .. }), "{out:?}");
        }
    }

    #[test]
    fn excerpt_is_capped() {
        let big = vec![b'x'; 10_000];
        let ProbeError::Unparsable { excerpt, .. } = parse_probe_output(&big).expect_err("garbage")
        else {
            panic!("wrong variant")
        };
        assert!(excerpt.len() <= EXCERPT_MAX + 4);
        let msg = parse_probe_output(&big).expect_err("garbage").to_string();
        assert!(msg.len() < 400, "{}", msg.len());
    }

    proptest! {
        #[test]
        fn parser_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..600)) {
            let _ = parse_probe_output(&bytes);
        }

        #[test]
        fn parser_never_panics_on_near_miss(
            lines in proptest::collection::vec(
                ("(kpssh-probe|cpu|memory_kib|arch|kubelet|x)", "[ -~]{0,12}"), 0..8)
        ) {
            let mut out = String::from("kpssh-probe=1\n");
            for (k, v) in &lines {
                out.push_str(k);
                out.push('=');
                out.push_str(v);
                out.push('\n');
            }
            if let Ok(f) = parse_probe_output(out.as_bytes()) {
                prop_assert!(f.cpu > 0 && f.memory_kib > 0 && !f.arch.is_empty());
            }
        }
    }
}
