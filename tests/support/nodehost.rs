//! Test support: a node machine for the E11 tier — a real kubelet, containerd and runc run on
//! it. Unlike [`crate::testhost::TestHost`] (a directory and a fake service manager), this host
//! is a set of Linux namespaces of this machine:
//!
//! ```text
//! pid      its own: sshd is pid 1; everything the profile starts (containerd, shims, kubelet,
//!          the pods' processes) lives and dies in it — killing pid 1 powers the host off
//! network  its own: eth0 (a veth pair to this machine, <gateway>/30 ↔ <address>/30, default
//!          route via the gateway), lo; the API server is reached at 127.0.0.1:<port> through a
//!          relay of this process (as kubespray's per-node API proxy)
//! mount    its own, private: /etc/kubernetes, /etc/containerd, /etc/cni, /var/lib/kubelet,
//!          /var/lib/containerd, /var/lib/cni, /run/containerd, /run/netns, /run/kpssh,
//!          /var/log/{kpssh,pods,containers} and /usr/local/bin are bind mounts of
//!          `<dir>/fs/<name>`; the rest is this machine's (packages, /root/.cache/kpssh)
//! sysctls  /proc/sys/vm/overcommit_memory, kernel/panic, kernel/panic_on_oops are files of
//!          the host already holding the kubelet's values (1, 10, 1): the kubelet checks and
//!          would otherwise set these kernel-wide tunables on the machine the tests share
//! cgroups  the machine's; the host's pods go below its own cgroup root (the profile's
//!          cgroupRoot var), removed with the host
//! ```
//!
//! The login is [`TEST_USER`] (passwordless sudo, as a cloud image's default user); sshd's
//! ForceCommand is a session wrapper that logs each command and the phase marker line of the
//! shipped profile's scripts (`# tls-bootstrap install`), never the rest of stdin (it holds
//! the bootstrap token).
//!
//! Cleanup: `Drop` stops the relay, SIGKILLs `unshare` (whose `--kill-child` kills pid 1, and
//! the kernel the rest of the pid namespace), removes the cgroup root and the directory.
//! `unshare` is spawned with `PR_SET_PDEATHSIG`, so a killed test run leaves no daemon behind.
#![allow(dead_code)]

use std::io::{Read as _, Write as _};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::os::fd::AsRawFd as _;
use std::os::unix::fs::PermissionsExt as _;
use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::time::{Duration, Instant};

use crate::sshd::{KeyPair, SSHD, ensure_test_user, keygen};

/// The private directories: (name under `<dir>/fs`, path on the host).
const PRIVATE: [(&str, &str); 13] = [
    ("etc-kubernetes", "/etc/kubernetes"),
    ("etc-containerd", "/etc/containerd"),
    ("etc-cni", "/etc/cni"),
    ("var-lib-kubelet", "/var/lib/kubelet"),
    ("var-lib-containerd", "/var/lib/containerd"),
    ("var-lib-cni", "/var/lib/cni"),
    ("run-containerd", "/run/containerd"),
    ("run-netns", "/run/netns"),
    ("run-kpssh", "/run/kpssh"),
    ("var-log-kpssh", "/var/log/kpssh"),
    ("var-log-pods", "/var/log/pods"),
    ("var-log-containers", "/var/log/containers"),
    ("usr-local-bin", "/usr/local/bin"),
];

/// Kernel tunables the kubelet checks, with the values it wants (`setupKernelTunables`).
const SYSCTLS: [(&str, &str); 3] = [
    ("vm/overcommit_memory", "1"),
    ("kernel/panic", "10"),
    ("kernel/panic_on_oops", "1"),
];

static NEXT: AtomicU32 = AtomicU32::new(0);

pub struct NodeHost {
    /// The host's own address (eth0 in its network namespace); sshd listens on port 22 there.
    pub address: String,
    /// This machine's end of the veth pair.
    pub gateway: String,
    pub port: u16,
    pub user: &'static str,
    /// `<base>/<name>`: sshd config, keys, logs and `fs/` (the private directories).
    pub dir: PathBuf,
    /// The pods' cgroup root (`/kpssh-<name>-<pid>`), for the profile's cgroupRoot var.
    pub cgroup_root: String,
    host_key: KeyPair,
    unshare: Option<Child>,
    veth: String,
    relay: Option<Relay>,
}

