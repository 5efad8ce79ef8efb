//! Node selector requirements (In, NotIn, Exists, DoesNotExist, Gt, Lt, Gte, Lte).
//!
//! Two layers: [`matches`] / [`all_match`] check a label set against requirements as the
//! kube-scheduler does; [`Requirements`] is Karpenter core's `scheduling.Requirements`
//! (sigs.k8s.io/karpenter v1.14.1) — per key a value set or its complement with integer
//! bounds — with core's `Compatible` and `Intersects` (S60). The oracle test
//! `tests/oracles/requirements.rs` compares both with core's on generated requirements.

use std::collections::{BTreeMap, BTreeSet};

use crate::api::karpenter::NodeSelectorRequirement;

/// Whether `labels` satisfy one requirement. Unknown operators never match (fail closed).
pub fn matches(req: &NodeSelectorRequirement, labels: &BTreeMap<String, String>) -> bool {
    let value = labels.get(&req.key);
    match req.operator.as_str() {
        "In" => value.is_some_and(|v| req.values.contains(v)),
        "NotIn" => value.is_none_or(|v| !req.values.contains(v)),
        "Exists" => value.is_some(),
        "DoesNotExist" => value.is_none(),
        // Gte and Lte are Karpenter's own (upstream's CRDs admit them in NodePools).
        "Gt" | "Lt" | "Gte" | "Lte" => {
            let (Some(v), Some(bound)) = (
                value.and_then(|v| v.parse::<i64>().ok()),
                req.values.first().and_then(|b| b.parse::<i64>().ok()),
            ) else {
                return false;
            };
            match req.operator.as_str() {
                "Gt" => v > bound,
                "Lt" => v < bound,
                "Gte" => v >= bound,
                _ => v <= bound,
            }
        }
        _ => false,
    }
}

pub fn all_match(reqs: &[NodeSelectorRequirement], labels: &BTreeMap<String, String>) -> bool {
    reqs.iter().all(|r| matches(r, labels))
}

/// Labels Karpenter knows and narrows by NodePool or pod: undefined on one side they are
/// allowed with [`Requirements::compatible_allowing_well_known`] (core's `WellKnownLabels`).
pub const WELL_KNOWN_LABELS: [&str; 8] = [
    "karpenter.sh/nodepool",
    "topology.kubernetes.io/zone",
    "topology.kubernetes.io/region",
    "node.kubernetes.io/instance-type",
    "kubernetes.io/arch",
    "kubernetes.io/os",
    "karpenter.sh/capacity-type",
    "node.kubernetes.io/windows-build",
];

/// Deprecated label keys and the keys core reads them as (core's `NormalizedLabels`).
pub const NORMALIZED_LABELS: [(&str, &str); 5] = [
    (
        "failure-domain.beta.kubernetes.io/zone",
        "topology.kubernetes.io/zone",
    ),
    ("beta.kubernetes.io/arch", "kubernetes.io/arch"),
    ("beta.kubernetes.io/os", "kubernetes.io/os"),
    (
        "beta.kubernetes.io/instance-type",
        "node.kubernetes.io/instance-type",
    ),
    (
        "failure-domain.beta.kubernetes.io/region",
        "topology.kubernetes.io/region",
    ),
];

/// The operator a [`Requirement`] reads as (bounds are an `Exists`/`NotIn` with limits).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Operator {
    In,
    NotIn,
    Exists,
    DoesNotExist,
}

/// One key's allowed values: `values` (or, with `complement`, everything but them), within the
/// inclusive integer bounds `gte` / `lte` (`Gt n` is `Gte n+1`, `Lt n` is `Lte n-1`).
/// `minValues` is kept but plays no part in compatibility.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Requirement {
    pub key: String,
    complement: bool,
    values: BTreeSet<String>,
    gte: Option<i64>,
    lte: Option<i64>,
    pub min_values: Option<i64>,
}

/// Go's `strconv.Atoi` as core uses it: out of range saturates, anything else that is not a
/// decimal integer is an error.
fn atoi(s: &str) -> Result<i64, i64> {
    let digits = s.strip_prefix(['+', '-']).unwrap_or(s);
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return Err(0);
    }
    s.parse::<i64>().map_err(|_| {
        if s.starts_with('-') {
            i64::MIN
        } else {
            i64::MAX
        }
    })
}

