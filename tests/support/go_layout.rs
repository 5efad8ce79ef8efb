//! Test support: a host laid out as the Go provider's docs describe Verified mode (S62).
//!
//! ```text
//! /opt/kpssh/kpssh-shim            the shim, sshd ForceCommand for the login user
//! /etc/kpssh/allowed_signers       its trust root (the shim's default)
//! /etc/kpssh/shim.options          kpssh's root-owned options file (optional)
//! /var/lib/kpssh/shim              kpssh's state (v2 records, the phase lock)
//! /etc/kpssh/shim.env              the shim's settings by environment (optional, below)
//! /etc/sudoers.d/kpsshgo           kpsshgo ALL=(root) NOPASSWD: /opt/kpssh/kpssh-shim
//! /etc/sudoers.d/kpsshgo-env       Defaults!/opt/kpssh/kpssh-shim env_file=/etc/kpssh/shim.env
//! sshd_config                      Match User kpsshgo / ForceCommand /opt/kpssh/kpssh-shim
//! ```
//!
//! The three `/…/kpssh` paths are the real paths the shim and sudo see, but private to the
//! host: its sshd runs in a mount namespace of its own (`unshare --mount`) in which each is a
//! bind mount of a directory of the test, so that parallel tests (and this machine's own files)
//! never meet. Outside the namespace only empty mount points and the sudoers drop-in remain.
//! The login user is `kpsshgo`, whose sudo reaches exactly `/opt/kpssh/kpssh-shim`.
//!
//! The Go shim is configured by environment (`KPSSH_ALLOWED_SIGNERS`, `KPSSH_NAMESPACE`,
//! `KPSSH_PRINCIPAL`), placed by provisioning. On the sudo path the root side's environment
//! is sudo's (`env_reset` drops the login's), so provisioning places it with sudo's `env_file`:
//! root-owned, read by sudo, and neither the SSH client nor the login user can change it
//! (`env_keep` would let the login user pick the trust root). A missing file sets nothing.
#![allow(dead_code)]

use std::os::unix::fs::PermissionsExt as _;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

/// The non-root login of Go-layout hosts; sudo to the shim only.
pub const GO_USER: &str = "kpsshgo";
/// Where the Go provider's docs install the shim.
pub const SHIM: &str = "/opt/kpssh/kpssh-shim";
/// The directories the namespace replaces.
const MOUNTS: [(&str, &str); 3] = [
    ("etc-kpssh", "/etc/kpssh"),
    ("opt-kpssh", "/opt/kpssh"),
    ("var-lib-kpssh", "/var/lib/kpssh"),
];

fn run(cmd: &mut Command) {
    let out = cmd.output().expect("spawn helper");
    assert!(
        out.status.success(),
        "{cmd:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Create [`GO_USER`] (idempotent) with the Go docs' sudoers entry, and the empty mount points.
pub fn ensure_go_user() -> &'static str {
    static DONE: OnceLock<()> = OnceLock::new();
    DONE.get_or_init(|| {
        assert!(
            Path::new("/usr/bin/sudo").exists() && Path::new("/usr/bin/unshare").exists(),
            "sudo and unshare are needed: run scripts/test-deps.sh"
        );
        let exists = Command::new("id")
            .args(["-u", GO_USER])
            .output()
            .is_ok_and(|o| o.status.success());
        if !exists {
            let out = Command::new("useradd")
                .args(["-m", "-s", "/bin/sh", GO_USER])
                .output()
                .expect("useradd");
            // 9: created concurrently by another test binary.
            assert!(
                out.status.success() || out.status.code() == Some(9),
                "useradd: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        // A locked account ("!") is refused by sshd without PAM; "*" is not locked.
        run(Command::new("usermod").args(["-p", "*", GO_USER]));
        let drop_in = "/etc/sudoers.d/kpsshgo";
        std::fs::write(drop_in, format!("{GO_USER} ALL=(root) NOPASSWD: {SHIM}\n"))
            .expect("sudoers drop-in");
        std::fs::set_permissions(drop_in, std::fs::Permissions::from_mode(0o440))
            .expect("chmod sudoers");
        let env_drop_in = "/etc/sudoers.d/kpsshgo-env";
        std::fs::write(
            env_drop_in,
            format!("Defaults!{SHIM} env_file=/etc/kpssh/shim.env\n"),
        )
        .expect("sudoers env drop-in");
        std::fs::set_permissions(env_drop_in, std::fs::Permissions::from_mode(0o440))
            .expect("chmod sudoers");
        for (_, target) in MOUNTS {
            std::fs::create_dir_all(target).expect("mount point");
        }
    });
    GO_USER
}

/// The host's private `/etc/kpssh`, `/opt/kpssh` and `/var/lib/kpssh`.
pub struct GoLayout {
    pub dir: PathBuf,
}

impl GoLayout {
    /// Lay the files out under `dir`: kpssh's shim at `/opt/kpssh/kpssh-shim`, `allowed_signers`.
    pub fn new(dir: &Path, allowed_signers: &str) -> GoLayout {
        ensure_go_user();
        let layout = GoLayout {
            dir: dir.to_path_buf(),
        };
        for (name, _) in MOUNTS {
            std::fs::create_dir_all(dir.join(name)).expect("layout dir");
            std::fs::set_permissions(dir.join(name), std::fs::Permissions::from_mode(0o755))
                .expect("chmod");
        }
        std::fs::create_dir_all(dir.join("var-lib-kpssh/shim")).expect("state dir");
        let shim = Path::new(env!("CARGO_MANIFEST_DIR")).join("shim/kpssh-shim");
        let installed = dir.join("opt-kpssh/kpssh-shim");
        std::fs::copy(&shim, &installed).expect("install the shim");
        std::fs::set_permissions(&installed, std::fs::Permissions::from_mode(0o755))
            .expect("chmod shim");
        layout.write_etc("allowed_signers", allowed_signers);
        layout
    }

    /// Write `/etc/kpssh/<name>` (root-owned, 0644).
    pub fn write_etc(&self, name: &str, text: &str) {
        let path = self.dir.join("etc-kpssh").join(name);
        std::fs::write(&path, text).expect("write /etc/kpssh file");
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).expect("chmod");
    }

    /// The `sshd_config` block of the Go docs for [`GO_USER`].
    pub fn sshd_match_block() -> String {
        format!(
            "Match User {GO_USER}\n    ForceCommand {SHIM}\n    PermitTTY no\n    \
             AllowTcpForwarding no\n    X11Forwarding no\n"
        )
    }

    /// `program args…` run inside this host's mount namespace: `unshare --mount` with the three
    /// bind mounts, then `exec`. Every process it starts (sshd's sessions, sudo, the shim)
    /// sees the host's files at the real paths.
    pub fn command(&self, program: &Path) -> Command {
        let mut script = String::from("set -e\n");
        for (name, target) in MOUNTS {
            script.push_str(&format!(
                "mount --bind '{}' '{target}'\n",
                self.dir.join(name).display()
            ));
        }
        script.push_str("exec \"$@\"\n");
        let mut cmd = Command::new("/usr/bin/unshare");
        cmd.args(["--mount", "--propagation", "private", "/bin/sh", "-c"])
            .arg(script)
            .arg("sh")
            .arg(program);
        cmd
    }
}
