//! Host-key pins: parsing the Secret's `knownHost` and checking a presented key against a pin.
//!
//! `knownHost` accepts three forms (several lines are alternatives, any one may match):
//! - a fingerprint `SHA256:<base64>` (padding optional),
//! - a known_hosts line `patterns keytype base64 [comment]`, where patterns is a comma list of
//!   globs (`*`, `?`, `!negation`) or a hashed entry `|1|<b64 salt>|<b64 HMAC-SHA1>`; the host
//!   name matched is `address` for port 22 and `[address]:port` otherwise, as OpenSSH writes it,
//! - a public-key line `keytype base64 [comment]`.

use base64::Engine as _;
use base64::engine::general_purpose::{STANDARD, STANDARD_NO_PAD};
use hmac::{Hmac, KeyInit, Mac};
use russh::keys::ssh_key::{HashAlg, PublicKey};
use sha2::{Digest, Sha256};

use crate::ssh::transport::HostKeyPin;

/// `SHA256:` + unpadded base64 of the SHA-256 of the key's wire encoding (43 characters).
pub fn fingerprint(key: &PublicKey) -> String {
    key.fingerprint(HashAlg::Sha256).to_string()
}

/// Fingerprint of a public key given as wire-format bytes.
pub fn fingerprint_of_blob(blob: &[u8]) -> String {
    format!("SHA256:{}", STANDARD_NO_PAD.encode(Sha256::digest(blob)))
}

/// Canonical form of a `SHA256:` fingerprint (padding stripped), or why it is not one.
pub fn normalize_fingerprint(text: &str) -> Result<String, String> {
    let t = text.trim();
    let Some(b64) = t.strip_prefix("SHA256:") else {
        return Err("fingerprint must start with SHA256:".into());
    };
    let b64 = b64.trim_end_matches('=');
    match STANDARD_NO_PAD.decode(b64) {
        Ok(d) if d.len() == 32 => Ok(format!("SHA256:{b64}")),
        _ => Err("fingerprint is not SHA256: + 43 base64 characters".into()),
    }
}

