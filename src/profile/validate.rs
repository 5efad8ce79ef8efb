//! Profile validation: what makes a node class go `Ready=False` / `ProfileInvalid`. // S32
//!
//! - `install`, `join`, `leave` must be present (`uninstall` is optional), each ≤ 256 KiB and
//!   parsable as a template;
//! - `version` matches `^[A-Za-z0-9._-]{1,63}$` (unset = `"1"`);
//! - `timeouts.*` match `^([0-9]+(s|m|h))+$` (defaults: install 10m, join 5m, leave 3m; `0s`
//!   means the default, like the Go provider);
//! - `leave` renders against an empty context (the Go provider's rule: leave runs on the
//!   release path and in the zombie guard, without a node class), so `{{ .Vars.x }}` or
//!   `{{ .Secrets.y }}` fail here and not when a host must be disconnected; empty fields such
//!   as `{{ .NodeName }}` render as "" as in Go.
//!
//! Verified hosts additionally need template-free scripts ([`check_verified_script`]).

use std::time::Duration;

use super::ProfileError;
use super::phase::{Phase, PhaseContext, ProfileSource};
use super::template::Template;

/// Largest script accepted, in bytes.
pub const MAX_SCRIPT_BYTES: usize = 256 * 1024;
pub const DEFAULT_INSTALL_TIMEOUT: Duration = Duration::from_secs(10 * 60);
pub const DEFAULT_JOIN_TIMEOUT: Duration = Duration::from_secs(5 * 60);
pub const DEFAULT_LEAVE_TIMEOUT: Duration = Duration::from_secs(3 * 60);

/// Parses a duration restricted to `^([0-9]+(s|m|h))+$` (`90s`, `10m`, `1h30m`; not `1.5h`,
/// not `500ms`). `None` when it does not match or overflows.
pub fn parse_timeout(s: &str) -> Option<Duration> {
    crate::api::duration::pattern(s)
}

/// `^[A-Za-z0-9._-]{1,63}$`.
pub fn is_valid_version(v: &str) -> bool {
    (1..=63).contains(&v.len())
        && v.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
}

/// The timeout of `phase`: the profile's value, or the default when unset or zero. `uninstall`
/// has no timeout field and uses the install timeout.
pub fn phase_timeout(profile: &ProfileSource, phase: Phase) -> Result<Duration, ProfileError> {
    let (field, default, timeout_phase) = match phase {
        Phase::Install | Phase::Uninstall => (
            &profile.timeouts.install,
            DEFAULT_INSTALL_TIMEOUT,
            Phase::Install,
        ),
        Phase::Join => (&profile.timeouts.join, DEFAULT_JOIN_TIMEOUT, Phase::Join),
        Phase::Leave => (&profile.timeouts.leave, DEFAULT_LEAVE_TIMEOUT, Phase::Leave),
    };
    match field.as_deref() {
        None | Some("") => Ok(default),
        Some(s) => match parse_timeout(s) {
            Some(d) if d.is_zero() => Ok(default),
            Some(d) => Ok(d),
            None => Err(ProfileError::BadTimeout {
                profile: profile.name.clone(),
                phase: timeout_phase,
                value: s.to_string(),
            }),
        },
    }
}

/// Resolved timeouts of a valid profile.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PhaseTimeouts {
    pub install: Duration,
    pub join: Duration,
    pub leave: Duration,
}

/// A profile that passed [`validate_profile`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ValidProfile {
    pub name: String,
    pub version: String,
    pub timeouts: PhaseTimeouts,
}

impl ValidProfile {
    /// `<profile>@<version>` (`SSHHost.status.installedProfile`). // S16
    pub fn installed_marker(&self) -> String {
        format!("{}@{}", self.name, self.version)
    }
}

/// Checks everything listed in the module docs; the first problem found is returned, with a
/// message fit for the node class condition. // S32
pub fn validate_profile(profile: &ProfileSource) -> Result<ValidProfile, ProfileError> {
    let name = &profile.name;
    let version = profile.version();
    if !is_valid_version(version) {
        return Err(ProfileError::BadVersion {
            profile: name.clone(),
            value: version.to_string(),
        });
    }
    let mut leave_tpl = None;
    for phase in Phase::ALL {
        let Some(src) = profile.script(phase) else {
            if phase == Phase::Uninstall {
                continue;
            }
            return Err(ProfileError::MissingScript {
                profile: name.clone(),
                phase,
            });
        };
        if src.len() > MAX_SCRIPT_BYTES {
            return Err(ProfileError::ScriptTooLarge {
                profile: name.clone(),
                phase,
                size: src.len(),
            });
        }
        let tpl =
            Template::parse_named(src, phase.as_str()).map_err(|error| ProfileError::Parse {
                profile: name.clone(),
                phase,
                error,
            })?;
        if phase == Phase::Leave {
            leave_tpl = Some(tpl);
        }
    }
    let timeouts = PhaseTimeouts {
        install: phase_timeout(profile, Phase::Install)?,
        join: phase_timeout(profile, Phase::Join)?,
        leave: phase_timeout(profile, Phase::Leave)?,
    };
    if let Some(tpl) = leave_tpl {
        check_leave(name, &tpl)?;
    }
    Ok(ValidProfile {
        name: name.clone(),
        version: version.to_string(),
        timeouts,
    })
}

