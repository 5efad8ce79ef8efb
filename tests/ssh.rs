//! Tier 3: the russh `Transport` against real OpenSSH `sshd` on loopback addresses.
//!
//! Scenarios: S1 (TOFU pin and probe facts, knownHost wins), S2 (refused/timeouts are errors),
//! S3 (mismatching pin fails before any session), S5 (unparsable probe output).

#[path = "ssh/cancel.rs"]
mod cancel;
#[path = "ssh/sha1.rs"]
mod sha1;
#[path = "support/sshd.rs"]
mod sshd;

use std::time::{Duration, Instant};

use kpssh::secret::Secret;
use kpssh::ssh::probe::ProbeError;
use kpssh::ssh::{
    HostKeyPin, HostTarget, RemoteCommand, RusshTransport, Transport, TransportConfig,
    TransportError,
};
use sshd::{KeyPair, Sshd, SshdOptions, Tarpit, keygen};

fn target(sshd: &Sshd, key: &KeyPair) -> HostTarget {
    HostTarget {
        host: format!("kpssh-system/{}", sshd.address),
        address: sshd.address.clone(),
        port: sshd.port,
        user: "root".into(),
        key: Secret::new(key.private.clone()),
        pin: HostKeyPin::TrustOnFirstUse,
        jump: None,
    }
}

fn transport() -> RusshTransport {
    RusshTransport::new(TransportConfig {
        handshake_timeout: Duration::from_secs(10),
        ..TransportConfig::default()
    })
}

/// A daemon plus an authorized ed25519 key.
fn setup() -> (Sshd, KeyPair) {
    let sshd = Sshd::start();
    let key = keygen(sshd.dir.path(), "client", "ed25519", None);
    sshd.authorize(&key.public);
    (sshd, key)
}

fn secs(n: u64) -> Duration {
    Duration::from_secs(n)
}

async fn sh(t: &RusshTransport, target: &HostTarget, cmd: &str) -> kpssh::ssh::CommandOutput {
    t.exec(target, RemoteCommand::new(cmd, secs(20)))
        .await
        .expect("exec")
}

// S1: trust on first use reports the host key fingerprint and the observed facts.
#[tokio::test]
async fn s1_tofu_probe_reports_fingerprint_and_facts() {
    let (sshd, key) = setup();
    let t = transport();
    let report = t.probe(&target(&sshd, &key), None).await.expect("probe");
    assert_eq!(report.fingerprint, sshd.fingerprint());
    assert_eq!(report.fingerprint.len(), "SHA256:".len() + 43);
    let cpus = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1);
    assert!(report.facts.cpu >= 1 && report.facts.cpu as usize <= cpus.max(1) * 64);
    let meminfo = std::fs::read_to_string("/proc/meminfo").expect("meminfo");
    assert!(meminfo.contains(&format!(" {} kB", report.facts.memory_kib)));
    if cfg!(target_arch = "x86_64") {
        assert_eq!(report.facts.arch, "amd64");
    }
    assert!(!report.facts.kubelet_active);
}

// S1/S3: knownHost in each of its three forms is accepted; the wrong key in each form is not.
#[tokio::test]
async fn s1_known_host_override_each_form() {
    let (sshd, key) = setup();
    let other = Sshd::start_with(SshdOptions {
        host_key: "ecdsa",
        ..Default::default()
    });
    let t = transport();
    let good = [
        sshd.fingerprint(),
        format!("{} {}", sshd.known_hosts_name(), sshd.host_public_key()),
        sshd.hashed_known_hosts_line(),
        sshd.host_key.public.clone(),
    ];
    let bad = [
        other.fingerprint(),
        format!("{} {}", sshd.known_hosts_name(), other.host_public_key()),
        // right key, but a hashed entry for another host name
        other.hashed_known_hosts_line().replacen(
            &other.host_public_key(),
            &sshd.host_public_key(),
            1,
        ),
        other.host_key.public.clone(),
    ];
    for (i, kh) in good.iter().enumerate() {
        let mut tg = target(&sshd, &key);
        tg.host = format!("ns/good-{i}");
        // knownHost wins over a (wrong) recorded fingerprint.
        tg.pin = HostKeyPin::from_sources(Some(kh), Some(&other.fingerprint()));
        let r = t
            .probe(&tg, None)
            .await
            .unwrap_or_else(|e| panic!("{kh}: {e}"));
        assert_eq!(r.fingerprint, sshd.fingerprint());
    }
    for (i, kh) in bad.iter().enumerate() {
        let mut tg = target(&sshd, &key);
        tg.host = format!("ns/bad-{i}");
        tg.pin = HostKeyPin::from_sources(Some(kh), None);
        let e = t.probe(&tg, None).await.expect_err(kh);
        match e {
            TransportError::HostKeyMismatch { host, actual, .. } => {
                assert_eq!(host, format!("ns/bad-{i}"));
                assert_eq!(actual, sshd.fingerprint());
            }
            other => panic!("{kh}: {other}"),
        }
    }
}

