//! Durations, parsed once for the whole crate. Two grammars reach kpssh from users' objects:
//!
//! - Go's `time.ParseDuration` ([`go`]): what Karpenter core parses NodePool durations with
//!   (`expireAfter`, `consolidateAfter`, `terminationGracePeriod`, budget `duration`), so kpssh
//!   accepts and rejects exactly what core does (the oracle tier compares it with Go);
//! - the Go provider's CRD pattern `^([0-9]+(s|m|h))+$` ([`pattern`]): profile timeouts, token
//!   lifetimes and the controller's flags. Each string it accepts is also a Go duration, so it
//!   is checked for its shape and then read by [`go`].
//!
//! The simulation's scenario files add days (`2d`) on top (`crate::sim::scenario`).

use std::time::Duration;

/// Go's `time.ParseDuration`, in nanoseconds; `None` where Go fails (then core could not
/// read the NodePool at all).
pub fn go(s: &str) -> Option<i64> {
    let (neg, mut rest) = match s.as_bytes().first() {
        Some(b'-') => (true, &s[1..]),
        Some(b'+') => (false, &s[1..]),
        _ => (false, s),
    };
    if rest == "0" {
        return Some(0);
    }
    if rest.is_empty() {
        return None;
    }
    let mut total: u64 = 0;
    while !rest.is_empty() {
        let int_len = rest.bytes().take_while(u8::is_ascii_digit).count();
        let (int_part, after) = rest.split_at(int_len);
        let mut v: u64 = 0;
        for d in int_part.bytes() {
            if v > (1 << 63) / 10 {
                return None;
            }
            v = v * 10 + u64::from(d - b'0');
            if v > 1 << 63 {
                return None;
            }
        }
        let mut rest2 = after;
        let (mut frac, mut scale, mut frac_digits) = (0u64, 1f64, false);
        if let Some(f) = rest2.strip_prefix('.') {
            let n = f.bytes().take_while(u8::is_ascii_digit).count();
            let mut overflow = false;
            for d in f[..n].bytes() {
                if overflow || frac > (1 << 63) / 10 {
                    overflow = true;
                    continue;
                }
                let y = frac * 10 + u64::from(d - b'0');
                if y > 1 << 63 {
                    overflow = true;
                    continue;
                }
                frac = y;
                scale *= 10.0;
            }
            frac_digits = n > 0;
            rest2 = &f[n..];
        }
        if int_len == 0 && !frac_digits {
            return None;
        }
        let unit_len = rest2
            .char_indices()
            .find(|(_, c)| *c == '.' || c.is_ascii_digit())
            .map(|(i, _)| i)
            .unwrap_or(rest2.len());
        let unit: u64 = match &rest2[..unit_len] {
            "ns" => 1,
            "us" | "\u{b5}s" | "\u{3bc}s" => 1_000,
            "ms" => 1_000_000,
            "s" => 1_000_000_000,
            "m" => 60_000_000_000,
            "h" => 3_600_000_000_000,
            _ => return None,
        };
        rest = &rest2[unit_len..];
        if v > (1 << 63) / unit {
            return None;
        }
        v *= unit;
        if frac > 0 {
            // Go: float64 arithmetic, truncated.
            v += (frac as f64 * (unit as f64 / scale)) as u64;
            if v > 1 << 63 {
                return None;
            }
        }
        total = total.checked_add(v)?;
        if total > 1 << 63 {
            return None;
        }
    }
    if neg {
        return Some(0i64.wrapping_sub_unsigned(total));
    }
    i64::try_from(total).ok()
}

/// A Karpenter duration field: `None` for `Never`, an empty string, a negative duration or
/// what Go cannot parse.
pub fn karpenter(s: &str) -> Option<Duration> {
    let s = s.trim();
    if s == "Never" {
        return None;
    }
    let nanos = u64::try_from(go(s)?).ok()?;
    Some(Duration::from_nanos(nanos))
}

/// `^([0-9]+(s|m|h))+$` (the Go provider's CRD pattern); `None` for anything else, and for a
/// duration Go could not hold (past 2^63 ns, about 292 years).
pub fn pattern(s: &str) -> Option<Duration> {
    let bytes = s.as_bytes();
    let mut digits = 0usize;
    for &b in bytes {
        match b {
            b'0'..=b'9' => digits += 1,
            b's' | b'm' | b'h' if digits > 0 => digits = 0,
            _ => return None,
        }
    }
    if bytes.is_empty() || digits > 0 {
        return None;
    }
    let nanos = u64::try_from(go(s)?).ok()?;
    Some(Duration::from_nanos(nanos))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn go_durations() {
        assert_eq!(go("720h"), Some(720 * 3_600_000_000_000));
        assert_eq!(go("1h30m"), Some(5_400_000_000_000));
        assert_eq!(go("1.5s"), Some(1_500_000_000));
        assert_eq!(go("-2ms"), Some(-2_000_000));
        assert_eq!(go("0"), Some(0));
        for bad in ["", "1", "h", "1d", ".s", "9999999999999999999h"] {
            assert_eq!(go(bad), None, "{bad}");
        }
    }

    #[test]
    fn karpenter_durations() {
        assert_eq!(karpenter("30s"), Some(Duration::from_secs(30)));
        assert_eq!(karpenter("1.5h"), Some(Duration::from_secs(5400)));
        assert_eq!(karpenter("720h"), Some(Duration::from_secs(720 * 3600)));
        for none in ["Never", "", "5", "5x", "-1s", "5124100000000000h"] {
            assert_eq!(karpenter(none), None, "{none}");
        }
    }

    #[test]
    fn pattern_durations() {
        assert_eq!(pattern("90s"), Some(Duration::from_secs(90)));
        assert_eq!(pattern("1h30m"), Some(Duration::from_secs(5400)));
        assert_eq!(pattern("1h1h"), Some(Duration::from_secs(7200)));
        assert_eq!(pattern("0s"), Some(Duration::ZERO));
        for bad in [
            "",
            "1.5h",
            "500ms",
            "10",
            "m",
            "10d",
            " 10m",
            "-1m",
            "0",
            "1hm",
            "99999999999999999999s",
        ] {
            assert_eq!(pattern(bad), None, "{bad}");
        }
    }
}
