use std::collections::VecDeque;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::Instant;

use super::Clock;
use crate::store::Token;
use crate::wire::{TaskId, TaskResult};

mod flow;
mod limiters;
mod ops;
mod schedules;
mod traits;
mod workflow;

/// In-memory claims and results with the Valkey store's semantics: leased claims with fencing
/// tokens, results written once (counted, for exactly-once tests), waiters woken on completion.
/// Clones share the data.
///
/// [`MemoryStore::new`] keeps every finished task, which tests and examples want; a
/// long-running embedded process should use [`MemoryStore::with_retention`].
///
/// ```
/// use std::time::Duration;
/// use ferriq::memory::MemoryStore;
/// use ferriq::store::{ClaimOutcome, ClaimStore, CompleteOutcome, ResultStore};
/// use ferriq::wire::{TaskId, TaskResult};
///
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// let store = MemoryStore::new();
/// let id = TaskId::random();
/// let ClaimOutcome::Run { token, .. } = store.claim(&id, "w1", Duration::from_secs(30), None).await.unwrap()
///     else { panic!() };
/// // A second delivery of the same task waits for the holder's lease.
/// assert!(matches!(store.claim(&id, "w2", Duration::from_secs(30), None).await.unwrap(),
///                  ClaimOutcome::Defer { .. }));
/// let result = TaskResult::success(5.into(), 0.0, Default::default());
/// assert_eq!(store.complete(&id, token, Some(&result), None).await.unwrap(), CompleteOutcome::Stored);
/// assert_eq!(store.write_count(&id), 1);
/// # }
/// ```
#[derive(Clone)]
pub struct MemoryStore {
    pub(super) inner: Arc<Inner>,
}

pub(super) struct Inner {
    state: Mutex<State>,
    pub(super) clock: Clock,
    retention: Option<Duration>,
}

#[derive(Default)]
pub(super) struct State {
    pub(super) claims: crate::FastMap<TaskId, Claim>,
    pub(super) results: crate::FastMap<TaskId, TaskResult>,
    writes: crate::FastMap<TaskId, u32>,
    waiters: crate::FastMap<TaskId, Arc<Notify>>,
    /// The worker id of the latest claim: a worker's claims share one copy of its id.
    pub(super) last_holder: Arc<str>,
    /// Finished tasks (and settled workflows) in the order they are forgotten (only with a
    /// retention).
    finished: VecDeque<(Instant, TaskId)>,
    pub(super) groups: crate::FastMap<TaskId, workflow::MemGroup>,
    pub(super) chains: crate::FastMap<TaskId, crate::store::ChainRecord>,
    pub(super) progress: crate::FastMap<TaskId, crate::store::TaskProgress>,
    pub(super) schedules: schedules::MemSchedules,
    pub(super) ops: ops::MemOps,
    /// Rate limiters by name.
    pub(super) rates: std::collections::HashMap<String, limiters::RateState>,
    /// Concurrency limiters by name.
    pub(super) slots: std::collections::HashMap<String, limiters::SlotState>,
    /// Deduplication keys: the task holding each, until when.
    pub(super) dedup: std::collections::HashMap<String, (TaskId, Instant)>,
    pub(super) limits: flow::MemLimits,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Phase {
    Running,
    Released,
    Done,
    Revoked,
}

#[derive(Debug, Clone)]
pub(super) struct Claim {
    pub(super) phase: Phase,
    pub(super) token: u64,
    pub(super) lease_until: Instant,
    // Shared with the other claims of the same worker (see `State::last_holder`).
    pub(super) holder: Arc<str>,
    pub(super) failures: u32,
    pub(super) starts: u32,
    pub(super) takeovers: u32,
    /// When the current run started (unix seconds on the store's clock).
    pub(super) started_at: f64,
}

impl Claim {
    pub(super) fn new(now: Instant) -> Self {
        Claim {
            phase: Phase::Released,
            token: 0,
            lease_until: now,
            holder: Arc::default(),
            failures: 0,
            starts: 0,
            takeovers: 0,
            started_at: 0.0,
        }
    }
}

impl Default for MemoryStore {
    fn default() -> Self {
        Self::new()
    }
}

impl MemoryStore {
    /// An empty store that keeps every finished task (for tests and examples).
    pub fn new() -> Self {
        Self::build(None)
    }

