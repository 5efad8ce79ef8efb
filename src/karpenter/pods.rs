//! What the karpenter layer needs to know about a Pod: is it waiting for capacity, what does it
//! request, can it be evicted, does it block disruption.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Pod, ResourceRequirements};

use super::quantity;
use crate::api::karpenter::DO_NOT_DISRUPT_ANNOTATION;

pub const MIRROR_ANNOTATION: &str = "kubernetes.io/config.mirror";

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

pub fn is_mirror(p: &Pod) -> bool {
    p.metadata
        .annotations
        .as_ref()
        .is_some_and(|a| a.contains_key(MIRROR_ANNOTATION))
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
