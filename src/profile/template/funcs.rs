//! Field access, comparison and printing.

use super::Value;

pub(super) fn field(v: Value, name: &str) -> Result<Value, String> {
    match v {
        Value::Root(fields) => fields
            .into_iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v)
            .ok_or_else(|| format!("can't evaluate field {name} in type *profile.Context")),
        Value::Map(mut m) => m
            .remove(name)
            .ok_or_else(|| format!("map has no entry for key \"{name}\"")),
        Value::NilMap => Err(format!("map has no entry for key \"{name}\"")),
        Value::Nil => Err(format!("nil pointer evaluating .{name}")),
        other => Err(format!(
            "can't evaluate field {name} in type {}",
            other.type_name()
        )),
    }
}

/// Go's basic kinds for comparison; everything else (maps, the data, nil) has none.
#[derive(PartialEq, Eq, Clone, Copy)]
enum Kind {
    Bool,
    Int,
    Uint,
    Float,
    Complex,
    Str,
    Other,
}

fn kind(v: &Value) -> Kind {
    match v {
        Value::Bool(_) => Kind::Bool,
        Value::Int(_) => Kind::Int,
        Value::Uint8(_) => Kind::Uint,
        Value::Float(_) => Kind::Float,
        Value::Complex(..) => Kind::Complex,
        Value::Str(_) | Value::Secret(_) | Value::Bytes(_) => Kind::Str,
        _ => Kind::Other,
    }
}

/// Go's `eq arg1 arg2…`: true when `arg1` equals any of the others. Values of different basic
/// kinds are an error unless one is nil; maps cannot be compared (unless one side is nil).
pub(super) fn go_eq(a: &Value, others: &[Value]) -> Result<bool, String> {
    if others.is_empty() {
        return Err("missing argument for comparison".into());
    }
    for b in others {
        let (ka, kb) = (kind(a), kind(b));
        let truth =
            if let (Value::Int(i), Value::Uint8(u)) | (Value::Uint8(u), Value::Int(i)) = (a, b) {
                // Go compares signed and unsigned integers by value.
                *i == i64::from(*u)
            } else if ka != kb {
                if !matches!(a, Value::Nil) && !matches!(b, Value::Nil) {
                    return Err(format!(
                        "incompatible types for comparison: {} and {}",
                        a.type_name(),
                        b.type_name()
                    ));
                }
                false
            } else {
                match (a, b) {
                    (Value::Bool(x), Value::Bool(y)) => x == y,
                    (Value::Int(x), Value::Int(y)) => x == y,
                    (Value::Uint8(x), Value::Uint8(y)) => x == y,
                    (Value::Float(x), Value::Float(y)) => x == y,
                    (Value::Complex(a, b), Value::Complex(c, d)) => a == c && b == d,
                    _ if ka == Kind::Str => a.as_bytes() == b.as_bytes(),
                    // Both without a basic kind: nil equals only nil, the data equals itself,
                    // maps are not comparable.
                    (Value::Nil, other) | (other, Value::Nil) => {
                        matches!(other, Value::Nil | Value::NilMap)
                    }
                    (Value::Root(_), Value::Root(_)) => true,
                    // Go's maps compare only with nil.
                    (Value::NilMap, Value::NilMap) => true,
                    (Value::NilMap, Value::Map(_)) | (Value::Map(_), Value::NilMap) => false,
                    _ => {
                        return Err(format!("non-comparable type {}", super::fmt::go_type(b)));
                    }
                }
            };
        if truth {
            return Ok(true);
        }
    }
    Ok(false)
}

/// Go's `lt`: only ints with ints and strings with strings.
pub(super) fn go_lt(a: &Value, b: &Value) -> Result<bool, String> {
    let (ka, kb) = (kind(a), kind(b));
    if ka == Kind::Other || kb == Kind::Other {
        return Err("invalid type for comparison".into());
    }
    let int = |v: &Value| match v {
        Value::Int(i) => Some(*i),
        Value::Uint8(u) => Some(i64::from(*u)),
        _ => None,
    };
    if let (Some(x), Some(y)) = (int(a), int(b)) {
        return Ok(x < y);
    }
    if ka != kb {
        return Err(format!(
            "incompatible types for comparison: {} and {}",
            a.type_name(),
            b.type_name()
        ));
    }
    match (a, b) {
        (Value::Bool(_) | Value::Complex(..), _) => Err("invalid type for comparison".into()),
        (Value::Float(x), Value::Float(y)) => Ok(x < y),
        _ => Ok(a.as_bytes() < b.as_bytes()),
    }
}

/// Go's `slice item indexes…`: a string (up to two indexes) or a list (up to three), each index
/// an integer within the length, `i <= j <= k`. A string's slice is bytes, cut where the indexes
/// say (possibly inside a character); a secret's stays a secret while it is UTF-8.
pub(super) fn go_slice(item: &Value, indexes: &[Value]) -> Result<Value, String> {
    let len = match item {
        Value::Nil => return Err("slice of untyped nil".into()),
        Value::List(l) => l.len(),
        v => match v.as_bytes() {
            Some(b) => b.len(),
            None => {
                let t = match v {
                    Value::Root(_) => "profile.Context",
                    v => super::fmt::go_type(v),
                };
                return Err(format!("can't slice item of type {t}"));
            }
        },
    };
    if indexes.len() > 3 {
        return Err(format!("too many slice indexes: {}", indexes.len()));
    }
    if indexes.len() == 3 && item.as_bytes().is_some() {
        return Err("cannot 3-index slice a string".into());
    }
    let mut idx = [0, len, len];
    for (slot, index) in idx.iter_mut().zip(indexes) {
        let x = match index {
            Value::Int(i) => *i,
            Value::Uint8(b) => i64::from(*b),
            Value::Nil => return Err("cannot index slice/array with nil".into()),
            other => {
                return Err(format!(
                    "cannot index slice/array with type {}",
                    super::fmt::go_type(other)
                ));
            }
        };
        // Errors name no index: one may be computed from a secret (`index .Secrets.x 0`).
        *slot = usize::try_from(x)
            .ok()
            .filter(|x| *x <= len)
            .ok_or("index out of range")?;
    }
    if idx[0] > idx[1] {
        return Err("invalid slice index: the first is past the second".into());
    }
    if indexes.len() == 3 && idx[1] > idx[2] {
        return Err("invalid slice index: the second is past the third".into());
    }
    let (i, j) = (idx[0], idx[1]);
    Ok(match item {
        Value::List(l) => Value::List(l[i..j].to_vec()),
        Value::Secret(s) => match s.expose().get(i..j) {
            Some(part) => Value::Secret(crate::secret::Secret::new(part)),
            None => Value::from_bytes(s.expose().as_bytes()[i..j].to_vec()),
        },
        v => Value::from_bytes(v.as_bytes().unwrap_or_default()[i..j].to_vec()),
    })
}
