//! `kpssh phase` against a real sshd: renders the profile, runs the phase, prints its output
//! with secrets redacted and exits with the script's status.

#[path = "support/sshd.rs"]
mod sshd;

use std::process::Command;

#[test]
fn phase_runs_a_profile_script_on_a_real_host() {
    let sshd = sshd::Sshd::start();
    let dir = tempfile::tempdir().expect("tempdir");
    let key = sshd::keygen(dir.path(), "client", "ed25519", None);
    sshd.authorize(&key.public);
    let profile = dir.path().join("profile.yaml");
    std::fs::write(
        &profile,
        r#"apiVersion: karpenter.dklesev.github.io/v1beta1
kind: SSHJoinProfile
metadata:
  name: manual
spec:
  version: "3"
  scripts:
    install: "true"
    join: |
      echo "node=$KPSSH_NODE_NAME var=$KPSSH_VAR_region token=$KPSSH_BOOTSTRAP_TOKEN"
      echo "secret={{ .Secrets.apikey }}" >&2
      exit 7
    leave: "echo left from $KPSSH_HOST_ADDRESS"
"#,
    )
    .expect("profile");
    let run = |phase: &str, extra: &[&str]| {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_kpssh"));
        cmd.args(["phase", "--profile"])
            .arg(&profile)
            .args([
                "--phase",
                phase,
                "--address",
                &sshd.address,
                "--port",
                &sshd.port.to_string(),
                "--key",
            ])
            .arg(&key.private_path)
            .args(["--known-host", &sshd.fingerprint()])
            .args(extra);
        cmd.output().expect("kpssh runs")
    };
    let join = run(
        "join",
        &[
            "--var",
            "region=eu-1",
            "--secret",
            "apikey=supersecretvalue",
            "--token",
            "abcdef.0123456789abcdef",
            "--cluster-endpoint",
            "https://api:6443",
            "--node-name",
            "n1",
        ],
    );
    let stdout = String::from_utf8_lossy(&join.stdout);
    let stderr = String::from_utf8_lossy(&join.stderr);
    assert_eq!(
        join.status.code(),
        Some(7),
        "exit status of the script; stderr: {stderr}"
    );
    assert!(
        stdout.contains("node=n1 var=eu-1 token=<redacted>"),
        "{stdout}"
    );
    assert!(stderr.contains("secret=<redacted>"), "{stderr}");
    assert!(!stdout.contains("0123456789abcdef") && !stderr.contains("supersecretvalue"));
    let leave = run("leave", &[]);
    assert_eq!(
        leave.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&leave.stderr)
    );
    assert_eq!(
        String::from_utf8_lossy(&leave.stdout).trim(),
        format!("left from {}", sshd.address)
    );
    let bad = run("join", &[]);
    assert_eq!(
        bad.status.code(),
        Some(1),
        "no endpoint is a configuration error"
    );
    // By hand the fix is a flag, not a node class field.
    let bad_stderr = String::from_utf8_lossy(&bad.stderr);
    assert!(bad_stderr.contains("--cluster-endpoint"), "{bad_stderr}");
    assert!(!bad_stderr.contains("spec.cluster"), "{bad_stderr}");
}

/// #23: `kpssh phase` prints a script's output redacted also where the transport's 1 MiB cap
/// cut it: no piece of a secret that straddled the cap reaches the terminal. The cap used to
/// keep the head, so the printed stderr ended with the secret's first bytes.
#[test]
fn a_secret_straddling_the_output_cap_is_not_printed() {
    let sshd = sshd::Sshd::start();
    let dir = tempfile::tempdir().expect("tempdir");
    let key = sshd::keygen(dir.path(), "client", "ed25519", None);
    sshd.authorize(&key.public);
    let secret = "S3CRETVALUE0123456789";
    const CAP: usize = 1 << 20;
    // Noise up to 7 bytes before the cap, then the secret; and the secret first, then noise
    // reaching 7 bytes into it from the end of the kept window.
    for (name, script) in [
        (
            "after",
            format!(
                "head -c {} /dev/zero | tr '\\0' x >&2; printf '%s' \"$KPSSH_SECRET_APIKEY\" >&2; exit 1",
                CAP - 7
            ),
        ),
        (
            "before",
            format!(
                "printf '%s' \"$KPSSH_SECRET_APIKEY\" >&2; head -c {} /dev/zero | tr '\\0' y >&2; exit 1",
                CAP - 7
            ),
        ),
    ] {
        let profile = dir.path().join(format!("{name}.yaml"));
        std::fs::write(
            &profile,
            format!(
                "apiVersion: karpenter.dklesev.github.io/v1beta1\nkind: SSHJoinProfile\n\
                 metadata:\n  name: capped\nspec:\n  scripts:\n    install: \"true\"\n    \
                 join: {script:?}\n    leave: \"true\"\n"
            ),
        )
        .expect("profile");
        let out = Command::new(env!("CARGO_BIN_EXE_kpssh"))
            .args(["phase", "--profile"])
            .arg(&profile)
            .args([
                "--phase",
                "join",
                "--cluster-endpoint",
                "https://api:6443",
                "--address",
                &sshd.address,
                "--port",
                &sshd.port.to_string(),
                "--key",
            ])
            .arg(&key.private_path)
            .args(["--known-host", &sshd.fingerprint()])
            .args(["--secret", &format!("apikey={secret}")])
            .output()
            .expect("kpssh runs");
        assert_eq!(out.status.code(), Some(1), "{name}");
        let stderr = String::from_utf8_lossy(&out.stderr);
        for k in 4..=secret.len() {
            assert!(
                !stderr.contains(&secret[..k]) && !stderr.contains(&secret[secret.len() - k..]),
                "{name}: a {k}-byte piece of the secret was printed: {:?} … {:?}",
                &stderr[..stderr.len().min(60)],
                &stderr[stderr.len().saturating_sub(200)..]
            );
        }
        assert!(stderr.contains("<redacted>"), "{name}");
        assert!(stderr.contains("output capped"), "{name}");
    }
}
