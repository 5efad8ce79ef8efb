//! HA (no S-number; issue 6, item 7: "`kpssh controller` … leader election through a Lease"):
//! `kpssh controller` processes against the real kube-apiserver, elected through one Lease.
//! Exactly one works while the other stands by; when the leader is killed the standby takes the
//! Lease once it expired and starts working; a leader stopped with SIGTERM releases the Lease and
//! a standby takes over at its next retry; a leader whose Lease is taken exits non-zero.

#[path = "support/controlplane.rs"]
mod controlplane;

use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use controlplane::ControlPlane;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Namespace, Secret};
use kpssh::api::crds;
use kpssh::k8s::{Cluster, ClusterError, KubeCluster};
use serde_json::json;

const NS: &str = "kpssh-ha";
const LEASE: &str = "kpssh-ha-leader";
/// client-go's defaults, which `kpssh controller` uses.
const LEASE_DURATION: Duration = Duration::from_secs(15);
const RETRY_PERIOD: Duration = Duration::from_secs(2);
/// What the probe count looks like once the controller probed the host.
const PROBED: &str = "kpssh_host_probe_duration_seconds_count{";

/// One `kpssh controller` process, killed when dropped.
struct Candidate {
    name: &'static str,
    child: Child,
    addr: String,
    log: PathBuf,
}

impl Candidate {
    fn start(cp: &ControlPlane, dir: &Path, name: &'static str) -> Candidate {
        let addr = format!("127.0.0.1:{}", free_port());
        let health = format!("127.0.0.1:{}", free_port());
        let log = dir.join(format!("{name}.log"));
        let file = std::fs::File::create(&log).expect("log file");
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_kpssh"));
        cmd.args([
            "controller",
            "--pool-namespace",
            NS,
            "--metrics-addr",
            &addr,
            // Health has its own listener (:8081 by default, as the Go provider's); two
            // controllers on one machine need their own.
            "--health-addr",
            &health,
            "--probe-interval",
            "5s",
            "--shutdown-grace",
            "5s",
            "--leader-election-namespace",
            NS,
            "--leader-election-id",
            LEASE,
        ])
        .env("KUBECONFIG", cp.kubeconfig_path())
        .env("POD_NAME", name)
        .env("RUST_LOG", "info")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(file);
        // SAFETY: prctl is async-signal-safe; nothing else runs between fork and exec.
        unsafe {
            cmd.pre_exec(|| {
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
                Ok(())
            });
        }
        let child = cmd.spawn().expect("kpssh controller");
        Candidate {
            name,
            child,
            addr,
            log,
        }
    }

