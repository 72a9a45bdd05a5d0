//! Dead-letter queues, as operators use them: look at what was parked and why, send it back
//! to run again, or throw it away.
//!
//! A broker exposes its dead-letter queues through [`DeadLetterQueue`] (from
//! [`Broker::dead_letters`](crate::broker::Broker::dead_letters)); [`crate::ops`] builds listing,
//! redriving and purging on it, with the store's reset so a redriven task really runs again.
//!
//! Here too: why a message is parked ([`DeadLetterReason`]) and what its parked copy carries
//! ([`DeadLetter`]), the worker's side of the same queues.

use std::time::Duration;

use async_trait::async_trait;

use super::{BrokerError, DeliveryHandle};
use crate::wire::TaskId;

/// A message parked in a dead-letter queue, held by the operator's session until it is
/// returned, redriven or dropped (a session that dies returns it by itself).
/// `Debug` shows the body's size, never its content (user data).
#[derive(Clone)]
#[non_exhaustive]
pub struct DeadMessage {
    /// The dead letter's own id (one per parking, stable while it stays parked).
    pub id: String,
    /// The queue (lane) it came from.
    pub lane: String,
    /// The task, when it can be read.
    pub task_id: Option<TaskId>,
    /// The task name, when known.
    pub task_name: Option<String>,
    /// Why it was parked, as recorded (`retries_exhausted`, …; another system's dead letter has
    /// none).
    pub reason: Option<String>,
    /// The error's detail.
    pub detail: String,
    /// Attempts made.
    pub attempts: u32,
    /// When it was parked (unix ms), when known.
    pub dead_at_ms: Option<u64>,
    /// The body as it was received.
    pub body: Vec<u8>,
    /// The broker's handle.
    pub handle: DeliveryHandle,
}

impl std::fmt::Debug for DeadMessage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeadMessage")
            .field("id", &self.id)
            .field("lane", &self.lane)
            .field("task_id", &self.task_id)
            .field("task_name", &self.task_name)
            .field("reason", &self.reason)
            .field("attempts", &self.attempts)
            .field("dead_at_ms", &self.dead_at_ms)
            .field("body", &format_args!("<{} bytes>", self.body.len()))
            .finish_non_exhaustive()
    }
}

impl DeadMessage {
    /// A dead letter, for broker implementations.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        id: impl Into<String>,
        lane: impl Into<String>,
        reason: Option<String>,
        detail: impl Into<String>,
        task_name: Option<String>,
        attempts: u32,
        dead_at_ms: Option<u64>,
        body: Vec<u8>,
        handle: DeliveryHandle,
    ) -> Self {
        let task_id = crate::wire::TaskMessage::peek_task_id(&body);
        let task_name = task_name.or_else(|| crate::wire::TaskMessage::peek_task_name(&body));
        DeadMessage {
            id: id.into(),
            lane: lane.into(),
            task_id,
            task_name,
            reason,
            detail: detail.into(),
            attempts,
            dead_at_ms,
            body,
            handle,
        }
    }

    /// Its key in the store's dead-letter index ([`dead_index_key`]).
    pub fn index_key(&self) -> String {
        dead_index_key(self.task_id.as_ref(), &self.body)
    }

    /// The reason as ferriq's, when it is one.
    pub fn reason_kind(&self) -> Option<DeadLetterReason> {
        DeadLetterReason::parse(self.reason.as_deref()?)
    }

    /// How long it has been parked, at `now_ms`.
    pub fn age(&self, now_ms: u64) -> Option<Duration> {
        self.dead_at_ms
            .map(|at| Duration::from_millis(now_ms.saturating_sub(at)))
    }
}

