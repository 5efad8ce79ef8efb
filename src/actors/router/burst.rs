//! A burst of claims (S15 at scale): NodeClaims queued for a host, claim tasks in flight (at
//! most `max_concurrent_claims`), the host reserved for each, and one [`Ranking`] per node
//! class for the burst.
//!
//! A reserved host is never offered to another claim, so concurrent claims spread over the
//! pool instead of racing for the best host; the CAS on the host's status stays the only
//! source of truth (a lost CAS is not an error: the claim goes back to the front of the queue
//! and takes the next host). The node class and profile are read and the pool is ranked once
//! per class per burst, not per claim; the rankings are dropped when the router goes idle, and
//! a claim that finds nothing in a ranking built earlier in the burst ranks the pool again
//! before it is declared insufficient.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::time::Duration;

use tokio::task::JoinHandle;

use super::choose::{Offer, Ranking};
use super::claim::{self, ClaimOutcome, ClaimResult};
use super::{RouterState, claim_ref, holder, launched, reconcile, send};
use crate::actors::host::HostMsg;
use crate::api::{ClaimRef, NodeClaim, SSHHost, SSHJoinProfile, SSHNodeClass};
use crate::k8s::{Cluster, ClusterError};
use crate::provider::instance_types::InstanceTypeError;
use crate::ssh::Transport;
use crate::telemetry::lifecycle::{Subject, nodepool_of};

/// How many hosts a claim tries before it waits for the next tick (lost CASes are not errors).
const CLAIM_ATTEMPTS: usize = 8;
/// A ranking older than this is rebuilt even while its burst goes on, so that a router that
/// never goes idle still sees new hosts and edits to classes and profiles.
const RANKING_MAX_AGE: Duration = Duration::from_secs(10);

struct ClassRanking {
    class: SSHNodeClass,
    ranking: Result<Ranking, InstanceTypeError>,
    built: jiff::Timestamp,
}

/// A class's offer (instance types and member hosts) and what it was computed from: the
/// pool's membership version and the class's resourceVersion. Claims and probes move
/// neither, so a burst that ranks the pool again and again computes it once.
struct CachedOffer {
    membership: u64,
    class_version: Option<String>,
    offer: Offer,
}

struct InFlight {
    /// The host reserved for this claim (none for an insufficient-capacity task).
    host: Option<String>,
    task: JoinHandle<()>,
}

pub struct Burst {
    limit: usize,
    /// NodeClaims waiting for a slot, in arrival order (a claim that lost a CAS goes first).
    queue: VecDeque<String>,
    queued: BTreeSet<String>,
    /// Claim tasks by NodeClaim name.
    in_flight: BTreeMap<String, InFlight>,
    /// Hosts held by claims in flight: never offered to another claim meanwhile.
    reserved: BTreeSet<String>,
    /// Hosts whose CAS was lost in this burst and could not be re-read.
    lost: BTreeSet<String>,
    /// Lost CASes of this round, by NodeClaim name.
    attempts: BTreeMap<String, usize>,
    /// NodeClaim UIDs whose termination finalizer a task has set (the NodeClaim in hand may
    /// not show it yet; patching again from it would be a conflict).
    finalized: BTreeSet<String>,
    /// Claims that found only reserved hosts: queued again when a task ends.
    deferred: Vec<String>,
    rankings: BTreeMap<String, ClassRanking>,
    /// Kept when the burst ends: the next burst usually finds the same pool.
    offers: BTreeMap<String, CachedOffer>,
}

impl Burst {
    pub fn new(limit: usize) -> Self {
        Burst {
            limit: limit.max(1),
            queue: VecDeque::new(),
            queued: BTreeSet::new(),
            in_flight: BTreeMap::new(),
            reserved: BTreeSet::new(),
            lost: BTreeSet::new(),
            attempts: BTreeMap::new(),
            finalized: BTreeSet::new(),
            deferred: vec![],
            rankings: BTreeMap::new(),
            offers: BTreeMap::new(),
        }
    }

