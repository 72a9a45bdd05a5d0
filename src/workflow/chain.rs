//! Chains: steps run one after the other, each receiving the previous step's result as its
//! first argument.

use std::marker::PhantomData;
use std::time::Duration;

use serde::de::DeserializeOwned;
use serde_json::{Map, Value};

use super::step_id;
use crate::client::{Call, Client, EnqueueError, TaskHandle, WaitError};
use crate::store::ChainRecord;
use crate::wire::{names, Labels, TaskId, TaskMessage, WireError};

/// A chain step after the first: a task and its arguments *after* the first, which is the
/// previous step's result.
///
/// ```
/// use ferriq::workflow::Step;
/// let step = Step::new("images.resize").arg(640).unwrap().kwarg("format", "webp").unwrap();
/// # let _ = step;
/// ```
#[derive(Debug, Clone)]
pub struct Step {
    name: String,
    args: Vec<Value>,
    kwargs: Map<String, Value>,
    labels: Labels,
}

impl Step {
    /// A step of task `name`.
    pub fn new(name: impl Into<String>) -> Self {
        Step {
            name: name.into(),
            args: Vec::new(),
            kwargs: Map::new(),
            labels: Labels::new(),
        }
    }

    /// Adds a positional argument (after the previous step's result).
    pub fn arg(mut self, value: impl serde::Serialize) -> Result<Self, WireError> {
        self.args
            .push(serde_json::to_value(value).map_err(|e| WireError::NotJson(e.to_string()))?);
        Ok(self)
    }

    /// Adds a keyword argument.
    pub fn kwarg(
        mut self,
        name: impl Into<String>,
        value: impl serde::Serialize,
    ) -> Result<Self, WireError> {
        self.kwargs.insert(
            name.into(),
            serde_json::to_value(value).map_err(|e| WireError::NotJson(e.to_string()))?,
        );
        Ok(self)
    }

    /// Sets a label (`queue_name`, `timeout`, `max_retries`…).
    pub fn label(
        mut self,
        name: impl Into<String>,
        value: impl Into<crate::wire::LabelValue>,
    ) -> Self {
        self.labels.insert(name, value);
        self
    }
}

/// Steps run one after the other: each is enqueued by the worker that stored the previous
/// step's result, with that result as its first argument. A failure stops the chain: the
/// failing step's error becomes the chain's result. Step `i` has the id
/// [`step_id`](super::step_id)`(chain, i)`.
#[derive(Debug)]
pub struct Chain {
    first: Result<TaskMessage, WireError>,
    rest: Vec<Step>,
    id: Option<TaskId>,
}

impl Chain {
    /// A chain starting with `first`.
    pub fn new<T>(first: Call<T>) -> Self {
        Chain {
            first: first.with_deadline(None).into_message(),
            rest: Vec::new(),
            id: None,
        }
    }

    /// Adds a step.
    pub fn then(mut self, step: Step) -> Self {
        self.rest.push(step);
        self
    }

    /// Sets the chain's id (an idempotency key); default: random.
    pub fn with_id(mut self, id: TaskId) -> Self {
        self.id = Some(id);
        self
    }
}

/// A handle on an enqueued chain: the last step's result is the chain's.
pub struct ChainHandle<U> {
    id: TaskId,
    steps: u32,
    client: Client,
    last: TaskHandle<U>,
    _output: PhantomData<fn() -> U>,
}

impl<U> std::fmt::Debug for ChainHandle<U> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ChainHandle({}, {} steps)", self.id, self.steps)
    }
}

impl<U: DeserializeOwned> ChainHandle<U> {
    /// The chain's id.
    pub fn id(&self) -> &TaskId {
        &self.id
    }

    /// A handle on step `index` (untyped: steps differ in type).
    pub fn step(&self, index: u32) -> TaskHandle<Value> {
        self.client.handle(step_id(&self.id, index))
    }

    /// Waits up to `timeout` for the chain's result: the last step's value, or the error of
    /// the step that stopped it.
    pub async fn wait(&self, timeout: Duration) -> Result<U, WaitError> {
        self.last.wait(timeout).await
    }
}

impl Client {
    /// Enqueues a chain: its record (every step) first, then its first step.
    pub async fn enqueue_chain<U>(&self, chain: Chain) -> Result<ChainHandle<U>, EnqueueError> {
        let id = chain.id.unwrap_or_else(TaskId::random);
        let reply_to = self.store().reply_channel();
        let mut messages = Vec::with_capacity(1 + chain.rest.len());
        let mut first = chain.first?;
        first.task_id = step_id(&id, 0);
        messages.push(first);
        for step in chain.rest {
            let mut msg = TaskMessage::new(step.name);
            msg.task_id = step_id(&id, messages.len() as u32);
            msg.args = step.args;
            msg.kwargs = step.kwargs;
            msg.labels = step.labels;
            messages.push(msg);
        }
        let steps = messages.len() as u32;
        for (i, msg) in messages.iter_mut().enumerate() {
            msg.labels.insert_named(names::CHAIN, id.as_str());
            msg.labels.insert_named(names::CHAIN_STEP, i as i64);
            if let Some(channel) = &reply_to {
                msg.labels.insert_named(names::REPLY_TO, channel.as_str());
            }
        }
        // Every step through the middleware, in order (a refusal of any writes nothing), then
        // the record, then the first step.
        let mut bodies = vec![messages[0].to_json_value()?];
        let first = self.prepare(messages.remove(0)).await?;
        let stored = async {
            for msg in &mut messages {
                self.before_send(msg).await?;
                bodies.push(msg.to_json_value()?);
            }
            self.store()
                .create_chain(&ChainRecord::new(id.clone(), bodies))
                .await
                .map_err(EnqueueError::Store)
        };
        if let Err(e) = stored.await {
            self.not_sent(vec![first]).await;
            return Err(e);
        }
        let last = self.handle(step_id(&id, steps - 1));
        self.publish_prepared(vec![first]).await?;
        Ok(ChainHandle {
            id,
            steps,
            client: self.clone(),
            last,
            _output: PhantomData,
        })
    }
}
