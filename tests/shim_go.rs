//! S62 on real OpenSSH: a host laid out as the Go provider's docs describe Verified mode
//! (`/opt/kpssh/kpssh-shim` as the ForceCommand of a non-root login that may sudo to exactly that
//! file, `/etc/kpssh/allowed_signers`, the shim configured by environment) with kpssh's shim
//! installed there. kpssh's controller code (the russh transport, `prepare`) probes it, joins
//! and leaves through sudo; the bytes the Go provider's controller sends are understood too; the
//! environment settings pick the trust root; options never cross sudo.

#[path = "support/go_layout.rs"]
mod go_layout;
#[path = "support/sshd.rs"]
mod sshd;

use std::io::Write as _;
use std::os::unix::process::CommandExt as _;
use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as B64;
use go_layout::{GO_USER, GoLayout, SHIM};
use kpssh::profile::verified::sshsig::allowed_signers_line;
use kpssh::profile::verified::{
    Expires, Params, Phase, PhaseRequest, PhaseSignatures, ProfileRef, TrustedSigners, exit,
    manifest_v2, prepare,
};
use kpssh::secret::Secret;
use kpssh::ssh::probe::parse_probe_output;
use kpssh::ssh::{
    CommandOutput, HostKeyPin, HostTarget, RemoteCommand, RusshTransport, Transport,
    TransportConfig,
};
use sshd::{KeyPair, free_port, keygen, unique_loopback};

/// Writes who ran it and with which node name into `$KPSSH_VAR_out`.
const SCRIPT: &str = "set -eu\nprintf '%s %s %s\\n' \"$(id -u)\" \"$1\" \"$KPSSH_NODE_NAME\" >> \"$KPSSH_VAR_out\"\n";

struct GoHost {
    dir: tempfile::TempDir,
    layout: GoLayout,
    address: String,
    port: u16,
    client: KeyPair,
    signer: KeyPair,
    sshd: Child,
}

impl Drop for GoHost {
    fn drop(&mut self) {
        let _ = self.sshd.kill();
        let _ = self.sshd.wait();
    }
}

