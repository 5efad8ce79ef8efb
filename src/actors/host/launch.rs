//! Launch (S13–S22): the router claimed this host for a NodeClaim. Resolve and render
//! everything first — a configuration error never touches the host and mints no token — then
//! install when the marker is not current, record and mint the bootstrap token, and join.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{ConfigMap, Secret as KubeSecret};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use serde_json::json;
use tracing::Instrument;

use super::failure::{fail, fail_as};
use super::phases::{PhaseFailure, plan, run_phase, run_phase_cancellable};
use super::probe::write;
use super::registration::static_provider_id;
use super::{HostActorState, target};
use crate::actors::drift::nodeclass_hash;
use crate::actors::events;
use crate::actors::status::ProbeStamp;
use crate::api::karpenter::{ARCH_LABEL, CAPACITY_TYPE_LABEL, INSTANCE_TYPE_LABEL, OS_LABEL};
use crate::api::nodeclass::ProviderIdSource;
use crate::api::{
    ClaimRef, HostState, NODECLASS_HASH_ANNOTATION, NODECLASS_HASH_VERSION,
    NODECLASS_HASH_VERSION_ANNOTATION, NodeClaim, SSHHost, SSHJoinProfile, SSHNodeClass,
};
use crate::k8s::{Cluster, ClusterError, EventType};
use crate::karpenter::quantity;
use crate::profile::phase::{Phase, PhaseContext, Taint};
use crate::secret::Secret;
use crate::ssh::{Cancel, Transport};

pub use super::token::{BOOTSTRAP_GROUP, token_secret};

/// Everything a launch needs, resolved before the host is touched.
struct Plan {
    claim: NodeClaim,
    class: SSHNodeClass,
    profile: SSHJoinProfile,
    ctx: PhaseContext,
}

pub async fn run<C: Cluster, T: Transport>(state: &mut HostActorState<C, T>, claim: &ClaimRef) {
    // The router's claim write may not have reached us through the watch yet.
    if state.host.claim() != Some(claim) {
        let _ = state.refresh().await;
    }
    if state.host.claim() != Some(claim) {
        return;
    }
    let span = state.lifecycle_span(claim);
    match state.state() {
        HostState::Claimed => traced(state, claim).instrument(span).await,
        HostState::InUse => registered_unreported(state, claim).instrument(span).await,
        _ => {}
    }
}

/// S20: a launch cut short (a restart) after its join, whose Node registered before the
/// launch was resumed: the host is InUse, the NodeClaim not yet Launched. Report it now, or
/// the NodeClaim would never be Launched (random sweep seeds 6633, 6738).
async fn registered_unreported<C: Cluster, T: Transport>(
    state: &mut HostActorState<C, T>,
    claim: &ClaimRef,
) {
    match resolve(state, claim).await {
        // Launched already (resolve says so with None), or gone.
        Ok(None) => {}
        Ok(Some(plan)) => {
            let nodepool = crate::telemetry::lifecycle::nodepool_of(&plan.claim);
            tracing::info!(host = %state.key(), nodeclaim = %claim.name, "resumed launch: the Node registered; reporting the NodeClaim launched");
            report_joined(state, &plan, claim, nodepool).await;
        }
        // The host is in use: a configuration error now is no launch failure of it.
        Err(f) => {
            tracing::warn!(host = %state.key(), nodeclaim = %claim.name, error = %f.message, "resumed launch: the NodeClaim could not be reported launched")
        }
    }
}

