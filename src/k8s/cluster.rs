//! The Kubernetes operations the controller needs, with the API server's semantics:
//! resourceVersion compare-and-swap, status separate from spec, finalizers, ordered watches.

use std::fmt::Debug;
use std::future::Future;
use std::sync::Arc;

use futures::StreamExt;
use futures::stream::BoxStream;
use kube::core::Selector;
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::Value;

use super::ClusterError;

/// Any Kubernetes object kind with a static type (CRDs from `crate::api`, k8s-openapi kinds).
pub trait Object:
    kube::Resource<DynamicType = (), Scope: super::kube_cluster::ScopedApi<Self>>
    + Clone
    + Serialize
    + DeserializeOwned
    + Debug
    + Send
    + Sync
    + 'static
{
}

impl<T> Object for T where
    T: kube::Resource<DynamicType = (), Scope: super::kube_cluster::ScopedApi<T>>
        + Clone
        + Serialize
        + DeserializeOwned
        + Debug
        + Send
        + Sync
        + 'static
{
}

/// One event of a watch, in the order the API server committed the changes.
#[derive(Debug, Clone, PartialEq)]
pub enum WatchEvent<K> {
    /// The full current set: sent first, and again after the watch had to re-list.
    /// Consumers replace their view with it.
    Restarted(Vec<K>),
    /// Created or modified.
    Applied(K),
    /// Gone from the API (finalizers done).
    Deleted(K),
}

impl<K> WatchEvent<K> {
    /// The same event with its objects behind `Arc`s.
    pub fn shared(self) -> WatchEvent<Arc<K>> {
        match self {
            WatchEvent::Restarted(all) => {
                WatchEvent::Restarted(all.into_iter().map(Arc::new).collect())
            }
            WatchEvent::Applied(k) => WatchEvent::Applied(Arc::new(k)),
            WatchEvent::Deleted(k) => WatchEvent::Deleted(Arc::new(k)),
        }
    }
}

impl<K: Clone> WatchEvent<Arc<K>> {
    /// The same event with its objects out of their `Arc`s (copied when still shared).
    pub fn owned(self) -> WatchEvent<K> {
        match self {
            WatchEvent::Restarted(all) => {
                WatchEvent::Restarted(all.into_iter().map(Arc::unwrap_or_clone).collect())
            }
            WatchEvent::Applied(k) => WatchEvent::Applied(Arc::unwrap_or_clone(k)),
            WatchEvent::Deleted(k) => WatchEvent::Deleted(Arc::unwrap_or_clone(k)),
        }
    }
}

pub type WatchStream<K> = BoxStream<'static, Result<WatchEvent<K>, ClusterError>>;

/// Delete preconditions, as the API server's `DeleteOptions.preconditions`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Precondition {
    pub uid: Option<String>,
    pub resource_version: Option<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeleteOutcome {
    /// Removed from the API.
    Deleted,
    /// Finalizers hold it: `deletionTimestamp` is set.
    Terminating,
    /// It was not there.
    NotFound,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EvictOutcome {
    Evicted,
    NotFound,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum EventType {
    Normal,
    Warning,
}

/// The object an event or an error is about.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ObjectRef {
    pub api_version: String,
    pub kind: String,
    pub namespace: Option<String>,
    pub name: String,
    pub uid: Option<String>,
}

impl ObjectRef {
    pub fn of<K: Object>(obj: &K) -> Self {
        let meta = obj.meta();
        ObjectRef {
            api_version: K::api_version(&()).into_owned(),
            kind: K::kind(&()).into_owned(),
            namespace: meta.namespace.clone(),
            name: meta.name.clone().unwrap_or_default(),
            uid: meta.uid.clone(),
        }
    }
}

impl std::fmt::Display for ObjectRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.namespace {
            Some(ns) => write!(f, "{} {}/{}", self.kind, ns, self.name),
            None => write!(f, "{} {}", self.kind, self.name),
        }
    }
}

/// A Kubernetes Event. Messages must already be redacted: events are world-readable.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct EventRecord {
    pub regarding: ObjectRef,
    pub type_: EventType,
    pub reason: String,
    pub message: String,
}

