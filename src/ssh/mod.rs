//! SSH: the [`Transport`] port (`transport`) and the probe contract (`probe`).

pub mod probe;
pub mod transport;

pub use probe::{ProbeError, ProbeFacts};
pub use transport::{
    CommandOutput, HostKeyPin, HostTarget, ProbeReport, RemoteCommand, Transport, TransportError,
};
