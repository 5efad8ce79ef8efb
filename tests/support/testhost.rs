//! Test support: a "machine" for the end-to-end tier. Each host is a real OpenSSH `sshd` on a
//! loopback address of its own, with its own host key and its own machine root directory:
//!
//! ```text
//! <root>/bin/svc, bin/systemctl   tiny service manager (systemctl stand-in)
//! <root>/bin/session              sshd ForceCommand: fixed PATH, command log, then the command
//! <root>/opt/<unit>               preinstalled "binaries" (the fake kubelet and runtime)
//! <root>/etc/units/<unit>         unit definitions (written by the profile's install)
//! <root>/etc/enabled/<unit>       enabled state: survives a reboot
//! <root>/run/<unit>.pid           running state: wiped by a reboot or power loss
//! <root>/var/log/                 unit logs and the session command log
//! ```
//!
//! Reboot = every process of the host is killed, sshd restarts, enabled units start. Power
//! loss = the same kill, and nothing comes back until [`TestHost::power_on`].
//!
//! Cleanup: `Drop` kills sshd, its sessions and every unit and removes the root. sshd gets
//! `PR_SET_PDEATHSIG`; units are detached (like real services), so the fake kubelet and
//! runtime watch the owning test process and exit when it is gone.
#![allow(dead_code)]

use std::os::unix::fs::PermissionsExt as _;
use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::go_layout::{GO_USER, GoLayout};
use crate::sshd::{KeyPair, SSHD, ensure_test_user, free_port, keygen, unique_loopback};

/// Units the fake machine image ships (their "binaries" live in `<root>/opt/`).
pub const UNITS: [&str; 2] = ["containerd", "kubelet"];

/// Environment variable that makes the e2e test binary act as a host daemon.
pub const ROLE_ENV: &str = "KPSSH_E2E_ROLE";
/// Machine root of that daemon.
pub const ROOT_ENV: &str = "KPSSH_E2E_ROOT";
/// Pid of the test process that owns the host: the daemon exits when it is gone.
pub const OWNER_ENV: &str = "KPSSH_E2E_OWNER";

/// How the host runs the commands it receives.
#[derive(Clone, Debug)]
pub enum ExecMode {
    /// Commands run as sent, through `sh -c` (Raw profiles: `bash -s`).
    Raw,
    /// Every command goes to the real `kpssh-shim` (ForceCommand) with this `allowed_signers`.
    Verified { allowed_signers: String },
    /// S62: laid out as the Go provider's docs describe Verified mode ([`GoLayout`]): login
    /// [`GO_USER`], sshd's `Match` block forces `/opt/kpssh/kpssh-shim`, which escalates
    /// through sudo; `etc` are the files of the host's `/etc/kpssh` (name, text). No session
    /// wrapper: the command log stays empty.
    GoLayout { etc: Vec<(String, String)> },
}

pub struct TestHost {
    pub address: String,
    /// The (non-root, passwordless sudo) account kpssh logs in as.
    pub user: &'static str,
    pub port: u16,
    /// The machine root; `<base>/<address>`.
    pub root: PathBuf,
    host_key: KeyPair,
    config: PathBuf,
    sshd: Option<Child>,
    powered: bool,
    /// The Go layout's private `/etc/kpssh`, `/opt/kpssh`, `/var/lib/kpssh` (sshd runs in
    /// their mount namespace).
    go: Option<GoLayout>,
}

const SYSTEM_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