    /// An empty store that forgets a finished (done or revoked) task — its claim, result and
    /// write count — `retention` after it finished, like the Valkey store's TTLs, so finished
    /// tasks no longer accumulate in a long-running process. Claims that never finish (a
    /// message dropped or dead-lettered while released) are kept. A copy of the message
    /// arriving after the retention runs again, and a revoke is forgotten with it: keep
    /// `retention` longer than any redelivery and than the longest delay a message may carry.
    ///
    /// ```
    /// # use std::time::Duration;
    /// let store = ferriq::memory::MemoryStore::with_retention(Duration::from_secs(3600));
    /// ```
    pub fn with_retention(retention: Duration) -> Self {
        Self::build(Some(retention))
    }

    /// Releases a running claim held under `token`; `interrupted` counts it as a takeover.
    fn release_claim(&self, id: &TaskId, token: Token, interrupted: bool) -> bool {
        let mut state = self.lock();
        match state.claims.get_mut(id) {
            Some(c) if c.phase == Phase::Running && c.token == token.0 => {
                c.phase = Phase::Released;
                if interrupted {
                    c.takeovers += 1;
                }
                true
            }
            _ => false,
        }
    }

    fn build(retention: Option<Duration>) -> Self {
        MemoryStore {
            inner: Arc::new(Inner {
                state: Mutex::new(State::default()),
                clock: Clock::following_tokio(),
                retention,
            }),
        }
    }

    /// Remembers when a task that just finished is to be forgotten.
    pub(super) fn finished(&self, state: &mut State, id: &TaskId) {
        // A retention too long to add to the clock keeps the task forever.
        if let Some(at) = self
            .inner
            .retention
            .and_then(|retention| Instant::now().checked_add(retention))
        {
            state.finished.push_back((at, id.clone()));
        }
    }

    /// Forgets the finished tasks whose retention is over (amortized over the writes).
    pub(super) fn sweep(&self, state: &mut State) {
        // A store that keeps every finished task (tests, benchmarks) has nothing to sweep:
        // no clock read per write.
        if state.finished.is_empty() {
            return;
        }
        let now = Instant::now();
        while state.finished.front().is_some_and(|(at, _)| *at <= now) {
            let Some((_, id)) = state.finished.pop_front() else {
                break;
            };
            if state
                .claims
                .get(&id)
                .is_some_and(|c| matches!(c.phase, Phase::Done | Phase::Revoked))
            {
                state.claims.remove(&id);
            }
            state.results.remove(&id);
            state.writes.remove(&id);
            state.progress.remove(&id);
            state.groups.remove(&id);
            state.chains.remove(&id);
        }
    }

    pub(super) fn lock(&self) -> MutexGuard<'_, State> {
        // Every update is a single map operation, so data behind a poisoned lock is consistent.
        self.inner
            .state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// How many times a result was written for `id` (exactly-once tests expect 1).
    pub fn write_count(&self, id: &TaskId) -> u32 {
        self.lock().writes.get(id).copied().unwrap_or(0)
    }

    /// Result writes over all tasks.
    pub fn total_writes(&self) -> u64 {
        self.lock().writes.values().map(|n| u64::from(*n)).sum()
    }

    /// Tasks with a stored result.
    pub fn result_count(&self) -> usize {
        self.lock().results.len()
    }

    /// Tasks written more than once (should be empty).
    pub fn duplicate_writes(&self) -> Vec<TaskId> {
        self.lock()
            .writes
            .iter()
            .filter(|(_, n)| **n > 1)
            .map(|(id, _)| id.clone())
            .collect()
    }

    /// The current token of a claim, if any.
    pub fn current_token(&self, id: &TaskId) -> Option<Token> {
        self.lock().claims.get(id).map(|c| Token(c.token))
    }

    /// Fault injection: the claim's lease runs out now (as if its holder paused or was
    /// partitioned), so the next claim takes it over with a larger token.
    pub fn expire_lease(&self, id: &TaskId) -> bool {
        let mut state = self.lock();
        match state.claims.get_mut(id) {
            Some(c) if c.phase == Phase::Running => {
                c.lease_until = Instant::now();
                true
            }
            _ => false,
        }
    }

    /// Fault injection: another worker takes the claim over now (token + 1), so the current
    /// holder's heartbeat and result write are rejected. Returns the new token.
    pub fn take_over(&self, id: &TaskId, lease: Duration) -> Option<Token> {
        let mut state = self.lock();
        let c = state.claims.get_mut(id)?;
        if matches!(c.phase, Phase::Done | Phase::Revoked) {
            return None;
        }
        c.token += 1;
        c.phase = Phase::Running;
        c.holder = Arc::from("intruder");
        c.lease_until = Instant::now() + lease;
        Some(Token(c.token))
    }

