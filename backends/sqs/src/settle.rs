//! Settling deliveries: deletes gathered into batches, releases by visibility (or by a fresh
//! copy once a message has been received often), heartbeats inside SQS's 12-hour visibility
//! budget, and dead letters sent with their reason.

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use aws_sdk_sqs::types::{
    ChangeMessageVisibilityBatchRequestEntry, DeleteMessageBatchRequestEntry,
};
use ferriq::broker::{BrokerError, DeadLetter, DeliveryHandle, LeaseStatus};
use tokio::sync::{mpsc, oneshot, Semaphore};
use tokio::time::Instant;

use crate::error::{broker_error, code_of, describe, is_lost_handle};
use crate::receive::{Held, EARLIER_RECEIVES_ATTRIBUTE, NOT_BEFORE_ATTRIBUTE};
use crate::send::{number, text, Entry, MAX_DELAY_SECS};
use crate::shared::{Delete, Shared};

/// How long SQS keeps a message invisible at most, counted from the receive.
pub(crate) const VISIBILITY_BUDGET: Duration = Duration::from_secs(12 * 3600);

/// Sends every delete handed to it, gathering those that arrive while earlier batches are
/// under way into `DeleteMessageBatch` calls of up to 10: one call per delete when idle (no
/// added latency), batches under load.
pub(crate) fn spawn_deleter(shared: std::sync::Weak<Shared>) -> mpsc::UnboundedSender<Delete> {
    let (tx, mut rx) = mpsc::unbounded_channel::<Delete>();
    tokio::spawn(async move {
        let calls = Arc::new(Semaphore::new(8));
        while let Some(first) = rx.recv().await {
            let Ok(permit) = Arc::clone(&calls).acquire_owned().await else {
                return;
            };
            let mut by_queue: HashMap<String, Vec<Delete>> = HashMap::new();
            by_queue
                .entry(first.queue.url.clone())
                .or_default()
                .push(first);
            let mut n = 1;
            while n < 100 {
                match rx.try_recv() {
                    Ok(d) => {
                        by_queue.entry(d.queue.url.clone()).or_default().push(d);
                        n += 1;
                    }
                    Err(_) => break,
                }
            }
            let Some(shared) = shared.upgrade() else {
                return;
            };
            tokio::spawn(async move {
                let mut calls = Vec::new();
                for (_, mut deletes) in by_queue {
                    while !deletes.is_empty() {
                        let rest = deletes.split_off(deletes.len().min(10));
                        calls.push(delete_batch(&shared, std::mem::replace(&mut deletes, rest)));
                    }
                }
                futures_util::future::join_all(calls).await;
                drop(permit);
            });
        }
    });
    tx
}

async fn delete_batch(shared: &Shared, batch: Vec<Delete>) {
    let mut call = shared
        .clients
        .call
        .delete_message_batch()
        .queue_url(&batch[0].queue.url);
    for (i, d) in batch.iter().enumerate() {
        call = call.entries(
            DeleteMessageBatchRequestEntry::builder()
                .id(i.to_string())
                .receipt_handle(&d.receipt)
                .build()
                .expect("id and handle are set"),
        );
    }
    match call.send().await {
        Ok(out) => {
            let mut failed: HashMap<usize, BrokerError> = out
                .failed()
                .iter()
                .filter_map(|f| {
                    let i = f.id().parse().ok()?;
                    let e = if is_lost_handle(f.code(), f.message()) {
                        BrokerError::DeliveryLost
                    } else {
                        BrokerError::Unavailable(format!(
                            "{}: {}",
                            f.code(),
                            f.message().unwrap_or("delete failed")
                        ))
                    };
                    Some((i, e))
                })
                .collect();
            for (i, d) in batch.into_iter().enumerate() {
                let _ = d.done.send(failed.remove(&i).map_or(Ok(()), Err));
            }
        }
        Err(e) => {
            let why = describe(&e);
            for d in batch {
                let _ = d.done.send(Err(BrokerError::Unavailable(why.clone())));
            }
        }
    }
}

