//! How the operator commands (`probe`, `phase`) name a host to reach.

use std::path::PathBuf;

use anyhow::Context as _;

use crate::secret::Secret;
use crate::ssh::{HostKeyPin, HostTarget};

#[derive(Debug, Clone, clap::Args)]
pub struct TargetArgs {
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
    /// Without it any host key is accepted for this one connection (`kpssh probe` prints the
    /// key's fingerprint in its output, to pin it).
    #[arg(long = "known-host")]
    pub known_host: Option<String>,
}

impl TargetArgs {
    pub fn target(&self) -> anyhow::Result<HostTarget> {
        let key = std::fs::read_to_string(&self.key)
            .with_context(|| format!("cannot read key file {}", self.key.display()))?;
        Ok(HostTarget {
            host: format!("{}:{}", self.address, self.port),
            address: self.address.clone(),
            port: self.port,
            user: self.user.clone(),
            key: Secret::new(key),
            pin: HostKeyPin::from_sources(self.known_host.as_deref(), None),
            jump: None,
        })
    }
}
