//! #23: jump hosts are pinned like targets, through real OpenSSH `sshd` bastions.
//!
//! - The bastion's host key is recorded on first use (`status.proxyJumpHostKey`, per bastion
//!   endpoint) and enforced from then on; the bastion Secret's `knownHost` wins over it. Before,
//!   the target builder passed no recorded key, so any bastion key was accepted on every dial.
//! - Two hosts reaching one bastion with different keys keep one bastion connection each
//!   instead of replacing each other's on every call.

#[path = "support/sshd.rs"]
mod sshd;

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret as KubeSecret;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use kpssh::actors::host::probe::apply_facts;
use kpssh::actors::host::target::host_target;
use kpssh::api::host::{ProxyJump, SecretRef};
use kpssh::api::{ExecMode, SSHHost, SSHHostSpec};
use kpssh::clock::Clock;
use kpssh::k8s::{Cluster, MemoryCluster};
use kpssh::secret::Secret;
use kpssh::ssh::{
    HostKeyPin, HostTarget, RemoteCommand, RusshTransport, Transport, TransportConfig,
    TransportError,
};
use sshd::{KeyPair, Sshd, keygen};

const NS: &str = "pool";

async fn key_secret(cluster: &MemoryCluster, name: &str, key: &KeyPair, known_host: Option<&str>) {
    let mut data = BTreeMap::from([(
        "privateKey".to_string(),
        ByteString(key.private.as_bytes().to_vec()),
    )]);
    if let Some(k) = known_host {
        data.insert("knownHost".into(), ByteString(k.as_bytes().to_vec()));
    }
    let secret = KubeSecret {
        metadata: kube::api::ObjectMeta {
            name: Some(name.into()),
            namespace: Some(NS.into()),
            ..Default::default()
        },
        data: Some(data),
        ..Default::default()
    };
    let _ = cluster.delete::<KubeSecret>(Some(NS), name, None).await;
    cluster.create(&secret).await.expect("secret");
}

fn host(target: &Sshd, bastion: &Sshd) -> SSHHost {
    let mut h = SSHHost::new(
        "behind-bastion",
        SSHHostSpec {
            address: target.address.clone(),
            port: i32::from(target.port),
            user: "root".into(),
            ssh_key_secret_ref: SecretRef {
                name: "host-key".into(),
            },
            node_address: None,
            capacity: BTreeMap::from([
                ("cpu".to_string(), Quantity("1".into())),
                ("memory".to_string(), Quantity("1Gi".into())),
            ]),
            exec_mode: ExecMode::Raw,
            trusted_signers: None,
            shim_command: "/opt/kpssh/kpssh-shim".into(),
            proxy_jump: Some(ProxyJump {
                address: bastion.address.clone(),
                port: i32::from(bastion.port),
                user: "root".into(),
                ssh_key_secret_ref: SecretRef {
                    name: "bastion-key".into(),
                },
            }),
        },
    );
    h.metadata.namespace = Some(NS.into());
    h
}

fn bastion_pin(t: &HostTarget) -> HostKeyPin {
    t.jump.as_ref().expect("a jump host").pin.clone()
}

