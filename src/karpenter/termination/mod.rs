//! Termination (S40, S44, S45): a NodeClaim of ours that is being deleted, or that disruption
//! marked, has its Node tainted `karpenter.sh/disrupted:NoSchedule` and drained as core drains
//! it: group by group ([`order`]), each pod through the Eviction API (PDB refusals retried
//! with backoff; `karpenter.sh/do-not-disrupt` pods never evicted). With a
//! `terminationGracePeriod` the deadline is persisted on the claim ([`deadline`]); each pod
//! still there is deleted its own grace period before it, and at the deadline the drain is
//! over whatever is left. Without one the drain waits as long as a PDB or a do-not-disrupt pod
//! holds it. A drained NodeClaim is annotated [`DRAINED_ANNOTATION`]; a marked one is then
//! deleted, and the router runs leave, deletes the Node and releases the host.

pub mod deadline;
pub mod order;

use std::collections::BTreeMap;
use std::time::Duration;

use jiff::Timestamp;
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
use deadline::{Recorded, TERMINATION_TIMESTAMP_ANNOTATION};

/// The label core puts on a draining Node so that load balancers stop sending it traffic.
pub const EXCLUDE_BALANCERS_LABEL: &str = "node.kubernetes.io/exclude-from-external-load-balancers";

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

