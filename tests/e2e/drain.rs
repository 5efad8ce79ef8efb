//! Termination on the real control plane: S44 a drain blocked by a real PodDisruptionBudget
//! with no terminationGracePeriod holds the host, S52 `kubectl delete node` of a managed Node,
//! E10 Adopt mode with a join mechanism that names the Node itself (nodeadm's `mi-*`).

use std::time::Duration;

use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kpssh::api::{HostState, NodeClaim, SSHJoinProfile, SSHNodeClass};
use kube::api::{DeleteParams, ListParams, PostParams};

use crate::scale::check_warm_and_disabled;
use crate::testhost::ExecMode;
use crate::world::{Sc, node_ready, pod_running_on, profile};

/// The scenario's bare pod (`app`) and a PDB over it that allows no disruption.
async fn pdb_blocked_pod(sc: &Sc) -> Result<(), String> {
    let pdb: PodDisruptionBudget = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "app", "namespace": sc.ns},
        "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": sc.id}}},
    }))
    .map_err(|e| format!("PDB: {e}"))?;
    sc.ns_api::<PodDisruptionBudget>(&sc.ns)
        .create(&PostParams::default(), &pdb)
        .await
        .map_err(|e| format!("create PDB: {e}"))?;
    // kube-controller-manager's disruption controller must have counted the pod, or the
    // Eviction API answers from a stale (or missing) status.
    sc.wait(
        "the PDB allows no disruption",
        Duration::from_secs(60),
        || async {
            let p = sc
                .ns_api::<PodDisruptionBudget>(&sc.ns)
                .get("app")
                .await
                .map_err(|e| e.to_string())?;
            let st = p.status.unwrap_or_default();
            Ok((st.current_healthy == Some(1) && st.disruptions_allowed == Some(0)).then_some(()))
        },
    )
    .await
}

async fn drop_pdb(sc: &Sc) -> Result<(), String> {
    sc.ns_api::<PodDisruptionBudget>(&sc.ns)
        .delete("app", &DeleteParams::default())
        .await
        .map(|_| ())
        .map_err(|e| format!("delete PDB: {e}"))
}

async fn app_pod(sc: &Sc) -> Result<Option<Pod>, String> {
    sc.ns_api::<Pod>(&sc.ns)
        .get_opt("app")
        .await
        .map_err(|e| format!("get pod: {e}"))
}

async fn node(sc: &Sc, name: &str) -> Result<Option<Node>, String> {
    sc.api::<Node>()
        .get_opt(name)
        .await
        .map_err(|e| format!("get Node: {e}"))
}

async fn claim(sc: &Sc, name: &str) -> Result<Option<NodeClaim>, String> {
    sc.api::<NodeClaim>()
        .get_opt(name)
        .await
        .map_err(|e| format!("get NodeClaim: {e}"))
}

/// Host `h` went back to the warm pool after its Node `node` was deleted: the Node and the
/// scenario's NodeClaims are gone, the host Available with no claim, leave ran to the end.
async fn back_warm(sc: &Sc, h: usize, node_name: &str) -> Result<(), String> {
    sc.wait("the Node deleted", Duration::from_secs(120), || async {
        if node(sc, node_name).await?.is_some() {
            return Ok(None);
        }
        // The Node goes only after leave stopped its kubelet.
        if !sc.hosts[h].read("var/log/phases").contains("left") {
            return Err("the Node was deleted before leave ran".into());
        }
        Ok(Some(()))
    })
    .await?;
    sc.wait(
        "host Available, claim cleared, NodeClaim gone",
        Duration::from_secs(60),
        || async {
            let host = sc.host(h).await?;
            let warm = host.state() == HostState::Available && host.claim().is_none();
            Ok((warm && sc.nodeclaims().await?.is_empty()).then_some(()))
        },
    )
    .await?;
    check_warm_and_disabled(sc, h)
}

/// A host, the scenario's class and NodePool (no consolidation), and the bare pod `app`
/// running on a new Node; returns (host, NodeClaim name = Node name).
async fn one_node(sc: &mut Sc) -> Result<(usize, String), String> {
    let h = sc.add_host(ExecMode::Raw, None).await;
    sc.class_and_profile(profile(&format!("e2e-{}", sc.id), &sc.world.base))
        .await;
    sc.nodepool("Never").await;
    sc.wait("host Available", Duration::from_secs(90), || async {
        Ok((sc.host_state(h).await? == HostState::Available).then_some(()))
    })
    .await?;
    sc.bare_pod().await;
    let node = sc.up_after_pending(h).await?;
    Ok((h, node))
}

