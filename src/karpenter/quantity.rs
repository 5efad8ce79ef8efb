//! Kubernetes resource quantities as exact integers of milli-units, for arithmetic that never
//! rounds the wrong way (bin-packing, limits, capacity drift).

use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

/// Largest magnitude a parsed quantity takes, in milli-units (10^27 units). Valid quantities
/// can be far larger (`1e2147483647`); they saturate here instead of overflowing, and a sum of
/// a billion such values still fits an `i128`, so callers' arithmetic cannot overflow either.
pub const MAX_MILLI: i128 = 1_000_000_000_000_000_000_000_000_000_000;

/// Longest quantity text accepted (the API server has no tighter rule for CRD quantities).
pub const MAX_LEN: usize = 4096;

/// Why a text is not a quantity.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{text:?} is not a Kubernetes quantity: {reason}")]
pub struct QuantityError {
    /// The text (cut to 64 characters).
    pub text: String,
    pub reason: &'static str,
}

/// Milli-units of a quantity (`"1.5"` → 1500, `"100m"` → 100, `"1Ki"` → 1_024_000), or `None`
/// when the text is not a quantity.
pub fn parse(q: &Quantity) -> Option<i128> {
    parse_str(&q.0)
}

/// [`parse_checked`] without the reason. Memoised per thread: every scheduling, provisioning,
/// disruption and NodePool status round reads the requests of every pod, and a fleet's pods
/// spell their requests with a handful of texts (this parse was a fifth of the simulation's
/// time). Only short texts are kept, and at most [`MEMO_ENTRIES`], so that no input can grow it.
pub fn parse_str(text: &str) -> Option<i128> {
    if text.len() > MEMO_TEXT {
        return parse_checked(text).ok();
    }
    MEMO.with(|memo| {
        let mut memo = memo.borrow_mut();
        if let Some(v) = memo.get(text) {
            return *v;
        }
        let v = parse_checked(text).ok();
        if memo.len() >= MEMO_ENTRIES {
            memo.clear();
        }
        memo.insert(text.into(), v);
        v
    })
}

/// Longest text [`parse_str`] remembers, and how many it remembers at most.
const MEMO_TEXT: usize = 32;
const MEMO_ENTRIES: usize = 512;

thread_local! {
    static MEMO: std::cell::RefCell<std::collections::HashMap<Box<str>, Option<i128>>> =
        std::cell::RefCell::new(std::collections::HashMap::new());
}

/// Milli-units of a quantity, rounded up below a milli-unit (as the API server does),
/// saturating at ±[`MAX_MILLI`]; exact in between, whatever the number of digits or the
/// exponent. A text that is not a quantity is an error naming it.
pub fn parse_checked(text: &str) -> Result<i128, QuantityError> {
    let bad = |reason| QuantityError {
        text: text.chars().take(64).collect(),
        reason,
    };
    if text.len() > MAX_LEN {
        return Err(bad("longer than 4096 characters"));
    }
    let s = text.trim();
    let split = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.' || c == '+' || c == '-'))
        .unwrap_or(s.len());
    let (number, suffix) = s.split_at(split);
    let (negative, int, frac) = decimal(number).ok_or_else(|| bad("malformed number"))?;
    // value = 0.<digits> scaled: digits × 10^exp10 × 2^bits, in milli-units (exp10 + 3).
    let (bits, exp10): (u32, i64) = match suffix {
        "" => (0, 0),
        "m" => (0, -3),
        "k" => (0, 3),
        "M" => (0, 6),
        "G" => (0, 9),
        "T" => (0, 12),
        "P" => (0, 15),
        "E" => (0, 18),
        "Ki" => (10, 0),
        "Mi" => (20, 0),
        "Gi" => (30, 0),
        "Ti" => (40, 0),
        "Pi" => (50, 0),
        "Ei" => (60, 0),
        s if s.starts_with(['e', 'E']) => (
            0,
            exponent(&s[1..]).ok_or_else(|| bad("malformed exponent"))?,
        ),
        _ => return Err(bad("unknown suffix")),
    };
    // All digits as one integer D with a decimal exponent: value = D × 10^e10 × 2^bits.
    let mut digits: Vec<u8> = int.bytes().chain(frac.bytes()).map(|b| b - b'0').collect();
    let mut e10 = exp10 + 3 - frac.len() as i64;
    let lead = digits.iter().take_while(|&&d| d == 0).count();
    digits.drain(..lead);
    while digits.last() == Some(&0) {
        digits.pop();
        e10 += 1;
    }
    if digits.is_empty() {
        return Ok(0);
    }
    let len = digits.len() as i64;
    let sign = if negative { -1 } else { 1 };
    // At least 10^(len + e10 - 1): beyond the bound whatever the binary factor.
    if len + e10 > 31 {
        return Ok(sign * MAX_MILLI);
    }
    // Below 10^(len + e10) × 2^60 < 1: a fraction of a milli-unit, rounded up.
    if len + e10 < -19 {
        return Ok(if negative { 0 } else { 1 });
    }
    // Split into the integer part (at most 31 digits) and the fraction digits.
    let int_len = (len + e10).max(0) as usize;
    let (head, tail): (Vec<u8>, Vec<u8>) = if e10 >= 0 {
        let mut d = digits.clone();
        d.extend(std::iter::repeat_n(0, e10 as usize));
        (d, Vec::new())
    } else if int_len >= digits.len() {
        (digits.clone(), Vec::new())
    } else {
        let mut frac = vec![0u8; ((-e10) as usize).saturating_sub(digits.len())];
        frac.extend_from_slice(&digits[int_len..]);
        (digits[..int_len].to_vec(), frac)
    };
    let whole = head.iter().try_fold(0u128, |acc, &d| {
        acc.checked_mul(10)?.checked_add(u128::from(d))
    });
    let Some(whole) = whole else {
        return Ok(sign * MAX_MILLI);
    };
    // × 2^bits: the integer part shifts, the fraction doubles `bits` times (its carries are
    // the integer bits it contributes), and whatever fraction is left rounds up.
    let mut frac = tail;
    let mut carried: u128 = 0;
    for _ in 0..bits {
        let mut carry = 0u8;
        for d in frac.iter_mut().rev() {
            let v = *d * 2 + carry;
            *d = v % 10;
            carry = v / 10;
        }
        carried = carried * 2 + u128::from(carry);
    }
    let rest = frac.iter().any(|&d| d != 0);
    let magnitude = whole
        .checked_mul(1u128 << bits)
        .and_then(|v| v.checked_add(carried))
        .filter(|v| *v <= MAX_MILLI as u128);
    let Some(magnitude) = magnitude else {
        return Ok(sign * MAX_MILLI);
    };
    let magnitude = magnitude as i128;
    Ok(match (negative, rest) {
        (false, true) => (magnitude + 1).min(MAX_MILLI),
        (false, false) => magnitude,
        // Rounding up a negative value drops its fraction.
        (true, _) => -magnitude,
    })
}

