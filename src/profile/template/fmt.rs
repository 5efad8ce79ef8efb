//! Go's `fmt` for the values templates handle: `print`, `println` and `printf` format exactly
//! as `fmt.Sprint`, `fmt.Sprintln` and `fmt.Sprintf` do, including their in-band errors
//! (`%!d(string=x)`, `%!v(MISSING)`, `%!(EXTRA int=1)`, `%!(NOVERB)`).

use std::io::Write as _;

use super::Value;
use super::fmt_float::{format_complex, format_float};

/// Output bytes: Go strings are bytes, not necessarily UTF-8 (`slice` can cut a character).
pub(super) trait Out {
    fn put(&mut self, c: char);
    fn put_str(&mut self, s: &str);
}

impl Out for Vec<u8> {
    fn put(&mut self, c: char) {
        let mut b = [0; 4];
        self.extend_from_slice(c.encode_utf8(&mut b).as_bytes());
    }

    fn put_str(&mut self, s: &str) {
        self.extend_from_slice(s.as_bytes());
    }
}

/// The runes of a Go string as Go's `utf8.DecodeRune` reads them: each byte of an invalid
/// sequence is one `None` (Go's `RuneError` of width 1), with the bytes it spans.
pub(super) fn runes(b: &[u8]) -> Vec<(Option<char>, &[u8])> {
    let mut out = Vec::with_capacity(b.len());
    for chunk in b.utf8_chunks() {
        let valid = chunk.valid();
        let mut at = 0;
        for c in valid.chars() {
            let n = c.len_utf8();
            out.push((Some(c), &valid.as_bytes()[at..at + n]));
            at += n;
        }
        for i in 0..chunk.invalid().len() {
            out.push((None, &chunk.invalid()[i..=i]));
        }
    }
    out
}

/// Go's type name of a value, as `%T` and the error forms print it.
pub(super) fn go_type(v: &Value) -> &'static str {
    match v {
        Value::Nil => "<nil>",
        Value::Bool(_) => "bool",
        Value::Int(_) => "int",
        Value::Float(_) => "float64",
        Value::Complex(..) => "complex128",
        Value::Uint8(_) => "uint8",
        Value::Str(_) | Value::Secret(_) | Value::Bytes(_) => "string",
        Value::List(_) => "[]string",
        Value::Map(_) | Value::NilMap => "map[string]string",
        Value::Root(_) => "*profile.Context",
    }
}

