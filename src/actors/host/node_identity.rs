//! Which Node is a claim's (S53). The join mechanism may register the kubelet under a name of
//! its own (nodeadm's `mi-*` on EKS Hybrid, Adopt mode), so a claim's Node is never looked up
//! by the claim's name alone: it is the Node the NodeClaim's `status.nodeName` names, else the
//! Node carrying the provider ID recorded for the claim or its host, found among the Nodes
//! named like the claim and those carrying the host's node IP (the supervisor's Node index,
//! so no list of every Node).

use k8s_openapi::api::core::v1::Node;

use crate::actors::Context;
use crate::k8s::{Cluster, ClusterError};
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
}
