//! Provisioning (S36): batches of unschedulable pending pods become NodeClaims, bin-packed onto
//! the cheapest fitting host classes of the NodePools that can take them.

pub mod batch;
pub mod nominate;
pub mod pack;
pub mod solve;
pub mod volumes;

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::api::ObjectMeta;
use rand::Rng;
use tokio::task::JoinHandle;

use super::scheduling::PodInfo;
use super::state::{ClusterState, Inner};
use super::topology::{Mode, Topology};
use super::{KarpenterConfig, KarpenterError};
use crate::api::karpenter::claim_type;
use crate::api::karpenter::{
    INSTANCE_TYPE_LABEL, NODEPOOL_LABEL, NodeClaimSpec, NodeSelectorRequirement, ResourceRequests,
};
use crate::api::quantity;
use crate::api::requirements::Requirements;
use crate::api::{NodeClaim, NodePool, SSHNodeClass};
use crate::k8s::{Cluster, EventRecord, EventType, ObjectRef};
use crate::provider::Context;
use crate::provider::instance_types::{InstanceType, instance_types};
use crate::ssh::Transport;
use k8s_openapi::api::core::v1::Taint;

pub use pack::{NewClaim, PoolOffer};

/// What one provisioning round did.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct ProvisionReport {
    pub pending: usize,
    /// Pods that fit on NodeClaims already in flight (or their nodes).
    pub absorbed: usize,
    pub created: Vec<String>,
    /// Pods left pending, with why.
    pub unplaced: Vec<((String, String), String)>,
}

pub fn spawn<C: Cluster, T: Transport>(
    ctx: Context<C, T>,
    state: ClusterState,
    cfg: KarpenterConfig,
) -> JoinHandle<()> {
    tokio::spawn(async move {
        let mut p = Provisioner::new(ctx, state, cfg);
        p.run().await;
    })
}

pub struct Provisioner<C: Cluster, T: Transport> {
    ctx: Context<C, T>,
    state: ClusterState,
    cfg: KarpenterConfig,
    /// Events already sent, by pod UID and reason (one event per pod and reason).
    told: BTreeSet<(String, String)>,
    /// The node affinity of the volumes pods mount (S56).
    volumes: volumes::VolumeTopology,
    /// The NodeClaim each pending pod was last planned onto (pods no longer pending are
    /// dropped each round).
    planned: BTreeMap<(String, String), String>,
    /// S59: core's Nominated events.
    nominator: nominate::Nominator,
    /// What the last round read and reported, if it changed nothing (see [`Inputs`]).
    idle: Option<(Inputs, ProvisionReport)>,
}

/// Versions of everything a provisioning round reads, other than the provisioner's own
/// memory: the cluster state (pods, NodePools, NodeClaims, Nodes, DaemonSets), the host view
/// (instance types, free hosts, claims holding hosts) and each node class the pools name, by
/// resourceVersion. A round over the same inputs that created nothing, told nothing new and
/// planned the same decides the same again, so it is skipped: while a NodePool's limits hold
/// pods pending, the retry every `provision_retry` used to rebuild the whole plan.
/// PersistentVolumes and namespaces are not versioned here: a round that read them is never
/// skipped.
#[derive(Debug, Clone, PartialEq)]
struct Inputs {
    state: (u64, u64),
    hosts: u64,
    classes: Vec<(String, Option<String>)>,
}

const POLL: Duration = Duration::from_millis(100);

impl<C: Cluster, T: Transport> Provisioner<C, T> {
    pub fn new(ctx: Context<C, T>, state: ClusterState, cfg: KarpenterConfig) -> Self {
        Provisioner {
            ctx,
            state,
            cfg,
            told: BTreeSet::new(),
            volumes: volumes::VolumeTopology::default(),
            planned: BTreeMap::new(),
            nominator: nominate::Nominator::default(),
            idle: None,
        }
    }

