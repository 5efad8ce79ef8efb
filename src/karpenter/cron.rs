//! Disruption budget schedules as core reads them (S59): `cron.ParseStandard` of
//! robfig/cron v3 in UTC, and a budget active while the schedule's next hit after
//! `now - duration` is not after `now`.
//!
//! robfig's semantics, kept here: five fields (minute, hour, day of month, month, day of
//! week) or a descriptor (`@yearly`/`@annually`, `@monthly`, `@weekly`, `@daily`/`@midnight`,
//! `@hourly`); lists, ranges, steps (`N/s` is `N-max/s`), `*` and `?`; month names `JAN`–`DEC`
//! and day names `SUN`–`SAT` in any case; day of week 0–6 (7 is out of range). When both day
//! fields are restricted a day matches either (day of month OR day of week); when one of them
//! is `*` or `?` (without a step above 1) both must match. A schedule that never fires within
//! five years counts, as robfig's zero time does for core, as always active.
//!
//! Why not the `croner` crate: it gives OR of the day fields and names, but accepts what
//! robfig rejects (7 for Sunday, `FRI-SUN`, `L`, `W`, `#`, six and seven fields), rejects what
//! robfig accepts (`@midnight`, `5/15`), and treats `*/1` and `1,*` as restricted; a budget
//! must be active exactly when core's is, so the parser is robfig's rules written out.

use jiff::civil::{Date, DateTime};
use jiff::tz::TimeZone;
use jiff::{Timestamp, ToSpan};

/// robfig's marker of a field written as `*` or `?`.
const STAR: u64 = 1 << 63;

/// A parsed schedule: one bit per allowed value of each field.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Schedule {
    minute: u64,
    hour: u64,
    dom: u64,
    month: u64,
    dow: u64,
}

struct Bounds {
    min: u32,
    max: u32,
    names: &'static [&'static str],
}

const MINUTES: Bounds = Bounds {
    min: 0,
    max: 59,
    names: &[],
};
const HOURS: Bounds = Bounds {
    min: 0,
    max: 23,
    names: &[],
};
const DOM: Bounds = Bounds {
    min: 1,
    max: 31,
    names: &[],
};
const MONTHS: Bounds = Bounds {
    min: 1,
    max: 12,
    names: &[
        "jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec",
    ],
};
const DOW: Bounds = Bounds {
    min: 0,
    max: 6,
    names: &["sun", "mon", "tue", "wed", "thu", "fri", "sat"],
};

fn bits(min: u32, max: u32, step: u32) -> u64 {
    let mut b = 0;
    let mut v = min;
    while v <= max {
        b |= 1 << v;
        v += step;
    }
    b
}

fn all(r: &Bounds) -> u64 {
    bits(r.min, r.max, 1) | STAR
}

/// Go's `strconv.Atoi` for what a cron field can hold, negatives refused as robfig does.
fn number(s: &str) -> Result<u32, String> {
    let digits = s.strip_prefix('+').unwrap_or(s);
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return Err(format!("failed to parse int from {s}"));
    }
    digits
        .parse()
        .map_err(|_| format!("failed to parse int from {s}"))
}

fn number_or_name(s: &str, r: &Bounds) -> Result<u32, String> {
    let lower = s.to_ascii_lowercase();
    if let Some(i) = r.names.iter().position(|n| *n == lower) {
        // Month names count from 1, day names from 0.
        return Ok(i as u32 + r.min);
    }
    number(s)
}

/// robfig's `getRange`: one comma-separated part of a field.
fn range(expr: &str, r: &Bounds) -> Result<u64, String> {
    let range_and_step: Vec<&str> = expr.split('/').collect();
    let low_high: Vec<&str> = range_and_step[0].split('-').collect();
    let single = low_high.len() == 1;
    let mut extra = 0;
    let (start, mut end) = if low_high[0] == "*" || low_high[0] == "?" {
        extra = STAR;
        (r.min, r.max)
    } else {
        let start = number_or_name(low_high[0], r)?;
        let end = match low_high.len() {
            1 => start,
            2 => number_or_name(low_high[1], r)?,
            _ => return Err(format!("too many hyphens: {expr}")),
        };
        (start, end)
    };
    let step = match range_and_step.len() {
        1 => 1,
        2 => {
            let step = number(range_and_step[1])?;
            // "N/step" is "N-max/step".
            if single {
                end = r.max;
            }
            if step > 1 {
                extra = 0;
            }
            step
        }
        _ => return Err(format!("too many slashes: {expr}")),
    };
    if start < r.min {
        return Err(format!(
            "beginning of range ({start}) below minimum ({}): {expr}",
            r.min
        ));
    }
    if end > r.max {
        return Err(format!(
            "end of range ({end}) above maximum ({}): {expr}",
            r.max
        ));
    }
    if start > end {
        return Err(format!(
            "beginning of range ({start}) beyond end of range ({end}): {expr}"
        ));
    }
    if step == 0 {
        return Err(format!("step of range should be a positive number: {expr}"));
    }
    Ok(bits(start, end, step) | extra)
}

