//! Numeric and character constants as Go's `text/template` reads them: the lexer's
//! `scanNumber` and `lexChar`, the parser's `newNumber` (with `strconv`'s base prefixes,
//! underscores, hexadecimal floats and character escapes) and the executor's `idealConstant`,
//! which decides what value a constant is (`1` an int, `1.5`/`1e3`/`0x1p4` a float64, `'a'` an
//! int, `1i`/`1+2i` a complex128).

/// What a constant evaluates to (Go's `idealConstant`).
#[derive(Debug, Clone, Copy)]
pub(super) enum Const {
    Int(i64),
    Float(f64),
    Complex(f64, f64),
    /// Fits a uint64 but not an int: parses, and fails when it runs ("overflows int").
    Overflow,
}

fn is_alnum(c: char) -> bool {
    c == '_' || c.is_alphanumeric()
}

/// Go's `scanNumber` from `p`: where the number ends and whether it is one (a letter or digit
/// right after it makes it bad; the end then includes that character, as Go reports it).
pub(super) fn scan_number(src: &str, p: usize) -> (usize, bool) {
    let b = src.as_bytes();
    let mut q = p;
    let mut accept = |set: &[u8]| {
        if b.get(q).is_some_and(|c| set.contains(c)) {
            q += 1;
            true
        } else {
            false
        }
    };
    accept(b"+-");
    let mut digits: &[u8] = b"0123456789_";
    if accept(b"0") {
        if accept(b"xX") {
            digits = b"0123456789abcdefABCDEF_";
        } else if accept(b"oO") {
            digits = b"01234567_";
        } else if accept(b"bB") {
            digits = b"01_";
        }
    }
    while accept(digits) {}
    if accept(b".") {
        while accept(digits) {}
    }
    if digits.len() == 11 && accept(b"eE") {
        accept(b"+-");
        while accept(b"0123456789_") {}
    }
    if digits.len() == 23 && accept(b"pP") {
        accept(b"+-");
        while accept(b"0123456789_") {}
    }
    accept(b"i");
    match src[q..].chars().next() {
        Some(c) if is_alnum(c) => (q + c.len_utf8(), false),
        _ => (q, true),
    }
}

/// Go's `lexChar` from the opening quote at `p`: the position after the closing quote.
pub(super) fn scan_char(src: &str, p: usize) -> Result<usize, (usize, String)> {
    let unterminated = || (p, "unterminated character constant".to_string());
    let mut chars = src[p + 1..].char_indices();
    loop {
        match chars.next() {
            Some((_, '\\')) => match chars.next() {
                Some((_, c)) if c != '\n' => {}
                _ => return Err(unterminated()),
            },
            None | Some((_, '\n')) => return Err(unterminated()),
            Some((i, '\'')) => return Ok(p + 1 + i + 1),
            Some(_) => {}
        }
    }
}

/// The constant a number or character token stands for (Go's `newNumber`, then
/// `idealConstant`); `complex`: the token is Go's `itemComplex` (`1+2i`). An error is a parse
/// error.
pub(super) fn constant(text: &str, complex: bool) -> Result<Const, String> {
    if let Some(body) = text.strip_prefix('\'') {
        let (r, tail) = unquote_char(body, '\'').ok_or("invalid syntax in character constant")?;
        if tail != "'" {
            return Err(format!("malformed character constant: {text}"));
        }
        return Ok(Const::Int(i64::from(r)));
    }
    if complex {
        return complex_pair(text)
            .map(|(re, im)| Const::Complex(re, im))
            .ok_or_else(|| format!("bad complex constant: {text}"));
    }
    if let Some(f) = text.strip_suffix('i').and_then(parse_float) {
        return Ok(Const::Complex(0.0, f));
    }
    let float_syntax = !is_hex_int(text) && text.contains(['.', 'e', 'E', 'p', 'P']);
    if let Some(i) = parse_int(text) {
        // `-0x1E` reads as an int but runs as a float64 (Go checks the hex prefix at index 0).
        #[allow(clippy::cast_precision_loss)]
        return Ok(if float_syntax {
            Const::Float(i as f64)
        } else {
            Const::Int(i)
        });
    }
    if let Some(u) = parse_uint(text) {
        #[allow(clippy::cast_precision_loss)]
        return Ok(if float_syntax {
            Const::Float(u as f64)
        } else {
            Const::Overflow
        });
    }
    match parse_float(text) {
        Some(_) if !text.contains(['.', 'e', 'E', 'p', 'P']) => {
            Err(format!("integer overflow: {text:?}"))
        }
        Some(f) => Ok(Const::Float(f)),
        None => Err(format!("illegal number syntax: {text:?}")),
    }
}

