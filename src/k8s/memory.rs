//! In-memory `Cluster` for the deterministic simulation and unit tests.
//!
//! It honours the API server's semantics that the controller relies on: resourceVersion CAS
//! (409 on a stale write), `metadata.generation` bumped on spec changes only, status written
//! only through the status path, finalizers holding deletion behind `deletionTimestamp`,
//! label selectors, ordered watches, and PodDisruptionBudgets on the Eviction API. Everything
//! is ordered (BTreeMap, sequence-numbered UIDs, injected clock) so that a seed replays exactly.

use std::any::Any;
use std::borrow::Cow;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, Mutex, MutexGuard};

use futures::StreamExt;
use jiff::Timestamp;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::core::{Selector, SelectorExt};
use serde_json::{Map, Value, json};
use tokio::sync::mpsc;
use tokio_stream::wrappers::UnboundedReceiverStream;

use super::ClusterError;
use super::cluster::{
    Cluster, DeleteOutcome, EventRecord, EvictOutcome, Object, Precondition, WatchEvent,
    WatchStream, object_key,
};
use crate::clock::Clock;

/// Which write an injected fault applies to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WriteKind {
    Create,
    Replace,
    ReplaceStatus,
    Patch,
    Delete,
}

/// Decides, per write, whether to fail it (API conflicts and transient errors in fault runs).
pub type FaultInjector = Arc<dyn Fn(WriteKind, &str, &str) -> Option<ClusterError> + Send + Sync>;

/// Counters of what reached the store; the simulation reports API cost from them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct WriteStats {
    pub creates: u64,
    pub replaces: u64,
    pub status_writes: u64,
    pub patches: u64,
    pub deletes: u64,
    pub conflicts: u64,
    pub lists: u64,
    /// Reads of single Secrets (`get`): the SSH key reads the API cost of probes includes.
    pub secret_gets: u64,
    /// Reads of single Leases (`get`): what leader election costs beyond its writes.
    pub lease_gets: u64,
    /// Status writes per kind (e.g. `SSHHost`).
    pub status_writes_by_kind: BTreeMap<String, u64>,
}

#[derive(Clone)]
pub struct MemoryCluster {
    state: Arc<Mutex<State>>,
    clock: Clock,
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct Key {
    // Borrowed from the type's constants: a key is built for every call.
    api_version: Cow<'static, str>,
    kind: Cow<'static, str>,
    at: Place,
}

/// Where an object of a kind is: its namespace ("" for cluster-scoped) and name, in the
/// order a list returns objects.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
struct Place {
    namespace: String,
    name: String,
}

/// A stored object of any kind: the typed value its last write produced, decoded from the
/// JSON that write made (so a read is a clone, not a parse, and equals what decoding the
/// stored JSON would give). Rare writes (create, replace, patch, delete) still work on JSON,
/// with the API server's merge and generation rules; the hot status write swaps the status
/// of the typed object (`status_replaced`).
trait Stored: Any + Send + Sync {
    /// The object as the API would serve it (with apiVersion and kind).
    fn json(&self) -> Result<Value, ClusterError>;
    fn meta(&self) -> &ObjectMeta;
    /// A copy at another resourceVersion (a deletion's last event).
    fn at_rv(&self, rv: String) -> Shared;
}

type Shared = Arc<dyn Stored>;

impl<K: Object> Stored for K {
    fn json(&self) -> Result<Value, ClusterError> {
        to_value(self)
    }

    fn meta(&self) -> &ObjectMeta {
        kube::Resource::meta(self)
    }

    fn at_rv(&self, rv: String) -> Shared {
        let mut copy = self.clone();
        copy.meta_mut().resource_version = Some(rv);
        Arc::new(copy)
    }
}

/// Decode JSON on its way into the store.
fn shared_from<K: Object>(v: &Value) -> Result<Shared, ClusterError> {
    Ok(Arc::new(from_value::<K>(v)?))
}

/// A stored object read as `K`: a clone, or a decode of its JSON when it was stored as
/// another type of the same kind.
fn read<K: Object>(stored: &Shared) -> Result<K, ClusterError> {
    share::<K>(stored.clone()).map(Arc::unwrap_or_clone)
}

/// A stored object as `Arc<K>`: the stored allocation itself when it is a `K`.
fn share<K: Object>(stored: Shared) -> Result<Arc<K>, ClusterError> {
    let any: &dyn Any = &*stored;
    if !any.is::<K>() {
        return from_value(&stored.json()?).map(Arc::new);
    }
    let any: Arc<dyn Any + Send + Sync> = stored;
    any.downcast::<K>().map_err(|_| ClusterError::Decode {
        kind: kind_of::<K>(),
        key: String::new(),
        message: "stored object changed type".into(),
    })
}

enum RawEvent {
    Restarted(Vec<Shared>),
    Applied(Shared),
    Deleted(Shared),
}

struct Watcher {
    api_version: String,
    kind: String,
    namespace: Option<String>,
    tx: mpsc::UnboundedSender<RawEvent>,
}

/// Stored objects by kind, then by namespace and name: a lookup compares names, not the
/// apiVersion and kind that every key of a kind shares (tens of thousands of lookups a
/// virtual minute in a fleet simulation).
#[derive(Default)]
struct Objects(BTreeMap<KindKey, OfKind>);

/// The objects of one kind by name, and their names in order for lists. A get or write by
/// name in an ordered map alone compared the name with a dozen or more others (each a read
/// of a string that is cold by then), and a fleet simulation makes tens of thousands a
/// virtual minute; the names' copy costs ~80 bytes an object, and a replace (the common
/// write) touches only the hashed map.
#[derive(Default)]
struct OfKind {
    by_place: HashMap<Place, Shared, foldhash::fast::FixedState>,
    ordered: BTreeSet<Place>,
}

/// A kind in [`Objects`]: kind first, since kinds differ in their first bytes and
/// apiVersions share a long prefix.
type KindKey = (Cow<'static, str>, Cow<'static, str>);

fn kind_key(key: &Key) -> KindKey {
    // Cheap: both are borrowed from the type's constants.
    (key.kind.clone(), key.api_version.clone())
}

impl Objects {
    fn get(&self, key: &Key) -> Option<&Shared> {
        self.0.get(&kind_key(key))?.by_place.get(&key.at)
    }

