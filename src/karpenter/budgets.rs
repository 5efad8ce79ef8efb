//! Disruption budgets as core counts them (S59): `nodes` as a count or a percentage (rounded
//! up) of the NodePool's initialized nodes, optionally only during `schedule` (robfig/cron
//! semantics, UTC, [`super::cron`]) + `duration`, optionally only for some reasons; the most
//! restrictive active budget applies. A budget that cannot be read (a schedule robfig rejects,
//! a `duration` without a `schedule`, `nodes` that is neither a count nor a percentage) allows
//! 0 disruptions for every reason of its NodePool, as core fails closed on any budget error.
//!
//! [`usage`] counts as core's `BuildDisruptionBudgetMapping`: the denominator is the
//! NodePool's initialized nodes (a node still launching does not widen a percentage), and a
//! node that is NotReady, being deleted or marked for disruption uses up the budget.

use std::time::Duration;

use jiff::Timestamp;

use super::cron::Schedule;
use super::lifecycle::{condition_true, node_ready};
use super::state::Inner;
use super::termination::{is_drained, is_marked, parse_duration};
use crate::api::NodePool;
use crate::api::karpenter::Budget;

/// Upstream's default when a NodePool lists no budget.
pub const DEFAULT_NODES: &str = "10%";

/// How many of `total` nodes may be disrupted at once for `reason` at `now` (before
/// subtracting those already being disrupted). 0 when any budget of the pool is invalid.
pub fn allowed(pool: &NodePool, reason: &str, total: usize, now: Timestamp) -> i64 {
    match allowed_or_error(pool, reason, total, now) {
        Ok(n) => n,
        Err(e) => {
            tracing::debug!(nodepool = ?pool.metadata.name, error = %e, "invalid disruption budget: no disruption allowed");
            0
        }
    }
}

/// [`allowed`], or why a budget of the pool cannot be read.
pub fn allowed_or_error(
    pool: &NodePool,
    reason: &str,
    total: usize,
    now: Timestamp,
) -> Result<i64, String> {
    let default = [Budget {
        nodes: DEFAULT_NODES.into(),
        ..Default::default()
    }];
    let budgets: &[Budget] = if pool.spec.disruption.budgets.is_empty() {
        &default
    } else {
        &pool.spec.disruption.budgets
    };
    let mut min = i64::from(i32::MAX);
    for (i, b) in budgets.iter().enumerate() {
        // As core: every budget is read (an unreadable one fails the pool, whatever its
        // reasons), the applicable ones bound the result.
        let value = budget_value(b, total, now).map_err(|e| format!("budgets[{i}]: {e}"))?;
        if b.reasons
            .as_ref()
            .is_none_or(|rs| rs.iter().any(|r| r == reason))
        {
            min = min.min(value);
        }
    }
    Ok(min)
}

/// One budget's allowance now: unbounded while it is not active.
fn budget_value(b: &Budget, total: usize, now: Timestamp) -> Result<i64, String> {
    if !active(b, now)? {
        return Ok(i64::from(i32::MAX));
    }
    nodes(&b.nodes, total)
}

/// Kubernetes' `GetScaledValueFromIntOrPercent` rounding up, as core: a count, or a percentage
/// of `total`.
fn nodes(value: &str, total: usize) -> Result<i64, String> {
    let bad = || format!("nodes {value:?} is neither a count nor a percentage");
    match value.strip_suffix('%') {
        Some(p) => {
            let pct: i64 = p.parse().map_err(|_| bad())?;
            let total = total as i64;
            Ok((total * pct + 99).div_euclid(100))
        }
        None => value.parse().map_err(|_| bad()),
    }
}

/// Core's `Budget.IsActive`: no schedule and no duration is always active; otherwise the
/// schedule's next hit after `now - duration` must not be after `now`.
pub fn active(b: &Budget, now: Timestamp) -> Result<bool, String> {
    if b.schedule.is_none() && b.duration.is_none() {
        return Ok(true);
    }
    let schedule = Schedule::parse(b.schedule.as_deref().unwrap_or_default())
        .map_err(|e| format!("schedule {:?}: {e}", b.schedule.as_deref().unwrap_or("")))?;
    let window = match b.duration.as_deref() {
        None => Duration::ZERO,
        Some(d) => parse_duration(d).ok_or_else(|| format!("duration {d:?} is not a duration"))?,
    };
    Ok(schedule.active(now, window))
}

/// A NodePool's nodes as the budget counts them.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Usage {
    /// Initialized nodes (core's denominator), drained and leaving ones left out.
    pub total: usize,
    /// Of those, the ones NotReady, being deleted or marked for disruption.
    pub disrupting: i64,
    /// Of those, the ones cordoned while their replacement launches (core's command
    /// candidates, marked for deletion from the start).
    pub waiting: i64,
}

