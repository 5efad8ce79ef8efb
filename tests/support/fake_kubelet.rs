//! Test support: the daemons of a test host (see `testhost.rs`), run by re-executing the e2e
//! test binary with `KPSSH_E2E_ROLE` set.
//!
//! - `kubelet`: a small but real kubelet as far as the API server can tell. With no client
//!   certificate yet it authenticates with the bootstrap token from its join config, sends a
//!   CSR for `kubernetes.io/kube-apiserver-client-kubelet` (approved and signed by
//!   kube-controller-manager, given the bootstrap RBAC in `examples/bootstrap-rbac.yaml`),
//!   and from then on acts as `system:node:<name>`: registers its Node (provider ID, labels,
//!   taints from the `KPSSH_*` join environment), keeps it Ready and its Lease fresh, reports
//!   pods bound to it as Running and finishes deleting pods being deleted. It registers as
//!   `KPSSH_NODE_NAME` unless the join wrote `KUBELET_NODE_NAME` (and, in Adopt mode where
//!   `KPSSH_PROVIDER_ID` is empty, `KUBELET_PROVIDER_ID`): a join mechanism that names the
//!   Node itself, as nodeadm does on EKS Hybrid (`mi-*`, S53/E10). A deleted Node is
//!   registered again while the kubelet runs (what a restarted kubelet would do) — so an
//!   orphan kubelet that was not stopped shows up as a Node coming back.
//! - `containerd`: the container runtime stand-in; it only runs until stopped.
//!
//! Both exit when SIGTERM arrives, when the owning test process is gone or when the machine
//! root was removed: no daemon survives the test run.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use base64::Engine as _;
use k8s_openapi::ByteString;
use k8s_openapi::api::certificates::v1::{
    CertificateSigningRequest, CertificateSigningRequestSpec,
};
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::api::core::v1::{Node, NodeSpec, Pod, Taint};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use kube::api::{Api, DeleteParams, ListParams, ObjectMeta, Patch, PatchParams, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};

use crate::testhost::{OWNER_ENV, ROLE_ENV, ROOT_ENV};

/// Bound of every API call the kubelet makes.
const CALL_TIMEOUT: Duration = Duration::from_secs(10);
/// Node status, lease and pod sync period.
const SYNC_EVERY: Duration = Duration::from_secs(2);
/// How long a CSR may wait for approval and signing.
const CSR_WAIT: Duration = Duration::from_secs(90);

/// If this process was started as a host daemon, run it and exit; otherwise return.
pub fn run_role_if_asked() {
    let Ok(role) = std::env::var(ROLE_ENV) else {
        return;
    };
    let root = PathBuf::from(std::env::var(ROOT_ENV).unwrap_or_default());
    let owner: u32 = std::env::var(OWNER_ENV)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let code = rt.block_on(async move {
        let work = async {
            match role.as_str() {
                "kubelet" => match kubelet(&root).await {
                    Ok(()) => 0,
                    Err(e) => {
                        eprintln!("kubelet: {e}");
                        1
                    }
                },
                // The runtime has nothing to do but run.
                _ => {
                    std::future::pending::<()>().await;
                    0
                }
            }
        };
        tokio::select! {
            code = work => code,
            _ = sigterm() => { eprintln!("{role}: SIGTERM, stopping"); 0 }
            _ = orphaned(owner, &root) => { eprintln!("{role}: owner gone, exiting"); 0 }
        }
    });
    std::process::exit(code);
}

async fn sigterm() {
    match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
        Ok(mut s) => {
            s.recv().await;
        }
        Err(_) => std::future::pending::<()>().await,
    }
}

