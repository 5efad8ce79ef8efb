//! `kpssh controller`: run the controller against a real cluster (kubeconfig or in-cluster).

use std::sync::Arc;
use std::time::Duration;

use clap::{ArgAction, Args};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::actors::{Controller, spawn_controller};
use crate::clock::Clock;
use crate::k8s::KubeCluster;
use crate::k8s::leader::{self, LeaderElector, LeaderError, Leadership, LeaseConfig, Role};
use crate::provider::{Config, Context};
use crate::server::{Readiness, Status, serve};
use crate::ssh::{RusshTransport, TransportConfig};

#[derive(Args, Debug)]
pub struct ControllerArgs {
    /// Namespace holding every SSHHost and its key Secret. Default: `$POOL_NAMESPACE` (the Go
    /// provider's setting), else kpssh-system.
    #[arg(long, env = "KPSSH_POOL_NAMESPACE")]
    pub pool_namespace: Option<String>,
    /// Probe period of an unchanged host (Go duration: 90s, 2m, 1h30m).
    #[arg(long, env = "KPSSH_PROBE_INTERVAL", default_value = "2m", value_parser = parse_duration)]
    pub probe_interval: Duration,
    /// Refresh period of status.lastProbeTime when nothing else changes (an unchanged probe
    /// writes nothing before that).
    #[arg(long, env = "KPSSH_PROBE_REFRESH", default_value = "1h", value_parser = parse_duration)]
    pub probe_refresh: Duration,
    /// Probes running at once, fleet-wide (each holds one SSH session for a few seconds).
    #[arg(long, env = "KPSSH_MAX_CONCURRENT_PROBES", default_value_t = 64)]
    pub max_concurrent_probes: usize,
    /// Launches (install through join) running at once; leaves have as many slots again.
    #[arg(long, env = "KPSSH_MAX_CONCURRENT_PHASES", default_value_t = 32)]
    pub max_concurrent_phases: usize,
    /// New SSH connections opened per second, fleet-wide (so that a restart or a burst never
    /// stampedes the hosts or a bastion; pooled connections are reused without a dial).
    #[arg(long, env = "KPSSH_SSH_DIALS_PER_SECOND", default_value_t = 50)]
    pub ssh_dials_per_second: u32,
    /// NodeClaims the router claims hosts for at once during a burst.
    #[arg(long, env = "KPSSH_MAX_CONCURRENT_CLAIMS", default_value_t = 128)]
    pub max_concurrent_claims: usize,
    /// Offer a node class whose hosts differ in architecture as one instance type per arch
    /// (`<class>-<arch>`) instead of not offering it.
    #[arg(long, env = "KPSSH_SPLIT_MIXED_ARCH", default_value_t = false, action = ArgAction::Set,
          num_args = 0..=1, default_missing_value = "true")]
    pub split_mixed_arch: bool,
    /// Node repair (as Karpenter's NodeRepair feature gate, off by default): a NodeClaim whose
    /// Node has been Ready=False or Unknown for 30 minutes is replaced, unless more than 20% of
    /// its NodePool's nodes are unhealthy.
    #[arg(long, env = "KPSSH_NODE_REPAIR", default_value_t = false, action = ArgAction::Set,
          num_args = 0..=1, default_missing_value = "true")]
    pub node_repair: bool,
    /// Cap on pooled SSH connections (least recently used idle ones are closed first; ~100 KiB
    /// and a file descriptor each). Above it a sweep of all hosts dials on every probe: see
    /// `--ssh-dials-per-second`.
    #[arg(long, env = "KPSSH_MAX_SSH_CONNECTIONS", default_value_t = 4096)]
    pub max_ssh_connections: usize,
    /// Address of /metrics (and /healthz, /readyz). Default: port `$METRICS_PORT` (the Go
    /// provider's setting), else 0.0.0.0:8080.
    #[arg(long, env = "KPSSH_METRICS_ADDR")]
    pub metrics_addr: Option<String>,
    /// Address of /healthz and /readyz (and /metrics), for the kubelet's probes. Default: port
    /// `$HEALTH_PROBE_PORT` (the Go provider's setting), else 0.0.0.0:8081.
    #[arg(long, env = "KPSSH_HEALTH_ADDR")]
    pub health_addr: Option<String>,
    /// How long phases in flight may run on after SIGTERM.
    #[arg(long, env = "KPSSH_SHUTDOWN_GRACE", default_value = "60s", value_parser = parse_duration)]
    pub shutdown_grace: Duration,
    /// Work only while holding the leader Lease; other replicas stand by and take over when
    /// the leader stops. `--leader-elect=false`: work at once, with no Lease (exactly one
    /// controller per pool must then run).
    #[arg(long, env = "KPSSH_LEADER_ELECT", default_value_t = true, action = ArgAction::Set,
          num_args = 0..=1, default_missing_value = "true")]
    pub leader_elect: bool,
    /// Namespace of the leader Lease. Empty: the kubeconfig context's namespace; in a pod, the
    /// pod's own namespace.
    #[arg(long, env = "KPSSH_LEADER_ELECTION_NAMESPACE", default_value = "")]
    pub leader_election_namespace: String,
    /// Name of the leader Lease: controllers naming the same Lease elect one leader among them.
    /// Default: `$LEADER_ELECTION_NAME` (the Go provider's setting), else kpssh-controller.
    #[arg(long, env = "KPSSH_LEADER_ELECTION_ID")]
    pub leader_election_id: Option<String>,
    /// Shard the pool (issue #26): manage only these SSHNodeClasses (comma-separated names),
    /// the SSHHosts they select, the NodePools whose nodeClassRef names one of them and those
    /// NodePools' NodeClaims. Several controllers with disjoint lists share one cluster, each
    /// with its own Lease. Empty (the default): every class, one controller for the pool. A
    /// host also selected by a class this controller does not own is left alone and reported
    /// (event `ShardOverlap`, `kpssh_shard_overlapping_hosts`).
    #[arg(long, env = "KPSSH_NODE_CLASSES", value_delimiter = ',', num_args = 0..)]
    pub node_classes: Vec<String>,
    /// Verified hosts: run a phase whose profile has no v2 signature with its v1 signature
    /// (binds neither phase, profile version nor expiry: someone who can edit profiles can
    /// replay any v1-signed script as any phase). Off by default; each such run logs a warning.
    #[arg(long, env = "KPSSH_ALLOW_V1_SIGNATURES", default_value_t = false, action = ArgAction::Set,
          num_args = 0..=1, default_missing_value = "true")]
    pub allow_v1_signatures: bool,
}