    fn contains_key(&self, key: &Key) -> bool {
        self.get(key).is_some()
    }

    fn insert(&mut self, key: &Key, value: Shared) {
        let of_kind = self.0.entry(kind_key(key)).or_default();
        if let Some(held) = of_kind.by_place.get_mut(&key.at) {
            *held = value;
            return;
        }
        of_kind.by_place.insert(key.at.clone(), value);
        of_kind.ordered.insert(key.at.clone());
    }

    fn remove(&mut self, key: &Key) -> Option<Shared> {
        let of_kind = self.0.get_mut(&kind_key(key))?;
        let removed = of_kind.by_place.remove(&key.at)?;
        of_kind.ordered.remove(&key.at);
        Some(removed)
    }

    /// The objects of one kind (and namespace, when given) in namespace and name order.
    fn of_kind<'a>(
        &'a self,
        kind: KindKey,
        ns: Option<&'a str>,
    ) -> impl Iterator<Item = &'a Shared> + 'a {
        let start = Place {
            namespace: ns.unwrap_or_default().to_string(),
            name: String::new(),
        };
        (self.0.get(&kind).into_iter()).flat_map(move |objects| {
            (objects.ordered.range(start.clone()..))
                .take_while(move |at| ns.is_none_or(|ns| at.namespace == ns))
                .filter_map(|at| objects.by_place.get(at))
        })
    }
}

#[derive(Default)]
struct State {
    resource_version: u64,
    uid_seq: u64,
    /// Stored objects, shared with the watchers they are sent to: a write stores and sends
    /// one copy.
    objects: Objects,
    watchers: Vec<Watcher>,
    events: Vec<EventRecord>,
    /// Events forgotten from the front (`forget_events_before`): indices stay absolute.
    events_forgotten: usize,
    stats: WriteStats,
    faults: Option<FaultInjector>,
}

impl MemoryCluster {
    pub fn new(clock: Clock) -> Self {
        MemoryCluster {
            state: Arc::new(Mutex::new(State::default())),
            clock,
        }
    }

    pub fn clock(&self) -> &Clock {
        &self.clock
    }

    /// Every event recorded so far and not forgotten, oldest first.
    pub fn events(&self) -> Vec<EventRecord> {
        self.lock().events.clone()
    }

    /// The events recorded after the first `seen` ones (for readers that poll as they go).
    pub fn events_since(&self, seen: usize) -> Vec<EventRecord> {
        let st = self.lock();
        let from = seen.saturating_sub(st.events_forgotten);
        st.events.get(from..).unwrap_or_default().to_vec()
    }

    /// Drop the first `seen` events, as the API server's event TTL would: a reader that has
    /// taken them keeps a day-long simulation of ten thousand hosts from holding every event.
    pub fn forget_events_before(&self, seen: usize) {
        let mut st = self.lock();
        let drop = seen
            .saturating_sub(st.events_forgotten)
            .min(st.events.len());
        st.events.drain(..drop);
        st.events_forgotten += drop;
    }

    pub fn stats(&self) -> WriteStats {
        self.lock().stats.clone()
    }

    pub fn set_fault_injector(&self, faults: Option<FaultInjector>) {
        self.lock().faults = faults;
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic while holding the lock leaves a consistent map (writes are single inserts),
        // so a poisoned lock is still usable.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn key_of<K: Object>(obj: &K) -> Key {
        let m = obj.meta();
        Self::key::<K>(
            m.namespace.as_deref(),
            m.name.as_deref().unwrap_or_default(),
        )
    }

    fn key<K: Object>(ns: Option<&str>, name: &str) -> Key {
        Key {
            api_version: K::api_version(&()),
            kind: K::kind(&()),
            at: Place {
                namespace: ns.unwrap_or_default().to_string(),
                name: name.to_string(),
            },
        }
    }

    /// The status write: the stored object after it (the same one when nothing changed).
    fn write_status<K: Object>(&self, obj: &K) -> Result<Shared, ClusterError> {
        let status = incoming_status(obj)?;
        let mut st = self.lock();
        let m = obj.meta();
        let (key, display) = (Self::key_of(obj), obj_name(obj));
        let stored = st.stored_for(WriteKind::ReplaceStatus, &key, &display)?;
        if !rv_matches(m.resource_version.as_deref(), &stored) {
            return Err(st.conflict(&key.kind, &display));
        }
        st.stats.status_writes += 1;
        match st.stats.status_writes_by_kind.get_mut(&*key.kind) {
            Some(n) => *n += 1,
            None => {
                st.stats
                    .status_writes_by_kind
                    .insert(key.kind.to_string(), 1);
            }
        }
        // Spec and metadata stay the stored ones (the status subresource ignores them), so
        // the generation stays and only the resourceVersion moves. A write that changes
        // nothing keeps its resourceVersion, as on a real API server.
        if let Some(write) = status_replaced::<K>(&stored, &status) {
            let mut new = match write? {
                StatusWrite::Same => return Ok(stored),
                StatusWrite::Changed(new) => new,
            };
            new.meta_mut().resource_version = Some(st.next_rv());
            return Ok(st.store_typed(&key, Arc::new(new)));
        }
        let status = match status {
            Some(bytes) => Some(
                serde_json::from_slice::<Value>(&bytes)
                    .map_err(|e| decode_err::<K>(display.clone(), e))?,
            ),
            None => None,
        };
        let stored_json = stored.json()?;
        if stored_json.get("status") == status.as_ref() {
            return Ok(stored);
        }
        let mut new = Map::new();
        if let Some(map) = stored_json.as_object() {
            for (k, v) in map.iter().filter(|(k, _)| k.as_str() != "status") {
                new.insert(k.clone(), v.clone());
            }
        }
        if let Some(status) = status {
            new.insert("status".into(), status);
        }
        st.store::<K>(&key, Value::Object(new))
    }

