//! Node class controller (S32, S33): the Ready condition of every SSHNodeClass, the finalizer
//! that blocks deleting a class while NodeClaims use it, and the finalizer that keeps a profile
//! while an install marker names it (so that leave always finds its script).

use std::collections::BTreeMap;
use std::marker::PhantomData;
use std::time::Duration;

use futures::StreamExt;
use ractor::{Actor, ActorProcessingErr, ActorRef};

use super::host::phases::profile_source;
use crate::api::nodeclass::reason;
use crate::api::{NodeClaim, SSHJoinProfile, SSHNodeClass, TERMINATION_FINALIZER};
use crate::k8s::conditions::upsert_condition;
use crate::k8s::{Cluster, ClusterError, WatchEvent, finalizers};
use crate::profile::validate_profile;
use crate::provider::Context;
use crate::provider::instance_types::{ClassSelector, usable};
use crate::ssh::Transport;

const RESYNC: Duration = Duration::from_secs(10);

#[derive(Debug)]
pub enum NodeClassMsg {
    Class(WatchEvent<SSHNodeClass>),
    Profile(WatchEvent<SSHJoinProfile>),
    Claim(WatchEvent<NodeClaim>),
    Resync,
}

pub struct NodeClassController<C: Cluster, T: Transport> {
    _ports: PhantomData<fn() -> (C, T)>,
}

impl<C: Cluster, T: Transport> Default for NodeClassController<C, T> {
    fn default() -> Self {
        NodeClassController {
            _ports: PhantomData,
        }
    }
}

pub struct NodeClassState<C: Cluster, T: Transport> {
    ctx: Context<C, T>,
    classes: BTreeMap<String, SSHNodeClass>,
    profiles: BTreeMap<String, SSHJoinProfile>,
    /// Our NodeClaims by name → the class they reference.
    claims: BTreeMap<String, String>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
    /// Host-view version at the last full pass; `dirty` when a claim changed or a pass failed.
    hosts_seen: Option<u64>,
    dirty: bool,
    /// The last Ready verdict per class and what it was computed from: counting selected
    /// hosts is the expensive part of a pass, and claims move far more often than the pool.
    readiness: BTreeMap<String, (ReadinessInputs, Readiness)>,
    /// Launch ledger epoch at the last pass.
    launches_seen: Option<u64>,
    /// Some class found no cluster endpoint at the last pass: look again at every resync.
    awaiting_endpoint: bool,
    /// Some class was paused at the last pass: the pass after its end makes it Ready again.
    was_paused: bool,
}

type Readiness = (bool, &'static str, String);

/// What a class's Ready verdict depends on.
#[derive(Debug, Clone, PartialEq, Eq)]
struct ReadinessInputs {
    membership: u64,
    class_generation: Option<i64>,
    profile_version: Option<String>,
    /// Why no cluster endpoint could be found for the class, if none could (S22).
    endpoint_error: Option<String>,
    /// The class's launch pause (S63).
    pause: Option<crate::provider::launches::Pause>,
}

fn pump<K: Send + 'static>(
    mut stream: crate::k8s::WatchStream<K>,
    to: ActorRef<NodeClassMsg>,
    wrap: fn(WatchEvent<K>) -> NodeClassMsg,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        while let Some(ev) = stream.next().await {
            if let Ok(ev) = ev
                && to.send_message(wrap(ev)).is_err()
            {
                return;
            }
        }
    })
}

impl<C: Cluster, T: Transport> Actor for NodeClassController<C, T> {
    type Msg = NodeClassMsg;
    type State = NodeClassState<C, T>;
    type Arguments = Context<C, T>;

