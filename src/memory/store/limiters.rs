//! The memory store's limiters: a rate limiter's granted and reserved turns, and a
//! concurrency limiter's held slots and waiting tasks — the decisions the Valkey store takes
//! in its scripts, on the memory store's clock (seconds).

use std::time::Duration;

use crate::store::{Rate, RateDecision, SlotDecision, TURN_GRACE, TURN_LATE};
use crate::wire::TaskId;

/// The rate-limit decision, on any clock (seconds), over a limiter's state. The memory
/// store's; the Valkey store runs the same steps in one script.
#[derive(Debug, Default)]
pub(crate) struct RateState {
    /// Granted starts, newest first, at most `limit`.
    started: std::collections::VecDeque<f64>,
    /// Turns handed out (granted starts and reservations), newest first, at most `limit`.
    planned: std::collections::VecDeque<f64>,
    /// Reserved turns by task.
    reserved: std::collections::HashMap<TaskId, f64>,
    /// The period of the latest decision (for the usage read).
    period: f64,
}

/// [`TURN_GRACE`] in seconds, as the memory store's limiters count time.
const TURN_GRACE_S: f64 = TURN_GRACE.as_secs_f64();

/// [`TURN_LATE`] in seconds.
const TURN_LATE_S: f64 = TURN_LATE.as_secs_f64();

impl RateState {
    pub(crate) fn admit(&mut self, id: &TaskId, rate: Rate, now: f64) -> RateDecision {
        let n = rate.limit() as usize;
        let period = rate.period().as_secs_f64();
        let keep = (period * 10.0).max(60.0);
        self.period = period;
        self.reserved.retain(|_, at| *at > now - keep);
        // Room for a start now, or when there will be.
        let free_at = match self.started.get(n - 1) {
            Some(oldest) if *oldest > now - period => oldest + period,
            _ => now,
        };
        let wait = |at: f64| RateDecision::Wait(Duration::from_secs_f64((at - now).max(0.0)));
        if let Some(&turn) = self.reserved.get(id) {
            if turn > now + TURN_GRACE_S {
                return wait(turn);
            }
            if free_at > now {
                // Starts that came late filled the window: a turn when it has room.
                self.reserved.insert(id.clone(), free_at);
                return wait(free_at);
            }
            self.reserved.remove(id);
            return self.start(n, now);
        }
        let mut turn = now.max(free_at);
        if let Some(newest) = self.planned.front() {
            turn = turn.max(*newest);
        }
        if let Some(nth) = self.planned.get(n - 1) {
            turn = turn.max(nth + period);
        }
        self.planned.push_front(turn);
        self.planned.truncate(n);
        if turn <= now + TURN_GRACE_S && free_at <= now {
            return self.start(n, now);
        }
        self.reserved.insert(id.clone(), turn);
        wait(turn)
    }

    /// Starts in the last period, turns reserved.
    pub(crate) fn usage(&self, now: f64) -> (u64, u64) {
        let used = self
            .started
            .iter()
            .filter(|at| **at > now - self.period)
            .count();
        (used as u64, self.reserved.len() as u64)
    }

    fn start(&mut self, n: usize, now: f64) -> RateDecision {
        self.started.push_front(now);
        self.started.truncate(n);
        RateDecision::Run
    }
}

/// A concurrency limiter's state, on any clock (seconds), for the memory store; the Valkey
/// store runs the same steps in one script.
#[derive(Debug, Default)]
pub(crate) struct SlotState {
    /// Slots held: task → lease end.
    held: std::collections::HashMap<TaskId, f64>,
    /// Tasks waiting: task → when it was told to come back.
    waiting: std::collections::HashMap<TaskId, f64>,
    /// How long a run holds a slot, on average (seconds).
    average_run: Option<f64>,
}

impl SlotState {
    pub(crate) fn acquire(
        &mut self,
        id: &TaskId,
        limit: u32,
        lease: f64,
        now: f64,
    ) -> SlotDecision {
        self.held.retain(|_, until| *until > now);
        self.waiting.retain(|_, back| *back > now - 3600.0);
        if let Some(until) = self.held.get_mut(id) {
            *until = now + lease;
            return SlotDecision::AlreadyHeld;
        }
        let free = (limit as usize).saturating_sub(self.held.len());
        let mine = self.waiting.get(id).copied();
        if let Some(back) = mine {
            if back > now + TURN_GRACE_S {
                return SlotDecision::Wait(Duration::from_secs_f64(back - now));
            }
        }
        // The waiting tasks before this one (all of them, for one not waiting yet): those due
        // back by now go first to a free slot; every one counts toward its turn.
        let before = |back: f64| mine.is_none_or(|m| back < m);
        let (mut due, mut ahead, mut oldest_due) = (0, 0, f64::INFINITY);
        for (other, back) in &self.waiting {
            if other != id && before(*back) {
                ahead += 1;
                if *back <= now + TURN_GRACE_S && *back > now - TURN_LATE_S {
                    due += 1;
                    oldest_due = oldest_due.min(*back);
                }
            }
        }
        if due < free {
            self.waiting.remove(id);
            self.held.insert(id.clone(), now + lease);
            return SlotDecision::Held;
        }
        // A slot whose worker died frees itself when its lease runs out: nobody waits past
        // the first lease end (and a moment), so a dead run's slot is taken again soon after.
        // A live holder's lease keeps moving ahead with its heartbeats, so this adds a
        // receive per waiter and lease at most.
        let first_end = self
            .held
            .values()
            .map(|until| until - now)
            .fold(f64::INFINITY, f64::min);
        let mut wait = slot_wait(ahead, limit, self.average_run).min((first_end + 0.05).max(0.25));
        if free > 0 {
            // A slot is free but kept for tasks due back now: if they are not back in time,
            // it is this one's turn.
            wait = wait.min((oldest_due + TURN_LATE_S - now + 0.05).max(0.25));
        }
        let back = now + wait;
        self.waiting.insert(id.clone(), back);
        SlotDecision::Wait(Duration::from_secs_f64(back - now))
    }

