//! Kubernetes resource quantities as exact integers of milli-units, for arithmetic that never
//! rounds the wrong way (bin-packing, limits, capacity drift).

use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

/// Milli-units of a quantity (`"1.5"` → 1500, `"100m"` → 100, `"1Ki"` → 1_024_000), or `None`
/// when the text is not a quantity.
pub fn parse(q: &Quantity) -> Option<i128> {
    parse_str(&q.0)
}

pub fn parse_str(text: &str) -> Option<i128> {
    let s = text.trim();
    let split = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.' || c == '+' || c == '-'))
        .unwrap_or(s.len());
    let (number, suffix) = s.split_at(split);
    let (num, scale) = decimal(number)?;
    // value = num / 10^scale * multiplier; in milli-units that is num * multiplier * 1000 / 10^scale.
    let (mul, exp10): (i128, i32) = match suffix {
        "" => (1, 0),
        "m" => (1, -3),
        "k" => (1, 3),
        "M" => (1, 6),
        "G" => (1, 9),
        "T" => (1, 12),
        "P" => (1, 15),
        "E" => (1, 18),
        "Ki" => (1 << 10, 0),
        "Mi" => (1 << 20, 0),
        "Gi" => (1 << 30, 0),
        "Ti" => (1 << 40, 0),
        "Pi" => (1 << 50, 0),
        "Ei" => (1 << 60, 0),
        s if s.starts_with(['e', 'E']) => (1, s[1..].parse().ok()?),
        _ => return None,
    };
    let exp = exp10 + 3 - scale;
    let scaled = num.checked_mul(mul)?;
    if exp >= 0 {
        scaled.checked_mul(10i128.checked_pow(exp as u32)?)
    } else {
        let div = 10i128.checked_pow((-exp) as u32)?;
        // Round up, as the API server does for sub-milli precision.
        Some((scaled + div - 1).div_euclid(div))
    }
}

fn decimal(s: &str) -> Option<(i128, i32)> {
    let (neg, s) = match s.strip_prefix('-') {
        Some(rest) => (true, rest),
        None => (false, s.strip_prefix('+').unwrap_or(s)),
    };
    if s.is_empty() {
        return None;
    }
    let (int, frac) = s.split_once('.').unwrap_or((s, ""));
    if int.is_empty() && frac.is_empty() {
        return None;
    }
    let digits = format!("{int}{frac}");
    if !digits.chars().all(|c| c.is_ascii_digit()) || digits.len() > 30 {
        return None;
    }
    let n: i128 = digits.parse().ok()?;
    Some((if neg { -n } else { n }, frac.len() as i32))
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
        assert_eq!(format_cpu(1500), "1500m");
        assert_eq!(format_cpu(4000), "4");
        assert_eq!(format_bytes(1_024_000), "1Ki");
    }

    proptest! {
        #[test]
        fn never_panics(s in ".{0,40}") {
            let _ = parse_str(&s);
        }

        #[test]
        fn integers_round_trip(n in 0i64..1_000_000_000) {
            prop_assert_eq!(parse_str(&n.to_string()), Some(i128::from(n) * 1000));
            prop_assert_eq!(parse_str(&format!("{n}Ki")), Some(i128::from(n) * 1024 * 1000));
        }
    }
}
