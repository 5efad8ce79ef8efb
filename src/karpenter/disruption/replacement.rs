//! Replacement before disruption: an under-utilised node whose pods do not fit on the other
//! nodes, but all fit on one node of a cheaper instance type (S38), and a drifted node with
//! pods (S39), get a replacement NodeClaim first; only once it is Initialized is the
//! old NodeClaim disrupted, so its pods always have somewhere to go. The two claims point at each other by annotation, so
//! the exchange survives a controller restart and is given up when the replacement goes away.

use std::collections::BTreeMap;

use serde_json::json;

use super::super::KarpenterError;
use super::super::lifecycle::condition_true;
use super::super::provisioning::pack::{Choice, capacity_with_node, pool_usage, within_limits};
use super::super::provisioning::{
    NewClaim, PoolOffer, build_claim, claim_name, claim_type, unheld_per_type,
};
use super::super::scheduling::{PodInfo, SimNode};
use super::super::state::{ClusterState, Inner};
use crate::actors::Context;
use crate::actors::events;
use crate::actors::router::instance_types::instance_types;
use crate::api::{NodeClaim, NodePool, SSHNodeClass};
use crate::k8s::{Cluster, EventType};
use crate::ssh::Transport;

/// On the NodeClaim being replaced: the name of its replacement.
pub const REPLACED_BY_ANNOTATION: &str = "karpenter.dklesev.github.io/replaced-by";
/// On the replacement: the NodeClaim it replaces (it is not itself consolidated meanwhile).
pub const REPLACEMENT_FOR_ANNOTATION: &str = "karpenter.dklesev.github.io/replacement-for";
/// On the NodeClaim being replaced: why (`Underutilized`, `Drifted`, `Expired`).
pub const REPLACEMENT_REASON_ANNOTATION: &str = "karpenter.dklesev.github.io/replacement-reason";

/// Why `old` is being replaced, as recorded when the replacement was launched.
pub fn reason(old: &NodeClaim) -> Option<&str> {
    annotation(old, REPLACEMENT_REASON_ANNOTATION)
}

fn annotation<'a>(nc: &'a NodeClaim, key: &str) -> Option<&'a str> {
    nc.metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(key))
        .map(String::as_str)
}

pub fn replaced_by(nc: &NodeClaim) -> Option<&str> {
    annotation(nc, REPLACED_BY_ANNOTATION)
}

/// A replacement one of whose old NodeClaims still exists: it waits for that claim's pods.
/// A multi-node consolidation's replacement (S57) names all the claims it replaces,
/// comma-separated.
pub fn awaits_pods(st: &Inner, nc: &NodeClaim) -> bool {
    annotation(nc, REPLACEMENT_FOR_ANNOTATION).is_some_and(|olds| {
        olds.split(',').any(|old| {
            st.nodeclaims
                .get(old.trim())
                .is_some_and(|o| replaced_by(o) == nc.metadata.name.as_deref())
        })
    })
}

/// Where a replacement started earlier stands.
pub enum Progress {
    /// The replacement is Initialized: the old claim may be disrupted now.
    Ready(String),
    /// Still launching: the replacement's name and creation time.
    Waiting(String, Option<jiff::Timestamp>),
    /// The replacement is gone or being deleted: the exchange is off.
    Abandoned,
}

pub fn progress(st: &Inner, old: &NodeClaim) -> Option<Progress> {
    let name = replaced_by(old)?;
    Some(match st.nodeclaims.get(name) {
        Some(r) if r.metadata.deletion_timestamp.is_some() => Progress::Abandoned,
        Some(r) if condition_true(r, "Initialized") => Progress::Ready(name.to_string()),
        Some(r) => Progress::Waiting(
            name.to_string(),
            r.metadata.creation_timestamp.as_ref().map(|t| t.0),
        ),
        None => Progress::Abandoned,
    })
}

/// What a replacement may be, priced once per disruption round: the pool's instance types as
/// new nodes would get them, and per type the claims not holding a host yet.
pub struct Replacer {
    offer: PoolOffer,
    reserved: BTreeMap<String, i64>,
    /// What the pool's NodeClaims take (capacity and `nodes`), with the replacements launched
    /// this round: a replacement runs beside the claim it replaces, so it must fit the
    /// NodePool's limits as well (S36: limits are never exceeded).
    usage: BTreeMap<String, i128>,
}

