//! Host choice for a NodeClaim (S13): cheapest fitting class first, then warm hosts (install
//! marker current) before cold, then the oldest host, then by name.
//!
//! The order does not depend on the claim, so a [`Ranking`] is built once per node class for a
//! burst of claims (O(hosts)), and each claim then walks it from the front, checking only the
//! claim's own requirements and resources and the host's current state (O(1) per claim when
//! the claims are alike). Hosts seen taken are skipped for the rest of the ranking's life.

use std::borrow::Borrow;

use crate::api::quantity;
use crate::api::requirements::all_match;
use crate::api::{NodeClaim, SSHHost, SSHNodeClass};
use crate::provider::instance_types::{
    ClassSelector, InstanceType, InstanceTypeError, capacity_of, claimable, instance_types,
    topology_labels, type_of, usable,
};

/// What a class offers, apart from which hosts are free: its instance types and its
/// members (selected, usable hosts with an instance type) as (index in the host list, type,
/// offering of that type).
/// Both depend only on the pool's membership and the class, not on claims or probes.
#[derive(Debug, Clone)]
pub struct Offer {
    pub types: Vec<InstanceType>,
    members: Vec<(usize, usize, usize)>,
}

impl Offer {
    pub fn of<H: Borrow<SSHHost>>(
        class: &SSHNodeClass,
        hosts: &[H],
        split_mixed_arch: bool,
    ) -> Result<Self, InstanceTypeError> {
        let types = instance_types(class, hosts, split_mixed_arch)?;
        let selector = ClassSelector::of(class)?;
        let members = hosts
            .iter()
            .enumerate()
            .filter(|(_, h)| selector.matches((*h).borrow()) && usable((*h).borrow()))
            .filter_map(|(i, h)| {
                let ti = type_of(&types, h.borrow())?;
                let labels = topology_labels(h.borrow());
                let oi = types[ti]
                    .offerings
                    .iter()
                    .position(|o| o.labels == labels)?;
                Some((i, ti, oi))
            })
            .collect();
        Ok(Offer { types, members })
    }
}

/// The claimable hosts of one node class, best first, as they were when it was built.
pub struct Ranking {
    selector: ClassSelector,
    types: Vec<InstanceType>,
    /// Host name, its index in `types` and in that type's offerings, best first.
    order: Vec<(String, usize, usize)>,
    /// Entries seen no longer claimable: never offered again by this ranking.
    taken: Vec<bool>,
    /// Every entry before this one is taken.
    front: usize,
}

impl Ranking {
    /// Rank the hosts of `class` that could be claimed now.
    pub fn build<H: Borrow<SSHHost>>(
        class: &SSHNodeClass,
        profile_marker: &str,
        hosts: &[H],
        split_mixed_arch: bool,
    ) -> Result<Self, InstanceTypeError> {
        let offer = Offer::of(class, hosts, split_mixed_arch)?;
        Self::build_from(class, profile_marker, hosts, &offer)
    }

    /// [`Ranking::build`] from an [`Offer`] computed over the same `hosts` (it changes only
    /// with the pool's membership, so a caller may keep it across rankings).
    pub fn build_from<H: Borrow<SSHHost>>(
        class: &SSHNodeClass,
        profile_marker: &str,
        hosts: &[H],
        offer: &Offer,
    ) -> Result<Self, InstanceTypeError> {
        let selector = ClassSelector::of(class)?;
        let types = offer.types.clone();
        // (price, cold, created, name, type, offering): the sort key, computed once per host.
        let mut ranked: Vec<(f64, bool, Option<jiff::Timestamp>, String, usize, usize)> = vec![];
        for &(i, ti, oi) in &offer.members {
            let Some(h) = hosts.get(i).map(Borrow::borrow) else {
                continue;
            };
            if !claimable(h) {
                continue;
            }
            let Some(name) = h.metadata.name.clone() else {
                continue;
            };
            ranked.push((
                types[ti].price,
                is_cold(h, profile_marker),
                created(h),
                name,
                ti,
                oi,
            ));
        }
        ranked.sort_by(|a, b| {
            a.0.total_cmp(&b.0)
                .then_with(|| a.1.cmp(&b.1))
                .then_with(|| a.2.cmp(&b.2))
                .then_with(|| a.3.cmp(&b.3))
        });
        let order: Vec<(String, usize, usize)> =
            ranked.into_iter().map(|r| (r.3, r.4, r.5)).collect();
        Ok(Ranking {
            selector,
            types,
            taken: vec![false; order.len()],
            order,
            front: 0,
        })
    }

