//! S52: `kubectl delete node` of a managed Node. The termination finalizer holds the Node; its
//! NodeClaim is deleted, the Node drained, the host leaves, and only then does the finalizer
//! come off and the Node go.

use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kpssh::api::karpenter::TERMINATION_FINALIZER;
use kpssh::api::{HostState, NodeClaim};
use kpssh::k8s::Cluster;

use super::termination::{one_node, pdb};
use super::*;

#[tokio::test(start_paused = true)]
async fn s52_deleting_a_managed_node_drains_it_deletes_its_claim_and_the_host_leaves() {
    let e = env().await;
    hosts(&e, "h", "small", 1, 2, 4, 66).await;
    let name = one_node(&e, pod("web-0", "500m", "256Mi")).await;
    e.w.cluster.create(&pdb()).await.expect("pdb");
    e.w.cluster
        .delete::<Node>(None, &name, None)
        .await
        .expect("kubectl delete node");
    let ok =
        e.w.until(MINUTE, || async {
            let nc: Option<NodeClaim> = e.w.cluster.get(None, &name).await.expect("get");
            nc.is_some_and(|nc| nc.metadata.deletion_timestamp.is_some())
        })
        .await;
    assert!(ok, "the Node's deletion deletes its NodeClaim");
    tokio::time::sleep(2 * MINUTE).await;
    let node: Node =
        e.w.cluster
            .get(None, &name)
            .await
            .expect("get")
            .expect("the finalizer holds the Node while the drain is blocked");
    assert!(node.metadata.deletion_timestamp.is_some());
    assert!(
        (node.metadata.finalizers.iter().flatten()).any(|f| f == TERMINATION_FINALIZER),
        "finalizer kept until leave"
    );
    assert_eq!(pods(&e).await.len(), 1, "the PDB holds the pod");
    assert_eq!(
        host_states(&e).await.get(&HostState::InUse),
        Some(&1),
        "no leave before the drain"
    );
    e.w.cluster
        .delete::<PodDisruptionBudget>(Some("default"), "web", None)
        .await
        .expect("drop pdb");
    let ok =
        e.w.until(5 * MINUTE, || async {
            let node: Option<Node> = e.w.cluster.get(None, &name).await.expect("get");
            node.is_none()
                && claims(&e).await.is_empty()
                && host_states(&e).await.get(&HostState::Available) == Some(&1)
        })
        .await;
    assert!(
        ok,
        "drained, left, Node and NodeClaim gone, host warm: {:?}",
        host_states(&e).await
    );
    assert!(pods(&e).await.is_empty(), "pod evicted");
    let sim = e.w.transport.host("10.66.0.1").expect("sim host");
    assert!(!sim.kubelet_active, "leave stopped the kubelet");
    assert!(reasons(&e).iter().any(|r| r == "NodeDeleted"));
}
