//! A running controller against the in-memory cluster and simulated hosts: what scenario
//! tests and `kpssh sim` drive. Runs on tokio's clock; pause it for determinism.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret as KubeSecret;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use kube::api::ObjectMeta;
use ractor::ActorRef;

use super::host::SimHost;
use super::transport::SimTransport;
use crate::actors::nodeclass::NodeClassMsg;
use crate::actors::router::RouterMsg;
use crate::actors::supervisor::SupervisorMsg;
use crate::actors::{Controller, spawn_controller};
use crate::api::host::SecretRef;
use crate::api::karpenter::{NodeClaimSpec, NodeClassRef};
use crate::api::nodeclass::{ClusterEndpoint, ProfileRef, SSHNodeClassSpec};
use crate::api::profile::{SSHJoinProfileSpec, Scripts, Timeouts};
use crate::api::{
    GROUP, HOST_CLASS_LABEL, NodeClaim, SSHHost, SSHHostSpec, SSHJoinProfile, SSHNodeClass,
};
use crate::clock::Clock;
use crate::k8s::{Cluster, ClusterError, MemoryCluster};
use crate::provider::{Config, Context};

pub const KEY_SECRET: &str = "ssh-key";

pub struct World {
    pub cluster: MemoryCluster,
    pub transport: SimTransport,
    pub ctx: Context<MemoryCluster, SimTransport>,
    pub supervisor: ActorRef<SupervisorMsg>,
    pub router: ActorRef<RouterMsg>,
    pub nodeclasses: ActorRef<NodeClassMsg>,
    /// The karpenter layer (provisioning, lifecycle, termination, disruption), when running.
    pub karpenter: Option<crate::karpenter::KarpenterHandles>,
    /// Its settings (a restarted controller starts it with the same).
    pub karpenter_config: crate::karpenter::KarpenterConfig,
}

impl World {
    /// Start the whole controller (actor core and karpenter layer) with `config` and `seed`.
    pub async fn start(config: Config, seed: u64) -> Result<World, ClusterError> {
        let karpenter = crate::karpenter::KarpenterConfig::for_actors(&config);
        Self::start_with(config, karpenter, seed).await
    }

    /// [`World::start`] with the karpenter layer's settings (e.g. node repair on).
    pub async fn start_with(
        config: Config,
        karpenter: crate::karpenter::KarpenterConfig,
        seed: u64,
    ) -> Result<World, ClusterError> {
        let mut world = Self::start_bare(config, seed).await?;
        let handles = crate::karpenter::spawn_with(&world.ctx, karpenter.clone())
            .await
            .map_err(spawn_error)?;
        world.karpenter = Some(handles);
        world.karpenter_config = karpenter;
        Ok(world)
    }

    /// Start only the actor core (for tests that run the karpenter layer with their own
    /// settings).
    pub async fn start_bare(config: Config, seed: u64) -> Result<World, ClusterError> {
        let start: jiff::Timestamp = "2026-01-01T00:00:00Z"
            .parse()
            .unwrap_or(jiff::Timestamp::UNIX_EPOCH);
        let clock = Clock::simulated(start);
        let cluster = MemoryCluster::new(clock.clone());
        let transport = SimTransport::new(cluster.clone());
        let ns = config.pool_namespace.clone();
        let karpenter_config = crate::karpenter::KarpenterConfig::for_actors(&config);
        let ctx = Context::new(
            cluster.clone(),
            Arc::new(transport.clone()),
            clock,
            config,
            Some(seed),
        );
        cluster.create(&key_secret(&ns)).await?;
        let Controller {
            supervisor,
            router,
            nodeclasses,
        } = spawn_controller(&ctx).await.map_err(spawn_error)?;
        Ok(World {
            cluster,
            transport,
            ctx,
            supervisor,
            router,
            nodeclasses,
            karpenter: None,
            karpenter_config,
        })
    }

    pub fn ns(&self) -> String {
        self.ctx.pool_ns().to_string()
    }

    /// The join profile `profile` (version 1) and a node class `class` using it: the
    /// pool every scenario test starts from.
    pub async fn add_profile_and_class(
        &self,
        profile: &str,
        class: &str,
    ) -> Result<(), crate::k8s::ClusterError> {
        self.cluster.create(&sim_profile(profile, "1")).await?;
        self.cluster.create(&node_class(class, profile)).await?;
        Ok(())
    }

    /// Add a simulated machine and its SSHHost object.
    pub async fn add_host(
        &self,
        name: &str,
        class: &str,
        sim: SimHost,
    ) -> Result<SSHHost, ClusterError> {
        let host = host_object(&self.ns(), name, class, &sim);
        self.transport.add(sim);
        self.cluster.create(&host).await
    }

