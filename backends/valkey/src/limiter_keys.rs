//! The keys of the limiters a store used lately, and what this process last told the server
//! about each: when it last had their time to live renewed, and when it last had a slot
//! limiter's statistics written.
//!
//! Why the worker keeps this: a limiter's keys must not expire while the limiter is in use,
//! and reading their TTL on every decision was one command of the five a rate decision cost on
//! the hot path. Instead each process asks for a renewal (`'1'` in the script's arguments)
//! once every `RENEW_EVERY` per limiter, far inside the shortest TTL a limiter key has (61 s):
//! a key any worker uses keeps living, and a key no worker uses expires as before. The scripts
//! give a key they create its TTL at once (they see it is new), so a key made between two
//! renewals is never left without one.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ferriq::wire::TaskId;
use fred::types::Key;

/// How often one process asks for a limiter's keys' TTLs to be renewed, and for a slot
/// limiter's statistics to be written (besides one release in four).
pub(crate) const RENEW_EVERY: Duration = Duration::from_secs(10);

/// One limiter's three keys (rate: started, turns, reserved; concurrency: held, waiting,
/// statistics) and this process's last renewal and statistics write.
pub(crate) struct LimiterKeys {
    /// Shared buffers: a decision's arguments take them without a copy.
    pub(crate) keys: [Key; 3],
    epoch: Instant,
    /// Milliseconds since `epoch` + 1 of the last renewal asked for (0: never).
    renewed: AtomicU64,
    /// Likewise, of the last statistics write asked for.
    noted: AtomicU64,
}

impl LimiterKeys {
    fn new(keys: [String; 3]) -> Self {
        Self {
            keys: keys.map(Key::from),
            epoch: Instant::now(),
            renewed: AtomicU64::new(0),
            noted: AtomicU64::new(0),
        }
    }

    /// Key `i` as text (for the rarely run scripts).
    pub(crate) fn text(&self, i: usize) -> String {
        self.keys[i].as_str_lossy().into_owned()
    }

    /// Whether this decision should renew the keys' TTLs (`RENEW_EVERY` has passed since this
    /// process last asked; the first decision always does). Counted as asked once it says so.
    pub(crate) fn renew_due(&self) -> bool {
        self.take(&self.renewed)
    }

    /// Whether this release should write the limiter's statistics whatever its sample says
    /// (the first release this process makes, then every `RENEW_EVERY`): they tell RENEW a
    /// released slot from one lost with the store's data.
    pub(crate) fn note_due(&self) -> bool {
        self.take(&self.noted)
    }

    fn take(&self, last: &AtomicU64) -> bool {
        let now = u64::try_from(self.epoch.elapsed().as_millis())
            .unwrap_or(u64::MAX - 1)
            .saturating_add(1);
        let seen = last.load(Ordering::Relaxed);
        let every = u64::try_from(RENEW_EVERY.as_millis()).unwrap_or(u64::MAX);
        if seen != 0 && now.saturating_sub(seen) < every {
            return false;
        }
        // Of concurrent decisions, one asks.
        last.compare_exchange(seen, now, Ordering::Relaxed, Ordering::Relaxed)
            .is_ok()
    }
}

/// The limiters used lately, by name, one map per kind: a digest and three `format!`s per
/// decision otherwise (bounded: cleared when it holds too many).
#[derive(Default)]
pub(crate) struct KeyCache {
    rates: Mutex<HashMap<String, Arc<LimiterKeys>>>,
    slots: Mutex<HashMap<String, Arc<LimiterKeys>>>,
}

impl KeyCache {
    const MAX: usize = 10_000;

    fn get(
        map: &Mutex<HashMap<String, Arc<LimiterKeys>>>,
        limiter: &str,
        make: impl FnOnce() -> [String; 3],
    ) -> Arc<LimiterKeys> {
        let mut cache = map.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(keys) = cache.get(limiter) {
            return Arc::clone(keys);
        }
        if cache.len() >= Self::MAX {
            cache.clear();
        }
        let keys = Arc::new(LimiterKeys::new(make()));
        cache.insert(limiter.to_owned(), Arc::clone(&keys));
        keys
    }

    /// A rate limiter's keys (started, turns, reserved), hash-tagged on a digest of its name
    /// (a name may hold any character).
    pub(crate) fn rate(&self, prefix: &str, limiter: &str) -> Arc<LimiterKeys> {
        Self::get(&self.rates, limiter, || {
            let tag = TaskId::derived(&["ferriq-rate", limiter]);
            ["started", "turns", "reserved"].map(|part| format!("{prefix}:rate:{{{tag}}}:{part}"))
        })
    }

    /// A concurrency limiter's keys (held, waiting, statistics), likewise.
    pub(crate) fn slots(&self, prefix: &str, limiter: &str) -> Arc<LimiterKeys> {
        Self::get(&self.slots, limiter, || {
            let tag = TaskId::derived(&["ferriq-slots", limiter]);
            ["held", "waiting", "stats"].map(|part| format!("{prefix}:slots:{{{tag}}}:{part}"))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_renewal_is_asked_for_first_then_once_per_period() {
        let cache = KeyCache::default();
        let keys = cache.rate("p", "api");
        assert!(keys.renew_due(), "the first decision renews");
        assert!(!keys.renew_due(), "the next one, at once after, does not");
        assert!(keys.note_due(), "statistics are a timer of their own");
        assert!(!keys.note_due());
        // The cache hands out the same entry, so the timer is per limiter, not per decision.
        assert!(!cache.rate("p", "api").renew_due());
        assert!(cache.rate("p", "other").renew_due());
        // A period later it is due again (an entry made a period ago, renewed at its start).
        let Some(epoch) = Instant::now().checked_sub(RENEW_EVERY + Duration::from_millis(5)) else {
            return; // a clock younger than the period: nothing to age the entry with
        };
        let aged = LimiterKeys {
            epoch,
            ..LimiterKeys::new([0, 1, 2].map(|i| keys.text(i)))
        };
        aged.renewed.store(1, Ordering::Relaxed);
        assert!(aged.renew_due(), "due again once RENEW_EVERY has passed");
        assert!(!aged.renew_due());
    }

    #[test]
    fn keys_are_hash_tagged_per_limiter_and_kind() {
        let cache = KeyCache::default();
        let rate = cache.rate("p", "api");
        let slots = cache.slots("p", "api");
        let (started, stats) = (rate.text(0), slots.text(2));
        assert!(started.starts_with("p:rate:{") && started.ends_with("}:started"));
        assert!(stats.starts_with("p:slots:{") && stats.ends_with("}:stats"));
        let tag = |k: &str| k.split(['{', '}']).nth(1).map(str::to_owned);
        assert_eq!(
            tag(&started),
            tag(&rate.text(2)),
            "one slot for a limiter's keys"
        );
        assert_ne!(tag(&started), tag(&slots.text(0)));
    }
}
