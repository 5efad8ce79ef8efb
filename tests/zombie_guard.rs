//! The zombie guard and orphan Nodes on the real control plane, with real sshd hosts (#23):
//! - S10 + #23: a kubelet on an unclaimed host that kpssh never installed is parked
//!   (ForeignKubelet) even when a Node with the host's IP exists: that Node (another
//!   Karpenter's, a hand-joined machine behind the same address) is not the host's, and nothing
//!   is run on the host or done to the Node.
//! - S9 + #23: on a host kpssh installed, the zombie guard runs leave and deletes only the
//!   Node tied to the host (its Static provider ID); a foreign Node sharing the IP keeps its
//!   `karpenter.sh/termination` finalizer and is never deleted.
//! - #23: the Node of a release whose leave failed is recorded in `status.orphanNode`, so a
//!   controller started after a restart still deletes it (dropping its finalizer) once the
//!   kubelet is stopped, instead of leaving it wedged.
//!
//! Each host is a real OpenSSH sshd whose sessions find a `systemctl` stand-in first on their
//! PATH (`SetEnv`): `systemctl is-active kubelet` prints the host's kubelet state file, which
//! the profile's join and leave write.

#[path = "support/controlplane.rs"]
mod controlplane;
#[path = "support/sshd.rs"]
mod sshd;

use std::collections::BTreeMap;
use std::os::unix::fs::PermissionsExt as _;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use controlplane::ControlPlane;
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::{Event, Namespace, Node, Secret};
use kpssh::actors::{Controller, spawn_controller};
use kpssh::api::host::OrphanNode;
use kpssh::api::nodeclass::ClusterEndpoint;
use kpssh::api::profile::Scripts;
use kpssh::api::{HostState, NodeClaim, SSHHost, SSHJoinProfile, crds};
use kpssh::clock::Clock;
use kpssh::k8s::{Cluster, ClusterError, KubeCluster};
use kpssh::provider::{Config, Context};
use kpssh::sim::world::{KEY_SECRET, host_object, node_claim, node_class, sim_profile};
use kpssh::ssh::{RusshTransport, TransportConfig};
use kube::api::{Api, ListParams, ObjectMeta, Patch, PatchParams, PostParams};
use serde_json::json;

const PROFILE: &str = "zg";
const FINALIZER: &str = "karpenter.sh/termination";
/// Another Karpenter's provider ID (an EC2 instance).
const FOREIGN_PROVIDER_ID: &str = "aws:///us-west-2a/i-0123456789abcdef0";

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
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    false
}

async fn create<K: kpssh::k8s::Object>(c: &KubeCluster, obj: &K) {
    match c.create(obj).await {
        Ok(_) | Err(ClusterError::AlreadyExists { .. }) => {}
        Err(e) => panic!("create: {e}"),
    }
}

/// A host: real sshd on its own loopback address, a machine directory with the kubelet state,
/// the phase log and the leave-failure switch.
struct Machine {
    sshd: sshd::Sshd,
    root: PathBuf,
    _bin: tempfile::TempDir,
}

impl Machine {
    fn start(base: &std::path::Path) -> Machine {
        let bin = tempfile::tempdir().expect("tempdir");
        std::fs::set_permissions(bin.path(), std::fs::Permissions::from_mode(0o755))
            .expect("chmod");
        let sshd = {
            let path = format!(
                "SetEnv PATH={}:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
                bin.path().display()
            );
            sshd::Sshd::start_with(sshd::SshdOptions {
                extra: vec![path],
                ..Default::default()
            })
        };
        let root = base.join(&sshd.address);
        std::fs::create_dir_all(&root).expect("machine root");
        let systemctl = bin.path().join("systemctl");
        std::fs::write(
            &systemctl,
            format!(
                "#!/bin/sh\n# systemctl stand-in: is-active prints the kubelet state file.\n\
                 [ \"$1\" = is-active ] || exit 0\ncat '{}/kubelet' 2>/dev/null || echo inactive\n",
                root.display()
            ),
        )
        .expect("systemctl");
        std::fs::set_permissions(&systemctl, std::fs::Permissions::from_mode(0o755))
            .expect("chmod");
        Machine {
            sshd,
            root,
            _bin: bin,
        }
    }

    fn kubelet(&self, active: bool) {
        let state = if active { "active\n" } else { "inactive\n" };
        std::fs::write(self.root.join("kubelet"), state).expect("kubelet state");
    }

    fn phases(&self) -> String {
        std::fs::read_to_string(self.root.join("log")).unwrap_or_default()
    }