    async fn run(&mut self) {
        let mut seen = 0u64;
        let mut last = tokio::time::Instant::now();
        loop {
            tokio::time::sleep(POLL).await;
            let seq = self.state.pending_seq();
            let retry_due = last.elapsed() >= self.cfg.provision_retry;
            if seq == seen && !retry_due {
                continue;
            }
            if seq != seen {
                batch::wait(&self.state, &self.cfg, POLL).await;
            }
            seen = self.state.pending_seq();
            last = tokio::time::Instant::now();
            if let Err(e) = self.provision_once().await {
                tracing::warn!(error = %e, "provisioning round failed; will retry");
            }
        }
    }

    /// One round over every provisionable pod.
    #[tracing::instrument(skip_all)]
    pub async fn provision_once(&mut self) -> Result<ProvisionReport, KarpenterError> {
        let (version, any, pools) = {
            let st = self.state.read();
            let any = st.pods.values().any(super::pods::is_provisionable);
            let pools: Vec<NodePool> = if any {
                (st.nodepools.values())
                    .filter(|p| p.metadata.deletion_timestamp.is_none())
                    .cloned()
                    .collect()
            } else {
                vec![]
            };
            (st.version(), any, pools)
        };
        if !any {
            // Nothing pending: no copy of the NodeClaims and NodePools.
            return Ok(ProvisionReport::default());
        }
        let hosts = self.ctx.hosts.version();
        let classes = self.classes(&pools).await?;
        let inputs = Inputs {
            state: version,
            hosts,
            classes: (classes.iter())
                .map(|(n, c)| {
                    let rv = c.as_ref().and_then(|c| c.metadata.resource_version.clone());
                    (n.clone(), rv)
                })
                .collect(),
        };
        if let Some((seen, report)) = &self.idle
            && *seen == inputs
        {
            return Ok(report.clone());
        }
        self.idle = None;
        let told = self.told.len();
        let planned = self.planned.clone();
        let (report, reread) = self.round(pools, classes).await?;
        if report.created.is_empty()
            && !reread
            && self.told.len() == told
            && self.planned == planned
        {
            self.idle = Some((inputs, report.clone()));
        }
        Ok(report)
    }

    /// The node class each pool names, read once per round.
    async fn classes(
        &self,
        pools: &[NodePool],
    ) -> Result<BTreeMap<String, Option<SSHNodeClass>>, KarpenterError> {
        let mut classes = BTreeMap::new();
        for pool in pools {
            let class_name = &pool.spec.template.spec.node_class_ref.name;
            if !classes.contains_key(class_name) {
                let c = self
                    .ctx
                    .cluster
                    .get::<SSHNodeClass>(None, class_name)
                    .await?;
                classes.insert(class_name.clone(), c);
            }
        }
        Ok(classes)
    }

