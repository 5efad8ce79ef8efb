//! The controller wired to real parts: a real kube-apiserver/etcd and a real OpenSSH sshd.
//! A host is probed and pinned (S1), claimed, installed and joined with a minted bootstrap
//! token (S13, S14, S27), and released with leave when its NodeClaim goes (S23).

#[path = "support/controlplane.rs"]
mod controlplane;
#[path = "support/sshd.rs"]
mod sshd;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use controlplane::ControlPlane;
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::{Namespace, Secret};
use kpssh::actors::spawn_controller;
use kpssh::api::nodeclass::ClusterEndpoint;
use kpssh::api::profile::Scripts;
use kpssh::api::{HostState, NodeClaim, SSHHost, SSHJoinProfile, crds};
use kpssh::clock::Clock;
use kpssh::k8s::{Cluster, ClusterError, KubeCluster};
use kpssh::provider::{Config, Context};
use kpssh::sim::world::{host_object, node_claim, node_class, sim_profile};
use kpssh::ssh::{RusshTransport, TransportConfig};
use kube::api::ObjectMeta;

const NS: &str = "kpssh-e2e";

async fn until<F, Fut>(limit: Duration, mut f: F) -> bool
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = tokio::time::Instant::now() + limit;
    while tokio::time::Instant::now() < deadline {
        if f().await {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    false
}

async fn create<K: kpssh::k8s::Object>(c: &KubeCluster, obj: &K) {
    match c.create(obj).await {
        Ok(_) | Err(ClusterError::AlreadyExists { .. }) => {}
        Err(e) => panic!("create: {e}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_host_is_probed_claimed_joined_and_released() {
    let cp = ControlPlane::shared();
    let yaml = format!(
        "{}{}",
        crds::to_yaml(&crds::kpssh_crds()).expect("yaml"),
        crds::to_yaml(&crds::karpenter_crds()).expect("yaml")
    );
    cp.install_crds(&yaml).await;
    let c = KubeCluster::new(cp.client().await);
    let ns = Namespace {
        metadata: ObjectMeta {
            name: Some(NS.into()),
            ..Default::default()
        },
        ..Default::default()
    };
    create(&c, &ns).await;

    let sshd = sshd::Sshd::start();
    let keys = tempfile::tempdir().expect("tempdir");
    let client_key = sshd::keygen(keys.path(), "client", "ed25519", None);
    sshd.authorize(&client_key.public);
    let secret = Secret {
        metadata: ObjectMeta {
            name: Some("ssh-key".into()),
            namespace: Some(NS.into()),
            ..Default::default()
        },
        data: Some(BTreeMap::from([(
            "privateKey".to_string(),
            ByteString(client_key.private.clone().into_bytes()),
        )])),
        ..Default::default()
    };
    create(&c, &secret).await;

    let record = sshd.dir.path().join("phases");
    let log = record.display().to_string();
    let mut profile: SSHJoinProfile = sim_profile("e2e", "1");
    profile.spec.scripts = Scripts {
        install: format!("echo install >> '{log}'\n"),
        join: format!(
            "echo \"join $KPSSH_NODE_NAME $KPSSH_PROVIDER_ID ${{#KPSSH_BOOTSTRAP_TOKEN}}\" >> '{log}'\n"
        ),
        leave: format!("echo leave >> '{log}'\n"),
        uninstall: None,
    };
    create(&c, &profile).await;
    let mut class = node_class("e2e", "e2e");
    class.spec.cluster = Some(ClusterEndpoint {
        endpoint: cp.server().to_string(),
        ca_bundle: None,
    });
    create(&c, &class).await;
    let sim = kpssh::sim::SimHost::new(&sshd.address, 1, 2_000_000);
    let mut host: SSHHost = host_object(NS, "real-1", "small", &sim);
    host.spec.port = i32::from(sshd.port);
    create(&c, &host).await;

    let config = Config {
        pool_namespace: NS.into(),
        ..Config::default()
    };
    let transport = RusshTransport::new(TransportConfig::default());
    let ctx = Context::new(
        c.clone(),
        Arc::new(transport),
        Clock::system(),
        config,
        None,
    );
    let controller = spawn_controller(&ctx).await.expect("controller");

    let get = || async {
        c.get::<SSHHost>(Some(NS), "real-1")
            .await
            .expect("get")
            .expect("host")
    };
    let available = until(Duration::from_secs(60), || async {
        get().await.state() == HostState::Available
    })
    .await;
    let h = get().await;
    assert!(available, "host not Available: {:?}", h.status);
    let status = h.status.clone().expect("status");
    assert_eq!(
        status.host_key_fingerprint,
        Some(sshd.fingerprint()),
        "S1: key pinned on first contact"
    );
    let cpus = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1);
    assert_eq!(
        status.observed_capacity.expect("capacity")["cpu"].0,
        cpus.to_string()
    );

    c.create(&node_claim("e2e-claim", "e2e", "100m", "64Mi"))
        .await
        .expect("nodeclaim");
    let joined = until(Duration::from_secs(60), || async {
        std::fs::read_to_string(&record).is_ok_and(|t| t.contains("join "))
    })
    .await;
    assert!(joined, "join did not run; host {:?}", get().await.status);
    let phases = std::fs::read_to_string(&record).expect("phases");
    let join_line = phases
        .lines()
        .find(|l| l.starts_with("join "))
        .expect("join line");
    assert_eq!(
        join_line,
        format!("join e2e-claim kpssh://{NS}/real-1 23"),
        "S14: node name, static provider ID, a 23-character token"
    );
    let h = get().await;
    assert_eq!(h.state(), HostState::Claimed);
    let token_id = h
        .status
        .as_ref()
        .and_then(|s| s.bootstrap_token_id.clone())
        .expect("S27: token recorded");
    let token = format!("bootstrap-token-{token_id}");
    assert!(
        c.get::<Secret>(Some("kube-system"), &token)
            .await
            .expect("get")
            .is_some()
    );

    c.delete::<NodeClaim>(None, "e2e-claim", None)
        .await
        .expect("delete");
    let released = until(Duration::from_secs(60), || async {
        let h = get().await;
        h.state() == HostState::Available && h.claim().is_none()
    })
    .await;
    assert!(released, "host not released: {:?}", get().await.status);
    let phases = std::fs::read_to_string(&record).expect("phases");
    assert_eq!(
        phases.lines().filter(|l| *l == "leave").count(),
        1,
        "S23: leave ran once: {phases}"
    );
    assert!(
        c.get::<Secret>(Some("kube-system"), &token)
            .await
            .expect("get")
            .is_none(),
        "token deleted"
    );
    let gone = until(Duration::from_secs(30), || async {
        c.get::<NodeClaim>(None, "e2e-claim")
            .await
            .expect("get")
            .is_none()
    })
    .await;
    assert!(gone, "NodeClaim finalizer released");
    assert_eq!(
        get().await.status.and_then(|s| s.installed_profile),
        Some("e2e@1".into()),
        "marker kept"
    );
    controller.shutdown(Duration::from_secs(10)).await;
}