    /// Subscribe to a kind: the current set first (under the lock, so no change slips
    /// between snapshot and subscription), then every change in commit order.
    fn raw_watch<K: Object>(&self, ns: Option<&str>) -> UnboundedReceiverStream<RawEvent> {
        let (tx, rx) = mpsc::unbounded_channel();
        let mut st = self.lock();
        let snapshot: Vec<Shared> = st.of_kind::<K>(ns).cloned().collect();
        let _ = tx.send(RawEvent::Restarted(snapshot));
        st.watchers.push(Watcher {
            api_version: K::api_version(&()).into_owned(),
            kind: K::kind(&()).into_owned(),
            namespace: ns.map(str::to_string),
            tx,
        });
        UnboundedReceiverStream::new(rx)
    }

    fn now_string(&self) -> String {
        format_time(self.clock.now())
    }
}

fn format_time(t: Timestamp) -> String {
    t.strftime("%Y-%m-%dT%H:%M:%SZ").to_string()
}

fn kind_of<K: Object>() -> String {
    K::kind(&()).into_owned()
}

fn to_value<K: Object>(obj: &K) -> Result<Value, ClusterError> {
    let mut v = serde_json::to_value(obj).map_err(|e| decode_err::<K>(obj_name(obj), e))?;
    if let Some(map) = v.as_object_mut() {
        map.insert("apiVersion".into(), json!(K::api_version(&())));
        map.insert("kind".into(), json!(K::kind(&())));
    }
    Ok(v)
}

fn from_value<K: Object>(v: &Value) -> Result<K, ClusterError> {
    // Deserialise from the borrowed tree: cloning it first was most of a fleet simulation's
    // time.
    K::deserialize(v).map_err(|e| {
        let name = v
            .pointer("/metadata/name")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string();
        decode_err::<K>(name, e)
    })
}

fn obj_name<K: Object>(obj: &K) -> String {
    let m = obj.meta();
    object_key(
        m.namespace.as_deref(),
        m.name.as_deref().unwrap_or_default(),
    )
}

fn decode_err<K: Object>(key: String, e: serde_json::Error) -> ClusterError {
    ClusterError::Decode {
        kind: kind_of::<K>(),
        key,
        message: e.to_string(),
    }
}

fn meta_str<'a>(v: &'a Value, field: &str) -> Option<&'a str> {
    v.get("metadata")?.get(field)?.as_str()
}

fn meta_mut(v: &mut Value) -> &mut Map<String, Value> {
    if !v.get("metadata").is_some_and(Value::is_object)
        && let Some(map) = v.as_object_mut()
    {
        map.insert("metadata".into(), json!({}));
    }
    match v.get_mut("metadata").and_then(Value::as_object_mut) {
        Some(m) => m,
        None => unreachable_meta(),
    }
}

#[allow(clippy::panic)]
fn unreachable_meta() -> ! {
    // Only reachable if a serialized object is not a JSON object, which serde never produces
    // for Kubernetes kinds.
    panic!("kubernetes object did not serialize to a JSON object")
}

fn finalizers_empty(v: &Value) -> bool {
    v.pointer("/metadata/finalizers")
        .and_then(Value::as_array)
        .is_none_or(|a| a.is_empty())
}

/// Everything the API server counts as spec for `generation`: all but metadata and status.
/// Top-level fields that are not the object's spec (they never bump `generation`).
const NOT_SPEC: [&str; 4] = ["metadata", "status", "apiVersion", "kind"];

/// Whether two objects have the same spec part (everything but metadata, status and type),
/// compared in place: copying both trees was a large share of every simulated write.
fn same_spec(a: &Value, b: &Value) -> bool {
    let (Some(a), Some(b)) = (a.as_object(), b.as_object()) else {
        return a == b;
    };
    let spec = |m: &'_ serde_json::Map<String, Value>| {
        m.iter()
            .filter(|(k, _)| !NOT_SPEC.contains(&k.as_str()))
            .count()
    };
    spec(a) == spec(b)
        && a.iter()
            .filter(|(k, _)| !NOT_SPEC.contains(&k.as_str()))
            .all(|(k, v)| b.get(k) == Some(v))
}

/// RFC 7386 JSON merge patch.
pub fn merge_patch(target: &mut Value, patch: &Value) {
    let Some(patch_map) = patch.as_object() else {
        *target = patch.clone();
        return;
    };
    if !target.is_object() {
        *target = json!({});
    }
    if let Some(t) = target.as_object_mut() {
        for (k, pv) in patch_map {
            if pv.is_null() {
                t.remove(k);
            } else {
                let entry = t.entry(k.clone()).or_insert(Value::Null);
                merge_patch(entry, pv);
            }
        }
    }
}

