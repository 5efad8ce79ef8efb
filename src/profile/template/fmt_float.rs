//! Go's `fmt` for float64 and complex128 (`strconv.FormatFloat`'s `'g'`, `'e'` and `'f'`
//! formats): `%v` is the shortest `%g` (`1e+06`, `0.0001`, `1e-05`, `-0`), complexes print as
//! `(re+imi)`. Digits come from Rust's formatter, which, like Go's, produces the shortest
//! round-tripping digits and rounds exactly (half to even) at a given precision.

/// The decimal digits of `|f|` without trailing zeros and the position of the decimal point
/// (`f = 0.d₁d₂… × 10^dp`, Go's `decimalSlice`); `prec`: significant digits, `None` shortest.
fn digits(f: f64, prec: Option<usize>) -> (Vec<u8>, i64) {
    let s = match prec {
        Some(p) => format!("{:.*e}", p.saturating_sub(1), f.abs()),
        None => format!("{:e}", f.abs()),
    };
    let (m, e) = s.split_once('e').unwrap_or((&s, "0"));
    let mut d: Vec<u8> = m.bytes().filter(u8::is_ascii_digit).collect();
    while d.len() > 1 && d.last() == Some(&b'0') {
        d.pop();
    }
    if d == b"0" {
        return (d, 1);
    }
    (d, e.parse::<i64>().unwrap_or(0) + 1)
}

/// `%e` with `prec` digits after the point, from digits `d` with point position `dp`.
fn fmt_e(out: &mut String, d: &[u8], dp: i64, prec: usize, upper: bool) {
    out.push(char::from(d[0]));
    if prec > 0 {
        out.push('.');
        for i in 1..=prec {
            out.push(char::from(*d.get(i).unwrap_or(&b'0')));
        }
    }
    out.push(if upper { 'E' } else { 'e' });
    let exp = if d == b"0" { 0 } else { dp - 1 };
    out.push(if exp < 0 { '-' } else { '+' });
    out.push_str(&format!("{:02}", exp.unsigned_abs()));
}

/// `%f` with `prec` digits after the point.
fn fmt_f(out: &mut String, d: &[u8], dp: i64, prec: usize) {
    let digit = |i: i64| {
        usize::try_from(i)
            .ok()
            .and_then(|i| d.get(i))
            .copied()
            .unwrap_or(b'0')
    };
    if dp > 0 {
        for i in 0..dp {
            out.push(char::from(digit(i)));
        }
    } else {
        out.push('0');
    }
    if prec > 0 {
        out.push('.');
        for i in 0..i64::try_from(prec).unwrap_or(i64::MAX) {
            out.push(char::from(digit(dp + i)));
        }
    }
}

/// One float with verb `v`, `g`, `G`, `e`, `E`, `f` or `F` (precision `prec`); `plus`: a `+`
/// before non-negative numbers. `false` for another verb (nothing written).
pub(super) fn format_float(
    f: f64,
    verb: char,
    prec: Option<usize>,
    plus: bool,
    out: &mut String,
) -> bool {
    if !matches!(verb, 'v' | 'g' | 'G' | 'e' | 'E' | 'f' | 'F') {
        return false;
    }
    if f.is_sign_negative() {
        out.push('-');
    } else if plus {
        out.push('+');
    }
    let upper = verb.is_ascii_uppercase();
    match verb {
        'e' | 'E' => {
            let p = prec.unwrap_or(6);
            let (d, dp) = digits(f, Some(p + 1));
            fmt_e(out, &d, dp, p, upper);
        }
        'f' | 'F' => {
            let p = prec.unwrap_or(6);
            // Exact: Rust's fixed-point formatting rounds as Go's does.
            let s = format!("{:.*}", p, f.abs());
            out.push_str(&s);
        }
        _ => {
            // Go: shortest digits decide with an exponent threshold of 6; a precision p rounds
            // to p significant digits and is the threshold (lowered to the digit count when
            // the number is an integer that short).
            // `%v` is `%g`, also with a precision.
            let shortest = prec.is_none();
            let (d, dp) = if shortest {
                digits(f, None)
            } else {
                digits(f, Some(prec.unwrap_or(6).max(1)))
            };
            let nd = i64::try_from(d.len()).unwrap_or(i64::MAX);
            let mut p = if shortest {
                nd
            } else {
                i64::try_from(prec.unwrap_or(6).max(1)).unwrap_or(i64::MAX)
            };
            let mut eprec = p;
            if eprec > nd && nd >= dp {
                eprec = nd;
            }
            if shortest {
                eprec = 6;
            }
            let exp = dp - 1;
            if d != b"0" && (exp < -4 || exp >= eprec) {
                p = p.min(nd);
                fmt_e(out, &d, dp, usize::try_from(p - 1).unwrap_or(0), upper);
            } else {
                if p > dp {
                    p = nd;
                }
                fmt_f(out, &d, dp, usize::try_from((p - dp).max(0)).unwrap_or(0));
            }
        }
    }
    true
}

/// A complex128: `(re+imi)`, both parts with the verb, the imaginary one always signed, each
/// padded to `width` on its own (left-aligned with `minus`), as Go's `fmtComplex` does.
#[allow(clippy::too_many_arguments)]
pub(super) fn format_complex(
    (re, im): (f64, f64),
    verb: char,
    prec: Option<usize>,
    plus: bool,
    width: Option<usize>,
    minus: bool,
    out: &mut String,
) -> bool {
    if !matches!(verb, 'v' | 'g' | 'G' | 'e' | 'E' | 'f' | 'F') {
        return false;
    }
    out.push('(');
    for (part, plus) in [(re, plus), (im, true)] {
        let mut s = String::new();
        format_float(part, verb, prec, plus, &mut s);
        let fill = width.unwrap_or(0).saturating_sub(s.chars().count());
        if minus {
            out.push_str(&s);
            out.extend(std::iter::repeat_n(' ', fill));
        } else {
            out.extend(std::iter::repeat_n(' ', fill));
            out.push_str(&s);
        }
    }
    out.push_str("i)");
    true
}