    /// Slots held now, tasks waiting.
    pub(crate) fn usage(&self, now: f64) -> (u64, u64) {
        let held = self.held.values().filter(|until| **until > now).count();
        (held as u64, self.waiting.len() as u64)
    }

    /// Extends a run's slot. A slot missing while no run was ever counted was lost with the
    /// state (a store restarted without its data): taken again, the runs still going count
    /// against the limit again; otherwise it was released or ran out, and stays free.
    pub(crate) fn renew(&mut self, id: &TaskId, lease: f64, now: f64) {
        match self.held.get_mut(id) {
            Some(until) => *until = now + lease,
            None if self.average_run.is_none() => {
                self.held.insert(id.clone(), now + lease);
            }
            None => {}
        }
    }

    pub(crate) fn release(&mut self, id: &TaskId, ran: f64) {
        if self.held.remove(id).is_none() {
            return;
        }
        // A slot freed by a copy that never ran (`ran` zero) says nothing of how long runs
        // take; it still marks the limiter as used (see `renew`), at the default estimate.
        self.average_run = Some(match self.average_run {
            Some(a) if ran > 0.0 => a * 0.8 + ran * 0.2,
            Some(a) => a,
            None if ran > 0.0 => ran,
            None => DEFAULT_RUN_S,
        });
    }
}

/// How long a run holds a slot before a limiter has timed one (seconds): the Valkey store's
/// scripts assume the same (`1000000` µs).
const DEFAULT_RUN_S: f64 = 1.0;

/// How long a task with `ahead` due waiters before it waits for a slot: its turn comes after
/// `ahead / limit` rounds of the average run, and at least a second (every hand-back costs a
/// receive).
fn slot_wait(ahead: usize, limit: u32, average_run: Option<f64>) -> f64 {
    let run = average_run.unwrap_or(DEFAULT_RUN_S).clamp(0.05, 600.0);
    let rounds = (ahead / limit.max(1) as usize + 1) as f64;
    (rounds * run).clamp(1.0, 600.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every start the limiter grants, for `tasks` arriving at once and each asking again at
    /// its turn, on a clock that jumps from one answer to the next.
    fn run_all(rate: Rate, tasks: usize) -> (Vec<f64>, usize) {
        let mut state = RateState::default();
        let mut asks = 0;
        let mut queue: Vec<(f64, TaskId)> = (0..tasks).map(|_| (0.0, TaskId::random())).collect();
        let mut starts = Vec::new();
        while let Some(i) = (0..queue.len()).min_by(|a, b| queue[*a].0.total_cmp(&queue[*b].0)) {
            let (at, id) = queue.swap_remove(i);
            asks += 1;
            match state.admit(&id, rate, at) {
                RateDecision::Run => starts.push(at),
                RateDecision::Wait(d) => queue.push((at + d.as_secs_f64(), id)),
            }
        }
        (starts, asks)
    }

    #[test]
    fn no_window_holds_more_starts_than_the_limit_and_each_task_asks_twice_at_most() {
        let rate = Rate::new(50, Duration::from_secs(1));
        let (starts, asks) = run_all(rate, 500);
        assert_eq!(starts.len(), 500);
        for (i, s) in starts.iter().enumerate() {
            let in_window = starts[i..].iter().take_while(|t| **t < s + 1.0).count();
            assert!(in_window <= 50, "{in_window} starts in the second from {s}");
        }
        // The first 50 at once, then the rest by turns: 10 periods for 500.
        let last = starts.iter().cloned().fold(0.0, f64::max);
        assert!((8.9..=9.1).contains(&last), "{last}");
        assert!(asks <= 1000, "{asks} asks for 500 tasks");
    }

    #[test]
    fn a_late_start_never_overfills_a_window() {
        let rate = Rate::new(2, Duration::from_secs(1));
        let mut state = RateState::default();
        let ids: Vec<TaskId> = (0..4).map(|_| TaskId::random()).collect();
        assert_eq!(state.admit(&ids[0], rate, 0.0), RateDecision::Run);
        assert_eq!(state.admit(&ids[1], rate, 0.0), RateDecision::Run);
        // Turns at 1.0 and 1.0 (the third and fourth of the window after).
        let turn = |d: RateDecision| match d {
            RateDecision::Wait(d) => d.as_secs_f64(),
            RateDecision::Run => 0.0,
        };
        assert!((turn(state.admit(&ids[2], rate, 0.0)) - 1.0).abs() < 1e-9);
        assert!((turn(state.admit(&ids[3], rate, 0.0)) - 1.0).abs() < 1e-9);
        // The third comes at its turn; the fourth comes back before it: early, it waits.
        assert_eq!(state.admit(&ids[2], rate, 1.0), RateDecision::Run);
        assert!(turn(state.admit(&ids[3], rate, 0.5)) > 0.4);
        assert_eq!(state.admit(&ids[3], rate, 1.0), RateDecision::Run);
        // A new one now waits for the next window.
        assert!((turn(state.admit(&TaskId::random(), rate, 1.0)) - 1.0).abs() < 1e-9);
    }
}