/// `fmt.Sprintf`.
pub(super) fn sprintf(format: &[u8], args: &[Value]) -> Vec<u8> {
    let mut out = Vec::new();
    let mut next = 0usize;
    // Runes with their bytes; an invalid byte is Go's RuneError.
    let fmt: Vec<(char, &[u8])> = runes(format)
        .into_iter()
        .map(|(c, b)| (c.unwrap_or('\u{fffd}'), b))
        .collect();
    let mut i = 0;
    let peek = |i: usize| fmt.get(i).map(|(c, _)| *c);
    while let Some(&(c, bytes)) = fmt.get(i) {
        i += 1;
        if c != '%' {
            out.extend_from_slice(bytes);
            continue;
        }
        let mut spec = Spec::default();
        loop {
            match peek(i) {
                Some('-') => spec.minus = true,
                Some('+') => spec.plus = true,
                Some('#') => spec.sharp = true,
                Some(' ') => spec.space = true,
                Some('0') => spec.zero = true,
                _ => break,
            }
            i += 1;
        }
        while let Some(d) = peek(i).and_then(|c| c.to_digit(10)) {
            spec.width = Some(spec.width.unwrap_or(0) * 10 + d as usize);
            i += 1;
        }
        if peek(i) == Some('.') {
            i += 1;
            let mut p = 0;
            while let Some(d) = peek(i).and_then(|c| c.to_digit(10)) {
                p = p * 10 + d as usize;
                i += 1;
            }
            spec.precision = Some(p);
        }
        let Some(verb) = peek(i) else {
            out.put_str("%!(NOVERB)");
            break;
        };
        i += 1;
        if verb == '%' {
            out.put('%');
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
        let mut one = Vec::new();
        format_arg(arg, verb, &spec, true, &mut one);
        pad(&mut out, &one, &spec);
    }
    if next < args.len() {
        out.put_str("%!(EXTRA ");
        for (i, a) in args[next..].iter().enumerate() {
            if i > 0 {
                out.put_str(", ");
            }
            if matches!(a, Value::Nil) {
                out.put_str("<nil>");
            } else {
                out.put_str(go_type(a));
                out.put('=');
                format_arg(a, 'v', &Spec::default(), true, &mut out);
            }
        }
        out.put(')');
    }
    out
}

/// `fmt.Sprint` (`ln`: `fmt.Sprintln`): operands are separated by a space when neither is a
/// string (always, for `Sprintln`).
pub(super) fn sprint(args: &[Value], ln: bool) -> Vec<u8> {
    let mut out = Vec::new();
    for (i, a) in args.iter().enumerate() {
        let is_str = |v: &Value| matches!(v, Value::Str(_) | Value::Secret(_) | Value::Bytes(_));
        if i > 0 && (ln || (!is_str(a) && !is_str(&args[i - 1]))) {
            out.put(' ');
        }
        format_arg(a, 'v', &Spec::default(), true, &mut out);
    }
    if ln {
        out.put('\n');
    }
    out
}

/// text/template's `evalArgs` (the argument text of `html`, `js` and `urlquery`): one string
/// as it is, else `fmt.Sprint` of the printable values (nil as `<no value>`, the data as a
/// struct).
pub(super) fn eval_args(args: &[Value]) -> Vec<u8> {
    if let [v] = args
        && let Some(b) = v.as_bytes()
    {
        return b.to_vec();
    }
    let is_str = |v: &Value| v.as_bytes().is_some() || matches!(v, Value::Nil);
    let mut out = Vec::new();
    for (i, a) in args.iter().enumerate() {
        if i > 0 && !is_str(a) && !is_str(&args[i - 1]) {
            out.put(' ');
        }
        match a {
            Value::Nil => out.put_str("<no value>"),
            _ => format_arg(a, 'v', &Spec::default(), false, &mut out),
        }
    }
    out
}

/// How an action prints its value (`{{ pipeline }}`): `%v`, with the data as a struct rather
/// than a pointer and nil as `<no value>`.
pub(super) fn action_text(v: &Value, out: &mut Vec<u8>) {
    match v {
        Value::Nil => out.put_str("<no value>"),
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

fn pad(out: &mut Vec<u8>, s: &[u8], spec: &Spec) {
    let n = runes(s).len();
    let width = spec.width.unwrap_or(0);
    if n >= width {
        out.extend_from_slice(s);
    } else if spec.minus {
        out.extend_from_slice(s);
        out.extend(std::iter::repeat_n(b' ', width - n));
    } else {
        out.extend(std::iter::repeat_n(b' ', width - n));
        out.extend_from_slice(s);
    }
}

fn bad_verb(v: &Value, verb: char, spec: &Spec, out: &mut Vec<u8>) {
    if matches!(v, Value::Nil) {
        let _ = write!(out, "%!{verb}(<nil>)");
        return;
    }
    // As Go: the value prints with `%v` and the same flags, width and precision.
    let _ = write!(out, "%!{verb}({}=", go_type(v));
    let mut inner = Vec::new();
    format_arg(v, 'v', spec, true, &mut inner);
    pad(out, &inner, spec);
    out.put(')');
}

/// One operand with one verb; `pointer`: the data prints as `&{…}` (a `*profile.Context`).
fn format_arg(v: &Value, verb: char, spec: &Spec, pointer: bool, out: &mut Vec<u8>) {
    match v {
        Value::Nil => match verb {
            'v' => out.put_str("<nil>"),
            'T' => out.put_str("<nil>"),
            _ => bad_verb(v, verb, spec, out),
        },
        Value::Bool(b) => match verb {
            'v' | 't' => out.put_str(if *b { "true" } else { "false" }),
            'T' => out.put_str("bool"),
            _ => bad_verb(v, verb, spec, out),
        },
        Value::Float(f) => {
            if verb == 'T' {
                out.put_str("float64");
            } else {
                let mut s = String::new();
                if format_float(*f, verb, spec.precision, spec.plus, &mut s) {
                    out.put_str(&s);
                } else {
                    bad_verb(v, verb, spec, out);
                }
            }
        }
        Value::Complex(re, im) => {
            if verb == 'T' {
                out.put_str("complex128");
            } else {
                let mut s = String::new();
                let (p, w) = (spec.precision, spec.width);
                if format_complex((*re, *im), verb, p, spec.plus, w, spec.minus, &mut s) {
                    out.put_str(&s);
                } else {
                    bad_verb(v, verb, spec, out);
                }
            }
        }
        Value::Uint8(b) => match verb {
            'T' => out.put_str("uint8"),
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
                    out.put('-');
                } else if spec.plus {
                    out.put('+');
                }
                out.put_str(&digits);
            }
            'c' => out.put(rune(*i)),
            'q' => quote_rune(rune(*i), out),
            'U' => {
                let _ = write!(out, "U+{:04X}", i);
            }
            'T' => out.put_str("int"),
            _ => bad_verb(v, verb, spec, out),
        },
        Value::Str(_) | Value::Secret(_) | Value::Bytes(_) => {
            let s = v.as_bytes().unwrap_or_default();
            match verb {
                'v' | 's' => match spec.precision {
                    Some(p) => out.extend(runes(s).iter().take(p).flat_map(|(_, b)| b.iter())),
                    None => out.extend_from_slice(s),
                },
                'q' => {
                    if spec.sharp
                        && !s.contains(&b'`')
                        && let Ok(s) = std::str::from_utf8(s)
                    {
                        let _ = write!(out, "`{s}`");
                    } else {
                        quote(s, out);
                    }
                }
                'x' | 'X' => {
                    for b in s {
                        if verb == 'x' {
                            let _ = write!(out, "{b:02x}");
                        } else {
                            let _ = write!(out, "{b:02X}");
                        }
                    }
                }
                'T' => out.put_str("string"),
                _ => bad_verb(v, verb, spec, out),
            }
        }
        Value::List(l) => {
            if verb == 'T' {
                out.put_str(go_type(v));
                return;
            }
            out.put('[');
            for (i, x) in l.iter().enumerate() {
                if i > 0 {
                    out.put(' ');
                }
                format_arg(x, verb, spec, true, out);
            }
            out.put(']');
        }
        Value::NilMap => {
            if verb == 'T' {
                out.put_str(go_type(v));
            } else {
                out.put_str("map[]");
            }
        }
        Value::Map(m) => {
            if verb == 'T' {
                out.put_str(go_type(v));
                return;
            }
            out.put_str("map[");
            for (i, (k, x)) in m.iter().enumerate() {
                if i > 0 {
                    out.put(' ');
                }
                format_arg(&Value::Str(k.clone()), verb, spec, true, out);
                out.put(':');
                format_arg(x, verb, spec, true, out);
            }
            out.put(']');
        }
        Value::Root(fields) => {
            if verb == 'T' {
                out.put_str(go_type(v));
                return;
            }
            if pointer {
                out.put('&');
            }
            out.put('{');
            for (i, (name, x)) in fields.iter().enumerate() {
                if i > 0 {
                    out.put(' ');
                }
                if spec.plus_v {
                    out.put_str(name);
                    out.put(':');
                }
                format_arg(x, verb, spec, true, out);
            }
            out.put('}');
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

fn escape(c: char, quote_char: char, out: &mut Vec<u8>) {
    match c {
        '\u{7}' => out.put_str("\\a"),
        '\u{8}' => out.put_str("\\b"),
        '\u{c}' => out.put_str("\\f"),
        '\n' => out.put_str("\\n"),
        '\r' => out.put_str("\\r"),
        '\t' => out.put_str("\\t"),
        '\u{b}' => out.put_str("\\v"),
        '\\' => out.put_str("\\\\"),
        c if c == quote_char => {
            out.put('\\');
            out.put(c);
        }
        c if printable(c) => out.put(c),
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

/// Go's `strconv.Quote` (a byte of invalid UTF-8 as `\xXX`).
pub(super) fn quote(s: &[u8], out: &mut Vec<u8>) {
    out.put('"');
    for (c, b) in runes(s) {
        match c {
            Some(c) => escape(c, '"', out),
            None => {
                let _ = write!(out, "\\x{:02x}", b[0]);
            }
        }
    }
    out.put('"');
}

fn quote_rune(c: char, out: &mut Vec<u8>) {
    out.put('\'');
    escape(c, '\'', out);
    out.put('\'');
}