    pub fn in_flight(&self, nodeclaim: &str) -> bool {
        self.in_flight.contains_key(nodeclaim)
    }

    /// Queue a NodeClaim for a host (once).
    pub fn enqueue(&mut self, nodeclaim: &str) {
        if !self.in_flight(nodeclaim) && self.queued.insert(nodeclaim.to_string()) {
            self.queue.push_back(nodeclaim.to_string());
        }
    }

    fn enqueue_first(&mut self, nodeclaim: &str) {
        if !self.in_flight(nodeclaim) && self.queued.insert(nodeclaim.to_string()) {
            self.queue.push_front(nodeclaim.to_string());
        }
    }

    /// The NodeClaim is gone: forget what was kept for it.
    pub fn forget(&mut self, nodeclaim: &str, uid: Option<&str>) {
        self.attempts.remove(nodeclaim);
        if let Some(uid) = uid {
            self.finalized.remove(uid);
        }
    }

    /// Stop every task in flight (the router is stopping). A CAS already written stays: the
    /// next router resumes its launch (S20).
    pub fn abort(&mut self) {
        for (_, f) in std::mem::take(&mut self.in_flight) {
            f.task.abort();
        }
    }

    fn idle(&self) -> bool {
        self.in_flight.is_empty() && self.queue.is_empty()
    }
}

/// Start queued claims while slots are free; drop the rankings when the burst is over.
pub async fn pump<C: Cluster, T: Transport>(state: &mut RouterState<C, T>) {
    while state.burst.in_flight.len() < state.burst.limit {
        let Some(name) = state.burst.queue.pop_front() else {
            break;
        };
        state.burst.queued.remove(&name);
        dispatch(state, &name).await;
    }
    if state.burst.idle() {
        state.burst.rankings.clear();
        state.burst.lost.clear();
    }
}

/// Choose a host for one queued NodeClaim and start its claim task.
async fn dispatch<C: Cluster, T: Transport>(state: &mut RouterState<C, T>, name: &str) {
    let Some(nc) = state.claims.get(name).cloned() else {
        return;
    };
    if nc.metadata.deletion_timestamp.is_some()
        || launched(&nc)
        || holder(&state.ctx, &nc).is_some()
    {
        // It changed while queued: reconcile takes it from here.
        reconcile(state, name).await;
        return;
    }
    let Some(claim) = claim_ref(&nc) else {
        return;
    };
    if !state.ctx.hosts.listed() {
        // The supervisor's first list of the hosts has not arrived (a controller starting,
        // or taking over): look again on the next tick.
        state.waiting.insert(name.to_string());
        return;
    }
    let class_name = nc.spec.node_class_ref.name.clone();
    let mut fresh = match rank(state, &class_name, false).await {
        Ok(Some(fresh)) => fresh,
        Ok(None) => {
            let why = format!("SSHNodeClass {class_name} not found");
            return start_insufficient(state, nc, claim, why);
        }
        Err(e) => {
            tracing::warn!(nodeclaim = %name, error = %e, "will retry");
            state.waiting.insert(name.to_string());
            return;
        }
    };
    loop {
        let picked = pick(state, &class_name, &nc, true);
        match picked {
            Err(why) => return start_insufficient(state, nc, claim, why),
            Ok(Some(host)) => return start_claim(state, nc, claim, host),
            Ok(None) if !fresh => {
                // Built earlier in the burst: hosts may have come back or joined since.
                match rank(state, &class_name, true).await {
                    Ok(Some(_)) => fresh = true,
                    Ok(None) => {
                        let why = format!("SSHNodeClass {class_name} not found");
                        return start_insufficient(state, nc, claim, why);
                    }
                    Err(e) => {
                        tracing::warn!(nodeclaim = %name, error = %e, "will retry");
                        state.waiting.insert(name.to_string());
                        return;
                    }
                }
            }
            Ok(None) => break,
        }
    }
    if matches!(pick(state, &class_name, &nc, false), Ok(Some(_))) {
        // Only hosts held by claims in flight, or whose lost CAS could not be re-read, fit:
        // they may still come free. Look again when a claim ends, or on the next tick.
        if state.burst.in_flight.is_empty() {
            state.waiting.insert(name.to_string());
        } else {
            state.burst.deferred.push(name.to_string());
        }
        return;
    }
    let why = "no Available host of any fitting class".to_string();
    start_insufficient(state, nc, claim, why);
}

