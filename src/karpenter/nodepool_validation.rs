//! Runtime validation of a NodePool: what its CRD cannot check, as core's
//! `NodePool.RuntimeValidate` (sigs.k8s.io/karpenter v1.14.1, `pkg/apis/v1/nodepool_validation.go`
//! and `nodeclaim_validation.go`) — template labels, taints and requirements — plus what kpssh
//! must be able to read: its durations. A NodePool that fails is `ValidationSucceeded=False`
//! (and so not Ready), and provisioning skips it, telling the pods why.
//!
//! Upstream's CRDs (`kpssh crds --karpenter`) reject most of this at admission; these checks
//! catch what an older or hand-written CRD let in, and the rules only a controller applies
//! (label syntax, well-known values, duplicate taints).

use std::collections::BTreeSet;

use crate::api::NodePool;
use crate::api::karpenter::{CAPACITY_TYPE_LABEL, NODEPOOL_LABEL, NodeSelectorRequirement};
use crate::api::requirements::{NORMALIZED_LABELS, WELL_KNOWN_LABELS};
use k8s_openapi::api::core::v1::Taint;

/// Operators a NodePool requirement may use (core's `SupportedNodeSelectorOps`).
pub const SUPPORTED_OPERATORS: [&str; 8] = [
    "In",
    "NotIn",
    "Exists",
    "DoesNotExist",
    "Gt",
    "Lt",
    "Gte",
    "Lte",
];

/// Core's `RestrictedLabelDomains` (`karpenter.sh` and its subdomains) and `RestrictedLabels`.
const RESTRICTED_DOMAIN: &str = "karpenter.sh";
const RESTRICTED_LABELS: [&str; 1] = ["kubernetes.io/hostname"];

/// Every problem of `pool`, each naming the field and the value; empty when it is valid.
pub fn validate(pool: &NodePool) -> Vec<String> {
    let mut errs = vec![];
    let t = &pool.spec.template;
    for (key, value) in t.metadata.labels() {
        if key == NODEPOOL_LABEL {
            errs.push(format!("invalid key name {key:?} in labels, restricted"));
        }
        for e in qualified_name(key) {
            errs.push(format!("invalid key name {key:?} in labels, {e:?}"));
        }
        for e in label_value(value) {
            errs.push(format!("invalid value: {value} for label[{key}], {e}"));
        }
        if let Some(e) = restricted_label(key) {
            errs.push(format!("invalid key name {key:?} in labels, {e}"));
        }
    }
    let mut seen = BTreeSet::new();
    for (field, taints) in [
        ("taints", t.spec.taints()),
        ("startupTaints", t.spec.startup_taints()),
    ] {
        validate_taints(field, taints, &mut seen, &mut errs);
    }
    for r in &t.spec.requirements {
        for e in requirement(r) {
            errs.push(format!("invalid value: {e} in requirements, restricted"));
        }
        if r.key == NODEPOOL_LABEL {
            errs.push(format!(
                "invalid key: {:?} in requirements, restricted",
                r.key
            ));
        }
    }
    // kpssh: durations it cannot read are errors, never 0 or "never" (upstream's patterns
    // reject them at admission).
    let durations = [
        (
            "spec.disruption.consolidateAfter",
            pool.spec.disruption.consolidate_after.as_deref(),
            true,
        ),
        (
            "spec.template.spec.expireAfter",
            t.spec.expire_after.as_deref(),
            true,
        ),
        (
            "spec.template.spec.terminationGracePeriod",
            t.spec.termination_grace_period.as_deref(),
            false,
        ),
    ];
    for (field, value, never_ok) in durations {
        if let Some(v) = value
            && !(never_ok && v == "Never")
            && super::termination::parse_duration(v).is_none()
        {
            let allowed = if never_ok { " (or Never)" } else { "" };
            errs.push(format!(
                "{field}: {v:?} is not a duration of s, m and h units like 30s, 5m or 1h30m{allowed}"
            ));
        }
    }
    for (i, b) in pool.spec.disruption.budgets.iter().enumerate() {
        if let Some(d) = &b.duration
            && super::termination::parse_duration(d).is_none()
        {
            errs.push(format!(
                "spec.disruption.budgets[{i}].duration: {d:?} is not a duration of h and m units like 1h30m"
            ));
        }
    }
    errs
}