    /// The round itself, and whether it read what [`Inputs`] does not version (volumes,
    /// namespaces).
    async fn round(
        &mut self,
        pools: Vec<NodePool>,
        classes: BTreeMap<String, Option<SSHNodeClass>>,
    ) -> Result<(ProvisionReport, bool), KarpenterError> {
        let (mut pods, claims) = {
            let st = self.state.read();
            let pods: Vec<PodInfo> = st
                .pods
                .values()
                .filter(|p| super::pods::is_provisionable(p))
                .map(|p| PodInfo::clone(&st.pod_info(p)))
                .collect();
            (pods, st.nodeclaims.clone())
        };
        let mut report = ProvisionReport {
            pending: pods.len(),
            ..Default::default()
        };
        super::scheduling::sort_pods(&mut pods);
        let mut reread = pods.iter().any(|p| !p.claims.is_empty());
        self.volumes.resolve(&self.ctx, &mut pods).await?;
        // Unsupported constraints: never ignored silently.
        let mut supported = vec![];
        for p in pods {
            match &p.invalid {
                Some(why) => {
                    let msg = format!("not provisioned: unsupported constraint ({why})");
                    self.tell(&p, "UnsupportedConstraint", &msg).await;
                    report.unplaced.push((p.key(), msg));
                }
                None => supported.push(p),
            }
        }
        // S64: why pools cannot launch now, told to every pod left pending.
        let (offers, blocked) = self.offers(&pools, &classes);
        let types: BTreeMap<String, InstanceType> = offers
            .iter()
            .flat_map(|o| o.types.iter().map(|t| (t.name.clone(), t.clone())))
            .collect();
        let namespaces = if super::topology::needs_namespaces(supported.iter()) {
            reread = true;
            namespace_labels(&self.ctx.cluster).await?
        } else {
            BTreeMap::new()
        };
        let mut topo = Topology::new(Mode::Provisioning, &supported, &namespaces);
        // In-flight claims (and their nodes) absorb pods first.
        let inflight = {
            let st = self.state.read();
            if !topo.is_empty() {
                count_cluster(&mut topo, &st, &namespaces);
            }
            pack::inflight_nodes(&st, &types, &offers)
        };
        let budgets = self.offering_budgets(&claims, &types);
        let usage = pack::pool_usage(&claims, &types);
        let mut solver = solve::Solver::new(&offers, budgets, usage, topo, inflight);
        let keys: BTreeSet<(String, String)> = supported.iter().map(PodInfo::key).collect();
        self.planned.retain(|k, _| keys.contains(k));
        solver.planned = std::mem::take(&mut self.planned);
        let outcome = solver.solve(&supported);
        report.absorbed = outcome.absorbed;
        self.planned.extend(outcome.placed.iter().cloned());
        for (pod, why) in &outcome.unplaced {
            let why = if blocked.is_empty() {
                why.clone()
            } else {
                format!("{why}; {}", blocked.join("; "))
            };
            self.tell(pod, "FailedProvisioning", &why).await;
            report.unplaced.push((pod.key(), why));
        }
        for claim in outcome.claims {
            let pool = pools
                .iter()
                .find(|p| p.metadata.name.as_deref() == Some(claim.pool.as_str()));
            let Some(pool) = pool else { continue };
            let created = self.create_claim(pool, &claim).await?;
            for pod in &claim.pods {
                self.planned.insert(pod.clone(), created.clone());
            }
            report.created.push(created);
        }
        if !report.created.is_empty() {
            tracing::info!(
                created = report.created.len(),
                absorbed = report.absorbed,
                pending = report.pending,
                "provisioned"
            );
        }
        Ok((report, reread))
    }

    async fn tell(&mut self, pod: &PodInfo, reason: &str, msg: &str) {
        if !self.told.insert((pod.uid.clone(), reason.to_string())) {
            return;
        }
        self.ctx
            .cluster
            .record_event(EventRecord {
                regarding: ObjectRef {
                    api_version: "v1".into(),
                    kind: "Pod".into(),
                    namespace: Some(pod.namespace.clone()),
                    name: pod.name.clone(),
                    uid: Some(pod.uid.clone()),
                },
                type_: EventType::Warning,
                reason: reason.into(),
                message: msg.into(),
            })
            .await;
    }

    /// For each NodePool (by weight, then name) the instance types of its node class, and
    /// why the pools that cannot launch now cannot (S64; a pool whose class is missing or not
    /// Ready gets no offer, so no NodeClaim is created and deleted again and again).
    fn offers(
        &self,
        pools: &[NodePool],
        classes: &BTreeMap<String, Option<SSHNodeClass>>,
    ) -> (Vec<PoolOffer>, Vec<String>) {
        use crate::provider::availability::{class_blocker, no_host};
        let hosts = self.ctx.hosts.snapshot();
        let daemonsets = {
            let st = self.state.read();
            st.daemonsets.values().cloned().collect::<Vec<_>>()
        };
        let mut offers = vec![];
        let mut blocked = vec![];
        for pool in pools {
            let class_name = &pool.spec.template.spec.node_class_ref.name;
            let pool_name = pool.metadata.name.as_deref().unwrap_or_default();
            // As upstream skips a NodePool that is not Ready: one that fails runtime
            // validation (ValidationSucceeded=False) launches nothing.
            let invalid = super::nodepool_validation::validate(pool);
            if !invalid.is_empty() {
                blocked.push(format!(
                    "NodePool {pool_name} is not valid (ValidationSucceeded=False): {}",
                    invalid.join("; ")
                ));
                continue;
            }
            let class = classes.get(class_name).and_then(Option::as_ref);
            if let Some(why) = class_blocker(pool_name, class_name, class) {
                blocked.push(why);
                continue;
            }
            let Some(class) = class else {
                continue;
            };
            blocked.extend(no_host(pool_name, class, &hosts));
            let types = match instance_types(class, &hosts, self.ctx.config.split_mixed_arch) {
                Ok(t) => t,
                Err(e) => {
                    tracing::warn!(nodepool = ?pool.metadata.name, error = %e, "no instance types");
                    continue;
                }
            };
            offers.push(PoolOffer::new(pool, class, types, &daemonsets));
        }
        offers.sort_by(|a, b| b.weight.cmp(&a.weight).then_with(|| a.pool.cmp(&b.pool)));
        (offers, blocked)
    }