/// Core ignores the parse error of a bound (the API validated it): a bad bound reads as 0, an
/// out-of-range one saturates.
fn bound(values: &[String]) -> i64 {
    values
        .first()
        .map(|v| atoi(v).unwrap_or_else(|e| e))
        .unwrap_or(0)
}

fn within_bounds(value: &str, gte: Option<i64>, lte: Option<i64>) -> bool {
    if gte.is_none() && lte.is_none() {
        return true;
    }
    let Ok(v) = atoi(value) else {
        return false;
    };
    gte.is_none_or(|g| v >= g) && lte.is_none_or(|l| v <= l)
}

impl Requirement {
    /// From a node selector requirement: the key is normalized (deprecated aliases), unknown
    /// operators read as `Exists`, as in core.
    pub fn new(key: &str, operator: &str, values: &[String], min_values: Option<i64>) -> Self {
        let key = NORMALIZED_LABELS
            .iter()
            .find(|(from, _)| *from == key)
            .map_or(key, |(_, to)| to)
            .to_string();
        let mut r = Requirement {
            key,
            complement: !matches!(operator, "In" | "DoesNotExist"),
            values: BTreeSet::new(),
            gte: None,
            lte: None,
            min_values,
        };
        match operator {
            "In" | "NotIn" => r.values = values.iter().cloned().collect(),
            "Gt" => {
                let v = bound(values);
                if v == i64::MAX {
                    // Gt MaxInt matches nothing.
                    return Requirement::new(&r.key, "DoesNotExist", &[], None);
                }
                r.gte = Some(v + 1);
            }
            // Go's int arithmetic wraps.
            "Lt" => r.lte = Some(bound(values).wrapping_sub(1)),
            "Gte" => r.gte = Some(bound(values)),
            "Lte" => r.lte = Some(bound(values)),
            _ => {}
        }
        r
    }

    /// Exactly `values`.
    pub fn one_of(key: &str, values: impl IntoIterator<Item = String>) -> Self {
        let values: Vec<String> = values.into_iter().collect();
        Requirement::new(key, "In", &values, None)
    }

    /// The concrete values (In); empty for a complement (NotIn, Exists) or DoesNotExist.
    pub fn values(&self) -> impl Iterator<Item = &String> {
        self.values.iter().filter(|_| !self.complement)
    }

    /// How many values are allowed: `None` when unbounded (a complement).
    #[allow(clippy::len_without_is_empty)]
    pub fn len(&self) -> Option<usize> {
        (!self.complement).then_some(self.values.len())
    }

    /// A node without the label satisfies it (`NotIn` without bounds, `DoesNotExist`), as the
    /// kube-scheduler matches node affinity.
    pub fn allows_absent(&self) -> bool {
        match self.operator() {
            Operator::DoesNotExist => true,
            Operator::NotIn => self.gte.is_none() && self.lte.is_none(),
            _ => false,
        }
    }

    /// Core's `Any()`: one allowed value, to label a node with. `In`: the smallest value (core
    /// takes an arbitrary one); `NotIn`/`Exists`: the smallest non-negative integer within
    /// the bounds that is not excluded (core draws a random one); `DoesNotExist`: none.
    pub fn any(&self) -> Option<String> {
        if !self.complement {
            return self.values.iter().next().cloned();
        }
        let lo = self.gte.unwrap_or(0).max(0);
        let hi = self.lte.unwrap_or(i64::MAX);
        let mut v = lo;
        while v <= hi {
            let s = v.to_string();
            if !self.values.contains(&s) {
                return Some(s);
            }
            v = v.checked_add(1)?;
        }
        None
    }

