//! Instance types (S28, S29): one per host class, computed from the pool view kept current by
//! the SSHHost watch — never by listing every host per question.

use std::collections::BTreeMap;

use kube::core::{Selector, SelectorExt};

use crate::api::karpenter::{
    ARCH_LABEL, CAPACITY_TYPE_LABEL, INSTANCE_TYPE_LABEL, OS_LABEL, ZONE_LABEL,
};
use crate::api::{HostState, SSHHost, SSHNodeClass};
use crate::karpenter::quantity;

/// One host class offered as an instance type.
#[derive(Debug, Clone, PartialEq)]
pub struct InstanceType {
    pub name: String,
    pub arch: String,
    /// Per-resource minimum over the class's usable hosts, in milli-units.
    pub capacity: BTreeMap<String, i128>,
    pub max_pods: i32,
    /// Price per hour: class vCPUs × pricePerCPUHour.
    pub price: f64,
    /// Hosts that could be claimed now (Available, not in maintenance).
    pub claimable: usize,
    pub usable: usize,
}

impl InstanceType {
    pub fn labels(&self) -> BTreeMap<String, String> {
        BTreeMap::from([
            (INSTANCE_TYPE_LABEL.to_string(), self.name.clone()),
            (ARCH_LABEL.to_string(), self.arch.clone()),
            (OS_LABEL.to_string(), "linux".to_string()),
            (ZONE_LABEL.to_string(), "pool".to_string()),
            (CAPACITY_TYPE_LABEL.to_string(), "on-demand".to_string()),
        ])
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

/// The hosts a node class selects.
pub fn selects(class: &SSHNodeClass, host: &SSHHost) -> Result<bool, InstanceTypeError> {
    let Some(sel) = class.spec.host_selector.clone() else {
        return Ok(true);
    };
    let sel = Selector::try_from(sel).map_err(|e| InstanceTypeError::BadSelector {
        class: class.metadata.name.clone().unwrap_or_default(),
        reason: e.to_string(),
    })?;
    Ok(sel.matches(&host.metadata.labels.clone().unwrap_or_default()))
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

/// A probed host with positive cpu and memory (S29).
pub fn usable(host: &SSHHost) -> bool {
    let probed = host
        .status
        .as_ref()
        .is_some_and(|s| s.observed_arch.is_some());
    let cap = host_capacity(host);
    probed && cap.get("cpu").is_some_and(|c| *c > 0) && cap.get("memory").is_some_and(|m| *m > 0)
}

pub fn claimable(host: &SSHHost) -> bool {
    host.state() == HostState::Available && !host.in_maintenance() && host.claim().is_none()
}

/// Instance types of a node class over `hosts`. Classes with mixed architectures are not
/// offered unless `split_arch`, in which case each arch becomes `<class>-<arch>`.
pub fn instance_types(
    class: &SSHNodeClass,
    hosts: &[SSHHost],
    split_arch: bool,
) -> Result<Vec<InstanceType>, InstanceTypeError> {
    let price = price_per_cpu(class)?;
    let mut groups: BTreeMap<String, Vec<&SSHHost>> = BTreeMap::new();
    for h in hosts {
        if selects(class, h)? && usable(h) {
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
    for (i, h) in hosts.iter().enumerate() {
        let cap = host_capacity(h);
        if i == 0 {
            capacity = cap;
        } else {
            capacity.retain(|k, _| cap.contains_key(k));
            for (k, v) in capacity.iter_mut() {
                *v = (*v).min(cap[k]);
            }
        }
    }
    let cpus = capacity.get("cpu").copied().unwrap_or(0) as f64 / 1000.0;
    InstanceType {
        name,
        arch,
        capacity,
        max_pods: class.spec.max_pods,
        price: cpus * price,
        claimable: hosts.iter().filter(|h| claimable(h)).count(),
        usable: hosts.len(),
    }
}
