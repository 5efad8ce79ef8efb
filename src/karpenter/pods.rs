//! What the karpenter layer needs to know about a Pod: is it waiting for capacity, what does it
//! request, can it be evicted, does it block disruption.

use std::collections::BTreeMap;

use std::time::Duration;

use k8s_openapi::api::core::v1::{Pod, ResourceRequirements};

use super::quantity;
use crate::api::karpenter::DO_NOT_DISRUPT_ANNOTATION;

pub const MIRROR_ANNOTATION: &str = "kubernetes.io/config.mirror";
/// The priority classes a drain leaves for last (as the kubelet's graceful node shutdown).
pub const CRITICAL_PRIORITY_CLASSES: [&str; 2] =
    ["system-cluster-critical", "system-node-critical"];
/// A pod the API server defaults this grace period for when its spec names none.
pub const DEFAULT_TERMINATION_GRACE: Duration = Duration::from_secs(30);
/// How long a pod may stay terminating past its deletion timestamp before a drain stops
/// waiting for it (core's "stuck terminating": the kubelet is gone or wedged).
pub const STUCK_TERMINATING: Duration = Duration::from_secs(60);

pub fn node_name(p: &Pod) -> Option<&str> {
    p.spec
        .as_ref()?
        .node_name
        .as_deref()
        .filter(|n| !n.is_empty())
}

pub fn phase(p: &Pod) -> &str {
    p.status
        .as_ref()
        .and_then(|s| s.phase.as_deref())
        .unwrap_or("Pending")
}

pub fn is_finished(p: &Pod) -> bool {
    matches!(phase(p), "Succeeded" | "Failed")
}

/// Unbound, not terminating, and marked `PodScheduled=False/Unschedulable` by the scheduler.
pub fn is_provisionable(p: &Pod) -> bool {
    node_name(p).is_none()
        && p.metadata.deletion_timestamp.is_none()
        && !is_finished(p)
        && p.status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .is_some_and(|cs| {
                cs.iter().any(|c| {
                    c.type_ == "PodScheduled"
                        && c.status == "False"
                        && c.reason.as_deref() == Some("Unschedulable")
                })
            })
}

/// A pod that occupies its node's capacity (bound, not finished).
/// When the pod's `PodScheduled` condition turned True (its binding): what core's podevents
/// controller takes as a bound pod's event time.
pub fn scheduled_at(p: &Pod) -> Option<jiff::Timestamp> {
    p.status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == "PodScheduled" && c.status == "True")?
        .last_transition_time
        .as_ref()
        .map(|t| t.0)
}

pub fn counts_on_node(p: &Pod) -> bool {
    node_name(p).is_some() && !is_finished(p)
}

pub fn owner_kind(p: &Pod) -> Option<&str> {
    p.metadata
        .owner_references
        .as_ref()?
        .iter()
        .find(|o| o.controller == Some(true))
        .map(|o| o.kind.as_str())
}

pub fn is_daemonset_pod(p: &Pod) -> bool {
    owner_kind(p) == Some("DaemonSet")
}

/// A static pod's mirror: annotated by the kubelet, owned by its Node. The API cannot delete
/// the pod itself (the kubelet runs it from a file), so a drain leaves it.
pub fn is_mirror(p: &Pod) -> bool {
    let annotated =
        (p.metadata.annotations.as_ref()).is_some_and(|a| a.contains_key(MIRROR_ANNOTATION));
    let node_owned = (p.metadata.owner_references.iter().flatten())
        .any(|o| o.kind == "Node" && o.api_version == "v1");
    annotated || node_owned
}

pub fn is_terminating(p: &Pod) -> bool {
    p.metadata.deletion_timestamp.is_some()
}

/// `system-cluster-critical` or `system-node-critical`.
pub fn is_critical(p: &Pod) -> bool {
    let class = p
        .spec
        .as_ref()
        .and_then(|s| s.priority_class_name.as_deref());
    class.is_some_and(|c| CRITICAL_PRIORITY_CLASSES.contains(&c))
}

/// Whether the pod tolerates `karpenter.sh/disrupted:NoSchedule`: it may stay on a draining
/// node, so the drain neither evicts it nor waits for it (as core).
pub fn tolerates_disrupted_taint(p: &Pod) -> bool {
    let taint = super::termination::disrupted_taint();
    (p.spec.as_ref().and_then(|s| s.tolerations.as_ref()))
        .is_some_and(|ts| ts.iter().any(|t| super::scheduling::tolerates(t, &taint)))
}

/// The pod's own terminationGracePeriodSeconds (the API server's default when unset).
pub fn termination_grace(p: &Pod) -> Duration {
    (p.spec
        .as_ref()
        .and_then(|s| s.termination_grace_period_seconds))
    .map_or(DEFAULT_TERMINATION_GRACE, |s| {
        Duration::from_secs(u64::try_from(s).unwrap_or(0))
    })
}