    fn logs(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    async fn metrics(&self) -> String {
        match http_get(&self.addr, "/metrics").await {
            Some((200, body)) => body,
            _ => String::new(),
        }
    }

    fn signal(&self, sig: i32) {
        let pid = i32::try_from(self.child.id()).expect("pid");
        // SAFETY: a plain syscall to our own child.
        unsafe {
            libc::kill(pid, sig);
        }
    }

    /// The exit status, waiting at most `limit`.
    async fn exit_within(&mut self, limit: Duration) -> Option<std::process::ExitStatus> {
        let deadline = Instant::now() + limit;
        while Instant::now() < deadline {
            if let Ok(Some(status)) = self.child.try_wait() {
                return Some(status);
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        None
    }
}

impl Drop for Candidate {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

/// `GET path`: (status code, body), or None if nothing answers.
async fn http_get(addr: &str, path: &str) -> Option<(u16, String)> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let exchange = async {
        let mut s = tokio::net::TcpStream::connect(addr).await.ok()?;
        let req = format!("GET {path} HTTP/1.1\r\nhost: {addr}\r\nconnection: close\r\n\r\n");
        s.write_all(req.as_bytes()).await.ok()?;
        let mut buf = Vec::new();
        s.read_to_end(&mut buf).await.ok()?;
        let text = String::from_utf8_lossy(&buf).into_owned();
        let code = text.split_whitespace().nth(1)?.parse().ok()?;
        let body = text.split_once("\r\n\r\n").map(|(_, b)| b.to_string())?;
        Some((code, body))
    };
    tokio::time::timeout(Duration::from_secs(5), exchange)
        .await
        .ok()
        .flatten()
}

async fn holder(c: &KubeCluster) -> Option<String> {
    c.get::<Lease>(Some(NS), LEASE)
        .await
        .expect("get the Lease")
        .and_then(|l| l.spec)
        .and_then(|s| s.holder_identity)
        .filter(|h| !h.is_empty())
}

/// Polls every 100 ms until the Lease names a holder whose identity starts with `name_`.
async fn until_held_by(c: &KubeCluster, name: &str, limit: Duration) -> Option<Duration> {
    let start = Instant::now();
    while start.elapsed() < limit {
        if holder(c)
            .await
            .is_some_and(|h| h.starts_with(&format!("{name}_")))
        {
            return Some(start.elapsed());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    None
}

async fn until_metrics(who: &Candidate, limit: Duration, want: &[&str]) -> bool {
    let deadline = Instant::now() + limit;
    while Instant::now() < deadline {
        let m = who.metrics().await;
        if want.iter().all(|w| m.contains(w)) {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    false
}

async fn create<K: kpssh::k8s::Object>(c: &KubeCluster, obj: K) {
    match c.create(&obj).await {
        Ok(_) | Err(ClusterError::AlreadyExists { .. }) => {}
        Err(e) => panic!("create: {e}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ha_one_leader_per_lease_standby_takes_over_after_kill_and_release() {
    let cp = ControlPlane::shared();
    let yaml = format!(
        "{}{}",
        crds::to_yaml(&crds::kpssh_crds()).expect("yaml"),
        crds::to_yaml(&crds::karpenter_crds()).expect("yaml")
    );
    cp.install_crds(&yaml).await;
    let admin = KubeCluster::new(cp.client().await);
    create(
        &admin,
        serde_json::from_value::<Namespace>(json!({"metadata": {"name": NS}})).expect("ns"),
    )
    .await;
    create(
        &admin,
        serde_json::from_value::<Secret>(json!({
            "metadata": {"name": "host-key", "namespace": NS},
            "stringData": {"privateKey": "not a key"}
        }))
        .expect("secret"),
    )
    .await;
    // A host nothing listens for: a working controller probes it (and counts the probe) every
    // 5 s; a standby must not.
    let mut host = kpssh::sim::world::host_object(
        NS,
        "ha-host",
        "ha-class",
        &kpssh::sim::SimHost::new("127.0.0.1", 2, 1),
    );
    host.spec.port = 1;
    host.spec.ssh_key_secret_ref.name = "host-key".into();
    create(&admin, host).await;

    let dir = tempfile::tempdir().expect("tempdir");
    let a = Candidate::start(cp, dir.path(), "ha-a");
    let b = Candidate::start(cp, dir.path(), "ha-b");
    let both = || format!("--- ha-a:\n{}\n--- ha-b:\n{}", a.logs(), b.logs());

    // Exactly one of two candidates started together leads.
    let deadline = Instant::now() + Duration::from_secs(60);
    let first = loop {
        if let Some(h) = holder(&admin).await {
            break h;
        }
        assert!(
            Instant::now() < deadline,
            "nobody took the Lease:\n{}",
            both()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let (leader, standby) = if first.starts_with("ha-a_") {
        (a, b)
    } else {
        assert!(first.starts_with("ha-b_"), "holder {first}");
        (b, a)
    };
    assert!(
        until_metrics(
            &leader,
            Duration::from_secs(60),
            &[PROBED, "\nkpssh_leader 1\n"]
        )
        .await,
        "the leader ({}) did not work:\n{}",
        leader.name,
        leader.logs()
    );
    // The standby is Ready (it read the Lease and can take over), reports itself as standby, and
    // does no work: over three probe intervals it probes nothing and starts no controller.
    assert!(
        until_metrics(&standby, Duration::from_secs(30), &["\nkpssh_leader 0\n"]).await,
        "the standby ({}) did not report itself:\n{}",
        standby.name,
        standby.logs()
    );
    assert_eq!(
        http_get(&standby.addr, "/readyz").await.map(|r| r.0),
        Some(200)
    );
    assert_eq!(
        http_get(&standby.addr, "/healthz").await.map(|r| r.0),
        Some(200)
    );
    tokio::time::sleep(Duration::from_secs(15)).await;
    let m = standby.metrics().await;
    assert!(
        !m.contains(PROBED),
        "the standby probed hosts: two controllers worked at once\n{m}"
    );
    assert!(!standby.logs().contains("kpssh controller started"));
    assert!(
        holder(&admin)
            .await
            .is_some_and(|h| h.starts_with(&format!("{}_", leader.name))),
        "the leader kept its Lease"
    );

    // Kill the leader (no release): the standby waits for the Lease to expire, then leads.
    leader.signal(libc::SIGKILL);
    let killed = Instant::now();
    until_held_by(&admin, standby.name, Duration::from_secs(40))
        .await
        .unwrap_or_else(|| panic!("the standby never took over:\n{}", standby.logs()));
    let took = killed.elapsed();
    eprintln!("HA: standby took the Lease {took:?} after the leader was killed");
    // The leader last renewed at most one retry period before it was killed.
    assert!(
        took >= LEASE_DURATION - RETRY_PERIOD,
        "the standby took a Lease that had not expired ({took:?})"
    );
    assert!(
        took <= LEASE_DURATION + RETRY_PERIOD * 2 + Duration::from_secs(2),
        "takeover took {took:?}"
    );
    assert!(
        until_metrics(
            &standby,
            Duration::from_secs(60),
            &[PROBED, "\nkpssh_leader 1\n"]
        )
        .await,
        "the new leader did not work:\n{}",
        standby.logs()
    );
    drop(leader);
    let mut leader = standby;

    // SIGTERM to the leader: it finishes, releases the Lease, and a standby takes it at its
    // next retry instead of waiting out the lease duration.
    let mut c = Candidate::start(cp, dir.path(), "ha-c");
    assert!(
        until_metrics(&c, Duration::from_secs(30), &["\nkpssh_leader 0\n"]).await,
        "ha-c did not stand by:\n{}",
        c.logs()
    );
    leader.signal(libc::SIGTERM);
    let status = leader
        .exit_within(Duration::from_secs(30))
        .await
        .unwrap_or_else(|| panic!("the leader did not stop on SIGTERM:\n{}", leader.logs()));
    assert!(status.success(), "{status:?}:\n{}", leader.logs());
    assert!(
        leader.logs().contains("released the leader Lease"),
        "{}",
        leader.logs()
    );
    let handover = until_held_by(&admin, "ha-c", Duration::from_secs(20))
        .await
        .unwrap_or_else(|| panic!("ha-c never took over:\n{}", c.logs()));
    eprintln!("HA: ha-c took the released Lease {handover:?} after the leader exited");
    assert!(
        handover <= RETRY_PERIOD.mul_f64(1.2) + Duration::from_secs(1),
        "a released Lease was taken only after {handover:?}"
    );
    assert!(
        until_metrics(&c, Duration::from_secs(60), &[PROBED, "\nkpssh_leader 1\n"]).await,
        "ha-c did not work:\n{}",
        c.logs()
    );

    // Someone else takes the Lease (as after a partition that outlasted the renew deadline):
    // the leader stops at once, with a non-zero exit, rather than work on beside the new holder.
    let mut lease: Lease = admin
        .get(Some(NS), LEASE)
        .await
        .expect("get")
        .expect("lease");
    if let Some(spec) = lease.spec.as_mut() {
        spec.holder_identity = Some("intruder".into());
    }
    admin.replace(&lease).await.expect("take the Lease");
    let status = c
        .exit_within(RETRY_PERIOD * 3 + Duration::from_secs(5))
        .await
        .unwrap_or_else(|| panic!("ha-c kept running without its Lease:\n{}", c.logs()));
    assert_eq!(status.code(), Some(1), "{}", c.logs());
    assert!(c.logs().contains("lost the leader Lease"), "{}", c.logs());
}
