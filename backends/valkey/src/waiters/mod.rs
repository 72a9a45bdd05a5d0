//! Waiters of this process, woken by completions announced on one subscriber connection.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use fred::clients::SubscriberClient;
use fred::prelude::{ClientLike, EventInterface, PubsubInterface};
use fred::types::config::Options;
use fred::types::{ClusterHash, Value};
use tokio::sync::broadcast::error::RecvError;
use tokio::sync::{mpsc, Notify};
use tokio::task::JoinHandle;

mod recent;

use recent::{Early, RecentIds};

/// Task id → the waiters of that task.
pub(crate) struct Waiters {
    entries: Mutex<HashMap<String, Entry>>,
    /// Announcements that came before anyone waited, taken by the first waiter (locked only
    /// while `entries` is: an announcement and a registration never miss each other).
    early: Mutex<Early>,
    /// The connection task channels are subscribed on (absent in unit tests).
    subscriber: Option<SubscriberClient>,
    /// Task channels to leave, handed to the dispatcher: a guard may drop outside a runtime.
    leave: Option<mpsc::UnboundedSender<(String, String)>>,
    /// Tasks this process enqueued with its reply channel, the latest ones.
    announced_here: Mutex<RecentIds>,
    /// When the last completion message reached this process, in ms since `epoch` (0:
    /// never): while they flow, a wait expecting one needs no quick re-read.
    last_announcement_ms: AtomicU64,
    epoch: std::time::Instant,
}

impl Default for Waiters {
    fn default() -> Self {
        Waiters {
            entries: Mutex::default(),
            early: Mutex::default(),
            subscriber: None,
            leave: None,
            announced_here: Mutex::default(),
            last_announcement_ms: AtomicU64::new(0),
            epoch: std::time::Instant::now(),
        }
    }
}

/// Task channels the last waiter left: (task id, channel).
pub(crate) type Leaves = mpsc::UnboundedReceiver<(String, String)>;

struct Entry {
    notify: Arc<Notify>,
    count: usize,
    /// The task's own channel, once a waiter of it subscribes there.
    task_channel: Option<String>,
    /// The result as its completion announced it (the JSON the worker stored), when the
    /// announcement carried it: waiters take it from here instead of reading it back.
    result: Option<Arc<str>>,
    /// Whether a completion was announced (with or without its result).
    announced: bool,
}

/// One waiter's registration; unregisters on drop.
pub(crate) struct WaiterGuard {
    waiters: Arc<Waiters>,
    id: String,
    pub(crate) notify: Arc<Notify>,
}

impl Drop for WaiterGuard {
    fn drop(&mut self) {
        let mut entries = self.waiters.lock();
        let Some(e) = entries.get_mut(&self.id) else {
            return;
        };
        e.count -= 1;
        if e.count > 0 {
            return;
        }
        let channel = entries.remove(&self.id).and_then(|e| e.task_channel);
        drop(entries);
        if let (Some(channel), Some(leave)) = (channel, &self.waiters.leave) {
            let _ = leave.send((self.id.clone(), channel));
        }
    }
}

impl WaiterGuard {
    /// The stored result JSON an announcement carried, if one did.
    pub(crate) fn announced_result(&self) -> Option<Arc<str>> {
        self.waiters
            .lock()
            .get(&self.id)
            .and_then(|e| e.result.clone())
    }

    /// Whether a completion of the task was announced to this process, with or without its
    /// result.
    pub(crate) fn was_announced(&self) -> bool {
        self.waiters
            .lock()
            .get(&self.id)
            .is_some_and(|e| e.announced)
    }

    /// Subscribes to the task's own completion channel (where tasks enqueued without a
    /// `reply_to` are announced). Every waiter subscribes for itself (the server keeps one
    /// subscription) and returns once the server confirmed it, so a read after this cannot miss
    /// the announcement; a failure leaves the waiter to its re-reads.
    pub(crate) async fn listen_on_task_channel(&self, channel: String) {
        let Some(subscriber) = &self.waiters.subscriber else {
            return;
        };
        // Marked first, so the last waiter leaves the channel even if this call is cancelled
        // after the subscribe went out.
        if let Some(e) = self.waiters.lock().get_mut(&self.id) {
            e.task_channel = Some(channel.clone());
        }
        // Boxed: fred's futures are kilobytes large, and a wait's future holds this one.
        let subscribed = Box::pin(async {
            subscriber.subscribe(channel).await?;
            confirm_subscribed(subscriber).await
        });
        if let Err(e) = subscribed.await {
            tracing::debug!(error = %e, "listening on a task's completion channel failed; re-reads remain");
        }
    }
}

