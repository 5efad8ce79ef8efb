//! Controller-side verification of armored OpenSSH signatures (SSHSIG).
//!
//! A verified profile carries, per phase, an armored `-----BEGIN SSH SIGNATURE-----` blob produced
//! by `ssh-keygen -Y sign -n kpssh`. Before the controller opens an SSH session to a host in
//! `execMode: Verified` it checks that blob here against the host's `spec.trustedSigners`; the
//! host-side shim then checks it again with stock `ssh-keygen -Y verify`.
//!
//! Accepted: namespace `kpssh`, hash `sha256`/`sha512`, keys `ssh-ed25519`,
//! `ecdsa-sha2-nistp256/384/521`, `ssh-rsa` keys with `rsa-sha2-256`/`rsa-sha2-512` signatures
//! (SHA-1 `ssh-rsa` signatures are refused), and the FIDO variants `sk-ssh-ed25519@openssh.com`
//! and `sk-ecdsa-sha2-nistp256@openssh.com` (which must carry the user-presence flag, as
//! `ssh-keygen -Y verify` requires by default). Certificates, DSA and unknown key types are
//! refused.

use russh::keys::ssh_key::{Algorithm, HashAlg, PublicKey, SshSig, public::KeyData};

/// The SSHSIG namespace every kpssh signature must use.
pub const NAMESPACE: &str = "kpssh";

/// `spec.trustedSigners` holds at most this many keys.
pub const MAX_TRUSTED_SIGNERS: usize = 16;

/// Armored signatures longer than this are refused before parsing.
pub const MAX_ARMORED_LEN: usize = 64 * 1024;

/// RSA signer keys shorter than this are refused.
pub const MIN_RSA_BITS: u32 = 2048;

/// FIDO signature flag: the user was present (touched the authenticator).
const SK_USER_PRESENT: u8 = 0x01;
/// FIDO signatures end with `flags (1 byte) || counter (4 bytes)`.
const SK_TRAILER_LEN: usize = 5;

/// Why a signature or a trusted-signer list was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SigError {
    /// No signature was given for a phase that must be signed.
    #[error("the script is not signed")]
    Missing,
    /// The armored text is too long to be a signature.
    #[error("armored signature is {len} bytes, more than the {max}-byte limit")]
    TooLarge {
        /// Actual length.
        len: usize,
        /// Limit.
        max: usize,
    },
    /// Not a well-formed `-----BEGIN SSH SIGNATURE-----` blob.
    #[error("malformed SSH signature: {0}")]
    Malformed(String),
    /// The SSHSIG version is not 1.
    #[error("unsupported SSHSIG version {0}")]
    Version(u32),
    /// The signature was made for another namespace.
    #[error("signature namespace is {found:?}, expected \"kpssh\"")]
    Namespace {
        /// Namespace found in the signature.
        found: String,
    },
    /// RSA signature using SHA-1 (`ssh-rsa`).
    #[error("RSA signature uses SHA-1 (ssh-rsa); only rsa-sha2-256 and rsa-sha2-512 are accepted")]
    Sha1Rsa,
    /// Key or signature algorithm kpssh does not accept.
    #[error("unsupported signature algorithm {0}")]
    UnsupportedAlgorithm(String),
    /// The signature's algorithm does not belong to the signing key's type.
    #[error("signature algorithm {signature} does not match key type {key}")]
    AlgorithmMismatch {
        /// Key algorithm.
        key: String,
        /// Signature algorithm.
        signature: String,
    },
    /// A FIDO signature without the user-presence flag.
    #[error("FIDO signature lacks the user-presence flag")]
    SkUserPresence,
    /// The signing key is not one of the trusted signers.
    #[error("signer {fingerprint} is not a trusted signer")]
    UntrustedSigner {
        /// SHA256 fingerprint of the key that made the signature.
        fingerprint: String,
    },
    /// The cryptographic check failed: the message is not the one that was signed.
    #[error("signature does not verify (content differs from what was signed)")]
    BadSignature,
    /// `execMode: Verified` needs at least one trusted signer.
    #[error("no trusted signers configured")]
    NoTrustedSigners,
    /// More than [`MAX_TRUSTED_SIGNERS`] keys.
    #[error("{0} trusted signers given, at most 16 are allowed")]
    TooManySigners(usize),
    /// A trusted-signer entry is not a usable OpenSSH public key line.
    #[error("trustedSigners[{index}]: {reason}")]
    BadTrustedSigner {
        /// Position in the list.
        index: usize,
        /// What is wrong with it.
        reason: String,
    },
}