impl TestHost {
    /// A new machine under `base` (the run's directory); sshd is up when this returns.
    pub fn start(base: &Path, mode: ExecMode) -> TestHost {
        let address = unique_loopback();
        let root = base.join(&address);
        for d in [
            "bin",
            "opt",
            "etc/units",
            "etc/enabled",
            "etc/kpssh",
            "run",
            "var/log",
            "var/lib/kpssh/shim",
            "ssh",
        ] {
            std::fs::create_dir_all(root.join(d)).expect("machine root");
        }
        chmod(&root, 0o755);
        let host_key = keygen(&root.join("ssh"), "host_key", "ed25519", None);
        std::fs::write(root.join("ssh/authorized_keys"), "").expect("authorized_keys");
        write_exec(&root.join("bin/svc"), &svc_script(&root));
        std::os::unix::fs::symlink("svc", root.join("bin/systemctl")).expect("symlink");
        let exe = std::env::current_exe().expect("current exe");
        for unit in UNITS {
            write_exec(
                &root.join("opt").join(unit),
                &format!(
                    "#!/bin/sh\nexec env {ROLE_ENV}={unit} {ROOT_ENV}='{root}' {OWNER_ENV}={pid} '{exe}'\n",
                    root = root.display(),
                    pid = std::process::id(),
                    exe = exe.display(),
                ),
            );
        }
        let commands = root.join("var/log/commands");
        let go = match &mode {
            ExecMode::GoLayout { etc } => {
                let layout = GoLayout::new(&root.join("go"), "");
                for (name, text) in etc {
                    layout.write_etc(name, text);
                }
                Some(layout)
            }
            _ => None,
        };
        let run_line = match &mode {
            ExecMode::Raw | ExecMode::GoLayout { .. } => {
                "/bin/sh -c \"${SSH_ORIGINAL_COMMAND:-true}\"".to_string()
            }
            ExecMode::Verified { allowed_signers } => {
                std::fs::write(root.join("etc/kpssh/allowed_signers"), allowed_signers)
                    .expect("allowed_signers");
                format!(
                    "'{shim}' --no-sudo --allowed-signers '{root}/etc/kpssh/allowed_signers' --state-dir '{root}/var/lib/kpssh/shim'",
                    shim = Path::new(env!("CARGO_MANIFEST_DIR"))
                        .join("shim/kpssh-shim")
                        .display(),
                    root = root.display(),
                )
            }
        };
        // The login shell's rc files may prepend to PATH; the session fixes it so that the
        // machine's own `systemctl` (the service manager) is found first.
        write_exec(
            &root.join("bin/session"),
            &format!(
                "#!/bin/sh\nPATH='{root}/bin:{SYSTEM_PATH}'\nexport PATH\n\
                 echo \"start ${{SSH_ORIGINAL_COMMAND:-}}\" >> '{log}'\n\
                 {run_line}\nrc=$?\n\
                 echo \"exit $rc ${{SSH_ORIGINAL_COMMAND:-}}\" >> '{log}'\nexit $rc\n",
                root = root.display(),
                log = commands.display(),
            ),
        );
        let port = free_port(&address);
        let config = root.join("ssh/sshd_config");
        // The Go docs' Match block for their login instead of the session wrapper.
        let force = match &go {
            Some(_) => GoLayout::sshd_match_block(),
            None => format!("ForceCommand {}/bin/session\n", root.display()),
        };
        std::fs::write(
            &config,
            format!(
                "ListenAddress {address}:{port}\n\
                 HostKey {hk}\n\
                 PidFile {root}/run/sshd.pid\n\
                 AuthorizedKeysFile {root}/ssh/authorized_keys\n\
                 StrictModes no\n\
                 UsePAM no\n\
                 PermitRootLogin no\n\
                 PubkeyAuthentication yes\n\
                 PasswordAuthentication no\n\
                 KbdInteractiveAuthentication no\n\
                 MaxSessions 100\n\
                 MaxStartups 100:30:200\n\
                 LoginGraceTime 30\n\
                 LogLevel VERBOSE\n\
                 {force}",
                hk = host_key.private_path.display(),
                root = root.display(),
            ),
        )
        .expect("sshd_config");
        // Sessions log in as a non-root account whose shell reads no rc files: a power loss
        // kills sessions at any point, and a root login shell killed inside the machine's
        // real dotfiles (which every test host shares) can leave their locks behind.
        // The Go layout's scripts run as root (through sudo): its files stay root's.
        let user = if go.is_some() {
            GO_USER
        } else {
            let user = ensure_test_user();
            chown_tree(&root, user, &root.join("ssh"));
            user
        };
        let mut host = TestHost {
            user,
            address,
            port,
            root,
            host_key,
            config,
            sshd: None,
            powered: false,
            go,
        };
        host.power_on();
        host
    }