/// The settings the Go provider's chart and image pass by environment, read where kpssh's own
/// flag or variable is not given: `POOL_NAMESPACE`, `METRICS_PORT`, `HEALTH_PROBE_PORT`,
/// `LEADER_ELECTION_NAME`, `BATCH_MAX_DURATION`, `BATCH_IDLE_DURATION` (`LOG_LEVEL` is read by
/// the log setup).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Resolved {
    pub pool_namespace: String,
    pub metrics_addr: String,
    pub health_addr: String,
    pub leader_election_id: String,
    pub batch_max: Option<Duration>,
    pub batch_idle: Option<Duration>,
}

impl ControllerArgs {
    /// kpssh's own settings, else the Go provider's names from `env`, else the defaults.
    pub fn resolve(&self, env: impl Fn(&str) -> Option<String>) -> anyhow::Result<Resolved> {
        let go = |name: &str| env(name).filter(|v| !v.trim().is_empty());
        let port = |name: &str, default: u16| -> anyhow::Result<String> {
            match go(name) {
                None => Ok(format!("0.0.0.0:{default}")),
                Some(p) => {
                    let p: u16 = p.trim().parse().map_err(|_| {
                        anyhow::anyhow!("{name}={p:?} is not a port number (1-65535)")
                    })?;
                    Ok(format!("0.0.0.0:{p}"))
                }
            }
        };
        let duration = |name: &str| -> anyhow::Result<Option<Duration>> {
            go(name)
                .map(|v| parse_duration(v.trim()).map_err(|e| anyhow::anyhow!("{name}: {e}")))
                .transpose()
        };
        Ok(Resolved {
            pool_namespace: match &self.pool_namespace {
                Some(ns) => ns.clone(),
                None => go("POOL_NAMESPACE")
                    .unwrap_or_else(|| crate::api::DEFAULT_POOL_NAMESPACE.to_string()),
            },
            metrics_addr: match &self.metrics_addr {
                Some(a) => a.clone(),
                None => port("METRICS_PORT", 8080)?,
            },
            health_addr: match &self.health_addr {
                Some(a) => a.clone(),
                None => port("HEALTH_PROBE_PORT", 8081)?,
            },
            leader_election_id: match &self.leader_election_id {
                Some(id) => id.clone(),
                None => {
                    let base =
                        go("LEADER_ELECTION_NAME").unwrap_or_else(|| "kpssh-controller".into());
                    shard_lease_name(&base, &self.node_classes)?
                }
            },
            batch_max: duration("BATCH_MAX_DURATION")?,
            batch_idle: duration("BATCH_IDLE_DURATION")?,
        })
    }
}

