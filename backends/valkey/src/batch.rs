//! Concurrent calls of one script, gathered into one round trip.
//!
//! While a batch is on the wire, new calls queue up; the next batch takes all of them (up to a
//! limit). Under load this turns many round trips into few, which is what the server spends most
//! of its time on. A lone call (no batch on the wire, nothing queued) goes out from its
//! caller's own task: handing it to the batching task and back would cost two wake-ups of
//! other threads, tens of µs each, on every task's claim and complete.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use ferriq::store::StoreError;
use tokio::sync::{mpsc, oneshot, Semaphore};
use tokio::task::JoinHandle;

type Reply<O> = oneshot::Sender<Result<O, StoreError>>;
type Answers<O> = Result<Vec<Result<O, StoreError>>, StoreError>;
type Run<I, O> = dyn Fn(Vec<I>) -> Pin<Box<dyn Future<Output = Answers<O>> + Send>> + Send + Sync;

/// Sends calls of type `I` in batches to a function answering `O` per call, in order.
pub(crate) struct Batcher<I, O> {
    tx: mpsc::UnboundedSender<(I, Reply<O>)>,
    run: Arc<Run<I, O>>,
    slots: Arc<Semaphore>,
    /// Calls sent to the batching task and not yet taken into a batch.
    queued: Arc<AtomicUsize>,
    /// Batches allowed on the wire at once: the slots' number.
    parallel: usize,
}

