//! Template data values.

use std::collections::BTreeMap;

use crate::secret::Secret;

/// A value in the template data.
#[derive(Clone, Debug)]
pub enum Value {
    Nil,
    Bool(bool),
    Int(i64),
    /// A float64 constant (`1.5`, `1e3`).
    Float(f64),
    /// A complex128 constant (`1i`, `1+2i`): real and imaginary part.
    Complex(f64, f64),
    /// A byte: what `index` yields on a string (Go's `uint8`).
    Uint8(u8),
    Str(String),
    /// Renders as its value; never appears in `Debug` output or error texts.
    Secret(Secret),
    /// A Go string that is not valid UTF-8: what `slice` leaves when it cuts a character.
    Bytes(RawStr),
    List(Vec<Value>),
    Map(BTreeMap<String, Value>),
    /// A nil Go map (`Vars`/`Secrets` the Go provider left unset): empty everywhere, but equal
    /// to `nil` in `eq`.
    NilMap,
    /// The top-level data: behaves like the Go provider's `*profile.Context` (fields in its
    /// order; unknown field = error, not indexable, not rangeable). Built by
    /// [`ContextData::into_value`].
    Root(Vec<(String, Value)>),
}

/// The bytes of a [`Value::Bytes`]; `Debug` shows only their number (they may be part of a
/// secret).
#[derive(Clone, PartialEq, Eq)]
pub struct RawStr(pub Vec<u8>);

impl std::fmt::Debug for RawStr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "RawStr({} bytes)", self.0.len())
    }
}

/// The template data, field for field the Go provider's `profile.Context` (its
/// `internal/profile/profile.go`): profiles written for it see the same names, the same
/// values and print the same way. `vars` and `secrets` are `None` where Go's maps are nil.
#[derive(Clone, Debug, Default)]
pub struct ContextData {
    pub cluster_endpoint: String,
    pub cluster_ca_cert: String,
    pub bootstrap_token: Secret,
    pub node_name: String,
    pub provider_id: String,
    pub node_labels: String,
    pub register_with_taints: String,
    pub host_address: String,
    pub node_address: String,
    pub vars: Option<BTreeMap<String, String>>,
    pub secrets: Option<BTreeMap<String, Secret>>,
}

impl ContextData {
    /// The root value templates render against.
    pub fn into_value(self) -> Value {
        let s = |v: String| Value::Str(v);
        let vars = match self.vars {
            Some(m) => Value::Map(m.into_iter().map(|(k, v)| (k, Value::Str(v))).collect()),
            None => Value::NilMap,
        };
        let secrets = match self.secrets {
            Some(m) => Value::Map(m.into_iter().map(|(k, v)| (k, Value::Secret(v))).collect()),
            None => Value::NilMap,
        };
        Value::Root(vec![
            ("ClusterEndpoint".into(), s(self.cluster_endpoint)),
            ("ClusterCACert".into(), s(self.cluster_ca_cert)),
            ("BootstrapToken".into(), Value::Secret(self.bootstrap_token)),
            ("NodeName".into(), s(self.node_name)),
            ("ProviderID".into(), s(self.provider_id)),
            ("NodeLabels".into(), s(self.node_labels)),
            ("RegisterWithTaints".into(), s(self.register_with_taints)),
            ("HostAddress".into(), s(self.host_address)),
            ("NodeAddress".into(), s(self.node_address)),
            ("Vars".into(), vars),
            ("Secrets".into(), secrets),
        ])
    }
}

impl Value {
    pub(super) fn type_name(&self) -> &'static str {
        match self {
            Value::Nil => "nil",
            Value::Bool(_) => "bool",
            Value::Int(_) => "int",
            Value::Float(_) => "float64",
            Value::Complex(..) => "complex128",
            Value::Uint8(_) => "uint8",
            Value::Str(_) | Value::Secret(_) | Value::Bytes(_) => "string",
            Value::List(_) => "list",
            Value::Map(_) | Value::NilMap => "map",
            Value::Root(_) => "*profile.Context",
        }
    }

    /// A Go string's bytes (strings, secrets, cut strings).
    pub(super) fn as_bytes(&self) -> Option<&[u8]> {
        match self {
            Value::Str(s) => Some(s.as_bytes()),
            Value::Secret(s) => Some(s.expose().as_bytes()),
            Value::Bytes(b) => Some(&b.0),
            _ => None,
        }
    }

    /// A Go string from bytes: a `Str` when they are UTF-8, else `Bytes`.
    pub(super) fn from_bytes(b: Vec<u8>) -> Value {
        match String::from_utf8(b) {
            Ok(s) => Value::Str(s),
            Err(e) => Value::Bytes(RawStr(e.into_bytes())),
        }
    }

    /// Go's notion of truth: false, 0, "", nil and empty collections are false.
    pub(super) fn truthy(&self) -> bool {
        match self {
            Value::Nil => false,
            Value::Bool(b) => *b,
            Value::Int(i) => *i != 0,
            Value::Float(f) => *f != 0.0,
            Value::Complex(re, im) => *re != 0.0 || *im != 0.0,
            Value::Uint8(b) => *b != 0,
            Value::Str(s) => !s.is_empty(),
            Value::Secret(s) => !s.is_empty(),
            Value::Bytes(b) => !b.0.is_empty(),
            Value::List(l) => !l.is_empty(),
            Value::Map(m) => !m.is_empty(),
            Value::NilMap => false,
            Value::Root(_) => true,
        }
    }
}

impl From<&str> for Value {
    fn from(s: &str) -> Self {
        Value::Str(s.to_string())
    }
}

impl From<String> for Value {
    fn from(s: String) -> Self {
        Value::Str(s)
    }
}
