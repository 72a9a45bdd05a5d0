//! Cron expressions with seconds, and their next times in a time zone, DST-correct.
//!
//! `sec min hour day-of-month month day-of-week` (a 5-field expression has seconds `0`):
//! numbers, `*` (also `?`), ranges `a-b`, steps `*/n`, `a/n`, `a-b/n`, lists `a,b`, month and
//! weekday names (`JAN`, `MON`; Sunday is 0 or 7), and in day-of-month `L` (last day), `L-n`,
//! `nW` (the weekday nearest day `n`) and `LW`; in day-of-week `dL` (the last such weekday of
//! the month) and `d#n` (the n-th). When both day fields are restricted a day matches either
//! (Vixie cron's rule).
//!
//! Time zones: every matching *local* time fires once. A local time the clocks skip (spring
//! forward) fires at the instant the clocks jump (03:00 for a 02:30 schedule in New York); a
//! local time that happens twice (fall back) fires at its first occurrence only.
//!
//! Parsing needs nothing else (the `#[ferriq::task]` macro checks expressions with it when it
//! expands); the `next` feature adds [`Cron::next_after`], on `jiff`.
#![warn(missing_docs)]

use std::fmt;

#[cfg(feature = "next")]
use jiff::civil::{Date, DateTime};
#[cfg(feature = "next")]
use jiff::tz::{AmbiguousOffset, TimeZone};
#[cfg(feature = "next")]
use jiff::Timestamp;
use thiserror::Error;

/// Why a cron expression was refused.
#[derive(Debug, Clone, Error, PartialEq, Eq)]
#[error("cron expression {expr:?}: {reason}")]
pub struct CronError {
    expr: String,
    reason: String,
}

/// A parsed cron expression.
///
/// ```
/// use ferriq_cron::Cron;
/// let every_five = Cron::parse("0 */5 * * * *").unwrap();
/// assert!(Cron::parse("0 0 25 * * *").is_err()); // no hour 25
/// # let _ = every_five;
/// ```
#[derive(Clone, PartialEq, Eq)]
#[cfg_attr(not(feature = "next"), allow(dead_code))]
pub struct Cron {
    source: String,
    seconds: u64,
    minutes: u64,
    hours: u32,
    months: u16,
    dom: Days,
    dow: Weekdays,
}

#[derive(Clone, PartialEq, Eq, Default)]
#[cfg_attr(not(feature = "next"), allow(dead_code))]
struct Days {
    /// Bit `d` for day `d` (1–31).
    mask: u32,
    /// `L-n`: days before the last (0 for `L`).
    from_last: Vec<u8>,
    /// `nW`: the weekday nearest day `n`.
    nearest_weekday: Vec<u8>,
    /// `LW`.
    last_weekday: bool,
    restricted: bool,
}

#[derive(Clone, PartialEq, Eq, Default)]
#[cfg_attr(not(feature = "next"), allow(dead_code))]
struct Weekdays {
    /// Bit `w` for weekday `w` (0 = Sunday).
    mask: u8,
    /// `w#n`.
    nth: Vec<(u8, u8)>,
    /// `wL`.
    last: Vec<u8>,
    restricted: bool,
}

const MONTHS: [&str; 12] = [
    "JAN", "FEB", "MAR", "APR", "MAY", "JUN", "JUL", "AUG", "SEP", "OCT", "NOV", "DEC",
];
const WEEKDAYS: [&str; 7] = ["SUN", "MON", "TUE", "WED", "THU", "FRI", "SAT"];

impl Cron {
    /// Parses an expression of 6 fields (or 5, without seconds).
    pub fn parse(expr: &str) -> Result<Cron, CronError> {
        let fail = |reason: String| CronError {
            expr: expr.to_owned(),
            reason,
        };
        let fields: Vec<&str> = expr.split_whitespace().collect();
        let fields: Vec<&str> = match fields.len() {
            6 => fields,
            5 => std::iter::once("0").chain(fields).collect(),
            n => {
                return Err(fail(format!(
                    "{n} fields; expected 6 (sec min hour day month weekday) or 5"
                )))
            }
        };
        let seconds = mask(fields[0], 0, 59, &[]).map_err(|e| fail(format!("seconds: {e}")))?;
        let minutes = mask(fields[1], 0, 59, &[]).map_err(|e| fail(format!("minutes: {e}")))?;
        let hours = mask(fields[2], 0, 23, &[]).map_err(|e| fail(format!("hours: {e}")))? as u32;
        let months =
            (mask(fields[4], 1, 12, &MONTHS).map_err(|e| fail(format!("month: {e}")))?) as u16;
        let dom = days(fields[3]).map_err(|e| fail(format!("day of month: {e}")))?;
        let dow = weekdays(fields[5]).map_err(|e| fail(format!("day of week: {e}")))?;
        Ok(Cron {
            source: expr.trim().to_owned(),
            seconds,
            minutes,
            hours,
            months,
            dom,
            dow,
        })
    }