impl State {
    /// The stored objects of one kind (and namespace, when given), in key order: a range of
    /// the ordered map, not a scan of every object.
    fn of_kind<'a, K: Object>(
        &'a self,
        ns: Option<&'a str>,
    ) -> impl Iterator<Item = &'a Shared> + 'a {
        self.objects
            .of_kind((K::kind(&()), K::api_version(&())), ns)
    }

    fn next_rv(&mut self) -> String {
        self.resource_version += 1;
        self.resource_version.to_string()
    }

    /// Send `value` to the watchers of its kind.
    fn notify(&mut self, key: &Key, event: impl Fn(Shared) -> RawEvent, value: &Shared) {
        self.watchers.retain(|w| !w.tx.is_closed());
        for w in &self.watchers {
            let ns_ok = w
                .namespace
                .as_deref()
                .is_none_or(|ns| ns == key.at.namespace);
            if w.api_version == key.api_version && w.kind == key.kind && ns_ok {
                // A closed receiver is pruned on the next notify.
                let _ = w.tx.send(event(value.clone()));
            }
        }
    }

    fn check_fault(
        &mut self,
        kind: WriteKind,
        obj_kind: &str,
        key: &str,
    ) -> Result<(), ClusterError> {
        let injected = self.faults.as_ref().and_then(|f| f(kind, obj_kind, key));
        if let Some(err) = injected {
            if err.is_conflict() {
                self.stats.conflicts += 1;
            }
            return Err(err);
        }
        Ok(())
    }

    /// The stored object an update of `key` applies to, once the fault injector had its say.
    fn stored_for(
        &mut self,
        write: WriteKind,
        key: &Key,
        display: &str,
    ) -> Result<Shared, ClusterError> {
        self.check_fault(write, &key.kind, display)?;
        self.objects
            .get(key)
            .cloned()
            .ok_or_else(|| ClusterError::NotFound {
                kind: key.kind.to_string(),
                key: display.to_string(),
            })
    }

    fn conflict(&mut self, kind: &str, key: &str) -> ClusterError {
        self.stats.conflicts += 1;
        ClusterError::Conflict {
            kind: kind.to_string(),
            key: key.to_string(),
        }
    }

    /// Store a new version of an existing object: bump rv (and generation if the spec changed),
    /// drop it when the last finalizer went away during deletion. A no-op write changes nothing.
    fn commit_update<K: Object>(
        &mut self,
        key: &Key,
        old: &Value,
        mut new: Value,
    ) -> Result<Shared, ClusterError> {
        if &new == old {
            return shared_from::<K>(&new);
        }
        let generation = old
            .pointer("/metadata/generation")
            .and_then(Value::as_i64)
            .unwrap_or(1);
        let generation = if !same_spec(old, &new) {
            generation + 1
        } else {
            generation
        };
        meta_mut(&mut new).insert("generation".into(), json!(generation));
        let deleting = new.pointer("/metadata/deletionTimestamp").is_some();
        if !(deleting && finalizers_empty(&new)) {
            return self.store::<K>(key, new);
        }
        let rv = self.next_rv();
        meta_mut(&mut new).insert("resourceVersion".into(), json!(rv));
        let new = shared_from::<K>(&new)?;
        self.objects.remove(key);
        self.notify(key, RawEvent::Deleted, &new);
        Ok(new)
    }

    /// Store `new` as the next version of an existing object and tell the watchers.
    fn store<K: Object>(&mut self, key: &Key, mut new: Value) -> Result<Shared, ClusterError> {
        let rv = self.next_rv();
        meta_mut(&mut new).insert("resourceVersion".into(), json!(rv));
        let new = shared_from::<K>(&new)?;
        Ok(self.store_typed(key, new))
    }

    /// Store an object whose resourceVersion is already the next one.
    fn store_typed(&mut self, key: &Key, new: Shared) -> Shared {
        self.objects.insert(key, new.clone());
        self.notify(key, RawEvent::Applied, &new);
        new
    }

    fn remove(&mut self, key: &Key) {
        if let Some(old) = self.objects.remove(key) {
            let rv = self.next_rv();
            let gone = old.at_rv(rv);
            self.notify(key, RawEvent::Deleted, &gone);
        }
    }
}

/// Keep the server-owned metadata of `stored` on an incoming object.
fn carry_server_meta(stored: &Value, incoming: &mut Value) {
    let server_fields = [
        "uid",
        "creationTimestamp",
        "deletionTimestamp",
        "generation",
        "resourceVersion",
        "name",
        "namespace",
    ];
    let stored_meta = stored.get("metadata").cloned().unwrap_or_else(|| json!({}));
    let meta = meta_mut(incoming);
    for f in server_fields {
        match stored_meta.get(f) {
            Some(v) => {
                meta.insert(f.into(), v.clone());
            }
            None => {
                meta.remove(f);
            }
        }
    }
}

/// An incoming resourceVersion (none or empty: unconditional) against the stored one.
fn rv_matches(incoming: Option<&str>, stored: &Shared) -> bool {
    match incoming {
        None | Some("") => true,
        Some(rv) => Some(rv) == stored.meta().resource_version.as_deref(),
    }
}

fn no_finalizers(meta: &ObjectMeta) -> bool {
    meta.finalizers.as_ref().is_none_or(Vec::is_empty)
}

/// The status a status write brings, serialised: its field alone when the kind serialises as
/// a struct (all Kubernetes kinds do), else taken from the whole serialised object.
fn incoming_status<K: Object>(obj: &K) -> Result<Option<Vec<u8>>, ClusterError> {
    use super::status_field::{StatusField, status_of};
    match status_of(obj).map_err(|e| decode_err::<K>(obj_name(obj), e))? {
        StatusField::Found(status) => Ok(status),
        StatusField::Unsupported => {
            let mut whole = to_value(obj)?;
            let status = whole.as_object_mut().and_then(|m| m.remove("status"));
            status
                .map(|s| serde_json::to_vec(&s).map_err(|e| decode_err::<K>(obj_name(obj), e)))
                .transpose()
        }
    }
}

/// What a status write makes of the stored object.
enum StatusWrite<K> {
    /// The status is the stored one: nothing to write.
    Same,
    /// The stored object with the new status, its resourceVersion still the old one.
    Changed(K),
}

