//! `kpssh controller`: run the controller against a real cluster (kubeconfig or in-cluster).

use std::sync::Arc;
use std::time::Duration;

use clap::Args;

use crate::actors::{Config, Context, Controller, spawn_controller};
use crate::clock::Clock;
use crate::k8s::KubeCluster;
use crate::server::{Readiness, Status, serve};
use crate::ssh::{RusshTransport, TransportConfig};

#[derive(Args, Debug)]
pub struct ControllerArgs {
    /// Namespace holding every SSHHost and its key Secret.
    #[arg(long, env = "KPSSH_POOL_NAMESPACE", default_value = crate::api::DEFAULT_POOL_NAMESPACE)]
    pub pool_namespace: String,
    /// Probe period of an unchanged host (Go duration: 90s, 2m, 1h30m).
    #[arg(long, env = "KPSSH_PROBE_INTERVAL", default_value = "2m", value_parser = parse_duration)]
    pub probe_interval: Duration,
    /// Refresh period of status.lastProbeTime when nothing else changes.
    #[arg(long, env = "KPSSH_PROBE_REFRESH", default_value = "15m", value_parser = parse_duration)]
    pub probe_refresh: Duration,
    #[arg(long, env = "KPSSH_MAX_CONCURRENT_PROBES", default_value_t = 64)]
    pub max_concurrent_probes: usize,
    #[arg(long, env = "KPSSH_MAX_CONCURRENT_PHASES", default_value_t = 32)]
    pub max_concurrent_phases: usize,
    #[arg(long, env = "KPSSH_SSH_DIALS_PER_SECOND", default_value_t = 50)]
    pub ssh_dials_per_second: u32,
    /// Cap on pooled SSH connections (least recently used idle ones are closed first).
    #[arg(long, env = "KPSSH_MAX_SSH_CONNECTIONS", default_value_t = 4096)]
    pub max_ssh_connections: usize,
    /// Address of /metrics, /healthz and /readyz.
    #[arg(long, env = "KPSSH_METRICS_ADDR", default_value = "0.0.0.0:8080")]
    pub metrics_addr: String,
    /// How long phases in flight may run on after SIGTERM.
    #[arg(long, env = "KPSSH_SHUTDOWN_GRACE", default_value = "60s", value_parser = parse_duration)]
    pub shutdown_grace: Duration,
}

/// Go-style durations as the CRDs use them: `^([0-9]+(s|m|h))+$`.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    crate::profile::validate::parse_timeout(s)
        .ok_or_else(|| format!("{s:?} is not a duration like 90s, 2m or 1h30m"))
}

struct ControllerStatus {
    ctx: Context<KubeCluster, RusshTransport>,
    ready: Readiness,
}

impl Status for ControllerStatus {
    fn metrics(&self) -> String {
        let open = self.ctx.transport.pooled_connections();
        self.ctx
            .metrics
            .ssh_connections
            .set(i64::try_from(open).unwrap_or(i64::MAX));
        self.ctx.metrics.encode(&self.ctx.hosts)
    }
    fn ready(&self) -> bool {
        self.ready.get()
    }
}

pub async fn run(args: ControllerArgs) -> anyhow::Result<i32> {
    let telemetry = crate::telemetry::init()?;
    if telemetry.exporting() {
        tracing::info!("exporting traces over OTLP");
    }
    let mut kube_config = kube::Config::infer()
        .await
        .map_err(|e| anyhow::anyhow!("no cluster: {e} (set KUBECONFIG or run in-cluster)"))?;
    // The controller retries with its own backoff; kube's built-in retry would hold a refused
    // eviction (429) or an unavailable server for minutes inside one call.
    kube_config.default_retry = false;
    let client = kube::Client::try_from(kube_config)?;
    let config = Config {
        pool_namespace: args.pool_namespace.clone(),
        probe_interval: args.probe_interval,
        probe_refresh: args.probe_refresh,
        max_concurrent_probes: args.max_concurrent_probes,
        max_concurrent_phases: args.max_concurrent_phases,
        ssh_dials_per_second: args.ssh_dials_per_second,
        ..Config::default()
    };
    let transport = RusshTransport::new(TransportConfig {
        max_connections: args.max_ssh_connections,
        ..TransportConfig::default()
    });
    let ctx = Context::new(
        KubeCluster::new(client),
        Arc::new(transport),
        Clock::system(),
        config,
        None,
    );
    let listener = tokio::net::TcpListener::bind(&args.metrics_addr)
        .await
        .map_err(|e| anyhow::anyhow!("cannot listen on {}: {e}", args.metrics_addr))?;
    let ready = Readiness::default();
    let status = Arc::new(ControllerStatus {
        ctx: ctx.clone(),
        ready: ready.clone(),
    });
    tokio::spawn(serve(listener, status));
    let controller: Controller = spawn_controller(&ctx).await?;
    let mut karpenter = crate::karpenter::spawn(&ctx).await?;
    ready.set(true);
    tracing::info!(pool = %args.pool_namespace, "kpssh controller started");
    shutdown_signal().await;
    tracing::info!(grace = ?args.shutdown_grace, "shutting down: no new work, phases in flight finish");
    ready.set(false);
    karpenter.stop();
    controller.shutdown(args.shutdown_grace).await;
    // Lifecycles still open end here (the next controller resumes them as new traces), then
    // whatever the batch exporter holds is sent.
    ctx.lifecycles.end_all("ControllerShutdown");
    telemetry.shutdown().await;
    Ok(0)
}

async fn shutdown_signal() {
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term => {}
    }
}
