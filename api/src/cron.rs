//! Cron schedules as Kubernetes' CronJob controller reads them (robfig/cron's standard parser):
//! five fields — minute, hour, day of month, month, day of week — each `*` or `?`, numbers,
//! names (`JAN`…`DEC`, `SUN`…`SAT`), ranges, lists and steps; the macros `@yearly`,
//! `@annually`, `@monthly`, `@weekly`, `@daily`, `@midnight`, `@hourly` and `@every DURATION`.
//! When both day fields are restricted, a day matches either (cron's rule). Times are the
//! schedule's time zone's wall clock. Pure.

use jiff::civil::{Date, DateTime, Time};
use jiff::tz::TimeZone;
use jiff::{SignedDuration, Timestamp, Zoned};

/// A parsed schedule.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Schedule {
    Fields {
        minutes: u64,
        hours: u64,
        days: u64,
        months: u64,
        weekdays: u64,
        /// The day-of-month field was `*` (or `?`).
        any_day: bool,
        /// The day-of-week field was `*` (or `?`).
        any_weekday: bool,
    },
    /// `@every DURATION`: a constant interval.
    Every(SignedDuration),
}

const MONTHS: [&str; 12] = ["JAN", "FEB", "MAR", "APR", "MAY", "JUN", "JUL", "AUG", "SEP", "OCT", "NOV", "DEC"];
const DAYS: [&str; 7] = ["SUN", "MON", "TUE", "WED", "THU", "FRI", "SAT"];

/// Parses one field into a bit set of the values it allows (`names` start at `min`).
fn field(text: &str, min: u32, max: u32, names: &[&str], whole: &str) -> Result<(u64, bool), String> {
    let fail = || format!("failed to parse {text}: {whole}");
    let value = |s: &str| -> Result<u32, String> {
        if let Ok(n) = s.parse::<u32>() {
            return if (min..=max).contains(&n) { Ok(n) } else { Err(fail()) };
        }
        names.iter().position(|n| n.eq_ignore_ascii_case(s)).map(|i| i as u32 + min).ok_or_else(fail)
    };
    let mut bits = 0u64;
    let mut star = false;
    for part in text.split(',') {
        let (range, step) = match part.split_once('/') {
            Some((r, s)) => (r, s.parse::<u32>().ok().filter(|s| *s > 0).ok_or_else(fail)?),
            None => (part, 1),
        };
        let (lo, hi) = if range == "*" || range == "?" {
            star = step == 1 && !text.contains(',');
            (min, max)
        } else if let Some((a, b)) = range.split_once('-') {
            (value(a)?, value(b)?)
        } else {
            let v = value(range)?;
            // `5/15`: from 5 to the end by 15.
            (v, if part.contains('/') { max } else { v })
        };
        if lo > hi {
            return Err(fail());
        }
        let mut v = lo;
        while v <= hi {
            bits |= 1 << v;
            v += step;
        }
    }
    Ok((bits, star))
}

/// A Go duration as `@every` takes it (`1h30m`, `90s`, `5m`), at least one second.
fn go_duration(text: &str) -> Option<SignedDuration> {
    let mut total = 0f64;
    let mut rest = text.trim();
    if rest.is_empty() {
        return None;
    }
    while !rest.is_empty() {
        let n = rest.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(rest.len());
        let (num, tail) = rest.split_at(n);
        let num: f64 = num.parse().ok()?;
        let u = tail.find(|c: char| c.is_ascii_digit() || c == '.').unwrap_or(tail.len());
        let (unit, tail) = tail.split_at(u);
        total += num
            * match unit {
                "h" => 3600.0,
                "m" => 60.0,
                "s" => 1.0,
                "ms" => 0.001,
                _ => return None,
            };
        rest = tail;
    }
    (total >= 1.0).then(|| SignedDuration::from_secs(total as i64))
}

impl Schedule {
    /// Parses a schedule; the error is the real controller's text (`expected exactly 5 fields,
    /// found 3: * * *`, `unrecognized descriptor: @sometimes`, `failed to parse …`).
    pub fn parse(text: &str) -> Result<Schedule, String> {
        let s = text.trim();
        if let Some(m) = s.strip_prefix('@') {
            let expanded = match m {
                "yearly" | "annually" => "0 0 1 1 *",
                "monthly" => "0 0 1 * *",
                "weekly" => "0 0 * * 0",
                "daily" | "midnight" => "0 0 * * *",
                "hourly" => "0 * * * *",
                _ => {
                    if let Some(d) = m.strip_prefix("every ") {
                        return go_duration(d)
                            .map(Schedule::Every)
                            .ok_or_else(|| format!("failed to parse duration {s}: {d}"));
                    }
                    return Err(format!("unrecognized descriptor: {s}"));
                }
            };
            return Schedule::parse(expanded);
        }
        let f: Vec<&str> = s.split_whitespace().collect();
        if f.len() != 5 {
            return Err(format!("expected exactly 5 fields, found {}: {s}", f.len()));
        }
        let (minutes, _) = field(f[0], 0, 59, &[], s)?;
        let (hours, _) = field(f[1], 0, 23, &[], s)?;
        let (days, any_day) = field(f[2], 1, 31, &[], s)?;
        let (months, _) = field(f[3], 1, 12, &MONTHS, s)?;
        let (weekdays, any_weekday) = field(f[4], 0, 6, &DAYS, s)?;
        Ok(Schedule::Fields { minutes, hours, days, months, weekdays, any_day, any_weekday })
    }