    fn fail_leave(&self, fail: bool) {
        let flag = self.root.join("fail-leave");
        if fail {
            std::fs::write(flag, "").expect("flag");
        } else {
            let _ = std::fs::remove_file(flag);
        }
    }
}

/// The profile every host runs: it logs each phase under `<base>/<host address>/` and keeps
/// the kubelet state there; leave fails while `fail-leave` exists.
fn profile(base: &std::path::Path) -> SSHJoinProfile {
    let dir = format!("{}/$KPSSH_HOST_ADDRESS", base.display());
    let mut p: SSHJoinProfile = sim_profile(PROFILE, "1");
    p.spec.scripts = Scripts {
        install: format!("echo install >> \"{dir}/log\"\n"),
        join: format!(
            "echo \"join $KPSSH_NODE_NAME\" >> \"{dir}/log\"\necho active > \"{dir}/kubelet\"\n"
        ),
        leave: format!(
            "echo leave >> \"{dir}/log\"\n\
             if [ -e \"{dir}/fail-leave\" ]; then echo 'leave failed on purpose' >&2; exit 3; fi\n\
             echo inactive > \"{dir}/kubelet\"\n"
        ),
        uninstall: None,
    };
    p
}

struct Pool {
    c: KubeCluster,
    client: kube::Client,
    ns: &'static str,
    _keys: tempfile::TempDir,
    public_key: String,
}

impl Pool {
    /// CRDs, the namespace `ns`, its key Secret and the shared profile.
    async fn new(cp: &ControlPlane, ns: &'static str, base: &std::path::Path) -> Pool {
        let yaml = format!(
            "{}{}",
            crds::to_yaml(&crds::kpssh_crds()).expect("yaml"),
            crds::to_yaml(&crds::karpenter_crds()).expect("yaml")
        );
        cp.install_crds(&yaml).await;
        let client = cp.client().await;
        let c = KubeCluster::new(client.clone());
        let namespace = Namespace {
            metadata: ObjectMeta {
                name: Some(ns.into()),
                ..Default::default()
            },
            ..Default::default()
        };
        create(&c, &namespace).await;
        let keys = tempfile::tempdir().expect("tempdir");
        let key = sshd::keygen(keys.path(), "client", "ed25519", None);
        let secret = Secret {
            metadata: ObjectMeta {
                name: Some(KEY_SECRET.into()),
                namespace: Some(ns.into()),
                ..Default::default()
            },
            data: Some(BTreeMap::from([(
                "privateKey".to_string(),
                ByteString(key.private.clone().into_bytes()),
            )])),
            ..Default::default()
        };
        create(&c, &secret).await;
        create(&c, &profile(base)).await;
        Pool {
            c,
            client,
            ns,
            _keys: keys,
            public_key: key.public,
        }
    }

    /// The SSHHost `name` for `m`, with the install marker when `installed`.
    async fn host(&self, m: &Machine, name: &str, installed: bool) {
        m.sshd.authorize(&self.public_key);
        let sim = kpssh::sim::SimHost::new(&m.sshd.address, 1, 2_000_000);
        let mut host: SSHHost = host_object(self.ns, name, "zg", &sim);
        host.spec.port = i32::from(m.sshd.port);
        create(&self.c, &host).await;
        if installed {
            let mut h = self.get(name).await;
            let status = h.status.get_or_insert_with(Default::default);
            status.installed_profile = Some(format!("{PROFILE}@1"));
            self.c.replace_status(&h).await.expect("marker");
        }
    }

    async fn get(&self, name: &str) -> SSHHost {
        self.c
            .get::<SSHHost>(Some(self.ns), name)
            .await
            .expect("get host")
            .expect("host exists")
    }

    async fn controller(&self, probe_interval: Duration) -> Controller {
        let config = Config {
            pool_namespace: self.ns.into(),
            probe_interval,
            retry_base: Duration::from_secs(1),
            ..Config::default()
        };
        let transport = RusshTransport::new(TransportConfig::default());
        let ctx = Context::new(
            self.c.clone(),
            Arc::new(transport),
            Clock::system(),
            config,
            None,
        );
        spawn_controller(&ctx).await.expect("controller")
    }

    fn nodes(&self) -> Api<Node> {
        Api::all(self.client.clone())
    }

    /// A registered Node: `provider_id`, InternalIP `ip`, the Karpenter termination finalizer.
    async fn node(&self, name: &str, provider_id: &str, ip: &str) {
        let node: Node = serde_json::from_value(json!({
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {
                "name": name,
                "labels": {"karpenter.sh/nodepool": "elsewhere"},
                "finalizers": [FINALIZER],
            },
            "spec": {"providerID": provider_id},
        }))
        .expect("node");
        self.nodes()
            .create(&PostParams::default(), &node)
            .await
            .expect("create node");
        let status = json!({"status": {"addresses": [{"type": "InternalIP", "address": ip}]}});
        self.nodes()
            .patch_status(name, &PatchParams::default(), &Patch::Merge(&status))
            .await
            .expect("node address");
    }

