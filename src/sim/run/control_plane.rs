//! What kube-controller-manager does to Nodes and pods in a real cluster, at every step:
//!
//! - node lifecycle: a Node whose kubelet stopped posting status (its host is off, or its
//!   kubelet stopped, for the 40 s node-monitor grace period) or whose class is cut off by a
//!   partition fault goes `Ready=Unknown` (`NodeStatusUnknown`); `True` again once its kubelet
//!   runs and reaches the API. Repair, consolidation and the scheduler see what they would.
//! - pod GC: pods bound to a Node that no longer exists are deleted (their Deployment's
//!   ReplicaSet then brings them back pending).

use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

use super::Runner;
use crate::k8s::Cluster;
use crate::karpenter::lifecycle::node_ready;
use crate::karpenter::pods;
use crate::sim::kubelet::set_ready;
use crate::sim::world::POD_NAMESPACE;

/// kube-controller-manager's `--node-monitor-grace-period`.
const NODE_MONITOR_GRACE: Duration = Duration::from_secs(40);

impl Runner<'_> {
    /// Node lifecycle: write each Node's Ready condition where it no longer says the truth.
    pub(super) async fn node_lifecycle(&mut self, now: Duration) {
        // The Node each host runs (the last in name order, as a map by host would keep), and
        // whether that host's kubelet runs as that Node: vectors by host index, not maps, and
        // the mirror's Nodes walked beside `attached` (both in name order) rather than looked
        // up by name: this runs at every step over every attached Node.
        let mut node_of_host: Vec<Option<&str>> = vec![None; self.infos.len()];
        for (node, i) in &self.attached {
            if let Some(slot) = node_of_host.get_mut(*i) {
                *slot = Some(node.as_str());
            }
        }
        let mut up = vec![false; node_of_host.len()];
        for i in self.world.transport.filter_map_kubelet_running(|i, h| {
            let node = node_of_host.get(i).copied().flatten()?;
            h.kubelet_runs_as(node).then_some(i)
        }) {
            up[i] = true;
        }
        let mut writes: Vec<(String, &'static str)> = vec![];
        let mut nodes = self.mirror.nodes.iter().peekable();
        for (node, i) in &self.attached {
            let talking = up.get(*i).copied().unwrap_or(false)
                && node_of_host.get(*i).copied().flatten() == Some(node.as_str());
            let cut_off = !self.partitioned.is_empty()
                && self
                    .partitioned
                    .get(&self.infos[*i].class)
                    .is_some_and(|until| *until > now);
            if talking {
                if !self.kubelet_down.is_empty() {
                    self.kubelet_down.remove(node);
                }
            } else {
                self.kubelet_down.entry(node.clone()).or_insert(now);
            }
            let silent = !self.kubelet_down.is_empty()
                && self
                    .kubelet_down
                    .get(node)
                    .is_some_and(|since| now.saturating_sub(*since) >= NODE_MONITOR_GRACE);
            let want = if cut_off || silent { "Unknown" } else { "True" };
            while nodes
                .next_if(|(name, _)| name.as_str() < node.as_str())
                .is_some()
            {}
            let Some((_, n)) = nodes.next_if(|(name, _)| *name == node) else {
                continue;
            };
            let have = node_ready(n).map(|c| c.status.as_str());
            if n.metadata.deletion_timestamp.is_none() && have != Some(want) {
                // A kubelet that is down cannot say it is Ready: only the node lifecycle
                // controller's Unknown, and the kubelet's own True once it talks again.
                if want == "True" && !talking {
                    continue;
                }
                writes.push((node.clone(), want));
            }
        }
        self.kubelet_down
            .retain(|n, _| self.attached.contains_key(n));
        if writes.is_empty() {
            return;
        }
        let cluster = self.cluster();
        let at = Time(self.world.ctx.clock.now());
        self.suspend(true);
        for (name, status) in writes {
            let Some(mut node) = self.mirror.nodes.get(&name).map(|n| n.as_ref().clone()) else {
                continue;
            };
            set_ready(&mut node, status, at.clone());
            // A conflict (the kubelet or the controller wrote meanwhile) is retried next step.
            if cluster.replace_status(&node).await.is_ok() {
                self.line(now, format!("node-lifecycle {name} Ready={status}"));
            }
        }
        self.suspend(false);
    }

    /// Pod GC: delete the workload's pods bound to Nodes that are gone.
    pub(super) async fn pod_gc(&mut self, now: Duration) {
        let Some(deleting) = self.workload.as_ref().map(|w| w.deleting.clone()) else {
            return;
        };
        let cluster = self.cluster();
        let Ok(all) = cluster.list::<Pod>(Some(POD_NAMESPACE), None).await else {
            return;
        };
        let orphans: Vec<String> = all
            .iter()
            .filter(|p| p.metadata.deletion_timestamp.is_none())
            .filter(|p| pods::node_name(p).is_some_and(|n| !self.mirror.nodes.contains_key(n)))
            .filter_map(|p| p.metadata.name.clone())
            .collect();
        if orphans.is_empty() {
            return;
        }
        self.suspend(true);
        for name in orphans {
            deleting.note(&name);
            if cluster
                .delete::<Pod>(Some(POD_NAMESPACE), &name, None)
                .await
                .is_ok()
            {
                self.line(now, format!("pod-gc delete pod {name}"));
            }
        }
        self.suspend(false);
    }
}