/// Terminating for longer than [`STUCK_TERMINATING`] past its deletion timestamp (which the
/// API server sets to the deletion time plus the grace period).
pub fn is_stuck_terminating(p: &Pod, now: jiff::Timestamp) -> bool {
    (p.metadata.deletion_timestamp.as_ref()).is_some_and(|t| {
        Duration::try_from(now.duration_since(t.0)).is_ok_and(|d| d > STUCK_TERMINATING)
    })
}

/// A pod the drain of its node waits for (core's `IsWaitingEviction`): not finished, not
/// tolerating the disrupted taint, not a mirror pod, not stuck terminating. Daemonset pods
/// and do-not-disrupt pods are included: the drain waits for them too.
pub fn is_waiting_eviction(p: &Pod, now: jiff::Timestamp) -> bool {
    !is_finished(p)
        && !tolerates_disrupted_taint(p)
        && !is_mirror(p)
        && !is_stuck_terminating(p, now)
}

/// A pod the drain asks the Eviction API for (core's `IsEvictable`): waiting eviction, not
/// terminating already, not annotated do-not-disrupt.
pub fn is_evictable(p: &Pod, now: jiff::Timestamp) -> bool {
    is_waiting_eviction(p, now) && !is_terminating(p) && !do_not_disrupt(p)
}

/// Pods that a drain evicts and that a consolidation has to place elsewhere.
pub fn is_reschedulable(p: &Pod) -> bool {
    counts_on_node(p) && !is_daemonset_pod(p) && !is_mirror(p)
}

pub fn do_not_disrupt(p: &Pod) -> bool {
    p.metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(DO_NOT_DISRUPT_ANNOTATION))
        .is_some_and(|v| v == "true")
}

fn add(into: &mut BTreeMap<String, i128>, from: &BTreeMap<String, i128>) {
    for (k, v) in from {
        *into.entry(k.clone()).or_insert(0) += v;
    }
}

fn max_into(into: &mut BTreeMap<String, i128>, from: &BTreeMap<String, i128>) {
    for (k, v) in from {
        let e = into.entry(k.clone()).or_insert(0);
        *e = (*e).max(*v);
    }
}

fn container_requests(r: Option<&ResourceRequirements>) -> BTreeMap<String, i128> {
    let Some(r) = r else {
        return BTreeMap::new();
    };
    // A limit without a request defaults the request (as the API server does).
    let mut out: BTreeMap<String, i128> = r
        .limits
        .iter()
        .flatten()
        .filter_map(|(k, v)| quantity::parse(v).map(|q| (k.clone(), q)))
        .collect();
    for (k, v) in r.requests.iter().flatten() {
        if let Some(q) = quantity::parse(v) {
            out.insert(k.clone(), q);
        }
    }
    out
}

/// Effective requests in milli-units: max(sum of containers + restartable init containers,
/// each regular init container + the restartable ones started before it) + overhead, plus one
/// `pods`.
pub fn requests(p: &Pod) -> BTreeMap<String, i128> {
    let mut total = BTreeMap::new();
    let Some(spec) = p.spec.as_ref() else {
        return total;
    };
    for c in &spec.containers {
        add(&mut total, &container_requests(c.resources.as_ref()));
    }
    let mut sidecars = BTreeMap::new();
    let mut init_peak = BTreeMap::new();
    for c in spec.init_containers.iter().flatten() {
        let r = container_requests(c.resources.as_ref());
        if c.restart_policy.as_deref() == Some("Always") {
            add(&mut sidecars, &r);
        } else {
            let mut at = sidecars.clone();
            add(&mut at, &r);
            max_into(&mut init_peak, &at);
        }
    }
    add(&mut total, &sidecars);
    max_into(&mut total, &init_peak);
    for (k, v) in spec.overhead.iter().flatten() {
        if let Some(q) = quantity::parse(v) {
            *total.entry(k.clone()).or_insert(0) += q;
        }
    }
    *total.entry("pods".into()).or_insert(0) += 1000;
    total
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{Container, PodSpec};
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

    fn c(cpu: &str, sidecar: bool) -> Container {
        Container {
            name: "c".into(),
            resources: Some(ResourceRequirements {
                requests: Some(BTreeMap::from([("cpu".into(), Quantity(cpu.into()))])),
                ..Default::default()
            }),
            restart_policy: sidecar.then(|| "Always".to_string()),
            ..Default::default()
        }
    }

    #[test]
    fn init_container_max_rule_sidecars_and_overhead() {
        let p = Pod {
            spec: Some(PodSpec {
                containers: vec![c("500m", false), c("500m", false)],
                init_containers: Some(vec![c("100m", true), c("2", false)]),
                overhead: Some(BTreeMap::from([("cpu".into(), Quantity("250m".into()))])),
                ..Default::default()
            }),
            ..Default::default()
        };
        let r = requests(&p);
        // max(1000 + 100, 100 + 2000) + 250
        assert_eq!(r["cpu"], 2350);
        assert_eq!(r["pods"], 1000);
    }
}
