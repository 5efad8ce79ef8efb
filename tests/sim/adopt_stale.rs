//! S20/S21/S53: an Adopt host's Node is taken for a claim only if that claim's join made it.
//! The random sweep (seeds 6633, 6738) found a claim released before its just-registered
//! Node was recorded: the release could not find the Node, which stayed with the host's IP;
//! a later claim of the host, whose launch a controller restart cut short before its join,
//! took that Node by IP, went InUse without a join and was never reported Launched.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use k8s_openapi::api::core::v1::{Node, NodeAddress, NodeSpec, NodeStatus};
use kpssh::api::{HostState, NodeClaim};
use kpssh::k8s::memory::WriteKind;
use kpssh::k8s::{Cluster, ClusterError};
use kpssh::sim::SimHost;
use kpssh::sim::world::{World, node_claim};
use kube::api::ObjectMeta;

use super::lifecycle::adopt_class;
use super::{MINUTE, token_secrets, wait_state, world};

/// Refuse the writes `refused(kind, object kind, key)` picks while `on` is set.
fn refuse_while(w: &World, on: Arc<AtomicBool>, refused: fn(WriteKind, &str, &str) -> bool) {
    w.cluster
        .set_fault_injector(Some(Arc::new(move |kind, obj_kind, key: &str| {
            (on.load(Ordering::SeqCst) && refused(kind, obj_kind, key)).then(|| {
                ClusterError::Transient {
                    kind: obj_kind.into(),
                    key: key.into(),
                    message: "injected: etcdserver: request timed out".into(),
                }
            })
        })));
}

fn launched(nc: &NodeClaim) -> bool {
    (nc.status.as_ref())
        .is_some_and(|s| (s.conditions.iter()).any(|c| c.type_ == "Launched" && c.status == "True"))
}

async fn nodes_with_ip(w: &World, ip: &str) -> Vec<String> {
    let nodes: Vec<Node> = w.cluster.list(None, None).await.expect("nodes");
    nodes
        .into_iter()
        .filter(|n| {
            kpssh::actors::context::internal_ips(n)
                .iter()
                .any(|a| a == ip)
        })
        .filter_map(|n| n.metadata.name)
        .collect()
}

/// A Node an earlier claim left behind (created before this claim, owned by none) carries the
/// host's IP and an adopted provider ID; this claim's join registers nothing. The host is not
/// taken InUse with that Node: it waits for its own, and the Adopt deadline ends the launch.
#[tokio::test(start_paused = true)]
async fn s21_a_node_older_than_the_claim_is_not_adopted() {
    let w = world().await;
    adopt_class(&w).await;
    let ip = "10.32.0.1";
    let stale = Node {
        metadata: ObjectMeta {
            name: Some("left-behind".into()),
            ..Default::default()
        },
        spec: Some(NodeSpec {
            provider_id: Some(format!("sim://adopted/{ip}")),
            ..Default::default()
        }),
        status: Some(NodeStatus {
            addresses: Some(vec![NodeAddress {
                type_: "InternalIP".into(),
                address: ip.into(),
            }]),
            ..Default::default()
        }),
    };
    let _: Node = w.cluster.create(&stale).await.expect("stale node");
    let mut sim = SimHost::new(ip, 2, 4_000_000);
    sim.registers = false;
    w.add_host("h", "small", sim).await.expect("host");
    wait_state(&w, "h", HostState::Available, MINUTE).await;
    tokio::time::sleep(Duration::from_secs(5)).await;
    let _: NodeClaim = (w
        .cluster
        .create(&node_claim("nc", "pool", "1", "1Gi"))
        .await)
        .expect("nc");
    // Two probe intervals, short of the Adopt deadline (4 minutes).
    let taken = w
        .until(Duration::from_secs(230), || async {
            w.host("h")
                .await
                .is_some_and(|h| h.state() == HostState::InUse)
        })
        .await;
    let h = w.host("h").await.expect("host");
    assert!(
        !taken,
        "InUse with a Node its join did not make: {:?}",
        h.status
    );
    assert_eq!(h.state(), HostState::Claimed, "still waiting for its Node");
}

/// The Node registered, but recording it failed; then the claim is deleted. The release
/// records the registration itself, so the Node goes with its claim (before, it stayed, with
/// the host's IP, for a later claim of the host to take).
#[tokio::test(start_paused = true)]
async fn s23_s53_release_deletes_a_node_whose_registration_was_not_recorded() {
    let w = world().await;
    adopt_class(&w).await;
    let ip = "10.32.0.2";
    let refuse = Arc::new(AtomicBool::new(true));
    refuse_while(&w, refuse.clone(), |kind, obj, key| {
        kind == WriteKind::Delete && obj == "Secret" && key.contains("bootstrap-token-")
    });
    w.add_host("h", "small", SimHost::new(ip, 2, 4_000_000))
        .await
        .expect("host");
    wait_state(&w, "h", HostState::Available, MINUTE).await;
    let _: NodeClaim = (w
        .cluster
        .create(&node_claim("nc", "pool", "1", "1Gi"))
        .await)
        .expect("nc");
    let registered = w
        .until(2 * MINUTE, || async {
            !nodes_with_ip(&w, ip).await.is_empty()
        })
        .await;
    assert!(registered, "the Node registered");
    tokio::time::sleep(Duration::from_secs(2)).await;
    let h = w.host("h").await.expect("host");
    assert_eq!(h.state(), HostState::Claimed, "registration not recorded");
    refuse.store(false, Ordering::SeqCst);
    (w.cluster.delete::<NodeClaim>(None, "nc", None).await).expect("delete");
    let released = w
        .until(MINUTE, || async {
            let gone = (w.cluster.get::<NodeClaim>(None, "nc").await)
                .expect("get")
                .is_none();
            gone && w
                .host("h")
                .await
                .is_some_and(|h| h.state() == HostState::Available)
        })
        .await;
    assert!(
        released,
        "released: {:?}",
        w.host("h").await.map(|h| h.status)
    );
    assert!(
        nodes_with_ip(&w, ip).await.is_empty(),
        "the claim's Node went with it: {:?}",
        nodes_with_ip(&w, ip).await
    );
    assert!(token_secrets(&w).await.is_empty());
}