// S3: a pin that differs fails in the key-check callback: no auth, no session, nothing runs.
#[tokio::test]
async fn s3_mismatching_pin_opens_no_session() {
    let (sshd, key) = setup();
    let other = keygen(sshd.dir.path(), "not-the-host", "ed25519", None);
    let t = transport();
    let mut tg = target(&sshd, &key);
    tg.pin = HostKeyPin::Fingerprint(other.fingerprint());
    let marker = sshd.dir.path().join("ran");
    let e = t
        .exec(
            &tg,
            RemoteCommand::new(format!("touch {}", marker.display()), secs(10)),
        )
        .await
        .expect_err("mismatch");
    let TransportError::HostKeyMismatch {
        host,
        expected,
        actual,
    } = &e
    else {
        panic!("{e}")
    };
    assert_eq!(host, &tg.host);
    assert_eq!(expected, &other.fingerprint());
    assert_eq!(actual, &sshd.fingerprint());
    assert!(e.touched_host() && !e.is_transient());
    assert!(e.to_string().contains(&tg.host));
    tokio::time::sleep(Duration::from_millis(300)).await;
    let log = sshd.log();
    assert_eq!(sshd.connections(), 1, "{log}");
    assert!(!log.contains("Accepted publickey"), "{log}");
    assert!(!log.contains("session_new"), "{log}");
    assert!(!log.contains("Starting session"), "{log}");
    assert!(!marker.exists());
    assert_eq!(t.pooled_connections(), 0);
}

// S2: a key that is not authorized is refused with an error naming the host.
#[tokio::test]
async fn s2_refused_key() {
    let (sshd, _) = setup();
    let stranger = keygen(sshd.dir.path(), "stranger", "ed25519", None);
    let t = transport();
    let tg = target(&sshd, &stranger);
    let e = t.probe(&tg, None).await.expect_err("refused");
    assert!(
        matches!(&e, TransportError::AuthRefused { host, user } if host == &tg.host && user == "root"),
        "{e}"
    );
    assert!(e.to_string().contains(&tg.host));
    assert!(!e.to_string().contains("PRIVATE KEY"));
}

#[tokio::test]
async fn key_types_ed25519_ecdsa_rsa() {
    let sshd = Sshd::start();
    let t = transport();
    for kind in ["ed25519", "ecdsa", "rsa"] {
        let key = keygen(sshd.dir.path(), &format!("client-{kind}"), kind, None);
        sshd.authorize(&key.public);
        let mut tg = target(&sshd, &key);
        tg.host = format!("ns/{kind}");
        let out = sh(&t, &tg, "echo ok").await;
        assert_eq!(out.stdout, b"ok\n", "{kind}");
    }
    // PEM (PKCS#1) RSA text works too.
    let pem = keygen(sshd.dir.path(), "client-pem", "rsa", None);
    let conv = std::process::Command::new(sshd::SSH_KEYGEN)
        .args(["-q", "-p", "-N", "", "-P", "", "-m", "PEM", "-f"])
        .arg(&pem.private_path)
        .output()
        .expect("convert");
    assert!(conv.status.success());
    sshd.authorize(&pem.public);
    let text = std::fs::read_to_string(&pem.private_path).expect("pem");
    assert!(text.starts_with("-----BEGIN RSA PRIVATE KEY-----"));
    let mut tg = target(&sshd, &pem);
    tg.host = "ns/pem".into();
    tg.key = Secret::new(text);
    assert_eq!(sh(&t, &tg, "echo ok").await.stdout, b"ok\n");
}

