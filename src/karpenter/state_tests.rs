//! Tests of `state.rs` (kept apart to keep that file short).

use super::*;
use crate::api::karpenter::NodeClaimStatus;
use k8s_openapi::api::core::v1::NodeSpec;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{OwnerReference, Time};
use kube::api::ObjectMeta;

fn meta(name: &str, rv: u64) -> ObjectMeta {
    ObjectMeta {
        name: Some(name.into()),
        resource_version: Some(rv.to_string()),
        ..Default::default()
    }
}

fn claim(name: &str, rv: u64, provider: Option<&str>) -> NodeClaim {
    let mut nc = NodeClaim::new(name, Default::default());
    nc.metadata = meta(name, rv);
    nc.spec.node_class_ref.group = crate::api::GROUP.into();
    nc.spec.node_class_ref.kind = "SSHNodeClass".into();
    nc.status = Some(NodeClaimStatus {
        provider_id: provider.map(str::to_string),
        ..Default::default()
    });
    nc
}

fn node(name: &str, rv: u64, provider: &str) -> Node {
    Node {
        metadata: meta(name, rv),
        spec: Some(NodeSpec {
            provider_id: Some(provider.into()),
            ..Default::default()
        }),
        ..Default::default()
    }
}

fn now() -> Timestamp {
    Timestamp::UNIX_EPOCH
}

fn with_ready(mut n: Node, status: &str) -> Node {
    n.status = Some(k8s_openapi::api::core::v1::NodeStatus {
        conditions: Some(vec![k8s_openapi::api::core::v1::NodeCondition {
            type_: "Ready".into(),
            status: status.into(),
            ..Default::default()
        }]),
        ..Default::default()
    });
    n
}

fn candidates(st: &Inner) -> Vec<String> {
    st.repair_candidates()
        .into_iter()
        .map(|nc| name_of(&**nc))
        .collect()
}

#[test]
fn repair_candidates_are_the_claims_of_nodes_not_ready() {
    let mut st = Inner::default();
    let a = claim("a", 1, Some("p://a"));
    apply_nodeclaim(&mut st, Change::Upsert(Arc::new(a.clone())), now());
    let worker = |rv: u64, ready: &str| with_ready(node("worker-1", rv, "p://a"), ready);
    apply_node(&mut st, Change::Upsert(Arc::new(worker(2, "True"))), now());
    assert!(candidates(&st).is_empty(), "Ready node");
    apply_node(&mut st, Change::Upsert(Arc::new(worker(3, "False"))), now());
    assert_eq!(candidates(&st), ["a"], "found by provider ID");
    apply_node(&mut st, Change::Upsert(Arc::new(worker(4, "True"))), now());
    assert!(candidates(&st).is_empty(), "Ready again");
    apply_node(
        &mut st,
        Change::Upsert(Arc::new(worker(5, "Unknown"))),
        now(),
    );
    apply_node(
        &mut st,
        Change::Delete(Arc::new(node("worker-1", 6, "p://a"))),
        now(),
    );
    assert!(candidates(&st).is_empty(), "a deleted Node is no candidate");
    apply_node(
        &mut st,
        Change::Reset(vec![Arc::new(worker(7, "False"))]),
        now(),
    );
    assert_eq!(candidates(&st), ["a"], "a restart rebuilds the set");
    // Not Ready twice over is one Node: Ready once clears it.
    apply_node(&mut st, Change::Upsert(Arc::new(worker(8, "False"))), now());
    apply_node(&mut st, Change::Upsert(Arc::new(worker(9, "True"))), now());
    assert!(candidates(&st).is_empty(), "Ready after repeated NotReady");
    // A NotReady Node whose provider ID changes no longer answers for the old one.
    apply_node(
        &mut st,
        Change::Upsert(Arc::new(worker(10, "False"))),
        now(),
    );
    let moved = with_ready(node("worker-1", 11, "p://b"), "False");
    apply_node(&mut st, Change::Upsert(Arc::new(moved)), now());
    assert!(candidates(&st).is_empty(), "stale provider ID");
    // The host claimed again: the new claim carries the same provider ID while the old
    // one is still there, being deleted; only the new one is a candidate, and it stays one
    // when the old one changes afterwards.
    let b = claim("b", 12, Some("p://b"));
    apply_nodeclaim(&mut st, Change::Upsert(Arc::new(b)), now());
    let mut old = claim("a", 13, Some("p://b"));
    old.metadata.deletion_timestamp = Some(Time(now()));
    apply_nodeclaim(&mut st, Change::Upsert(Arc::new(old.clone())), now());
    assert_eq!(candidates(&st), ["b"]);
    apply_nodeclaim(&mut st, Change::Delete(Arc::new(old)), now());
    assert_eq!(candidates(&st), ["b"]);
    // By node name too, and a claims restart refiles everything.
    let mut named = claim("c", 14, None);
    if let Some(s) = named.status.as_mut() {
        s.node_name = Some("worker-1".into());
    } else {
        named.status = Some(crate::api::NodeClaimStatus {
            node_name: Some("worker-1".into()),
            ..Default::default()
        });
    }
    apply_nodeclaim(&mut st, Change::Reset(vec![Arc::new(named)]), now());
    assert_eq!(
        candidates(&st),
        ["c"],
        "by nodeName; b is gone after the reset"
    );
}

