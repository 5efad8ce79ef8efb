//! S63: the chart's PrometheusRule, rendered by the real helm and evaluated by the real
//! `promtool test rules` (Debian's `prometheus` package) on synthetic series: install
//! failures fire KpsshLaunchFailureRate and KpsshLaunchesFailing (KpsshJoinFailureRate of
//! old counted joins only); a host that keeps failing launches while its probes look fine
//! fires KpsshHostsBackingOff, and hosts flapping Unhealthy ↔ Available fire
//! KpsshHostsFlapping where KpsshHostsUnhealthy stays silent. S59: a NodePool near its limit
//! (Karpenter core's `karpenter_nodepools_usage` and `_limit`) fires KpsshNodePoolNearLimit.

#[path = "support/apply.rs"]
#[allow(dead_code)]
mod apply;
#[path = "support/helm.rs"]
mod helm;

use std::process::Command;

use serde_json::Value;

const CHART: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/charts/kpssh");

/// The rendered rule groups as a Prometheus rule file (`groups:` at the top).
fn rule_file(dir: &std::path::Path) -> std::path::PathBuf {
    let text = helm::run_helm(&[
        "template",
        "kpssh",
        CHART,
        "--namespace",
        "kpssh-system",
        "--set",
        "prometheusRule.enabled=true",
    ])
    .unwrap_or_else(|e| panic!("helm template: {e}"));
    let rule = apply::parse_docs(&text)
        .into_iter()
        .find(|o| o["kind"] == "PrometheusRule")
        .expect("a PrometheusRule");
    let mut groups: Value = rule["spec"].clone();
    let path = dir.join("rules.yaml");
    std::fs::write(&path, serde_yaml::to_string(&groups).expect("yaml")).expect("write rules");
    // The unit tests compare labels only: without the annotations, an expected alert need not
    // restate its summary and description.
    for group in groups["groups"].as_array_mut().into_iter().flatten() {
        for rule in group["rules"].as_array_mut().into_iter().flatten() {
            if let Some(r) = rule.as_object_mut() {
                r.remove("annotations");
            }
        }
    }
    let bare = dir.join("rules-bare.yaml");
    std::fs::write(&bare, serde_yaml::to_string(&groups).expect("yaml")).expect("write rules");
    path
}

fn promtool() -> &'static str {
    let found = Command::new("promtool").arg("--version").output();
    assert!(
        found.is_ok_and(|o| o.status.success()),
        "promtool is missing: scripts/test-deps.sh installs it (Debian package prometheus)"
    );
    "promtool"
}