#[tokio::test]
async fn encrypted_or_invalid_key_is_a_clear_error_before_dialling() {
    let (sshd, _) = setup();
    let enc = keygen(sshd.dir.path(), "enc", "ed25519", Some("correct horse"));
    sshd.authorize(&enc.public);
    let t = transport();
    let tg = target(&sshd, &enc);
    let e = t.probe(&tg, None).await.expect_err("encrypted");
    assert!(
        matches!(&e, TransportError::KeyEncrypted { host } if host == &tg.host),
        "{e}"
    );
    assert!(!e.touched_host());
    let mut bad = tg.clone();
    bad.key = Secret::new(
        "-----BEGIN OPENSSH PRIVATE KEY-----\nnot a key\n-----END OPENSSH PRIVATE KEY-----\n",
    );
    let e = t.probe(&bad, None).await.expect_err("invalid");
    assert!(matches!(e, TransportError::KeyInvalid { .. }), "{e}");
    assert!(!e.to_string().contains("not a key"));
    assert_eq!(sshd.connections(), 0, "nothing reached the host");
}

#[tokio::test]
async fn exit_codes_stdin_and_stderr() {
    let (sshd, key) = setup();
    let t = transport();
    let tg = target(&sshd, &key);
    assert_eq!(sh(&t, &tg, "exit 7").await.exit_status, 7);
    assert_eq!(sh(&t, &tg, "true").await.exit_status, 0);
    let out = t
        .exec(
            &tg,
            RemoteCommand::new("cat; echo err >&2; exit 3", secs(10)).with_stdin(b"in\n".to_vec()),
        )
        .await
        .expect("exec");
    assert_eq!(
        (out.exit_status, &out.stdout[..], &out.stderr[..]),
        (3, &b"in\n"[..], &b"err\n"[..])
    );
    // A 300 KiB script through `bash -s` (as phases run).
    let script = format!("x=0\n{}echo done $x\n", "x=$((x+1))\n".repeat(30_000));
    let out = t
        .exec(
            &tg,
            RemoteCommand::new("bash -s", secs(20)).with_stdin(script.into_bytes()),
        )
        .await
        .expect("exec");
    assert_eq!(out.stdout, b"done 30000\n");
    // A command that ignores a large stdin still returns at its exit.
    let started = Instant::now();
    let out = t
        .exec(
            &tg,
            RemoteCommand::new("exit 0", secs(20)).with_stdin(vec![b'x'; 10 << 20]),
        )
        .await
        .expect("exec");
    assert_eq!(out.exit_status, 0);
    assert!(started.elapsed() < secs(5), "{:?}", started.elapsed());
    // Killed by a signal: 128 + n.
    assert_eq!(sh(&t, &tg, "kill -TERM $$").await.exit_status, 128 + 15);
}

// A command that exits without reading a large stdin leaves data queued behind the host's
// window; the call must still return at the exit every time (it once hung on the channel close
// about one time in ten), and the host must stay usable.
#[tokio::test]
async fn unread_stdin_never_hangs_the_call() {
    let (sshd, key) = setup();
    let t = transport();
    let tg = target(&sshd, &key);
    for round in 0..15 {
        let started = Instant::now();
        let out = tokio::time::timeout(
            secs(30),
            t.exec(
                &tg,
                RemoteCommand::new("exit 0", secs(20)).with_stdin(vec![b'x'; 10 << 20]),
            ),
        )
        .await
        .unwrap_or_else(|_| panic!("round {round}: the call hung"))
        .expect("exec");
        assert_eq!(out.exit_status, 0);
        assert!(
            started.elapsed() < secs(5),
            "round {round}: {:?}",
            started.elapsed()
        );
        assert_eq!(sh(&t, &tg, "exit 7").await.exit_status, 7, "round {round}");
    }
}

