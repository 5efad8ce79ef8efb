//! S60: kpssh's nodeclass hash equals the Go provider's JoinHash on the same SSHNodeClass.

use std::sync::Mutex;

use kpssh::api::nodeclass::SSHNodeClassSpec;
use kpssh::provider::drift::nodeclass_hash;
use proptest::prelude::*;
use serde_json::{Value, json};

use crate::support::{Oracle, cases, tricky_string};

#[derive(serde::Deserialize)]
struct Answer {
    hash: String,
    version: String,
}

/// A node class spec as the API serves it (with the CRD's defaults applied).
fn spec_json() -> impl Strategy<Value = Value> {
    let vars = prop::option::of(prop::collection::btree_map(
        "[A-Za-z_][A-Za-z0-9_]{0,6}",
        tricky_string(),
        0..5,
    ));
    let secret = prop::option::of("[a-z0-9.-]{1,12}");
    let source = prop_oneof![Just("Static"), Just("Adopt")];
    let ca = prop::option::of(prop_oneof![
        prop::collection::vec(any::<u8>(), 0..40).prop_map(|b| {
            use base64::Engine as _;
            base64::engine::general_purpose::STANDARD.encode(b)
        }),
        // PEM-like text split over lines, as a pasted bundle looks.
        prop::collection::vec(any::<u8>(), 1..80).prop_map(|b| {
            use base64::Engine as _;
            let t = base64::engine::general_purpose::STANDARD.encode(b);
            t.as_bytes()
                .chunks(16)
                .map(|c| String::from_utf8_lossy(c).into_owned())
                .collect::<Vec<_>>()
                .join("\n")
        }),
    ]);
    let cluster = prop::option::of(("https://[a-z0-9.<>&-]{1,20}(:[0-9]{2,5})?", ca));
    let extras = (
        prop::option::of("[0-9]{1,2}\\.[0-9]{1,3}"),
        prop::option::of(1i32..300),
    );
    (vars, secret, source, cluster, extras).prop_map(|(vars, secret, source, cluster, extras)| {
        let mut spec = json!({
            "joinProfileRef": {"name": "p"},
            "providerIDSource": source,
        });
        if let Some(v) = vars {
            spec["vars"] = json!(v);
        }
        if let Some(s) = secret {
            spec["joinSecretRef"] = json!({"name": s});
        }
        if let Some((endpoint, ca)) = cluster {
            spec["cluster"] = json!({"endpoint": endpoint});
            if let Some(ca) = ca {
                spec["cluster"]["caBundle"] = json!(ca);
            }
        }
        // Fields that never drift: they must not change the hash.
        if let Some(price) = extras.0 {
            spec["pricePerCPUHour"] = json!(price);
        }
        if let Some(max) = extras.1 {
            spec["maxPods"] = json!(max);
        }
        spec
    })
}

#[test]
fn s60_nodeclass_hash_equals_the_go_providers_join_hash() {
    let oracle = Mutex::new(Oracle::start("joinhash"));
    let config = ProptestConfig {
        cases: cases(),
        ..ProptestConfig::default()
    };
    proptest!(config, |(spec in spec_json())| {
        let ours: SSHNodeClassSpec = serde_json::from_value(spec.clone())
            .expect("kpssh reads the generated spec");
        let theirs: Answer = oracle.lock().unwrap().ask(&spec);
        prop_assert_eq!(theirs.version.as_str(), kpssh::api::NODECLASS_HASH_VERSION);
        prop_assert_eq!(nodeclass_hash(&ours), theirs.hash, "spec: {}", spec);
    });
}

#[test]
fn s60_known_go_hashes_of_fixed_classes() {
    // Fixed points, so that a change on either side shows without the generator.
    let mut oracle = Oracle::start("joinhash");
    let spec = json!({
        "joinProfileRef": {"name": "p"},
        "vars": {"b": "<&>\u{2028}", "a": "x"},
        "joinSecretRef": {"name": "activation"},
        "providerIDSource": "Adopt",
        "cluster": {"endpoint": "https://10.0.0.5:6443", "caBundle": "Y2E="},
    });
    let ours: SSHNodeClassSpec = serde_json::from_value(spec.clone()).unwrap();
    let theirs: Answer = oracle.ask(&spec);
    assert_eq!(nodeclass_hash(&ours), theirs.hash);
    assert_eq!(theirs.hash, "d2e5519405bb1b9e");
}