fn field(text: &str, r: &Bounds) -> Result<u64, String> {
    // Go's strings.FieldsFunc: empty parts are dropped.
    text.split(',')
        .filter(|p| !p.is_empty())
        .try_fold(0, |acc, part| Ok(acc | range(part, r)?))
}

impl Schedule {
    /// `cron.ParseStandard` (robfig/cron v3). The error says what is wrong, in robfig's words.
    pub fn parse(spec: &str) -> Result<Schedule, String> {
        let spec = spec.trim();
        if spec.is_empty() {
            return Err("empty spec string".into());
        }
        if spec.starts_with("TZ=") || spec.starts_with("CRON_TZ=") {
            // Core puts `TZ=UTC ` in front: a second time zone is a sixth field there.
            return Err("a time zone is not allowed (budget schedules are in UTC)".into());
        }
        if let Some(d) = spec.strip_prefix('@') {
            let min = |r: &Bounds| 1u64 << r.min;
            let s = |minute, hour, dom, month, dow| Schedule {
                minute,
                hour,
                dom,
                month,
                dow,
            };
            return match d {
                "yearly" | "annually" => Ok(s(
                    min(&MINUTES),
                    min(&HOURS),
                    min(&DOM),
                    min(&MONTHS),
                    all(&DOW),
                )),
                "monthly" => Ok(s(
                    min(&MINUTES),
                    min(&HOURS),
                    min(&DOM),
                    all(&MONTHS),
                    all(&DOW),
                )),
                "weekly" => Ok(s(
                    min(&MINUTES),
                    min(&HOURS),
                    all(&DOM),
                    all(&MONTHS),
                    min(&DOW),
                )),
                "daily" | "midnight" => Ok(s(
                    min(&MINUTES),
                    min(&HOURS),
                    all(&DOM),
                    all(&MONTHS),
                    all(&DOW),
                )),
                "hourly" => Ok(s(
                    min(&MINUTES),
                    all(&HOURS),
                    all(&DOM),
                    all(&MONTHS),
                    all(&DOW),
                )),
                _ => Err(format!("unrecognized descriptor: {spec}")),
            };
        }
        let fields: Vec<&str> = spec.split_whitespace().collect();
        if fields.len() != 5 {
            return Err(format!(
                "expected exactly 5 fields, found {}: {spec}",
                fields.len()
            ));
        }
        Ok(Schedule {
            minute: field(fields[0], &MINUTES)?,
            hour: field(fields[1], &HOURS)?,
            dom: field(fields[2], &DOM)?,
            month: field(fields[3], &MONTHS)?,
            dow: field(fields[4], &DOW)?,
        })
    }

    /// robfig's `dayMatches`: with a `*` in either day field both must match, else either.
    fn day_matches(&self, d: Date) -> bool {
        let dom = self.dom & (1 << d.day()) != 0;
        let dow = self.dow & (1 << d.weekday().to_sunday_zero_offset()) != 0;
        if self.dom & STAR != 0 || self.dow & STAR != 0 {
            dom && dow
        } else {
            dom || dow
        }
    }

    /// robfig's `Next`: the first hit (a whole minute, UTC) strictly after `t`'s second, or
    /// None when there is none within five years (robfig's zero time).
    pub fn next_after(&self, t: Timestamp) -> Option<Timestamp> {
        let start = Timestamp::from_second(t.as_second().checked_add(1)?).ok()?;
        let dt = start.to_zoned(TimeZone::UTC).datetime();
        // The second field is 0: the next whole minute at or after `start`.
        let (mut date, mut hour, mut minute) = (dt.date(), dt.hour(), dt.minute());
        if dt.second() != 0 {
            minute += 1;
        }
        let limit = date.year() + 5;
        loop {
            if minute == 60 {
                minute = 0;
                hour += 1;
            }
            if hour == 24 {
                hour = 0;
                date = date.tomorrow().ok()?;
            }
            if date.year() > limit {
                return None;
            }
            if self.month & (1 << date.month()) == 0 {
                date = date.first_of_month().checked_add(1.month()).ok()?;
                (hour, minute) = (0, 0);
            } else if !self.day_matches(date) {
                date = date.tomorrow().ok()?;
                (hour, minute) = (0, 0);
            } else if self.hour & (1 << hour) == 0 {
                hour += 1;
                minute = 0;
            } else if self.minute & (1 << minute) == 0 {
                minute += 1;
            } else {
                let at = DateTime::from_parts(date, jiff::civil::time(hour, minute, 0, 0));
                return at.to_zoned(TimeZone::UTC).ok().map(|z| z.timestamp());
            }
        }
    }

