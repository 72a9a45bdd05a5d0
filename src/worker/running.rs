use std::sync::{Arc, Mutex, MutexGuard, OnceLock};

use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::broker::DeliveryHandle;
use crate::store::Token;
use crate::wire::TaskId;

/// Why a run was stopped from outside.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum StopReason {
    /// The broker no longer holds our delivery: write nothing, free the claim.
    DeliveryLost,
    /// Another worker holds the claim now: release the message, never ack it.
    ClaimLost,
    /// The claim heartbeat kept failing: the lease may run out and another worker may take
    /// the task; release the message, and the claim once the store answers.
    StoreUnreachable,
    /// Shutdown after the grace period: release claim and message for another worker.
    Shutdown,
    /// The task was revoked: its `Cancelled` result is stored; ack the message.
    Revoked,
    /// The broker cannot hold the message longer (SQS's 12-hour visibility limit): fail the
    /// run for good while the message is still ours.
    LeaseLimit,
}

/// One running delivery, as the heartbeat loops see it.
pub(crate) struct Running {
    pub(crate) task_id: TaskId,
    pub(crate) task_name: &'static str,
    pub(crate) attempt: u32,
    /// The lane its delivery came from, for operators.
    pub(crate) lane: Arc<str>,
    /// When the run started (unix ms), for operators.
    pub(crate) started_at_ms: u64,
    pub(crate) token: Token,
    pub(crate) handle: DeliveryHandle,
    pub(crate) cancel: CancellationToken,
    /// Why it was stopped from outside, set before `cancel` fires; the run reads it from the
    /// entry it takes out of the table when it ends (`remove`).
    pub(crate) reason: OnceLock<StopReason>,
    /// When the claim's lease was last known renewed (claimed, or a heartbeat kept it).
    pub(crate) renewed_at: Instant,
}

/// The table of running deliveries, keyed by delivery handle key: the heartbeat loops read
/// it in one pass instead of keeping a timer per task.
#[derive(Default)]
pub(crate) struct RunningTable {
    entries: Mutex<Table>,
}

#[derive(Default)]
struct Table {
    runs: crate::FastMap<u64, Running>,
    /// Set by `stop_all`: a run that starts afterwards is stopped at once.
    closed: Option<StopReason>,
}

