//! The `kpssh` command line: one module per subcommand.

pub mod controller;
pub mod crds;
pub mod doctor;
pub mod phase;
pub mod probe;
pub mod probe_request;
pub mod sign;
pub mod sim;
pub mod status;
pub mod target;

use clap::{Parser, Subcommand};

/// Autoscale Kubernetes cluster membership of hosts reachable only over SSH.
#[derive(Parser, Debug)]
#[command(name = "kpssh", version, about, long_about = None)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Run the controller against a cluster (kubeconfig or in-cluster).
    Controller(controller::ControllerArgs),
    /// Print kpssh's CustomResourceDefinitions as one multi-document YAML.
    Crds(crds::CrdsArgs),
    /// Check what a working install needs (CRDs, scheduler, RBAC, node classes, profiles,
    /// hosts, NodePools, the controller's Lease) and print each with its fix.
    Doctor(doctor::DoctorArgs),
    /// Render one phase of a profile and run it on one host; exits with the script's status.
    Phase(Box<phase::PhaseArgs>),
    /// Probe one host over SSH and print its facts as JSON, or (`--host`) ask the controller to
    /// probe an SSHHost now.
    Probe(probe::ProbeArgs),
    /// Sign an SSHJoinProfile's scripts (v1 and v2 signatures) with ssh-keygen.
    Sign(sign::SignArgs),
    /// Simulate a fleet under kpssh (capacity and savings planning, fault campaigns).
    Sim(sim::SimArgs),
    /// The pool at a glance: hosts by state per class, claimable and warm, errors, claims.
    Status(status::StatusArgs),
}

/// Parse the command line. Installed as `kubectl-kpssh`, the binary is a kubectl plugin
/// (`kubectl kpssh status`) and names itself that way in help and errors. With no arguments at
/// all it runs the controller, as the Go provider's image did (its entrypoint took none).
pub fn parse() -> Cli {
    use clap::{CommandFactory, FromArgMatches};
    let argv0 = std::env::args_os().next().unwrap_or_default();
    let plugin = std::path::Path::new(&argv0)
        .file_name()
        .is_some_and(|n| n.to_string_lossy().starts_with("kubectl-kpssh"));
    let mut cmd = Cli::command();
    if plugin {
        cmd = cmd.bin_name("kubectl kpssh").name("kubectl kpssh");
    }
    let matches = cmd.get_matches_from(args_or_controller(std::env::args_os().collect()));
    Cli::from_arg_matches(&matches).unwrap_or_else(|e| e.exit())
}

/// `kpssh` alone is `kpssh controller`.
fn args_or_controller(mut args: Vec<std::ffi::OsString>) -> Vec<std::ffi::OsString> {
    if args.len() <= 1 {
        args.truncate(1);
        if args.is_empty() {
            args.push("kpssh".into());
        }
        args.push("controller".into());
    }
    args
}

/// Runs the parsed command and returns the process exit code.
pub async fn run(cli: Cli) -> anyhow::Result<i32> {
    match cli.command {
        Command::Controller(args) => controller::run(args).await,
        Command::Crds(args) => crds::run(&args),
        Command::Doctor(args) => doctor::run(args).await,
        Command::Phase(args) => phase::run(*args).await,
        Command::Probe(args) => probe::run(args).await,
        Command::Sign(args) => sign::run(args),
        Command::Sim(args) => sim::run(args),
        Command::Status(args) => status::run(args).await,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::{CommandFactory, FromArgMatches};

    #[test]
    fn no_arguments_run_the_controller_as_the_go_image_did() {
        let args = args_or_controller(vec!["/kpssh".into()]);
        let cli = Cli::from_arg_matches(&Cli::command().get_matches_from(args)).expect("parse");
        assert!(matches!(cli.command, Command::Controller(_)));
        let args = args_or_controller(vec!["kpssh".into(), "status".into()]);
        assert_eq!(args.len(), 2, "arguments are left alone");
    }
}