impl NodeHost {
    /// A new, powered-on host named `name` under `base`; sshd is listening when this returns.
    pub fn start(base: &Path, name: &str) -> NodeHost {
        for tool in ["/usr/bin/unshare", "/usr/sbin/ip", SSHD, "/usr/bin/sudo"] {
            assert!(
                Path::new(tool).exists(),
                "{tool} is missing: run scripts/test-deps.sh"
            );
        }
        let user = ensure_test_user();
        let dir = base.join(name);
        let fs = dir.join("fs");
        for (d, target) in PRIVATE {
            std::fs::create_dir_all(fs.join(d)).expect("private dir");
            // The mount point on this machine: an empty directory where there was none.
            std::fs::create_dir_all(target).expect("mount point");
        }
        let sysctl = dir.join("sysctl");
        std::fs::create_dir_all(&sysctl).expect("sysctl dir");
        for (key, value) in SYSCTLS {
            std::fs::write(sysctl.join(key.replace('/', "_")), format!("{value}\n"))
                .expect("sysctl file");
        }
        chmod(&dir, 0o755);
        let host_key = keygen(&dir, "host_key", "ed25519", None);
        std::fs::write(dir.join("authorized_keys"), "").expect("authorized_keys");
        let n = NEXT.fetch_add(1, Ordering::SeqCst);
        let pid = std::process::id();
        let cgroup_root = format!("/kpssh-{name}-{pid}");
        make_cgroup_root(&cgroup_root);
        let (gateway, address) = free_pair(pid, n);
        let veth = format!("kpn{}x{n}", pid % 1_000_000);
        let sessions = dir.join("sessions.log");
        std::fs::write(&sessions, "").expect("sessions log");
        std::os::unix::fs::chown(&sessions, Some(uid_of(user)), None).expect("chown log");
        write_exec(
            &dir.join("session"),
            &format!(
                "#!/bin/bash\nlog='{log}'\necho \"start ${{SSH_ORIGINAL_COMMAND:-}}\" >> \"$log\"\n\
                 tee >(grep -aoE '^# tls-bootstrap (install|join|leave|uninstall)$' >> \"$log\") \
                 | /bin/sh -c \"${{SSH_ORIGINAL_COMMAND:-true}}\"\n\
                 rc=${{PIPESTATUS[1]}}\necho \"exit $rc\" >> \"$log\"\nexit \"$rc\"\n",
                log = sessions.display()
            ),
        );
        let config = dir.join("sshd_config");
        std::fs::write(
            &config,
            format!(
                "ListenAddress {address}:22\nHostKey {hk}\nPidFile {dir}/sshd.pid\n\
                 AuthorizedKeysFile {dir}/authorized_keys\nStrictModes no\nUsePAM no\n\
                 PermitRootLogin no\nPubkeyAuthentication yes\nPasswordAuthentication no\n\
                 KbdInteractiveAuthentication no\nMaxSessions 100\nMaxStartups 100:30:200\n\
                 LoginGraceTime 30\nLogLevel VERBOSE\nForceCommand {dir}/session\n",
                hk = host_key.private_path.display(),
                dir = dir.display(),
            ),
        )
        .expect("sshd_config");
        let mut inner = String::from(
            "set -eu\nifname=$1 addr=$2 gw=$3 dir=$4\ni=0\n\
             until ip link show \"$ifname\" >/dev/null 2>&1; do\n  i=$((i + 1))\n  \
             [ \"$i\" -lt 200 ] || { echo \"no $ifname\" >&2; exit 1; }\n  sleep 0.05\ndone\n\
             ip link set lo up\nip link set \"$ifname\" name eth0\n\
             ip addr add \"$addr/30\" dev eth0\nip link set eth0 up\n\
             ip route add default via \"$gw\"\n",
        );
        for (d, target) in PRIVATE {
            inner.push_str(&format!("mount --bind \"$dir/fs/{d}\" '{target}'\n"));
        }
        for (key, _) in SYSCTLS {
            inner.push_str(&format!(
                "mount --bind \"$dir/sysctl/{}\" '/proc/sys/{key}'\n",
                key.replace('/', "_")
            ));
        }
        inner.push_str("mkdir -p /run/sshd\nexec /usr/sbin/sshd -D -E \"$dir/sshd.log\" -f \"$dir/sshd_config\"\n");
        let mut cmd = Command::new("/usr/bin/unshare");
        cmd.args([
            "--pid",
            "--fork",
            "--kill-child",
            "--net",
            "--mount",
            "--propagation",
            "private",
            "--mount-proc",
            "/bin/sh",
            "-c",
            &inner,
            "sh",
            &format!("{veth}p"),
            &address,
            &gateway,
        ])
        .arg(&dir)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(dir.join("init.log")).expect("init log"));
        // SAFETY: prctl is async-signal-safe; nothing else runs between fork and exec.
        unsafe {
            cmd.pre_exec(|| {
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
                Ok(())
            });
        }
        let child = cmd.spawn().expect("spawn unshare");
        let mut host = NodeHost {
            address,
            gateway,
            port: 22,
            user,
            dir,
            cgroup_root,
            host_key,
            unshare: Some(child),
            veth,
            relay: None,
        };
        host.wire();
        host
    }

    /// The veth pair, this machine's end configured, the other end moved into the namespace;
    /// then wait for sshd.
    fn wire(&mut self) {
        let pid = self.unshare_pid();
        // unshare(1) unshares before it forks: its own netns is the host's.
        let netns = format!("/proc/{pid}/ns/net");
        let deadline = Instant::now() + Duration::from_secs(10);
        while std::fs::read_link(&netns).ok() == std::fs::read_link("/proc/self/ns/net").ok() {
            assert!(Instant::now() < deadline, "unshare never left this netns");
            std::thread::sleep(Duration::from_millis(20));
        }
        let peer = format!("{}p", self.veth);
        ip(&[
            "link", "add", &self.veth, "type", "veth", "peer", "name", &peer,
        ]);
        ip(&["link", "set", &peer, "netns", &pid.to_string()]);
        ip(&[
            "addr",
            "add",
            &format!("{}/30", self.gateway),
            "dev",
            &self.veth,
        ]);
        ip(&["link", "set", &self.veth, "up"]);
        let log = self.dir.join("sshd.log");
        let deadline = Instant::now() + Duration::from_secs(15);
        loop {
            if let Some(child) = self.unshare.as_mut()
                && let Ok(Some(status)) = child.try_wait()
            {
                panic!(
                    "host {} died ({status}): {}{}",
                    self.address,
                    std::fs::read_to_string(self.dir.join("init.log")).unwrap_or_default(),
                    std::fs::read_to_string(&log).unwrap_or_default()
                );
            }
            if std::fs::read_to_string(&log)
                .unwrap_or_default()
                .contains("Server listening on")
            {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "sshd of {} did not start: {}",
                self.address,
                std::fs::read_to_string(self.dir.join("init.log")).unwrap_or_default()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn unshare_pid(&self) -> u32 {
        self.unshare.as_ref().map(Child::id).expect("host is on")
    }

    /// Allow a public key line to log in as the test user.
    pub fn authorize(&self, public_key_line: &str) {
        let path = self.dir.join("authorized_keys");
        let mut text = std::fs::read_to_string(&path).unwrap_or_default();
        text.push_str(public_key_line);
        text.push('\n');
        std::fs::write(path, text).expect("authorized_keys");
    }

    /// `SHA256:…` of the host key.
    pub fn fingerprint(&self) -> String {
        self.host_key.fingerprint()
    }

    /// Relay `127.0.0.1:<port>` inside the host to `127.0.0.1:<port>` of this machine (the API
    /// server), so the cluster endpoint reads the same on both sides.
    pub fn relay_api_server(&mut self, port: u16) {
        let netns = format!("/proc/{}/ns/net", self.unshare_pid());
        // A socket belongs to the netns its creator was in: bind on a thread that enters the
        // host's netns and ends; accept and dial from threads of this machine's netns.
        let listener = std::thread::spawn(move || {
            let f = std::fs::File::open(&netns).expect("open the host's netns");
            // SAFETY: setns on this thread only, with a valid namespace fd.
            let rc = unsafe { libc::setns(f.as_raw_fd(), libc::CLONE_NEWNET) };
            assert_eq!(rc, 0, "setns: {}", std::io::Error::last_os_error());
            TcpListener::bind(("127.0.0.1", port)).expect("bind the relay in the host")
        })
        .join()
        .expect("relay bind thread");
        let stop = Arc::new(AtomicBool::new(false));
        let fd = listener.as_raw_fd();
        let flag = stop.clone();
        let accept = std::thread::spawn(move || {
            for conn in listener.incoming() {
                if flag.load(Ordering::SeqCst) {
                    break;
                }
                let Ok(inside) = conn else { continue };
                let Ok(outside) = TcpStream::connect(("127.0.0.1", port)) else {
                    continue;
                };
                pipe(inside, outside);
            }
        });
        self.relay = Some(Relay {
            stop,
            fd,
            accept: Some(accept),
        });
    }

    /// A file under the host's private directories, by host path (`/var/log/kpssh/kubelet.log`).
    pub fn read(&self, host_path: &str) -> String {
        std::fs::read_to_string(self.private_path(host_path)).unwrap_or_default()
    }

    /// Where a host path of a private directory lives on this machine.
    pub fn private_path(&self, host_path: &str) -> PathBuf {
        for (d, target) in PRIVATE {
            if let Some(rest) = host_path.strip_prefix(target) {
                return self
                    .dir
                    .join("fs")
                    .join(d)
                    .join(rest.trim_start_matches('/'));
            }
        }
        panic!("{host_path} is not in a private directory of the host");
    }

    /// The phase markers and commands the host's sessions logged.
    pub fn sessions(&self) -> String {
        std::fs::read_to_string(self.dir.join("sessions.log")).unwrap_or_default()
    }

    /// How many times `phase` of the shipped tls-bootstrap profile ran on the host.
    pub fn phase_runs(&self, phase: &str) -> usize {
        let marker = format!("# tls-bootstrap {phase}");
        self.sessions().lines().filter(|l| *l == marker).count()
    }

    /// (pid, command name) of every process of the host's pid namespace.
    pub fn processes(&self) -> Vec<(u32, String)> {
        let Some(child) = self.unshare.as_ref() else {
            return Vec::new();
        };
        let Ok(ns) = std::fs::read_link(format!("/proc/{}/ns/pid_for_children", child.id())) else {
            return Vec::new();
        };
        let mut out = Vec::new();
        for e in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
            let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
                continue;
            };
            if std::fs::read_link(format!("/proc/{pid}/ns/pid"))
                .ok()
                .as_ref()
                != Some(&ns)
            {
                continue;
            }
            let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
            out.push((pid, comm.trim().to_string()));
        }
        out
    }

    /// The host's processes whose name is one of `names`.
    pub fn running(&self, names: &[&str]) -> Vec<(u32, String)> {
        self.processes()
            .into_iter()
            .filter(|(_, c)| names.iter().any(|n| c.starts_with(n)))
            .collect()
    }

    /// Everything useful for a failure message: processes, sessions, daemon logs (tails).
    pub fn describe(&self) -> String {
        let mut s = format!(
            "node host {} (gateway {}, cgroup root {}, dir {})\n  processes: {:?}\n",
            self.address,
            self.gateway,
            self.cgroup_root,
            self.dir.display(),
            self.processes()
        );
        s.push_str(&format!("  --- sessions\n{}\n", tail(&self.sessions(), 30)));
        for log in [
            "/var/log/kpssh/kubelet.log",
            "/var/log/kpssh/containerd.log",
        ] {
            s.push_str(&format!(
                "  --- {log} (tail)\n{}\n",
                tail(&self.read(log), 40)
            ));
        }
        let sshd = std::fs::read_to_string(self.dir.join("sshd.log")).unwrap_or_default();
        s.push_str(&format!("  --- sshd log (tail)\n{}\n", tail(&sshd, 10)));
        s
    }
}

