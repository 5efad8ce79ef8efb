//! Tier-4 test support: a real Kubernetes control plane (etcd + kube-apiserver, optionally
//! kube-scheduler and kube-controller-manager) started from binaries built by
//! `scripts/controlplane.sh`. It plays the role envtest plays for Go controllers.
//!
//! Use from a test file with
//! `#[path = "support/controlplane.rs"] mod controlplane;`
//!
//! * [`ControlPlane::start`] gives an owned control plane; dropping it (also while unwinding from a
//!   panic) kills every process it started and removes its temporary directory.
//! * [`ControlPlane::shared`] gives one control plane per test binary, started on first use and
//!   torn down when the test binary exits. Tests sharing it must use their own namespaces/names.
//!
//! Every child process is spawned with `PR_SET_PDEATHSIG = SIGKILL` from a dedicated thread that
//! lives as long as the test binary, so a test binary that is killed leaves nothing behind.
//!
//! Binaries come from `KPSSH_CONTROLPLANE_DIR` if set, else from the last stdout line of
//! `scripts/controlplane.sh` (which builds them once into `~/.cache/kpssh`). If neither works the
//! harness panics: tier-4 tests are never silently skipped.

#![allow(dead_code)] // each test binary uses a different subset

use std::fmt::Write as _;
use std::fs::{self, File};
use std::io::{self, Read, Seek, SeekFrom};
use std::net::TcpListener;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Mutex, OnceLock, mpsc};
use std::time::{Duration, Instant};

use base64::Engine as _;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, Patch, PatchParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose,
};
use serde::Deserialize as _;

/// Bound on waiting for kube-apiserver `/readyz` (the machine may be busy building).
const APISERVER_READY_TIMEOUT: Duration = Duration::from_secs(120);
/// Bound on waiting for kube-scheduler / kube-controller-manager `/healthz`.
const COMPONENT_HEALTHY_TIMEOUT: Duration = Duration::from_secs(60);
/// Bound on waiting for a CustomResourceDefinition to become Established.
const CRD_ESTABLISHED_TIMEOUT: Duration = Duration::from_secs(60);
/// Service IP range handed to kube-apiserver; its first address is the `kubernetes` Service.
pub const SERVICE_CLUSTER_IP_RANGE: &str = "10.96.0.0/16";
const KUBERNETES_SERVICE_IP: &str = "10.96.0.1";
/// Field manager used by [`ControlPlane::install_crds`].
const FIELD_MANAGER: &str = "kpssh-tests";

const BINARIES: [&str; 4] = [
    "etcd",
    "kube-apiserver",
    "kube-scheduler",
    "kube-controller-manager",
];

/// A running control plane. See the module documentation.
pub struct ControlPlane {
    dir: Mutex<Option<tempfile::TempDir>>,
    root: PathBuf,
    bin_dir: PathBuf,
    server: String,
    pki: Pki,
    kubeconfig_yaml: String,
    kubeconfig_path: PathBuf,
    procs: Mutex<Vec<Proc>>,
}

/// Generated key material, PEM encoded. Written to `<root>/pki/` as well.
pub struct Pki {
    pub ca_cert: String,
    pub ca_key: String,
    pub admin_cert: String,
    pub admin_key: String,
    /// Service-account token signing key (ECDSA P-256, PKCS#8).
    pub sa_key: String,
    dir: PathBuf,
}

struct Proc {
    name: &'static str,
    child: Child,
    log: PathBuf,
}

impl ControlPlane {
    /// Starts etcd and kube-apiserver and waits for `/readyz`. Panics with the tail of the
    /// process logs if that fails. Blocking; may be called from sync or async tests.
    pub fn start() -> ControlPlane {
        match Self::try_start() {
            Ok(cp) => cp,
            Err(e) => panic!("control plane did not start: {e}"),
        }
    }

