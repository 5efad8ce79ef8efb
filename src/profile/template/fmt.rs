//! Go's `fmt` for the values templates handle: `print`, `println` and `printf` format exactly
//! as `fmt.Sprint`, `fmt.Sprintln` and `fmt.Sprintf` do, including their in-band errors
//! (`%!d(string=x)`, `%!v(MISSING)`, `%!(EXTRA int=1)`, `%!(NOVERB)`).

use std::fmt::Write as _;

use super::Value;
use super::fmt_float::{format_complex, format_float};

/// Go's type name of a value, as `%T` and the error forms print it.
pub(super) fn go_type(v: &Value) -> &'static str {
    match v {
        Value::Nil => "<nil>",
        Value::Bool(_) => "bool",
        Value::Int(_) => "int",
        Value::Float(_) => "float64",
        Value::Complex(..) => "complex128",
        Value::Uint8(_) => "uint8",
        Value::Str(_) | Value::Secret(_) => "string",
        Value::List(_) => "[]string",
        Value::Map(_) | Value::NilMap => "map[string]string",
        Value::Root(_) => "*profile.Context",
    }
}

/// `fmt.Sprintf`.
pub(super) fn sprintf(format: &str, args: &[Value]) -> String {
    let mut out = String::new();
    let mut next = 0usize;
    let mut chars = format.chars().peekable();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        let mut spec = Spec::default();
        loop {
            match chars.peek() {
                Some('-') => spec.minus = true,
                Some('+') => spec.plus = true,
                Some('#') => spec.sharp = true,
                Some(' ') => spec.space = true,
                Some('0') => spec.zero = true,
                _ => break,
            }
            chars.next();
        }
        while let Some(d) = chars.peek().and_then(|c| c.to_digit(10)) {
            spec.width = Some(spec.width.unwrap_or(0) * 10 + d as usize);
            chars.next();
        }
        if chars.peek() == Some(&'.') {
            chars.next();
            let mut p = 0;
            while let Some(d) = chars.peek().and_then(|c| c.to_digit(10)) {
                p = p * 10 + d as usize;
                chars.next();
            }
            spec.precision = Some(p);
        }
        let Some(verb) = chars.next() else {
            out.push_str("%!(NOVERB)");
            break;
        };
        if verb == '%' {
            out.push('%');
            continue;
        }
        // Go: `%+v` is "plusV" (struct field names), not a sign for numbers.
        if verb == 'v' && spec.plus {
            spec.plus = false;
            spec.plus_v = true;
        }
        let Some(arg) = args.get(next) else {
            let _ = write!(out, "%!{verb}(MISSING)");
            continue;
        };
        next += 1;
        let mut one = String::new();
        format_arg(arg, verb, &spec, true, &mut one);
        pad(&mut out, &one, &spec);
    }
    if next < args.len() {
        out.push_str("%!(EXTRA ");
        for (i, a) in args[next..].iter().enumerate() {
            if i > 0 {
                out.push_str(", ");
            }
            if matches!(a, Value::Nil) {
                out.push_str("<nil>");
            } else {
                out.push_str(go_type(a));
                out.push('=');
                format_arg(a, 'v', &Spec::default(), true, &mut out);
            }
        }
        out.push(')');
    }
    out
}

/// `fmt.Sprint` (`ln`: `fmt.Sprintln`): operands are separated by a space when neither is a
/// string (always, for `Sprintln`).
pub(super) fn sprint(args: &[Value], ln: bool) -> String {
    let mut out = String::new();
    for (i, a) in args.iter().enumerate() {
        let is_str = |v: &Value| matches!(v, Value::Str(_) | Value::Secret(_));
        if i > 0 && (ln || (!is_str(a) && !is_str(&args[i - 1]))) {
            out.push(' ');
        }
        format_arg(a, 'v', &Spec::default(), true, &mut out);
    }
    if ln {
        out.push('\n');
    }
    out
}

/// text/template's `evalArgs` (the argument text of `html` and `urlquery`): one string as it
/// is, else `fmt.Sprint` of the printable values (nil as `<no value>`, the data as a struct).
pub(super) fn eval_args(args: &[Value]) -> String {
    if let [v @ (Value::Str(_) | Value::Secret(_))] = args {
        return v.as_str().unwrap_or_default().to_string();
    }
    let is_str = |v: &Value| matches!(v, Value::Str(_) | Value::Secret(_) | Value::Nil);
    let mut out = String::new();
    for (i, a) in args.iter().enumerate() {
        if i > 0 && !is_str(a) && !is_str(&args[i - 1]) {
            out.push(' ');
        }
        match a {
            Value::Nil => out.push_str("<no value>"),
            _ => format_arg(a, 'v', &Spec::default(), false, &mut out),
        }
    }
    out
}

