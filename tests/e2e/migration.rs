//! E9: migration from the Go provider, following docs/migration.md step by step. Before kpssh
//! starts, the cluster is left exactly as the Go provider (with Karpenter core inside it) leaves
//! a running node: the host joined over SSH with the profile's own install and join scripts
//! (`sudo bash -s`, a bootstrap token the kubelet traded for its certificate), a Ready Node with
//! the provider ID, core's labels, finalizer and owner reference, a NodeClaim with core's
//! conditions and the annotations the Go provider and core write — their values computed by
//! the Go reference code (`tests/oracle`: the Go provider's JoinHash, core's `NodePool.Hash()`),
//! the NodePool annotated by core's hash controller, the SSHHost `InUse` with its claimRef, and
//! a pod running on the node. Then kpssh starts: for 2× consolidateAfter no NodeClaim is drifted
//! or deleted, the node is not disrupted, no phase runs on the host and the annotations stay
//! the Go provider's (a rollback would find its own); then a scale-down drains the node, leave
//! runs, the host is warm again.

use std::io::Write as _;
use std::process::{Command, Stdio};
use std::time::Duration;

use base64::Engine as _;
use k8s_openapi::api::core::v1::{Node, Secret};
use kpssh::api::{HostState, NodeClaim, NodePool, SSHHost, SSHNodeClass};
use kube::api::{ObjectMeta, Patch, PatchParams, PostParams};
use serde_json::{Value, json};

use crate::scale::check_warm_and_disabled;
use crate::testhost::ExecMode;
use crate::world::{POOL_NS, SCENARIO_LABEL, Sc, profile};

const NODECLASS_HASH: &str = "karpenter.dklesev.github.io/nodeclass-hash";
const NODECLASS_HASH_VERSION: &str = "karpenter.dklesev.github.io/nodeclass-hash-version";
const NODEPOOL_HASH: &str = "karpenter.sh/nodepool-hash";
const NODEPOOL_HASH_VERSION: &str = "karpenter.sh/nodepool-hash-version";
/// The NodePool's consolidateAfter; kpssh is watched for twice as long.
const CONSOLIDATE_AFTER: Duration = Duration::from_secs(20);

/// One answer of the Go reference oracle (`scripts/oracle.sh`, or `KPSSH_ORACLE`).
fn oracle(mode: &str, input: &Value) -> Result<Value, String> {
    let binary = match std::env::var("KPSSH_ORACLE") {
        Ok(p) => p,
        Err(_) => {
            let script = concat!(env!("CARGO_MANIFEST_DIR"), "/scripts/oracle.sh");
            let out = Command::new(script)
                .stderr(Stdio::inherit())
                .output()
                .map_err(|e| format!("{script}: {e}"))?;
            String::from_utf8_lossy(&out.stdout)
                .lines()
                .last()
                .ok_or("oracle.sh printed no path")?
                .to_string()
        }
    };
    let mut child = Command::new(&binary)
        .arg(mode)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .map_err(|e| format!("{binary}: {e}"))?;
    let mut stdin = child.stdin.take().ok_or("oracle stdin")?;
    writeln!(stdin, "{input}").map_err(|e| e.to_string())?;
    drop(stdin);
    let out = child.wait_with_output().map_err(|e| e.to_string())?;
    let answer: Value = serde_json::from_slice(&out.stdout).map_err(|e| format!("{e}"))?;
    if answer.get("decodeError").is_some() {
        return Err(format!("oracle {mode}: {answer}"));
    }
    Ok(answer)
}

