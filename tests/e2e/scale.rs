//! E1 scale up and E2 consolidation, all through kube-scheduler and the real controller.

use std::time::Duration;

use k8s_openapi::api::certificates::v1::CertificateSigningRequest;
use k8s_openapi::api::core::v1::{Node, Secret};
use kube::api::ListParams;

use crate::testhost::ExecMode;
use crate::world::{POOL_NS, SCENARIO_LABEL, Sc, profile};

/// E1: a Deployment's pod goes Pending → NodeClaim → join (the fake kubelet bootstraps with the
/// minted token through an approved CSR) → Node Ready → pod scheduled and Running.
pub async fn e1(sc: &mut Sc) -> Result<(), String> {
    let h = sc.add_host(ExecMode::Raw, None).await;
    sc.class_and_profile(profile(&format!("e2e-{}", sc.id), &sc.world.base))
        .await;
    sc.nodepool("Never").await;
    let node_name = sc.scale_up(h).await?;

    let node = sc
        .api::<Node>()
        .get(&node_name)
        .await
        .map_err(|e| format!("get node: {e}"))?;
    let labels = node.metadata.labels.clone().unwrap_or_default();
    if labels.get(SCENARIO_LABEL).map(String::as_str) != Some(sc.id.as_str()) {
        return Err(format!(
            "S14: NodePool label missing on the Node: {labels:?}"
        ));
    }
    let taints = node
        .spec
        .as_ref()
        .and_then(|s| s.taints.clone())
        .unwrap_or_default();
    if taints.iter().any(|t| t.key == "karpenter.sh/unregistered") {
        return Err(format!(
            "S37: unregistered taint still on the Node: {taints:?}"
        ));
    }
    let phases = sc.hosts[h].read("var/log/phases");
    if !phases.contains(&format!("join {node_name}")) || !phases.starts_with("install") {
        return Err(format!("install then join expected, got: {phases}"));
    }
    // The kubelet got its identity from the minted token: its CSR was sent by the bootstrap
    // user and kube-controller-manager approved and signed it.
    let csrs = sc
        .api::<CertificateSigningRequest>()
        .list(&ListParams::default())
        .await
        .map_err(|e| format!("list CSRs: {e}"))?;
    let cn = format!("system:node:{node_name}");
    let ours = csrs.items.iter().find(|c| {
        c.spec
            .username
            .as_deref()
            .is_some_and(|u| u.starts_with("system:bootstrap:"))
            && c.spec
                .groups
                .as_ref()
                .is_some_and(|g| g.iter().any(|g| g == "system:bootstrappers:kpssh"))
            && csr_subject_is(c, &cn)
    });
    let Some(csr) = ours else {
        return Err(format!("no CSR for {cn} from a kpssh bootstrap token"));
    };
    let approved = csr
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|c| c.iter().any(|c| c.type_ == "Approved"));
    if !approved {
        return Err("the node client CSR was not auto-approved".into());
    }
    // S27: the token is deleted once the Node registered.
    let token_user = csr.spec.username.clone().unwrap_or_default();
    let token_id = token_user
        .trim_start_matches("system:bootstrap:")
        .to_string();
    sc.wait(
        "S27: the bootstrap token Secret deleted",
        Duration::from_secs(60),
        || async {
            let s = sc
                .ns_api::<Secret>("kube-system")
                .get_opt(&format!("bootstrap-token-{token_id}"))
                .await
                .map_err(|e| e.to_string())?;
            Ok(s.is_none().then_some(()))
        },
    )
    .await?;
    let host = sc.host(h).await?;
    let status = host.status.clone().unwrap_or_default();
    if status.provider_id.as_deref() != Some(sc.provider_id(h).as_str()) {
        return Err(format!("host providerID: {:?}", status.provider_id));
    }
    let _ = POOL_NS;
    Ok(())
}

pub(crate) fn csr_subject_is(c: &CertificateSigningRequest, cn: &str) -> bool {
    // The PEM request is DER inside; the CN is stored as plain bytes in it.
    let pem = String::from_utf8_lossy(&c.spec.request.0).into_owned();
    let b64: String = pem.lines().filter(|l| !l.starts_with("-----")).collect();
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD
        .decode(b64)
        .is_ok_and(|der| der.windows(cn.len()).any(|w| w == cn.as_bytes()))
}

/// E2: replicas 0 → the empty Node is consolidated: drained, leave runs, the Node is deleted,
/// the host is Available again with kubelet and runtime disabled (and stopped).
pub async fn e2(sc: &mut Sc) -> Result<(), String> {
    let h = sc.add_host(ExecMode::Raw, None).await;
    sc.class_and_profile(profile(&format!("e2e-{}", sc.id), &sc.world.base))
        .await;
    sc.nodepool("0s").await;
    let node = sc.scale_up(h).await?;
    sc.scale(0).await?;
    sc.consolidated(h, &node).await?;
    check_warm_and_disabled(sc, h)
}

/// The host left: kubelet and runtime disabled and stopped; the kubelet's credentials kept.
pub fn check_warm_and_disabled(sc: &Sc, h: usize) -> Result<(), String> {
    let host = &sc.hosts[h];
    for unit in crate::testhost::UNITS {
        if host.unit_enabled(unit) || host.unit_active(unit) {
            return Err(format!(
                "{unit} still enabled or running after leave:\n{}",
                host.describe()
            ));
        }
    }
    let phases = host.read("var/log/phases");
    if phases.lines().filter(|l| *l == "left").count() != 1 {
        return Err(format!("leave must have run once to the end: {phases}"));
    }
    if host
        .read("var/lib/kubelet/pki/kubelet-client.crt")
        .is_empty()
    {
        return Err("warm pool: the kubelet's credentials should stay on the host".into());
    }
    Ok(())
}
