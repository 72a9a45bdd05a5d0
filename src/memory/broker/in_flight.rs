//! A queue's received messages, each invisible until its lease runs out: found by id on every
//! ack and heartbeat, and scanned for expired leases only when one may have run out.

use tokio::time::Instant;

use crate::FastMap;

/// One received message, invisible until `visible_at`.
pub(super) struct InFlight<T> {
    pub(super) stored: T,
    /// Which receive of the message holds it: an older handle is stale.
    pub(super) receipt: u64,
    pub(super) visible_at: Instant,
}

/// The in-flight messages of one queue, by message id.
pub(super) struct InFlightSet<T> {
    by_id: FastMap<u64, InFlight<T>>,
    /// No lease here runs out before this: a lower bound, kept by every change that can make
    /// one run out sooner and made exact again by each scan. Before it, a receive looks at none
    /// of the leases (with a worker's whole prefetch in flight, it used to look at all of them
    /// twice per receive).
    floor: Option<Instant>,
}

impl<T> Default for InFlightSet<T> {
    fn default() -> Self {
        InFlightSet {
            by_id: FastMap::default(),
            floor: None,
        }
    }
}

impl<T> InFlightSet<T> {
    pub(super) fn len(&self) -> usize {
        self.by_id.len()
    }

    pub(super) fn is_empty(&self) -> bool {
        self.by_id.is_empty()
    }

    pub(super) fn get(&self, id: u64) -> Option<&InFlight<T>> {
        self.by_id.get(&id)
    }

    pub(super) fn remove(&mut self, id: u64) -> Option<InFlight<T>> {
        // An earlier floor stays a lower bound: the next scan makes it exact.
        self.by_id.remove(&id)
    }

    pub(super) fn insert(&mut self, id: u64, entry: InFlight<T>) {
        self.lower_floor(entry.visible_at);
        self.by_id.insert(id, entry);
    }

    /// Moves the lease of `id`, when `receipt` is its current receive and `keep` accepts the
    /// lease it has; returns whether it moved.
    pub(super) fn move_lease(
        &mut self,
        id: u64,
        receipt: u64,
        keep: impl FnOnce(Instant) -> bool,
        to: Instant,
    ) -> bool {
        match self.by_id.get_mut(&id) {
            Some(f) if f.receipt == receipt && keep(f.visible_at) => {
                f.visible_at = to;
            }
            _ => return false,
        }
        self.lower_floor(to);
        true
    }

    /// Every lease runs out at `now`; returns how many there were.
    pub(super) fn expire_all(&mut self, now: Instant) -> usize {
        for f in self.by_id.values_mut() {
            f.visible_at = now;
        }
        if !self.by_id.is_empty() {
            self.lower_floor(now);
        }
        self.by_id.len()
    }

    /// Takes out every message whose lease ran out by `now`.
    pub(super) fn take_expired(&mut self, now: Instant) -> Vec<InFlight<T>> {
        if self.floor.is_none_or(|floor| floor > now) {
            return Vec::new();
        }
        let expired: Vec<u64> = self
            .by_id
            .iter()
            .filter(|(_, f)| f.visible_at <= now)
            .map(|(id, _)| *id)
            .collect();
        let taken = expired
            .iter()
            .filter_map(|id| self.by_id.remove(id))
            .collect();
        self.floor = self.by_id.values().map(|f| f.visible_at).min();
        taken
    }

    /// When the earliest lease may run out (never later than it does).
    pub(super) fn next_expiry(&self) -> Option<Instant> {
        self.floor
    }

    fn lower_floor(&mut self, t: Instant) {
        self.floor = Some(self.floor.map_or(t, |floor| floor.min(t)));
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    /// A set holding messages 1, 2, … (each on its first receipt, the same number) whose
    /// leases run out `secs` after `t0`.
    fn leases(t0: Instant, secs: &[u64]) -> InFlightSet<()> {
        let mut set = InFlightSet::default();
        for (id, s) in (1..).zip(secs) {
            let visible_at = t0 + Duration::from_secs(*s);
            set.insert(
                id,
                InFlight {
                    stored: (),
                    receipt: id,
                    visible_at,
                },
            );
        }
        set
    }

    #[test]
    fn a_scan_takes_what_ran_out_and_the_floor_follows_what_is_left() {
        let t0 = Instant::now();
        let mut set = leases(t0, &[1, 5]);
        assert!(set.take_expired(t0).is_empty());
        assert_eq!(set.next_expiry(), Some(t0 + Duration::from_secs(1)));
        let taken = set.take_expired(t0 + Duration::from_secs(2));
        assert_eq!(taken.len(), 1);
        assert_eq!(taken[0].receipt, 1);
        assert_eq!(set.next_expiry(), Some(t0 + Duration::from_secs(5)));
    }

    #[test]
    fn a_lease_moved_sooner_is_found_by_the_next_scan() {
        let t0 = Instant::now();
        let mut set = leases(t0, &[30]);
        assert!(
            !set.move_lease(1, 2, |_| true, t0),
            "a stale receipt moves nothing"
        );
        assert!(set.take_expired(t0).is_empty());
        assert!(set.move_lease(1, 1, |_| true, t0));
        assert_eq!(set.take_expired(t0).len(), 1);
        assert!(set.is_empty());
        assert_eq!(set.next_expiry(), None);
    }

    #[test]
    fn expiring_everything_makes_every_lease_due_now() {
        let t0 = Instant::now();
        let mut set = leases(t0, &[30, 40]);
        assert_eq!(set.expire_all(t0), 2);
        assert_eq!(set.take_expired(t0).len(), 2);
    }
}
