//! The `kpssh` command line: one module per subcommand.

pub mod controller;
pub mod crds;
pub mod phase;
pub mod probe;
pub mod sign;
pub mod sim;
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
    /// Render one phase of a profile and run it on one host; exits with the script's status.
    Phase(Box<phase::PhaseArgs>),
    /// Probe one host over SSH and print its facts as JSON.
    Probe(probe::ProbeArgs),
    /// Sign an SSHJoinProfile's scripts (v1 and v2 signatures) with ssh-keygen.
    Sign(sign::SignArgs),
    /// Simulate a fleet under kpssh (capacity and savings planning, fault campaigns).
    Sim(sim::SimArgs),
}

/// Runs the parsed command and returns the process exit code.
pub async fn run(cli: Cli) -> anyhow::Result<i32> {
    match cli.command {
        Command::Controller(args) => controller::run(args).await,
        Command::Crds(args) => crds::run(&args),
        Command::Phase(args) => phase::run(*args).await,
        Command::Probe(args) => probe::run(args).await,
        Command::Sign(args) => sign::run(args),
        Command::Sim(args) => sim::run(args),
    }
}
