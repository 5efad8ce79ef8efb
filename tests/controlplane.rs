//! Tier-4 smoke tests: the real control plane behaves the way kpssh relies on.
//!
//! These use plain `kube::Api`; they will be re-pointed at the product's `Cluster` port later.
//! Binaries: see tests/support/controlplane.rs and docs/development.md.

#[path = "support/controlplane.rs"]
mod controlplane;

use std::time::{Duration, Instant};

use controlplane::ControlPlane;
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::authentication::v1::SelfSubjectReview;
use k8s_openapi::api::core::v1::{
    ConfigMap, Namespace, Node, Pod, PodCondition, PodStatus, Secret, ServiceAccount,
};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::api::{
    Api, DeleteParams, DynamicObject, EvictParams, ListParams, Patch, PatchParams, PostParams,
    WatchEvent, WatchParams,
};
use kube::core::{ApiResource, GroupVersionKind};
use serde_json::json;

/// Creates a namespace with a unique name (tests share one control plane) and its `default`
/// ServiceAccount (normally made by kube-controller-manager, which most tests do not run; the
/// ServiceAccount admission plugin rejects pods without it).
async fn namespace(client: &kube::Client, prefix: &str) -> String {
    let name = format!("{prefix}-{:08x}", rand::random::<u32>());
    let ns: Namespace =
        serde_json::from_value(json!({"metadata": {"name": name}})).expect("namespace object");
    Api::<Namespace>::all(client.clone())
        .create(&PostParams::default(), &ns)
        .await
        .expect("creating namespace");
    let sa: ServiceAccount =
        serde_json::from_value(json!({"metadata": {"name": "default"}})).expect("SA object");
    match Api::<ServiceAccount>::namespaced(client.clone(), &name)
        .create(&PostParams::default(), &sa)
        .await
    {
        Ok(_) => {}
        Err(kube::Error::Api(s)) if s.code == 409 => {}
        Err(e) => panic!("creating default ServiceAccount: {e}"),
    }
    name
}

fn api_code<T: std::fmt::Debug>(res: Result<T, kube::Error>) -> u16 {
    match res {
        Err(kube::Error::Api(s)) => s.code,
        other => panic!("expected an API error status, got {other:?}"),
    }
}