/// Resolves once the owning test process is gone or the machine root was removed.
async fn orphaned(owner: u32, root: &Path) {
    loop {
        let owner_alive = owner != 0 && Path::new(&format!("/proc/{owner}")).exists();
        if !owner_alive || !root.exists() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// The join configuration the profile's join wrote: `KPSSH_*=value` lines.
struct JoinConfig {
    endpoint: String,
    ca_pem: String,
    token: String,
    node_name: String,
    provider_id: String,
    labels: BTreeMap<String, String>,
    taints: Vec<Taint>,
    node_address: String,
}

fn read_join_config(root: &Path) -> Result<JoinConfig, String> {
    let path = root.join("etc/kubelet/join.env");
    let text = std::fs::read_to_string(&path).map_err(|e| format!("{}: {e}", path.display()))?;
    let vars: BTreeMap<&str, &str> = text.lines().filter_map(|l| l.split_once('=')).collect();
    let get = |k: &str| vars.get(k).map(|v| v.to_string()).unwrap_or_default();
    let ca = base64::engine::general_purpose::STANDARD
        .decode(get("KPSSH_CLUSTER_CA_B64"))
        .map_err(|e| format!("KPSSH_CLUSTER_CA_B64: {e}"))?;
    let labels = get("KPSSH_NODE_LABELS")
        .split(',')
        .filter_map(|kv| kv.split_once('='))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    let mut taints = Vec::new();
    for t in get("KPSSH_TAINTS").split(',').filter(|t| !t.is_empty()) {
        let (kv, effect) = t
            .rsplit_once(':')
            .ok_or_else(|| format!("taint without effect: {t}"))?;
        let (key, value) = kv.split_once('=').unwrap_or((kv, ""));
        taints.push(Taint {
            key: key.to_string(),
            value: (!value.is_empty()).then(|| value.to_string()),
            effect: effect.to_string(),
            ..Default::default()
        });
    }
    let cfg = JoinConfig {
        endpoint: get("KPSSH_CLUSTER_ENDPOINT"),
        ca_pem: String::from_utf8_lossy(&ca).into_owned(),
        token: get("KPSSH_BOOTSTRAP_TOKEN"),
        // The join mechanism's own choice of name and provider ID, if it made one.
        node_name: Some(get("KUBELET_NODE_NAME"))
            .filter(|n| !n.is_empty())
            .unwrap_or_else(|| get("KPSSH_NODE_NAME")),
        provider_id: Some(get("KPSSH_PROVIDER_ID"))
            .filter(|p| !p.is_empty())
            .unwrap_or_else(|| get("KUBELET_PROVIDER_ID")),
        labels,
        taints,
        node_address: get("KPSSH_NODE_ADDRESS"),
    };
    if cfg.endpoint.is_empty() || cfg.node_name.is_empty() || cfg.node_address.is_empty() {
        return Err("join config lacks the endpoint, node name or node address".into());
    }
    Ok(cfg)
}

async fn client(cfg: &JoinConfig, user: &str) -> Result<kube::Client, String> {
    let b64 = |s: &str| base64::engine::general_purpose::STANDARD.encode(s);
    let yaml = format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: {}\n    certificate-authority-data: {}\nusers:\n- name: u\n  user:\n{user}\ncontexts:\n- name: c\n  context:\n    cluster: c\n    user: u\ncurrent-context: c\n",
        cfg.endpoint,
        b64(&cfg.ca_pem),
    );
    let kc = Kubeconfig::from_yaml(&yaml).map_err(|e| format!("kubeconfig: {e}"))?;
    let mut config = kube::Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default())
        .await
        .map_err(|e| format!("kubeconfig: {e}"))?;
    config.default_retry = false;
    config.connect_timeout = Some(CALL_TIMEOUT);
    config.read_timeout = Some(CALL_TIMEOUT);
    kube::Client::try_from(config).map_err(|e| format!("client: {e}"))
}

async fn bounded<T, E: std::fmt::Display>(
    what: &str,
    fut: impl std::future::Future<Output = Result<T, E>>,
) -> Result<T, String> {
    match tokio::time::timeout(CALL_TIMEOUT, fut).await {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(e)) => Err(format!("{what}: {e}")),
        Err(_) => Err(format!("{what}: timed out")),
    }
}