#[test]
fn a_node_change_touches_its_claim_by_name_or_provider_id() {
    let mut st = Inner::default();
    apply_nodeclaim(
        &mut st,
        Change::Upsert(Arc::new(claim("a", 1, Some("p://a")))),
        now(),
    );
    apply_nodeclaim(
        &mut st,
        Change::Upsert(Arc::new(claim("b", 2, Some("p://b")))),
        now(),
    );
    assert!(st.nodeclaims.contains_key("a"), "claim of ours kept");
    st.touched_claims.lifecycle.clear();
    // Adopt: the Node has its own name; the provider ID leads to claim b.
    apply_node(
        &mut st,
        Change::Upsert(Arc::new(node("worker-7", 3, "p://b"))),
        now(),
    );
    assert_eq!(
        st.touched_claims.lifecycle,
        BTreeSet::from(["b".to_string()])
    );
    assert_eq!(
        st.node_of(&st.nodeclaims["b"])
            .and_then(|n| n.metadata.name.clone()),
        Some("worker-7".into())
    );
    st.touched_claims.lifecycle.clear();
    // Static: the Node is named after its claim.
    apply_node(
        &mut st,
        Change::Upsert(Arc::new(node("a", 4, "p://x"))),
        now(),
    );
    assert_eq!(
        st.touched_claims.lifecycle,
        BTreeSet::from(["a".to_string()])
    );
}

/// Seed 9437: the Node of an earlier claim of the machine, left behind owned by no claim
/// and NotReady for 45 minutes, was taken for a fresh claim's, and repair deleted that.
/// A Node created before the claim is never its Node.
#[test]
fn a_claim_is_never_given_a_node_older_than_itself() {
    let at = |s: &str| Some(Time(s.parse().expect("time")));
    let mut nc = claim("new", 1, Some("p://m"));
    nc.metadata.creation_timestamp = at("2026-01-01T01:00:00Z");
    let mut st = Inner::default();
    let mut old = node("stale", 2, "p://m");
    old.metadata.creation_timestamp = at("2026-01-01T00:05:00Z");
    apply_node(&mut st, Change::Upsert(Arc::new(old)), now());
    assert!(
        st.node_of(&nc).is_none(),
        "the stale Node is not the claim's"
    );
    let mut fresh = node("mi-1", 3, "p://m");
    fresh.metadata.creation_timestamp = at("2026-01-01T01:00:00Z");
    apply_node(&mut st, Change::Upsert(Arc::new(fresh)), now());
    let name = st.node_of(&nc).and_then(|n| n.metadata.name.clone());
    assert_eq!(
        name.as_deref(),
        Some("mi-1"),
        "created with the claim: its Node"
    );
}