    pub async fn host(&self, name: &str) -> Option<SSHHost> {
        self.cluster
            .get::<SSHHost>(Some(&self.ns()), name)
            .await
            .ok()
            .flatten()
    }

    /// Let virtual time pass in small steps until `done` holds or `limit` passed.
    pub async fn until<F, Fut>(&self, limit: Duration, mut done: F) -> bool
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = bool>,
    {
        let step = Duration::from_millis(250);
        let mut waited = Duration::ZERO;
        while waited <= limit {
            if done().await {
                return true;
            }
            tokio::time::sleep(step).await;
            waited += step;
        }
        false
    }

    /// A controller crash: every actor dies at once, mid-phase included; then a new controller
    /// starts against the same API and hosts and rebuilds from the API state.
    pub async fn crash_and_restart(&mut self, seed: u64) -> Result<(), ClusterError> {
        // The supervisor's host actors die with it (their handles abort them when its state
        // goes).
        self.supervisor.kill();
        self.router.kill();
        self.nodeclasses.kill();
        // The process is gone, and with it the probes it had scheduled: a clock left running
        // would hold every dead host actor (their mailboxes) until its last probe came due,
        // beside the new controller's.
        self.ctx.probe_clock.stop();
        let restart_karpenter = self.karpenter.take().is_some();
        // The new process starts with no SSH connections: every host is dialled again.
        self.transport.drop_connections();
        tokio::time::sleep(Duration::from_millis(1)).await;
        let ctx = Context::new(
            self.cluster.clone(),
            Arc::new(self.transport.clone()),
            self.ctx.clock.clone(),
            (*self.ctx.config).clone(),
            Some(seed),
        );
        let Controller {
            supervisor,
            router,
            nodeclasses,
        } = spawn_controller(&ctx).await.map_err(spawn_error)?;
        if restart_karpenter {
            let handles = crate::karpenter::spawn_with(&ctx, self.karpenter_config.clone());
            self.karpenter = Some(handles.await.map_err(spawn_error)?);
        }
        self.ctx = ctx;
        self.supervisor = supervisor;
        self.router = router;
        self.nodeclasses = nodeclasses;
        Ok(())
    }

    pub async fn stop(self) {
        self.nodeclasses.stop(None);
        self.router.stop(None);
        self.supervisor.stop(None);
    }
}

fn spawn_error(message: impl ToString) -> ClusterError {
    let message = message.to_string();
    ClusterError::Invalid {
        kind: "Actor".into(),
        key: String::new(),
        message,
    }
}

pub fn key_secret(ns: &str) -> KubeSecret {
    KubeSecret {
        metadata: ObjectMeta {
            name: Some(KEY_SECRET.into()),
            namespace: Some(ns.into()),
            ..Default::default()
        },
        data: Some(BTreeMap::from([(
            "privateKey".to_string(),
            ByteString(b"-----BEGIN OPENSSH PRIVATE KEY-----\nsimulated\n-----END OPENSSH PRIVATE KEY-----\n".to_vec()),
        )])),
        ..Default::default()
    }
}

pub fn host_object(ns: &str, name: &str, class: &str, sim: &SimHost) -> SSHHost {
    let mut h = SSHHost::new(
        name,
        SSHHostSpec {
            address: sim.address.clone(),
            port: 22,
            user: "root".into(),
            ssh_key_secret_ref: SecretRef {
                name: KEY_SECRET.into(),
            },
            node_address: None,
            capacity: BTreeMap::from([
                ("cpu".into(), Quantity(sim.cpu.to_string())),
                ("memory".into(), Quantity(format!("{}Ki", sim.memory_kib))),
            ]),
            exec_mode: Default::default(),
            trusted_signers: None,
            shim_command: "/opt/kpssh/kpssh-shim".into(),
            proxy_jump: None,
        },
    );
    h.metadata.namespace = Some(ns.into());
    h.metadata.labels = Some(BTreeMap::from([(
        HOST_CLASS_LABEL.to_string(),
        class.to_string(),
    )]));
    h
}

/// A profile whose scripts the simulated hosts understand.
pub fn sim_profile(name: &str, version: &str) -> SSHJoinProfile {
    SSHJoinProfile::new(
        name,
        SSHJoinProfileSpec {
            version: version.into(),
            scripts: Scripts {
                install: "echo sim-install\n".into(),
                join: "echo sim-join \"$KPSSH_NODE_NAME\"\n".into(),
                leave: "echo sim-leave\n".into(),
                uninstall: None,
            },
            timeouts: Timeouts::default(),
            signatures: None,
            signatures_v2: None,
        },
    )
}

