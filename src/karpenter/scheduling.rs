//! The scheduling simulation shared by provisioning and consolidation: which pods fit on which
//! (real, in-flight or hypothetical) node, by the same rules the kube-scheduler applies to the
//! constraints this layer supports.

use std::collections::{BTreeMap, HashMap};

use k8s_openapi::api::core::v1::{Pod, Taint, Toleration};
use kube::core::{Selector, SelectorExt};

use super::pods;
use crate::actors::router::requirements;
use crate::api::karpenter::NodeSelectorRequirement;

pub const HOSTNAME_KEY: &str = "kubernetes.io/hostname";

/// A host port a container binds (`hostIP` empty: every address).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct HostPort {
    pub protocol: String,
    pub port: i32,
    pub ip: String,
}

impl HostPort {
    /// Two binds collide: same protocol and port, and addresses that overlap (an empty or
    /// unspecified address overlaps every address).
    pub fn collides(&self, other: &HostPort) -> bool {
        let any = |ip: &str| ip.is_empty() || ip == "0.0.0.0" || ip == "::";
        self.protocol == other.protocol
            && self.port == other.port
            && (any(&self.ip) || any(&other.ip) || self.ip == other.ip)
    }
}

/// The host ports of a pod's containers (and its restartable init containers, which run
/// beside them).
fn host_ports(spec: &k8s_openapi::api::core::v1::PodSpec) -> Vec<HostPort> {
    let sidecars = spec
        .init_containers
        .iter()
        .flatten()
        .filter(|c| c.restart_policy.as_deref() == Some("Always"));
    spec.containers
        .iter()
        .chain(sidecars)
        .flat_map(|c| c.ports.iter().flatten())
        .filter_map(|p| {
            let port = p.host_port.filter(|hp| *hp > 0)?;
            Some(HostPort {
                protocol: p.protocol.clone().unwrap_or_else(|| "TCP".into()),
                port,
                ip: p.host_ip.clone().unwrap_or_default(),
            })
        })
        .collect()
}

/// A pod's scheduling constraints, extracted once.
#[derive(Debug, Clone, Default)]
pub struct PodInfo {
    pub namespace: String,
    pub name: String,
    pub uid: String,
    pub labels: BTreeMap<String, String>,
    pub requests: BTreeMap<String, i128>,
    pub node_selector: BTreeMap<String, String>,
    /// Required node affinity: OR of terms, each an AND of requirements. Empty: none.
    pub terms: Vec<Vec<NodeSelectorRequirement>>,
    pub tolerations: Vec<Toleration>,
    /// Required pod anti-affinity on the hostname key: no two matching pods on one node.
    pub anti: Vec<Selector>,
    /// Hostname topology spread (DoNotSchedule): at most `max_skew` matching pods per node.
    pub spread: Vec<(Selector, i32)>,
    /// Host ports the pod's containers bind: no two pods on one node may share one (the
    /// scheduler's NodePorts filter).
    pub host_ports: Vec<HostPort>,
    /// Names of the PersistentVolumeClaims the pod mounts (resolved to `volume_terms` by
    /// callers that can read the API).
    pub claims: Vec<String>,
    /// The required node affinity of each PersistentVolume the pod mounts (each an OR of terms,
    /// each term an AND): a node must satisfy every one of them.
    pub volume_terms: Vec<Vec<Vec<NodeSelectorRequirement>>>,
    /// A constraint the per-node check ([`SimNode::fits`]) cannot decide: pod affinity, or
    /// anti-affinity or spread on a key other than the hostname. Consolidation leaves such a
    /// pod on its node; provisioning and the simulated scheduler decide it with
    /// [`super::topology`].
    pub unsupported: Option<String>,
    /// Every required topology term, on any key (S56).
    pub topology: Vec<super::topology::TopologyTerm>,
    /// A constraint nothing here models (`matchFields`, an invalid selector): the pod is left
    /// pending with an `UnsupportedConstraint` event.
    pub invalid: Option<String>,
}

