//! Removing secret material from text that leaves the controller (errors, events, logs, status).
//!
//! A phase's stderr may contain the bootstrap token or `KPSSH_SECRET_*` values (a script under
//! `set -x` traces its exports). Everything quoted from a script goes through a [`Redactor`]
//! built for that phase, and [`Redactor::tail`] redacts **before** it truncates, so a secret that
//! straddles the cut can never leave a readable half behind. // S35
//!
//! The transport itself caps output (it keeps the last bytes, see `crate::ssh::capped`), so the
//! text may already start in the middle of a secret, where no whole occurrence is left to find.
//! [`Redactor::redact_window`] (and [`Redactor::tail_output`] built on it) therefore also redact,
//! at an edge where text was cut, any piece that is the end (front edge) or the beginning (back
//! edge) of a secret.

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
        self.redact_window(text, false, false)
    }

    /// [`Redactor::redact`] for a window of a longer text: `cut_front` says bytes before `text`
    /// were dropped, `cut_back` that bytes after it were. At a cut edge, the longest piece that
    /// is the end (front) or the beginning (back) of a secret is redacted as well, also when the
    /// cut split a UTF-8 character (lossy decoding left `U+FFFD` there), so no part of a secret
    /// that straddled the cut survives.
    pub fn redact_window(&self, text: &str, cut_front: bool, cut_back: bool) -> String {
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
        if cut_front && cut_back {
            // Cut on both sides, the window may lie inside one secret.
            let core = text.trim_matches(char::REPLACEMENT_CHARACTER);
            if !core.is_empty() && self.needles.iter().any(|n| n.expose().contains(core)) {
                return PLACEHOLDER.to_string();
            }
        }
        if cut_front {
            let skip = text.len() - text.trim_start_matches(char::REPLACEMENT_CHARACTER).len();
            if let Some(k) = self.longest_piece(&text[skip..], Edge::Front) {
                ranges.push((0, skip + k));
            }
        }
        if cut_back {
            let body = text.trim_end_matches(char::REPLACEMENT_CHARACTER);
            if let Some(k) = self.longest_piece(body, Edge::Back) {
                ranges.push((body.len() - k, text.len()));
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

    /// Length in bytes of the longest proper piece of any secret at the `edge` of `text`: a
    /// suffix of a secret that `text` starts with (front) or a prefix of a secret that `text`
    /// ends with (back).
    fn longest_piece(&self, text: &str, edge: Edge) -> Option<usize> {
        self.needles
            .iter()
            .filter_map(|n| {
                let n = n.expose();
                (1..n.len().min(text.len() + 1))
                    .rev()
                    .find(|&k| match edge {
                        Edge::Front => {
                            n.is_char_boundary(n.len() - k) && text.starts_with(&n[n.len() - k..])
                        }
                        Edge::Back => n.is_char_boundary(k) && text.ends_with(&n[..k]),
                    })
            })
            .max()
    }

    /// The last at most `max_bytes` bytes of a command's captured output stream, redacted:
    /// `dropped` is how many bytes the transport dropped before `bytes` (its cap keeps the end),
    /// so a secret cut there loses its remaining end too. For stderr tails in errors, events and
    /// status.
    pub fn tail_output(&self, bytes: &[u8], dropped: u64, max_bytes: usize) -> String {
        let red = self.redact_window(&String::from_utf8_lossy(bytes), dropped > 0, false);
        tail_str(&red, max_bytes).to_string()
    }

    /// The last at most `max_bytes` bytes of the redacted `text`, cut on a UTF-8 boundary
    /// (for stderr tails in errors and events). Redaction happens first.
    pub fn tail(&self, text: &str, max_bytes: usize) -> String {
        let red = self.redact(text);
        tail_str(&red, max_bytes).to_string()
    }

    /// [`Redactor::tail`] for raw bytes (lossy UTF-8 decoding first). Only for bytes that are
    /// complete; a command's captured stream may have lost its beginning to the transport's
    /// cap: use [`Redactor::tail_output`] for that.
    pub fn tail_bytes(&self, bytes: &[u8], max_bytes: usize) -> String {
        self.tail(&String::from_utf8_lossy(bytes), max_bytes)
    }
}

/// Which edge of a window a cut is at.
#[derive(Clone, Copy)]
enum Edge {
    Front,
    Back,
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

    #[test]
    fn a_secret_cut_at_the_front_or_back_of_a_window_leaves_nothing() {
        // The transport kept "89abcdef rejected": the token's secret half lost its start.
        let r = redactor(&["s3cret-activation-code"]);
        assert_eq!(
            r.redact_window("89abcdef rejected", true, false),
            "<redacted> rejected"
        );
        // Not cut: the same text is left alone (it may just be text).
        assert_eq!(
            r.redact_window("89abcdef rejected", false, false),
            "89abcdef rejected"
        );
        // A head cut inside a secret (what keeping the head would quote).
        assert_eq!(
            r.redact_window("code: s3cret-act", false, true),
            "code: <redacted>"
        );
        // A cut that split a multi-byte character of the secret.
        let r = redactor(&["pässwörd-123"]);
        let bytes = "pässwörd-123 ok".as_bytes();
        let cut = &bytes[6..]; // inside the 'ö'
        let out = r.tail_output(cut, 6, 100);
        assert_eq!(out, "<redacted> ok");
        // Whole occurrences and both edges together; a one-character piece counts too.
        let r = redactor(&["abcdefgh"]);
        assert_eq!(
            r.redact_window("h then abcdefgh then a", true, true),
            "<redacted> then <redacted> then <redacted>"
        );
        assert_eq!(r.tail_output(b"h done", 0, 100), "h done");
        assert_eq!(r.tail_output(b"h done", 1, 100), "<redacted> done");
    }

    fn no_secret_survives(out: &str, secrets: &[String]) -> bool {
        secrets
            .iter()
            .all(|s| s.chars().count() < MIN_SECRET_CHARS || !out.contains(s.as_str()))
            && !out.contains("0123456789abcdef")
    }

    proptest! {
        // #23: a secret straddling either edge of a captured window leaves no character behind:
        // noise is lowercase, secrets are digits and capitals, so after removing placeholders
        // nothing but noise may remain.
        #![proptest_config(ProptestConfig::with_cases(10_000))]
        #[test]
        fn prop_window_edges_never_leak(
            secrets in proptest::collection::vec("[0-9A-Z]{8,24}", 1..4),
            parts in proptest::collection::vec(("[a-z ]{0,10}", 0usize..4), 1..6),
            front in 0usize..200,
            back in 0usize..200,
            keep in 0usize..300,
        ) {
            let mut text = String::new();
            for (noise, pick) in &parts {
                text.push_str(noise);
                text.push_str(&secrets[pick % secrets.len()]);
            }
            let r = Redactor::new(None, &secrets.iter().map(|s| Secret::new(s.as_str())).collect::<Vec<_>>());
            let start = front.min(text.len());
            let end = text.len().saturating_sub(back).max(start);
            let window = &text[start..end];
            let out = r.redact_window(window, start > 0, end < text.len());
            let rest = out.replace(PLACEHOLDER, "");
            prop_assert!(!rest.chars().any(|c| c.is_ascii_digit() || c.is_ascii_uppercase()),
                "window {:?} became {:?}", window, out);
            // The transport's view: the last `keep` bytes, then a tail for an event.
            let kept = &text.as_bytes()[text.len().saturating_sub(keep)..];
            let dropped = (text.len() - kept.len()) as u64;
            let tail = r.tail_output(kept, dropped, 64);
            prop_assert!(tail.len() <= 64);
            let rest = tail.replace(PLACEHOLDER, "");
            prop_assert!(!rest.chars().any(|c| c.is_ascii_digit() || c.is_ascii_uppercase()),
                "kept {:?} became {:?}", String::from_utf8_lossy(kept), tail);
        }
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
