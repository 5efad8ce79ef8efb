//! kpssh: autoscale Kubernetes cluster membership of hosts reachable only over SSH.
//!
//! Layers (see `docs/architecture.md`), each importing only those below it: `api` holds the
//! CRD types and the shared vocabulary (quantities, requirements, annotations), `k8s` the
//! `Cluster` port and its implementations, `ssh` the `Transport` port, `profile` rendering and
//! verified execution, `provider` the SSH pool as a cloud provider (the shared `Context`,
//! instance types, drift), `actors` the supervisor/host actors/router, `karpenter` the
//! Karpenter semantics (reaching the pool only through `provider`), `sim` the deterministic
//! simulation.

pub mod actors;
pub mod api;
pub mod cli;
pub mod clock;
pub mod k8s;
pub mod karpenter;
pub mod profile;
pub mod provider;
pub mod secret;
pub mod server;
pub mod sim;
pub mod ssh;
pub mod telemetry;