    async fn pre_start(
        &self,
        myself: ActorRef<Self::Msg>,
        ctx: Context<C, T>,
    ) -> Result<Self::State, ActorProcessingErr> {
        let mut tasks = vec![
            pump(
                ctx.cluster.watch::<SSHNodeClass>(None),
                myself.clone(),
                NodeClassMsg::Class,
            ),
            pump(
                ctx.cluster.watch::<SSHJoinProfile>(None),
                myself.clone(),
                NodeClassMsg::Profile,
            ),
            pump(
                ctx.cluster.watch::<NodeClaim>(None),
                myself.clone(),
                NodeClassMsg::Claim,
            ),
        ];
        let me = myself.clone();
        tasks.push(tokio::spawn(async move {
            loop {
                tokio::time::sleep(RESYNC).await;
                if me.send_message(NodeClassMsg::Resync).is_err() {
                    return;
                }
            }
        }));
        Ok(NodeClassState {
            ctx,
            classes: BTreeMap::new(),
            profiles: BTreeMap::new(),
            claims: BTreeMap::new(),
            tasks,
            hosts_seen: None,
            dirty: true,
            readiness: BTreeMap::new(),
            launches_seen: None,
            awaiting_endpoint: false,
            was_paused: false,
        })
    }

    async fn post_stop(
        &self,
        _myself: ActorRef<Self::Msg>,
        state: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        for t in state.tasks.drain(..) {
            t.abort();
        }
        Ok(())
    }

    async fn handle(
        &self,
        _myself: ActorRef<Self::Msg>,
        msg: Self::Msg,
        state: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        match msg {
            NodeClassMsg::Class(ev) => apply(&mut state.classes, ev),
            NodeClassMsg::Profile(ev) => apply(&mut state.profiles, ev),
            NodeClassMsg::Claim(ev) => {
                on_claim(state, ev);
                state.dirty = true;
                return Ok(());
            }
            NodeClassMsg::Resync => {
                // A pass reads every host: skip it when neither the pool nor a claim moved,
                // no launch was recorded, no pause runs out and no class waits for its
                // cluster endpoint to be published.
                let now = state.ctx.clock.now();
                let quiet = !state.dirty
                    && state.hosts_seen == Some(state.ctx.hosts.version())
                    && state.launches_seen == Some(state.ctx.launches.epoch())
                    && !state.ctx.launches.any_paused(now)
                    && !state.was_paused
                    && !state.awaiting_endpoint;
                if quiet {
                    return Ok(());
                }
            }
        }
        state.hosts_seen = Some(state.ctx.hosts.version());
        state.launches_seen = Some(state.ctx.launches.epoch());
        state.was_paused = state.ctx.launches.any_paused(state.ctx.clock.now());
        // A failed pass is retried at the next resync.
        state.dirty = !reconcile_all(state).await;
        Ok(())
    }
}

fn on_claim<C: Cluster, T: Transport>(state: &mut NodeClassState<C, T>, ev: WatchEvent<NodeClaim>) {
    let entry = |nc: &NodeClaim| {
        Some((
            nc.metadata.name.clone()?,
            nc.spec.node_class_ref.name.clone(),
        ))
    };
    match ev {
        WatchEvent::Restarted(all) => {
            state.claims = all
                .iter()
                .filter(|nc| nc.is_ours())
                .filter_map(entry)
                .collect();
        }
        WatchEvent::Applied(nc) if nc.is_ours() => {
            if let Some((n, c)) = entry(&nc) {
                state.claims.insert(n, c);
            }
        }
        WatchEvent::Applied(_) => {}
        WatchEvent::Deleted(nc) => {
            if let Some(n) = nc.metadata.name.as_ref() {
                state.claims.remove(n);
            }
        }
    }
}

/// Fold a watch event into a name-keyed map.
fn apply<K: kube::Resource + Clone>(map: &mut BTreeMap<String, K>, ev: WatchEvent<K>) {
    match ev {
        WatchEvent::Restarted(all) => {
            map.clear();
            for o in all {
                if let Some(n) = o.meta().name.clone() {
                    map.insert(n, o);
                }
            }
        }
        WatchEvent::Applied(o) => {
            if let Some(n) = o.meta().name.clone() {
                map.insert(n, o);
            }
        }
        WatchEvent::Deleted(o) => {
            if let Some(n) = o.meta().name.as_ref() {
                map.remove(n);
            }
        }
    }
}