/// S20: the join ran and the Node registered, but the NodeClaim was never reported Launched
/// (every report refused); after a restart the resumed launch finds the host InUse and reports
/// the claim Launched (before, it returned: the claim stayed unlaunched for good).
#[tokio::test(start_paused = true)]
async fn s20_resumed_launch_of_a_registered_claim_reports_it_launched() {
    let mut w = world().await;
    let refuse = Arc::new(AtomicBool::new(false));
    refuse_while(&w, refuse.clone(), |kind, obj, _| {
        kind == WriteKind::Patch && obj == "NodeClaim"
    });
    let mut sim = SimHost::new("10.32.0.3", 2, 4_000_000);
    sim.phase_latency = Duration::from_secs(20);
    w.add_host("h", "small", sim).await.expect("host");
    wait_state(&w, "h", HostState::Available, MINUTE).await;
    let _: NodeClaim = (w
        .cluster
        .create(&node_claim("nc", "pool", "1", "1Gi"))
        .await)
        .expect("nc");
    // Claimed (the router's finalizer is on): from now the launch's report is refused.
    let joining = w
        .until(MINUTE, || async {
            w.host("h").await.is_some_and(|h| {
                (h.status.as_ref()).is_some_and(|s| s.bootstrap_token_id.is_some())
            })
        })
        .await;
    assert!(joining, "claimed, token minted");
    refuse.store(true, Ordering::SeqCst);
    wait_state(&w, "h", HostState::InUse, 2 * MINUTE).await;
    // The launch gives up its report after five tries (75 s of backoff).
    tokio::time::sleep(2 * MINUTE).await;
    refuse.store(false, Ordering::SeqCst);
    tokio::time::sleep(MINUTE).await;
    let nc: NodeClaim = (w.cluster.get(None, "nc").await).expect("get").expect("nc");
    assert!(
        !launched(&nc),
        "precondition: never reported: {:?}",
        nc.status
    );
    w.crash_and_restart(9).await.expect("restart");
    let reported = w
        .until(MINUTE, || async {
            let nc: Option<NodeClaim> = w.cluster.get(None, "nc").await.expect("get");
            nc.is_some_and(|nc| launched(&nc))
        })
        .await;
    assert!(reported, "Launched after the resumed launch");
    assert_eq!(w.host("h").await.expect("host").state(), HostState::InUse);
}

/// nodeadm names a Node after the machine: a kubelet whose Node object still exists re-uses
/// it and posts its status. Such a Node, older than the claim but with a Ready heartbeat since,
/// is the claim's (only a Node nobody posted for since the claim is refused above).
#[tokio::test(start_paused = true)]
async fn s53_a_reused_nodeadm_node_with_a_fresh_heartbeat_is_adopted() {
    use kpssh::api::SSHNodeClass;
    use kpssh::sim::kubelet::{REGISTER_AS_VAR, managed_instance_name};
    let w = world().await;
    adopt_class(&w).await;
    let mut class: SSHNodeClass = (w.cluster.get(None, "pool").await)
        .expect("get")
        .expect("class");
    class.spec.vars = Some([(REGISTER_AS_VAR.to_string(), "nodeadm".to_string())].into());
    w.cluster.replace(&class).await.expect("nodeadm names");
    let ip = "10.32.0.4";
    let machine = managed_instance_name(ip);
    let old = Node {
        metadata: ObjectMeta {
            name: Some(machine.clone()),
            ..Default::default()
        },
        spec: Some(NodeSpec {
            provider_id: Some(format!("sim://adopted/{ip}")),
            ..Default::default()
        }),
        status: Some(NodeStatus {
            addresses: Some(vec![NodeAddress {
                type_: "InternalIP".into(),
                address: ip.into(),
            }]),
            ..Default::default()
        }),
    };
    let _: Node = w.cluster.create(&old).await.expect("node of the machine");
    w.add_host("h", "small", SimHost::new(ip, 2, 4_000_000))
        .await
        .expect("host");
    wait_state(&w, "h", HostState::Available, MINUTE).await;
    tokio::time::sleep(Duration::from_secs(5)).await;
    let _: NodeClaim = (w
        .cluster
        .create(&node_claim("nc", "pool", "1", "1Gi"))
        .await)
        .expect("nc");
    let h = wait_state(&w, "h", HostState::InUse, 2 * MINUTE).await;
    assert_eq!(
        h.status.and_then(|s| s.provider_id),
        Some(format!("sim://adopted/{ip}"))
    );
    assert_eq!(nodes_with_ip(&w, ip).await, vec![machine]);
}