/// S44 on the real control plane: no terminationGracePeriod, the NodeClaim deleted, the drain
/// refused by a real PDB (the Eviction API's 429). The scenario's hour is replaced by
/// `HOLD` under the real API server here (the e2e tier's budget is about a minute), while the
/// hour itself runs on the simulated clock in `tests/karpenter/grace.rs`
/// (`s44_unset_grace_period_a_pdb_blocked_drain_holds_the_host_for_an_hour`): throughout, the
/// host stays InUse while the claim and Node are there. Dropping the PDB lets the drain end.
pub async fn s44(sc: &mut Sc) -> Result<(), String> {
    const HOLD: Duration = Duration::from_secs(30);
    let (h, name) = one_node(sc).await?;
    pdb_blocked_pod(sc).await?;
    sc.api::<NodeClaim>()
        .delete(&name, &DeleteParams::default())
        .await
        .map_err(|e| format!("delete NodeClaim: {e}"))?;
    sc.hold(
        "S44: the PDB-blocked drain holds the host",
        HOLD,
        || async {
            let nc = claim(sc, &name).await?;
            let node = node(sc, &name).await?;
            if nc.is_none() || node.is_none() {
                return Ok(Some(format!(
                    "the NodeClaim ({}) or Node ({}) went",
                    nc.is_some(),
                    node.is_some()
                )));
            }
            if app_pod(sc).await?.is_none() {
                return Ok(Some("the pod was evicted through the PDB".into()));
            }
            let state = sc.host_state(h).await?;
            Ok((state != HostState::InUse).then(|| format!("host went {state:?}")))
        },
    )
    .await?;
    let nc = claim(sc, &name).await?.ok_or("NodeClaim gone")?;
    if nc.metadata.deletion_timestamp.is_none() {
        return Err("the NodeClaim is not being deleted".into());
    }
    let annotations = nc.metadata.annotations.unwrap_or_default();
    if annotations.contains_key("karpenter.sh/nodeclaim-termination-timestamp") {
        return Err("no terminationGracePeriod, yet a termination deadline was set".into());
    }
    drop_pdb(sc).await?;
    sc.wait("the pod evicted", Duration::from_secs(60), || async {
        Ok(app_pod(sc).await?.is_none().then_some(()))
    })
    .await?;
    back_warm(sc, h, &name).await
}

/// S52 on the real control plane: `kubectl delete node` of a managed Node. The termination
/// finalizer holds it while its NodeClaim is deleted, the pod evicted and leave run; then the
/// finalizer comes off and the Node goes.
pub async fn s52(sc: &mut Sc) -> Result<(), String> {
    let (h, name) = one_node(sc).await?;
    sc.api::<Node>()
        .delete(&name, &DeleteParams::default())
        .await
        .map_err(|e| format!("delete Node: {e}"))?;
    sc.wait(
        "the Node's deletion deletes its NodeClaim",
        Duration::from_secs(60),
        || async {
            let deleting = claim(sc, &name)
                .await?
                .is_none_or(|nc| nc.metadata.deletion_timestamp.is_some());
            Ok(deleting.then_some(()))
        },
    )
    .await?;
    sc.wait("the pod evicted", Duration::from_secs(60), || async {
        Ok(app_pod(sc).await?.is_none().then_some(()))
    })
    .await?;
    back_warm(sc, h, &name).await
}

/// The test profile, its join acting as nodeadm: the kubelet registers under a managed-
/// instance name of the machine's own (`mi-` + 17 hex digits) with a provider ID of the join
/// mechanism's, not under `KPSSH_NODE_NAME`.
fn nodeadm_profile(sc: &Sc) -> SSHJoinProfile {
    let mut p = profile(&format!("e2e-{}", sc.id), &sc.world.base);
    let mv = "mv \"$root/etc/kubelet/join.env.new\"";
    let nodeadm = "mi=\"mi-$(printf '%s' \"$KPSSH_HOST_ADDRESS\" | sha256sum | cut -c1-17)\"\n\
                   printf 'KUBELET_NODE_NAME=%s\\nKUBELET_PROVIDER_ID=eks-hybrid:///e2e/kpssh/%s\\n' \
                   \"$mi\" \"$mi\" >> \"$root/etc/kubelet/join.env.new\"\n";
    p.spec.scripts.join = p
        .spec
        .scripts
        .join
        .replacen(mv, &format!("{nodeadm}{mv}"), 1);
    p
}