/// The launch inside the claim's lifecycle span.
async fn traced<C: Cluster, T: Transport>(state: &mut HostActorState<C, T>, claim: &ClaimRef) {
    let plan = match resolve(state, claim).await {
        Ok(Some(p)) => p,
        Ok(None) => return,
        Err(f) => return fail(state, claim, None, f).await,
    };
    let nodepool = crate::telemetry::lifecycle::nodepool_of(&plan.claim);
    if !nodepool.is_empty() {
        tracing::Span::current().record("nodepool", nodepool);
    }
    let nodeclaim = plan.claim.clone();
    match launch(state, &plan).await {
        // The NodeClaim was force-deleted while the join ran (S26): release now, with its
        // token (S27), rather than at the next probe, a whole probe interval later.
        Ok(Launch::Joined)
            if super::registration::release_if_stale(state)
                .await
                .unwrap_or(false) =>
        {
            return;
        }
        // The join was stopped because its NodeClaim went (S26): no failure of the host's.
        // A vanished claim is released here with its token (S27; if the API refuses, the
        // router's probe, queued behind this launch, tries again); a claim being deleted
        // gets its Release, queued too.
        Ok(Launch::Aborted) => {
            tracing::info!(host = %state.key(), nodeclaim = %claim.name, "join stopped: its NodeClaim is gone or being deleted");
            if let Err(e) = super::registration::release_if_stale(state).await {
                tracing::warn!(host = %state.key(), error = %e, "stale claim not released; the next probe retries");
            }
            return;
        }
        Ok(Launch::Joined) => {
            let class = plan.claim.spec.node_class_ref.name.clone();
            let now = state.ctx.clock.now();
            (state.ctx.launches).record(&class, crate::actors::launches::Outcome::succeeded(), now);
            tracing::info!(host = %state.key(), nodeclaim = %claim.name, "launched; waiting for the Node to register");
        }
        // The NodeClaim went away while the launch waited: its release (queued) or the stale
        // claim check of the next probe frees the host.
        Ok(Launch::Unwanted) => return,
        Err(f) => return fail(state, claim, Some(&nodeclaim), f).await,
    }
    report_joined(state, &plan, claim, nodepool).await;
}

/// Joined: the host is attached (and billed) until its claim ends; the NodeClaim says so.
async fn report_joined<C: Cluster, T: Transport>(
    state: &mut HostActorState<C, T>,
    plan: &Plan,
    claim: &ClaimRef,
    nodepool: &str,
) {
    let vcpus = host_capacity(state, plan)
        .get("cpu")
        .and_then(quantity::parse)
        .map_or(0.0, |milli| milli as f64 / 1000.0);
    state.ctx.metrics.attach(
        &claim.uid,
        crate::actors::metrics::Billing {
            nodepool: nodepool.to_string(),
            vcpus,
            price_per_cpu_hour: plan.class.spec.price_per_cpu_hour.parse().unwrap_or(0.0),
        },
    );
    for attempt in 1..=5u32 {
        match report_launched(state, plan).await {
            Ok(()) => break,
            Err(e) => {
                tracing::warn!(host = %state.key(), error = %e, attempt, "launched, but the NodeClaim status was not written");
                tokio::time::sleep(state.ctx.config.retry_base * attempt).await;
            }
        }
    }
}

/// How a launch that did not fail ended.
#[derive(Debug, PartialEq, Eq)]
enum Launch {
    Joined,
    /// The NodeClaim was gone or being deleted by the time its turn came: no host is touched
    /// for a claim nobody wants any more.
    Unwanted,
    /// The join was killed because its NodeClaim went meanwhile ([`super::abort`]).
    Aborted,
}

/// Install and join under one phase slot.
async fn launch<C: Cluster, T: Transport>(
    state: &mut HostActorState<C, T>,
    plan: &Plan,
) -> Result<Launch, PhaseFailure> {
    let waiting = tokio::time::Instant::now();
    state.launch_slot = Some(state.ctx.limits.phase_slot().await);
    state.ctx.metrics.limiter_waited("phase", waiting.elapsed());
    let result = install_and_join(state, plan).await;
    state.launch_slot = None;
    result
}