impl PodInfo {
    pub fn new(p: &Pod) -> PodInfo {
        // Borrowed: every scheduling round builds this for every pod (cloning the spec, with
        // its containers, was most of the cost).
        let empty;
        let spec = match &p.spec {
            Some(s) => s,
            None => {
                empty = k8s_openapi::api::core::v1::PodSpec::default();
                &empty
            }
        };
        let mut unsupported = None;
        let mut invalid = None;
        let mut terms = vec![];
        let mut anti = vec![];
        let mut spread = vec![];
        if let Some(aff) = &spec.affinity {
            if let Some(req) = aff.node_affinity.as_ref().and_then(|n| {
                n.required_during_scheduling_ignored_during_execution
                    .as_ref()
            }) {
                for t in &req.node_selector_terms {
                    if t.match_fields.as_ref().is_some_and(|f| !f.is_empty()) {
                        unsupported = Some("node affinity matchFields".to_string());
                        invalid = unsupported.clone();
                    }
                    terms.push(
                        t.match_expressions
                            .iter()
                            .flatten()
                            .map(|e| NodeSelectorRequirement {
                                key: e.key.clone(),
                                operator: e.operator.clone(),
                                values: e.values.clone().unwrap_or_default(),
                                min_values: None,
                            })
                            .collect(),
                    );
                }
            }
            if aff.pod_affinity.as_ref().is_some_and(|a| {
                a.required_during_scheduling_ignored_during_execution
                    .as_ref()
                    .is_some_and(|v| !v.is_empty())
            }) {
                unsupported = Some("required pod affinity".to_string());
            }
            for t in aff
                .pod_anti_affinity
                .as_ref()
                .and_then(|a| {
                    a.required_during_scheduling_ignored_during_execution
                        .as_ref()
                })
                .into_iter()
                .flatten()
            {
                if t.topology_key != HOSTNAME_KEY {
                    unsupported = Some(format!(
                        "required pod anti-affinity on topology key {}",
                        t.topology_key
                    ));
                    continue;
                }
                match t.label_selector.clone().map(Selector::try_from) {
                    Some(Ok(s)) => anti.push(s),
                    _ => unsupported = Some("pod anti-affinity without a valid selector".into()),
                }
            }
        }
        for c in spec.topology_spread_constraints.iter().flatten() {
            if c.when_unsatisfiable != "DoNotSchedule" {
                continue;
            }
            if c.topology_key != HOSTNAME_KEY {
                unsupported = Some(format!(
                    "topology spread on topology key {}",
                    c.topology_key
                ));
                continue;
            }
            match c.label_selector.clone().map(Selector::try_from) {
                Some(Ok(s)) => spread.push((s, c.max_skew.max(1))),
                _ => unsupported = Some("topology spread without a valid selector".into()),
            }
        }
        let namespace = p.metadata.namespace.clone().unwrap_or_default();
        let labels = p.metadata.labels.clone().unwrap_or_default();
        let topology = match super::topology::terms_of(spec, &namespace, &labels) {
            Ok(t) => t,
            Err(why) => {
                invalid = invalid.or(Some(why));
                vec![]
            }
        };
        let claims = spec
            .volumes
            .iter()
            .flatten()
            .filter_map(|v| v.persistent_volume_claim.as_ref())
            .map(|c| c.claim_name.clone())
            .collect();
        PodInfo {
            namespace,
            name: p.metadata.name.clone().unwrap_or_default(),
            uid: p.metadata.uid.clone().unwrap_or_default(),
            labels,
            requests: pods::requests(p),
            node_selector: spec.node_selector.clone().unwrap_or_default(),
            terms,
            tolerations: spec.tolerations.clone().unwrap_or_default(),
            anti,
            spread,
            host_ports: host_ports(spec),
            claims,
            volume_terms: vec![],
            unsupported,
            topology,
            invalid,
        }
    }

    pub fn key(&self) -> (String, String) {
        (self.namespace.clone(), self.name.clone())
    }

    pub fn cpu(&self) -> i128 {
        self.requests.get("cpu").copied().unwrap_or(0)
    }

