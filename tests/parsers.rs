//! Property tier for every parser of untrusted input (#23): 10,000 cases each, no panic (a
//! debug build also panics on arithmetic overflow), no overflow past the documented bounds,
//! and every rejection a clear error (a message that says what is wrong, never empty, never a
//! secret). The shim's argument and envelope parsing is driven through the real `/bin/sh` in
//! `parsers/shim.rs`.
//!
//! Untrusted input and where it comes from:
//! - join profile scripts (Go templates) and their timeouts: whoever may edit SSHJoinProfiles;
//! - resource quantities: SSHHost capacity, NodeClaim requests, probe results;
//! - envelopes and their parameter blocks: what the shim reads on stdin;
//! - `knownHost` values: the host key Secrets;
//! - probe output: the hosts themselves (a compromised host prints what it likes);
//! - armored SSH signatures: the profiles' `signatures`;
//! - NodePool durations (`expireAfter`, `consolidateAfter`): whoever may edit NodePools.
//!
//! The tier's run time is measured in docs/security.md (`cargo test --test parsers`).

#[path = "parsers/shim.rs"]
mod shim;
#[path = "support/sshd.rs"]
mod sshd;

use std::collections::BTreeMap;

use kpssh::api::quantity::{MAX_MILLI, parse_checked};
use kpssh::profile::template::{ContextData, Template, Value};
use kpssh::profile::verified::sshsig::parse_armored;
use kpssh::profile::verified::{Envelope, Params};
use kpssh::secret::Secret;
use kpssh::ssh::known_host::KnownHost;
use kpssh::ssh::probe::parse_probe_output;
use proptest::prelude::*;

/// Cases per property (the floor; `PROPTEST_CASES` cannot lower it).
pub const CASES: u32 = 10_000;

pub fn config() -> ProptestConfig {
    ProptestConfig {
        cases: CASES.max(
            std::env::var("PROPTEST_CASES")
                .ok()
                .and_then(|c| c.parse().ok())
                .unwrap_or(0),
        ),
        failure_persistence: None,
        ..ProptestConfig::default()
    }
}

const SECRET: &str = "s3cret-activation-9f8e7d";

/// A clear error: says something, on one line or a few, never the secret.
fn clear(message: &str) -> Result<(), TestCaseError> {
    prop_assert!(message.trim().len() >= 8, "unclear error: {message:?}");
    prop_assert!(!message.contains(SECRET), "secret in an error: {message}");
    Ok(())
}

fn root() -> Value {
    ContextData {
        node_name: "node-a".into(),
        bootstrap_token: Secret::new(SECRET),
        vars: Some(BTreeMap::from([
            ("clusterName".to_string(), "prod".to_string()),
            ("n".to_string(), "3".to_string()),
        ])),
        secrets: Some(BTreeMap::from([(
            "activationCode".to_string(),
            Secret::new(SECRET),
        )])),
        ..Default::default()
    }
    .into_value()
}

/// Template text: a soup of the pieces templates are made of, so that most cases reach the
/// parser's and executor's deeper states (actions, pipelines, control structures, defines).
fn template_text() -> impl Strategy<Value = String> {
    let piece = prop_oneof![
        Just("{{".to_string()),
        Just("{{- ".to_string()),
        Just("}}".to_string()),
        Just(" -}}".to_string()),
        Just(" ".to_string()),
        Just("\n".to_string()),
        Just(".NodeName".to_string()),
        Just(".Vars.clusterName".to_string()),
        Just(".Vars.n".to_string()),
        Just(".Secrets.activationCode".to_string()),
        Just(".BootstrapToken".to_string()),
        Just(".Missing.Field".to_string()),
        Just("$x := ".to_string()),
        Just("$x".to_string()),
        Just("$".to_string()),
        Just("if ".to_string()),
        Just("else".to_string()),
        Just("else if ".to_string()),
        Just("end".to_string()),
        Just("range ".to_string()),
        Just("with ".to_string()),
        Just("define \"t\"".to_string()),
        Just("template \"t\" .".to_string()),
        Just("block \"b\" .".to_string()),
        Just("break".to_string()),
        Just("continue".to_string()),
        Just("|".to_string()),
        Just("(".to_string()),
        Just(")".to_string()),
        Just("printf \"%s-%d-%v-%q\" ".to_string()),
        Just("print ".to_string()),
        Just("len ".to_string()),
        Just("index . \"Vars\" ".to_string()),
        Just("eq ".to_string()),
        Just("and ".to_string()),
        Just("or ".to_string()),
        Just("not ".to_string()),
        Just("quote".to_string()),
        Just("/* c */".to_string()),
        Just("nil".to_string()),
        Just("true".to_string()),
        Just("-1".to_string()),
        Just("99999999999999999999999".to_string()),
        Just("1e400".to_string()),
        Just("0x".to_string()),
        Just("'a'".to_string()),
        Just("\"".to_string()),
        Just("`raw`".to_string()),
        "[a-z]{1,4}",
        "\\PC{0,3}",
    ];
    prop::collection::vec(piece, 0..40).prop_map(|v| v.concat())
}

