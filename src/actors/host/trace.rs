//! The host actor's side of the lifecycle traces (see `crate::telemetry::lifecycle`): the
//! claim's root span is held in the actor state and every phase of the claim runs inside it.

use tracing::Span;

use super::HostActorState;
use crate::api::ClaimRef;
use crate::k8s::Cluster;
use crate::ssh::Transport;
use crate::telemetry::lifecycle::Subject;

impl<C: Cluster, T: Transport> HostActorState<C, T> {
    /// The lifecycle span of `claim`: the one the router opened, or a new one marked resumed
    /// (a restarted controller or a rebuilt actor); kept in the actor state.
    pub fn lifecycle_span(&mut self, claim: &ClaimRef) -> Span {
        if let Some((uid, span)) = &self.lifecycle
            && *uid == claim.uid
            && self.ctx.lifecycles.get(uid).is_some()
        {
            return span.clone();
        }
        let subject = Subject::new(&self.key(), self.host.class(), claim, "");
        let span = self.ctx.lifecycles.get_or_resume(&subject);
        self.lifecycle = Some((claim.uid.clone(), span.clone()));
        span
    }

    /// Close the lifecycle of `uid` with its outcome (exported now).
    pub fn end_lifecycle(&mut self, uid: &str, outcome: &str, failed: bool) {
        self.ctx.lifecycles.end(uid, outcome, failed);
        self.ctx.metrics.detach(uid);
        if self.lifecycle.as_ref().is_some_and(|(u, _)| u == uid) {
            self.lifecycle = None;
        }
    }
}