/// The stored object with `status` (serialised) in place of its own, for the kinds whose
/// status type is known here: the new status is decoded from its JSON, exactly as a read
/// of the stored object would decode it, and nothing else is re-encoded. `None` for other
/// kinds, which take the JSON path.
fn status_replaced<K: Object>(
    stored: &Shared,
    status: &Option<Vec<u8>>,
) -> Option<Result<StatusWrite<K>, ClusterError>> {
    use crate::api::{NodeClaim, NodePool, SSHHost, SSHNodeClass};
    use k8s_openapi::api::core::v1::Node;
    macro_rules! try_kinds {
        ($($kind:ident),*) => {$(
            let found = swap_status::<K, $kind, _>(
                stored,
                status,
                |o| &o.status,
                // Field by field: cloning the stored object would copy its old status only
                // to drop it.
                |o, status| $kind {
                    metadata: o.metadata.clone(),
                    spec: o.spec.clone(),
                    status,
                },
            );
            if let Some(found) = found {
                return Some(found);
            }
        )*};
    }
    try_kinds!(SSHHost, NodeClaim, NodePool, SSHNodeClass, Node, Pod);
    None
}

/// [`status_replaced`] for one kind `T` (when `K` is `T` and the stored object is a `T`).
fn swap_status<K: Object, T: Object, S>(
    stored: &Shared,
    status: &Option<Vec<u8>>,
    field: impl Fn(&T) -> &Option<S>,
    with_status: impl Fn(&T, Option<S>) -> T,
) -> Option<Result<StatusWrite<K>, ClusterError>>
where
    S: serde::de::DeserializeOwned + PartialEq,
{
    let any: &dyn Any = &**stored;
    let current = any.downcast_ref::<T>()?;
    if std::any::TypeId::of::<K>() != std::any::TypeId::of::<T>() {
        return None;
    }
    // `null` decodes to `None`, as a `Value::Null` did.
    let decoded = match status {
        None => None,
        Some(bytes) => match serde_json::from_slice::<Option<S>>(bytes) {
            Ok(s) => s,
            Err(e) => return Some(Err(decode_err::<T>(obj_name(current), e))),
        },
    };
    if *field(current) == decoded {
        return Some(Ok(StatusWrite::Same));
    }
    let new = with_status(current, decoded);
    // K is T (checked above): move it across without a copy.
    let mut moved: Option<T> = Some(new);
    let as_k = (&mut moved as &mut dyn Any)
        .downcast_mut::<Option<K>>()?
        .take()?;
    Some(Ok(StatusWrite::Changed(as_k)))
}

impl Cluster for MemoryCluster {
    async fn get<K: Object>(
        &self,
        ns: Option<&str>,
        name: &str,
    ) -> Result<Option<K>, ClusterError> {
        let key = Self::key::<K>(ns, name);
        let mut st = self.lock();
        match key.kind.as_ref() {
            "Secret" => st.stats.secret_gets += 1,
            "Lease" => st.stats.lease_gets += 1,
            _ => {}
        }
        st.objects.get(&key).map(read::<K>).transpose()
    }

    async fn list<K: Object>(
        &self,
        ns: Option<&str>,
        selector: Option<&Selector>,
    ) -> Result<Vec<K>, ClusterError> {
        let mut st = self.lock();
        st.stats.lists += 1;
        let no_labels = BTreeMap::new();
        st.of_kind::<K>(ns)
            .filter(|v| {
                selector.is_none_or(|s| s.matches(v.meta().labels.as_ref().unwrap_or(&no_labels)))
            })
            .map(read::<K>)
            .collect()
    }

    async fn create<K: Object>(&self, obj: &K) -> Result<K, ClusterError> {
        let mut value = to_value(obj)?;
        let now = self.now_string();
        let mut st = self.lock();
        let ns = obj.meta().namespace.clone();
        let mut name = obj.meta().name.clone().unwrap_or_default();
        if name.is_empty() {
            let prefix = obj.meta().generate_name.clone().unwrap_or_default();
            if prefix.is_empty() {
                return Err(ClusterError::Invalid {
                    kind: kind_of::<K>(),
                    key: String::new(),
                    message: "metadata.name or metadata.generateName is required".into(),
                });
            }
            st.uid_seq += 1;
            name = format!("{prefix}{:05x}", st.uid_seq);
        }
        let key = Self::key::<K>(ns.as_deref(), &name);
        let display = object_key(ns.as_deref(), &name);
        st.check_fault(WriteKind::Create, &key.kind, &display)?;
        if st.objects.contains_key(&key) {
            return Err(ClusterError::AlreadyExists {
                kind: key.kind.into_owned(),
                key: display,
            });
        }
        st.uid_seq += 1;
        let uid = format!("00000000-0000-4000-8000-{:012x}", st.uid_seq);
        let rv = st.next_rv();
        let meta = meta_mut(&mut value);
        meta.insert("name".into(), json!(name));
        meta.insert("uid".into(), json!(uid));
        meta.insert("resourceVersion".into(), json!(rv));
        meta.insert("generation".into(), json!(1));
        meta.insert("creationTimestamp".into(), json!(now));
        meta.remove("deletionTimestamp");
        let created = shared_from::<K>(&value)?;
        st.stats.creates += 1;
        read(&st.store_typed(&key, created))
    }

    async fn replace<K: Object>(&self, obj: &K) -> Result<K, ClusterError> {
        let mut incoming = to_value(obj)?;
        let mut st = self.lock();
        let (key, display) = (Self::key_of(obj), obj_name(obj));
        let stored = st.stored_for(WriteKind::Replace, &key, &display)?;
        if !rv_matches(meta_str(&incoming, "resourceVersion"), &stored) {
            return Err(st.conflict(&key.kind, &display));
        }
        let stored = stored.json()?;
        carry_server_meta(&stored, &mut incoming);
        if let Some(map) = incoming.as_object_mut() {
            match stored.get("status") {
                Some(s) => map.insert("status".into(), s.clone()),
                None => map.remove("status"),
            };
        }
        st.stats.replaces += 1;
        let new = st.commit_update::<K>(&key, &stored, incoming)?;
        read(&new)
    }