fn leave_error(profile: &str, reason: String) -> ProfileError {
    ProfileError::LeaveNeedsContext {
        profile: profile.to_string(),
        reason,
    }
}

/// The Go provider's leave rule: the script renders against an empty context.
pub fn check_leave(profile: &str, tpl: &Template) -> Result<(), ProfileError> {
    let data = PhaseContext::default()
        .template_data(Phase::Leave)
        .map_err(|e| leave_error(profile, format!("cannot build the empty context: {e}")))?;
    tpl.render(&data).map_err(|e| {
        leave_error(
            profile,
            format!("does not render with an empty context: {e}"),
        )
    })?;
    Ok(())
}

/// A script for a Verified host runs exactly as signed: it must not contain template actions
/// (`{{`). // S18
pub fn check_verified_script(
    profile: &str,
    phase: Phase,
    script: &str,
) -> Result<(), ProfileError> {
    if script.contains("{{") {
        return Err(ProfileError::VerifiedTemplated {
            profile: profile.to_string(),
            phase,
        });
    }
    Ok(())
}

/// [`check_verified_script`] for every script the controller runs (install, join, leave).
pub fn check_verified_profile(profile: &ProfileSource) -> Result<(), ProfileError> {
    for phase in [Phase::Install, Phase::Join, Phase::Leave] {
        if let Some(s) = profile.script(phase) {
            check_verified_script(&profile.name, phase, s)?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::profile::phase::{Scripts, Timeouts};

    fn profile(leave: &str) -> ProfileSource {
        ProfileSource {
            name: "tls-bootstrap".into(),
            version: Some("1".into()),
            scripts: Scripts {
                install: Some("#!/bin/bash\necho install\n".into()),
                join: Some("#!/bin/bash\necho {{ .NodeName }} \"$KPSSH_BOOTSTRAP_TOKEN\"\n".into()),
                leave: Some(leave.into()),
                uninstall: None,
            },
            timeouts: Timeouts::default(),
        }
    }

    fn leave_err(leave: &str) -> String {
        match validate_profile(&profile(leave)) {
            Ok(_) => panic!("leave {leave:?} should be rejected"),
            Err(e) => {
                assert!(matches!(e, ProfileError::LeaveNeedsContext { .. }), "{e}");
                e.to_string()
            }
        }
    }

    #[test]
    fn a_good_profile_passes_with_defaults() {
        // S32
        let v = validate_profile(&profile("systemctl disable --now kubelet || true\n")).unwrap();
        assert_eq!(v.installed_marker(), "tls-bootstrap@1");
        assert_eq!(
            v.timeouts,
            PhaseTimeouts {
                install: Duration::from_secs(600),
                join: Duration::from_secs(300),
                leave: Duration::from_secs(180),
            }
        );
    }

    #[test]
    fn version_default_and_pattern() {
        // S16
        let mut p = profile("true");
        p.version = None;
        assert_eq!(validate_profile(&p).unwrap().version, "1");
        p.version = Some("2024.01-rc_1".into());
        assert_eq!(
            validate_profile(&p).unwrap().installed_marker(),
            "tls-bootstrap@2024.01-rc_1"
        );
        for bad in ["a b", "v/1", &"x".repeat(64), "ü"] {
            p.version = Some(bad.to_string());
            let e = validate_profile(&p).unwrap_err();
            assert!(matches!(e, ProfileError::BadVersion { .. }), "{bad}");
        }
    }

    #[test]
    fn missing_scripts() {
        // S32
        for phase in [Phase::Install, Phase::Join, Phase::Leave] {
            let mut p = profile("true");
            match phase {
                Phase::Install => p.scripts.install = None,
                Phase::Join => p.scripts.join = Some(String::new()),
                _ => p.scripts.leave = None,
            }
            let e = validate_profile(&p).unwrap_err();
            assert_eq!(
                e.to_string(),
                format!("profile tls-bootstrap: {phase} script is missing")
            );
        }
        // uninstall is optional
        assert!(validate_profile(&profile("true")).is_ok());
    }

    #[test]
    fn unparsable_template() {
        // S32
        let mut p = profile("true");
        p.scripts.join = Some("echo\n{{ if .NodeName }}x".into());
        let e = validate_profile(&p).unwrap_err();
        assert!(
            matches!(
                e,
                ProfileError::Parse {
                    phase: Phase::Join,
                    ..
                }
            ),
            "{e}"
        );
        assert!(
            e.to_string()
                .starts_with("profile tls-bootstrap: join script does not parse: 2:1:"),
            "{e}"
        );
        p.scripts.join = Some("{{ quote .NodeName }}".into());
        assert!(validate_profile(&p).is_err());
        // uninstall must parse too when present
        let mut p = profile("true");
        p.scripts.uninstall = Some("{{".into());
        assert!(validate_profile(&p).is_err());
    }

    #[test]
    fn script_size_limit() {
        let mut p = profile("true");
        p.scripts.install = Some("#".repeat(MAX_SCRIPT_BYTES));
        assert!(validate_profile(&p).is_ok());
        p.scripts.install = Some("#".repeat(MAX_SCRIPT_BYTES + 1));
        let e = validate_profile(&p).unwrap_err();
        assert!(
            matches!(e, ProfileError::ScriptTooLarge { size, .. } if size == MAX_SCRIPT_BYTES + 1)
        );
    }

    #[test]
    fn timeouts() {
        assert_eq!(parse_timeout("90s"), Some(Duration::from_secs(90)));
        assert_eq!(parse_timeout("10m"), Some(Duration::from_secs(600)));
        assert_eq!(parse_timeout("1h30m"), Some(Duration::from_secs(5400)));
        assert_eq!(parse_timeout("1h1h"), Some(Duration::from_secs(7200)));
        for bad in [
            "",
            "1.5h",
            "500ms",
            "10",
            "m",
            "10d",
            " 10m",
            "-1m",
            "99999999999999999999s",
        ] {
            assert_eq!(parse_timeout(bad), None, "{bad}");
        }
        let mut p = profile("true");
        p.timeouts.join = Some("2m30s".into());
        p.timeouts.leave = Some("0s".into());
        let v = validate_profile(&p).unwrap();
        assert_eq!(v.timeouts.join, Duration::from_secs(150));
        assert_eq!(v.timeouts.leave, DEFAULT_LEAVE_TIMEOUT);
        p.timeouts.install = Some("1.5h".into());
        let e = validate_profile(&p).unwrap_err();
        assert!(e.to_string().contains("timeouts.install \"1.5h\""), "{e}");
    }

    #[test]
    fn leave_renders_against_the_empty_context() {
        // S61, S32: the Go provider's rule. Empty fields render as "", text is not inspected.
        let ok = "#!/bin/bash\n# {{ .HostAddress }}\nip addr | grep -q {{ .NodeAddress }} || true\n\
                  {{ if .HostAddress }}x{{ end }}{{ with .NodeAddress }}{{ . }}{{ end }}\n\
                  echo {{ .NodeName }}{{ .BootstrapToken }}{{ len .Vars }}{{ range .Secrets }}{{ end }}\n\
                  echo \"$KPSSH_HOST_ADDRESS $KPSSH_NODE_ADDRESS $KPSSH_VAR_x\"\n";
        assert!(validate_profile(&profile(ok)).is_ok());
    }

    #[test]
    fn leave_needing_vars_or_secrets_is_rejected() {
        // S32: what fails against the empty context.
        let e = leave_err("kubectl delete node {{ .Vars.clusterName }}");
        assert!(e.contains("does not render with an empty context"), "{e}");
        assert!(e.contains("1:24"), "{e}");
        assert!(e.starts_with("profile tls-bootstrap: leave script"), "{e}");
        assert!(leave_err("{{ .Secrets.k }}").contains("\"k\""));
        assert!(leave_err("{{ $.Vars.x }}").contains("\"x\""));
        assert!(leave_err("{{ (.Secrets).x }}").contains("\"x\""));
        assert!(leave_err("{{ .HostAddress.NodeAddress }}").contains("NodeAddress"));
    }

    #[test]
    fn verified_scripts_must_be_template_free() {
        // S18
        assert!(
            check_verified_script(
                "p",
                Phase::Join,
                "set -euo pipefail\necho \"$KPSSH_NODE_NAME\""
            )
            .is_ok()
        );
        let e = check_verified_script("p", Phase::Join, "echo {{ .NodeName }}").unwrap_err();
        assert!(
            e.to_string()
                .starts_with("profile p: join script contains template actions"),
            "{e}"
        );
        let p = profile("true");
        assert!(matches!(
            check_verified_profile(&p),
            Err(ProfileError::VerifiedTemplated {
                phase: Phase::Join,
                ..
            })
        ));
        let mut p = profile("true");
        p.scripts.join = Some("true".into());
        p.scripts.uninstall = Some("{{ .X }}".into()); // never run by the controller
        assert!(check_verified_profile(&p).is_ok());
    }
}
