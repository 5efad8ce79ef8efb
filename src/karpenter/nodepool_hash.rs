//! The NodePool template hash a NodeClaim carries (`karpenter.sh/nodepool-hash`, with
//! `karpenter.sh/nodepool-hash-version`): a NodeClaim whose hash differs from its NodePool's
//! current one is Drifted (S50, S60).
//!
//! The hash is Karpenter core's `NodePool.Hash()` (sigs.k8s.io/karpenter v1.14.1, version
//! `v3`): `hashstructure/v2` (FormatV2, FNV-1 64) over `spec.template` with `SlicesAsSets`,
//! `IgnoreZeroValue` and `ZeroNil`; `requirements` is ignored (`hash:"ignore"`), and so is a
//! taint's `timeAdded` here (see `docs/concepts.md`). It is printed as a decimal `uint64`, so a
//! NodeClaim that core (or the Go provider) stamped is not drifted by kpssh, and back. The
//! oracle test `tests/oracles/nodepool_hash.rs` compares this with core's on generated pools.
//!
//! One module for stamping (provisioning, replacements) and comparing (disruption), so the
//! hash and its version annotation are defined in one place.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Taint;

use crate::api::{NodeClaim, NodePool};

pub const NODEPOOL_HASH_ANNOTATION: &str = "karpenter.sh/nodepool-hash";
pub const NODEPOOL_HASH_VERSION_ANNOTATION: &str = "karpenter.sh/nodepool-hash-version";
/// Core's `NodePoolHashVersion`: hashes of another version are never compared.
pub const NODEPOOL_HASH_VERSION: &str = "v3";

/// Core's `NodePool.Hash()` of a NodePool's template (what a NodeClaim was made from).
pub fn nodepool_hash(pool: &NodePool) -> String {
    template_hash(&pool.spec.template).to_string()
}

/// The annotations a NodeClaim made from `pool` gets, besides the template's own.
pub fn stamp(pool: &NodePool, annotations: &mut BTreeMap<String, String>) {
    annotations.insert(NODEPOOL_HASH_ANNOTATION.into(), nodepool_hash(pool));
    annotations.insert(
        NODEPOOL_HASH_VERSION_ANNOTATION.into(),
        NODEPOOL_HASH_VERSION.into(),
    );
}

/// The claim was made from another version of its NodePool's template than `current` (the
/// pool's [`nodepool_hash`]). As core: a claim without the hash or without the version
/// annotation, or stamped with another hash version, is not drifted.
pub fn drifted(claim: &NodeClaim, current: &str) -> bool {
    let Some(a) = claim.metadata.annotations.as_ref() else {
        return false;
    };
    a.get(NODEPOOL_HASH_VERSION_ANNOTATION).map(String::as_str) == Some(NODEPOOL_HASH_VERSION)
        && a.get(NODEPOOL_HASH_ANNOTATION)
            .is_some_and(|h| h != current)
}

// ---------------------------------------------------------------------------------------------
// hashstructure/v2, for the types of a NodeClaimTemplate.

const FNV_OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
const FNV_PRIME: u64 = 0x0000_0100_0000_01b3;

/// FNV-1 (not 1a) 64, Go's `hash/fnv.New64`.
fn fnv1(bytes: &[u8]) -> u64 {
    bytes
        .iter()
        .fold(FNV_OFFSET, |h, b| h.wrapping_mul(FNV_PRIME) ^ u64::from(*b))
}

fn hash_str(s: &str) -> u64 {
    fnv1(s.as_bytes())
}

fn hash_i64(v: i64) -> u64 {
    fnv1(&v.to_le_bytes())
}

fn ordered(a: u64, b: u64) -> u64 {
    let mut buf = [0u8; 16];
    buf[..8].copy_from_slice(&a.to_le_bytes());
    buf[8..].copy_from_slice(&b.to_le_bytes());
    fnv1(&buf)
}

fn finish_unordered(a: u64) -> u64 {
    fnv1(&a.to_le_bytes())
}