    async fn replace_status<K: Object>(&self, obj: &K) -> Result<K, ClusterError> {
        read(&self.write_status(obj)?)
    }

    async fn patch<K: Object>(
        &self,
        ns: Option<&str>,
        name: &str,
        patch: &Value,
    ) -> Result<K, ClusterError> {
        let mut st = self.lock();
        let key = Self::key::<K>(ns, name);
        let display = object_key(ns, name);
        let stored = st.stored_for(WriteKind::Patch, &key, &display)?;
        if !rv_matches(meta_str(patch, "resourceVersion"), &stored) {
            return Err(st.conflict(&key.kind, &display));
        }
        let stored = stored.json()?;
        let mut new = stored.clone();
        let mut patch = patch.clone();
        if let Some(p) = patch.as_object_mut() {
            // Status only changes through the status path.
            p.remove("status");
        }
        merge_patch(&mut new, &patch);
        carry_server_meta(&stored, &mut new);
        st.stats.patches += 1;
        let new = st.commit_update::<K>(&key, &stored, new)?;
        read(&new)
    }

    async fn patch_status<K: Object>(
        &self,
        ns: Option<&str>,
        name: &str,
        patch: &Value,
    ) -> Result<K, ClusterError> {
        let mut st = self.lock();
        let key = Self::key::<K>(ns, name);
        let display = object_key(ns, name);
        let stored = st.stored_for(WriteKind::ReplaceStatus, &key, &display)?;
        let Some(status) = patch.get("status") else {
            return read(&stored);
        };
        let stored_json = stored.json()?;
        let mut new = stored_json.clone();
        // Only the status moves (the subresource ignores the rest).
        merge_patch(&mut new, &json!({ "status": status }));
        st.stats.status_writes += 1;
        *st.stats
            .status_writes_by_kind
            .entry(key.kind.to_string())
            .or_insert(0) += 1;
        if new == stored_json {
            return read(&stored);
        }
        let new = st.store::<K>(&key, new)?;
        read(&new)
    }

    async fn delete<K: Object>(
        &self,
        ns: Option<&str>,
        name: &str,
        precondition: Option<Precondition>,
    ) -> Result<DeleteOutcome, ClusterError> {
        let now = self.now_string();
        let mut st = self.lock();
        let key = Self::key::<K>(ns, name);
        let display = object_key(ns, name);
        st.check_fault(WriteKind::Delete, &key.kind, &display)?;
        let Some(stored) = st.objects.get(&key).cloned() else {
            return Ok(DeleteOutcome::NotFound);
        };
        if let Some(p) = precondition {
            let meta = stored.meta();
            let uid_ok = p
                .uid
                .as_deref()
                .is_none_or(|u| Some(u) == meta.uid.as_deref());
            let rv_ok = p
                .resource_version
                .as_deref()
                .is_none_or(|rv| Some(rv) == meta.resource_version.as_deref());
            if !uid_ok || !rv_ok {
                return Err(st.conflict(&key.kind, &display));
            }
        }
        st.stats.deletes += 1;
        if no_finalizers(stored.meta()) {
            st.remove(&key);
            return Ok(DeleteOutcome::Deleted);
        }
        if stored.meta().deletion_timestamp.is_none() {
            let mut new = stored.json()?;
            meta_mut(&mut new).insert("deletionTimestamp".into(), json!(now));
            // Setting deletionTimestamp is not a spec change: keep the generation.
            let rv = st.next_rv();
            meta_mut(&mut new).insert("resourceVersion".into(), json!(rv));
            let new = shared_from::<K>(&new)?;
            st.store_typed(&key, new);
        }
        Ok(DeleteOutcome::Terminating)
    }

    fn watch<K: Object>(&self, ns: Option<&str>) -> WatchStream<K> {
        self.watch_shared::<K>(ns)
            .map(|ev| ev.map(WatchEvent::owned))
            .boxed()
    }

    fn watch_shared<K: Object>(&self, ns: Option<&str>) -> WatchStream<Arc<K>> {
        self.raw_watch::<K>(ns)
            .map(|raw| match raw {
                RawEvent::Restarted(vs) => vs
                    .into_iter()
                    .map(share::<K>)
                    .collect::<Result<Vec<_>, _>>()
                    .map(WatchEvent::Restarted),
                RawEvent::Applied(v) => share::<K>(v).map(WatchEvent::Applied),
                RawEvent::Deleted(v) => share::<K>(v).map(WatchEvent::Deleted),
            })
            .boxed()
    }

    async fn replace_status_shared<K: Object>(&self, obj: &K) -> Result<Arc<K>, ClusterError> {
        share(self.write_status(obj)?)
    }

