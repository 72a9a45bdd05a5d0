//! Concurrent calls of one script, gathered into one round trip.
//!
//! While a batch is on the wire, new calls queue up; the next batch takes all of them (up to a
//! limit). Under load this turns many round trips into few, which is what the server spends most
//! of its time on; a lone call still goes out at once.

use std::future::Future;
use std::sync::Arc;

use ferriq::store::StoreError;
use tokio::sync::{mpsc, oneshot, Semaphore};
use tokio::task::JoinHandle;

type Reply<O> = oneshot::Sender<Result<O, StoreError>>;

/// Sends calls of type `I` in batches to a function answering `O` per call, in order.
pub(crate) struct Batcher<I, O> {
    tx: mpsc::UnboundedSender<(I, Reply<O>)>,
}

impl<I: Send + 'static, O: Send + 'static> Batcher<I, O> {
    /// Runs `run` on batches of at most `max_batch` calls, with at most `parallel` batches on
    /// the wire at once. `run` answers each call (in order), or fails the whole batch.
    pub(crate) fn spawn<F, Fut>(max_batch: usize, parallel: usize, run: F) -> (Self, JoinHandle<()>)
    where
        F: Fn(Vec<I>) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<Vec<Result<O, StoreError>>, StoreError>> + Send + 'static,
    {
        let (tx, mut rx) = mpsc::unbounded_channel::<(I, Reply<O>)>();
        let run = Arc::new(run);
        let slots = Arc::new(Semaphore::new(parallel.max(1)));
        let task = tokio::spawn(async move {
            loop {
                // A free slot first: calls arriving meanwhile join the next batch.
                let Ok(slot) = Arc::clone(&slots).acquire_owned().await else {
                    return;
                };
                let Some(first) = rx.recv().await else {
                    return;
                };
                let mut batch = vec![first];
                while batch.len() < max_batch {
                    match rx.try_recv() {
                        Ok(call) => batch.push(call),
                        Err(_) => break,
                    }
                }
                let run = Arc::clone(&run);
                tokio::spawn(async move {
                    let (inputs, replies): (Vec<I>, Vec<Reply<O>>) = batch.into_iter().unzip();
                    let n = replies.len();
                    match run(inputs).await {
                        Ok(outputs) if outputs.len() == n => {
                            for (reply, out) in replies.into_iter().zip(outputs) {
                                let _ = reply.send(out);
                            }
                        }
                        Ok(outputs) => {
                            let why =
                                format!("valkey answered {} results for {n} calls", outputs.len());
                            for reply in replies {
                                let _ = reply.send(Err(StoreError::Unavailable(why.clone())));
                            }
                        }
                        Err(e) => {
                            for reply in replies {
                                let _ = reply.send(Err(copy_error(&e)));
                            }
                        }
                    }
                    drop(slot);
                });
            }
        });
        (Batcher { tx }, task)
    }

    /// One call, answered when its batch is.
    pub(crate) async fn call(&self, input: I) -> Result<O, StoreError> {
        let closed = || StoreError::Unavailable("the valkey store was closed".into());
        let (reply, answer) = oneshot::channel();
        self.tx.send((input, reply)).map_err(|_| closed())?;
        answer.await.map_err(|_| closed())?
    }
}

fn copy_error(e: &StoreError) -> StoreError {
    match e {
        StoreError::Config(m) => StoreError::Config(m.clone()),
        other => StoreError::Unavailable(other.to_string()),
    }
}
