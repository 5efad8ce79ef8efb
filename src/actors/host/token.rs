//! The bootstrap token of a launch (S27): recorded on the host before its Secret exists, so a
//! crash can never orphan one; the Secret in the shape the chart's admission policy admits.

use std::collections::BTreeMap;

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret as KubeSecret;
use rand::Rng;

use super::HostActorState;
use super::probe::write;
use super::registration::{TOKEN_NAMESPACE, token_secret_name};
use crate::actors::status::ProbeStamp;
use crate::k8s::{Cluster, ClusterError};
use crate::secret::Secret;
use crate::ssh::Transport;

/// Group the minted tokens authenticate as (bind it to system:node-bootstrapper).
pub const BOOTSTRAP_GROUP: &str = "system:bootstrappers:kpssh";

/// The bootstrap token for this launch, recorded in status **before** its Secret is created, so
/// a crash in between can never orphan a token (S27). A resumed launch (S20) keeps the recorded
/// ID but mints a new secret half and replaces the Secret: the controller may create and delete
/// token Secrets, never read them (`get` on kube-system Secrets would let a stolen controller
/// identity read any of them).
pub async fn token<C: Cluster, T: Transport>(
    state: &mut HostActorState<C, T>,
) -> Result<Secret, ClusterError> {
    let recorded = state
        .host
        .status
        .as_ref()
        .and_then(|s| s.bootstrap_token_id.clone());
    let id = match recorded {
        Some(id) => id,
        None => {
            let id = random_token_part(state, 6);
            write(state, ProbeStamp::Keep, |s| {
                s.bootstrap_token_id = Some(id.clone())
            })
            .await?;
            id
        }
    };
    let half = random_token_part(state, 16);
    let expires = state.ctx.clock.now()
        + jiff::SignedDuration::try_from(state.ctx.config.token_ttl)
            .unwrap_or(jiff::SignedDuration::from_hours(1));
    let secret = token_secret(
        &id,
        &half,
        expires,
        &format!("kpssh join of {}", state.key()),
    );
    match state.ctx.cluster.create(&secret).await {
        Ok(_) => {}
        // A previous attempt (before a restart, or a retry) created it: replace it.
        Err(ClusterError::AlreadyExists { .. }) => {
            state
                .ctx
                .cluster
                .delete::<KubeSecret>(Some(TOKEN_NAMESPACE), &token_secret_name(&id), None)
                .await?;
            state.ctx.cluster.create(&secret).await?;
        }
        Err(e) => return Err(e),
    }
    Ok(Secret::new(format!("{id}.{half}")))
}

/// The `kube-system/bootstrap-token-<id>` Secret of a token `<id>.<secret>`: group
/// [`BOOTSTRAP_GROUP`], label `app.kubernetes.io/managed-by: kpssh` (the chart's admission
/// policy lets the controller create exactly this shape and delete only Secrets so labelled).
pub fn token_secret(
    id: &str,
    secret: &str,
    expires: jiff::Timestamp,
    description: &str,
) -> KubeSecret {
    let data = |v: &str| ByteString(v.as_bytes().to_vec());
    KubeSecret {
        metadata: kube::api::ObjectMeta {
            name: Some(token_secret_name(id)),
            namespace: Some(TOKEN_NAMESPACE.into()),
            labels: Some(BTreeMap::from([(
                "app.kubernetes.io/managed-by".to_string(),
                "kpssh".to_string(),
            )])),
            ..Default::default()
        },
        type_: Some("bootstrap.kubernetes.io/token".into()),
        data: Some(BTreeMap::from([
            ("token-id".to_string(), data(id)),
            ("token-secret".to_string(), data(secret)),
            (
                "expiration".to_string(),
                data(&expires.strftime("%Y-%m-%dT%H:%M:%SZ").to_string()),
            ),
            ("usage-bootstrap-authentication".to_string(), data("true")),
            ("usage-bootstrap-signing".to_string(), data("true")),
            ("auth-extra-groups".to_string(), data(BOOTSTRAP_GROUP)),
            ("description".to_string(), data(description)),
        ])),
        ..Default::default()
    }
}

fn random_token_part<C: Cluster, T: Transport>(state: &HostActorState<C, T>, len: usize) -> String {
    const ALPHABET: &[u8] = b"abcdefghijklmnopqrstuvwxyz0123456789";
    let mut rng = state.ctx.rng();
    (0..len)
        .map(|_| ALPHABET[rng.random_range(0..ALPHABET.len())] as char)
        .collect()
}
