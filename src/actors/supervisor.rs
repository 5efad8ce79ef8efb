//! `Supervisor`: watches SSHHosts in the pool namespace and Nodes; keeps one host actor per
//! host, stops it on deletion, restarts it when it fails (its state is rebuilt from the API),
//! and forwards Node events to the host they belong to.

use std::collections::BTreeMap;
use std::marker::PhantomData;
use std::sync::Arc;

use futures::StreamExt;
use k8s_openapi::api::core::v1::Node;
use ractor::{Actor, ActorProcessingErr, ActorRef, RpcReplyPort};

use super::host::{HostMsg, HostRef, SeenVersion};
use crate::api::{HostState, SSHHost};
use crate::k8s::{Cluster, WatchEvent};
use crate::provider::Context;
use crate::ssh::Transport;

#[derive(Debug)]
pub enum SupervisorMsg {
    Host(Box<WatchEvent<Arc<SSHHost>>>),
    Node(Box<WatchEvent<Node>>),
    /// Deliver a message to a host's actor (used by the router).
    ToHost(String, HostMsg),
    /// Secrets in the pool namespace changed (by name; `relisted`: the watch restarted and
    /// these are all of them). Their hosts re-read the key, probe, and drop a launch backoff
    /// recorded against an older Secret (S63).
    Secrets {
        names: Vec<String>,
        relisted: bool,
    },
    /// SSHNodeClasses changed (sharded controllers only, `--node-classes`): which hosts are
    /// this shard's may have changed.
    Class(Box<WatchEvent<crate::api::SSHNodeClass>>),
    /// A watch stream ended or failed; it is restarted by its task.
    WatchError(String),
    /// A host actor panicked (`epoch` tells it from a later actor of the same host).
    HostFailed {
        name: String,
        epoch: u64,
        error: String,
    },
    /// Shutdown: stop every host actor (each finishes the message in hand) and hand back
    /// their tasks, to be awaited within the grace period.
    StopHosts(RpcReplyPort<Vec<tokio::task::JoinHandle<()>>>),
}

pub struct Supervisor<C: Cluster, T: Transport> {
    _ports: PhantomData<fn() -> (C, T)>,
}

impl<C: Cluster, T: Transport> Default for Supervisor<C, T> {
    fn default() -> Self {
        Supervisor {
            _ports: PhantomData,
        }
    }
}

/// A running host actor and the newest host version it holds. Dropped with the supervisor's
/// state when the supervisor is killed (a crash), it aborts the actor's task: a killed
/// controller's host actors die with it, mid-phase included. A stopped supervisor stops its
/// hosts gracefully first and lets their tasks finish ([`HostHandle::detach`]).
struct HostHandle {
    actor: HostRef,
    seen: SeenVersion,
    /// Which actor of this host it is (a restarted one gets a new epoch).
    epoch: u64,
    task: Option<tokio::task::JoinHandle<()>>,
}

impl HostHandle {
    /// Stop the actor after the message in hand and let its task run to its end.
    fn detach(mut self) -> Option<tokio::task::JoinHandle<()>> {
        self.actor.stop();
        self.task.take()
    }
}

impl Drop for HostHandle {
    fn drop(&mut self) {
        if let Some(task) = &self.task {
            task.abort();
        }
    }
}

pub struct SupervisorState<C: Cluster, T: Transport> {
    pub(super) ctx: Context<C, T>,
    actors: BTreeMap<String, HostHandle>,
    /// The epoch of the next host actor started.
    epoch: u64,
    watches: Vec<tokio::task::JoinHandle<()>>,
    /// Sharded only: every SSHHost of the pool namespace, this shard's or not (a class
    /// change may move hosts in or out of the shard).
    pub(super) all: BTreeMap<String, Arc<SSHHost>>,
    /// Sharded only: hosts reported as selected by this shard's classes and another's, with
    /// the classes reported (reported again only when they change).
    pub(super) overlaps: BTreeMap<String, (Vec<String>, Vec<String>)>,
}

