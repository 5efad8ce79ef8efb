//! Deterministic simulation: simulated hosts behind the `Transport` port, a simulated kubelet
//! that registers Nodes in the in-memory `Cluster`, all on tokio's (paused) clock.

pub mod host;
pub mod kubelet;
pub mod transport;
pub mod world;

pub use host::{SimHost, SimPhase};
pub use transport::SimTransport;
