//! S55 (NodePool requirements: minValues, narrowing, labels and annotations) and S56 (topology
//! spread and pod (anti-)affinity on any key the hosts label, volume topology) in provisioning
//! and the simulated scheduler, as core's scheduler does them.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    Namespace, Node, PodAffinity, PodAffinityTerm, PodAntiAffinity, TopologySpreadConstraint,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use kpssh::api::NodeClaim;
use kpssh::api::karpenter::{INSTANCE_TYPE_LABEL, NodeSelectorRequirement};
use kpssh::k8s::Cluster;

use super::*;

pub const ZONE: &str = "topology.kubernetes.io/zone";

pub fn req(key: &str, op: &str, values: &[&str], min: Option<i32>) -> NodeSelectorRequirement {
    NodeSelectorRequirement {
        key: key.into(),
        operator: op.into(),
        values: values.iter().map(|v| v.to_string()).collect(),
        min_values: min,
    }
}

pub fn selector(app: &str) -> Option<LabelSelector> {
    Some(LabelSelector {
        match_labels: Some(BTreeMap::from([("app".to_string(), app.to_string())])),
        ..Default::default()
    })
}

/// A pod of `app` (label `app`), with `cpu` and 256Mi.
pub fn app_pod(name: &str, app: &str, cpu: &str) -> Pod {
    let mut p = pod(name, cpu, "256Mi");
    p.metadata.labels = Some(BTreeMap::from([("app".to_string(), app.to_string())]));
    p
}

pub fn spread(p: &mut Pod, key: &str, skew: i32) {
    let app = p
        .metadata
        .labels
        .as_ref()
        .and_then(|l| l.get("app"))
        .cloned();
    let s = p.spec.as_mut().expect("spec");
    s.topology_spread_constraints
        .get_or_insert_default()
        .push(TopologySpreadConstraint {
            max_skew: skew,
            topology_key: key.into(),
            when_unsatisfiable: "DoNotSchedule".into(),
            label_selector: selector(app.as_deref().unwrap_or_default()),
            ..Default::default()
        });
}

pub fn anti(p: &mut Pod, key: &str, app: &str) {
    let s = p.spec.as_mut().expect("spec");
    let a = s.affinity.get_or_insert_default();
    a.pod_anti_affinity
        .get_or_insert_with(PodAntiAffinity::default)
        .required_during_scheduling_ignored_during_execution
        .get_or_insert_default()
        .push(PodAffinityTerm {
            label_selector: selector(app),
            topology_key: key.into(),
            ..Default::default()
        });
}

/// Node labels by node name.
pub async fn node_labels(e: &Env) -> BTreeMap<String, BTreeMap<String, String>> {
    let nodes: Vec<Node> = e.w.cluster.list(None, None).await.expect("nodes");
    nodes
        .into_iter()
        .map(|n| {
            (
                n.metadata.name.unwrap_or_default(),
                n.metadata.labels.unwrap_or_default(),
            )
        })
        .collect()
}

/// Per pod name: the value of `key` on the node it is bound to.
pub async fn bound_to(e: &Env, key: &str) -> BTreeMap<String, String> {
    let labels = node_labels(e).await;
    pods(e)
        .await
        .into_iter()
        .filter_map(|p| {
            let node = p.spec.as_ref()?.node_name.clone()?;
            let v = labels.get(&node)?.get(key).cloned().unwrap_or_default();
            Some((p.metadata.name.unwrap_or_default(), v))
        })
        .collect()
}

fn warnings(e: &Env, reason: &str) -> Vec<String> {
    e.w.cluster
        .events()
        .into_iter()
        .filter(|ev| ev.reason == reason)
        .map(|ev| ev.message)
        .collect()
}

