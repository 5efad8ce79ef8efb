//! E11: a real kubelet joins through the shipped `examples/profiles/tls-bootstrap.yaml` and runs
//! real pods. The host is a [`NodeHost`] (own pid, network and mount namespaces; sshd; no
//! systemd, so the profile's own supervision runs containerd and the kubelet); the kubelet is
//! built from the control plane's `k8s.io/kubernetes` module, containerd, runc and the CNI
//! plugins are Debian's, and both images are OCI archives of a static binary
//! (`scripts/node.sh`, `tests/node/`) that join imports: nothing is pulled from a registry.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use k8s_openapi::api::apps::v1::{DaemonSet, Deployment};
use k8s_openapi::api::certificates::v1::CertificateSigningRequest;
use k8s_openapi::api::core::v1::{Node, Pod};
use kpssh::api::{HOST_CLASS_LABEL, HostState, SSHHost, SSHJoinProfile, SSHNodeClass};
use kube::api::{ListParams, PostParams};
use sha2::{Digest, Sha256};

use crate::nodehost::NodeHost;
use crate::world::{KEY_SECRET, POOL_NS, SCENARIO_LABEL, Sc, node_ready};

const APP_IMAGE: &str = "kpssh.test/e11-app:1";
const PAUSE_IMAGE: &str = "kpssh.test/pause:1";
/// The host's pod subnet (the profile's cniBridgeSubnet): the bridge lives in its netns.
const POD_SUBNET_PREFIX: &str = "10.244.0.";

/// What `scripts/node.sh` built: the kubelet and the image archives' directory.
struct Artifacts {
    kubelet: PathBuf,
    sha256: String,
    minor: String,
    version: String,
    images: PathBuf,
}

/// `KPSSH_NODE_KUBELET` and `KPSSH_NODE_IMAGES` (set by scripts/test.sh), else
/// `scripts/node.sh`'s answer. Never skipped: a missing piece fails with the reason.
fn artifacts() -> Result<Artifacts, String> {
    let (kubelet, images) = match (
        std::env::var_os("KPSSH_NODE_KUBELET"),
        std::env::var_os("KPSSH_NODE_IMAGES"),
    ) {
        (Some(k), Some(i)) => (PathBuf::from(k), PathBuf::from(i)),
        _ => {
            let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/node.sh");
            let out = std::process::Command::new(&script)
                .output()
                .map_err(|e| format!("E11 needs {}: {e}", script.display()))?;
            let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
            if !out.status.success() {
                return Err(format!(
                    "scripts/node.sh failed (E11 needs its kubelet and images): {}",
                    String::from_utf8_lossy(&out.stderr)
                ));
            }
            let get = |k: &str| {
                stdout
                    .lines()
                    .find_map(|l| l.strip_prefix(k))
                    .map(PathBuf::from)
                    .ok_or_else(|| format!("scripts/node.sh printed no {k}: {stdout}"))
            };
            (get("kubelet=")?, get("images=")?)
        }
    };
    for f in [
        kubelet.clone(),
        images.join("pause.tar"),
        images.join("app.tar"),
    ] {
        if !f.is_file() {
            return Err(format!(
                "E11 needs {} (scripts/node.sh builds it)",
                f.display()
            ));
        }
    }
    let bytes = std::fs::read(&kubelet).map_err(|e| format!("read kubelet: {e}"))?;
    let sha256 = format!("{:x}", Sha256::digest(&bytes));
    let out = std::process::Command::new(&kubelet)
        .arg("--version")
        .output()
        .map_err(|e| format!("kubelet --version: {e}"))?;
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let version = text
        .trim()
        .strip_prefix("Kubernetes ")
        .ok_or_else(|| format!("kubelet --version said {text:?}"))?
        .to_string();
    let minor = version
        .split('.')
        .nth(1)
        .ok_or_else(|| format!("no minor in {version}"))?
        .to_string();
    Ok(Artifacts {
        kubelet,
        sha256,
        minor,
        version,
        images,
    })
}