async fn eventually<F, Fut>(what: &str, timeout: Duration, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let deadline = Instant::now() + timeout;
    while !check().await {
        assert!(
            Instant::now() < deadline,
            "timed out after {timeout:?}: {what}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test]
async fn apiserver_is_ready_and_reports_pinned_version() {
    let cp = ControlPlane::shared();
    let client = cp.client().await;
    let req = http::Request::get("/readyz")
        .body(Vec::new())
        .expect("request");
    let body = client.request_text(req).await.expect("/readyz");
    assert_eq!(body.trim(), "ok");
    let version = client.apiserver_version().await.expect("/version");
    assert_eq!(version.git_version, "v1.36.3", "{version:?}");
}

#[tokio::test]
async fn stale_resource_version_update_is_a_conflict() {
    let cp = ControlPlane::shared();
    let client = cp.client().await;
    let ns = namespace(&client, "cas").await;
    let api = Api::<ConfigMap>::namespaced(client, &ns);
    let cm: ConfigMap = serde_json::from_value(json!({
        "metadata": {"name": "cas"}, "data": {"v": "1"}
    }))
    .expect("configmap");
    let created = api
        .create(&PostParams::default(), &cm)
        .await
        .expect("create");

    let mut first = created.clone();
    first.data = Some([("v".to_string(), "2".to_string())].into());
    let updated = api
        .replace("cas", &PostParams::default(), &first)
        .await
        .expect("update with the current resourceVersion");
    assert_ne!(
        updated.metadata.resource_version,
        created.metadata.resource_version
    );

    // A writer still holding the old resourceVersion loses.
    let mut stale = created;
    stale.data = Some([("v".to_string(), "3".to_string())].into());
    let code = api_code(api.replace("cas", &PostParams::default(), &stale).await);
    assert_eq!(code, 409);
    let now = api.get("cas").await.expect("get");
    assert_eq!(now.data.expect("data")["v"], "2");
}

const WIDGET_CRD: &str = r#"
---
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata:
  name: widgets.smoke.kpssh.test
spec:
  group: smoke.kpssh.test
  scope: Namespaced
  names: {plural: widgets, singular: widget, kind: Widget, shortNames: [wdg]}
  versions:
  - name: v1
    served: true
    storage: true
    subresources: {status: {}}
    schema:
      openAPIV3Schema:
        type: object
        properties:
          spec:
            type: object
            required: [size]
            properties:
              size: {type: integer, minimum: 0}
              max: {type: integer}
            x-kubernetes-validations:
            - rule: "!has(self.max) || self.size <= self.max"
              message: size must not exceed max
          status:
            type: object
            properties:
              state: {type: string, enum: [Pending, Ready]}
---
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata:
  name: gadgets.smoke.kpssh.test
spec:
  group: smoke.kpssh.test
  scope: Cluster
  names: {plural: gadgets, singular: gadget, kind: Gadget}
  versions:
  - name: v1
    served: true
    storage: true
    schema:
      openAPIV3Schema: {type: object, x-kubernetes-preserve-unknown-fields: true}
"#;

#[tokio::test]
async fn crds_install_get_established_and_validate() {
    let cp = ControlPlane::shared();
    cp.install_crds(WIDGET_CRD).await;
    // Installing again is a no-op apply.
    cp.install_crds(WIDGET_CRD).await;

    let client = cp.client().await;
    let ns = namespace(&client, "crd").await;
    let gvk = GroupVersionKind::gvk("smoke.kpssh.test", "v1", "Widget");
    let ar = ApiResource::from_gvk(&gvk);
    let api = Api::<DynamicObject>::namespaced_with(client, &ns, &ar);
    let obj = |name: &str, spec: serde_json::Value| -> DynamicObject {
        serde_json::from_value(json!({
            "apiVersion": "smoke.kpssh.test/v1", "kind": "Widget",
            "metadata": {"name": name}, "spec": spec
        }))
        .expect("widget")
    };
    api.create(
        &PostParams::default(),
        &obj("ok", json!({"size": 1, "max": 2})),
    )
    .await
    .expect("valid widget");
    // OpenAPI schema and CEL rule are enforced by the server.
    let code = api_code(
        api.create(&PostParams::default(), &obj("neg", json!({"size": -1})))
            .await,
    );
    assert_eq!(code, 422);
    let err = api
        .create(
            &PostParams::default(),
            &obj("cel", json!({"size": 3, "max": 2})),
        )
        .await
        .expect_err("CEL rule must reject size > max");
    assert!(
        err.to_string().contains("size must not exceed max"),
        "{err}"
    );
}

#[tokio::test]
async fn bootstrap_token_secret_authenticates_until_deleted() {
    let cp = ControlPlane::shared();
    let client = cp.client().await;
    let secrets = Api::<Secret>::namespaced(client, "kube-system");
    const ALNUM: &[u8] = b"abcdefghijklmnopqrstuvwxyz0123456789";
    let pick = |n: usize| -> String {
        (0..n)
            .map(|_| ALNUM[rand::random_range(0..ALNUM.len())] as char)
            .collect()
    };
    let (id, secret) = (pick(6), pick(16));
    let name = format!("bootstrap-token-{id}");
    let expiration = jiff::Timestamp::now() + jiff::SignedDuration::from_hours(1);
    let s: Secret = serde_json::from_value(json!({
        "metadata": {"name": name},
        "type": "bootstrap.kubernetes.io/token",
        "stringData": {
            "token-id": id,
            "token-secret": secret,
            "expiration": expiration.to_string(),
            "usage-bootstrap-authentication": "true",
            "usage-bootstrap-signing": "true",
            "auth-extra-groups": "system:bootstrappers:kpssh",
        }
    }))
    .expect("secret");
    let created = secrets
        .create(&PostParams::default(), &s)
        .await
        .expect("create bootstrap token Secret");
    assert_eq!(
        created.type_.as_deref(),
        Some("bootstrap.kubernetes.io/token")
    );

    // The token authenticates as system:bootstrap:<id> in the extra group.
    let token_client = token_client(cp, &format!("{id}.{secret}")).await;
    let review: SelfSubjectReview =
        serde_json::from_value(json!({"metadata": {}})).expect("review");
    // The authenticator reads Secrets through an informer: allow it a moment.
    let reviews = Api::<SelfSubjectReview>::all(token_client.clone());
    let deadline = Instant::now() + Duration::from_secs(30);
    let user = loop {
        match reviews.create(&PostParams::default(), &review).await {
            Ok(r) => break r.status.and_then(|s| s.user_info),
            Err(e) => assert!(
                Instant::now() < deadline,
                "bootstrap token does not authenticate: {e}"
            ),
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let user = user.expect("user info in SelfSubjectReview");
    assert_eq!(
        user.username.as_deref(),
        Some(format!("system:bootstrap:{id}").as_str())
    );
    let groups = user.groups.unwrap_or_default();
    assert!(
        groups.iter().any(|g| g == "system:bootstrappers:kpssh"),
        "{groups:?}"
    );

    secrets
        .delete(&name, &DeleteParams::default())
        .await
        .expect("delete bootstrap token Secret");
    assert_eq!(api_code(secrets.get(&name).await), 404);
    eventually(
        "deleted bootstrap token stops authenticating",
        Duration::from_secs(30),
        || {
            let api = Api::<SelfSubjectReview>::all(token_client.clone());
            let review = review.clone();
            async move {
                matches!(api.create(&PostParams::default(), &review).await,
                         Err(kube::Error::Api(s)) if s.code == 401)
            }
        },
    )
    .await;
}

async fn token_client(cp: &ControlPlane, token: &str) -> kube::Client {
    let mut config = kube::Config::new(cp.server().parse().expect("server URL"));
    config.root_cert = Some(vec![pem_to_der(&cp.pki().ca_cert)]);
    config.auth_info.token = Some(token.to_string().into());
    config.default_retry = false;
    kube::Client::try_from(config).expect("token client")
}

fn pem_to_der(pem: &str) -> Vec<u8> {
    use base64::Engine as _;
    let b64: String = pem.lines().filter(|l| !l.starts_with("-----")).collect();
    base64::engine::general_purpose::STANDARD
        .decode(b64)
        .expect("PEM body")
}

#[tokio::test]
async fn eviction_honours_pod_disruption_budget() {
    let cp = ControlPlane::shared();
    // The disruption controller computes the PDB status the Eviction API checks.
    cp.start_controller_manager();
    let client = cp.client().await;
    let ns = namespace(&client, "evict").await;
    let pods = Api::<Pod>::namespaced(client.clone(), &ns);
    let pdbs = Api::<PodDisruptionBudget>::namespaced(client.clone(), &ns);

    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": "guarded", "labels": {"app": "guarded"}},
        "spec": {
            "automountServiceAccountToken": false,
            "containers": [{"name": "c", "image": "registry.k8s.io/pause:3.10"}]
        }
    }))
    .expect("pod");
    pods.create(&PostParams::default(), &pod)
        .await
        .expect("create pod");
    // No kubelet: make the pod look running and ready, as the Eviction API ignores PDBs for
    // Pending pods.
    let now = k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(jiff::Timestamp::now());
    let status = PodStatus {
        phase: Some("Running".into()),
        conditions: Some(vec![PodCondition {
            type_: "Ready".into(),
            status: "True".into(),
            last_transition_time: Some(now),
            ..Default::default()
        }]),
        ..Default::default()
    };
    pods.patch_status(
        "guarded",
        &PatchParams::default(),
        &Patch::Merge(json!({"status": status})),
    )
    .await
    .expect("mark pod running");

    let pdb: PodDisruptionBudget = serde_json::from_value(json!({
        "metadata": {"name": "guard"},
        "spec": {"maxUnavailable": 0, "selector": {"matchLabels": {"app": "guarded"}}}
    }))
    .expect("pdb");
    pdbs.create(&PostParams::default(), &pdb)
        .await
        .expect("create PDB");
    eventually(
        "disruption controller observes the PDB",
        Duration::from_secs(60),
        || {
            let pdbs = pdbs.clone();
            async move {
                let p = pdbs.get("guard").await.expect("get PDB");
                let observed = p.status.as_ref().and_then(|s| s.observed_generation);
                observed.is_some() && observed == p.metadata.generation
            }
        },
    )
    .await;
    let status = pdbs
        .get("guard")
        .await
        .expect("get PDB")
        .status
        .expect("PDB status");
    assert_eq!(status.disruptions_allowed, Some(0), "{status:?}");

    // The harness's clients have kube's default 429/503/504 retry turned off; with it on,
    // this call would back off for minutes before surfacing the 429.
    let res = pods.evict("guarded", &EvictParams::default()).await;
    let Err(kube::Error::Api(s)) = res else {
        panic!("eviction must be refused while the PDB allows no disruption: {res:?}");
    };
    assert_eq!(s.code, 429, "{s:?}");
    pods.get("guarded").await.expect("pod still there");

    pdbs.delete("guard", &DeleteParams::default())
        .await
        .expect("delete PDB");
    pods.evict("guarded", &EvictParams::default())
        .await
        .expect("eviction without a PDB");
    eventually("evicted pod is gone", Duration::from_secs(30), || {
        let pods = pods.clone();
        async move { matches!(pods.get("guarded").await, Err(kube::Error::Api(s)) if s.code == 404) }
    })
    .await;
}

#[tokio::test]
async fn watch_sees_create_update_delete_in_order() {
    let cp = ControlPlane::shared();
    let client = cp.client().await;
    let ns = namespace(&client, "watch").await;
    let api = Api::<ConfigMap>::namespaced(client, &ns);
    // Only the test's own object: the controller-manager publishes
    // `kube-root-ca.crt` into every new namespace, racing with the watch.
    let only_w = ListParams::default().fields("metadata.name=w");
    let rv = api
        .list(&only_w)
        .await
        .expect("list")
        .metadata
        .resource_version
        .expect("list resourceVersion");
    let stream = api
        .watch(
            &WatchParams::default().fields("metadata.name=w").timeout(60),
            &rv,
        )
        .await
        .expect("watch");
    let mut stream = stream.boxed();

    let cm: ConfigMap = serde_json::from_value(json!({
        "metadata": {"name": "w"}, "data": {"v": "1"}
    }))
    .expect("configmap");
    api.create(&PostParams::default(), &cm)
        .await
        .expect("create");
    api.patch(
        "w",
        &PatchParams::default(),
        &Patch::Merge(json!({"data": {"v": "2"}})),
    )
    .await
    .expect("update");
    api.delete("w", &DeleteParams::default())
        .await
        .expect("delete");

    let mut seen = Vec::new();
    let deadline = Duration::from_secs(30);
    while seen.len() < 3 {
        let ev = tokio::time::timeout(deadline, stream.try_next())
            .await
            .expect("watch event in time")
            .expect("watch stream error")
            .expect("watch ended early");
        let (kind, obj) = match ev {
            WatchEvent::Added(o) => ("Added", o),
            WatchEvent::Modified(o) => ("Modified", o),
            WatchEvent::Deleted(o) => ("Deleted", o),
            WatchEvent::Bookmark(_) => continue,
            WatchEvent::Error(e) => panic!("watch error event: {e:?}"),
        };
        let v = obj.data.and_then(|d| d.get("v").cloned());
        let rv: u64 = obj
            .metadata
            .resource_version
            .expect("resourceVersion")
            .parse()
            .expect("numeric resourceVersion (etcd revision)");
        seen.push((kind, v, rv));
    }
    let kinds: Vec<_> = seen.iter().map(|(k, v, _)| (*k, v.as_deref())).collect();
    assert_eq!(
        kinds,
        [
            ("Added", Some("1")),
            ("Modified", Some("2")),
            ("Deleted", Some("2"))
        ]
    );
    assert!(
        seen.windows(2).all(|w| w[0].2 < w[1].2),
        "resourceVersions must increase: {seen:?}"
    );
}

/// An owned control plane with kube-scheduler: a pod is bound to a (fake, Ready) Node; dropping
/// the control plane leaves no process and no temp dir behind.
#[tokio::test]
async fn owned_control_plane_schedules_and_tears_down() {
    let cp = ControlPlane::start();
    cp.start_scheduler();
    let client = cp.client().await;
    let ns = namespace(&client, "sched").await;

    let node: Node = serde_json::from_value(json!({
        "metadata": {"name": "fake-node", "labels": {"kubernetes.io/hostname": "fake-node"}},
    }))
    .expect("node");
    let nodes = Api::<Node>::all(client.clone());
    nodes
        .create(&PostParams::default(), &node)
        .await
        .expect("create node");
    let cap = json!({"cpu": "2", "memory": "4Gi", "pods": "110"});
    nodes
        .patch_status(
            "fake-node",
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {
                "capacity": cap, "allocatable": cap,
                "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady",
                                "message": "fake", "lastHeartbeatTime": jiff::Timestamp::now().to_string(),
                                "lastTransitionTime": jiff::Timestamp::now().to_string()}]
            }})),
        )
        .await
        .expect("node status");
    // The TaintNodesByCondition admission plugin taints new Nodes not-ready; the node lifecycle
    // controller (kube-controller-manager, not running here) would lift it.
    nodes
        .patch(
            "fake-node",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"taints": null}})),
        )
        .await
        .expect("remove not-ready taint");

    let pods = Api::<Pod>::namespaced(client.clone(), &ns);
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": "p"},
        "spec": {
            "automountServiceAccountToken": false,
            "containers": [{"name": "c", "image": "registry.k8s.io/pause:3.10",
                            "resources": {"requests": {"cpu": "100m"}}}]
        }
    }))
    .expect("pod");
    pods.create(&PostParams::default(), &pod)
        .await
        .expect("create pod");
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let p = pods.get("p").await.expect("get pod");
        if p.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some("fake-node") {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "scheduler did not bind the pod: {:?}\n{}",
            p.status,
            cp.log_tail("kube-scheduler")
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    let pids = cp.pids();
    assert_eq!(pids.len(), 3, "{pids:?}");
    let root = cp.temp_dir().to_path_buf();
    drop(client);
    drop(cp);
    for (name, pid) in pids {
        assert!(
            !std::path::Path::new(&format!("/proc/{pid}")).exists(),
            "{name} (pid {pid}) survived the control plane's drop"
        );
    }
    assert!(!root.exists(), "{} not removed", root.display());
}