    /// Whether the schedule fires on `date` (cron's day rule).
    fn day_matches(&self, date: Date) -> bool {
        let Schedule::Fields { days, months, weekdays, any_day, any_weekday, .. } = self else { return false };
        if months & (1 << date.month()) == 0 {
            return false;
        }
        let dom = days & (1 << date.day()) != 0;
        let dow = weekdays & (1 << date.weekday().to_sunday_zero_offset()) != 0;
        if *any_day || *any_weekday {
            dom && dow
        } else {
            dom || dow
        }
    }

    /// The first time after `after` that the schedule fires, in `tz`'s wall clock (None when
    /// it never fires within five years, as `0 0 30 2 *`).
    pub fn next_after(&self, after: Timestamp, tz: &TimeZone) -> Option<Timestamp> {
        let (minutes, hours) = match self {
            Schedule::Every(d) => return after.checked_add(*d).ok(),
            Schedule::Fields { minutes, hours, .. } => (*minutes, *hours),
        };
        let start = after.to_zoned(tz.clone()).datetime();
        // The next whole minute after `after`.
        let mut t = DateTime::from_parts(start.date(), Time::new(start.hour(), start.minute(), 0, 0).ok()?)
            .checked_add(SignedDuration::from_secs(60))
            .ok()?;
        let limit = start.date().checked_add(jiff::Span::new().years(5)).ok()?;
        while t.date() <= limit {
            if !self.day_matches(t.date()) {
                t = t.date().tomorrow().ok()?.to_datetime(Time::midnight());
                continue;
            }
            if hours & (1 << t.hour()) == 0 {
                t = DateTime::from_parts(t.date(), Time::new(t.hour(), 0, 0, 0).ok()?)
                    .checked_add(SignedDuration::from_secs(3600))
                    .ok()?;
                continue;
            }
            if minutes & (1 << t.minute()) == 0 {
                t = t.checked_add(SignedDuration::from_secs(60)).ok()?;
                continue;
            }
            // A wall-clock time a DST change skips is taken as the instant after the gap.
            let z: Zoned = t.to_zoned(tz.clone()).ok()?;
            if z.timestamp() > after {
                return Some(z.timestamp());
            }
            t = t.checked_add(SignedDuration::from_secs(60)).ok()?;
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ts(s: &str) -> Timestamp {
        s.parse().unwrap()
    }

    fn next(s: &str, after: &str) -> Option<String> {
        Schedule::parse(s).unwrap().next_after(ts(after), &TimeZone::UTC).map(|t| t.to_string())
    }

    #[test]
    fn fields_macros_and_errors_read_as_the_controller_reads_them() {
        assert_eq!(next("*/5 * * * *", "2026-11-26T12:03:10Z").as_deref(), Some("2026-11-26T12:05:00Z"));
        assert_eq!(next("*/5 * * * *", "2026-11-26T12:05:00Z").as_deref(), Some("2026-11-26T12:10:00Z"));
        assert_eq!(next("0 3 * * MON-FRI", "2026-11-27T04:00:00Z").as_deref(), Some("2026-11-30T03:00:00Z"));
        assert_eq!(next("15,45 1-5 1 JAN *", "2026-02-01T00:00:00Z").as_deref(), Some("2027-01-01T01:15:00Z"));
        assert_eq!(next("@hourly", "2026-11-26T12:00:00Z").as_deref(), Some("2026-11-26T13:00:00Z"));
        assert_eq!(next("@every 90s", "2026-11-26T12:00:00Z").as_deref(), Some("2026-11-26T12:01:30Z"));
        assert_eq!(next("5/20 * * * *", "2026-11-26T12:26:00Z").as_deref(), Some("2026-11-26T12:45:00Z"));
        // Both day fields restricted: either matches (the 1st, or a Friday).
        assert_eq!(next("0 0 1 * FRI", "2026-11-26T12:00:00Z").as_deref(), Some("2026-11-27T00:00:00Z"));
        assert_eq!(next("0 0 30 2 *", "2026-11-26T12:00:00Z"), None, "February 30th never comes");
        assert_eq!(Schedule::parse("* * *").unwrap_err(), "expected exactly 5 fields, found 3: * * *");
        assert_eq!(Schedule::parse("@sometimes").unwrap_err(), "unrecognized descriptor: @sometimes");
        for bad in ["*/0 * * * *", "60 * * * *", "* * * FOO *", "5-1 * * * *", "@every x"] {
            assert!(Schedule::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn a_time_zone_moves_the_wall_clock() {
        let s = Schedule::parse("0 9 * * *").unwrap();
        // 09:00 in a zone 5 hours behind UTC (fixed: no tz database needed) is 14:00 UTC.
        let tz = TimeZone::fixed(jiff::tz::offset(-5));
        assert_eq!(s.next_after(ts("2026-11-26T12:00:00Z"), &tz).unwrap().to_string(), "2026-11-26T14:00:00Z");
    }
}