impl Replacer {
    pub fn new<C: Cluster, T: Transport>(
        ctx: &Context<C, T>,
        state: &ClusterState,
        pool: &NodePool,
        class: &SSHNodeClass,
    ) -> Option<Replacer> {
        let hosts = ctx.hosts.snapshot();
        let types = instance_types(class, &hosts, ctx.config.split_mixed_arch).ok()?;
        let st = state.read();
        let daemonsets: Vec<_> = st.daemonsets.values().cloned().collect();
        let reserved = unheld_per_type(ctx, &st.nodeclaims);
        let by_name = types.iter().map(|t| (t.name.clone(), t.clone())).collect();
        let pool_name = pool.metadata.name.clone().unwrap_or_default();
        let usage = pool_usage(&st.nodeclaims, &by_name)
            .remove(&pool_name)
            .unwrap_or_default();
        Some(Replacer {
            offer: PoolOffer::new(pool, class, types, &daemonsets),
            reserved,
            usage,
        })
    }

    /// A replacement of `ty` was launched: one host of it fewer, and its capacity taken from
    /// the pool's limits, for the rest of the round.
    pub fn reserve(&mut self, ty: &str) {
        *self.reserved.entry(ty.to_string()).or_insert(0) += 1;
        if let Some(it) = self.offer.types.iter().find(|t| t.name == ty) {
            for (k, v) in capacity_with_node(it) {
                *self.usage.entry(k).or_insert(0) += v;
            }
        }
    }

    /// One node of the cheapest instance type with a claimable host that takes every pod the
    /// claim's node would have to give up (`moving`, largest first); `cheaper` asks for a type
    /// cheaper than the claim's own. None also when a pod has a constraint this layer cannot
    /// check (it keeps its node).
    pub fn node_for(
        &self,
        claim: &NodeClaim,
        moving: &[PodInfo],
        cheaper: bool,
    ) -> Option<NewClaim> {
        if moving.is_empty() || moving.iter().any(|p| p.unsupported.is_some()) {
            return None;
        }
        let current = claim_type(claim).unwrap_or_default();
        let price = match self.offer.types.iter().find(|t| t.name == current) {
            Some(t) => t.price,
            None if cheaper => return None,
            None => f64::INFINITY,
        };
        let mut choices: Vec<_> = self
            .offer
            .choices
            .iter()
            .filter(|c| !cheaper || (c.it.price < price && c.it.name != current))
            .filter(|c| c.it.claimable as i64 > self.reserved.get(&c.it.name).copied().unwrap_or(0))
            .filter(|c| within_limits(&self.offer, Some(&self.usage), &c.it))
            .collect();
        if choices.is_empty() {
            return None;
        }
        choices.sort_by(|a, b| {
            a.it.price
                .total_cmp(&b.it.price)
                .then_with(|| a.it.name.cmp(&b.it.name))
        });
        choices.into_iter().find_map(|c| self.take_all(c, moving))
    }

    /// One node of `c` with every pod of `pods` on it, or None when they do not all fit.
    fn take_all(&self, c: &Choice, pods: &[PodInfo]) -> Option<NewClaim> {
        let mut sim = SimNode {
            labels: c.labels.clone(),
            taints: self.offer.taints.clone(),
            allocatable: c.avail.clone(),
            ..Default::default()
        };
        for p in pods {
            if !sim.fits(p) {
                return None;
            }
            sim.add(p);
        }
        let mut requests = sim.used.clone();
        for (k, v) in &c.daemon_overhead {
            *requests.entry(k.clone()).or_insert(0) += v;
        }
        Some(NewClaim {
            pool: self.offer.pool.clone(),
            instance_type: c.it.name.clone(),
            requests,
            pods: pods.iter().map(PodInfo::key).collect(),
            ..Default::default()
        })
    }

    /// The price of instance type `ty` in this pool, if it is one of the pool's.
    pub fn price(&self, ty: &str) -> Option<f64> {
        self.offer
            .types
            .iter()
            .find(|t| t.name == ty)
            .map(|t| t.price)
    }

    /// S57: one node for the pods of several candidates that fit on no other node (`pods`),
    /// cheaper than the candidates together (`below`, the sum of their prices), as core's
    /// multi-node consolidation asks of its one replacement. As core's `filterOutSameType`,
    /// an option of the same type as a candidate (`replaced`) must be cheaper than it too:
    /// replacing several nodes by one of their own type is deleting the others, which
    /// reschedules fewer pods. The cheapest option left, with a claimable host, within the
    /// NodePool's limits.
    pub fn node_for_many(
        &self,
        pods: &[PodInfo],
        below: f64,
        replaced: &[String],
    ) -> Option<NewClaim> {
        if pods.is_empty() || pods.iter().any(|p| p.unsupported.is_some()) {
            return None;
        }
        let mut options: Vec<(&Choice, NewClaim)> = self
            .offer
            .choices
            .iter()
            .filter(|c| c.it.price < below)
            .filter(|c| c.it.claimable as i64 > self.reserved.get(&c.it.name).copied().unwrap_or(0))
            .filter(|c| within_limits(&self.offer, Some(&self.usage), &c.it))
            .filter_map(|c| self.take_all(c, pods).map(|n| (c, n)))
            .collect();
        let same_type = options
            .iter()
            .filter(|(c, _)| replaced.contains(&c.it.name))
            .map(|(c, _)| c.it.price)
            .fold(f64::INFINITY, f64::min);
        options.retain(|(c, _)| c.it.price < same_type);
        options
            .into_iter()
            .min_by(|(a, _), (b, _)| {
                a.it.price
                    .total_cmp(&b.it.price)
                    .then_with(|| a.it.name.cmp(&b.it.name))
            })
            .map(|(_, n)| n)
    }
}

