//! `Cluster` over kube-rs, against a real API server.
//!
//! Built on kube's raw `Request` builder so that one generic code path serves every kind,
//! namespaced or not; the watch is kube's runtime watcher.

use std::time::Duration;

use either::Either;
use futures::StreamExt;
use k8s_openapi::api::core::v1::{Event, ObjectReference, Pod};
use k8s_openapi::api::policy::v1::Eviction;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, Time};
use k8s_openapi::{ClusterResourceScope, NamespaceResourceScope};
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams, Preconditions};
use kube::core::{ObjectList, Request, Selector};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client};
use serde_json::Value;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;

use super::ClusterError;
use super::cluster::{
    Cluster, DeleteOutcome, EventRecord, EventType, EvictOutcome, Object, Precondition, WatchEvent,
    WatchStream, object_key,
};

/// Every API call is bounded; a hung connection must not stall an actor.
const CALL_TIMEOUT: Duration = Duration::from_secs(30);
const WATCH_TIMEOUT_SECS: u32 = 290;
const FIELD_MANAGER: &str = "kpssh";

#[derive(Clone)]
pub struct KubeCluster {
    client: Client,
}

impl KubeCluster {
    async fn delete_with<K: Object>(
        &self,
        ns: Option<&str>,
        name: &str,
        dp: DeleteParams,
    ) -> Result<DeleteOutcome, ClusterError> {
        let key = object_key(ns, name);
        let kind = kind_of::<K>();
        let req = request_for::<K>(ns)
            .delete(name, &dp)
            .map_err(|e| invalid(&kind, &key, e.to_string()))?;
        let fut = self.client.request_status::<K>(req);
        let res = tokio::time::timeout(CALL_TIMEOUT, fut)
            .await
            .map_err(|_| transient(&kind, &key, "API call timed out"))?;
        match res {
            Ok(Either::Left(obj)) if obj.meta().deletion_timestamp.is_some() => {
                Ok(DeleteOutcome::Terminating)
            }
            Ok(_) => Ok(DeleteOutcome::Deleted),
            Err(e) => match map_error(&kind, &key, e) {
                ClusterError::NotFound { .. } => Ok(DeleteOutcome::NotFound),
                other => Err(other),
            },
        }
    }

    pub fn new(client: Client) -> Self {
        KubeCluster { client }
    }

    pub fn client(&self) -> &Client {
        &self.client
    }

    async fn call<T: serde::de::DeserializeOwned>(
        &self,
        kind: &str,
        key: &str,
        req: Result<http::Request<Vec<u8>>, kube::core::request::Error>,
    ) -> Result<T, ClusterError> {
        let req = req.map_err(|e| invalid(kind, key, e.to_string()))?;
        match tokio::time::timeout(CALL_TIMEOUT, self.client.request::<T>(req)).await {
            Ok(r) => r.map_err(|e| map_error(kind, key, e)),
            Err(_) => Err(transient(kind, key, "API call timed out")),
        }
    }
}

fn invalid(kind: &str, key: &str, message: String) -> ClusterError {
    ClusterError::Invalid {
        kind: kind.into(),
        key: key.into(),
        message,
    }
}

fn transient(kind: &str, key: &str, message: &str) -> ClusterError {
    ClusterError::Transient {
        kind: kind.into(),
        key: key.into(),
        message: message.into(),
    }
}

/// Map kube errors onto the port's error kinds by HTTP status.
pub fn map_error(kind: &str, key: &str, err: kube::Error) -> ClusterError {
    let (kind, key) = (kind.to_string(), key.to_string());
    match err {
        kube::Error::Api(status) => match status.code {
            404 => ClusterError::NotFound { kind, key },
            409 if status.reason == "AlreadyExists" => ClusterError::AlreadyExists { kind, key },
            409 => ClusterError::Conflict { kind, key },
            422 | 400 => ClusterError::Invalid {
                kind,
                key,
                message: status.message,
            },
            401 | 403 => ClusterError::Forbidden {
                kind,
                key,
                message: status.message,
            },
            429 => ClusterError::TooManyRequests {
                kind,
                key,
                message: status.message,
            },
            _ => ClusterError::Transient {
                kind,
                key,
                message: format!("{} ({})", status.message, status.code),
            },
        },
        kube::Error::SerdeError(e) => ClusterError::Decode {
            kind,
            key,
            message: e.to_string(),
        },
        other => ClusterError::Transient {
            kind,
            key,
            message: other.to_string(),
        },
    }
}