/// Sign, integer digits and fraction digits of `[+-]digits[.digits]`.
fn decimal(s: &str) -> Option<(bool, &str, &str)> {
    let (neg, s) = match s.strip_prefix('-') {
        Some(rest) => (true, rest),
        None => (false, s.strip_prefix('+').unwrap_or(s)),
    };
    let (int, frac) = s.split_once('.').unwrap_or((s, ""));
    if int.is_empty() && frac.is_empty() {
        return None;
    }
    if !int.bytes().chain(frac.bytes()).all(|c| c.is_ascii_digit()) {
        return None;
    }
    Some((neg, int, frac))
}

/// A decimal exponent `[+-]digits`, clamped far beyond any meaningful range (the magnitude
/// checks above saturate or round long before), so it never overflows.
fn exponent(s: &str) -> Option<i64> {
    let (neg, digits) = match s.strip_prefix('-') {
        Some(rest) => (true, rest),
        None => (false, s.strip_prefix('+').unwrap_or(s)),
    };
    if digits.is_empty() || !digits.bytes().all(|c| c.is_ascii_digit()) {
        return None;
    }
    let significant = digits.trim_start_matches('0');
    let e: i64 = if significant.len() > 12 {
        1_000_000_000_000
    } else {
        significant.parse().unwrap_or(0)
    };
    Some(if neg { -e } else { e })
}

/// Format milli-cpu the way Kubernetes does for cpu (`"2"`, `"1500m"`).
pub fn format_cpu(milli: i128) -> String {
    if milli % 1000 == 0 {
        (milli / 1000).to_string()
    } else {
        format!("{milli}m")
    }
}

