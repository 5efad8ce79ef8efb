//! SSH: the [`Transport`] port (`transport`), its russh implementation with pooled connections
//! (`client`, `pool`) and capped output streams (`capped`), host-key pins (`known_host`) and the probe contract (`probe`).

pub mod capped;
pub mod client;
pub mod known_host;
pub mod pool;
pub mod probe;
pub mod transport;

pub use client::{RusshTransport, TransportConfig};
pub use probe::{ProbeError, ProbeFacts};
pub use transport::{
    Cancel, CommandOutput, HostKeyPin, HostTarget, JumpKey, ProbeReport, RemoteCommand, Transport,
    TransportError,
};