/// The Lease of a shard: `<base>-<its classes, sorted, joined by '-'>`, so that each shard
/// elects its own leader without a flag; `base` alone without sharding.
pub fn shard_lease_name(base: &str, classes: &[String]) -> anyhow::Result<String> {
    let mut owned: Vec<&str> = (classes.iter())
        .map(|c| c.trim())
        .filter(|c| !c.is_empty())
        .collect();
    if owned.is_empty() {
        return Ok(base.to_string());
    }
    owned.sort_unstable();
    owned.dedup();
    let name = format!("{base}-{}", owned.join("-"));
    // A Lease name is a DNS subdomain (at most 253 characters).
    if name.len() > 253 {
        anyhow::bail!(
            "the Lease name derived from --node-classes is {} characters (at most 253): name it \
             with --leader-election-id",
            name.len()
        );
    }
    Ok(name)
}

/// Go-style durations as the CRDs use them: `^([0-9]+(s|m|h))+$`.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    crate::profile::validate::parse_timeout(s)
        .ok_or_else(|| format!("{s:?} is not a duration like 90s, 2m or 1h30m"))
}

struct ControllerStatus {
    ctx: Context<KubeCluster, RusshTransport>,
    /// Set once the controller's watches delivered their first lists.
    ready: Readiness,
    /// The election's view; `None` with `--leader-elect=false`.
    role: Option<watch::Receiver<Role>>,
}

impl ControllerStatus {
    /// Whether this process does the work (leads, or runs without an election).
    fn working(&self) -> bool {
        self.role
            .as_ref()
            .is_none_or(|r| *r.borrow() == Role::Leader)
    }
}

impl Status for ControllerStatus {
    fn metrics(&self) -> String {
        let open = self.ctx.transport.pooled_connections();
        self.ctx
            .metrics
            .ssh_connections
            .set(i64::try_from(open).unwrap_or(i64::MAX));
        let mut text = self.ctx.metrics.encode(&self.ctx.hosts);
        text.push_str(&leader::exposition(self.working()));
        text.push_str(&shard_exposition(&self.ctx.shard));
        text
    }
    /// A standby is ready once it has read the Lease: it is healthy and can take over, and a
    /// RollingUpdate must be able to count it (a standby that never turned Ready would stall
    /// every rollout). The leader is ready once its watches delivered their first lists.
    fn ready(&self) -> bool {
        match self.role.as_ref().map(|r| r.borrow().clone()) {
            None | Some(Role::Leader) => self.ready.get(),
            Some(Role::Standby { .. }) => true,
            Some(Role::Starting | Role::Lost) => false,
        }
    }
}

/// `kpssh_shard_info`: which node classes this controller owns, so that the metrics of
/// several shards can be told apart (`*`: all, no sharding).
pub fn shard_exposition(shard: &crate::provider::shard::Shard) -> String {
    format!(
        "# HELP kpssh_shard_info The SSHNodeClasses this controller owns (--node-classes; * for all).\n# TYPE kpssh_shard_info gauge\nkpssh_shard_info{{node_classes=\"{}\"}} 1\n",
        shard.describe()
    )
}