/// A Karpenter duration field (`"30s"`, `"1h30m"`, `"720h"`, Go's grammar); `None` for
/// `Never` or garbage.
pub fn parse_duration(s: &str) -> Option<Duration> {
    crate::api::duration::karpenter(s)
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

/// Taint the Node and label it out of load balancers, in one CAS patch (idempotent).
async fn prepare_node<C: Cluster>(cluster: &C, node: &Node) -> Result<(), ClusterError> {
    let mut taints = node
        .spec
        .as_ref()
        .and_then(|s| s.taints.clone())
        .unwrap_or_default();
    let tainted = taints.iter().any(|t| t.key == DISRUPTED_TAINT_KEY);
    let labelled =
        (node.metadata.labels.as_ref()).is_some_and(|l| l.contains_key(EXCLUDE_BALANCERS_LABEL));
    if tainted && labelled {
        return Ok(());
    }
    if !tainted {
        taints.push(disrupted_taint());
    }
    let name = node.metadata.name.clone().unwrap_or_default();
    let patch = json!({
        "metadata": {
            "resourceVersion": node.metadata.resource_version,
            "labels": {EXCLUDE_BALANCERS_LABEL: "karpenter"},
        },
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
        // The drain step of the claim's lifecycle trace (closed when drained or released).
        self.ctx.lifecycles.open(&uid, "drain");
        let (node, on_node) = {
            let st = self.state.read();
            // By status.nodeName or provider ID: an adopted Node has a name of its own (S53).
            let node = st.node_of(nc).cloned();
            let on_node: Vec<Pod> = match &node {
                Some(n) => {
                    let nn = n.metadata.name.clone().unwrap_or_default();
                    st.pods_on(&nn).cloned().collect()
                }
                None => vec![],
            };
            (node, on_node)
        };
        if let Some(node) = &node {
            prepare_node(&self.ctx.cluster, node).await?;
        }
        let deadline = self.deadline(nc).await?;
        let now = self.ctx.clock.now();
        let on_node: Vec<&Pod> = on_node.iter().collect();
        if let Some(d) = deadline {
            self.delete_expiring(nc, &on_node, d, now).await?;
        }
        let expired = deadline.is_some_and(|d| now >= d);
        let current = order::current(&on_node, now);
        if !expired && !current.is_empty() {
            for p in current.iter().filter(|p| pods::is_evictable(p, now)) {
                self.evict(p).await?;
            }
            return Ok(());
        }
        // Drained, or the grace period is over: whatever is left does not hold the node.
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
        for p in &on_node {
            if let Some(puid) = p.metadata.uid.as_deref() {
                self.backoff.remove(puid);
            }
        }
        let (reason, msg) = if current.is_empty() {
            ("Drained", "node drained".to_string())
        } else {
            (
                "TerminationGracePeriodElapsed",
                format!(
                    "terminationGracePeriod over: {} pods still on the node no longer hold it",
                    current.len()
                ),
            )
        };
        events::record(&self.ctx.cluster, nc, EventType::Normal, reason, msg).await;
        if !deleting {
            self.ctx
                .cluster
                .delete::<NodeClaim>(None, &name, None)
                .await?;
        }
        Ok(())
    }

    /// The claim's deadline: recorded, else recorded now when it has a grace period (S44).
    async fn deadline(&self, nc: &NodeClaim) -> Result<Option<Timestamp>, KarpenterError> {
        let name = nc.metadata.name.clone().unwrap_or_default();
        match deadline::recorded(nc) {
            Recorded::At(t) => return Ok(Some(t)),
            Recorded::None => {}
            Recorded::Invalid(text) => {
                let msg = format!(
                    "annotation {TERMINATION_TIMESTAMP_ANNOTATION}={text:?} is not an RFC 3339 \
                     time; {}",
                    if nc.spec.termination_grace_period.is_some() {
                        "replaced by the deadline from terminationGracePeriod"
                    } else {
                        "ignored (no terminationGracePeriod); remove it or set a time"
                    }
                );
                events::record(
                    &self.ctx.cluster,
                    nc,
                    EventType::Warning,
                    "InvalidTerminationTimestamp",
                    msg,
                )
                .await;
            }
        }
        let Some(due) = deadline::due(nc, self.ctx.clock.now()) else {
            return Ok(None);
        };
        // A CAS: a deadline someone recorded meanwhile wins, and is read on the next pass.
        let patch = json!({"metadata": {
            "resourceVersion": nc.metadata.resource_version,
            "annotations": {TERMINATION_TIMESTAMP_ANNOTATION: deadline::format(due)},
        }});
        let written = self
            .ctx
            .cluster
            .patch::<NodeClaim>(None, &name, &patch)
            .await?;
        self.state.observe_claim(written);
        let msg = format!(
            "terminationGracePeriod: the node goes by {} whatever its pods",
            deadline::format(due)
        );
        events::record(
            &self.ctx.cluster,
            nc,
            EventType::Normal,
            "TerminationGracePeriodExpiring",
            msg,
        )
        .await;
        Ok(Some(due))
    }

    /// Core's pod deletion decorator: a pod still on the node is deleted once only its own
    /// terminationGracePeriodSeconds is left before the deadline, with what is left of it as
    /// its grace, PDBs and do-not-disrupt notwithstanding.
    async fn delete_expiring(
        &self,
        nc: &NodeClaim,
        on_node: &[&Pod],
        deadline: Timestamp,
        now: Timestamp,
    ) -> Result<(), KarpenterError> {
        let due = on_node.iter().filter(|p| {
            pods::is_waiting_eviction(p, now)
                && !pods::is_terminating(p)
                && now >= deadline::pod_delete_at(deadline, pods::termination_grace(p))
        });
        for p in due {
            let pns = p.metadata.namespace.clone().unwrap_or_default();
            let pname = p.metadata.name.clone().unwrap_or_default();
            let grace = deadline::remaining_seconds(deadline, now);
            self.ctx.cluster.delete_pod(&pns, &pname, grace).await?;
            let msg = format!(
                "pod {pns}/{pname} deleted with {grace}s grace: the NodeClaim's \
                 terminationGracePeriod ends at {}",
                deadline::format(deadline)
            );
            events::record(
                &self.ctx.cluster,
                nc,
                EventType::Warning,
                "PodDeletedForTerminationGracePeriod",
                msg,
            )
            .await;
        }
        Ok(())
    }

    /// One eviction, unless a PDB refused the last one too recently.
    async fn evict(&mut self, p: &Pod) -> Result<(), KarpenterError> {
        let pns = p.metadata.namespace.clone().unwrap_or_default();
        let pname = p.metadata.name.clone().unwrap_or_default();
        let puid = p.metadata.uid.clone().unwrap_or_default();
        if self
            .backoff
            .get(&puid)
            .is_some_and(|(next, _)| Instant::now() < *next)
        {
            return Ok(());
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
        // #23: a value past Duration's range is refused, not a panic (it was one).
        assert_eq!(parse_duration("5124100000000000h"), None);
        assert_eq!(parse_duration(&"9".repeat(400)), None);
        assert_eq!(parse_duration(&format!("{}s", "9".repeat(400))), None);
    }
}
