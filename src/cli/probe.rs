//! `kpssh probe`: probe one host over SSH, the way the controller does, and print what it saw.
//!
//! Prints `{"cpu":…,"memoryKiB":…,"arch":…,"kubeletActive":…,"fingerprint":…}` and exits 0, or
//! prints the error (which names the host and never contains key material) and exits 1.

use std::path::PathBuf;

use anyhow::Context as _;

use crate::secret::Secret;
use crate::ssh::{HostKeyPin, HostTarget, RusshTransport, Transport, TransportConfig};

#[derive(Debug, Clone, clap::Args)]
pub struct ProbeArgs {
    /// Host name or IP to dial.
    #[arg(long)]
    pub address: String,
    #[arg(long, default_value_t = 22)]
    pub port: u16,
    #[arg(long, default_value = "root")]
    pub user: String,
    /// File holding the (unencrypted) OpenSSH or PEM private key.
    #[arg(long)]
    pub key: PathBuf,
    /// Pin the host key: `SHA256:…` fingerprint, known_hosts line or public-key line.
    /// Without it the key is trusted on first use and its fingerprint printed.
    #[arg(long = "known-host")]
    pub known_host: Option<String>,
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
    let key = std::fs::read_to_string(&args.key)
        .with_context(|| format!("cannot read key file {}", args.key.display()))?;
    let target = HostTarget {
        host: format!("{}:{}", args.address, args.port),
        address: args.address.clone(),
        port: args.port,
        user: args.user.clone(),
        key: Secret::new(key),
        pin: HostKeyPin::from_sources(args.known_host.as_deref(), None),
        jump: None,
    };
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
