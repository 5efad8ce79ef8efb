//! kpssh: autoscale Kubernetes cluster membership of hosts reachable only over SSH.
//!
//! Layers (see `docs/architecture.md`): `api` holds the CRD types, `k8s` the `Cluster` port and
//! its implementations, `ssh` the `Transport` port, `profile` rendering and verified execution,
//! `actors` the supervisor/host actors/router, `karpenter` the Karpenter semantics, `sim` the
//! deterministic simulation.

pub mod actors;
pub mod api;
pub mod cli;
pub mod clock;
pub mod k8s;
pub mod karpenter;
pub mod profile;
pub mod secret;
pub mod server;
pub mod sim;
pub mod ssh;
pub mod telemetry;