/// The node client credentials: kept from an earlier bootstrap for the same node name (warm
/// credentials survive a reboot), else obtained through a CSR with the bootstrap token.
async fn credentials(root: &Path, cfg: &JoinConfig) -> Result<(String, String), String> {
    let dir = root.join("var/lib/kubelet/pki");
    let (crt, key, name) = (
        dir.join("kubelet-client.crt"),
        dir.join("kubelet-client.key"),
        dir.join("node-name"),
    );
    if std::fs::read_to_string(&name).ok().as_deref() == Some(cfg.node_name.as_str())
        && let (Ok(c), Ok(k)) = (std::fs::read_to_string(&crt), std::fs::read_to_string(&key))
    {
        eprintln!("kubelet: using the client certificate on disk");
        return Ok((c, k));
    }
    if cfg.token.is_empty() {
        return Err("no client certificate and no bootstrap token".into());
    }
    let client = client(cfg, &format!("    token: {}", cfg.token)).await?;
    let key_pair = rcgen::KeyPair::generate().map_err(|e| format!("key: {e}"))?;
    let mut params = rcgen::CertificateParams::default();
    let mut dn = rcgen::DistinguishedName::new();
    dn.push(
        rcgen::DnType::CommonName,
        format!("system:node:{}", cfg.node_name),
    );
    dn.push(rcgen::DnType::OrganizationName, "system:nodes");
    params.distinguished_name = dn;
    let request = params
        .serialize_request(&key_pair)
        .and_then(|r| r.pem())
        .map_err(|e| format!("csr: {e}"))?;
    let api: Api<CertificateSigningRequest> = Api::all(client);
    let csr = CertificateSigningRequest {
        metadata: ObjectMeta {
            generate_name: Some("node-csr-".into()),
            ..Default::default()
        },
        spec: CertificateSigningRequestSpec {
            request: ByteString(request.into_bytes()),
            signer_name: "kubernetes.io/kube-apiserver-client-kubelet".into(),
            usages: Some(vec!["digital signature".into(), "client auth".into()]),
            ..Default::default()
        },
        status: None,
    };
    let created = bounded(
        "create CSR (bootstrap token)",
        api.create(&PostParams::default(), &csr),
    )
    .await?;
    let csr_name = created.metadata.name.unwrap_or_default();
    eprintln!("kubelet: CSR {csr_name} sent with the bootstrap token");
    let deadline = tokio::time::Instant::now() + CSR_WAIT;
    let cert = loop {
        let got = bounded("get CSR", api.get(&csr_name)).await?;
        if let Some(c) = got.status.and_then(|s| s.certificate)
            && !c.0.is_empty()
        {
            break String::from_utf8_lossy(&c.0).into_owned();
        }
        if tokio::time::Instant::now() > deadline {
            return Err(format!(
                "CSR {csr_name} was not approved and signed in {CSR_WAIT:?}"
            ));
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    eprintln!("kubelet: CSR {csr_name} approved and signed");
    std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let key_pem = key_pair.serialize_pem();
    for (path, text) in [(&crt, &cert), (&key, &key_pem), (&name, &cfg.node_name)] {
        std::fs::write(path, text).map_err(|e| format!("{}: {e}", path.display()))?;
    }
    Ok((cert, key_pem))
}

async fn kubelet(root: &Path) -> Result<(), String> {
    let cfg = read_join_config(root)?;
    let (cert, key) = credentials(root, &cfg).await?;
    let b64 = |s: &str| base64::engine::general_purpose::STANDARD.encode(s);
    let client = client(
        &cfg,
        &format!(
            "    client-certificate-data: {}\n    client-key-data: {}",
            b64(&cert),
            b64(&key)
        ),
    )
    .await?;
    let nodes: Api<Node> = Api::all(client.clone());
    let leases: Api<Lease> = Api::namespaced(client.clone(), "kube-node-lease");
    let pods: Api<Pod> = Api::all(client);
    loop {
        // A failed round is logged and retried: the API server may be busy.
        if let Err(e) = sync(&cfg, &nodes, &leases, &pods).await {
            eprintln!("kubelet: {e}");
        }
        tokio::time::sleep(SYNC_EVERY).await;
    }
}

fn node_object(cfg: &JoinConfig) -> Node {
    let mut labels = cfg.labels.clone();
    labels.insert("kubernetes.io/hostname".into(), cfg.node_name.clone());
    labels.insert("kubernetes.io/os".into(), "linux".into());
    labels.insert("kubernetes.io/arch".into(), arch().into());
    Node {
        metadata: ObjectMeta {
            name: Some(cfg.node_name.clone()),
            labels: Some(labels),
            ..Default::default()
        },
        spec: Some(NodeSpec {
            provider_id: (!cfg.provider_id.is_empty()).then(|| cfg.provider_id.clone()),
            taints: Some(cfg.taints.clone()),
            ..Default::default()
        }),
        status: None,
    }
}

fn arch() -> &'static str {
    match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        other => other,
    }
}

fn machine_capacity() -> serde_json::Value {
    let cpu = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1);
    let mem_kib = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|t| {
            t.lines()
                .find_map(|l| l.strip_prefix("MemTotal:"))
                .and_then(|v| v.split_whitespace().next())
                .and_then(|v| v.parse::<u64>().ok())
        })
        .unwrap_or(1 << 20);
    serde_json::json!({
        "cpu": cpu.to_string(),
        "memory": format!("{mem_kib}Ki"),
        "pods": "110",
        "ephemeral-storage": "100Gi",
    })
}

fn now_rfc3339() -> String {
    jiff::Timestamp::now()
        .strftime("%Y-%m-%dT%H:%M:%SZ")
        .to_string()
}

