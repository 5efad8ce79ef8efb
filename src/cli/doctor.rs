//! `kpssh doctor`: check, against the cluster of the current kubeconfig, what a working install
//! needs, and print each check with its fix. Exit status 1 when any check failed.
//!
//! Checks: kpssh's CRDs and the `karpenter.sh/v1` ones (served versions); a kube-scheduler
//! holding its Lease; the bootstrap RBAC of the tls-bootstrap/sbc profiles; a cluster endpoint
//! and CA for each node class; every profile parses; every host class served by a node class;
//! NodePools naming existing node classes; the controller's Lease held.

use std::fmt::Write as _;

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::rbac::v1::ClusterRoleBinding;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;

use crate::actors::host::launch::cluster_endpoint;
use crate::actors::host::phases::profile_source;
use crate::api::{NodePool, SSHHost, SSHJoinProfile, SSHNodeClass};
use crate::k8s::{Cluster, KubeCluster};
use crate::provider::instance_types::selects;

#[derive(clap::Args, Debug)]
pub struct DoctorArgs {
    /// Namespace holding the SSHHosts (and, by default, the controller's Lease).
    #[arg(long, short = 'n', env = "KPSSH_POOL_NAMESPACE", default_value = crate::api::DEFAULT_POOL_NAMESPACE)]
    pub namespace: String,
    /// Namespace of the controller's leader Lease (default: the pool namespace).
    #[arg(long)]
    pub lease_namespace: Option<String>,
    /// Name of the controller's leader Lease (the chart's is `<release>-kpssh-controller`).
    #[arg(long, default_value = "kpssh-controller")]
    pub lease: String,
}

/// One check's verdict.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Check {
    pub name: String,
    pub ok: bool,
    /// What was found, or what is wrong and how to fix it.
    pub detail: String,
}

fn pass(name: &str, detail: impl Into<String>) -> Check {
    Check {
        name: name.into(),
        ok: true,
        detail: detail.into(),
    }
}

fn fail(name: &str, detail: impl Into<String>) -> Check {
    Check {
        name: name.into(),
        ok: false,
        detail: detail.into(),
    }
}

pub async fn run(args: DoctorArgs) -> anyhow::Result<i32> {
    let config = kube::Config::infer()
        .await
        .map_err(|e| anyhow::anyhow!("no cluster: {e} (set KUBECONFIG or run in-cluster)"))?;
    let cluster = KubeCluster::new(kube::Client::try_from(config)?);
    let lease_ns = args
        .lease_namespace
        .clone()
        .unwrap_or(args.namespace.clone());
    let checks = checks(
        &cluster,
        &args.namespace,
        &lease_ns,
        &args.lease,
        jiff::Timestamp::now(),
    )
    .await;
    print!("{}", render(&checks));
    Ok(if checks.iter().all(|c| c.ok) { 0 } else { 1 })
}

/// The report, one line per check (`ok`/`FAIL`), details indented below a failure.
pub fn render(checks: &[Check]) -> String {
    let mut out = String::new();
    for c in checks {
        let mark = if c.ok { "ok  " } else { "FAIL" };
        let _ = writeln!(out, "{mark} {}: {}", c.name, c.detail);
    }
    let failed = checks.iter().filter(|c| !c.ok).count();
    let _ = writeln!(out, "{} checks, {failed} failed", checks.len());
    out
}

