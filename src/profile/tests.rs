//! Tests of the whole profile API: validate → render → Raw plan.

use std::time::Duration;

use super::*;
use crate::secret::Secret;

const TOKEN: &str = "abcdef.0123456789abcdef";

fn ctx() -> PhaseContext {
    let mut c = PhaseContext {
        cluster_endpoint: "https://10.0.0.1:6443".into(),
        cluster_ca_b64: "Q0EK".into(),
        bootstrap_token: Some(Secret::new(TOKEN)),
        node_name: "default-x7k2p".into(),
        provider_id: "kpssh://kpssh-system/h1".into(),
        host_address: "192.0.2.10".into(),
        node_address: "10.1.0.10".into(),
        ..Default::default()
    };
    c.node_labels
        .insert("karpenter.sh/nodepool".into(), "default".into());
    c.node_labels
        .insert("node-role.kubernetes.io/worker".into(), "".into());
    c.vars.insert("clusterName".into(), "prod".into());
    c.secrets.insert(
        "activationCode".into(),
        Secret::new("s3cret-activation-code"),
    );
    c
}

fn profile() -> ProfileSource {
    ProfileSource {
        name: "nodeadm-ssm".into(),
        version: Some("3".into()),
        scripts: Scripts {
            install: Some("echo install {{ .Vars.clusterName }} [{{ .BootstrapToken }}]\n".into()),
            join: Some(
                "echo {{ .NodeName }} {{ .ClusterEndpoint }} {{ .ClusterCACert }}\n\
                 echo {{ .ProviderID }} {{ .NodeLabels }} {{ .RegisterWithTaints }}\n\
                 echo {{ .HostAddress }} {{ .NodeAddress }} {{ .Vars.clusterName }}\n\
                 {{- if .BootstrapToken }} token{{ end }}\n"
                    .into(),
            ),
            leave: Some("echo leave {{ .HostAddress }} {{ .NodeAddress }}\n".into()),
            uninstall: Some("echo uninstall\n".into()),
        },
        timeouts: Timeouts {
            join: Some("2m".into()),
            ..Default::default()
        },
    }
}

#[test]
fn join_renders_template_data_and_env() {
    // S14
    let p = profile();
    validate_profile(&p).unwrap();
    let r = render_phase(&p, Phase::Join, &ctx(), ExecMode::Raw).unwrap();
    assert_eq!(
        String::from_utf8(r.script.clone()).unwrap(),
        "echo default-x7k2p https://10.0.0.1:6443 Q0EK\n\
         echo kpssh://kpssh-system/h1 karpenter.sh/nodepool=default \
         karpenter.sh/unregistered:NoExecute\n\
         echo 192.0.2.10 10.1.0.10 prod token\n"
    );
    assert_eq!(r.timeout, Duration::from_secs(120));
    assert_eq!(r.env["KPSSH_BOOTSTRAP_TOKEN"].expose(), TOKEN);
    assert_eq!(
        r.env["KPSSH_SECRET_ACTIVATIONCODE"].expose(),
        "s3cret-activation-code"
    );
    assert_eq!(r.env["KPSSH_VAR_clusterName"].expose(), "prod");
}

#[test]
fn install_has_no_token_in_template_or_env() {
    let r = render_phase(&profile(), Phase::Install, &ctx(), ExecMode::Raw).unwrap();
    assert_eq!(r.script, b"echo install prod []\n");
    assert_eq!(r.env["KPSSH_BOOTSTRAP_TOKEN"].expose(), "");
    assert_eq!(r.timeout, Duration::from_secs(600));
}

#[test]
fn leave_renders_with_addresses_only() {
    let r = render_phase(&profile(), Phase::Leave, &ctx(), ExecMode::Raw).unwrap();
    assert_eq!(r.script, b"echo leave 192.0.2.10 10.1.0.10\n");
    assert_eq!(r.timeout, Duration::from_secs(180));
    assert!(
        !r.env
            .keys()
            .any(|k| k.starts_with("KPSSH_VAR_") || k.starts_with("KPSSH_SECRET_"))
    );
    assert_eq!(r.env["KPSSH_BOOTSTRAP_TOKEN"].expose(), "");
    assert_eq!(r.env["KPSSH_NODE_NAME"].expose(), "");
    assert_eq!(r.env["KPSSH_TAINTS"].expose(), "");
    // Even if a caller renders leave with a full context, nothing else leaks in.
    let mut p = profile();
    p.scripts.leave = Some("{{ .Vars.clusterName }}".into());
    let e = render_phase(&p, Phase::Leave, &ctx(), ExecMode::Raw).unwrap_err();
    assert!(
        matches!(
            e,
            ProfileError::Render {
                phase: Phase::Leave,
                ..
            }
        ),
        "{e}"
    );
}