impl GoHost {
    /// sshd in the host's mount namespace; `kpsshgo` (sudo) and `root` (environment settings
    /// from `SetEnv`: another signers file, namespace `example`, principal `ops`) force the shim.
    fn start() -> GoHost {
        let dir = tempfile::tempdir().expect("tempdir");
        let keys = dir.path().join("keys");
        std::fs::create_dir_all(&keys).expect("keys");
        let signer = keygen(&keys, "signer", "ed25519", None);
        let client = keygen(&keys, "client", "ed25519", None);
        let hostkey = keygen(&keys, "hostkey", "ed25519", None);
        let line = allowed_signers_line(&signer.public).expect("allowed line");
        let layout = GoLayout::new(&dir.path().join("host"), &format!("{line}\n"));
        // The root login's signers: principal `ops`, namespace `example`.
        let key = signer.public.split_whitespace().take(2).collect::<Vec<_>>();
        layout.write_etc(
            "ops_signers",
            &format!("ops namespaces=\"example\" {}\n", key.join(" ")),
        );
        let out = dir.path().join("out");
        std::fs::create_dir_all(&out).expect("out");
        std::fs::write(
            dir.path().join("authorized_keys"),
            format!("{}\n", client.public),
        )
        .expect("authorized_keys");
        let address = unique_loopback();
        let port = free_port(&address);
        let d = dir.path().display();
        let config = format!(
            "ListenAddress {address}:{port}\nHostKey {hk}\nPidFile {d}/sshd.pid\n\
             AuthorizedKeysFile {d}/authorized_keys\nStrictModes no\nUsePAM no\n\
             PermitRootLogin prohibit-password\nPubkeyAuthentication yes\n\
             PasswordAuthentication no\nKbdInteractiveAuthentication no\nLogLevel VERBOSE\n\
             MaxStartups 100:30:200\n\
             Match User root\n    ForceCommand {SHIM}\n    \
             SetEnv KPSSH_ALLOWED_SIGNERS=/etc/kpssh/ops_signers KPSSH_NAMESPACE=example KPSSH_PRINCIPAL=ops\n\
             {go}",
            hk = hostkey.private_path.display(),
            go = GoLayout::sshd_match_block(),
        );
        std::fs::write(dir.path().join("sshd_config"), config).expect("sshd_config");
        let _ = std::fs::create_dir_all("/run/sshd");
        let log = dir.path().join("sshd.log");
        let mut cmd = layout.command(Path::new(sshd::SSHD));
        cmd.arg("-D")
            .arg("-E")
            .arg(&log)
            .arg("-f")
            .arg(dir.path().join("sshd_config"))
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
                    std::fs::read_to_string(&log).unwrap_or_default()
                );
            }
            if std::fs::read_to_string(&log)
                .unwrap_or_default()
                .contains("Server listening on")
            {
                break;
            }
            assert!(Instant::now() < deadline, "sshd did not start");
            std::thread::sleep(Duration::from_millis(20));
        }
        GoHost {
            dir,
            layout,
            address,
            port,
            client,
            signer,
            sshd: child,
        }
    }

    fn target(&self, user: &str) -> HostTarget {
        HostTarget {
            host: format!("kpssh-system/{}", self.address),
            address: self.address.clone(),
            port: self.port,
            user: user.into(),
            key: Secret::new(self.client.private.clone()),
            pin: HostKeyPin::TrustOnFirstUse,
            jump: None,
        }
    }

    fn out(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("out/ran")).unwrap_or_default()
    }

    fn params(&self, node: &str) -> Params {
        let mut p = Params::new();
        p.insert("KPSSH_NODE_NAME", node).expect("param");
        p.insert(
            "KPSSH_VAR_out",
            self.dir.path().join("out/ran").display().to_string(),
        )
        .expect("param");
        p
    }

    fn sshd_log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("sshd.log")).unwrap_or_default()
    }
}

fn script(phase: Phase) -> String {
    SCRIPT.replace("\"$1\"", phase.as_str())
}

fn transport() -> RusshTransport {
    RusshTransport::new(TransportConfig {
        handshake_timeout: Duration::from_secs(10),
        ..TransportConfig::default()
    })
}

async fn exec(t: &RusshTransport, tg: &HostTarget, cmd: &str, stdin: &[u8]) -> CommandOutput {
    t.exec(
        tg,
        RemoteCommand::verbatim(cmd, Duration::from_secs(60)).with_stdin(stdin.to_vec()),
    )
    .await
    .expect("exec")
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

fn request<'a>(
    host: &GoHost,
    phase: Phase,
    script: &'a str,
    signatures: PhaseSignatures,
) -> PhaseRequest<'a> {
    PhaseRequest {
        phase,
        profile: "go-profile@1".parse::<ProfileRef>().expect("profile"),
        script,
        signatures,
        params: host.params("n1"),
        shim_command: SHIM,
        allow_v1: true,
        timeout: Some(Duration::from_secs(30)),
    }
}