/// Returns once the server has processed every subscription sent so far on `subscriber`.
///
/// fred answers `SUBSCRIBE` as soon as it is written (the server's confirmation arrives out of
/// band and is dropped), so a read right after it could overtake it and a completion in between
/// would go unheard. A `PING` on the same connection is answered only after everything before
/// it: the subscription included. (In a cluster fred sends every subscription to the node of
/// the client id's slot; the ping goes there too.)
pub(crate) async fn confirm_subscribed(
    subscriber: &SubscriberClient,
) -> Result<(), fred::error::Error> {
    let options = Options {
        cluster_hash: subscriber
            .is_clustered()
            .then(|| ClusterHash::Custom(fred::util::redis_keyslot(subscriber.id().as_bytes()))),
        ..Default::default()
    };
    let _: Value = subscriber.with_options(&options).ping(None).await?;
    Ok(())
}

impl Waiters {
    /// Waiters whose task channels are subscribed on `subscriber`; the dispatcher leaves the
    /// channels sent to [`Leaves`].
    pub(crate) fn new(subscriber: SubscriberClient) -> (Self, Leaves) {
        let (leave, leaves) = mpsc::unbounded_channel();
        let waiters = Waiters {
            subscriber: Some(subscriber),
            leave: Some(leave),
            ..Waiters::default()
        };
        (waiters, leaves)
    }

    /// Notes that a completion message reached this process now.
    fn note_announcement(&self) {
        // At least 1: 0 means "never".
        let ms = (self.epoch.elapsed().as_millis() as u64).max(1);
        self.last_announcement_ms.store(ms, Ordering::Relaxed);
    }

    /// Whether completion messages reach this process: one came within the last second.
    /// A wait whose task's completion is announced here then re-reads only as the safety net
    /// (`recheck_interval`), not after 100 ms: under a backlog thousands of waits are
    /// pending, and quick re-reads of each would cost the process more CPU the longer the
    /// backlog grew (a backlog that feeds itself). Without announcements (a Python worker
    /// announces nowhere) the quick re-read is how its results are found.
    pub(crate) fn announcements_flowing(&self) -> bool {
        let last = self.last_announcement_ms.load(Ordering::Relaxed);
        last != 0 && (self.epoch.elapsed().as_millis() as u64).saturating_sub(last) < 1000
    }

    /// Notes that task `id` went out with this process's reply channel: its completion is
    /// announced there.
    pub(crate) fn announced_here(&self, id: &str) {
        self.announced_here
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(id);
    }

    /// Whether task `id` went out with this process's reply channel (as far as it remembers).
    pub(crate) fn is_announced_here(&self, id: &str) -> bool {
        self.announced_here
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .contains(id)
    }

    /// Whether this is the first wait for task `id`, which went out with this process's reply
    /// channel, and its completion was not announced yet: the completion then reaches this
    /// process, and the wait need not read the result before it sleeps. Later waits read
    /// first (the first one took the announcement), and so does a first wait whose
    /// announcement came before it: it finds what `early` kept, or reads what `early`
    /// forgot (a client that enqueued more than `early` keeps, then waits for each in turn,
    /// must not sleep until a re-read for every one).
    pub(crate) fn first_wait_here(&self, id: &str) -> bool {
        self.announced_here
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .first_wait(id)
    }

    /// Whether task `id` went out with this process's reply channel and no wait for it has
    /// begun; if so, notes that its completion came first.
    fn announced_before_wait(&self, id: &str) -> bool {
        self.announced_here
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .announced_before_wait(id)
    }

