//! docs/installation.md, run as a newcomer would: every command of its ```sh blocks, in
//! document order, against a real control plane (kube-apiserver, etcd, kube-scheduler) with two
//! real OpenSSH hosts, up to the hosts `Available`, the NodePool `Ready` and `kpssh doctor`
//! passing.
//!
//! What the doc says the cluster must already have is set up first (kube-scheduler running,
//! `kube-public/cluster-info`); `helm install` applies what `helm template` renders with the same
//! arguments, and the controller pod, which has no node to run on here, is `kpssh controller`
//! as a process with the Deployment's arguments and environment and the chart's service
//! account's identity. The doc's one edit (step 6: the key and address of
//! `examples/sshhost.yaml`) is made as it describes, once per host. A block marked
//! `<!-- docs-test: alternative -->` is rendered and dry-run by the API server, not applied.
//! A command of any other shape fails the test: a new command in the doc needs a way to be
//! run here first.

#[path = "support/apply.rs"]
mod apply;
#[path = "support/controlplane.rs"]
mod controlplane;
#[path = "support/helm.rs"]
mod helm;
#[path = "support/sshd.rs"]
mod sshd;

use std::collections::BTreeMap;
use std::os::unix::process::CommandExt as _;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use apply::{apply, parse_docs};
use controlplane::ControlPlane;
use k8s_openapi::api::core::v1::ConfigMap;
use kpssh::api::{NodePool, SSHHost, SSHNodeClass};
use kpssh::k8s::{Cluster, KubeCluster};
use serde_json::{Value, json};
use sshd::{Sshd, keygen};

const ROOT: &str = env!("CARGO_MANIFEST_DIR");
const DOC: &str = "docs/installation.md";
const MARK_ALTERNATIVE: &str = "<!-- docs-test: alternative -->";
/// The example host, and the second one made from the same file.
const HOSTS: [&str; 2] = ["node-7", "node-8"];
const WAIT: Duration = Duration::from_secs(90);

/// One ```sh block: its commands, and whether the doc marks it as an alternative.
#[derive(Debug)]
struct Block {
    alternative: bool,
    commands: Vec<String>,
}

fn blocks(text: &str) -> Vec<Block> {
    let mut out = Vec::new();
    let mut current: Option<Block> = None;
    let mut previous = "";
    for line in text.lines() {
        let t = line.trim();
        if t.starts_with("```") {
            match current.take() {
                Some(b) => out.push(b),
                None if t == "```sh" => {
                    current = Some(Block {
                        alternative: previous == MARK_ALTERNATIVE,
                        commands: vec![],
                    })
                }
                // Another language's block: skip to its end.
                None => {
                    current = Some(Block {
                        alternative: true,
                        commands: vec!["#skip".into()],
                    })
                }
            }
        } else if let Some(b) = current.as_mut()
            && !t.is_empty()
            && !t.starts_with('#')
        {
            b.commands.push(t.to_string());
        }
        if !t.is_empty() {
            previous = t;
        }
    }
    out.retain(|b| b.commands.first().map(String::as_str) != Some("#skip"));
    out
}

/// Step 6's edit of `examples/sshhost.yaml`: the host's name, its address and port, and the
/// controller's private key instead of the placeholder.
fn edit_sshhost(text: &str, name: &str, sshd: &Sshd, private_key: &str) -> String {
    let key: String = private_key.lines().map(|l| format!("    {l}\n")).collect();
    let placeholder = "    -----BEGIN OPENSSH PRIVATE KEY-----\n    replace-me\n    -----END OPENSSH PRIVATE KEY-----\n";
    assert!(
        text.contains(placeholder),
        "the example's key placeholder moved"
    );
    assert!(
        text.contains("address: 192.0.2.17"),
        "the example's address moved"
    );
    text.replace(placeholder, &key)
        .replace(
            "address: 192.0.2.17",
            &format!("address: {}\n  port: {}", sshd.address, sshd.port),
        )
        .replace("node-7", name)
}

struct Controller(Child);