pub async fn run(args: ControllerArgs) -> anyhow::Result<i32> {
    let telemetry = crate::telemetry::init()?;
    let resolved = args.resolve(|name| std::env::var(name).ok())?;
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
    let cluster = KubeCluster::new(client.clone());
    let config = Config {
        pool_namespace: resolved.pool_namespace.clone(),
        probe_interval: args.probe_interval,
        probe_refresh: args.probe_refresh,
        max_concurrent_probes: args.max_concurrent_probes,
        max_concurrent_phases: args.max_concurrent_phases,
        ssh_dials_per_second: args.ssh_dials_per_second,
        max_concurrent_claims: args.max_concurrent_claims.max(1),
        split_mixed_arch: args.split_mixed_arch,
        node_classes: args.node_classes.clone(),
        verified: crate::profile::verified::VerifiedPolicy {
            allow_v1: args.allow_v1_signatures,
        },
        ..Config::default()
    };
    if args.allow_v1_signatures {
        tracing::warn!(
            "--allow-v1-signatures: Verified hosts may run v1-signed scripts, which are not bound \
             to phase, profile version or expiry"
        );
    }
    let transport = RusshTransport::new(TransportConfig {
        max_connections: args.max_ssh_connections,
        ..TransportConfig::default()
    });
    let ctx = Context::new(
        cluster.clone(),
        Arc::new(transport),
        Clock::system(),
        config,
        None,
    );
    if ctx.shard.is_sharded() {
        tracing::info!(node_classes = %ctx.shard.describe(), "sharded: managing only these node classes");
    }
    let elector = if args.leader_elect {
        let namespace = if args.leader_election_namespace.is_empty() {
            client.default_namespace().to_string()
        } else {
            args.leader_election_namespace.clone()
        };
        let lease = LeaseConfig::new(
            &namespace,
            &resolved.leader_election_id,
            &leader::process_identity(),
        );
        Some(LeaderElector::new(cluster, lease, Clock::system())?)
    } else {
        None
    };
    let listener = tokio::net::TcpListener::bind(&resolved.metrics_addr)
        .await
        .map_err(|e| anyhow::anyhow!("cannot listen on {}: {e}", resolved.metrics_addr))?;
    // The kubelet's probes on their own port, as the Go provider serves them (the same
    // endpoints; one listener when both addresses are the same).
    let health = if resolved.health_addr == resolved.metrics_addr {
        None
    } else {
        Some(
            tokio::net::TcpListener::bind(&resolved.health_addr)
                .await
                .map_err(|e| anyhow::anyhow!("cannot listen on {}: {e}", resolved.health_addr))?,
        )
    };
    let ready = Readiness::default();
    let status = Arc::new(ControllerStatus {
        ctx: ctx.clone(),
        ready: ready.clone(),
        role: elector.as_ref().map(LeaderElector::role),
    });
    if let Some(health) = health {
        tokio::spawn(serve(health, status.clone()));
    }
    tokio::spawn(serve(listener, status));
    let shutdown = CancellationToken::new();
    tokio::spawn({
        let shutdown = shutdown.clone();
        async move {
            shutdown_signal().await;
            shutdown.cancel();
        }
    });

    let mut leadership = match elector {
        None => None,
        Some(elector) => {
            let lease = elector.config().clone();
            tracing::info!(lease = %format!("{}/{}", lease.namespace, lease.name),
                identity = %lease.identity, "waiting for the leader Lease before working");
            match elector.acquire(&shutdown).await {
                Some(held) => Some(held),
                None => {
                    tracing::info!("shut down while standing by");
                    telemetry.shutdown().await;
                    return Ok(0);
                }
            }
        }
    };
    let started = async {
        let controller: Controller = spawn_controller(&ctx).await?;
        let defaults = crate::karpenter::KarpenterConfig::for_actors(&ctx.config);
        let config = crate::karpenter::KarpenterConfig {
            node_repair: args.node_repair,
            batch_max: resolved.batch_max.unwrap_or(defaults.batch_max),
            batch_idle: resolved.batch_idle.unwrap_or(defaults.batch_idle),
            ..defaults
        };
        let karpenter = crate::karpenter::spawn_with(&ctx, config).await?;
        anyhow::Ok((controller, karpenter))
    };
    let (controller, mut karpenter) = tokio::select! {
        r = started => match r {
            Ok(parts) => parts,
            Err(e) => {
                // Hand the Lease on rather than make a standby wait out its duration.
                if let Some(held) = leadership {
                    let _ = held.release().await;
                }
                return Err(e);
            }
        },
        e = lost(&mut leadership) => return Ok(exit_on_lost(&e)),
    };
    ready.set(true);
    tracing::info!(pool = %resolved.pool_namespace, "kpssh controller started");
    tokio::select! {
        _ = shutdown.cancelled() => {}
        e = lost(&mut leadership) => return Ok(exit_on_lost(&e)),
    }
    tracing::info!(grace = ?args.shutdown_grace, "shutting down: no new work, phases in flight finish");
    ready.set(false);
    karpenter.stop();
    // The Lease is still renewed while phases finish: nobody else may start on the same hosts.
    tokio::select! {
        _ = controller.shutdown(args.shutdown_grace) => {}
        e = lost(&mut leadership) => return Ok(exit_on_lost(&e)),
    }
    // Lifecycles still open end here (the next controller resumes them as new traces), then
    // whatever the batch exporter holds is sent.
    ctx.lifecycles.end_all("ControllerShutdown");
    if let Some(held) = leadership {
        // Work has stopped: a standby may take over at its next retry.
        match held.release().await {
            Ok(true) => tracing::info!("released the leader Lease"),
            Ok(false) => tracing::warn!("the leader Lease was no longer ours to release"),
            Err(e) => {
                tracing::warn!(error = %e, "could not release the leader Lease; it expires on its own")
            }
        }
    }
    telemetry.shutdown().await;
    Ok(0)
}