/// Which dead letters an operation touches: every condition given must hold.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct DeadFilter {
    /// This reason (`retries_exhausted`, …).
    pub reason: Option<String>,
    /// This task name.
    pub task_name: Option<String>,
    /// This task.
    pub task_id: Option<TaskId>,
    /// This dead letter.
    pub id: Option<String>,
    /// Parked at least this long ago.
    pub older_than: Option<Duration>,
    /// Its error text contains this (ignoring case).
    pub detail_contains: Option<String>,
    /// One of these dead letters (empty: any).
    pub ids: Vec<String>,
    /// One of these dead letters by index key ([`crate::store::dead_index_key`]; empty: any).
    pub keys: Vec<String>,
}

impl DeadFilter {
    /// Every dead letter.
    pub fn all() -> Self {
        DeadFilter::default()
    }

    /// Only those parked for `reason`.
    pub fn reason(mut self, reason: impl Into<String>) -> Self {
        self.reason = Some(reason.into());
        self
    }

    /// Only those of task `name`.
    pub fn task_name(mut self, name: impl Into<String>) -> Self {
        self.task_name = Some(name.into());
        self
    }

    /// Only the dead letters of task `id`.
    pub fn task_id(mut self, id: TaskId) -> Self {
        self.task_id = Some(id);
        self
    }

    /// Only the dead letter `id`.
    pub fn id(mut self, id: impl Into<String>) -> Self {
        self.id = Some(id.into());
        self
    }

    /// Only those parked at least `age` ago.
    pub fn older_than(mut self, age: Duration) -> Self {
        self.older_than = Some(age);
        self
    }

    /// Only those whose error text contains `text`, ignoring case.
    pub fn detail_contains(mut self, text: impl Into<String>) -> Self {
        self.detail_contains = Some(text.into().to_lowercase());
        self
    }

    /// Only the dead letters `ids` (a selection).
    pub fn any_of_ids(mut self, ids: impl IntoIterator<Item = String>) -> Self {
        self.ids = ids.into_iter().collect();
        self
    }

    /// Only the dead letters whose index keys are `keys` (a selection from the store's index,
    /// [`crate::store::DeadEntry::key`]).
    pub fn any_of_keys(mut self, keys: impl IntoIterator<Item = String>) -> Self {
        self.keys = keys.into_iter().collect();
        self
    }

    /// Whether `m` is one of them (at `now_ms`).
    pub fn matches(&self, m: &DeadMessage, now_ms: u64) -> bool {
        self.id.as_deref().is_none_or(|id| m.id == id)
            && (self.ids.is_empty() || self.ids.contains(&m.id))
            && (self.keys.is_empty() || self.keys.contains(&m.index_key()))
            && self.matches_fields(
                m.reason.as_deref(),
                m.task_name.as_deref(),
                m.task_id.as_ref(),
                &m.detail,
                m.age(now_ms),
            )
    }

    /// The conditions a dead letter and an index entry are read alike by: reason, task name,
    /// task id, error text and age (`None`: unknown, never old enough).
    pub(crate) fn matches_fields(
        &self,
        reason: Option<&str>,
        task_name: Option<&str>,
        task_id: Option<&TaskId>,
        detail: &str,
        age: Option<Duration>,
    ) -> bool {
        self.reason.as_deref().is_none_or(|r| reason == Some(r))
            && self
                .task_name
                .as_deref()
                .is_none_or(|n| task_name == Some(n))
            && self.task_id.as_ref().is_none_or(|id| task_id == Some(id))
            && self
                .detail_contains
                .as_deref()
                .is_none_or(|t| detail.to_lowercase().contains(&t.to_lowercase()))
            && self
                .older_than
                .is_none_or(|min| age.is_some_and(|age| age >= min))
    }
}

