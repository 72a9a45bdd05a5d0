//! What the waiters remember beyond the waits going on: the ids this process enqueued
//! lately, and announcements that came before anyone waited.

use std::collections::HashMap;
use std::sync::Arc;

/// The most recent ids (by a 64-bit hash), forgetting the oldest beyond a bound: memory stays
/// bounded however many tasks a client enqueues, and a forgotten id only costs its waits the
/// task-channel subscription and the first read they made before. Each remembers whether a
/// wait for it has begun and whether its completion was announced before that.
#[derive(Default)]
pub(super) struct RecentIds {
    pub(super) set: std::collections::HashMap<u64, Seen>,
    pub(super) order: std::collections::VecDeque<u64>,
}

/// What this process saw of one task it enqueued.
#[derive(Default, Clone, Copy)]
pub(super) struct Seen {
    /// A wait for it has begun.
    pub(super) waited: bool,
    /// Its completion was announced while nobody waited: kept in `Early`, or forgotten there
    /// (then its first wait must read, not sleep).
    pub(super) announced: bool,
}

/// Completions announced while nobody waited for them, of tasks this process enqueued and
/// has not waited for yet: a client that enqueues a batch and then waits for each finds most
/// of them here instead of reading each back. Bounded in count, bytes and age, the oldest
/// forgotten first (its waiter, told by `RecentIds` that the task was announced, reads it).
#[derive(Default)]
pub(super) struct Early {
    /// Task id → when it was kept (its place in `order`) and the result JSON when the
    /// announcement carried it.
    pub(super) announced: HashMap<String, (u64, Option<Arc<str>>)>,
    /// Kept ids, oldest first, with when and in which place they were kept. A taken id's
    /// place stays until it reaches the front (removing it from the middle would cost a
    /// scan): the place number tells a stale entry from a live one kept again since.
    pub(super) order: std::collections::VecDeque<(u64, std::time::Instant, String)>,
    pub(super) next_place: u64,
    pub(super) bytes: usize,
}

impl Early {
    pub(super) const CAPACITY: usize = 1 << 16;
    pub(super) const MAX_BYTES: usize = 8 << 20;
    /// A wait that comes later than this finds the result by its first re-read.
    pub(super) const MAX_AGE: std::time::Duration = std::time::Duration::from_secs(60);

    pub(super) fn keep(&mut self, id: &str, result: Option<&str>) {
        let result = result.map(Arc::from);
        let added = result.as_ref().map_or(0, |r: &Arc<str>| r.len());
        match self.announced.get_mut(id) {
            Some((_, kept)) => {
                // A later announcement of the same task (a duplicate's `already`) must not
                // drop the result an earlier one carried.
                if result.is_some() {
                    self.bytes -= kept.as_ref().map_or(0, |r| r.len());
                    self.bytes += added;
                    *kept = result;
                }
            }
            None => {
                let place = self.next_place;
                self.next_place += 1;
                self.announced.insert(id.to_owned(), (place, result));
                self.order
                    .push_back((place, std::time::Instant::now(), id.to_owned()));
                self.bytes += id.len() + added;
            }
        }
        self.evict();
    }

    /// Forgets the oldest until the bounds hold again.
    pub(super) fn evict(&mut self) {
        loop {
            let Some((_, kept_at, _)) = self.order.front() else {
                return;
            };
            let over = self.order.len() > Self::CAPACITY
                || self.bytes > Self::MAX_BYTES
                || kept_at.elapsed() > Self::MAX_AGE;
            if !over {
                return;
            }
            let Some((place, _, old)) = self.order.pop_front() else {
                return;
            };
            if self.announced.get(&old).is_some_and(|(p, _)| *p == place) {
                if let Some((_, r)) = self.announced.remove(&old) {
                    self.bytes -= old.len() + r.map_or(0, |r| r.len());
                }
            }
        }
    }

    /// The announcement of `id`, taken out.
    pub(super) fn take(&mut self, id: &str) -> Option<Option<Arc<str>>> {
        let (_, taken) = self.announced.remove(id)?;
        self.bytes -= id.len() + taken.as_ref().map_or(0, |r| r.len());
        Some(taken)
    }
}

impl RecentIds {
    /// About 1.5 MiB at most.
    pub(super) const CAPACITY: usize = 1 << 16;

    pub(super) fn hash(id: &str) -> u64 {
        use std::hash::{BuildHasher, BuildHasherDefault, DefaultHasher};
        BuildHasherDefault::<DefaultHasher>::default().hash_one(id)
    }

    pub(super) fn insert(&mut self, id: &str) {
        let h = Self::hash(id);
        if self.set.insert(h, Seen::default()).is_some() {
            return;
        }
        self.order.push_back(h);
        if self.order.len() > Self::CAPACITY {
            if let Some(old) = self.order.pop_front() {
                self.set.remove(&old);
            }
        }
    }

    pub(super) fn contains(&self, id: &str) -> bool {
        self.set.contains_key(&Self::hash(id))
    }

    /// Whether `id` is remembered and no wait for it has begun; if so, notes that its
    /// completion was announced before any wait.
    pub(super) fn announced_before_wait(&mut self, id: &str) -> bool {
        match self.set.get_mut(&Self::hash(id)) {
            Some(s) if !s.waited => {
                s.announced = true;
                true
            }
            _ => false,
        }
    }

    /// Whether `id` is remembered, no wait for it began before and its completion has not
    /// been announced yet (so the wait can sleep until it is); marks it waited for.
    pub(super) fn first_wait(&mut self, id: &str) -> bool {
        self.set.get_mut(&Self::hash(id)).is_some_and(|s| {
            let first = !std::mem::replace(&mut s.waited, true);
            first && !s.announced
        })
    }
}