    /// The Node `name` exists, is not being deleted and still holds the finalizer.
    async fn node_untouched(&self, name: &str) -> Result<(), String> {
        let node = (self.nodes().get_opt(name).await.map_err(|e| e.to_string()))?
            .ok_or_else(|| format!("Node {name} was deleted"))?;
        if node.metadata.deletion_timestamp.is_some() {
            return Err(format!("Node {name} is being deleted"));
        }
        let fins = node.metadata.finalizers.unwrap_or_default();
        if !fins.iter().any(|f| f == FINALIZER) {
            return Err(format!("Node {name} lost its finalizer: {fins:?}"));
        }
        Ok(())
    }

    async fn node_gone(&self, name: &str) -> bool {
        matches!(self.nodes().get_opt(name).await, Ok(None))
    }

    async fn reasons(&self, host: &str) -> Vec<String> {
        let events: Api<Event> = Api::namespaced(self.client.clone(), self.ns);
        let list = events.list(&ListParams::default()).await.expect("events");
        (list.items.into_iter())
            .filter(|e| e.involved_object.name.as_deref() == Some(host))
            .filter_map(|e| e.reason)
            .collect()
    }
}

/// One test, scenarios in sequence: each runs its own controller, and a controller watches
/// every NodeClaim and Node of the cluster.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn zombie_guard_touches_only_the_hosts_own_nodes_and_orphans_survive_a_restart() {
    let cp = ControlPlane::shared();
    let base = tempfile::tempdir().expect("tempdir");
    std::fs::set_permissions(base.path(), std::fs::Permissions::from_mode(0o755)).expect("chmod");
    foreign_node_sharing_the_ip_is_never_touched(cp, base.path()).await;
    orphan_node_is_deleted_after_a_controller_restart(cp, base.path()).await;
}

async fn foreign_node_sharing_the_ip_is_never_touched(cp: &ControlPlane, base: &std::path::Path) {
    let pool = Pool::new(cp, "zg-zombie", base).await;
    // Host f: a kubelet kpssh never installed; a Node of another Karpenter has its IP.
    let f = Machine::start(base);
    f.kubelet(true);
    pool.node("zg-foreign-f", FOREIGN_PROVIDER_ID, &f.sshd.address)
        .await;
    pool.host(&f, "f", false).await;
    // Host m: installed by kpssh (marker); its kubelet runs, a foreign Node has its IP.
    let m = Machine::start(base);
    m.kubelet(true);
    pool.node("zg-foreign-m", FOREIGN_PROVIDER_ID, &m.sshd.address)
        .await;
    pool.host(&m, "m", true).await;
    let controller = pool.controller(Duration::from_secs(2)).await;

    let parked = until(Duration::from_secs(60), || async {
        let h = pool.get("f").await;
        h.state() == HostState::Unhealthy
            && (h
                .status
                .as_ref()
                .and_then(|s| s.last_probe_error.as_deref()))
            .is_some_and(|e| e.contains("never installed"))
    })
    .await;
    assert!(
        parked,
        "S10: host f parked: {:?}",
        pool.get("f").await.status
    );
    let left = until(Duration::from_secs(60), || async {
        pool.reasons("m").await.iter().any(|r| r == "ZombieLeft")
    })
    .await;
    assert!(left, "S9: leave on m: {:?}", pool.reasons("m").await);
    assert_eq!(m.phases(), "leave\n", "leave ran once on m");
    // A few more probes: nothing changes for either foreign Node.
    tokio::time::sleep(Duration::from_secs(6)).await;
    for node in ["zg-foreign-f", "zg-foreign-m"] {
        if let Err(e) = pool.node_untouched(node).await {
            panic!("#23: a Node that only shares a host's IP was touched: {e}");
        }
    }
    assert_eq!(f.phases(), "", "nothing ran on the foreign kubelet's host");
    let reasons = pool.reasons("f").await;
    assert!(reasons.iter().any(|r| r == "ForeignKubelet"), "{reasons:?}");
    assert!(
        !reasons.iter().any(|r| r.starts_with("Zombie")),
        "f never went Leaving: {reasons:?}"
    );
    assert_eq!(pool.get("m").await.state(), HostState::Available);

    // m's kubelet comes back, and this time m's own Node (its Static provider ID) exists too:
    // that one goes, the foreign one stays.
    let own = format!("kpssh://{}/m", pool.ns);
    pool.node("zg-own-m", &own, &m.sshd.address).await;
    m.kubelet(true);
    let deleted = until(Duration::from_secs(60), || pool.node_gone("zg-own-m")).await;
    assert!(deleted, "S9: the host's own Node deleted after leave");
    assert_eq!(m.phases(), "leave\nleave\n");
    if let Err(e) = pool.node_untouched("zg-foreign-m").await {
        panic!("#23: {e}");
    }
    controller.shutdown(Duration::from_secs(10)).await;
}