/// A struct: the hash of its type name, then per non-zero field `finish(h ^ ordered(name,
/// value))`. Zero fields (`IgnoreZeroValue`) are `None` and leave no trace.
fn hash_struct(type_name: &str, fields: &[(&str, Option<u64>)]) -> u64 {
    let mut h = hash_str(type_name);
    for (name, value) in fields {
        if let Some(v) = value {
            h = finish_unordered(h ^ ordered(hash_str(name), *v));
        }
    }
    h
}

/// A non-nil map: XOR of `ordered(key, value)`, finished.
fn hash_map(m: &BTreeMap<String, String>) -> u64 {
    let h = m
        .iter()
        .fold(0, |h, (k, v)| h ^ ordered(hash_str(k), hash_str(v)));
    finish_unordered(h)
}

/// A slice under `SlicesAsSets` without a `set` tag: a bare XOR of the elements (so two equal
/// elements cancel out, as in core).
fn hash_set(items: impl Iterator<Item = u64>) -> u64 {
    items.fold(0, |h, x| h ^ x)
}

fn non_empty_str(s: &str) -> Option<u64> {
    (!s.is_empty()).then(|| hash_str(s))
}

fn hash_taint(t: &Taint) -> u64 {
    hash_struct(
        "Taint",
        &[
            ("Key", non_empty_str(&t.key)),
            ("Value", t.value.as_deref().and_then(non_empty_str)),
            ("Effect", non_empty_str(&t.effect)),
        ],
    )
}

/// A taint slice: absent (nil) leaves no trace, `[]` hashes as an empty set (`IgnoreZeroValue`
/// skips only nil slices).
fn hash_taints(taints: Option<&Vec<Taint>>) -> Option<u64> {
    taints.map(|t| hash_set(t.iter().map(hash_taint)))
}

fn template_hash(t: &crate::api::karpenter::NodeClaimTemplate) -> u64 {
    let meta = &t.metadata;
    // Nil maps leave no trace; an empty map is hashed (`IgnoreZeroValue` skips only nil).
    let labels = meta.labels.as_ref().map(hash_map);
    let annotations = meta.annotations.as_ref().map(hash_map);
    let object_meta = (labels.is_some() || annotations.is_some()).then(|| {
        hash_struct(
            "ObjectMeta",
            &[("Labels", labels), ("Annotations", annotations)],
        )
    });
    let spec = &t.spec;
    let r = &spec.node_class_ref;
    let node_class_ref = hash_struct(
        "NodeClassReference",
        &[
            ("Kind", non_empty_str(&r.kind)),
            ("Name", non_empty_str(&r.name)),
            ("Group", non_empty_str(&r.group)),
        ],
    );
    // metav1.Duration{Duration}: a set pointer is hashed even when the duration is zero.
    let tgp = spec
        .termination_grace_period
        .as_deref()
        .and_then(parse_go_duration)
        .map(|ns| hash_struct("Duration", &[("Duration", (ns != 0).then(|| hash_i64(ns)))]));
    // NillableDuration{Duration *time.Duration, Raw (ignored)}: "Never" is the zero value.
    let expire_after = spec
        .expire_after
        .as_deref()
        .filter(|s| *s != "Never")
        .and_then(parse_go_duration)
        .map(|ns| hash_struct("NillableDuration", &[("Duration", Some(hash_i64(ns)))]));
    let spec_hash = hash_struct(
        "NodeClaimTemplateSpec",
        &[
            ("Taints", hash_taints(spec.taints.as_ref())),
            ("StartupTaints", hash_taints(spec.startup_taints.as_ref())),
            ("NodeClassRef", Some(node_class_ref)),
            ("TerminationGracePeriod", tgp),
            ("ExpireAfter", expire_after),
        ],
    );
    hash_struct(
        "NodeClaimTemplate",
        &[("ObjectMeta", object_meta), ("Spec", Some(spec_hash))],
    )
}

