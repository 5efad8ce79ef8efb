//! Every shipped example: the join profiles under examples/profiles/ validate, render every phase
//! (checked by real `bash -n` and `shellcheck`) and keep the leave and secret rules; every
//! manifest under examples/ (except the simulator's scenarios) is accepted by the API server.

#[path = "support/apply.rs"]
mod apply;
#[path = "support/controlplane.rs"]
mod controlplane;

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use apply::{apply, parse_docs};
use controlplane::ControlPlane;
use k8s_openapi::api::core::v1::Namespace;
use kpssh::actors::host::phases::profile_source;
use kpssh::api::{NodePool, SSHJoinProfile, SSHNodeClass, crds};
use kpssh::k8s::{Cluster, ClusterError, KubeCluster};
use kpssh::profile::{
    ExecMode, Phase, PhaseContext, check_verified_profile, raw_plan, render_phase, validate_profile,
};
use kpssh::secret::Secret;
use serde_json::Value;

const EXAMPLES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/examples");

/// Every `.yaml` under examples/, the simulator's scenario files (not Kubernetes objects) aside.
fn manifest_files() -> Vec<PathBuf> {
    fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
        let mut entries: Vec<_> = std::fs::read_dir(dir)
            .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
            .map(|e| e.expect("dir entry").path())
            .collect();
        entries.sort();
        for p in entries {
            if p.is_dir() {
                if p.file_name().is_some_and(|n| n != "sim") {
                    walk(&p, out);
                }
            } else if p.extension().is_some_and(|e| e == "yaml") {
                out.push(p);
            }
        }
    }
    let mut out = Vec::new();
    walk(Path::new(EXAMPLES), &mut out);
    out
}

fn docs(path: &Path) -> Vec<Value> {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    parse_docs(&text)
}

fn all_docs_of_kind(kind: &str) -> Vec<Value> {
    manifest_files()
        .iter()
        .flat_map(|p| docs(p))
        .filter(|d| d["kind"] == kind)
        .collect()
}

fn shipped_profiles() -> Vec<SSHJoinProfile> {
    let dir = Path::new(EXAMPLES).join("profiles");
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .expect("examples/profiles")
        .map(|e| e.expect("entry").path())
        .collect();
    files.sort();
    files
        .iter()
        .flat_map(|p| docs(p))
        .map(|d| serde_json::from_value(d).expect("an SSHJoinProfile"))
        .collect()
}

/// The vars a shipped node class gives the profile, or the profile's documented minimum.
fn vars_for(profile: &str) -> BTreeMap<String, String> {
    let from_class = all_docs_of_kind("SSHNodeClass")
        .into_iter()
        .map(|d| serde_json::from_value::<SSHNodeClass>(d).expect("SSHNodeClass"))
        .find(|c| c.spec.join_profile_ref.name == profile)
        .and_then(|c| c.spec.vars);
    from_class.unwrap_or_else(|| BTreeMap::from([("k8sMinor".to_string(), "36".to_string())]))
}

fn context(profile: &str) -> PhaseContext {
    PhaseContext {
        cluster_endpoint: "https://10.0.0.1:6443".into(),
        cluster_ca_b64: "Q0EK".into(),
        bootstrap_token: Some(Secret::new("abcdef.0123456789abcdef".to_string())),
        node_name: "bare-metal-x7k2p".into(),
        provider_id: "kpssh://kpssh-system/node-7".into(),
        node_labels: BTreeMap::from([("karpenter.sh/nodepool".into(), "bare-metal".into())]),
        taints: Vec::new(),
        host_address: "192.0.2.17".into(),
        node_address: "192.0.2.17".into(),
        vars: vars_for(profile),
        secrets: BTreeMap::from([
            (
                "activationId".to_string(),
                Secret::new("act-id-123".to_string()),
            ),
            (
                "activationCode".to_string(),
                Secret::new("act-code-456".to_string()),
            ),
        ]),
    }
}

/// Runs a tool with the script on stdin; panics with its output when it fails.
fn check_with(tool: &[&str], script: &[u8], what: &str) {
    let mut child = Command::new("timeout")
        .arg("60")
        .args(tool)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("{tool:?}: {e}"));
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(script)
        .expect("write script");
    let out = child.wait_with_output().expect("wait");
    assert!(
        out.status.success(),
        "{what}: {tool:?} failed:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn the_three_seed_profiles_are_shipped() {
    let names: Vec<String> = shipped_profiles()
        .iter()
        .map(|p| p.metadata.name.clone().unwrap_or_default())
        .collect();
    assert_eq!(names, ["nodeadm-ssm", "sbc", "tls-bootstrap"]);
}