/// A provider ID names a machine: the Node of an earlier claim of it (owned by that
/// claim) may still be there when the next claim's Node registers. Found by the random
/// campaign (Adopt mode, a controller restart): the drain of the new claim looked at the
/// old Node (first by name after the restart's relist), found none of the new Node's pods
/// and let the host go, PDB-covered pods and all.
#[test]
fn a_claim_is_never_given_the_node_another_claim_owns() {
    let owned_by = |mut n: Node, uid: &str| {
        n.metadata.owner_references = Some(vec![OwnerReference {
            api_version: "karpenter.sh/v1".into(),
            kind: "NodeClaim".into(),
            name: "old".into(),
            uid: uid.into(),
            ..Default::default()
        }]);
        n
    };
    let mut new = claim("new", 1, Some("p://m"));
    new.metadata.uid = Some("u-new".into());
    let name = |st: &Inner, nc: &NodeClaim| st.node_of(nc).and_then(|n| n.metadata.name.clone());
    // The relist after a restart, in name order: the old claim's Node ("a-old") first.
    for (old_node, new_node) in [("a-old", "z-new"), ("z-old", "a-new")] {
        let mut st = Inner::default();
        let mut all = vec![
            owned_by(node(old_node, 2, "p://m"), "u-old"),
            node(new_node, 3, "p://m"),
        ];
        all.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
        apply_node(
            &mut st,
            Change::Reset(all.into_iter().map(Arc::new).collect()),
            now(),
        );
        assert_eq!(
            name(&st, &new),
            Some(new_node.to_string()),
            "unowned, not the old"
        );
        // Owned by the claim: preferred over one named after it.
        apply_node(
            &mut st,
            Change::Upsert(Arc::new(node("new", 4, "p://m"))),
            now(),
        );
        assert_eq!(
            name(&st, &new),
            Some("new".to_string()),
            "named after the claim"
        );
        let mine = owned_by(node(new_node, 5, "p://m"), "u-new");
        apply_node(&mut st, Change::Upsert(Arc::new(mine)), now());
        assert_eq!(
            name(&st, &new),
            Some(new_node.to_string()),
            "owned by the claim"
        );
        // Only the old claim's Node left: the new claim has none.
        for gone in ["new", new_node] {
            apply_node(
                &mut st,
                Change::Delete(Arc::new(node(gone, 6, "p://m"))),
                now(),
            );
        }
        assert_eq!(name(&st, &new), None);
    }
}

#[test]
fn a_stale_node_event_leaves_the_provider_index_alone() {
    let mut st = Inner::default();
    apply_node(
        &mut st,
        Change::Upsert(Arc::new(node("n", 5, "p://new"))),
        now(),
    );
    apply_node(
        &mut st,
        Change::Upsert(Arc::new(node("n", 4, "p://old"))),
        now(),
    );
    assert_eq!(
        st.nodes_by_provider.get("p://new"),
        Some(&BTreeSet::from(["n".to_string()]))
    );
    assert!(!st.nodes_by_provider.contains_key("p://old"));
    apply_node(
        &mut st,
        Change::Delete(Arc::new(node("n", 6, "p://new"))),
        now(),
    );
    assert!(
        st.nodes_by_provider.is_empty(),
        "{:?}",
        st.nodes_by_provider
    );
}

#[test]
fn a_claim_whose_provider_id_changes_is_reindexed() {
    let mut st = Inner::default();
    apply_nodeclaim(
        &mut st,
        Change::Upsert(Arc::new(claim("a", 1, Some("p://1")))),
        now(),
    );
    apply_nodeclaim(
        &mut st,
        Change::Upsert(Arc::new(claim("a", 2, Some("p://2")))),
        now(),
    );
    assert_eq!(
        st.claims_by_provider,
        BTreeMap::from([("p://2".to_string(), "a".to_string())])
    );
    apply_nodeclaim(
        &mut st,
        Change::Delete(Arc::new(claim("a", 3, Some("p://2")))),
        now(),
    );
    assert!(st.claims_by_provider.is_empty());
    assert!(st.touched_claims.lifecycle.contains("a"));
}

