//! A small simulated kube-scheduler and kubelet for the simulation and tests: binds pending
//! pods to Ready nodes they fit (resources, selectors, required node affinity, taints), marks
//! the rest `PodScheduled=False/Unschedulable`, and marks bound pods Running. Pods annotated
//! [`RECREATE_ANNOTATION`] play a ReplicaSet's pods: evicted, they come back pending under a
//! new name.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::{Pod, PodCondition, PodStatus};
use serde_json::json;
use tokio::task::JoinHandle;

use crate::api::quantity;
use crate::api::requirements::{Requirement, Requirements};
use crate::k8s::{Cluster, WatchEvent};
use crate::karpenter::lifecycle::node_ready;
use crate::karpenter::pods;
use crate::karpenter::scheduling::{HOSTNAME_KEY, PodInfo, SimNode, shapes};
use crate::karpenter::state::ClusterState;
use crate::karpenter::topology::{self, Mode, Topology};

pub const RECREATE_ANNOTATION: &str = "sim.kpssh.dev/recreate";

/// Start the scheduler loop (every `period`) and the "ReplicaSet" that recreates evicted pods.
pub fn spawn<C: Cluster>(cluster: C, state: ClusterState, period: Duration) -> Vec<JoinHandle<()>> {
    let c2 = cluster.clone();
    let recreate = tokio::spawn(async move {
        let mut stream = c2.watch::<Pod>(None);
        let mut seq = 0u64;
        while let Some(ev) = stream.next().await {
            let Ok(WatchEvent::Deleted(p)) = ev else {
                continue;
            };
            let wants = p
                .metadata
                .annotations
                .as_ref()
                .is_some_and(|a| a.contains_key(RECREATE_ANNOTATION));
            if !wants {
                continue;
            }
            seq += 1;
            let base = p.metadata.name.clone().unwrap_or_default();
            let base = base.split("-r").next().unwrap_or_default().to_string();
            let mut fresh = Pod {
                metadata: kube::api::ObjectMeta {
                    name: Some(format!("{base}-r{seq}")),
                    namespace: p.metadata.namespace.clone(),
                    labels: p.metadata.labels.clone(),
                    annotations: p.metadata.annotations.clone(),
                    owner_references: p.metadata.owner_references.clone(),
                    ..Default::default()
                },
                spec: p.spec.clone(),
                status: None,
            };
            if let Some(s) = fresh.spec.as_mut() {
                s.node_name = None;
            }
            if let Err(e) = c2.create(&fresh).await {
                tracing::warn!(error = %e, "sim replicaset could not recreate a pod");
            }
        }
    });
    let sched = tokio::spawn(async move {
        // The state's change count after a pass that wrote nothing: until the state moves,
        // another pass would decide the same (nothing) and is skipped. A pass is a function
        // of this state alone unless it read the namespaces, which the state does not hold.
        let mut idle_at: Option<u64> = None;
        loop {
            tokio::time::sleep(period).await;
            let at = state.read().changes;
            if idle_at == Some(at) {
                continue;
            }
            idle_at = None;
            match pass(&cluster, &state).await {
                Ok(p) if p.writes == 0 && !p.read_namespaces => idle_at = Some(at),
                Ok(_) => {}
                Err(e) => tracing::debug!(error = %e, "sim scheduler round failed"),
            }
        }
    });
    vec![recreate, sched]
}

fn unschedulable_status(msg: &str) -> PodStatus {
    PodStatus {
        phase: Some("Pending".into()),
        conditions: Some(vec![PodCondition {
            type_: "PodScheduled".into(),
            status: "False".into(),
            reason: Some("Unschedulable".into()),
            message: Some(msg.into()),
            ..Default::default()
        }]),
        ..Default::default()
    }
}

/// One scheduling pass. Returns how many pods were bound.
pub async fn schedule_once<C: Cluster>(
    cluster: &C,
    state: &ClusterState,
) -> Result<usize, crate::k8s::ClusterError> {
    Ok(pass(cluster, state).await?.bound)
}

/// What a pass did.
struct Pass {
    bound: usize,
    /// API writes tried (binds and status writes, failed or not).
    writes: usize,
    /// Whether it listed the namespaces (topology terms with namespace selectors).
    read_namespaces: bool,
}