/// The NodeClaim of the plan still exists with its UID and is not being deleted.
async fn still_wanted<C: Cluster, T: Transport>(
    state: &HostActorState<C, T>,
    plan: &Plan,
) -> Result<bool, PhaseFailure> {
    let Some(claim) = plan_claim_ref(plan) else {
        return Ok(false);
    };
    super::abort::wanted(&state.ctx, &claim)
        .await
        .map_err(api_failure)
}

async fn install_and_join<C: Cluster, T: Transport>(
    state: &mut HostActorState<C, T>,
    plan: &Plan,
) -> Result<Launch, PhaseFailure> {
    if !still_wanted(state, plan).await? {
        return Ok(Launch::Unwanted);
    }
    let ns = state.ctx.pool_ns().to_string();
    let target = target::host_target(&state.ctx.cluster, &ns, &state.host)
        .await
        .map_err(|e| PhaseFailure::config(e.to_string()))?;
    let marker = plan.profile.marker();
    let installed = state
        .host
        .status
        .as_ref()
        .and_then(|s| s.installed_profile.clone());
    let warm = installed.as_deref() == Some(marker.as_str());
    tracing::Span::current().record("warm", warm);
    if !warm {
        run_phase(state, &target, &plan.profile, Phase::Install, &plan.ctx).await?;
        write_held(state, plan, |s| s.installed_profile = Some(marker.clone()))
            .await
            .map_err(api_failure)?;
    }
    if !warm && !still_wanted(state, plan).await? {
        return Ok(Launch::Unwanted);
    }
    super::registration::leave_stale_kubelet(state, &target, &plan.claim).await?;
    let token = super::token::token(state).await.map_err(api_failure)?;
    let mut ctx = plan.ctx.clone();
    ctx.bootstrap_token = Some(token);
    let claim = plan_claim_ref(plan)
        .ok_or_else(|| PhaseFailure::config("NodeClaim without a name or UID"))?;
    let stop = tokio_util::sync::CancellationToken::new();
    let join = run_phase_cancellable(
        state,
        &target,
        &plan.profile,
        Phase::Join,
        &ctx,
        Cancel::new(stop.clone()),
    );
    match super::abort::while_wanted(&state.ctx, &claim, &stop, join).await {
        (Err(_), true) => return Ok(Launch::Aborted),
        (result, _) => result?,
    }
    let provider_id = (!ctx.provider_id.is_empty()).then(|| ctx.provider_id.clone());
    let adopt = provider_id.is_none();
    write_held(state, plan, |s| s.provider_id = provider_id.clone())
        .await
        .map_err(api_failure)?;
    if adopt {
        // S21: the Node must show up (by InternalIP) before the deadline, or the host leaves.
        let me = state.myself.clone();
        let after = state.ctx.config.adopt_timeout;
        let claim = plan_claim_ref(plan);
        let metrics = state.ctx.metrics.clone();
        tokio::spawn(async move {
            tokio::time::sleep(after).await;
            if let Some(c) = claim
                && me.send_message(super::HostMsg::AdoptDeadline(c)).is_ok()
            {
                metrics.mailbox_in("host");
            }
        });
    }
    Ok(Launch::Joined)
}

/// Record a launch step on the host. A conflict (a probe or the router wrote first) is
/// retried on the fresh object as long as the host still holds this claim: after a join
/// that succeeded, a lost CAS must not fail the launch.
async fn write_held<C: Cluster, T: Transport>(
    state: &mut HostActorState<C, T>,
    plan: &Plan,
    change: impl Fn(&mut crate::api::SSHHostStatus),
) -> Result<(), ClusterError> {
    let claim = plan_claim_ref(plan);
    let mut attempt = 0;
    loop {
        match write(state, ProbeStamp::Keep, &change).await {
            Err(e) if e.is_conflict() && attempt < 3 => {
                attempt += 1;
                state.refresh().await?;
                if state.host.claim() != claim.as_ref() || state.state() != HostState::Claimed {
                    return Err(e);
                }
            }
            other => return other,
        }
    }
}