#[test]
fn unregistered_set_follows_registration_and_deletion() {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
    let mut st = Inner::default();
    apply_nodeclaim(
        &mut st,
        Change::Upsert(Arc::new(claim("a", 1, None))),
        now(),
    );
    apply_nodeclaim(
        &mut st,
        Change::Upsert(Arc::new(claim("b", 2, None))),
        now(),
    );
    let both = BTreeSet::from(["a".to_string(), "b".to_string()]);
    assert_eq!(st.unregistered_claims(), &both);
    let mut registered = claim("a", 3, Some("ssh://h1"));
    if let Some(s) = registered.status.as_mut() {
        s.conditions.push(Condition {
            type_: "Registered".into(),
            status: "True".into(),
            last_transition_time: Time(now()),
            message: String::new(),
            observed_generation: None,
            reason: "Registered".into(),
        });
    }
    apply_nodeclaim(&mut st, Change::Upsert(Arc::new(registered)), now());
    assert_eq!(st.unregistered_claims(), &BTreeSet::from(["b".to_string()]));
    let mut deleting = claim("b", 4, None);
    deleting.metadata.deletion_timestamp = Some(Time(now()));
    apply_nodeclaim(&mut st, Change::Upsert(Arc::new(deleting)), now());
    assert!(
        st.unregistered_claims().is_empty(),
        "being deleted: not due"
    );
    // A re-list rebuilds the set from what it holds.
    apply_nodeclaim(
        &mut st,
        Change::Reset(vec![Arc::new(claim("c", 5, None))]),
        now(),
    );
    assert_eq!(st.unregistered_claims(), &BTreeSet::from(["c".to_string()]));
}

#[test]
fn termination_work_list_follows_deletion_and_drain() {
    let mut st = Inner::default();
    apply_nodeclaim(
        &mut st,
        Change::Upsert(Arc::new(claim("a", 1, None))),
        now(),
    );
    assert!(st.terminating.is_empty());
    let mut deleting = claim("a", 2, None);
    deleting.metadata.deletion_timestamp = Some(Time(now()));
    apply_nodeclaim(&mut st, Change::Upsert(Arc::new(deleting.clone())), now());
    assert_eq!(st.terminating, BTreeSet::from(["a".to_string()]));
    let mut drained = deleting;
    drained.metadata.resource_version = Some("3".into());
    drained.metadata.annotations = Some(BTreeMap::from([(
        crate::api::DRAINED_ANNOTATION.to_string(),
        "true".to_string(),
    )]));
    apply_nodeclaim(&mut st, Change::Upsert(Arc::new(drained)), now());
    assert!(st.terminating.is_empty(), "drained: no work left");
    apply_nodeclaim(
        &mut st,
        Change::Upsert(Arc::new(claim("b", 4, None))),
        now(),
    );
    let mut gone = claim("b", 5, None);
    gone.metadata.deletion_timestamp = Some(Time(now()));
    apply_nodeclaim(&mut st, Change::Upsert(Arc::new(gone.clone())), now());
    apply_nodeclaim(&mut st, Change::Delete(Arc::new(gone)), now());
    assert!(st.terminating.is_empty(), "deleted: no work left");
}

fn sized_pod(name: &str, rv: u64, cpu: &str) -> Pod {
    let mut p = crate::sim::world::pod(name, cpu, "1Gi");
    p.metadata.resource_version = Some(rv.to_string());
    p.metadata.uid = Some(format!("uid-{name}"));
    p
}

#[test]
fn a_pods_info_is_kept_until_the_pod_changes() {
    let mut st = Inner::default();
    let p1 = sized_pod("a", 1, "1");
    apply_pod(&mut st, Change::Upsert(p1.clone()), now());
    let held = |st: &Inner| st.pods.values().next().cloned().expect("pod");
    let first = st.pod_info(&held(&st));
    assert_eq!(first.cpu(), 1000);
    assert!(
        Arc::ptr_eq(&first, &st.pod_info(&held(&st))),
        "the same version is read once"
    );
    // Not the version the view holds (an older copy): read afresh, not from the cache.
    let mut stale = p1.clone();
    stale.metadata.resource_version = Some("0".into());
    assert!(!Arc::ptr_eq(&first, &st.pod_info(&stale)));
    // A new version of the pod: its new requests, not the kept ones.
    apply_pod(&mut st, Change::Upsert(sized_pod("a", 2, "2")), now());
    assert_eq!(st.pod_info(&held(&st)).cpu(), 2000);
    // Deleted and created again under the same name and version: another pod.
    apply_pod(&mut st, Change::Delete(sized_pod("a", 2, "2")), now());
    apply_pod(&mut st, Change::Upsert(sized_pod("a", 2, "3")), now());
    assert_eq!(st.pod_info(&held(&st)).cpu(), 3000);
}