/// Go's `html.EscapeString` as text/template's `html` does it (`HTMLEscapeString`): `"`, `'`,
/// `&`, `<`, `>` as entities and NUL as U+FFFD.
pub(super) fn html_escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '\0' => out.push('\u{fffd}'),
            '"' => out.push_str("&#34;"),
            '\'' => out.push_str("&#39;"),
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            c => out.push(c),
        }
    }
    out
}

/// Go's `url.QueryEscape`: unreserved bytes (`A-Z a-z 0-9 - _ . ~`) stay, a space becomes `+`,
/// every other byte `%XX`.
pub(super) fn query_escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                out.push(char::from(b));
            }
            b' ' => out.push('+'),
            b => {
                let _ = write!(out, "%{b:02X}");
            }
        }
    }
    out
}

/// How an action prints its value (`{{ pipeline }}`): `%v`, with the data as a struct rather
/// than a pointer and nil as `<no value>`.
pub(super) fn action_text(v: &Value, out: &mut String) {
    match v {
        Value::Nil => out.push_str("<no value>"),
        _ => format_arg(v, 'v', &Spec::default(), false, out),
    }
}

#[derive(Default, Clone)]
struct Spec {
    minus: bool,
    plus: bool,
    plus_v: bool,
    sharp: bool,
    space: bool,
    zero: bool,
    width: Option<usize>,
    precision: Option<usize>,
}

fn pad(out: &mut String, s: &str, spec: &Spec) {
    let n = s.chars().count();
    let width = spec.width.unwrap_or(0);
    if n >= width {
        out.push_str(s);
    } else if spec.minus {
        out.push_str(s);
        out.extend(std::iter::repeat_n(' ', width - n));
    } else {
        out.extend(std::iter::repeat_n(' ', width - n));
        out.push_str(s);
    }
}

fn bad_verb(v: &Value, verb: char, spec: &Spec, out: &mut String) {
    if matches!(v, Value::Nil) {
        let _ = write!(out, "%!{verb}(<nil>)");
        return;
    }
    // As Go: the value prints with `%v` and the same flags, width and precision.
    let _ = write!(out, "%!{verb}({}=", go_type(v));
    let mut inner = String::new();
    format_arg(v, 'v', spec, true, &mut inner);
    pad(out, &inner, spec);
    out.push(')');
}

