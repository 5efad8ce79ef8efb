//! The `KPSSH_*` environment contract.
//!
//! | name | install / uninstall | join | leave |
//! |---|---|---|---|
//! | `KPSSH_CLUSTER_ENDPOINT`, `KPSSH_CLUSTER_CA_B64`, `KPSSH_NODE_NAME`, `KPSSH_PROVIDER_ID`, `KPSSH_NODE_LABELS`, `KPSSH_TAINTS` | set | set | exported, empty |
//! | `KPSSH_BOOTSTRAP_TOKEN` | exported, empty | set | exported, empty |
//! | `KPSSH_HOST_ADDRESS`, `KPSSH_NODE_ADDRESS` | set | set | set |
//! | `KPSSH_VAR_<key>`, `KPSSH_SECRET_<KEY>` | set | set | absent |
//!
//! `KPSSH_PROVIDER_ID` is empty in Adopt mode (the caller passes an empty provider ID).

use std::collections::BTreeMap;
use std::fmt;

use super::phase::{Phase, PhaseContext, Taint};
use crate::secret::Secret;

pub const CLUSTER_ENDPOINT: &str = "KPSSH_CLUSTER_ENDPOINT";
pub const CLUSTER_CA_B64: &str = "KPSSH_CLUSTER_CA_B64";
pub const BOOTSTRAP_TOKEN: &str = "KPSSH_BOOTSTRAP_TOKEN";
pub const NODE_NAME: &str = "KPSSH_NODE_NAME";
pub const PROVIDER_ID: &str = "KPSSH_PROVIDER_ID";
pub const NODE_LABELS: &str = "KPSSH_NODE_LABELS";
pub const TAINTS: &str = "KPSSH_TAINTS";
pub const HOST_ADDRESS: &str = "KPSSH_HOST_ADDRESS";
pub const NODE_ADDRESS: &str = "KPSSH_NODE_ADDRESS";
pub const VAR_PREFIX: &str = "KPSSH_VAR_";
pub const SECRET_PREFIX: &str = "KPSSH_SECRET_";

/// The taint every joining kubelet registers with (karpenter's registration contract); always
/// first in `KPSSH_TAINTS`.
pub const UNREGISTERED_TAINT: &str = "karpenter.sh/unregistered:NoExecute";

/// One environment value: plain, or secret (never shown by `Debug`).
#[derive(Clone, PartialEq, Eq)]
pub enum EnvValue {
    Plain(String),
    Secret(Secret),
}

impl EnvValue {
    /// The value as it goes to the host.
    pub fn expose(&self) -> &str {
        match self {
            EnvValue::Plain(s) => s,
            EnvValue::Secret(s) => s.expose(),
        }
    }

    pub fn is_secret(&self) -> bool {
        matches!(self, EnvValue::Secret(_))
    }
}

impl fmt::Debug for EnvValue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            EnvValue::Plain(s) => write!(f, "{s:?}"),
            EnvValue::Secret(_) => f.write_str("<redacted>"),
        }
    }
}

/// The environment of one phase, sorted by name.
pub type Env = BTreeMap<String, EnvValue>;