impl Drop for Controller {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// `kpssh controller` as the chart's Deployment runs it: its container's arguments and
/// environment (the metrics address moved to a free loopback port), as its service account.
fn start_controller(cp: &ControlPlane, deployment: &Value, dir: &Path) -> Controller {
    let ns = deployment["metadata"]["namespace"]
        .as_str()
        .expect("namespace");
    let pod = &deployment["spec"]["template"]["spec"];
    let sa = pod["serviceAccountName"]
        .as_str()
        .expect("serviceAccountName");
    let container = &pod["containers"][0];
    let user = format!("system:serviceaccount:{ns}:{sa}");
    let groups = [
        "system:serviceaccounts",
        &format!("system:serviceaccounts:{ns}"),
    ];
    let kubeconfig = dir.join("controller.kubeconfig");
    std::fs::write(&kubeconfig, cp.kubeconfig_for(&user, &groups)).expect("kubeconfig");
    let mut env: BTreeMap<String, String> = BTreeMap::new();
    for e in container["env"].as_array().into_iter().flatten() {
        let name = e["name"].as_str().expect("env name").to_string();
        let value = match (
            e["value"].as_str(),
            e["valueFrom"]["fieldRef"]["fieldPath"].as_str(),
        ) {
            (Some(v), _) => v.to_string(),
            (None, Some("metadata.name")) => "kpssh-doc-0".to_string(),
            other => panic!("env {name}: {other:?} is not modelled here"),
        };
        env.insert(name, value);
    }
    let metrics = format!("127.0.0.1:{}", sshd::free_port("127.0.0.1"));
    env.insert("KPSSH_METRICS_ADDR".into(), metrics);
    let args: Vec<String> = container["args"]
        .as_array()
        .expect("args")
        .iter()
        .map(|a| a.as_str().expect("arg").to_string())
        .collect();
    let log = std::fs::File::create(dir.join("controller.log")).expect("log");
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_kpssh"));
    cmd.args(&args)
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .env("HOME", dir)
        .envs(&env)
        .env("KUBECONFIG", &kubeconfig)
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
    Controller(cmd.spawn().expect("spawn kpssh controller"))
}

/// A `kpssh` command line of the doc, run with the admin's kubeconfig: (exit status, output).
fn kpssh(cp: &ControlPlane, args: &[&str]) -> (i32, String) {
    let out = Command::new("timeout")
        .arg("120")
        .arg(env!("CARGO_BIN_EXE_kpssh"))
        .args(args)
        .env("KUBECONFIG", cp.kubeconfig_path())
        .env_remove("KPSSH_POOL_NAMESPACE")
        .output()
        .expect("kpssh");
    (
        out.status.code().unwrap_or(-1),
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    )
}

async fn wait_for<F, Fut>(what: &str, dir: &Path, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<(), String>>,
{
    let deadline = Instant::now() + WAIT;
    loop {
        let last = match check().await {
            Ok(()) => return,
            Err(e) => e,
        };
        if Instant::now() > deadline {
            let log = std::fs::read_to_string(dir.join("controller.log")).unwrap_or_default();
            let tail: Vec<&str> = log.lines().rev().take(40).collect();
            panic!(
                "{what} not within {WAIT:?}: {last}\ncontroller log (last lines):\n{}",
                tail.into_iter().rev().collect::<Vec<_>>().join("\n")
            );
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

fn condition(
    conds: &[k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition],
    t: &str,
) -> String {
    conds
        .iter()
        .find(|c| c.type_ == t)
        .map(|c| format!("{} {} {}", c.status, c.reason, c.message))
        .unwrap_or_else(|| "absent".into())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn installation_md_runs_in_order_up_to_available_hosts() {
    let text = std::fs::read_to_string(Path::new(ROOT).join(DOC)).expect(DOC);
    let cp = ControlPlane::shared();
    let client = cp.client().await;
    let admin = KubeCluster::new(client.clone());
    let dir = tempfile::tempdir().expect("tempdir");

    // What the cluster must already have: kube-scheduler (elected, as clusters run it) and
    // kube-public/cluster-info as kubeadm publishes it.
    cp.start_scheduler_with(true);
    let b64 = base64::Engine::encode(
        &base64::engine::general_purpose::STANDARD,
        cp.pki().ca_cert.as_bytes(),
    );
    let cluster_info: ConfigMap = serde_json::from_value(json!({
        "metadata": {"name": "cluster-info", "namespace": "kube-public"},
        "data": {"kubeconfig": format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: \"\"\n  cluster:\n    server: {}\n    certificate-authority-data: {b64}\n",
            cp.server()
        )},
    }))
    .expect("cluster-info");
    admin.create(&cluster_info).await.expect("cluster-info");
    // The machines: two sshd, the controller's key authorized on both (root logs in, as the
    // example's `user: root`).
    let key = keygen(dir.path(), "id_ed25519", "ed25519", None);
    let machines: Vec<Sshd> = HOSTS.iter().map(|_| Sshd::start()).collect();
    for m in &machines {
        m.authorize(&key.public);
    }

    let mut ran: Vec<String> = vec![];
    let mut controller: Option<Controller> = None;
    for block in blocks(&text) {
        let dry = block.alternative;
        for line in &block.commands {
            let words: Vec<&str> = line.split_whitespace().collect();
            match words.as_slice() {
                ["kubectl", "apply", rest @ ..] => {
                    let file = rest
                        .windows(2)
                        .find(|w| w[0] == "-f")
                        .map(|w| w[1])
                        .unwrap_or_else(|| panic!("no -f in `{line}`"));
                    let content = std::fs::read_to_string(Path::new(ROOT).join(file))
                        .unwrap_or_else(|e| panic!("`{line}`: {file}: {e}"));
                    if file.ends_with("crds.yaml") && !dry {
                        cp.install_crds(&content).await;
                    } else if file == "examples/sshhost.yaml" {
                        for (name, m) in HOSTS.iter().zip(&machines) {
                            for obj in parse_docs(&edit_sshhost(&content, name, m, &key.private)) {
                                apply(&client, &obj, dry)
                                    .await
                                    .unwrap_or_else(|e| panic!("`{line}` ({name}): {e}"));
                            }
                        }
                        if !dry {
                            hosts_available(&admin, dir.path()).await;
                        }
                    } else {
                        for obj in parse_docs(&content) {
                            apply(&client, &obj, dry)
                                .await
                                .unwrap_or_else(|e| panic!("`{line}`: {e}"));
                        }
                    }
                    if file == "examples/nodepool.yaml" && !dry {
                        nodepool_ready(&admin, dir.path()).await;
                    }
                }
                [
                    "kpssh",
                    "crds",
                    flags @ ..,
                    "|",
                    "kubectl",
                    "apply",
                    "--server-side",
                    "-f",
                    "-",
                ] => {
                    let mut args = vec!["crds"];
                    args.extend(flags);
                    let out = Command::new(env!("CARGO_BIN_EXE_kpssh"))
                        .args(&args)
                        .output()
                        .expect("kpssh crds");
                    assert!(out.status.success(), "`{line}`");
                    let yaml = String::from_utf8_lossy(&out.stdout);
                    if dry {
                        for obj in parse_docs(&yaml) {
                            apply(&client, &obj, true).await.expect("dry run");
                        }
                    } else {
                        cp.install_crds(&yaml).await;
                    }
                }
                ["helm", "install", release, chart, rest @ ..] => {
                    let mut args = vec!["template", release, chart];
                    let mut ns = "default";
                    let mut i = 0;
                    while i < rest.len() {
                        match rest[i] {
                            "--namespace" | "-n" => {
                                ns = rest[i + 1];
                                args.extend(["--namespace", ns]);
                                i += 2;
                            }
                            "--set" => {
                                args.extend(["--set", rest[i + 1]]);
                                i += 2;
                            }
                            "--create-namespace" => i += 1,
                            other => panic!("`{line}`: option {other} is not exercised"),
                        }
                    }
                    let rendered =
                        helm::run_helm(&args).unwrap_or_else(|e| panic!("`{line}`: {e}"));
                    let objs = parse_docs(&rendered);
                    let namespace = json!({"apiVersion": "v1", "kind": "Namespace",
                        "metadata": {"name": ns}});
                    apply(&client, &namespace, false).await.expect("namespace");
                    if !dry {
                        // Helm installs the chart's CRDs first.
                        let crds = std::fs::read_to_string(
                            Path::new(ROOT).join(chart).join("crds/crds.yaml"),
                        )
                        .expect("chart CRDs");
                        cp.install_crds(&crds).await;
                    }
                    for obj in &objs {
                        let kind = obj["kind"].as_str().unwrap_or_default();
                        // prometheus-operator kinds: their CRDs are tests/chart.rs's business.
                        if kind == "ServiceMonitor" || kind == "PrometheusRule" {
                            continue;
                        }
                        apply(&client, obj, dry)
                            .await
                            .unwrap_or_else(|e| panic!("`{line}`: {e}"));
                    }
                    if !dry {
                        let deployment = objs
                            .iter()
                            .find(|o| o["kind"] == "Deployment")
                            .expect("the chart renders a Deployment");
                        controller = Some(start_controller(cp, deployment, dir.path()));
                    }
                }
                ["kpssh", args @ ..]
                    if matches!(args.first(), Some(&"status" | &"probe" | &"doctor")) =>
                {
                    let (code, out) = kpssh(cp, args);
                    assert_eq!(code, 0, "`{line}` failed:\n{out}");
                    match args[0] {
                        "status" => {
                            assert!(out.contains("c8-m32"), "`{line}`:\n{out}");
                            assert!(!out.contains("Hosts with errors"), "`{line}`:\n{out}");
                        }
                        "probe" => assert!(out.contains("Available"), "`{line}`:\n{out}"),
                        _ => assert!(!out.contains("FAIL"), "`{line}`:\n{out}"),
                    }
                    eprintln!("$ {line}\n{out}");
                }
                _ => panic!("{DOC}: `{line}` is not a command this test can run"),
            }
            ran.push(line.clone());
        }
    }
    assert!(controller.is_some(), "the doc never installs the chart");
    // The installation order: CRDs, chart, RBAC, profile, class, hosts, NodePool, check.
    let order = [
        "kpssh crds --karpenter",
        "helm install kpssh",
        "examples/bootstrap-rbac.yaml",
        "examples/profiles/tls-bootstrap.yaml",
        "examples/sshnodeclass.yaml",
        "examples/sshhost.yaml",
        "kpssh status",
        "kpssh probe --host",
        "examples/nodepool.yaml",
        "kpssh doctor",
    ];
    let pos = |needle: &str| {
        ran.iter()
            .position(|l| l.contains(needle))
            .unwrap_or_else(|| panic!("the doc never runs {needle}: {ran:?}"))
    };
    for pair in order.windows(2) {
        assert!(
            pos(pair[0]) < pos(pair[1]),
            "{} must come before {}",
            pair[0],
            pair[1]
        );
    }
    for m in &machines {
        assert!(
            m.connections() > 0,
            "the controller never reached {}",
            m.address
        );
    }
}

/// Step 6's promise: each host goes `Available`.
async fn hosts_available(admin: &KubeCluster, dir: &Path) {
    wait_for("both hosts Available", dir, || async {
        for name in HOSTS {
            let h: Option<SSHHost> = admin
                .get(Some("kpssh-system"), name)
                .await
                .map_err(|e| e.to_string())?;
            let status = h
                .and_then(|h| h.status)
                .ok_or(format!("{name}: no status"))?;
            let state = format!("{:?}", status.state);
            if !state.contains("Available") {
                return Err(format!(
                    "{name}: {state}, Ready {}",
                    condition(&status.conditions, "Ready")
                ));
            }
        }
        Ok(())
    })
    .await;
}

/// Step 7's promise: the NodePool goes `Ready` (its node class is `Ready` by then).
async fn nodepool_ready(admin: &KubeCluster, dir: &Path) {
    wait_for("NodePool bare-metal Ready", dir, || async {
        let class: Option<SSHNodeClass> = admin
            .get(None, "bare-metal")
            .await
            .map_err(|e| e.to_string())?;
        let class_ready = class
            .and_then(|c| c.status)
            .map(|s| condition(&s.conditions, "Ready"))
            .unwrap_or_default();
        let pool: Option<NodePool> = admin
            .get(None, "bare-metal")
            .await
            .map_err(|e| e.to_string())?;
        let conds = pool
            .and_then(|p| p.status)
            .map(|s| s.conditions)
            .unwrap_or_default();
        let ready = condition(&conds, "Ready");
        if ready.starts_with("True") {
            for t in ["ValidationSucceeded", "NodeClassReady"] {
                let c = condition(&conds, t);
                if !c.starts_with("True") {
                    return Err(format!("Ready but {t}: {c}"));
                }
            }
            Ok(())
        } else {
            Err(format!(
                "NodePool Ready: {ready}; ValidationSucceeded: {}; NodeClassReady: {}; class Ready: {class_ready}",
                condition(&conds, "ValidationSucceeded"),
                condition(&conds, "NodeClassReady")
            ))
        }
    })
    .await;
}