/// Exit status after losing the Lease: the process stops at once (its Pod restarts and stands
/// by), because another controller may start working on the same hosts after the lease duration.
pub const LOST_LEASE_EXIT: i32 = 1;

fn exit_on_lost(e: &LeaderError) -> i32 {
    tracing::error!(error = %e, "lost the leader Lease: exiting so that no work continues without it");
    LOST_LEASE_EXIT
}

/// Resolves when a held Lease is lost; never without an election.
async fn lost(leadership: &mut Option<Leadership<KubeCluster>>) -> LeaderError {
    match leadership.as_mut() {
        Some(held) => held.lost().await,
        None => std::future::pending().await,
    }
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

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        args: ControllerArgs,
    }

    fn args(argv: &[&str]) -> ControllerArgs {
        Cli::try_parse_from(std::iter::once("kpssh").chain(argv.iter().copied()))
            .expect("parse")
            .args
    }

    #[test]
    fn the_go_providers_environment_is_honoured_where_kpssh_says_nothing() {
        let go = |name: &str| {
            Some(match name {
                "POOL_NAMESPACE" => "pool".to_string(),
                "METRICS_PORT" => "9090".into(),
                "HEALTH_PROBE_PORT" => "9091".into(),
                "LEADER_ELECTION_NAME" => "karpenter-provider-ssh".into(),
                "BATCH_MAX_DURATION" => "20s".into(),
                "BATCH_IDLE_DURATION" => "2s".into(),
                _ => return None,
            })
        };
        let r = args(&[]).resolve(go).expect("resolve");
        assert_eq!(
            r,
            Resolved {
                pool_namespace: "pool".into(),
                metrics_addr: "0.0.0.0:9090".into(),
                health_addr: "0.0.0.0:9091".into(),
                leader_election_id: "karpenter-provider-ssh".into(),
                batch_max: Some(Duration::from_secs(20)),
                batch_idle: Some(Duration::from_secs(2)),
            }
        );
        // kpssh's own settings win; nothing set: the defaults, health on :8081 as in Go.
        let own = args(&["--pool-namespace", "mine", "--metrics-addr", "127.0.0.1:1"]);
        let r = own.resolve(go).expect("resolve");
        assert_eq!(
            (r.pool_namespace.as_str(), r.metrics_addr.as_str()),
            ("mine", "127.0.0.1:1")
        );
        let r = args(&[]).resolve(|_| None).expect("resolve");
        assert_eq!(r.pool_namespace, crate::api::DEFAULT_POOL_NAMESPACE);
        assert_eq!(
            (r.metrics_addr.as_str(), r.health_addr.as_str()),
            ("0.0.0.0:8080", "0.0.0.0:8081")
        );
        assert_eq!(r.leader_election_id, "kpssh-controller");
        // A bad value names the variable.
        let err = args(&[])
            .resolve(|n| (n == "HEALTH_PROBE_PORT").then(|| "http".to_string()))
            .expect_err("bad port");
        assert!(err.to_string().contains("HEALTH_PROBE_PORT"), "{err}");
    }

    #[test]
    fn a_shard_gets_its_own_lease_unless_one_is_named() {
        let r = args(&["--node-classes", "b,a"])
            .resolve(|_| None)
            .expect("resolve");
        assert_eq!(r.leader_election_id, "kpssh-controller-a-b");
        let r = args(&["--node-classes", "gpu"])
            .resolve(|n| (n == "LEADER_ELECTION_NAME").then(|| "karpenter-ssh".to_string()))
            .expect("resolve");
        assert_eq!(r.leader_election_id, "karpenter-ssh-gpu");
        let r = args(&["--node-classes", "gpu", "--leader-election-id", "mine"])
            .resolve(|_| None)
            .expect("resolve");
        assert_eq!(r.leader_election_id, "mine");
        // No sharding: the Lease of today.
        let a = args(&[]);
        assert!(a.node_classes.is_empty());
        assert_eq!(
            a.resolve(|_| None).expect("resolve").leader_election_id,
            "kpssh-controller"
        );
        let long = vec!["x".repeat(200), "y".repeat(60)];
        let err = shard_lease_name("kpssh-controller", &long).expect_err("too long");
        assert!(err.to_string().contains("--leader-election-id"), "{err}");
    }
}
