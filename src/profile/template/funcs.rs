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
        Value::Nil => Err(format!("nil pointer evaluating .{name}")),
        other => Err(format!(
            "can't evaluate field {name} in type {}",
            other.type_name()
        )),
    }
}

pub(super) fn compare(a: &Value, b: &Value) -> Result<std::cmp::Ordering, String> {
    use std::cmp::Ordering::*;
    match (a, b) {
        (Value::Int(x), Value::Int(y)) => Ok(x.cmp(y)),
        (Value::Bool(x), Value::Bool(y)) => Ok(x.cmp(y)),
        (Value::Nil, Value::Nil) => Ok(Equal),
        _ => match (a.as_str(), b.as_str()) {
            (Some(x), Some(y)) => Ok(x.cmp(y)),
            _ => Err(format!(
                "incompatible types for comparison: {} and {}",
                a.type_name(),
                b.type_name()
            )),
        },
    }
}

pub(super) fn print_value(v: &Value, out: &mut String) -> Result<(), String> {
    match v {
        Value::Nil => out.push_str("<no value>"),
        Value::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
        Value::Int(i) => out.push_str(&i.to_string()),
        Value::Str(s) => out.push_str(s),
        Value::Secret(s) => out.push_str(s.expose()),
        Value::List(l) => {
            out.push('[');
            for (i, x) in l.iter().enumerate() {
                if i > 0 {
                    out.push(' ');
                }
                print_value(x, out)?;
            }
            out.push(']');
        }
        Value::Map(m) => {
            out.push_str("map[");
            for (i, (k, x)) in m.iter().enumerate() {
                if i > 0 {
                    out.push(' ');
                }
                out.push_str(k);
                out.push(':');
                print_value(x, out)?;
            }
            out.push(']');
        }
        Value::Root(fields) => {
            // Go prints a struct as `{v1 v2 …}`, its fields with %v.
            out.push('{');
            for (i, (_, x)) in fields.iter().enumerate() {
                if i > 0 {
                    out.push(' ');
                }
                print_value(x, out)?;
            }
            out.push('}');
        }
    }
    Ok(())
}

/// A value as fmt prints a function argument: the data is a pointer there (`&{…}`) and nil is
/// `<nil>` (an action prints it as `<no value>`).
pub(super) fn print_arg(v: &Value, out: &mut String) -> Result<(), String> {
    match v {
        Value::Nil => {
            out.push_str("<nil>");
            Ok(())
        }
        Value::Root(_) => {
            out.push('&');
            print_value(v, out)
        }
        _ => print_value(v, out),
    }
}

pub(super) fn go_quote(s: &str, out: &mut String) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\t' => out.push_str("\\t"),
            '\r' => out.push_str("\\r"),
            c if (c as u32) < 0x20 || c == '\u{7f}' => {
                out.push_str(&format!("\\x{:02x}", c as u32));
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

pub(super) fn printf(fmt: &str, args: &[Value]) -> Result<String, String> {
    let mut out = String::new();
    let mut it = fmt.chars();
    let mut next = args.iter();
    while let Some(c) = it.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        let verb = it.next().ok_or("printf: format ends with %")?;
        if verb == '%' {
            out.push('%');
            continue;
        }
        let arg = next
            .next()
            .ok_or_else(|| format!("printf: missing argument for %{verb}"))?;
        match verb {
            's' | 'v' => print_arg(arg, &mut out)?,
            'd' => match arg {
                Value::Int(i) => out.push_str(&i.to_string()),
                other => return Err(format!("printf: %d of {}", other.type_name())),
            },
            'q' => match arg.as_str() {
                Some(s) => go_quote(s, &mut out),
                None => return Err(format!("printf: %q of {}", arg.type_name())),
            },
            other => return Err(format!("printf: verb %{other} is not supported")),
        }
    }
    if next.next().is_some() {
        return Err("printf: too many arguments for the format".into());
    }
    Ok(out)
}