/// The budget's count of `pool`'s NodeClaims.
pub fn usage(st: &Inner, pool: &str) -> Usage {
    let mut u = Usage::default();
    for nc in st.nodeclaims.values() {
        if nc.nodepool() != Some(pool) || !condition_true(nc, "Initialized") {
            continue;
        }
        // Core leaves out claims whose instance is terminating (drained, being deleted).
        let deleting = nc.metadata.deletion_timestamp.is_some();
        if deleting && is_drained(nc) {
            continue;
        }
        u.total += 1;
        let ready = st
            .node_of(nc)
            .and_then(node_ready)
            .is_some_and(|c| c.status == "True");
        if !ready || deleting || is_marked(nc) {
            u.disrupting += 1;
        } else if super::disruption::replacement::replaced_by(nc).is_some() {
            u.waiting += 1;
        }
    }
    u
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::NodeClaim;
    use k8s_openapi::api::core::v1::{Node, NodeCondition, NodeStatus};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
    use std::collections::BTreeMap;
    use std::sync::Arc;

    fn pool(budgets: Vec<Budget>) -> NodePool {
        let mut p = NodePool::new("np", Default::default());
        p.spec.disruption.budgets = budgets;
        p
    }

    fn b(
        nodes: &str,
        reasons: Option<Vec<&str>>,
        sched: Option<&str>,
        dur: Option<&str>,
    ) -> Budget {
        Budget {
            nodes: nodes.into(),
            reasons: reasons.map(|r| r.into_iter().map(str::to_string).collect()),
            schedule: sched.map(str::to_string),
            duration: dur.map(str::to_string),
        }
    }

    #[test]
    fn counts_percentages_reasons_and_schedules() {
        let now: Timestamp = "2026-01-05T09:30:00Z".parse().expect("ts");
        assert_eq!(allowed(&pool(vec![]), "Empty", 20, now), 2, "default 10%");
        assert_eq!(allowed(&pool(vec![]), "Empty", 9, now), 1, "rounded up");
        let p = pool(vec![
            b("50%", None, None, None),
            b("0", Some(vec!["Drifted"]), None, None),
            b("1", None, Some("0 9 * * 1-5"), Some("1h")),
        ]);
        assert_eq!(allowed(&p, "Drifted", 10, now), 0);
        assert_eq!(
            allowed(&p, "Empty", 10, now),
            1,
            "business-hours budget active"
        );
        let later: Timestamp = "2026-01-05T11:00:00Z".parse().expect("ts");
        assert_eq!(allowed(&p, "Empty", 10, later), 5);
    }

    /// S59: an invalid schedule allows 0, for every reason of the pool (core fails closed on
    /// any budget error); so does a duration without a schedule, and unreadable `nodes`. The
    /// old reading let a bad schedule count as "active" for its own budget only.
    #[test]
    fn s59_an_invalid_budget_allows_no_disruption() {
        let now: Timestamp = "2026-01-05T09:30:00Z".parse().expect("ts");
        for bad in [
            b("5", Some(vec!["Drifted"]), Some("0 9 * * 7"), Some("1h")),
            b(
                "5",
                Some(vec!["Drifted"]),
                Some("not a schedule"),
                Some("1h"),
            ),
            b("5", Some(vec!["Drifted"]), None, Some("1h")),
            b("five", Some(vec!["Drifted"]), None, None),
        ] {
            let p = pool(vec![b("100%", None, None, None), bad.clone()]);
            assert_eq!(allowed(&p, "Empty", 10, now), 0, "{bad:?}");
            assert!(allowed_or_error(&p, "Empty", 10, now).is_err());
        }
        // robfig's day-of-month OR day-of-week: "0 9 10 * MON" fires on Monday the 5th.
        let p = pool(vec![b("0", None, Some("0 9 10 * MON"), Some("1h"))]);
        assert_eq!(allowed(&p, "Empty", 10, now), 0, "the budget is active");
    }

    fn claim(name: &str, node: &str, initialized: bool) -> Arc<NodeClaim> {
        let mut nc = NodeClaim::new(name, Default::default());
        nc.metadata.labels = Some(BTreeMap::from([(
            crate::api::karpenter::NODEPOOL_LABEL.to_string(),
            "np".to_string(),
        )]));
        let status = crate::api::karpenter::NodeClaimStatus {
            node_name: Some(node.into()),
            conditions: if initialized {
                vec![Condition {
                    type_: "Initialized".into(),
                    status: "True".into(),
                    reason: "Initialized".into(),
                    message: String::new(),
                    last_transition_time: Time(Timestamp::UNIX_EPOCH),
                    observed_generation: None,
                }]
            } else {
                vec![]
            },
            ..Default::default()
        };
        nc.status = Some(status);
        Arc::new(nc)
    }

    fn node(name: &str, ready: &str) -> Node {
        let mut n = Node::default();
        n.metadata.name = Some(name.into());
        n.status = Some(NodeStatus {
            conditions: Some(vec![NodeCondition {
                type_: "Ready".into(),
                status: ready.into(),
                ..Default::default()
            }]),
            ..Default::default()
        });
        n
    }

    /// S59: ten initialized nodes (one NotReady, one being deleted) and two still launching:
    /// the denominator is the ten, and the NotReady and the deleting node use the budget: at
    /// 10% (one node), nothing more may be disrupted.
    #[test]
    fn s59_budget_counts_initialized_nodes_and_not_ready_ones_use_it() {
        let mut st = Inner::default();
        for i in 0..10 {
            let (c, n) = (format!("c{i}"), format!("n{i}"));
            let mut nc = claim(&c, &n, true);
            if i == 9 {
                Arc::make_mut(&mut nc).metadata.deletion_timestamp =
                    Some(Time(Timestamp::UNIX_EPOCH));
            }
            st.nodeclaims.insert(c, nc);
            st.nodes.insert(
                n.clone(),
                Arc::new(node(&n, if i == 0 { "False" } else { "True" })),
            );
        }
        for i in 10..12 {
            st.nodeclaims
                .insert(format!("c{i}"), claim(&format!("c{i}"), "", false));
        }
        let u = usage(&st, "np");
        assert_eq!(
            u,
            Usage {
                total: 10,
                disrupting: 2,
                waiting: 0
            }
        );
        let now: Timestamp = "2026-01-05T09:30:00Z".parse().expect("ts");
        let left = allowed(&pool(vec![]), "Empty", u.total, now) - u.disrupting - u.waiting;
        assert!(left <= 0, "{left}");
    }
}