    pub fn memory(&self) -> i128 {
        self.requests.get("memory").copied().unwrap_or(0)
    }

    /// nodeSelector, required node affinity and the node affinity of the pod's volumes
    /// against a node's labels.
    pub fn labels_match(&self, labels: &BTreeMap<String, String>) -> bool {
        let any_term = |terms: &[Vec<NodeSelectorRequirement>]| {
            terms.is_empty() || terms.iter().any(|t| requirements::all_match(t, labels))
        };
        self.node_selector
            .iter()
            .all(|(k, v)| labels.get(k) == Some(v))
            && any_term(&self.terms)
            && self.volume_terms.iter().all(|v| any_term(v))
    }

    pub fn tolerates(&self, taints: &[Taint]) -> bool {
        tolerates_all(&self.tolerations, taints)
    }
}

/// One toleration against one taint, as the scheduler evaluates it.
pub fn tolerates(t: &Toleration, taint: &Taint) -> bool {
    if t.effect
        .as_deref()
        .is_some_and(|e| !e.is_empty() && e != taint.effect)
    {
        return false;
    }
    let op = t.operator.as_deref().unwrap_or("Equal");
    match t.key.as_deref() {
        None | Some("") => op == "Exists",
        Some(k) if k != taint.key => false,
        Some(_) if op == "Exists" => true,
        Some(_) => t.value.as_deref().unwrap_or("") == taint.value.as_deref().unwrap_or(""),
    }
}

/// Every NoSchedule/NoExecute taint is tolerated (PreferNoSchedule never blocks).
pub fn tolerates_all(tols: &[Toleration], taints: &[Taint]) -> bool {
    taints
        .iter()
        .filter(|t| t.effect != "PreferNoSchedule")
        .all(|taint| tols.iter().any(|t| tolerates(t, taint)))
}

/// A pod placed on a simulated node, with what later pods' constraints need to see.
#[derive(Debug, Clone)]
pub struct Placed {
    pub namespace: String,
    pub labels: BTreeMap<String, String>,
    pub anti: Vec<Selector>,
    pub host_ports: Vec<HostPort>,
}

impl Placed {
    pub fn of(p: &PodInfo) -> Placed {
        Placed {
            namespace: p.namespace.clone(),
            labels: p.labels.clone(),
            anti: p.anti.clone(),
            host_ports: p.host_ports.clone(),
        }
    }
}

/// A node in the simulation: real, in flight or hypothetical.
#[derive(Debug, Clone, Default)]
pub struct SimNode {
    pub name: String,
    pub labels: BTreeMap<String, String>,
    /// Taints that block scheduling.
    pub taints: Vec<Taint>,
    pub allocatable: BTreeMap<String, i128>,
    pub used: BTreeMap<String, i128>,
    pub pods: Vec<Placed>,
}

/// The resources fit in `allocatable - used`.
pub fn fits_resources(
    req: &BTreeMap<String, i128>,
    used: &BTreeMap<String, i128>,
    allocatable: &BTreeMap<String, i128>,
) -> bool {
    req.iter().all(|(k, v)| {
        *v <= 0 || used.get(k).copied().unwrap_or(0) + v <= allocatable.get(k).copied().unwrap_or(0)
    })
}

/// Pod-to-pod constraints (hostname anti-affinity both ways, hostname spread, host ports) on
/// one node.
pub fn pods_allow(pod: &PodInfo, placed: &[Placed]) -> bool {
    if !pod.host_ports.is_empty()
        && placed.iter().any(|q| {
            q.host_ports
                .iter()
                .any(|h| pod.host_ports.iter().any(|mine| mine.collides(h)))
        })
    {
        return false;
    }
    let same_ns = || placed.iter().filter(|q| q.namespace == pod.namespace);
    if pod
        .anti
        .iter()
        .any(|s| same_ns().any(|q| s.matches(&q.labels)))
    {
        return false;
    }
    if same_ns().any(|q| q.anti.iter().any(|s| s.matches(&pod.labels))) {
        return false;
    }
    pod.spread.iter().all(|(s, skew)| {
        let n = same_ns().filter(|q| s.matches(&q.labels)).count() as i64;
        n < i64::from(*skew)
    })
}