    /// Claimable hosts per instance type and offering, less the claims not yet holding a
    /// host that will take one of them.
    fn offering_budgets(
        &self,
        claims: &BTreeMap<String, std::sync::Arc<NodeClaim>>,
        types: &BTreeMap<String, InstanceType>,
    ) -> solve::Budgets {
        let mut budgets: solve::Budgets = types
            .iter()
            .flat_map(|(n, t)| {
                t.offerings
                    .iter()
                    .enumerate()
                    .map(|(i, o)| ((n.clone(), i), o.claimable as i64))
            })
            .collect();
        for nc in unheld(&self.ctx, claims) {
            let Some(t) = claim_type(nc).and_then(|t| types.get(&t)) else {
                continue;
            };
            let mut labels = nc.metadata.labels.clone().unwrap_or_default();
            labels.extend(t.labels());
            let fitting: Vec<usize> = (0..t.offerings.len())
                .filter(|i| {
                    let mut l = labels.clone();
                    l.extend(t.offerings[*i].labels.clone());
                    crate::api::requirements::all_match(&nc.spec.requirements, &l)
                })
                .collect();
            let free = |i: &usize| budgets.get(&(t.name.clone(), *i)).copied().unwrap_or(0) > 0;
            if let Some(i) = fitting.iter().find(|i| free(i)).or(fitting.first()) {
                *budgets.entry((t.name.clone(), *i)).or_insert(0) -= 1;
            }
        }
        budgets
    }

    /// `kpssh_provisioning_latency_seconds{stage="pod_to_nodeclaim"}`: from the oldest pod
    /// this NodeClaim is for.
    fn observe_latency(&self, name: &str, claim: &NewClaim) {
        let oldest = {
            let st = self.state.read();
            // Looked up by key: a scan of every pod per claim cost pods × claims.
            claim
                .pods
                .iter()
                .filter_map(|key| st.pods.get(key))
                .filter_map(|p| p.metadata.creation_timestamp.as_ref().map(|t| t.0))
                .min()
        };
        if let Some(oldest) = oldest {
            self.ctx
                .metrics
                .nodeclaim_created(name, oldest, self.ctx.clock.now());
        }
    }

    async fn create_claim(
        &mut self,
        pool: &NodePool,
        claim: &NewClaim,
    ) -> Result<String, KarpenterError> {
        let pool_name = pool.metadata.name.clone().unwrap_or_default();
        for _ in 0..5 {
            let nc = build_claim(pool, &claim_name(&self.ctx, &pool_name), claim);
            match self.ctx.cluster.create(&nc).await {
                Ok(created) => {
                    let name = created.metadata.name.clone().unwrap_or_default();
                    self.state.observe_claim(created.clone());
                    self.observe_latency(&name, claim);
                    let msg = format!(
                        "launching NodeClaim {name} ({}) for {} pod(s)",
                        claim.instance_type,
                        claim.pods.len()
                    );
                    crate::k8s::events::record(
                        &self.ctx.cluster,
                        &created,
                        EventType::Normal,
                        "Launching",
                        msg,
                    )
                    .await;
                    self.ctx.metrics.core.created("provisioned", &pool_name);
                    let state = self.state.clone();
                    let uid_of = |k: &(String, String)| {
                        state
                            .read()
                            .pods
                            .get(k)
                            .and_then(|p| p.metadata.uid.clone())
                    };
                    self.nominator
                        .nominate(&self.ctx, &name, &claim.pods, uid_of)
                        .await;
                    return Ok(name);
                }
                Err(crate::k8s::ClusterError::AlreadyExists { .. }) => continue,
                Err(e) => return Err(e.into()),
            }
        }
        Err(KarpenterError::NodePool {
            pool: pool_name,
            message: "could not find a free NodeClaim name".into(),
        })
    }
}