pub async fn e11(sc: &mut Sc) -> Result<(), String> {
    let art = artifacts()?;
    let mut host = NodeHost::start(&sc.world.base, &sc.host_name(0));
    host.authorize(&sc.world.client_key.public);
    let port: u16 = sc
        .world
        .cp
        .server()
        .rsplit(':')
        .next()
        .and_then(|p| p.parse().ok())
        .ok_or("the API server URL has no port")?;
    host.relay_api_server(port);
    let outcome = run(sc, &host, &art).await;
    outcome.map_err(|e| format!("{e}\n{}", host.describe()))
}

async fn run(sc: &Sc, host: &NodeHost, art: &Artifacts) -> Result<(), String> {
    setup(sc, host, art).await?;
    sc.wait("host Available", Duration::from_secs(90), || async {
        Ok((sc.host_state(0).await? == HostState::Available).then_some(()))
    })
    .await?;
    create_in(sc, daemonset(&sc.id, &sc.ns, "agent")).await?;
    create_in(sc, daemonset(&sc.id, &sc.ns, "netagent")).await?;
    create_in(sc, deployment(&sc.id, &sc.ns, 1)).await?;

    // Cold: install and join over SSH, TLS bootstrap, Ready with kpssh's provider ID.
    let node = up(sc, art, "first").await?;
    check_bootstrap(sc, &node).await?;
    let app = running_pod(sc, &node, "app").await?;
    running_pod(sc, &node, "agent").await?;
    running_pod(sc, &node, "netagent").await?;
    check_container_ran(host, &app)?;
    if (host.phase_runs("install"), host.phase_runs("join")) != (1, 1) {
        return Err(format!(
            "one install and one join expected:\n{}",
            host.sessions()
        ));
    }

    // Demand drops: the Deployment goes to zero, the Node is empty but for the DaemonSet pods;
    // consolidation drains it (the eviction is what stops the agent while the Node is still
    // there; the netagent tolerates the drain), leave stops kubelet, the netagent and the
    // runtime, the Node goes, the host is warm.
    sc.scale(0).await?;
    let agent_evicted = drained(sc, &node).await?;
    if !agent_evicted {
        return Err(
            "the DaemonSet pod still ran when its Node went: the drain did not evict it".into(),
        );
    }
    sc.consolidated(0, &node).await?;
    if host.phase_runs("leave") != 1 {
        return Err(format!("one leave expected:\n{}", host.sessions()));
    }
    let left: Vec<_> = host
        .processes()
        .into_iter()
        .filter(|(_, c)| {
            c == "kubelet" || c.starts_with("containerd") || c == "pause" || c == "app"
        })
        .collect();
    if !left.is_empty() {
        return Err(format!("leave left processes running: {left:?}"));
    }
    if !host.read("/etc/kubernetes/kubelet.conf").is_empty() {
        return Err("leave kept the kubelet's kubeconfig".into());
    }

    // Warm: a second pod brings the host back with join alone.
    sc.scale(1).await?;
    let again = up(sc, art, "second").await?;
    if again == node {
        return Err(format!("the rejoined Node reuses the old name {node}"));
    }
    running_pod(sc, &again, "app").await?;
    if (host.phase_runs("install"), host.phase_runs("join")) != (1, 2) {
        return Err(format!(
            "the rejoin must be warm (join only):\n{}",
            host.sessions()
        ));
    }
    println!(
        "[{}] kubelet {} on containerd: cold join {node}, warm rejoin {again}",
        sc.id, art.version
    );
    Ok(())
}

