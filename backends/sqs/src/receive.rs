//! Receiving: a few long pollers feed a channel, asking SQS only for as many messages as the
//! worker has free run slots. A message waiting in a local buffer would burn its visibility
//! and its receive count, so pollers take *credits* — granted by `receive` for the slots the
//! worker offers — and hand back the ones a poll did not use.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use aws_sdk_sqs::types::{Message, MessageAttributeValue, MessageSystemAttributeName};
use ferriq::broker::{BrokerError, Bytes, Delivery, DeliveryHandle};
use ferriq::wire::TaskId;
use tokio::sync::{mpsc, Notify};
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::error::describe;
use crate::queue::Queue;
use crate::shared::Shared;

/// Our message attribute: unix milliseconds before which a re-sent copy is not to run (set
/// when a release is longer than SQS's 900-second `DelaySeconds`).
pub(crate) const NOT_BEFORE_ATTRIBUTE: &str = "ferriq_not_before";

/// Our message attribute: receives of the copies a fresh copy replaced. SQS counts each copy
/// from zero; a delivery's receive count is SQS's count plus this, so limits that count
/// receives (an unknown task's) hold across copies.
pub(crate) const EARLIER_RECEIVES_ATTRIBUTE: &str = "ferriq_earlier_receives";

/// What a delivery's handle keeps: enough to delete it, change its visibility, or copy it.
pub(crate) struct Held {
    pub(crate) broker: u64,
    pub(crate) queue: Arc<Queue>,
    pub(crate) receipt: String,
    /// Taken just before the receive call: SQS's 12-hour visibility budget runs from the
    /// receive, and an earlier instant keeps every ask inside it.
    pub(crate) received_at: Instant,
    /// Receives of this message and of the copies it replaced.
    pub(crate) receive_count: u32,
    /// SQS's own count for this copy (`ApproximateReceiveCount`): what `maxReceiveCount`
    /// compares.
    pub(crate) sqs_receive_count: u32,
    /// The delivery's own bytes, shared with it (SQS sent them as text, so they are UTF-8):
    /// a copy is made only when a release or a dead letter sends them again.
    pub(crate) body: Bytes,
    pub(crate) attributes: HashMap<String, MessageAttributeValue>,
    pub(crate) group_id: Option<String>,
    /// Set once this broker deleted the message or replaced it with a copy: later calls on
    /// the handle are answered without SQS (a delete proves nothing there: SQS accepts stale
    /// handles).
    pub(crate) gone: AtomicBool,
}

impl Held {
    /// The body as the text SQS takes (it came as text: nothing is replaced).
    pub(crate) fn body_text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
}

#[derive(Default)]
struct Credits {
    /// Granted by the worker, not yet taken by a poller.
    available: usize,
    /// Asked for by polls in progress.
    asked: usize,
    /// Most a single poll takes, so one idle lane does not hold every credit.
    fair_share: usize,
    /// The worker is draining: no poll starts, and what open polls bring is handed back.
    stopping: bool,
}

/// The pollers and the buffer between them and `receive`.
pub(crate) struct Receiver {
    credits: Mutex<Credits>,
    wake: Notify,
    tx: mpsc::UnboundedSender<Delivery>,
    rx: tokio::sync::Mutex<mpsc::UnboundedReceiver<Delivery>>,
    buffered: AtomicUsize,
    pollers: Mutex<Vec<JoinHandle<()>>>,
    /// Told whenever a poll ends.
    settled: Notify,
    /// Held while a poll's deliveries go into the buffer, and while a receive takes from it:
    /// a receive takes a poll's messages together (as many as it may take), so the messages
    /// of one FIFO group that SQS handed over at once reach the worker's ordering together
    /// (split over two receives, a head that went back in between could see a later one start
    /// a run of its own).
    handing_over: Mutex<()>,
}