/// Every class and profile; false when any of them failed.
async fn reconcile_all<C: Cluster, T: Transport>(state: &mut NodeClassState<C, T>) -> bool {
    // A shard (`--node-classes`) writes the status and finalizer of its own classes only:
    // another shard's host view holds other hosts, and two shards would flap the condition.
    let names: Vec<String> = (state.classes.keys())
        .filter(|n| state.ctx.shard.owns_class(n))
        .cloned()
        .collect();
    // Read before the snapshot: a change in between makes the next pass count again.
    let membership = state.ctx.hosts.membership_version();
    let mut ok = true;
    // `kube-public/cluster-info`, read once per pass and only when some class needs it.
    let needs_cluster_info = state
        .classes
        .values()
        .any(|c| c.spec.cluster.is_none() && c.metadata.deletion_timestamp.is_none());
    let cluster_info = if needs_cluster_info {
        Some(cluster_info_endpoint(&state.ctx.cluster).await)
    } else {
        None
    };
    state.awaiting_endpoint = cluster_info.as_ref().is_some_and(|r| r.is_err());
    for name in names {
        let endpoint_error = match (&cluster_info, state.classes.get(&name)) {
            (Some(Err(why)), Some(c)) if c.spec.cluster.is_none() => Some(format!(
                "no cluster endpoint for the hosts to join: set spec.cluster (endpoint and caBundle) on SSHNodeClass {name}, or publish kube-public/cluster-info ({why})"
            )),
            _ => None,
        };
        if let Err(e) = reconcile_class(state, &name, membership, endpoint_error).await {
            tracing::warn!(nodeclass = %name, error = %e, "node class not reconciled");
            ok = false;
        }
    }
    if let Err(e) = reconcile_profiles(state).await {
        tracing::warn!(error = %e, "profile finalizers not reconciled");
        ok = false;
    }
    ok
}

/// Whether `kube-public/cluster-info` names an API server (S22), else why not.
async fn cluster_info_endpoint<C: Cluster>(cluster: &C) -> Result<(), String> {
    let cm: Option<k8s_openapi::api::core::v1::ConfigMap> = cluster
        .get(Some("kube-public"), "cluster-info")
        .await
        .map_err(|e| format!("reading kube-public/cluster-info: {e}"))?;
    let kubeconfig = cm
        .and_then(|c| c.data)
        .and_then(|d| d.get("kubeconfig").cloned())
        .ok_or("kube-public/cluster-info does not exist or has no kubeconfig")?;
    crate::k8s::cluster_info::endpoint(&kubeconfig)
        .map(|_| ())
        .map_err(|e| e.to_string())
}

/// The Ready condition's (ok, reason, message) for a class (S32).
pub fn readiness<H: std::borrow::Borrow<crate::api::SSHHost>>(
    class: &SSHNodeClass,
    profile: Option<&SSHJoinProfile>,
    hosts: &[H],
) -> (bool, &'static str, String) {
    readiness_with(class, profile, hosts, None, None)
}

/// [`readiness`], also judging the cluster endpoint (S22) and the launch pause (S63).
fn readiness_with<H: std::borrow::Borrow<crate::api::SSHHost>>(
    class: &SSHNodeClass,
    profile: Option<&SSHJoinProfile>,
    hosts: &[H],
    endpoint_error: Option<&str>,
    pause: Option<&crate::provider::launches::Pause>,
) -> (bool, &'static str, String) {
    let profile_name = &class.spec.join_profile_ref.name;
    let Some(profile) = profile else {
        return (
            false,
            reason::PROFILE_NOT_FOUND,
            format!("SSHJoinProfile {profile_name} not found"),
        );
    };
    if let Err(e) = validate_profile(&profile_source(profile)) {
        return (false, reason::PROFILE_INVALID, e.to_string());
    }
    let selector = match ClassSelector::of(class) {
        Ok(s) => s,
        Err(e) => return (false, reason::SELECTOR_ERROR, e.to_string()),
    };
    if let Some(why) = endpoint_error {
        return (false, reason::NO_CLUSTER_ENDPOINT, why.to_string());
    }
    if let Some(p) = pause {
        return (false, reason::LAUNCHES_FAILING, p.message.clone());
    }
    let selected = hosts
        .iter()
        .map(|h| h.borrow())
        .filter(|h| selector.matches(h) && usable(h))
        .count();
    if selected == 0 {
        return (
            false,
            reason::NO_HOSTS,
            "no probed SSHHost matches hostSelector".into(),
        );
    }
    (true, reason::READY, format!("{selected} hosts selected"))
}

