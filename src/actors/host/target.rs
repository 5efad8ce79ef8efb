//! How to reach a host: its spec plus the key Secret, turned into a transport target.

use std::time::Duration;

use k8s_openapi::api::core::v1::Secret as KubeSecret;
use thiserror::Error;

use crate::api::SSHHost;
use crate::api::host::SecretRef;
use crate::api::host::{PinnedHostKey, valid_address};
use crate::k8s::{Cluster, ClusterError};
use crate::provider::key_cache::KeyCache;
use crate::secret::Secret;
use crate::ssh::{HostKeyPin, HostTarget, JumpKey};

pub const PRIVATE_KEY: &str = "privateKey";
pub const KNOWN_HOST: &str = "knownHost";

/// A configuration problem found before any connection: nothing was sent to the host.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum TargetError {
    #[error(
        "Secret {namespace}/{name} not found: create it with the host's private key under key `privateKey`"
    )]
    SecretMissing { namespace: String, name: String },
    #[error("Secret {namespace}/{name} has no `privateKey`")]
    KeyMissing { namespace: String, name: String },
    #[error("SSHHost {host}: port {port} is out of range")]
    BadPort { host: String, port: i32 },
    #[error("SSHHost {host}: {field} {address:?} is neither an IP literal nor a DNS name")]
    BadAddress {
        host: String,
        field: &'static str,
        address: String,
    },
    #[error(transparent)]
    Api(#[from] ClusterError),
}

impl TargetError {
    /// API trouble is worth a retry; the others wait for someone to fix the configuration.
    pub fn is_transient(&self) -> bool {
        matches!(self, TargetError::Api(e) if e.is_transient())
    }
}

/// The transport target of `host`, reading its key Secret (and the bastion's) from `ns`.
pub async fn host_target<C: Cluster>(
    cluster: &C,
    ns: &str,
    host: &SSHHost,
) -> Result<HostTarget, TargetError> {
    build_target(cluster, None, ns, host).await
}

/// [`host_target`], with the key Secrets taken from `keys` while they are younger than
/// `max_age` (and read into it otherwise).
pub async fn cached_host_target<C: Cluster>(
    cluster: &C,
    keys: &KeyCache,
    max_age: Duration,
    ns: &str,
    host: &SSHHost,
) -> Result<HostTarget, TargetError> {
    build_target(cluster, Some((keys, max_age)), ns, host).await
}

async fn build_target<C: Cluster>(
    cluster: &C,
    keys: Option<(&KeyCache, Duration)>,
    ns: &str,
    host: &SSHHost,
) -> Result<HostTarget, TargetError> {
    let read_key = |secret_ref: &SecretRef| {
        let secret_ref = secret_ref.clone();
        async move {
            match keys {
                Some((cache, max_age)) => {
                    read_cached(cache, cluster, ns, &secret_ref, max_age).await
                }
                None => read_key(cluster, ns, &secret_ref).await,
            }
        }
    };
    let name = host.metadata.name.clone().unwrap_or_default();
    let id = format!("{ns}/{name}");
    // The CRD refuses such addresses too; an object admitted before that rule is refused here.
    check_address(&id, "spec.address", &host.spec.address)?;
    if let Some(jump) = &host.spec.proxy_jump {
        check_address(&id, "spec.proxyJump.address", &jump.address)?;
    }
    let (key, known_host) = read_key(&host.spec.ssh_key_secret_ref).await?;
    let fingerprint = host
        .status
        .as_ref()
        .and_then(|s| s.host_key_fingerprint.as_deref());
    let mut target = HostTarget {
        host: id.clone(),
        address: host.spec.address.clone(),
        port: port(&id, host.spec.port)?,
        user: host.spec.user.clone(),
        key,
        pin: HostKeyPin::from_sources(known_host.as_deref(), fingerprint),
        jump: None,
    };
    if let Some(jump) = &host.spec.proxy_jump {
        let (key, known_host) = read_key(&jump.ssh_key_secret_ref).await?;
        let mut bastion = HostTarget {
            host: format!("{id} (bastion {})", jump.address),
            address: jump.address.clone(),
            port: port(&id, jump.port)?,
            user: jump.user.clone(),
            key,
            pin: HostKeyPin::TrustOnFirstUse,
            jump: None,
        };
        // Like the host's own key: the Secret's knownHost wins, else the key recorded on first
        // use (for this bastion endpoint), else trust on first use.
        let endpoint = JumpKey::endpoint_of(&bastion);
        let recorded = jump_fingerprint(host).filter(|p| p.endpoint == endpoint);
        bastion.pin = HostKeyPin::from_sources(
            known_host.as_deref(),
            recorded.map(|p| p.fingerprint.as_str()),
        );
        target.jump = Some(Box::new(bastion));
    }
    Ok(target)
}