fn validate_taints(
    field: &str,
    taints: &[Taint],
    seen: &mut BTreeSet<(String, String)>,
    errs: &mut Vec<String>,
) {
    for taint in taints {
        if taint.key.is_empty() {
            errs.push(format!("invalid value: empty taint key in {field}"));
        }
        for e in qualified_name(&taint.key) {
            errs.push(format!("invalid value: {e} in {field}"));
        }
        if let Some(v) = taint.value.as_deref().filter(|v| !v.is_empty()) {
            for e in qualified_name(v) {
                errs.push(format!("invalid value: {e} in {field}"));
            }
        }
        if !matches!(
            taint.effect.as_str(),
            "NoSchedule" | "PreferNoSchedule" | "NoExecute" | ""
        ) {
            errs.push(format!("invalid value: {:?} in {field}", taint.effect));
        }
        if !seen.insert((taint.key.clone(), taint.effect.clone())) {
            errs.push(format!(
                "duplicate taint Key/Effect pair {}={}",
                taint.key, taint.effect
            ));
        }
    }
}

/// Core's `ValidateRequirement`: what is wrong with one requirement.
pub fn requirement(r: &NodeSelectorRequirement) -> Vec<String> {
    let mut errs = vec![];
    let key = NORMALIZED_LABELS
        .iter()
        .find(|(from, _)| *from == r.key)
        .map_or(r.key.as_str(), |(_, to)| to);
    let op = r.operator.as_str();
    if !SUPPORTED_OPERATORS.contains(&op) {
        errs.push(format!(
            "key {key} has an unsupported operator {op} not in {}",
            SUPPORTED_OPERATORS.join(", ")
        ));
    }
    if let Some(e) = restricted_label(key) {
        errs.push(e);
    }
    if let Some(e) = well_known_values(key, r) {
        errs.push(e);
    }
    for e in qualified_name(key) {
        errs.push(format!("key {key} is not a qualified name, {e}"));
    }
    for v in &r.values {
        for e in label_value(v) {
            errs.push(format!("invalid value {v} for key {key}, {e}"));
        }
    }
    if op == "In" && r.values.is_empty() {
        errs.push(format!(
            "key {key} with operator {op} must have a value defined"
        ));
    }
    if op == "In"
        && r.min_values
            .is_some_and(|m| (r.values.len() as i64) < i64::from(m))
    {
        errs.push(format!(
            "key {key} with operator {op} must have at least minimum number of values defined in 'values' field"
        ));
    }
    if matches!(op, "Gt" | "Lt" | "Gte" | "Lte")
        && !(r.values.len() == 1 && r.values[0].parse::<i64>().is_ok_and(|v| v >= 0))
    {
        errs.push(format!(
            "key {key} with operator {op} must have a single positive integer value"
        ));
    }
    errs
}

/// Core's `IsRestrictedLabel`.
fn restricted_label(key: &str) -> Option<String> {
    if WELL_KNOWN_LABELS.contains(&key) {
        return None;
    }
    let domain = key.split_once('/').map_or("", |(d, _)| d);
    let restricted = domain == RESTRICTED_DOMAIN
        || domain.ends_with(&format!(".{RESTRICTED_DOMAIN}"))
        || RESTRICTED_LABELS.contains(&key);
    restricted.then(|| {
        format!(
            "using label {key} is not allowed as it might interfere with the internal provisioning logic; specify a well known label: {}, or a custom label that does not use a restricted domain: [{RESTRICTED_DOMAIN}]",
            WELL_KNOWN_LABELS.join(", ")
        )
    })
}

