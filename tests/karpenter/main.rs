//! Deterministic scenario tests of the karpenter layer (S36–S40) on the in-memory cluster,
//! simulated hosts and a simulated scheduler, on tokio's paused clock.

mod acceptance;
mod adopt;
mod consolidation;
mod disruption;
mod disruption_controls;
mod drain_order;
mod exchange;
mod expiration;
mod explain;
mod grace;
mod hash;
mod lifecycle;
mod metrics;
mod multinode;
mod node_deletion;
mod provisioning;
mod repair;
mod scheduling;
mod status;
mod termination;

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kpssh::actors::Config;
use kpssh::api::{HostState, NodeClaim, NodePool, SSHHost};
use kpssh::k8s::Cluster;
use kpssh::karpenter::{KarpenterConfig, KarpenterHandles, sim_scheduler};
use kpssh::sim::SimHost;
use kpssh::sim::world::World;

pub const MINUTE: Duration = Duration::from_secs(60);

pub struct Env {
    pub w: World,
    pub k: KarpenterHandles,
    _sched: Vec<tokio::task::JoinHandle<()>>,
}

impl Drop for Env {
    fn drop(&mut self) {
        for t in &self._sched {
            t.abort();
        }
    }
}

impl Env {
    /// A controller crash and restart: the actors and the karpenter layer (and the simulated
    /// scheduler beside it) start again from what the API holds.
    pub async fn restart(&mut self, cfg: KarpenterConfig) {
        self.k.stop();
        for t in &self._sched {
            t.abort();
        }
        self.w.crash_and_restart(12).await.expect("restart");
        self.k = kpssh::karpenter::spawn_with(&self.w.ctx, cfg)
            .await
            .expect("karpenter");
        self._sched = sim_scheduler::spawn(
            self.w.cluster.clone(),
            self.k.state.clone(),
            Duration::from_secs(1),
        );
    }
}

pub async fn env() -> Env {
    env_with(KarpenterConfig::default()).await
}

pub async fn env_with(cfg: KarpenterConfig) -> Env {
    env_scheduling_every(cfg, Duration::from_secs(1)).await
}

/// An environment whose simulated kube-scheduler binds pods only every `period`.
pub async fn env_scheduling_every(cfg: KarpenterConfig, period: Duration) -> Env {
    let w = World::start_bare(Config::default(), 11)
        .await
        .expect("world");
    w.add_profile_and_class("p", "pool")
        .await
        .expect("profile and class");
    let k = kpssh::karpenter::spawn_with(&w.ctx, cfg)
        .await
        .expect("karpenter");
    let sched = sim_scheduler::spawn(w.cluster.clone(), k.state.clone(), period);
    Env {
        w,
        k,
        _sched: sched,
    }
}

/// `n` hosts of `class` with `cpu` cores and `gib` GiB each; waits until all are Available.
pub async fn hosts(e: &Env, prefix: &str, class: &str, n: usize, cpu: u32, gib: u64, net: u8) {
    hosts_labelled(e, prefix, class, n, cpu, gib, net, &[]).await;
}

/// [`hosts`] with extra labels on each SSHHost (topology: zone, rack, custom, S56).
#[allow(clippy::too_many_arguments)]
pub async fn hosts_labelled(
    e: &Env,
    prefix: &str,
    class: &str,
    n: usize,
    cpu: u32,
    gib: u64,
    net: u8,
    labels: &[(&str, &str)],
) {
    for i in 0..n {
        let addr = format!("10.{net}.{}.{}", i / 250, i % 250 + 1);
        let sim = SimHost::new(&addr, cpu, gib * 1024 * 1024);
        let mut h =
            kpssh::sim::world::host_object(&e.w.ns(), &format!("{prefix}{i:03}"), class, &sim);
        let l = h.metadata.labels.get_or_insert_default();
        for (k, v) in labels {
            l.insert(k.to_string(), v.to_string());
        }
        e.w.transport.add(sim);
        e.w.cluster.create(&h).await.expect("host");
    }
    let ok =
        e.w.until(5 * MINUTE, || async {
            host_states(e)
                .await
                .get(&HostState::Available)
                .copied()
                .unwrap_or(0)
                >= count_prefix(e, prefix).await
        })
        .await;
    assert!(ok, "hosts became Available");
}

async fn count_prefix(e: &Env, prefix: &str) -> usize {
    let hs: Vec<SSHHost> = e.w.cluster.list(Some(&e.w.ns()), None).await.expect("list");
    hs.iter()
        .filter(|h| {
            h.metadata
                .name
                .as_deref()
                .is_some_and(|n| n.starts_with(prefix))
        })
        .count()
}

pub async fn host_states(e: &Env) -> BTreeMap<HostState, usize> {
    let hs: Vec<SSHHost> = e.w.cluster.list(Some(&e.w.ns()), None).await.expect("list");
    let mut m = BTreeMap::new();
    for h in hs {
        *m.entry(h.state()).or_insert(0) += 1;
    }
    m
}

pub fn nodepool(name: &str) -> NodePool {
    kpssh::sim::world::node_pool(name, "pool")
}

pub fn pod(name: &str, cpu: &str, mem: &str) -> Pod {
    let mut p = kpssh::sim::world::pod(name, cpu, mem);
    p.metadata.labels = Some(BTreeMap::from([("app".to_string(), "web".to_string())]));
    p
}

pub async fn claims(e: &Env) -> Vec<NodeClaim> {
    e.w.cluster.list(None, None).await.expect("claims")
}

pub async fn pods(e: &Env) -> Vec<Pod> {
    e.w.cluster.list(None, None).await.expect("pods")
}

pub async fn running(e: &Env) -> usize {
    pods(e)
        .await
        .iter()
        .filter(|p| p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running"))
        .count()
}

pub fn reasons(e: &Env) -> Vec<String> {
    e.w.cluster
        .events()
        .into_iter()
        .map(|ev| ev.reason)
        .collect()
}

pub async fn wait_available(e: &Env, n: usize) {
    let ok =
        e.w.until(10 * MINUTE, || async {
            host_states(e)
                .await
                .get(&HostState::Available)
                .copied()
                .unwrap_or(0)
                >= n
        })
        .await;
    assert!(ok, "{n} hosts Available: {:?}", host_states(e).await);
}

/// Mark a NodeClaim for voluntary disruption, as the disruption controller does.
pub async fn mark(e: &Env, name: &str) {
    let patch = serde_json::json!({"metadata": {"annotations": {
        kpssh::karpenter::DISRUPTION_ANNOTATION: "Test"
    }}});
    e.w.cluster
        .patch::<NodeClaim>(None, name, &patch)
        .await
        .expect("mark");
}
