//! The container image (`Containerfile`, `make image` = `scripts/image.sh`): built offline from
//! scratch around the kpssh binary this test run built, run with podman: `--version` answers,
//! the user is 65532 (non-root), and started with no arguments, as the Go provider's image was,
//! it runs the controller (which, with no cluster to reach, says so). The image name the script
//! gives by default is the chart's default image.
//!
//! Running a container on this kind of machine needs two settings, both passed here: runc
//! (crun refuses the hybrid cgroup v1/v2 layout) and rlimits no higher than the current ones
//! (podman's defaults raise RLIMIT_NOFILE/NPROC, which needs CAP_SYS_RESOURCE).

use std::path::Path;
use std::process::{Command, Output};

const ROOT: &str = env!("CARGO_MANIFEST_DIR");

fn run(cmd: &mut Command) -> Output {
    cmd.output()
        .unwrap_or_else(|e| panic!("{cmd:?}: {e} (run scripts/test-deps.sh)"))
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

fn podman_run(image: &str, args: &[&str]) -> Output {
    run(Command::new("podman")
        .args(["--runtime", "runc", "run", "--rm", "--network", "none"])
        .args([
            "--ulimit",
            "nofile=1024:1024",
            "--ulimit",
            "nproc=1024:1024",
        ])
        .args([
            "-e",
            "POOL_NAMESPACE=pool",
            "-e",
            "KUBERNETES_SERVICE_HOST=",
        ])
        .arg(image)
        .args(args))
}

fn chart_default_image() -> String {
    let values: serde_yaml::Value = serde_yaml::from_str(
        &std::fs::read_to_string(Path::new(ROOT).join("charts/kpssh/values.yaml"))
            .expect("values.yaml"),
    )
    .expect("values.yaml parses");
    let chart: serde_yaml::Value = serde_yaml::from_str(
        &std::fs::read_to_string(Path::new(ROOT).join("charts/kpssh/Chart.yaml"))
            .expect("Chart.yaml"),
    )
    .expect("Chart.yaml parses");
    let repo = values["image"]["repository"].as_str().expect("repository");
    let tag = values["image"]["tag"].as_str().unwrap_or_default();
    let tag = if tag.is_empty() {
        chart["appVersion"].as_str().expect("appVersion")
    } else {
        tag
    };
    format!("{repo}:{tag}")
}

#[test]
fn image_builds_offline_runs_as_nonroot_and_starts_the_controller_without_a_subcommand() {
    let script = Path::new(ROOT).join("scripts/image.sh");
    // The default name is the chart's default image.
    let tag = chart_default_image();
    let out = run(Command::new(&script)
        .args(["--binary", env!("CARGO_BIN_EXE_kpssh")])
        .args(["--tag", &tag]));
    assert!(out.status.success(), "image.sh: {}", text(&out.stderr));
    assert_eq!(text(&out.stdout).lines().last(), Some(tag.as_str()));
    assert!(
        !text(&out.stderr).contains("Trying to pull"),
        "nothing is pulled: {}",
        text(&out.stderr)
    );

    let out = run(Command::new("podman").args([
        "image",
        "inspect",
        "--format",
        "{{.Config.User}} {{json .Config.Entrypoint}} {{len .RootFS.Layers}}",
        &tag,
    ]));
    assert!(out.status.success(), "inspect: {}", text(&out.stderr));
    assert_eq!(text(&out.stdout).trim(), r#"65532:65532 ["/kpssh"] 1"#);

    let out = podman_run(&tag, &["--version"]);
    assert!(out.status.success(), "--version: {}", text(&out.stderr));
    assert_eq!(
        text(&out.stdout).trim(),
        format!("kpssh {}", env!("CARGO_PKG_VERSION"))
    );
    let out = podman_run(&tag, &["--help"]);
    assert!(text(&out.stdout).contains("controller"), "{out:?}");

    // No arguments: the controller, which finds no cluster here (and names what it needs).
    let out = podman_run(&tag, &[]);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    assert!(
        text(&out.stderr).contains("no cluster"),
        "the controller ran: {}",
        text(&out.stderr)
    );
    let _ = run(Command::new("podman").args(["rmi", "-f", &tag]));
}