/// Series and expectations in promtool's unit-test format.
const TESTS: &str = r#"
rule_files: [rules-bare.yaml]
evaluation_interval: 1m
tests:
  # Installs fail (the mirror cannot be resolved), joins never run: half of all launches fail.
  - interval: 1m
    input_series:
      - series: 'kpssh_instance_phase_duration_seconds_count{phase="install",outcome="error"}'
        values: '0+2x60'
      - series: 'kpssh_instance_phase_duration_seconds_count{phase="install",outcome="success"}'
        values: '0+2x60'
      - series: 'kpssh_launch_failures_total{class="small",phase="install"}'
        values: '0+1x60'
      - series: 'kpssh_pool_hosts{class="small",state="Unhealthy"}'
        values: '0x60'
    alert_rule_test:
      - eval_time: 45m
        alertname: KpsshLaunchFailureRate
        exp_alerts:
          - exp_labels: {severity: warning}
      - eval_time: 45m
        alertname: KpsshLaunchesFailing
        exp_alerts:
          - exp_labels: {severity: warning, class: small, phase: install}
  # A host fails a launch, goes Unhealthy, is probed Available, backs off, is claimed again:
  # never Unhealthy for 15 minutes in a row, backing off most of the time.
  - interval: 1m
    input_series:
      - series: 'kpssh_pool_hosts{class="small",state="Unhealthy"}'
        values: '1 1 0 0 0 0 0 0 0 0 1 1 0 0 0 0 0 0 0 0 1 1 0 0 0 0 0 0 0 0 1 1 0 0 0 0 0 0 0 0 1 1 0 0 0 0 0 0 0 0 1 1 0 0 0 0 0 0 0 0 1 1 0 0 0 0 0 0 0 0 1 1 0 0 0 0 0 0 0 0'
      - series: 'kpssh_pool_hosts_backing_off{class="small"}'
        values: '1 1 1 1 1 1 1 1 0 0 1 1 1 1 1 1 1 1 0 0 1 1 1 1 1 1 1 1 0 0 1 1 1 1 1 1 1 1 0 0 1 1 1 1 1 1 1 1 0 0 1 1 1 1 1 1 1 1 0 0 1 1 1 1 1 1 1 1 0 0 1 1 1 1 1 1 1 1 0 0'
    alert_rule_test:
      - eval_time: 75m
        alertname: KpsshHostsUnhealthy
        exp_alerts: []
      - eval_time: 75m
        alertname: KpsshHostsBackingOff
        exp_alerts:
          - exp_labels: {severity: warning, class: small}
      - eval_time: 75m
        alertname: KpsshHostsFlapping
        exp_alerts:
          - exp_labels: {severity: warning, class: small}
  # A healthy pool: nothing fires.
  - interval: 1m
    input_series:
      - series: 'kpssh_instance_phase_duration_seconds_count{phase="join",outcome="success"}'
        values: '0+5x60'
      - series: 'kpssh_instance_phase_duration_seconds_count{phase="install",outcome="success"}'
        values: '0+1x60'
      - series: 'kpssh_launch_failures_total{class="small",phase="join"}'
        values: '0x60'
      - series: 'kpssh_pool_hosts_backing_off{class="small"}'
        values: '0x60'
      - series: 'kpssh_pool_hosts{class="small",state="Unhealthy"}'
        values: '0x60'
    alert_rule_test:
      - {eval_time: 45m, alertname: KpsshLaunchFailureRate, exp_alerts: []}
      - {eval_time: 45m, alertname: KpsshLaunchesFailing, exp_alerts: []}
      - {eval_time: 45m, alertname: KpsshHostsBackingOff, exp_alerts: []}
      - {eval_time: 45m, alertname: KpsshHostsFlapping, exp_alerts: []}
      - {eval_time: 45m, alertname: KpsshHostsUnhealthy, exp_alerts: []}
  # S59, on Karpenter core's names: a NodePool at 95% of its cpu limit; another at 50%, and a
  # resource without a limit.
  - interval: 1m
    input_series:
      - series: 'karpenter_nodepools_usage{nodepool="full",resource_type="cpu"}'
        values: '95x60'
      - series: 'karpenter_nodepools_limit{nodepool="full",resource_type="cpu"}'
        values: '100x60'
      - series: 'karpenter_nodepools_usage{nodepool="roomy",resource_type="cpu"}'
        values: '50x60'
      - series: 'karpenter_nodepools_limit{nodepool="roomy",resource_type="cpu"}'
        values: '100x60'
      - series: 'karpenter_nodepools_usage{nodepool="roomy",resource_type="memory"}'
        values: '1000x60'
    alert_rule_test:
      - eval_time: 30m
        alertname: KpsshNodePoolNearLimit
        exp_alerts:
          - exp_labels: {severity: info, nodepool: full, resource_type: cpu}
"#;

#[test]
fn s63_alerts_cover_install_failures_and_flapping_hosts() {
    let dir = tempfile::tempdir().expect("tempdir");
    let rules = rule_file(dir.path());
    let check = Command::new(promtool())
        .args(["check", "rules"])
        .arg(&rules)
        .output()
        .expect("promtool check rules");
    assert!(
        check.status.success(),
        "promtool check rules: {}{}",
        String::from_utf8_lossy(&check.stdout),
        String::from_utf8_lossy(&check.stderr)
    );
    let tests = dir.path().join("tests.yaml");
    std::fs::write(&tests, TESTS).expect("write tests");
    let out = Command::new(promtool())
        .current_dir(dir.path())
        .args(["test", "rules", "tests.yaml"])
        .output()
        .expect("promtool test rules");
    assert!(
        out.status.success(),
        "promtool test rules:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}
