//! The wall clock that due times, deadlines and schedules are read from.
//!
//! Production code reads the system clock. Tests swap in [`Clock::following_tokio`], whose
//! wall time advances with tokio's (pausable) clock, so a 30-day delay runs in milliseconds
//! under `tokio::time::pause`; and [`Clock::offset`] skews a clock to test what two machines
//! whose clocks disagree do.

use std::fmt;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tokio::time::Instant;

/// A wall clock, in unix seconds. Cheap to copy.
///
/// ```
/// use ferriq::clock::Clock;
/// let system = Clock::system();
/// let ahead = system.offset(5.0);
/// assert!(ahead.now_unix() - system.now_unix() > 4.9);
/// ```
#[derive(Clone, Copy)]
pub struct Clock {
    source: Source,
    offset_secs: f64,
}

#[derive(Clone, Copy)]
enum Source {
    System,
    Tokio { base_unix: f64, base: Instant },
}

impl Clock {
    /// The system clock.
    pub fn system() -> Self {
        Clock {
            source: Source::System,
            offset_secs: 0.0,
        }
    }

    /// A clock that starts at the system time now and advances with tokio's clock: paused
    /// time (`tokio::time::pause`, `advance`) moves it too. For tests.
    pub fn following_tokio() -> Self {
        Clock {
            source: Source::Tokio {
                base_unix: system_unix(),
                base: Instant::now(),
            },
            offset_secs: 0.0,
        }
    }

    /// This clock, `secs` ahead (negative: behind). For tests of skewed machines.
    pub fn offset(self, secs: f64) -> Self {
        Clock {
            offset_secs: self.offset_secs + secs,
            ..self
        }
    }

    /// Unix seconds now.
    pub fn now_unix(&self) -> f64 {
        let base = match self.source {
            Source::System => system_unix(),
            Source::Tokio { base_unix, base } => base_unix + base.elapsed().as_secs_f64(),
        };
        base + self.offset_secs
    }

    /// Unix milliseconds now.
    pub fn now_unix_ms(&self) -> u64 {
        unix_ms(self.now_unix())
    }

    /// How long from now until `unix` (zero when it has passed).
    pub fn until(&self, unix: f64) -> Duration {
        let left = unix - self.now_unix();
        if left.is_finite() && left > 0.0 {
            Duration::from_secs_f64(left.min(1e12))
        } else {
            Duration::ZERO
        }
    }
}

impl Default for Clock {
    fn default() -> Self {
        Clock::system()
    }
}

impl fmt::Debug for Clock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let source = match self.source {
            Source::System => "system",
            Source::Tokio { .. } => "following tokio",
        };
        f.debug_struct("Clock")
            .field("source", &source)
            .field("offset_secs", &self.offset_secs)
            .finish()
    }
}

/// Unix milliseconds of a reading in unix seconds (zero before the epoch).
pub(crate) fn unix_ms(unix: f64) -> u64 {
    (unix * 1000.0).max(0.0) as u64
}

fn system_unix() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_tokio_clock_follows_paused_time() {
        let clock = Clock::following_tokio();
        let start = clock.now_unix();
        tokio::time::advance(Duration::from_secs(30 * 86_400)).await;
        let moved = clock.now_unix() - start;
        assert!((moved - 30.0 * 86_400.0).abs() < 1.0, "{moved}");
        assert_eq!(clock.until(start - 1.0), Duration::ZERO);
        assert!(clock.until(clock.now_unix() + 10.0) > Duration::from_secs(9));
    }
}