impl SimNode {
    pub fn fits(&self, pod: &PodInfo) -> bool {
        fits_resources(&pod.requests, &self.used, &self.allocatable)
            && pod.labels_match(&self.labels)
            && pod.tolerates(&self.taints)
            && pods_allow(pod, &self.pods)
    }

    pub fn add(&mut self, pod: &PodInfo) {
        for (k, v) in &pod.requests {
            *self.used.entry(k.clone()).or_insert(0) += v;
        }
        self.pods.push(Placed::of(pod));
    }
}

/// Place each pod on the first node it fits (nodes in the given order). Returns the pods that
/// found no place.
pub fn place_all<'a>(pods: &'a [PodInfo], nodes: &mut [SimNode]) -> Vec<&'a PodInfo> {
    let shape = shapes(pods);
    // Per shape, the first node that may still take it: nodes only fill up during a pass, so
    // one that refused a shape refuses it for the rest of the pass.
    let mut first: Vec<usize> = vec![0; shape.iter().max().map_or(0, |m| m + 1)];
    let mut left = vec![];
    for (p, &s) in pods.iter().zip(&shape) {
        let from = first[s];
        match nodes[from..].iter().position(|n| n.fits(p)) {
            Some(i) => {
                first[s] = from + i;
                nodes[from + i].add(p);
            }
            None => {
                first[s] = nodes.len();
                left.push(p);
            }
        }
    }
    left
}

/// A shape id per pod: pods with equal requests, node constraints, tolerations, pod-to-pod
/// constraints, namespace and labels get the same id. Whether a node can take a pod depends on
/// nothing else, so packing can treat a node's answer for one pod as its answer for the shape.
pub fn shapes(pods: &[PodInfo]) -> Vec<usize> {
    let mut ids: HashMap<String, usize> = HashMap::new();
    pods.iter()
        .map(|p| {
            let next = ids.len();
            *ids.entry(shape_key(p)).or_insert(next)
        })
        .collect()
}

/// What [`shapes`] compares: everything that decides whether a node can take the pod.
pub fn shape_key(p: &PodInfo) -> String {
    format!(
        "{:?}|{:?}|{:?}|{:?}|{:?}|{:?}|{}|{:?}|{:?}|{:?}|{:?}",
        p.requests,
        p.node_selector,
        p.terms,
        p.tolerations,
        p.anti,
        p.spread,
        p.namespace,
        p.labels,
        p.host_ports,
        p.volume_terms,
        p.topology
    )
}