/// Go's `time.ParseDuration` (one parser for every duration: `crate::api::duration`).
pub use crate::api::duration::go as parse_go_duration;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::karpenter::{NodeClaimTemplate, NodeClaimTemplateSpec, NodeClassRef};

    fn template() -> NodeClaimTemplate {
        NodeClaimTemplate {
            metadata: Default::default(),
            spec: NodeClaimTemplateSpec {
                node_class_ref: NodeClassRef {
                    group: "karpenter.dklesev.github.io".into(),
                    kind: "SSHNodeClass".into(),
                    name: "default".into(),
                },
                expire_after: Some("720h".into()),
                ..Default::default()
            },
        }
    }

    #[test]
    fn fnv1_is_gos_new64() {
        // hash/fnv New64 of "" and "a" (FNV-1, not FNV-1a).
        assert_eq!(fnv1(b""), 0xcbf29ce484222325);
        assert_eq!(fnv1(b"a"), 0xaf63bd4c8601b7be);
    }

    #[test]
    fn s60_a_fixed_template_hashes_as_core_does() {
        // Core's NodePool.Hash() of this template (sigs.k8s.io/karpenter v1.14.1, from the
        // oracle in tests/oracle/).
        let mut t = template();
        t.metadata.labels = Some(BTreeMap::from([("team".to_string(), "a".to_string())]));
        t.spec.taints = Some(vec![Taint {
            key: "k".into(),
            value: Some("v".into()),
            effect: "NoSchedule".into(),
            time_added: None,
        }]);
        t.spec.termination_grace_period = Some("1h".into());
        assert_eq!(template_hash(&t), 6097226699073503930);
    }

    #[test]
    fn s50_requirements_do_not_change_the_hash_and_taints_are_a_set() {
        let base = template_hash(&template());
        let mut t = template();
        t.spec.requirements = vec![crate::api::karpenter::NodeSelectorRequirement {
            key: "kubernetes.io/arch".into(),
            operator: "In".into(),
            values: vec!["amd64".into()],
            min_values: None,
        }];
        assert_eq!(template_hash(&t), base);
        let taint = |k: &str| Taint {
            key: k.into(),
            effect: "NoSchedule".into(),
            ..Default::default()
        };
        t.spec.taints = Some(vec![taint("a"), taint("b")]);
        let ab = template_hash(&t);
        assert_ne!(ab, base);
        t.spec.taints = Some(vec![taint("b"), taint("a")]);
        assert_eq!(template_hash(&t), ab);
    }

    #[test]
    fn s60_absent_and_empty_maps_and_taints_hash_apart_as_in_core() {
        // Core's NodePool.Hash() (sigs.k8s.io/karpenter v1.14.1, the oracle in tests/oracle/)
        // of one template with nothing set, `labels: {}`, `taints: []` and `startupTaints: []`.
        let from = |v: serde_json::Value| -> NodeClaimTemplate {
            serde_json::from_value(v).expect("template")
        };
        let r = serde_json::json!({"group": "g", "kind": "K", "name": "n"});
        let bare = from(serde_json::json!({"spec": {"nodeClassRef": r}}));
        assert_eq!(template_hash(&bare), 12798397565595811573);
        let labels =
            from(serde_json::json!({"metadata": {"labels": {}}, "spec": {"nodeClassRef": r}}));
        assert_eq!(template_hash(&labels), 6662946317224488719);
        let taints = from(serde_json::json!({"spec": {"taints": [], "nodeClassRef": r}}));
        assert_eq!(template_hash(&taints), 11274702407591943674);
        let startup = from(
            serde_json::json!({"metadata": {}, "spec": {"startupTaints": [], "nodeClassRef": r}}),
        );
        assert_eq!(template_hash(&startup), 966314777948304921);
    }

    #[test]
    fn s60_drift_abstains_on_another_hash_version() {
        let mut nc = crate::sim::world::node_claim("nc", "pool", "1", "1Gi");
        let ann = |h: &str, v: Option<&str>| {
            let mut a = BTreeMap::from([(NODEPOOL_HASH_ANNOTATION.to_string(), h.to_string())]);
            if let Some(v) = v {
                a.insert(NODEPOOL_HASH_VERSION_ANNOTATION.into(), v.into());
            }
            Some(a)
        };
        nc.metadata.annotations = ann("1", Some("v3"));
        assert!(drifted(&nc, "2"));
        assert!(!drifted(&nc, "1"));
        nc.metadata.annotations = ann("1", Some("v2"));
        assert!(!drifted(&nc, "2"), "another version is not compared");
        nc.metadata.annotations = ann("1", None);
        assert!(!drifted(&nc, "2"), "no version is not compared");
    }
}
