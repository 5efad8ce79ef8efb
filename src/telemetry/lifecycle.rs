//! One trace per NodeClaim lifecycle on a host: a root span `nodeclaim.lifecycle` opened when
//! the router claims a host and closed when the host is released (or the launch fails), with
//! child spans for each step: `claim`, `install`/`join`/`leave` (each with an `ssh.exec` child),
//! `registered`, `initialized`, `drain`, `released`.
//!
//! A lifecycle spans many actor messages over minutes and three actors (router, host actor,
//! karpenter layer), so its span lives here, keyed by NodeClaim UID, and every participant
//! parents its spans on it. The registry is in memory only: after a controller restart the
//! host actor starts a new trace for the same NodeClaim with `resumed = true` and the NodeClaim's
//! name and UID as attributes, which is how the two halves are found together.
//!
//! Span attributes carry names, states and numbers only — never script text, env or tokens.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard};

use tokio::time::Instant;
use tracing::Span;
use tracing::field::Empty;

use crate::api::ClaimRef;

/// Who a lifecycle is about.
#[derive(Clone, Debug, Default)]
pub struct Subject {
    pub host: String,
    pub class: String,
    pub nodeclaim: String,
    pub nodeclaim_uid: String,
    pub nodepool: String,
}

impl Subject {
    pub fn new(host: &str, class: &str, claim: &ClaimRef, nodepool: &str) -> Self {
        Subject {
            host: host.to_string(),
            class: class.to_string(),
            nodeclaim: claim.name.clone(),
            nodeclaim_uid: claim.uid.clone(),
            nodepool: nodepool.to_string(),
        }
    }
}

struct Entry {
    span: Span,
    started: Instant,
    /// Steps that last across messages (the drain), by name.
    open: BTreeMap<&'static str, (Span, Instant)>,
}

/// The open lifecycles of this controller, by NodeClaim UID.
#[derive(Clone, Default)]
pub struct Lifecycles {
    inner: Arc<Mutex<BTreeMap<String, Entry>>>,
}

fn root_span(s: &Subject, resumed: bool) -> Span {
    tracing::info_span!(
        parent: None,
        "nodeclaim.lifecycle",
        host = %s.host,
        class = %s.class,
        nodeclaim = %s.nodeclaim,
        nodeclaim_uid = %s.nodeclaim_uid,
        nodepool = %s.nodepool,
        resumed,
        warm = Empty,
        outcome = Empty,
        duration_ms = Empty,
        otel.status_code = Empty,
    )
}

/// A child span for a step; its outcome is recorded once, when known (a value recorded
/// twice would be exported twice).
fn step_span(parent: &Span, name: &'static str) -> Span {
    tracing::info_span!(
        parent: parent,
        "lifecycle.step",
        otel.name = name,
        phase = name,
        outcome = Empty,
        duration_ms = Empty,
    )
}

impl Lifecycles {
    fn lock(&self) -> MutexGuard<'_, BTreeMap<String, Entry>> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Open the lifecycle of a claim that was just written (replacing a leftover one).
    pub fn begin(&self, subject: &Subject) -> Span {
        self.insert(subject, false)
    }

    fn insert(&self, subject: &Subject, resumed: bool) -> Span {
        let span = root_span(subject, resumed);
        let entry = Entry {
            span: span.clone(),
            started: Instant::now(),
            open: BTreeMap::new(),
        };
        self.lock().insert(subject.nodeclaim_uid.clone(), entry);
        span
    }

    /// The lifecycle span of this claim; a new one marked `resumed` when this controller did
    /// not open it (a restart, or a rebuilt actor).
    pub fn get_or_resume(&self, subject: &Subject) -> Span {
        if let Some(span) = self.get(&subject.nodeclaim_uid) {
            return span;
        }
        self.insert(subject, true)
    }

    pub fn get(&self, uid: &str) -> Option<Span> {
        self.lock().get(uid).map(|e| e.span.clone())
    }

    /// Record a step that completed now as a child span.
    pub fn step(&self, uid: &str, name: &'static str, outcome: &str) {
        if let Some(parent) = self.get(uid) {
            step_span(&parent, name).record("outcome", outcome);
        }
    }

    /// Start a step that lasts across messages (the drain). A step already open stays.
    pub fn open(&self, uid: &str, name: &'static str) {
        let mut map = self.lock();
        if let Some(e) = map.get_mut(uid) {
            let parent = e.span.clone();
            e.open
                .entry(name)
                .or_insert_with(|| (step_span(&parent, name), Instant::now()));
        }
    }

    /// Finish an open step with its outcome; no-op when it is not open.
    pub fn close(&self, uid: &str, name: &'static str, outcome: &str) {
        let step = self.lock().get_mut(uid).and_then(|e| e.open.remove(name));
        if let Some((span, started)) = step {
            span.record("outcome", outcome);
            span.record("duration_ms", millis(started));
        }
    }

    /// Close the lifecycle: remaining open steps end as `interrupted`, the root span records
    /// its outcome and duration and is exported.
    pub fn end(&self, uid: &str, outcome: &str, failed: bool) {
        let Some(entry) = self.lock().remove(uid) else {
            return;
        };
        for (span, started) in entry.open.into_values() {
            span.record("outcome", "interrupted");
            span.record("duration_ms", millis(started));
        }
        entry.span.record("outcome", outcome);
        entry.span.record("duration_ms", millis(entry.started));
        if failed {
            entry.span.record("otel.status_code", "ERROR");
        }
    }

    /// End every open lifecycle (controller shutdown).
    pub fn end_all(&self, outcome: &str) {
        let uids: Vec<String> = self.lock().keys().cloned().collect();
        for uid in uids {
            self.end(&uid, outcome, false);
        }
    }

    /// Open lifecycles (for tests and metrics).
    pub fn len(&self) -> usize {
        self.lock().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Milliseconds since `started` on tokio's clock (virtual in the simulation). Signed: the
/// OpenTelemetry layer exports recorded `u64` values as strings, `i64` as integers.
pub fn millis(started: Instant) -> i64 {
    i64::try_from(started.elapsed().as_millis()).unwrap_or(i64::MAX)
}

/// The NodePool a NodeClaim belongs to (its `karpenter.sh/nodepool` label), or "".
pub fn nodepool_of(nc: &crate::api::NodeClaim) -> &str {
    nc.metadata
        .labels
        .as_ref()
        .and_then(|l| l.get(crate::api::karpenter::NODEPOOL_LABEL))
        .map_or("", String::as_str)
}