/// Sort for first-fit-decreasing: largest cpu, then memory, then name (deterministic).
pub fn sort_pods(pods: &mut [PodInfo]) {
    pods.sort_by(|a, b| {
        b.cpu()
            .cmp(&a.cpu())
            .then_with(|| b.memory().cmp(&a.memory()))
            .then_with(|| a.key().cmp(&b.key()))
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    fn taint(key: &str, value: Option<&str>, effect: &str) -> Taint {
        Taint {
            key: key.into(),
            value: value.map(str::to_string),
            effect: effect.into(),
            time_added: None,
        }
    }

    fn tol(key: Option<&str>, op: &str, value: Option<&str>, effect: Option<&str>) -> Toleration {
        Toleration {
            key: key.map(str::to_string),
            operator: Some(op.into()),
            value: value.map(str::to_string),
            effect: effect.map(str::to_string),
            toleration_seconds: None,
        }
    }

    fn sized(i: usize, cpu: i128, group: usize) -> PodInfo {
        PodInfo {
            namespace: "default".into(),
            name: format!("p{i:05}"),
            uid: format!("u{i}"),
            labels: BTreeMap::from([("app".to_string(), format!("g{group}"))]),
            requests: BTreeMap::from([("cpu".to_string(), cpu)]),
            node_selector: BTreeMap::new(),
            terms: vec![],
            tolerations: vec![],
            anti: vec![],
            spread: vec![],
            host_ports: vec![],
            claims: vec![],
            volume_terms: vec![],
            unsupported: None,
            topology: vec![],
            invalid: None,
        }
    }

    /// S36: in-flight nodes absorb pending pods first fit; starting each shape where it last
    /// fitted places every pod exactly where trying every node from the first would.
    #[test]
    fn s36_first_fit_by_shape_matches_plain_first_fit() {
        use rand::{Rng, SeedableRng};
        for seed in 0..20u64 {
            let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
            let groups = if seed % 2 == 0 { 3 } else { 300 };
            let pods: Vec<PodInfo> = (0..300)
                .map(|i| {
                    let g = rng.random_range(0..groups);
                    sized(i, [250, 700, 1500][g % 3] + (g / 3) as i128, g)
                })
                .collect();
            let nodes: Vec<SimNode> = (0..40)
                .map(|n| SimNode {
                    name: format!("n{n}"),
                    allocatable: BTreeMap::from([(
                        "cpu".to_string(),
                        rng.random_range(1..8) * 1000,
                    )]),
                    ..Default::default()
                })
                .collect();
            let mut fast = nodes.clone();
            let left: Vec<String> = place_all(&pods, &mut fast)
                .iter()
                .map(|p| p.name.clone())
                .collect();
            let mut plain = nodes.clone();
            let mut plain_left = vec![];
            for p in &pods {
                match plain.iter_mut().find(|n| n.fits(p)) {
                    Some(n) => n.add(p),
                    None => plain_left.push(p.name.clone()),
                }
            }
            assert_eq!(left, plain_left, "seed {seed}");
            let used = |ns: &[SimNode]| ns.iter().map(|n| n.used.clone()).collect::<Vec<_>>();
            assert_eq!(used(&fast), used(&plain), "seed {seed}");
        }
    }

    /// S48: two pods binding one host port never share a node (the scheduler's NodePorts
    /// filter): same protocol and port, and addresses that overlap.
    #[test]
    fn s48_host_ports_collide_as_the_scheduler_sees_them() {
        let hp = |protocol: &str, port: i32, ip: &str| HostPort {
            protocol: protocol.into(),
            port,
            ip: ip.into(),
        };
        assert!(hp("TCP", 80, "").collides(&hp("TCP", 80, "10.0.0.1")));
        assert!(hp("TCP", 80, "0.0.0.0").collides(&hp("TCP", 80, "")));
        assert!(!hp("TCP", 80, "10.0.0.1").collides(&hp("TCP", 80, "10.0.0.2")));
        assert!(!hp("TCP", 80, "").collides(&hp("UDP", 80, "")));
        assert!(!hp("TCP", 80, "").collides(&hp("TCP", 81, "")));
        let mut a = sized(1, 100, 1);
        a.host_ports = vec![hp("TCP", 8080, "")];
        let mut b = sized(2, 100, 2);
        b.host_ports = vec![hp("TCP", 8080, "")];
        let mut node = SimNode {
            allocatable: BTreeMap::from([("cpu".to_string(), 1000)]),
            ..Default::default()
        };
        assert!(node.fits(&a));
        node.add(&a);
        assert!(!node.fits(&b), "host port taken");
        b.host_ports = vec![hp("TCP", 8081, "")];
        assert!(node.fits(&b));
    }

    #[test]
    fn tolerations_follow_the_scheduler() {
        let t = taint("gpu", Some("yes"), "NoSchedule");
        assert!(tolerates(&tol(Some("gpu"), "Equal", Some("yes"), None), &t));
        assert!(!tolerates(&tol(Some("gpu"), "Equal", Some("no"), None), &t));
        assert!(tolerates(
            &tol(Some("gpu"), "Exists", None, Some("NoSchedule")),
            &t
        ));
        assert!(!tolerates(
            &tol(Some("gpu"), "Exists", None, Some("NoExecute")),
            &t
        ));
        assert!(tolerates(&tol(None, "Exists", None, None), &t));
        assert!(tolerates_all(
            &[],
            &[taint("soft", None, "PreferNoSchedule")]
        ));
        assert!(!tolerates_all(&[], &[t]));
    }
}