/// Run `script` on host `h` the way the Go provider's Raw mode does: over SSH as the host's
/// user, `sudo bash -s`, the parameters exported ahead of the script.
fn go_phase(sc: &Sc, h: usize, script: &str, env: &[(&str, String)]) -> Result<(), String> {
    let host = &sc.hosts[h];
    let mut stdin = String::new();
    for (k, v) in env {
        stdin.push_str(&format!("export {k}='{v}'\n"));
    }
    stdin.push_str(script);
    let mut child = Command::new("ssh")
        .arg("-i")
        .arg(&sc.world.client_key.private_path)
        .args([
            "-o",
            "StrictHostKeyChecking=no",
            "-o",
            "UserKnownHostsFile=/dev/null",
        ])
        .args(["-o", "BatchMode=yes", "-o", "LogLevel=ERROR"])
        .args(["-p", &host.port.to_string()])
        .arg(format!("{}@{}", host.user, host.address))
        .arg("sudo bash -s")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("ssh: {e}"))?;
    child
        .stdin
        .take()
        .ok_or("ssh stdin")?
        .write_all(stdin.as_bytes())
        .map_err(|e| e.to_string())?;
    let out = child.wait_with_output().map_err(|e| e.to_string())?;
    if !out.status.success() {
        return Err(format!(
            "Go-side phase failed: {}",
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    Ok(())
}

fn merge(v: Value) -> Patch<Value> {
    Patch::Merge(v)
}

pub async fn e9(sc: &mut Sc) -> Result<(), String> {
    let h = sc.add_host(ExecMode::Raw, None).await;
    // A warm host next to it: were the node drifted, its replacement would launch there (a
    // drifted node whose pods can go nowhere is left alone, S50, and would hide the drift).
    let spare = sc.add_host(ExecMode::Raw, None).await;
    let prof = profile(&format!("e2e-{}", sc.id), &sc.world.base);
    let prof_name = prof.metadata.name.clone().unwrap_or_default();
    sc.class_and_profile(prof.clone()).await;
    sc.nodepool(&format!("{}s", CONSOLIDATE_AFTER.as_secs()))
        .await;
    let pp = PatchParams::default();

    // Core's hash controller annotated the NodePool; the values come from core's own code.
    let pool = sc
        .api::<NodePool>()
        .get(&sc.id)
        .await
        .map_err(|e| e.to_string())?;
    let pool_json = serde_json::to_value(&pool).map_err(|e| e.to_string())?;
    let core = oracle("nodepoolhash", &pool_json)?;
    let pool_hash = core["hash"].as_str().ok_or("hash")?.to_string();
    let pool_version = core["version"].as_str().ok_or("version")?.to_string();
    let pool = sc
        .api::<NodePool>()
        .patch(
            &sc.id,
            &pp,
            &merge(json!({"metadata": {"annotations": {
                NODEPOOL_HASH: pool_hash, NODEPOOL_HASH_VERSION: pool_version}}})),
        )
        .await
        .map_err(|e| format!("annotate NodePool: {e}"))?;
    let class = sc
        .api::<SSHNodeClass>()
        .get(&sc.id)
        .await
        .map_err(|e| e.to_string())?;
    let join_hash = oracle(
        "joinhash",
        &serde_json::to_value(&class.spec).map_err(|e| e.to_string())?,
    )?;
    let class_hash = join_hash["hash"].as_str().ok_or("joinhash")?.to_string();

    // The NodeClaim core created and the Go provider launched (Create stamps the class hash).
    let claim_name = format!("{}-go-q7x2k", sc.id);
    let provider_id = sc.provider_id(h);
    let labels = json!({
        SCENARIO_LABEL: sc.id,
        "karpenter.sh/nodepool": sc.id,
        "node.kubernetes.io/instance-type": sc.id,
        "topology.kubernetes.io/zone": "pool",
        "karpenter.sh/capacity-type": "on-demand",
        "kubernetes.io/arch": "amd64",
        "kubernetes.io/os": "linux",
    });
    let claim: NodeClaim = serde_json::from_value(json!({
        "apiVersion": "karpenter.sh/v1",
        "kind": "NodeClaim",
        "metadata": {
            "name": claim_name,
            "labels": labels,
            "annotations": {
                NODECLASS_HASH: class_hash,
                NODECLASS_HASH_VERSION: "v1",
                NODEPOOL_HASH: pool_hash,
                NODEPOOL_HASH_VERSION: pool_version,
            },
            "finalizers": ["karpenter.sh/termination"],
            "ownerReferences": [{"apiVersion": "karpenter.sh/v1", "kind": "NodePool",
                "name": sc.id, "uid": pool.metadata.uid, "blockOwnerDeletion": true}],
        },
        "spec": {
            "nodeClassRef": {"group": "karpenter.dklesev.github.io", "kind": "SSHNodeClass",
                "name": sc.id},
            "requirements": [
                {"key": "karpenter.sh/nodepool", "operator": "In", "values": [sc.id]},
                {"key": "node.kubernetes.io/instance-type", "operator": "In", "values": [sc.id]},
                {"key": SCENARIO_LABEL, "operator": "In", "values": [sc.id]},
            ],
            "resources": {"requests": {"cpu": "100m", "memory": "64Mi", "pods": "1"}},
            "expireAfter": "720h",
        },
    }))
    .map_err(|e| format!("NodeClaim: {e}"))?;
    let claim = sc
        .api::<NodeClaim>()
        .create(&PostParams::default(), &claim)
        .await
        .map_err(|e| format!("create NodeClaim: {e}"))?;
    let claim_uid = claim.metadata.uid.clone().unwrap_or_default();

    // The host claimed and joined: install and join as the Go provider ran them.
    let token_id = "e9gotk";
    let token_secret = "0123456789abcdef";
    let secret = Secret {
        metadata: ObjectMeta {
            name: Some(format!("bootstrap-token-{token_id}")),
            namespace: Some("kube-system".into()),
            ..Default::default()
        },
        type_: Some("bootstrap.kubernetes.io/token".into()),
        string_data: Some(
            [
                ("token-id", token_id),
                ("token-secret", token_secret),
                ("usage-bootstrap-authentication", "true"),
                ("usage-bootstrap-signing", "true"),
                ("auth-extra-groups", "system:bootstrappers:kpssh"),
            ]
            .into_iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
        ),
        ..Default::default()
    };
    sc.ns_api::<Secret>("kube-system")
        .create(&PostParams::default(), &secret)
        .await
        .map_err(|e| format!("bootstrap token: {e}"))?;
    let ca = base64::engine::general_purpose::STANDARD.encode(&sc.world.cp.pki().ca_cert);
    let address = sc.hosts[h].address.clone();
    let node_labels = format!(
        "{SCENARIO_LABEL}={id},karpenter.sh/capacity-type=on-demand,karpenter.sh/nodepool={id},node.kubernetes.io/instance-type={id},topology.kubernetes.io/zone=pool",
        id = sc.id
    );
    let env = [
        ("KPSSH_CLUSTER_ENDPOINT", sc.world.cp.server().to_string()),
        ("KPSSH_CLUSTER_CA_B64", ca),
        ("KPSSH_NODE_NAME", claim_name.clone()),
        ("KPSSH_HOST_ADDRESS", address.clone()),
        ("KPSSH_NODE_ADDRESS", address.clone()),
        ("KPSSH_NODE_LABELS", node_labels),
        ("KPSSH_TAINTS", String::new()),
        ("KPSSH_PROVIDER_ID", provider_id.clone()),
        (
            "KPSSH_BOOTSTRAP_TOKEN",
            format!("{token_id}.{token_secret}"),
        ),
    ];
    go_phase(sc, h, &prof.spec.scripts.install, &env)?;
    go_phase(sc, h, &prof.spec.scripts.join, &env)?;
    let node = sc
        .wait(
            "E9 setup: the Go-joined Node registered and Ready",
            Duration::from_secs(120),
            || async { Ok(sc.node_of(h).await?.filter(crate::world::node_ready)) },
        )
        .await?;
    let node_name = node.metadata.name.clone().unwrap_or_default();
    if node_name != claim_name {
        return Err(format!("Node {node_name} is not named after {claim_name}"));
    }
    // Core's registration and initialization of that Node and NodeClaim.
    sc.api::<Node>()
        .patch(
            &node_name,
            &pp,
            &merge(json!({"metadata": {
                "labels": {"karpenter.sh/registered": "true", "karpenter.sh/initialized": "true"},
                "finalizers": ["karpenter.sh/termination"],
                "ownerReferences": [{"apiVersion": "karpenter.sh/v1", "kind": "NodeClaim",
                    "name": claim_name, "uid": claim_uid, "blockOwnerDeletion": true}],
            }})),
        )
        .await
        .map_err(|e| format!("register Node: {e}"))?;
    let now = jiff::Timestamp::now()
        .strftime("%Y-%m-%dT%H:%M:%SZ")
        .to_string();
    let cond = |t: &str, reason: &str| {
        json!({"type": t, "status": "True", "reason": reason, "message": "",
            "lastTransitionTime": now})
    };
    sc.api::<NodeClaim>()
        .patch_status(
            &claim_name,
            &pp,
            &merge(json!({"status": {
                "providerID": provider_id,
                "nodeName": node_name,
                "capacity": {"cpu": "2", "memory": "4Gi", "pods": "110"},
                "allocatable": {"cpu": "2", "memory": "4Gi", "pods": "110"},
                "conditions": [cond("Launched", "Launched"), cond("Registered", "Registered"),
                    cond("Initialized", "Initialized"), cond("Ready", "Ready"),
                    cond("ConsistentStateFound", "ConsistentStateFound")],
            }})),
        )
        .await
        .map_err(|e| format!("NodeClaim status: {e}"))?;
    // The Go provider's probe controller deleted the token once the Node registered.
    let _ = sc
        .ns_api::<Secret>("kube-system")
        .delete(&format!("bootstrap-token-{token_id}"), &Default::default())
        .await;
    let fingerprint = sc.hosts[h].fingerprint();
    sc.ns_api::<SSHHost>(POOL_NS)
        .patch_status(
            &sc.host_name(h),
            &pp,
            &merge(json!({"status": {
                "state": "InUse",
                "conditions": [{"type": "Ready", "status": "True", "reason": "ProbeSucceeded",
                    "message": "", "lastTransitionTime": now}],
                "claimRef": {"name": claim_name, "uid": claim_uid},
                "installedProfile": format!("{prof_name}@{}", prof.spec.version),
                "providerID": provider_id,
                "hostKeyFingerprint": fingerprint,
                "observedCapacity": {"cpu": "2", "memory": "4Gi"},
                "observedArch": "amd64",
                "lastProbeTime": now,
            }})),
        )
        .await
        .map_err(|e| format!("SSHHost status: {e}"))?;
    // A workload on the node.
    sc.deployment(1).await;
    sc.wait(
        "E9 setup: the pod Running on the Go-joined node",
        Duration::from_secs(90),
        || async {
            Ok(sc
                .pods()
                .await?
                .into_iter()
                .find(|p| crate::world::pod_running_on(p, &node_name)))
        },
    )
    .await?;
    let phases_before = sc.hosts[h].read("var/log/phases");
    let spare_phases = sc.hosts[spare].read("var/log/phases");
    let claim_before = sc
        .api::<NodeClaim>()
        .get(&claim_name)
        .await
        .map_err(|e| e.to_string())?;
    let annotations_before = claim_before
        .metadata
        .annotations
        .clone()
        .unwrap_or_default();

    // docs/migration.md steps 1–2: the Go controller is gone, kpssh starts.
    sc.prepared();
    sc.world.wait_started();
    let commands_before = sc.hosts[h].command_log().len();
    sc.hold(
        "E9: no drift, no disruption, no phase for 2x consolidateAfter",
        CONSOLIDATE_AFTER * 2 + Duration::from_secs(5),
        || async {
            let nc = sc
                .api::<NodeClaim>()
                .get_opt(&claim_name)
                .await
                .map_err(|e| e.to_string())?;
            let Some(nc) = nc else {
                return Ok(Some("the NodeClaim was deleted".into()));
            };
            if nc.metadata.deletion_timestamp.is_some() {
                return Ok(Some("the NodeClaim is being deleted".into()));
            }
            let conds = nc
                .status
                .as_ref()
                .map(|s| s.conditions.clone())
                .unwrap_or_default();
            if let Some(c) = conds
                .iter()
                .find(|c| c.type_ == "Drifted" && c.status == "True")
            {
                return Ok(Some(format!("the NodeClaim drifted: {}", c.reason)));
            }
            let ann = nc.metadata.annotations.clone().unwrap_or_default();
            for k in [
                NODECLASS_HASH,
                NODECLASS_HASH_VERSION,
                NODEPOOL_HASH,
                NODEPOOL_HASH_VERSION,
            ] {
                if ann.get(k) != annotations_before.get(k) {
                    return Ok(Some(format!("{k} changed: {:?}", ann.get(k))));
                }
            }
            if ann.keys().any(|k| k.contains("disruption-reason")) {
                return Ok(Some(format!("marked for disruption: {ann:?}")));
            }
            let node = sc
                .api::<Node>()
                .get_opt(&node_name)
                .await
                .map_err(|e| e.to_string())?;
            let Some(node) = node else {
                return Ok(Some("the Node was deleted".into()));
            };
            let spec = node.spec.clone().unwrap_or_default();
            if spec.unschedulable == Some(true) {
                return Ok(Some("the Node was cordoned".into()));
            }
            if let Some(t) = spec
                .taints
                .unwrap_or_default()
                .iter()
                .find(|t| t.key.starts_with("karpenter.sh/"))
            {
                return Ok(Some(format!("the Node was tainted {}", t.key)));
            }
            let host = sc.host(h).await?;
            if host.state() != HostState::InUse
                || host.claim().map(|c| c.name.as_str()) != Some(claim_name.as_str())
            {
                return Ok(Some(format!(
                    "host left InUse/its claim: {:?}",
                    host.status
                )));
            }
            let claims = sc.nodeclaims().await?;
            if claims.len() != 1 {
                let names: Vec<_> = claims
                    .iter()
                    .filter_map(|c| c.metadata.name.clone())
                    .collect();
                return Ok(Some(format!("a replacement was launched: {names:?}")));
            }
            if sc.hosts[spare].read("var/log/phases") != spare_phases {
                return Ok(Some(format!(
                    "a phase ran on the spare host: {}",
                    sc.hosts[spare].read("var/log/phases")
                )));
            }
            if sc.hosts[h].read("var/log/phases") != phases_before {
                return Ok(Some(format!(
                    "a phase ran: {}",
                    sc.hosts[h].read("var/log/phases")
                )));
            }
            let log = sc.hosts[h].command_log();
            if let Some(l) = log
                .get(commands_before..)
                .and_then(|t| t.lines().find(|l| l.contains("bash -s")))
            {
                return Ok(Some(format!("an SSH phase ran: {l}")));
            }
            Ok(None)
        },
    )
    .await?;
    // Rolling back is safe: the NodePool still carries core's annotations.
    let pool = sc
        .api::<NodePool>()
        .get(&sc.id)
        .await
        .map_err(|e| e.to_string())?;
    let ann = pool.metadata.annotations.clone().unwrap_or_default();
    if ann.get(NODEPOOL_HASH).map(String::as_str) != core["hash"].as_str()
        || ann.get(NODEPOOL_HASH_VERSION).map(String::as_str) != core["version"].as_str()
    {
        return Err(format!(
            "NodePool annotations are not core's any more: {ann:?}"
        ));
    }

    // Then a scale-down works: drained, leave, Node deleted, host warm.
    sc.scale(0).await?;
    sc.consolidated(h, &node_name).await?;
    check_warm_and_disabled(sc, h)
}
