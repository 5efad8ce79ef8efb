//! Volume topology for provisioning (S56), as core's `VolumeTopology`: a pod mounting a bound
//! PersistentVolumeClaim may only go where the volume's node affinity allows (a local volume's
//! host, a zonal disk's zone); an unbound one whose StorageClass lists `allowedTopologies` only
//! where those allow. The answers for bound claims are kept (a bound claim's volume and a
//! volume's node affinity do not change); unbound claims are read again each round.

use std::collections::HashMap;
use std::time::Duration;

use jiff::Timestamp;
use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};
use k8s_openapi::api::storage::v1::StorageClass;

use crate::api::karpenter::NodeSelectorRequirement;
use crate::k8s::Cluster;
use crate::karpenter::KarpenterError;
use crate::karpenter::scheduling::PodInfo;
use crate::provider::Context;
use crate::ssh::Transport;

const KEEP: Duration = Duration::from_secs(10 * 60);

/// A node affinity: OR of terms, each an AND.
type Terms = Vec<Vec<NodeSelectorRequirement>>;

#[derive(Debug, Default)]
pub struct VolumeTopology {
    bound: HashMap<(String, String), (Timestamp, Result<Terms, String>)>,
}

impl VolumeTopology {
    /// Add each pod's volume constraints to it; a volume that cannot be read or modelled makes
    /// the pod `invalid` (left pending, with the reason in its event).
    pub async fn resolve<C: Cluster, T: Transport>(
        &mut self,
        ctx: &Context<C, T>,
        pods: &mut [PodInfo],
    ) -> Result<(), KarpenterError> {
        let now = ctx.clock.now();
        let keep = jiff::SignedDuration::try_from(KEEP).unwrap_or_default();
        self.bound
            .retain(|_, (at, _)| now.duration_since(*at) < keep);
        for p in pods.iter_mut() {
            for claim in p.claims.clone() {
                let key = (p.namespace.clone(), claim);
                let answer = match self.bound.get(&key) {
                    Some((_, a)) => a.clone(),
                    None => {
                        let (bound, a) = read(ctx, &key.0, &key.1).await?;
                        if bound {
                            self.bound.insert(key.clone(), (now, a.clone()));
                        }
                        a
                    }
                };
                match answer {
                    Ok(terms) if !terms.is_empty() => p.volume_terms.push(terms),
                    Ok(_) => {}
                    Err(why) => p.invalid = Some(why),
                }
            }
        }
        Ok(())
    }
}

fn terms_of(
    terms: Vec<k8s_openapi::api::core::v1::NodeSelectorTerm>,
    volume: &str,
) -> Result<Terms, String> {
    if terms
        .iter()
        .any(|t| t.match_fields.as_ref().is_some_and(|f| !f.is_empty()))
    {
        return Err(format!(
            "PersistentVolume {volume}: node affinity matchFields"
        ));
    }
    Ok(terms
        .into_iter()
        .map(|t| {
            t.match_expressions
                .into_iter()
                .flatten()
                .map(|e| NodeSelectorRequirement {
                    key: e.key,
                    operator: e.operator,
                    values: e.values.unwrap_or_default(),
                    min_values: None,
                })
                .collect()
        })
        .collect())
}

/// The node affinity of PersistentVolume `volume` (`None`: no such volume); shared with
/// disruption's check of where a pod's volumes let it go (S48).
pub(crate) async fn volume_terms<C: Cluster, T: Transport>(
    ctx: &Context<C, T>,
    volume: &str,
) -> Result<Option<Result<Terms, String>>, KarpenterError> {
    let Some(pv) = ctx.cluster.get::<PersistentVolume>(None, volume).await? else {
        return Ok(None);
    };
    let terms = pv
        .spec
        .and_then(|s| s.node_affinity)
        .and_then(|a| a.required)
        .map(|r| r.node_selector_terms)
        .unwrap_or_default();
    Ok(Some(terms_of(terms, volume)))
}

/// (whether the claim is bound, its constraint).
async fn read<C: Cluster, T: Transport>(
    ctx: &Context<C, T>,
    namespace: &str,
    claim: &str,
) -> Result<(bool, Result<Terms, String>), KarpenterError> {
    let Some(pvc) = ctx
        .cluster
        .get::<PersistentVolumeClaim>(Some(namespace), claim)
        .await?
    else {
        return Ok((
            false,
            Err(format!(
                "PersistentVolumeClaim {namespace}/{claim} not found"
            )),
        ));
    };
    let spec = pvc.spec.unwrap_or_default();
    if let Some(volume) = spec.volume_name.filter(|v| !v.is_empty()) {
        return match volume_terms(ctx, &volume).await? {
            Some(terms) => Ok((true, terms)),
            None => Ok((false, Err(format!("PersistentVolume {volume} not found")))),
        };
    }
    // Not bound yet: its StorageClass's allowed topologies (WaitForFirstConsumer binds it
    // where the pod lands).
    let Some(class) = spec.storage_class_name.filter(|c| !c.is_empty()) else {
        return Ok((false, Ok(vec![])));
    };
    let Some(sc) = ctx.cluster.get::<StorageClass>(None, &class).await? else {
        return Ok((false, Ok(vec![])));
    };
    let terms = sc
        .allowed_topologies
        .unwrap_or_default()
        .into_iter()
        .map(|t| {
            t.match_label_expressions
                .into_iter()
                .flatten()
                .map(|e| NodeSelectorRequirement {
                    key: e.key,
                    operator: "In".into(),
                    values: e.values,
                    min_values: None,
                })
                .collect::<Vec<_>>()
        })
        .filter(|t| !t.is_empty())
        .collect();
    Ok((false, Ok(terms)))
}
