//! `kpssh probe --host NS/NAME`: ask the running controller to probe an SSHHost now. The
//! request is an annotation with the time it was made; the host's actor probes when the value
//! changes and stamps `status.lastProbeTime` (S63's Secret and spec edits trigger the same).

use std::time::Duration;

use anyhow::Context as _;
use serde_json::json;

use crate::api::{PROBE_ANNOTATION, SSHHost};
use crate::k8s::{Cluster, KubeCluster};

/// Ask, wait, print; exit 0 when the host probed healthy, 1 when not (or no answer in time).
pub async fn run(host: &str, wait: Duration) -> anyhow::Result<i32> {
    let (ns, name) = match host.split_once('/') {
        Some((ns, name)) => (ns.to_string(), name.to_string()),
        None => (
            crate::api::DEFAULT_POOL_NAMESPACE.to_string(),
            host.to_string(),
        ),
    };
    let config = kube::Config::infer()
        .await
        .context("no cluster (set KUBECONFIG or run in-cluster)")?;
    let cluster = KubeCluster::new(kube::Client::try_from(config)?);
    let outcome = request(&cluster, &ns, &name, wait, jiff::Timestamp::now()).await?;
    println!("{}", outcome.text);
    Ok(if outcome.healthy { 0 } else { 1 })
}

/// What `kpssh probe --host` prints.
#[derive(Debug, PartialEq, Eq)]
pub struct Outcome {
    pub healthy: bool,
    pub text: String,
}

/// Set the annotation to `now` and wait (polling) until the host's `lastProbeTime` is at
/// least `now` (seconds), for at most `wait`.
pub async fn request<C: Cluster>(
    cluster: &C,
    ns: &str,
    name: &str,
    wait: Duration,
    now: jiff::Timestamp,
) -> anyhow::Result<Outcome> {
    let asked = now.strftime("%Y-%m-%dT%H:%M:%SZ").to_string();
    let patch = json!({"metadata": {"annotations": {PROBE_ANNOTATION: asked}}});
    let _: SSHHost = cluster
        .patch(Some(ns), name, &patch)
        .await
        .map_err(|e| match e {
            crate::k8s::ClusterError::NotFound { .. } => {
                anyhow::anyhow!("SSHHost {ns}/{name} not found (kubectl get sshh -A lists them)")
            }
            other => anyhow::anyhow!("asking for a probe of SSHHost {ns}/{name}: {other}"),
        })?;
    let asked_second = now.as_second();
    let deadline = tokio::time::Instant::now() + wait;
    loop {
        let host: Option<SSHHost> = cluster.get(Some(ns), name).await?;
        let status = host
            .as_ref()
            .and_then(|h| h.status.clone())
            .unwrap_or_default();
        let probed = status
            .last_probe_time
            .as_ref()
            .is_some_and(|t| t.0.as_second() >= asked_second);
        if probed {
            let error = status.last_probe_error.clone();
            let mut text = format!("SSHHost {ns}/{name}: {}", status.state);
            if let Some(e) = &error {
                text.push_str(&format!("\nprobe error: {e}"));
            }
            if let Some(b) = &status.launch_backoff
                && let Some(until) = &b.until
            {
                text.push_str(&format!(
                    "\nlaunch backoff: not claimed before {} after {} failed launch(es)",
                    until.0.strftime("%Y-%m-%dT%H:%M:%SZ"),
                    b.failures
                ));
            }
            return Ok(Outcome {
                healthy: error.is_none(),
                text,
            });
        }
        if tokio::time::Instant::now() >= deadline {
            return Ok(Outcome {
                healthy: false,
                text: format!(
                    "SSHHost {ns}/{name}: no probe within {wait:?} (is `kpssh controller` running for namespace {ns}? `kpssh doctor` checks)"
                ),
            });
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}
