//! Fleet-scale behaviour of the actor core (issue #5 acceptance): a burst of claims on a
//! thousand hosts, and the API cost of a steady fleet.

use std::time::Duration;

use kpssh::api::{HostState, SSHHost};
use kpssh::k8s::Cluster;
use kpssh::provider::Config;
use kpssh::sim::SimHost;
use kpssh::sim::world::{World, node_claim};
use kpssh::ssh::pool::PoolConfig;

use super::{MINUTE, world, world_with};

const HOSTS: usize = 1000;

#[tokio::test(start_paused = true)]
async fn s15_burst_of_1000_claims_on_1000_hosts_and_steady_state_cost() {
    let w = world().await;
    for i in 0..HOSTS {
        let addr = format!("10.{}.{}.{}", 100 + i / 65536, (i / 256) % 256, i % 256);
        w.add_host(
            &format!("h{i:04}"),
            "small",
            SimHost::new(&addr, 2, 4_000_000),
        )
        .await
        .expect("host");
    }
    let count = |state: HostState| {
        let w = &w;
        async move {
            let hosts: Vec<SSHHost> = w.cluster.list(Some(&w.ns()), None).await.expect("list");
            hosts.iter().filter(|h| h.state() == state).count()
        }
    };
    assert!(
        w.until(5 * MINUTE, || async {
            count(HostState::Available).await == HOSTS
        })
        .await
    );

    // Steady state: nothing changes for two virtual hours.
    let before = w
        .cluster
        .stats()
        .status_writes_by_kind
        .get("SSHHost")
        .copied()
        .unwrap_or(0);
    tokio::time::sleep(Duration::from_secs(2 * 3600)).await;
    let after = w
        .cluster
        .stats()
        .status_writes_by_kind
        .get("SSHHost")
        .copied()
        .unwrap_or(0);
    let per_host_hour = (after - before) as f64 / (HOSTS as f64 * 2.0);
    println!("steady state: {per_host_hour:.2} SSHHost status writes per host-hour");
    assert!(per_host_hour <= 4.0, "{per_host_hour} writes per host-hour");

    // Burst: one NodeClaim per host.
    let conflicts_before = w.cluster.stats().conflicts;
    for i in 0..HOSTS {
        w.cluster
            .create(&node_claim(&format!("burst-{i:04}"), "pool", "1", "1Gi"))
            .await
            .expect("nc");
    }
    let all = w
        .until(10 * MINUTE, || async {
            count(HostState::InUse).await == HOSTS
        })
        .await;
    assert!(
        all,
        "all claims joined: {} InUse",
        count(HostState::InUse).await
    );
    let conflicts = w.cluster.stats().conflicts - conflicts_before;
    let ratio = conflicts as f64 / HOSTS as f64;
    println!(
        "burst: {HOSTS} claims, {conflicts} CAS conflicts ({:.2}%)",
        ratio * 100.0
    );
    assert!(ratio <= 0.02, "conflicts {ratio}");
}

/// S4 at fleet scale, the API reads: the hosts of a pool share one key Secret, so a steady
/// fleet reads it once per target refresh (15 minutes), not once per host per refresh and
/// again after each host's first probe pins its key (it was 4 to 5 GETs per host-hour, 30 at
/// the real API server's 2-minute probe interval in the hour after a cold start: issue #26).
#[tokio::test(start_paused = true)]
async fn s4_a_steady_fleet_reads_its_shared_key_secret_per_refresh_not_per_host() {
    const N: usize = 50;
    let w = world().await;
    for i in 0..N {
        let addr = format!("10.7.0.{}", i + 1);
        w.add_host(
            &format!("k{i:02}"),
            "small",
            SimHost::new(&addr, 2, 4_000_000),
        )
        .await
        .expect("host");
    }
    let available = || async {
        let hosts: Vec<SSHHost> = w.cluster.list(Some(&w.ns()), None).await.expect("list");
        hosts
            .iter()
            .filter(|h| h.state() == HostState::Available)
            .count()
    };
    assert!(
        w.until(5 * MINUTE, || async { available().await == N })
            .await
    );
    let cold = w.cluster.stats().secret_gets;
    assert!(cold <= 2, "{cold} Secret reads for {N} hosts' first probes");
    tokio::time::sleep(Duration::from_secs(2 * 3600)).await;
    let steady = w.cluster.stats().secret_gets - cold;
    // One read per 15-minute refresh of the shared cache; the hosts' own refreshes hit it.
    assert!(
        steady <= 10,
        "{steady} Secret reads in 2 h by {N} steady hosts"
    );
    assert_eq!(available().await, N);
}

/// A steady fleet of `n` hosts at 1 SSH dial a second, all probed once; returns (probes per
/// host-hour, dials) over the following hour.
async fn steady_hour_at_one_dial_a_second(n: usize, pool_cap: usize) -> (f64, u64) {
    let w = world_with(Config {
        ssh_dials_per_second: 1,
        ..Config::default()
    })
    .await;
    w.transport.set_pool(PoolConfig {
        max_connections: pool_cap,
        ..PoolConfig::default()
    });
    for i in 0..n {
        let addr = format!("10.8.{}.{}", i / 256, i % 256);
        (w.add_host(
            &format!("p{i:03}"),
            "small",
            SimHost::new(&addr, 2, 4_000_000),
        ))
        .await
        .expect("host");
    }
    let sessions = |w: &World| w.transport.each(|h| h.sessions).iter().sum::<u64>();
    let all_probed = w
        .until(15 * MINUTE, || async {
            w.transport.each(|h| h.sessions > 0).iter().all(|p| *p)
        })
        .await;
    assert!(all_probed, "every host probed once");
    let (s0, d0) = (sessions(&w), w.transport.dials());
    tokio::time::sleep(Duration::from_secs(3600)).await;
    let probes = sessions(&w) - s0;
    (probes as f64 / n as f64, w.transport.dials() - d0)
}

/// Issue #26: `--ssh-dials-per-second` paces dials, not probes. 300 hosts probed every 2
/// minutes need 2.5 probes a second; at 1 dial a second the first sweep dials each host once
/// (5 minutes), and then the probes reuse their pooled connections at the full rate: 30 per
/// host-hour, no dial. Before the fix every probe took a dial slot: 12 per host-hour.
#[tokio::test(start_paused = true)]
async fn s4_steady_probes_over_pooled_connections_are_not_held_to_the_dial_rate() {
    let (per_host_hour, dials) = steady_hour_at_one_dial_a_second(300, 4096).await;
    assert!(
        per_host_hour >= 29.0,
        "{per_host_hour:.1} probes per host-hour at a 2-minute interval"
    );
    assert_eq!(dials, 0, "steady probes over pooled connections dial not");
}

/// The other side, so that the simulated pool does not hide it: a fleet larger than the pool
/// (300 hosts, 100 connections) is probed round-robin, so the least recently used
/// connection the pool evicts is the next one probed: every probe dials, and the dial rate
/// bounds the probe rate again (1 a second: 12 per host-hour).
#[tokio::test(start_paused = true)]
async fn a_fleet_larger_than_the_pool_dials_every_probe_and_is_held_to_the_dial_rate() {
    let (per_host_hour, dials) = steady_hour_at_one_dial_a_second(300, 100).await;
    assert!(
        (11.0..=13.0).contains(&per_host_hour),
        "{per_host_hour:.1} probes per host-hour"
    );
    let probes = (per_host_hour * 300.0).round() as u64;
    assert!(
        dials + 2 >= probes && dials <= probes,
        "{dials} dials for {probes} probes"
    );
}
