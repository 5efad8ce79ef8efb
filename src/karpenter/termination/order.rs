//! Drain order (S45), as core's drain and the kubelet's graceful node shutdown: non-critical
//! pods, then non-critical daemonset pods, then critical pods (`system-cluster-critical`,
//! `system-node-critical`), then critical daemonset pods. Only the first group that still has
//! a pod the drain waits for is worked on: a group starts once every pod of the groups before
//! it is gone (finished, deleted, or stuck terminating), not merely asked to leave.

use jiff::Timestamp;
use k8s_openapi::api::core::v1::Pod;

use crate::karpenter::pods;

/// The four groups, in the order they are drained.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Group {
    NonCritical,
    NonCriticalDaemon,
    Critical,
    CriticalDaemon,
}

pub fn group_of(p: &Pod) -> Group {
    match (pods::is_critical(p), pods::is_daemonset_pod(p)) {
        (false, false) => Group::NonCritical,
        (false, true) => Group::NonCriticalDaemon,
        (true, false) => Group::Critical,
        (true, true) => Group::CriticalDaemon,
    }
}

/// The pods the drain works on now: those of the first group that still has a pod the drain
/// waits for ([`pods::is_waiting_eviction`]). Empty: the node is drained.
pub fn current<'a>(on_node: &[&'a Pod], now: Timestamp) -> Vec<&'a Pod> {
    let waiting: Vec<&Pod> = on_node
        .iter()
        .copied()
        .filter(|p| pods::is_waiting_eviction(p, now))
        .collect();
    let Some(first) = waiting.iter().map(|p| group_of(p)).min() else {
        return Vec::new();
    };
    waiting
        .into_iter()
        .filter(|p| group_of(p) == first)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::karpenter::DO_NOT_DISRUPT_ANNOTATION;
    use k8s_openapi::api::core::v1::{PodSpec, PodStatus, Toleration};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{OwnerReference, Time};

    fn now() -> Timestamp {
        "2026-01-01T01:00:00Z".parse().expect("timestamp")
    }

    fn pod(name: &str, critical: bool, daemon: bool) -> Pod {
        let mut p = Pod {
            metadata: kube::api::ObjectMeta {
                name: Some(name.into()),
                ..Default::default()
            },
            spec: Some(PodSpec {
                priority_class_name: critical.then(|| "system-node-critical".to_string()),
                ..Default::default()
            }),
            status: Some(PodStatus {
                phase: Some("Running".into()),
                ..Default::default()
            }),
        };
        if daemon {
            p.metadata.owner_references = Some(vec![owner("apps/v1", "DaemonSet")]);
        }
        p
    }

    fn owner(api_version: &str, kind: &str) -> OwnerReference {
        OwnerReference {
            api_version: api_version.into(),
            kind: kind.into(),
            name: "o".into(),
            uid: "u".into(),
            controller: Some(true),
            ..Default::default()
        }
    }

    fn names(ps: &[&Pod]) -> Vec<String> {
        ps.iter()
            .map(|p| p.metadata.name.clone().unwrap_or_default())
            .collect()
    }

    #[test]
    fn groups_go_in_core_order_each_after_the_one_before_is_gone() {
        let all = [
            pod("crit-ds", true, true),
            pod("crit", true, false),
            pod("ds", false, true),
            pod("app", false, false),
        ];
        let mut left: Vec<&Pod> = all.iter().collect();
        let mut order = Vec::new();
        while !left.is_empty() {
            let now_on = current(&left, now());
            order.push(names(&now_on));
            left.retain(|p| !now_on.iter().any(|q| q.metadata.name == p.metadata.name));
        }
        assert_eq!(
            order,
            vec![
                vec!["app".to_string()],
                vec!["ds".to_string()],
                vec!["crit".to_string()],
                vec!["crit-ds".to_string()]
            ]
        );
    }

    #[test]
    fn a_terminating_or_do_not_disrupt_pod_holds_the_next_group() {
        let mut app = pod("app", false, false);
        app.metadata.deletion_timestamp = Some(Time(now()));
        let ds = pod("ds", false, true);
        assert_eq!(names(&current(&[&app, &ds], now())), vec!["app"]);
        let mut keep = pod("keep", false, false);
        keep.metadata.annotations =
            Some([(DO_NOT_DISRUPT_ANNOTATION.to_string(), "true".to_string())].into());
        assert_eq!(names(&current(&[&keep, &ds], now())), vec!["keep"]);
    }

    #[test]
    fn tolerating_mirror_finished_and_stuck_pods_are_not_waited_for() {
        let mut tolerant = pod("tolerant", false, false);
        if let Some(s) = tolerant.spec.as_mut() {
            s.tolerations = Some(vec![Toleration {
                key: Some("karpenter.sh/disrupted".into()),
                operator: Some("Exists".into()),
                effect: Some("NoSchedule".into()),
                ..Default::default()
            }]);
        }
        let mut mirror = pod("mirror", false, false);
        mirror.metadata.owner_references = Some(vec![owner("v1", "Node")]);
        let mut done = pod("done", false, false);
        done.status = Some(PodStatus {
            phase: Some("Succeeded".into()),
            ..Default::default()
        });
        let mut stuck = pod("stuck", false, false);
        let two_minutes_ago: Timestamp = "2026-01-01T00:58:00Z".parse().expect("timestamp");
        stuck.metadata.deletion_timestamp = Some(Time(two_minutes_ago));
        let ds = pod("ds", false, true);
        assert_eq!(
            names(&current(&[&tolerant, &mirror, &done, &stuck, &ds], now())),
            vec!["ds"]
        );
        assert!(current(&[&tolerant, &mirror, &done, &stuck], now()).is_empty());
    }
}