    /// Allow a public key line to log in as root.
    pub fn authorize(&self, public_key_line: &str) {
        let path = self.root.join("ssh/authorized_keys");
        let mut text = std::fs::read_to_string(&path).unwrap_or_default();
        text.push_str(public_key_line);
        text.push('\n');
        std::fs::write(path, text).expect("authorized_keys");
    }

    /// `SHA256:…` of the host key.
    pub fn fingerprint(&self) -> String {
        self.host_key.fingerprint()
    }

    /// Power on (or boot after a reboot): sshd starts, then every enabled unit.
    pub fn power_on(&mut self) {
        if self.powered {
            return;
        }
        self.start_sshd();
        let out = Command::new("/bin/sh")
            .arg(self.root.join("bin/svc"))
            .arg("boot")
            .stdin(Stdio::null())
            .output()
            .expect("svc boot");
        assert!(
            out.status.success(),
            "boot of {}: {}",
            self.address,
            String::from_utf8_lossy(&out.stderr)
        );
        self.powered = true;
    }

    /// Power loss: every process of the machine dies at once; runtime state (`run/`) is lost.
    pub fn power_off(&mut self) {
        self.kill_everything();
        self.powered = false;
    }

    /// Reboot: power loss, then power on.
    pub fn reboot(&mut self) {
        self.power_off();
        self.power_on();
    }

    pub fn unit_enabled(&self, unit: &str) -> bool {
        self.root.join("etc/enabled").join(unit).exists()
    }

    pub fn unit_active(&self, unit: &str) -> bool {
        Command::new("/bin/sh")
            .arg(self.root.join("bin/svc"))
            .args(["is-active", unit])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .map(|s| s.success())
            .unwrap_or(false)
    }

    /// The commands sshd sessions ran (`start <cmd>` / `exit <rc> <cmd>` lines).
    pub fn command_log(&self) -> String {
        std::fs::read_to_string(self.root.join("var/log/commands")).unwrap_or_default()
    }

    pub fn read(&self, rel: &str) -> String {
        std::fs::read_to_string(self.root.join(rel)).unwrap_or_default()
    }

    /// Everything useful for a failure message: units, files, logs (tails).
    pub fn describe(&self) -> String {
        let mut s = format!(
            "host {}:{} powered={}\n",
            self.address, self.port, self.powered
        );
        for unit in UNITS {
            s.push_str(&format!(
                "  unit {unit}: enabled={} active={}\n",
                self.unit_enabled(unit),
                self.unit_active(unit)
            ));
        }
        for log in ["var/log/commands", "var/log/kubelet.log", "var/log/phases"] {
            s.push_str(&format!(
                "  --- {log} (tail)\n{}\n",
                tail(&self.read(log), 30)
            ));
        }
        s.push_str(&format!(
            "  --- sshd log (tail)\n{}\n",
            tail(&self.read("var/log/sshd.log"), 15)
        ));
        s
    }

