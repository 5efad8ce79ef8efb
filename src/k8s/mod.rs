//! The `Cluster` port and its two implementations: kube-rs against a real API server
//! (`kube_cluster`) and an in-memory one for the deterministic simulation (`memory`).

pub mod cluster;
pub mod cluster_info;
pub mod error;
pub mod finalizers;
pub mod kube_cluster;
pub mod leader;
pub mod memory;
mod status_field;

pub use cluster::{
    Cluster, DeleteOutcome, EventRecord, EventType, EvictOutcome, Object, ObjectRef, Precondition,
    WatchEvent, WatchStream,
};
pub use error::ClusterError;
pub use kube_cluster::KubeCluster;
pub use memory::MemoryCluster;