    /// One control plane per test binary, started on first use. It is torn down (processes
    /// killed, temp dir removed) when the test binary exits; if the binary is killed, the
    /// processes die with it (PR_SET_PDEATHSIG) and only the temp dir may stay behind.
    pub fn shared() -> &'static ControlPlane {
        static SHARED: OnceLock<Result<ControlPlane, String>> = OnceLock::new();
        let res = SHARED.get_or_init(|| {
            let res = Self::try_start();
            if res.is_ok() {
                extern "C" fn teardown_shared() {
                    if let Some(Ok(cp)) = SHARED.get() {
                        cp.shutdown();
                    }
                }
                // SAFETY: registering a plain `extern "C" fn` with no captured state.
                unsafe {
                    libc::atexit(teardown_shared);
                }
            }
            res
        });
        match res {
            Ok(cp) => cp,
            Err(e) => panic!("shared control plane did not start: {e}"),
        }
    }

    fn try_start() -> Result<ControlPlane, String> {
        let bin_dir = binaries_dir()?.to_path_buf();
        let mut last_err = String::new();
        // Free ports are picked by binding port 0; another process may grab one before our
        // child binds it, so a bind failure is retried with fresh ports.
        for _attempt in 0..3 {
            match Self::try_start_once(&bin_dir) {
                Ok(cp) => return Ok(cp),
                Err(e) if e.contains("address already in use") => last_err = e,
                Err(e) => return Err(e),
            }
        }
        Err(last_err)
    }

    fn try_start_once(bin_dir: &Path) -> Result<ControlPlane, String> {
        let dir = tempfile::Builder::new()
            .prefix("kpssh-controlplane-")
            .tempdir()
            .map_err(|e| format!("creating temp dir: {e}"))?;
        let root = dir.path().to_path_buf();
        let pki = Pki::generate(&root.join("pki"))?;

        let etcd_client = free_port()?;
        let etcd_peer = free_port()?;
        let api_port = free_port()?;
        let server = format!("https://127.0.0.1:{api_port}");
        let kubeconfig_yaml = kubeconfig(&server, &pki.ca_cert, &pki.admin_cert, &pki.admin_key);
        let kubeconfig_path = root.join("admin.kubeconfig");
        write(&kubeconfig_path, &kubeconfig_yaml)?;

        let cp = ControlPlane {
            dir: Mutex::new(Some(dir)),
            root: root.clone(),
            bin_dir: bin_dir.to_path_buf(),
            server,
            pki,
            kubeconfig_yaml,
            kubeconfig_path,
            procs: Mutex::new(Vec::new()),
        };
        // From here on `cp` owns the temp dir and every process: an early return drops it,
        // which kills what was started.

        let etcd_url = format!("http://127.0.0.1:{etcd_client}");
        let peer_url = format!("http://127.0.0.1:{etcd_peer}");
        let etcd_data = root.join("etcd");
        cp.spawn(
            "etcd",
            &[
                "--name=default".into(),
                format!("--data-dir={}", etcd_data.display()),
                format!("--listen-client-urls={etcd_url}"),
                format!("--advertise-client-urls={etcd_url}"),
                format!("--listen-peer-urls={peer_url}"),
                format!("--initial-advertise-peer-urls={peer_url}"),
                format!("--initial-cluster=default={peer_url}"),
                "--unsafe-no-fsync=true".into(),
                "--log-level=warn".into(),
            ],
        )?;

        let pki_dir = &cp.pki.dir;
        let p = |f: &str| pki_dir.join(f).display().to_string();
        cp.spawn(
            "kube-apiserver",
            &[
                format!("--etcd-servers={etcd_url}"),
                "--bind-address=127.0.0.1".into(),
                "--advertise-address=127.0.0.1".into(),
                format!("--secure-port={api_port}"),
                format!("--cert-dir={}", root.join("apiserver-certs").display()),
                format!("--tls-cert-file={}", p("apiserver.crt")),
                format!("--tls-private-key-file={}", p("apiserver.key")),
                format!("--client-ca-file={}", p("ca.crt")),
                "--service-account-issuer=https://kubernetes.default.svc.cluster.local".into(),
                format!("--service-account-key-file={}", p("sa.pub")),
                format!("--service-account-signing-key-file={}", p("sa.key")),
                format!("--service-cluster-ip-range={SERVICE_CLUSTER_IP_RANGE}"),
                "--authorization-mode=Node,RBAC".into(),
                "--enable-admission-plugins=NodeRestriction".into(),
                "--enable-bootstrap-token-auth=true".into(),
                // Front-proxy (request-header) authentication as kubeadm sets it up; without
                // it every component logs missing requestheader CA errors.
                format!("--requestheader-client-ca-file={}", p("ca.crt")),
                "--requestheader-allowed-names=front-proxy-client".into(),
                "--requestheader-username-headers=X-Remote-User".into(),
                "--requestheader-group-headers=X-Remote-Group".into(),
                "--requestheader-extra-headers-prefix=X-Remote-Extra-".into(),
                format!("--proxy-client-cert-file={}", p("front-proxy-client.crt")),
                format!("--proxy-client-key-file={}", p("front-proxy-client.key")),
                "--allow-privileged=true".into(),
                "--profiling=false".into(),
                "--v=1".into(),
            ],
        )?;

        let started = Instant::now();
        cp.wait_apiserver_ready()?;
        eprintln!(
            "control plane: kube-apiserver {} ready after {:.1}s",
            cp.server,
            started.elapsed().as_secs_f64()
        );
        Ok(cp)
    }

    /// `https://127.0.0.1:<port>` of kube-apiserver.
    pub fn server(&self) -> &str {
        &self.server
    }

    /// Path of an admin kubeconfig (user in `system:masters`).
    pub fn kubeconfig_path(&self) -> &Path {
        &self.kubeconfig_path
    }

    /// The admin kubeconfig as YAML.
    pub fn kubeconfig_yaml(&self) -> &str {
        &self.kubeconfig_yaml
    }

    /// Generated CA, admin credentials and service-account key.
    pub fn pki(&self) -> &Pki {
        &self.pki
    }

    /// The temporary directory holding PKI, kubeconfig, etcd data and component logs; removed
    /// on teardown.
    pub fn temp_dir(&self) -> &Path {
        &self.root
    }

    /// The directory holding the control-plane binaries.
    pub fn bin_dir(&self) -> &Path {
        &self.bin_dir
    }

    /// An admin client (`system:masters`). Build one per tokio runtime: a client is bound to
    /// the runtime it was created on.
    ///
    /// kube's default retry of 429/503/504 responses is turned off so tests see the API's
    /// answers as they are (with it, an eviction refused by a PodDisruptionBudget is retried
    /// with exponential backoff for minutes before the 429 surfaces).
    pub async fn client(&self) -> kube::Client {
        client_from_kubeconfig(&self.kubeconfig_yaml)
            .await
            .unwrap_or_else(|e| panic!("admin client for {}: {e}", self.server))
    }

    /// A kubeconfig for `user` in `groups`, authenticated by a client certificate signed by the
    /// cluster CA (e.g. `system:node:<name>` in `system:nodes` for Node-authorizer tests).
    pub fn kubeconfig_for(&self, user: &str, groups: &[&str]) -> String {
        let (cert, key) = self
            .pki
            .client_cert(user, groups)
            .unwrap_or_else(|e| panic!("client cert for {user}: {e}"));
        kubeconfig(&self.server, &self.pki.ca_cert, &cert, &key)
    }

    /// A client for `user` in `groups`; see [`ControlPlane::kubeconfig_for`].
    pub async fn client_for(&self, user: &str, groups: &[&str]) -> kube::Client {
        client_from_kubeconfig(&self.kubeconfig_for(user, groups))
            .await
            .unwrap_or_else(|e| panic!("client for {user}: {e}"))
    }

    /// Starts kube-scheduler (idempotent) and waits for its `/healthz`.
    pub fn start_scheduler(&self) {
        self.start_scheduler_with(false);
    }

    /// [`ControlPlane::start_scheduler`], with leader election as clusters run it (the
    /// scheduler then holds the Lease `kube-system/kube-scheduler`, which `kpssh doctor` checks).
    pub fn start_scheduler_with(&self, leader_elect: bool) {
        if self.running("kube-scheduler") {
            return;
        }
        let port = free_port().unwrap_or_else(|e| panic!("{e}"));
        let kc = self.kubeconfig_path.display().to_string();
        self.spawn(
            "kube-scheduler",
            &[
                format!("--kubeconfig={kc}"),
                format!("--authentication-kubeconfig={kc}"),
                format!("--authorization-kubeconfig={kc}"),
                "--bind-address=127.0.0.1".into(),
                format!("--secure-port={port}"),
                format!("--cert-dir={}", self.root.join("scheduler-certs").display()),
                format!("--leader-elect={leader_elect}"),
                "--v=1".into(),
            ],
        )
        .unwrap_or_else(|e| panic!("{e}"));
        self.wait_component_healthy("kube-scheduler", port)
            .unwrap_or_else(|e| panic!("{e}"));
    }

    /// Starts kube-controller-manager (idempotent) with all default controllers plus
    /// `bootstrapsigner` and `tokencleaner`, CSR signing by the cluster CA and per-controller
    /// service-account credentials, and waits for its `/healthz`.
    pub fn start_controller_manager(&self) {
        if self.running("kube-controller-manager") {
            return;
        }
        let port = free_port().unwrap_or_else(|e| panic!("{e}"));
        let kc = self.kubeconfig_path.display().to_string();
        let p = |f: &str| self.pki.dir.join(f).display().to_string();
        self.spawn(
            "kube-controller-manager",
            &[
                format!("--kubeconfig={kc}"),
                format!("--authentication-kubeconfig={kc}"),
                format!("--authorization-kubeconfig={kc}"),
                "--bind-address=127.0.0.1".into(),
                format!("--secure-port={port}"),
                format!("--cert-dir={}", self.root.join("kcm-certs").display()),
                "--leader-elect=false".into(),
                "--controllers=*,bootstrapsigner,tokencleaner".into(),
                format!("--cluster-signing-cert-file={}", p("ca.crt")),
                format!("--cluster-signing-key-file={}", p("ca.key")),
                "--use-service-account-credentials=true".into(),
                format!("--service-account-private-key-file={}", p("sa.key")),
                format!("--root-ca-file={}", p("ca.crt")),
                format!("--service-cluster-ip-range={SERVICE_CLUSTER_IP_RANGE}"),
                "--cluster-name=kpssh-test".into(),
                "--v=1".into(),
            ],
        )
        .unwrap_or_else(|e| panic!("{e}"));
        let started = Instant::now();
        self.wait_component_healthy("kube-controller-manager", port)
            .unwrap_or_else(|e| panic!("{e}"));
        eprintln!(
            "control plane: kube-controller-manager healthy after {:.1}s",
            started.elapsed().as_secs_f64()
        );
    }

    /// Applies every CustomResourceDefinition in `multi_doc_yaml` (server-side apply, forced)
    /// and waits until each is Established. Panics on any failure.
    pub async fn install_crds(&self, multi_doc_yaml: &str) {
        let client = self.client().await;
        let api: Api<CustomResourceDefinition> = Api::all(client);
        let mut names = Vec::new();
        for (i, doc) in serde_yaml::Deserializer::from_str(multi_doc_yaml).enumerate() {
            let value = serde_yaml::Value::deserialize(doc)
                .unwrap_or_else(|e| panic!("CRD YAML document {i}: {e}"));
            if value.is_null() {
                continue;
            }
            let crd: CustomResourceDefinition = serde_yaml::from_value(value)
                .unwrap_or_else(|e| panic!("CRD YAML document {i} is not a CRD: {e}"));
            let name = crd
                .metadata
                .name
                .clone()
                .unwrap_or_else(|| panic!("CRD YAML document {i} has no metadata.name"));
            api.patch(
                &name,
                &PatchParams::apply(FIELD_MANAGER).force(),
                &Patch::Apply(&crd),
            )
            .await
            .unwrap_or_else(|e| panic!("applying CRD {name}: {e}"));
            names.push(name);
        }
        let deadline = Instant::now() + CRD_ESTABLISHED_TIMEOUT;
        for name in names {
            loop {
                let crd = api
                    .get(&name)
                    .await
                    .unwrap_or_else(|e| panic!("reading CRD {name}: {e}"));
                let conditions = crd
                    .status
                    .as_ref()
                    .and_then(|s| s.conditions.clone())
                    .unwrap_or_default();
                if conditions
                    .iter()
                    .any(|c| c.type_ == "Established" && c.status == "True")
                {
                    break;
                }
                if Instant::now() > deadline {
                    panic!(
                        "CRD {name} not Established after {CRD_ESTABLISHED_TIMEOUT:?}; conditions: {conditions:?}"
                    );
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }

    /// The last lines of a component's log (`etcd`, `kube-apiserver`, `kube-scheduler`,
    /// `kube-controller-manager`), for failure messages.
    pub fn log_tail(&self, name: &str) -> String {
        log_tail(&self.root.join(format!("{name}.log")))
    }

    /// Process ids of the running components (for tests of the harness itself).
    pub fn pids(&self) -> Vec<(&'static str, u32)> {
        lock(&self.procs)
            .iter()
            .map(|p| (p.name, p.child.id()))
            .collect()
    }

    /// Kills every process and removes the temp dir. Idempotent; also run by Drop.
    pub fn shutdown(&self) {
        // `try_lock`: this also runs from an atexit handler, where a thread that died holding
        // the lock must not hang the exit. PR_SET_PDEATHSIG is the backstop.
        let procs = match self.procs.try_lock() {
            Ok(mut g) => std::mem::take(&mut *g),
            Err(std::sync::TryLockError::Poisoned(p)) => std::mem::take(&mut *p.into_inner()),
            Err(std::sync::TryLockError::WouldBlock) => Vec::new(),
        };
        // Reverse start order: controllers first, etcd last.
        for mut p in procs.into_iter().rev() {
            let _ = p.child.kill();
            let _ = p.child.wait();
        }
        if let Ok(mut dir) = self.dir.try_lock() {
            drop(dir.take());
        }
    }

    fn running(&self, name: &str) -> bool {
        lock(&self.procs)
            .iter_mut()
            .any(|p| p.name == name && matches!(p.child.try_wait(), Ok(None)))
    }

    fn spawn(&self, name: &'static str, args: &[String]) -> Result<(), String> {
        let bin = self.bin_dir.join(name);
        let log = self.root.join(format!("{name}.log"));
        let out = File::create(&log).map_err(|e| format!("creating {}: {e}", log.display()))?;
        let err = out
            .try_clone()
            .map_err(|e| format!("cloning {}: {e}", log.display()))?;
        let mut cmd = Command::new(&bin);
        cmd.args(args)
            .current_dir(&self.root)
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err);
        let child =
            spawn_with_pdeathsig(cmd).map_err(|e| format!("starting {}: {e}", bin.display()))?;
        lock(&self.procs).push(Proc { name, child, log });
        Ok(())
    }

    /// `Err` with the log tail of the first process that exited.
    fn check_alive(&self) -> Result<(), String> {
        let mut procs = lock(&self.procs);
        for p in procs.iter_mut() {
            if let Ok(Some(status)) = p.child.try_wait() {
                return Err(format!(
                    "{} exited early ({status}); last lines of {}:\n{}",
                    p.name,
                    p.log.display(),
                    log_tail(&p.log)
                ));
            }
        }
        Ok(())
    }

    fn logs_tail(&self) -> String {
        let mut s = String::new();
        for p in lock(&self.procs).iter() {
            let _ = write!(
                s,
                "\n--- last lines of {} ({}):\n{}",
                p.name,
                p.log.display(),
                log_tail(&p.log)
            );
        }
        s
    }

    fn wait_apiserver_ready(&self) -> Result<(), String> {
        let kubeconfig = self.kubeconfig_yaml.clone();
        self.wait_until(
            "kube-apiserver /readyz",
            APISERVER_READY_TIMEOUT,
            move || {
                let kubeconfig = kubeconfig.clone();
                async move {
                    let client = client_from_kubeconfig(&kubeconfig).await?;
                    let req = http::Request::get("/readyz")
                        .body(Vec::new())
                        .map_err(|e| e.to_string())?;
                    let body = client.request_text(req).await.map_err(|e| e.to_string())?;
                    if body.trim() == "ok" {
                        Ok(())
                    } else {
                        Err(body)
                    }
                }
            },
        )
    }

    fn wait_component_healthy(&self, name: &str, port: u16) -> Result<(), String> {
        let url = format!("https://127.0.0.1:{port}");
        self.wait_until(
            &format!("{name} /healthz"),
            COMPONENT_HEALTHY_TIMEOUT,
            move || {
                let url = url.clone();
                async move {
                    let uri = url.parse().map_err(|e| format!("{url}: {e}"))?;
                    let mut config = kube::Config::new(uri);
                    // The component serves a self-signed certificate from its --cert-dir.
                    config.accept_invalid_certs = true;
                    config.default_retry = false;
                    let client = kube::Client::try_from(config).map_err(|e| e.to_string())?;
                    let req = http::Request::get("/healthz")
                        .body(Vec::new())
                        .map_err(|e| e.to_string())?;
                    let body = client.request_text(req).await.map_err(|e| e.to_string())?;
                    if body.trim() == "ok" {
                        Ok(())
                    } else {
                        Err(body)
                    }
                }
            },
        )
    }

    /// Polls `probe` on a private tokio runtime in its own thread (so it works from sync code
    /// and from inside any runtime) until it succeeds, a process dies or `timeout` passes.
    fn wait_until<F, Fut>(&self, what: &str, timeout: Duration, probe: F) -> Result<(), String>
    where
        F: Fn() -> Fut + Send + 'static,
        Fut: std::future::Future<Output = Result<(), String>>,
    {
        let (tx, rx) = mpsc::channel::<Result<(), String>>();
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let stop2 = stop.clone();
        let started = Instant::now();
        let handle = std::thread::spawn(move || {
            let rt = match tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            {
                Ok(rt) => rt,
                Err(e) => {
                    let _ = tx.send(Err(format!("tokio runtime: {e}")));
                    return;
                }
            };
            rt.block_on(async {
                while !stop2.load(std::sync::atomic::Ordering::Relaxed) {
                    let outcome = match tokio::time::timeout(Duration::from_secs(5), probe()).await
                    {
                        Ok(Ok(())) => {
                            let _ = tx.send(Ok(()));
                            return;
                        }
                        Ok(Err(e)) => e,
                        Err(_) => "probe timed out after 5s".into(),
                    };
                    let _ = tx.send(Err(outcome));
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
            });
        });
        let mut last = String::from("no attempt yet");
        let result = loop {
            if let Err(e) = self.check_alive() {
                break Err(format!("waiting for {what}: {e}"));
            }
            match rx.recv_timeout(Duration::from_millis(200)) {
                Ok(Ok(())) => break Ok(()),
                Ok(Err(e)) => last = e,
                Err(mpsc::RecvTimeoutError::Timeout) => {}
                Err(mpsc::RecvTimeoutError::Disconnected) => {
                    break Err(format!("waiting for {what}: prober stopped: {last}"));
                }
            }
            if started.elapsed() > timeout {
                break Err(format!(
                    "{what} not ready after {timeout:?}; last error: {last}{}",
                    self.logs_tail()
                ));
            }
        };
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        let _ = handle.join();
        result
    }
}

impl Drop for ControlPlane {
    fn drop(&mut self) {
        self.shutdown();
    }
}

impl Pki {
    fn generate(dir: &Path) -> Result<Pki, String> {
        fs::create_dir_all(dir).map_err(|e| format!("creating {}: {e}", dir.display()))?;
        fn err(what: &str) -> impl Fn(rcgen::Error) -> String + '_ {
            move |e| format!("generating {what}: {e}")
        }

        let ca_key = KeyPair::generate().map_err(err("CA key"))?;
        let ca_params = ca_params();
        let ca_cert = ca_params.self_signed(&ca_key).map_err(err("CA cert"))?;
        let ca_cert_pem = ca_cert.pem();
        let ca_key_pem = ca_key.serialize_pem();
        let issuer = Issuer::new(ca_params, ca_key);

        let serving_key = KeyPair::generate().map_err(err("serving key"))?;
        let mut serving = CertificateParams::new(vec![
            "127.0.0.1".to_string(),
            "localhost".to_string(),
            KUBERNETES_SERVICE_IP.to_string(),
            "kubernetes".to_string(),
            "kubernetes.default".to_string(),
            "kubernetes.default.svc".to_string(),
            "kubernetes.default.svc.cluster.local".to_string(),
        ])
        .map_err(err("serving cert params"))?;
        serving.distinguished_name = rcgen::DistinguishedName::new();
        serving
            .distinguished_name
            .push(DnType::CommonName, "kube-apiserver");
        serving.key_usages = vec![
            KeyUsagePurpose::DigitalSignature,
            KeyUsagePurpose::KeyEncipherment,
        ];
        serving.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        let serving_cert = serving
            .signed_by(&serving_key, &issuer)
            .map_err(err("serving cert"))?;

        let (admin_cert, admin_key) =
            client_cert(&issuer, "kpssh-test-admin", &["system:masters"])?;
        let sa = KeyPair::generate().map_err(err("service-account key"))?;
        let sa_key = sa.serialize_pem();

        // Client certificate the aggregator presents to extension API servers (front proxy).
        let (proxy_cert, proxy_key) = client_cert(&issuer, "front-proxy-client", &[])?;
        write(&dir.join("front-proxy-client.crt"), &proxy_cert)?;
        write(&dir.join("front-proxy-client.key"), &proxy_key)?;
        write(&dir.join("ca.crt"), &ca_cert_pem)?;
        write(&dir.join("ca.key"), &ca_key_pem)?;
        write(&dir.join("apiserver.crt"), &serving_cert.pem())?;
        write(&dir.join("apiserver.key"), &serving_key.serialize_pem())?;
        write(&dir.join("admin.crt"), &admin_cert)?;
        write(&dir.join("admin.key"), &admin_key)?;
        write(&dir.join("sa.key"), &sa_key)?;
        // kube-apiserver reads verification keys as public keys; PKCS#8 private keys are not.
        write(&dir.join("sa.pub"), &sa.public_key_pem())?;
        Ok(Pki {
            ca_cert: ca_cert_pem,
            ca_key: ca_key_pem,
            admin_cert,
            admin_key,
            sa_key,
            dir: dir.to_path_buf(),
        })
    }

    /// A client certificate and key (PEM) for `user` in `groups`, signed by the cluster CA.
    pub fn client_cert(&self, user: &str, groups: &[&str]) -> Result<(String, String), String> {
        let key = KeyPair::from_pem(&self.ca_key).map_err(|e| format!("CA key: {e}"))?;
        // Issuing only needs the CA's subject and key, which `ca_params` reproduces.
        client_cert(&Issuer::new(ca_params(), key), user, groups)
    }

    /// Directory holding `ca.crt`, `ca.key`, `apiserver.{crt,key}`, `admin.{crt,key}`, `front-proxy-client.{crt,key}`,
    /// `sa.{key,pub}`.
    pub fn dir(&self) -> &Path {
        &self.dir
    }
}

/// The cluster CA's certificate parameters (deterministic: the key makes it unique).
fn ca_params() -> CertificateParams {
    let mut params = CertificateParams::default();
    params.distinguished_name = rcgen::DistinguishedName::new();
    params
        .distinguished_name
        .push(DnType::CommonName, "kpssh-test-ca");
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    params
}

fn client_cert(
    issuer: &Issuer<'_, KeyPair>,
    user: &str,
    groups: &[&str],
) -> Result<(String, String), String> {
    let key = KeyPair::generate().map_err(|e| format!("client key: {e}"))?;
    let mut params = CertificateParams::default();
    params.distinguished_name = rcgen::DistinguishedName::new();
    params.distinguished_name.push(DnType::CommonName, user);
    for g in groups {
        params.distinguished_name.push(DnType::OrganizationName, *g);
    }
    params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
    let cert = params
        .signed_by(&key, issuer)
        .map_err(|e| format!("client cert for {user}: {e}"))?;
    Ok((cert.pem(), key.serialize_pem()))
}

fn kubeconfig(server: &str, ca: &str, cert: &str, key: &str) -> String {
    let b64 = |s: &str| base64::engine::general_purpose::STANDARD.encode(s);
    format!(
        "apiVersion: v1
kind: Config
clusters:
- name: kpssh-test
  cluster:
    server: {server}
    certificate-authority-data: {ca}
users:
- name: kpssh-test
  user:
    client-certificate-data: {cert}
    client-key-data: {key}
contexts:
- name: kpssh-test
  context:
    cluster: kpssh-test
    user: kpssh-test
current-context: kpssh-test
",
        ca = b64(ca),
        cert = b64(cert),
        key = b64(key),
    )
}

async fn client_from_kubeconfig(yaml: &str) -> Result<kube::Client, String> {
    let kc = Kubeconfig::from_yaml(yaml).map_err(|e| format!("kubeconfig: {e}"))?;
    let mut config = kube::Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default())
        .await
        .map_err(|e| format!("kubeconfig: {e}"))?;
    config.default_retry = false;
    kube::Client::try_from(config).map_err(|e| format!("client: {e}"))
}

