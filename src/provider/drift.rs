//! Drift (S30): what makes a claimed node out of date with its node class or profile.

use base64::Engine as _;
use sha2::{Digest, Sha256};

use crate::api::nodeclass::{ProviderIdSource, SSHNodeClassSpec};
use crate::api::{
    NODECLASS_HASH_ANNOTATION, NODECLASS_HASH_VERSION, NODECLASS_HASH_VERSION_ANNOTATION, NodeClaim,
};

/// The Go provider's `JoinHash` (annotation `karpenter.dklesev.github.io/nodeclass-hash`,
/// version `v1`): the first 8 bytes, hex, of SHA-256 over Go's `json.Marshal` of the node class
/// fields that change how a host joins — `vars`, `joinSecretRef`, `providerIDSource`,
/// `cluster` (`endpoint`, `caBundle` as the base64 of its bytes), in that order, each
/// omitted when empty. Price, selector, kubeReserved, maxPods and gates never drift. Equal to
/// the Go provider's on the same object (oracle test `tests/oracles/joinhash.rs`), so a
/// NodeClaim it stamped is not drifted by kpssh.
pub fn nodeclass_hash(spec: &SSHNodeClassSpec) -> String {
    let digest = Sha256::digest(join_hash_json(spec).as_bytes());
    digest.iter().take(8).map(|b| format!("{b:02x}")).collect()
}

/// The JSON text Go's `json.Marshal` writes for the hashed struct.
fn join_hash_json(spec: &SSHNodeClassSpec) -> String {
    let mut fields: Vec<String> = Vec::new();
    if let Some(vars) = spec.vars.as_ref().filter(|v| !v.is_empty()) {
        // A BTreeMap iterates in byte order of its keys, as Go sorts map keys.
        let entries: Vec<String> = vars
            .iter()
            .map(|(k, v)| format!("{}:{}", go_json_string(k), go_json_string(v)))
            .collect();
        fields.push(format!("\"vars\":{{{}}}", entries.join(",")));
    }
    if let Some(r) = &spec.join_secret_ref {
        // corev1.LocalObjectReference: `name,omitempty`.
        let inner = if r.name.is_empty() {
            String::new()
        } else {
            format!("\"name\":{}", go_json_string(&r.name))
        };
        fields.push(format!("\"joinSecretRef\":{{{inner}}}"));
    }
    // Never empty here: the CRD defaults it to Static and kpssh reads a missing one as Static.
    let source = match spec.provider_id_source {
        ProviderIdSource::Static => "Static",
        ProviderIdSource::Adopt => "Adopt",
    };
    fields.push(format!("\"providerIDSource\":{}", go_json_string(source)));
    if let Some(c) = &spec.cluster {
        let mut inner = format!("\"endpoint\":{}", go_json_string(&c.endpoint));
        if let Some(ca) = c.ca_bundle.as_deref().map(canonical_base64)
            && !ca.is_empty()
        {
            inner.push_str(&format!(",\"caBundle\":{}", go_json_string(&ca)));
        }
        fields.push(format!("\"cluster\":{{{inner}}}"));
    }
    format!("{{{}}}", fields.join(","))
}

/// `caBundle` is `[]byte` on the Go side: its JSON string is decoded (standard alphabet,
/// padded, newlines skipped, trailing bits allowed — Go's `base64.StdEncoding`) and encoded
/// again. Text Go could not decode never reaches the Go provider (the API rejects it); it is
/// hashed as written.
fn canonical_base64(text: &str) -> String {
    const GO_STD: base64::engine::GeneralPurpose = base64::engine::GeneralPurpose::new(
        &base64::alphabet::STANDARD,
        base64::engine::GeneralPurposeConfig::new().with_decode_allow_trailing_bits(true),
    );
    let compact: String = text.chars().filter(|c| !matches!(c, '\r' | '\n')).collect();
    match GO_STD.decode(compact.as_bytes()) {
        Ok(bytes) => GO_STD.encode(bytes),
        Err(_) => text.to_string(),
    }
}

/// A JSON string as Go's `encoding/json` writes it: besides `"` and `\\`, it escapes `<`, `>`,
/// `&`, U+2028 and U+2029, writes `\b \f \n \r \t` short and other control characters as
/// `\u00xx`.
pub(crate) fn go_json_string(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '<' | '>' | '&' | '\u{2028}' | '\u{2029}' => {
                out.push_str(&format!("\\u{:04x}", u32::from(c)));
            }
            c if u32::from(c) < 0x20 => out.push_str(&format!("\\u{:04x}", u32::from(c))),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Drift {
    /// The host's install marker is not the class's current `<profile>@<version>`.
    Profile,
    /// The NodeClaim's nodeclass-hash annotation (v1) differs from the class's hash.
    NodeClass,
}

impl Drift {
    pub fn reason(self) -> &'static str {
        match self {
            Drift::Profile => "ProfileDrift",
            Drift::NodeClass => "NodeClassDrift",
        }
    }
}

