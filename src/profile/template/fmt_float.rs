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
    if !matches!(
        verb,
        'v' | 'g' | 'G' | 'e' | 'E' | 'f' | 'F' | 'x' | 'X' | 'b'
    ) {
        return false;
    }
    if f.is_sign_negative() {
        out.push('-');
    } else if plus {
        out.push('+');
    }
    let upper = verb.is_ascii_uppercase();
    match verb {
        'x' | 'X' => fmt_x(out, f, prec, upper),
        'b' => {
            // strconv's 'b': decimal mantissa, binary exponent (`6755399441055744p-52`).
            let (mant, exp) = mant_exp(f);
            out.push_str(&format!(
                "{mant}p{}{}",
                if exp - 52 < 0 { '-' } else { '+' },
                (exp - 52).unsigned_abs()
            ));
        }
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

/// The 52-bit-fraction mantissa (with the implicit bit) and the unbiased exponent of `|f|`:
/// `|f| = mant × 2^(exp - 52)` (strconv's `mant`, `exp` before formatting).
fn mant_exp(f: f64) -> (u64, i64) {
    let bits = f.to_bits();
    let mut exp = i64::try_from((bits >> 52) & 0x7ff).unwrap_or(0);
    let mut mant = bits & ((1u64 << 52) - 1);
    if exp == 0 {
        exp = 1;
    } else {
        mant |= 1 << 52;
    }
    (mant, exp - 1023)
}

/// strconv's `%x`: `0x1.8p+00`, `0x0p+00`; with a precision below 15, rounded to that many
/// hex digits (half to even).
fn fmt_x(out: &mut String, f: f64, prec: Option<usize>, upper: bool) {
    let (mut mant, mut exp) = mant_exp(f);
    if mant == 0 {
        exp = 0;
    }
    mant <<= 60 - 52;
    while mant != 0 && mant & (1 << 60) == 0 {
        mant <<= 1;
        exp -= 1;
    }
    if let Some(p) = prec.filter(|p| *p < 15) {
        let shift = u32::try_from(p * 4).unwrap_or(0);
        let extra = (mant << shift) & ((1 << 60) - 1);
        mant >>= 60 - shift;
        if extra | (mant & 1) > 1 << 59 {
            mant += 1;
        }
        mant <<= 60 - shift;
        if mant & (1 << 61) != 0 {
            mant >>= 1;
            exp += 1;
        }
    }
    let hex = |d: u64| {
        let c = char::from_digit(u32::try_from(d & 15).unwrap_or(0), 16).unwrap_or('0');
        if upper { c.to_ascii_uppercase() } else { c }
    };
    out.push_str(if upper { "0X" } else { "0x" });
    out.push(if (mant >> 60) & 1 == 1 { '1' } else { '0' });
    mant <<= 4;
    match prec {
        None if mant != 0 => {
            out.push('.');
            while mant != 0 {
                out.push(hex(mant >> 60));
                mant <<= 4;
            }
        }
        Some(p) if p > 0 => {
            out.push('.');
            for _ in 0..p {
                out.push(hex(mant >> 60));
                mant <<= 4;
            }
        }
        _ => {}
    }
    out.push(if upper { 'P' } else { 'p' });
    out.push(if exp < 0 { '-' } else { '+' });
    out.push_str(&format!("{:02}", exp.unsigned_abs()));
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
    if !matches!(
        verb,
        'v' | 'g' | 'G' | 'e' | 'E' | 'f' | 'F' | 'x' | 'X' | 'b'
    ) {
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
