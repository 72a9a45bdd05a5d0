//! A rate: starts allowed per period, as tasks declare it (`rate = "50/s"`).

use std::fmt;
use std::time::Duration;

/// At most `limit` starts in any window of `period`, across every worker: `"50/s"`, `"300/m"`,
/// `"1000/h"`. Starts over it are not run, failed or counted as attempts: they wait, each for
/// its own later turn.
///
/// ```
/// use std::time::Duration;
/// use ferriq::task::Rate;
/// let r = Rate::parse("50/s").unwrap();
/// assert_eq!((r.limit(), r.period()), (50, Duration::from_secs(1)));
/// assert_eq!(Rate::parse("5/10s").unwrap().period(), Duration::from_secs(10));
/// assert_eq!(r.to_string(), "50/s");
/// assert!(Rate::parse("fast").is_err());
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rate {
    limit: u32,
    period: Duration,
}

impl Rate {
    /// `limit` starts per `period` (a limit of 0 reads as 1; a period under a millisecond as a
    /// millisecond).
    pub const fn new(limit: u32, period: Duration) -> Self {
        let limit = if limit == 0 { 1 } else { limit };
        let period = if period.as_millis() == 0 {
            Duration::from_millis(1)
        } else {
            period
        };
        Rate { limit, period }
    }

    /// Reads `N/s`, `N/m`, `N/h` or `N/<count><ms|s|m|h>` (`5/10s`, `10/500ms`): what the
    /// `rate` task option and the `ferriq_rate` label hold.
    pub fn parse(text: &str) -> Result<Rate, String> {
        let bad =
            || format!("rate {text:?}: write starts per period, as 50/s, 300/m, 1000/h or 5/10s");
        let (limit, per) = text.trim().split_once('/').ok_or_else(bad)?;
        let limit: u32 = limit.trim().parse().map_err(|_| bad())?;
        let per = per.trim();
        let unit_at = per.find(|c: char| !c.is_ascii_digit()).ok_or_else(bad)?;
        let count: u64 = match &per[..unit_at] {
            "" => 1,
            digits => digits.parse().map_err(|_| bad())?,
        };
        let unit_ms = match &per[unit_at..] {
            "ms" => 1,
            "s" => 1000,
            "m" => 60_000,
            "h" => 3_600_000,
            _ => return Err(bad()),
        };
        if limit == 0 || count == 0 {
            return Err(bad());
        }
        let ms = count.checked_mul(unit_ms).ok_or_else(bad)?;
        Ok(Rate::new(limit, Duration::from_millis(ms)))
    }

    /// Starts allowed per period.
    pub const fn limit(&self) -> u32 {
        self.limit
    }

    /// The window the limit counts over.
    pub const fn period(&self) -> Duration {
        self.period
    }
}

impl fmt::Display for Rate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.period.subsec_nanos() != 0 {
            // What `parse` reads back (a period of whole milliseconds, as `new` keeps it).
            return write!(f, "{}/{}ms", self.limit, self.period.as_millis());
        }
        let secs = self.period.as_secs();
        let (count, unit) = if secs.is_multiple_of(3600) {
            (secs / 3600, "h")
        } else if secs.is_multiple_of(60) {
            (secs / 60, "m")
        } else {
            (secs, "s")
        };
        match count {
            1 => write!(f, "{}/{unit}", self.limit),
            _ => write!(f, "{}/{count}{unit}", self.limit),
        }
    }
}
