//! Host choice for a NodeClaim (S13): cheapest fitting class first, then warm hosts (install
//! marker current) before cold, then the oldest host, then by name.

use std::borrow::Borrow;
use std::collections::BTreeMap;

use super::instance_types::{
    ClassSelector, InstanceTypeError, capacity_of, claimable, instance_types, usable,
};
use super::requirements::all_match;
use crate::api::{NodeClaim, SSHHost, SSHNodeClass};
use crate::karpenter::quantity;

/// Candidate host names for `claim`, best first.
pub fn candidates<H: Borrow<SSHHost>>(
    claim: &NodeClaim,
    class: &SSHNodeClass,
    profile_marker: &str,
    hosts: &[H],
) -> Result<Vec<String>, InstanceTypeError> {
    let types = instance_types(class, hosts, false)?;
    let price: BTreeMap<&str, f64> = types.iter().map(|t| (t.name.as_str(), t.price)).collect();
    let claim_labels = claim.metadata.labels.clone().unwrap_or_default();
    let selector = ClassSelector::of(class)?;
    let mut fitting: Vec<(&SSHHost, f64)> = vec![];
    for h in hosts {
        let h = h.borrow();
        if !claimable(h) || !selector.matches(h) || !usable(h) {
            continue;
        }
        let Some(ty) = types.iter().find(|t| t.name == h.class()) else {
            continue;
        };
        let mut labels = claim_labels.clone();
        labels.extend(ty.labels());
        if !all_match(&claim.spec.requirements, &labels) || !fits(claim, h, class) {
            continue;
        }
        fitting.push((h, price.get(h.class()).copied().unwrap_or(f64::MAX)));
    }
    fitting.sort_by(|(a, pa), (b, pb)| {
        pa.total_cmp(pb)
            .then_with(|| is_cold(a, profile_marker).cmp(&is_cold(b, profile_marker)))
            .then_with(|| created(a).cmp(&created(b)))
            .then_with(|| a.metadata.name.cmp(&b.metadata.name))
    });
    Ok(fitting
        .into_iter()
        .filter_map(|(h, _)| h.metadata.name.clone())
        .collect())
}

fn is_cold(h: &SSHHost, marker: &str) -> bool {
    h.status
        .as_ref()
        .and_then(|s| s.installed_profile.as_deref())
        != Some(marker)
}

fn created(h: &SSHHost) -> Option<jiff::Timestamp> {
    h.metadata.creation_timestamp.as_ref().map(|t| t.0)
}

/// The NodeClaim's resource requests fit the host's allocatable (capacity less kubeReserved;
/// pods against maxPods).
pub fn fits(claim: &NodeClaim, host: &SSHHost, class: &SSHNodeClass) -> bool {
    claim.spec.resources.requests.iter().all(|(k, v)| {
        let Some(want) = quantity::parse(v) else {
            return false;
        };
        if k == "pods" {
            return want <= i128::from(class.spec.max_pods) * 1000;
        }
        let reserved = class
            .spec
            .kube_reserved
            .get(k)
            .and_then(quantity::parse)
            .unwrap_or(0);
        capacity_of(host, k).is_some_and(|have| want <= have - reserved)
    })
}