async fn orphan_node_is_deleted_after_a_controller_restart(
    cp: &ControlPlane,
    base: &std::path::Path,
) {
    let pool = Pool::new(cp, "zg-orphan", base).await;
    let mut class = node_class("zg-orphan", PROFILE);
    class.spec.cluster = Some(ClusterEndpoint {
        endpoint: cp.server().to_string(),
        ca_bundle: None,
    });
    create(&pool.c, &class).await;
    let o = Machine::start(base);
    o.kubelet(false);
    pool.host(&o, "o", false).await;
    // The first controller probes once at start and then not for ten minutes: whatever
    // happens to the Node after the failed leave below is the second controller's doing.
    let first = pool.controller(Duration::from_secs(600)).await;
    let available = until(Duration::from_secs(60), || async {
        pool.get("o").await.state() == HostState::Available
    })
    .await;
    assert!(available, "host o: {:?}", pool.get("o").await.status);

    const CLAIM: &str = "zg-orphan-claim";
    create(&pool.c, &node_claim(CLAIM, "zg-orphan", "100m", "64Mi")).await;
    let joined = until(Duration::from_secs(60), || async {
        o.phases().contains(&format!("join {CLAIM}"))
    })
    .await;
    assert!(
        joined,
        "join: {} {:?}",
        o.phases(),
        pool.get("o").await.status
    );
    let provider_id = format!("kpssh://{}/o", pool.ns);
    pool.node(CLAIM, &provider_id, &o.sshd.address).await;
    let in_use = until(Duration::from_secs(60), || async {
        pool.get("o").await.state() == HostState::InUse
    })
    .await;
    assert!(in_use, "host o: {:?}", pool.get("o").await.status);

    // The release's leave fails: the kubelet may still run, so the Node stays, recorded.
    // (The karpenter layer, not running here, would mark the claim drained first.)
    o.fail_leave(true);
    let claims: Api<NodeClaim> = Api::all(pool.client.clone());
    let drained = json!({"metadata": {"annotations": {kpssh::api::DRAINED_ANNOTATION: "true"}}});
    claims
        .patch(CLAIM, &PatchParams::default(), &Patch::Merge(&drained))
        .await
        .expect("mark drained");
    pool.c
        .delete::<NodeClaim>(None, CLAIM, None)
        .await
        .expect("delete claim");
    let released = until(Duration::from_secs(60), || async {
        let h = pool.get("o").await;
        h.claim().is_none() && h.state() == HostState::Unhealthy
    })
    .await;
    assert!(
        released,
        "S24: released Unhealthy: {:?}",
        pool.get("o").await.status
    );
    let recorded = (pool.get("o").await.status).and_then(|s| s.orphan_node);
    pool.node_untouched(CLAIM)
        .await
        .expect("the Node stays while its kubelet may run");

    // Restart: the first controller goes; the kubelet is stopped and leave works again
    // before the next one starts. Only the status remembers the Node.
    first.shutdown(Duration::from_secs(10)).await;
    o.fail_leave(false);
    o.kubelet(false);
    let second = pool.controller(Duration::from_secs(2)).await;
    let gone = until(Duration::from_secs(60), || pool.node_gone(CLAIM)).await;
    assert!(
        gone,
        "#23: the orphan Node must be deleted after a restart: {:?}",
        pool.nodes()
            .get_opt(CLAIM)
            .await
            .ok()
            .flatten()
            .map(|n| n.metadata)
    );
    assert_eq!(
        recorded,
        Some(OrphanNode {
            name: CLAIM.into(),
            provider_id: Some(provider_id.clone()),
        }),
        "the Node was recorded in status.orphanNode by the failed release"
    );
    let cleared = until(Duration::from_secs(30), || async {
        let h = pool.get("o").await;
        h.state() == HostState::Available
            && h.status.as_ref().is_some_and(|s| s.orphan_node.is_none())
    })
    .await;
    assert!(cleared, "host o: {:?}", pool.get("o").await.status);
    second.shutdown(Duration::from_secs(10)).await;
}
