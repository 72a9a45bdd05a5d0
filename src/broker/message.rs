//! What goes out: a message to publish, and a refusal of one in a batch.

use std::borrow::Cow;
use std::fmt;
use std::time::Duration;

use crate::clock::Clock;
use crate::wire::{Labels, TaskId, TaskMessage, TaskName, WireError, MAX_DELAY};

/// A message ready to publish: the taskiq body plus what brokers need to route it. `Debug`
/// shows the body's size, never its content (user data).
#[derive(Clone)]
#[non_exhaustive]
pub struct OutgoingMessage {
    /// The task's id (also sent as a header/attribute, as taskiq-aio-pika does).
    pub task_id: TaskId,
    /// The task's name.
    pub task_name: TaskName,
    /// The compact JSON body.
    pub body: Vec<u8>,
    /// The message's labels, which brokers that carry headers write as
    /// [`OutgoingMessage::headers`] (the body has them too). `queue`, `delay` and `priority`
    /// were read from them when the message was built: changing a label here changes only the
    /// headers.
    pub labels: Labels,
    /// The queue (lane) from the `queue_name` label; `None` is the broker's default queue.
    pub queue: Option<String>,
    /// How long the broker should keep the message from consumers: until its `due_at` label.
    /// Brokers that cannot hold it that long deliver it earlier, and the worker releases it
    /// again until it is due.
    pub delay: Option<Duration>,
    /// Priority from the `priority` label.
    pub priority: Option<u8>,
}

impl OutgoingMessage {
    /// Serialises a message and derives its routing from its labels, reading the system clock
    /// for the delay.
    pub fn from_message(message: &TaskMessage) -> Result<Self, WireError> {
        Self::from_message_at(message, Clock::system().now_unix())
    }

    /// Serialises a message and derives its routing from its labels; `now_unix` is the time
    /// its delay (until `due_at`) is counted from.
    pub fn from_message_at(message: &TaskMessage, now_unix: f64) -> Result<Self, WireError> {
        let body = message.to_json()?;
        Ok(Self::routed(
            message.task_id.clone(),
            message.task_name.clone(),
            body,
            message.labels.clone(),
            now_unix,
        ))
    }

    /// [`from_message_at`](Self::from_message_at), taking the message: its name is moved, not
    /// copied (an enqueue that keeps no copy of its message for middleware).
    pub(crate) fn from_owned_message_at(
        message: TaskMessage,
        now_unix: f64,
    ) -> Result<Self, WireError> {
        let body = message.to_json()?;
        Ok(Self::routed(
            message.task_id,
            message.task_name,
            body,
            message.labels,
            now_unix,
        ))
    }

    /// The message with its routing read from its labels.
    fn routed(
        task_id: TaskId,
        task_name: TaskName,
        body: Vec<u8>,
        labels: Labels,
        now_unix: f64,
    ) -> Self {
        OutgoingMessage {
            task_id,
            task_name,
            body,
            queue: labels.queue_name().map(str::to_owned),
            delay: labels
                .due_at()
                .map(|due| due - now_unix)
                .filter(|left| *left > 0.0)
                .map(|left| Duration::from_secs_f64(left.min(MAX_DELAY.as_secs_f64()))),
            priority: labels.priority(),
            labels,
        }
    }

    /// The headers taskiq-aio-pika writes: `task_id`, `task_name`, then every label as a
    /// string. Written on demand, borrowing what is already text, so a broker without headers
    /// pays nothing for them.
    ///
    /// ```
    /// use ferriq::broker::OutgoingMessage;
    /// use ferriq::wire::TaskMessage;
    /// let mut msg = TaskMessage::new("emails.send");
    /// msg.labels.insert("retry_on_error", true);
    /// let out = OutgoingMessage::from_message(&msg).unwrap();
    /// let headers: Vec<(&str, String)> = out.headers().map(|(k, v)| (k, v.into_owned())).collect();
    /// assert_eq!(headers[1], ("task_name", "emails.send".to_owned()));
    /// assert_eq!(headers[2], ("retry_on_error", "True".to_owned()));
    /// ```
    pub fn headers(&self) -> impl Iterator<Item = (&str, Cow<'_, str>)> {
        // A raw body ([`OutgoingMessage::raw`], no task name) names no task: its made-up id
        // must not reach a worker as the id of an unreadable message.
        let named = !self.task_name.is_empty();
        [
            ("task_id", Cow::Borrowed(self.task_id.as_str())),
            ("task_name", Cow::Borrowed(self.task_name.as_str())),
        ]
        .into_iter()
        .filter(move |_| named)
        .chain(self.labels.iter().map(|(k, v)| (k, v.header_value())))
    }

    /// A message with an arbitrary body, for tests of what workers do with malformed input.
    pub fn raw(body: impl Into<Vec<u8>>) -> Self {
        OutgoingMessage {
            task_id: TaskId::random(),
            task_name: TaskName::default(),
            body: body.into(),
            labels: Labels::new(),
            queue: None,
            delay: None,
            priority: None,
        }
    }
}

impl fmt::Debug for OutgoingMessage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("OutgoingMessage")
            .field("task_id", &self.task_id)
            .field("task_name", &self.task_name)
            .field("body", &format_args!("<{} bytes>", self.body.len()))
            .field("queue", &self.queue)
            .field("delay", &self.delay)
            .finish_non_exhaustive()
    }
}

/// One message a broker refused in a batch it otherwise took.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct RejectedMessage {
    /// The refused message's task.
    pub task_id: TaskId,
    /// Why (the broker's words).
    pub reason: String,
}

impl RejectedMessage {
    /// A refusal.
    pub fn new(task_id: TaskId, reason: impl Into<String>) -> Self {
        RejectedMessage {
            task_id,
            reason: reason.into(),
        }
    }
}
