//! Template data values.

use std::collections::BTreeMap;

use crate::secret::Secret;

/// A value in the template data.
#[derive(Clone, Debug)]
pub enum Value {
    Nil,
    Bool(bool),
    Int(i64),
    Str(String),
    /// Renders as its value; never appears in `Debug` output or error texts.
    Secret(Secret),
    List(Vec<Value>),
    Map(BTreeMap<String, Value>),
    /// The top-level data: behaves like a Go struct (unknown field = error, not indexable,
    /// not rangeable, not printable).
    Root(BTreeMap<String, Value>),
}

impl Value {
    pub(super) fn type_name(&self) -> &'static str {
        match self {
            Value::Nil => "nil",
            Value::Bool(_) => "bool",
            Value::Int(_) => "int",
            Value::Str(_) | Value::Secret(_) => "string",
            Value::List(_) => "list",
            Value::Map(_) => "map",
            Value::Root(_) => "context",
        }
    }

    pub(super) fn as_str(&self) -> Option<&str> {
        match self {
            Value::Str(s) => Some(s),
            Value::Secret(s) => Some(s.expose()),
            _ => None,
        }
    }

    /// Go's notion of truth: false, 0, "", nil and empty collections are false.
    pub(super) fn truthy(&self) -> bool {
        match self {
            Value::Nil => false,
            Value::Bool(b) => *b,
            Value::Int(i) => *i != 0,
            Value::Str(s) => !s.is_empty(),
            Value::Secret(s) => !s.is_empty(),
            Value::List(l) => !l.is_empty(),
            Value::Map(m) => !m.is_empty(),
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