/// Drift of a NodeClaim against its class and the host's marker.
pub fn drift(
    claim: &NodeClaim,
    class: &SSHNodeClassSpec,
    host_marker: Option<&str>,
    profile_marker: &str,
) -> Option<Drift> {
    if host_marker.is_some_and(|m| m != profile_marker) {
        return Some(Drift::Profile);
    }
    let ann = claim.metadata.annotations.as_ref()?;
    if ann
        .get(NODECLASS_HASH_VERSION_ANNOTATION)
        .map(String::as_str)
        != Some(NODECLASS_HASH_VERSION)
    {
        return None;
    }
    let hash = ann.get(NODECLASS_HASH_ANNOTATION)?;
    (hash != &nodeclass_hash(class)).then_some(Drift::NodeClass)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::host::SecretRef;
    use crate::sim::world::{node_claim, node_class};
    use std::collections::BTreeMap;

    fn stamped(class: &SSHNodeClassSpec) -> NodeClaim {
        let mut nc = node_claim("nc", "pool", "1", "1Gi");
        nc.metadata.annotations = Some(BTreeMap::from([
            (NODECLASS_HASH_ANNOTATION.to_string(), nodeclass_hash(class)),
            (
                NODECLASS_HASH_VERSION_ANNOTATION.to_string(),
                NODECLASS_HASH_VERSION.to_string(),
            ),
        ]));
        nc
    }

    #[test]
    fn s30_profile_and_nodeclass_drift() {
        let class = node_class("pool", "p").spec;
        let nc = stamped(&class);
        assert_eq!(drift(&nc, &class, Some("p@1"), "p@1"), None);
        assert_eq!(drift(&nc, &class, Some("p@1"), "p@2"), Some(Drift::Profile));
        let mut vars = class.clone();
        vars.vars = Some(BTreeMap::from([("k".to_string(), "v".to_string())]));
        assert_eq!(
            drift(&nc, &vars, Some("p@1"), "p@1"),
            Some(Drift::NodeClass)
        );
        let mut secret = class.clone();
        secret.join_secret_ref = Some(SecretRef {
            name: "activation".into(),
        });
        assert_eq!(
            drift(&nc, &secret, Some("p@1"), "p@1"),
            Some(Drift::NodeClass)
        );
    }

    #[test]
    fn s60_a_fixed_class_hashes_as_the_go_provider_does() {
        // The Go provider's JoinHash of this spec (from the oracle in tests/oracle/).
        let spec: SSHNodeClassSpec = serde_json::from_value(serde_json::json!({
            "joinProfileRef": {"name": "p"},
            "vars": {"b": "<&>\u{2028}", "a": "x"},
            "joinSecretRef": {"name": "activation"},
            "providerIDSource": "Adopt",
            "cluster": {"endpoint": "https://10.0.0.5:6443", "caBundle": "Y2E="},
        }))
        .unwrap();
        assert_eq!(nodeclass_hash(&spec), "d2e5519405bb1b9e");
        assert_eq!(
            go_json_string("<a href=\"x\">&\u{2028}\u{1}\u{8}"),
            r#""\u003ca href=\"x\"\u003e\u0026\u2028\u0001\b""#
        );
    }

    #[test]
    fn s30_price_selector_reserved_maxpods_gates_never_drift() {
        let class = node_class("pool", "p").spec;
        let nc = stamped(&class);
        let mut other = class.clone();
        other.price_per_cpu_hour = "9.99".into();
        other.max_pods = 12;
        other.kube_reserved.clear();
        other.host_selector = Some(Default::default());
        other.startup_taint_gates = Some(vec![]);
        assert_eq!(drift(&nc, &other, Some("p@1"), "p@1"), None);
        let mut old_version = nc.clone();
        if let Some(a) = old_version.metadata.annotations.as_mut() {
            a.insert(NODECLASS_HASH_VERSION_ANNOTATION.into(), "v0".into());
        }
        let mut vars = class.clone();
        vars.vars = Some(BTreeMap::from([("k".to_string(), "v".to_string())]));
        assert_eq!(
            drift(&old_version, &vars, Some("p@1"), "p@1"),
            None,
            "another hash version is not compared"
        );
    }
}