fn plan_claim_ref(plan: &Plan) -> Option<ClaimRef> {
    Some(ClaimRef {
        name: plan.claim.metadata.name.clone()?,
        uid: plan.claim.metadata.uid.clone()?,
    })
}

/// S21: no Node was adopted in time. Run leave so no kubelet stays behind, then release the
/// host and fail the NodeClaim.
pub async fn adopt_deadline<C: Cluster, T: Transport>(
    state: &mut HostActorState<C, T>,
    claim: &ClaimRef,
) {
    let _ = state.refresh().await;
    let waiting = state.host.claim() == Some(claim)
        && state.state() == HostState::Claimed
        && state
            .host
            .status
            .as_ref()
            .and_then(|s| s.provider_id.as_ref())
            .is_none();
    if !waiting {
        return;
    }
    let span = state.lifecycle_span(claim);
    let left = super::registration::leave(state)
        .instrument(span.clone())
        .await;
    let message = format!(
        "{}: no Node with InternalIP {} and a provider ID appeared within {:?} (providerIDSource Adopt); leave {}",
        state.key(),
        state.host.node_address(),
        state.ctx.config.adopt_timeout,
        if left.is_ok() { "ran" } else { "failed" }
    );
    let failure = PhaseFailure {
        message,
        touched_host: left.is_err(),
        ..PhaseFailure::default()
    };
    fail_as(state, claim, None, failure, Some("registration"))
        .instrument(span)
        .await;
}

fn api_failure(e: ClusterError) -> PhaseFailure {
    PhaseFailure::touched(e.to_string())
}

/// Resolve node class, profile, secrets and endpoint, and render every phase once with a
/// placeholder token, so that any configuration error surfaces before the host is touched.
async fn resolve<C: Cluster, T: Transport>(
    state: &mut HostActorState<C, T>,
    claim: &ClaimRef,
) -> Result<Option<Plan>, PhaseFailure> {
    let cluster = state.ctx.cluster.clone();
    let cfg = |e: ClusterError| PhaseFailure::config(e.to_string());
    let nodeclaim: Option<NodeClaim> = cluster.get(None, &claim.name).await.map_err(cfg)?;
    let Some(nodeclaim) = nodeclaim.filter(|n| n.metadata.uid.as_deref() == Some(&claim.uid))
    else {
        // S26: the claim is stale; the probe path releases it.
        let _ = super::registration::release_if_stale(state).await;
        return Ok(None);
    };
    if launched(&nodeclaim) {
        // A duplicate Launch (router restart): the join already succeeded.
        return Ok(None);
    }
    let class_name = nodeclaim.spec.node_class_ref.name.clone();
    let class: SSHNodeClass = cluster
        .get(None, &class_name)
        .await
        .map_err(cfg)?
        .ok_or_else(|| PhaseFailure::config(format!("SSHNodeClass {class_name} not found")))?;
    let profile_name = class.spec.join_profile_ref.name.clone();
    let profile: SSHJoinProfile = cluster.get(None, &profile_name).await.map_err(cfg)?.ok_or_else(|| {
        PhaseFailure::config(format!(
            "SSHJoinProfile {profile_name} (spec.joinProfileRef of SSHNodeClass {class_name}) not found"
        ))
    })?;
    let secrets = join_secrets(state, &class).await?;
    let (endpoint, ca) = cluster_endpoint(&cluster, &class).await?;
    let ns = state.ctx.pool_ns().to_string();
    let provider_id = match class.spec.provider_id_source {
        ProviderIdSource::Static => static_provider_id(&ns, &state.name),
        ProviderIdSource::Adopt => String::new(),
    };
    let ctx = PhaseContext {
        cluster_endpoint: endpoint,
        cluster_ca_b64: ca,
        bootstrap_token: None,
        node_name: claim.name.clone(),
        provider_id,
        node_labels: node_labels(&nodeclaim, &state.host, arch(state)),
        taints: taints(&nodeclaim),
        host_address: state.host.spec.address.clone(),
        node_address: state.host.node_address().to_string(),
        vars: class.spec.vars.clone().unwrap_or_default(),
        secrets,
    };
    let mut dry = ctx.clone();
    dry.bootstrap_token = Some(Secret::new("abcdef.0123456789abcdef"));
    let now = state.ctx.clock.now();
    for phase in [Phase::Install, Phase::Join, Phase::Leave] {
        plan(
            &state.host,
            &profile,
            phase,
            &dry,
            now,
            state.ctx.config.verified,
        )?;
    }
    Ok(Some(Plan {
        claim: nodeclaim,
        class,
        profile,
        ctx,
    }))
}