impl Receiver {
    pub(crate) fn new() -> Self {
        let (tx, rx) = mpsc::unbounded_channel();
        Receiver {
            credits: Mutex::new(Credits::default()),
            wake: Notify::new(),
            tx,
            rx: tokio::sync::Mutex::new(rx),
            buffered: AtomicUsize::new(0),
            pollers: Mutex::new(Vec::new()),
            settled: Notify::new(),
            handing_over: Mutex::new(()),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Credits> {
        self.credits.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Up to `max` deliveries, waiting up to `wait` for the first.
    pub(crate) async fn receive(
        self: &Arc<Self>,
        shared: &Arc<Shared>,
        max: usize,
        wait: Duration,
    ) -> Result<Vec<Delivery>, BrokerError> {
        self.start(shared);
        let max = max.max(1);
        {
            let mut c = self.lock();
            // A run that asks again is not draining (a run dropped mid-drain left the flag).
            c.stopping = false;
            let outstanding = c.available + c.asked + self.buffered.load(Ordering::SeqCst);
            if max > outstanding {
                c.available += max - outstanding;
                drop(c);
                self.wake.notify_waiters();
            }
        }
        let mut rx = self.rx.lock().await;
        let mut out = Vec::new();
        match tokio::time::timeout(wait, rx.recv()).await {
            Ok(Some(d)) => out.push(d),
            Ok(None) => return Err(BrokerError::Unavailable("the broker was closed".into())),
            Err(_) => return Ok(out),
        }
        let _whole_polls = self.handing_over.lock().unwrap_or_else(|p| p.into_inner());
        while out.len() < max {
            match rx.try_recv() {
                Ok(d) => out.push(d),
                Err(_) => break,
            }
        }
        self.buffered.fetch_sub(out.len(), Ordering::SeqCst);
        Ok(out)
    }

    /// Starts the pollers, once per consuming run.
    fn start(self: &Arc<Self>, shared: &Arc<Shared>) {
        let mut pollers = self.pollers.lock().unwrap_or_else(|p| p.into_inner());
        if !pollers.is_empty() {
            return;
        }
        let lanes = shared.lanes.len();
        let concurrency = shared.consumer().concurrency.max(1);
        let n = shared
            .settings
            .pollers
            .unwrap_or_else(|| concurrency.div_ceil(10).clamp(1, 8))
            .max(lanes);
        self.lock().fair_share = concurrency.div_ceil(n).clamp(1, 10);
        for i in 0..n {
            let lane = Arc::clone(&shared.lanes[i % lanes]);
            pollers.push(tokio::spawn(poll(
                Arc::clone(self),
                Arc::clone(shared),
                lane,
            )));
        }
    }

    /// The worker is draining: no poll starts any more, and what the open ones bring is
    /// handed back as it comes (another worker takes it at once).
    pub(crate) fn stop_polling(&self) {
        let mut c = self.lock();
        c.stopping = true;
        c.available = 0;
    }

    fn is_stopping(&self) -> bool {
        self.lock().stopping
    }

    /// Stops the pollers and hands back every buffered delivery, visible at once. Open long
    /// polls are waited for (up to the poll's wait, plus a margin): one cut off mid-call may
    /// have taken messages — SQS then hands them to a closed connection, and they come back
    /// only when their visibility (the lease) runs out.
    pub(crate) async fn stop(&self, shared: &Shared) {
        self.stop_polling();
        let deadline = Instant::now() + shared.settings.wait_time + Duration::from_secs(2);
        loop {
            let settled = self.settled.notified();
            tokio::pin!(settled);
            settled.as_mut().enable();
            if self.lock().asked == 0 {
                break;
            }
            tokio::select! {
                _ = settled => {}
                _ = tokio::time::sleep_until(deadline) => {
                    tracing::debug!("an SQS poll is still open; stopping without it (its messages come back after the lease)");
                    break;
                }
            }
        }
        let pollers: Vec<_> = self
            .pollers
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .drain(..)
            .collect();
        for p in pollers {
            p.abort();
        }
        *self.lock() = Credits::default();
        self.hand_back_buffered(shared).await;
    }

    /// Hands back every buffered delivery, visible at once (the worker will not take them).
    pub(crate) async fn hand_back_buffered(&self, shared: &Shared) {
        let mut rx = self.rx.lock().await;
        let mut buffered = Vec::new();
        while let Ok(d) = rx.try_recv() {
            buffered.push(d);
        }
        self.buffered.fetch_sub(buffered.len(), Ordering::SeqCst);
        drop(rx);
        for d in buffered {
            if let Err(e) = shared.change_visibility(&d.handle, 0).await {
                tracing::debug!(error = %e, "handing back a buffered delivery failed; it returns with its visibility");
            }
        }
    }

    /// Takes credits for one poll, waiting for the worker to grant some.
    async fn take(&self) -> usize {
        loop {
            let granted = self.wake.notified();
            tokio::pin!(granted);
            granted.as_mut().enable();
            {
                let mut c = self.lock();
                if c.available > 0 && !c.stopping {
                    let n = c.available.min(c.fair_share.max(1)).min(10);
                    c.available -= n;
                    c.asked += n;
                    return n;
                }
            }
            granted.await;
        }
    }

    /// A poll of `asked` credits ended with `got` deliveries: the rest go back.
    fn settle(&self, asked: usize, got: usize) {
        let mut c = self.lock();
        c.asked -= asked;
        if !c.stopping {
            c.available += asked.saturating_sub(got);
        }
        drop(c);
        self.settled.notify_waiters();
        if got < asked {
            self.wake.notify_waiters();
        }
    }
}

/// One long poller on one lane.
async fn poll(receiver: Arc<Receiver>, shared: Arc<Shared>, lane: Arc<Queue>) {
    let mut backoff = Duration::from_millis(100);
    loop {
        let asked = tokio::select! {
            _ = shared.stop.cancelled() => return,
            n = receiver.take() => n,
        };
        let visibility = shared.consumer().lease.as_secs().clamp(1, 43_200) as i32;
        let received_at = Instant::now();
        let call = shared
            .clients
            .receive
            .receive_message()
            .queue_url(&lane.url)
            .max_number_of_messages(asked as i32)
            .wait_time_seconds(shared.settings.wait_time.as_secs() as i32)
            .visibility_timeout(visibility)
            .message_system_attribute_names(MessageSystemAttributeName::ApproximateReceiveCount)
            .message_system_attribute_names(MessageSystemAttributeName::MessageGroupId)
            .message_attribute_names("All")
            .send();
        let answer = tokio::select! {
            _ = shared.stop.cancelled() => return,
            answer = call => answer,
        };
        match answer {
            Ok(out) if receiver.is_stopping() => {
                // Brought after the worker began to drain: straight back, for another worker.
                let messages = out.messages.unwrap_or_default();
                for m in messages {
                    if let Some(d) = delivery(&shared, &lane, m, received_at) {
                        if let Err(e) = shared.change_visibility(&d.handle, 0).await {
                            tracing::debug!(error = %e, "handing back a message polled while draining failed; it returns with its visibility");
                        }
                    }
                }
                receiver.settle(asked, asked);
            }
            Ok(out) => {
                backoff = Duration::from_millis(100);
                let messages = out.messages.unwrap_or_default();
                let got = messages.len();
                // Counted as buffered and the poll settled before any delivery is handed
                // over: a receive that takes them at once must not still see this poll as in
                // flight (it would grant no credits and wait out its whole wait).
                receiver.buffered.fetch_add(got, Ordering::SeqCst);
                receiver.settle(asked, got);
                {
                    let _whole_poll = receiver
                        .handing_over
                        .lock()
                        .unwrap_or_else(|p| p.into_inner());
                    for m in messages {
                        if let Some(d) = delivery(&shared, &lane, m, received_at) {
                            let _ = receiver.tx.send(d);
                        } else {
                            receiver.buffered.fetch_sub(1, Ordering::SeqCst);
                        }
                    }
                }
                if got > 0 && receiver.is_stopping() {
                    // The drain began between the check above and these landing in the
                    // buffer, maybe after its hand-back ran: back with them too.
                    receiver.hand_back_buffered(&shared).await;
                }
            }
            Err(e) => {
                receiver.settle(asked, 0);
                let why = describe(&e);
                tracing::warn!(queue = %lane.name, error = %why, retry_in = ?backoff, "receive failed");
                shared.set_error(why);
                tokio::select! {
                    _ = shared.stop.cancelled() => return,
                    _ = tokio::time::sleep(backoff) => {}
                }
                backoff = (backoff * 2).min(Duration::from_secs(10));
            }
        }
    }
}

/// A received message as a delivery.
fn delivery(
    shared: &Shared,
    lane: &Arc<Queue>,
    m: Message,
    received_at: Instant,
) -> Option<Delivery> {
    let receipt = m.receipt_handle?;
    let system = m.attributes.unwrap_or_default();
    let sqs_receive_count = system
        .get(&MessageSystemAttributeName::ApproximateReceiveCount)
        .and_then(|c| c.parse::<u32>().ok())
        .unwrap_or(1)
        .max(1);
    let group_id = system
        .get(&MessageSystemAttributeName::MessageGroupId)
        .cloned();
    // A FIFO queue's group runs one message at a time, in order. (Standard queues may carry a
    // group id too, for fair queueing: no order there.)
    let ordering_key = group_id
        .as_deref()
        .filter(|_| lane.fifo)
        .map(|g| Arc::<str>::from(format!("{}\n{g}", lane.url)));
    let attributes = m.message_attributes.unwrap_or_default();
    let text = |name: &str| attributes.get(name).and_then(|v| v.string_value());
    let task_id = text("task_id").and_then(|id| TaskId::parse(id).ok());
    let receive_count = text(EARLIER_RECEIVES_ATTRIBUTE)
        .and_then(|n| n.parse::<u32>().ok())
        .unwrap_or(0)
        .saturating_add(sqs_receive_count);
    let not_before = text(NOT_BEFORE_ATTRIBUTE)
        .and_then(|ms| ms.parse::<f64>().ok())
        .map(|ms| ms / 1000.0);
    let body = Bytes::from(m.body.unwrap_or_default());
    let held = Held {
        broker: shared.id,
        queue: Arc::clone(lane),
        receipt,
        received_at,
        receive_count,
        sqs_receive_count,
        body: body.clone(),
        attributes,
        group_id,
        gone: AtomicBool::new(false),
    };
    Some(
        Delivery::new(
            body,
            task_id,
            receive_count,
            lane.name.clone(),
            DeliveryHandle::new(held),
        )
        .with_not_before(not_before)
        .with_ordering_key(ordering_key),
    )
}