    #[cfg(feature = "next")]
    /// The next time after `after` (strictly) that this expression matches in `tz`; `None`
    /// when none comes within 100 years (`0 0 0 30 2 *`).
    pub fn next_after(&self, after: Timestamp, tz: &TimeZone) -> Option<Timestamp> {
        let start = tz.to_datetime(after);
        let last_year = start.year().saturating_add(100).min(9999);
        let mut date = start.date();
        let mut first = true;
        while date.year() <= last_year {
            if self.months & (1 << date.month()) == 0 {
                date = first_of_next_month(date)?;
                first = false;
                continue;
            }
            if self.day_matches(date) {
                if let Some(t) = self.first_time_on(date, first.then_some(start), after, tz) {
                    return Some(t);
                }
            }
            date = date.tomorrow().ok()?;
            first = false;
        }
        None
    }

    #[cfg(feature = "next")]
    /// The first matching time on `date` mapping to an instant after `after`; on the start
    /// date, local times up to `start` (inclusive) are skipped.
    fn first_time_on(
        &self,
        date: Date,
        start: Option<DateTime>,
        after: Timestamp,
        tz: &TimeZone,
    ) -> Option<Timestamp> {
        for h in bits(u64::from(self.hours), 23) {
            if start.is_some_and(|s| i64::from(h) < i64::from(s.hour())) {
                continue;
            }
            for m in bits(self.minutes, 59) {
                if start.is_some_and(|s| {
                    (i64::from(h), i64::from(m)) < (i64::from(s.hour()), i64::from(s.minute()))
                }) {
                    continue;
                }
                for sec in bits(self.seconds, 59) {
                    if start.is_some_and(|s| {
                        (i64::from(h), i64::from(m), i64::from(sec))
                            <= (
                                i64::from(s.hour()),
                                i64::from(s.minute()),
                                i64::from(s.second()),
                            )
                    }) {
                        continue;
                    }
                    let local = date.at(h as i8, m as i8, sec as i8, 0);
                    if let Some(t) = instant_of(local, tz) {
                        if t > after {
                            return Some(t);
                        }
                    }
                }
            }
        }
        None
    }

    #[cfg(feature = "next")]
    fn day_matches(&self, date: Date) -> bool {
        let (dom, dow) = (self.dom_matches(date), self.dow_matches(date));
        match (self.dom.restricted, self.dow.restricted) {
            (true, true) => dom || dow,
            (true, false) => dom,
            (false, true) => dow,
            (false, false) => true,
        }
    }

    #[cfg(feature = "next")]
    fn dom_matches(&self, date: Date) -> bool {
        let d = date.day() as u8;
        let last = date.days_in_month() as u8;
        if self.dom.mask & (1 << d) != 0 {
            return true;
        }
        if self
            .dom
            .from_last
            .iter()
            .any(|n| last.checked_sub(*n) == Some(d))
        {
            return true;
        }
        if self
            .dom
            .nearest_weekday
            .iter()
            .any(|n| nearest_weekday(date, (*n).min(last)) == d)
        {
            return true;
        }
        self.dom.last_weekday && nearest_weekday(date, last) == d
    }

    #[cfg(feature = "next")]
    fn dow_matches(&self, date: Date) -> bool {
        let w = date.weekday().to_sunday_zero_offset() as u8;
        let d = date.day() as u8;
        let last = date.days_in_month() as u8;
        self.dow.mask & (1 << w) != 0
            || self
                .dow
                .nth
                .iter()
                .any(|(wd, n)| *wd == w && (d - 1) / 7 + 1 == *n)
            || self.dow.last.iter().any(|wd| *wd == w && d + 7 > last)
    }
}

impl fmt::Display for Cron {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.source)
    }
}

impl fmt::Debug for Cron {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Cron({:?})", self.source)
    }
}

#[cfg(feature = "next")]
/// The instant of a local time: the single one, the first of a repeated one, or — for one the
/// clocks skip — the instant they jump.
fn instant_of(local: DateTime, tz: &TimeZone) -> Option<Timestamp> {
    let ambiguous = tz.to_ambiguous_timestamp(local);
    match ambiguous.offset() {
        AmbiguousOffset::Unambiguous { .. } => ambiguous.unambiguous().ok(),
        AmbiguousOffset::Fold { .. } => ambiguous.earlier().ok(),
        AmbiguousOffset::Gap { after, .. } => {
            // `local` read with the offset after the gap is just before the jump.
            let before_jump = after.to_timestamp(local).ok()?;
            Some(tz.following(before_jump).next()?.timestamp())
        }
    }
}

