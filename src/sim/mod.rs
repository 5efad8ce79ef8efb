//! Deterministic simulation: simulated hosts behind the `Transport` port, a simulated kubelet
//! that registers Nodes in the in-memory `Cluster`, all on tokio's (paused) clock; scenario
//! files, fault schedules, invariants and reports for `kpssh sim` and the fault campaigns.

pub mod generate;
pub mod host;
pub mod kubelet;
mod mirror;
pub mod pool;
pub mod report;
pub mod run;
pub mod scenario;
pub mod scheduler;
pub mod shrink;
pub mod transport;
pub mod workload;
pub mod world;

pub use host::{SimHost, SimPhase};
pub use transport::SimTransport;
