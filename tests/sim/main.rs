//! Deterministic scenario tests of the actor core on the in-memory cluster and simulated
//! hosts, on tokio's paused clock. Each test names the scenario of SCENARIOS.md it shows.

mod abort;
mod adopt_stale;
mod backoff;
mod claims;
mod host_state;
mod lifecycle;
mod nodeclass;
mod scale;
mod shards;
mod taint_gates;
mod zombie;

use std::time::Duration;

use kpssh::api::{HostState, SSHHost};
use kpssh::k8s::Cluster;
use kpssh::provider::Config;
use kpssh::sim::world::World;

pub const MINUTE: Duration = Duration::from_secs(60);

/// A world with one node class `pool` using profile `p@1`.
pub async fn world() -> World {
    world_with(Config::default()).await
}

pub async fn world_with(config: Config) -> World {
    let w = World::start(config, 7).await.expect("world starts");
    w.add_profile_and_class("p", "pool")
        .await
        .expect("profile and class");
    w
}

pub async fn wait_state(w: &World, host: &str, state: HostState, limit: Duration) -> SSHHost {
    let ok = w
        .until(limit, || async {
            w.host(host).await.is_some_and(|h| h.state() == state)
        })
        .await;
    let h = w.host(host).await.expect("host exists");
    assert!(
        ok,
        "{host} did not reach {state} within {limit:?}; status: {:?}",
        h.status
    );
    h
}

/// Names of the bootstrap-token Secrets in kube-system.
pub async fn token_secrets(w: &World) -> Vec<String> {
    let s: Vec<k8s_openapi::api::core::v1::Secret> = w
        .cluster
        .list(Some("kube-system"), None)
        .await
        .expect("secrets");
    s.into_iter().filter_map(|s| s.metadata.name).collect()
}

pub fn reasons(w: &World) -> Vec<String> {
    w.cluster.events().into_iter().map(|e| e.reason).collect()
}
