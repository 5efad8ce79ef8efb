//! What a new node of each NodePool could be (its offers: instance types as that pool's nodes
//! would get them), NodePool limits and usage, and the NodeClaims already in flight as
//! simulated nodes. The packing itself is [`super::solve`].

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::{Pod, Taint};

use crate::api::DISRUPTION_ANNOTATION;
use crate::api::karpenter::{
    ARCH_LABEL, CAPACITY_TYPE_LABEL, INSTANCE_TYPE_LABEL, NODEPOOL_LABEL, NodeSelectorRequirement,
    OS_LABEL, UNREGISTERED_TAINT_KEY,
};
use crate::api::quantity;
use crate::api::requirements::{Requirement, Requirements, WELL_KNOWN_LABELS};
use crate::api::{NodeClaim, NodePool, SSHNodeClass};
use crate::karpenter::pods;
use crate::karpenter::scheduling::{HOSTNAME_KEY, PodInfo, SimNode};
use crate::karpenter::state::Inner;
use crate::provider::instance_types::{InstanceType, Offering};

use crate::api::karpenter::{claim_type, claim_types};

/// One instance type as a node of one NodePool would get it.
#[derive(Debug, Clone)]
pub struct Choice {
    pub it: InstanceType,
    /// The labels every such node gets (template, resolved requirements, the type's).
    pub labels: BTreeMap<String, String>,
    /// Allocatable less daemonset overhead: what pending pods may use.
    pub avail: BTreeMap<String, i128>,
    pub daemon_overhead: BTreeMap<String, i128>,
    /// The type's own labels as requirements (instance type, arch, os, capacity type).
    pub type_reqs: Requirements,
    /// The type's offerings (indices into `it.offerings`) the pool's requirements admit.
    pub offerings: Vec<usize>,
}

/// A NodePool with the instance types its node class offers.
#[derive(Debug, Clone)]
pub struct PoolOffer {
    pub pool: String,
    pub weight: i32,
    /// Template taints (startup taints never block pods).
    pub taints: Vec<Taint>,
    pub limits: BTreeMap<String, i128>,
    pub types: Vec<InstanceType>,
    pub choices: Vec<Choice>,
    /// The template's requirements (with `minValues`), its labels and the NodePool's, as core's
    /// `NodeClaimTemplate.Requirements`.
    pub reqs: Requirements,
    /// The template's labels and `karpenter.sh/nodepool`.
    pub labels: BTreeMap<String, String>,
    /// The label keys the class's hosts give their nodes (zone, rack, custom): like a cloud
    /// provider's well-known labels, pods may require them without the template defining them,
    /// and only the host decides their value.
    pub host_keys: BTreeSet<String>,
}

/// Well-known keys only hosts can give a node (their value is never resolved from
/// requirements).
const HOST_ONLY_KEYS: [&str; 3] = [
    "topology.kubernetes.io/zone",
    "topology.kubernetes.io/region",
    "node.kubernetes.io/windows-build",
];

/// The template's labels (requirements are resolved per NodeClaim: [`resolve_labels`]).
pub fn template_labels(pool: &NodePool) -> BTreeMap<String, String> {
    pool.spec.template.metadata.labels().clone()
}

/// Labels a NodeClaim gets from its (narrowed) requirements, as core's
/// `resolveCustomLabelsFromRequirements`: one value ([`Requirement::any`]) for every key that
/// is not well-known, not restricted, not given by the hosts and not already labelled.
pub fn resolve_labels(
    reqs: &Requirements,
    host_keys: &BTreeSet<String>,
    labels: &BTreeMap<String, String>,
) -> BTreeMap<String, String> {
    reqs.iter()
        .filter(|r| {
            !WELL_KNOWN_LABELS.contains(&r.key.as_str())
                && !host_keys.contains(&r.key)
                && !labels.contains_key(&r.key)
                && r.key != HOSTNAME_KEY
                && !restricted(&r.key)
        })
        .filter_map(|r| Some((r.key.clone(), r.any()?)))
        .collect()
}

fn restricted(key: &str) -> bool {
    let domain = key.split_once('/').map_or("", |(d, _)| d);
    domain == "karpenter.sh" || domain.ends_with(".karpenter.sh")
}