#[test]
fn raw_plan_exact_bytes_for_leave() {
    let r = render_phase(&profile(), Phase::Leave, &ctx(), ExecMode::Raw).unwrap();
    let plan = raw_plan(&r, "debian").unwrap();
    assert_eq!(plan.command, "sudo bash -s");
    let script = b"echo leave 192.0.2.10 10.1.0.10\n";
    let end = crate::profile::raw::delimiter(script);
    let lock = crate::profile::raw::PhaseLock::for_host("192.0.2.10", r.timeout);
    assert_eq!(
        String::from_utf8(plan.stdin).unwrap(),
        format!(
            "set -euo pipefail\n\
             export KPSSH_BOOTSTRAP_TOKEN=''\n\
             export KPSSH_CLUSTER_CA_B64=''\n\
             export KPSSH_CLUSTER_ENDPOINT=''\n\
             export KPSSH_HOST_ADDRESS='192.0.2.10'\n\
             export KPSSH_NODE_ADDRESS='10.1.0.10'\n\
             export KPSSH_NODE_LABELS=''\n\
             export KPSSH_NODE_NAME=''\n\
             export KPSSH_PROVIDER_ID=''\n\
             export KPSSH_TAINTS=''\n\
             {}\
             IFS= read -r -d '' kpssh_script <<'{end}' || true\n\
             echo leave 192.0.2.10 10.1.0.10\n\
             {end}\n\
             eval \"$kpssh_script\" </dev/null 9>&-\n",
            crate::profile::raw::lock_block(&lock)
        )
    );
    assert_eq!(raw_plan(&r, "root").unwrap().command, "bash -s");
}

#[test]
fn raw_plan_for_join_exports_everything_quoted() {
    // S14, S35
    let mut c = ctx();
    c.vars.insert("evil".into(), "'; rm -rf / #".into());
    let r = render_phase(&profile(), Phase::Join, &c, ExecMode::Raw).unwrap();
    let stdin = String::from_utf8(raw_plan(&r, "root").unwrap().stdin).unwrap();
    assert!(stdin.starts_with(
        "set -euo pipefail\nexport KPSSH_BOOTSTRAP_TOKEN='abcdef.0123456789abcdef'\n"
    ));
    assert!(stdin.contains("export KPSSH_VAR_evil=''\\''; rm -rf / #'\n"));
    assert!(stdin.contains("export KPSSH_SECRET_ACTIVATIONCODE='s3cret-activation-code'\n"));
    assert!(stdin.contains("export KPSSH_TAINTS='karpenter.sh/unregistered:NoExecute'\n"));
    assert!(stdin.contains(std::str::from_utf8(&r.script).unwrap()));
}

#[test]
fn verified_mode_runs_bytes_verbatim_and_refuses_templates() {
    // S18
    let mut p = profile();
    p.scripts.join = Some("set -euo pipefail\necho \"$KPSSH_NODE_NAME\"\n".into());
    let r = render_phase(&p, Phase::Join, &ctx(), ExecMode::Verified).unwrap();
    assert_eq!(r.script, b"set -euo pipefail\necho \"$KPSSH_NODE_NAME\"\n");
    assert_eq!(r.env["KPSSH_BOOTSTRAP_TOKEN"].expose(), TOKEN);
    let e = render_phase(&profile(), Phase::Join, &ctx(), ExecMode::Verified).unwrap_err();
    assert!(matches!(
        e,
        ProfileError::VerifiedTemplated {
            phase: Phase::Join,
            ..
        }
    ));
}

#[test]
fn configuration_errors_fail_before_anything_runs() {
    // S18: colliding secret keys, naming both keys and not the values.
    let mut c = ctx();
    c.secrets
        .insert("a-b".into(), Secret::new("first-secret-value"));
    c.secrets
        .insert("a.b".into(), Secret::new("second-secret-value"));
    let e = render_phase(&profile(), Phase::Join, &c, ExecMode::Raw).unwrap_err();
    let msg = e.to_string();
    assert_eq!(
        msg,
        "profile nodeadm-ssm: join environment: secret keys \"a-b\" and \"a.b\" both map to KPSSH_SECRET_A_B"
    );
    // S22: no cluster endpoint.
    let mut c = ctx();
    c.cluster_endpoint.clear();
    let e = render_phase(&profile(), Phase::Join, &c, ExecMode::Raw).unwrap_err();
    assert!(e.to_string().contains("spec.cluster"), "{e}");
    // Missing script.
    let mut p = profile();
    p.scripts.uninstall = None;
    let e = render_phase(&p, Phase::Uninstall, &ctx(), ExecMode::Raw).unwrap_err();
    assert_eq!(
        e.to_string(),
        "profile nodeadm-ssm: uninstall script is missing"
    );
    assert_eq!(e.phase(), Some(Phase::Uninstall));
}

#[test]
fn render_errors_never_contain_secrets() {
    // S35, S17
    let mut p = profile();
    p.scripts.join = Some("{{ index .Vars .Secrets.activationCode }}{{ .Vars.nope }}".into());
    let e = render_phase(&p, Phase::Join, &ctx(), ExecMode::Raw).unwrap_err();
    let msg = e.to_string();
    assert!(
        msg.starts_with("profile nodeadm-ssm: rendering the join script failed: 1:"),
        "{msg}"
    );
    assert!(
        !msg.contains("s3cret") && !msg.contains("0123456789abcdef"),
        "{msg}"
    );
    p.scripts.join = Some("{{ index .NodeName .BootstrapToken }}".into());
    let msg = render_phase(&p, Phase::Join, &ctx(), ExecMode::Raw)
        .unwrap_err()
        .to_string();
    assert!(!msg.contains("0123456789abcdef"), "{msg}");
}

