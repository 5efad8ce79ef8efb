//! Removing secret material from text that leaves the controller (errors, events, logs, status).
//!
//! A phase's stderr may contain the bootstrap token or `KPSSH_SECRET_*` values (a script under
//! `set -x` traces its exports). Everything quoted from a script goes through a [`Redactor`]
//! built for that phase, and [`Redactor::tail`] redacts **before** it truncates, so a secret that
//! straddles the cut can never leave a readable half behind. // S35

use crate::secret::Secret;

/// What a secret is replaced with.
pub const PLACEHOLDER: &str = "<redacted>";

/// Secret values shorter than this (in characters) are not redacted: a one-character "secret"
/// would shred every message. The bootstrap token and its secret half are always redacted.
pub const MIN_SECRET_CHARS: usize = 8;

/// Replaces known secret values in text with [`PLACEHOLDER`].
#[derive(Clone, Default)]
pub struct Redactor {
    /// Distinct needles, longest first.
    needles: Vec<Secret>,
}

impl std::fmt::Debug for Redactor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Redactor({} values)", self.needles.len())
    }
}

impl Redactor {
    /// A redactor for the bootstrap token (`<id>.<secret>`: the whole token and the secret half)
    /// and every secret value of at least [`MIN_SECRET_CHARS`] characters.
    pub fn new<'a>(
        token: Option<&Secret>,
        secrets: impl IntoIterator<Item = &'a Secret>,
    ) -> Redactor {
        let mut r = Redactor::default();
        if let Some(t) = token.map(Secret::expose).filter(|t| !t.is_empty()) {
            r.push(t);
            if let Some((_, half)) = t.split_once('.')
                && !half.is_empty()
            {
                r.push(half);
            }
        }
        for s in secrets {
            if s.expose().chars().count() >= MIN_SECRET_CHARS {
                r.push(s.expose());
            }
        }
        r
    }

    /// Adds one more value to redact (any length but empty).
    pub fn push(&mut self, value: &str) {
        if value.is_empty() || self.needles.iter().any(|n| n.expose() == value) {
            return;
        }
        self.needles.push(Secret::new(value));
        self.needles
            .sort_by_key(|n| std::cmp::Reverse(n.expose().len()));
    }

    /// Whether nothing would ever be redacted.
    pub fn is_empty(&self) -> bool {
        self.needles.is_empty()
    }

    /// `text` with every occurrence of every value replaced by [`PLACEHOLDER`]. Overlapping
    /// occurrences (of one value or of two values) merge into one placeholder, so no fragment of
    /// either survives.
    pub fn redact(&self, text: &str) -> String {
        if self.needles.is_empty() {
            return text.to_string();
        }
        let mut ranges: Vec<(usize, usize)> = Vec::new();
        for n in &self.needles {
            let n = n.expose();
            let mut from = 0;
            while let Some(i) = text.get(from..).and_then(|t| t.find(n)) {
                let start = from + i;
                ranges.push((start, start + n.len()));
                // Step one character to also find overlapping occurrences.
                let step = text[start..].chars().next().map_or(1, char::len_utf8);
                from = start + step;
            }
        }
        if ranges.is_empty() {
            return text.to_string();
        }
        ranges.sort_unstable();
        let mut out = String::with_capacity(text.len());
        let mut pos = 0;
        let mut iter = ranges.into_iter().peekable();
        while let Some((s, mut e)) = iter.next() {
            while let Some(&(s2, e2)) = iter.peek() {
                if s2 > e {
                    break;
                }
                e = e.max(e2);
                iter.next();
            }
            out.push_str(&text[pos..s]);
            out.push_str(PLACEHOLDER);
            pos = e;
        }
        out.push_str(&text[pos..]);
        out
    }

    /// The last at most `max_bytes` bytes of the redacted `text`, cut on a UTF-8 boundary
    /// (for stderr tails in errors and events). Redaction happens first.
    pub fn tail(&self, text: &str, max_bytes: usize) -> String {
        let red = self.redact(text);
        tail_str(&red, max_bytes).to_string()
    }

    /// [`Redactor::tail`] for raw bytes (lossy UTF-8 decoding first).
    pub fn tail_bytes(&self, bytes: &[u8], max_bytes: usize) -> String {
        self.tail(&String::from_utf8_lossy(bytes), max_bytes)
    }
}