#[cfg(feature = "next")]
/// The weekday nearest day `n` of `date`'s month, without leaving the month.
fn nearest_weekday(date: Date, n: u8) -> u8 {
    let last = date.days_in_month() as u8;
    let Ok(day) = Date::new(date.year(), date.month(), n.clamp(1, last) as i8) else {
        return 0;
    };
    match day.weekday().to_sunday_zero_offset() {
        6 if n == 1 => 3,        // Saturday the 1st: Monday the 3rd
        6 => n - 1,              // Saturday: Friday
        0 if n == last => n - 2, // Sunday the last: Friday
        0 => n + 1,              // Sunday: Monday
        _ => n,
    }
}

#[cfg(feature = "next")]
fn first_of_next_month(date: Date) -> Option<Date> {
    date.last_of_month().tomorrow().ok()
}

#[cfg(feature = "next")]
fn bits(mask: u64, max: u32) -> impl Iterator<Item = u32> {
    (0..=max).filter(move |b| mask & (1 << b) != 0)
}

fn value(token: &str, names: &[&str], offset: u32) -> Result<u32, String> {
    if let Ok(n) = token.parse::<u32>() {
        return Ok(n);
    }
    let upper = token.to_ascii_uppercase();
    names
        .iter()
        .position(|n| *n == upper)
        .map(|i| i as u32 + offset)
        .ok_or_else(|| format!("{token:?} is not a number or a name"))
}

/// A field of numbers, ranges, steps and names as a bit mask over `min..=max`.
fn mask(field: &str, min: u32, max: u32, names: &[&str]) -> Result<u64, String> {
    let mut out = 0u64;
    for item in field.split(',') {
        let (range, step) = match item.split_once('/') {
            Some((r, s)) => (
                r,
                s.parse::<u32>()
                    .ok()
                    .filter(|s| *s > 0)
                    .ok_or_else(|| format!("step {s:?} must be a whole number above 0"))?,
            ),
            None => (item, 1),
        };
        let (lo, hi) = if range == "*" || range == "?" {
            (min, max)
        } else if let Some((a, b)) = range.split_once('-') {
            (value(a, names, min)?, value(b, names, min)?)
        } else {
            let v = value(range, names, min)?;
            // `a/n` runs from a to the end.
            (v, if step > 1 { max } else { v })
        };
        if lo < min || hi > max || lo > hi {
            return Err(format!("{item:?} is outside {min}-{max}"));
        }
        for v in (lo..=hi).step_by(step as usize) {
            out |= 1 << v;
        }
    }
    Ok(out)
}

fn days(field: &str) -> Result<Days, String> {
    let mut days = Days {
        restricted: field != "*" && field != "?",
        ..Days::default()
    };
    let mut plain = Vec::new();
    for item in field.split(',') {
        let upper = item.to_ascii_uppercase();
        if upper == "L" {
            days.from_last.push(0);
        } else if upper == "LW" {
            days.last_weekday = true;
        } else if let Some(n) = upper.strip_prefix("L-") {
            let n: u8 = n
                .parse()
                .map_err(|_| format!("{item:?}: L-n takes a number"))?;
            if n > 30 {
                return Err(format!("{item:?}: at most L-30"));
            }
            days.from_last.push(n);
        } else if let Some(n) = upper.strip_suffix('W') {
            let n: u8 = n.parse().map_err(|_| format!("{item:?}: nW takes a day"))?;
            if !(1..=31).contains(&n) {
                return Err(format!("{item:?}: the day must be 1-31"));
            }
            days.nearest_weekday.push(n);
        } else {
            plain.push(item);
        }
    }
    if !plain.is_empty() {
        days.mask = mask(&plain.join(","), 1, 31, &[])? as u32;
    }
    Ok(days)
}

fn weekdays(field: &str) -> Result<Weekdays, String> {
    let mut w = Weekdays {
        restricted: field != "*" && field != "?",
        ..Weekdays::default()
    };
    let mut plain = Vec::new();
    let day = |s: &str| -> Result<u8, String> {
        let v = value(s, &WEEKDAYS, 0)?;
        if v > 7 {
            return Err(format!("{s:?}: weekdays are 0-7 (0 and 7 are Sunday)"));
        }
        Ok((v % 7) as u8)
    };
    for item in field.split(',') {
        let upper = item.to_ascii_uppercase();
        if let Some((d, n)) = upper.split_once('#') {
            let n: u8 = n
                .parse()
                .map_err(|_| format!("{item:?}: d#n takes a number"))?;
            if !(1..=5).contains(&n) {
                return Err(format!("{item:?}: the n-th must be 1-5"));
            }
            w.nth.push((day(d)?, n));
        } else if let Some(d) = upper.strip_suffix('L').filter(|d| !d.is_empty()) {
            w.last.push(day(d)?);
        } else {
            plain.push(item);
        }
    }
    if !plain.is_empty() {
        let m = mask(&plain.join(","), 0, 7, &WEEKDAYS)?;
        // 7 is Sunday too.
        w.mask = ((m | (m >> 7)) & 0x7f) as u8;
    }
    Ok(w)
}