#[test]
fn redactor_of_a_rendered_phase_covers_token_and_secrets() {
    // S35
    let r = render_phase(&profile(), Phase::Join, &ctx(), ExecMode::Raw).unwrap();
    let stderr = format!(
        "+ export KPSSH_BOOTSTRAP_TOKEN={TOKEN}\n+ nodeadm init --code s3cret-activation-code\nexit 1"
    );
    let out = r.redactor.tail(&stderr, 40);
    assert!(
        !out.contains("s3cret") && !out.contains("0123456789"),
        "{out}"
    );
    // Leave's redactor still knows the secrets (a leave's stderr could echo stale files).
    let r = render_phase(&profile(), Phase::Leave, &ctx(), ExecMode::Raw).unwrap();
    assert_eq!(r.redactor.redact("s3cret-activation-code"), "<redacted>");
}

#[test]
fn debug_output_hides_secrets() {
    let mut p = profile();
    p.scripts.join = Some("{{ .Secrets.activationCode }}".into());
    let r = render_phase(&p, Phase::Join, &ctx(), ExecMode::Raw).unwrap();
    assert_eq!(r.script, b"s3cret-activation-code");
    let d = format!("{r:?} {:?} {:?}", ctx(), raw_plan(&r, "root").unwrap());
    assert!(
        !d.contains("s3cret") && !d.contains("0123456789abcdef"),
        "{d}"
    );
}

#[test]
fn installed_marker() {
    // S16
    assert_eq!(profile().installed_marker(), "nodeadm-ssm@3");
    let mut p = profile();
    p.version = None;
    assert_eq!(p.installed_marker(), "nodeadm-ssm@1");
    assert_eq!(
        validate_profile(&p).unwrap().installed_marker(),
        "nodeadm-ssm@1"
    );
}

#[test]
fn phase_names() {
    let names: Vec<String> = Phase::ALL.iter().map(ToString::to_string).collect();
    assert_eq!(names, ["install", "join", "leave", "uninstall"]);
}

/// The shipped profiles of the Go provider are template-free and pass validation unchanged
/// (condensed here: the leave scripts are the parts the rules bite on).
#[test]
fn shipped_style_profiles_validate() {
    let p = ProfileSource {
        name: "tls-bootstrap".into(),
        version: Some("1".into()),
        scripts: Scripts {
            install: Some("#!/usr/bin/env bash\nset -euxo pipefail\nK=\"${KPSSH_VAR_k8sMinor:?k8sMinor var required}\"\n".into()),
            join: Some(": \"${KPSSH_CLUSTER_ENDPOINT:?}\" \"${KPSSH_BOOTSTRAP_TOKEN:?}\"\ncat <<EOF\ntoken: ${KPSSH_BOOTSTRAP_TOKEN}\nEOF\n".into()),
            leave: Some("#!/usr/bin/env bash\nset -euxo pipefail\nsystemctl disable --now kubelet 2>/dev/null || true\nawk '$2 ~ /^\\/var\\/lib\\/kubelet/ {print $2}' /proc/mounts | sort -r | xargs -r -n1 umount -f 2>/dev/null || true\nfor dev in cni0 flannel.1; do ip link del \"$dev\" 2>/dev/null || true; done\n".into()),
            uninstall: None,
        },
        timeouts: Timeouts::default(),
    };
    validate_profile(&p).unwrap();
    check_verified_profile(&p).unwrap();
}

#[test]
fn every_error_names_the_profile_and_its_phase() {
    // S32: messages are what the node class condition shows.
    let cases: Vec<ProfileError> = vec![
        ProfileError::MissingScript {
            profile: "p1".into(),
            phase: Phase::Join,
        },
        ProfileError::ScriptTooLarge {
            profile: "p1".into(),
            phase: Phase::Install,
            size: 300_000,
        },
        ProfileError::BadTimeout {
            profile: "p1".into(),
            phase: Phase::Leave,
            value: "1.5h".into(),
        },
        ProfileError::LeaveNeedsContext {
            profile: "p1".into(),
            reason: "references .Vars (line 1, col 4)".into(),
        },
        ProfileError::VerifiedTemplated {
            profile: "p1".into(),
            phase: Phase::Join,
        },
        ProfileError::NoClusterEndpoint {
            profile: "p1".into(),
            phase: Phase::Join,
        },
    ];
    for e in cases {
        let msg = e.to_string();
        let phase = e.phase().unwrap();
        assert!(msg.starts_with("profile p1: "), "{msg}");
        assert!(msg.contains(phase.as_str()), "{msg}");
    }
    let e = ProfileError::BadVersion {
        profile: "p1".into(),
        value: "a b".into(),
    };
    assert_eq!(e.phase(), None);
    assert_eq!(
        e.to_string(),
        "profile p1: version \"a b\" does not match ^[A-Za-z0-9._-]{1,63}$"
    );
}
