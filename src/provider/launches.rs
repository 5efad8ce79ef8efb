//! Recent launch outcomes per node class, and the class-level pause they imply (S63): when most
//! of a class's recent launches failed the same way (the same phase and exit status, or the
//! same configuration error), launching more hosts into that failure only burns them. The node
//! class controller then sets Ready=False (reason `LaunchesFailing`) and provisioning stops
//! creating NodeClaims for the class until the pause runs out. After it one launch goes
//! through; if it fails the same way the class pauses again, twice as long.
//!
//! Kept in memory: a restarted controller forgets the pause (the per-host backoff, which
//! lives in each host's status, still holds the failing hosts back).

use std::collections::{BTreeMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use jiff::Timestamp;

use crate::api::LaunchFailure;

/// Outcomes looked at per class.
pub const WINDOW: usize = 5;
/// Failures of one kind among the window that pause the class.
pub const SAME_FAILURES: usize = 3;
/// Outcomes older than this are forgotten.
pub const MAX_AGE: Duration = Duration::from_secs(30 * 60);
/// First pause; doubled for each pause that follows without a success, up to `MAX_PAUSE`.
pub const FIRST_PAUSE: Duration = Duration::from_secs(5 * 60);
pub const MAX_PAUSE: Duration = Duration::from_secs(60 * 60);

/// One launch's outcome.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outcome {
    /// `None`: succeeded. Else what makes two failures "the same way".
    failure: Option<String>,
    /// A readable account of the failure (the last one is shown).
    summary: String,
}

impl Outcome {
    pub fn succeeded() -> Self {
        Outcome {
            failure: None,
            summary: String::new(),
        }
    }

    /// A failure's kind: its phase and exit status; for a configuration error, its text
    /// (which names the class and the cause, not the host).
    pub fn failed(f: &LaunchFailure) -> Self {
        let kind = match (f.phase.as_str(), f.exit_status) {
            ("configuration", _) => format!("configuration: {}", f.message),
            (phase, Some(code)) => format!("{phase} exited with status {code}"),
            (phase, None) => format!("{phase}: {}", f.reason),
        };
        Outcome {
            failure: Some(kind),
            summary: f.message.clone(),
        }
    }
}

/// Why a class is paused, and until when.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pause {
    pub until: Timestamp,
    pub message: String,
}

#[derive(Debug, Default)]
struct ClassLaunches {
    recent: VecDeque<(Timestamp, Outcome)>,
    /// Pauses in a row without a success in between.
    pauses: u32,
    paused: Option<Pause>,
}

#[derive(Debug, Default)]
struct Inner {
    classes: BTreeMap<String, ClassLaunches>,
    /// Bumped by every record and forget: readers recompute when it moved.
    epoch: u64,
}

/// Shared by every host actor (which record) and the node class controller (which reads).
#[derive(Clone, Debug, Default)]
pub struct LaunchLedger(Arc<Mutex<Inner>>);

impl LaunchLedger {
    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Record one launch of `class` (ignored for an unknown class, "").
    pub fn record(&self, class: &str, outcome: Outcome, now: Timestamp) {
        if class.is_empty() {
            return;
        }
        let mut inner = self.lock();
        inner.epoch += 1;
        let c = inner.classes.entry(class.to_string()).or_default();
        if outcome.failure.is_none() {
            c.pauses = 0;
            c.paused = None;
        }
        c.recent.push_back((now, outcome));
        while c.recent.len() > WINDOW {
            c.recent.pop_front();
        }
        if c.paused.as_ref().is_some_and(|p| p.until > now) {
            return;
        }
        if let Some((kind, count, last)) = dominant_failure(&c.recent, now) {
            c.pauses = c.pauses.saturating_add(1);
            let doublings = (c.pauses - 1).min(10);
            let pause = FIRST_PAUSE.saturating_mul(1 << doublings).min(MAX_PAUSE);
            let until = now + jiff::SignedDuration::try_from(pause).unwrap_or_default();
            let message = format!(
                "{count} of the last {} launches failed the same way ({kind}); launches paused until {}. Last failure: {last}",
                c.recent.len(),
                until.strftime("%Y-%m-%dT%H:%M:%SZ"),
            );
            c.paused = Some(Pause { until, message });
            // The next pause needs fresh failures: one launch goes through after this one.
            c.recent.clear();
        }
    }

    /// The class's pause, if one runs at `now`.
    pub fn paused(&self, class: &str, now: Timestamp) -> Option<Pause> {
        self.lock()
            .classes
            .get(class)
            .and_then(|c| c.paused.clone())
            .filter(|p| p.until > now)
    }