    /// A task's result, if stored: `get` without the boxed future its trait method is, for
    /// `wait`'s own checks.
    pub(super) fn status(&self, id: &TaskId) -> crate::store::ResultStatus {
        match self.lock().results.get(id) {
            Some(r) => crate::store::ResultStatus::Ready(r.clone()),
            None => crate::store::ResultStatus::Pending,
        }
    }

    pub(super) fn store_result(state: &mut State, id: &TaskId, result: &TaskResult) -> bool {
        if state.results.contains_key(id) {
            return false;
        }
        state.results.insert(id.clone(), result.clone());
        *state.writes.entry(id.clone()).or_default() += 1;
        if let Some(waiter) = state.waiters.remove(id) {
            waiter.notify_waiters();
        }
        true
    }
}

impl std::fmt::Debug for MemoryStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let state = self.lock();
        f.debug_struct("MemoryStore")
            .field("claims", &state.claims.len())
            .field("results", &state.results.len())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::{ClaimOutcome, ClaimStore, CompleteOutcome, ResultStatus, ResultStore};

    fn ok() -> TaskResult {
        TaskResult::success(1.into(), 0.0, Default::default())
    }

    async fn run(store: &MemoryStore, id: &TaskId) -> Token {
        match store.claim(id, "w", Duration::from_secs(30), None).await {
            Ok(ClaimOutcome::Run { token, .. }) => token,
            other => panic!("{other:?}"),
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_finished_task_is_forgotten_after_the_retention_and_a_running_one_is_not() {
        let store = MemoryStore::with_retention(Duration::from_secs(60));
        let (done, busy) = (TaskId::random(), TaskId::random());
        let token = run(&store, &done).await;
        run(&store, &busy).await;
        store
            .complete(&done, token, Some(&ok()), None)
            .await
            .unwrap();

        tokio::time::advance(Duration::from_secs(59)).await;
        store
            .claim(&TaskId::random(), "w", Duration::from_secs(30), None)
            .await
            .unwrap();
        assert!(matches!(
            store.get(&done).await.unwrap(),
            ResultStatus::Ready(_)
        ));
        assert!(matches!(
            store
                .claim(&done, "w", Duration::from_secs(30), None)
                .await
                .unwrap(),
            ClaimOutcome::Done
        ));

        tokio::time::advance(Duration::from_secs(2)).await;
        store
            .claim(&TaskId::random(), "w", Duration::from_secs(30), None)
            .await
            .unwrap();
        assert_eq!(store.get(&done).await.unwrap(), ResultStatus::Pending);
        assert_eq!(store.write_count(&done), 0);
        assert_eq!(store.current_token(&done), None);
        // The running task's claim is kept however long it runs.
        assert!(store.current_token(&busy).is_some());
        // A copy arriving after the retention runs again (documented).
        run(&store, &done).await;

        // A revoke is forgotten the same way.
        let revoked = TaskId::random();
        assert!(store.revoke(&revoked, &ok()).await.unwrap());
        tokio::time::advance(Duration::from_secs(61)).await;
        store
            .claim(&TaskId::random(), "w", Duration::from_secs(30), None)
            .await
            .unwrap();
        assert_eq!(store.get(&revoked).await.unwrap(), ResultStatus::Pending);
        assert_eq!(store.current_token(&revoked), None);
    }

    #[tokio::test(start_paused = true)]
    async fn a_retention_too_long_for_the_clock_keeps_the_task() {
        let store = MemoryStore::with_retention(Duration::MAX);
        let id = TaskId::random();
        let token = run(&store, &id).await;
        assert_eq!(
            store.complete(&id, token, Some(&ok()), None).await.unwrap(),
            CompleteOutcome::Stored
        );
        assert!(matches!(
            store.get(&id).await.unwrap(),
            ResultStatus::Ready(_)
        ));
    }

    #[tokio::test(start_paused = true)]
    async fn without_a_retention_everything_is_kept() {
        let store = MemoryStore::new();
        let id = TaskId::random();
        let token = run(&store, &id).await;
        store.complete(&id, token, Some(&ok()), None).await.unwrap();
        tokio::time::advance(Duration::from_secs(365 * 86_400)).await;
        store
            .claim(&TaskId::random(), "w", Duration::from_secs(30), None)
            .await
            .unwrap();
        assert_eq!(store.write_count(&id), 1);
        assert!(matches!(
            store
                .claim(&id, "w", Duration::from_secs(30), None)
                .await
                .unwrap(),
            ClaimOutcome::Done
        ));
    }
}
