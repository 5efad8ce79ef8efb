//! Every command the operator docs show is run here, in document order, against the real API
//! server: `kubectl apply -f FILE` applies FILE (server-side, as `--server-side` would), and
//! `helm install NAME CHART --namespace NS …` renders with the real helm (`helm template` with the
//! same arguments) and applies the result as a server-side dry run. A command of any other shape
//! fails the test, so a new command in the docs needs a way to be exercised here first.

#[path = "support/apply.rs"]
mod apply;
#[path = "support/controlplane.rs"]
mod controlplane;

use std::path::{Path, PathBuf};
use std::process::Command;

use apply::{apply, parse_docs};
use controlplane::ControlPlane;
use kpssh::api::crds;
use serde_json::json;

const ROOT: &str = env!("CARGO_MANIFEST_DIR");
/// The docs whose commands this test owns.
const DOCS: &[&str] = &[
    "docs/installation.md",
    "docs/operations.md",
    "docs/troubleshooting.md",
    "docs/security.md",
    "docs/migration.md",
    "docs/api-reference.md",
];

/// Lines of every ```sh block, with the file they came from.
fn shell_lines(doc: &str) -> Vec<String> {
    let text =
        std::fs::read_to_string(Path::new(ROOT).join(doc)).unwrap_or_else(|e| panic!("{doc}: {e}"));
    let mut out = Vec::new();
    let mut inside = false;
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            inside = !inside && line.trim() == "```sh";
            continue;
        }
        if inside && !line.trim().is_empty() && !line.trim_start().starts_with('#') {
            out.push(line.trim().to_string());
        }
    }
    out
}

fn helm() -> PathBuf {
    if let Some(p) = std::env::var_os("KPSSH_HELM") {
        return PathBuf::from(p);
    }
    let out = Command::new("timeout")
        .args(["1800", &format!("{ROOT}/scripts/helm.sh")])
        .output()
        .expect("scripts/helm.sh");
    assert!(out.status.success(), "scripts/helm.sh failed");
    let stdout = String::from_utf8_lossy(&out.stdout);
    PathBuf::from(stdout.lines().last().expect("helm path").trim())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_command_in_the_operator_docs_runs() {
    let cp = ControlPlane::shared();
    // The Karpenter CRDs are a prerequisite the docs point to, not a command they show.
    cp.install_crds(&crds::to_yaml(&crds::karpenter_crds()).expect("yaml"))
        .await;
    let client = cp.client().await;
    let mut ran = Vec::new();
    for doc in DOCS {
        for line in shell_lines(doc) {
            let words: Vec<&str> = line.split_whitespace().collect();
            match words.as_slice() {
                ["kubectl", "apply", rest @ ..] => {
                    let file = rest
                        .windows(2)
                        .find(|w| w[0] == "-f")
                        .map(|w| w[1])
                        .unwrap_or_else(|| panic!("{doc}: no -f in `{line}`"));
                    let text = std::fs::read_to_string(Path::new(ROOT).join(file))
                        .unwrap_or_else(|e| panic!("{doc}: `{line}`: {file}: {e}"));
                    if file.ends_with("crds.yaml") {
                        cp.install_crds(&text).await;
                        continue;
                    }
                    for obj in parse_docs(&text) {
                        apply(&client, &obj, false)
                            .await
                            .unwrap_or_else(|e| panic!("{doc}: `{line}`: {e}"));
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
                    let out = Command::new(env!("CARGO_BIN_EXE_kpssh"))
                        .arg("crds")
                        .args(flags)
                        .output()
                        .expect("kpssh crds");
                    assert!(out.status.success(), "{doc}: `{line}`");
                    cp.install_crds(&String::from_utf8_lossy(&out.stdout)).await;
                }
                ["helm", "install", name, chart, rest @ ..] => {
                    let mut args = vec!["template", name, chart];
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
                            other => panic!("{doc}: `{line}`: option {other} is not exercised"),
                        }
                    }
                    let out = Command::new("timeout")
                        .arg("120")
                        .arg(helm())
                        .args(&args)
                        .current_dir(ROOT)
                        .output()
                        .expect("helm template");
                    assert!(
                        out.status.success(),
                        "{doc}: `{line}`: {}",
                        String::from_utf8_lossy(&out.stderr)
                    );
                    let namespace = json!({"apiVersion": "v1", "kind": "Namespace",
                        "metadata": {"name": ns}});
                    apply(&client, &namespace, false).await.expect("namespace");
                    // The chart's CRDs: the same file `kubectl apply` installs above.
                    let crd_text =
                        std::fs::read_to_string(Path::new(ROOT).join(chart).join("crds/crds.yaml"))
                            .expect("chart CRDs");
                    cp.install_crds(&crd_text).await;
                    let objs = parse_docs(&String::from_utf8_lossy(&out.stdout));
                    assert!(objs.iter().any(|o| o["kind"] == "Deployment"));
                    for obj in objs {
                        let kind = obj["kind"].as_str().unwrap_or_default();
                        // prometheus-operator kinds are dry-run in tests/chart.rs, which installs
                        // their CRDs; here the rendering is what matters.
                        if kind == "ServiceMonitor" || kind == "PrometheusRule" {
                            continue;
                        }
                        apply(&client, &obj, true)
                            .await
                            .unwrap_or_else(|e| panic!("{doc}: `{line}`: {e}"));
                    }
                }
                _ => panic!("{doc}: `{line}` is not a command this test can exercise"),
            }
            ran.push(line);
        }
    }
    // The installation order: chart, RBAC, profile, class, hosts, NodePool.
    let order = [
        "helm install kpssh",
        "examples/bootstrap-rbac.yaml",
        "examples/profiles/tls-bootstrap.yaml",
        "examples/sshnodeclass.yaml",
        "examples/sshhost.yaml",
        "examples/nodepool.yaml",
    ];
    let pos = |needle: &str| {
        ran.iter()
            .position(|l| l.contains(needle))
            .unwrap_or_else(|| panic!("the docs never run {needle}: {ran:?}"))
    };
    for pair in order.windows(2) {
        assert!(
            pos(pair[0]) < pos(pair[1]),
            "{} must come before {}",
            pair[0],
            pair[1]
        );
    }
}
