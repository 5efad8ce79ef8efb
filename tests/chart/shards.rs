//! The chart's `shards` (issue #26): one Deployment, PodDisruptionBudget and Lease per shard,
//! each owning its node classes; no shards renders the single controller of before.

use serde_json::Value;

use super::{of_kind, one};
use crate::helm::render;

fn env(dep: &Value, name: &str) -> Option<String> {
    dep["spec"]["template"]["spec"]["containers"][0]["env"]
        .as_array()?
        .iter()
        .find(|e| e["name"] == name)
        .and_then(|e| e["value"].as_str().map(str::to_string))
}

fn lease_names(objs: &[Value]) -> Vec<String> {
    of_kind(objs, "Role")
        .into_iter()
        .flat_map(|r| r["rules"].as_array().cloned().unwrap_or_default())
        .filter(|rule| rule["resources"][0] == "leases" && rule["resourceNames"].is_array())
        .flat_map(|rule| {
            (rule["resourceNames"]
                .as_array()
                .cloned()
                .unwrap_or_default())
            .into_iter()
            .filter_map(|v| v.as_str().map(str::to_string))
            .collect::<Vec<_>>()
        })
        .collect()
}

#[test]
fn without_shards_the_chart_renders_one_controller_for_every_class() {
    let objs = render(
        "kpssh",
        "kpssh-system",
        &["podDisruptionBudget.enabled=true"],
    )
    .expect("render");
    let dep = one(&objs, "Deployment");
    assert_eq!(dep["metadata"]["name"], "kpssh");
    assert_eq!(
        env(dep, "KPSSH_NODE_CLASSES"),
        None,
        "no shard: every class"
    );
    assert_eq!(
        env(dep, "KPSSH_LEADER_ELECTION_ID").as_deref(),
        Some("kpssh-controller")
    );
    let labels = &dep["spec"]["selector"]["matchLabels"];
    assert!(
        labels.get("karpenter.dklesev.github.io/shard").is_none(),
        "{labels}"
    );
    assert_eq!(
        one(&objs, "PodDisruptionBudget")["metadata"]["name"],
        "kpssh"
    );
    assert_eq!(lease_names(&objs), vec!["kpssh-controller".to_string()]);
}

#[test]
fn each_shard_gets_its_deployment_pdb_and_lease_owning_its_node_classes() {
    let objs = render(
        "kpssh",
        "kpssh-system",
        &[
            "podDisruptionBudget.enabled=true",
            "shards[0].name=gpu",
            "shards[0].nodeClasses={gpu}",
            "shards[1].name=general",
            "shards[1].nodeClasses={small,large}",
            "shards[1].replicas=3",
        ],
    )
    .expect("render");
    let deps = of_kind(&objs, "Deployment");
    let pdbs = of_kind(&objs, "PodDisruptionBudget");
    assert_eq!((deps.len(), pdbs.len()), (2, 2));
    let want = [
        ("kpssh-gpu", "gpu", "gpu", 2),
        ("kpssh-general", "general", "small,large", 3),
    ];
    for (dep, (name, shard, classes, replicas)) in deps.iter().zip(want) {
        assert_eq!(dep["metadata"]["name"], name);
        assert_eq!(dep["spec"]["replicas"], replicas);
        assert_eq!(env(dep, "KPSSH_NODE_CLASSES").as_deref(), Some(classes));
        let lease = format!("kpssh-controller-{shard}");
        assert_eq!(env(dep, "KPSSH_LEADER_ELECTION_ID"), Some(lease));
        // Each Deployment selects its own pods only (selectors of two Deployments must not
        // overlap), and its pod template carries the label it selects on.
        let sel = &dep["spec"]["selector"]["matchLabels"];
        assert_eq!(sel["karpenter.dklesev.github.io/shard"], shard, "{sel}");
        let pod = &dep["spec"]["template"]["metadata"]["labels"];
        assert_eq!(pod["karpenter.dklesev.github.io/shard"], shard);
        let anti = &dep["spec"]["template"]["spec"]["affinity"]["podAntiAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
            [0]["podAffinityTerm"]["labelSelector"]["matchLabels"];
        assert_eq!(anti["karpenter.dklesev.github.io/shard"], shard, "{anti}");
    }
    for (pdb, shard) in pdbs.iter().zip(["gpu", "general"]) {
        assert_eq!(pdb["metadata"]["name"], format!("kpssh-{shard}"));
        assert_eq!(
            pdb["spec"]["selector"]["matchLabels"]["karpenter.dklesev.github.io/shard"],
            shard
        );
    }
    // The controller's Role may update exactly the shards' Leases.
    assert_eq!(
        lease_names(&objs),
        vec![
            "kpssh-controller-gpu".to_string(),
            "kpssh-controller-general".to_string()
        ]
    );
}

#[test]
fn shards_sharing_a_node_class_or_a_name_are_refused() {
    let refused: &[(&[&str], &str)] = &[
        (
            &[
                "shards[0].name=a",
                "shards[0].nodeClasses={x,y}",
                "shards[1].name=b",
                "shards[1].nodeClasses={y}",
            ],
            "SSHNodeClass \"y\" is in the nodeClasses of shard a and of shard b",
        ),
        (
            &[
                "shards[0].name=a",
                "shards[0].nodeClasses={x}",
                "shards[1].name=a",
                "shards[1].nodeClasses={y}",
            ],
            "two shards are named \"a\"",
        ),
        (&["shards[0].name=a"], "nodeClasses"),
        (
            &["shards[0].name=Bad_Name", "shards[0].nodeClasses={x}"],
            "name",
        ),
    ];
    for (set, want) in refused {
        let err = render("kpssh", "kpssh-system", set)
            .err()
            .unwrap_or_else(|| panic!("{set:?} must be refused"));
        assert!(err.contains(want), "{set:?}: {err}");
    }
}