// S62: the Go layout with kpssh's shim: the controller's probe is answered through sudo, a
// v1-signed join and leave (the Go provider's profiles carry only v1 signatures) run as root once
// the root-owned options file allows v1, and are refused without it, where a v2 join still runs.
#[tokio::test]
async fn s62_go_layout_host_probes_joins_and_leaves_through_sudo() {
    let host = GoHost::start();
    let t = transport();
    let tg = host.target(GO_USER);
    let report = t
        .probe(&tg, Some(SHIM))
        .await
        .unwrap_or_else(|e| panic!("probe through sudo: {e}\n{}", host.sshd_log()));
    assert!(report.facts.cpu > 0 && report.facts.memory_kib > 0);
    assert!(report.fingerprint.starts_with("SHA256:"));

    let trusted = TrustedSigners::parse(&[host.signer.public.as_str()]).expect("trusted");
    host.layout.write_etc(
        "shim.options",
        "# migration: the Go profiles are v1\n--allow-v1\n",
    );
    for phase in [Phase::Join, Phase::Leave] {
        let s = script(phase);
        let sigs = PhaseSignatures {
            v1: Some(host.signer.sign("kpssh", s.as_bytes())),
            v2: None,
        };
        let run = prepare(
            &trusted,
            request(&host, phase, &s, sigs),
            jiff::Timestamp::now(),
        )
        .expect("prepare");
        assert_eq!(run.version, 1);
        let out = exec(&t, &tg, &run.command, &run.stdin).await;
        assert_eq!(out.exit_status, 0, "{phase}: {}", text(&out.stderr));
    }
    assert_eq!(
        host.out(),
        "0 join n1\n0 leave n1\n",
        "ran as root, in order"
    );

    // Without the options file the shim's default holds: v1 is refused, nothing runs.
    std::fs::remove_file(host.layout.dir.join("etc-kpssh/shim.options")).expect("rm options");
    let s = script(Phase::Join);
    let v1 = PhaseSignatures {
        v1: Some(host.signer.sign("kpssh", s.as_bytes())),
        v2: None,
    };
    let run = prepare(
        &trusted,
        request(&host, Phase::Join, &s, v1),
        jiff::Timestamp::now(),
    )
    .expect("prepare");
    let out = exec(&t, &tg, &run.command, &run.stdin).await;
    assert_eq!(
        out.exit_status,
        exit::EXPIRED as u32,
        "{}",
        text(&out.stderr)
    );
    assert!(text(&out.stderr).contains("shim.options"), "names the fix");
    assert_eq!(host.out().lines().count(), 2);
    let expires: Expires = (jiff::Timestamp::now() + jiff::SignedDuration::from_hours(24))
        .strftime("%Y-%m-%dT%H:%M:%SZ")
        .to_string()
        .parse()
        .expect("expires");
    let profile: ProfileRef = "go-profile@1".parse().expect("profile");
    let manifest = manifest_v2(Phase::Join, &profile, s.as_bytes(), &expires);
    let v2 = PhaseSignatures {
        v1: None,
        v2: Some((
            expires.to_string(),
            host.signer.sign("kpssh", manifest.as_bytes()),
        )),
    };
    let run = prepare(
        &trusted,
        request(&host, Phase::Join, &s, v2),
        jiff::Timestamp::now(),
    )
    .expect("prepare v2");
    let out = exec(&t, &tg, &run.command, &run.stdin).await;
    assert_eq!(out.exit_status, 0, "{}", text(&out.stderr));
    assert_eq!(host.out().lines().last(), Some("0 join n1"));
}

// S62: what the Go provider's controller sends (its shim command, its probe envelope; a v1
// envelope without params-b64) reaches kpssh's shim on the Go layout and is answered in the Go
// format, which kpssh's parser reads as well.
#[tokio::test]
async fn s62_the_go_controllers_bytes_are_understood() {
    let host = GoHost::start();
    let t = transport();
    let tg = host.target(GO_USER);
    let out = exec(&t, &tg, SHIM, b"kpssh-envelope: 1\nphase: probe\n").await;
    assert_eq!(out.exit_status, 0, "{}", text(&out.stderr));
    let stdout = text(&out.stdout);
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(
        lines.len(),
        4,
        "nproc, MemTotal, uname -m, kubelet: {stdout:?}"
    );
    let nproc = Command::new("nproc").output().expect("nproc");
    assert_eq!(lines[0], text(&nproc.stdout).trim());
    let facts = parse_probe_output(&out.stdout).expect("kpssh parses the Go format");
    assert_eq!(facts.cpu.to_string(), lines[0]);

    host.layout.write_etc("shim.options", "--allow-v1\n");
    let s = "echo ran-without-params\n";
    let sig = host.signer.sign("kpssh", s.as_bytes());
    let go_join = format!(
        "kpssh-envelope: 1\nphase: join\nsig-b64: {}\nscript-b64: {}\n",
        B64.encode(&sig),
        B64.encode(s)
    );
    let out = exec(&t, &tg, SHIM, go_join.as_bytes()).await;
    assert_eq!(out.exit_status, 0, "{}", text(&out.stderr));
    assert!(text(&out.stdout).contains("ran-without-params"));
}