/// The directory with the four binaries: `KPSSH_CONTROLPLANE_DIR`, else the last stdout line
/// of `scripts/controlplane.sh` (run once per test binary; the script serialises concurrent
/// builds with a lock).
fn binaries_dir() -> Result<&'static Path, String> {
    static DIR: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    let res = DIR.get_or_init(|| {
        let dir = match std::env::var_os("KPSSH_CONTROLPLANE_DIR") {
            Some(d) => PathBuf::from(d),
            None => run_script()?,
        };
        let missing: Vec<_> = BINARIES
            .iter()
            .filter(|b| !dir.join(b).is_file())
            .collect();
        if missing.is_empty() {
            Ok(dir)
        } else {
            Err(format!(
                "control-plane binaries {missing:?} missing in {} (from KPSSH_CONTROLPLANE_DIR or scripts/controlplane.sh)",
                dir.display()
            ))
        }
    });
    match res {
        Ok(dir) => Ok(dir.as_path()),
        Err(e) => Err(e.clone()),
    }
}

fn run_script() -> Result<PathBuf, String> {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/controlplane.sh");
    eprintln!(
        "control plane: running {} (set KPSSH_CONTROLPLANE_DIR to skip)",
        script.display()
    );
    let out = Command::new("bash")
        .arg(&script)
        .stdin(Stdio::null())
        .stderr(Stdio::inherit())
        .output()
        .map_err(|e| format!("running {}: {e}", script.display()))?;
    if !out.status.success() {
        return Err(format!(
            "{} failed ({}); see its output above",
            script.display(),
            out.status
        ));
    }
    let stdout = String::from_utf8_lossy(&out.stdout);
    match stdout.lines().rev().find(|l| !l.trim().is_empty()) {
        Some(line) => Ok(PathBuf::from(line.trim())),
        None => Err(format!("{} printed no directory", script.display())),
    }
}