/// S55: `minValues` on the instance type: with two classes, a NodePool asking for three
/// distinct types launches nothing and says why; once a third class exists, the claim lists
/// all three (with `minValues`) and the pod runs on the cheapest.
#[tokio::test(start_paused = true)]
async fn s55_min_values_launches_only_with_enough_distinct_types() {
    let e = env().await;
    hosts(&e, "s", "small", 1, 2, 4, 50).await;
    hosts(&e, "m", "medium", 1, 4, 8, 51).await;
    let mut np = nodepool("default");
    np.spec.template.spec.requirements = vec![req(
        INSTANCE_TYPE_LABEL,
        "In",
        &["small", "medium", "large"],
        Some(3),
    )];
    e.w.cluster.create(&np).await.expect("np");
    e.w.cluster
        .create(&pod("p", "1", "1Gi"))
        .await
        .expect("pod");
    let told =
        e.w.until(3 * MINUTE, || async {
            warnings(&e, "FailedProvisioning")
                .iter()
                .any(|m| m.contains("minValues"))
        })
        .await;
    assert!(told, "events: {:?}", reasons(&e));
    assert!(claims(&e).await.is_empty(), "no claim without 3 types");
    assert!(
        warnings(&e, "FailedProvisioning")[0].contains(&format!("{INSTANCE_TYPE_LABEL} (2 of 3")),
        "{:?}",
        warnings(&e, "FailedProvisioning")
    );
    hosts(&e, "l", "large", 1, 8, 16, 52).await;
    let ok =
        e.w.until(5 * MINUTE, || async { running(&e).await == 1 })
            .await;
    assert!(ok, "the pod runs once three types exist");
    let cs = claims(&e).await;
    assert_eq!(cs.len(), 1);
    let it = cs[0]
        .spec
        .requirements
        .iter()
        .find(|r| r.key == INSTANCE_TYPE_LABEL)
        .expect("instance type requirement");
    assert_eq!(it.values, ["small", "medium", "large"], "cheapest first");
    assert_eq!(it.min_values, Some(3));
    let labels = cs[0].metadata.labels.clone().unwrap_or_default();
    assert_eq!(
        labels.get(INSTANCE_TYPE_LABEL).map(String::as_str),
        Some("small")
    );
}

/// S55: `minValues` on a key the hosts label (zone): a class in one zone cannot give two.
#[tokio::test(start_paused = true)]
async fn s55_min_values_on_a_host_label_counts_the_offerings() {
    let e = env().await;
    hosts_labelled(&e, "a", "small", 1, 2, 4, 53, &[(ZONE, "a")]).await;
    let mut np = nodepool("default");
    np.spec.template.spec.requirements = vec![req(ZONE, "In", &["a", "b"], Some(2))];
    e.w.cluster.create(&np).await.expect("np");
    e.w.cluster
        .create(&pod("p", "1", "1Gi"))
        .await
        .expect("pod");
    let told =
        e.w.until(3 * MINUTE, || async {
            warnings(&e, "FailedProvisioning")
                .iter()
                .any(|m| m.contains(&format!("minValues requirement is not met for {ZONE}")))
        })
        .await;
    assert!(told, "{:?}", warnings(&e, "FailedProvisioning"));
    hosts_labelled(&e, "b", "small", 1, 2, 4, 54, &[(ZONE, "b")]).await;
    let ok =
        e.w.until(5 * MINUTE, || async { running(&e).await == 1 })
            .await;
    assert!(ok, "runs once the class spans two zones");
}

