//! text/template's escaping functions on Go strings (bytes): `html`, `js`, `urlquery`.

use super::fmt::{Out, runes};
use super::unicode_print::is_print;

/// Go's `HTMLEscape` (text/template's `html`): `"`, `'`, `&`, `<`, `>` as entities and NUL
/// as U+FFFD, byte by byte.
pub(super) fn html_escape(s: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(s.len());
    for &b in s {
        match b {
            0 => out.put('\u{fffd}'),
            b'"' => out.put_str("&#34;"),
            b'\'' => out.put_str("&#39;"),
            b'&' => out.put_str("&amp;"),
            b'<' => out.put_str("&lt;"),
            b'>' => out.put_str("&gt;"),
            b => out.push(b),
        }
    }
    out
}

/// Go's `url.QueryEscape`: unreserved bytes (`A-Z a-z 0-9 - _ . ~`) stay, a space becomes `+`,
/// every other byte `%XX`.
pub(super) fn query_escape(s: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(s.len());
    for &b in s {
        match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => out.push(b),
            b' ' => out.push(b'+'),
            b => out.put_str(&format!("%{b:02X}")),
        }
    }
    out
}

/// Go's `JSEscape` (text/template's `js`): `\` `'` `"` as backslash escapes, `<` `>` `&` `=`
/// and every control character below U+0020 as `\u00XX`; other runes ≥ U+0080 stay when Go's
/// `unicode.IsPrint` holds, else `\uXXXX` (`%04X`: five or six digits past U+FFFF); a byte of
/// invalid UTF-8 is Go's `RuneError`, which is printable, so the byte stays as it is.
pub(super) fn js_escape(s: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(s.len());
    for (c, bytes) in runes(s) {
        match c {
            Some('\\') => out.put_str("\\\\"),
            Some('\'') => out.put_str("\\'"),
            Some('"') => out.put_str("\\\""),
            Some('<') => out.put_str("\\u003C"),
            Some('>') => out.put_str("\\u003E"),
            Some('&') => out.put_str("\\u0026"),
            Some('=') => out.put_str("\\u003D"),
            Some(c) if u32::from(c) < 0x20 => out.put_str(&format!("\\u00{:02X}", u32::from(c))),
            Some(c) if u32::from(c) < 0x80 || is_print(c) => out.extend_from_slice(bytes),
            Some(c) => out.put_str(&format!("\\u{:04X}", u32::from(c))),
            None => out.extend_from_slice(bytes),
        }
    }
    out
}