impl Shared {
    pub(crate) fn held<'a>(&self, handle: &'a DeliveryHandle) -> Result<&'a Held, BrokerError> {
        match handle.downcast_ref::<Held>() {
            Some(h) if h.broker == self.id => Ok(h),
            _ => Err(BrokerError::ForeignHandle),
        }
    }

    /// Deletes a held message (batched with other deletes).
    pub(crate) async fn delete(&self, held: &Held) -> Result<(), BrokerError> {
        if held.gone.load(Ordering::SeqCst) {
            return Ok(());
        }
        let (done, answer) = oneshot::channel();
        self.deleter
            .send(Delete {
                queue: Arc::clone(&held.queue),
                receipt: held.receipt.clone(),
                done,
            })
            .map_err(|_| BrokerError::Unavailable("the broker was closed".into()))?;
        let outcome = answer
            .await
            .unwrap_or_else(|_| Err(BrokerError::Unavailable("delete abandoned".into())));
        if outcome.is_ok() {
            held.gone.store(true, Ordering::SeqCst);
        }
        outcome
    }

    /// How much of a delivery's visibility budget is left now (the broker's clock may be
    /// advanced by tests).
    pub(crate) fn budget_left(&self, held: &Held) -> Duration {
        let elapsed = Instant::now().saturating_duration_since(held.received_at) + self.aged();
        VISIBILITY_BUDGET.saturating_sub(elapsed)
    }

    /// Sets a delivery's visibility to `secs` from now.
    pub(crate) async fn change_visibility(
        &self,
        handle: &ferriq::broker::DeliveryHandle,
        secs: u64,
    ) -> Result<(), BrokerError> {
        let held = self.held(handle)?;
        if held.gone.load(Ordering::SeqCst) {
            return Err(BrokerError::DeliveryLost);
        }
        // Never past the budget: SQS refuses the whole call.
        let secs = secs.min(self.budget_left(held).as_secs());
        self.clients
            .call
            .change_message_visibility()
            .queue_url(&held.queue.url)
            .receipt_handle(&held.receipt)
            .visibility_timeout(secs as i32)
            .send()
            .await
            .map(|_| ())
            .map_err(|e| broker_error(&e))
    }

    /// Makes a delivery visible again after `after`: by its visibility while it has few
    /// receives, else by a fresh copy (sent first, the original deleted after) whose receive
    /// count starts again at zero. A wait longer than the receive's visibility budget holds it
    /// for the rest of the budget (it comes back early and is released again).
    pub(crate) async fn release(
        &self,
        handle: &ferriq::broker::DeliveryHandle,
        after: Duration,
    ) -> Result<(), BrokerError> {
        let held = self.held(handle)?;
        // Never sooner than asked: whole seconds, rounded up.
        let secs = after.as_secs() + u64::from(after.subsec_nanos() > 0);
        let left = self.budget_left(held).as_secs();
        if secs == 0 || held.queue.fifo {
            return self.change_visibility(handle, secs).await;
        }
        if held.sqs_receive_count < self.resend_after() {
            if secs + 5 <= left {
                return self.change_visibility(handle, secs).await;
            }
            // Longer than this receive may hold it: as long as it may, and the worker
            // releases it again when it comes back early — unless the queue forgets messages
            // sooner than three such holds take.
            if held.queue.retention >= Duration::from_secs(2 * 86_400) && left > 120 {
                return self.change_visibility(handle, left - 60).await;
            }
        }
        if held.gone.load(Ordering::SeqCst) {
            return Err(BrokerError::DeliveryLost);
        }
        let now_ms = unix_ms();
        let mut attributes: Vec<_> = held
            .attributes
            .iter()
            .filter(|(k, _)| {
                k.as_str() != NOT_BEFORE_ATTRIBUTE && k.as_str() != EARLIER_RECEIVES_ATTRIBUTE
            })
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        attributes.push((
            EARLIER_RECEIVES_ATTRIBUTE.to_owned(),
            number(held.receive_count),
        ));
        if secs > MAX_DELAY_SECS {
            attributes.push((
                NOT_BEFORE_ATTRIBUTE.to_owned(),
                number(now_ms + after.as_millis() as u64),
            ));
        }
        let copy = Entry {
            task_id: task_id_of(held),
            body: held.body_text(),
            attributes,
            delay_secs: secs.min(MAX_DELAY_SECS),
            group_id: None,
            dedup_id: None,
        };
        let refused = self.send_entries(&held.queue, vec![copy]).await?;
        if let Some(r) = refused.into_iter().next() {
            return Err(BrokerError::Rejected(r.reason));
        }
        // The copy is durable: the original may go. Should the delete fail, two copies exist
        // and the claim absorbs the second.
        self.delete(held).await
    }

    /// Parks a copy in the lane's dead-letter queue with the reason as attributes, then
    /// deletes the original.
    pub(crate) async fn dead_letter(
        &self,
        handle: &ferriq::broker::DeliveryHandle,
        why: &DeadLetter,
    ) -> Result<(), BrokerError> {
        let held = self.held(handle)?;
        if held.gone.load(Ordering::SeqCst) {
            return Err(BrokerError::DeliveryLost);
        }
        let Some(dead) = &held.queue.dead_letter else {
            return Err(BrokerError::Config(format!(
                "queue {} has no dead-letter queue",
                held.queue.name
            )));
        };
        let detail: String = why.detail.chars().take(1000).collect();
        let mut attributes = vec![
            ("task_id".to_owned(), text(task_id_of(held).as_str())),
            ("ferriq_reason".to_owned(), text(why.reason.as_str())),
            ("ferriq_attempts".to_owned(), number(why.attempts)),
            ("ferriq_source_queue".to_owned(), text(&*held.queue.name)),
            (
                "ferriq_receive_count".to_owned(),
                number(held.receive_count),
            ),
        ];
        if !detail.is_empty() {
            attributes.push(("ferriq_detail".to_owned(), text(detail)));
        }
        if let Some(name) = &why.task_name {
            attributes.push(("ferriq_task_name".to_owned(), text(name.as_str())));
        }
        let copy = Entry {
            task_id: task_id_of(held),
            body: held.body_text(),
            attributes,
            delay_secs: 0,
            group_id: dead
                .fifo
                .then(|| held.group_id.clone().unwrap_or_else(|| "ferriq".to_owned())),
            dedup_id: dead.fifo.then(|| uuid::Uuid::new_v4().simple().to_string()),
        };
        let refused = self.send_entries(dead, vec![copy]).await?;
        if let Some(r) = refused.into_iter().next() {
            return Err(BrokerError::Rejected(format!(
                "the dead-letter queue {} refused the copy: {}",
                dead.name, r.reason
            )));
        }
        self.delete(held).await
    }

    /// Extends held deliveries by `lease`, never past their budget: one
    /// `ChangeMessageVisibilityBatch` per 10 deliveries, all at once, one attempt each.
    pub(crate) async fn extend(
        &self,
        handles: &[ferriq::broker::DeliveryHandle],
        lease: Duration,
    ) -> Result<Vec<LeaseStatus>, BrokerError> {
        let margin = self.settings.budget_margin;
        let mut statuses = vec![LeaseStatus::Kept; handles.len()];
        let mut asks: HashMap<String, Vec<(usize, &Held, u64)>> = HashMap::new();
        for (i, h) in handles.iter().enumerate() {
            let held = self.held(h)?;
            if held.gone.load(Ordering::SeqCst) {
                statuses[i] = LeaseStatus::Lost;
                continue;
            }
            let (ask, status) = visibility_ask(self.budget_left(held), margin, lease);
            statuses[i] = status;
            if ask.as_secs() > 0 {
                asks.entry(held.queue.url.clone())
                    .or_default()
                    .push((i, held, ask.as_secs()));
            }
        }
        let mut calls = Vec::new();
        for (url, entries) in &asks {
            for chunk in entries.chunks(10) {
                calls.push(self.extend_chunk(url, chunk));
            }
        }
        let mut any_answered = calls.is_empty();
        let mut last_error = None;
        for outcome in futures_util::future::join_all(calls).await {
            match outcome {
                Ok(lost) => {
                    any_answered = true;
                    for i in lost {
                        statuses[i] = LeaseStatus::Lost;
                    }
                }
                Err(e) => last_error = Some(e),
            }
        }
        match last_error {
            // Nothing got through: the worker tries again at the next beat.
            Some(e) if !any_answered => Err(e),
            _ => Ok(statuses),
        }
    }

    /// One heartbeat batch; the indexes of the deliveries SQS says are no longer ours.
    async fn extend_chunk(
        &self,
        url: &str,
        chunk: &[(usize, &Held, u64)],
    ) -> Result<Vec<usize>, BrokerError> {
        let mut call = self
            .clients
            .beat
            .change_message_visibility_batch()
            .queue_url(url);
        for (n, (_, held, secs)) in chunk.iter().enumerate() {
            call = call.entries(
                ChangeMessageVisibilityBatchRequestEntry::builder()
                    .id(n.to_string())
                    .receipt_handle(&held.receipt)
                    .visibility_timeout(*secs as i32)
                    .build()
                    .expect("id and handle are set"),
            );
        }
        let out = call.send().await.map_err(|e| {
            let code = code_of(&e).map(str::to_owned);
            tracing::debug!(?code, "heartbeat batch failed");
            broker_error(&e)
        })?;
        Ok(out
            .failed()
            .iter()
            .filter(|f| is_lost_handle(f.code(), f.message()))
            .filter_map(|f| f.id().parse::<usize>().ok())
            .filter_map(|n| chunk.get(n).map(|(i, _, _)| *i))
            .collect())
    }
}

