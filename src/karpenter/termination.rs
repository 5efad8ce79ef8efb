//! Termination (S40): a NodeClaim of ours that is being deleted, or that disruption marked,
//! has its Node tainted `karpenter.sh/disrupted:NoSchedule` and drained through the Eviction
//! API (PDB refusals retried with backoff; daemonset, mirror and finished pods skipped;
//! `karpenter.sh/do-not-disrupt` pods wait until `terminationGracePeriod` runs out, then are
//! deleted). A drained NodeClaim is annotated [`DRAINED_ANNOTATION`]; a marked one is then
//! deleted, and the router runs leave, deletes the Node and releases the host.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Node, Pod, Taint};
use serde_json::json;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use super::state::ClusterState;
use super::{DISRUPTION_ANNOTATION, DRAINED_ANNOTATION, KarpenterConfig, KarpenterError, pods};
use crate::actors::Context;
use crate::actors::events;
use crate::api::NodeClaim;
use crate::api::karpenter::DISRUPTED_TAINT_KEY;
use crate::k8s::{Cluster, ClusterError, EventType};
use crate::ssh::Transport;

pub fn spawn<C: Cluster, T: Transport>(
    ctx: Context<C, T>,
    state: ClusterState,
    cfg: KarpenterConfig,
) -> JoinHandle<()> {
    tokio::spawn(async move {
        let mut t = Terminator {
            ctx,
            state,
            cfg,
            backoff: BTreeMap::new(),
            started: BTreeMap::new(),
        };
        loop {
            tokio::time::sleep(t.cfg.reconcile_interval).await;
            // Only claims being terminated have work here; copy just those.
            let claims = t.state.terminating_claims();
            for nc in claims {
                if let Err(e) = t.reconcile(&nc).await {
                    tracing::debug!(nodeclaim = ?nc.metadata.name, error = %e, "termination retry");
                }
            }
        }
    })
}

pub fn is_marked(nc: &NodeClaim) -> bool {
    nc.metadata
        .annotations
        .as_ref()
        .is_some_and(|a| a.contains_key(DISRUPTION_ANNOTATION))
}

pub fn is_drained(nc: &NodeClaim) -> bool {
    nc.metadata
        .annotations
        .as_ref()
        .is_some_and(|a| a.contains_key(DRAINED_ANNOTATION))
}

/// Go-style duration (`"30s"`, `"1h30m"`, `"720h"`); `None` for `Never` or garbage.
pub fn parse_duration(s: &str) -> Option<Duration> {
    let s = s.trim();
    if s.is_empty() || s == "Never" {
        return None;
    }
    let mut total = 0f64;
    let mut num = String::new();
    let mut chars = s.chars().peekable();
    while let Some(c) = chars.next() {
        if c.is_ascii_digit() || c == '.' {
            num.push(c);
            continue;
        }
        let mut unit = c.to_string();
        if c == 'm' && chars.peek() == Some(&'s') {
            unit.push('s');
            chars.next();
        }
        let n: f64 = num.parse().ok()?;
        num.clear();
        total += n * match unit.as_str() {
            "h" => 3600.0,
            "m" => 60.0,
            "s" => 1.0,
            "ms" => 0.001,
            _ => return None,
        };
    }
    if !num.is_empty() {
        return None;
    }
    Some(Duration::from_secs_f64(total))
}

/// `karpenter.sh/disrupted:NoSchedule`.
pub fn disrupted_taint() -> Taint {
    Taint {
        key: DISRUPTED_TAINT_KEY.into(),
        value: None,
        effect: "NoSchedule".into(),
        time_added: None,
    }
}

/// Put the disrupted taint on a Node (idempotent).
pub async fn taint_node<C: Cluster>(cluster: &C, node: &Node) -> Result<(), ClusterError> {
    let mut taints = node
        .spec
        .as_ref()
        .and_then(|s| s.taints.clone())
        .unwrap_or_default();
    if taints.iter().any(|t| t.key == DISRUPTED_TAINT_KEY) {
        return Ok(());
    }
    taints.push(disrupted_taint());
    let name = node.metadata.name.clone().unwrap_or_default();
    let patch = json!({
        "metadata": {"resourceVersion": node.metadata.resource_version},
        "spec": {"taints": taints},
    });
    cluster.patch::<Node>(None, &name, &patch).await.map(|_| ())
}

struct Terminator<C: Cluster, T: Transport> {
    ctx: Context<C, T>,
    state: ClusterState,
    cfg: KarpenterConfig,
    /// Pod UID → (next attempt, current delay) after a PDB refusal.
    backoff: BTreeMap<String, (Instant, Duration)>,
    /// NodeClaim UID → when its drain started (for terminationGracePeriod).
    started: BTreeMap<String, Instant>,
}