    fn start_sshd(&mut self) {
        let _ = std::fs::create_dir_all("/run/sshd");
        let log = self.root.join("var/log/sshd.log");
        let before = std::fs::read_to_string(&log).unwrap_or_default().len();
        let mut cmd = match &self.go {
            Some(layout) => layout.command(Path::new(SSHD)),
            None => Command::new(SSHD),
        };
        cmd.arg("-D")
            .arg("-E")
            .arg(&log)
            .arg("-f")
            .arg(&self.config)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        // SAFETY: prctl is async-signal-safe; nothing else runs between fork and exec.
        unsafe {
            cmd.pre_exec(|| {
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
                Ok(())
            });
        }
        let mut child = cmd.spawn().expect("spawn sshd");
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if let Ok(Some(status)) = child.try_wait() {
                panic!(
                    "sshd exited with {status}: {}",
                    self.read("var/log/sshd.log")
                );
            }
            let text = std::fs::read_to_string(&log).unwrap_or_default();
            if text
                .get(before..)
                .is_some_and(|t| t.contains("Server listening on"))
            {
                break;
            }
            assert!(Instant::now() < deadline, "sshd did not start: {text}");
            std::thread::sleep(Duration::from_millis(20));
        }
        self.sshd = Some(child);
    }

    /// SIGKILL to sshd, every process below it (sessions, scripts) and every unit's process
    /// group; the pid files go as `/run` would on a real machine.
    fn kill_everything(&mut self) {
        if let Some(mut child) = self.sshd.take() {
            let tree = descendants(child.id());
            let _ = child.kill();
            for pid in tree {
                kill(pid, libc::SIGKILL);
            }
            let _ = child.wait();
        }
        if let Ok(entries) = std::fs::read_dir(self.root.join("run")) {
            for e in entries.flatten() {
                let path = e.path();
                if path.extension().is_some_and(|x| x == "pid")
                    && let Some(pid) = std::fs::read_to_string(&path)
                        .ok()
                        .and_then(|t| t.trim().parse::<i32>().ok())
                        .filter(|p| *p > 1)
                {
                    // SAFETY: plain syscalls; the group is the unit's own session.
                    unsafe {
                        libc::kill(-pid, libc::SIGKILL);
                        libc::kill(pid, libc::SIGKILL);
                    }
                }
                let _ = std::fs::remove_file(path);
            }
        }
    }
}

impl Drop for TestHost {
    fn drop(&mut self) {
        self.kill_everything();
        let _ = std::fs::remove_dir_all(&self.root);
    }
}

/// Pids of live host daemons (fake kubelet, runtime) owned by the test process `owner`.
pub fn daemons_of(owner: u32) -> Vec<u32> {
    let needle = format!("{OWNER_ENV}={owner}");
    let mut out = Vec::new();
    for e in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
            continue;
        };
        let Ok(environ) = std::fs::read(format!("/proc/{pid}/environ")) else {
            continue;
        };
        if environ.split(|b| *b == 0).any(|v| v == needle.as_bytes())
            && crate::sshd::process_alive(pid)
        {
            out.push(pid);
        }
    }
    out
}

fn kill(pid: u32, sig: i32) {
    if let Ok(p) = i32::try_from(pid) {
        // SAFETY: a plain syscall.
        unsafe {
            libc::kill(p, sig);
        }
    }
}

/// Every process whose ancestry reaches `pid` (scanned from /proc).
fn descendants(pid: u32) -> Vec<u32> {
    let mut parent_of = Vec::new();
    if let Ok(entries) = std::fs::read_dir("/proc") {
        for e in entries.flatten() {
            let Some(p) = e.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
                continue;
            };
            let Ok(stat) = std::fs::read_to_string(format!("/proc/{p}/stat")) else {
                continue;
            };
            let ppid = stat
                .rsplit_once(')')
                .and_then(|(_, rest)| rest.split_whitespace().nth(1))
                .and_then(|v| v.parse::<u32>().ok());
            if let Some(ppid) = ppid {
                parent_of.push((p, ppid));
            }
        }
    }
    let mut out = vec![];
    let mut frontier = vec![pid];
    while let Some(cur) = frontier.pop() {
        for (p, pp) in &parent_of {
            if *pp == cur && !out.contains(p) {
                out.push(*p);
                frontier.push(*p);
            }
        }
    }
    out
}

/// `chown -R user` of `dir`, except `skip` (sshd's own files stay root's).
fn chown_tree(dir: &Path, user: &str, skip: &Path) {
    let out = Command::new("id")
        .arg("-u")
        .arg(user)
        .output()
        .expect("id -u");
    let uid: u32 = String::from_utf8_lossy(&out.stdout)
        .trim()
        .parse()
        .expect("uid of the test user");
    let mut stack = vec![dir.to_path_buf()];
    while let Some(p) = stack.pop() {
        if p == skip {
            continue;
        }
        std::os::unix::fs::lchown(&p, Some(uid), Some(uid)).expect("chown");
        if p.is_dir() && !p.is_symlink() {
            for e in std::fs::read_dir(&p).expect("read_dir").flatten() {
                stack.push(e.path());
            }
        }
    }
}