    async fn evict(&self, ns: &str, pod: &str) -> Result<EvictOutcome, ClusterError> {
        let Some(target) = self.get::<Pod>(Some(ns), pod).await? else {
            return Ok(EvictOutcome::NotFound);
        };
        let pdbs: Vec<PodDisruptionBudget> = self.list(Some(ns), None).await?;
        let pods: Vec<Pod> = self.list(Some(ns), None).await?;
        let target_labels = target.metadata.labels.clone().unwrap_or_default();
        for pdb in &pdbs {
            let Some(sel) = pdb.spec.as_ref().and_then(|s| s.selector.clone()) else {
                continue;
            };
            let Ok(sel) = Selector::try_from(sel) else {
                continue;
            };
            if !sel.matches(&target_labels) {
                continue;
            }
            let covered: Vec<&Pod> = pods
                .iter()
                .filter(|p| sel.matches(&p.metadata.labels.clone().unwrap_or_default()))
                .collect();
            if disruptions_allowed(pdb, &covered) < 1 {
                return Err(ClusterError::TooManyRequests {
                    kind: "Pod".into(),
                    key: object_key(Some(ns), pod),
                    message: format!(
                        "Cannot evict pod as it would violate the pod's disruption budget {}",
                        pdb.metadata.name.as_deref().unwrap_or_default()
                    ),
                });
            }
        }
        match self.delete::<Pod>(Some(ns), pod, None).await? {
            DeleteOutcome::NotFound => Ok(EvictOutcome::NotFound),
            _ => Ok(EvictOutcome::Evicted),
        }
    }

    async fn record_event(&self, event: EventRecord) {
        self.lock().events.push(event);
    }
}

fn pod_healthy(p: &Pod) -> bool {
    p.metadata.deletion_timestamp.is_none()
        && p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running")
}