#[tokio::test]
async fn command_timeout_returns_promptly_and_kills_the_remote_process() {
    let (sshd, key) = setup();
    let t = transport();
    let tg = target(&sshd, &key);
    let pidfile = sshd.dir.path().join("pids");
    let started = Instant::now();
    let e = t
        .exec(
            &tg,
            RemoteCommand::new(
                format!(
                    "sleep 300 & echo $! > {p}; echo $$ >> {p}; wait",
                    p = pidfile.display()
                ),
                secs(2),
            ),
        )
        .await
        .expect_err("timeout");
    let elapsed = started.elapsed();
    eprintln!("2s command timeout returned after {elapsed:?}");
    assert!(
        matches!(&e, TransportError::CommandTimeout { host, after } if host == &tg.host && *after == secs(2)),
        "{e}"
    );
    assert!(e.is_transient());
    assert!(elapsed < secs(4), "returned after {elapsed:?}");
    let pids: Vec<u32> = std::fs::read_to_string(&pidfile)
        .expect("pids")
        .lines()
        .filter_map(|l| l.trim().parse().ok())
        .collect();
    assert_eq!(pids.len(), 2);
    let deadline = Instant::now() + secs(3);
    while pids.iter().any(|p| sshd::process_alive(*p)) {
        assert!(
            Instant::now() < deadline,
            "remote processes {pids:?} survive: {}",
            sshd.log()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // The connection is still usable.
    assert_eq!(sh(&t, &tg, "echo ok").await.stdout, b"ok\n");
    assert_eq!(sshd.connections(), 1);
}

#[tokio::test]
async fn background_child_holding_stdout_does_not_block() {
    let (sshd, key) = setup();
    let t = transport();
    let tg = target(&sshd, &key);
    let started = Instant::now();
    let out = t
        .exec(
            &tg,
            RemoteCommand::new("sleep 8 & echo started; exit 4", secs(20)),
        )
        .await
        .expect("exec");
    assert_eq!(out.exit_status, 4);
    assert_eq!(out.stdout, b"started\n");
    assert!(started.elapsed() < secs(3), "{:?}", started.elapsed());
}

#[tokio::test]
async fn output_is_capped_and_dropped_bytes_counted() {
    let (sshd, key) = setup();
    let t = transport();
    let tg = target(&sshd, &key);
    let rss_before = sshd::vm_rss_kib();
    let started = Instant::now();
    let out = t
        .exec(
            &tg,
            RemoteCommand::new(
                "head -c 52428800 /dev/zero; head -c 3000000 /dev/zero >&2",
                secs(60),
            ),
        )
        .await
        .expect("exec");
    let rss_after = sshd::vm_rss_kib();
    let cap = 1 << 20;
    assert_eq!(out.stdout.len(), cap);
    assert_eq!(out.stdout_dropped, 52_428_800 - cap as u64);
    assert_eq!(out.stderr.len(), cap);
    assert_eq!(out.stderr_dropped, 3_000_000 - cap as u64);
    eprintln!(
        "50 MiB through the cap in {:?}; RSS {} KiB -> {} KiB",
        started.elapsed(),
        rss_before,
        rss_after
    );
    assert!(
        rss_after.saturating_sub(rss_before) < 32 * 1024,
        "RSS grew from {rss_before} KiB to {rss_after} KiB"
    );

    // A smaller configured cap.
    let small = RusshTransport::new(TransportConfig {
        stdout_cap: 10,
        stderr_cap: 0,
        ..TransportConfig::default()
    });
    let out = small
        .exec(&tg, RemoteCommand::new("seq 1 100; echo e >&2", secs(10)))
        .await
        .expect("exec");
    // The end of the stream is kept: that is where a failing script says why.
    assert_eq!(out.stdout, b"98\n99\n100\n");
    assert_eq!(out.stdout_dropped, 292 - 10);
    assert_eq!((out.stderr.len(), out.stderr_dropped), (0, 2));
}

/// #23: a secret that straddles the output cap leaves no part of itself in what is quoted.
/// The transport keeps the end of a stream (the old head-keeping cap ended the kept text with
/// the secret's first bytes, and that end is what events quote), and the redactor removes the
/// rest of a secret cut at the front of the kept window.
#[tokio::test]
async fn redaction_across_the_output_cap_leaves_no_fragment() {
    use kpssh::profile::redact::{PLACEHOLDER, Redactor};
    let (sshd, key) = setup();
    let tg = target(&sshd, &key);
    let secret = "S3CRETVALUE0123456789";
    let redactor = Redactor::new(None, [&Secret::new(secret)]);
    let t = RusshTransport::new(TransportConfig {
        stderr_cap: 4096,
        ..TransportConfig::default()
    });
    // Noise, the secret, then noise such that the cap's edge falls 7 bytes before the secret's
    // end, and the same again with the edge 7 bytes after its start.
    for (before, after) in [(5000, 4096 - 7), (4096 - 7, 0)] {
        let cmd = format!(
            "head -c {before} /dev/zero | tr '\\0' x >&2; printf '%s' '{secret}' >&2; \
             head -c {after} /dev/zero | tr '\\0' y >&2; exit 3"
        );
        let out = t
            .exec(&tg, RemoteCommand::new(cmd, secs(20)))
            .await
            .expect("exec");
        assert_eq!(out.exit_status, 3);
        assert_eq!(out.stderr.len(), 4096);
        assert_eq!(
            out.stderr_dropped as usize,
            before + secret.len() + after - 4096
        );
        let event_tail = redactor.tail_output(&out.stderr, out.stderr_dropped, 2048);
        let whole = redactor.redact_window(
            &String::from_utf8_lossy(&out.stderr),
            out.stderr_dropped > 0,
            false,
        );
        for text in [&event_tail, &whole] {
            for k in 4..=secret.len() {
                assert!(
                    !text.contains(&secret[..k]) && !text.contains(&secret[secret.len() - k..]),
                    "a {k}-byte piece of the secret survived: {:?}",
                    &text[..text.len().min(80)]
                );
            }
        }
        if after > 0 {
            assert!(whole.starts_with(PLACEHOLDER), "{:?}", &whole[..40]);
        } else {
            assert!(event_tail.ends_with(PLACEHOLDER), "{event_tail:?}");
        }
    }
}

#[tokio::test]
async fn jump_host() {
    let bastion = Sshd::start();
    let (target_sshd, key) = setup();
    let bkey = keygen(bastion.dir.path(), "bastion-client", "ed25519", None);
    bastion.authorize(&bkey.public);
    let t = transport();
    let mut tg = target(&target_sshd, &key);
    let mut jump = target(&bastion, &bkey);
    jump.pin = HostKeyPin::Fingerprint(bastion.fingerprint());
    tg.pin = HostKeyPin::KnownHost(target_sshd.host_public_key());
    tg.jump = Some(Box::new(jump));
    let r = t.probe(&tg, None).await.expect("probe via jump");
    assert_eq!(r.fingerprint, target_sshd.fingerprint());
    let out = sh(&t, &tg, "echo via").await;
    assert_eq!(out.stdout, b"via\n");
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(
        bastion.log().contains("direct-tcpip"),
        "bastion log: {}",
        bastion.log()
    );
    assert_eq!(bastion.connections(), 1);
    assert_eq!(target_sshd.connections(), 1);
    // A wrong target pin through the bastion still fails in the key check.
    let mut bad = tg.clone();
    bad.host = "ns/bad-through-jump".into();
    bad.pin = HostKeyPin::Fingerprint(bastion.fingerprint());
    let e = t.probe(&bad, None).await.expect_err("mismatch");
    assert!(matches!(e, TransportError::HostKeyMismatch { .. }), "{e}");
}

#[tokio::test]
async fn session_reuse_one_connection_for_many_calls() {
    let (sshd, key) = setup();
    let t = transport();
    let tg = target(&sshd, &key);
    let first = t.probe(&tg, None).await.expect("probe");
    // After first contact the caller pins the fingerprint: the connection is still reused.
    let mut pinned = tg.clone();
    pinned.pin = HostKeyPin::Fingerprint(first.fingerprint.clone());
    for _ in 0..20 {
        t.probe(&pinned, None).await.expect("probe");
    }
    // Several channels at once over the same connection.
    let runs = (0..8).map(|i| {
        let t = &t;
        let pinned = &pinned;
        async move {
            t.exec(
                pinned,
                RemoteCommand::new(format!("sleep 0.3; echo {i}"), secs(20)),
            )
            .await
        }
    });
    for (i, r) in futures::future::join_all(runs)
        .await
        .into_iter()
        .enumerate()
    {
        assert_eq!(r.expect("exec").stdout, format!("{i}\n").into_bytes());
    }
    let conns = sshd.connections();
    eprintln!("21 probes + 8 concurrent execs over {conns} TCP connection(s)");
    assert_eq!(conns, 1, "{}", sshd.log());
    assert_eq!(t.pooled_connections(), 1);

    // forget() drops it; the next call dials again.
    t.forget(&tg.host).await;
    assert_eq!(t.pooled_connections(), 0);
    t.probe(&pinned, None).await.expect("probe");
    assert_eq!(sshd.connections(), 2);

    // A broken connection is re-dialled: kill this connection's sshd process.
    let _ = t
        .exec(&pinned, RemoteCommand::new("kill -9 $PPID", secs(10)))
        .await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    t.probe(&pinned, None).await.expect("probe after break");
    assert_eq!(sshd.connections(), 3);
}

#[tokio::test]
async fn cap_evicts_lru_and_idle_connections_close() {
    let (a, key) = setup();
    let b = Sshd::start();
    b.authorize(&key.public);
    let c = Sshd::start();
    c.authorize(&key.public);
    let t = RusshTransport::new(TransportConfig {
        max_connections: 2,
        ..TransportConfig::default()
    });
    let (ta, tb, tc) = (target(&a, &key), target(&b, &key), target(&c, &key));
    t.probe(&ta, None).await.expect("a");
    t.probe(&tb, None).await.expect("b");
    t.probe(&tc, None).await.expect("c");
    assert_eq!(
        t.pooled_connections(),
        2,
        "cap of 2: the LRU (a) was evicted"
    );
    t.probe(&tc, None).await.expect("c");
    t.probe(&tb, None).await.expect("b");
    assert_eq!((b.connections(), c.connections()), (1, 1));
    t.probe(&ta, None).await.expect("a");
    assert_eq!(a.connections(), 2, "a was re-dialled after eviction");
    t.probe(&tb, None).await.expect("b");
    assert_eq!(b.connections(), 1, "b was most recently used, c went");

    // Idle: closed after the idle timeout; the next call dials again.
    let idle = RusshTransport::new(TransportConfig {
        idle_timeout: Duration::from_millis(1000),
        ..TransportConfig::default()
    });
    idle.probe(&tc, None).await.expect("c");
    idle.probe(&tc, None).await.expect("c");
    assert_eq!(c.connections(), 2);
    tokio::time::sleep(Duration::from_millis(2500)).await;
    assert_eq!(idle.pooled_connections(), 0);
    idle.probe(&tc, None).await.expect("c");
    assert_eq!(c.connections(), 3);
}

#[tokio::test]
async fn tarpit_handshake_times_out() {
    let pit = Tarpit::start();
    let dir = tempfile::tempdir().expect("tmp");
    let key = keygen(dir.path(), "k", "ed25519", None);
    let t = RusshTransport::new(TransportConfig {
        handshake_timeout: secs(2),
        ..TransportConfig::default()
    });
    let tg = HostTarget {
        host: "ns/tarpit".into(),
        address: pit.address.clone(),
        port: pit.port,
        user: "root".into(),
        key: Secret::new(key.private.clone()),
        pin: HostKeyPin::TrustOnFirstUse,
        jump: None,
    };
    let started = Instant::now();
    let e = t.probe(&tg, None).await.expect_err("tarpit");
    assert!(
        matches!(&e, TransportError::HandshakeTimeout { host, after } if host == "ns/tarpit" && *after == secs(2)),
        "{e}"
    );
    assert!(started.elapsed() < secs(4), "{:?}", started.elapsed());
    assert!(e.is_transient() && e.touched_host());
}

#[tokio::test]
async fn s2_dial_refused() {
    let addr = sshd::unique_loopback();
    let port = sshd::free_port(&addr);
    let dir = tempfile::tempdir().expect("tmp");
    let key = keygen(dir.path(), "k", "ed25519", None);
    let t = transport();
    let mut tg = HostTarget::new("ns/down", addr, Secret::new(key.private.clone()));
    tg.port = port;
    let e = t.probe(&tg, None).await.expect_err("refused");
    assert!(
        matches!(&e, TransportError::DialRefused { host, .. } if host == "ns/down"),
        "{e}"
    );
    assert!(e.is_transient() && !e.touched_host());
}

// S5: a host whose probe prints garbage is an error, never zero capacity.
#[tokio::test]
async fn s5_unparsable_probe_output() {
    let (sshd, key) = setup();
    // A "shim" that answers every command with garbage.
    let shim = keygen(sshd.dir.path(), "shim", "ed25519", None);
    sshd.authorize_with_options(
        "command=\"echo kpssh-probe=1; echo cpu=0; echo memory_kib=; echo arch=x86_64\"",
        &shim.public,
    );
    let t = transport();
    let tg = target(&sshd, &shim);
    let e = t
        .probe(&tg, Some("/opt/kpssh/kpssh-shim"))
        .await
        .expect_err("unparsable");
    match &e {
        TransportError::Probe {
            host,
            source: ProbeError::Unparsable { excerpt, .. },
        } => {
            assert_eq!(host, &tg.host);
            assert!(excerpt.contains("cpu=0"));
        }
        other => panic!("{other}"),
    }
    assert!(!e.is_transient());
    // A verified host's shim receives `<shimCommand> probe` and, on stdin, the Go provider's
    // probe envelope (S62: the Go provider's shim reads only stdin).
    let rec = keygen(sshd.dir.path(), "recorder", "ed25519", None);
    let seen = sshd.dir.path().join("original-command");
    let seen_stdin = sshd.dir.path().join("probe-stdin");
    sshd.authorize_with_options(
        &format!(
            "command=\"printf %s \\\"$SSH_ORIGINAL_COMMAND\\\" > {}; cat > {}; printf 'kpssh-probe=1\\ncpu=3\\nmemory_kib=2048\\narch=aarch64\\nkubelet=active\\n'\"",
            seen.display(),
            seen_stdin.display()
        ),
        &rec.public,
    );
    let mut tg = target(&sshd, &rec);
    tg.host = "ns/verified".into();
    let r = t
        .probe(&tg, Some("/opt/kpssh/kpssh-shim"))
        .await
        .expect("probe");
    assert_eq!(
        std::fs::read_to_string(&seen).expect("recorded"),
        "/opt/kpssh/kpssh-shim probe"
    );
    assert_eq!(
        std::fs::read_to_string(&seen_stdin).expect("recorded stdin"),
        "kpssh-envelope: 1\nphase: probe\n"
    );
    assert_eq!(
        (
            r.facts.cpu,
            r.facts.memory_kib,
            r.facts.arch.as_str(),
            r.facts.kubelet_active
        ),
        (3, 2048, "arm64", true)
    );
    // Raw probe exiting non-zero.
    let _ = key;
}

#[tokio::test]
async fn non_root_user_with_sudo() {
    let user = sshd::ensure_test_user();
    let (sshd, key) = setup();
    let t = transport();
    let mut tg = target(&sshd, &key);
    tg.user = user.into();
    let out = sh(&t, &tg, "id -un; sudo -n bash -c 'id -u'").await;
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        format!("{user}\n0\n"),
        "stderr: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    // Phases run as `sudo bash -s` with the script on stdin.
    let out = t
        .exec(
            &tg,
            RemoteCommand::new("sudo -n bash -s", secs(20))
                .with_stdin(b"set -euo pipefail\nid -u\nexit 5\n".to_vec()),
        )
        .await
        .expect("exec");
    assert_eq!((out.exit_status, &out.stdout[..]), (5, &b"0\n"[..]));

    // A timed-out `sudo bash -s` phase: the root processes behind sudo die too.
    let pidfile = sshd.dir.path().join("sudo-pids");
    let started = Instant::now();
    let e = t
        .exec(
            &tg,
            RemoteCommand::new("sudo -n bash -s", secs(2)).with_stdin(
                format!(
                    "sleep 300 & echo $! > {p}; echo $$ >> {p}; wait\n",
                    p = pidfile.display()
                )
                .into_bytes(),
            ),
        )
        .await
        .expect_err("timeout");
    assert!(matches!(e, TransportError::CommandTimeout { .. }), "{e}");
    assert!(started.elapsed() < secs(4), "{:?}", started.elapsed());
    let pids: Vec<u32> = std::fs::read_to_string(&pidfile)
        .expect("pids")
        .lines()
        .filter_map(|l| l.trim().parse().ok())
        .collect();
    assert_eq!(pids.len(), 2);
    let deadline = Instant::now() + secs(3);
    while pids.iter().any(|p| sshd::process_alive(*p)) {
        assert!(Instant::now() < deadline, "root processes {pids:?} survive");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test]
async fn cli_probe_prints_json_or_fails_with_1() {
    use kpssh::cli::probe::{ProbeArgs, run};
    use kpssh::cli::target::TargetArgs;
    let (sshd, key) = setup();
    let target = TargetArgs {
        address: sshd.address.clone(),
        port: sshd.port,
        user: "root".into(),
        key: key.private_path.clone(),
        known_host: Some(sshd.fingerprint()),
    };
    let args = ProbeArgs {
        host: None,
        wait: std::time::Duration::from_secs(60),
        target: Some(target.clone()),
        verified: false,
    };
    assert_eq!(run(args.clone()).await.expect("run"), 0);
    let wrong = ProbeArgs {
        target: Some(TargetArgs {
            known_host: Some(sshd::keygen(sshd.dir.path(), "x", "ed25519", None).fingerprint()),
            ..target
        }),
        ..args
    };
    assert_eq!(run(wrong).await.expect("run"), 1);
}

// S3: a pin that changes while a connection is pooled is checked against the pooled host key.
#[tokio::test]
async fn s3_changed_pin_rejects_pooled_connection() {
    let (sshd, key) = setup();
    let t = transport();
    let tg = target(&sshd, &key);
    t.probe(&tg, None).await.expect("tofu");
    let mut repinned = tg.clone();
    repinned.pin =
        HostKeyPin::Fingerprint(keygen(sshd.dir.path(), "y", "ed25519", None).fingerprint());
    let e = t.probe(&repinned, None).await.expect_err("mismatch");
    assert!(matches!(e, TransportError::HostKeyMismatch { .. }), "{e}");
    assert_eq!(
        t.pooled_connections(),
        0,
        "the pooled connection was dropped"
    );
    let marker = sshd.dir.path().join("ran");
    let e = t
        .exec(
            &repinned,
            RemoteCommand::new(format!("touch {}", marker.display()), secs(10)),
        )
        .await
        .expect_err("mismatch");
    assert!(matches!(e, TransportError::HostKeyMismatch { .. }), "{e}");
    assert!(!marker.exists());
}

// S2: a pooled connection whose host went silent (process stopped) is abandoned and re-dialled.
#[tokio::test]
async fn wedged_pooled_connection_is_redialled() {
    let (sshd, key) = setup();
    let t = transport();
    let tg = target(&sshd, &key);
    let out = sh(&t, &tg, "echo $PPID").await;
    let conn_pid: i32 = String::from_utf8_lossy(&out.stdout)
        .trim()
        .parse()
        .expect("pid");
    // SAFETY: signalling a process of the sshd this test started.
    unsafe { libc::kill(conn_pid, libc::SIGSTOP) };
    let started = Instant::now();
    let out = t
        .exec(&tg, RemoteCommand::new("echo again", secs(2)))
        .await
        .expect("re-dialled");
    assert_eq!(out.stdout, b"again\n");
    assert!(started.elapsed() < secs(6), "{:?}", started.elapsed());
    assert_eq!(sshd.connections(), 2);
    unsafe { libc::kill(conn_pid, libc::SIGKILL) };
}