#[test]
fn every_shipped_profile_validates_and_renders_every_phase() {
    for profile in shipped_profiles() {
        let name = profile.metadata.name.clone().unwrap_or_default();
        let source = profile_source(&profile);
        validate_profile(&source).unwrap_or_else(|e| panic!("{name}: {e}"));
        // Template-free and carrying their own `set -euo pipefail`: usable signed, in
        // Verified mode, exactly as shipped.
        check_verified_profile(&source).unwrap_or_else(|e| panic!("{name}: {e}"));
        let ctx = context(&name);
        for phase in [Phase::Install, Phase::Join, Phase::Leave, Phase::Uninstall] {
            let what = format!("{name} {phase}");
            let script = source
                .script(phase)
                .unwrap_or_else(|| panic!("{what} is missing"));
            let rendered = render_phase(&source, phase, &ctx.for_phase(phase), ExecMode::Raw)
                .unwrap_or_else(|e| panic!("{what}: {e}"));
            // What the host's bash would read in Raw mode: the preamble, then the script.
            let plan = raw_plan(&rendered, "root").unwrap_or_else(|e| panic!("{what}: {e}"));
            check_with(&["bash", "-n"], &plan.stdin, &what);
            // The preamble carries the script as data (a here-document): check it on its own.
            check_with(&["bash", "-n"], &rendered.script, &what);
            check_with(
                &["shellcheck", "-s", "bash", "-S", "warning", "-"],
                script.as_bytes(),
                &what,
            );
            check_xtrace_never_covers_a_secret(&what, script);
        }
        let leave = source.script(Phase::Leave).expect("leave");
        // The leave contract: only the host's addresses exist there.
        for (i, _) in leave.match_indices("KPSSH_") {
            let name_here: String = leave[i..]
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect();
            assert!(
                ["KPSSH_HOST_ADDRESS", "KPSSH_NODE_ADDRESS"].contains(&name_here.as_str()),
                "{name} leave uses {name_here}, which leave never gets"
            );
        }
        // Rule 3 of the lifecycle contract: a rebooted warm host stays out of the cluster.
        assert!(
            leave.contains("systemctl disable --now kubelet"),
            "{name} leave must disable (not only stop) kubelet"
        );
        let join = source.script(Phase::Join).expect("join");
        assert!(
            join.contains("enable"),
            "{name} join must re-enable what leave disabled"
        );
    }
}

/// `set -x` prints commands after expansion: no line that expands a secret or the token may
/// run while tracing is on.
fn check_xtrace_never_covers_a_secret(what: &str, script: &str) {
    let mut tracing = false;
    for (n, line) in script.lines().enumerate() {
        let code = line.split('#').next().unwrap_or_default();
        if code.contains("set -x") {
            tracing = true;
        }
        if code.contains("set +x") {
            tracing = false;
        }
        let secret = code.contains("KPSSH_SECRET_") || code.contains("KPSSH_BOOTSTRAP_TOKEN");
        assert!(
            !(tracing && secret),
            "{what} line {}: a secret is expanded while xtrace is on: {line}",
            n + 1
        );
        // A branch that exits ends its own tracing; a new block starts untraced only if it
        // says so, so stay conservative: tracing stays on until `set +x`.
    }
}

#[test]
fn the_xtrace_check_catches_a_traced_secret() {
    let bad = "set -euo pipefail\nset -x\necho \"$KPSSH_SECRET_ACTIVATIONCODE\"\n";
    let caught = std::panic::catch_unwind(|| check_xtrace_never_covers_a_secret("bad", bad));
    assert!(caught.is_err());
    check_xtrace_never_covers_a_secret(
        "good",
        "set -euo pipefail\necho \"$KPSSH_SECRET_A\" > f\nset -x\nrun f\n",
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_example_manifest_is_accepted_by_the_api_server() {
    let cp = ControlPlane::shared();
    let yaml = format!(
        "{}{}",
        crds::to_yaml(&crds::kpssh_crds()).expect("yaml"),
        crds::to_yaml(&crds::karpenter_crds()).expect("yaml")
    );
    cp.install_crds(&yaml).await;
    let client = cp.client().await;
    let c = KubeCluster::new(client.clone());
    let ns: Namespace =
        serde_json::from_value(serde_json::json!({"metadata": {"name": "kpssh-system"}}))
            .expect("ns");
    match c.create(&ns).await {
        Ok(_) | Err(ClusterError::AlreadyExists { .. }) => {}
        Err(e) => panic!("{e}"),
    }
    let files = manifest_files();
    let mut applied = BTreeMap::<String, usize>::new();
    for file in &files {
        let rel = file
            .strip_prefix(EXAMPLES)
            .expect("under examples")
            .display()
            .to_string();
        for doc in docs(file) {
            apply(&client, &doc, false)
                .await
                .unwrap_or_else(|e| panic!("the API server refused {rel}: {e}"));
            *applied.entry(rel.clone()).or_default() += 1;
        }
    }
    for must in [
        "bootstrap-rbac.yaml",
        "coexistence.yaml",
        "nodepool.yaml",
        "profiles/nodeadm-ssm.yaml",
        "profiles/sbc.yaml",
        "profiles/tls-bootstrap.yaml",
        "sshhost.yaml",
        "sshnodeclass-eks-hybrid.yaml",
        "sshnodeclass.yaml",
    ] {
        assert!(
            applied.contains_key(must),
            "{must} was not applied: {applied:?}"
        );
    }
    // Every node class names a shipped profile, and every NodePool is either kpssh's (pointing
    // at a shipped node class) or, in the coexistence example, another provider's.
    let classes: Vec<SSHNodeClass> = all_docs_of_kind("SSHNodeClass")
        .into_iter()
        .map(|d| serde_json::from_value(d).expect("class"))
        .collect();
    let profiles: Vec<String> = shipped_profiles()
        .iter()
        .filter_map(|p| p.metadata.name.clone())
        .collect();
    for class in &classes {
        assert!(
            profiles.contains(&class.spec.join_profile_ref.name),
            "node class {:?} names an unshipped profile",
            class.metadata.name
        );
    }
    let mut ours = 0;
    for doc in all_docs_of_kind("NodePool") {
        let pool: NodePool = serde_json::from_value(doc).expect("nodepool");
        let name = pool.metadata.name.clone().unwrap_or_default();
        if pool.is_ours() {
            ours += 1;
            let class = &pool.spec.template.spec.node_class_ref.name;
            assert!(
                classes
                    .iter()
                    .any(|c| c.metadata.name.as_ref() == Some(class)),
                "NodePool {name} points at SSHNodeClass {class}, which no example defines"
            );
        } else {
            assert_eq!(
                name, "cloud-burst",
                "only the coexistence example has a foreign pool"
            );
        }
    }
    assert!(ours >= 2, "{ours}");
}