/// The name OpenSSH matches known_hosts patterns against.
pub fn host_pattern_name(address: &str, port: u16) -> String {
    if port == 22 {
        address.to_string()
    } else {
        format!("[{address}]:{port}")
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum Hosts {
    Hashed { salt: Vec<u8>, hash: Vec<u8> },
    Plain(Vec<String>),
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum Entry {
    Fingerprint(String),
    Key {
        hosts: Option<Hosts>,
        fingerprint: String,
    },
}

/// A parsed `knownHost` value.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KnownHost {
    entries: Vec<Entry>,
}

fn is_key_type(word: &str) -> bool {
    word.starts_with("ssh-")
        || word.starts_with("ecdsa-sha2-")
        || word.starts_with("sk-")
        || word.starts_with("rsa-sha2-")
}

fn parse_key(words: &[&str]) -> Result<String, String> {
    let (Some(kind), Some(b64)) = (words.first(), words.get(1)) else {
        return Err("public key line needs a key type and base64 key".into());
    };
    let blob = STANDARD
        .decode(b64)
        .map_err(|_| "public key is not valid base64".to_string())?;
    // Cross-check with ssh-key so that a truncated or mistyped key is rejected up front.
    let key = PublicKey::from_openssh(&format!("{kind} {b64}"))
        .map_err(|_| format!("cannot parse {kind} public key"))?;
    let fp = fingerprint(&key);
    debug_assert_eq!(fp, fingerprint_of_blob(&blob));
    Ok(fp)
}

fn parse_hosts(field: &str) -> Result<Hosts, String> {
    if let Some(rest) = field.strip_prefix("|1|") {
        let (salt, hash) = rest
            .split_once('|')
            .ok_or_else(|| "hashed host entry must be |1|salt|hash".to_string())?;
        let salt = STANDARD
            .decode(salt)
            .map_err(|_| "hashed host salt is not base64".to_string())?;
        let hash = STANDARD
            .decode(hash)
            .map_err(|_| "hashed host hash is not base64".to_string())?;
        if hash.len() != 20 {
            return Err("hashed host hash must be 20 bytes (HMAC-SHA1)".into());
        }
        Ok(Hosts::Hashed { salt, hash })
    } else if field.starts_with('|') {
        Err("unsupported hashed host entry (only |1| is known)".into())
    } else {
        Ok(Hosts::Plain(field.split(',').map(str::to_string).collect()))
    }
}

/// Glob match with `*` and `?` (ASCII case-insensitive, as OpenSSH does for host names).
fn glob(pattern: &[u8], name: &[u8]) -> bool {
    let (mut p, mut n) = (0usize, 0usize);
    let (mut star, mut mark) = (None, 0usize);
    while n < name.len() {
        if p < pattern.len() && (pattern[p] == b'?' || pattern[p].eq_ignore_ascii_case(&name[n])) {
            p += 1;
            n += 1;
        } else if p < pattern.len() && pattern[p] == b'*' {
            star = Some(p);
            mark = n;
            p += 1;
        } else if let Some(s) = star {
            p = s + 1;
            mark += 1;
            n = mark;
        } else {
            return false;
        }
    }
    while p < pattern.len() && pattern[p] == b'*' {
        p += 1;
    }
    p == pattern.len()
}

impl Hosts {
    fn matches(&self, name: &str) -> bool {
        match self {
            Hosts::Hashed { salt, hash } => {
                let Ok(mut mac) = <Hmac<sha1::Sha1> as KeyInit>::new_from_slice(salt) else {
                    return false;
                };
                mac.update(name.as_bytes());
                mac.verify_slice(hash).is_ok()
            }
            Hosts::Plain(patterns) => {
                let mut positive = false;
                for p in patterns {
                    if let Some(neg) = p.strip_prefix('!') {
                        if glob(neg.as_bytes(), name.as_bytes()) {
                            return false;
                        }
                    } else if glob(p.as_bytes(), name.as_bytes()) {
                        positive = true;
                    }
                }
                positive
            }
        }
    }
}

impl KnownHost {
    /// Parse a `knownHost` value. Errors never quote the input beyond a key type.
    pub fn parse(text: &str) -> Result<KnownHost, String> {
        let mut entries = Vec::new();
        for line in text.lines() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            if line.starts_with("SHA256:") {
                entries.push(Entry::Fingerprint(normalize_fingerprint(line)?));
                continue;
            }
            let words: Vec<&str> = line.split_whitespace().collect();
            if words[0].starts_with('@') {
                return Err(format!(
                    "known_hosts marker {} is not supported",
                    words[0].chars().take(20).collect::<String>()
                ));
            }
            if is_key_type(words[0]) {
                entries.push(Entry::Key {
                    hosts: None,
                    fingerprint: parse_key(&words)?,
                });
            } else {
                let hosts = parse_hosts(words[0])?;
                entries.push(Entry::Key {
                    hosts: Some(hosts),
                    fingerprint: parse_key(&words[1..])?,
                });
            }
        }
        if entries.is_empty() {
            return Err("knownHost is empty".into());
        }
        Ok(KnownHost { entries })
    }

    /// Whether the key with fingerprint `actual` presented by `address:port` is accepted.
    pub fn accepts(&self, address: &str, port: u16, actual: &str) -> bool {
        let name = host_pattern_name(address, port);
        self.entries.iter().any(|e| match e {
            Entry::Fingerprint(fp) => fp == actual,
            Entry::Key { hosts, fingerprint } => {
                fingerprint == actual && hosts.as_ref().is_none_or(|h| h.matches(&name))
            }
        })
    }

    /// Human-readable description of what is expected (fingerprints only).
    pub fn describe(&self, address: &str, port: u16) -> String {
        let name = host_pattern_name(address, port);
        let mut parts = Vec::new();
        for e in &self.entries {
            match e {
                Entry::Fingerprint(fp) => parts.push(fp.clone()),
                Entry::Key {
                    hosts: None,
                    fingerprint,
                } => parts.push(fingerprint.clone()),
                Entry::Key {
                    hosts: Some(h),
                    fingerprint,
                } => {
                    if h.matches(&name) {
                        parts.push(fingerprint.clone());
                    } else {
                        parts.push(format!("{fingerprint} (known_hosts entry not for {name})"));
                    }
                }
            }
        }
        parts.join(" or ")
    }
}

/// A host-key pin ready to check keys.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PinCheck {
    KnownHost(KnownHost),
    Fingerprint(String),
    TrustOnFirstUse,
}

