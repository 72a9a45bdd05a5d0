//! Deliveries that must run one at a time, in the order received: an SQS FIFO queue's message
//! group ([`Delivery::ordering_key`]). SQS may hand over up to ten messages of one group in a
//! single receive, and never more of the group while any of them is in flight; run side by
//! side, they would start out of order and overlap.
//!
//! The first delivery of a key runs; the others wait here, in order, each keeping its
//! concurrency slot (so the worker never holds more than it may run) and its broker lease
//! (heartbeated with the runs). When the running one's message left its queue for good
//! (result stored and acked, or parked), the next starts. When it went back instead (a retry
//! after a backoff, not due yet, another holder, a lost run, a broker error, a drain), every
//! waiting one is handed back at once, unrun and unclaimed: the head stays in flight, so the
//! broker returns the group from its head again. Nothing here touches a claim, so no attempt
//! is spent.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, MutexGuard};

use tokio::sync::OwnedSemaphorePermit;

use crate::broker::{Delivery, DeliveryHandle};
use crate::FastMap;

/// A delivery waiting for the run of its group ahead of it, with its concurrency slot.
pub(crate) struct Waiting {
    pub(crate) delivery: Delivery,
    pub(crate) permit: Option<OwnedSemaphorePermit>,
}

/// What follows the end of a group's run.
pub(crate) enum Next {
    /// Run this one now.
    Run(Waiting),
    /// Hand these back (the head went back to its queue, or the worker drains).
    HandBack(Vec<Waiting>),
}

/// The groups with a run under way, and what waits behind each.
#[derive(Default)]
pub(crate) struct OrderedGroups {
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    groups: FastMap<Arc<str>, VecDeque<Waiting>>,
    draining: bool,
}

impl OrderedGroups {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Takes `delivery` in: handed back to run now when its group has no run under way (it
    /// becomes the group's head), else queued behind the group's run (`None`).
    pub(crate) fn admit(&self, key: &Arc<str>, waiting: Waiting) -> Option<Waiting> {
        let mut state = self.lock();
        match state.groups.get_mut(key) {
            Some(queue) => {
                queue.push_back(waiting);
                None
            }
            None => {
                state.groups.insert(Arc::clone(key), VecDeque::new());
                Some(waiting)
            }
        }
    }

    /// The run of `key`'s head ended, its message `removed` from the queue for good or not:
    /// the next to run, or what to hand back. `None` when nothing waits (the group's run is
    /// over, and the next delivery of the key becomes a head).
    pub(crate) fn next(&self, key: &Arc<str>, removed: bool) -> Option<Next> {
        let mut state = self.lock();
        let draining = state.draining;
        let queue = state.groups.get_mut(key)?;
        let next = if removed && !draining {
            queue.pop_front().map(Next::Run)
        } else if queue.is_empty() {
            None
        } else {
            Some(Next::HandBack(queue.drain(..).collect()))
        };
        if next.is_none() || matches!(next, Some(Next::HandBack(_))) {
            state.groups.remove(key);
        }
        next
    }

    /// The broker handles of every waiting delivery, to keep their leases with the runs'.
    pub(crate) fn waiting_handles(&self) -> Vec<DeliveryHandle> {
        let state = self.lock();
        state
            .groups
            .values()
            .flatten()
            .map(|w| w.delivery.handle.clone())
            .collect()
    }

    /// Takes out a waiting delivery (`handle_key`) whose broker lease is lost or at its limit,
    /// and everything behind it in its group, which must not run before it comes back.
    /// Returns them in order, that one first.
    pub(crate) fn take_from(&self, handle_key: u64) -> Vec<Waiting> {
        let mut state = self.lock();
        for queue in state.groups.values_mut() {
            if let Some(at) = queue
                .iter()
                .position(|w| w.delivery.handle.key() == handle_key)
            {
                return queue.drain(at..).collect();
            }
        }
        Vec::new()
    }

    /// A run starts: deliveries are taken in again (after a drain of an earlier run).
    pub(crate) fn open(&self) {
        self.lock().draining = false;
    }

    /// A drain started: every waiting delivery, to hand back now; the runs under way finish,
    /// and nothing after them starts.
    pub(crate) fn drain(&self) -> Vec<Waiting> {
        let mut state = self.lock();
        state.draining = true;
        state
            .groups
            .values_mut()
            .flat_map(|q| q.drain(..))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::TaskId;

    fn delivery(n: u32) -> Waiting {
        Waiting {
            delivery: Delivery::new(
                Vec::new(),
                Some(TaskId::parse(n.to_string()).unwrap()),
                1,
                "q",
                DeliveryHandle::new(n),
            ),
            permit: None,
        }
    }

    fn id(w: &Waiting) -> String {
        w.delivery
            .task_id
            .as_ref()
            .map(|id| id.to_string())
            .unwrap_or_default()
    }

    fn ids(ws: &[Waiting]) -> Vec<String> {
        ws.iter().map(id).collect()
    }

    #[test]
    fn a_group_runs_in_order_and_hands_the_rest_back_when_its_head_goes_back() {
        let groups = OrderedGroups::default();
        let key: Arc<str> = Arc::from("q\ng");
        let head = groups.admit(&key, delivery(0)).expect("the first runs");
        assert_eq!(id(&head), "0");
        for n in 1..4 {
            assert!(
                groups.admit(&key, delivery(n)).is_none(),
                "waits behind the head"
            );
        }
        // Another group is not held up.
        assert!(groups.admit(&Arc::from("q\nother"), delivery(9)).is_some());
        assert_eq!(groups.waiting_handles().len(), 3);
        match groups.next(&key, true) {
            Some(Next::Run(w)) => assert_eq!(id(&w), "1"),
            _ => panic!("the next in order runs"),
        }
        // The running one went back (a retry): the rest goes back too, and the group is free.
        match groups.next(&key, false) {
            Some(Next::HandBack(rest)) => assert_eq!(ids(&rest), ["2", "3"]),
            _ => panic!("the rest is handed back"),
        }
        assert!(groups.waiting_handles().is_empty());
        assert!(groups.admit(&key, delivery(1)).is_some(), "a new head");
        assert!(
            groups.next(&key, true).is_none(),
            "nothing waits: the run is over"
        );
    }

    #[test]
    fn a_lost_lease_takes_the_ones_behind_it_and_a_drain_takes_everything() {
        let groups = OrderedGroups::default();
        let key: Arc<str> = Arc::from("q\ng");
        let _head = groups.admit(&key, delivery(0));
        let mut keys = Vec::new();
        for n in 1..5 {
            let w = delivery(n);
            keys.push(w.delivery.handle.key());
            groups.admit(&key, w);
        }
        assert_eq!(ids(&groups.take_from(keys[2])), ["3", "4"]);
        assert_eq!(ids(&groups.drain()), ["1", "2"]);
        // Draining, the head's end starts nothing more.
        assert!(groups.next(&key, true).is_none());
    }
}