proptest! {
    #![proptest_config(config())]

    /// Templates: parsing and rendering never panic; a rejection names line and column; no
    /// error text holds a secret the template could reach.
    #[test]
    fn template_parse_and_render(src in prop_oneof![template_text(), "\\PC{0,200}"]) {
        match Template::parse(&src) {
            Ok(t) => {
                if let Err(e) = t.render(&root()) {
                    clear(&e.to_string())?;
                    prop_assert!(e.line >= 1 && e.col >= 1, "{e:?}");
                }
            }
            Err(e) => {
                clear(&e.to_string())?;
                prop_assert!(e.line >= 1 && e.col >= 1, "{e:?}");
            }
        }
    }

    /// Quantities: arbitrary text and near-quantities (long digit runs, huge exponents, every
    /// suffix): never a panic or overflow, values within ±MAX_MILLI, rejections name the text.
    #[test]
    fn quantity(text in prop_oneof![
        "\\PC{0,40}",
        ("[+-]?", "[0-9]{0,45}", "(\\.[0-9]{0,45})?", "([eE][+-]?[0-9]{1,12})?",
         "(|m|k|M|G|T|P|E|Ki|Mi|Gi|Ti|Pi|Ei|n|u| |x)")
            .prop_map(|(s, i, f, e, u)| format!("{s}{i}{f}{e}{u}")),
    ]) {
        match parse_checked(&text) {
            Ok(v) => prop_assert!((-MAX_MILLI..=MAX_MILLI).contains(&v), "{text}: {v}"),
            Err(e) => {
                clear(&e.to_string())?;
                prop_assert!(e.to_string().contains("not a Kubernetes quantity"), "{e}");
            }
        }
    }

    /// Envelopes: arbitrary bytes and near-envelopes (header lines in any order, any value).
    #[test]
    fn envelope(bytes in prop_oneof![
        prop::collection::vec(any::<u8>(), 0..300),
        prop::collection::vec(
            ("(kpssh-envelope|phase|timeout|profile|expires|params-b64|sig-b64|script-b64|x)",
             "(: |:|=| )", "[ -~]{0,24}"),
            0..10,
        ).prop_map(|lines| lines.iter().map(|(k, s, v)| format!("{k}{s}{v}\n")).collect::<String>().into_bytes()),
    ]) {
        if let Err(e) = Envelope::parse(&bytes) {
            clear(&e.to_string())?;
        }
        if let Err(e) = Params::parse(&bytes) {
            clear(&e.to_string())?;
        }
    }

    /// `knownHost` values: arbitrary text and near-lines (markers, patterns, hashed hosts,
    /// key types, base64 bodies); errors never quote the input beyond a key type.
    #[test]
    fn known_host(text in prop_oneof![
        "\\PC{0,160}",
        prop::collection::vec(
            ("(@cert-authority |@revoked |)", "(\\*|\\[[a-z0-9.]{1,8}\\]:[0-9]{1,6}|!?[a-z0-9.*?]{1,10}|\\|1\\|[A-Za-z0-9+/=]{0,30}\\|[A-Za-z0-9+/=]{0,30}|SHA256:[A-Za-z0-9+/=]{0,50})",
             "( ssh-ed25519| ssh-rsa| ecdsa-sha2-nistp256| sk-ssh-ed25519@openssh.com| x|)",
             "( [A-Za-z0-9+/=]{0,80}|)", "( comment|)"),
            0..4,
        ).prop_map(|lines| lines.iter().map(|(a, b, c, d, e)| format!("{a}{b}{c}{d}{e}\n")).collect()),
    ]) {
        if let Err(e) = KnownHost::parse(&text) {
            clear(&e)?;
        }
    }

    /// Probe output from a hostile host: arbitrary bytes and near-miss key=value lines.
    #[test]
    fn probe_output(bytes in prop_oneof![
        prop::collection::vec(any::<u8>(), 0..400),
        prop::collection::vec(
            ("(kpssh-probe|cpu|memory_kib|arch|kubelet|x|)", "(=|: |)", "(-?[0-9]{0,25}|[ -~]{0,12}|active|inactive)"),
            0..8,
        ).prop_map(|lines| {
            let mut out = String::from("kpssh-probe=1\n");
            for (k, s, v) in &lines {
                out.push_str(&format!("{k}{s}{v}\n"));
            }
            out.into_bytes()
        }),
        ("[0-9]{0,22}", "-?[0-9]{0,22}", "[ -~]{0,12}", "[a-z]{0,10}")
            .prop_map(|(a, b, c, d)| format!("{a}\n{b}\n{c}\n{d}\n").into_bytes()),
    ]) {
        match parse_probe_output(&bytes) {
            Ok(f) => prop_assert!(f.cpu > 0 && !f.arch.is_empty(), "{f:?}"),
            Err(e) => {
                clear(&e.to_string())?;
                prop_assert!(e.to_string().len() <= 600, "error not capped: {}", e.to_string().len());
            }
        }
    }

    /// Armored SSH signatures from profiles: arbitrary text and armored arbitrary bodies.
    #[test]
    fn armored_signature(text in prop_oneof![
        "\\PC{0,200}",
        prop::collection::vec(any::<u8>(), 0..300).prop_map(|body| {
            use base64::Engine as _;
            let b64 = base64::engine::general_purpose::STANDARD.encode(body);
            format!("-----BEGIN SSH SIGNATURE-----\n{b64}\n-----END SSH SIGNATURE-----\n")
        }),
        prop::collection::vec(any::<u8>(), 0..64).prop_map(|tail| {
            use base64::Engine as _;
            let mut body = b"SSHSIG\0\0\0\x01".to_vec();
            body.extend_from_slice(&tail);
            let b64 = base64::engine::general_purpose::STANDARD.encode(body);
            format!("-----BEGIN SSH SIGNATURE-----\n{b64}\n-----END SSH SIGNATURE-----\n")
        }),
    ]) {
        if let Err(e) = parse_armored(&text) {
            clear(&e.to_string())?;
        }
    }

    /// Profile timeouts and NodePool durations: digit runs far past u64, every unit.
    #[test]
    fn durations(text in prop_oneof![
        "\\PC{0,30}",
        prop::collection::vec(("[0-9]{1,25}", "(ns|us|µs|ms|s|m|h|d|x|)"), 0..5)
            .prop_map(|p| p.iter().map(|(n, u)| format!("{n}{u}")).collect::<String>()),
    ]) {
        if kpssh::profile::validate::parse_timeout(&text).is_some() {
            // Only what the CRD's pattern `^([0-9]+(s|m|h))+$` admits.
            prop_assert!(
                text.ends_with(['s', 'm', 'h'])
                    && text.chars().all(|c| c.is_ascii_digit() || "smh".contains(c))
                    && !text.starts_with(['s', 'm', 'h']),
                "{text:?} accepted"
            );
        }
        let _ = kpssh::karpenter::termination::parse_duration(&text);
        let _ = kpssh::karpenter::nodepool_hash::parse_go_duration(&text);
    }
}