pub fn node_class(name: &str, profile: &str) -> SSHNodeClass {
    SSHNodeClass::new(
        name,
        SSHNodeClassSpec {
            host_selector: None,
            join_profile_ref: ProfileRef {
                name: profile.into(),
            },
            vars: None,
            join_secret_ref: None,
            provider_id_source: Default::default(),
            price_per_cpu_hour: "0.02".into(),
            kube_reserved: BTreeMap::from([
                ("cpu".into(), Quantity("80m".into())),
                ("memory".into(), Quantity("300Mi".into())),
            ]),
            max_pods: 110,
            cluster: Some(ClusterEndpoint {
                endpoint: "https://10.0.0.1:6443".into(),
                ca_bundle: Some("Q0E=".into()),
            }),
            startup_taint_gates: None,
        },
    )
}

/// A NodeClaim for `class` requesting `cpu` and `memory`.
pub fn node_claim(name: &str, class: &str, cpu: &str, memory: &str) -> NodeClaim {
    let mut nc = NodeClaim::new(
        name,
        NodeClaimSpec {
            node_class_ref: NodeClassRef {
                group: GROUP.into(),
                kind: "SSHNodeClass".into(),
                name: class.into(),
            },
            ..Default::default()
        },
    );
    nc.spec.resources.requests = BTreeMap::from([
        ("cpu".into(), Quantity(cpu.into())),
        ("memory".into(), Quantity(memory.into())),
    ]);
    nc
}

/// A NodePool whose NodeClaims use the node class `class`, nothing else set.
pub fn node_pool(name: &str, class: &str) -> crate::api::NodePool {
    use crate::api::karpenter::{NodeClaimTemplate, NodeClaimTemplateSpec, NodePoolSpec};
    crate::api::NodePool::new(
        name,
        NodePoolSpec {
            template: NodeClaimTemplate {
                metadata: Default::default(),
                spec: NodeClaimTemplateSpec {
                    node_class_ref: NodeClassRef {
                        group: GROUP.into(),
                        kind: "SSHNodeClass".into(),
                        name: class.into(),
                    },
                    ..Default::default()
                },
            },
            ..Default::default()
        },
    )
}

/// Namespace of the simulated workload's pods.
pub const POD_NAMESPACE: &str = "default";
/// On every simulated pod: the NodePool its demand is for.
pub const POD_POOL_LABEL: &str = "sim.kpssh.dev/pool";
/// On every simulated pod: the demand entry (a Deployment of one pod shape) it belongs to.
pub const POD_GROUP_LABEL: &str = "sim.kpssh.dev/group";

/// A pod in the `default` namespace with one container requesting `cpu` and `memory`.
pub fn pod(name: &str, cpu: &str, memory: &str) -> k8s_openapi::api::core::v1::Pod {
    use k8s_openapi::api::core::v1::{Container, Pod, PodSpec, ResourceRequirements};
    Pod {
        metadata: ObjectMeta {
            name: Some(name.into()),
            namespace: Some(POD_NAMESPACE.into()),
            ..Default::default()
        },
        spec: Some(PodSpec {
            containers: vec![Container {
                name: "app".into(),
                resources: Some(ResourceRequirements {
                    requests: Some(BTreeMap::from([
                        ("cpu".to_string(), Quantity(cpu.into())),
                        ("memory".to_string(), Quantity(memory.into())),
                    ])),
                    ..Default::default()
                }),
                ..Default::default()
            }],
            ..Default::default()
        }),
        status: None,
    }
}

/// A pod of the simulated workload: `cpu` and `memory` requested, for NodePool `pool`, of
/// demand entry `group`. It plays a Deployment's pod: evicted by a drain, it comes back
/// pending under a new name.
pub fn workload_pod(
    name: &str,
    (pool, group): (&str, &str),
    cpu: &str,
    memory: &str,
) -> k8s_openapi::api::core::v1::Pod {
    let mut p = pod(name, cpu, memory);
    p.metadata.labels = Some(BTreeMap::from([
        (POD_POOL_LABEL.to_string(), pool.to_string()),
        (POD_GROUP_LABEL.to_string(), group.to_string()),
    ]));
    p.metadata.annotations = Some(BTreeMap::from([(
        crate::sim::scheduler::RECREATE_ANNOTATION.to_string(),
        "true".to_string(),
    )]));
    if let Some(spec) = p.spec.as_mut() {
        spec.node_selector = Some(BTreeMap::from([(
            crate::api::karpenter::NODEPOOL_LABEL.to_string(),
            pool.to_string(),
        )]));
    }
    p
}
