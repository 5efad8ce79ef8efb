//! The shared world of the tier (control plane, bootstrap RBAC, the controller process) and
//! one scenario's context (`Sc`): its namespace, hosts, node class, NodePool, waits and the
//! failure dump.

#![allow(dead_code)]
use std::collections::BTreeMap;
use std::future::Future;
use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Condvar, Mutex};
use std::time::{Duration, Instant};

use base64::Engine as _;
use k8s_openapi::ByteString;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Event, Namespace, Node, Pod, Secret, ServiceAccount};
use k8s_openapi::api::rbac::v1::ClusterRoleBinding;
use kpssh::api::host::ExecMode as HostExecMode;
use kpssh::api::profile::{Scripts, Timeouts};
use kpssh::api::{
    HOST_CLASS_LABEL, HostState, NodeClaim, NodePool, SSHHost, SSHJoinProfile, SSHJoinProfileSpec,
    SSHNodeClass, crds,
};
use kube::api::{Api, ListParams, ObjectMeta, Patch, PatchParams, PostParams};
use serde::Deserialize;

use crate::controlplane::ControlPlane;
use crate::sshd::{KeyPair, keygen};
use crate::testhost::{ExecMode, TestHost, tail};

pub const POOL_NS: &str = "kpssh-system";
pub const KEY_SECRET: &str = "e2e-ssh-key";
/// Label of every scenario's NodePool template and pod node selector.
pub const SCENARIO_LABEL: &str = "e2e.kpssh.dev/scenario";

pub struct World {
    pub cp: &'static ControlPlane,
    /// Machine roots, keys, profiles: removed by [`World::stop`].
    pub base: PathBuf,
    pub client_key: KeyPair,
    /// Trusted signer of the verified profiles.
    pub signer: KeyPair,
    /// A key nobody trusts on the hosts.
    pub rogue: KeyPair,
    controller: Mutex<Option<Child>>,
    controller_log: PathBuf,
    /// Set once the controller process was started ([`World::start_controller`]).
    started: AtomicBool,
    /// Scenarios that prepare the cluster before the controller starts (E9), still preparing.
    preparing: Mutex<usize>,
    changed: Condvar,
}

impl World {
    /// Control plane with scheduler and controller-manager, CRDs, the shipped bootstrap RBAC,
    /// the pool namespace and SSH key Secret. The real `kpssh controller` process starts with
    /// [`World::start_controller`].
    pub fn start() -> World {
        let base = tempfile::Builder::new()
            .prefix("kpssh-e2e-")
            .tempdir()
            .expect("tempdir")
            .keep();
        // The hosts' account (not root) reaches the machine roots below.
        std::fs::set_permissions(&base, std::os::unix::fs::PermissionsExt::from_mode(0o755))
            .expect("chmod base");
        let cp = ControlPlane::shared();
        cp.start_scheduler();
        cp.start_controller_manager();
        let keys = base.join("keys");
        std::fs::create_dir_all(&keys).expect("keys dir");
        let client_key = keygen(&keys, "controller", "ed25519", None);
        let signer = keygen(&keys, "signer", "ed25519", None);
        let rogue = keygen(&keys, "rogue", "ed25519", None);
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        rt.block_on(async {
            let yaml = format!(
                "{}{}",
                crds::to_yaml(&crds::kpssh_crds()).expect("yaml"),
                crds::to_yaml(&crds::karpenter_crds()).expect("yaml")
            );
            cp.install_crds(&yaml).await;
            let client = cp.client().await;
            create(&Api::<Namespace>::all(client.clone()), &namespace(POOL_NS)).await;
            let rbac = std::fs::read_to_string(
                Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/bootstrap-rbac.yaml"),
            )
            .expect("examples/bootstrap-rbac.yaml");
            let crbs: Api<ClusterRoleBinding> = Api::all(client.clone());
            for doc in serde_yaml::Deserializer::from_str(&rbac) {
                let crb = ClusterRoleBinding::deserialize(doc).expect("ClusterRoleBinding");
                create(&crbs, &crb).await;
            }
            let secret = Secret {
                metadata: ObjectMeta {
                    name: Some(KEY_SECRET.into()),
                    namespace: Some(POOL_NS.into()),
                    ..Default::default()
                },
                data: Some(BTreeMap::from([(
                    "privateKey".to_string(),
                    ByteString(client_key.private.clone().into_bytes()),
                )])),
                ..Default::default()
            };
            create(&Api::<Secret>::namespaced(client, POOL_NS), &secret).await;
        });
        let controller_log = base.join("controller.log");
        World {
            cp,
            base,
            client_key,
            signer,
            rogue,
            controller: Mutex::new(None),
            controller_log,
            started: AtomicBool::new(false),
            preparing: Mutex::new(0),
            changed: Condvar::new(),
        }
    }