#[tokio::test]
async fn bastion_key_is_pinned_on_first_use_and_enforced() {
    let bastion = Sshd::start();
    let target = Sshd::start();
    let dir = tempfile::tempdir().expect("tempdir");
    let client = keygen(dir.path(), "client", "ed25519", None);
    let bclient = keygen(dir.path(), "bastion-client", "ed25519", None);
    target.authorize(&client.public);
    bastion.authorize(&bclient.public);
    let cluster = MemoryCluster::new(Clock::system());
    key_secret(&cluster, "host-key", &client, None).await;
    key_secret(&cluster, "bastion-key", &bclient, None).await;
    let mut h = host(&target, &bastion);
    let t = RusshTransport::new(TransportConfig::default());

    // First use: nothing recorded, any bastion key is accepted and reported.
    let first = host_target(&cluster, NS, &h).await.expect("target");
    assert_eq!(bastion_pin(&first), HostKeyPin::TrustOnFirstUse);
    let report = t.probe(&first, None).await.expect("probe via the bastion");
    let jump = report.jump.clone().expect("the bastion's key is reported");
    assert_eq!(jump.fingerprint, bastion.fingerprint());
    assert_eq!(
        jump.endpoint,
        format!("{}:{}", bastion.address, bastion.port)
    );
    // The probe's status write records it, and the next target carries it as the pin.
    let mut status = h.status.clone().unwrap_or_default();
    apply_facts(&mut status, &report, None, false);
    let pinned = status.proxy_jump_host_key.clone().expect("recorded");
    assert_eq!(pinned.fingerprint, bastion.fingerprint());
    h.status = Some(status);
    let second = host_target(&cluster, NS, &h).await.expect("target");
    assert_eq!(
        bastion_pin(&second),
        HostKeyPin::Fingerprint(bastion.fingerprint())
    );
    t.probe(&second, None).await.expect("the pinned bastion");

    // The bastion now presents another key than the one recorded (simulated by recording
    // another key for its endpoint): refused as a host key mismatch naming the bastion, before
    // any session to the target.
    let other = keygen(dir.path(), "other", "ed25519", None);
    if let Some(s) = h.status.as_mut()
        && let Some(p) = s.proxy_jump_host_key.as_mut()
    {
        p.fingerprint = other.fingerprint();
    }
    t.forget(&second.host).await;
    let changed = host_target(&cluster, NS, &h).await.expect("target");
    let err = t.probe(&changed, None).await.expect_err("mismatch");
    match &err {
        TransportError::HostKeyMismatch { host, actual, .. } => {
            assert!(host.contains("bastion"), "{err}");
            assert_eq!(actual, &bastion.fingerprint());
        }
        other => panic!("expected a host key mismatch, got {other}"),
    }
    assert!(
        !err.is_transient(),
        "a key mismatch is not retried as a network error"
    );

    // A record for another bastion endpoint is not this bastion's pin: first use again.
    if let Some(s) = h.status.as_mut()
        && let Some(p) = s.proxy_jump_host_key.as_mut()
    {
        p.endpoint = "192.0.2.1:22".into();
    }
    let moved = host_target(&cluster, NS, &h).await.expect("target");
    assert_eq!(bastion_pin(&moved), HostKeyPin::TrustOnFirstUse);

    // knownHost in the bastion's Secret wins over any record.
    key_secret(
        &cluster,
        "bastion-key",
        &bclient,
        Some(&bastion.host_public_key()),
    )
    .await;
    let known = host_target(&cluster, NS, &h).await.expect("target");
    assert_eq!(
        bastion_pin(&known),
        HostKeyPin::KnownHost(bastion.host_public_key())
    );
}

#[tokio::test]
async fn hosts_with_different_bastion_keys_keep_their_own_bastion_connection() {
    let bastion = Sshd::start();
    let target = Sshd::start();
    let dir = tempfile::tempdir().expect("tempdir");
    let client = keygen(dir.path(), "client", "ed25519", None);
    target.authorize(&client.public);
    let t = RusshTransport::new(TransportConfig::default());
    let mut targets = Vec::new();
    for name in ["a", "b"] {
        let bkey = keygen(dir.path(), &format!("bastion-{name}"), "ed25519", None);
        bastion.authorize(&bkey.public);
        targets.push(HostTarget {
            host: format!("pool/{name}"),
            address: target.address.clone(),
            port: target.port,
            user: "root".into(),
            key: Secret::new(client.private.clone()),
            pin: HostKeyPin::Fingerprint(target.fingerprint()),
            jump: Some(Box::new(HostTarget {
                host: format!("pool/{name} (bastion)"),
                address: bastion.address.clone(),
                port: bastion.port,
                user: "root".into(),
                key: Secret::new(bkey.private.clone()),
                pin: HostKeyPin::Fingerprint(bastion.fingerprint()),
                jump: None,
            })),
        });
    }
    // Alternate between the two hosts: each call used to redial the shared bastion entry.
    for _ in 0..3 {
        for tg in &targets {
            let out = t
                .exec(tg, RemoteCommand::new("echo via", Duration::from_secs(20)))
                .await
                .expect("exec");
            assert_eq!(out.stdout, b"via\n");
        }
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(
        bastion.connections(),
        2,
        "one bastion connection per key, each reused"
    );
}