/// Every check, in the order an install is done.
pub async fn checks<C: Cluster>(
    cluster: &C,
    pool_ns: &str,
    lease_ns: &str,
    lease: &str,
    now: jiff::Timestamp,
) -> Vec<Check> {
    let mut out = vec![];
    out.extend(crd_checks(cluster).await);
    out.push(lease_check(cluster, "kube-system", "kube-scheduler", "kube-scheduler", now, "run kube-scheduler (with --leader-elect, as kubeadm does): kpssh launches nodes for pods the scheduler marked unschedulable and never binds pods itself").await);
    out.push(bootstrap_rbac(cluster).await);
    let classes: Vec<SSHNodeClass> = cluster.list(None, None).await.unwrap_or_default();
    let profiles: Vec<SSHJoinProfile> = cluster.list(None, None).await.unwrap_or_default();
    let hosts: Vec<SSHHost> = cluster.list(Some(pool_ns), None).await.unwrap_or_default();
    let pools: Vec<NodePool> = cluster.list(None, None).await.unwrap_or_default();
    for class in &classes {
        let name = class.metadata.name.clone().unwrap_or_default();
        out.push(match cluster_endpoint(cluster, class).await {
            Ok((endpoint, ca)) if ca.is_empty() => fail(
                &format!("SSHNodeClass {name} cluster endpoint"),
                format!("{endpoint} has no CA bundle: set spec.cluster.caBundle (base64 of the API server's CA) or publish certificate-authority-data in kube-public/cluster-info"),
            ),
            Ok((endpoint, _)) if !endpoint.starts_with("https://") => fail(
                &format!("SSHNodeClass {name} cluster endpoint"),
                format!("{endpoint:?} is not an https:// URL: set spec.cluster.endpoint"),
            ),
            Ok((endpoint, _)) => pass(&format!("SSHNodeClass {name} cluster endpoint"), endpoint),
            Err(e) => fail(&format!("SSHNodeClass {name} cluster endpoint"), e.message),
        });
        let profile = &class.spec.join_profile_ref.name;
        if !profiles
            .iter()
            .any(|p| p.metadata.name.as_deref() == Some(profile))
        {
            out.push(fail(
                &format!("SSHNodeClass {name} profile"),
                format!("SSHJoinProfile {profile} not found: apply it (examples/profiles/) or fix spec.joinProfileRef"),
            ));
        }
    }
    for p in &profiles {
        let name = p.metadata.name.clone().unwrap_or_default();
        out.push(match crate::profile::validate_profile(&profile_source(p)) {
            Ok(_) => pass(
                &format!("SSHJoinProfile {name}"),
                format!("{} parses", p.marker()),
            ),
            Err(e) => fail(
                &format!("SSHJoinProfile {name}"),
                format!("{e}: fix the profile (kpssh phase runs one phase by hand)"),
            ),
        });
    }
    let mut host_classes: Vec<&str> = hosts.iter().map(SSHHost::class).collect();
    host_classes.sort_unstable();
    host_classes.dedup();
    for hc in host_classes {
        let served = hosts
            .iter()
            .filter(|h| h.class() == hc)
            .all(|h| classes.iter().any(|c| selects(c, h).unwrap_or(false)));
        out.push(if served {
            pass(&format!("host class {hc}"), "served by a node class")
        } else {
            fail(
                &format!("host class {hc}"),
                format!("some SSHHosts of class {hc} are selected by no SSHNodeClass: add a node class whose spec.hostSelector matches karpenter.dklesev.github.io/host-class: {hc}"),
            )
        });
    }
    for pool in pools.iter().filter(|p| p.is_ours()) {
        let name = pool.metadata.name.clone().unwrap_or_default();
        let class = &pool.spec.template.spec.node_class_ref.name;
        out.push(if classes.iter().any(|c| c.metadata.name.as_deref() == Some(class)) {
            pass(&format!("NodePool {name}"), format!("uses SSHNodeClass {class}"))
        } else {
            fail(
                &format!("NodePool {name}"),
                format!("SSHNodeClass {class} (spec.template.spec.nodeClassRef.name) not found: create it or fix the reference"),
            )
        });
    }
    out.push(lease_check(cluster, lease_ns, lease, "controller", now, "start the controller (helm install charts/kpssh, or kpssh controller); with the chart the Lease is <release>-kpssh-controller in the release namespace: pass --lease and --lease-namespace").await);
    out
}