/// S55: a multi-value `In` on a label no host gives is narrowed by the pods (core's
/// requirements intersection): the node gets the value the pod asks for, not the first one;
/// `Exists` and `Gt` on such a key admit every type and label the node with a value that
/// satisfies them; the template's annotations reach the Node.
#[tokio::test(start_paused = true)]
async fn s55_requirements_narrow_label_and_annotate_the_node() {
    let e = env().await;
    hosts(&e, "h", "small", 2, 2, 4, 55).await;
    let mut np = nodepool("default");
    np.spec.template.spec.requirements = vec![
        req("team", "In", &["a", "b"], None),
        req("example.com/tier", "Exists", &[], None),
        req("example.com/gen", "Gt", &["3"], None),
    ];
    np.spec
        .template
        .metadata
        .annotations
        .get_or_insert_default()
        .insert("example.com/owner".into(), "ops".into());
    e.w.cluster.create(&np).await.expect("np");
    let mut p = pod("b-team", "1", "1Gi");
    p.spec.as_mut().expect("spec").node_selector =
        Some(BTreeMap::from([("team".to_string(), "b".to_string())]));
    e.w.cluster.create(&p).await.expect("pod");
    let ok =
        e.w.until(5 * MINUTE, || async { running(&e).await == 1 })
            .await;
    assert!(ok, "the pod runs; events {:?}", reasons(&e));
    let cs: Vec<NodeClaim> = claims(&e).await;
    let labels = cs[0].metadata.labels.clone().unwrap_or_default();
    assert_eq!(labels.get("team").map(String::as_str), Some("b"));
    assert_eq!(
        labels.get("example.com/tier").map(String::as_str),
        Some("0")
    );
    assert_eq!(labels.get("example.com/gen").map(String::as_str), Some("4"));
    let team = cs[0]
        .spec
        .requirements
        .iter()
        .find(|r| r.key == "team")
        .expect("team");
    assert_eq!(team.values, ["b"], "narrowed by the pod");
    let nodes: Vec<Node> = e.w.cluster.list(None, None).await.expect("nodes");
    let ann = nodes[0].metadata.annotations.clone().unwrap_or_default();
    assert_eq!(
        ann.get("example.com/owner").map(String::as_str),
        Some("ops")
    );
    let nl = nodes[0].metadata.labels.clone().unwrap_or_default();
    assert_eq!(nl.get("team").map(String::as_str), Some("b"));
}

/// S56: a zone spread over hosts labelled with three zones: every pod runs, the nodes carry
/// their hosts' zones and no zone holds more than `maxSkew` pods above another (checked from
/// the bindings). Before, such pods stayed pending with UnsupportedConstraint.
#[tokio::test(start_paused = true)]
async fn s56_zone_spread_over_host_labels() {
    let e = env().await;
    for (i, z) in ["a", "b", "c"].iter().enumerate() {
        hosts_labelled(
            &e,
            &format!("{z}-"),
            "small",
            3,
            4,
            8,
            60 + i as u8,
            &[(ZONE, z)],
        )
        .await;
    }
    e.w.cluster.create(&nodepool("default")).await.expect("np");
    for i in 0..9 {
        let mut p = app_pod(&format!("web{i}"), "web", "1");
        spread(&mut p, ZONE, 1);
        e.w.cluster.create(&p).await.expect("pod");
    }
    let ok =
        e.w.until(10 * MINUTE, || async { running(&e).await == 9 })
            .await;
    assert!(
        ok,
        "all spread pods run: {} of 9; {:?}",
        running(&e).await,
        reasons(&e)
    );
    assert!(!reasons(&e).iter().any(|r| r == "UnsupportedConstraint"));
    let mut per_zone: BTreeMap<String, usize> = BTreeMap::new();
    for z in bound_to(&e, ZONE).await.into_values() {
        *per_zone.entry(z).or_default() += 1;
    }
    assert_eq!(per_zone.len(), 3, "{per_zone:?}");
    let (min, max) = (per_zone.values().min(), per_zone.values().max());
    assert!(
        max.zip(min).is_some_and(|(a, b)| a - b <= 1),
        "{per_zone:?}"
    );
    assert!(claims(&e).await.len() <= 3, "three nodes suffice");
}