/// Format a byte count (given in milli-bytes) as `<n>Ki` or plain bytes.
pub fn format_bytes(milli: i128) -> String {
    let bytes = milli / 1000;
    if bytes % 1024 == 0 {
        format!("{}Ki", bytes / 1024)
    } else {
        bytes.to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn parses_the_forms_kubernetes_uses() {
        assert_eq!(parse_str("2"), Some(2000));
        assert_eq!(parse_str("1.5"), Some(1500));
        assert_eq!(parse_str("100m"), Some(100));
        assert_eq!(parse_str("1Ki"), Some(1_024_000));
        assert_eq!(parse_str("300Mi"), Some(300 * 1024 * 1024 * 1000));
        assert_eq!(parse_str("1G"), Some(1_000_000_000_000));
        assert_eq!(parse_str("1e3"), Some(1_000_000));
        assert_eq!(parse_str("0.1m"), Some(1), "sub-milli rounds up");
        assert_eq!(parse_str(""), None);
        assert_eq!(parse_str("banana"), None);
        assert_eq!(parse_str("1.2.3"), None);
        assert_eq!(parse_str("-1.5"), Some(-1500));
        assert_eq!(parse_str("0.5Ki"), Some(512_000));
        assert_eq!(parse_str("1.0001m"), Some(2), "rounds up");
        assert_eq!(parse_str("-0.1m"), Some(0), "rounds up");
        assert_eq!(parse_str("1e-3"), Some(1));
        assert_eq!(parse_str("000"), Some(0));
        assert_eq!(format_cpu(1500), "1500m");
        assert_eq!(format_cpu(4000), "4");
        assert_eq!(format_bytes(1_024_000), "1Ki");
    }

    /// #23: valid quantities whose exact value does not fit used to overflow (a panic in debug
    /// builds, a wrapped value in release ones).
    #[test]
    fn huge_and_tiny_quantities_saturate_or_round_never_overflow() {
        // 0.0147573952589676412927 × 2^60 ≈ 1.7e16 units: exact, no overflow on the way.
        let v = parse_checked("0.0147573952589676412927Ei").expect("valid");
        assert_eq!(v, 17_014_118_346_046_923_174);
        assert_eq!(parse_checked("1e2147483647"), Ok(MAX_MILLI));
        assert_eq!(parse_checked("-1e2147483647"), Ok(-MAX_MILLI));
        assert_eq!(parse_checked("1e-2147483648"), Ok(1));
        assert_eq!(parse_checked("1e99999999999999999999"), Ok(MAX_MILLI));
        assert_eq!(
            parse_checked("99999999999999999999999999999999999999999Ei"),
            Ok(MAX_MILLI)
        );
        assert_eq!(parse_checked(&format!("0.{}1Ei", "0".repeat(200))), Ok(1));
        assert_eq!(parse_checked("8Ei"), Ok(8 * (1i128 << 60) * 1000));
        let err = parse_checked("12 cores").expect_err("not a quantity");
        assert!(
            err.to_string()
                .contains("\"12 cores\" is not a Kubernetes quantity"),
            "{err}"
        );
        assert!(parse_checked(&"9".repeat(5000)).is_err());
    }

    /// The exact value of `digits × 10^e × 2^bits` in milli-units, rounded up, computed with
    /// f64-free big arithmetic on small inputs (a reference for the property below).
    fn reference(int: u64, frac: &str, bits: u32, e10: i32) -> i128 {
        // value × 1000 = (int.frac) × 10^e10 × 2^bits × 1000
        let scale = frac.len() as i32;
        let n = i128::from(int) * 10i128.pow(scale as u32) + frac.parse::<i128>().unwrap_or(0);
        let num = n << bits;
        let exp = e10 + 3 - scale;
        if exp >= 0 {
            (num * 10i128.pow(exp as u32)).min(MAX_MILLI)
        } else {
            let div = 10i128.pow((-exp) as u32);
            ((num + div - 1) / div).min(MAX_MILLI)
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(10_000))]
        #[test]
        fn never_panics(s in ".{0,40}") {
            let _ = parse_str(&s);
        }

        /// Quantity-shaped text, exponents and suffixes anywhere in their range: never a
        /// panic, always within the bound, and every rejection says why.
        #[test]
        fn quantity_shaped_text_is_parsed_or_refused_clearly(
            sign in prop::sample::select(vec!["", "+", "-"]),
            int in "[0-9]{0,45}",
            frac in prop::option::of("[0-9]{0,45}"),
            suffix in prop::sample::select(vec![
                "", "m", "k", "M", "G", "T", "P", "E", "Ki", "Mi", "Gi", "Ti", "Pi", "Ei", "e", "E", "x", "KiB",
            ]),
            exp in any::<i64>(),
        ) {
            let suffix = match suffix {
                "e" | "E" => format!("{suffix}{exp}"),
                s => s.to_string(),
            };
            let text = match &frac {
                Some(f) => format!("{sign}{int}.{f}{suffix}"),
                None => format!("{sign}{int}{suffix}"),
            };
            match parse_checked(&text) {
                Ok(v) => prop_assert!((-MAX_MILLI..=MAX_MILLI).contains(&v), "{} -> {}", text, v),
                Err(e) => prop_assert!(e.to_string().contains("is not a Kubernetes quantity"), "{}", e),
            }
        }

        /// Exact where the value is small enough to compute directly.
        #[test]
        fn agrees_with_direct_arithmetic(
            int in 0u64..1_000_000,
            frac in "[0-9]{0,6}",
            bits in prop::sample::select(vec![0u32, 10, 20, 30, 40]),
            e10 in -9i32..9,
        ) {
            let suffix = match bits { 0 => format!("e{e10}"), 10 => "Ki".into(), 20 => "Mi".into(), 30 => "Gi".into(), _ => "Ti".into() };
            let e = if bits == 0 { e10 } else { 0 };
            let text = if frac.is_empty() { format!("{int}{suffix}") } else { format!("{int}.{frac}{suffix}") };
            prop_assert_eq!(parse_checked(&text), Ok(reference(int, &frac, bits, e)), "{}", text);
        }

        #[test]
        fn integers_round_trip(n in 0i64..1_000_000_000) {
            prop_assert_eq!(parse_str(&n.to_string()), Some(i128::from(n) * 1000));
            prop_assert_eq!(parse_str(&format!("{n}Ki")), Some(i128::from(n) * 1024 * 1000));
        }
    }
}
