//! Tests of `supervisor.rs`: host actors failing, stopping and dying with the supervisor.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use ractor::Actor;

use super::{Supervisor, SupervisorMsg};
use crate::clock::Clock;
use crate::k8s::{Cluster, MemoryCluster};
use crate::provider::{Config, Context};
use crate::sim::host::SimHost;
use crate::sim::world::{host_object, key_secret};
use crate::ssh::{
    CommandOutput, HostTarget, ProbeReport, RemoteCommand, Transport, TransportError,
};

/// A transport whose probe panics (a bug in the probe path) or hangs; counts the probes.
#[derive(Default)]
struct Faulty {
    probes: AtomicUsize,
    hang: bool,
}

impl Transport for Faulty {
    async fn probe(&self, _: &HostTarget, _: Option<&str>) -> Result<ProbeReport, TransportError> {
        self.probes.fetch_add(1, Ordering::SeqCst);
        if self.hang {
            std::future::pending::<()>().await;
        }
        panic!("the probe path panicked");
    }

    async fn exec(
        &self,
        _: &HostTarget,
        _: RemoteCommand,
    ) -> Result<CommandOutput, TransportError> {
        panic!("no command runs in these tests");
    }

    fn pooled(&self, _: &HostTarget) -> bool {
        true
    }

    async fn forget(&self, _: &str) {}
}

/// A transport whose every probe hangs (until the probe timeout).
fn hanging() -> Arc<Faulty> {
    Arc::new(Faulty {
        hang: true,
        ..Faulty::default()
    })
}

async fn supervisor_over(
    transport: Arc<Faulty>,
) -> (
    MemoryCluster,
    ractor::ActorRef<SupervisorMsg>,
    Context<MemoryCluster, Faulty>,
) {
    let clock = Clock::simulated("2026-01-01T00:00:00Z".parse().expect("time"));
    let cluster = MemoryCluster::new(clock.clone());
    let config = Config::default();
    let ns = config.pool_namespace.clone();
    let ctx = Context::new(cluster.clone(), transport, clock, config, Some(1));
    cluster.create(&key_secret(&ns)).await.expect("key secret");
    let (supervisor, _) = Actor::spawn(None, Supervisor::default(), ctx.clone())
        .await
        .expect("supervisor");
    let host = host_object(&ns, "h1", "c", &SimHost::new("10.0.0.1", 4, 8 << 20));
    cluster.create(&host).await.expect("host");
    (cluster, supervisor, ctx)
}

/// Wait (yielding: a restart loop keeps the runtime busy, so the paused clock would not
/// advance past a sleep) until the transport saw `n` probes.
async fn probes_reach(transport: &Faulty, n: usize) -> bool {
    for _ in 0..100_000 {
        if transport.probes.load(Ordering::SeqCst) >= n {
            return true;
        }
        tokio::task::yield_now().await;
    }
    false
}

/// A host actor whose message panics is reported to the supervisor and rebuilt from the API:
/// the rebuilt actor probes at once (and here panics again, and is rebuilt again).
#[tokio::test(start_paused = true)]
async fn a_panicking_host_actor_is_restarted_from_the_api() {
    let transport = Arc::new(Faulty::default());
    let (_cluster, supervisor, ctx) = supervisor_over(transport.clone()).await;
    assert!(
        probes_reach(&transport, 3).await,
        "the actor was not restarted after its panic: {} probes",
        transport.probes.load(Ordering::SeqCst)
    );
    assert_eq!(
        ctx.metrics.host_actors.get(),
        1,
        "one actor for the one host"
    );
    supervisor.stop(None);
}

/// Shutdown hands back every host actor's task; a stopped actor's task ends after the message
/// in hand (here a probe that never returns, so it is aborted by the caller instead), and
/// killing the supervisor aborts the host actors it holds.
#[tokio::test(start_paused = true)]
async fn stopped_hosts_are_handed_back_and_a_killed_supervisor_takes_them_along() {
    let transport = hanging();
    let (_cluster, supervisor, _ctx) = supervisor_over(transport.clone()).await;
    assert!(
        probes_reach(&transport, 1).await,
        "the host was never probed"
    );
    let tasks = supervisor
        .call(SupervisorMsg::StopHosts, Some(Duration::from_secs(5)))
        .await
        .expect("call")
        .expect("reply");
    assert_eq!(tasks.len(), 1, "one host actor");
    let task = tasks.into_iter().next().expect("one");
    // The probe in hand has not ended (it would at the probe timeout): the actor is still
    // running after a stop.
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(
        !task.is_finished(),
        "a stop lets the message in hand finish"
    );
    task.abort();

    let transport = hanging();
    let (_cluster, supervisor, ctx) = supervisor_over(transport.clone()).await;
    assert!(
        probes_reach(&transport, 1).await,
        "the host was never probed"
    );
    supervisor.kill();
    drop(ctx);
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(
        Arc::strong_count(&transport),
        1,
        "the killed supervisor's host actor (holding the context) is gone"
    );
}
