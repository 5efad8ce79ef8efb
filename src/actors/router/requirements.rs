//! Node selector requirements (In, NotIn, Exists, DoesNotExist, Gt, Lt) against a label set.

use std::collections::BTreeMap;

use crate::api::karpenter::NodeSelectorRequirement;

/// Whether `labels` satisfy one requirement. Unknown operators never match (fail closed).
pub fn matches(req: &NodeSelectorRequirement, labels: &BTreeMap<String, String>) -> bool {
    let value = labels.get(&req.key);
    match req.operator.as_str() {
        "In" => value.is_some_and(|v| req.values.contains(v)),
        "NotIn" => value.is_none_or(|v| !req.values.contains(v)),
        "Exists" => value.is_some(),
        "DoesNotExist" => value.is_none(),
        "Gt" | "Lt" => {
            let (Some(v), Some(bound)) = (
                value.and_then(|v| v.parse::<i64>().ok()),
                req.values.first().and_then(|b| b.parse::<i64>().ok()),
            ) else {
                return false;
            };
            if req.operator == "Gt" {
                v > bound
            } else {
                v < bound
            }
        }
        _ => false,
    }
}

pub fn all_match(reqs: &[NodeSelectorRequirement], labels: &BTreeMap<String, String>) -> bool {
    reqs.iter().all(|r| matches(r, labels))
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
}
