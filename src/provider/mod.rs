//! The SSH pool as a cloud provider: the seam between the karpenter layer and the actor core,
//! as Karpenter core draws it with its `CloudProvider` interface (core never reaches into a
//! provider's internals). The karpenter layer reaches the pool only through this module; the
//! actor core ([`crate::actors`]) implements the pool's side of it.
//!
//! | core's `CloudProvider` | kpssh |
//! |---|---|
//! | `GetInstanceTypes` | [`instance_types::instance_types`]: one type per host class of a node class, offerings from its free hosts |
//! | `IsDrifted` | [`drift::drift`]: the NodeClaim against its SSHNodeClass and the host's installed profile |
//! | `Create` | a NodeClaim object; the router claims a host for it ([`HostView::holder`] then answers) |
//! | `Delete` | deleting the NodeClaim; the router releases its host (leave) once it is drained |
//! | `Get`, `List` | [`HostView::holder`], [`HostView::get`], [`HostView::snapshot`] |
//! | (launchability) | [`availability`]: why a NodePool's class has no host to launch on |
//!
//! [`Context`] is what both layers are handed: the ports, the clock, the settings, the shared
//! limits, the pool's views (hosts, claims, node addresses) and the metrics.

pub mod availability;
pub mod config;
pub mod context;
pub mod drift;
pub mod instance_types;
pub mod key_cache;
pub mod launches;
pub mod limits;
pub mod metrics;
pub mod probe_clock;
pub mod shard;

pub use config::Config;
pub use context::{Context, HostView};