fn is_hex_int(s: &str) -> bool {
    let b = s.as_bytes();
    b.len() > 2 && b[0] == b'0' && matches!(b[1], b'x' | b'X') && !s.contains(['p', 'P'])
}

/// `strconv`'s `underscoreOK`: underscores only between digits (a base prefix counts as one).
fn underscore_ok(s: &str) -> bool {
    let mut b = s.as_bytes();
    if let [b'-' | b'+', rest @ ..] = b {
        b = rest;
    }
    let mut saw = b'^';
    let mut i = 0;
    let mut hex = false;
    if b.len() >= 2 && b[0] == b'0' && matches!(b[1].to_ascii_lowercase(), b'b' | b'o' | b'x') {
        i = 2;
        saw = b'0';
        hex = b[1].eq_ignore_ascii_case(&b'x');
    }
    for &c in &b[i..] {
        if c.is_ascii_digit() || (hex && c.is_ascii_hexdigit()) {
            saw = b'0';
        } else if c == b'_' {
            if saw != b'0' {
                return false;
            }
            saw = b'_';
        } else {
            if saw == b'_' {
                return false;
            }
            saw = b'!';
        }
    }
    saw != b'_'
}

/// `strconv.ParseUint(s, 0, 64)`.
fn parse_uint(s: &str) -> Option<u64> {
    let b = s.as_bytes();
    let (base, digits) = match b {
        [] => return None,
        [b'0', p, _, ..] if p.eq_ignore_ascii_case(&b'b') => (2, &b[2..]),
        [b'0', p, _, ..] if p.eq_ignore_ascii_case(&b'o') => (8, &b[2..]),
        [b'0', p, _, ..] if p.eq_ignore_ascii_case(&b'x') => (16, &b[2..]),
        [b'0', rest @ ..] => (8, rest),
        _ => (10, b),
    };
    let mut n: u64 = 0;
    let mut underscores = false;
    for &c in digits {
        if c == b'_' {
            underscores = true;
            continue;
        }
        let d = u64::from(char::from(c).to_digit(36)?);
        if d >= base {
            return None;
        }
        n = n.checked_mul(base)?.checked_add(d)?;
    }
    (!underscores || underscore_ok(s)).then_some(n)
}

/// `strconv.ParseInt(s, 0, 64)`.
fn parse_int(s: &str) -> Option<i64> {
    let (neg, rest) = match s.as_bytes().first() {
        Some(b'-') => (true, &s[1..]),
        Some(b'+') => (false, &s[1..]),
        _ => (false, s),
    };
    let u = parse_uint(rest)?;
    if neg {
        0i64.checked_sub_unsigned(u)
    } else {
        i64::try_from(u).ok()
    }
}

/// `strconv.ParseFloat(s, 64)` for what the template lexer lets through: decimal and
/// hexadecimal (`0x1.8p3`, the `p` exponent required) floats with underscores between digits;
/// `None` also where Go reports a range error (a result of ±Inf).
pub(super) fn parse_float(s: &str) -> Option<f64> {
    let (neg, body) = match s.as_bytes().first() {
        Some(b'-') => (true, &s[1..]),
        Some(b'+') => (false, &s[1..]),
        _ => (false, s),
    };
    if s.contains('_') && !underscore_ok(s) {
        return None;
    }
    let body = body.replace('_', "");
    let v = if let Some(hex) = body.strip_prefix("0x").or_else(|| body.strip_prefix("0X")) {
        parse_hex_float(hex)?
    } else {
        // Rust's grammar is Go's for decimal digits, '.', and an exponent, but it also reads
        // "inf"/"nan", which the template lexer never passes.
        if !body.bytes().any(|c| c.is_ascii_digit())
            || !body
                .bytes()
                .all(|c| c.is_ascii_digit() || matches!(c, b'.' | b'e' | b'E' | b'+' | b'-'))
        {
            return None;
        }
        body.parse::<f64>().ok()?
    };
    if v.is_infinite() {
        return None;
    }
    Some(if neg { -v } else { v })
}

