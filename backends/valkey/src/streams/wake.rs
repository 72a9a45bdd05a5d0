//! Wake-ups across processes. A receive that finds nothing waits on the server (a blocking
//! read) — and a blocking read ends only for new entries of the stream, not for a delayed
//! message or a hand-back falling due, which wait in the lane's sorted sets until a receive
//! looks for them. A process knows what it handed back itself, but another one's hand-back
//! or a producer's short delay would be found only at the end of the wait it fell into: up
//! to a second late.
//!
//! So the scripts that set something due soon (a delayed publish, a release) announce it on
//! the lane's channel (`{<queue>}:ferriq:due`, the milliseconds until due), and each
//! receiving broker listens there: its waiting receive looks for it when the announced time
//! comes. A missed announcement (a reconnect, a lagging listener) only makes that message as
//! late as it would be without it.

use std::sync::{Mutex, Weak};
use std::time::Duration;

use fred::clients::SubscriberClient;
use fred::prelude::{ClientLike, EventInterface, PubsubInterface};
use tokio::sync::broadcast::error::RecvError;
use tokio::task::JoinHandle;

use super::read::Reads;

/// Something due within this many milliseconds is announced. A receive looks for lapsed
/// leases and due messages at least every two seconds (its blocking read ends by then), so
/// what falls due later is found by a look before it is due.
pub(crate) const ANNOUNCE_WITHIN_MS: i64 = 3_000;

/// The listener of one broker (and its clones): started at the first receive, so a producer
/// keeps no connection for it; stopped at close or when the last clone is dropped.
pub(crate) struct Wakes {
    subscriber: SubscriberClient,
    listener: Mutex<Listener>,
}

/// Where the listener is: never started, listening, or stopped for good by a close.
enum Listener {
    NotStarted,
    Listening(JoinHandle<()>),
    Stopped,
}

impl Wakes {
    pub(crate) fn new(subscriber: SubscriberClient) -> Self {
        Wakes {
            subscriber,
            listener: Mutex::new(Listener::NotStarted),
        }
    }

    /// Listens on `channels` (once; later calls do nothing), telling `reads` what falls due.
    pub(crate) fn start(&self, channels: Vec<String>, reads: Weak<Reads>) {
        let mut listener = self.listener.lock().unwrap_or_else(|p| p.into_inner());
        if !matches!(*listener, Listener::NotStarted) {
            return;
        }
        let subscriber = self.subscriber.clone();
        let listen = tokio::spawn(async move {
            // Subscribed to the events before connecting: nothing sent after the
            // subscription is missed.
            let mut messages = subscriber.message_rx();
            let mut reconnects = subscriber.reconnect_rx();
            let connection = match subscriber.init().await {
                Ok(router) => router,
                Err(e) => {
                    tracing::debug!(error = %e.details(), "no wake-up channel: due messages are found by the receive's own looks");
                    return;
                }
            };
            let _router = AbortOnDrop(connection);
            let subscribe = || async {
                if let Err(e) = subscriber.subscribe(channels.clone()).await {
                    tracing::debug!(error = %e.details(), "subscribing to the wake-up channel failed");
                }
            };
            subscribe().await;
            loop {
                let Some(reads) = reads.upgrade() else { return };
                tokio::select! {
                    msg = messages.recv() => match msg {
                        Ok(msg) => {
                            let ms = msg.value.as_str().and_then(|s| s.parse::<u64>().ok());
                            reads.due_in(Duration::from_millis(ms.unwrap_or(0)));
                        }
                        // Some missed: look now.
                        Err(RecvError::Lagged(_)) => reads.due_in(Duration::ZERO),
                        Err(RecvError::Closed) => return,
                    },
                    r = reconnects.recv() => match r {
                        Ok(_) | Err(RecvError::Lagged(_)) => {
                            subscribe().await;
                            // What was announced while disconnected is not replayed: look now.
                            reads.due_in(Duration::ZERO);
                        }
                        Err(RecvError::Closed) => return,
                    },
                }
            }
        });
        *listener = Listener::Listening(listen);
    }

    /// Stops listening (for good) and closes the connection.
    pub(crate) async fn stop(&self) {
        let was = std::mem::replace(
            &mut *self.listener.lock().unwrap_or_else(|p| p.into_inner()),
            Listener::Stopped,
        );
        if let Listener::Listening(task) = was {
            let _ = self.subscriber.quit().await;
            task.abort();
        }
    }
}

impl Drop for Wakes {
    fn drop(&mut self) {
        let listener = self.listener.get_mut().unwrap_or_else(|p| p.into_inner());
        if let Listener::Listening(task) = listener {
            task.abort();
        }
    }
}

/// Aborts the connection's task when the listener ends (or is aborted), so a dropped broker
/// leaves no connection behind.
struct AbortOnDrop(JoinHandle<Result<(), fred::error::Error>>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}