/// The longest suffix of `s` that is at most `max_bytes` long and starts on a char boundary.
pub fn tail_str(s: &str, max_bytes: usize) -> &str {
    if s.len() <= max_bytes {
        return s;
    }
    let mut start = s.len() - max_bytes;
    while !s.is_char_boundary(start) {
        start += 1;
    }
    &s[start..]
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const TOKEN: &str = "abcdef.0123456789abcdef";

    fn redactor(secrets: &[&str]) -> Redactor {
        let s: Vec<Secret> = secrets.iter().map(|s| Secret::new(*s)).collect();
        Redactor::new(Some(&Secret::new(TOKEN)), &s)
    }

    #[test]
    fn token_whole_and_secret_half() {
        // S35
        let r = redactor(&[]);
        let out = r.redact(
            "+ export KPSSH_BOOTSTRAP_TOKEN=abcdef.0123456789abcdef\ntoken 0123456789abcdef",
        );
        assert!(!out.contains("0123456789abcdef"), "{out}");
        assert_eq!(
            out,
            "+ export KPSSH_BOOTSTRAP_TOKEN=<redacted>\ntoken <redacted>"
        );
        // The id alone is not secret.
        assert_eq!(r.redact("id abcdef"), "id abcdef");
    }

    #[test]
    fn secrets_of_eight_chars_or_more() {
        // S35
        let r = redactor(&["s3cret-activation-code", "short", "exactly8"]);
        assert_eq!(
            r.redact("nodeadm --code s3cret-activation-code short exactly8"),
            "nodeadm --code <redacted> short <redacted>"
        );
    }

    #[test]
    fn overlapping_values_leave_no_fragment() {
        let r = redactor(&["abcdefgh", "efghijkl"]);
        assert_eq!(r.redact("xxabcdefghijklyy"), "xx<redacted>yy");
        let r = redactor(&["aaaaaaaa"]);
        assert_eq!(r.redact("aaaaaaaaa!"), "<redacted>!");
    }

    #[test]
    fn tail_redacts_before_truncating() {
        // S35: the token straddles the cut; truncating first would keep "456789abcdef".
        let r = redactor(&[]);
        let text = format!("error: {TOKEN} rejected");
        let t = r.tail(&text, 20);
        assert!(!t.contains("456789"), "{t}");
        assert!(t.len() <= 20);
        assert!(t.ends_with(" rejected"));
    }

    #[test]
    fn tail_cuts_on_char_boundaries() {
        let r = Redactor::default();
        assert_eq!(r.tail("ääää", 3), "ä");
        assert_eq!(r.tail("ääää", 4), "ää");
        assert_eq!(r.tail("abc", 10), "abc");
        assert_eq!(r.tail("abc", 0), "");
        assert_eq!(r.tail_bytes(b"ab\xffc", 10), "ab\u{fffd}c");
    }

    #[test]
    fn debug_never_shows_values() {
        let r = redactor(&["s3cret-activation-code"]);
        let d = format!("{r:?}");
        assert!(!d.contains("s3cret") && !d.contains("0123456789"), "{d}");
    }

    fn no_secret_survives(out: &str, secrets: &[String]) -> bool {
        secrets
            .iter()
            .all(|s| s.chars().count() < MIN_SECRET_CHARS || !out.contains(s.as_str()))
            && !out.contains("0123456789abcdef")
    }

    proptest! {
        // S35: no secret of >= 8 chars survives redaction.
        #[test]
        fn prop_redact_removes_every_secret(
            secrets in proptest::collection::vec("[a-zA-Z0-9é]{1,16}", 0..4),
            parts in proptest::collection::vec(("[a-z é\n]{0,12}", 0usize..6), 0..8),
        ) {
            let all: Vec<String> = secrets.iter().cloned().chain([TOKEN.to_string(), "0123456789abcdef".to_string()]).collect();
            let mut text = String::new();
            for (noise, pick) in &parts {
                text.push_str(noise);
                if let Some(s) = all.get(*pick) { text.push_str(s); }
            }
            let r = redactor(&secrets.iter().map(String::as_str).collect::<Vec<_>>());
            let out = r.redact(&text);
            prop_assert!(no_secret_survives(&out, &secrets), "{:?}", out);
        }

        // S35: after redaction + truncation at any length, no secret and no tail fragment of
        // a secret that straddled the cut survives.
        #[test]
        fn prop_tail_never_leaks(
            secrets in proptest::collection::vec("[a-z0-9]{8,20}", 1..3),
            prefix in "[a-z ]{0,20}",
            suffix in "[a-z ]{0,20}",
            max in 0usize..80,
        ) {
            let text = format!("{prefix}{}{}{TOKEN}{suffix}", secrets[0], secrets.last().map(String::as_str).unwrap_or(""));
            let r = redactor(&secrets.iter().map(String::as_str).collect::<Vec<_>>());
            let out = r.tail(&text, max);
            prop_assert!(out.len() <= max);
            prop_assert!(no_secret_survives(&out, &secrets), "{:?}", out);
            // A secret cut in half by the truncation would show up as one of its suffixes
            // right at the start of the tail; only placeholder/noise may be there.
            let red = r.redact(&text);
            prop_assert!(red.ends_with(&out));
            for s in secrets.iter().map(String::as_str).chain([TOKEN, "0123456789abcdef"]) {
                for k in 4..s.len() {
                    let frag = &s[s.len() - k..];
                    prop_assert!(!out.starts_with(frag) || prefix.contains(frag) || suffix.contains(frag) || PLACEHOLDER.contains(frag),
                        "fragment {:?} of a secret at the cut: {:?}", frag, out);
                }
            }
        }
    }
}
