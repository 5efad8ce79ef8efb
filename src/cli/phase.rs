//! `kpssh phase`: render one phase of a profile and run it on one host, as the controller
//! would, then exit with the script's exit status. For testing profiles by hand.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context as _, bail};

use super::target::TargetArgs;
use crate::actors::host::phases::plan;
use crate::api::host::SecretRef;
use crate::api::{ExecMode, SSHHost, SSHHostSpec, SSHJoinProfile};
use crate::profile::phase::{Phase, PhaseContext};
use crate::profile::verified::VerifiedPolicy;
use crate::secret::Secret;
use crate::ssh::{RusshTransport, Transport, TransportConfig};

#[derive(Debug, Clone, clap::Args)]
pub struct PhaseArgs {
    /// SSHJoinProfile manifest (YAML).
    #[arg(long)]
    pub profile: PathBuf,
    #[arg(long, value_parser = ["install", "join", "leave", "uninstall"])]
    pub phase: String,
    #[command(flatten)]
    pub target: TargetArgs,
    /// `KPSSH_VAR_<key>` / `.Vars.key`; repeat for several.
    #[arg(long = "var", value_parser = key_value)]
    pub vars: Vec<(String, String)>,
    /// `KPSSH_SECRET_<KEY>` / `.Secrets.key`; repeat for several. Redacted from output.
    #[arg(long = "secret", value_parser = key_value)]
    pub secrets: Vec<(String, String)>,
    /// Override the profile's timeout for this phase (90s, 5m, 1h30m).
    #[arg(long, value_parser = super::controller::parse_duration)]
    pub timeout: Option<Duration>,
    /// API server URL the host joins (`KPSSH_CLUSTER_ENDPOINT`; the controller takes it from
    /// the node class's spec.cluster or kube-public/cluster-info). Needed by join and install.
    #[arg(long, default_value = "")]
    pub cluster_endpoint: String,
    /// Base64 of the API server's CA bundle (`KPSSH_CLUSTER_CA_B64`).
    #[arg(long, default_value = "")]
    pub cluster_ca_b64: String,
    /// Bootstrap token for join (`<id>.<secret>`). Redacted from output.
    #[arg(long, env = "KPSSH_BOOTSTRAP_TOKEN")]
    pub token: Option<String>,
    #[arg(long, default_value = "manual")]
    pub node_name: String,
    #[arg(long, default_value = "")]
    pub provider_id: String,
    /// Run through the host shim with signatures checked against these signers.
    #[arg(long = "trusted-signer")]
    pub trusted_signers: Vec<String>,
    #[arg(long, default_value = "/opt/kpssh/kpssh-shim")]
    pub shim_command: String,
    /// Verified: use the profile's v1 signature when the phase has no v2 one (downgradable;
    /// the controller's --allow-v1-signatures).
    #[arg(long)]
    pub allow_v1: bool,
}

fn key_value(s: &str) -> Result<(String, String), String> {
    s.split_once('=')
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .ok_or_else(|| format!("{s:?}: expected key=value"))
}

fn phase(name: &str) -> anyhow::Result<Phase> {
    Ok(match name {
        "install" => Phase::Install,
        "join" => Phase::Join,
        "leave" => Phase::Leave,
        "uninstall" => Phase::Uninstall,
        other => bail!("unknown phase {other}"),
    })
}

pub async fn run(args: PhaseArgs) -> anyhow::Result<i32> {
    let text = std::fs::read_to_string(&args.profile)
        .with_context(|| format!("cannot read {}", args.profile.display()))?;
    let profile: SSHJoinProfile = serde_yaml::from_str(&text)
        .with_context(|| format!("{} is not an SSHJoinProfile", args.profile.display()))?;
    let target = args.target.target()?;
    let host = host_for(&args);
    let ctx = PhaseContext {
        cluster_endpoint: args.cluster_endpoint.clone(),
        cluster_ca_b64: args.cluster_ca_b64.clone(),
        bootstrap_token: args.token.clone().map(Secret::new),
        node_name: args.node_name.clone(),
        provider_id: args.provider_id.clone(),
        host_address: args.target.address.clone(),
        node_address: args.target.address.clone(),
        vars: args.vars.iter().cloned().collect(),
        secrets: args
            .secrets
            .iter()
            .map(|(k, v)| (k.clone(), Secret::new(v.clone())))
            .collect::<BTreeMap<_, _>>(),
        ..PhaseContext::default()
    };
    let phase = phase(&args.phase)?;
    let policy = VerifiedPolicy {
        allow_v1: args.allow_v1,
    };
    let (mut cmd, redactor) = plan(&host, &profile, phase, &ctx, jiff::Timestamp::now(), policy)
        .map_err(|f| {
            // The renderer names the controller's fixes; by hand the fix is a flag.
            if args.cluster_endpoint.is_empty() && f.message.contains("needs a cluster endpoint") {
                anyhow::anyhow!(
                    "{phase} needs a cluster endpoint: pass --cluster-endpoint https://<api-server>:6443 and --cluster-ca-b64 <base64 CA bundle>"
                )
            } else {
                anyhow::anyhow!(f.message)
            }
        })?;
    if let Some(t) = args.timeout {
        cmd.timeout = t;
    }
    let transport = RusshTransport::new(TransportConfig::default());
    match transport.exec(&target, cmd).await {
        Ok(out) => {
            // The transport keeps the end of each stream: when it dropped a beginning, the
            // text may start inside a secret, which redact_window also removes.
            let shown = |bytes: &[u8], dropped: u64| {
                redactor.redact_window(&String::from_utf8_lossy(bytes), dropped > 0, false)
            };
            print!("{}", shown(&out.stdout, out.stdout_dropped));
            eprint!("{}", shown(&out.stderr, out.stderr_dropped));
            if out.stdout_dropped + out.stderr_dropped > 0 {
                eprintln!(
                    "kpssh: output capped to its end ({} stdout and {} stderr bytes dropped before)",
                    out.stdout_dropped, out.stderr_dropped
                );
            }
            Ok(i32::try_from(out.exit_status).unwrap_or(255))
        }
        Err(e) => {
            eprintln!("{phase} failed: {}", redactor.redact(&e.to_string()));
            Ok(255)
        }
    }
}

/// The SSHHost the command stands for: the controller renders against one.
fn host_for(args: &PhaseArgs) -> SSHHost {
    let verified = !args.trusted_signers.is_empty();
    SSHHost::new(
        &args.target.address,
        SSHHostSpec {
            address: args.target.address.clone(),
            port: i32::from(args.target.port),
            user: args.target.user.clone(),
            ssh_key_secret_ref: SecretRef::default(),
            node_address: None,
            capacity: BTreeMap::new(),
            exec_mode: if verified {
                ExecMode::Verified
            } else {
                ExecMode::Raw
            },
            trusted_signers: verified.then(|| args.trusted_signers.clone()),
            shim_command: args.shim_command.clone(),
            proxy_jump: None,
        },
    )
}