/// Parse an armored SSHSIG blob without checking who signed it or what.
///
/// Structural checks only: size, armor, version 1, namespace `kpssh`, a supported
/// key/signature algorithm pair (SHA-1 RSA refused).
pub fn parse_armored(armored: &str) -> Result<SshSig, SigError> {
    let trimmed = armored.trim();
    if trimmed.is_empty() {
        return Err(SigError::Missing);
    }
    if armored.len() > MAX_ARMORED_LEN {
        return Err(SigError::TooLarge {
            len: armored.len(),
            max: MAX_ARMORED_LEN,
        });
    }
    let sig =
        SshSig::from_pem(trimmed.as_bytes()).map_err(|e| SigError::Malformed(e.to_string()))?;
    if sig.version() != SshSig::VERSION {
        return Err(SigError::Version(sig.version()));
    }
    if sig.namespace() != NAMESPACE {
        return Err(SigError::Namespace {
            found: sig.namespace().to_owned(),
        });
    }
    check_algorithms(sig.public_key(), &sig.algorithm())?;
    Ok(sig)
}

fn check_algorithms(key: &KeyData, sig_alg: &Algorithm) -> Result<(), SigError> {
    let mismatch = || SigError::AlgorithmMismatch {
        key: key.algorithm().to_string(),
        signature: sig_alg.to_string(),
    };
    match (key, sig_alg) {
        (KeyData::Ed25519(_), Algorithm::Ed25519) => Ok(()),
        (KeyData::Ecdsa(k), Algorithm::Ecdsa { curve }) if k.curve() == *curve => Ok(()),
        (KeyData::Rsa(_), Algorithm::Rsa { hash: None }) => Err(SigError::Sha1Rsa),
        (KeyData::Rsa(_), Algorithm::Rsa { hash: Some(_) }) => Ok(()),
        (KeyData::SkEd25519(_), Algorithm::SkEd25519) => Ok(()),
        (KeyData::SkEcdsaSha2NistP256(_), Algorithm::SkEcdsaSha2NistP256) => Ok(()),
        (KeyData::Ed25519(_) | KeyData::Ecdsa(_) | KeyData::Rsa(_), _)
        | (KeyData::SkEd25519(_) | KeyData::SkEcdsaSha2NistP256(_), _) => Err(mismatch()),
        _ => Err(SigError::UnsupportedAlgorithm(key.algorithm().to_string())),
    }
}

fn check_key_type(key: &KeyData) -> Result<(), String> {
    match key {
        KeyData::Ed25519(_)
        | KeyData::Ecdsa(_)
        | KeyData::SkEd25519(_)
        | KeyData::SkEcdsaSha2NistP256(_) => Ok(()),
        KeyData::Rsa(k) if k.key_size() >= MIN_RSA_BITS => Ok(()),
        KeyData::Rsa(k) => Err(format!(
            "RSA key has {} bits, at least {MIN_RSA_BITS} are required",
            k.key_size()
        )),
        other => Err(format!(
            "key type {} is not accepted as a signer",
            other.algorithm()
        )),
    }
}

/// Who made a signature that verified.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VerifiedSigner {
    /// `SHA256:…` fingerprint of the signing key.
    pub fingerprint: String,
    /// Key algorithm name, e.g. `ssh-ed25519`.
    pub algorithm: String,
    /// Index of the matching entry in the trusted-signer list.
    pub index: usize,
}

