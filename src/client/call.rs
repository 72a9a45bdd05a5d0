//! A task call: name, arguments and labels, ready to enqueue.

use std::fmt;
use std::marker::PhantomData;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde_json::{Map, Value};

use crate::clock::Clock;
use crate::task::TaskOptions;
use crate::wire::{names, LabelValue, Labels, TaskId, TaskMessage, WireError, MAX_DELAY};

/// A task call ready to enqueue: name, arguments and labels, with its output type.
/// `#[task]` generates `task::call(args…)` returning one.
///
/// ```
/// use std::time::Duration;
/// #[ferriq::task(name = "docs.call.add")]
/// async fn add(a: i64, b: i64) -> i64 { a + b }
///
/// let call = add::call(1, 2).with_delay(Duration::from_secs(5)).with_label("tenant", "acme");
/// let msg = call.into_message().unwrap();
/// assert_eq!(msg.task_name, "docs.call.add");
/// assert_eq!(msg.args, [serde_json::json!(1), serde_json::json!(2)]);
/// // Due in 5 s: workers that receive it earlier hand it back until then.
/// let due_in = msg.labels.due_at().unwrap() - ferriq::clock::Clock::system().now_unix();
/// assert!(due_in > 4.9 && due_in < 5.1);
/// ```
#[must_use = "a Call does nothing until it is enqueued: `client.enqueue(call).await`"]
pub struct Call<T> {
    name: &'static str,
    args: Result<Vec<Value>, WireError>,
    kwargs: Map<String, Value>,
    labels: Labels,
    task_id: Option<TaskId>,
    deadline: Option<Duration>,
    due: Option<Due>,
    dedup: Option<DedupSpec>,
    _output: PhantomData<fn() -> T>,
}

/// An enqueue's deduplication: its key (`None`: the task and its arguments), window and mode.
#[derive(Debug, Clone)]
struct DedupSpec {
    key: Option<String>,
    /// The argument or label the key is taken from (the task's `dedup_key`).
    source: Option<crate::task::KeySource>,
    window: Duration,
    mode: crate::task::Dedup,
}

/// When a call is due.
#[derive(Debug, Clone, Copy)]
enum Due {
    After(Duration),
    At(f64),
}

impl<T> Call<T> {
    /// A call of task `name` with positional arguments. Its `timeout` and `queue` options
    /// become the `timeout` and `queue_name` labels, its `deadline` the `deadline_at` label; its retry options stay with the worker's
    /// own definition of the task. For a Python taskiq worker, which retries only what its
    /// message asks for, set them on the call: [`Call::with_max_attempts`] and
    /// `with_label("retry_on_error", true)`.
    pub fn new(
        name: &'static str,
        options: TaskOptions,
        args: impl IntoIterator<Item = Result<Value, WireError>>,
    ) -> Self {
        let mut labels = Labels::new();
        if let Some(t) = options.get_timeout() {
            labels.insert_named(names::TIMEOUT, t.as_secs_f64());
        }
        if let Some(q) = options.get_queue() {
            labels.insert_named(names::QUEUE_NAME, q);
        }
        Call {
            name,
            args: args.into_iter().collect(),
            kwargs: Map::new(),
            labels,
            task_id: None,
            deadline: options.get_deadline(),
            due: None,
            dedup: options.get_unique_for().map(|(window, mode)| DedupSpec {
                key: None,
                source: options.get_dedup_key(),
                window,
                mode,
            }),
            _output: PhantomData,
        }
    }

    /// Sets the task id (an idempotency key chosen by the caller); default: random.
    pub fn with_task_id(mut self, id: TaskId) -> Self {
        self.task_id = Some(id);
        self
    }

    /// Sets a label.
    pub fn with_label(mut self, name: impl Into<String>, value: impl Into<LabelValue>) -> Self {
        self.labels.insert(name, value);
        self
    }

    /// Delays the first run by `delay` from enqueueing (up to [`MAX_DELAY`]; longer delays
    /// are clamped). The message carries its due time (`due_at`), so a delay survives
    /// redeliveries and works the same on every broker.
    pub fn with_delay(mut self, delay: Duration) -> Self {
        self.due = Some(Due::After(delay.min(MAX_DELAY)));
        self
    }

    /// The first run is not before `at` (a time in the past runs at once).
    pub fn with_due_at(mut self, at: SystemTime) -> Self {
        let unix = at
            .duration_since(UNIX_EPOCH)
            .map_or(0.0, |d| d.as_secs_f64());
        self.due = Some(Due::At(unix));
        self
    }

    /// Overrides the run's timeout.
    pub fn with_timeout(self, timeout: Duration) -> Self {
        self.with_label(names::TIMEOUT, timeout.as_secs_f64())
    }

    /// Overrides total attempts.
    pub fn with_max_attempts(self, attempts: u32) -> Self {
        self.with_label(names::MAX_RETRIES, attempts.max(1))
    }