fn launched(nc: &NodeClaim) -> bool {
    nc.status.as_ref().is_some_and(|s| {
        s.conditions
            .iter()
            .any(|c| c.type_ == "Launched" && c.status == "True")
    })
}

fn arch<C: Cluster, T: Transport>(state: &HostActorState<C, T>) -> String {
    state
        .host
        .status
        .as_ref()
        .and_then(|s| s.observed_arch.clone())
        .unwrap_or_else(|| "amd64".into())
}

/// The claim's labels, the host's topology labels (its zone — `pool` without one —, rack or
/// custom labels, S56) and the class's well-known labels.
fn node_labels(nc: &NodeClaim, host: &SSHHost, arch: String) -> BTreeMap<String, String> {
    let class = host.class();
    let mut labels = nc.metadata.labels.clone().unwrap_or_default();
    labels.extend(crate::actors::router::instance_types::topology_labels(host));
    // A class split by architecture is offered as `<class>-<arch>`; the claim asked for that
    // (one of the types it lists, S55).
    let split = format!("{class}-{arch}");
    let asked = crate::karpenter::provisioning::claim_types(nc);
    let ty = if asked.contains(&split) {
        split
    } else {
        class.to_string()
    };
    labels.insert(INSTANCE_TYPE_LABEL.into(), ty);
    labels.insert(ARCH_LABEL.into(), arch);
    labels.insert(OS_LABEL.into(), "linux".into());
    labels.insert(CAPACITY_TYPE_LABEL.into(), "on-demand".into());
    labels
}

fn taints(nc: &NodeClaim) -> Vec<Taint> {
    nc.spec
        .taints
        .iter()
        .chain(nc.spec.startup_taints.iter())
        .map(|t| Taint {
            key: t.key.clone(),
            value: t.value.clone().unwrap_or_default(),
            effect: t.effect.clone(),
        })
        .collect()
}

/// `joinSecretRef`'s keys and values (S14), read only at join time.
async fn join_secrets<C: Cluster, T: Transport>(
    state: &HostActorState<C, T>,
    class: &SSHNodeClass,
) -> Result<BTreeMap<String, Secret>, PhaseFailure> {
    let Some(r) = &class.spec.join_secret_ref else {
        return Ok(BTreeMap::new());
    };
    let ns = state.ctx.pool_ns();
    let secret: KubeSecret = state
        .ctx
        .cluster
        .get(Some(ns), &r.name)
        .await
        .map_err(|e| PhaseFailure::config(e.to_string()))?
        .ok_or_else(|| {
            PhaseFailure::config(format!(
                "Secret {ns}/{} (spec.joinSecretRef of SSHNodeClass {}) not found",
                r.name,
                class.metadata.name.as_deref().unwrap_or_default()
            ))
        })?;
    Ok(secret
        .data
        .unwrap_or_default()
        .into_iter()
        .map(|(k, v)| (k, Secret::new(String::from_utf8_lossy(&v.0).into_owned())))
        .collect())
}