    /// The best host for `claim`: still claimable according to `current` (the live view),
    /// not excluded by `skip` (hosts reserved by claims in flight), matching the claim's
    /// requirements and fitting its requests.
    pub fn pick(
        &mut self,
        claim: &NodeClaim,
        class: &SSHNodeClass,
        current: impl Fn(&str) -> Option<SSHHost>,
        skip: impl Fn(&str) -> bool,
    ) -> Option<SSHHost> {
        let claim_labels = claim.metadata.labels.clone().unwrap_or_default();
        // Requirements are checked against the claim's labels, the instance type's and the
        // offering's (the host's topology labels, S56): once per offering, not per host.
        let type_ok: Vec<Vec<bool>> = self
            .types
            .iter()
            .map(|t| {
                let mut labels = claim_labels.clone();
                labels.extend(t.labels());
                t.offerings
                    .iter()
                    .map(|o| {
                        let mut labels = labels.clone();
                        labels.extend(o.labels.clone());
                        all_match(&claim.spec.requirements, &labels)
                    })
                    .collect()
            })
            .collect();
        for i in self.front..self.order.len() {
            if self.taken[i] {
                continue;
            }
            let (name, ti, oi) = &self.order[i];
            let ok = type_ok.get(*ti).and_then(|o| o.get(*oi)).copied();
            if skip(name) || ok != Some(true) {
                continue;
            }
            let host =
                current(name).filter(|h| claimable(h) && usable(h) && self.selector.matches(h));
            let Some(host) = host else {
                self.taken[i] = true;
                continue;
            };
            if fits(claim, &host, class) {
                self.advance();
                return Some(host);
            }
        }
        self.advance();
        None
    }

    fn advance(&mut self) {
        while self.front < self.taken.len() && self.taken[self.front] {
            self.front += 1;
        }
    }
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

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

    use super::*;
    use crate::api::{ClaimRef, HostState, SSHHostStatus};
    use crate::sim::SimHost;
    use crate::sim::world::{host_object, node_claim, node_class};

    fn available(name: &str, class: &str, cpu: u32, age_s: i64, warm: bool) -> SSHHost {
        let mut h = host_object(
            "pool",
            name,
            class,
            &SimHost::new("10.0.0.1", cpu, 8_000_000),
        );
        h.metadata.creation_timestamp = Some(Time(
            jiff::Timestamp::from_second(1_000_000 - age_s).expect("time"),
        ));
        h.status = Some(SSHHostStatus {
            state: HostState::Available,
            observed_arch: Some("amd64".into()),
            observed_capacity: Some(BTreeMap::from([
                ("cpu".into(), Quantity(cpu.to_string())),
                ("memory".into(), Quantity("8000000Ki".into())),
            ])),
            installed_profile: warm.then(|| "p@1".to_string()),
            ..Default::default()
        });
        h
    }

    fn by_name(hosts: &[SSHHost]) -> BTreeMap<String, SSHHost> {
        hosts
            .iter()
            .map(|h| (h.metadata.name.clone().unwrap_or_default(), h.clone()))
            .collect()
    }

    #[test]
    fn s13_ranking_is_cheapest_then_warm_then_oldest_then_name() {
        let class = node_class("pool", "p");
        let hosts = vec![
            available("big", "big", 8, 500, true),
            available("cold-old", "small", 2, 400, false),
            available("warm-new", "small", 2, 10, true),
            available("warm-old-b", "small", 2, 300, true),
            available("warm-old-a", "small", 2, 300, true),
        ];
        let view = by_name(&hosts);
        let nc = node_claim("nc", "pool", "1", "1Gi");
        let mut ranking = Ranking::build(&class, "p@1", &hosts, false).expect("ranking");
        let handed = std::cell::RefCell::new(Vec::<String>::new());
        while let Some(h) = ranking.pick(
            &nc,
            &class,
            |n| view.get(n).cloned(),
            |n| handed.borrow().iter().any(|x| x == n),
        ) {
            handed
                .borrow_mut()
                .push(h.metadata.name.unwrap_or_default());
        }
        assert_eq!(
            handed.into_inner(),
            ["warm-old-a", "warm-old-b", "warm-new", "cold-old", "big"]
        );
    }

    #[test]
    fn s15_pick_skips_reserved_and_taken_hosts_and_checks_the_claims_fit() {
        let class = node_class("pool", "p");
        let hosts: Vec<SSHHost> = (0..4)
            .map(|i| available(&format!("h{i}"), "small", 2, 100 - i, true))
            .collect();
        let mut view = by_name(&hosts);
        let nc = node_claim("nc", "pool", "1", "1Gi");
        let mut ranking = Ranking::build(&class, "p@1", &hosts, false).expect("ranking");
        // h0 was claimed since the ranking was built; h1 is reserved by a claim in flight.
        if let Some(h0) = view.get_mut("h0") {
            h0.status.as_mut().expect("status").claim_ref = Some(ClaimRef {
                name: "other".into(),
                uid: "u".into(),
            });
        }
        let pick = |r: &mut Ranking, nc: &NodeClaim, view: &BTreeMap<String, SSHHost>| {
            r.pick(nc, &class, |n| view.get(n).cloned(), |n| n == "h1")
                .and_then(|h| h.metadata.name)
        };
        assert_eq!(pick(&mut ranking, &nc, &view).as_deref(), Some("h2"));
        // h0 is never looked at again, even if the view goes back.
        let claimed_h0 = view.remove("h0");
        assert!(claimed_h0.is_some());
        view.insert("h0".into(), hosts[0].clone());
        assert_eq!(pick(&mut ranking, &nc, &view).as_deref(), Some("h2"));
        let too_big = node_claim("big", "pool", "4", "1Gi");
        assert_eq!(pick(&mut ranking, &too_big, &view), None, "2 cpu hosts");
    }
}