    /// As a node selector requirement (bounds as `Gt`/`Lt`; a complement with values and
    /// bounds keeps only its bounds' meaning plus the excluded values as a second entry).
    pub fn to_node_selector(&self) -> Vec<NodeSelectorRequirement> {
        let mv = self.min_values.and_then(|m| i32::try_from(m).ok());
        let req = |op: &str, values: Vec<String>| NodeSelectorRequirement {
            key: self.key.clone(),
            operator: op.into(),
            values,
            min_values: mv,
        };
        let values: Vec<String> = self.values.iter().cloned().collect();
        if !self.complement {
            return vec![if values.is_empty() {
                req("DoesNotExist", vec![])
            } else {
                req("In", values)
            }];
        }
        let mut out = vec![];
        if let Some(g) = self.gte {
            // Upstream's schema wants a non-negative bound: `Gt -1` is written `Gte 0`.
            out.push(if g >= 1 {
                req("Gt", vec![(g - 1).to_string()])
            } else {
                req("Gte", vec![g.max(0).to_string()])
            });
        }
        if let Some(l) = self.lte {
            out.push(req("Lt", vec![l.saturating_add(1).to_string()]));
        }
        if !values.is_empty() {
            out.push(req("NotIn", values));
        } else if out.is_empty() {
            out.push(req("Exists", vec![]));
        }
        out
    }

    /// Any value allowed.
    pub fn exists(key: &str) -> Self {
        Requirement::new(key, "Exists", &[], None)
    }

    pub fn operator(&self) -> Operator {
        match (self.complement, self.values.is_empty()) {
            (true, false) => Operator::NotIn,
            (true, true) => Operator::Exists,
            (false, false) => Operator::In,
            (false, true) => Operator::DoesNotExist,
        }
    }

    /// Whether `value` is allowed.
    pub fn has(&self, value: &str) -> bool {
        self.values.contains(value) != self.complement && within_bounds(value, self.gte, self.lte)
    }

    /// Whether some value is allowed by both.
    pub fn has_intersection(&self, other: &Requirement) -> bool {
        let gte = max_opt(self.gte, other.gte);
        let lte = min_opt(self.lte, other.lte);
        if let (Some(g), Some(l)) = (gte, lte)
            && g > l
        {
            return false;
        }
        match (self.complement, other.complement) {
            (true, true) => true,
            (true, false) => other
                .values
                .iter()
                .any(|v| !self.values.contains(v) && within_bounds(v, gte, lte)),
            (false, true) => self
                .values
                .iter()
                .any(|v| !other.values.contains(v) && within_bounds(v, gte, lte)),
            (false, false) => self
                .values
                .iter()
                .any(|v| other.values.contains(v) && within_bounds(v, gte, lte)),
        }
    }

    /// The values allowed by both.
    pub fn intersection(&self, other: &Requirement) -> Requirement {
        let complement = self.complement && other.complement;
        let mut gte = max_opt(self.gte, other.gte);
        let mut lte = min_opt(self.lte, other.lte);
        let min_values = max_opt(self.min_values, other.min_values);
        if let (Some(g), Some(l)) = (gte, lte)
            && g > l
        {
            return Requirement {
                min_values,
                ..Requirement::new(&self.key, "DoesNotExist", &[], None)
            };
        }
        let mut values: BTreeSet<String> = match (self.complement, other.complement) {
            (true, true) => self.values.union(&other.values).cloned().collect(),
            (true, false) => other.values.difference(&self.values).cloned().collect(),
            (false, true) => self.values.difference(&other.values).cloned().collect(),
            (false, false) => self.values.intersection(&other.values).cloned().collect(),
        };
        values.retain(|v| within_bounds(v, gte, lte));
        if !complement {
            (gte, lte) = (None, None);
        }
        Requirement {
            key: self.key.clone(),
            complement,
            values,
            gte,
            lte,
            min_values,
        }
    }
}

fn max_opt(a: Option<i64>, b: Option<i64>) -> Option<i64> {
    match (a, b) {
        (Some(x), Some(y)) => Some(x.max(y)),
        (x, None) | (None, x) => x,
    }
}

fn min_opt(a: Option<i64>, b: Option<i64>) -> Option<i64> {
    match (a, b) {
        (Some(x), Some(y)) => Some(x.min(y)),
        (x, None) | (None, x) => x,
    }
}

/// Requirements by key (core's `scheduling.Requirements`); a key given twice is the
/// intersection of both.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Requirements(BTreeMap<String, Requirement>);