async fn sync(
    cfg: &JoinConfig,
    nodes: &Api<Node>,
    leases: &Api<Lease>,
    pods: &Api<Pod>,
) -> Result<(), String> {
    let name = cfg.node_name.as_str();
    if bounded("get node", nodes.get_opt(name)).await?.is_none() {
        bounded(
            "register node",
            nodes.create(&PostParams::default(), &node_object(cfg)),
        )
        .await?;
        eprintln!("kubelet: registered Node {name}");
    }
    let now = now_rfc3339();
    let cond = |t: &str, status: &str, reason: &str| {
        serde_json::json!({"type": t, "status": status, "reason": reason,
            "message": "fake kubelet", "lastHeartbeatTime": now, "lastTransitionTime": now})
    };
    let capacity = machine_capacity();
    let status = serde_json::json!({"status": {
        "conditions": [
            cond("MemoryPressure", "False", "KubeletHasSufficientMemory"),
            cond("DiskPressure", "False", "KubeletHasNoDiskPressure"),
            cond("PIDPressure", "False", "KubeletHasSufficientPID"),
            cond("Ready", "True", "KubeletReady"),
        ],
        "addresses": [
            {"type": "InternalIP", "address": cfg.node_address},
            {"type": "Hostname", "address": name},
        ],
        "capacity": capacity,
        "allocatable": capacity,
        "nodeInfo": {
            "architecture": arch(), "operatingSystem": "linux", "kubeletVersion": "v1.36.3",
            "kubeProxyVersion": "", "containerRuntimeVersion": "fake://1", "osImage": "kpssh e2e",
            "kernelVersion": "", "machineID": "", "systemUUID": "", "bootID": "",
        },
    }});
    bounded(
        "node status",
        nodes.patch_status(name, &PatchParams::default(), &Patch::Merge(&status)),
    )
    .await?;
    let renew = MicroTime(jiff::Timestamp::now());
    match bounded("get lease", leases.get_opt(name)).await? {
        Some(mut lease) => {
            let spec = lease.spec.get_or_insert_with(LeaseSpec::default);
            spec.renew_time = Some(renew);
            spec.holder_identity = Some(name.to_string());
            bounded(
                "renew lease",
                leases.replace(name, &PostParams::default(), &lease),
            )
            .await?;
        }
        None => {
            let lease = Lease {
                metadata: ObjectMeta {
                    name: Some(name.to_string()),
                    ..Default::default()
                },
                spec: Some(LeaseSpec {
                    holder_identity: Some(name.to_string()),
                    lease_duration_seconds: Some(40),
                    renew_time: Some(renew),
                    ..Default::default()
                }),
            };
            bounded(
                "create lease",
                leases.create(&PostParams::default(), &lease),
            )
            .await?;
        }
    }
    let bound = bounded(
        "list pods",
        pods.list(&ListParams::default().fields(&format!("spec.nodeName={name}"))),
    )
    .await?;
    for pod in bound.items {
        sync_pod(cfg, pods, &pod, &now).await?;
    }
    Ok(())
}

/// A pod being deleted is finished (grace 0, fenced by UID); any other is reported Running.
async fn sync_pod(cfg: &JoinConfig, pods: &Api<Pod>, pod: &Pod, now: &str) -> Result<(), String> {
    let (Some(name), Some(ns), Some(uid)) = (
        pod.metadata.name.as_deref(),
        pod.metadata.namespace.as_deref(),
        pod.metadata.uid.as_deref(),
    ) else {
        return Ok(());
    };
    let api: Api<Pod> = Api::namespaced(pods.clone().into_client(), ns);
    if pod.metadata.deletion_timestamp.is_some() {
        let dp = DeleteParams {
            grace_period_seconds: Some(0),
            preconditions: Some(kube::api::Preconditions {
                uid: Some(uid.to_string()),
                resource_version: None,
            }),
            ..Default::default()
        };
        bounded("delete terminating pod", api.delete(name, &dp)).await?;
        eprintln!("kubelet: pod {ns}/{name} terminated");
        return Ok(());
    }
    let status = pod.status.as_ref();
    let running = status.and_then(|s| s.phase.as_deref()) == Some("Running")
        && status
            .and_then(|s| s.conditions.as_ref())
            .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"));
    if running {
        return Ok(());
    }
    let containers: Vec<serde_json::Value> = pod
        .spec
        .as_ref()
        .map(|s| s.containers.as_slice())
        .unwrap_or_default()
        .iter()
        .map(|c| {
            serde_json::json!({
                "name": c.name, "image": c.image.clone().unwrap_or_default(), "imageID": "",
                "containerID": format!("fake://{uid}/{}", c.name), "ready": true, "started": true,
                "restartCount": 0, "state": {"running": {"startedAt": now}},
            })
        })
        .collect();
    let cond =
        |t: &str| serde_json::json!({"type": t, "status": "True", "lastTransitionTime": now});
    let patch = serde_json::json!({"status": {
        "phase": "Running",
        "hostIP": cfg.node_address,
        "podIP": cfg.node_address,
        "startTime": now,
        "conditions": [cond("PodScheduled"), cond("Initialized"), cond("ContainersReady"), cond("Ready")],
        "containerStatuses": containers,
    }});
    bounded(
        "pod status",
        api.patch_status(name, &PatchParams::default(), &Patch::Merge(&patch)),
    )
    .await?;
    eprintln!("kubelet: pod {ns}/{name} Running");
    Ok(())
}