/// S56: anti-affinity on zone: one pod per zone; a fourth stays pending and is told why.
#[tokio::test(start_paused = true)]
async fn s56_zone_anti_affinity_one_pod_per_zone() {
    let e = env().await;
    for (i, z) in ["a", "b", "c"].iter().enumerate() {
        hosts_labelled(
            &e,
            &format!("{z}-"),
            "small",
            2,
            4,
            8,
            63 + i as u8,
            &[(ZONE, z)],
        )
        .await;
    }
    e.w.cluster.create(&nodepool("default")).await.expect("np");
    for i in 0..4 {
        let mut p = app_pod(&format!("db{i}"), "db", "1");
        anti(&mut p, ZONE, "db");
        e.w.cluster.create(&p).await.expect("pod");
    }
    let ok =
        e.w.until(10 * MINUTE, || async { running(&e).await == 3 })
            .await;
    assert!(ok, "three run: {}; {:?}", running(&e).await, reasons(&e));
    tokio::time::sleep(2 * MINUTE).await;
    assert_eq!(running(&e).await, 3, "a fourth zone does not exist");
    let zones: std::collections::BTreeSet<String> =
        bound_to(&e, ZONE).await.into_values().collect();
    assert_eq!(zones.len(), 3, "{zones:?}");
    assert!(
        warnings(&e, "FailedProvisioning")
            .iter()
            .any(|m| m.contains("pod anti-affinity")),
        "{:?}",
        warnings(&e, "FailedProvisioning")
    );
    assert_eq!(claims(&e).await.len(), 3);
}

/// S56: pod affinity on zone across namespaces chosen by a namespaceSelector, and a spread on
/// a custom rack label the hosts carry.
#[tokio::test(start_paused = true)]
async fn s56_pod_affinity_namespace_selector_and_rack_spread() {
    let e = env().await;
    hosts_labelled(
        &e,
        "a-",
        "small",
        2,
        4,
        8,
        66,
        &[(ZONE, "a"), ("example.com/rack", "r1")],
    )
    .await;
    hosts_labelled(
        &e,
        "b-",
        "small",
        2,
        4,
        8,
        67,
        &[(ZONE, "b"), ("example.com/rack", "r2")],
    )
    .await;
    for (ns, team) in [("front", "x"), ("back", "y")] {
        let n = Namespace {
            metadata: kube::api::ObjectMeta {
                name: Some(ns.into()),
                labels: Some(BTreeMap::from([("team".to_string(), team.to_string())])),
                ..Default::default()
            },
            ..Default::default()
        };
        e.w.cluster.create(&n).await.expect("ns");
    }
    let mut np = nodepool("default");
    np.spec.template.spec.requirements = vec![req(ZONE, "In", &["b"], None)];
    e.w.cluster.create(&np).await.expect("np");
    // The web pod in namespace front goes to zone b (the only one the pool allows).
    let mut web = app_pod("web", "web", "1");
    web.metadata.namespace = Some("front".into());
    e.w.cluster.create(&web).await.expect("pod");
    let ok =
        e.w.until(5 * MINUTE, || async { running(&e).await == 1 })
            .await;
    assert!(ok, "web runs");
    // Cache pods (namespace back, another pool without the zone requirement) want the web
    // pod's zone, in the namespaces labelled team=x, and spread over racks with skew 2: zone b
    // is rack r2 only, rack r1 (zone a) counts as a domain with none, so two run and the
    // third would make the skew 3.
    let mut open = nodepool("open");
    open.spec.weight = Some(10);
    e.w.cluster.create(&open).await.expect("np");
    for i in 0..3 {
        let mut c = app_pod(&format!("cache{i}"), "cache", "1");
        c.metadata.namespace = Some("back".into());
        spread(&mut c, "example.com/rack", 2);
        let s = c.spec.as_mut().expect("spec");
        s.affinity.get_or_insert_default().pod_affinity = Some(PodAffinity {
            required_during_scheduling_ignored_during_execution: Some(vec![PodAffinityTerm {
                label_selector: selector("web"),
                topology_key: ZONE.into(),
                namespace_selector: Some(LabelSelector {
                    match_labels: Some(BTreeMap::from([("team".to_string(), "x".to_string())])),
                    ..Default::default()
                }),
                ..Default::default()
            }]),
            ..Default::default()
        });
        e.w.cluster.create(&c).await.expect("pod");
    }
    let ok =
        e.w.until(5 * MINUTE, || async { running(&e).await == 3 })
            .await;
    let zones = bound_to(&e, ZONE).await;
    assert!(ok, "caches run: {zones:?}; {:?}", reasons(&e));
    assert_eq!(zones.get("cache0").map(String::as_str), Some("b"));
    assert_eq!(zones.get("cache1").map(String::as_str), Some("b"));
    let racks = bound_to(&e, "example.com/rack").await;
    assert_eq!(
        racks.get("cache0").map(String::as_str),
        Some("r2"),
        "{racks:?}"
    );
    assert_eq!(
        racks.get("cache1").map(String::as_str),
        Some("r2"),
        "{racks:?}"
    );
    tokio::time::sleep(2 * MINUTE).await;
    assert_eq!(
        running(&e).await,
        3,
        "the third cache would skew the racks by 3"
    );
    assert!(
        warnings(&e, "FailedProvisioning")
            .iter()
            .any(|m| m.contains("topology spread on example.com/rack")),
        "{:?}",
        warnings(&e, "FailedProvisioning")
    );
}

