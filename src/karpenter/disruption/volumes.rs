//! The node affinity of the PersistentVolumes a pod mounts (S48): a pod whose volume is pinned
//! to some nodes (local volumes, zonal disks) can only move to those. Read through the API for
//! the pods a disruption would move, and kept: a bound claim's volume and a volume's node
//! affinity do not change (a claim deleted and made again is read again after [`KEEP`]).

use std::collections::HashMap;
use std::time::Duration;

use jiff::Timestamp;
use k8s_openapi::api::core::v1::PersistentVolumeClaim;

use super::super::KarpenterError;
use super::super::provisioning::volumes::volume_terms;
use super::super::scheduling::PodInfo;
use crate::api::karpenter::NodeSelectorRequirement;
use crate::k8s::Cluster;
use crate::provider::Context;
use crate::ssh::Transport;

/// How long a claim's answer is kept.
const KEEP: Duration = Duration::from_secs(10 * 60);

/// A volume's required node affinity (OR of terms, each an AND); empty: any node.
type Terms = Vec<Vec<NodeSelectorRequirement>>;

/// Answers per claim (`namespace`, `name`): the volume's terms, or why it cannot be checked.
#[derive(Debug, Default)]
pub struct VolumeAffinity {
    known: HashMap<(String, String), (Timestamp, Result<Terms, String>)>,
}

impl VolumeAffinity {
    /// Forget answers older than [`KEEP`] (once per round).
    pub fn prune(&mut self, now: Timestamp) {
        let keep = jiff::SignedDuration::try_from(KEEP).unwrap_or_default();
        self.known
            .retain(|_, (at, _)| now.duration_since(*at) < keep);
    }

    /// Add the node affinity of each pod's volumes to its constraints. A claim that is not
    /// bound, or whose volume cannot be read or uses `matchFields`, makes the pod one whose
    /// constraints cannot be checked (it keeps its node).
    pub async fn resolve<C: Cluster, T: Transport>(
        &mut self,
        ctx: &Context<C, T>,
        pods: &mut [PodInfo],
    ) -> Result<(), KarpenterError> {
        let now = ctx.clock.now();
        for p in pods.iter_mut() {
            for claim in p.claims.clone() {
                let key = (p.namespace.clone(), claim);
                if !self.known.contains_key(&key) {
                    let answer = read(ctx, &key.0, &key.1).await?;
                    self.known.insert(key.clone(), (now, answer));
                }
                match self.known.get(&key).map(|(_, a)| a) {
                    Some(Ok(terms)) if !terms.is_empty() => p.volume_terms.push(terms.clone()),
                    Some(Ok(_)) | None => {}
                    Some(Err(why)) => p.unsupported = Some(why.clone()),
                }
            }
        }
        Ok(())
    }
}

async fn read<C: Cluster, T: Transport>(
    ctx: &Context<C, T>,
    namespace: &str,
    claim: &str,
) -> Result<Result<Terms, String>, KarpenterError> {
    let pvc = ctx
        .cluster
        .get::<PersistentVolumeClaim>(Some(namespace), claim)
        .await?;
    let Some(volume) = pvc
        .and_then(|c| c.spec)
        .and_then(|s| s.volume_name)
        .filter(|v| !v.is_empty())
    else {
        return Ok(Err(format!(
            "PersistentVolumeClaim {namespace}/{claim} is not bound"
        )));
    };
    Ok(volume_terms(ctx, &volume)
        .await?
        .unwrap_or_else(|| Err(format!("PersistentVolume {volume} not found"))))
}