impl PinCheck {
    pub fn from_pin(pin: &HostKeyPin) -> Result<PinCheck, String> {
        Ok(match pin {
            HostKeyPin::KnownHost(text) => PinCheck::KnownHost(KnownHost::parse(text)?),
            HostKeyPin::Fingerprint(fp) => PinCheck::Fingerprint(normalize_fingerprint(fp)?),
            HostKeyPin::TrustOnFirstUse => PinCheck::TrustOnFirstUse,
        })
    }

    /// `Ok(())` if `actual` is acceptable, else the description of what was expected.
    pub fn verify(&self, address: &str, port: u16, actual: &str) -> Result<(), String> {
        match self {
            PinCheck::TrustOnFirstUse => Ok(()),
            PinCheck::Fingerprint(fp) if fp == actual => Ok(()),
            PinCheck::Fingerprint(fp) => Err(fp.clone()),
            PinCheck::KnownHost(k) if k.accepts(address, port, actual) => Ok(()),
            PinCheck::KnownHost(k) => Err(k.describe(address, port)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // A throwaway ed25519 public key (generated for these tests; no private half kept).
    const KEY: &str =
        "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIIkennrmbTHLh+J7OAxAPml2lNm9pFsFjmyquO4ofwze";
    const OTHER: &str =
        "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIDyTaq7H/OYlAlkGT6NvHgPK5jhRarvPPDXCoKe08vBF";

    fn fp(line: &str) -> String {
        fingerprint(&PublicKey::from_openssh(line).expect("key"))
    }

    fn hashed(name: &str, salt: &[u8]) -> String {
        let mut mac = <Hmac<sha1::Sha1> as KeyInit>::new_from_slice(salt).expect("hmac");
        mac.update(name.as_bytes());
        let h = mac.finalize().into_bytes();
        format!("|1|{}|{}", STANDARD.encode(salt), STANDARD.encode(h))
    }

    #[test]
    fn fingerprint_format() {
        let f = fp(KEY);
        assert!(f.starts_with("SHA256:"));
        assert_eq!(f.len(), 7 + 43);
        assert_eq!(normalize_fingerprint(&format!("{f}=")).expect("ok"), f);
        assert!(normalize_fingerprint("SHA256:abc").is_err());
        assert!(normalize_fingerprint("MD5:aa:bb").is_err());
        let blob = STANDARD
            .decode(KEY.split_whitespace().nth(1).expect("b64"))
            .expect("b64");
        assert_eq!(fingerprint_of_blob(&blob), f);
    }

    #[test]
    fn three_forms() {
        let good = fp(KEY);
        let bad = fp(OTHER);
        let forms = [
            good.clone(),
            format!("{KEY} comment here"),
            format!("10.0.0.5 {KEY}"),
            format!("[10.0.0.5]:2222,other {KEY}"),
            format!("{} {KEY}", hashed("10.0.0.5", b"0123456789abcdefghij")),
        ];
        for (i, f) in forms.iter().enumerate() {
            let k = KnownHost::parse(f).expect("parse");
            let port = if i == 3 { 2222 } else { 22 };
            assert!(k.accepts("10.0.0.5", port, &good), "{f}");
            assert!(!k.accepts("10.0.0.5", port, &bad), "{f}");
        }
    }

    #[test]
    fn host_patterns_must_match() {
        let good = fp(KEY);
        let k = KnownHost::parse(&format!("10.0.0.5 {KEY}")).expect("parse");
        assert!(!k.accepts("10.0.0.6", 22, &good));
        assert!(!k.accepts("10.0.0.5", 2222, &good));
        let h = KnownHost::parse(&format!("{} {KEY}", hashed("[h.example]:2200", b"salt")))
            .expect("parse");
        assert!(h.accepts("h.example", 2200, &good));
        assert!(!h.accepts("h.example", 22, &good));
        let w = KnownHost::parse(&format!("*.example,!bad.example {KEY}")).expect("parse");
        assert!(w.accepts("A.example", 22, &good));
        assert!(!w.accepts("bad.example", 22, &good));
        assert!(!w.accepts("example", 22, &good));
        assert!(k.describe("10.0.0.6", 22).contains("not for 10.0.0.6"));
    }

    #[test]
    fn several_lines_are_alternatives() {
        let k = KnownHost::parse(&format!("# comment\n{OTHER}\n\n{KEY}\n")).expect("parse");
        assert!(k.accepts("x", 22, &fp(KEY)));
        assert!(k.accepts("x", 22, &fp(OTHER)));
    }

    #[test]
    fn invalid_inputs() {
        for bad in [
            "",
            "   \n# only comment",
            "ssh-ed25519",
            "ssh-ed25519 !!!notbase64",
            "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIIkennrmbTHLh",
            "host",
            "|1|abc|def ssh-ed25519 AAAA",
            "|2|x|y ssh-ed25519 AAAA",
            "@cert-authority * ssh-ed25519 AAAA",
            "SHA256:tooshort",
        ] {
            assert!(KnownHost::parse(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn pin_precedence_and_verify() {
        let good = fp(KEY);
        assert_eq!(
            HostKeyPin::from_sources(Some(KEY), Some(&good)),
            HostKeyPin::KnownHost(KEY.into())
        );
        assert_eq!(
            HostKeyPin::from_sources(Some("  "), Some(&good)),
            HostKeyPin::Fingerprint(good.clone())
        );
        assert_eq!(
            HostKeyPin::from_sources(None, None),
            HostKeyPin::TrustOnFirstUse
        );
        let p = PinCheck::from_pin(&HostKeyPin::Fingerprint(good.clone())).expect("pin");
        assert!(p.verify("a", 22, &good).is_ok());
        assert_eq!(p.verify("a", 22, &fp(OTHER)), Err(good.clone()));
        assert!(PinCheck::TrustOnFirstUse.verify("a", 22, "x").is_ok());
    }

    mod properties {
        use super::*;
        use proptest::prelude::*;

        proptest! {
            /// Hostile knownHost text never panics the parser, and whatever parses never
            /// accepts a key other than the one it names.
            #[test]
            fn parsing_never_panics_and_never_accepts_a_stranger(text in "[ -~|]{0,120}") {
                if let Ok(k) = KnownHost::parse(&text) {
                    prop_assert!(!k.accepts("a", 22, &fp(OTHER)) || text.contains(&fp(OTHER)[7..]) || text.contains(OTHER.split(' ').nth(1).unwrap_or("-")));
                }
            }

            #[test]
            fn hashed_entries_match_only_their_host(host in "[a-z0-9.]{1,20}", other in "[a-z0-9.]{1,20}", salt in proptest::collection::vec(any::<u8>(), 20)) {
                let line = format!("{} {KEY}", hashed(&host_pattern_name(&host, 22), &salt));
                let k = KnownHost::parse(&line).expect("hashed line parses");
                prop_assert!(k.accepts(&host, 22, &fp(KEY)));
                prop_assert!(!k.accepts(&host, 22, &fp(OTHER)));
                if other != host {
                    prop_assert!(!k.accepts(&other, 22, &fp(KEY)));
                }
            }
        }
    }
}