    /// The real `kpssh controller` process, logging to `controller.log`.
    pub fn start_controller(&self) {
        let log = std::fs::File::create(&self.controller_log).expect("controller log");
        let metrics = format!("127.0.0.1:{}", crate::sshd::free_port("127.0.0.1"));
        let health = format!("127.0.0.1:{}", crate::sshd::free_port("127.0.0.1"));
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_kpssh"));
        cmd.args([
            "controller",
            "--pool-namespace",
            POOL_NS,
            "--probe-interval",
            "5s",
            "--metrics-addr",
            &metrics,
            "--health-addr",
            &health,
            "--shutdown-grace",
            "5s",
        ])
        .env("KUBECONFIG", self.cp.kubeconfig_path())
        .env("RUST_LOG", "info,kpssh=debug")
        .stdin(Stdio::null())
        .stdout(log.try_clone().expect("log"))
        .stderr(log);
        // SAFETY: prctl is async-signal-safe; nothing else runs between fork and exec.
        unsafe {
            cmd.pre_exec(|| {
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
                Ok(())
            });
        }
        let child = cmd.spawn().expect("spawn kpssh controller");
        *self.controller.lock().unwrap_or_else(|e| e.into_inner()) = Some(child);
        self.started.store(true, Ordering::SeqCst);
        let _guard = self.preparing.lock().unwrap_or_else(|e| e.into_inner());
        self.changed.notify_all();
    }

    /// `n` scenarios prepare the cluster before the controller starts.
    pub fn expect_preparations(&self, n: usize) {
        *self.preparing.lock().unwrap_or_else(|e| e.into_inner()) = n;
    }

    /// One preparing scenario is done (or gave up).
    pub fn prepared(&self) {
        let mut p = self.preparing.lock().unwrap_or_else(|e| e.into_inner());
        *p = p.saturating_sub(1);
        self.changed.notify_all();
    }

    /// Wait (at most `limit`) until every preparing scenario is done.
    pub fn wait_prepared(&self, limit: Duration) {
        let p = self.preparing.lock().unwrap_or_else(|e| e.into_inner());
        let _ = self.changed.wait_timeout_while(p, limit, |p| *p > 0);
    }

    /// Block until the controller process was started.
    pub fn wait_started(&self) {
        let mut p = self.preparing.lock().unwrap_or_else(|e| e.into_inner());
        while !self.started.load(Ordering::SeqCst) {
            p = self.changed.wait(p).unwrap_or_else(|e| e.into_inner());
        }
    }

    pub fn controller_log(&self) -> String {
        std::fs::read_to_string(&self.controller_log).unwrap_or_default()
    }

    /// Whether the controller process still runs (it must, through the whole tier; before it
    /// was started, it counts as running).
    pub fn controller_running(&self) -> bool {
        if !self.started.load(Ordering::SeqCst) {
            return true;
        }
        let mut guard = self.controller.lock().unwrap_or_else(|e| e.into_inner());
        guard
            .as_mut()
            .is_some_and(|c| matches!(c.try_wait(), Ok(None)))
    }

    /// SIGTERM to the controller (bounded wait, then SIGKILL) and remove the run directory.
    pub fn stop(&self) {
        let mut guard = self.controller.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(mut child) = guard.take() {
            if let Ok(pid) = i32::try_from(child.id()) {
                // SAFETY: a plain syscall to our own child.
                unsafe {
                    libc::kill(pid, libc::SIGTERM);
                }
            }
            let deadline = Instant::now() + Duration::from_secs(15);
            while matches!(child.try_wait(), Ok(None)) && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(100));
            }
            let _ = child.kill();
            let _ = child.wait();
        }
        if std::env::var_os("KPSSH_E2E_KEEP").is_none() {
            let _ = std::fs::remove_dir_all(&self.base);
        } else {
            eprintln!("e2e: kept {}", self.base.display());
        }
    }
}