async fn pass<C: Cluster>(
    cluster: &C,
    state: &ClusterState,
) -> Result<Pass, crate::k8s::ClusterError> {
    let mut writes = 0;
    let (mut nodes, pending, to_run) = {
        let st = state.read();
        let mut nodes: Vec<SimNode> = vec![];
        for node in st.nodes.values() {
            if node.metadata.deletion_timestamp.is_some()
                || node_ready(node).is_none_or(|c| c.status != "True")
                || node.spec.as_ref().and_then(|s| s.unschedulable) == Some(true)
            {
                continue;
            }
            let name = node.metadata.name.clone().unwrap_or_default();
            let parse =
                |m: &BTreeMap<String, k8s_openapi::apimachinery::pkg::api::resource::Quantity>| {
                    m.iter()
                        .filter_map(|(k, v)| quantity::parse(v).map(|q| (k.clone(), q)))
                        .collect::<BTreeMap<_, _>>()
                };
            let mut alloc = node
                .status
                .as_ref()
                .and_then(|s| s.allocatable.as_ref())
                .map(parse)
                .unwrap_or_default();
            if alloc.is_empty() {
                alloc = st
                    .claim_of_node(node)
                    .and_then(|c| c.status.as_ref())
                    .map(|s| parse(&s.allocatable))
                    .unwrap_or_default();
            }
            if alloc.is_empty() {
                continue;
            }
            alloc.entry("pods".into()).or_insert(110_000);
            let mut sim = SimNode {
                name: name.clone(),
                labels: node.metadata.labels.clone().unwrap_or_default(),
                taints: node
                    .spec
                    .as_ref()
                    .and_then(|s| s.taints.clone())
                    .unwrap_or_default(),
                allocatable: alloc,
                ..Default::default()
            };
            for p in st.pods_on(&name).filter(|p| pods::counts_on_node(p)) {
                sim.add(&st.pod_info(p));
            }
            nodes.push(sim);
        }
        let pending: Vec<(Pod, PodInfo)> = st
            .pods
            .values()
            .filter(|p| pods::node_name(p).is_none() && p.metadata.deletion_timestamp.is_none())
            .map(|p| (p.clone(), PodInfo::clone(&st.pod_info(p))))
            .collect();
        let to_run: Vec<Pod> = st
            .pods
            .values()
            .filter(|p| pods::node_name(p).is_some() && pods::phase(p) == "Pending")
            .cloned()
            .collect();
        (nodes, pending, to_run)
    };
    let (pending, infos): (Vec<Pod>, Vec<PodInfo>) = pending.into_iter().unzip();
    // S56: spread and pod (anti-)affinity on any key, over the Ready nodes, as the
    // kube-scheduler's PodTopologySpread and InterPodAffinity filters.
    let read_namespaces = topology::needs_namespaces(infos.iter());
    let namespaces = if read_namespaces {
        let all: Vec<k8s_openapi::api::core::v1::Namespace> = cluster.list(None, None).await?;
        all.into_iter()
            .map(|n| {
                (
                    n.metadata.name.unwrap_or_default(),
                    n.metadata.labels.unwrap_or_default(),
                )
            })
            .collect()
    } else {
        BTreeMap::new()
    };
    let mut topo = Topology::new(Mode::Kube, &infos, &namespaces);
    let mut node_reqs: Vec<Requirements> = vec![];
    if !topo.is_empty() {
        let st = state.read();
        crate::karpenter::provisioning::count_cluster(&mut topo, &st, &namespaces);
        node_reqs = nodes
            .iter()
            .map(|n| {
                let mut r = Requirements::from_labels(&n.labels);
                if !n.labels.contains_key(HOSTNAME_KEY) {
                    r.add(Requirement::one_of(HOSTNAME_KEY, [n.name.clone()]));
                }
                r
            })
            .collect();
    }
    let mut bound = 0;
    let mut seen = BTreeSet::new();
    // Per shape, the first node that may still take it: a node that refused a shape on its
    // own (resources, labels, taints, its pods) refuses it for the rest of the pass.
    let shape = shapes(&infos);
    let mut first = vec![0usize; shape.iter().max().map_or(0, |m| m + 1)];
    for (i, (p, info)) in pending.into_iter().zip(&infos).enumerate() {
        let ns = info.namespace.clone();
        let name = info.name.clone();
        seen.insert((ns.clone(), name.clone()));
        let pod_reqs = Requirements::from_labels(&info.node_selector);
        let mut chosen = None;
        let mut prefix = true;
        for (ni, n) in nodes.iter().enumerate().skip(first[shape[i]]) {
            if info.invalid.is_some() || !n.fits(info) {
                if prefix {
                    first[shape[i]] = ni + 1;
                }
                continue;
            }
            prefix = false;
            if topo.is_empty() {
                chosen = Some((ni, None));
                break;
            }
            let reqs = &node_reqs[ni];
            if topo.quick_reject(i, info, reqs).is_some() {
                continue;
            }
            match topo.add_requirements(i, info, &pod_reqs, reqs, &n.taints) {
                Ok(t)
                    if t.iter().all(|r| match n.labels.get(&r.key) {
                        Some(v) => r.has(v),
                        None => r.key == HOSTNAME_KEY || r.allows_absent(),
                    }) =>
                {
                    chosen = Some((ni, Some(t)));
                    break;
                }
                _ => {}
            }
        }
        match chosen {
            Some((ni, t)) => {
                if let Some(t) = t {
                    topo.record(i, info, &t, &nodes[ni].taints);
                }
                let n = &mut nodes[ni];
                n.add(info);
                let patch = json!({"spec": {"nodeName": n.name}});
                writes += 1;
                cluster.patch::<Pod>(Some(&ns), &name, &patch).await?;
                bound += 1;
            }
            None => {
                if !pods::is_provisionable(&p) {
                    let mut p2 = p.clone();
                    p2.status = Some(unschedulable_status("0 nodes are available"));
                    writes += 1;
                    match cluster.replace_status(&p2).await {
                        Ok(_) => {}
                        Err(e) if e.is_conflict() || e.is_not_found() => {}
                        Err(e) => return Err(e),
                    }
                }
            }
        }
    }
    for p in to_run {
        let mut p2 = p.clone();
        p2.status = Some(PodStatus {
            phase: Some("Running".into()),
            conditions: Some(vec![PodCondition {
                type_: "PodScheduled".into(),
                status: "True".into(),
                last_transition_time: Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                    state.now(),
                )),
                ..Default::default()
            }]),
            ..Default::default()
        });
        writes += 1;
        match cluster.replace_status(&p2).await {
            Ok(_) => {}
            Err(e) if e.is_conflict() || e.is_not_found() => {}
            Err(e) => return Err(e),
        }
    }
    Ok(Pass {
        bound,
        writes,
        read_namespaces,
    })
}