impl<C: Cluster, T: Transport> Actor for Supervisor<C, T> {
    type Msg = SupervisorMsg;
    type State = SupervisorState<C, T>;
    type Arguments = Context<C, T>;

    async fn pre_start(
        &self,
        myself: ActorRef<Self::Msg>,
        ctx: Context<C, T>,
    ) -> Result<Self::State, ActorProcessingErr> {
        let ns = ctx.pool_ns().to_string();
        let hosts = forward(
            ctx.cluster.watch_shared::<SSHHost>(Some(&ns)),
            myself.clone(),
            |e| SupervisorMsg::Host(Box::new(e)),
        );
        let nodes = forward(ctx.cluster.watch::<Node>(None), myself.clone(), |e| {
            SupervisorMsg::Node(Box::new(e))
        });
        let secrets = forward_secrets(
            ctx.cluster
                .watch::<k8s_openapi::api::core::v1::Secret>(Some(&ns)),
            myself.clone(),
        );
        let mut watches = vec![hosts, nodes, secrets];
        // Only a shard needs the classes here; an unsharded controller's watches (and the
        // simulation's traces) stay as they were.
        if ctx.shard.is_sharded() {
            // Read once before the first host list is handled, so that it is sorted into ours
            // and not ours at once rather than after the class watch's first list.
            match ctx
                .cluster
                .list::<crate::api::SSHNodeClass>(None, None)
                .await
            {
                Ok(classes) => ctx.shard.set_classes(&classes),
                Err(e) => tracing::warn!(error = %e, "SSHNodeClasses not listed; the watch will"),
            }
            watches.push(forward(
                ctx.cluster.watch::<crate::api::SSHNodeClass>(None),
                myself.clone(),
                |e| SupervisorMsg::Class(Box::new(e)),
            ));
        }
        Ok(SupervisorState {
            ctx,
            actors: BTreeMap::new(),
            epoch: 0,
            watches,
            all: BTreeMap::new(),
            overlaps: BTreeMap::new(),
        })
    }

    async fn post_stop(
        &self,
        _myself: ActorRef<Self::Msg>,
        state: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        for w in state.watches.drain(..) {
            w.abort();
        }
        for (_, h) in std::mem::take(&mut state.actors) {
            h.detach();
        }
        Ok(())
    }

    async fn handle(
        &self,
        myself: ActorRef<Self::Msg>,
        msg: Self::Msg,
        state: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        match msg {
            SupervisorMsg::Host(ev) => on_host_event(&myself, state, *ev).await,
            SupervisorMsg::Node(ev) => on_node_event(state, *ev),
            SupervisorMsg::ToHost(name, m) => {
                if let Some(h) = state.actors.get(&name)
                    && h.actor.send_message(m).is_ok()
                {
                    state.ctx.metrics.mailbox_in("host");
                }
            }
            SupervisorMsg::Secrets { names, relisted } => on_secrets(state, &names, relisted),
            SupervisorMsg::Class(ev) => super::shard::on_class_event(&myself, state, *ev).await,
            SupervisorMsg::WatchError(e) => tracing::warn!(error = %e, "watch error"),
            SupervisorMsg::HostFailed { name, epoch, error } => {
                if state.actors.get(&name).is_none_or(|h| h.epoch != epoch) {
                    return Ok(());
                }
                state.actors.remove(&name);
                tracing::error!(host = %name, error = %error, "host actor failed; restarting from API state");
                if let Some(host) = state.ctx.hosts.get(&name) {
                    spawn_host(&myself, state, Arc::new(host)).await;
                }
            }
            SupervisorMsg::StopHosts(reply) => {
                let tasks = std::mem::take(&mut state.actors)
                    .into_values()
                    .filter_map(HostHandle::detach)
                    .collect();
                state.ctx.metrics.host_actors.set(0);
                let _ = reply.send(tasks);
            }
        }
        Ok(())
    }
}

/// Pump a watch stream into the supervisor's mailbox.
fn forward<K: Send + 'static>(
    mut stream: crate::k8s::WatchStream<K>,
    to: ActorRef<SupervisorMsg>,
    wrap: fn(WatchEvent<K>) -> SupervisorMsg,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        while let Some(ev) = stream.next().await {
            let msg = match ev {
                Ok(ev) => wrap(ev),
                Err(e) => SupervisorMsg::WatchError(e.to_string()),
            };
            if to.send_message(msg).is_err() {
                return;
            }
        }
    })
}