impl<I: Send + 'static, O: Send + 'static> Batcher<I, O> {
    /// Runs `run` on batches of at most `max_batch` calls, with at most `parallel` batches on
    /// the wire at once. `run` answers each call (in order), or fails the whole batch.
    pub(crate) fn spawn<F, Fut>(max_batch: usize, parallel: usize, run: F) -> (Self, JoinHandle<()>)
    where
        F: Fn(Vec<I>) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Answers<O>> + Send + 'static,
    {
        let (tx, mut rx) = mpsc::unbounded_channel::<(I, Reply<O>)>();
        let run: Arc<Run<I, O>> = Arc::new(move |calls| Box::pin(run(calls)));
        let parallel = parallel.max(1);
        let slots = Arc::new(Semaphore::new(parallel));
        let queued = Arc::new(AtomicUsize::new(0));
        let batcher = Batcher {
            tx,
            run: Arc::clone(&run),
            slots: Arc::clone(&slots),
            queued: Arc::clone(&queued),
            parallel,
        };
        let task = tokio::spawn(async move {
            loop {
                let Some(first) = rx.recv().await else {
                    return;
                };
                // Then a free slot: calls arriving meanwhile join this batch. (Waiting for the
                // slot before the first call would keep one from lone calls while idle.)
                let Ok(slot) = Arc::clone(&slots).acquire_owned().await else {
                    return;
                };
                let mut batch = vec![first];
                while batch.len() < max_batch {
                    match rx.try_recv() {
                        Ok(call) => batch.push(call),
                        Err(_) => break,
                    }
                }
                queued.fetch_sub(batch.len(), Ordering::AcqRel);
                let run = Arc::clone(&run);
                tokio::spawn(async move {
                    let (inputs, replies): (Vec<I>, Vec<Reply<O>>) = batch.into_iter().unzip();
                    let n = replies.len();
                    match answers(run(inputs).await, n) {
                        Ok(outputs) => {
                            for (reply, out) in replies.into_iter().zip(outputs) {
                                let _ = reply.send(out);
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
        (batcher, task)
    }

    /// Waits for the batches on the wire to be answered, and takes every slot: a call after
    /// this fails at once (the store is closing).
    pub(crate) async fn quiesce(&self) {
        if let Ok(all) = self.slots.acquire_many(self.parallel as u32).await {
            all.forget();
        }
        self.slots.close();
    }

    /// One call, answered when its batch is.
    pub(crate) async fn call(&self, input: I) -> Result<O, StoreError> {
        let closed = || StoreError::Unavailable("the valkey store was closed".into());
        // Nothing on the wire and nothing waiting: this call is a batch of one, sent from
        // here. Under load a batch is on the wire, and calls queue for the next one as
        // before: sending them from here whenever a slot was free shrank the batches by a
        // quarter (a third more script runs per task) for no measured gain in latency.
        if self.queued.load(Ordering::Acquire) == 0
            && self.slots.available_permits() == self.parallel
        {
            if let Ok(_slot) = Arc::clone(&self.slots).try_acquire_owned() {
                let mut outputs = answers((self.run)(vec![input]).await, 1)?;
                return outputs.pop().unwrap_or_else(|| Err(closed()));
            }
        }
        let (reply, answer) = oneshot::channel();
        self.queued.fetch_add(1, Ordering::AcqRel);
        if self.tx.send((input, reply)).is_err() {
            self.queued.fetch_sub(1, Ordering::AcqRel);
            return Err(closed());
        }
        answer.await.map_err(|_| closed())?
    }
}

/// A batch's answers, checked to be one per call.
fn answers<O>(result: Answers<O>, n: usize) -> Answers<O> {
    match result {
        Ok(outputs) if outputs.len() == n => Ok(outputs),
        Ok(outputs) => Err(StoreError::Unavailable(format!(
            "valkey answered {} results for {n} calls",
            outputs.len()
        ))),
        Err(e) => Err(e),
    }
}

fn copy_error(e: &StoreError) -> StoreError {
    match e {
        StoreError::Config(m) => StoreError::Config(m.clone()),
        other => StoreError::Unavailable(other.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use tokio::sync::Notify;

    use super::*;

    /// Each batch's inputs and the task it ran on.
    type Seen = Arc<Mutex<Vec<(Vec<u32>, Option<tokio::task::Id>)>>>;

    /// A batcher whose batches record their inputs and the task they ran on, and wait for
    /// `gate` when their first input is 0.
    fn recording(parallel: usize, gate: Arc<Notify>) -> (Batcher<u32, u32>, Seen) {
        let seen = Arc::new(Mutex::new(Vec::new()));
        let log = Arc::clone(&seen);
        let (batcher, _task) = Batcher::spawn(64, parallel, move |inputs: Vec<u32>| {
            let (log, gate) = (Arc::clone(&log), Arc::clone(&gate));
            async move {
                log.lock()
                    .unwrap()
                    .push((inputs.clone(), tokio::task::try_id()));
                if inputs.first() == Some(&0) {
                    gate.notified().await;
                }
                Ok(inputs.into_iter().map(|i| Ok(i * 10)).collect())
            }
        });
        (batcher, seen)
    }

    #[tokio::test]
    async fn a_lone_call_runs_on_its_callers_task() {
        let (batcher, seen) = recording(1, Arc::new(Notify::new()));
        let caller = tokio::spawn(async move {
            let answer = batcher.call(7).await.unwrap();
            (answer, tokio::task::id())
        });
        let (answer, caller_id) = caller.await.unwrap();
        assert_eq!(answer, 70);
        assert_eq!(*seen.lock().unwrap(), vec![(vec![7], Some(caller_id))]);
    }

    #[tokio::test]
    async fn calls_made_while_every_slot_is_busy_go_out_together_in_order() {
        let gate = Arc::new(Notify::new());
        let (batcher, seen) = recording(1, Arc::clone(&gate));
        let batcher = Arc::new(batcher);
        // The one slot is taken by a lone call that waits for the gate.
        let first = tokio::spawn({
            let b = Arc::clone(&batcher);
            async move { b.call(0).await }
        });
        while seen.lock().unwrap().is_empty() {
            tokio::task::yield_now().await;
        }
        let queued: Vec<_> = (1..=5)
            .map(|i| {
                let b = Arc::clone(&batcher);
                tokio::spawn(async move { b.call(i).await })
            })
            .collect();
        // Every queued call is in the batcher's queue before the slot frees.
        while batcher.queued.load(Ordering::Acquire) < 5 {
            tokio::task::yield_now().await;
        }
        gate.notify_one();
        assert_eq!(first.await.unwrap().unwrap(), 0);
        for (i, call) in (1..=5).zip(queued) {
            assert_eq!(call.await.unwrap().unwrap(), i * 10);
        }
        let seen = seen.lock().unwrap();
        assert_eq!(seen.len(), 2, "one batch of the five: {seen:?}");
        assert_eq!(seen[1].0, vec![1, 2, 3, 4, 5]);
    }
}