/// Make sure `class_name` has a ranking (rebuilt if `force` or old). `Some(true)`: built now;
/// `None`: the class does not exist.
async fn rank<C: Cluster, T: Transport>(
    state: &mut RouterState<C, T>,
    class_name: &str,
    force: bool,
) -> Result<Option<bool>, ClusterError> {
    let clock = &state.ctx.clock;
    if !force
        && let Some(r) = state.burst.rankings.get(class_name)
        && clock.since(r.built) < RANKING_MAX_AGE
    {
        return Ok(Some(false));
    }
    let cluster = &state.ctx.cluster;
    let Some(class) = cluster.get::<SSHNodeClass>(None, class_name).await? else {
        state.burst.rankings.remove(class_name);
        return Ok(None);
    };
    let profile_name = &class.spec.join_profile_ref.name;
    let marker = match cluster.get::<SSHJoinProfile>(None, profile_name).await? {
        Some(p) => p.marker(),
        None => format!("{profile_name}@?"),
    };
    let (membership, hosts) = state.ctx.hosts.snapshot_at();
    let ranking = class_offer(state, &class, &hosts, membership)
        .and_then(|offer| Ranking::build_from(&class, &marker, &hosts, &offer));
    let built = state.ctx.clock.now();
    state.burst.rankings.insert(
        class_name.to_string(),
        ClassRanking {
            class,
            ranking,
            built,
        },
    );
    Ok(Some(true))
}

/// The class's offer over `hosts` (the snapshot taken at `membership`), from the
/// cache when neither the pool's membership nor the class moved since it was computed: the
/// same membership means the same hosts in the same order.
fn class_offer<C: Cluster, T: Transport>(
    state: &mut RouterState<C, T>,
    class: &SSHNodeClass,
    hosts: &[std::sync::Arc<SSHHost>],
    membership: u64,
) -> Result<Offer, InstanceTypeError> {
    let name = class.metadata.name.clone().unwrap_or_default();
    let class_version = class.metadata.resource_version.clone();
    if let Some(c) = state.burst.offers.get(&name)
        && c.membership == membership
        && c.class_version == class_version
    {
        return Ok(c.offer.clone());
    }
    let offer = Offer::of(class, hosts, state.ctx.config.split_mixed_arch)?;
    state.burst.offers.insert(
        name,
        CachedOffer {
            membership,
            class_version,
            offer: offer.clone(),
        },
    );
    Ok(offer)
}

/// The next host of the class's ranking for `nc`; `skip_held: false` also offers hosts held
/// by claims in flight or lost without a re-read. `Err`: the class cannot be offered (bad
/// price or selector).
fn pick<C: Cluster, T: Transport>(
    state: &mut RouterState<C, T>,
    class_name: &str,
    nc: &NodeClaim,
    skip_held: bool,
) -> Result<Option<SSHHost>, String> {
    let hosts = &state.ctx.hosts;
    let burst = &mut state.burst;
    let Some(entry) = burst.rankings.get_mut(class_name) else {
        return Ok(None);
    };
    let ranking = entry.ranking.as_mut().map_err(|e| e.to_string())?;
    let (reserved, lost) = (&burst.reserved, &burst.lost);
    Ok(ranking.pick(
        nc,
        &entry.class,
        |n| hosts.get(n),
        |n| skip_held && (reserved.contains(n) || lost.contains(n)),
    ))
}