/// S22: `spec.cluster` wins, else `kube-public/cluster-info`; neither is a configuration error.
pub async fn cluster_endpoint<C: Cluster>(
    cluster: &C,
    class: &SSHNodeClass,
) -> Result<(String, String), PhaseFailure> {
    if let Some(c) = &class.spec.cluster {
        return Ok((c.endpoint.clone(), c.ca_bundle.clone().unwrap_or_default()));
    }
    let missing = || {
        PhaseFailure::config(format!(
            "no cluster endpoint: set spec.cluster on SSHNodeClass {} or publish kube-public/cluster-info",
            class.metadata.name.as_deref().unwrap_or_default()
        ))
    };
    let cm: Option<ConfigMap> = cluster
        .get(Some("kube-public"), "cluster-info")
        .await
        .map_err(|e| PhaseFailure::config(e.to_string()))?;
    let kubeconfig = cm
        .and_then(|c| c.data)
        .and_then(|d| d.get("kubeconfig").cloned())
        .ok_or_else(missing)?;
    let endpoint = crate::k8s::cluster_info::endpoint(&kubeconfig).map_err(|_| missing())?;
    Ok((endpoint.server, endpoint.ca_data))
}

/// Write the launch result onto the NodeClaim: provider ID, capacity, allocatable, labels and
/// the nodeclass hash annotations; Launched=True.
async fn report_launched<C: Cluster, T: Transport>(
    state: &mut HostActorState<C, T>,
    plan: &Plan,
) -> Result<(), ClusterError> {
    let cluster = state.ctx.cluster.clone();
    let name = plan.claim.metadata.name.clone().unwrap_or_default();
    let labels = node_labels(&plan.claim, &state.host, arch(state));
    let patch = json!({"metadata": {
        "labels": labels,
        "annotations": {
            NODECLASS_HASH_ANNOTATION: nodeclass_hash(&plan.class.spec),
            NODECLASS_HASH_VERSION_ANNOTATION: NODECLASS_HASH_VERSION,
        }
    }});
    let mut nc: NodeClaim = cluster.patch(None, &name, &patch).await?;
    let capacity = host_capacity(state, plan);
    let allocatable = allocatable(&capacity, &plan.class);
    let provider_id = state
        .host
        .status
        .as_ref()
        .and_then(|s| s.provider_id.clone());
    for _ in 0..5 {
        let waiting = awaiting_node(&nc, state);
        let status = nc.status.get_or_insert_with(Default::default);
        if provider_id.is_some() {
            status.provider_id = provider_id.clone();
        }
        status.capacity = capacity.clone();
        status.allocatable = allocatable.clone();
        upsert_condition(
            &mut status.conditions,
            "Launched",
            true,
            "Launched",
            "",
            &state.ctx.clock,
        );
        if let Some(waiting) = waiting {
            match status
                .conditions
                .iter_mut()
                .find(|c| c.type_ == "Registered")
            {
                // Registered already (a fast kubelet): keep it.
                Some(c) if c.status == "True" => {}
                Some(c) => *c = waiting,
                None => status.conditions.push(waiting),
            }
        }
        match cluster.replace_status(&nc).await {
            Ok(_) => break,
            Err(e) if e.is_conflict() => {
                nc = cluster.get(None, &name).await?.ok_or(e)?;
            }
            Err(e) => return Err(e),
        }
    }
    let msg = format!("{} joined as node {name}", state.key());
    events::record(
        &cluster,
        &*state.host,
        EventType::Normal,
        events::JOINED,
        msg,
    )
    .await;
    Ok(())
}

