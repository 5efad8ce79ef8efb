//! Test support: a real OpenSSH `sshd` on a loopback address, with its own host keys, authorized
//! keys and log, killed on drop (and by `PR_SET_PDEATHSIG` if the test process dies).
//!
//! Requires Debian's `openssh-server` (and `sudo` for the non-root user helpers). They are
//! installed by `scripts/test-deps.sh`; a missing `sshd` fails the test, it never skips it.
#![allow(dead_code)]

use std::io::Write as _;
use std::net::{TcpListener, TcpStream};
use std::os::unix::fs::PermissionsExt as _;
use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

pub const SSHD: &str = "/usr/sbin/sshd";
pub const SSH_KEYGEN: &str = "/usr/bin/ssh-keygen";
/// Non-root account created by [`ensure_test_user`] (passwordless sudo).
pub const TEST_USER: &str = "kpsshtest";

static NEXT: AtomicU32 = AtomicU32::new(0);

fn require_tools() {
    for tool in [SSHD, SSH_KEYGEN] {
        assert!(
            Path::new(tool).exists(),
            "{tool} is missing: run scripts/test-deps.sh (installs openssh-server, sudo)"
        );
    }
}

/// A loopback address of its own (any 127/8 address works on Linux) for this process and call.
pub fn unique_loopback() -> String {
    let n = NEXT.fetch_add(1, Ordering::SeqCst);
    let pid = std::process::id();
    format!("127.{}.{}.{}", 10 + pid % 200, (n / 250) % 250, 1 + n % 250)
}

/// A free TCP port on `address`.
pub fn free_port(address: &str) -> u16 {
    let l = TcpListener::bind((address, 0)).expect("bind loopback");
    l.local_addr().expect("local addr").port()
}