type SpawnRequest = (Command, mpsc::Sender<io::Result<Child>>);

/// Spawns `cmd` with PR_SET_PDEATHSIG=SIGKILL. The signal fires when the *thread* that forked
/// the child exits, so all children are forked by one thread that lives as long as the process.
fn spawn_with_pdeathsig(mut cmd: Command) -> io::Result<Child> {
    static SPAWNER: OnceLock<Mutex<mpsc::Sender<SpawnRequest>>> = OnceLock::new();
    let parent = std::process::id() as libc::pid_t;
    // SAFETY: the closure only calls async-signal-safe functions (prctl, getppid, raise).
    unsafe {
        cmd.pre_exec(move || {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                return Err(io::Error::last_os_error());
            }
            // The parent may have died between fork and prctl.
            if libc::getppid() != parent {
                libc::raise(libc::SIGKILL);
            }
            Ok(())
        });
    }
    let sender = SPAWNER.get_or_init(|| {
        let (tx, rx) = mpsc::channel::<SpawnRequest>();
        std::thread::Builder::new()
            .name("controlplane-spawner".into())
            .spawn(move || {
                for (mut cmd, reply) in rx {
                    let _ = reply.send(cmd.spawn());
                }
            })
            .expect("spawning the control-plane spawner thread");
        Mutex::new(tx)
    });
    let (reply_tx, reply_rx) = mpsc::channel();
    lock(sender)
        .send((cmd, reply_tx))
        .map_err(|_| io::Error::other("control-plane spawner thread is gone"))?;
    reply_rx
        .recv()
        .map_err(|_| io::Error::other("control-plane spawner thread is gone"))?
}

fn free_port() -> Result<u16, String> {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .map_err(|e| format!("finding a free port: {e}"))
}

fn write(path: &Path, contents: &str) -> Result<(), String> {
    fs::write(path, contents).map_err(|e| format!("writing {}: {e}", path.display()))
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// The last 40 lines (at most 16 KiB) of a log file.
fn log_tail(path: &Path) -> String {
    const MAX: u64 = 16 * 1024;
    let mut s = String::new();
    let read = File::open(path).and_then(|mut f| {
        let len = f.metadata()?.len();
        f.seek(SeekFrom::Start(len.saturating_sub(MAX)))?;
        let mut buf = Vec::new();
        f.read_to_end(&mut buf)?;
        s = String::from_utf8_lossy(&buf).into_owned();
        Ok(())
    });
    if let Err(e) = read {
        return format!("(cannot read {}: {e})", path.display());
    }
    let lines: Vec<&str> = s.lines().collect();
    lines[lines.len().saturating_sub(40)..].join("\n")
}