/// The port. `ns` is `None` for cluster-scoped kinds (and for "all namespaces" in list/watch).
///
/// Writes are compare-and-swap: `replace` and `replace_status` fail with
/// [`ClusterError::Conflict`] when `metadata.resourceVersion` is not the stored one.
pub trait Cluster: Clone + Send + Sync + 'static {
    fn get<K: Object>(
        &self,
        ns: Option<&str>,
        name: &str,
    ) -> impl Future<Output = Result<Option<K>, ClusterError>> + Send;

    fn list<K: Object>(
        &self,
        ns: Option<&str>,
        selector: Option<&Selector>,
    ) -> impl Future<Output = Result<Vec<K>, ClusterError>> + Send;

    fn create<K: Object>(&self, obj: &K) -> impl Future<Output = Result<K, ClusterError>> + Send;

    /// Replace metadata and spec (status is ignored); CAS on resourceVersion.
    fn replace<K: Object>(&self, obj: &K) -> impl Future<Output = Result<K, ClusterError>> + Send;

    /// Replace status only; CAS on resourceVersion.
    fn replace_status<K: Object>(
        &self,
        obj: &K,
    ) -> impl Future<Output = Result<K, ClusterError>> + Send;

    /// JSON merge patch (RFC 7386) of metadata/spec. A `metadata.resourceVersion` in the patch
    /// makes it a CAS.
    fn patch<K: Object>(
        &self,
        ns: Option<&str>,
        name: &str,
        patch: &Value,
    ) -> impl Future<Output = Result<K, ClusterError>> + Send;

    /// JSON merge patch (RFC 7386) of the status subresource: only `patch["status"]` is
    /// applied (metadata and spec stay); no resourceVersion, so it never conflicts. A patch
    /// that changes nothing leaves the object (and its resourceVersion) as it was.
    fn patch_status<K: Object>(
        &self,
        ns: Option<&str>,
        name: &str,
        patch: &Value,
    ) -> impl Future<Output = Result<K, ClusterError>> + Send;

    fn delete<K: Object>(
        &self,
        ns: Option<&str>,
        name: &str,
        precondition: Option<Precondition>,
    ) -> impl Future<Output = Result<DeleteOutcome, ClusterError>> + Send;

    /// Ordered events: first `Restarted` with the current set, then every change.
    fn watch<K: Object>(&self, ns: Option<&str>) -> WatchStream<K>;

    /// [`Cluster::watch`] with each object behind an `Arc`, for consumers that keep what they
    /// see: an in-memory cluster hands every watcher the stored object itself instead of a
    /// copy each.
    fn watch_shared<K: Object>(&self, ns: Option<&str>) -> WatchStream<Arc<K>> {
        self.watch::<K>(ns)
            .map(|ev| ev.map(WatchEvent::shared))
            .boxed()
    }

    /// [`Cluster::replace_status`] returning the stored object behind an `Arc` (shared with
    /// the watchers by an in-memory cluster).
    fn replace_status_shared<K: Object>(
        &self,
        obj: &K,
    ) -> impl Future<Output = Result<Arc<K>, ClusterError>> + Send {
        async move { self.replace_status(obj).await.map(Arc::new) }
    }

    /// Delete a Pod with `grace_seconds` as the deletion's grace period (the API's
    /// `DeleteOptions.gracePeriodSeconds`: it can only shorten the pod's own). An in-memory
    /// cluster has no kubelet to wait for and deletes at once.
    fn delete_pod(
        &self,
        ns: &str,
        name: &str,
        grace_seconds: u32,
    ) -> impl Future<Output = Result<DeleteOutcome, ClusterError>> + Send {
        let _ = grace_seconds;
        self.delete::<k8s_openapi::api::core::v1::Pod>(Some(ns), name, None)
    }

    /// Through the Eviction API: PodDisruptionBudgets can refuse with `TooManyRequests`.
    fn evict(
        &self,
        ns: &str,
        pod: &str,
    ) -> impl Future<Output = Result<EvictOutcome, ClusterError>> + Send;

    /// Best effort: a lost event never fails the caller.
    fn record_event(&self, event: EventRecord) -> impl Future<Output = ()> + Send;
}

/// `ns/name` or `name`, for error texts.
pub fn object_key(ns: Option<&str>, name: &str) -> String {
    match ns {
        Some(ns) => format!("{ns}/{name}"),
        None => name.to_string(),
    }
}