/// The SSHHost, the shipped profile, a node class with the vars this host needs, the NodePool.
async fn setup(sc: &Sc, host: &NodeHost, art: &Artifacts) -> Result<(), String> {
    let obj: SSHHost = serde_json::from_value(serde_json::json!({
        "apiVersion": "karpenter.dklesev.github.io/v1beta1",
        "kind": "SSHHost",
        "metadata": {"name": sc.host_name(0), "namespace": POOL_NS,
            "labels": {HOST_CLASS_LABEL: sc.id}},
        "spec": {"address": host.address, "port": host.port, "user": host.user,
            "sshKeySecretRef": {"name": KEY_SECRET},
            "capacity": {"cpu": "2", "memory": "4Gi"}},
    }))
    .map_err(|e| format!("SSHHost: {e}"))?;
    sc.ns_api::<SSHHost>(POOL_NS)
        .create(&PostParams::default(), &obj)
        .await
        .map_err(|e| format!("create SSHHost: {e}"))?;
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/profiles/tls-bootstrap.yaml");
    let text = std::fs::read_to_string(&path).map_err(|e| format!("{}: {e}", path.display()))?;
    let profile: SSHJoinProfile =
        serde_yaml::from_str(&text).map_err(|e| format!("{}: {e}", path.display()))?;
    create(sc, profile).await?;
    use base64::Engine as _;
    let ca = base64::engine::general_purpose::STANDARD.encode(&sc.world.cp.pki().ca_cert);
    // The disk this runs on is shared and may be fuller than the kubelet's default eviction
    // thresholds allow; image GC stays off so the imported images stay.
    let kubelet_config = "{evictionHard: {nodefs.available: 1%, imagefs.available: 1%, memory.available: 50Mi}, \
         imageGCHighThresholdPercent: 100, imageGCLowThresholdPercent: 99}";
    let class: SSHNodeClass = serde_json::from_value(serde_json::json!({
        "apiVersion": "karpenter.dklesev.github.io/v1beta1",
        "kind": "SSHNodeClass",
        "metadata": {"name": sc.id},
        "spec": {
            "hostSelector": {"matchLabels": {HOST_CLASS_LABEL: sc.id}},
            "joinProfileRef": {"name": "tls-bootstrap"},
            "cluster": {"endpoint": sc.world.cp.server(), "caBundle": ca},
            "vars": {
                "k8sMinor": art.minor,
                "kubeletURL": format!("file://{}", art.kubelet.display()),
                "kubeletSHA256": art.sha256,
                "imageArchives": art.images.display().to_string(),
                "sandboxImage": PAUSE_IMAGE,
                "cniBridgeSubnet": format!("{POD_SUBNET_PREFIX}0/24"),
                "cgroupRoot": host.cgroup_root,
                "allowCgroupV1": "true",
                "kubeletConfig": kubelet_config,
            },
        },
    }))
    .map_err(|e| format!("SSHNodeClass: {e}"))?;
    create(sc, class).await?;
    sc.nodepool("5s").await;
    Ok(())
}

async fn create<K>(sc: &Sc, obj: K) -> Result<(), String>
where
    K: kube::Resource<Scope = k8s_openapi::ClusterResourceScope>
        + Clone
        + serde::Serialize
        + serde::de::DeserializeOwned
        + std::fmt::Debug,
    K::DynamicType: Default,
{
    sc.api::<K>()
        .create(&PostParams::default(), &obj)
        .await
        .map(|_| ())
        .map_err(|e| format!("create {:?}: {e}", obj.meta().name))
}

async fn create_in<K>(sc: &Sc, obj: K) -> Result<(), String>
where
    K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope>
        + Clone
        + serde::Serialize
        + serde::de::DeserializeOwned
        + std::fmt::Debug,
    K::DynamicType: Default,
{
    sc.ns_api::<K>(&sc.ns)
        .create(&PostParams::default(), &obj)
        .await
        .map(|_| ())
        .map_err(|e| format!("create {:?}: {e}", obj.meta().name))
}

fn pod_spec(id: &str, name: &str) -> serde_json::Value {
    serde_json::json!({
        "metadata": {"labels": {"app": format!("{id}-{name}")}},
        "spec": {
            "nodeSelector": {SCENARIO_LABEL: id},
            "terminationGracePeriodSeconds": 10,
            "containers": [{"name": name, "image": APP_IMAGE, "imagePullPolicy": "Never",
                "readinessProbe": {"httpGet": {"path": "/", "port": 8080}, "periodSeconds": 2},
                "resources": {"requests": {"cpu": "50m", "memory": "32Mi"}}}],
        },
    })
}