/// A broker's dead-letter queues. Object-safe.
#[async_trait]
pub trait DeadLetterQueue: Send + Sync {
    /// Takes up to `max` dead letters of `lane`, oldest first, held from everyone else until
    /// returned, redriven or dropped.
    async fn take_dead(&self, lane: &str, max: usize) -> Result<Vec<DeadMessage>, BrokerError>;
    /// Puts held dead letters back as they were (in their order, where the broker keeps one).
    async fn return_dead(&self, held: Vec<DeadMessage>) -> Result<(), BrokerError>;
    /// Sends `body` to the dead letter's lane — confirmed — and only then removes the dead
    /// letter: a session that dies in between leaves both (a duplicate the claims absorb).
    async fn redrive_dead(&self, held: &DeadMessage, body: Vec<u8>) -> Result<(), BrokerError>;
    /// Removes a held dead letter for good.
    async fn drop_dead(&self, held: &DeadMessage) -> Result<(), BrokerError>;
    /// How many dead letters `lane` has (when the broker can count them). A dead-letter queue
    /// several lanes share is counted whole (SQS: counting one lane's would mean reading them).
    async fn dead_count(&self, lane: &str) -> Result<u64, BrokerError>;
}

/// Why a message is parked in the dead-letter queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum DeadLetterReason {
    /// The body is not a task message.
    InvalidMessage,
    /// The body is larger than allowed.
    TooLarge,
    /// Written by a newer ferriq wire version than this worker runs.
    UnsupportedWireVersion,
    /// No worker serves its task name.
    UnknownTask,
    /// The task failed with an error no retry can fix.
    NonRetryable,
    /// Every attempt failed.
    RetriesExhausted,
    /// Its deadline (`deadline_at`) passed before it could start: it never ran. Redriving it
    /// runs it without a deadline.
    Expired,
    /// The broker's own redrive limit (SQS `maxReceiveCount`, quorum `x-delivery-limit`, the
    /// memory broker's `max_receives`) moved it: a backstop, not the worker's decision.
    RedriveLimit,
}

impl DeadLetterReason {
    /// Every reason.
    pub const ALL: [DeadLetterReason; 8] = [
        DeadLetterReason::InvalidMessage,
        DeadLetterReason::TooLarge,
        DeadLetterReason::UnsupportedWireVersion,
        DeadLetterReason::UnknownTask,
        DeadLetterReason::NonRetryable,
        DeadLetterReason::RetriesExhausted,
        DeadLetterReason::Expired,
        DeadLetterReason::RedriveLimit,
    ];

    /// The reason named `name` ([`DeadLetterReason::as_str`]).
    pub fn parse(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|r| r.as_str() == name)
    }

    /// A stable name, written as a header/attribute.
    pub fn as_str(self) -> &'static str {
        match self {
            DeadLetterReason::InvalidMessage => "invalid_message",
            DeadLetterReason::TooLarge => "too_large",
            DeadLetterReason::UnsupportedWireVersion => "unsupported_wire_version",
            DeadLetterReason::UnknownTask => "unknown_task",
            DeadLetterReason::NonRetryable => "non_retryable",
            DeadLetterReason::RetriesExhausted => "retries_exhausted",
            DeadLetterReason::Expired => "expired",
            DeadLetterReason::RedriveLimit => "redrive_limit",
        }
    }
}

/// What a dead-lettered copy carries besides its body.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct DeadLetter {
    /// Why.
    pub reason: DeadLetterReason,
    /// A human-readable detail (the error message).
    pub detail: String,
    /// The task name, when known.
    pub task_name: Option<String>,
    /// Attempts made.
    pub attempts: u32,
}

impl DeadLetter {
    /// A dead-letter record.
    pub fn new(
        reason: DeadLetterReason,
        detail: impl Into<String>,
        task_name: Option<String>,
        attempts: u32,
    ) -> Self {
        DeadLetter {
            reason,
            detail: detail.into(),
            task_name,
            attempts,
        }
    }
}

/// The index key of a dead letter: its task id, or `body:<uuid v5 of the body>` for a body
/// that names none — the same for the worker that parks it and the operator who takes it.
pub fn dead_index_key(task_id: Option<&TaskId>, body: &[u8]) -> String {
    match task_id {
        Some(id) => id.as_str().to_owned(),
        None => format!(
            "body:{}",
            uuid::Uuid::new_v5(&uuid::Uuid::NAMESPACE_OID, body)
        ),
    }
}