    fn lock_early(&self) -> MutexGuard<'_, Early> {
        self.early.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Whether a waiter of `id` listens on the task's channel (again).
    fn listens(&self, id: &str) -> bool {
        self.lock()
            .get(id)
            .is_some_and(|e| e.task_channel.is_some())
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<String, Entry>> {
        self.entries.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub(crate) fn register(self: &Arc<Self>, id: &str) -> WaiterGuard {
        let mut entries = self.lock();
        let entry = entries.entry(id.to_owned()).or_insert_with(|| {
            let early = self.lock_early().take(id);
            Entry {
                notify: Arc::new(Notify::new()),
                count: 0,
                task_channel: None,
                announced: early.is_some(),
                result: early.flatten(),
            }
        });
        entry.count += 1;
        WaiterGuard {
            waiters: Arc::clone(self),
            id: id.to_owned(),
            notify: Arc::clone(&entry.notify),
        }
    }

    pub(crate) fn wake(&self, id: &str) {
        self.wake_with(id, None);
    }

    /// Wakes the waiters of `id`, leaving them the stored result JSON when the announcement
    /// carried it.
    fn wake_with(&self, id: &str, result: Option<&str>) {
        let mut entries = self.lock();
        match entries.get_mut(id) {
            Some(e) => {
                if let Some(json) = result {
                    e.result = Some(Arc::from(json));
                }
                e.announced = true;
                e.notify.notify_waiters();
            }
            // Before anyone waits (under the same lock as a registration, so either it finds
            // this or this finds it), for a task whose first wait is still to come.
            None if self.announced_before_wait(id) => self.lock_early().keep(id, result),
            None => {}
        }
    }

    /// After a gap in notifications (lag, reconnect) every waiter re-reads its result.
    pub(crate) fn wake_all(&self) {
        for e in self.lock().values() {
            e.notify.notify_waiters();
        }
    }
}

/// The tasks one completion message names, each with its stored result JSON when the message
/// carries it. A batch of completes announces its tasks in one message: one line per task,
/// `task_id` or `task_id<TAB>result JSON` (compact JSON holds no raw tab or newline, task ids no
/// whitespace). A line without a tab may also name several ids separated by spaces (the format
/// before results were carried), so both are read.
fn announced(payload: &str) -> impl Iterator<Item = (&str, Option<&str>)> {
    payload.split('\n').flat_map(|line| {
        let (ids, result) = match line.split_once('\t') {
            Some((id, json)) => (id, Some(json)),
            None => (line, None),
        };
        ids.split(' ')
            .filter(|id| !id.is_empty())
            .map(move |id| (id, result))
    })
}

/// Reads completion messages and wakes the matching waiters; wakes all after a reconnect or
/// when messages were dropped, since pub/sub does not replay what it missed.
pub(crate) fn spawn_dispatcher(
    subscriber: &SubscriberClient,
    waiters: Arc<Waiters>,
    mut leaves: Leaves,
) -> JoinHandle<()> {
    let mut messages = subscriber.message_rx();
    let mut reconnects = subscriber.reconnect_rx();
    let subscriber = subscriber.clone();
    tokio::spawn(async move {
        loop {
            tokio::select! {
                msg = messages.recv() => match msg {
                    Ok(msg) => {
                        waiters.note_announcement();
                        match msg.value.as_str() {
                            Some(payload) => announced(&payload).for_each(|(id, result)| waiters.wake_with(id, result)),
                            None => waiters.wake_all(),
                        }
                    }
                    Err(RecvError::Lagged(n)) => {
                        tracing::warn!(missed = n, "completion notifications lagged; re-checking every waiter");
                        waiters.wake_all();
                    }
                    Err(RecvError::Closed) => return,
                },
                Some((id, channel)) = leaves.recv() => {
                    // A new waiter of the same task may have subscribed since: keep it. (One
                    // racing this check may still lose its subscription to the unsubscribe;
                    // it then wakes by its re-reads.)
                    if !waiters.listens(&id) {
                        let subscriber = subscriber.clone();
                        tokio::spawn(async move {
                            if let Err(e) = subscriber.unsubscribe(channel).await {
                                tracing::debug!(error = %e, "leaving a task's completion channel failed");
                            }
                        });
                    }
                }
                r = reconnects.recv() => match r {
                    Ok(_) | Err(RecvError::Lagged(_)) => {
                        // Subscribed again before the re-reads: a completion between the two
                        // is then either announced or already stored.
                        let resubscribed = async {
                            // The channels fred tracks (the reply channel and every task
                            // channel in use), never an empty PSUBSCRIBE: its error reply would
                            // answer the PING below.
                            let channels: Vec<_> =
                                subscriber.tracked_channels().into_iter().collect();
                            if !channels.is_empty() {
                                subscriber.subscribe(channels).await?;
                            }
                            confirm_subscribed(&subscriber).await
                        };
                        if let Err(e) = resubscribed.await {
                            tracing::warn!(error = %e, "resubscribing after a reconnect failed");
                        }
                        waiters.wake_all();
                    }
                    Err(RecvError::Closed) => return,
                },
            }
        }
    })
}

#[cfg(test)]
mod tests;