// S62: a root login does not escalate and takes the trust root, namespace and principal from
// the environment sshd sets (the Go shim's KPSSH_ALLOWED_SIGNERS/NAMESPACE/PRINCIPAL).
#[tokio::test]
async fn s62_environment_picks_the_trust_root_on_a_root_login() {
    let host = GoHost::start();
    host.layout.write_etc("shim.options", "--allow-v1\n");
    let t = transport();
    let tg = host.target("root");
    let s = script(Phase::Join);
    let envelope = |namespace: &str| {
        format!(
            "kpssh-envelope: 1\nphase: join\nparams-b64: {}\nsig-b64: {}\nscript-b64: {}\n",
            B64.encode(host.params("n2").to_text()),
            B64.encode(host.signer.sign(namespace, s.as_bytes())),
            B64.encode(&s)
        )
    };
    let out = exec(&t, &tg, SHIM, envelope("kpssh").as_bytes()).await;
    assert_eq!(
        out.exit_status,
        exit::SIGNATURE as u32,
        "namespace kpssh is not the configured one: {}",
        text(&out.stderr)
    );
    let out = exec(&t, &tg, SHIM, envelope("example").as_bytes()).await;
    assert_eq!(out.exit_status, 0, "{}", text(&out.stderr));
    assert_eq!(host.out(), "0 join n2\n");
}

fn in_namespace(host: &GoHost, args: &[&str], stdin: &[u8]) -> Output {
    let mut cmd = host.layout.command(Path::new("/usr/sbin/runuser"));
    cmd.args(args)
        .env_remove("SUDO_UID")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = cmd.spawn().expect("spawn");
    let mut input = child.stdin.take().expect("stdin");
    let data = stdin.to_vec();
    let writer = std::thread::spawn(move || {
        let _ = input.write_all(&data);
    });
    let out = child.wait_with_output().expect("wait");
    writer.join().expect("writer");
    out
}

// S62: options do not cross sudo. The login user's sudo reaches the shim with any arguments,
// so a local user of that account must not choose the trust root: a root shim started by sudo
// refuses command-line options, and a non-root shim with options refuses to escalate (naming
// the options file and --no-sudo).
#[test]
fn s62_options_never_cross_sudo() {
    let host = GoHost::start();
    let evil = host.dir.path().join("evil_signers");
    std::fs::write(&evil, "").expect("evil");
    let out = in_namespace(
        &host,
        &[
            "-u",
            GO_USER,
            "--",
            "sudo",
            "-n",
            SHIM,
            "--allowed-signers",
            &evil.display().to_string(),
            "--",
            "run",
            "join",
        ],
        b"kpssh-envelope: 2\n",
    );
    assert_eq!(out.status.code(), Some(exit::INTERNAL), "{out:?}");
    assert!(
        text(&out.stderr).contains("refused when sudo started the shim"),
        "{out:?}"
    );

    let out = in_namespace(
        &host,
        &[
            "-u",
            GO_USER,
            "--",
            SHIM,
            "--allowed-signers",
            "/etc/kpssh/allowed_signers",
            "probe",
        ],
        b"",
    );
    assert_eq!(out.status.code(), Some(exit::INTERNAL), "{out:?}");
    let err = text(&out.stderr);
    assert!(
        err.contains("do not cross sudo") && err.contains("--no-sudo"),
        "{err}"
    );

    // --no-sudo: the login user runs the shim as itself.
    let out = in_namespace(
        &host,
        &["-u", GO_USER, "--", SHIM, "--no-sudo", "probe"],
        b"",
    );
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    assert!(text(&out.stdout).starts_with("kpssh-probe=1\n"));
}