const HELPER_ENV: &str = "KPSSH_CONTROLPLANE_PDEATHSIG_HELPER";

/// Run by `killed_test_binary_leaves_no_process` in a child copy of this test binary: starts a
/// control plane, reports its pids and temp dir, then waits to be killed.
#[test]
#[ignore = "helper process for killed_test_binary_leaves_no_process"]
fn pdeathsig_helper() {
    if std::env::var_os(HELPER_ENV).is_none() {
        return;
    }
    let cp = ControlPlane::start();
    let pids: Vec<String> = cp.pids().iter().map(|(_, p)| p.to_string()).collect();
    let root = cp.temp_dir().display().to_string();
    println!("KPSSH_HELPER {root} {}", pids.join(" "));
    std::thread::sleep(Duration::from_secs(600));
}

/// SIGKILL of a test binary (no Drop, no atexit) still takes its control plane down, through
/// PR_SET_PDEATHSIG.
#[test]
fn killed_test_binary_leaves_no_process() {
    use std::io::BufRead as _;
    let exe = std::env::current_exe().expect("current test binary");
    let mut child = std::process::Command::new(exe)
        .args([
            "--ignored",
            "--exact",
            "pdeathsig_helper",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(HELPER_ENV, "1")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("spawning helper");
    let stdout = child.stdout.take().expect("helper stdout");
    let mut stderr = child.stderr.take().expect("helper stderr");
    let line = std::io::BufReader::new(stdout)
        .lines()
        .map(|l| l.expect("helper output"))
        // libtest prints "test pdeathsig_helper ... " on the same line first.
        .find_map(|l| {
            l.split_once("KPSSH_HELPER ")
                .map(|(_, rest)| rest.to_string())
        });
    let Some(line) = line else {
        let mut err = String::new();
        let _ = std::io::Read::read_to_string(&mut stderr, &mut err);
        panic!("helper did not report its control plane; its stderr:\n{err}");
    };
    let mut fields = line.split_whitespace();
    let root = fields.next().expect("temp dir").to_string();
    let pids: Vec<u32> = fields.map(|p| p.parse().expect("pid")).collect();
    assert_eq!(pids.len(), 2, "etcd and kube-apiserver: {line}");

    child.kill().expect("SIGKILL helper");
    child.wait().expect("reap helper");
    let alive = |pid: u32| {
        // Gone, or a zombie waiting for a reaper that is not us.
        std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .map(|s| {
                let state = s.rsplit(')').next().unwrap_or("").trim_start();
                !state.starts_with('Z')
            })
            .unwrap_or(false)
    };
    let deadline = Instant::now() + Duration::from_secs(10);
    while pids.iter().any(|p| alive(*p)) {
        assert!(
            Instant::now() < deadline,
            "processes {pids:?} outlived their killed test binary"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    // Without Drop nobody removes the temp dir; do it here.
    let _ = std::fs::remove_dir_all(&root);
}
