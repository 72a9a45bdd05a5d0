//! Deduplication at enqueue: a call whose key another task holds returns that task's handle
//! and sends nothing; a debounced call sends a copy of the task its key waits with, carrying
//! the latest arguments.

use std::time::Duration;

use super::{Client, EnqueueError, Prepared, TaskHandle};
use crate::broker::OutgoingMessage;
use crate::store::DebounceTurn;
use crate::wire::{names, TaskId, TaskMessage};

/// Whether a prepared message is debounced (`ferriq_dedup_mode` `debounce`).
fn debounced(out: &OutgoingMessage) -> bool {
    out.labels
        .get(names::DEDUP_MODE)
        .is_some_and(|m| m.header_value() == crate::task::Dedup::Debounce.as_str())
}

/// A prepared message's deduplication key and how long it holds at most.
fn dedup_of(out: &OutgoingMessage) -> Option<(String, Duration)> {
    let key = out
        .labels
        .get(names::DEDUP_KEY)?
        .header_value()
        .into_owned();
    let secs = out
        .labels
        .get(names::DEDUP_FOR)
        .and_then(|v| v.as_f64())
        .filter(|s| s.is_finite() && *s > 0.0)?;
    Some((
        key,
        Duration::from_secs_f64(secs.min(crate::wire::MAX_DELAY.as_secs_f64())),
    ))
}

impl Client {
    /// Publishes prepared calls, each deduplicated by its key when it has one: the handle of
    /// each call, in order — of the task holding its key when another one does (that call is
    /// not sent). A failed publish gives the keys it reserved back.
    pub(super) async fn send_deduplicated<T>(
        &self,
        prepared: Vec<Prepared>,
    ) -> Result<Vec<TaskHandle<T>>, EnqueueError> {
        if prepared.iter().all(|p| dedup_of(&p.1).is_none()) {
            // Nothing to deduplicate: the calls are published as they are, not moved one by
            // one into a vector of their own first.
            let handles = prepared
                .iter()
                .map(|p| self.sent_handle(p.1.task_id.clone(), p.1.queue.clone()))
                .collect();
            self.publish_prepared(prepared).await?;
            return Ok(handles);
        }
        let mut handles = Vec::with_capacity(prepared.len());
        let mut to_send = Vec::with_capacity(prepared.len());
        let mut reserved = Vec::new();
        for mut p in prepared {
            if let Some((key, ttl)) = dedup_of(&p.1) {
                let id = p.1.task_id.clone();
                if debounced(&p.1) {
                    // Every debounced enqueue sends a message: its own, or a copy of the task
                    // its key waits with, carrying this enqueue's arguments.
                    match self.store.debounce(&key, &id, ttl).await {
                        Ok(DebounceTurn::Joined { task, seq }) => match self.copy_of(p, &task, seq)
                        {
                            Ok(copy) => p = copy,
                            Err(e) => {
                                self.release_reserved(&reserved).await;
                                return Err(e);
                            }
                        },
                        Ok(_) => {}
                        Err(e) => {
                            self.release_reserved(&reserved).await;
                            return Err(EnqueueError::Store(e));
                        }
                    }
                    handles.push(self.sent_handle(p.1.task_id.clone(), p.1.queue.clone()));
                    to_send.push(p);
                    continue;
                }
                match self.store.reserve_dedup(&key, &id, ttl).await {
                    Ok(Some(holder)) => {
                        handles.push(self.handle(holder));
                        self.not_sent(vec![p]).await;
                        continue;
                    }
                    Ok(None) => reserved.push((key, id)),
                    Err(e) => {
                        self.release_reserved(&reserved).await;
                        return Err(EnqueueError::Store(e));
                    }
                }
            }
            handles.push(self.sent_handle(p.1.task_id.clone(), p.1.queue.clone()));
            to_send.push(p);
        }
        if let Err(e) = self.publish_prepared(to_send).await {
            self.release_reserved(&reserved).await;
            return Err(e);
        }
        Ok(handles)
    }

    async fn release_reserved(&self, reserved: &[(String, TaskId)]) {
        for (key, id) in reserved {
            if let Err(e) = self.store.release_dedup(key, id).await {
                tracing::warn!(error = %e, "could not give a deduplication key back; it lasts its window");
            }
        }
    }

    /// A prepared debounced message made a copy of `task` (the one its key waits with):
    /// that id, this enqueue's arguments and the `ferriq_debounce_seq` label `seq`.
    fn copy_of(
        &self,
        prepared: Prepared,
        task: &TaskId,
        seq: u64,
    ) -> Result<Prepared, EnqueueError> {
        let (message, out) = prepared;
        let mut msg = match message {
            Some(msg) => msg,
            None => TaskMessage::from_json(&out.body).map_err(EnqueueError::Wire)?,
        };
        msg.task_id = task.clone();
        msg.labels
            .insert_named(names::DEBOUNCE_SEQ, seq.min(i64::MAX as u64) as i64);
        let mut copy = OutgoingMessage::from_message(&msg).map_err(EnqueueError::Wire)?;
        copy.queue = out.queue;
        copy.delay = out.delay;
        copy.priority = out.priority;
        Ok((Some(msg), copy))
    }
}