/// Whether `o` (one offering: its hosts' topology labels) can carry a node with `reqs`: each
/// label it has is allowed, and each host key it lacks may be absent.
pub fn offering_ok(o: &Offering, reqs: &Requirements, host_keys: &BTreeSet<String>) -> bool {
    o.labels
        .iter()
        .all(|(k, v)| !reqs.has(k) || reqs.get(k).has(v))
        && host_keys
            .iter()
            .filter(|k| !o.labels.contains_key(*k) && reqs.has(k))
            .all(|k| reqs.get(k).allows_absent())
}

fn allocatable(it: &InstanceType, class: &SSHNodeClass) -> BTreeMap<String, i128> {
    let mut a = it.capacity.clone();
    for (k, v) in &class.spec.kube_reserved {
        if let (Some(have), Some(r)) = (a.get_mut(k), quantity::parse(v)) {
            *have = (*have - r).max(0);
        }
    }
    a.insert("pods".into(), i128::from(it.max_pods) * 1000);
    a
}

fn daemon_pod(ds: &DaemonSet) -> Option<Pod> {
    let t = &ds.spec.as_ref()?.template;
    Some(Pod {
        metadata: t.metadata.clone().unwrap_or_default(),
        spec: t.spec.clone(),
        status: None,
    })
}

/// The type-level requirements of `it`.
pub fn type_requirements(it: &InstanceType) -> Requirements {
    let mut r = Requirements::default();
    for (k, v) in [
        (INSTANCE_TYPE_LABEL, &it.name),
        (ARCH_LABEL, &it.arch),
        (OS_LABEL, &"linux".to_string()),
        (CAPACITY_TYPE_LABEL, &"on-demand".to_string()),
    ] {
        r.add(Requirement::one_of(k, [v.clone()]));
    }
    r
}

impl PoolOffer {
    pub fn new(
        pool: &NodePool,
        class: &SSHNodeClass,
        types: Vec<InstanceType>,
        daemonsets: &[DaemonSet],
    ) -> PoolOffer {
        let name = pool.metadata.name.clone().unwrap_or_default();
        let t = &pool.spec.template.spec;
        let mut base = template_labels(pool);
        base.insert(NODEPOOL_LABEL.into(), name.clone());
        let mut reqs = Requirements::from_node_selector(&t.requirements);
        reqs.add(Requirement::one_of(NODEPOOL_LABEL, [name.clone()]));
        for (k, v) in &base {
            reqs.add(Requirement::one_of(k, [v.clone()]));
        }
        // The hosts' label keys, and the well-known topology keys a class has no value for
        // unless its hosts give one (a node without them satisfies only what allows absence).
        let host_keys: BTreeSet<String> = types
            .iter()
            .flat_map(|it| it.offerings.iter().flat_map(|o| o.labels.keys().cloned()))
            .chain(HOST_ONLY_KEYS.iter().map(|k| k.to_string()))
            .collect();
        base.extend(resolve_labels(&reqs, &host_keys, &base));
        let ds_pods: Vec<PodInfo> = daemonsets
            .iter()
            .filter_map(daemon_pod)
            .map(|p| PodInfo::new(&p))
            .collect();
        let mut choices = vec![];
        for it in &types {
            let type_reqs = type_requirements(it);
            let offerings: Vec<usize> = (0..it.offerings.len())
                .filter(|i| offering_ok(&it.offerings[*i], &reqs, &host_keys))
                .collect();
            if type_reqs.intersects(&reqs).is_err() || offerings.is_empty() {
                continue;
            }
            let mut labels = base.clone();
            labels.extend(it.labels());
            let alloc = allocatable(it, class);
            let mut overhead: BTreeMap<String, i128> = BTreeMap::new();
            for d in &ds_pods {
                if d.tolerates(t.taints()) && d.labels_match(&labels) {
                    for (k, v) in &d.requests {
                        *overhead.entry(k.clone()).or_insert(0) += v;
                    }
                }
            }
            let mut avail = alloc.clone();
            for (k, v) in &overhead {
                if let Some(a) = avail.get_mut(k) {
                    *a -= v;
                }
            }
            choices.push(Choice {
                it: it.clone(),
                labels,
                avail,
                daemon_overhead: overhead,
                type_reqs,
                offerings,
            });
        }
        let limits = pool
            .spec
            .limits
            .iter()
            .filter_map(|(k, v)| {
                let q = quantity::parse(v)?;
                Some((k.clone(), q))
            })
            .collect();
        let mut labels = template_labels(pool);
        labels.insert(NODEPOOL_LABEL.into(), name.clone());
        PoolOffer {
            pool: name,
            weight: pool.spec.weight.unwrap_or(0),
            taints: t.taints().to_vec(),
            limits,
            types,
            choices,
            reqs,
            labels,
            host_keys,
        }
    }