fn namespace(name: &str) -> Namespace {
    Namespace {
        metadata: ObjectMeta {
            name: Some(name.into()),
            ..Default::default()
        },
        ..Default::default()
    }
}

async fn create<K>(api: &Api<K>, obj: &K)
where
    K: kube::Resource + Clone + serde::Serialize + serde::de::DeserializeOwned + std::fmt::Debug,
{
    match api.create(&PostParams::default(), obj).await {
        Ok(_) => {}
        Err(kube::Error::Api(e)) if e.code == 409 => {}
        Err(e) => panic!("create {:?}: {e}", obj.meta().name),
    }
}

/// One scenario: id `e1`…`e8` names its namespace `e2e-<id>`, node class, NodePool,
/// profile and hosts `<id>-h<n>`.
pub struct Sc {
    pub id: String,
    pub world: &'static World,
    pub client: kube::Client,
    pub hosts: Vec<TestHost>,
    pub ns: String,
    /// Whether this scenario told the world it finished preparing (see [`Sc::prepared`]).
    pub signalled: bool,
}

/// A wait's answer: `Some(value)` when done.
pub type Poll<T> = Result<Option<T>, String>;

impl Sc {
    pub async fn new(world: &'static World, id: &str) -> Sc {
        let client = world.cp.client().await;
        let ns = format!("e2e-{id}");
        create(&Api::<Namespace>::all(client.clone()), &namespace(&ns)).await;
        // Pods are refused until kube-controller-manager made the namespace's default
        // ServiceAccount.
        let sas: Api<ServiceAccount> = Api::namespaced(client.clone(), &ns);
        let deadline = Instant::now() + Duration::from_secs(60);
        while !matches!(sas.get_opt("default").await, Ok(Some(_))) {
            assert!(
                Instant::now() < deadline,
                "no default ServiceAccount in {ns}"
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        Sc {
            id: id.to_string(),
            world,
            client,
            hosts: Vec::new(),
            ns,
            signalled: false,
        }
    }

    /// A preparing scenario (E9) set the cluster up: the controller may start.
    pub fn prepared(&mut self) {
        if !self.signalled {
            self.signalled = true;
            self.world.prepared();
        }
    }

    pub fn host_name(&self, i: usize) -> String {
        format!("{}-h{i}", self.id)
    }

    pub fn provider_id(&self, i: usize) -> String {
        format!("kpssh://{POOL_NS}/{}", self.host_name(i))
    }

    pub fn api<K>(&self) -> Api<K>
    where
        K: kube::Resource<Scope = k8s_openapi::ClusterResourceScope>,
        K::DynamicType: Default,
    {
        Api::all(self.client.clone())
    }

    pub fn ns_api<K>(&self, ns: &str) -> Api<K>
    where
        K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope>,
        K::DynamicType: Default,
    {
        Api::namespaced(self.client.clone(), ns)
    }

    /// A new machine and its SSHHost (class = the scenario id).
    pub async fn add_host(
        &mut self,
        mode: ExecMode,
        trusted_signers: Option<Vec<String>>,
    ) -> usize {
        let host = TestHost::start(&self.world.base, mode);
        host.authorize(&self.world.client_key.public);
        let i = self.hosts.len();
        let verified = trusted_signers.is_some();
        let mut obj: SSHHost = serde_json::from_value(serde_json::json!({
            "apiVersion": "karpenter.dklesev.github.io/v1beta1",
            "kind": "SSHHost",
            "metadata": {"name": self.host_name(i), "namespace": POOL_NS,
                "labels": {HOST_CLASS_LABEL: self.id}},
            "spec": {"address": host.address, "port": host.port, "user": host.user,
                "sshKeySecretRef": {"name": KEY_SECRET},
                "capacity": {"cpu": "2", "memory": "4Gi"}},
        }))
        .expect("SSHHost");
        if verified {
            obj.spec.exec_mode = HostExecMode::Verified;
            obj.spec.trusted_signers = trusted_signers;
        }
        self.hosts.push(host);
        let api: Api<SSHHost> = self.ns_api(POOL_NS);
        api.create(&PostParams::default(), &obj)
            .await
            .expect("create SSHHost");
        i
    }

    pub async fn host(&self, i: usize) -> Result<SSHHost, String> {
        self.ns_api::<SSHHost>(POOL_NS)
            .get(&self.host_name(i))
            .await
            .map_err(|e| format!("get SSHHost: {e}"))
    }

    /// The SSHNodeClass (selecting this scenario's hosts) and its profile.
    pub async fn class_and_profile(&self, profile: SSHJoinProfile) {
        let name = profile.metadata.name.clone().expect("profile name");
        create(&self.api::<SSHJoinProfile>(), &profile).await;
        let ca = base64::engine::general_purpose::STANDARD.encode(&self.world.cp.pki().ca_cert);
        let class: SSHNodeClass = serde_json::from_value(serde_json::json!({
            "apiVersion": "karpenter.dklesev.github.io/v1beta1",
            "kind": "SSHNodeClass",
            "metadata": {"name": self.id},
            "spec": {
                "hostSelector": {"matchLabels": {HOST_CLASS_LABEL: self.id}},
                "joinProfileRef": {"name": name},
                "cluster": {"endpoint": self.world.cp.server(), "caBundle": ca},
            },
        }))
        .expect("SSHNodeClass");
        create(&self.api::<SSHNodeClass>(), &class).await;
    }

    /// A NodePool for this scenario's class; its nodes carry the scenario label.
    pub async fn nodepool(&self, consolidate_after: &str) {
        let pool: NodePool = serde_json::from_value(serde_json::json!({
            "apiVersion": "karpenter.sh/v1",
            "kind": "NodePool",
            "metadata": {"name": self.id},
            "spec": {
                "template": {
                    "metadata": {"labels": {SCENARIO_LABEL: self.id}},
                    "spec": {"nodeClassRef": {"group": "karpenter.dklesev.github.io",
                        "kind": "SSHNodeClass", "name": self.id}},
                },
                "disruption": {"consolidationPolicy": "WhenEmpty", "consolidateAfter": consolidate_after},
            },
        }))
        .expect("NodePool");
        create(&self.api::<NodePool>(), &pool).await;
    }

    fn pod_template(&self) -> serde_json::Value {
        serde_json::json!({
            "metadata": {"labels": {"app": self.id}},
            "spec": {
                "nodeSelector": {SCENARIO_LABEL: self.id},
                "terminationGracePeriodSeconds": 5,
                "containers": [{"name": "app", "image": "registry.invalid/e2e:1",
                    "resources": {"requests": {"cpu": "100m", "memory": "64Mi"}}}],
            },
        })
    }

    pub async fn deployment(&self, replicas: i32) {
        let d: Deployment = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "app", "namespace": self.ns},
            "spec": {"replicas": replicas, "selector": {"matchLabels": {"app": self.id}},
                "template": self.pod_template()},
        }))
        .expect("Deployment");
        create(&self.ns_api::<Deployment>(&self.ns), &d).await;
    }

    /// A bare pod (no controller re-creates it).
    pub async fn bare_pod(&self) {
        let mut v = self.pod_template();
        v["metadata"]["name"] = serde_json::json!("app");
        let p: Pod = serde_json::from_value(v).expect("Pod");
        create(&self.ns_api::<Pod>(&self.ns), &p).await;
    }

    pub async fn scale(&self, replicas: i32) -> Result<(), String> {
        self.ns_api::<Deployment>(&self.ns)
            .patch(
                "app",
                &PatchParams::default(),
                &Patch::Merge(serde_json::json!({"spec": {"replicas": replicas}})),
            )
            .await
            .map(|_| ())
            .map_err(|e| format!("scale: {e}"))
    }

    pub async fn nodeclaims(&self) -> Result<Vec<NodeClaim>, String> {
        self.api::<NodeClaim>()
            .list(&ListParams::default().labels(&format!("karpenter.sh/nodepool={}", self.id)))
            .await
            .map(|l| l.items)
            .map_err(|e| format!("list NodeClaims: {e}"))
    }

    pub async fn node_of(&self, i: usize) -> Result<Option<Node>, String> {
        let pid = self.provider_id(i);
        let nodes = self
            .api::<Node>()
            .list(&ListParams::default())
            .await
            .map_err(|e| format!("list Nodes: {e}"))?;
        Ok(nodes
            .items
            .into_iter()
            .find(|n| n.spec.as_ref().and_then(|s| s.provider_id.as_deref()) == Some(&pid)))
    }

    pub async fn pods(&self) -> Result<Vec<Pod>, String> {
        self.ns_api::<Pod>(&self.ns)
            .list(&ListParams::default())
            .await
            .map(|l| l.items)
            .map_err(|e| format!("list pods: {e}"))
    }

    pub async fn host_state(&self, i: usize) -> Result<HostState, String> {
        Ok(self.host(i).await?.state())
    }

    /// Poll `f` every 500 ms until it answers `Some`, for at most `limit`.
    pub async fn wait<T, F, Fut>(&self, what: &str, limit: Duration, mut f: F) -> Result<T, String>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Poll<T>>,
    {
        let started = Instant::now();
        let mut last_err = String::new();
        while started.elapsed() < limit {
            match f().await {
                Ok(Some(v)) => {
                    println!(
                        "[{}] {what}: after {:.1}s",
                        self.id,
                        started.elapsed().as_secs_f64()
                    );
                    return Ok(v);
                }
                Ok(None) => {}
                Err(e) => last_err = e,
            }
            if !self.world.controller_running() {
                return Err(format!("{what}: the controller process exited"));
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        Err(format!(
            "timed out after {limit:?} waiting for: {what} {last_err}"
        ))
    }

    /// Hold for `period`, failing as soon as `bad` reports something.
    pub async fn hold<F, Fut>(&self, what: &str, period: Duration, mut bad: F) -> Result<(), String>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<Option<String>, String>>,
    {
        let started = Instant::now();
        while started.elapsed() < period {
            if let Some(problem) = bad().await? {
                return Err(format!(
                    "{what}: after {:.1}s: {problem}",
                    started.elapsed().as_secs_f64()
                ));
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        println!("[{}] {what}: held for {period:?}", self.id);
        Ok(())
    }

    /// E1: from a Deployment's pending pod to a Ready Node with the pod Running on it.
    /// Returns the Node's name.
    pub async fn scale_up(&self, host: usize) -> Result<String, String> {
        self.wait("host Available", Duration::from_secs(90), || async {
            Ok((self.host_state(host).await? == HostState::Available).then_some(()))
        })
        .await?;
        self.deployment(1).await;
        self.up_after_pending(host).await
    }

    /// The pod exists and is pending; wait for NodeClaim, Node Ready, pod Running.
    pub async fn up_after_pending(&self, host: usize) -> Result<String, String> {
        let claim = self
            .wait(
                "a NodeClaim for the pending pod",
                Duration::from_secs(90),
                || async { Ok(self.nodeclaims().await?.into_iter().next()) },
            )
            .await?;
        let claim_name = claim.metadata.name.clone().unwrap_or_default();
        let node = self
            .wait(
                "the Node registered and Ready",
                Duration::from_secs(150),
                || async { Ok(self.node_of(host).await?.filter(node_ready)) },
            )
            .await?;
        let node_name = node.metadata.name.clone().unwrap_or_default();
        if node_name != claim_name {
            return Err(format!(
                "Node {node_name} is not named after NodeClaim {claim_name}"
            ));
        }
        self.wait(
            "the pod Running on the new Node",
            Duration::from_secs(120),
            || async {
                Ok(self
                    .pods()
                    .await?
                    .into_iter()
                    .find(|p| pod_running_on(p, &node_name)))
            },
        )
        .await?;
        self.wait("host InUse", Duration::from_secs(60), || async {
            Ok((self.host_state(host).await? == HostState::InUse).then_some(()))
        })
        .await?;
        Ok(node_name)
    }

    /// E2 path: no pod wants the Node any more → drained, leave, Node deleted, host warm.
    pub async fn consolidated(&self, host: usize, node: &str) -> Result<(), String> {
        self.wait("the Node deleted", Duration::from_secs(150), || async {
            Ok(self
                .api::<Node>()
                .get_opt(node)
                .await
                .map_err(|e| e.to_string())?
                .is_none()
                .then_some(()))
        })
        .await?;
        self.wait(
            "host Available, claim cleared",
            Duration::from_secs(60),
            || async {
                let h = self.host(host).await?;
                Ok((h.state() == HostState::Available && h.claim().is_none()).then_some(()))
            },
        )
        .await?;
        self.wait("the NodeClaim gone", Duration::from_secs(60), || async {
            Ok(self.nodeclaims().await?.is_empty().then_some(()))
        })
        .await
    }

    /// Controller log lines about this scenario, the hosts, and the API objects.
    pub async fn dump(&self) -> String {
        let mut out = format!("--- dump of scenario {}\n", self.id);
        let log = self.world.controller_log();
        let mine: Vec<&str> = log
            .lines()
            .filter(|l| {
                l.contains(&format!("{}-h", self.id)) || l.contains(&format!("\"{}", self.id))
            })
            .collect();
        out.push_str(&format!(
            "controller log ({} lines about {}; last 60):\n{}\n",
            mine.len(),
            self.id,
            tail(&mine.join("\n"), 60)
        ));
        out.push_str(&format!("controller log tail:\n{}\n", tail(&log, 20)));
        for h in &self.hosts {
            out.push_str(&h.describe());
        }
        let yaml = |v: &dyn erased_json::Ser| v.to_yaml();
        for i in 0..self.hosts.len() {
            if let Ok(h) = self.host(i).await {
                out.push_str(&format!("SSHHost {}:\n{}\n", self.host_name(i), yaml(&h)));
            }
        }
        if let Ok(ncs) = self.nodeclaims().await {
            for nc in ncs {
                out.push_str(&format!("NodeClaim:\n{}\n", yaml(&nc)));
            }
        }
        for i in 0..self.hosts.len() {
            if let Ok(Some(n)) = self.node_of(i).await {
                out.push_str(&format!("Node:\n{}\n", yaml(&n)));
            }
        }
        if let Ok(pods) = self.pods().await {
            for p in pods {
                out.push_str(&format!(
                    "Pod {:?}: node {:?} phase {:?}\n",
                    p.metadata.name,
                    p.spec.as_ref().and_then(|s| s.node_name.clone()),
                    p.status.as_ref().and_then(|s| s.phase.clone())
                ));
            }
        }
        for ns in [self.ns.as_str(), "default", POOL_NS] {
            if let Ok(events) = self.ns_api::<Event>(ns).list(&ListParams::default()).await {
                for e in events.items {
                    let name = e.involved_object.name.clone().unwrap_or_default();
                    if name.starts_with(&self.id) || ns == self.ns {
                        out.push_str(&format!(
                            "Event {ns} {} {name}: {} {}\n",
                            e.type_.unwrap_or_default(),
                            e.reason.unwrap_or_default(),
                            e.message.unwrap_or_default()
                        ));
                    }
                }
            }
        }
        out
    }
}

pub fn node_ready(n: &Node) -> bool {
    n.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

pub fn pod_running_on(p: &Pod, node: &str) -> bool {
    p.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(node)
        && p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running")
}

/// The test profile (Raw or, signed, Verified: the scripts are template-free either way).
/// The machine root is `<base>/$KPSSH_HOST_ADDRESS`; every phase appends to `var/log/phases`.
/// join writes the kubelet's join config and enables + starts runtime and kubelet; leave
/// disables + stops both and keeps the kubelet's credentials (a warm host: only the disabled
/// state keeps it out of the cluster after a reboot). A `hold-leave` file in the machine
/// root makes leave wait (E5 cuts the power there).
pub fn profile(name: &str, base: &Path) -> SSHJoinProfile {
    let head = format!(
        "set -euo pipefail\nroot='{}'/\"$KPSSH_HOST_ADDRESS\"\nsvc=\"$root/bin/svc\"\n",
        base.display()
    );
    let install = format!(
        "{head}echo \"install\" >> \"$root/var/log/phases\"\n\
         for u in containerd kubelet; do\n  test -x \"$root/opt/$u\"\n  \
         printf '#!/bin/sh\\nexec %s\\n' \"$root/opt/$u\" > \"$root/etc/units/$u\"\n  \
         chmod 0755 \"$root/etc/units/$u\"\ndone\n"
    );
    let join = format!(
        "{head}echo \"join $KPSSH_NODE_NAME\" >> \"$root/var/log/phases\"\n\
         mkdir -p \"$root/etc/kubelet\"\n\
         ( umask 077\n  for v in KPSSH_CLUSTER_ENDPOINT KPSSH_CLUSTER_CA_B64 KPSSH_BOOTSTRAP_TOKEN KPSSH_NODE_NAME \\\n    \
         KPSSH_PROVIDER_ID KPSSH_NODE_LABELS KPSSH_TAINTS KPSSH_NODE_ADDRESS; do\n    \
         printf '%s=%s\\n' \"$v\" \"${{!v:-}}\"\n  done > \"$root/etc/kubelet/join.env.new\" )\n\
         mv \"$root/etc/kubelet/join.env.new\" \"$root/etc/kubelet/join.env\"\n\
         \"$svc\" enable --now containerd\n\"$svc\" enable kubelet\n\"$svc\" restart kubelet\n"
    );
    let leave = format!(
        "{head}echo \"leave\" >> \"$root/var/log/phases\"\n\
         i=0\nwhile [ -e \"$root/hold-leave\" ] && [ \"$i\" -lt 1200 ]; do sleep 0.1; i=$((i + 1)); done\n\
         \"$svc\" disable --now kubelet containerd\n\
         echo \"left\" >> \"$root/var/log/phases\"\n"
    );
    SSHJoinProfile::new(
        name,
        SSHJoinProfileSpec {
            version: "1".into(),
            scripts: Scripts {
                install,
                join,
                leave,
                uninstall: None,
            },
            timeouts: Timeouts::default(),
            signatures: None,
            signatures_v2: None,
        },
    )
}

/// `kpssh sign` (the real binary and `ssh-keygen`) over `profile` with `key`. Every profile of
/// the run gets the same v2 expiry (30 days after the first signing), so that signatures of
/// two keys over one profile can be mixed (E7).
pub fn sign(profile: &SSHJoinProfile, key: &KeyPair, dir: &Path) -> SSHJoinProfile {
    static EXPIRES: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    let expires = EXPIRES.get_or_init(|| {
        (jiff::Timestamp::now() + jiff::SignedDuration::from_hours(30 * 24))
            .strftime("%Y-%m-%dT%H:%M:%SZ")
            .to_string()
    });
    let name = profile.metadata.name.clone().unwrap_or_default();
    let input = dir.join(format!("{name}.yaml"));
    let output = dir.join(format!("{name}.signed.yaml"));
    std::fs::write(&input, serde_yaml::to_string(profile).expect("yaml")).expect("write");
    let out = Command::new(env!("CARGO_BIN_EXE_kpssh"))
        .arg("sign")
        .arg("--key")
        .arg(&key.private_path)
        .arg("--out")
        .arg(&output)
        .args(["--expires-at", expires])
        .arg(&input)
        .output()
        .expect("run kpssh sign");
    assert!(
        out.status.success(),
        "kpssh sign: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = std::fs::read_to_string(&output).expect("signed profile");
    serde_yaml::from_str(&text).expect("signed profile parses")
}

/// Tiny helper so the dump can print any API object as YAML.
mod erased_json {
    pub trait Ser {
        fn to_yaml(&self) -> String;
    }
    impl<T: serde::Serialize> Ser for T {
        fn to_yaml(&self) -> String {
            let mut v = serde_json::to_value(self).unwrap_or_default();
            if let Some(meta) = v.get_mut("metadata").and_then(|m| m.as_object_mut()) {
                meta.remove("managedFields");
            }
            serde_yaml::to_string(&v).unwrap_or_else(|e| format!("<{e}>"))
        }
    }
}