async fn reconcile_class<C: Cluster, T: Transport>(
    state: &mut NodeClassState<C, T>,
    name: &str,
    membership: u64,
    endpoint_error: Option<String>,
) -> Result<(), ClusterError> {
    let Some(class) = state.classes.get(name).cloned() else {
        return Ok(());
    };
    let referenced = state.claims.values().any(|c| c == name);
    finalizers::set(
        &state.ctx.cluster,
        &class,
        TERMINATION_FINALIZER,
        referenced,
    )
    .await?;
    if class.metadata.deletion_timestamp.is_some() {
        return Ok(());
    }
    let profile = state.profiles.get(&class.spec.join_profile_ref.name);
    let profile_version = profile.and_then(|p| p.metadata.resource_version.clone());
    if let Some((seen, _)) = state.readiness.get(name)
        && (seen.class_generation != class.metadata.generation
            || seen.profile_version != profile_version)
    {
        // An edited class or profile starts with a clean launch record (S63).
        state.ctx.launches.forget(name);
    }
    let pause = state.ctx.launches.paused(name, state.ctx.clock.now());
    let inputs = ReadinessInputs {
        membership,
        class_generation: class.metadata.generation,
        profile_version,
        endpoint_error,
        pause,
    };
    let (ok, why, message) = match state.readiness.get(name) {
        Some((seen, verdict)) if *seen == inputs => verdict.clone(),
        _ => {
            // Only a membership change pays for a look at every host.
            let verdict = readiness_with(
                &class,
                profile,
                &state.ctx.hosts.snapshot(),
                inputs.endpoint_error.as_deref(),
                inputs.pause.as_ref(),
            );
            state
                .readiness
                .insert(name.to_string(), (inputs, verdict.clone()));
            verdict
        }
    };
    let mut updated = class.clone();
    let status = updated.status.get_or_insert_with(Default::default);
    upsert_condition(
        &mut status.conditions,
        "Ready",
        ok,
        why,
        &message,
        &state.ctx.clock,
    );
    status.observed_generation = class.metadata.generation;
    if updated.status != class.status {
        let stored = state.ctx.cluster.replace_status(&updated).await?;
        state.classes.insert(name.to_string(), stored);
        let before = ready_reason(&class);
        if !ok && before.as_deref() != Some(why) {
            // One event per change of reason: a class that stops launching says why.
            tracing::info!(nodeclass = %name, reason = why, %message, "node class not Ready");
            crate::k8s::events::record(
                &state.ctx.cluster,
                &updated,
                crate::k8s::EventType::Warning,
                why,
                message.clone(),
            )
            .await;
        }
    }
    Ok(())
}

/// The reason of the class's Ready condition, if it has one.
fn ready_reason(class: &SSHNodeClass) -> Option<String> {
    class
        .status
        .as_ref()?
        .conditions
        .iter()
        .find(|c| c.type_ == "Ready")
        .map(|c| c.reason.clone())
}

/// Profiles named by any host's install marker keep a finalizer.
async fn reconcile_profiles<C: Cluster, T: Transport>(
    state: &NodeClassState<C, T>,
) -> Result<(), ClusterError> {
    for (name, profile) in &state.profiles {
        let mut in_use = state.ctx.hosts.profile_in_use(name);
        // A shard sees only its own hosts: before it drops the finalizer, hosts of the other
        // shards are asked about too (rare: only a profile going out of use gets here).
        let held =
            (profile.metadata.finalizers.iter().flatten()).any(|f| f == TERMINATION_FINALIZER);
        if !in_use && held && state.ctx.shard.is_sharded() {
            let hosts: Vec<crate::api::SSHHost> = state
                .ctx
                .cluster
                .list(Some(state.ctx.pool_ns()), None)
                .await?;
            in_use = hosts
                .iter()
                .any(|h| crate::provider::context::installed_profile(h) == Some(name.as_str()));
        }
        finalizers::set(&state.ctx.cluster, profile, TERMINATION_FINALIZER, in_use).await?;
    }
    Ok(())
}