fn chmod(path: &Path, mode: u32) {
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).expect("chmod");
}

fn write_exec(path: &Path, text: &str) {
    std::fs::write(path, text).expect("write executable");
    chmod(path, 0o755);
}

pub fn tail(text: &str, lines: usize) -> String {
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

/// The service manager, POSIX sh. `svc {enable|disable} [--now] UNIT…`,
/// `svc {start|stop|restart|is-active|is-enabled} UNIT…`, `svc boot` (start enabled units).
/// A unit runs in a session of its own; its pid file holds the session id.
fn svc_script(root: &Path) -> String {
    let mut s = format!("#!/bin/sh\nROOT='{}'\n", root.display());
    s.push_str(
        r#"set -u
alive() {
  [ -r "/proc/$1/stat" ] || return 1
  st=$(sed 's/.*) //' "/proc/$1/stat" 2>/dev/null | cut -d' ' -f1)
  [ -n "$st" ] && [ "$st" != Z ] && [ "$st" != X ]
}
active() {
  [ -s "$ROOT/run/$1.pid" ] && alive "$(cat "$ROOT/run/$1.pid")"
}
start() {
  active "$1" && return 0
  if [ ! -x "$ROOT/etc/units/$1" ]; then echo "svc: unit $1 is not installed" >&2; return 5; fi
  f="$ROOT/run/$1.pid"
  rm -f "$f"
  setsid sh -c 'echo $$ > "$1.tmp" && mv "$1.tmp" "$1" && shift && exec "$@"' sh "$f" "$ROOT/etc/units/$1" \
    </dev/null >>"$ROOT/var/log/$1.log" 2>&1 &
  i=0
  while [ ! -s "$f" ]; do
    i=$((i + 1))
    if [ "$i" -gt 200 ]; then echo "svc: $1 did not start" >&2; return 1; fi
    sleep 0.05
  done
}
stop() {
  f="$ROOT/run/$1.pid"
  [ -s "$f" ] || return 0
  pid=$(cat "$f")
  kill -TERM -- "-$pid" 2>/dev/null || kill -TERM "$pid" 2>/dev/null || true
  i=0
  while alive "$pid"; do
    i=$((i + 1))
    if [ "$i" -eq 50 ]; then kill -KILL -- "-$pid" 2>/dev/null || kill -KILL "$pid" 2>/dev/null || true; fi
    if [ "$i" -gt 100 ]; then echo "svc: $1 (pid $pid) does not stop" >&2; return 1; fi
    sleep 0.1
  done
  rm -f "$f"
}
cmd=${1:-}
[ $# -gt 0 ] && shift
now=
if [ "${1:-}" = --now ]; then now=1; shift; fi
rc=0
case "$cmd" in
  boot)
    for e in "$ROOT"/etc/enabled/*; do
      [ -e "$e" ] || continue
      start "$(basename "$e")" || rc=1
    done ;;
  enable)
    for u in "$@"; do
      : > "$ROOT/etc/enabled/$u"
      if [ -n "$now" ]; then start "$u" || rc=1; fi
    done ;;
  disable)
    for u in "$@"; do
      rm -f "$ROOT/etc/enabled/$u"
      if [ -n "$now" ]; then stop "$u" || rc=1; fi
    done ;;
  start) for u in "$@"; do start "$u" || rc=1; done ;;
  stop) for u in "$@"; do stop "$u" || rc=1; done ;;
  restart) for u in "$@"; do stop "$u" && start "$u" || rc=1; done ;;
  is-active)
    for u in "$@"; do
      if active "$u"; then echo active; else echo inactive; rc=3; fi
    done ;;
  is-enabled)
    for u in "$@"; do
      if [ -e "$ROOT/etc/enabled/$u" ]; then echo enabled; else echo disabled; rc=1; fi
    done ;;
  *) echo "usage: svc boot | {enable|disable} [--now] UNIT... | {start|stop|restart|is-active|is-enabled} UNIT..." >&2; rc=2 ;;
esac
exit "$rc"
"#,
    );
    s
}
