//! The dead-letter index: what a lane's dead-letter queue holds, kept in the store so that a
//! page of 100,000 dead letters filtered by task, reason, age or error text is one store read,
//! not a walk through the broker's queue.
//!
//! Workers add an entry when they park a message; [`crate::ops`]'s redrive and purge remove
//! what they take away, and [`Ops::reindex_dead`](crate::ops::Ops::reindex_dead) rebuilds a
//! lane's index from its queue (for what was parked before the index existed, by the broker
//! itself, or by a worker that died between parking and indexing). The broker's queue stays
//! the truth: the index is what a page *lists*; every action still takes the dead letters from
//! the queue.

use std::time::Duration;

use crate::broker::dead_letters::dead_index_key;
use crate::dead_letters::{DeadFilter, DeadMessage};
use crate::wire::TaskId;

/// The longest error text an entry keeps (characters).
pub const DEAD_DETAIL_KEPT: usize = 500;
/// The longest arguments preview an entry keeps (characters).
pub const DEAD_ARGS_KEPT: usize = 300;

/// One dead letter as the index keeps it. `Debug` leaves the arguments out (user data).
///
/// ```
/// use ferriq::store::DeadEntry;
/// let e = DeadEntry::new("jobs", None, br#"{"task_name":"t","args":[1]}"#)
///     .reason("retries_exhausted")
///     .detail("boom")
///     .dead_at_ms(1_700_000_000_000);
/// assert_eq!(e.task_name.as_deref(), Some("t"));
/// assert_eq!(e.arguments, "[1]");
/// ```
#[derive(Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct DeadEntry {
    /// Which dead letter: its task id, or for a body that is not a task, a hash of the body
    /// ([`dead_index_key`]). A task parked twice is one entry, the latest.
    pub key: String,
    /// The lane it came from.
    pub lane: String,
    /// The task, when the body names one.
    pub task_id: Option<TaskId>,
    /// The task name, when known.
    pub task_name: Option<String>,
    /// Why it was parked.
    pub reason: Option<String>,
    /// The error's detail, at most [`DEAD_DETAIL_KEPT`] characters.
    pub detail: String,
    /// Attempts made.
    pub attempts: u32,
    /// When it was parked (unix ms).
    pub dead_at_ms: u64,
    /// Its arguments as JSON text, at most [`DEAD_ARGS_KEPT`] characters (user data: shown
    /// escaped, never logged).
    pub arguments: String,
}

impl std::fmt::Debug for DeadEntry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeadEntry")
            .field("key", &self.key)
            .field("lane", &self.lane)
            .field("task_id", &self.task_id)
            .field("task_name", &self.task_name)
            .field("reason", &self.reason)
            .field("attempts", &self.attempts)
            .field("dead_at_ms", &self.dead_at_ms)
            .finish_non_exhaustive()
    }
}

fn cut(s: &str, max: usize) -> String {
    s.chars().take(max).collect()
}

impl DeadEntry {
    /// An entry for a message of `lane` with `body` (the task id, name and arguments are read
    /// from it when it is a task message).
    pub fn new(lane: impl Into<String>, task_id: Option<TaskId>, body: &[u8]) -> Self {
        let task_id = task_id.or_else(|| crate::wire::TaskMessage::peek_task_id(body));
        let value = serde_json::from_slice::<serde_json::Value>(body).ok();
        let arguments = match value.as_ref().filter(|v| v.is_object()) {
            Some(v) => {
                let mut s = v.get("args").map_or("null".into(), |a| a.to_string());
                if let Some(k) = v.get("kwargs").and_then(|k| k.as_object()) {
                    if !k.is_empty() {
                        s.push(' ');
                        s.push_str(&serde_json::Value::Object(k.clone()).to_string());
                    }
                }
                cut(&s, DEAD_ARGS_KEPT)
            }
            None => format!("(unreadable body, {} bytes)", body.len()),
        };
        DeadEntry {
            key: dead_index_key(task_id.as_ref(), body),
            lane: lane.into(),
            task_name: crate::wire::TaskMessage::peek_task_name(body),
            task_id,
            reason: None,
            detail: String::new(),
            attempts: 0,
            dead_at_ms: 0,
            arguments,
        }
    }

    /// The entry of a dead letter taken from its queue.
    pub fn of(m: &DeadMessage) -> Self {
        let mut e = DeadEntry::new(m.lane.clone(), m.task_id.clone(), &m.body)
            .detail(&m.detail)
            .attempts(m.attempts)
            .dead_at_ms(m.dead_at_ms.unwrap_or(0));
        e.reason = m.reason.clone();
        if m.task_name.is_some() {
            e.task_name = m.task_name.clone();
        }
        e
    }

    /// With the task name (when the body's cannot be read).
    pub fn task_name(mut self, name: impl Into<String>) -> Self {
        self.task_name = Some(name.into());
        self
    }

    /// With why it was parked.
    pub fn reason(mut self, reason: impl Into<String>) -> Self {
        self.reason = Some(reason.into());
        self
    }

    /// With the error's detail (cut to [`DEAD_DETAIL_KEPT`]).
    pub fn detail(mut self, detail: &str) -> Self {
        self.detail = cut(detail, DEAD_DETAIL_KEPT);
        self
    }

    /// With the attempts made.
    pub fn attempts(mut self, attempts: u32) -> Self {
        self.attempts = attempts;
        self
    }

    /// With when it was parked.
    pub fn dead_at_ms(mut self, at: u64) -> Self {
        self.dead_at_ms = at;
        self
    }

    /// Whether the entry matches `filter` at `now_ms`. A filter naming dead-letter ids (the
    /// broker's, which the index does not keep) matches no entry.
    pub fn matches(&self, filter: &DeadFilter, now_ms: u64) -> bool {
        filter.id.is_none()
            && filter.ids.is_empty()
            && (filter.keys.is_empty() || filter.keys.contains(&self.key))
            && filter.matches_fields(
                self.reason.as_deref(),
                self.task_name.as_deref(),
                self.task_id.as_ref(),
                &self.detail,
                Some(Duration::from_millis(
                    now_ms.saturating_sub(self.dead_at_ms),
                )),
            )
    }
}

/// A page of the index, newest first.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct DeadPage {
    /// The entries of the page.
    pub entries: Vec<DeadEntry>,
    /// How many entries match the filter in all.
    pub total: u64,
    /// How many entries the lane's index holds (matching or not).
    pub indexed: u64,
}

impl DeadPage {
    /// A page.
    pub fn new(entries: Vec<DeadEntry>, total: u64, indexed: u64) -> Self {
        DeadPage {
            entries,
            total,
            indexed,
        }
    }
}
