//! #23: SHA-1 `ssh-rsa` is never used, for the host's key nor for the client's: a host whose
//! sshd offers nothing else is refused with the reason, while RSA keys with SHA-2 signatures
//! (`rsa-sha2-256/512`) keep working (`key_types_ed25519_ecdsa_rsa`).

use super::{secs, sh, target, transport};
use crate::sshd::{Sshd, SshdOptions, keygen};
use kpssh::ssh::{RemoteCommand, Transport};

/// Before: russh's default host key algorithms ended with `ssh-rsa`, and this host was
/// accepted with a SHA-1 signature over the key exchange.
#[tokio::test]
async fn host_key_signed_with_sha1_only_is_refused() {
    let sshd = Sshd::start_with(SshdOptions {
        host_key: "rsa",
        extra: vec!["HostKeyAlgorithms ssh-rsa".into()],
    });
    let key = keygen(sshd.dir.path(), "client", "ed25519", None);
    sshd.authorize(&key.public);
    let t = transport();
    let err = t
        .exec(
            &target(&sshd, &key),
            RemoteCommand::new("echo ok", secs(10)),
        )
        .await
        .expect_err("an ssh-rsa (SHA-1) host key signature must be refused");
    let text = err.to_string();
    assert!(text.contains(&sshd.address), "names the host: {text}");
}

/// The RSA user-key hash: SHA-2 whatever the host's `server-sig-algs` says. Before, a host
/// naming only `ssh-rsa` got a SHA-1 signature. (Debian's sshd lists every algorithm it
/// supports there, whatever `PubkeyAcceptedAlgorithms` says, so a real sshd cannot ask for
/// SHA-1 only; the decision is checked directly, and an RSA key against a real sshd below.)
#[tokio::test]
async fn rsa_user_key_is_never_signed_with_sha1() {
    use kpssh::ssh::client::rsa_user_hash;
    use russh::keys::HashAlg;
    let err = rsa_user_hash(Some(None)).expect_err("SHA-1 only: refused");
    assert!(err.contains("SHA-1"), "says why: {err}");
    assert_eq!(
        rsa_user_hash(Some(Some(HashAlg::Sha256))),
        Ok(Some(HashAlg::Sha256))
    );
    assert_eq!(
        rsa_user_hash(None),
        Ok(Some(HashAlg::Sha512)),
        "no list: SHA-512"
    );
    // An RSA key logs in with rsa-sha2 (the server says which it used).
    let sshd = Sshd::start();
    let key = keygen(sshd.dir.path(), "client-rsa", "rsa", None);
    sshd.authorize(&key.public);
    let t = transport();
    assert_eq!(
        sh(&t, &target(&sshd, &key), "echo ok").await.stdout,
        b"ok\n"
    );
    let log = sshd.log();
    assert!(
        log.contains("rsa-sha2-512") || log.contains("RSA-SHA2-512"),
        "signed with rsa-sha2-512: {}",
        log.lines()
            .filter(|l| l.contains("ccepted"))
            .collect::<Vec<_>>()
            .join("\n")
    );
}
