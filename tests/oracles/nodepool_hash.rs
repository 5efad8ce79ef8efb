//! S60 (and S50's hash part): kpssh's NodePool hash equals Karpenter core's `NodePool.Hash()`
//! (sigs.k8s.io/karpenter v1.14.1) on the same NodePool, and the version it stamps is core's.

use std::sync::Mutex;

use kpssh::api::NodePool;
use kpssh::karpenter::nodepool_hash::{NODEPOOL_HASH_VERSION, nodepool_hash};
use proptest::prelude::*;
use serde_json::{Value, json};

use crate::support::{Oracle, cases, tricky_string};

#[derive(serde::Deserialize)]
struct Answer {
    hash: String,
    version: String,
}

fn string_map() -> impl Strategy<Value = std::collections::BTreeMap<String, String>> {
    prop::collection::btree_map("[a-z.]{0,3}/?[a-z0-9-]{1,8}", tricky_string(), 0..4)
}

fn taints() -> impl Strategy<Value = Vec<Value>> {
    // A small alphabet, so that equal taints (which cancel out in core's set hash) occur.
    let taint = (
        prop_oneof![
            Just("a".to_string()),
            Just("b".to_string()),
            "[a-z./-]{0,10}"
        ],
        prop::option::of(prop_oneof![
            Just(String::new()),
            Just("v".to_string()),
            tricky_string()
        ]),
        prop_oneof![
            Just("NoSchedule"),
            Just("PreferNoSchedule"),
            Just("NoExecute"),
            Just("")
        ],
    )
        .prop_map(|(key, value, effect)| {
            let mut t = json!({"key": key, "effect": effect});
            if let Some(v) = value {
                t["value"] = json!(v);
            }
            t
        });
    prop::collection::vec(taint, 0..4)
}

fn duration() -> impl Strategy<Value = String> {
    prop_oneof![
        Just("0s".to_string()),
        Just("720h".to_string()),
        "([0-9]{1,4}(s|m|h)){1,3}",
    ]
}

fn requirement() -> impl Strategy<Value = Value> {
    (
        "[a-z./-]{1,12}",
        prop_oneof![Just("In"), Just("NotIn"), Just("Exists"), Just("Gt")],
        prop::collection::vec("[a-z0-9]{1,4}", 0..3),
        prop::option::of(1i32..3),
    )
        .prop_map(|(key, op, values, min)| {
            let mut r = json!({"key": key, "operator": op, "values": values});
            if let Some(m) = min {
                r["minValues"] = json!(m);
            }
            r
        })
}

/// A NodePool as the API serves it.
fn nodepool_json() -> impl Strategy<Value = Value> {
    // Absent, empty and filled apart: core's hash tells a nil map or slice from an empty one.
    let meta = (
        prop::option::of(string_map()),
        prop::option::of(string_map()),
        any::<bool>(),
    );
    let spec = (
        prop::option::of(taints()),
        prop::option::of(taints()),
        prop::collection::vec(requirement(), 0..3),
        (
            prop_oneof![
                Just("karpenter.dklesev.github.io".to_string()),
                "[a-z.]{0,8}"
            ],
            prop_oneof![Just("SSHNodeClass".to_string()), "[A-Za-z]{0,8}"],
            "[a-z0-9-]{0,8}",
        ),
        prop::option::of(prop_oneof![Just("Never".to_string()), duration()]),
        prop::option::of(duration()),
        prop::option::of(0i32..100),
    );
    (meta, spec).prop_map(
        |(
            (labels, annotations, with_meta),
            (taints, startup, reqs, (group, kind, name), expire, tgp, weight),
        )| {
            let mut template_meta = json!({});
            if let Some(l) = labels {
                template_meta["labels"] = json!(l);
            }
            if let Some(a) = annotations {
                template_meta["annotations"] = json!(a);
            }
            let mut spec = json!({
                "requirements": reqs,
                "nodeClassRef": {"group": group, "kind": kind, "name": name},
            });
            if let Some(t) = taints {
                spec["taints"] = json!(t);
            }
            if let Some(t) = startup {
                spec["startupTaints"] = json!(t);
            }
            if let Some(e) = expire {
                spec["expireAfter"] = json!(e);
            }
            if let Some(t) = tgp {
                spec["terminationGracePeriod"] = json!(t);
            }
            let mut template = json!({"spec": spec});
            if with_meta || template_meta != json!({}) {
                template["metadata"] = template_meta;
            }
            let mut pool = json!({
                "apiVersion": "karpenter.sh/v1",
                "kind": "NodePool",
                "metadata": {"name": "pool"},
                "spec": {
                    "template": template,
                    "disruption": {"consolidateAfter": "30s"},
                },
            });
            // Outside the template: never part of the hash.
            if let Some(w) = weight {
                pool["spec"]["weight"] = json!(w);
            }
            pool
        },
    )
}

#[test]
fn s60_nodepool_hash_equals_cores() {
    let oracle = Mutex::new(Oracle::start("nodepoolhash"));
    let config = ProptestConfig {
        cases: cases(),
        ..ProptestConfig::default()
    };
    proptest!(config, |(pool in nodepool_json())| {
        let ours: NodePool = serde_json::from_value(pool.clone())
            .expect("kpssh reads the generated NodePool");
        let theirs: Answer = oracle.lock().unwrap().ask(&pool);
        prop_assert_eq!(theirs.version.as_str(), NODEPOOL_HASH_VERSION);
        prop_assert_eq!(nodepool_hash(&ours), theirs.hash, "pool: {}", pool);
    });
}