impl Drop for NodeHost {
    fn drop(&mut self) {
        if let Some(relay) = self.relay.take() {
            relay.stop();
        }
        let ns = self
            .unshare
            .as_ref()
            .and_then(|c| std::fs::read_link(format!("/proc/{}/ns/pid_for_children", c.id())).ok());
        if let Some(mut child) = self.unshare.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        // The kernel kills the rest of the pid namespace with its init; wait for it.
        if let Some(ns) = ns {
            let deadline = Instant::now() + Duration::from_secs(15);
            while Instant::now() < deadline && any_in_pid_ns(&ns) {
                std::thread::sleep(Duration::from_millis(50));
            }
        }
        let _ = Command::new("/usr/sbin/ip")
            .args(["link", "del", &self.veth])
            .stderr(Stdio::null())
            .status();
        remove_cgroup_root(&self.cgroup_root);
        if std::env::var_os("KPSSH_E2E_KEEP").is_none() {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

struct Relay {
    stop: Arc<AtomicBool>,
    fd: i32,
    accept: Option<std::thread::JoinHandle<()>>,
}

impl Relay {
    fn stop(mut self) {
        self.stop.store(true, Ordering::SeqCst);
        // SAFETY: shutting down the listener's own fd wakes the blocked accept.
        unsafe {
            libc::shutdown(self.fd, libc::SHUT_RDWR);
        }
        if let Some(h) = self.accept.take() {
            let _ = h.join();
        }
    }
}

/// Copy both ways between two connections, each direction on its own thread; a direction that
/// ends shuts the other side's write half.
fn pipe(a: TcpStream, b: TcpStream) {
    let (Ok(a2), Ok(b2)) = (a.try_clone(), b.try_clone()) else {
        return;
    };
    std::thread::spawn(move || copy(a, b));
    std::thread::spawn(move || copy(b2, a2));
}

fn copy(mut from: TcpStream, mut to: TcpStream) {
    let mut buf = [0u8; 16 * 1024];
    loop {
        match from.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => {
                if to.write_all(&buf[..n]).is_err() {
                    break;
                }
            }
        }
    }
    let _ = to.shutdown(Shutdown::Write);
    let _ = from.shutdown(Shutdown::Read);
}

fn any_in_pid_ns(ns: &Path) -> bool {
    std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter(|e| {
            e.file_name()
                .to_str()
                .is_some_and(|s| s.parse::<u32>().is_ok())
        })
        .any(|e| std::fs::read_link(e.path().join("ns/pid")).ok().as_deref() == Some(ns))
}

/// A /30 of 10.231.0.0/16 that no interface of this machine uses: (gateway, host address).
fn free_pair(pid: u32, n: u32) -> (String, String) {
    let used = String::from_utf8_lossy(
        &Command::new("/usr/sbin/ip")
            .args(["-o", "-4", "addr", "show"])
            .output()
            .expect("ip addr")
            .stdout,
    )
    .into_owned();
    for k in 0..16_384u32 {
        let block = (pid.wrapping_mul(7919).wrapping_add(n * 131 + k)) % 16_384;
        let (third, fourth) = (block / 64, (block % 64) * 4);
        let gw = format!("10.231.{third}.{}", fourth + 1);
        let host = format!("10.231.{third}.{}", fourth + 2);
        if !used.contains(&format!("{gw}/")) && !used.contains(&format!("{host}/")) {
            return (gw, host);
        }
    }
    panic!("no free /30 in 10.231.0.0/16");
}

/// The cgroup every pod of the host goes below: one directory per v1 hierarchy (cpuset
/// inheriting its parent's CPUs and memory nodes), or one of the v2 tree.
fn make_cgroup_root(root: &str) {
    for h in hierarchies() {
        let dir = h.join(root.trim_start_matches('/'));
        std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("cgroup {}: {e}", dir.display()));
        for f in ["cpuset.cpus", "cpuset.mems"] {
            if h.join(f).exists() && !h.join("cgroup.controllers").exists() {
                let v = std::fs::read_to_string(h.join(f)).expect("parent cpuset");
                std::fs::write(dir.join(f), v.trim()).expect("cpuset of the cgroup root");
            }
        }
    }
}

/// The cgroup root in every hierarchy, including the hybrid layout's `unified` tree (runc
/// mirrors the pods' cgroups there).
fn remove_cgroup_root(root: &str) {
    let mut all = hierarchies();
    let unified = Path::new("/sys/fs/cgroup/unified");
    if unified.join("cgroup.procs").exists() {
        all.push(unified.to_path_buf());
    }
    for h in all {
        let top = h.join(root.trim_start_matches('/'));
        for _ in 0..50 {
            if !top.exists() || rmdir_tree(&top) {
                break;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

/// rmdir every directory below and including `dir`, deepest first (cgroupfs refuses `rm -r`).
fn rmdir_tree(dir: &Path) -> bool {
    if let Ok(entries) = std::fs::read_dir(dir) {
        for e in entries.flatten() {
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                rmdir_tree(&e.path());
            }
        }
    }
    std::fs::remove_dir(dir).is_ok()
}

/// The cgroup hierarchies to create a cgroup root in: the v2 root, or every v1 hierarchy
/// (not the hybrid layout's empty `unified` v2 tree).
fn hierarchies() -> Vec<PathBuf> {
    let base = Path::new("/sys/fs/cgroup");
    if base.join("cgroup.controllers").exists() {
        return vec![base.to_path_buf()];
    }
    std::fs::read_dir(base)
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.is_dir() && !p.ends_with("unified"))
        .collect()
}

fn ip(args: &[&str]) {
    let out = Command::new("/usr/sbin/ip")
        .args(args)
        .output()
        .expect("spawn ip");
    assert!(
        out.status.success(),
        "ip {}: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
}

fn uid_of(user: &str) -> u32 {
    let out = Command::new("id")
        .arg("-u")
        .arg(user)
        .output()
        .expect("id -u");
    String::from_utf8_lossy(&out.stdout)
        .trim()
        .parse()
        .expect("uid")
}

fn chmod(path: &Path, mode: u32) {
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).expect("chmod");
}

fn write_exec(path: &Path, text: &str) {
    std::fs::write(path, text).expect("write executable");
    chmod(path, 0o755);
}

fn tail(text: &str, lines: usize) -> String {
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}
