//! Groups and chords.

use std::marker::PhantomData;
use std::time::Duration;

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use super::{callback_id, member_id};
use crate::client::{Call, Client, EnqueueError, TaskHandle, WaitError};
use crate::store::{ChordPolicy, GroupMark, GroupRecord, GroupState, ResultStatus, StoreError};
use crate::wire::{names, TaskId, TaskResult, WireError};

/// Calls enqueued together and awaited together.
///
/// Each member gets an id derived from the group's ([`member_id`](super::member_id)), so
/// enqueueing the same group again (with [`Group::with_id`]) sends the same tasks.
pub struct Group<T> {
    calls: Vec<Call<T>>,
    id: Option<TaskId>,
}

impl<T> Group<T> {
    /// A group of `calls`.
    pub fn new(calls: impl IntoIterator<Item = Call<T>>) -> Self {
        Group {
            calls: calls.into_iter().collect(),
            id: None,
        }
    }

    /// Sets the group's id (an idempotency key); default: random.
    pub fn with_id(mut self, id: TaskId) -> Self {
        self.id = Some(id);
        self
    }

    /// How many members.
    pub fn len(&self) -> usize {
        self.calls.len()
    }

    /// Whether the group has no member.
    pub fn is_empty(&self) -> bool {
        self.calls.is_empty()
    }
}

impl<T> std::fmt::Debug for Group<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Group")
            .field("id", &self.id)
            .field("members", &self.calls.len())
            .finish()
    }
}

/// A group and a callback run once, after every member's outcome is stored.
///
/// The callback reads the members' outcomes from its context
/// ([`TaskContext::group_results`](crate::TaskContext::group_results), in member order) — for
/// any group size, without carrying them in its message. With [`ChordPolicy::AllSucceeded`]
/// (the default) it runs only if every member succeeded; otherwise its result is an error
/// naming the first failed member. Its id is derived from the group's
/// ([`callback_id`](super::callback_id)).
pub struct Chord<T, U> {
    group: Group<T>,
    callback: Call<U>,
    policy: ChordPolicy,
}

/// A chord of `group` and `callback`.
pub fn chord<T, U>(group: Group<T>, callback: Call<U>) -> Chord<T, U> {
    Chord {
        group,
        callback,
        policy: ChordPolicy::default(),
    }
}

impl<T, U> Chord<T, U> {
    /// What to do when members failed (default: run the callback only if all succeeded).
    pub fn policy(mut self, policy: ChordPolicy) -> Self {
        self.policy = policy;
        self
    }
}

impl<T, U> std::fmt::Debug for Chord<T, U> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Chord")
            .field("group", &self.group)
            .field("callback", &self.callback)
            .field("policy", &self.policy)
            .finish()
    }
}

/// A finished group's counts: the group's own result, written once when its last member's
/// outcome is stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct GroupSummary {
    /// Members.
    pub size: u32,
    /// Members that succeeded.
    pub succeeded: u32,
    /// Members that failed (errors, expiries, revokes).
    pub failed: u32,
}

impl GroupSummary {
    /// The summary of a group of `size` members, `failed` of which failed.
    pub fn new(size: u32, failed: u32) -> Self {
        GroupSummary {
            size,
            succeeded: size.saturating_sub(failed),
            failed,
        }
    }
}

/// A handle on an enqueued group, typed by its members' output.
pub struct GroupHandle<T> {
    id: TaskId,
    size: u32,
    client: Client,
    _output: PhantomData<fn() -> T>,
}

impl<T> Clone for GroupHandle<T> {
    fn clone(&self) -> Self {
        GroupHandle {
            id: self.id.clone(),
            size: self.size,
            client: self.client.clone(),
            _output: PhantomData,
        }
    }
}

impl<T> std::fmt::Debug for GroupHandle<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "GroupHandle({}, {} members)", self.id, self.size)
    }
}

impl<T: DeserializeOwned> GroupHandle<T> {
    /// The group's id.
    pub fn id(&self) -> &TaskId {
        &self.id
    }

    /// How many members.
    pub fn len(&self) -> u32 {
        self.size
    }

    /// Whether the group has no member.
    pub fn is_empty(&self) -> bool {
        self.size == 0
    }

    /// A handle on member `index`.
    pub fn member(&self, index: u32) -> TaskHandle<T> {
        self.client.handle(member_id(&self.id, index))
    }

    /// How many members have finished (succeeded or failed) so far.
    pub async fn done(&self) -> Result<u32, StoreError> {
        Ok(self
            .client
            .store()
            .group(&self.id)
            .await?
            .map_or(0, |g| g.mark.done))
    }

    /// Waits up to `timeout` for every member to finish; their counts.
    pub async fn wait_done(&self, timeout: Duration) -> Result<GroupSummary, WaitError> {
        self.client
            .handle::<GroupSummary>(self.id.clone())
            .wait(timeout)
            .await
    }

    /// Waits up to `timeout` for every member to finish; each member's outcome, in order.
    pub async fn results(&self, timeout: Duration) -> Result<Vec<Result<T, WaitError>>, WaitError> {
        self.wait_done(timeout).await?;
        let ids: Vec<TaskId> = (0..self.size).map(|i| member_id(&self.id, i)).collect();
        let stored = self.client.store().get_many(&ids).await?;
        Ok(ids
            .into_iter()
            .zip(stored)
            .map(|(id, status)| match status {
                ResultStatus::Ready(r) => decode(&id, r),
                _ => Err(WaitError::TimedOut(timeout)),
            })
            .collect())
    }

