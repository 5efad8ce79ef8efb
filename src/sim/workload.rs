//! Pod demand (`demand[].pool`): the simulated workload whose pending pods Karpenter's
//! provisioning turns into NodeClaims, the kube-scheduler that binds them to Ready nodes, and
//! the `nodepool-limits` invariant over the NodeClaims that result.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::policy::v1::{PodDisruptionBudget, PodDisruptionBudgetSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use kube::core::Selector;
use rand::Rng;
use rand_chacha::ChaCha8Rng;
use serde_json::json;
use tokio::task::JoinHandle;

use super::scenario::{Scenario, SimPdb};
use super::world::{POD_GROUP_LABEL, POD_NAMESPACE, workload_pod};
use crate::api::NodeClaim;
use crate::api::karpenter::{DO_NOT_DISRUPT_ANNOTATION, NODEPOOL_LABEL};
use crate::api::quantity;
use crate::clock::Clock;
use crate::k8s::{Cluster, MemoryCluster};
use crate::karpenter::state::ClusterState;
use crate::sim::run::safety::OwnDeletions;
use crate::sim::scheduler as sim_scheduler;
use crate::sim::scheduler::RECREATE_ANNOTATION;

/// How often the simulated kube-scheduler binds pending pods.
const SCHEDULER_PERIOD: Duration = Duration::from_secs(5);

/// The running workload: its scheduler's tasks (stopped when dropped) and pod numbering.
pub struct Workload {
    tasks: Vec<JoinHandle<()>>,
    seq: u64,
    /// Pods the simulation itself deletes (scale-down, pod GC): not the controller's doing.
    pub deleting: OwnDeletions,
}

impl Drop for Workload {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}

