//! Which Node is a claim's (S53). The join mechanism may register the kubelet under a name of
//! its own (nodeadm's `mi-*` on EKS Hybrid, Adopt mode), so a claim's Node is never looked up
//! by the claim's name alone: it is the Node the NodeClaim's `status.nodeName` names, else the
//! Node carrying the provider ID recorded for the claim or its host, found among the Nodes
//! named like the claim and those carrying the host's node IP (the supervisor's Node index,
//! so no list of every Node).

use k8s_openapi::api::core::v1::Node;

use crate::api::SSHHost;
use crate::k8s::{Cluster, ClusterError};
use crate::provider::Context;
use crate::ssh::Transport;

/// What identifies a claim's Node.
#[derive(Debug, Clone, Copy, Default)]
pub struct Identity<'a> {
    /// The NodeClaim's name (a Static kubelet registers under it).
    pub claim: &'a str,
    /// The NodeClaim's `status.nodeName`, set once its Node registered.
    pub node_name: Option<&'a str>,
    /// The provider ID recorded on the claim or on the host.
    pub provider_id: Option<&'a str>,
    /// The host's node address (the Node's InternalIP).
    pub node_ip: Option<&'a str>,
}

/// The claim's Node, if it exists.
pub async fn find<C: Cluster, T: Transport>(
    ctx: &Context<C, T>,
    id: &Identity<'_>,
) -> Result<Option<Node>, ClusterError> {
    if let Some(name) = id.node_name.filter(|n| !n.is_empty())
        && let Some(node) = ctx.cluster.get::<Node>(None, name).await?
    {
        return Ok(Some(node));
    }
    let Some(pid) = id.provider_id.filter(|p| !p.is_empty()) else {
        return Ok(None);
    };
    let mut names = vec![id.claim.to_string()];
    if let Some(ip) = id.node_ip {
        names.extend(
            (ctx.node_addresses.named_with_ip(ip).into_iter()).filter(|n| n.as_str() != id.claim),
        );
    }
    for name in names {
        if let Some(node) = ctx.cluster.get::<Node>(None, &name).await?
            && provider_id(&node) == Some(pid)
        {
            return Ok(Some(node));
        }
    }
    Ok(None)
}

pub fn provider_id(node: &Node) -> Option<&str> {
    (node.spec.as_ref())
        .and_then(|s| s.provider_id.as_deref())
        .filter(|p| !p.is_empty())
}

/// The UID of the NodeClaim the Node is owned by (the lifecycle adds the reference at
/// registration), if any.
pub fn owner_claim(node: &Node) -> Option<&str> {
    (node.metadata.owner_references.iter().flatten())
        .find(|o| o.kind == "NodeClaim")
        .map(|o| o.uid.as_str())
}

/// Whether `node` is known to be the Node of the claim `name` (`uid`): named after it (a
/// Static kubelet), or owned by it (registered for it, under any name). A Node owned by no
/// claim under another name is not known to be this claim's: it may be the Node of an earlier
/// claim of the same machine, which nodeadm registers under the same name.
pub fn is_claims(node: &Node, name: &str, uid: &str) -> bool {
    node.metadata.name.as_deref() == Some(name) || owner_claim(node) == Some(uid)
}

/// Whether `node` is tied to the host `name` of the pool namespace `ns` (`host`: its current
/// object), so that the zombie guard and the orphan cleanup may stop its kubelet's record and
/// drop its finalizer. Tied means one of:
/// - its provider ID is the host's Static one, `kpssh://<ns>/<name>` (unique to the host);
/// - its provider ID is the one recorded on the host for its current claim (Adopt);
/// - it is the Node recorded in `status.orphanNode` (same name and provider ID);
/// - it is owned by the NodeClaim that holds the host.
///
/// An InternalIP equal to the host's is never enough: addresses are reused, NATed and shared
/// (another Karpenter's Node, a manually joined machine), and such a Node is not ours to
/// delete. Labels are no tie either: every label kpssh puts on a Node (NodePool, instance
/// type, zone) is shared by many hosts.
pub fn tied_to_host(node: &Node, ns: &str, name: &str, host: &SSHHost) -> bool {
    let pid = provider_id(node);
    if pid == Some(super::registration::static_provider_id(ns, name).as_str()) {
        return true;
    }
    let Some(status) = host.status.as_ref() else {
        return false;
    };
    let recorded = status.provider_id.as_deref().filter(|p| !p.is_empty());
    if pid.is_some() && pid == recorded {
        return true;
    }
    if let Some(o) = &status.orphan_node
        && node.metadata.name.as_deref() == Some(o.name.as_str())
        && (o.provider_id.is_none() || o.provider_id.as_deref() == pid)
    {
        return true;
    }
    status
        .claim_ref
        .as_ref()
        .is_some_and(|c| owner_claim(node) == Some(c.uid.as_str()))
}