    /// Revokes every member that has not finished; how many were revoked. Revoked members
    /// count as failed, so the group still completes.
    pub async fn revoke_rest(&self) -> Result<u32, StoreError> {
        let ids: Vec<TaskId> = (0..self.size).map(|i| member_id(&self.id, i)).collect();
        let stored = self.client.store().get_many(&ids).await?;
        let mut revoked = 0;
        for (id, status) in ids.iter().zip(stored) {
            if matches!(status, ResultStatus::Pending) && self.client.revoke(id).await? {
                revoked += 1;
            }
        }
        Ok(revoked)
    }
}

/// A stored result as a member's outcome.
pub(crate) fn decode<T: DeserializeOwned>(id: &TaskId, r: TaskResult) -> Result<T, WaitError> {
    if let Some(f) = r.failure_details() {
        return Err(WaitError::Failed(f));
    }
    serde_json::from_value(r.return_value).map_err(|e| WaitError::Decode {
        task_id: id.clone(),
        reason: e.to_string(),
    })
}

/// A handle on an enqueued chord: its callback's result, and its group.
pub struct ChordHandle<T, U> {
    group: GroupHandle<T>,
    callback: TaskHandle<U>,
}

impl<T, U> std::fmt::Debug for ChordHandle<T, U> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChordHandle")
            .field("group", &self.group)
            .field("callback", &self.callback)
            .finish()
    }
}

impl<T: DeserializeOwned, U: DeserializeOwned> ChordHandle<T, U> {
    /// The group.
    pub fn group(&self) -> &GroupHandle<T> {
        &self.group
    }

    /// The callback.
    pub fn callback(&self) -> &TaskHandle<U> {
        &self.callback
    }

    /// Waits up to `timeout` for the callback's result (or the chord's error).
    pub async fn wait(&self, timeout: Duration) -> Result<U, WaitError> {
        self.callback.wait(timeout).await
    }
}

impl Client {
    /// Enqueues a group: its record first, then every member in one batch. Returns once the
    /// broker holds them all.
    pub async fn enqueue_group<T>(&self, group: Group<T>) -> Result<GroupHandle<T>, EnqueueError> {
        let id = group.id.clone().unwrap_or_else(TaskId::random);
        let size = self
            .start_group(&id, group, None, ChordPolicy::default())
            .await?;
        Ok(GroupHandle {
            id,
            size,
            client: self.clone(),
            _output: PhantomData,
        })
    }

    /// Enqueues a chord: the group's record (with the callback) first, then every member.
    pub async fn enqueue_chord<T, U>(
        &self,
        chord: Chord<T, U>,
    ) -> Result<ChordHandle<T, U>, EnqueueError> {
        let Chord {
            group,
            callback,
            policy,
        } = chord;
        let id = group.id.clone().unwrap_or_else(TaskId::random);
        let mut message = callback
            .with_task_id(callback_id(&id))
            // Sent when the last member finishes, however long that takes.
            .with_deadline(None)
            .into_message_at(self.clock())?;
        message
            .labels
            .insert_named(names::GROUP_RESULTS, id.as_str());
        if let Some(channel) = self.store().reply_channel() {
            message.labels.insert_named(names::REPLY_TO, channel);
        }
        self.before_send(&mut message).await?;
        let callback_message = message.to_json_value()?;
        let size = self
            .start_group(&id, group, Some(callback_message), policy)
            .await?;
        Ok(ChordHandle {
            group: GroupHandle {
                id: id.clone(),
                size,
                client: self.clone(),
                _output: PhantomData,
            },
            callback: self.sent_handle(
                message.task_id,
                message.labels.queue_name().map(str::to_owned),
            ),
        })
    }

    async fn start_group<T>(
        &self,
        id: &TaskId,
        group: Group<T>,
        callback: Option<serde_json::Value>,
        policy: ChordPolicy,
    ) -> Result<u32, EnqueueError> {
        let size = u32::try_from(group.calls.len())
            .map_err(|_| WireError::NotJson("a group has at most 2^32 - 1 members".into()))?;
        let mut record = GroupRecord::new(id.clone(), size);
        if let Some(message) = callback {
            record = record.with_callback(message, policy);
        }
        // Every member prepared (middleware may refuse one) before anything is written.
        let mut batch = Vec::with_capacity(group.calls.len());
        for (i, call) in group.calls.into_iter().enumerate() {
            let mut msg = call
                .with_task_id(member_id(id, i as u32))
                .into_message_at(self.clock())?;
            msg.labels.insert_named(names::GROUP, id.as_str());
            msg.labels.insert_named(names::GROUP_INDEX, i as i64);
            match self.prepare(msg).await {
                Ok(prepared) => batch.push(prepared),
                Err(e) => {
                    self.not_sent(batch).await;
                    return Err(e);
                }
            }
        }
        // Written before any member can finish and count.
        if let Err(e) = self.store().create_group(&record).await {
            self.not_sent(batch).await;
            return Err(EnqueueError::Store(e));
        }
        if batch.is_empty() {
            // Nothing to wait for: the group is complete now.
            let state = GroupState::new(record, GroupMark::new(0, 0, 0, false));
            super::advance::complete_group(
                self.store().as_ref(),
                self.broker().as_ref(),
                self.clock(),
                &state,
            )
            .await
            .map_err(|e| match e {
                super::advance::AdvanceError::Store(e) => EnqueueError::Store(e),
                super::advance::AdvanceError::Broker(e) => EnqueueError::Broker(e),
                super::advance::AdvanceError::Wire(e) => EnqueueError::Wire(e),
            })?;
        } else {
            self.publish_prepared(batch).await?;
        }
        Ok(size)
    }
}