/// S56: a pod mounting a bound volume pinned to zone c gets a node in zone c; an unbound claim
/// whose StorageClass allows only zone a gets one in zone a.
#[tokio::test(start_paused = true)]
async fn s56_volume_topology_pins_the_zone() {
    use k8s_openapi::api::core::v1::{
        NodeSelector, NodeSelectorRequirement as K8sReq, NodeSelectorTerm, PersistentVolume,
        PersistentVolumeClaim, PersistentVolumeClaimSpec, PersistentVolumeClaimVolumeSource,
        PersistentVolumeSpec, TopologySelectorLabelRequirement, TopologySelectorTerm, Volume,
        VolumeNodeAffinity,
    };
    use k8s_openapi::api::storage::v1::StorageClass;
    let e = env().await;
    for (i, z) in ["a", "b", "c"].iter().enumerate() {
        hosts_labelled(
            &e,
            &format!("{z}-"),
            "small",
            1,
            4,
            8,
            68 + i as u8,
            &[(ZONE, z)],
        )
        .await;
    }
    e.w.cluster.create(&nodepool("default")).await.expect("np");
    let pv = PersistentVolume {
        metadata: kube::api::ObjectMeta {
            name: Some("disk-c".into()),
            ..Default::default()
        },
        spec: Some(PersistentVolumeSpec {
            node_affinity: Some(VolumeNodeAffinity {
                required: Some(NodeSelector {
                    node_selector_terms: vec![NodeSelectorTerm {
                        match_expressions: Some(vec![K8sReq {
                            key: ZONE.into(),
                            operator: "In".into(),
                            values: Some(vec!["c".into()]),
                        }]),
                        ..Default::default()
                    }],
                }),
            }),
            ..Default::default()
        }),
        status: None,
    };
    e.w.cluster.create(&pv).await.expect("pv");
    let sc = StorageClass {
        metadata: kube::api::ObjectMeta {
            name: Some("zonal".into()),
            ..Default::default()
        },
        provisioner: "example.com/disk".into(),
        allowed_topologies: Some(vec![TopologySelectorTerm {
            match_label_expressions: Some(vec![TopologySelectorLabelRequirement {
                key: ZONE.into(),
                values: vec!["a".into()],
            }]),
        }]),
        ..Default::default()
    };
    e.w.cluster.create(&sc).await.expect("sc");
    for (claim, volume, class) in [
        ("data-c", Some("disk-c"), None),
        ("data-a", None, Some("zonal")),
    ] {
        let pvc = PersistentVolumeClaim {
            metadata: kube::api::ObjectMeta {
                name: Some(claim.into()),
                namespace: Some("default".into()),
                ..Default::default()
            },
            spec: Some(PersistentVolumeClaimSpec {
                volume_name: volume.map(str::to_string),
                storage_class_name: class.map(str::to_string),
                ..Default::default()
            }),
            status: None,
        };
        e.w.cluster.create(&pvc).await.expect("pvc");
        let mut p = app_pod(&format!("uses-{claim}"), claim, "3");
        p.spec.as_mut().expect("spec").volumes = Some(vec![Volume {
            name: "data".into(),
            persistent_volume_claim: Some(PersistentVolumeClaimVolumeSource {
                claim_name: claim.into(),
                read_only: None,
            }),
            ..Default::default()
        }]);
        e.w.cluster.create(&p).await.expect("pod");
    }
    let ok =
        e.w.until(5 * MINUTE, || async { claims(&e).await.len() == 2 })
            .await;
    assert!(ok, "{:?}", reasons(&e));
    let mut zones: Vec<String> = claims(&e)
        .await
        .iter()
        .filter_map(|c| {
            c.spec
                .requirements
                .iter()
                .find(|r| r.key == ZONE)
                .map(|r| r.values.join(","))
        })
        .collect();
    zones.sort();
    assert_eq!(zones, ["a", "c"]);
}

