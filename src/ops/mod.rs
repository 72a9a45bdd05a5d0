//! Operations: what the on-call engineer needs — queues, workers and their runs, a task's
//! state, and dead letters listed, redriven and purged. The `ferriq` command is built on it.
//!
//! A redriven task really runs again: before its copy goes back to its lane, the store resets
//! it ([`OpsStore::reset_for_redrive`](crate::store::OpsStore::reset_for_redrive)) — its error
//! result removed, its claim given a fresh attempt budget under a new, larger token, so no
//! worker from before can store over the new result — once per dead letter, so a redrive that
//! dies midway and runs again sends at worst a duplicate the claims absorb. The copy is
//! confirmed in the lane before the dead letter is removed.
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")] async fn main() {
//! use ferriq::dead_letters::DeadFilter;
//! let env = ferriq::testing::TestEnv::new();
//! let ops = env.client.ops();
//! let parked = ops.dead_letters("taskiq", 0, 50).await.unwrap();
//! let report = ops
//!     .redrive("taskiq", &DeadFilter::all().reason("retries_exhausted"), |_| {})
//!     .await
//!     .unwrap();
//! assert_eq!((parked.len(), report.redriven), (0, 0));
//! # }
//! ```

use serde_json::Value;
use thiserror::Error;

mod dead_index;

use crate::broker::{BrokerError, DeadLetterReason, QueueDepth};
use crate::client::{Client, TaskStatus};
use crate::dead_letters::{DeadFilter, DeadLetterQueue, DeadMessage};
use crate::store::{
    ClaimInfo, ClaimState, DeadEntry, RedriveReset, ResultStatus, StoreError, WorkerInfo,
};
use crate::wire::{names, ErrorKind, TaskId, TaskMessage, TaskResult};

/// What went wrong in an operation.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum OpsError {
    /// The broker failed (check its URL, credentials and that the queue exists).
    #[error(transparent)]
    Broker(#[from] BrokerError),
    /// The store failed (check its URL and that it answers).
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The broker offers no dead-letter queues.
    #[error("this broker has no dead-letter queues to manage")]
    NoDeadLetters,
}

/// A lane as operators see it.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct QueueView {
    /// The lane.
    pub name: String,
    /// Ready, in flight, delayed.
    pub depth: QueueDepth,
    /// Parked in its dead-letter queue.
    pub dead_lettered: Option<u64>,
    /// Consumers, when the broker knows.
    pub consumers: Option<u64>,
    /// Runs in flight from this lane, as the live workers report them (a broker such as
    /// RabbitMQ does not say how many of its messages are delivered and unacked).
    pub running: u64,
}

/// A task as operators see it (`ops().task(id)`): its [`TaskStatus`] — what a client's
/// `status()` says — with the stored result, the last progress and what its claim says.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct TaskInfo {
    /// The task.
    pub id: TaskId,
    /// Finished, started or pending.
    pub status: TaskStatus,
    /// Its stored result.
    pub result: Option<TaskResult>,
    /// Its last reported progress.
    pub progress: Option<Value>,
    /// What its claim says.
    pub claim: Option<ClaimInfo>,
}

/// Where a long redrive or purge stands: dead letters looked at, acted on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct Progress {
    /// Looked at so far.
    pub seen: u64,
    /// Redriven or purged so far.
    pub done: u64,
}

/// What a redrive did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct RedriveReport {
    /// Sent back to their lane.
    pub redriven: u64,
    /// Left parked: not matching the filter.
    pub kept: u64,
    /// Left parked: a run holds the task now.
    pub running: u64,
    /// Left parked: its task was already redriven by this call (a second dead letter of the
    /// task, or one parked again after failing while the redrive ran).
    pub parked_again: u64,
}

/// What a purge did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct PurgeReport {
    /// Removed for good.
    pub purged: u64,
    /// Left parked.
    pub kept: u64,
    /// Purged tasks parked without a result (by the broker's own redrive limit, or of a wire
    /// version the worker did not read) that got a `Cancelled` one, so their callers stop
    /// waiting.
    pub answered: u64,
}

/// Operations on one broker and store, from [`Client::ops`].
#[derive(Debug, Clone)]
pub struct Ops {
    client: Client,
}

impl Client {
    /// Operations on this client's broker and store.
    pub fn ops(&self) -> Ops {
        Ops {
            client: self.clone(),
        }
    }
}

/// Dead letters are taken this many at a time.
const BATCH: usize = 100;

impl Ops {
    fn dlq(&self) -> Result<&dyn DeadLetterQueue, OpsError> {
        self.client
            .broker()
            .dead_letters()
            .ok_or(OpsError::NoDeadLetters)
    }