fn deployment(id: &str, ns: &str, replicas: i32) -> Deployment {
    serde_json::from_value(serde_json::json!({
        "metadata": {"name": "app", "namespace": ns},
        "spec": {"replicas": replicas, "selector": {"matchLabels": {"app": format!("{id}-app")}},
            "template": pod_spec(id, "app")},
    }))
    .expect("Deployment")
}

/// A node agent: every node of the scenario's pool runs one. `agent` is what the drain has to
/// evict; `netagent` tolerates every taint (as CNI agents and kube-proxy do), so the drain
/// leaves it running and leave has to stop it.
fn daemonset(id: &str, ns: &str, name: &str) -> DaemonSet {
    let mut template = pod_spec(id, name);
    if name == "netagent" {
        template["spec"]["tolerations"] = serde_json::json!([{"operator": "Exists"}]);
    }
    serde_json::from_value(serde_json::json!({
        "metadata": {"name": name, "namespace": ns},
        "spec": {"selector": {"matchLabels": {"app": format!("{id}-{name}")}},
            "template": template},
    }))
    .expect("DaemonSet")
}

/// A NodeClaim for the pending pod, then its Node Ready with the host's provider ID, run by
/// the real kubelet of this version on containerd. Returns the Node's name.
async fn up(sc: &Sc, art: &Artifacts, which: &str) -> Result<String, String> {
    let claim = sc
        .wait(
            &format!("the {which} NodeClaim"),
            Duration::from_secs(90),
            || async {
                Ok(sc
                    .nodeclaims()
                    .await?
                    .into_iter()
                    .find(|c| c.metadata.deletion_timestamp.is_none()))
            },
        )
        .await?;
    let claim_name = claim.metadata.name.clone().unwrap_or_default();
    let node = sc
        .wait(
            &format!("the {which} Node registered by the real kubelet and Ready"),
            Duration::from_secs(240),
            || async { Ok(sc.node_of(0).await?.filter(node_ready)) },
        )
        .await?;
    let name = node.metadata.name.clone().unwrap_or_default();
    if name != claim_name {
        return Err(format!(
            "Node {name} is not named after NodeClaim {claim_name}"
        ));
    }
    let info = node
        .status
        .as_ref()
        .and_then(|s| s.node_info.clone())
        .ok_or("the Node has no nodeInfo")?;
    if info.kubelet_version != art.version
        || !info.container_runtime_version.starts_with("containerd://")
    {
        return Err(format!(
            "Node {name} runs kubelet {} on {}, expected {} on containerd",
            info.kubelet_version, info.container_runtime_version, art.version
        ));
    }
    sc.wait(
        &format!("host InUse ({which})"),
        Duration::from_secs(60),
        || async { Ok((sc.host_state(0).await? == HostState::InUse).then_some(())) },
    )
    .await?;
    Ok(name)
}

/// The kubelet's client certificate came from a CSR of the kpssh bootstrap token, approved by
/// kube-controller-manager.
async fn check_bootstrap(sc: &Sc, node: &str) -> Result<(), String> {
    let cn = format!("system:node:{node}");
    let csrs = sc
        .api::<CertificateSigningRequest>()
        .list(&ListParams::default())
        .await
        .map_err(|e| format!("list CSRs: {e}"))?;
    let ours = csrs.items.iter().find(|c| {
        c.spec
            .username
            .as_deref()
            .is_some_and(|u| u.starts_with("system:bootstrap:"))
            && crate::scale::csr_subject_is(c, &cn)
    });
    let Some(csr) = ours else {
        return Err(format!("no CSR for {cn} from a bootstrap token"));
    };
    let issued = csr
        .status
        .as_ref()
        .is_some_and(|s| s.certificate.as_ref().is_some_and(|c| !c.0.is_empty()))
        && csr
            .status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .is_some_and(|c| c.iter().any(|c| c.type_ == "Approved"));
    if !issued {
        return Err(format!("the CSR for {cn} was not approved and signed"));
    }
    Ok(())
}