/// S56: a well-known topology key only hosts can give (region) is not invented: a NodePool
/// requiring a region launches nothing until hosts in that region exist (a claim no host could
/// take would be made and deleted again and again).
#[tokio::test(start_paused = true)]
async fn s56_a_region_requirement_waits_for_hosts_in_that_region() {
    let e = env().await;
    hosts(&e, "plain", "small", 1, 2, 4, 71).await;
    let mut np = nodepool("default");
    np.spec.template.spec.requirements =
        vec![req("topology.kubernetes.io/region", "In", &["eu"], None)];
    e.w.cluster.create(&np).await.expect("np");
    e.w.cluster
        .create(&pod("p", "1", "1Gi"))
        .await
        .expect("pod");
    let told =
        e.w.until(3 * MINUTE, || async {
            reasons(&e).iter().any(|r| r == "FailedProvisioning")
        })
        .await;
    assert!(told, "{:?}", reasons(&e));
    assert!(claims(&e).await.is_empty(), "no claim without a host in eu");
    hosts_labelled(
        &e,
        "eu-",
        "small",
        1,
        2,
        4,
        72,
        &[("topology.kubernetes.io/region", "eu")],
    )
    .await;
    let ok =
        e.w.until(5 * MINUTE, || async { running(&e).await == 1 })
            .await;
    assert!(ok, "runs on the eu host: {:?}", reasons(&e));
    let regions = bound_to(&e, "topology.kubernetes.io/region").await;
    assert_eq!(regions.get("p").map(String::as_str), Some("eu"));
}

/// Host ports in provisioning: two pods binding one host port get two nodes, though one host
/// would hold both.
#[tokio::test(start_paused = true)]
async fn s56_host_ports_split_pods_across_new_nodes() {
    use k8s_openapi::api::core::v1::ContainerPort;
    let e = env().await;
    hosts(&e, "h", "big", 3, 8, 16, 73).await;
    e.w.cluster.create(&nodepool("default")).await.expect("np");
    for i in 0..2 {
        let mut p = app_pod(&format!("proxy{i}"), "proxy", "500m");
        let c = &mut p.spec.as_mut().expect("spec").containers[0];
        c.ports = Some(vec![ContainerPort {
            container_port: 8080,
            host_port: Some(8080),
            ..Default::default()
        }]);
        e.w.cluster.create(&p).await.expect("pod");
    }
    let ok =
        e.w.until(5 * MINUTE, || async { running(&e).await == 2 })
            .await;
    assert!(ok, "{:?}", reasons(&e));
    assert_eq!(claims(&e).await.len(), 2, "one node per host port user");
    let nodes: Vec<Option<String>> = pods(&e)
        .await
        .iter()
        .map(|p| p.spec.as_ref().and_then(|s| s.node_name.clone()))
        .collect();
    assert_ne!(nodes[0], nodes[1], "{nodes:?}");
}
