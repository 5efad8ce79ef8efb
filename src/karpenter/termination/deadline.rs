//! The terminationGracePeriod deadline of a NodeClaim (S44), persisted on the claim as core
//! does: `karpenter.sh/nodeclaim-termination-timestamp` (RFC 3339). A claim being deleted gets
//! its deletion timestamp plus the grace period; a claim marked for voluntary disruption
//! (kpssh drains before it deletes) gets the moment the drain starts plus the grace period. An
//! annotation already there is kept: a controller restart neither restarts nor extends the
//! countdown. No grace period and no annotation: no deadline, the drain waits as long as it
//! takes.

use jiff::Timestamp;

use super::parse_duration;
use crate::api::NodeClaim;

/// Core's annotation for the time by which the node must be gone.
pub const TERMINATION_TIMESTAMP_ANNOTATION: &str = "karpenter.sh/nodeclaim-termination-timestamp";

/// What the claim carries about its deadline.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Recorded {
    /// No annotation.
    None,
    At(Timestamp),
    /// An annotation that is not an RFC 3339 time (someone edited it): the text, for the error.
    Invalid(String),
}

pub fn recorded(nc: &NodeClaim) -> Recorded {
    let value =
        (nc.metadata.annotations.as_ref()).and_then(|a| a.get(TERMINATION_TIMESTAMP_ANNOTATION));
    match value {
        None => Recorded::None,
        Some(v) => v
            .parse::<Timestamp>()
            .map_or_else(|_| Recorded::Invalid(v.clone()), Recorded::At),
    }
}

/// The deadline to record for a claim entering termination at `now`: its deletion (or, for a
/// claim only marked, `now`) plus `spec.terminationGracePeriod`; `None` without one.
pub fn due(nc: &NodeClaim, now: Timestamp) -> Option<Timestamp> {
    let grace = nc
        .spec
        .termination_grace_period
        .as_deref()
        .and_then(parse_duration)?;
    let start = nc.metadata.deletion_timestamp.as_ref().map_or(now, |t| t.0);
    let grace = jiff::SignedDuration::try_from(grace).ok()?;
    Some(start.checked_add(grace).unwrap_or(Timestamp::MAX))
}

/// The annotation's text for `t`: whole seconds, as core writes it.
pub fn format(t: Timestamp) -> String {
    t.strftime("%Y-%m-%dT%H:%M:%SZ").to_string()
}

/// When a pod with `grace` of its own must be deleted so that its grace ends by `deadline`
/// (core's pod deletion decorator).
pub fn pod_delete_at(deadline: Timestamp, grace: std::time::Duration) -> Timestamp {
    jiff::SignedDuration::try_from(grace)
        .ok()
        .and_then(|g| deadline.checked_sub(g).ok())
        .unwrap_or(Timestamp::MIN)
}

/// The grace to delete a pod with at `now`: what is left until `deadline`, never negative.
pub fn remaining_seconds(deadline: Timestamp, now: Timestamp) -> u32 {
    let left = deadline.duration_since(now).as_secs();
    u32::try_from(left.max(0)).unwrap_or(u32::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sim::world::node_claim;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
    use std::time::Duration;

    fn t(s: &str) -> Timestamp {
        s.parse().expect("timestamp")
    }

    #[test]
    fn due_counts_from_the_deletion_else_from_now() {
        let mut nc = node_claim("a", "pool", "1", "1Gi");
        let now = t("2026-01-01T01:00:00Z");
        assert_eq!(due(&nc, now), None, "no grace period: no deadline");
        nc.spec.termination_grace_period = Some("10m".into());
        assert_eq!(due(&nc, now), Some(t("2026-01-01T01:10:00Z")));
        nc.metadata.deletion_timestamp = Some(Time(t("2026-01-01T00:30:00Z")));
        assert_eq!(due(&nc, now), Some(t("2026-01-01T00:40:00Z")));
    }

    #[test]
    fn recorded_reads_the_annotation_and_names_garbage() {
        let mut nc = node_claim("a", "pool", "1", "1Gi");
        assert_eq!(recorded(&nc), Recorded::None);
        let at = t("2026-01-01T00:40:00Z");
        nc.metadata.annotations =
            Some([(TERMINATION_TIMESTAMP_ANNOTATION.to_string(), format(at))].into());
        assert_eq!(recorded(&nc), Recorded::At(at));
        nc.metadata.annotations = Some(
            [(
                TERMINATION_TIMESTAMP_ANNOTATION.to_string(),
                "soon".to_string(),
            )]
            .into(),
        );
        assert_eq!(recorded(&nc), Recorded::Invalid("soon".into()));
    }

    #[test]
    fn a_pod_is_deleted_its_own_grace_before_the_deadline() {
        let deadline = t("2026-01-01T00:40:00Z");
        assert_eq!(
            pod_delete_at(deadline, Duration::from_secs(120)),
            t("2026-01-01T00:38:00Z")
        );
        assert_eq!(remaining_seconds(deadline, t("2026-01-01T00:38:00Z")), 120);
        assert_eq!(remaining_seconds(deadline, t("2026-01-01T00:41:00Z")), 0);
    }
}