impl Requirements {
    pub fn from_node_selector(reqs: &[NodeSelectorRequirement]) -> Self {
        let mut out = Requirements::default();
        for r in reqs {
            out.add(Requirement::new(
                &r.key,
                &r.operator,
                &r.values,
                r.min_values.map(i64::from),
            ));
        }
        out
    }

    /// A node's labels: each key `In` its one value.
    pub fn from_labels(labels: &BTreeMap<String, String>) -> Self {
        let mut out = Requirements::default();
        for (k, v) in labels {
            out.add(Requirement::new(k, "In", std::slice::from_ref(v), None));
        }
        out
    }

    pub fn add(&mut self, r: Requirement) {
        let merged = match self.0.get(&r.key) {
            Some(existing) => r.intersection(existing),
            None => r,
        };
        self.0.insert(merged.key.clone(), merged);
    }

    pub fn has(&self, key: &str) -> bool {
        self.0.contains_key(key)
    }

    /// The requirement on `key`, if defined (no copy).
    pub fn get_ref(&self, key: &str) -> Option<&Requirement> {
        self.0.get(key)
    }

    pub fn iter(&self) -> impl Iterator<Item = &Requirement> {
        self.0.values()
    }

    /// Some requirement asks for `minValues`.
    pub fn has_min_values(&self) -> bool {
        self.0.values().any(|r| r.min_values.is_some())
    }

    /// Back to node selector requirements (by key).
    pub fn to_node_selector(&self) -> Vec<NodeSelectorRequirement> {
        self.0
            .values()
            .flat_map(Requirement::to_node_selector)
            .collect()
    }

    /// [`Requirements::compatible`] where keys for which `undefined_ok` holds may be undefined
    /// here (core's `AllowUndefinedWellKnownLabels` with the provider's own label keys).
    pub fn compatible_allowing(
        &self,
        incoming: &Requirements,
        undefined_ok: impl Fn(&str) -> bool,
    ) -> Result<(), String> {
        for (key, r) in &incoming.0 {
            if undefined_ok(key)
                || self.has(key)
                || matches!(r.operator(), Operator::NotIn | Operator::DoesNotExist)
            {
                continue;
            }
            return Err(format!("label {key:?} does not have known values"));
        }
        self.intersects(incoming)
    }

    /// The requirement on `key`; an undefined key allows anything.
    pub fn get(&self, key: &str) -> Requirement {
        self.0
            .get(key)
            .cloned()
            .unwrap_or_else(|| Requirement::exists(key))
    }

    /// Core's `Compatible`: every key `incoming` requires must be defined here (unless
    /// `incoming` only excludes values: NotIn, DoesNotExist), and the keys both define must
    /// intersect. `Err` names the first key that fails.
    pub fn compatible(&self, incoming: &Requirements) -> Result<(), String> {
        self.compatible_with(incoming, &[])
    }

    /// [`Requirements::compatible`] where the well-known labels may be undefined here (core's
    /// `AllowUndefinedWellKnownLabels`: instance types against a NodeClaim).
    pub fn compatible_allowing_well_known(&self, incoming: &Requirements) -> Result<(), String> {
        self.compatible_with(incoming, &WELL_KNOWN_LABELS)
    }

    fn compatible_with(
        &self,
        incoming: &Requirements,
        allow_undefined: &[&str],
    ) -> Result<(), String> {
        for (key, r) in &incoming.0 {
            if allow_undefined.contains(&key.as_str())
                || self.has(key)
                || matches!(r.operator(), Operator::NotIn | Operator::DoesNotExist)
            {
                continue;
            }
            return Err(format!("label {key:?} does not have known values"));
        }
        self.intersects(incoming)
    }