    /// The lanes: depth, dead letters, consumers.
    pub async fn queues(&self) -> Result<Vec<QueueView>, OpsError> {
        let broker = self.client.broker();
        let workers = self.client.store().workers().await?;
        let mut out = Vec::new();
        for (name, depth) in broker.queue_depths().await? {
            let running = workers
                .iter()
                .flat_map(|w| &w.runs)
                .filter(|r| r.lane == name)
                .count() as u64;
            let dead_lettered = match broker.dead_letters() {
                Some(dlq) => Some(dlq.dead_count(&name).await?),
                None => None,
            };
            let consumers = broker.consumer_count(Some(&name)).await.map(|(_, n)| n);
            out.push(QueueView {
                name,
                depth,
                dead_lettered,
                consumers,
                running,
            });
        }
        Ok(out)
    }

    /// Workers alive (reported within their lease) and their runs in flight.
    pub async fn workers(&self) -> Result<Vec<WorkerInfo>, StoreError> {
        self.client.store().workers().await
    }

    /// A task's status, result, progress and claim.
    pub async fn task(&self, id: &TaskId) -> Result<TaskInfo, StoreError> {
        let store = self.client.store();
        let result = match store.get(id).await? {
            ResultStatus::Ready(r) => Some(r),
            _ => None,
        };
        Ok(TaskInfo {
            id: id.clone(),
            status: self.client.handle::<Value>(id.clone()).status().await?,
            result,
            progress: store.progress(id).await?.map(|p| p.meta),
            claim: store.claim_info(id).await?,
        })
    }

    /// Dead letters of `lane`, oldest first: `limit` from `offset`. Every one is put back as
    /// it was.
    pub async fn dead_letters(
        &self,
        lane: &str,
        offset: usize,
        limit: usize,
    ) -> Result<Vec<DeadMessage>, OpsError> {
        self.dead_letters_matching(lane, &DeadFilter::all(), offset, limit)
            .await
    }

    /// The dead letters of `lane` matching `filter`, oldest first: `limit` from `offset`.
    /// Every one looked at is put back as it was.
    pub async fn dead_letters_matching(
        &self,
        lane: &str,
        filter: &DeadFilter,
        offset: usize,
        limit: usize,
    ) -> Result<Vec<DeadMessage>, OpsError> {
        let dlq = self.dlq()?;
        let now_ms = self.client.clock().now_unix_ms();
        // Everything taken, in order (all of it goes back); the page picked from it.
        let mut held = Vec::new();
        let mut page = Vec::new();
        let mut matched = 0usize;
        let wanted = offset.saturating_add(limit);
        while matched < wanted {
            let got = match dlq.take_dead(lane, BATCH).await {
                Ok(got) => got,
                Err(e) => {
                    dlq.return_dead(held).await?;
                    return Err(e.into());
                }
            };
            if got.is_empty() {
                break;
            }
            for m in got {
                // A dead-letter queue several lanes share holds others' too.
                if m.lane == lane && filter.matches(&m, now_ms) {
                    if matched >= offset && matched < wanted {
                        page.push(m.clone());
                    }
                    matched += 1;
                }
                held.push(m);
            }
        }
        dlq.return_dead(held).await?;
        Ok(page)
    }

    /// How many dead letters of `lane` match `filter` (each one looked at is put back).
    pub async fn count_dead_letters(
        &self,
        lane: &str,
        filter: &DeadFilter,
    ) -> Result<u64, OpsError> {
        Ok(self
            .dead_letters_matching(lane, filter, 0, usize::MAX)
            .await?
            .len() as u64)
    }

    /// Sends back every dead letter of `lane` matching `filter`, each reset first so it runs
    /// again with a fresh attempt budget. `progress` hears after each one. A task is sent back
    /// once per call: one that fails again and is parked again while the redrive goes on stays
    /// parked (`parked_again`) rather than being chased round the loop.
    pub async fn redrive(
        &self,
        lane: &str,
        filter: &DeadFilter,
        mut progress: impl FnMut(Progress),
    ) -> Result<RedriveReport, OpsError> {
        let dlq = self.dlq()?;
        let store = self.client.store();
        let now_ms = self.client.clock().now_unix_ms();
        let mut report = RedriveReport::default();
        let mut kept = Vec::new();
        let mut seen = 0;
        // What this call sent back: its task id, or its body when it has none (unreadable).
        let mut redriven = std::collections::HashSet::new();
        let outcome: Result<(), OpsError> = async {
            loop {
                let batch = dlq.take_dead(lane, BATCH).await?;
                if batch.is_empty() {
                    return Ok(());
                }
                for m in batch {
                    if m.lane != lane {
                        kept.push(m);
                        continue;
                    }
                    seen += 1;
                    if !filter.matches(&m, now_ms) {
                        report.kept += 1;
                        kept.push(m);
                        continue;
                    }
                    let key = match &m.task_id {
                        Some(id) => id.as_str().as_bytes().to_vec(),
                        None => m.body.clone(),
                    };
                    if redriven.contains(&key) {
                        report.parked_again += 1;
                        kept.push(m);
                        continue;
                    }
                    if let Some(id) = &m.task_id {
                        if store.reset_for_redrive(id, &m.id).await? == RedriveReset::Running {
                            report.running += 1;
                            kept.push(m);
                            continue;
                        }
                    }
                    // Out of the index before it goes back: the run may park it again at
                    // once, and that entry must stay.
                    let entry = DeadEntry::of(&m);
                    store
                        .unindex_dead(lane, std::slice::from_ref(&entry.key))
                        .await?;
                    let body = fresh_body(&m.body);
                    if let Err(e) = dlq.redrive_dead(&m, body).await {
                        let _ = store.index_dead(&[entry]).await;
                        return Err(e.into());
                    }
                    redriven.insert(key);
                    report.redriven += 1;
                    progress(Progress {
                        seen,
                        done: report.redriven,
                    });
                }
            }
        }
        .await;
        dlq.return_dead(kept).await?;
        outcome.map(|()| report)
    }