fn kind_of<K: Object>() -> String {
    K::kind(&()).into_owned()
}

fn request_for<K: Object>(ns: Option<&str>) -> Request {
    Request::new(K::url_path(&(), ns))
}

fn body<K: Object>(obj: &K, key: &str) -> Result<Vec<u8>, ClusterError> {
    serde_json::to_vec(obj).map_err(|e| ClusterError::Decode {
        kind: kind_of::<K>(),
        key: key.into(),
        message: e.to_string(),
    })
}

fn meta_key<K: Object>(obj: &K) -> (Option<String>, String) {
    let m = obj.meta();
    (m.namespace.clone(), m.name.clone().unwrap_or_default())
}

impl Cluster for KubeCluster {
    async fn get<K: Object>(
        &self,
        ns: Option<&str>,
        name: &str,
    ) -> Result<Option<K>, ClusterError> {
        let key = object_key(ns, name);
        let req = request_for::<K>(ns).get(name, &Default::default());
        match self.call::<K>(&kind_of::<K>(), &key, req).await {
            Ok(obj) => Ok(Some(lean(obj))),
            Err(e) if e.is_not_found() => Ok(None),
            Err(e) => Err(e),
        }
    }

    async fn list<K: Object>(
        &self,
        ns: Option<&str>,
        selector: Option<&Selector>,
    ) -> Result<Vec<K>, ClusterError> {
        let mut lp = ListParams::default();
        if let Some(s) = selector {
            lp = lp.labels_from(s);
        }
        let req = request_for::<K>(ns).list(&lp);
        let list: ObjectList<K> = self.call(&kind_of::<K>(), ns.unwrap_or("*"), req).await?;
        Ok(list.items.into_iter().map(lean).collect())
    }

    async fn create<K: Object>(&self, obj: &K) -> Result<K, ClusterError> {
        let (ns, name) = meta_key(obj);
        let key = object_key(ns.as_deref(), &name);
        let req = request_for::<K>(ns.as_deref()).create(&post_params(), body(obj, &key)?);
        self.call(&kind_of::<K>(), &key, req).await.map(lean)
    }

    async fn replace<K: Object>(&self, obj: &K) -> Result<K, ClusterError> {
        let (ns, name) = meta_key(obj);
        let key = object_key(ns.as_deref(), &name);
        let req = request_for::<K>(ns.as_deref()).replace(&name, &post_params(), body(obj, &key)?);
        self.call(&kind_of::<K>(), &key, req).await.map(lean)
    }

    async fn replace_status<K: Object>(&self, obj: &K) -> Result<K, ClusterError> {
        let (ns, name) = meta_key(obj);
        let key = object_key(ns.as_deref(), &name);
        let req = request_for::<K>(ns.as_deref()).replace_subresource(
            "status",
            &name,
            &post_params(),
            body(obj, &key)?,
        );
        self.call(&kind_of::<K>(), &key, req).await.map(lean)
    }

    async fn patch<K: Object>(
        &self,
        ns: Option<&str>,
        name: &str,
        patch: &Value,
    ) -> Result<K, ClusterError> {
        let key = object_key(ns, name);
        let req = request_for::<K>(ns).patch(name, &patch_params(), &Patch::Merge(patch));
        self.call(&kind_of::<K>(), &key, req).await.map(lean)
    }

    async fn patch_status<K: Object>(
        &self,
        ns: Option<&str>,
        name: &str,
        patch: &Value,
    ) -> Result<K, ClusterError> {
        let key = object_key(ns, name);
        let req = request_for::<K>(ns).patch_subresource(
            "status",
            name,
            &patch_params(),
            &Patch::Merge(patch),
        );
        self.call(&kind_of::<K>(), &key, req).await.map(lean)
    }

