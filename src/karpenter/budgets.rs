//! Disruption budgets: `nodes` as a count or a percentage of the NodePool's nodes, optionally
//! only during `schedule` (5-field cron, UTC) + `duration`, optionally only for some reasons.

use std::time::Duration;

use jiff::Timestamp;
use jiff::tz::TimeZone;

use super::termination::parse_duration;
use crate::api::NodePool;
use crate::api::karpenter::Budget;

/// Upstream's default when a NodePool lists no budget.
pub const DEFAULT_NODES: &str = "10%";

/// How many of `total` nodes may be disrupted at once for `reason` at `now` (before
/// subtracting those already being disrupted).
pub fn allowed(pool: &NodePool, reason: &str, total: usize, now: Timestamp) -> i64 {
    let default = [Budget {
        nodes: DEFAULT_NODES.into(),
        ..Default::default()
    }];
    let budgets: &[Budget] = if pool.spec.disruption.budgets.is_empty() {
        &default
    } else {
        &pool.spec.disruption.budgets
    };
    budgets
        .iter()
        .filter(|b| {
            b.reasons
                .as_ref()
                .is_none_or(|rs| rs.iter().any(|r| r == reason))
        })
        .filter(|b| active(b, now))
        .map(|b| nodes(&b.nodes, total))
        .min()
        .unwrap_or(i64::MAX)
}

fn nodes(value: &str, total: usize) -> i64 {
    match value.trim().strip_suffix('%') {
        Some(p) => {
            let pct: i64 = p.trim().parse().unwrap_or(0);
            (total as i64 * pct + 99) / 100
        }
        None => value.trim().parse().unwrap_or(0),
    }
}

/// Active now: no schedule, or the schedule fired within the last `duration`.
pub fn active(b: &Budget, now: Timestamp) -> bool {
    let Some(schedule) = &b.schedule else {
        return true;
    };
    let Some(cron) = Cron::parse(schedule) else {
        // Fail closed: an unreadable schedule blocks (a budget of "0" during it is the common
        // intent); counting it as active is the conservative choice.
        return true;
    };
    let window = b
        .duration
        .as_deref()
        .and_then(parse_duration)
        .unwrap_or(Duration::ZERO);
    let minutes = (window.as_secs() / 60).min(60 * 24 * 31) as i64;
    let zoned = now.to_zoned(TimeZone::UTC);
    for back in 0..minutes {
        let Ok(t) = zoned.checked_sub(jiff::Span::new().minutes(back)) else {
            break;
        };
        if cron.matches(
            t.minute() as u32,
            t.hour() as u32,
            t.day() as u32,
            t.month() as u32,
            t.weekday().to_sunday_zero_offset() as u32,
        ) {
            return true;
        }
    }
    false
}

/// A 5-field cron expression (`*`, lists, ranges, steps) or an `@` macro.
#[derive(Debug, Clone, PartialEq)]
pub struct Cron {
    fields: [Vec<u32>; 5],
}

impl Cron {
    pub fn parse(text: &str) -> Option<Cron> {
        let text = match text.trim() {
            "@yearly" | "@annually" => "0 0 1 1 *",
            "@monthly" => "0 0 1 * *",
            "@weekly" => "0 0 * * 0",
            "@daily" | "@midnight" => "0 0 * * *",
            "@hourly" => "0 * * * *",
            t => t,
        };
        let parts: Vec<&str> = text.split_whitespace().collect();
        if parts.len() != 5 {
            return None;
        }
        let ranges = [(0, 59), (0, 23), (1, 31), (1, 12), (0, 7)];
        let mut fields: [Vec<u32>; 5] = Default::default();
        for (i, part) in parts.iter().enumerate() {
            let (lo, hi) = ranges[i];
            for item in part.split(',') {
                let (range, step) = match item.split_once('/') {
                    Some((r, s)) => (r, s.parse::<u32>().ok().filter(|s| *s > 0)?),
                    None => (item, 1),
                };
                let (a, b) = if range == "*" {
                    (lo, hi)
                } else if let Some((a, b)) = range.split_once('-') {
                    (a.parse().ok()?, b.parse().ok()?)
                } else {
                    let v: u32 = range.parse().ok()?;
                    (v, if item.contains('/') { hi } else { v })
                };
                if a < lo || b > hi || a > b {
                    return None;
                }
                fields[i].extend((a..=b).step_by(step as usize));
            }
        }
        if fields[4].contains(&7) {
            fields[4].push(0);
        }
        Some(Cron { fields })
    }

    pub fn matches(&self, minute: u32, hour: u32, dom: u32, month: u32, dow: u32) -> bool {
        self.fields[0].contains(&minute)
            && self.fields[1].contains(&hour)
            && self.fields[2].contains(&dom)
            && self.fields[3].contains(&month)
            && self.fields[4].contains(&dow)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pool(budgets: Vec<Budget>) -> NodePool {
        let mut p = NodePool::new("np", Default::default());
        p.spec.disruption.budgets = budgets;
        p
    }

    #[test]
    fn counts_percentages_reasons_and_schedules() {
        let now: Timestamp = "2026-01-05T09:30:00Z".parse().expect("ts");
        assert_eq!(allowed(&pool(vec![]), "Empty", 20, now), 2, "default 10%");
        let b = |nodes: &str,
                 reasons: Option<Vec<&str>>,
                 sched: Option<&str>,
                 dur: Option<&str>| Budget {
            nodes: nodes.into(),
            reasons: reasons.map(|r| r.into_iter().map(str::to_string).collect()),
            schedule: sched.map(str::to_string),
            duration: dur.map(str::to_string),
        };
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
        assert!(Cron::parse("*/15 * * * *").is_some());
        assert!(Cron::parse("61 * * * *").is_none());
    }
}