/// The Node whose InternalIP is host `h`'s address.
async fn node_with_ip(sc: &Sc, h: usize) -> Result<Option<Node>, String> {
    let ip = sc.hosts[h].address.clone();
    let nodes = sc
        .api::<Node>()
        .list(&ListParams::default())
        .await
        .map_err(|e| format!("list Nodes: {e}"))?;
    Ok(nodes.items.into_iter().find(|n| {
        (n.status.as_ref().and_then(|s| s.addresses.as_ref()))
            .is_some_and(|a| a.iter().any(|a| a.type_ == "InternalIP" && a.address == ip))
    }))
}

/// E10: Adopt mode, the kubelet registering under a name of the join mechanism's (nodeadm's
/// `mi-*`). The host goes InUse on that Node, the NodeClaim records it; then the NodeClaim is
/// deleted with the pod still on the Node (where every scale-down ends; an empty node's drain
/// would evict nothing): the pod is evicted from that Node, leave runs, that Node is deleted
/// and the host is warm again.
pub async fn e10(sc: &mut Sc) -> Result<(), String> {
    let h = sc.add_host(ExecMode::Raw, None).await;
    sc.class_and_profile(nodeadm_profile(sc)).await;
    let classes = sc.api::<SSHNodeClass>();
    let mut class = classes
        .get(&sc.id)
        .await
        .map_err(|e| format!("get class: {e}"))?;
    class.spec.provider_id_source = kpssh::api::ProviderIdSource::Adopt;
    classes
        .replace(&sc.id, &PostParams::default(), &class)
        .await
        .map_err(|e| format!("Adopt: {e}"))?;
    sc.nodepool("Never").await;
    sc.wait("host Available", Duration::from_secs(90), || async {
        Ok((sc.host_state(h).await? == HostState::Available).then_some(()))
    })
    .await?;
    sc.bare_pod().await;
    let node = sc
        .wait(
            "the nodeadm-named Node registered and Ready",
            Duration::from_secs(150),
            || async { Ok(node_with_ip(sc, h).await?.filter(node_ready)) },
        )
        .await?;
    let node_name = node.metadata.name.clone().unwrap_or_default();
    if !node_name.starts_with("mi-") {
        return Err(format!(
            "the Node is named {node_name}, not by the join mechanism"
        ));
    }
    let claim_name = sc
        .wait(
            "the NodeClaim records the adopted Node and the host is InUse",
            Duration::from_secs(60),
            || async {
                let Some(nc) = sc.nodeclaims().await?.into_iter().next() else {
                    return Ok(None);
                };
                let recorded = nc.status.as_ref().and_then(|s| s.node_name.as_deref());
                let in_use = sc.host_state(h).await? == HostState::InUse;
                Ok((recorded == Some(node_name.as_str()) && in_use)
                    .then(|| nc.metadata.name.clone().unwrap_or_default()))
            },
        )
        .await?;
    let host = sc.host(h).await?;
    let pid = host.status.and_then(|s| s.provider_id).unwrap_or_default();
    if pid != format!("eks-hybrid:///e2e/kpssh/{node_name}") {
        return Err(format!("host providerID {pid:?} is not the adopted one"));
    }
    sc.wait(
        "the pod Running on the adopted Node",
        Duration::from_secs(90),
        || async { Ok(app_pod(sc).await?.filter(|p| pod_running_on(p, &node_name))) },
    )
    .await?;
    sc.api::<NodeClaim>()
        .delete(&claim_name, &DeleteParams::default())
        .await
        .map_err(|e| format!("delete NodeClaim: {e}"))?;
    sc.wait(
        "the pod evicted from the adopted Node",
        Duration::from_secs(60),
        || async { Ok(app_pod(sc).await?.is_none().then_some(())) },
    )
    .await?;
    back_warm(sc, h, &node_name).await
}
