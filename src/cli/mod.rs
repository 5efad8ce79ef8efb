//! The `kpssh` command line: one module per subcommand.

pub mod crds;
pub mod sign;
pub mod sim;

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
    /// Print kpssh's CustomResourceDefinitions as one multi-document YAML.
    Crds(crds::CrdsArgs),
    /// Sign an SSHJoinProfile's scripts (v1 and v2 signatures) with ssh-keygen.
    Sign(sign::SignArgs),
    /// Simulate a fleet under kpssh (capacity and savings planning, fault campaigns).
    Sim(sim::SimArgs),
}

/// Runs the parsed command and returns the process exit code.
pub async fn run(cli: Cli) -> anyhow::Result<i32> {
    match cli.command {
        Command::Crds(args) => crds::run(&args),
        Command::Sign(args) => sign::run(args),
        Command::Sim(args) => sim::run(args),
    }
}