/// Core's `validateWellKnownValues`: an `In` on a label with known values names at least one
/// (and `minValues` of them). The only such label is the capacity type.
fn well_known_values(key: &str, r: &NodeSelectorRequirement) -> Option<String> {
    const CAPACITY_TYPES: [&str; 3] = ["on-demand", "spot", "reserved"];
    if key != CAPACITY_TYPE_LABEL || r.operator != "In" {
        return None;
    }
    let valid = r
        .values
        .iter()
        .filter(|v| CAPACITY_TYPES.contains(&v.as_str()))
        .count();
    if valid == 0 {
        return Some(format!(
            "no valid values found in {:?} for {key}, expected one of: {CAPACITY_TYPES:?}",
            r.values
        ));
    }
    if r.min_values.is_some_and(|m| (valid as i64) < i64::from(m)) {
        return Some(format!(
            "not enough valid values found in {:?} for {key}, expected at least {} valid values from: {CAPACITY_TYPES:?}",
            r.values,
            r.min_values.unwrap_or_default()
        ));
    }
    None
}

/// Kubernetes' `IsQualifiedName`: `[prefix/]name`, the prefix a DNS subdomain, the name at most
/// 63 alphanumerics, `-`, `_`, `.`, starting and ending alphanumeric.
pub fn qualified_name(value: &str) -> Vec<String> {
    let mut errs = vec![];
    let parts: Vec<&str> = value.split('/').collect();
    let name = match parts.as_slice() {
        [name] => *name,
        [prefix, name] => {
            if prefix.is_empty() {
                errs.push("prefix part must be non-empty".to_string());
            } else if !dns_subdomain(prefix) {
                errs.push(format!(
                    "prefix part {prefix:?} must be a lowercase RFC 1123 subdomain"
                ));
            }
            name
        }
        _ => {
            return vec![format!(
                "{value:?}: a qualified name must consist of alphanumeric characters, '-', '_' or '.', with an optional DNS subdomain prefix and '/'"
            )];
        }
    };
    if name.is_empty() {
        errs.push("name part must be non-empty".to_string());
    } else if name.len() > 63 {
        errs.push("name part must be no more than 63 characters".to_string());
    } else if !label_text(name) {
        errs.push(format!(
            "name part {name:?} must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character"
        ));
    }
    errs
}

/// Kubernetes' `IsValidLabelValue`: empty, or at most 63 characters of [`label_text`].
pub fn label_value(value: &str) -> Vec<String> {
    let mut errs = vec![];
    if value.len() > 63 {
        errs.push("must be no more than 63 characters".to_string());
    }
    if !value.is_empty() && !label_text(value) {
        errs.push("a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character".to_string());
    }
    errs
}

fn label_text(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b[0].is_ascii_alphanumeric()
        && b[b.len() - 1].is_ascii_alphanumeric()
        && b.iter()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'-' | b'_' | b'.'))
}