    /// Core's `Intersects`: every key both define allows a common value, or both only exclude
    /// values. Undefined keys are allowed. `Err` names the keys that fail.
    pub fn intersects(&self, incoming: &Requirements) -> Result<(), String> {
        let failing: Vec<&str> = self
            .0
            .iter()
            .filter_map(|(key, existing)| {
                let theirs = incoming.0.get(key)?;
                let excluding = |r: &Requirement| {
                    matches!(r.operator(), Operator::NotIn | Operator::DoesNotExist)
                };
                let ok =
                    existing.has_intersection(theirs) || (excluding(theirs) && excluding(existing));
                (!ok).then_some(key.as_str())
            })
            .collect();
        if failing.is_empty() {
            Ok(())
        } else {
            Err(format!("no common values for {}", failing.join(", ")))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(key: &str, op: &str, values: &[&str]) -> NodeSelectorRequirement {
        NodeSelectorRequirement {
            key: key.into(),
            operator: op.into(),
            values: values.iter().map(|v| v.to_string()).collect(),
            min_values: None,
        }
    }

    #[test]
    fn operators_follow_kubernetes_semantics() {
        let labels = BTreeMap::from([
            ("a".to_string(), "x".to_string()),
            ("n".to_string(), "5".to_string()),
        ]);
        assert!(matches(&req("a", "In", &["x", "y"]), &labels));
        assert!(!matches(&req("a", "In", &["y"]), &labels));
        assert!(matches(&req("a", "NotIn", &["y"]), &labels));
        assert!(matches(&req("missing", "NotIn", &["y"]), &labels));
        assert!(matches(&req("a", "Exists", &[]), &labels));
        assert!(matches(&req("missing", "DoesNotExist", &[]), &labels));
        assert!(matches(&req("n", "Gt", &["4"]), &labels));
        assert!(!matches(&req("n", "Lt", &["5"]), &labels));
        assert!(
            !matches(&req("a", "Gt", &["1"]), &labels),
            "non-numeric never matches Gt"
        );
        assert!(!matches(&req("a", "Banana", &["x"]), &labels));
    }

    /// S55: core's `Any()` (a value to label a node with) and the way back to node selector
    /// requirements, as a NodeClaim carries them.
    #[test]
    fn any_value_and_node_selector_form() {
        let r = |k: &str, op: &str, v: &[&str]| {
            Requirement::new(
                k,
                op,
                &v.iter().map(|s| s.to_string()).collect::<Vec<_>>(),
                None,
            )
        };
        assert_eq!(r("a", "In", &["y", "x"]).any().as_deref(), Some("x"));
        assert_eq!(r("a", "Exists", &[]).any().as_deref(), Some("0"));
        assert_eq!(r("a", "Gt", &["3"]).any().as_deref(), Some("4"));
        assert_eq!(r("a", "NotIn", &["0", "1"]).any().as_deref(), Some("2"));
        assert_eq!(
            r("a", "Lt", &["0"]).any(),
            None,
            "no non-negative value below 0"
        );
        assert_eq!(r("a", "DoesNotExist", &[]).any(), None);
        let both = r("a", "Gt", &["3"]).intersection(&r("a", "Lt", &["9"]));
        let ns = both.to_node_selector();
        assert_eq!(
            ns.iter()
                .map(|n| (n.operator.as_str(), n.values.clone()))
                .collect::<Vec<_>>(),
            [("Gt", vec!["3".to_string()]), ("Lt", vec!["9".to_string()])]
        );
        let ge0 = r("a", "Gte", &["0"]).to_node_selector();
        assert_eq!(
            (ge0[0].operator.as_str(), ge0[0].values.clone()),
            ("Gte", vec!["0".to_string()])
        );
        assert!(r("a", "NotIn", &["x"]).allows_absent());
        assert!(!r("a", "Exists", &[]).allows_absent());
        assert!(!r("a", "Gt", &["1"]).allows_absent());
        assert_eq!(
            r("a", "In", &[]).to_node_selector()[0].operator,
            "DoesNotExist"
        );
    }

    /// Karpenter's Gte and Lte (admitted by upstream's CRDs) match as the bounds they are:
    /// a host whose label equals the bound is taken, not refused as by an unknown operator.
    #[test]
    fn gte_and_lte_include_the_bound() {
        let labels = BTreeMap::from([("n".to_string(), "5".to_string())]);
        assert!(matches(&req("n", "Gte", &["5"]), &labels));
        assert!(!matches(&req("n", "Gte", &["6"]), &labels));
        assert!(matches(&req("n", "Lte", &["5"]), &labels));
        assert!(!matches(&req("n", "Lte", &["4"]), &labels));
        assert!(!matches(&req("missing", "Gte", &["0"]), &labels));
    }
}