impl Workload {
    /// Start the scheduler. It keeps its own view of the cluster, as kube-scheduler does: a
    /// controller crash in the simulation must not stop pods from being bound.
    pub async fn start(cluster: &MemoryCluster, clock: Clock, deleting: OwnDeletions) -> Workload {
        let state = ClusterState::new(clock);
        let mut tasks = state.start(cluster);
        while !state.read().synced() {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        tasks.extend(sim_scheduler::spawn(
            cluster.clone(),
            state,
            SCHEDULER_PERIOD,
        ));
        Workload {
            tasks,
            seq: 0,
            deleting,
        }
    }

    /// Create or delete pods of one demand entry (`group`, for `pool`) until it has `want`;
    /// returns trace lines. A pod is deleted as a scale-down would: its "ReplicaSet" mark goes
    /// first, so that it is not recreated; a random one of them, drawn from `rng`. A share
    /// `do_not_disrupt` of new pods (drawn from `rng` when there is one) carries
    /// `karpenter.sh/do-not-disrupt`.
    pub async fn follow(
        &mut self,
        cluster: &MemoryCluster,
        rng: &mut ChaCha8Rng,
        (pool, group): (&str, &str),
        want: u32,
        (requests, do_not_disrupt): ((&str, &str), f64),
    ) -> Vec<String> {
        let selector = Selector::from_iter([(POD_GROUP_LABEL.to_string(), group.to_string())]);
        let Ok(pods) = cluster
            .list::<Pod>(Some(POD_NAMESPACE), Some(&selector))
            .await
        else {
            return vec![];
        };
        let mut names: Vec<String> = pods
            .into_iter()
            .filter(|p| p.metadata.deletion_timestamp.is_none())
            .filter_map(|p| p.metadata.name)
            .collect();
        let have = names.len() as u32;
        let mut lines = vec![];
        for _ in have..want {
            self.seq += 1;
            let name = format!("pod-{:06}", self.seq);
            let mut pod = workload_pod(&name, (pool, group), requests.0, requests.1);
            if do_not_disrupt > 0.0 && rng.random_bool(do_not_disrupt.min(1.0)) {
                pod.metadata
                    .annotations
                    .get_or_insert_with(Default::default)
                    .insert(DO_NOT_DISRUPT_ANNOTATION.into(), "true".into());
            }
            if cluster.create(&pod).await.is_ok() {
                lines.push(format!("demand pool {pool} create pod {name}"));
            }
        }
        for _ in want..have {
            if names.is_empty() {
                break;
            }
            let name = names.swap_remove(rng.random_range(0..names.len()));
            self.deleting.note(&name);
            let unmark = json!({"metadata": {"annotations": {RECREATE_ANNOTATION: null}}});
            let _ = cluster
                .patch::<Pod>(Some(POD_NAMESPACE), &name, &unmark)
                .await;
            if cluster
                .delete::<Pod>(Some(POD_NAMESPACE), &name, None)
                .await
                .is_ok()
            {
                lines.push(format!("demand pool {pool} delete pod {name}"));
            }
        }
        lines
    }
}

/// The PodDisruptionBudget over the pods of demand entry `index`.
pub fn pdb(index: usize, spec: &SimPdb) -> PodDisruptionBudget {
    PodDisruptionBudget {
        metadata: kube::api::ObjectMeta {
            name: Some(format!("pdb-{}", group(index))),
            namespace: Some(POD_NAMESPACE.into()),
            ..Default::default()
        },
        spec: Some(PodDisruptionBudgetSpec {
            max_unavailable: spec.max_unavailable.as_ref().map(|x| x.to_k8s()),
            min_available: spec.min_available.as_ref().map(|x| x.to_k8s()),
            selector: Some(LabelSelector {
                match_labels: Some(BTreeMap::from([(
                    POD_GROUP_LABEL.to_string(),
                    group(index),
                )])),
                ..Default::default()
            }),
            ..Default::default()
        }),
        status: None,
    }
}

/// The `sim.kpssh.dev/group` label value of demand entry `index`.
pub fn group(index: usize) -> String {
    format!("d{index}")
}

/// Each class's capacity as declared (`cpu`, `memoryGib`): what its largest host can hold
/// when no MemTotal falls short.
pub fn declared_capacity(sc: &Scenario) -> BTreeMap<String, BTreeMap<String, i128>> {
    (sc.classes.iter())
        .map(|c| {
            let memory = quantity::parse_str(&format!("{}Gi", c.memory_gib)).unwrap_or(0);
            let cap = BTreeMap::from([
                ("cpu".to_string(), i128::from(c.cpu) * 1000),
                ("memory".to_string(), memory),
            ]);
            (c.name.clone(), cap)
        })
        .collect()
}

/// `nodepool-limits`: each NodePool's NodeClaims (those being deleted too: their hosts are
/// still taken) within its `limits`. A claim counts its recorded capacity, or before launch
/// the most any host of its class could give it (`largest`, per class, in milli-units), and
/// one `nodes`. Returns (pool, message) per pool over a limit.
pub fn limit_breaches(
    sc: &Scenario,
    largest: &BTreeMap<String, BTreeMap<String, i128>>,
    claims: &BTreeMap<String, Arc<NodeClaim>>,
) -> Vec<(String, String)> {
    let mut out = vec![];
    let none = BTreeMap::new();
    for pool in sc.node_pools.iter().filter(|p| !p.limits.is_empty()) {
        let declared = largest.get(&pool.class).unwrap_or(&none);
        let mut used: BTreeMap<String, i128> = BTreeMap::new();
        let mut count = 0;
        for nc in claims
            .values()
            .filter(|c| c.nodepool() == Some(pool.name.as_str()))
        {
            count += 1;
            let recorded: BTreeMap<String, i128> = nc
                .status
                .iter()
                .flat_map(|s| s.capacity.iter())
                .filter_map(|(k, v)| quantity::parse(v).map(|q| (k.clone(), q)))
                .collect();
            let cap = if recorded.is_empty() {
                declared
            } else {
                &recorded
            };
            for (k, v) in cap {
                *used.entry(k.clone()).or_insert(0) += v;
            }
            *used.entry("nodes".into()).or_insert(0) += 1000;
        }
        for (k, limit) in &pool.limits {
            let (Some(l), Some(u)) = (quantity::parse_str(limit), used.get(k)) else {
                continue;
            };
            if *u > l {
                let used = match k.as_str() {
                    "memory" => format!("{}Mi", u / 1000 / (1 << 20)),
                    "cpu" => quantity::format_cpu(*u),
                    _ => format!("{}", u / 1000),
                };
                out.push((
                    pool.name.clone(),
                    format!(
                        "NodePool {} holds {count} NodeClaims using {k} {used}, above its limit {limit}",
                        pool.name
                    ),
                ));
            }
        }
    }
    out
}

/// Whether a NodeClaim was made by Karpenter's provisioning for one of the scenario's pools
/// (the simulator's own NodeClaims carry no NodePool).
pub fn from_pool(nc: &NodeClaim) -> bool {
    nc.metadata
        .labels
        .as_ref()
        .is_some_and(|l| l.contains_key(NODEPOOL_LABEL))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::karpenter::NodeClaimSpec;

    fn claim(name: &str, pool: &str, cpu: Option<&str>) -> (String, Arc<NodeClaim>) {
        let mut nc = NodeClaim::new(name, NodeClaimSpec::default());
        nc.metadata.labels = Some(BTreeMap::from([(NODEPOOL_LABEL.into(), pool.into())]));
        if let Some(cpu) = cpu {
            let mut status = crate::api::karpenter::NodeClaimStatus::default();
            status.capacity.insert(
                "cpu".into(),
                k8s_openapi::apimachinery::pkg::api::resource::Quantity(cpu.into()),
            );
            nc.status = Some(status);
        }
        (name.to_string(), Arc::new(nc))
    }

    /// The invariant counts launched claims by their recorded capacity and the others by the
    /// class's, claims of other pools not at all, and reports a pool only above its limit.
    #[test]
    fn limit_breaches_counts_each_claim_of_the_pool_once() {
        let sc = Scenario::from_yaml(
            "duration: 1h\nclasses: [{name: small, count: 6, cpu: 2}]\n\
             nodePools: [{name: capped, class: small, limits: {cpu: \"8\", nodes: \"4\"}}]\n",
        )
        .expect("scenario");
        let mut claims: BTreeMap<String, Arc<NodeClaim>> = [
            claim("a", "capped", Some("2")),
            claim("b", "capped", None),
            claim("c", "capped", Some("2")),
            claim("d", "capped", None),
            claim("other", "elsewhere", Some("64")),
        ]
        .into_iter()
        .collect();
        assert!(
            limit_breaches(&sc, &declared_capacity(&sc), &claims).is_empty(),
            "four 2-cpu nodes fit cpu 8"
        );
        let (n, c) = claim("e", "capped", None);
        claims.insert(n, c);
        let breaches = limit_breaches(&sc, &declared_capacity(&sc), &claims);
        assert_eq!(breaches.len(), 2, "cpu and nodes: {breaches:?}");
        assert!(breaches.iter().all(|(pool, _)| pool == "capped"));
        assert!(breaches[0].1.contains("5 NodeClaims"), "{breaches:?}");
    }
}