/// Pump the pool namespace's Secret watch into the supervisor as names only: key material
/// never travels in a message.
fn forward_secrets(
    mut stream: crate::k8s::WatchStream<k8s_openapi::api::core::v1::Secret>,
    to: ActorRef<SupervisorMsg>,
) -> tokio::task::JoinHandle<()> {
    let name = |s: &k8s_openapi::api::core::v1::Secret| s.metadata.name.clone();
    tokio::spawn(async move {
        while let Some(ev) = stream.next().await {
            let msg = match ev {
                Ok(WatchEvent::Applied(s)) => SupervisorMsg::Secrets {
                    names: name(&s).into_iter().collect(),
                    relisted: false,
                },
                Ok(WatchEvent::Restarted(all)) => SupervisorMsg::Secrets {
                    names: all.iter().filter_map(name).collect(),
                    relisted: true,
                },
                // A deleted key Secret shows at the next probe (which fails and says so).
                Ok(WatchEvent::Deleted(_)) => continue,
                Err(e) => SupervisorMsg::WatchError(e.to_string()),
            };
            if to.send_message(msg).is_err() {
                return;
            }
        }
    })
}

/// Tell the hosts whose key (or bastion key) Secret changed. After a relist only hosts with
/// a launch backoff are told: they compare versions; the others have nothing to catch up on
/// that the next probe would not.
fn on_secrets<C: Cluster, T: Transport>(
    state: &SupervisorState<C, T>,
    names: &[String],
    relisted: bool,
) {
    let names: std::collections::BTreeSet<&str> = names.iter().map(String::as_str).collect();
    if relisted {
        state.ctx.keys.forget_all();
    } else {
        state
            .ctx
            .keys
            .forget(state.ctx.pool_ns(), names.iter().copied());
    }
    for host in state.ctx.hosts.snapshot() {
        let uses = names.contains(host.spec.ssh_key_secret_ref.name.as_str())
            || host
                .spec
                .proxy_jump
                .as_ref()
                .is_some_and(|j| names.contains(j.ssh_key_secret_ref.name.as_str()));
        let backing_off = host
            .status
            .as_ref()
            .is_some_and(|s| s.launch_backoff.is_some());
        if !uses || (relisted && !backing_off) {
            continue;
        }
        let Some(name) = host.metadata.name.as_deref() else {
            continue;
        };
        if let Some(h) = state.actors.get(name)
            && h.actor.send_message(HostMsg::SecretChanged).is_ok()
        {
            state.ctx.metrics.mailbox_in("host");
        }
    }
}

async fn on_host_event<C: Cluster, T: Transport>(
    myself: &ActorRef<SupervisorMsg>,
    state: &mut SupervisorState<C, T>,
    ev: WatchEvent<Arc<SSHHost>>,
) {
    let ev = match super::shard::filter_host_event(state, ev).await {
        Some(ev) => ev,
        None => return,
    };
    match ev {
        WatchEvent::Restarted(hosts) => {
            let keep: std::collections::BTreeSet<String> = hosts
                .iter()
                .filter_map(|h| h.metadata.name.clone())
                .collect();
            let gone: Vec<String> = state
                .actors
                .keys()
                .filter(|n| !keep.contains(*n))
                .cloned()
                .collect();
            for name in gone {
                stop_host(state, &name);
            }
            state.ctx.hosts.replace_all(hosts.clone());
            for h in hosts {
                upsert_host(myself, state, h).await;
            }
        }
        WatchEvent::Applied(h) => {
            state.ctx.hosts.upsert(h.clone());
            upsert_host(myself, state, h).await;
        }
        WatchEvent::Deleted(h) => {
            let name = h.metadata.name.clone().unwrap_or_default();
            state.ctx.hosts.remove(&name);
            stop_host(state, &name);
        }
    }
}