    /// Core's `Budget.IsActive`: a hit in `(now - window, now]` (or none for five years).
    pub fn active(&self, now: Timestamp, window: std::time::Duration) -> bool {
        let window = jiff::SignedDuration::try_from(window).unwrap_or(jiff::SignedDuration::MAX);
        let checkpoint = now.checked_sub(window).unwrap_or(Timestamp::MIN);
        self.next_after(checkpoint).is_none_or(|hit| hit <= now)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(s: &str) -> Timestamp {
        s.parse().expect("timestamp")
    }

    fn next(spec: &str, from: &str) -> Option<String> {
        Schedule::parse(spec)
            .expect(spec)
            .next_after(at(from))
            .map(|t| t.to_string())
    }

    /// S59: day of month OR day of week when both are restricted, AND when one is `*`.
    #[test]
    fn s59_day_of_month_or_day_of_week_as_robfig() {
        // 2026-01-05 is a Monday. "on the 10th, or on Fridays": Friday the 9th comes first.
        assert_eq!(
            next("0 9 10 * FRI", "2026-01-05T10:00:00Z").as_deref(),
            Some("2026-01-09T09:00:00Z")
        );
        // With `*` in the day of month only the day of week counts.
        assert_eq!(
            next("0 9 * * FRI", "2026-01-05T10:00:00Z").as_deref(),
            Some("2026-01-09T09:00:00Z")
        );
        // `*/1` keeps the star; `*/2` is a restriction: "odd days, or Mondays".
        assert_eq!(
            next("0 0 */2 * MON", "2026-01-05T10:00:00Z").as_deref(),
            Some("2026-01-07T00:00:00Z")
        );
        assert_eq!(
            next("0 0 */1 * MON", "2026-01-05T10:00:00Z").as_deref(),
            Some("2026-01-12T00:00:00Z")
        );
    }

    #[test]
    fn s59_names_descriptors_and_what_robfig_rejects() {
        assert_eq!(
            next("30 2 * jan-Mar mon-fri", "2026-03-31T03:00:00Z").as_deref(),
            Some("2027-01-01T02:30:00Z")
        );
        assert_eq!(
            next("@midnight", "2026-01-05T10:00:00Z").as_deref(),
            Some("2026-01-06T00:00:00Z")
        );
        assert_eq!(
            next("@weekly", "2026-01-05T10:00:00Z").as_deref(),
            Some("2026-01-11T00:00:00Z")
        );
        assert_eq!(
            next("@monthly", "2026-01-05T10:00:00Z").as_deref(),
            Some("2026-02-01T00:00:00Z")
        );
        // "N/step" is "N-max/step".
        assert_eq!(
            next("5/20 * * * *", "2026-01-05T10:26:00Z").as_deref(),
            Some("2026-01-05T10:45:00Z")
        );
        // A hit exactly at `t` is not after it; seconds round up to the next minute.
        assert_eq!(
            next("* * * * *", "2026-01-05T10:00:00Z").as_deref(),
            Some("2026-01-05T10:01:00Z")
        );
        assert_eq!(
            next("* * * * *", "2026-01-05T10:00:30.5Z").as_deref(),
            Some("2026-01-05T10:01:00Z")
        );
        for bad in [
            "0 0 * * 7",
            "0 0 * * FRI-SUN",
            "0 0 L * *",
            "0 0 * * 1#2",
            "0 0 0 * * *",
            "0 * * *",
            "61 * * * *",
            "@every 1h",
            "@DAILY",
            "TZ=Europe/Berlin 0 9 * * *",
            "*/0 * * * *",
            "",
        ] {
            assert!(Schedule::parse(bad).is_err(), "{bad:?} parsed");
        }
    }

    /// Active while a hit lies in `(now - duration, now]`; a schedule that never fires is
    /// always active, as core's zero time.
    #[test]
    fn s59_active_window_as_core() {
        let nine = Schedule::parse("0 9 * * *").expect("parse");
        let hour = std::time::Duration::from_secs(3600);
        assert!(nine.active(at("2026-01-05T09:00:00Z"), hour));
        assert!(nine.active(at("2026-01-05T09:59:59Z"), hour));
        assert!(!nine.active(at("2026-01-05T10:00:00Z"), hour));
        assert!(!nine.active(at("2026-01-05T08:59:59Z"), hour));
        assert!(!nine.active(at("2026-01-05T09:00:00Z"), std::time::Duration::ZERO));
        let never = Schedule::parse("0 0 30 2 *").expect("parse");
        assert!(never.active(at("2026-01-05T09:00:00Z"), hour));
    }
}