fn start_claim<C: Cluster, T: Transport>(
    state: &mut RouterState<C, T>,
    nc: std::sync::Arc<NodeClaim>,
    claim: ClaimRef,
    host: SSHHost,
) {
    let host_name = host.metadata.name.clone().unwrap_or_default();
    let name = claim.name.clone();
    let finalized = state.burst.finalized.contains(&claim.uid);
    state.burst.reserved.insert(host_name.clone());
    let task = tokio::spawn(claim::run(
        state.ctx.clone(),
        state.myself.clone(),
        std::sync::Arc::unwrap_or_clone(nc),
        claim,
        host,
        finalized,
    ));
    state.burst.in_flight.insert(
        name,
        InFlight {
            host: Some(host_name),
            task,
        },
    );
}

fn start_insufficient<C: Cluster, T: Transport>(
    state: &mut RouterState<C, T>,
    nc: std::sync::Arc<NodeClaim>,
    claim: ClaimRef,
    why: String,
) {
    let task = tokio::spawn(claim::run_insufficient(
        state.ctx.clone(),
        state.myself.clone(),
        std::sync::Arc::unwrap_or_clone(nc),
        claim.clone(),
        why,
    ));
    state
        .burst
        .in_flight
        .insert(claim.name, InFlight { host: None, task });
}

/// Apply what a claim task reports.
pub async fn apply<C: Cluster, T: Transport>(state: &mut RouterState<C, T>, outcome: ClaimOutcome) {
    let ClaimOutcome {
        claim,
        host,
        finalized,
        result,
    } = outcome;
    let name = claim.name.clone();
    let Some(flight) = state.burst.in_flight.remove(&name) else {
        return;
    };
    if let Some(h) = &flight.host {
        state.burst.reserved.remove(h);
    }
    for d in std::mem::take(&mut state.burst.deferred) {
        state.burst.enqueue(&d);
    }
    if finalized && !matches!(result, ClaimResult::Won(_)) {
        state.burst.finalized.insert(claim.uid.clone());
    }
    match result {
        ClaimResult::Won(updated) => {
            state.burst.forget(&name, Some(&claim.uid));
            let host_name = host.unwrap_or_default();
            let class = updated.class().to_string();
            state.ctx.hosts.upsert(std::sync::Arc::from(updated));
            state.claimed += 1;
            state.ctx.metrics.claims.inc();
            state.launches.insert(claim.uid.clone());
            let current = state
                .claims
                .get(&name)
                .filter(|nc| nc.metadata.uid.as_deref() == Some(claim.uid.as_str()))
                .cloned();
            let Some(nc) = current else {
                // Deleted while the CAS was in flight (S26): the holder notices now.
                send(state, &host_name, HostMsg::Probe);
                return;
            };
            let subject = Subject::new(
                &format!("{}/{host_name}", state.ctx.pool_ns()),
                &class,
                &claim,
                nodepool_of(&nc),
            );
            state.ctx.lifecycles.begin(&subject);
            state.ctx.lifecycles.step(&claim.uid, "claim", "success");
            send(state, &host_name, HostMsg::Launch(claim));
            if nc.metadata.deletion_timestamp.is_some() {
                reconcile(state, &name).await;
            }
        }
        ClaimResult::Lost(fresh) => {
            // S15: someone else got there first; that is not an error. Try the next one.
            state.conflicts += 1;
            state.ctx.metrics.claim_conflicts.inc();
            // The re-read tells whether the host is still free (a probe write raced the CAS)
            // or taken; without it, the host is not offered again in this burst.
            match (fresh, host) {
                (Some(fresh), _) => state.ctx.hosts.upsert(std::sync::Arc::from(fresh)),
                (None, Some(h)) => {
                    state.burst.lost.insert(h);
                }
                (None, None) => {}
            }
            let attempts = state.burst.attempts.entry(name.clone()).or_default();
            *attempts += 1;
            if *attempts >= CLAIM_ATTEMPTS {
                state.burst.attempts.remove(&name);
                state.waiting.insert(name);
            } else {
                state.burst.enqueue_first(&name);
            }
        }
        ClaimResult::Insufficient => {
            state.burst.forget(&name, Some(&claim.uid));
        }
        ClaimResult::Failed(e) => {
            tracing::warn!(nodeclaim = %name, error = %e, "will retry");
            state.burst.attempts.remove(&name);
            state.waiting.insert(name);
        }
    }
}
