//! Instance types (S28, S29): one per host class, computed from the pool view kept current by
//! the SSHHost watch — never by listing every host per question.

use std::borrow::Borrow;
use std::collections::BTreeMap;

use kube::core::{Selector, SelectorExt};

use crate::api::karpenter::{
    ARCH_LABEL, CAPACITY_TYPE_LABEL, INSTANCE_TYPE_LABEL, OS_LABEL, ZONE_LABEL,
};
use crate::api::quantity;
use crate::api::{HostState, SSHHost, SSHNodeClass};

/// One host class offered as an instance type.
#[derive(Debug, Clone, PartialEq)]
pub struct InstanceType {
    pub name: String,
    pub arch: String,
    /// Per-resource minimum over the class's usable hosts, in milli-units: what pods may
    /// count on, whichever host a NodeClaim gets.
    pub capacity: BTreeMap<String, i128>,
    /// Per-resource maximum over the same hosts: the most a NodeClaim of this type may come
    /// to hold, which NodePool limits count (as core counts the largest of a NodeClaim's
    /// instance type options against them). Hosts of one class rarely report exactly the
    /// same memory.
    pub largest: BTreeMap<String, i128>,
    pub max_pods: i32,
    /// Price per hour: class vCPUs × pricePerCPUHour.
    pub price: f64,
    /// Hosts that could be claimed now (Available, not in maintenance).
    pub claimable: usize,
    pub usable: usize,
    /// The class's hosts grouped by their topology labels ([`topology_labels`]): core's
    /// offerings, with a zone (and any rack or custom label the hosts carry) each.
    pub offerings: Vec<Offering>,
}

/// The usable hosts of one instance type that carry the same topology labels.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Offering {
    /// The hosts' labels that their Nodes get ([`topology_labels`]; zone `pool` by default).
    pub labels: BTreeMap<String, String>,
    pub claimable: usize,
    pub usable: usize,
}

/// The zone of a host that has no `topology.kubernetes.io/zone` label.
pub const DEFAULT_ZONE: &str = "pool";

/// Whether a host label reaches its Node: every label but kpssh's own (its API group's
/// domain), `karpenter.sh`'s, the hostname and the labels kpssh sets from the class
/// (instance type, arch, os, capacity type, and their deprecated forms).
pub fn is_topology_label(key: &str) -> bool {
    const SET_BY_KPSSH: [&str; 9] = [
        "kubernetes.io/hostname",
        INSTANCE_TYPE_LABEL,
        "beta.kubernetes.io/instance-type",
        ARCH_LABEL,
        "beta.kubernetes.io/arch",
        OS_LABEL,
        "beta.kubernetes.io/os",
        CAPACITY_TYPE_LABEL,
        "failure-domain.beta.kubernetes.io/zone",
    ];
    let domain = key.split_once('/').map_or("", |(d, _)| d);
    let under = |base: &str| domain == base || domain.ends_with(&format!(".{base}"));
    !SET_BY_KPSSH.contains(&key) && !under(crate::api::GROUP) && !under("karpenter.sh")
}

/// The labels a host gives the Node that runs on it (S56): its own topology labels
/// ([`is_topology_label`]), and zone [`DEFAULT_ZONE`] when it has none.
pub fn topology_labels(host: &SSHHost) -> BTreeMap<String, String> {
    let mut out: BTreeMap<String, String> = host
        .metadata
        .labels
        .iter()
        .flatten()
        .filter(|(k, _)| is_topology_label(k))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    out.entry(ZONE_LABEL.to_string())
        .or_insert_with(|| DEFAULT_ZONE.to_string());
    out
}

impl InstanceType {
    /// The labels every node of this type gets: the class's (instance type, arch, os,
    /// capacity type) and the topology labels all its hosts share (zone `pool` when none
    /// has one).
    pub fn labels(&self) -> BTreeMap<String, String> {
        let mut l = self.common_topology();
        l.extend([
            (INSTANCE_TYPE_LABEL.to_string(), self.name.clone()),
            (ARCH_LABEL.to_string(), self.arch.clone()),
            (OS_LABEL.to_string(), "linux".to_string()),
            (CAPACITY_TYPE_LABEL.to_string(), "on-demand".to_string()),
        ]);
        l
    }