/// S64: Registered=Unknown while the join has run and the Node is awaited, with the deadline
/// after which the NodeClaim is given up (its creation plus the registration timeout, S37).
fn awaiting_node<C: Cluster, T: Transport>(
    nc: &NodeClaim,
    state: &HostActorState<C, T>,
) -> Option<Condition> {
    let created = nc.metadata.creation_timestamp.as_ref()?.0;
    let deadline =
        created + jiff::SignedDuration::try_from(state.ctx.config.registration_timeout).ok()?;
    let name = nc.metadata.name.as_deref().unwrap_or_default();
    let identity = match state
        .host
        .status
        .as_ref()
        .and_then(|s| s.provider_id.as_deref())
    {
        Some(id) => format!("Node {name} with providerID {id}"),
        None => format!("a Node with InternalIP {}", state.host.node_address()),
    };
    Some(Condition {
        type_: "Registered".into(),
        status: "Unknown".into(),
        reason: "AwaitingNode".into(),
        message: format!(
            "{} joined; waiting for {identity} to register, until {} (then the NodeClaim is deleted)",
            state.key(),
            deadline.strftime("%Y-%m-%dT%H:%M:%SZ")
        ),
        observed_generation: None,
        last_transition_time: Time(state.ctx.clock.now()),
    })
}

fn host_capacity<C: Cluster, T: Transport>(
    state: &HostActorState<C, T>,
    plan: &Plan,
) -> BTreeMap<String, Quantity> {
    let mut cap = state.host.spec.capacity.clone();
    if let Some(observed) = state
        .host
        .status
        .as_ref()
        .and_then(|s| s.observed_capacity.as_ref())
    {
        for (k, v) in observed {
            let lower = match (quantity::parse(v), cap.get(k).and_then(quantity::parse)) {
                (Some(o), Some(d)) => o < d,
                _ => false,
            };
            if lower {
                cap.insert(k.clone(), v.clone());
            }
        }
    }
    cap.insert(
        "pods".into(),
        Quantity(plan.class.spec.max_pods.to_string()),
    );
    cap
}

/// Capacity less kubeReserved (never below zero).
pub fn allocatable(
    capacity: &BTreeMap<String, Quantity>,
    class: &SSHNodeClass,
) -> BTreeMap<String, Quantity> {
    capacity
        .iter()
        .map(|(k, v)| {
            let reserved = class
                .spec
                .kube_reserved
                .get(k)
                .and_then(quantity::parse)
                .unwrap_or(0);
            let q = match quantity::parse(v) {
                Some(total) => {
                    let left = (total - reserved).max(0);
                    if k == "cpu" {
                        Quantity(quantity::format_cpu(left))
                    } else if k == "memory" || k == "ephemeral-storage" {
                        Quantity(quantity::format_bytes(left))
                    } else {
                        Quantity((left / 1000).to_string())
                    }
                }
                None => v.clone(),
            };
            (k.clone(), q)
        })
        .collect()
}

pub async fn set_launched<C: Cluster>(
    cluster: &C,
    nc: &NodeClaim,
    ok: bool,
    reason: &str,
    message: &str,
    clock: &crate::clock::Clock,
) -> Result<NodeClaim, ClusterError> {
    let mut nc = nc.clone();
    let status = nc.status.get_or_insert_with(Default::default);
    upsert_condition(
        &mut status.conditions,
        "Launched",
        ok,
        reason,
        message,
        clock,
    );
    cluster.replace_status(&nc).await
}

pub fn upsert_condition(
    conditions: &mut Vec<Condition>,
    type_: &str,
    ok: bool,
    reason: &str,
    message: &str,
    clock: &crate::clock::Clock,
) {
    let status = if ok { "True" } else { "False" };
    let cond = Condition {
        type_: type_.into(),
        status: status.into(),
        reason: reason.into(),
        message: message.into(),
        observed_generation: None,
        last_transition_time: Time(clock.now()),
    };
    match conditions.iter_mut().find(|c| c.type_ == type_) {
        Some(c) if c.status == status && c.reason == reason && c.message == message => {}
        Some(c) => {
            let keep_time = c.status == status;
            let t = c.last_transition_time.clone();
            *c = cond;
            if keep_time {
                c.last_transition_time = t;
            }
        }
        None => conditions.push(cond),
    }
}