impl<C: Cluster, T: Transport> Terminator<C, T> {
    #[tracing::instrument(skip_all, fields(nodeclaim = ?nc.metadata.name))]
    async fn reconcile(&mut self, nc: &NodeClaim) -> Result<(), KarpenterError> {
        let deleting = nc.metadata.deletion_timestamp.is_some();
        if !(deleting || is_marked(nc)) || is_drained(nc) {
            return Ok(());
        }
        let name = nc.metadata.name.clone().unwrap_or_default();
        let uid = nc.metadata.uid.clone().unwrap_or_default();
        let started = *self.started.entry(uid.clone()).or_insert_with(Instant::now);
        // The drain step of the claim's lifecycle trace (closed when drained or released).
        self.ctx.lifecycles.open(&uid, "drain");
        let (node, victims) = {
            let st = self.state.read();
            let node = st.node_of(nc).or_else(|| st.nodes.get(&name)).cloned();
            let victims: Vec<Pod> = match &node {
                Some(n) => {
                    let nn = n.metadata.name.clone().unwrap_or_default();
                    st.pods_on(&nn)
                        .filter(|p| pods::is_reschedulable(p))
                        .filter(|p| p.metadata.deletion_timestamp.is_none())
                        .cloned()
                        .collect()
                }
                None => vec![],
            };
            (node, victims)
        };
        if let Some(node) = &node {
            taint_node(&self.ctx.cluster, node).await?;
        }
        let grace = nc
            .spec
            .termination_grace_period
            .as_deref()
            .and_then(parse_duration);
        // The grace period runs from the deletion (restart-proof), or from the mark.
        let draining_for = match &nc.metadata.deletion_timestamp {
            Some(t) => self.ctx.clock.since(t.0),
            None => started.elapsed(),
        };
        let expired = grace.is_some_and(|g| draining_for >= g);
        for p in &victims {
            let pns = p.metadata.namespace.clone().unwrap_or_default();
            let pname = p.metadata.name.clone().unwrap_or_default();
            let puid = p.metadata.uid.clone().unwrap_or_default();
            if expired {
                // terminationGracePeriod ran out: PDBs and do-not-disrupt no longer hold.
                self.ctx
                    .cluster
                    .delete::<Pod>(Some(&pns), &pname, None)
                    .await?;
                continue;
            }
            if pods::do_not_disrupt(p) {
                continue;
            }
            if self
                .backoff
                .get(&puid)
                .is_some_and(|(next, _)| Instant::now() < *next)
            {
                continue;
            }
            match self.ctx.cluster.evict(&pns, &pname).await {
                Ok(_) => {
                    self.backoff.remove(&puid);
                }
                Err(ClusterError::TooManyRequests { message, .. }) => {
                    let delay = self
                        .backoff
                        .get(&puid)
                        .map_or(self.cfg.eviction_backoff, |(_, d)| {
                            (*d * 2).min(self.cfg.eviction_backoff_max)
                        });
                    self.backoff.insert(puid, (Instant::now() + delay, delay));
                    tracing::debug!(pod = %pname, %message, ?delay, "eviction refused");
                }
                Err(e) => return Err(e.into()),
            }
        }
        if !victims.is_empty() {
            return Ok(());
        }
        let patch = json!({"metadata": {"annotations": {DRAINED_ANNOTATION: "true"}}});
        match self
            .ctx
            .cluster
            .patch::<NodeClaim>(None, &name, &patch)
            .await
        {
            Ok(nc2) => {
                self.ctx.lifecycles.close(&uid, "drain", "success");
                self.state.observe_claim(nc2)
            }
            Err(e) if e.is_not_found() => {}
            Err(e) => return Err(e.into()),
        }
        self.started.remove(&uid);
        events::record(
            &self.ctx.cluster,
            nc,
            EventType::Normal,
            "Drained",
            "node drained",
        )
        .await;
        if !deleting {
            self.ctx
                .cluster
                .delete::<NodeClaim>(None, &name, None)
                .await?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn go_durations() {
        assert_eq!(parse_duration("30s"), Some(Duration::from_secs(30)));
        assert_eq!(parse_duration("1h30m"), Some(Duration::from_secs(5400)));
        assert_eq!(
            parse_duration("720h"),
            Some(Duration::from_secs(720 * 3600))
        );
        assert_eq!(parse_duration("Never"), None);
        assert_eq!(parse_duration("5"), None);
        assert_eq!(parse_duration("5x"), None);
    }
}