async fn crd_checks<C: Cluster>(cluster: &C) -> Vec<Check> {
    let wanted = [
        (
            "sshhosts.karpenter.dklesev.github.io",
            "v1beta1",
            "kubectl apply --server-side -f charts/kpssh/crds/crds.yaml (or kpssh crds | kubectl apply --server-side -f -)",
        ),
        (
            "sshnodeclasses.karpenter.dklesev.github.io",
            "v1beta1",
            "kubectl apply --server-side -f charts/kpssh/crds/crds.yaml",
        ),
        (
            "sshjoinprofiles.karpenter.dklesev.github.io",
            "v1beta1",
            "kubectl apply --server-side -f charts/kpssh/crds/crds.yaml",
        ),
        (
            "nodepools.karpenter.sh",
            "v1",
            "kpssh crds --karpenter | kubectl apply --server-side -f - (or install Karpenter's CRDs)",
        ),
        (
            "nodeclaims.karpenter.sh",
            "v1",
            "kpssh crds --karpenter | kubectl apply --server-side -f - (or install Karpenter's CRDs)",
        ),
    ];
    let mut out = vec![];
    for (name, version, fix) in wanted {
        let crd: Option<CustomResourceDefinition> = cluster.get(None, name).await.ok().flatten();
        let served = crd.as_ref().is_some_and(|c| {
            c.spec
                .versions
                .iter()
                .any(|v| v.name == version && v.served)
        });
        out.push(match (crd, served) {
            (None, _) => fail(&format!("CRD {name}"), format!("missing: {fix}")),
            (Some(_), false) => fail(
                &format!("CRD {name}"),
                format!("does not serve {version}: {fix}"),
            ),
            (Some(_), true) => pass(&format!("CRD {name}"), format!("{version} served")),
        });
    }
    out
}

/// A Lease held and renewed within its duration (twice it, for clock skew).
async fn lease_check<C: Cluster>(
    cluster: &C,
    ns: &str,
    name: &str,
    what: &str,
    now: jiff::Timestamp,
    fix: &str,
) -> Check {
    let title = format!("{what} Lease {ns}/{name}");
    let lease: Option<Lease> = cluster.get(Some(ns), name).await.ok().flatten();
    let Some(spec) = lease.and_then(|l| l.spec) else {
        return fail(&title, format!("not found: {fix}"));
    };
    let holder = spec.holder_identity.clone().unwrap_or_default();
    let duration = i64::from(spec.lease_duration_seconds.unwrap_or(15));
    let renewed = spec.renew_time.as_ref().map(|t| t.0);
    let fresh = renewed.is_some_and(|t| now.duration_since(t).as_secs() <= 2 * duration);
    if holder.is_empty() || !fresh {
        return fail(
            &title,
            format!("not held (holder {holder:?}, last renewed {renewed:?}): {fix}"),
        );
    }
    pass(&title, format!("held by {holder}"))
}

async fn bootstrap_rbac<C: Cluster>(cluster: &C) -> Check {
    let title = "bootstrap RBAC";
    let bindings: Vec<ClusterRoleBinding> = cluster.list(None, None).await.unwrap_or_default();
    let bound = |role: &str| {
        bindings.iter().any(|b| {
            b.role_ref.name == role
                && b.subjects.iter().flatten().any(|s| {
                    s.kind == "Group"
                        && (s.name == crate::actors::host::launch::BOOTSTRAP_GROUP
                            || s.name == "system:bootstrappers")
                })
        })
    };
    let missing: Vec<&str> = [
        "system:node-bootstrapper",
        "system:certificates.k8s.io:certificatesigningrequests:nodeclient",
    ]
    .into_iter()
    .filter(|r| !bound(r))
    .collect();
    if missing.is_empty() {
        pass(
            title,
            "system:bootstrappers:kpssh may request and get node client certificates",
        )
    } else {
        fail(
            title,
            format!(
                "group system:bootstrappers:kpssh is not bound to {}: kubectl apply -f examples/bootstrap-rbac.yaml (tls-bootstrap and sbc profiles; nodeadm-ssm needs none)",
                missing.join(", ")
            ),
        )
    }
}