    /// Routes to another queue (lane).
    pub fn with_queue(self, queue: impl Into<String>) -> Self {
        self.with_label(names::QUEUE_NAME, queue.into())
    }

    /// Sets the priority.
    pub fn with_priority(self, priority: u8) -> Self {
        self.with_label(names::PRIORITY, i64::from(priority))
    }

    /// The task must start within `within` of when it is due (enqueue time plus its delay)
    /// or it expires: it never runs, its waiter gets `DeadlineExceeded`, and the message is
    /// parked with reason `expired`, to be listed and redriven. `None` for no deadline.
    /// Default: the task's `deadline` option, and without one none — a task waits for a
    /// worker as long as it takes.
    pub fn with_deadline(mut self, within: Option<Duration>) -> Self {
        self.deadline = within;
        self
    }

    /// Deduplicates this enqueue by `key`: another enqueue with the same key (of any task)
    /// within `window` gets this one's handle back and sends nothing — while this task is
    /// queued or running, or for the whole window with [`Dedup::Window`](crate::task::Dedup).
    /// A task's `unique_for` option does the same with the task and its arguments as the key.
    pub fn with_dedup_key(
        mut self,
        key: impl Into<String>,
        window: Duration,
        mode: crate::task::Dedup,
    ) -> Self {
        self.dedup = Some(DedupSpec {
            key: Some(key.into()),
            source: None,
            window,
            mode,
        });
        self
    }

    /// The message this call sends, timed by the system clock.
    pub fn into_message(self) -> Result<TaskMessage, WireError> {
        self.into_message_at(&Clock::system())
    }

    /// The message this call sends, its due time and deadline read from `clock`.
    pub fn into_message_at(self, clock: &Clock) -> Result<TaskMessage, WireError> {
        let mut labels = self.labels;
        let now = clock.now_unix();
        let mut due = match self.due {
            None => None,
            Some(Due::After(delay)) => Some(now + delay.as_secs_f64()),
            Some(Due::At(at)) => Some(at.min(now + MAX_DELAY.as_secs_f64())),
        };
        if let Some(dedup) = &self.dedup {
            if dedup.mode == crate::task::Dedup::Debounce {
                // It runs once its key has been quiet for the window: not before the window.
                let quiet = now + dedup.window.as_secs_f64().min(MAX_DELAY.as_secs_f64());
                due = Some(due.map_or(quiet, |d| d.max(quiet)));
            }
        }
        if let Some(due) = due.filter(|due| *due > now) {
            // Milliseconds are plenty, and keep the label short.
            labels.insert_named(names::DUE_AT, (due * 1000.0).ceil() / 1000.0);
            // taskiq's own label, for its tools and middlewares; workers go by `due_at`.
            labels.insert_named(names::DELAY, ((due - now) * 1000.0).round() / 1000.0);
        }
        if let Some(within) = self.deadline {
            let from = due.unwrap_or(now).max(now);
            // Whole seconds keep the label readable by Python as an int.
            labels.insert_named(
                names::DEADLINE_AT,
                (from + within.as_secs_f64()).ceil().min(i64::MAX as f64) as i64,
            );
        }
        let mut msg = TaskMessage {
            task_id: self.task_id.unwrap_or_else(TaskId::random),
            task_name: crate::wire::TaskName::from_static(self.name),
            labels,
            args: self.args?,
            kwargs: self.kwargs,
        };
        if let Some(dedup) = self.dedup {
            let from_source = dedup
                .source
                .and_then(|source| source.value_in(&msg))
                .map(|value| format!("{}\n{value}", self.name));
            let key = match (dedup.key, from_source) {
                (Some(key), _) => key,
                (None, Some(key)) => key,
                // Debounced, the latest arguments win: the key is the task.
                (None, None) if dedup.mode == crate::task::Dedup::Debounce => self.name.to_owned(),
                // The task and its arguments: the same call is the same key. (serde_json's maps
                // are ordered, so equal keyword arguments write equal text.)
                (None, None) => {
                    let call = serde_json::to_string(&(&msg.args, &msg.kwargs))
                        .map_err(|e| WireError::Serialize(e.to_string()))?;
                    TaskId::derived(&["ferriq-dedup", self.name, &call]).to_string()
                }
            };
            msg.labels.insert_named(names::DEDUP_KEY, key);
            msg.labels
                .insert_named(names::DEDUP_FOR, dedup.window.as_secs_f64().max(0.001));
            msg.labels
                .insert_named(names::DEDUP_MODE, dedup.mode.as_str());
        }
        Ok(msg)
    }
}

impl<T> fmt::Debug for Call<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Call")
            .field("name", &self.name)
            .field("task_id", &self.task_id)
            .field("labels", &self.labels)
            .finish_non_exhaustive()
    }
}