/// The instance type a NodeClaim asks for (a single-value `In` on the instance-type label).
/// `<pool>-<5 random [0-9a-z]>`, from the seeded random source (as Karpenter names claims).
pub fn claim_name<C: Cluster, T: Transport>(ctx: &Context<C, T>, pool: &str) -> String {
    let mut rng = ctx.rng();
    let suffix: String = (0..5)
        .map(|_| {
            let i = rng.random_range(0..36u8);
            char::from(if i < 10 { b'0' + i } else { b'a' + i - 10 })
        })
        .collect();
    format!("{pool}-{suffix}")
}

/// NodeClaims not being deleted that do not hold a host yet (they will take one).
pub fn unheld<'a, C: Cluster, T: Transport>(
    ctx: &'a Context<C, T>,
    claims: &'a BTreeMap<String, std::sync::Arc<NodeClaim>>,
) -> impl Iterator<Item = &'a NodeClaim> + 'a {
    claims
        .values()
        .filter(|nc| nc.metadata.deletion_timestamp.is_none())
        .filter(|nc| {
            nc.metadata
                .uid
                .as_deref()
                .and_then(|u| ctx.hosts.holder(u))
                .is_none()
        })
        .map(|nc| nc.as_ref())
}

/// NodeClaims of each instance type that do not hold a host yet (they will take one).
pub fn unheld_per_type<C: Cluster, T: Transport>(
    ctx: &Context<C, T>,
    claims: &BTreeMap<String, std::sync::Arc<NodeClaim>>,
) -> BTreeMap<String, i64> {
    let mut out: BTreeMap<String, i64> = BTreeMap::new();
    for nc in unheld(ctx, claims) {
        if let Some(t) = claim_type(nc) {
            *out.entry(t).or_insert(0) += 1;
        }
    }
    out
}

/// Namespace labels by name, for `namespaceSelector` (S56).
async fn namespace_labels<C: Cluster>(
    cluster: &C,
) -> Result<super::topology::NamespaceLabels, KarpenterError> {
    let all: Vec<k8s_openapi::api::core::v1::Namespace> = cluster.list(None, None).await?;
    Ok(all
        .into_iter()
        .map(|n| {
            (
                n.metadata.name.unwrap_or_default(),
                n.metadata.labels.unwrap_or_default(),
            )
        })
        .collect())
}

/// Every Node's domains and every bound pod, into the round's topology (core's
/// `countDomains` and inverse anti-affinities).
pub fn count_cluster(
    topo: &mut Topology,
    st: &Inner,
    namespaces: &super::topology::NamespaceLabels,
) {
    let keys = topo.keys();
    static NONE: Vec<Taint> = Vec::new();
    for node in st.nodes.values() {
        let name = node.metadata.name.clone().unwrap_or_default();
        let labels = node.metadata.labels.clone().unwrap_or_default();
        let taints = node
            .spec
            .as_ref()
            .and_then(|s| s.taints.as_ref())
            .unwrap_or(&NONE);
        for key in &keys {
            let value = labels
                .get(key)
                .cloned()
                .or_else(|| (key == super::scheduling::HOSTNAME_KEY).then(|| name.clone()));
            if let Some(v) = value {
                topo.register(key, &v, &super::topology::NodeView::Labels(&labels, taints));
            }
        }
    }
    for p in st.pods.values().filter(|p| super::pods::counts_on_node(p)) {
        let Some(node) = super::pods::node_name(p).and_then(|n| st.nodes.get(n)) else {
            continue;
        };
        let labels = node.metadata.labels.clone().unwrap_or_default();
        let taints = node
            .spec
            .as_ref()
            .and_then(|s| s.taints.as_ref())
            .unwrap_or(&NONE);
        let name = node.metadata.name.clone().unwrap_or_default();
        topo.count_existing(&st.pod_info(p), &name, &labels, taints, namespaces);
    }
}

