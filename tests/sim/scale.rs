//! Fleet-scale behaviour of the actor core (issue #5 acceptance): a burst of claims on a
//! thousand hosts, and the API cost of a steady fleet.

use std::time::Duration;

use kpssh::api::{HostState, SSHHost};
use kpssh::k8s::Cluster;
use kpssh::sim::SimHost;
use kpssh::sim::world::node_claim;

use super::{MINUTE, world};

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