/// A validated `spec.trustedSigners` list.
#[derive(Debug, Clone)]
pub struct TrustedSigners {
    keys: Vec<PublicKey>,
}

impl TrustedSigners {
    /// Parse OpenSSH public key lines (`<type> <base64> [comment]`), 1 to 16 of them.
    pub fn parse<S: AsRef<str>>(lines: &[S]) -> Result<Self, SigError> {
        if lines.is_empty() {
            return Err(SigError::NoTrustedSigners);
        }
        if lines.len() > MAX_TRUSTED_SIGNERS {
            return Err(SigError::TooManySigners(lines.len()));
        }
        let mut keys = Vec::with_capacity(lines.len());
        for (index, line) in lines.iter().enumerate() {
            let line = line.as_ref().trim();
            let bad = |reason: String| SigError::BadTrustedSigner { index, reason };
            if line.len() > MAX_ARMORED_LEN {
                return Err(bad("entry is too long".into()));
            }
            let key = PublicKey::from_openssh(line).map_err(|e| bad(e.to_string()))?;
            check_key_type(key.key_data()).map_err(bad)?;
            keys.push(key);
        }
        Ok(Self { keys })
    }

    /// Number of trusted keys.
    pub fn len(&self) -> usize {
        self.keys.len()
    }

    /// Always false: a parsed list holds at least one key.
    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }

    /// Verify `armored` as a `kpssh`-namespace signature over exactly `message` by one of the
    /// trusted signers.
    pub fn verify(&self, armored: &str, message: &[u8]) -> Result<VerifiedSigner, SigError> {
        let sig = parse_armored(armored)?;
        let signer = sig.public_key();
        let Some((index, key)) = self
            .keys
            .iter()
            .enumerate()
            .find(|(_, k)| k.key_data() == signer)
        else {
            return Err(SigError::UntrustedSigner {
                fingerprint: signer.fingerprint(HashAlg::Sha256).to_string(),
            });
        };
        if matches!(
            signer,
            KeyData::SkEd25519(_) | KeyData::SkEcdsaSha2NistP256(_)
        ) {
            let bytes = sig.signature_bytes();
            let flags = bytes
                .len()
                .checked_sub(SK_TRAILER_LEN)
                .and_then(|i| bytes.get(i))
                .copied()
                .ok_or(SigError::BadSignature)?;
            if flags & SK_USER_PRESENT == 0 {
                return Err(SigError::SkUserPresence);
            }
        }
        key.verify(NAMESPACE, message, &sig).map_err(|e| match e {
            russh::keys::ssh_key::Error::AlgorithmUnknown
            | russh::keys::ssh_key::Error::AlgorithmUnsupported { .. } => {
                SigError::UnsupportedAlgorithm(sig.algorithm().to_string())
            }
            _ => SigError::BadSignature,
        })?;
        Ok(VerifiedSigner {
            fingerprint: signer.fingerprint(HashAlg::Sha256).to_string(),
            algorithm: signer.algorithm().to_string(),
            index,
        })
    }
}