/// The pod `name` (`app`, `agent`, `netagent`) Running and Ready on `node`: its container started by
/// containerd, its IP from the host's bridge, the kubelet's HTTP readiness probe answered.
async fn running_pod(sc: &Sc, node: &str, name: &str) -> Result<Pod, String> {
    let label = format!("app={}-{name}", sc.id);
    sc.wait(
        &format!("the {name} pod Running and Ready on {node}"),
        Duration::from_secs(120),
        || async {
            let pods = sc
                .ns_api::<Pod>(&sc.ns)
                .list(&ListParams::default().labels(&label))
                .await
                .map_err(|e| format!("list pods: {e}"))?;
            Ok(pods.items.into_iter().find(|p| {
                let on = p.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(node);
                let st = p.status.as_ref();
                let ready = st
                    .and_then(|s| s.conditions.as_ref())
                    .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"));
                let containerd = st
                    .and_then(|s| s.container_statuses.as_ref())
                    .and_then(|c| c.first())
                    .and_then(|c| c.container_id.as_deref())
                    .is_some_and(|id| id.starts_with("containerd://"));
                let bridged = st
                    .and_then(|s| s.pod_ip.as_deref())
                    .is_some_and(|ip| ip.starts_with(POD_SUBNET_PREFIX));
                on && ready && containerd && bridged
            }))
        },
    )
    .await
}

/// The workload's own output, from the log file the kubelet keeps on the host.
fn check_container_ran(host: &NodeHost, pod: &Pod) -> Result<(), String> {
    let m = &pod.metadata;
    let dir = format!(
        "/var/log/pods/{}_{}_{}/app",
        m.namespace.as_deref().unwrap_or_default(),
        m.name.as_deref().unwrap_or_default(),
        m.uid.as_deref().unwrap_or_default()
    );
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let log = std::fs::read_dir(host.private_path(&dir))
            .into_iter()
            .flatten()
            .flatten()
            .map(|e| std::fs::read_to_string(e.path()).unwrap_or_default())
            .collect::<String>();
        if log.contains("kpssh-e11 app") && log.contains("listening on :8080") {
            return Ok(());
        }
        if Instant::now() > deadline {
            return Err(format!(
                "the app container's log in {dir} lacks its line: {log:?}"
            ));
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// Wait until the Node is gone; whether the DaemonSet pod stopped first (evicted by the drain,
/// not collected with its deleted Node).
async fn drained(sc: &Sc, node: &str) -> Result<bool, String> {
    let label = format!("app={}-agent", sc.id);
    let mut agent_gone_first = false;
    let started = Instant::now();
    loop {
        let agents = sc
            .ns_api::<Pod>(&sc.ns)
            .list(&ListParams::default().labels(&label))
            .await
            .map_err(|e| format!("list pods: {e}"))?;
        // Evicted, the agent is stopped by the kubelet (its process exits 0 on SIGTERM:
        // Succeeded) and deleted; the drain is done with it once it is terminal.
        let on_node = agents.items.iter().any(|p| {
            p.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(node)
                && !matches!(
                    p.status.as_ref().and_then(|s| s.phase.as_deref()),
                    Some("Succeeded" | "Failed")
                )
        });
        let exists = sc
            .api::<Node>()
            .get_opt(node)
            .await
            .map_err(|e| e.to_string())?
            .is_some();
        if !on_node && exists {
            agent_gone_first = true;
        }
        if !exists {
            println!(
                "[{}] the Node drained and deleted after {:.1}s",
                sc.id,
                started.elapsed().as_secs_f64()
            );
            return Ok(agent_gone_first);
        }
        if started.elapsed() > Duration::from_secs(180) {
            return Err(format!(
                "Node {node} was not drained and deleted within 180s"
            ));
        }
        if !sc.world.controller_running() {
            return Err("the controller process exited".into());
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}