    /// Topology labels with one value over every offering.
    fn common_topology(&self) -> BTreeMap<String, String> {
        let Some((first, rest)) = self.offerings.split_first() else {
            return BTreeMap::from([(ZONE_LABEL.to_string(), DEFAULT_ZONE.to_string())]);
        };
        let mut l = first.labels.clone();
        for o in rest {
            l.retain(|k, v| o.labels.get(k) == Some(v));
        }
        l
    }

    /// An offering exists iff a claimable host exists (S28).
    pub fn available(&self) -> bool {
        self.claimable > 0
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum InstanceTypeError {
    #[error("SSHNodeClass {class}: pricePerCPUHour {price:?} is not a decimal number")]
    BadPrice { class: String, price: String },
    #[error("SSHNodeClass {class}: hostSelector is invalid: {reason}")]
    BadSelector { class: String, reason: String },
}

/// A node class's hostSelector, parsed once for a pass over many hosts.
pub struct ClassSelector(Option<Selector>);

impl ClassSelector {
    pub fn of(class: &SSHNodeClass) -> Result<Self, InstanceTypeError> {
        let Some(sel) = class.spec.host_selector.clone() else {
            return Ok(ClassSelector(None));
        };
        Selector::try_from(sel)
            .map(|s| ClassSelector(Some(s)))
            .map_err(|e| InstanceTypeError::BadSelector {
                class: class.metadata.name.clone().unwrap_or_default(),
                reason: e.to_string(),
            })
    }

    pub fn matches(&self, host: &SSHHost) -> bool {
        static NO_LABELS: BTreeMap<String, String> = BTreeMap::new();
        match &self.0 {
            None => true,
            Some(sel) => sel.matches(host.metadata.labels.as_ref().unwrap_or(&NO_LABELS)),
        }
    }
}

/// The hosts a node class selects.
pub fn selects(class: &SSHNodeClass, host: &SSHHost) -> Result<bool, InstanceTypeError> {
    Ok(ClassSelector::of(class)?.matches(host))
}

pub fn price_per_cpu(class: &SSHNodeClass) -> Result<f64, InstanceTypeError> {
    let p = &class.spec.price_per_cpu_hour;
    p.parse::<f64>()
        .ok()
        .filter(|v| v.is_finite() && *v >= 0.0)
        .ok_or_else(|| InstanceTypeError::BadPrice {
            class: class.metadata.name.clone().unwrap_or_default(),
            price: p.clone(),
        })
}

/// A host's capacity for scheduling: declared, lowered to what the probe observed.
pub fn host_capacity(host: &SSHHost) -> BTreeMap<String, i128> {
    let mut cap: BTreeMap<String, i128> = host
        .spec
        .capacity
        .iter()
        .filter_map(|(k, v)| quantity::parse(v).map(|q| (k.clone(), q)))
        .collect();
    if let Some(obs) = host
        .status
        .as_ref()
        .and_then(|s| s.observed_capacity.as_ref())
    {
        for (k, v) in obs {
            if let Some(o) = quantity::parse(v) {
                let e = cap.entry(k.clone()).or_insert(o);
                *e = (*e).min(o);
            }
        }
    }
    cap
}

/// One resource of [`host_capacity`], without building the map (asked per host per pass).
pub fn capacity_of(host: &SSHHost, resource: &str) -> Option<i128> {
    let declared = host.spec.capacity.get(resource).and_then(quantity::parse);
    let observed = host
        .status
        .as_ref()
        .and_then(|s| s.observed_capacity.as_ref())
        .and_then(|o| o.get(resource))
        .and_then(quantity::parse);
    match (declared, observed) {
        (Some(d), Some(o)) => Some(d.min(o)),
        (d, o) => d.or(o),
    }
}

/// A probed host with positive cpu and memory (S29).
pub fn usable(host: &SSHHost) -> bool {
    let probed = host
        .status
        .as_ref()
        .is_some_and(|s| s.observed_arch.is_some());
    probed
        && capacity_of(host, "cpu").is_some_and(|c| c > 0)
        && capacity_of(host, "memory").is_some_and(|m| m > 0)
}

/// Available, not in maintenance, unclaimed and not backing off after failed launches (S63).
pub fn claimable(host: &SSHHost) -> bool {
    host.state() == HostState::Available
        && !host.in_maintenance()
        && host.claim().is_none()
        && !host.backing_off()
}

/// The instance type `host` belongs to: its class, or `<class>-<arch>` when the class was split.
pub fn type_of(types: &[InstanceType], host: &SSHHost) -> Option<usize> {
    let arch = host
        .status
        .as_ref()
        .and_then(|s| s.observed_arch.as_deref())
        .unwrap_or_default();
    types.iter().position(|t| {
        t.name == host.class()
            || (t.arch == arch
                && t.name.len() == host.class().len() + 1 + arch.len()
                && t.name.starts_with(host.class())
                && t.name.ends_with(arch))
    })
}

/// Instance types of a node class over `hosts`. Classes with mixed architectures are not
/// offered unless `split_arch`, in which case each arch becomes `<class>-<arch>`.
pub fn instance_types<H: Borrow<SSHHost>>(
    class: &SSHNodeClass,
    hosts: &[H],
    split_arch: bool,
) -> Result<Vec<InstanceType>, InstanceTypeError> {
    let price = price_per_cpu(class)?;
    let selector = ClassSelector::of(class)?;
    let mut groups: BTreeMap<String, Vec<&SSHHost>> = BTreeMap::new();
    for h in hosts {
        let h = h.borrow();
        if selector.matches(h) && usable(h) {
            groups.entry(h.class().to_string()).or_default().push(h);
        }
    }
    let mut out = vec![];
    for (name, members) in groups {
        let mut arches: BTreeMap<String, Vec<&SSHHost>> = BTreeMap::new();
        for h in members {
            let arch = h
                .status
                .as_ref()
                .and_then(|s| s.observed_arch.clone())
                .unwrap_or_default();
            arches.entry(arch).or_default().push(h);
        }
        if arches.len() > 1 && !split_arch {
            continue;
        }
        let split = arches.len() > 1;
        for (arch, hs) in arches {
            let it_name = if split {
                format!("{name}-{arch}")
            } else {
                name.clone()
            };
            out.push(summarise(it_name, arch, &hs, class, price));
        }
    }
    Ok(out)
}

fn summarise(
    name: String,
    arch: String,
    hosts: &[&SSHHost],
    class: &SSHNodeClass,
    price: f64,
) -> InstanceType {
    let mut capacity: BTreeMap<String, i128> = BTreeMap::new();
    let mut largest: BTreeMap<String, i128> = BTreeMap::new();
    for (i, h) in hosts.iter().enumerate() {
        let cap = host_capacity(h);
        for (k, v) in &cap {
            let e = largest.entry(k.clone()).or_insert(*v);
            *e = (*e).max(*v);
        }
        if i == 0 {
            capacity = cap;
        } else {
            capacity.retain(|k, _| cap.contains_key(k));
            for (k, v) in capacity.iter_mut() {
                *v = (*v).min(cap[k]);
            }
        }
    }
    let mut offerings: BTreeMap<BTreeMap<String, String>, Offering> = BTreeMap::new();
    for h in hosts {
        let labels = topology_labels(h);
        let o = offerings.entry(labels.clone()).or_insert_with(|| Offering {
            labels,
            ..Default::default()
        });
        o.usable += 1;
        o.claimable += usize::from(claimable(h));
    }
    let cpus = capacity.get("cpu").copied().unwrap_or(0) as f64 / 1000.0;
    InstanceType {
        name,
        arch,
        capacity,
        largest,
        max_pods: class.spec.max_pods,
        price: cpus * price,
        claimable: hosts.iter().filter(|h| claimable(h)).count(),
        usable: hosts.len(),
        offerings: offerings.into_values().collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::{HostState, MAINTENANCE_ANNOTATION, SSHHostStatus};
    use crate::sim::SimHost;
    use crate::sim::world::{host_object, node_class};
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

    fn probed(
        name: &str,
        class: &str,
        cpu: u32,
        mem_kib: u64,
        arch: &str,
        state: HostState,
    ) -> SSHHost {
        let mut h = host_object("pool", name, class, &SimHost::new("10.0.0.1", cpu, mem_kib));
        h.status = Some(SSHHostStatus {
            state,
            observed_arch: Some(arch.into()),
            observed_capacity: Some(BTreeMap::from([
                ("cpu".into(), Quantity(cpu.to_string())),
                ("memory".into(), Quantity(format!("{mem_kib}Ki"))),
            ])),
            ..Default::default()
        });
        h
    }

    #[test]
    fn s28_one_type_per_class_min_capacity_price_and_offering() {
        let class = node_class("pool", "p");
        let hosts = vec![
            probed("a", "small", 4, 8_000_000, "amd64", HostState::Available),
            probed("b", "small", 2, 16_000_000, "amd64", HostState::InUse),
            probed("c", "big", 16, 64_000_000, "amd64", HostState::InUse),
        ];
        let types = instance_types(&class, &hosts, false).expect("types");
        let small = types.iter().find(|t| t.name == "small").expect("small");
        assert_eq!(small.capacity["cpu"], 2000, "minimum cpu over the class");
        assert_eq!(
            small.capacity["memory"],
            8_000_000 * 1024 * 1000,
            "minimum memory"
        );
        assert_eq!(small.largest["cpu"], 4000, "maximum cpu, for limits");
        assert_eq!(small.largest["memory"], 16_000_000 * 1024 * 1000);
        assert!(
            (small.price - 2.0 * 0.02).abs() < 1e-9,
            "vCPUs × pricePerCPUHour"
        );
        assert!(small.available(), "a claimable host exists");
        let big = types.iter().find(|t| t.name == "big").expect("big");
        assert!(!big.available(), "no claimable host: no offering");
        assert_eq!(big.labels()["node.kubernetes.io/instance-type"], "big");
        assert_eq!(big.labels()["topology.kubernetes.io/zone"], "pool");
        assert_eq!(big.labels()["karpenter.sh/capacity-type"], "on-demand");
    }

    #[test]
    fn s28_maintenance_is_not_claimable() {
        let class = node_class("pool", "p");
        let mut h = probed("a", "small", 4, 8_000_000, "amd64", HostState::Available);
        h.metadata.annotations = Some(BTreeMap::from([(
            MAINTENANCE_ANNOTATION.to_string(),
            String::new(),
        )]));
        let types = instance_types(&class, &[h], false).expect("types");
        assert!(!types[0].available());
    }

    #[test]
    fn s29_unprobed_zero_and_mixed_arch_classes_are_not_offered() {
        let class = node_class("pool", "p");
        let mut unprobed = probed("u", "fresh", 4, 8_000_000, "amd64", HostState::Pending);
        unprobed.status = None;
        let zero = probed("z", "zero", 0, 8_000_000, "amd64", HostState::Available);
        let mixed = vec![
            probed("m1", "mixed", 4, 8_000_000, "amd64", HostState::Available),
            probed("m2", "mixed", 4, 8_000_000, "arm64", HostState::Available),
        ];
        let mut all = vec![unprobed, zero];
        all.extend(mixed.clone());
        let names: Vec<String> = instance_types(&class, &all, false)
            .expect("types")
            .into_iter()
            .map(|t| t.name)
            .collect();
        assert!(names.is_empty(), "{names:?}");
        let split: Vec<String> = instance_types(&class, &mixed, true)
            .expect("types")
            .into_iter()
            .map(|t| t.name)
            .collect();
        assert_eq!(split, ["mixed-amd64", "mixed-arm64"]);
    }

    #[test]
    fn s29_bad_price_is_an_error_on_the_class() {
        let mut class = node_class("pool", "p");
        class.spec.price_per_cpu_hour = "cheap".into();
        let err = instance_types::<SSHHost>(&class, &[], false).expect_err("bad price");
        assert!(err.to_string().contains("SSHNodeClass pool"), "{err}");
    }
}