/// What a heartbeat asks for a delivery with `left` of its 12-hour budget: the lease while
/// the budget (less `margin`) allows it, else what is left and [`LeaseStatus::LimitReached`]:
/// the run must end now, while the message is still held long enough to store its result and
/// park it. Never more than `left`.
pub(crate) fn visibility_ask(
    left: Duration,
    margin: Duration,
    lease: Duration,
) -> (Duration, LeaseStatus) {
    let usable = left.saturating_sub(margin);
    if usable >= lease {
        (lease, LeaseStatus::Kept)
    } else {
        (usable, LeaseStatus::LimitReached)
    }
}

fn task_id_of(held: &Held) -> ferriq::wire::TaskId {
    held.attributes
        .get("task_id")
        .and_then(|v| v.string_value())
        .and_then(|s| ferriq::wire::TaskId::parse(s).ok())
        .or_else(|| ferriq::wire::TaskMessage::peek_task_id(&held.body))
        .unwrap_or_else(ferriq::wire::TaskId::random)
}

/// Unix milliseconds now, from the core's clock.
pub(crate) fn unix_ms() -> u64 {
    ferriq::clock::Clock::system().now_unix_ms()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_heartbeat_never_asks_past_the_visibility_budget() {
        let s = Duration::from_secs;
        let (margin, lease) = (s(120), s(30));
        assert_eq!(
            visibility_ask(VISIBILITY_BUDGET, margin, lease),
            (lease, LeaseStatus::Kept)
        );
        assert_eq!(
            visibility_ask(s(151), margin, lease),
            (s(31).min(lease), LeaseStatus::Kept)
        );
        assert_eq!(
            visibility_ask(s(140), margin, lease),
            (s(20), LeaseStatus::LimitReached)
        );
        assert_eq!(
            visibility_ask(s(100), margin, lease),
            (s(0), LeaseStatus::LimitReached)
        );
        // At every point of the budget, what is asked ends inside it.
        for left in (0..=43_200).step_by(7) {
            let (ask, _) = visibility_ask(s(left), margin, lease);
            assert!(ask <= s(left), "{left}: asked {ask:?}");
        }
    }
}