/// A NodeClaim from a NodePool's template: labels (+ nodepool), annotations, taints, startup
/// taints, requirements (+ the chosen instance type and nodepool), requests, expireAfter,
/// terminationGracePeriod and an owner reference to the NodePool.
pub fn build_claim(pool: &NodePool, name: &str, claim: &NewClaim) -> NodeClaim {
    let t = &pool.spec.template;
    let pool_name = pool.metadata.name.clone().unwrap_or_default();
    let mut labels = pack::template_labels(pool);
    labels.insert(NODEPOOL_LABEL.into(), pool_name.clone());
    let requirements = match &claim.requirements {
        // Narrowed by its pods and their topology (S55, S56), labels resolved from them.
        Some(reqs) => {
            labels.extend(claim.labels.clone());
            reqs.clone()
        }
        None => {
            let mut requirements: Vec<NodeSelectorRequirement> = t
                .spec
                .requirements
                .iter()
                .filter(|r| r.key != INSTANCE_TYPE_LABEL && r.key != NODEPOOL_LABEL)
                .cloned()
                .collect();
            let reqs = Requirements::from_node_selector(&t.spec.requirements);
            labels.extend(pack::resolve_labels(&reqs, &BTreeSet::new(), &labels));
            requirements.push(NodeSelectorRequirement {
                key: NODEPOOL_LABEL.into(),
                operator: "In".into(),
                values: vec![pool_name.clone()],
                min_values: None,
            });
            requirements.push(NodeSelectorRequirement {
                key: INSTANCE_TYPE_LABEL.into(),
                operator: "In".into(),
                values: vec![claim.instance_type.clone()],
                min_values: None,
            });
            requirements
        }
    };
    let requests = claim
        .requests
        .iter()
        .map(|(k, v)| {
            let q = match k.as_str() {
                "cpu" => quantity::format_cpu(*v),
                "memory" | "ephemeral-storage" => quantity::format_bytes(*v),
                _ => ((*v + 999) / 1000).to_string(),
            };
            (k.clone(), Quantity(q))
        })
        .collect();
    NodeClaim {
        metadata: ObjectMeta {
            name: Some(name.into()),
            labels: Some(labels),
            annotations: Some({
                let mut a = t.metadata.annotations().clone();
                super::nodepool_hash::stamp(pool, &mut a);
                a
            }),
            owner_references: Some(vec![OwnerReference {
                api_version: "karpenter.sh/v1".into(),
                kind: "NodePool".into(),
                name: pool_name,
                uid: pool.metadata.uid.clone().unwrap_or_default(),
                block_owner_deletion: Some(true),
                controller: None,
            }]),
            ..Default::default()
        },
        spec: NodeClaimSpec {
            taints: t.spec.taints().to_vec(),
            startup_taints: t.spec.startup_taints().to_vec(),
            requirements,
            resources: ResourceRequests { requests },
            node_class_ref: t.spec.node_class_ref.clone(),
            expire_after: t.spec.expire_after.clone(),
            termination_grace_period: t.spec.termination_grace_period.clone(),
            extra: BTreeMap::new(),
        },
        status: None,
    }
}

/// Pods of `st` bound to `node` that a consolidation would have to move.
pub fn reschedulable_on(st: &Inner, node: &str) -> Vec<Pod> {
    st.pods_on(node)
        .filter(|p| super::pods::is_reschedulable(p))
        .cloned()
        .collect()
}