/// The Node tied to this host ([`tied_to_host`]), if any: the one recorded in
/// `status.orphanNode`, else the first tied one among the Nodes carrying the host's node IP
/// (the supervisor's Node watch names them), else among all Nodes (listed: this runs on the
/// zombie and orphan paths only). A Node that only shares the IP is skipped.
pub async fn host_node<C: Cluster, T: Transport>(
    ctx: &Context<C, T>,
    name: &str,
    host: &SSHHost,
) -> Result<Option<Node>, ClusterError> {
    let ns = ctx.pool_ns();
    let tied = |n: &Node| tied_to_host(n, ns, name, host);
    let recorded = (host.status.as_ref()).and_then(|s| s.orphan_node.as_ref());
    if let Some(o) = recorded
        && let Some(n) = ctx.cluster.get::<Node>(None, &o.name).await?
        && tied(&n)
    {
        return Ok(Some(n));
    }
    let ip = host.node_address().to_string();
    for candidate in ctx.node_addresses.named_with_ip(&ip) {
        if let Some(n) = ctx.cluster.get::<Node>(None, &candidate).await?
            && tied(&n)
        {
            return Ok(Some(n));
        }
    }
    // The watch may lag, and a kubelet may advertise another address than the host's: the
    // tie decides, not the IP.
    let nodes: Vec<Node> = ctx.cluster.list(None, None).await?;
    Ok(nodes.into_iter().find(|n| tied(n)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;

    fn node(name: &str, owner: Option<&str>) -> Node {
        let mut n = Node::default();
        n.metadata.name = Some(name.into());
        n.metadata.owner_references = owner.map(|uid| {
            vec![OwnerReference {
                api_version: "karpenter.sh/v1".into(),
                kind: "NodeClaim".into(),
                name: "c".into(),
                uid: uid.into(),
                ..Default::default()
            }]
        });
        n
    }

    #[test]
    fn a_node_is_the_claims_by_name_or_owner() {
        assert!(is_claims(&node("c", None), "c", "u1"));
        assert!(is_claims(&node("mi-1", Some("u1")), "c", "u1"));
        assert!(!is_claims(&node("mi-1", Some("u0")), "c", "u1"));
        assert!(
            !is_claims(&node("mi-1", None), "c", "u1"),
            "unowned under another name: maybe an earlier claim's"
        );
        assert_eq!(owner_claim(&node("mi-1", Some("u0"))), Some("u0"));
    }

    /// #23: a Node is the host's by provider ID, recorded orphan or owning claim, never by IP.
    #[test]
    fn only_nodes_tied_to_the_host_are_its_own() {
        use crate::api::host::OrphanNode;
        use crate::api::{ClaimRef, SSHHostStatus};
        let with_pid = |name: &str, pid: &str, owner: Option<&str>| {
            let mut n = node(name, owner);
            n.spec = Some(k8s_openapi::api::core::v1::NodeSpec {
                provider_id: Some(pid.into()),
                ..Default::default()
            });
            n
        };
        let sim = crate::sim::SimHost::new("10.0.0.9", 1, 1_000_000);
        let mut host = crate::sim::world::host_object("pool", "h1", "c", &sim);
        let foreign = with_pid("ip-10-0-0-9", "aws:///zone/i-0abc", None);
        let tied = |n: &Node, h: &SSHHost| tied_to_host(n, "pool", "h1", h);
        assert!(!tied(&foreign, &host), "sharing the IP is no tie");
        assert!(
            tied(&with_pid("any", "kpssh://pool/h1", None), &host),
            "Static ID"
        );
        assert!(!tied(&with_pid("any", "kpssh://pool/h2", None), &host));
        assert!(!tied(&with_pid("any", "kpssh://other/h1", None), &host));
        host.status = Some(SSHHostStatus {
            provider_id: Some("eks-hybrid:///r/c/mi-1".into()),
            claim_ref: Some(ClaimRef {
                name: "c1".into(),
                uid: "u1".into(),
            }),
            orphan_node: Some(OrphanNode {
                name: "mi-0".into(),
                provider_id: Some("eks-hybrid:///r/c/mi-0".into()),
            }),
            ..Default::default()
        });
        assert!(
            tied(&with_pid("mi-1", "eks-hybrid:///r/c/mi-1", None), &host),
            "recorded ID"
        );
        assert!(
            tied(&with_pid("mi-0", "eks-hybrid:///r/c/mi-0", None), &host),
            "orphan"
        );
        assert!(
            !tied(&with_pid("mi-0", "eks-hybrid:///r/c/other", None), &host),
            "the orphan's name with another provider ID is another machine"
        );
        assert!(
            tied(&with_pid("x", "aws:///z/i-1", Some("u1")), &host),
            "owned by the claim"
        );
        assert!(!tied(&with_pid("x", "aws:///z/i-1", Some("u0")), &host));
        assert!(!tied(&foreign, &host));
    }
}