/// Convert an OpenSSH public key line into an `allowed_signers` line for the host shim
/// (principal `kpssh`, restricted to the `kpssh` namespace).
pub fn allowed_signers_line(public_key_line: &str) -> Result<String, SigError> {
    let key = PublicKey::from_openssh(public_key_line.trim()).map_err(|e| {
        SigError::BadTrustedSigner {
            index: 0,
            reason: e.to_string(),
        }
    })?;
    check_key_type(key.key_data())
        .map_err(|reason| SigError::BadTrustedSigner { index: 0, reason })?;
    let mut bare = PublicKey::from(key.key_data().clone());
    bare.set_comment("");
    let text = bare.to_openssh().map_err(|e| SigError::BadTrustedSigner {
        index: 0,
        reason: e.to_string(),
    })?;
    Ok(format!("kpssh namespaces=\"kpssh\" {}", text.trim()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use russh::keys::ssh_key::private::{Ed25519Keypair, KeypairData};
    use russh::keys::ssh_key::{LineEnding, PrivateKey, Signature, public::SkEd25519};

    fn ed25519(seed: u8) -> PrivateKey {
        let kp = Ed25519Keypair::from_seed(&[seed; 32]);
        PrivateKey::new(KeypairData::Ed25519(kp), "test").expect("key")
    }

    fn sign(key: &PrivateKey, ns: &str, msg: &[u8]) -> String {
        key.sign(ns, HashAlg::Sha512, msg)
            .expect("sign")
            .to_pem(LineEnding::LF)
            .expect("pem")
    }

    fn trusted(key: &PrivateKey) -> TrustedSigners {
        TrustedSigners::parse(&[key.public_key().to_openssh().expect("openssh")]).expect("parse")
    }

    #[test]
    fn ed25519_round_trip() {
        let k = ed25519(1);
        let sig = sign(&k, NAMESPACE, b"echo hi\n");
        let v = trusted(&k).verify(&sig, b"echo hi\n").expect("verifies");
        assert_eq!(v.algorithm, "ssh-ed25519");
        assert_eq!(v.index, 0);
        assert_eq!(
            trusted(&k).verify(&sig, b"echo hI\n"),
            Err(SigError::BadSignature)
        );
    }

    #[test]
    fn wrong_namespace_and_rogue() {
        let k = ed25519(1);
        let sig = sign(&k, "file", b"x");
        assert!(matches!(
            trusted(&k).verify(&sig, b"x"),
            Err(SigError::Namespace { .. })
        ));
        let rogue = ed25519(2);
        let sig = sign(&rogue, NAMESPACE, b"x");
        assert!(matches!(
            trusted(&k).verify(&sig, b"x"),
            Err(SigError::UntrustedSigner { .. })
        ));
    }

    #[test]
    fn signer_list_limits() {
        let none: [&str; 0] = [];
        assert_eq!(
            TrustedSigners::parse(&none).unwrap_err(),
            SigError::NoTrustedSigners
        );
        let k = ed25519(3).public_key().to_openssh().expect("openssh");
        let many = vec![k.clone(); 17];
        assert_eq!(
            TrustedSigners::parse(&many).unwrap_err(),
            SigError::TooManySigners(17)
        );
        assert!(matches!(
            TrustedSigners::parse(&[k.as_str(), "ssh-ed25519 AAAAnotbase64"]),
            Err(SigError::BadTrustedSigner { index: 1, .. })
        ));
    }

    #[test]
    fn missing_and_garbage() {
        let t = trusted(&ed25519(1));
        assert_eq!(t.verify("", b"x"), Err(SigError::Missing));
        assert!(matches!(
            t.verify(
                "-----BEGIN SSH SIGNATURE-----\nAAAA\n-----END SSH SIGNATURE-----\n",
                b"x"
            ),
            Err(SigError::Malformed(_))
        ));
        let huge = "A".repeat(MAX_ARMORED_LEN + 1);
        assert!(matches!(
            t.verify(&huge, b"x"),
            Err(SigError::TooLarge { .. })
        ));
    }

    /// Build a FIDO ed25519 signature in software, the way an authenticator would.
    fn sk_sig(kp: &Ed25519Keypair, flags: u8, msg: &[u8]) -> (String, String) {
        use sha2::Digest;
        use signature::Signer;
        let app = "ssh:";
        let key = KeyData::SkEd25519(SkEd25519::new(kp.public, app));
        let signed = SshSig::signed_data(NAMESPACE, HashAlg::Sha512, msg).expect("signed data");
        let mut to_sign = Vec::new();
        to_sign.extend(sha2::Sha256::digest(app.as_bytes()));
        let trailer = [flags, 0, 0, 0, 7];
        to_sign.extend(trailer);
        to_sign.extend(sha2::Sha256::digest(&signed));
        let raw: Signature = kp.try_sign(&to_sign).expect("sign");
        let mut data = raw.as_bytes().to_vec();
        data.extend(trailer);
        let sig = Signature::new(Algorithm::SkEd25519, data).expect("sig");
        let ssh_sig = SshSig::new(key.clone(), NAMESPACE, HashAlg::Sha512, sig).expect("sshsig");
        (
            ssh_sig.to_pem(LineEnding::LF).expect("pem"),
            PublicKey::from(key).to_openssh().expect("openssh"),
        )
    }

    #[test]
    fn fido_ed25519_user_presence() {
        let kp = Ed25519Keypair::from_seed(&[9; 32]);
        let (sig, pubkey) = sk_sig(&kp, SK_USER_PRESENT, b"script");
        let t = TrustedSigners::parse(&[pubkey.as_str()]).expect("parse");
        let v = t.verify(&sig, b"script").expect("sk verifies");
        assert_eq!(v.algorithm, "sk-ssh-ed25519@openssh.com");
        assert_eq!(t.verify(&sig, b"other"), Err(SigError::BadSignature));
        let (sig, _) = sk_sig(&kp, 0, b"script");
        assert_eq!(t.verify(&sig, b"script"), Err(SigError::SkUserPresence));
    }

    #[test]
    fn allowed_signers_line_format() {
        let k = ed25519(4).public_key().to_openssh().expect("openssh");
        let line = allowed_signers_line(&format!("{k} me@host")).expect("line");
        assert!(line.starts_with("kpssh namespaces=\"kpssh\" ssh-ed25519 AAAA"));
        assert!(!line.contains("me@host"));
    }

    mod props {
        use super::*;
        use base64::Engine as _;
        use base64::engine::general_purpose::STANDARD as B64;
        use proptest::prelude::*;
        use std::sync::OnceLock;

        const SIGNED: &[u8] = b"#!/bin/bash\nset -euo pipefail\necho joined\n";

        fn fixture() -> &'static (TrustedSigners, String) {
            static F: OnceLock<(TrustedSigners, String)> = OnceLock::new();
            F.get_or_init(|| {
                let k = ed25519(7);
                (trusted(&k), sign(&k, NAMESPACE, SIGNED))
            })
        }

        fn rearmor(blob: &[u8]) -> String {
            let b64 = B64.encode(blob);
            let mut out = String::from("-----BEGIN SSH SIGNATURE-----\n");
            for chunk in b64.as_bytes().chunks(70) {
                out.push_str(std::str::from_utf8(chunk).unwrap_or_default());
                out.push('\n');
            }
            out.push_str("-----END SSH SIGNATURE-----\n");
            out
        }

        fn blob() -> Vec<u8> {
            let body: String = fixture()
                .1
                .lines()
                .filter(|l| !l.starts_with("-----"))
                .collect();
            B64.decode(body).expect("b64")
        }

        proptest! {
            #[test]
            fn arbitrary_text_never_panics(s in "\\PC{0,300}") {
                let _ = parse_armored(&s);
                let _ = fixture().0.verify(&s, SIGNED);
            }

            #[test]
            fn arbitrary_body_never_panics(body in proptest::collection::vec(any::<u8>(), 0..600)) {
                let _ = fixture().0.verify(&rearmor(&body), SIGNED);
            }

            #[test]
            fn success_implies_the_exact_message(msg in proptest::collection::vec(any::<u8>(), 0..128)) {
                let (t, sig) = fixture();
                prop_assert_eq!(t.verify(sig, &msg).is_ok(), msg == SIGNED);
            }

            #[test]
            fn mutated_signatures_only_ever_verify_the_signed_message(
                idx in any::<usize>(),
                xor in 1u8..,
                truncate in any::<bool>(),
                msg in proptest::collection::vec(any::<u8>(), 0..64),
            ) {
                let mut b = blob();
                let i = idx % b.len();
                if truncate { b.truncate(i); } else { b[i] ^= xor; }
                let armored = rearmor(&b);
                let t = &fixture().0;
                if t.verify(&armored, &msg).is_ok() {
                    prop_assert_eq!(&msg[..], SIGNED);
                }
                let _ = t.verify(&armored, SIGNED);
            }
        }
    }
}