    /// A key pods may require without the template defining it (core's
    /// `AllowUndefinedWellKnownLabels`, with the hosts' label keys as the provider's).
    pub fn undefined_ok(&self, key: &str) -> bool {
        WELL_KNOWN_LABELS.contains(&key) || self.host_keys.contains(key)
    }
}

/// A NodeClaim to create.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct NewClaim {
    pub pool: String,
    /// The instance type priced for it (the cheapest of `instance_types`).
    pub instance_type: String,
    /// Pods' requests plus daemonset overhead, in milli-units.
    pub requests: BTreeMap<String, i128>,
    pub pods: Vec<(String, String)>,
    /// Its requirements narrowed by its pods and their topology (core's NodeClaim
    /// requirements), `karpenter.sh/nodepool` and the instance type included; `None`: the
    /// template's, with `instance_type` (a replacement).
    pub requirements: Option<Vec<NodeSelectorRequirement>>,
    /// Labels resolved from those requirements ([`resolve_labels`]).
    pub labels: BTreeMap<String, String>,
}

/// What one node of `it` may add to its NodePool's usage: the capacity of its largest host
/// (the router may give it any of them) and one `nodes`.
pub fn capacity_with_node(it: &InstanceType) -> BTreeMap<String, i128> {
    let mut c = it.largest.clone();
    c.insert("nodes".into(), 1000);
    c
}

/// Whether one more node of `it` keeps the pool within its limits, given what it uses now.
pub fn within_limits(
    offer: &PoolOffer,
    used: Option<&BTreeMap<String, i128>>,
    it: &InstanceType,
) -> bool {
    within(offer, used, &capacity_with_node(it))
}

/// Whether `more` keeps the pool within its limits, given what it uses now.
pub fn within(
    offer: &PoolOffer,
    used: Option<&BTreeMap<String, i128>>,
    more: &BTreeMap<String, i128>,
) -> bool {
    offer.limits.iter().all(|(k, limit)| {
        let u = used.and_then(|u| u.get(k)).copied().unwrap_or(0);
        u + more.get(k).copied().unwrap_or(0) <= *limit
    })
}

/// Resources each NodePool's NodeClaims take, for limits: a launched claim's recorded
/// capacity, before that the largest host of its instance type's; plus one `nodes` each.
pub fn pool_usage(
    claims: &BTreeMap<String, std::sync::Arc<NodeClaim>>,
    types: &BTreeMap<String, InstanceType>,
) -> BTreeMap<String, BTreeMap<String, i128>> {
    let mut usage: BTreeMap<String, BTreeMap<String, i128>> = BTreeMap::new();
    for nc in claims.values() {
        let Some(pool) = nc.nodepool() else { continue };
        let status_cap: BTreeMap<String, i128> = nc
            .status
            .as_ref()
            .map(|s| {
                s.capacity
                    .iter()
                    .filter_map(|(k, v)| quantity::parse(v).map(|q| (k.clone(), q)))
                    .collect()
            })
            .unwrap_or_default();
        let cap = if status_cap.is_empty() {
            // Not launched: the largest host of any type it lists (S55: a claim with
            // minValues lists several), as core counts the largest of its options.
            let mut cap: BTreeMap<String, i128> = BTreeMap::new();
            for t in claim_types(nc).iter().filter_map(|t| types.get(t)) {
                for (k, v) in &t.largest {
                    let e = cap.entry(k.clone()).or_insert(*v);
                    *e = (*e).max(*v);
                }
            }
            cap
        } else {
            status_cap
        };
        let u = usage.entry(pool.to_string()).or_default();
        for (k, v) in cap {
            *u.entry(k).or_insert(0) += v;
        }
        *u.entry("nodes".into()).or_insert(0) += 1000;
    }
    usage
}

