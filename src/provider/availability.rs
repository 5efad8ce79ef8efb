//! Why a NodePool cannot launch a node now (S64), in words a pod's events can carry: its node
//! class is missing, its node class is not Ready (and why), or none of its hosts is free —
//! and then whether there are none at all, or they are taken, unhealthy, backing off after
//! failed launches, in maintenance or not probed yet. Provisioning calls these; they read
//! only the class and the host view.

use std::borrow::Borrow;

use crate::api::nodeclass::reason;
use crate::api::{HostState, SSHHost, SSHNodeClass};

use super::instance_types::{ClassSelector, claimable};

/// Ready reasons that stop launches for the class (NoHosts is said by the host count).
const BLOCKING: [&str; 5] = [
    reason::PROFILE_NOT_FOUND,
    reason::PROFILE_INVALID,
    reason::SELECTOR_ERROR,
    reason::NO_CLUSTER_ENDPOINT,
    reason::LAUNCHES_FAILING,
];

/// Why `pool` must not launch onto `class` now: the class is missing, or Ready=False for a
/// reason that would make every launch fail. `None`: it may launch.
pub fn class_blocker(pool: &str, class_name: &str, class: Option<&SSHNodeClass>) -> Option<String> {
    let Some(class) = class else {
        return Some(format!(
            "NodePool {pool}: SSHNodeClass {class_name} (spec.template.spec.nodeClassRef) not found"
        ));
    };
    let ready = class
        .status
        .as_ref()?
        .conditions
        .iter()
        .find(|c| c.type_ == "Ready")?;
    (ready.status == "False" && BLOCKING.contains(&ready.reason.as_str())).then(|| {
        format!(
            "NodePool {pool}: SSHNodeClass {class_name} is not Ready ({}): {}",
            ready.reason, ready.message
        )
    })
}

/// Why `pool`'s class has no host to claim, or `None` when it has one.
pub fn no_host<H: Borrow<SSHHost>>(
    pool: &str,
    class: &SSHNodeClass,
    hosts: &[H],
) -> Option<String> {
    let class_name = class.metadata.name.as_deref().unwrap_or_default();
    let Ok(selector) = ClassSelector::of(class) else {
        return None;
    };
    let mut counts = Counts::default();
    for h in hosts
        .iter()
        .map(Borrow::borrow)
        .filter(|h| selector.matches(h))
    {
        if claimable(h) {
            return None;
        }
        counts.add(h);
    }
    if counts.total == 0 {
        return Some(format!(
            "NodePool {pool}: no SSHHost matches SSHNodeClass {class_name}'s hostSelector"
        ));
    }
    Some(format!(
        "NodePool {pool}: none of the {} hosts of SSHNodeClass {class_name} is free ({})",
        counts.total,
        counts.describe()
    ))
}

#[derive(Default)]
struct Counts {
    total: usize,
    taken: usize,
    unhealthy: usize,
    backing_off: usize,
    maintenance: usize,
    unprobed: usize,
    leaving: usize,
}

impl Counts {
    fn add(&mut self, h: &SSHHost) {
        self.total += 1;
        if h.in_maintenance() || h.state() == HostState::Maintenance {
            self.maintenance += 1;
            return;
        }
        match h.state() {
            HostState::Claimed | HostState::InUse => self.taken += 1,
            HostState::Unhealthy => self.unhealthy += 1,
            HostState::Pending => self.unprobed += 1,
            HostState::Leaving => self.leaving += 1,
            HostState::Available if h.backing_off() => self.backing_off += 1,
            HostState::Available => self.taken += 1,
            HostState::Maintenance => self.maintenance += 1,
        }
    }

    fn describe(&self) -> String {
        let parts = [
            (self.taken, "in use or claimed"),
            (self.unhealthy, "Unhealthy"),
            (self.backing_off, "backing off after failed launches"),
            (self.maintenance, "in maintenance"),
            (self.unprobed, "not probed yet"),
            (self.leaving, "leaving"),
        ];
        parts
            .iter()
            .filter(|(n, _)| *n > 0)
            .map(|(n, what)| format!("{n} {what}"))
            .collect::<Vec<_>>()
            .join(", ")
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};

    use super::*;
    use crate::api::{LaunchBackoff, SSHHostStatus, SSHNodeClassStatus};
    use crate::sim::SimHost;
    use crate::sim::world::{host_object, node_class};

    fn host(name: &str, state: HostState, backoff: bool) -> SSHHost {
        let mut h = host_object("pool", name, "small", &SimHost::new("10.0.0.1", 2, 1));
        h.status = Some(SSHHostStatus {
            state,
            launch_backoff: backoff.then_some(LaunchBackoff {
                failures: 2,
                until: Some(Time(jiff::Timestamp::UNIX_EPOCH)),
                secret_version: None,
            }),
            ..Default::default()
        });
        h
    }

    #[test]
    fn s64_no_host_tells_none_from_taken_unhealthy_and_backing_off() {
        let class = node_class("pool", "p");
        let none: Vec<SSHHost> = vec![];
        assert_eq!(
            no_host("np", &class, &none).as_deref(),
            Some("NodePool np: no SSHHost matches SSHNodeClass pool's hostSelector")
        );
        let hosts = vec![
            host("a", HostState::InUse, false),
            host("b", HostState::Unhealthy, true),
            host("c", HostState::Available, true),
            host("d", HostState::Available, true),
        ];
        let why = no_host("np", &class, &hosts).expect("nothing free");
        assert_eq!(
            why,
            "NodePool np: none of the 4 hosts of SSHNodeClass pool is free (1 in use or claimed, 1 Unhealthy, 2 backing off after failed launches)"
        );
        let mut free = hosts.clone();
        free.push(host("e", HostState::Available, false));
        assert!(no_host("np", &class, &free).is_none());
    }

    #[test]
    fn s64_class_blocker_names_the_pool_and_the_reason() {
        assert_eq!(
            class_blocker("np", "gone", None).as_deref(),
            Some("NodePool np: SSHNodeClass gone (spec.template.spec.nodeClassRef) not found")
        );
        let mut class = node_class("pool", "p");
        assert!(
            class_blocker("np", "pool", Some(&class)).is_none(),
            "no status yet"
        );
        let cond = |reason: &str| Condition {
            type_: "Ready".into(),
            status: "False".into(),
            reason: reason.into(),
            message: "why".into(),
            observed_generation: None,
            last_transition_time: Time(jiff::Timestamp::UNIX_EPOCH),
        };
        class.status = Some(SSHNodeClassStatus {
            conditions: vec![cond("NoClusterEndpoint")],
            observed_generation: None,
        });
        assert_eq!(
            class_blocker("np", "pool", Some(&class)).as_deref(),
            Some("NodePool np: SSHNodeClass pool is not Ready (NoClusterEndpoint): why")
        );
        class.status = Some(SSHNodeClassStatus {
            conditions: vec![cond("NoHosts")],
            observed_generation: None,
        });
        assert!(
            class_blocker("np", "pool", Some(&class)).is_none(),
            "told by the host count"
        );
    }
}
