//! S60: kpssh's `Requirements` answers Karpenter core's `Compatible` (with and without
//! `AllowUndefinedWellKnownLabels`) and `Intersects` on the same requirements, and a node's
//! labels against them.

use std::collections::BTreeMap;
use std::sync::Mutex;

use kpssh::api::karpenter::NodeSelectorRequirement;
use kpssh::api::requirements::Requirements;
use proptest::prelude::*;
use serde_json::json;

use crate::support::{Oracle, cases};

#[derive(serde::Deserialize, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
struct Answer {
    compatible: bool,
    compatible_well_known: bool,
    intersects: bool,
    labels_compatible: bool,
}

/// Few keys (custom, well-known and their deprecated aliases) and few values, so that keys
/// repeat and sets overlap.
fn key() -> impl Strategy<Value = String> {
    prop_oneof![
        Just("a".to_string()),
        Just("b".to_string()),
        Just("example.com/rack".to_string()),
        Just("kubernetes.io/arch".to_string()),
        Just("beta.kubernetes.io/arch".to_string()),
        Just("topology.kubernetes.io/zone".to_string()),
        Just("failure-domain.beta.kubernetes.io/zone".to_string()),
        Just("karpenter.sh/capacity-type".to_string()),
        Just("node.kubernetes.io/instance-type".to_string()),
        Just("karpenter.sh/nodepool".to_string()),
    ]
}

fn value() -> impl Strategy<Value = String> {
    prop_oneof![
        4 => "[xyz]",
        4 => "-?[0-9]{1,2}",
        1 => Just("9223372036854775807".to_string()),
        1 => Just("-9223372036854775808".to_string()),
        1 => Just("+3".to_string()),
        1 => Just("".to_string()),
    ]
}

fn requirement() -> impl Strategy<Value = NodeSelectorRequirement> {
    let op = prop_oneof![
        3 => Just("In"),
        2 => Just("NotIn"),
        1 => Just("Exists"),
        1 => Just("DoesNotExist"),
        1 => Just("Gt"),
        1 => Just("Lt"),
        1 => Just("Gte"),
        1 => Just("Lte"),
    ];
    (
        key(),
        op,
        prop::collection::vec(value(), 0..4),
        prop::option::of(1i32..4),
    )
        .prop_map(|(key, op, mut values, min_values)| {
            if matches!(op, "Gt" | "Lt" | "Gte" | "Lte") {
                // Prevalidated by the API: exactly one (integer) value.
                values.truncate(1);
                if values.is_empty() {
                    values.push("1".into());
                }
            }
            if matches!(op, "Exists" | "DoesNotExist") {
                values.clear();
            }
            NodeSelectorRequirement {
                key,
                operator: op.into(),
                values,
                min_values,
            }
        })
}

fn labels() -> impl Strategy<Value = BTreeMap<String, String>> {
    prop::collection::btree_map(key(), value(), 0..4)
}

#[test]
fn s60_requirements_compatibility_equals_cores() {
    let oracle = Mutex::new(Oracle::start("requirements"));
    let config = ProptestConfig {
        cases: cases(),
        ..ProptestConfig::default()
    };
    let reqs = || prop::collection::vec(requirement(), 0..5);
    proptest!(config, |(existing in reqs(), incoming in reqs(), labels in labels())| {
        let theirs: Answer = oracle.lock().unwrap().ask(&json!({
            "existing": existing,
            "incoming": incoming,
            "labels": labels,
        }));
        let ours_existing = Requirements::from_node_selector(&existing);
        let ours_incoming = Requirements::from_node_selector(&incoming);
        let ours = Answer {
            compatible: ours_existing.compatible(&ours_incoming).is_ok(),
            compatible_well_known: ours_existing
                .compatible_allowing_well_known(&ours_incoming)
                .is_ok(),
            intersects: ours_existing.intersects(&ours_incoming).is_ok(),
            labels_compatible: Requirements::from_labels(&labels)
                .compatible(&ours_incoming)
                .is_ok(),
        };
        prop_assert_eq!(ours, theirs);
    });
}
