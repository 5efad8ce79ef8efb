//! Core's `Nominated` event (S59): a pod that provisioning placed on a new NodeClaim is told
//! where it should schedule ("Pod should schedule on: nodeclaim/NAME"). As core, the events
//! go through a token bucket of 5 per second with a burst of 10 (a round of ten thousand pods
//! must not turn into ten thousand API writes), and each pod is told once per NodeClaim.

use std::collections::BTreeSet;

use jiff::Timestamp;

use crate::actors::Context;
use crate::k8s::{Cluster, EventRecord, EventType, ObjectRef};
use crate::ssh::Transport;

/// Core's event reason.
pub const NOMINATED: &str = "Nominated";
/// Core's rate: tokens per second and burst.
const RATE: f64 = 5.0;
const BURST: f64 = 10.0;

#[derive(Debug)]
pub struct Nominator {
    tokens: f64,
    last: Option<Timestamp>,
    /// (pod UID, NodeClaim) already told; bounded.
    told: BTreeSet<(String, String)>,
}

impl Default for Nominator {
    fn default() -> Self {
        Nominator {
            tokens: BURST,
            last: None,
            told: BTreeSet::new(),
        }
    }
}

impl Nominator {
    /// Take a token at `now`, if there is one.
    fn take(&mut self, now: Timestamp) -> bool {
        if let Some(last) = self.last {
            let secs = now.duration_since(last).as_secs_f64().max(0.0);
            self.tokens = (self.tokens + secs * RATE).min(BURST);
        }
        self.last = Some(now);
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            true
        } else {
            false
        }
    }

    /// Tell the pods `pods` (namespace, name) that they should schedule on NodeClaim `claim`.
    pub async fn nominate<C: Cluster, T: Transport>(
        &mut self,
        ctx: &Context<C, T>,
        claim: &str,
        pods: &[(String, String)],
        uid_of: impl Fn(&(String, String)) -> Option<String>,
    ) {
        for key in pods {
            let Some(uid) = uid_of(key) else { continue };
            if self.told.contains(&(uid.clone(), claim.to_string())) {
                continue;
            }
            if !self.take(ctx.clock.now()) {
                return;
            }
            if self.told.len() >= 100_000 {
                self.told.clear();
            }
            self.told.insert((uid.clone(), claim.to_string()));
            ctx.cluster
                .record_event(EventRecord {
                    regarding: ObjectRef {
                        api_version: "v1".into(),
                        kind: "Pod".into(),
                        namespace: Some(key.0.clone()),
                        name: key.1.clone(),
                        uid: Some(uid),
                    },
                    type_: EventType::Normal,
                    reason: NOMINATED.into(),
                    message: format!("Pod should schedule on: nodeclaim/{claim}"),
                })
                .await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bucket_of_ten_refilled_at_five_per_second() {
        let mut n = Nominator::default();
        let t0: Timestamp = "2026-01-05T09:30:00Z".parse().expect("ts");
        assert_eq!((0..20).filter(|_| n.take(t0)).count(), 10, "the burst");
        let t1 = t0 + jiff::SignedDuration::from_secs(1);
        assert_eq!(
            (0..20).filter(|_| n.take(t1)).count(),
            5,
            "one second later"
        );
    }
}