fn dns_subdomain(s: &str) -> bool {
    s.len() <= 253
        && s.split('.').all(|l| {
            let b = l.as_bytes();
            !b.is_empty()
                && b.len() <= 63
                && b[0].is_ascii_alphanumeric()
                && b[b.len() - 1].is_ascii_alphanumeric()
                && b.iter()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pool(yaml: &str) -> NodePool {
        let base = format!(
            "apiVersion: karpenter.sh/v1\nkind: NodePool\nmetadata: {{name: p}}\nspec:\n  template:\n    spec:\n      nodeClassRef: {{group: karpenter.dklesev.github.io, kind: SSHNodeClass, name: c}}\n{yaml}"
        );
        serde_yaml::from_str(&base).expect("pool")
    }

    #[test]
    fn the_shipped_example_is_valid() {
        let text = include_str!("../../examples/nodepool.yaml");
        let p: NodePool = serde_yaml::from_str(text).expect("example");
        assert_eq!(validate(&p), Vec::<String>::new());
    }

    #[test]
    fn unknown_operators_and_bad_requirements_are_named() {
        let p = pool(
            "      requirements:\n      - {key: kubernetes.io/arch, operator: Equals, values: [amd64]}\n      - {key: cores, operator: Gt, values: [\"-1\"]}\n      - {key: karpenter.sh/custom, operator: Exists}\n      - {key: karpenter.sh/nodepool, operator: In, values: [x]}\n      - {key: zone, operator: In, values: []}\n      - {key: karpenter.sh/capacity-type, operator: In, values: [preemptible]}\n      - {key: cores, operator: Gte, values: [\"4\"]}",
        );
        let errs = validate(&p).join("\n");
        assert!(errs.contains("unsupported operator Equals"), "{errs}");
        assert!(
            errs.contains("operator Gt must have a single positive integer"),
            "{errs}"
        );
        assert!(
            errs.contains("using label karpenter.sh/custom is not allowed"),
            "{errs}"
        );
        assert!(
            errs.contains("\"karpenter.sh/nodepool\" in requirements, restricted"),
            "{errs}"
        );
        assert!(
            errs.contains("key zone with operator In must have a value defined"),
            "{errs}"
        );
        assert!(
            errs.contains("no valid values found in [\"preemptible\"]"),
            "{errs}"
        );
        assert!(!errs.contains("operator Gte"), "Gte is supported: {errs}");
        // `-1` is also not a label value (as in core, two errors for that requirement).
        assert!(errs.contains("invalid value -1 for key cores"), "{errs}");
        assert_eq!(validate(&p).len(), 7, "{errs}");
    }

    #[test]
    fn unparsable_durations_are_errors_never_zero_or_never() {
        let p = pool(
            "      expireAfter: 30d\n      terminationGracePeriod: Never\n  disruption:\n    consolidateAfter: 5min\n    budgets: [{nodes: \"1\", schedule: \"@daily\", duration: 2days}]",
        );
        let errs = validate(&p);
        let text = errs.join("\n");
        assert_eq!(errs.len(), 4, "{text}");
        for field in [
            "consolidateAfter: \"5min\"",
            "expireAfter: \"30d\"",
            "terminationGracePeriod: \"Never\"",
            "budgets[0].duration: \"2days\"",
        ] {
            assert!(text.contains(field), "{field}: {text}");
        }
        let ok = pool(
            "      expireAfter: Never\n      terminationGracePeriod: 1h30m\n  disruption:\n    consolidateAfter: Never",
        );
        assert_eq!(validate(&ok), Vec::<String>::new());
    }

    #[test]
    fn labels_and_taints_follow_kubernetes_syntax() {
        let p = pool(
            "      taints: [{key: a, effect: NoSchedule}, {key: \"bad key\", effect: Sometimes}]\n      startupTaints: [{key: a, effect: NoSchedule}]\n    metadata:\n      labels: {\"Team/x\": ok, karpenter.sh/nodepool: p, good: \"-bad-\"}",
        );
        let text = validate(&p).join("\n");
        for needle in [
            "invalid key name \"Team/x\" in labels",
            "must be a lowercase RFC 1123 subdomain",
            "\"karpenter.sh/nodepool\" in labels, restricted",
            "invalid value: -bad- for label[good]",
            "invalid value: \"Sometimes\" in taints",
            "name part \"bad key\" must consist",
            "duplicate taint Key/Effect pair a=NoSchedule",
        ] {
            assert!(text.contains(needle), "{needle}: {text}");
        }
    }

    #[test]
    fn qualified_names() {
        assert!(qualified_name("kubernetes.io/arch").is_empty());
        assert!(qualified_name("a").is_empty());
        assert!(!qualified_name("a/b/c").is_empty());
        assert!(!qualified_name("/b").is_empty());
        assert!(!qualified_name(&"x".repeat(64)).is_empty());
        assert!(label_value("").is_empty());
        assert!(!label_value("a b").is_empty());
    }
}