    async fn delete<K: Object>(
        &self,
        ns: Option<&str>,
        name: &str,
        precondition: Option<Precondition>,
    ) -> Result<DeleteOutcome, ClusterError> {
        let dp = DeleteParams {
            preconditions: precondition.map(|p| Preconditions {
                uid: p.uid,
                resource_version: p.resource_version,
            }),
            ..Default::default()
        };
        self.delete_with::<K>(ns, name, dp).await
    }

    async fn delete_pod(
        &self,
        ns: &str,
        name: &str,
        grace_seconds: u32,
    ) -> Result<DeleteOutcome, ClusterError> {
        let dp = DeleteParams {
            grace_period_seconds: Some(grace_seconds),
            ..Default::default()
        };
        self.delete_with::<Pod>(Some(ns), name, dp).await
    }

    fn watch<K: Object>(&self, ns: Option<&str>) -> WatchStream<K> {
        let (tx, rx) = mpsc::channel(256);
        let client = self.client.clone();
        let ns = ns.map(str::to_string);
        tokio::spawn(async move { watch_loop::<K>(client, ns, tx).await });
        ReceiverStream::new(rx).boxed()
    }

    async fn evict(&self, ns: &str, pod: &str) -> Result<EvictOutcome, ClusterError> {
        let key = object_key(Some(ns), pod);
        let eviction = Eviction {
            metadata: kube::api::ObjectMeta {
                name: Some(pod.into()),
                namespace: Some(ns.into()),
                ..Default::default()
            },
            delete_options: None,
        };
        let data =
            serde_json::to_vec(&eviction).map_err(|e| invalid("Pod", &key, e.to_string()))?;
        let req = request_for::<Pod>(Some(ns))
            .create_subresource("eviction", pod, &post_params(), data)
            .map_err(|e| invalid("Pod", &key, e.to_string()))?;
        let fut = self.client.request_status::<Value>(req);
        match tokio::time::timeout(CALL_TIMEOUT, fut).await {
            Err(_) => Err(transient("Pod", &key, "eviction timed out")),
            Ok(Ok(_)) => Ok(EvictOutcome::Evicted),
            Ok(Err(e)) => match map_error("Pod", &key, e) {
                ClusterError::NotFound { .. } => Ok(EvictOutcome::NotFound),
                other => Err(other),
            },
        }
    }

    async fn record_event(&self, event: EventRecord) {
        let now = jiff::Timestamp::now();
        let ns = event
            .regarding
            .namespace
            .clone()
            .unwrap_or_else(|| "default".to_string());
        let ev = Event {
            metadata: kube::api::ObjectMeta {
                generate_name: Some(format!("{}.", event.regarding.name)),
                namespace: Some(ns.clone()),
                ..Default::default()
            },
            involved_object: ObjectReference {
                api_version: Some(event.regarding.api_version.clone()),
                kind: Some(event.regarding.kind.clone()),
                name: Some(event.regarding.name.clone()),
                namespace: event.regarding.namespace.clone(),
                uid: event.regarding.uid.clone(),
                ..Default::default()
            },
            reason: Some(event.reason.clone()),
            message: Some(event.message.clone()),
            type_: Some(
                match event.type_ {
                    EventType::Normal => "Normal",
                    EventType::Warning => "Warning",
                }
                .into(),
            ),
            source: Some(k8s_openapi::api::core::v1::EventSource {
                component: Some(FIELD_MANAGER.into()),
                host: None,
            }),
            reporting_component: Some(FIELD_MANAGER.into()),
            reporting_instance: Some(FIELD_MANAGER.into()),
            first_timestamp: Some(Time(now)),
            last_timestamp: Some(Time(now)),
            event_time: Some(MicroTime(now)),
            action: Some(event.reason.clone()),
            count: Some(1),
            ..Default::default()
        };
        if let Err(e) = self.create(&ev).await {
            tracing::debug!(error = %e, reason = %event.reason, "event not recorded");
        }
    }
}