/// Why an environment could not be built. Messages name keys, never values.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EnvError {
    #[error("environment name {name:?} is not a shell identifier (^[A-Za-z_][A-Za-z0-9_]*$)")]
    InvalidName { name: String },
    #[error("the value of {name} contains a NUL byte")]
    NulInValue { name: String },
    #[error("secret keys {first:?} and {second:?} both map to {name}")]
    SecretCollision {
        first: String,
        second: String,
        name: String,
    },
    #[error("node label {key:?} cannot be passed to the kubelet: {reason}")]
    BadLabel { key: String, reason: &'static str },
    #[error("taint {key:?} cannot be passed to the kubelet: {reason}")]
    BadTaint { key: String, reason: &'static str },
}

/// `^[A-Za-z_][A-Za-z0-9_]*$`.
pub fn is_valid_env_name(name: &str) -> bool {
    let mut b = name.bytes();
    matches!(b.next(), Some(c) if c.is_ascii_alphabetic() || c == b'_')
        && b.all(|c| c.is_ascii_alphanumeric() || c == b'_')
}

/// `KPSSH_SECRET_<KEY>`: the Secret data key upper-cased, `-` and `.` replaced by `_`.
pub fn secret_env_name(key: &str) -> String {
    let mapped: String = key
        .chars()
        .map(|c| match c {
            '-' | '.' => '_',
            c => c.to_ascii_uppercase(),
        })
        .collect();
    format!("{SECRET_PREFIX}{mapped}")
}

/// `KPSSH_VAR_<key>` (the key as written in the node class).
pub fn var_env_name(key: &str) -> String {
    format!("{VAR_PREFIX}{key}")
}

const KUBELET_LABELS: &[&str] = &[
    "kubernetes.io/hostname",
    "kubernetes.io/arch",
    "kubernetes.io/os",
    "beta.kubernetes.io/arch",
    "beta.kubernetes.io/os",
    "beta.kubernetes.io/instance-type",
    "node.kubernetes.io/instance-type",
    "topology.kubernetes.io/region",
    "topology.kubernetes.io/zone",
    "failure-domain.beta.kubernetes.io/region",
    "failure-domain.beta.kubernetes.io/zone",
];

fn in_namespace(ns: &str, base: &str) -> bool {
    ns == base || ns.strip_suffix(base).is_some_and(|p| p.ends_with('.'))
}

/// Whether a kubelet may set this label on its own Node (`--node-labels`): the kubelet's own
/// rule — the well-known set above, the `kubelet.kubernetes.io` and `node.kubernetes.io`
/// namespaces (and their subdomains), and anything outside the `kubernetes.io` / `k8s.io`
/// namespaces. A kubelet refuses to start with any other `kubernetes.io`/`k8s.io` label.
pub fn kubelet_may_set_label(key: &str) -> bool {
    if KUBELET_LABELS.contains(&key) {
        return true;
    }
    let ns = key.split_once('/').map(|(p, _)| p).unwrap_or("");
    if in_namespace(ns, "kubelet.kubernetes.io") || in_namespace(ns, "node.kubernetes.io") {
        return true;
    }
    !(in_namespace(ns, "kubernetes.io") || in_namespace(ns, "k8s.io"))
}

/// `KPSSH_NODE_LABELS`: the labels a kubelet may set on itself, `k=v`, sorted, comma-joined.
/// The others still reach the Node: karpenter core syncs all NodeClaim labels at registration.
pub fn node_labels_value(labels: &BTreeMap<String, String>) -> Result<String, EnvError> {
    let mut out = Vec::new();
    for (k, v) in labels {
        if !kubelet_may_set_label(k) {
            continue;
        }
        let bad = |reason| EnvError::BadLabel {
            key: k.clone(),
            reason,
        };
        if k.is_empty() {
            return Err(bad("empty key"));
        }
        if k.contains([',', '=']) || k.chars().any(char::is_whitespace) {
            return Err(bad("the key contains ',', '=' or whitespace"));
        }
        if v.contains(',') || v.chars().any(char::is_whitespace) {
            return Err(bad("the value contains ',' or whitespace"));
        }
        out.push(format!("{k}={v}"));
    }
    Ok(out.join(","))
}

/// `KPSSH_TAINTS`: `karpenter.sh/unregistered:NoExecute` first, then the NodeClaim's taints in
/// their order (`key=value:Effect`, or `key:Effect` without a value), comma-joined. A NodeClaim
/// taint equal to the unregistered taint is not repeated.
pub fn taints_value(taints: &[Taint]) -> Result<String, EnvError> {
    let mut out = vec![UNREGISTERED_TAINT.to_string()];
    for t in taints {
        let bad = |reason| EnvError::BadTaint {
            key: t.key.clone(),
            reason,
        };
        if t.key.is_empty() {
            return Err(bad("empty key"));
        }
        if t.key.contains([',', '=', ':']) || t.key.chars().any(char::is_whitespace) {
            return Err(bad("the key contains ',', '=', ':' or whitespace"));
        }
        if t.value.contains([',', ':']) || t.value.chars().any(char::is_whitespace) {
            return Err(bad("the value contains ',', ':' or whitespace"));
        }
        if !matches!(
            t.effect.as_str(),
            "NoSchedule" | "PreferNoSchedule" | "NoExecute"
        ) {
            return Err(bad(
                "effect is not NoSchedule, PreferNoSchedule or NoExecute",
            ));
        }
        let s = if t.value.is_empty() {
            format!("{}:{}", t.key, t.effect)
        } else {
            format!("{}={}:{}", t.key, t.value, t.effect)
        };
        if s != UNREGISTERED_TAINT && !out.contains(&s) {
            out.push(s);
        }
    }
    Ok(out.join(","))
}

fn insert(env: &mut Env, name: String, value: EnvValue) -> Result<(), EnvError> {
    if !is_valid_env_name(&name) {
        return Err(EnvError::InvalidName { name });
    }
    if value.expose().contains('\0') {
        return Err(EnvError::NulInValue { name });
    }
    env.insert(name, value);
    Ok(())
}

/// The environment of `phase`. `leave` gets only the two address variables: the other fixed
/// names are exported empty and `KPSSH_VAR_*`/`KPSSH_SECRET_*` are absent. The bootstrap token is
/// set for `join` only.
pub fn build_env(phase: Phase, ctx: &PhaseContext) -> Result<Env, EnvError> {
    let mut env = Env::new();
    let full = phase != Phase::Leave;
    let plain = |s: &str| EnvValue::Plain(if full { s.to_string() } else { String::new() });
    let (labels, taints) = if full {
        (
            node_labels_value(&ctx.node_labels)?,
            taints_value(&ctx.taints)?,
        )
    } else {
        (String::new(), String::new())
    };
    insert(
        &mut env,
        CLUSTER_ENDPOINT.into(),
        plain(&ctx.cluster_endpoint),
    )?;
    insert(&mut env, CLUSTER_CA_B64.into(), plain(&ctx.cluster_ca_b64))?;
    let token = match (&ctx.bootstrap_token, phase) {
        (Some(t), Phase::Join) => EnvValue::Secret(t.clone()),
        _ => EnvValue::Plain(String::new()),
    };
    insert(&mut env, BOOTSTRAP_TOKEN.into(), token)?;
    insert(&mut env, NODE_NAME.into(), plain(&ctx.node_name))?;
    insert(&mut env, PROVIDER_ID.into(), plain(&ctx.provider_id))?;
    insert(&mut env, NODE_LABELS.into(), EnvValue::Plain(labels))?;
    insert(&mut env, TAINTS.into(), EnvValue::Plain(taints))?;
    insert(
        &mut env,
        HOST_ADDRESS.into(),
        EnvValue::Plain(ctx.host_address.clone()),
    )?;
    insert(
        &mut env,
        NODE_ADDRESS.into(),
        EnvValue::Plain(ctx.node_address.clone()),
    )?;
    if !full {
        return Ok(env);
    }
    for (k, v) in &ctx.vars {
        insert(&mut env, var_env_name(k), EnvValue::Plain(v.clone()))?;
    }
    let mut seen: BTreeMap<String, &str> = BTreeMap::new();
    for (k, v) in &ctx.secrets {
        let name = secret_env_name(k);
        if let Some(first) = seen.get(&name) {
            return Err(EnvError::SecretCollision {
                first: first.to_string(),
                second: k.clone(),
                name,
            });
        }
        if !is_valid_env_name(&name) {
            return Err(EnvError::InvalidName { name });
        }
        seen.insert(name.clone(), k);
        insert(&mut env, name, EnvValue::Secret(v.clone()))?;
    }
    Ok(env)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ctx() -> PhaseContext {
        let mut c = PhaseContext {
            cluster_endpoint: "https://10.0.0.1:6443".into(),
            cluster_ca_b64: "Q0EK".into(),
            bootstrap_token: Some(Secret::new("abcdef.0123456789abcdef")),
            node_name: "default-x7k2p".into(),
            provider_id: "kpssh://kpssh-system/h1".into(),
            host_address: "192.0.2.10".into(),
            node_address: "10.1.0.10".into(),
            ..Default::default()
        };
        c.node_labels
            .insert("karpenter.sh/nodepool".into(), "default".into());
        c.node_labels
            .insert("kubernetes.io/arch".into(), "amd64".into());
        c.node_labels
            .insert("node-role.kubernetes.io/worker".into(), "".into());
        c.taints.push(Taint {
            key: "dedicated".into(),
            value: "gpu".into(),
            effect: "NoSchedule".into(),
        });
        c.vars.insert("k8sMinor".into(), "1.34".into());
        c.secrets
            .insert("activation-id".into(), Secret::new("act-id-1234"));
        c
    }

    #[test]
    fn join_env_carries_everything() {
        // S14
        let env = build_env(Phase::Join, &ctx()).unwrap();
        let get = |n: &str| env.get(n).map(|v| v.expose().to_string());
        assert_eq!(
            get(BOOTSTRAP_TOKEN).as_deref(),
            Some("abcdef.0123456789abcdef")
        );
        assert!(env[BOOTSTRAP_TOKEN].is_secret());
        assert_eq!(get(PROVIDER_ID).as_deref(), Some("kpssh://kpssh-system/h1"));
        assert_eq!(get(NODE_NAME).as_deref(), Some("default-x7k2p"));
        assert_eq!(
            get(NODE_LABELS).as_deref(),
            Some("karpenter.sh/nodepool=default,kubernetes.io/arch=amd64")
        );
        assert_eq!(
            get(TAINTS).as_deref(),
            Some("karpenter.sh/unregistered:NoExecute,dedicated=gpu:NoSchedule")
        );
        assert_eq!(
            get(CLUSTER_ENDPOINT).as_deref(),
            Some("https://10.0.0.1:6443")
        );
        assert_eq!(get(CLUSTER_CA_B64).as_deref(), Some("Q0EK"));
        assert_eq!(get("KPSSH_VAR_k8sMinor").as_deref(), Some("1.34"));
        assert_eq!(
            get("KPSSH_SECRET_ACTIVATION_ID").as_deref(),
            Some("act-id-1234")
        );
        assert!(env["KPSSH_SECRET_ACTIVATION_ID"].is_secret());
        assert_eq!(get(HOST_ADDRESS).as_deref(), Some("192.0.2.10"));
        assert_eq!(get(NODE_ADDRESS).as_deref(), Some("10.1.0.10"));
    }

    #[test]
    fn adopt_mode_provider_id_is_empty() {
        // S21
        let mut c = ctx();
        c.provider_id.clear();
        let env = build_env(Phase::Join, &c).unwrap();
        assert_eq!(env[PROVIDER_ID].expose(), "");
    }

    #[test]
    fn install_has_no_token() {
        let env = build_env(Phase::Install, &ctx()).unwrap();
        assert_eq!(env[BOOTSTRAP_TOKEN].expose(), "");
        assert_eq!(env["KPSSH_VAR_k8sMinor"].expose(), "1.34");
        assert_eq!(env[CLUSTER_ENDPOINT].expose(), "https://10.0.0.1:6443");
    }

    #[test]
    fn leave_gets_only_the_addresses() {
        let env = build_env(Phase::Leave, &ctx()).unwrap();
        let names: Vec<&str> = env.keys().map(String::as_str).collect();
        assert_eq!(
            names,
            vec![
                BOOTSTRAP_TOKEN,
                CLUSTER_CA_B64,
                CLUSTER_ENDPOINT,
                HOST_ADDRESS,
                NODE_ADDRESS,
                NODE_LABELS,
                NODE_NAME,
                PROVIDER_ID,
                TAINTS,
            ]
        );
        for (k, v) in &env {
            match k.as_str() {
                HOST_ADDRESS => assert_eq!(v.expose(), "192.0.2.10"),
                NODE_ADDRESS => assert_eq!(v.expose(), "10.1.0.10"),
                _ => assert_eq!(v.expose(), "", "{k}"),
            }
        }
    }

    #[test]
    fn kubelet_label_rules() {
        // S14
        for ok in [
            "kubernetes.io/hostname",
            "kubernetes.io/arch",
            "kubernetes.io/os",
            "beta.kubernetes.io/arch",
            "beta.kubernetes.io/os",
            "beta.kubernetes.io/instance-type",
            "node.kubernetes.io/instance-type",
            "topology.kubernetes.io/region",
            "topology.kubernetes.io/zone",
            "failure-domain.beta.kubernetes.io/zone",
            "failure-domain.beta.kubernetes.io/region",
            "kubelet.kubernetes.io/anything",
            "x.kubelet.kubernetes.io/anything",
            "node.kubernetes.io/whatever",
            "foo.node.kubernetes.io/whatever",
            "karpenter.sh/nodepool",
            "karpenter.sh/capacity-type",
            "karpenter.dklesev.github.io/host-class",
            "plain",
            "example.com/team",
            "notkubernetes.io/x",
        ] {
            assert!(kubelet_may_set_label(ok), "{ok}");
        }
        for no in [
            "node-role.kubernetes.io/worker",
            "kubernetes.io/role",
            "beta.kubernetes.io/fluentd-ds-ready",
            "topology.kubernetes.io/rack",
            "k8s.io/x",
            "example.k8s.io/x",
            "karpenter.k8s.io/x",
            "failure-domain.beta.kubernetes.io/other",
        ] {
            assert!(!kubelet_may_set_label(no), "{no}");
        }
    }

    #[test]
    fn labels_sorted_and_validated() {
        let mut l = BTreeMap::new();
        l.insert("z".to_string(), "1".to_string());
        l.insert("a".to_string(), "2".to_string());
        assert_eq!(node_labels_value(&l).unwrap(), "a=2,z=1");
        l.insert("b".to_string(), "x,y".to_string());
        assert!(matches!(
            node_labels_value(&l),
            Err(EnvError::BadLabel { .. })
        ));
        assert_eq!(node_labels_value(&BTreeMap::new()).unwrap(), "");
    }

    #[test]
    fn taints_unregistered_first_no_duplicate() {
        // S14
        let t = |k: &str, v: &str, e: &str| Taint {
            key: k.into(),
            value: v.into(),
            effect: e.into(),
        };
        assert_eq!(taints_value(&[]).unwrap(), UNREGISTERED_TAINT);
        assert_eq!(
            taints_value(&[
                t("a", "", "NoExecute"),
                t("karpenter.sh/unregistered", "", "NoExecute"),
                t("b", "v", "PreferNoSchedule"),
            ])
            .unwrap(),
            "karpenter.sh/unregistered:NoExecute,a:NoExecute,b=v:PreferNoSchedule"
        );
        assert!(taints_value(&[t("a", "", "Sometimes")]).is_err());
        assert!(taints_value(&[t("a:b", "", "NoSchedule")]).is_err());
        assert!(taints_value(&[t("a", "x,y", "NoSchedule")]).is_err());
    }

    #[test]
    fn secret_names_are_mapped_and_collisions_name_both_keys() {
        // S18
        assert_eq!(secret_env_name("activationId"), "KPSSH_SECRET_ACTIVATIONID");
        assert_eq!(secret_env_name("a-b.c"), "KPSSH_SECRET_A_B_C");
        let mut c = ctx();
        c.secrets.insert("a-b".into(), Secret::new("value-one-1"));
        c.secrets.insert("a.b".into(), Secret::new("value-two-2"));
        let e = build_env(Phase::Join, &c).unwrap_err();
        assert_eq!(
            e,
            EnvError::SecretCollision {
                first: "a-b".into(),
                second: "a.b".into(),
                name: "KPSSH_SECRET_A_B".into()
            }
        );
        let msg = e.to_string();
        assert!(msg.contains("\"a-b\"") && msg.contains("\"a.b\""), "{msg}");
        assert!(!msg.contains("value-"), "{msg}");
        // A collision matters only where secrets are exported.
        assert!(build_env(Phase::Leave, &c).is_ok());
    }

    #[test]
    fn names_are_validated() {
        // S35
        assert!(is_valid_env_name("KPSSH_VAR_k8sMinor"));
        assert!(is_valid_env_name("_x1"));
        for bad in ["", "1x", "a-b", "a b", "a=b", "ä", "a.b", "$x"] {
            assert!(!is_valid_env_name(bad), "{bad:?}");
        }
        let mut c = ctx();
        c.vars.insert("bad-key".into(), "v".into());
        assert_eq!(
            build_env(Phase::Join, &c).unwrap_err(),
            EnvError::InvalidName {
                name: "KPSSH_VAR_bad-key".into()
            }
        );
        let mut c = ctx();
        c.secrets
            .insert("has space".into(), Secret::new("whatever-123"));
        assert!(matches!(
            build_env(Phase::Join, &c),
            Err(EnvError::InvalidName { .. })
        ));
    }

    #[test]
    fn nul_values_are_rejected_without_echoing_them() {
        // S35
        let mut c = ctx();
        c.secrets
            .insert("tok".into(), Secret::new("secret\0value-xyz"));
        let e = build_env(Phase::Join, &c).unwrap_err();
        assert_eq!(
            e,
            EnvError::NulInValue {
                name: "KPSSH_SECRET_TOK".into()
            }
        );
        assert!(!e.to_string().contains("value-xyz"));
        let mut c = ctx();
        c.node_name = "a\0b".into();
        assert!(build_env(Phase::Join, &c).is_err());
    }

    #[test]
    fn debug_hides_secret_values() {
        let env = build_env(Phase::Join, &ctx()).unwrap();
        let d = format!("{env:?}");
        assert!(
            !d.contains("0123456789abcdef") && !d.contains("act-id-1234"),
            "{d}"
        );
        assert!(d.contains("1.34"));
    }
}