fn parse_map(
    m: &BTreeMap<String, k8s_openapi::apimachinery::pkg::api::resource::Quantity>,
) -> BTreeMap<String, i128> {
    m.iter()
        .filter_map(|(k, v)| quantity::parse(v).map(|q| (k.clone(), q)))
        .collect()
}

/// The room of an in-flight claim whose instance type is no longer offered to its pool: its
/// allocatable once known, else what it requested (its pods and daemonset overhead), with its
/// instance type's pod count.
fn claimed_room(nc: &NodeClaim, it: Option<&InstanceType>) -> BTreeMap<String, i128> {
    let mut room = nc
        .status
        .as_ref()
        .map(|s| parse_map(&s.allocatable))
        .unwrap_or_default();
    if room.is_empty() {
        room = parse_map(&nc.spec.resources.requests);
    }
    room.entry("pods".into())
        .or_insert(i128::from(it.map_or(110, |t| t.max_pods)) * 1000);
    room
}

/// Our NodeClaims (not being deleted or disrupted) as simulated nodes, with the pods already
/// bound to their nodes: pending pods that fit there are waiting for them, not for new ones.
pub fn inflight_nodes(
    st: &Inner,
    types: &BTreeMap<String, InstanceType>,
    offers: &[PoolOffer],
) -> Vec<SimNode> {
    let mut out = vec![];
    for nc in st.nodeclaims.values() {
        let disrupting = nc
            .metadata
            .annotations
            .as_ref()
            .is_some_and(|a| a.contains_key(DISRUPTION_ANNOTATION));
        if nc.metadata.deletion_timestamp.is_some() || disrupting {
            continue;
        }
        let ty = claim_type(nc);
        let listed = claim_types(nc);
        let offer = offers
            .iter()
            .find(|o| Some(o.pool.as_str()) == nc.nodepool());
        let choice = offer.and_then(|o| o.choices.iter().find(|c| Some(&c.it.name) == ty.as_ref()));
        // S55: a claim listing several types may get any of them: its pods fit the smallest.
        let room = offer.filter(|_| listed.len() > 1).map(|o| {
            let mut room: Option<BTreeMap<String, i128>> = None;
            for c in o.choices.iter().filter(|c| listed.contains(&c.it.name)) {
                room = Some(match room {
                    None => c.avail.clone(),
                    Some(r) => r
                        .into_iter()
                        .map(|(k, v)| {
                            let other = c.avail.get(&k).copied().unwrap_or(0);
                            (k, v.min(other))
                        })
                        .collect(),
                });
            }
            room.unwrap_or_default()
        });
        let node = st.node_of(nc);
        let mut labels = choice.map(|c| c.labels.clone()).unwrap_or_default();
        labels.extend(nc.metadata.labels.clone().unwrap_or_default());
        let startup: Vec<&str> = nc
            .spec
            .startup_taints
            .iter()
            .map(|t| t.key.as_str())
            .collect();
        let mut taints: Vec<Taint> = nc.spec.taints.clone();
        let mut sim = SimNode {
            name: nc.metadata.name.clone().unwrap_or_default(),
            ..Default::default()
        };
        match node {
            Some(node) => {
                labels.extend(node.metadata.labels.clone().unwrap_or_default());
                taints = node
                    .spec
                    .as_ref()
                    .and_then(|s| s.taints.clone())
                    .unwrap_or_default()
                    .into_iter()
                    .filter(|t| {
                        t.key != UNREGISTERED_TAINT_KEY && !startup.contains(&t.key.as_str())
                    })
                    .collect();
                let mut alloc = node
                    .status
                    .as_ref()
                    .and_then(|s| s.allocatable.as_ref())
                    .map(parse_map)
                    .unwrap_or_default();
                if alloc.is_empty() {
                    alloc = nc
                        .status
                        .as_ref()
                        .map(|s| parse_map(&s.allocatable))
                        .unwrap_or_default();
                }
                if alloc.is_empty() {
                    alloc = choice.map(|c| c.avail.clone()).unwrap_or_default();
                }
                let max_pods = ty
                    .as_ref()
                    .and_then(|t| types.get(t))
                    .map_or(110, |t| t.max_pods);
                alloc
                    .entry("pods".into())
                    .or_insert(i128::from(max_pods) * 1000);
                sim.allocatable = alloc;
                let name = node.metadata.name.clone().unwrap_or_default();
                for p in st.pods_on(&name).filter(|p| pods::counts_on_node(p)) {
                    sim.add(&st.pod_info(p));
                }
            }
            None => {
                sim.allocatable = match (room, choice) {
                    (Some(r), _) if !r.is_empty() => r,
                    (_, Some(c)) => c.avail.clone(),
                    // S54: its instance type left the pool's offers (its class lost its hosts,
                    // the pool's requirements changed) while it launches: it still takes the
                    // pods it was made for. What it asked for is a lower bound of its room.
                    _ => claimed_room(nc, types.get(ty.as_deref().unwrap_or_default())),
                };
                if listed.len() > 1
                    && nc
                        .metadata
                        .labels
                        .as_ref()
                        .is_none_or(|l| !l.contains_key(INSTANCE_TYPE_LABEL))
                {
                    // Which of its types it gets is not known yet.
                    labels.remove(INSTANCE_TYPE_LABEL);
                }
                for r in &nc.spec.requirements {
                    if r.operator == "In"
                        && let [only] = r.values.as_slice()
                    {
                        labels.entry(r.key.clone()).or_insert_with(|| only.clone());
                    }
                }
            }
        }
        sim.labels = labels;
        sim.taints = taints;
        out.push(sim);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::super::solve::pack;
    use super::*;
    use crate::karpenter::scheduling::{fits_resources, pods_allow};
    use crate::provider::instance_types::Offering;
    use rand::{Rng, SeedableRng};

    fn offer() -> PoolOffer {
        let choice = |name: &str, cpu: i128, price: f64| {
            let it = InstanceType {
                name: name.into(),
                arch: "amd64".into(),
                capacity: BTreeMap::from([
                    ("cpu".to_string(), cpu),
                    ("memory".to_string(), (cpu * 4) << 30),
                ]),
                largest: BTreeMap::from([
                    ("cpu".to_string(), cpu),
                    ("memory".to_string(), (cpu * 4) << 30),
                ]),
                max_pods: 110,
                price,
                claimable: 1000,
                usable: 1000,
                offerings: vec![Offering {
                    labels: BTreeMap::from([(
                        "topology.kubernetes.io/zone".to_string(),
                        "pool".to_string(),
                    )]),
                    claimable: 1000,
                    usable: 1000,
                }],
            };
            let mut avail = it.capacity.clone();
            avail.insert("pods".into(), 110_000);
            Choice {
                labels: it.labels(),
                type_reqs: type_requirements(&it),
                offerings: vec![0],
                it,
                avail,
                daemon_overhead: BTreeMap::new(),
            }
        };
        let choices = vec![choice("small", 4000, 1.0), choice("big", 16000, 3.0)];
        PoolOffer {
            pool: "default".into(),
            weight: 0,
            taints: vec![],
            limits: BTreeMap::new(),
            types: choices.iter().map(|c| c.it.clone()).collect(),
            choices,
            reqs: Requirements::default(),
            labels: BTreeMap::new(),
            host_keys: BTreeSet::from(["topology.kubernetes.io/zone".to_string()]),
        }
    }

    fn pod(i: usize, cpu: i128, group: usize) -> PodInfo {
        PodInfo {
            namespace: "default".into(),
            name: format!("p{i:05}"),
            uid: format!("u{i}"),
            labels: BTreeMap::from([("app".to_string(), format!("g{group}"))]),
            requests: BTreeMap::from([
                ("cpu".to_string(), cpu),
                ("memory".to_string(), cpu << 20),
                ("pods".to_string(), 1000),
            ]),
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

    /// The packing as first written: every remaining pod is tried on every bin, no shortcuts.
    fn reference(pods: &[PodInfo], offer: &PoolOffer) -> Vec<(String, Vec<(String, String)>)> {
        let mut done = vec![false; pods.len()];
        let mut out = vec![];
        for i in 0..pods.len() {
            if done[i] {
                continue;
            }
            done[i] = true;
            let mut choices: Vec<&Choice> = offer
                .choices
                .iter()
                .filter(|c| fits_resources(&pods[i].requests, &BTreeMap::new(), &c.avail))
                .collect();
            if choices.is_empty() {
                continue;
            }
            let mut node = SimNode::default();
            node.add(&pods[i]);
            let mut members = vec![pods[i].key()];
            for j in (i + 1)..pods.len() {
                if done[j] || !pods_allow(&pods[j], &node.pods) {
                    continue;
                }
                let mut used = node.used.clone();
                for (k, v) in &pods[j].requests {
                    *used.entry(k.clone()).or_insert(0) += v;
                }
                let still: Vec<&Choice> = choices
                    .iter()
                    .copied()
                    .filter(|c| fits_resources(&used, &BTreeMap::new(), &c.avail))
                    .collect();
                if still.is_empty() {
                    continue;
                }
                choices = still;
                node.add(&pods[j]);
                members.push(pods[j].key());
                done[j] = true;
            }
            let best = choices
                .iter()
                .min_by(|a, b| a.it.price.total_cmp(&b.it.price))
                .map(|c| c.it.name.clone())
                .unwrap_or_default();
            out.push((best, members));
        }
        out
    }

    /// S36 (nodepool-limits, found by the random campaign): the hosts of one class report
    /// different memory (MemTotal falls short of the nominal size by a per-machine amount).
    /// Pods fit by the smallest host, but the router may give a NodeClaim any host of the
    /// class, so limits count the largest: under a 31 GiB limit over hosts of 7.6–8 GiB three
    /// nodes open, not four (four of the smallest, 30.4 GiB, would fit; four of the largest,
    /// 32 GiB, do not).
    #[test]
    fn s36_limits_count_the_largest_host_of_a_type() {
        let mut offer = offer();
        offer.choices.retain(|c| c.it.name == "small");
        let c = &mut offer.choices[0];
        c.it.capacity.insert("memory".into(), 7600 << 30);
        c.avail.insert("memory".into(), 7600 << 30);
        c.it.largest.insert("memory".into(), 8000 << 30);
        offer.types = vec![c.it.clone()];
        offer.limits = BTreeMap::from([("memory".to_string(), 31000 << 30)]);
        // One pod per node (3 of 4 CPUs each).
        let pods: Vec<PodInfo> = (0..8).map(|i| pod(i, 3000, 0)).collect();
        let budgets = BTreeMap::from([("small".to_string(), 100)]);
        let offers = [offer];
        let out = pack(&pods, &offers, budgets.clone(), BTreeMap::new());
        assert_eq!(out.claims.len(), 3, "{:?}", out.claims);
        assert_eq!(out.unplaced.len(), 5);
        assert!(
            out.unplaced
                .iter()
                .all(|(_, why)| why == "NodePool limits exceeded")
        );
        // Two launched claims of 7.7 GiB each: 15.4 + 8 + 8 = 31.4 > 31, so one more only.
        let usage = BTreeMap::from([(
            "default".to_string(),
            BTreeMap::from([("memory".to_string(), 15400 << 30), ("nodes".into(), 2000)]),
        )]);
        let out = pack(&pods, &offers, budgets, usage);
        assert_eq!(out.claims.len(), 1, "{:?}", out.claims);
    }

    /// S36: skipping a bin's refused shapes changes nothing: the same claims with the same pods
    /// as trying every pod on every bin, over random mixes of a few shapes and many.
    #[test]
    fn s36_shape_skipping_packs_exactly_like_trying_every_pod() {
        let offer = offer();
        let offers = vec![offer.clone()];
        for seed in 0..20u64 {
            let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
            let shapes = if seed % 2 == 0 { 4 } else { 400 };
            let mut pods: Vec<PodInfo> = (0..400)
                .map(|i| {
                    let g = rng.random_range(0..shapes);
                    let cpu = [250, 500, 1500, 3000, 9000][g % 5] + (g / 5) as i128;
                    pod(i, cpu, g)
                })
                .collect();
            crate::karpenter::scheduling::sort_pods(&mut pods);
            let budgets = BTreeMap::from([("small".to_string(), 1000), ("big".to_string(), 1000)]);
            let got: Vec<(String, Vec<(String, String)>)> =
                pack(&pods, &offers, budgets, BTreeMap::new())
                    .claims
                    .into_iter()
                    .map(|c| (c.instance_type, c.pods))
                    .collect();
            assert_eq!(got, reference(&pods, &offer), "seed {seed}");
        }
    }
}