    /// Forget a class's history (its spec or its profile changed: old failures say nothing
    /// about the new configuration).
    pub fn forget(&self, class: &str) {
        let mut inner = self.lock();
        if inner.classes.remove(class).is_some() {
            inner.epoch += 1;
        }
    }

    /// Moves with every record and forget.
    pub fn epoch(&self) -> u64 {
        self.lock().epoch
    }

    /// Whether any class is paused at `now` (its pause runs out by time, with no record).
    pub fn any_paused(&self, now: Timestamp) -> bool {
        self.lock()
            .classes
            .values()
            .any(|c| c.paused.as_ref().is_some_and(|p| p.until > now))
    }
}

/// The failure kind that most recent launches share, when it pauses the class: at least
/// [`SAME_FAILURES`] of them, and more than half of the window, within [`MAX_AGE`].
fn dominant_failure(
    recent: &VecDeque<(Timestamp, Outcome)>,
    now: Timestamp,
) -> Option<(String, usize, String)> {
    let fresh: Vec<&Outcome> = recent
        .iter()
        .filter(|(t, _)| {
            now.duration_since(*t) <= jiff::SignedDuration::try_from(MAX_AGE).unwrap_or_default()
        })
        .map(|(_, o)| o)
        .collect();
    let mut counts: BTreeMap<&str, (usize, &str)> = BTreeMap::new();
    for o in &fresh {
        if let Some(k) = o.failure.as_deref() {
            let e = counts.entry(k).or_insert((0, ""));
            e.0 += 1;
            e.1 = o.summary.as_str();
        }
    }
    counts
        .into_iter()
        .filter(|(_, (n, _))| *n >= SAME_FAILURES && *n * 2 > fresh.len())
        .max_by_key(|(_, (n, _))| *n)
        .map(|(k, (n, last))| (k.to_string(), n, last.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

    fn failure(phase: &str, code: Option<i32>, message: &str) -> Outcome {
        Outcome::failed(&LaunchFailure {
            phase: phase.into(),
            reason: "LaunchFailed".into(),
            exit_status: code,
            message: message.into(),
            node_claim: None,
            time: Time(Timestamp::UNIX_EPOCH),
        })
    }

    fn at(s: i64) -> Timestamp {
        Timestamp::from_second(1_000_000 + s).expect("time")
    }

    #[test]
    fn s63_a_class_pauses_when_most_launches_fail_the_same_way() {
        let ledger = LaunchLedger::default();
        let install = |h: &str| {
            failure(
                "install",
                Some(100),
                &format!("{h}: install exited with status 100"),
            )
        };
        ledger.record("c", install("h1"), at(0));
        ledger.record("c", Outcome::succeeded(), at(1));
        ledger.record("c", install("h2"), at(2));
        assert!(ledger.paused("c", at(3)).is_none(), "2 of 3: not yet");
        ledger.record("c", install("h3"), at(3));
        let pause = ledger
            .paused("c", at(4))
            .expect("3 of 4 failed the same way");
        assert!(
            pause.message.contains("install exited with status 100"),
            "{}",
            pause.message
        );
        assert!(
            pause.message.contains("h3"),
            "the last failure is shown: {}",
            pause.message
        );
        assert_eq!(pause.until, at(3 + 300));
        assert!(ledger.paused("other", at(4)).is_none(), "per class");
        assert!(ledger.paused("c", at(303)).is_none(), "runs out");
        // After the pause, the same failure three more times pauses twice as long.
        for i in 0..3 {
            ledger.record("c", install("h4"), at(400 + i));
        }
        assert_eq!(
            ledger.paused("c", at(403)).map(|p| p.until),
            Some(at(402 + 600))
        );
        // A success ends it and resets the doubling.
        ledger.record("c", Outcome::succeeded(), at(500));
        assert!(ledger.paused("c", at(501)).is_none());
    }

    #[test]
    fn s63_different_failures_or_a_minority_do_not_pause() {
        let ledger = LaunchLedger::default();
        ledger.record("c", failure("install", Some(100), "a"), at(0));
        ledger.record("c", failure("join", Some(1), "b"), at(1));
        ledger.record("c", failure("install", Some(2), "c"), at(2));
        ledger.record("c", failure("registration", None, "d"), at(3));
        assert!(ledger.paused("c", at(4)).is_none(), "four ways of failing");
        let ledger = LaunchLedger::default();
        for i in 0..3 {
            ledger.record("c", failure("join", Some(1), "x"), at(i * 1000));
        }
        assert!(
            ledger.paused("c", at(2001)).is_none(),
            "spread over more than 30 minutes"
        );
    }
}
