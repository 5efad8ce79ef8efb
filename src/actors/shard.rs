//! The supervisor's side of sharding (`--node-classes`, [`crate::provider::shard`]): only the
//! hosts this shard's classes select get a host actor and enter the host view (which the
//! router chooses from and the instance types are computed from); a host selected by classes
//! of this shard and of another is left alone and reported. Without sharding nothing here
//! runs: every event passes through unchanged.

use std::sync::Arc;

use ractor::ActorRef;

use super::supervisor::{SupervisorMsg, SupervisorState, has_actor, stop_host, upsert_host};
use crate::api::{SSHHost, SSHNodeClass};
use crate::k8s::{Cluster, EventType, WatchEvent, events};
use crate::provider::shard::{Ownership, overlap_message};
use crate::ssh::Transport;

/// The part of a host event that concerns this shard, or `None` when nothing does. Hosts no
/// longer ours leave the view and lose their actor here.
pub(super) async fn filter_host_event<C: Cluster, T: Transport>(
    state: &mut SupervisorState<C, T>,
    ev: WatchEvent<Arc<SSHHost>>,
) -> Option<WatchEvent<Arc<SSHHost>>> {
    if !state.ctx.shard.is_sharded() {
        return Some(ev);
    }
    match ev {
        WatchEvent::Restarted(hosts) => {
            state.all = hosts
                .iter()
                .filter_map(|h| Some((h.metadata.name.clone()?, h.clone())))
                .collect();
            let mut ours = Vec::with_capacity(hosts.len());
            for h in hosts {
                if classify(state, &h).await {
                    ours.push(h);
                }
            }
            state.overlaps.retain(|n, _| state.all.contains_key(n));
            set_overlap_gauge(state);
            Some(WatchEvent::Restarted(ours))
        }
        WatchEvent::Applied(h) => {
            let name = h.metadata.name.clone().unwrap_or_default();
            state.all.insert(name.clone(), h.clone());
            let ours = classify(state, &h).await;
            set_overlap_gauge(state);
            if ours {
                Some(WatchEvent::Applied(h))
            } else {
                // Most writes seen here are another shard's hosts: the view is left as it is
                // (a removal bumps its membership, which makes every pass over it recount).
                if state.ctx.hosts.contains(&name) {
                    state.ctx.hosts.remove(&name);
                }
                stop_host(state, &name);
                None
            }
        }
        WatchEvent::Deleted(h) => {
            let name = h.metadata.name.clone().unwrap_or_default();
            state.all.remove(&name);
            state.overlaps.remove(&name);
            set_overlap_gauge(state);
            Some(WatchEvent::Deleted(h))
        }
    }
}

/// Whether `host` is this shard's; reports an overlap the first time it is seen (and again
/// when the classes involved change).
async fn classify<C: Cluster, T: Transport>(
    state: &mut SupervisorState<C, T>,
    host: &SSHHost,
) -> bool {
    let name = host.metadata.name.clone().unwrap_or_default();
    match state.ctx.shard.host(host) {
        Ownership::Ours => {
            state.overlaps.remove(&name);
            true
        }
        Ownership::NotOurs => {
            state.overlaps.remove(&name);
            false
        }
        Ownership::Overlap { ours, theirs } => {
            let pair = (ours, theirs);
            if state.overlaps.get(&name) != Some(&pair) {
                let msg = overlap_message(
                    &name,
                    state.ctx.pool_ns(),
                    &state.ctx.shard,
                    &pair.0,
                    &pair.1,
                );
                tracing::error!(host = %name, "{msg}");
                events::record(
                    &state.ctx.cluster,
                    host,
                    EventType::Warning,
                    events::SHARD_OVERLAP,
                    msg,
                )
                .await;
                state.overlaps.insert(name, pair);
            }
            false
        }
    }
}

fn set_overlap_gauge<C: Cluster, T: Transport>(state: &SupervisorState<C, T>) {
    state
        .ctx
        .metrics
        .shard_overlapping_hosts
        .set(i64::try_from(state.overlaps.len()).unwrap_or(i64::MAX));
}

/// A class changed: when a selection did, every host is classified again (hosts may enter or
/// leave the shard).
pub(super) async fn on_class_event<C: Cluster, T: Transport>(
    myself: &ActorRef<SupervisorMsg>,
    state: &mut SupervisorState<C, T>,
    ev: WatchEvent<SSHNodeClass>,
) {
    let shard = &state.ctx.shard;
    let changed = match &ev {
        WatchEvent::Restarted(all) => {
            shard.set_classes(all);
            true
        }
        WatchEvent::Applied(c) => {
            shard.upsert_class(c.metadata.name.as_deref().unwrap_or(""), Some(c))
        }
        WatchEvent::Deleted(c) => {
            shard.upsert_class(c.metadata.name.as_deref().unwrap_or(""), None)
        }
    };
    if !changed {
        return;
    }
    // Not a relist of the view: the view may hold newer versions (the actors' own writes)
    // than the last watch event; only hosts entering or leaving the shard are touched.
    let all: Vec<Arc<SSHHost>> = state.all.values().cloned().collect();
    for h in all {
        let name = h.metadata.name.clone().unwrap_or_default();
        let ours = classify(state, &h).await;
        match (ours, has_actor(state, &name)) {
            (true, false) => {
                state.ctx.hosts.upsert(h.clone());
                upsert_host(myself, state, h).await;
            }
            (false, true) => {
                state.ctx.hosts.remove(&name);
                stop_host(state, &name);
            }
            (false, false) => {
                if state.ctx.hosts.contains(&name) {
                    state.ctx.hosts.remove(&name);
                }
            }
            (true, true) => {}
        }
    }
    set_overlap_gauge(state);
}
