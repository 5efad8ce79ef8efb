//! The actor core (DESIGN §2): a [`supervisor::Supervisor`] keeps one [`host::HostActor`] per
//! SSHHost; the [`router::Router`] turns NodeClaims into claims and `Launch`/`Release` messages.
//! A host's status is only ever written by its own actor, except the claim itself, which the
//! router writes as a compare-and-swap that the actor's own writes are fenced against.

pub mod config;
pub mod context;
pub mod drift;
pub mod events;
pub mod host;
pub mod limits;
pub mod nodeclass;
pub mod router;
pub mod status;
pub mod supervisor;

pub use config::Config;
pub use context::Context;