    /// Gives a purged task that was parked without a result a `Cancelled` one (as a revoke
    /// does: a late copy is then acked unrun), unless a copy of it runs now; whether it wrote
    /// one. Only for the reasons a worker parks without writing a result — the broker's own
    /// redrive limit, a newer wire version: for every other reason a result was written when it
    /// was parked, and a task that has none now was reset by a redrive whose copy is on its way.
    async fn answer_purged(&self, m: &DeadMessage) -> Result<bool, OpsError> {
        let parked_without_result = m
            .reason
            .as_deref()
            .and_then(DeadLetterReason::parse)
            .is_some_and(|r| {
                matches!(
                    r,
                    DeadLetterReason::RedriveLimit | DeadLetterReason::UnsupportedWireVersion
                )
            });
        let (true, Some(id)) = (parked_without_result, &m.task_id) else {
            return Ok(false);
        };
        let store = self.client.store();
        let running = store
            .claim_info(id)
            .await?
            .is_some_and(|c| c.state == ClaimState::Running);
        if running {
            return Ok(false);
        }
        let result = TaskResult::failure(
            ErrorKind::Cancelled,
            "removed from the dead-letter queue by a purge before it had a result",
            false,
            m.attempts,
            0.0,
            Default::default(),
        );
        Ok(store.revoke(id, &result).await?)
    }

    /// Removes every dead letter of `lane` matching `filter` for good. A task parked without a
    /// result gets a `Cancelled` one ([`PurgeReport::answered`]).
    pub async fn purge(
        &self,
        lane: &str,
        filter: &DeadFilter,
        mut progress: impl FnMut(Progress),
    ) -> Result<PurgeReport, OpsError> {
        let dlq = self.dlq()?;
        let now_ms = self.client.clock().now_unix_ms();
        let mut report = PurgeReport::default();
        let mut kept = Vec::new();
        let mut seen = 0;
        let outcome: Result<(), OpsError> = async {
            loop {
                let batch = dlq.take_dead(lane, BATCH).await?;
                if batch.is_empty() {
                    return Ok(());
                }
                for m in batch {
                    if m.lane != lane {
                        kept.push(m);
                        continue;
                    }
                    seen += 1;
                    if filter.matches(&m, now_ms) {
                        // Answered first: a purge that stops between the two leaves the
                        // letter parked with its answer written, never a caller waiting forever.
                        if self.answer_purged(&m).await? {
                            report.answered += 1;
                        }
                        dlq.drop_dead(&m).await?;
                        self.client
                            .store()
                            .unindex_dead(lane, &[m.index_key()])
                            .await?;
                        report.purged += 1;
                        progress(Progress {
                            seen,
                            done: report.purged,
                        });
                    } else {
                        report.kept += 1;
                        kept.push(m);
                    }
                }
            }
        }
        .await;
        dlq.return_dead(kept).await?;
        outcome.map(|()| report)
    }
}

/// A dead letter's body as it goes back: no earlier failures carried (`_retries`), due now,
/// and no deadline — the redrive is the decision to run it (an `expired` task would expire
/// again at once). A body that is not a message goes back as it was.
fn fresh_body(body: &[u8]) -> Vec<u8> {
    let Ok(mut msg) = TaskMessage::from_json(body) else {
        return body.to_vec();
    };
    for label in [
        names::RETRIES,
        names::DUE_AT,
        names::DELAY,
        names::X_DELAY,
        names::DEADLINE_AT,
    ] {
        msg.labels.remove(label);
    }
    msg.to_json().unwrap_or_else(|_| body.to_vec())
}