fn check_address(id: &str, field: &'static str, address: &str) -> Result<(), TargetError> {
    if valid_address(address) {
        Ok(())
    } else {
        Err(TargetError::BadAddress {
            host: id.to_string(),
            field,
            address: address.chars().take(64).collect(),
        })
    }
}

fn port(id: &str, port: i32) -> Result<u16, TargetError> {
    u16::try_from(port)
        .ok()
        .filter(|p| *p > 0)
        .ok_or_else(|| TargetError::BadPort {
            host: id.to_string(),
            port,
        })
}

async fn read_key<C: Cluster>(
    cluster: &C,
    ns: &str,
    secret_ref: &SecretRef,
) -> Result<(Secret, Option<String>), TargetError> {
    let secret: KubeSecret = cluster
        .get(Some(ns), &secret_ref.name)
        .await?
        .ok_or_else(|| TargetError::SecretMissing {
            namespace: ns.to_string(),
            name: secret_ref.name.clone(),
        })?;
    let field = |k: &str| -> Option<String> {
        let from_data = secret
            .data
            .as_ref()
            .and_then(|d| d.get(k))
            .map(|b| String::from_utf8_lossy(&b.0).into_owned());
        from_data.or_else(|| secret.string_data.as_ref().and_then(|d| d.get(k)).cloned())
    };
    let key = field(PRIVATE_KEY)
        .filter(|k| !k.trim().is_empty())
        .ok_or_else(|| TargetError::KeyMissing {
            namespace: ns.to_string(),
            name: secret_ref.name.clone(),
        })?;
    Ok((Secret::new(key), field(KNOWN_HOST)))
}

/// The key Secret `secret_ref` of `ns` from `cache` while younger than `max_age`, else read
/// and stored (unless a forget came meanwhile: what was read may be the old version).
async fn read_cached<C: Cluster>(
    cache: &KeyCache,
    cluster: &C,
    ns: &str,
    secret_ref: &SecretRef,
    max_age: Duration,
) -> Result<(Secret, Option<String>), TargetError> {
    let epoch = match cache.lookup(ns, &secret_ref.name, max_age) {
        Ok(hit) => return Ok(hit),
        Err(epoch) => epoch,
    };
    let (key, known_host) = read_key(cluster, ns, secret_ref).await?;
    cache.store(epoch, ns, &secret_ref.name, &key, known_host.as_deref());
    Ok((key, known_host))
}

/// A target and what it was built from. Shared: a steady probe hands the transport the
/// cached target, it does not copy it (and the key in it).
#[derive(Clone)]
pub struct CachedTarget {
    pub target: std::sync::Arc<HostTarget>,
    generation: Option<i64>,
    fingerprint: Option<String>,
    jump_fingerprint: Option<PinnedHostKey>,
    built: tokio::time::Instant,
}

impl CachedTarget {
    pub fn new(host: &SSHHost, target: HostTarget) -> Self {
        CachedTarget {
            target: std::sync::Arc::new(target),
            generation: host.metadata.generation,
            fingerprint: fingerprint(host).map(str::to_string),
            jump_fingerprint: jump_fingerprint(host).cloned(),
            built: tokio::time::Instant::now(),
        }
    }

    pub fn valid_for(&self, host: &SSHHost, max_age: std::time::Duration) -> bool {
        self.generation == host.metadata.generation
            && self.fingerprint.as_deref() == fingerprint(host)
            && self.jump_fingerprint.as_ref() == jump_fingerprint(host)
            && self.built.elapsed() < max_age
    }
}

fn fingerprint(host: &SSHHost) -> Option<&str> {
    host.status
        .as_ref()
        .and_then(|s| s.host_key_fingerprint.as_deref())
}

fn jump_fingerprint(host: &SSHHost) -> Option<&PinnedHostKey> {
    host.status
        .as_ref()
        .and_then(|s| s.proxy_jump_host_key.as_ref())
}