/// The object without `metadata.managedFields`, as every read and write result is handed on
/// (controller-runtime's `TransformStripManagedFields`). The server's field ownership is
/// nothing kpssh reads, and held in the watch-fed stores it cost more than the objects
/// themselves: each entry's `fieldsV1` is a tree of `serde_json` maps, several KiB per
/// object, for 10,000 SSHHosts and 10,000 Nodes held twice (issue #26). Writing a stripped
/// object back is safe: the API server keeps the live object's managedFields when an update
/// carries none (so that clients unaware of the field cannot wipe it).
fn lean<K: Object>(mut obj: K) -> K {
    obj.meta_mut().managed_fields = None;
    obj
}

fn post_params() -> PostParams {
    PostParams {
        field_manager: Some(FIELD_MANAGER.into()),
        ..Default::default()
    }
}

fn patch_params() -> PatchParams {
    PatchParams {
        field_manager: Some(FIELD_MANAGER.into()),
        ..Default::default()
    }
}

/// kube's runtime watcher (paged list, then watch from its resourceVersion with bookmarks;
/// re-list on `410 Gone`; its default backoff between failures), folded into the `Cluster`
/// contract: the listed set as one `Restarted`, then every change. Ends when the receiver is
/// dropped.
async fn watch_loop<K: Object>(
    client: Client,
    ns: Option<String>,
    tx: mpsc::Sender<Result<WatchEvent<K>, ClusterError>>,
) {
    let kind = kind_of::<K>();
    let key = ns.clone().unwrap_or_else(|| "*".into());
    let api = <K::Scope as ScopedApi<K>>::api(client, ns.as_deref());
    let config = watcher::Config::default().timeout(WATCH_TIMEOUT_SECS);
    let events = watcher::watcher(api, config).default_backoff();
    futures::pin_mut!(events);
    let mut listing: Option<Vec<K>> = None;
    while let Some(event) = events.next().await {
        let out = match event {
            Ok(watcher::Event::Init) => {
                listing = Some(Vec::new());
                continue;
            }
            Ok(watcher::Event::InitApply(o)) => {
                listing.get_or_insert_with(Vec::new).push(lean(o));
                continue;
            }
            Ok(watcher::Event::InitDone) => {
                Ok(WatchEvent::Restarted(listing.take().unwrap_or_default()))
            }
            Ok(watcher::Event::Apply(o)) => Ok(WatchEvent::Applied(lean(o))),
            Ok(watcher::Event::Delete(o)) => Ok(WatchEvent::Deleted(lean(o))),
            Err(e) => Err(watch_error(&kind, &key, e)),
        };
        if tx.send(out).await.is_err() {
            return;
        }
    }
}

fn watch_error(kind: &str, key: &str, err: watcher::Error) -> ClusterError {
    match err {
        watcher::Error::InitialListFailed(e)
        | watcher::Error::WatchStartFailed(e)
        | watcher::Error::WatchFailed(e) => map_error(kind, key, e),
        other => transient(kind, key, &other.to_string()),
    }
}

/// The `Api` of a kind, namespaced or not, by its scope: kube builds a namespaced `Api` only
/// for a kind whose scope says so at compile time, while the `Cluster` contract is one generic
/// `watch(ns)` for both.
pub trait ScopedApi<K> {
    fn api(client: Client, ns: Option<&str>) -> Api<K>;
}

impl<K> ScopedApi<K> for NamespaceResourceScope
where
    K: kube::Resource<DynamicType = (), Scope = NamespaceResourceScope>,
{
    fn api(client: Client, ns: Option<&str>) -> Api<K> {
        match ns {
            Some(ns) => Api::namespaced(client, ns),
            None => Api::all(client),
        }
    }
}

impl<K> ScopedApi<K> for ClusterResourceScope
where
    K: kube::Resource<DynamicType = (), Scope = ClusterResourceScope>,
{
    fn api(client: Client, _ns: Option<&str>) -> Api<K> {
        Api::all(client)
    }
}
