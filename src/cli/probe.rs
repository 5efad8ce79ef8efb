//! `kpssh probe`: probe one host over SSH, the way the controller does, and print what it saw.
//!
//! Prints `{"cpu":…,"memoryKiB":…,"arch":…,"kubeletActive":…,"fingerprint":…}` and exits 0, or
//! prints the error (which names the host and never contains key material) and exits 1.

use crate::ssh::{RusshTransport, Transport, TransportConfig};

#[derive(Debug, Clone, clap::Args)]
pub struct ProbeArgs {
    #[command(flatten)]
    pub target: super::target::TargetArgs,
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
    let target = args.target.target()?;
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