/// The digits of a hexadecimal float after `0x`: mantissa, optional point, `p` exponent.
fn parse_hex_float(s: &str) -> Option<f64> {
    let (mant, exp) = s.split_once(['p', 'P'])?;
    let (eneg, edigits) = match exp.as_bytes().first() {
        Some(b'-') => (true, &exp[1..]),
        Some(b'+') => (false, &exp[1..]),
        _ => (false, exp),
    };
    if edigits.is_empty() || !edigits.bytes().all(|d| d.is_ascii_digit()) {
        return None;
    }
    // Saturating: anything past ±100,000 is ±Inf or 0 either way.
    let mag = edigits
        .bytes()
        .fold(0i64, |a, d| (a * 10 + i64::from(d - b'0')).min(100_000));
    let exp = if eneg { -mag } else { mag };
    let (int, frac) = mant.split_once('.').unwrap_or((mant, ""));
    if int.is_empty() && frac.is_empty() {
        return None;
    }
    // Up to 30 hex digits exactly in a u128, the rest as a sticky bit (so rounding is right).
    let mut m: u128 = 0;
    let mut shift: i64 = 0;
    let mut sticky = false;
    let mut kept = 0;
    for (i, c) in int.chars().chain(frac.chars()).enumerate() {
        let d = c.to_digit(16)?;
        let in_frac = i >= int.len();
        if kept < 30 {
            m = m * 16 + u128::from(d);
            if m != 0 {
                kept += 1;
            }
            if in_frac {
                shift -= 4;
            }
        } else {
            sticky |= d != 0;
            if !in_frac {
                shift += 4;
            }
        }
    }
    if sticky {
        m = (m << 1) | 1;
        shift -= 1;
    }
    #[allow(clippy::cast_precision_loss)]
    let mant = m as f64;
    let e = (exp + shift).clamp(-2000, 2000);
    // Two steps so that 2^e itself never overflows or underflows on the way.
    let half = i32::try_from(e / 2).ok()?;
    let rest = i32::try_from(e - e / 2).ok()?;
    Some(mant * 2f64.powi(half) * 2f64.powi(rest))
}

/// fmt.Sscan's complex: a float token, a sign, a float token, `i`, each token read as
/// `ParseFloat` does (a sign after an exponent letter belongs to the exponent; where Go's
/// scanner would split elsewhere, the token it hands on fails to parse there as here).
fn complex_pair(text: &str) -> Option<(f64, f64)> {
    let body = text.strip_suffix('i')?;
    let b = body.as_bytes();
    // The sign between the parts: the first + or - after the real part's start that does not
    // follow an exponent letter.
    let split = (1..b.len())
        .find(|&i| matches!(b[i], b'+' | b'-') && !matches!(b[i - 1], b'e' | b'E' | b'p' | b'P'))?;
    let (re, im) = body.split_at(split);
    Some((parse_float(re)?, parse_float(im)?))
}

/// `strconv.UnquoteChar(s, quote)`: the character and the rest of `s`.
fn unquote_char(s: &str, quote: char) -> Option<(u32, &str)> {
    let c = s.chars().next()?;
    if c == quote {
        return None;
    }
    if c != '\\' {
        return Some((u32::from(c), &s[c.len_utf8()..]));
    }
    let b = s.as_bytes();
    let e = *b.get(1)?;
    let rest = &s[2..];
    let simple = match e {
        b'a' => Some(7),
        b'b' => Some(8),
        b'f' => Some(12),
        b'n' => Some(10),
        b'r' => Some(13),
        b't' => Some(9),
        b'v' => Some(11),
        b'\\' => Some(u32::from('\\')),
        b'\'' | b'"' if char::from(e) == quote => Some(u32::from(e)),
        _ => None,
    };
    if let Some(v) = simple {
        return Some((v, rest));
    }
    match e {
        b'x' | b'u' | b'U' => {
            let n = match e {
                b'x' => 2,
                b'u' => 4,
                _ => 8,
            };
            let digits = rest.get(..n)?;
            if !digits.bytes().all(|d| d.is_ascii_hexdigit()) {
                return None;
            }
            let v = u32::from_str_radix(digits, 16).ok()?;
            if e != b'x' && char::from_u32(v).is_none() {
                return None;
            }
            Some((v, &rest[n..]))
        }
        b'0'..=b'7' => {
            let digits = rest.get(..2)?;
            let mut v = u32::from(e - b'0');
            for d in digits.bytes() {
                if !(b'0'..=b'7').contains(&d) {
                    return None;
                }
                v = (v << 3) | u32::from(d - b'0');
            }
            (v <= 255).then_some((v, &rest[2..]))
        }
        _ => None,
    }
}