pub(super) async fn upsert_host<C: Cluster, T: Transport>(
    myself: &ActorRef<SupervisorMsg>,
    state: &mut SupervisorState<C, T>,
    host: Arc<SSHHost>,
) {
    let name = host.metadata.name.clone().unwrap_or_default();
    match state.actors.get(&name) {
        // Its own write echoed back, or a version it re-read: nothing new for the actor.
        Some(h) if h.seen.has(crate::provider::context::rv(&host)) => {}
        Some(h) => {
            if h.actor.send_message(HostMsg::Observed(host)).is_ok() {
                state.ctx.metrics.mailbox_in("host");
            }
        }
        None => spawn_host(myself, state, host).await,
    }
}

async fn spawn_host<C: Cluster, T: Transport>(
    myself: &ActorRef<SupervisorMsg>,
    state: &mut SupervisorState<C, T>,
    host: Arc<SSHHost>,
) {
    let name = host.metadata.name.clone().unwrap_or_default();
    let seen = SeenVersion::default();
    let epoch = state.epoch;
    state.epoch += 1;
    let supervisor = myself.clone();
    let failed_name = name.clone();
    let failed = move |error: String| {
        let _ = supervisor.send_message(SupervisorMsg::HostFailed {
            name: failed_name,
            epoch,
            error,
        });
    };
    let (actor, task) = super::host::spawn(state.ctx.clone(), host, seen.clone(), failed);
    let handle = HostHandle {
        actor,
        seen,
        epoch,
        task: Some(task),
    };
    state.actors.insert(name, handle);
    state.ctx.metrics.host_actors.set(state.actors.len() as i64);
}

pub(super) fn has_actor<C: Cluster, T: Transport>(
    state: &SupervisorState<C, T>,
    name: &str,
) -> bool {
    state.actors.contains_key(name)
}

pub(super) fn stop_host<C: Cluster, T: Transport>(state: &mut SupervisorState<C, T>, name: &str) {
    if let Some(h) = state.actors.remove(name) {
        // The SSHHost is deleted: the actor finishes the message in hand, then ends.
        h.detach();
        state.ctx.metrics.host_actors.set(state.actors.len() as i64);
    }
}

/// Route a Node to its host: Static provider ID `kpssh://<ns>/<host>`, else (Adopt) the
/// claimed host whose node address is the Node's InternalIP.
fn on_node_event<C: Cluster, T: Transport>(state: &SupervisorState<C, T>, ev: WatchEvent<Node>) {
    let addresses = &state.ctx.node_addresses;
    let nodes = match ev {
        WatchEvent::Applied(n) => {
            addresses.upsert(&n);
            vec![n]
        }
        WatchEvent::Restarted(ns) => {
            addresses.replace_all(&ns);
            ns
        }
        WatchEvent::Deleted(n) => {
            addresses.remove(n.metadata.name.as_deref().unwrap_or_default());
            return;
        }
    };
    let prefix = format!("kpssh://{}/", state.ctx.pool_ns());
    for node in nodes {
        let provider = node
            .spec
            .as_ref()
            .and_then(|s| s.provider_id.clone())
            .unwrap_or_default();
        let host = match provider.strip_prefix(&prefix) {
            Some(name) => Some(name.to_string()),
            None => adopt_candidate(state, &node),
        };
        if let Some(h) = host.and_then(|h| state.actors.get(&h))
            && h.actor
                .send_message(HostMsg::NodeSeen(Box::new(node)))
                .is_ok()
        {
            state.ctx.metrics.mailbox_in("host");
        }
    }
}

fn adopt_candidate<C: Cluster, T: Transport>(
    state: &SupervisorState<C, T>,
    node: &Node,
) -> Option<String> {
    let ips = crate::provider::context::internal_ips(node);
    state
        .ctx
        .hosts
        .snapshot()
        .into_iter()
        .find(|h| h.state() == HostState::Claimed && ips.iter().any(|ip| ip == h.node_address()))
        .and_then(|h| h.metadata.name.clone())
}

#[cfg(test)]
#[path = "supervisor_tests.rs"]
mod tests;
