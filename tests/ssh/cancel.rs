//! S26: a command whose caller cancels it (a join whose NodeClaim went) is killed on the host
//! as a timed-out one is, the call returns `Cancelled` at once, and the connection stays
//! usable.

use std::time::{Duration, Instant};

use super::{secs, setup, sh, target, transport};
use crate::sshd;
use kpssh::ssh::{Cancel, RemoteCommand, Transport, TransportError};
use tokio_util::sync::CancellationToken;

#[tokio::test]
async fn s26_cancelled_command_returns_at_once_and_is_killed_on_the_host() {
    let (sshd, key) = setup();
    let t = transport();
    let tg = target(&sshd, &key);
    let pidfile = sshd.dir.path().join("pids");
    let stop = CancellationToken::new();
    let cmd = RemoteCommand::new(
        format!(
            "sleep 300 & echo $! > {p}; echo $$ >> {p}; wait",
            p = pidfile.display()
        ),
        secs(120),
    )
    .with_cancel(Cancel::new(stop.clone()));
    let started = Instant::now();
    let run = t.exec(&tg, cmd);
    let cancel = async {
        // Cancel once the command runs (its pids are written).
        while std::fs::read_to_string(&pidfile).map_or(0, |s| s.lines().count()) < 2 {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        stop.cancel();
    };
    let (result, ()) = tokio::join!(run, cancel);
    let e = result.expect_err("cancelled");
    let elapsed = started.elapsed();
    assert!(
        matches!(&e, TransportError::Cancelled { host } if host == &tg.host),
        "{e}"
    );
    assert!(e.touched_host() && !e.is_transient(), "{e:?}");
    assert!(elapsed < secs(10), "returned after {elapsed:?}");
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
    assert_eq!(sh(&t, &tg, "echo ok").await.stdout, b"ok\n");
    assert_eq!(sshd.connections(), 1);
}