impl RunningTable {
    fn lock(&self) -> MutexGuard<'_, Table> {
        self.entries.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Registers a run; the reason it was stopped at once when the table is closed (it is
    /// then not registered).
    pub(crate) fn insert(&self, entry: Running) -> Option<StopReason> {
        let mut table = self.lock();
        if let Some(reason) = table.closed {
            entry.cancel.cancel();
            return Some(reason);
        }
        table.runs.insert(entry.handle.key(), entry);
        None
    }

    /// Opens the table for a new `Worker::run`.
    pub(crate) fn open(&self) {
        self.lock().closed = None;
    }

    /// Takes a run out of the table: why it was stopped from outside, if it was.
    pub(crate) fn remove(&self, key: u64) -> Option<StopReason> {
        let entry = self.lock().runs.remove(&key)?;
        entry.reason.get().copied()
    }

    pub(crate) fn len(&self) -> usize {
        self.lock().runs.len()
    }

    /// Stops one run; the first reason wins.
    pub(crate) fn stop(&self, key: u64, reason: StopReason) {
        if let Some(e) = self.lock().runs.get(&key) {
            let _ = e.reason.set(reason);
            e.cancel.cancel();
        }
    }

    /// Stops every run, and every run that starts from now on.
    pub(crate) fn stop_all(&self, reason: StopReason) {
        let mut table = self.lock();
        table.closed = Some(reason);
        for e in table.runs.values() {
            let _ = e.reason.set(reason);
            e.cancel.cancel();
        }
    }

    pub(crate) fn handles(&self) -> Vec<DeliveryHandle> {
        self.lock()
            .runs
            .values()
            .map(|e| e.handle.clone())
            .collect()
    }

    /// The runs in flight, for the worker's report.
    pub(crate) fn runs(&self) -> Vec<crate::store::RunInfo> {
        self.lock()
            .runs
            .values()
            .map(|e| {
                crate::store::RunInfo::new(
                    e.task_id.clone(),
                    e.task_name.to_owned(),
                    e.started_at_ms,
                    e.attempt,
                    e.lane.to_string(),
                )
            })
            .collect()
    }

    pub(crate) fn claims(&self) -> Vec<(u64, TaskId, Token)> {
        self.lock()
            .runs
            .iter()
            .map(|(k, e)| (*k, e.task_id.clone(), e.token))
            .collect()
    }

    /// Records that these runs' claims were renewed at `at`.
    pub(crate) fn renewed(&self, keys: &[u64], at: Instant) {
        let mut table = self.lock();
        for k in keys {
            if let Some(e) = table.runs.get_mut(k) {
                e.renewed_at = at;
            }
        }
    }

    /// Runs whose claim was last renewed before `before`.
    pub(crate) fn unrenewed_since(&self, before: Instant) -> Vec<u64> {
        self.lock()
            .runs
            .iter()
            .filter(|(_, e)| e.renewed_at < before)
            .map(|(k, _)| *k)
            .collect()
    }
}

/// What became of one delivery.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Outcome {
    /// Ran and its result is stored; acked.
    Succeeded,
    /// Failed for good; error stored and message dead-lettered.
    Failed,
    /// Failed; released for another attempt after backoff.
    Retried,
    /// A duplicate of a finished task; acked.
    Duplicate,
    /// A debounced task's copy that a later enqueue's copy replaced; acked, nothing run.
    Superseded,
    /// Another worker holds the claim; released until its lease ends.
    Deferred,
    /// Past its deadline before it started; `DeadlineExceeded` stored, parked as `expired`.
    Expired,
    /// Revoked (before it started, or while it ran); its `Cancelled` result stands, acked.
    Revoked,
    /// Malformed, too large or unserved; dead-lettered.
    DeadLettered,
    /// Released to come back later (unknown name, newer wire version, store unreachable…).
    Released,
    /// Received before it was due (a delayed task); released until it is due, nothing run.
    NotDue,
    /// Over its rate limit; released until its turn, nothing run, no attempt spent.
    RateLimited,
    /// Every slot of its concurrency limit taken; released until its likely turn, nothing
    /// run, no attempt spent.
    ConcurrencyLimited,
    /// The broker took the delivery back mid-run; nothing written.
    DeliveryLost,
    /// Another worker took the claim mid-run; released, never acked.
    ClaimLost,
    /// The result write was fenced off (another holder); not acked.
    Stale,
    /// Cancelled by shutdown and released for another worker.
    ShutdownReleased,
    /// A broker call failed; the message comes back by itself.
    BrokerError,
}

impl Outcome {
    /// Whether the message left its queue for good (its outcome is durable: a result stored
    /// and the message acked, or parked); otherwise it is back in its queue or will be.
    pub fn removed(self) -> bool {
        matches!(
            self,
            Outcome::Succeeded
                | Outcome::Failed
                | Outcome::Duplicate
                | Outcome::Superseded
                | Outcome::Expired
                | Outcome::Revoked
                | Outcome::DeadLettered
        )
    }

    /// A stable name, for logs and metrics.
    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Succeeded => "succeeded",
            Outcome::Failed => "failed",
            Outcome::Retried => "retried",
            Outcome::Duplicate => "duplicate",
            Outcome::Superseded => "superseded",
            Outcome::Deferred => "deferred",
            Outcome::Expired => "expired",
            Outcome::Revoked => "revoked",
            Outcome::DeadLettered => "dead_lettered",
            Outcome::Released => "released",
            Outcome::NotDue => "not_due",
            Outcome::RateLimited => "rate_limited",
            Outcome::ConcurrencyLimited => "concurrency_limited",
            Outcome::DeliveryLost => "delivery_lost",
            Outcome::ClaimLost => "claim_lost",
            Outcome::Stale => "stale",
            Outcome::ShutdownReleased => "shutdown_released",
            Outcome::BrokerError => "broker_error",
        }
    }

    pub(crate) const ALL: [Outcome; 18] = [
        Outcome::Succeeded,
        Outcome::Failed,
        Outcome::Retried,
        Outcome::Duplicate,
        Outcome::Superseded,
        Outcome::Deferred,
        Outcome::Expired,
        Outcome::Revoked,
        Outcome::DeadLettered,
        Outcome::Released,
        Outcome::NotDue,
        Outcome::RateLimited,
        Outcome::ConcurrencyLimited,
        Outcome::DeliveryLost,
        Outcome::ClaimLost,
        Outcome::Stale,
        Outcome::ShutdownReleased,
        Outcome::BrokerError,
    ];
}