/// The disruption controller's arithmetic for one budget, over the pods it covers.
fn disruptions_allowed(pdb: &PodDisruptionBudget, covered: &[&Pod]) -> i64 {
    use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
    let expected = covered.len() as i64;
    let healthy = covered.iter().filter(|p| pod_healthy(p)).count() as i64;
    let resolve = |v: &IntOrString| -> i64 {
        match v {
            IntOrString::Int(i) => i64::from(*i),
            IntOrString::String(s) => {
                let pct: i64 = s.trim_end_matches('%').parse().unwrap_or(100);
                (expected * pct + 99) / 100
            }
        }
    };
    let Some(spec) = pdb.spec.as_ref() else {
        return i64::MAX;
    };
    if let Some(max) = &spec.max_unavailable {
        let unhealthy = expected - healthy;
        return resolve(max) - unhealthy;
    }
    if let Some(min) = &spec.min_available {
        return healthy - resolve(min);
    }
    i64::MAX
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::k8s::{EventType, ObjectRef};

    #[test]
    fn same_spec_ignores_metadata_status_and_type_only() {
        let a = json!({"apiVersion": "v1", "kind": "K", "metadata": {"name": "a"},
                       "spec": {"x": 1}, "status": {"s": 1}});
        let b = json!({"apiVersion": "v2", "kind": "K", "metadata": {"name": "b"},
                       "spec": {"x": 1}, "status": {"s": 2}});
        assert!(same_spec(&a, &b));
        let c = json!({"metadata": {}, "spec": {"x": 2}});
        assert!(!same_spec(&a, &c));
        // A top-level field other than spec (e.g. a Secret's data) counts too.
        let d = json!({"metadata": {}, "spec": {"x": 1}, "data": {}});
        assert!(!same_spec(&a, &d));
        assert!(!same_spec(&d, &a));
    }

    /// The typed status write (SSHHost) and the JSON one (a kind it does not list) store what
    /// decoding the written JSON gives: times to the second, as a real API server keeps them;
    /// a write of the stored status keeps the resourceVersion; watchers see the new version.
    #[tokio::test]
    async fn status_writes_store_what_the_json_decodes_to() {
        use crate::api::{HostState, SSHHost, SSHHostStatus};
        use k8s_openapi::api::core::v1::{Namespace, NamespaceStatus};
        use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
        let clock = Clock::simulated(jiff::Timestamp::UNIX_EPOCH);
        let cluster = MemoryCluster::new(clock);
        let sim = crate::sim::SimHost::new("10.9.0.1", 2, 4_000_000);
        let host = cluster
            .create(&crate::sim::world::host_object("pool", "h", "small", &sim))
            .await
            .expect("create");
        let mut watch = cluster.watch::<SSHHost>(None);
        let subsecond = jiff::Timestamp::new(1_000, 700_000_000).expect("timestamp");
        let mut written = host.clone();
        written.status = Some(SSHHostStatus {
            state: HostState::Available,
            last_probe_time: Some(Time(subsecond)),
            ..Default::default()
        });
        let stored = cluster
            .replace_status(&written)
            .await
            .expect("status write");
        let stamp = stored
            .status
            .as_ref()
            .and_then(|s| s.last_probe_time.clone());
        assert_eq!(
            stamp,
            Some(Time(jiff::Timestamp::from_second(1_000).expect("ts")))
        );
        assert_ne!(
            stored.metadata.resource_version,
            host.metadata.resource_version
        );
        assert_eq!(stored.spec, host.spec);
        let read: Option<SSHHost> = cluster.get(Some("pool"), "h").await.expect("get");
        let json = |h: &SSHHost| serde_json::to_value(h).expect("json");
        assert_eq!(read.as_ref().map(json), Some(json(&stored)));
        let again = cluster.replace_status(&stored).await.expect("same status");
        assert_eq!(
            again.metadata.resource_version,
            stored.metadata.resource_version
        );
        let mut seen = vec![];
        while let Some(Some(ev)) = futures::FutureExt::now_or_never(watch.next()) {
            seen.push(ev.expect("event"));
        }
        assert_eq!(
            seen.len(),
            2,
            "the snapshot and one status change: {seen:?}"
        );
        match &seen[1] {
            WatchEvent::Applied(h) => assert_eq!(json(h), json(&stored)),
            other => panic!("expected the status change, got {other:?}"),
        }

        let ns = Namespace {
            metadata: ObjectMeta {
                name: Some("n".into()),
                ..Default::default()
            },
            ..Default::default()
        };
        let mut ns = cluster.create(&ns).await.expect("namespace");
        ns.status = Some(NamespaceStatus {
            phase: Some("Active".into()),
            ..Default::default()
        });
        let written = cluster.replace_status(&ns).await.expect("namespace status");
        assert_eq!(written.status, ns.status);
        assert_ne!(
            written.metadata.resource_version,
            ns.metadata.resource_version
        );
        let again = cluster.replace_status(&written).await.expect("same status");
        assert_eq!(
            again.metadata.resource_version,
            written.metadata.resource_version
        );
    }

    /// Shared watches and the shared status write hand out the stored allocation itself: one
    /// object per version, however many consumers keep it.
    #[tokio::test]
    async fn shared_watchers_and_writer_hold_one_allocation() {
        use crate::api::{HostState, SSHHost, SSHHostStatus};
        let cluster = MemoryCluster::new(Clock::simulated(jiff::Timestamp::UNIX_EPOCH));
        let sim = crate::sim::SimHost::new("10.9.0.1", 2, 4_000_000);
        let mut host = cluster
            .create(&crate::sim::world::host_object("pool", "h", "small", &sim))
            .await
            .expect("create");
        let mut first = cluster.watch_shared::<SSHHost>(None);
        let mut second = cluster.watch_shared::<SSHHost>(Some("pool"));
        host.status = Some(SSHHostStatus {
            state: HostState::Available,
            ..Default::default()
        });
        let written = cluster.replace_status_shared(&host).await.expect("write");
        for watch in [&mut first, &mut second] {
            let mut events = vec![];
            while let Some(Some(ev)) = futures::FutureExt::now_or_never(watch.next()) {
                events.push(ev.expect("event"));
            }
            match events.as_slice() {
                [WatchEvent::Restarted(all), WatchEvent::Applied(h)] => {
                    assert_eq!(all.len(), 1);
                    assert!(Arc::ptr_eq(h, &written), "the watcher got a copy");
                }
                other => panic!("unexpected events {other:?}"),
            }
        }
        assert_eq!(
            written.status.as_ref().map(|s| s.state),
            Some(HostState::Available)
        );
    }

    /// The store's two views of a kind (hashed by name, names in order) agree with one
    /// ordered map through any sequence of creates, replaces and deletes: a get finds what
    /// the last write left, and a list returns exactly the live objects in namespace and name
    /// order, one namespace or all.
    #[test]
    fn the_hashed_and_ordered_views_of_a_kind_stay_one_map() {
        use rand::{Rng, SeedableRng};
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(26);
        let mut objects = Objects::default();
        let mut reference = BTreeMap::<(String, String), String>::new();
        let key = |ns: &str, name: &str| Key {
            api_version: Cow::Borrowed("v1"),
            kind: Cow::Borrowed("ConfigMap"),
            at: Place {
                namespace: ns.to_string(),
                name: name.to_string(),
            },
        };
        let value = |ns: &str, name: &str, n: u32| -> Shared {
            Arc::new(k8s_openapi::api::core::v1::ConfigMap {
                metadata: ObjectMeta {
                    namespace: Some(ns.to_string()).filter(|n| !n.is_empty()),
                    name: Some(name.to_string()),
                    resource_version: Some(n.to_string()),
                    ..Default::default()
                },
                ..Default::default()
            })
        };
        let version = |v: &Shared| v.meta().resource_version.clone().unwrap_or_default();
        for n in 0..3_000u32 {
            let ns = ["", "a", "b", "ab"][rng.random_range(0..4)];
            let name = format!("o{}", rng.random_range(0..60));
            let k = key(ns, &name);
            if rng.random_bool(0.3) {
                let gone = objects.remove(&k).map(|v| version(&v));
                assert_eq!(gone, reference.remove(&(ns.into(), name.clone())));
            } else {
                objects.insert(&k, value(ns, &name, n));
                reference.insert((ns.into(), name.clone()), n.to_string());
            }
            let got = objects.get(&k).map(version);
            assert_eq!(got.as_ref(), reference.get(&(ns.into(), name)));
            let kind = (Cow::Borrowed("ConfigMap"), Cow::Borrowed("v1"));
            for scope in [None, Some("a"), Some("")] {
                let listed: Vec<(String, String)> = objects
                    .of_kind(kind.clone(), scope)
                    .map(|v| (v.meta().name.clone().unwrap_or_default(), version(v)))
                    .collect();
                let expected: Vec<(String, String)> = (reference.iter())
                    .filter(|((ns, _), _)| scope.is_none_or(|s| s == ns))
                    .map(|((_, name), v)| (name.clone(), v.clone()))
                    .collect();
                assert_eq!(listed, expected, "list of {scope:?} after step {n}");
            }
        }
    }

    #[tokio::test]
    async fn forgotten_events_keep_absolute_indices() {
        let cluster = MemoryCluster::new(Clock::system());
        let event = |n: usize| EventRecord {
            regarding: ObjectRef {
                api_version: "v1".into(),
                kind: "Node".into(),
                namespace: None,
                name: format!("n{n}"),
                uid: None,
            },
            type_: EventType::Normal,
            reason: "R".into(),
            message: format!("m{n}"),
        };
        for n in 0..5 {
            cluster.record_event(event(n)).await;
        }
        cluster.forget_events_before(3);
        assert_eq!(cluster.events().len(), 2);
        let names =
            |v: Vec<EventRecord>| v.into_iter().map(|e| e.regarding.name).collect::<Vec<_>>();
        assert_eq!(names(cluster.events_since(3)), ["n3", "n4"]);
        assert_eq!(names(cluster.events_since(4)), ["n4"]);
        cluster.record_event(event(5)).await;
        assert_eq!(names(cluster.events_since(5)), ["n5"]);
        // Forgetting twice, or past the end, is harmless.
        cluster.forget_events_before(3);
        cluster.forget_events_before(99);
        assert!(cluster.events().is_empty());
        cluster.record_event(event(6)).await;
        assert_eq!(names(cluster.events_since(6)), ["n6"]);
    }
}
