//! `kpssh probe`: probe one host over SSH, the way the controller does, and print what it saw.
//!
//! Prints `{"cpu":…,"memoryKiB":…,"arch":…,"kubeletActive":…,"fingerprint":…}` and exits 0, or
//! prints the error (which names the host and never contains key material) and exits 1.
//!
//! `kpssh probe --host NS/NAME` instead asks the running controller to probe an SSHHost now
//! (it sets the `karpenter.dklesev.github.io/probe-requested` annotation), waits until the
//! host's `status.lastProbeTime` shows that probe, and prints the host's state and error.

use crate::ssh::{RusshTransport, Transport, TransportConfig};

#[derive(Debug, Clone, clap::Args)]
pub struct ProbeArgs {
    /// Ask the controller to probe this SSHHost (`NAMESPACE/NAME`, or `NAME` in the pool
    /// namespace) now, through the cluster of the current kubeconfig, and print the outcome.
    #[arg(long, conflicts_with_all = ["address", "key"])]
    pub host: Option<String>,
    /// With `--host`: how long to wait for the controller's probe (Go duration).
    #[arg(long, default_value = "60s", value_parser = super::controller::parse_duration)]
    pub wait: std::time::Duration,
    #[command(flatten)]
    pub target: Option<super::target::TargetArgs>,
    /// Probe a Verified host through its shim (sends the command `probe`).
    #[arg(long)]
    pub verified: bool,
}

#[derive(serde::Serialize)]
#[serde(rename_all = "camelCase")]
struct Output<'a> {
    cpu: u32,
    #[serde(rename = "memoryKiB")]
    memory_kib: u64,
    arch: &'a str,
    kubelet_active: bool,
    fingerprint: &'a str,
}

pub async fn run(args: ProbeArgs) -> anyhow::Result<i32> {
    if let Some(host) = &args.host {
        return super::probe_request::run(host, args.wait).await;
    }
    let Some(target) = &args.target else {
        anyhow::bail!(
            "say which host: --host NAMESPACE/NAME (through the controller), or --address and --key (directly over SSH)"
        );
    };
    let target = target.target()?;
    let transport = RusshTransport::new(TransportConfig::default());
    let shim = args.verified.then_some("kpssh-shim");
    match transport.probe(&target, shim).await {
        Ok(report) => {
            let out = Output {
                cpu: report.facts.cpu,
                memory_kib: report.facts.memory_kib,
                arch: &report.facts.arch,
                kubelet_active: report.facts.kubelet_active,
                fingerprint: &report.fingerprint,
            };
            println!("{}", serde_json::to_string(&out)?);
            Ok(0)
        }
        Err(e) => {
            eprintln!("probe failed: {e}");
            Ok(1)
        }
    }
}