/// One operand with one verb; `pointer`: the data prints as `&{…}` (a `*profile.Context`).
fn format_arg(v: &Value, verb: char, spec: &Spec, pointer: bool, out: &mut String) {
    match v {
        Value::Nil => match verb {
            'v' => out.push_str("<nil>"),
            'T' => out.push_str("<nil>"),
            _ => bad_verb(v, verb, spec, out),
        },
        Value::Bool(b) => match verb {
            'v' | 't' => out.push_str(if *b { "true" } else { "false" }),
            'T' => out.push_str("bool"),
            _ => bad_verb(v, verb, spec, out),
        },
        Value::Float(f) => {
            if verb == 'T' {
                out.push_str("float64");
            } else if !format_float(*f, verb, spec.precision, spec.plus, out) {
                bad_verb(v, verb, spec, out);
            }
        }
        Value::Complex(re, im) => {
            if verb == 'T' {
                out.push_str("complex128");
            } else if !format_complex(
                (*re, *im),
                verb,
                spec.precision,
                spec.plus,
                spec.width,
                spec.minus,
                out,
            ) {
                bad_verb(v, verb, spec, out);
            }
        }
        Value::Uint8(b) => match verb {
            'T' => out.push_str("uint8"),
            'v' | 'd' | 'x' | 'X' | 'o' | 'b' | 'c' | 'q' | 'U' => {
                format_arg(&Value::Int(i64::from(*b)), verb, spec, pointer, out);
            }
            _ => bad_verb(v, verb, spec, out),
        },
        Value::Int(i) => match verb {
            'v' | 'd' | 'x' | 'X' | 'o' | 'b' => {
                // Go's fmtInteger: the precision is a minimum digit count (0 and a zero value
                // print nothing), then the sign.
                let mag = i.unsigned_abs();
                let mut digits = match verb {
                    'x' => format!("{mag:x}"),
                    'X' => format!("{mag:X}"),
                    'o' => format!("{mag:o}"),
                    'b' => format!("{mag:b}"),
                    _ => format!("{mag}"),
                };
                if let Some(p) = spec.precision {
                    if p == 0 && mag == 0 {
                        digits.clear();
                    } else if digits.len() < p {
                        digits.insert_str(0, &"0".repeat(p - digits.len()));
                    }
                }
                if *i < 0 {
                    out.push('-');
                } else if spec.plus {
                    out.push('+');
                }
                out.push_str(&digits);
            }
            'c' => out.push(rune(*i)),
            'q' => quote_rune(rune(*i), out),
            'U' => {
                let _ = write!(out, "U+{:04X}", i);
            }
            'T' => out.push_str("int"),
            _ => bad_verb(v, verb, spec, out),
        },
        Value::Str(_) | Value::Secret(_) => {
            let s = match v {
                Value::Str(s) => s.as_str(),
                Value::Secret(s) => s.expose(),
                _ => "",
            };
            match verb {
                'v' | 's' => match spec.precision {
                    Some(p) => out.extend(s.chars().take(p)),
                    None => out.push_str(s),
                },
                'q' => {
                    if spec.sharp && !s.contains('`') {
                        let _ = write!(out, "`{s}`");
                    } else {
                        quote(s, out);
                    }
                }
                'x' | 'X' => {
                    for b in s.bytes() {
                        if verb == 'x' {
                            let _ = write!(out, "{b:02x}");
                        } else {
                            let _ = write!(out, "{b:02X}");
                        }
                    }
                }
                'T' => out.push_str("string"),
                _ => bad_verb(v, verb, spec, out),
            }
        }
        Value::List(l) => {
            if verb == 'T' {
                out.push_str(go_type(v));
                return;
            }
            out.push('[');
            for (i, x) in l.iter().enumerate() {
                if i > 0 {
                    out.push(' ');
                }
                format_arg(x, verb, spec, true, out);
            }
            out.push(']');
        }
        Value::NilMap => {
            if verb == 'T' {
                out.push_str(go_type(v));
            } else {
                out.push_str("map[]");
            }
        }
        Value::Map(m) => {
            if verb == 'T' {
                out.push_str(go_type(v));
                return;
            }
            out.push_str("map[");
            for (i, (k, x)) in m.iter().enumerate() {
                if i > 0 {
                    out.push(' ');
                }
                format_arg(&Value::Str(k.clone()), verb, spec, true, out);
                out.push(':');
                format_arg(x, verb, spec, true, out);
            }
            out.push(']');
        }
        Value::Root(fields) => {
            if verb == 'T' {
                out.push_str(go_type(v));
                return;
            }
            if pointer {
                out.push('&');
            }
            out.push('{');
            for (i, (name, x)) in fields.iter().enumerate() {
                if i > 0 {
                    out.push(' ');
                }
                if spec.plus_v {
                    out.push_str(name);
                    out.push(':');
                }
                format_arg(x, verb, spec, true, out);
            }
            out.push('}');
        }
    }
}

/// An int as a rune: invalid code points print as U+FFFD.
fn rune(i: i64) -> char {
    u32::try_from(i)
        .ok()
        .and_then(char::from_u32)
        .unwrap_or('\u{fffd}')
}

/// Go's `strconv.IsPrint`.
fn printable(c: char) -> bool {
    super::unicode_print::is_print(c)
}

fn escape(c: char, quote_char: char, out: &mut String) {
    match c {
        '\u{7}' => out.push_str("\\a"),
        '\u{8}' => out.push_str("\\b"),
        '\u{c}' => out.push_str("\\f"),
        '\n' => out.push_str("\\n"),
        '\r' => out.push_str("\\r"),
        '\t' => out.push_str("\\t"),
        '\u{b}' => out.push_str("\\v"),
        '\\' => out.push_str("\\\\"),
        c if c == quote_char => {
            out.push('\\');
            out.push(c);
        }
        c if printable(c) => out.push(c),
        c if (c as u32) < 0x80 => {
            let _ = write!(out, "\\x{:02x}", c as u32);
        }
        c if (c as u32) < 0x10000 => {
            let _ = write!(out, "\\u{:04x}", c as u32);
        }
        c => {
            let _ = write!(out, "\\U{:08x}", c as u32);
        }
    }
}

/// Go's `strconv.Quote`.
pub(super) fn quote(s: &str, out: &mut String) {
    out.push('"');
    for c in s.chars() {
        escape(c, '"', out);
    }
    out.push('"');
}

fn quote_rune(c: char, out: &mut String) {
    out.push('\'');
    escape(c, '\'', out);
    out.push('\'');
}