/// Launch `new` as the replacement of `old` and record the exchange on both. Returns the
/// replacement's name, or None when `old` changed meanwhile (nothing was left behind).
pub async fn launch<C: Cluster, T: Transport>(
    ctx: &Context<C, T>,
    state: &ClusterState,
    pool: &NodePool,
    old: &NodeClaim,
    new: &NewClaim,
    why: &str,
) -> Result<Option<String>, KarpenterError> {
    let (name, kept) = launch_for(ctx, state, pool, &[old], new, why).await?;
    Ok(name.filter(|_| !kept.is_empty()))
}

/// Launch `new` as the replacement of every claim of `olds` (S57: one node for several) and
/// record the exchange on each. Returns the replacement's name (None when no old claim took
/// it: then it is deleted again) and the old claims that were marked; one that changed
/// meanwhile is left out, and its node is the caller's to un-cordon.
pub async fn launch_for<C: Cluster, T: Transport>(
    ctx: &Context<C, T>,
    state: &ClusterState,
    pool: &NodePool,
    olds: &[&NodeClaim],
    new: &NewClaim,
    why: &str,
) -> Result<(Option<String>, Vec<String>), KarpenterError> {
    let old_names: Vec<String> = olds
        .iter()
        .map(|o| o.metadata.name.clone().unwrap_or_default())
        .collect();
    let pool_name = pool.metadata.name.clone().unwrap_or_default();
    let mut claim = build_claim(pool, &claim_name(ctx, &pool_name), new);
    claim
        .metadata
        .annotations
        .get_or_insert_with(Default::default)
        .insert(REPLACEMENT_FOR_ANNOTATION.into(), old_names.join(","));
    let created = ctx.cluster.create(&claim).await?;
    let name = created.metadata.name.clone().unwrap_or_default();
    state.observe_claim(created.clone());
    ctx.metrics.core.created(&why.to_lowercase(), &pool_name);
    let mut kept = vec![];
    for (old, old_name) in olds.iter().zip(&old_names) {
        let patch = json!({"metadata": {
            "resourceVersion": old.metadata.resource_version,
            "annotations": {REPLACED_BY_ANNOTATION: name, REPLACEMENT_REASON_ANNOTATION: why},
        }});
        match ctx.cluster.patch::<NodeClaim>(None, old_name, &patch).await {
            // Seen at once, so that no later round takes the old claim's cordon for a stale one.
            Ok(nc) => {
                state.observe_claim(nc);
                kept.push(old_name.clone());
            }
            // The old claim moved on; the replacement is not needed for it.
            Err(e) if e.is_conflict() || e.is_not_found() => {}
            Err(e) => return Err(e.into()),
        }
    }
    if kept.is_empty() {
        ctx.cluster.delete::<NodeClaim>(None, &name, None).await?;
        return Ok((None, kept));
    }
    let because = if why == "Underutilized" {
        "a cheaper instance type takes them all".to_string()
    } else {
        format!("it is {}", why.to_lowercase())
    };
    for (old, old_name) in olds.iter().zip(&old_names) {
        if !kept.contains(old_name) {
            continue;
        }
        let msg = format!(
            "launching replacement NodeClaim {name} ({}) for the {} pod(s) of NodeClaim \
             {}: {because}",
            new.instance_type,
            new.pods.len(),
            kept.join(", ")
        );
        events::record(
            &ctx.cluster,
            *old,
            EventType::Normal,
            "DisruptionLaunching",
            msg,
        )
        .await;
    }
    Ok((Some(name), kept))
}

/// Drop the `replaced-by` mark of a claim whose exchange is off (its Node must be un-cordoned
/// first: without the mark, nothing would do it).
pub async fn abandon<C: Cluster, T: Transport>(
    ctx: &Context<C, T>,
    old: &NodeClaim,
) -> Result<(), KarpenterError> {
    let name = old.metadata.name.clone().unwrap_or_default();
    let patch = json!({"metadata": {"annotations": {
        REPLACED_BY_ANNOTATION: null,
        REPLACEMENT_REASON_ANNOTATION: null,
    }}});
    match ctx.cluster.patch::<NodeClaim>(None, &name, &patch).await {
        Ok(_) => Ok(()),
        Err(e) if e.is_not_found() => Ok(()),
        Err(e) => Err(e.into()),
    }
}