fn run(cmd: &mut Command) -> std::process::Output {
    let out = cmd.output().expect("spawn helper");
    assert!(
        out.status.success(),
        "{cmd:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// A key pair made by the real `ssh-keygen`.
pub struct KeyPair {
    pub private_path: PathBuf,
    pub private: String,
    /// `type base64 comment`
    pub public: String,
}

impl KeyPair {
    /// `ssh-keygen -Y sign` of `msg` under `namespace` with this key: the armored signature.
    pub fn sign(&self, namespace: &str, msg: &[u8]) -> String {
        use std::io::Write as _;
        let mut child = Command::new(SSH_KEYGEN)
            .args(["-Y", "sign", "-n", namespace, "-f"])
            .arg(&self.private_path)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("ssh-keygen");
        child
            .stdin
            .take()
            .expect("stdin")
            .write_all(msg)
            .expect("write");
        let out = child.wait_with_output().expect("wait");
        assert!(out.status.success(), "sign: {out:?}");
        String::from_utf8(out.stdout).expect("utf8")
    }
}

impl KeyPair {
    /// `ssh-keygen -lf` fingerprint, `SHA256:…`.
    pub fn fingerprint(&self) -> String {
        let pub_path = self.private_path.with_extension("pub");
        let out = run(Command::new(SSH_KEYGEN).arg("-lf").arg(pub_path));
        let text = String::from_utf8_lossy(&out.stdout).to_string();
        text.split_whitespace()
            .nth(1)
            .expect("fingerprint field")
            .to_string()
    }
}

/// `kind` is `ed25519`, `ecdsa` or `rsa`; `passphrase` encrypts the key.
pub fn keygen(dir: &Path, name: &str, kind: &str, passphrase: Option<&str>) -> KeyPair {
    require_tools();
    let path = dir.join(name);
    let mut cmd = Command::new(SSH_KEYGEN);
    cmd.args(["-q", "-t", kind, "-C", name, "-N", passphrase.unwrap_or("")])
        .arg("-f")
        .arg(&path);
    if kind == "rsa" {
        cmd.args(["-b", "2048"]);
    }
    run(&mut cmd);
    KeyPair {
        private: std::fs::read_to_string(&path).expect("read key"),
        public: std::fs::read_to_string(path.with_extension("pub"))
            .expect("read pub")
            .trim()
            .to_string(),
        private_path: path,
    }
}

#[derive(Clone, Debug)]
pub struct SshdOptions {
    /// Host key type (`ed25519`, `ecdsa`, `rsa`).
    pub host_key: &'static str,
    /// Extra `sshd_config` lines.
    pub extra: Vec<String>,
}

impl Default for SshdOptions {
    fn default() -> Self {
        SshdOptions {
            host_key: "ed25519",
            extra: Vec::new(),
        }
    }
}

/// A running `sshd -D -E <log> -f <config>`.
pub struct Sshd {
    pub address: String,
    pub port: u16,
    pub dir: tempfile::TempDir,
    pub host_key: KeyPair,
    log: PathBuf,
    authorized_keys: PathBuf,
    child: Child,
}

impl Sshd {
    pub fn start() -> Sshd {
        Sshd::start_with(SshdOptions::default())
    }

    pub fn start_with(opts: SshdOptions) -> Sshd {
        require_tools();
        // Privilege separation directory (normally created by the service unit).
        let _ = std::fs::create_dir_all("/run/sshd");
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755))
            .expect("chmod");
        let host_key = keygen(dir.path(), "host_key", opts.host_key, None);
        let authorized_keys = dir.path().join("authorized_keys");
        std::fs::write(&authorized_keys, "").expect("authorized_keys");
        std::fs::set_permissions(&authorized_keys, std::fs::Permissions::from_mode(0o644))
            .expect("chmod");
        let address = unique_loopback();
        let port = free_port(&address);
        let log = dir.path().join("sshd.log");
        let mut config = format!(
            "ListenAddress {address}:{port}\n\
             HostKey {hk}\n\
             PidFile {pid}\n\
             AuthorizedKeysFile {ak}\n\
             StrictModes no\n\
             UsePAM no\n\
             PermitRootLogin prohibit-password\n\
             PubkeyAuthentication yes\n\
             PasswordAuthentication no\n\
             KbdInteractiveAuthentication no\n\
             AllowTcpForwarding yes\n\
             MaxSessions 100\n\
             MaxStartups 100:30:200\n\
             LoginGraceTime 30\n\
             LogLevel DEBUG1\n\
             Subsystem sftp internal-sftp\n",
            hk = host_key.private_path.display(),
            pid = dir.path().join("sshd.pid").display(),
            ak = authorized_keys.display(),
        );
        for line in &opts.extra {
            config.push_str(line);
            config.push('\n');
        }
        let config_path = dir.path().join("sshd_config");
        std::fs::write(&config_path, config).expect("sshd_config");
        let log_file = std::fs::File::create(dir.path().join("sshd.stderr")).expect("stderr");
        let mut cmd = Command::new(SSHD);
        // `-E` (not `-e`): with `-e` and LogLevel DEBUG1 the session child leaks debug lines
        // into the command's stderr.
        cmd.arg("-D")
            .arg("-E")
            .arg(&log)
            .arg("-f")
            .arg(&config_path)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log_file);
        // SAFETY: prctl is async-signal-safe; nothing else runs between fork and exec.
        unsafe {
            cmd.pre_exec(|| {
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
                Ok(())
            });
        }
        let child = cmd.spawn().expect("spawn sshd");
        let mut sshd = Sshd {
            address,
            port,
            dir,
            host_key,
            log,
            authorized_keys,
            child,
        };
        sshd.wait_ready();
        sshd
    }

    fn wait_ready(&mut self) {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if let Ok(Some(status)) = self.child.try_wait() {
                panic!("sshd exited with {status}: {}", self.log());
            }
            if self.log().contains("Server listening on") {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "sshd did not start: {}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Allow a public key line to log in (any user).
    pub fn authorize(&self, public_key_line: &str) {
        let mut f = std::fs::OpenOptions::new()
            .append(true)
            .open(&self.authorized_keys)
            .expect("authorized_keys");
        writeln!(f, "{public_key_line}").expect("write authorized_keys");
    }

    /// `authorized_keys` options + key, e.g. a `command="…"` restriction.
    pub fn authorize_with_options(&self, options: &str, public_key_line: &str) {
        self.authorize(&format!("{options} {public_key_line}"));
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Keep the log (and print its path) for debugging a failing test.
    pub fn log_path(&self) -> &Path {
        &self.log
    }

    /// Lines of the log containing `needle`.
    pub fn log_count(&self, needle: &str) -> usize {
        self.log().lines().filter(|l| l.contains(needle)).count()
    }

    /// TCP connections the daemon accepted so far.
    pub fn connections(&self) -> usize {
        self.log_count("Connection from ")
    }

    /// The host key's `SHA256:` fingerprint per `ssh-keygen -lf`.
    pub fn fingerprint(&self) -> String {
        self.host_key.fingerprint()
    }

    /// `type base64` of the host key (no comment).
    pub fn host_public_key(&self) -> String {
        self.host_key
            .public
            .split_whitespace()
            .take(2)
            .collect::<Vec<_>>()
            .join(" ")
    }

    /// The known_hosts host name OpenSSH uses for this daemon: `[addr]:port`.
    pub fn known_hosts_name(&self) -> String {
        if self.port == 22 {
            self.address.clone()
        } else {
            format!("[{}]:{}", self.address, self.port)
        }
    }

    /// A hashed known_hosts line for this daemon, made by `ssh-keygen -H`.
    pub fn hashed_known_hosts_line(&self) -> String {
        let path = self.dir.path().join("known_hosts_hashed");
        std::fs::write(
            &path,
            format!("{} {}\n", self.known_hosts_name(), self.host_public_key()),
        )
        .expect("known_hosts");
        run(Command::new(SSH_KEYGEN)
            .arg("-q")
            .arg("-H")
            .arg("-f")
            .arg(&path));
        let text = std::fs::read_to_string(&path).expect("read known_hosts");
        text.lines()
            .find(|l| l.starts_with("|1|"))
            .expect("hashed line")
            .to_string()
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }
}

impl Drop for Sshd {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Create [`TEST_USER`] (idempotent) with passwordless sudo; returns its name.
pub fn ensure_test_user() -> &'static str {
    static DONE: OnceLock<()> = OnceLock::new();
    DONE.get_or_init(|| {
        let exists = Command::new("id")
            .arg("-u")
            .arg(TEST_USER)
            .output()
            .map(|o| o.status.success())
            .unwrap_or(false);
        if !exists {
            let out = Command::new("useradd")
                .args(["-m", "-s", "/bin/sh", TEST_USER])
                .output()
                .expect("useradd");
            // 9: already exists (created concurrently by another test binary).
            assert!(
                out.status.success() || out.status.code() == Some(9),
                "useradd: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        // A locked account ("!" password) is refused by sshd without PAM; "*" is not locked.
        run(Command::new("usermod").args(["-p", "*", TEST_USER]));
        assert!(
            Path::new("/usr/bin/sudo").exists(),
            "sudo is missing: run scripts/test-deps.sh"
        );
        let drop_in = "/etc/sudoers.d/kpsshtest";
        std::fs::write(drop_in, format!("{TEST_USER} ALL=(ALL) NOPASSWD: ALL\n"))
            .expect("sudoers drop-in");
        std::fs::set_permissions(drop_in, std::fs::Permissions::from_mode(0o440))
            .expect("chmod sudoers");
    });
    TEST_USER
}

/// A TCP listener that accepts connections and never says anything (an SSH tarpit).
pub struct Tarpit {
    pub address: String,
    pub port: u16,
}

impl Tarpit {
    pub fn start() -> Tarpit {
        let address = unique_loopback();
        let listener = TcpListener::bind((address.as_str(), 0)).expect("bind tarpit");
        let port = listener.local_addr().expect("addr").port();
        std::thread::spawn(move || {
            let mut held: Vec<TcpStream> = Vec::new();
            for s in listener.incoming().flatten() {
                held.push(s);
            }
        });
        Tarpit { address, port }
    }
}

/// Whether a process with this pid exists (and is not a zombie).
pub fn process_alive(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => {
            // state is the field after the parenthesised command name
            let state = stat
                .rsplit_once(')')
                .and_then(|(_, rest)| rest.split_whitespace().next())
                .unwrap_or("");
            state != "Z" && state != "X"
        }
        Err(_) => false,
    }
}

/// Peak resident set size of this process, KiB.
pub fn vm_hwm_kib() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

/// Current resident set size of this process, KiB.
pub fn vm_rss_kib() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}
