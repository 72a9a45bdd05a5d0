//! The exactly-once scenario, for a store: 1,000 tasks, each message delivered twice, four workers,
//! and a chaos loop that expires claim leases and broker visibility at random. Every task must
//! end with exactly one result, written once.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use crate::broker::{Broker, OutgoingMessage};
use crate::memory::MemoryBroker;
use crate::testing::{CountingStore, Oracle, RunningWorker};
use crate::wire::TaskId;
use crate::worker::Outcome;
use crate::{Client, Registry, State, TaskContext, Worker, WorkerConfig};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

#[crate::task(inventory = false, name = "conformance.chaos.double")]
async fn double(oracle: State<Oracle>, ctx: TaskContext, n: u64, pause_ms: u64) -> u64 {
    oracle.started(ctx.task_id());
    tokio::time::sleep(Duration::from_millis(pause_ms)).await;
    oracle.finished(ctx.task_id());
    n * 2
}

/// Makes one task's claim lease run out now, as if its holder had paused.
pub type ExpireLease =
    Arc<dyn Fn(TaskId) -> Pin<Box<dyn Future<Output = bool> + Send>> + Send + Sync>;

/// What the scenario saw.
#[derive(Debug)]
pub struct Report {
    /// Tasks answered (each waited for and checked).
    pub results: u64,
    /// Result writes the store accepted: one per task.
    pub writes: u64,
    /// Tasks whose result was written more than once: 0.
    pub duplicate_writes: usize,
    /// Runs that started while another run of the same task had started (takeovers).
    pub duplicate_starts: u64,
    /// Writes or runs fenced off because their claim had been taken over.
    pub fenced_off: u64,
    /// Claim leases the chaos ended.
    pub expired_leases: usize,
    /// Deliveries the chaos handed out again while in flight.
    pub expired_deliveries: usize,
}

fn config() -> WorkerConfig {
    let mut config = WorkerConfig::default();
    config.concurrency = 16;
    config.lease = Duration::from_secs(3);
    // Deferred copies come back every 20 ms, ready to take over an expired lease.
    config.min_defer = Duration::from_millis(20);
    // The chaos expires leases at random: every expiry is a takeover, not a crash loop.
    config.max_takeovers = u32::MAX;
    config
}

/// Runs the scenario on `store` and asserts lost = 0 and duplicate result writes = 0.
pub async fn exactly_once<S: crate::store::Store>(
    store: Arc<S>,
    expire_lease: ExpireLease,
    tasks: u64,
) -> Report {
    let broker = MemoryBroker::with_visibility(Duration::from_secs(3));
    let store = Arc::new(CountingStore::new(store));
    let oracle = Oracle::default();
    let client = Client::new(Arc::new(broker.clone()), store.clone());

    let mut rng = SmallRng::seed_from_u64(42);
    let messages: Vec<_> = (0..tasks)
        .map(|n| {
            double::call(n, rng.random_range(20..200))
                .into_message()
                .unwrap()
        })
        .collect();
    let ids: Vec<_> = messages.iter().map(|m| m.task_id.clone()).collect();
    // Every message twice, side by side, so both copies are in flight together.
    let doubled: Vec<_> = messages
        .iter()
        .map(|m| OutgoingMessage::from_message(m).unwrap())
        .flat_map(|m| [m.clone(), m])
        .collect();
    broker.publish(doubled).await.unwrap();

    let workers: Vec<RunningWorker> = (0..4)
        .map(|i| {
            RunningWorker::spawn(
                Worker::builder()
                    .broker(Arc::new(broker.clone()))
                    .store(store.clone())
                    .registry(
                        Registry::from_registrations([double::registration()]).expect("one task"),
                    )
                    .state(oracle.clone())
                    .config(config())
                    .jitter_seed(i)
                    .build()
                    .unwrap(),
            )
        })
        .collect();

    let done = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let chaos = {
        let (broker, ids, done) = (broker.clone(), ids.clone(), done.clone());
        let oracle = oracle.clone();
        tokio::spawn(async move {
            let mut rng = SmallRng::seed_from_u64(7);
            let (mut leases, mut deliveries) = (0usize, 0usize);
            let mut round = 0u64;
            while !done.load(std::sync::atomic::Ordering::SeqCst) {
                // A running task's lease runs out with a chance of 1 in 8 a round (a lease of
                // a task not running is no race), until the task has started three times: a
                // task whose every run is taken over before it ends would never end. (At 1 in
                // 20 a run of 1,000 tasks saw 0–6 fenced writes, 2–3 on average: about one
                // run in ten saw none and failed the check below.)
                for id in ids.iter() {
                    let starts = oracle.starts(id);
                    if starts > oracle.finishes(id) && starts < 3 && rng.random_ratio(1, 8) {
                        leases += usize::from(expire_lease(id.clone()).await);
                    }
                }
                // Every delivery in flight is handed out again every 10 rounds, 20 times in
                // all: often enough that expiries land while leases are zeroed and their
                // holders still run (every 50 rounds, a run of 1,000 tasks saw one, and on a
                // clean-clone CI no takeover at all), but not for ever: a run stopped at every
                // broker heartbeat because its delivery was handed out again never ends.
                if round.is_multiple_of(10) && round < 200 {
                    deliveries += broker.expire_in_flight();
                }
                round += 1;
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            (leases, deliveries)
        })
    };

    for (n, id) in ids.iter().enumerate() {
        let value: u64 = client
            .handle(id.clone())
            .wait(Duration::from_secs(180))
            .await
            .unwrap_or_else(|e| panic!("task {n} lost: {e}"));
        assert_eq!(value, n as u64 * 2);
    }
    done.store(true, std::sync::atomic::Ordering::SeqCst);
    let (expired_leases, expired_deliveries) = chaos.await.unwrap();
    // Every duplicate copy is acked as Done in the end: nothing left behind.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(120);
    while !broker.is_empty() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "copies left unsettled"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // Fenced off: a result write refused to a holder that lost its claim (counted by the
    // store: the worker's own `Stale` count misses the ones whose delivery the chaos had
    // expired meanwhile, as their release then fails), or a run stopped by its heartbeat.
    let mut fenced_off = store.fenced_writes();
    for w in workers {
        fenced_off += w.worker.stats().count(Outcome::ClaimLost);
        w.stop().await;
    }
    let report = Report {
        results: ids.len() as u64,
        writes: store.total_writes(),
        duplicate_writes: store.duplicate_writes().len(),
        duplicate_starts: oracle.duplicate_starts(),
        fenced_off,
        expired_leases,
        expired_deliveries,
    };
    println!("exactly-once report: tasks={tasks} {report:?}");
    assert_eq!(report.writes, tasks, "every result written once (lost = 0)");
    assert_eq!(report.duplicate_writes, 0, "duplicate result writes");
    assert_eq!(oracle.distinct_started() as u64, tasks);
    assert!(
        expired_leases > 0 && expired_deliveries > 0,
        "the chaos really happened"
    );
    assert!(
        report.duplicate_starts > 0 && fenced_off > 0,
        "takeovers raced real runs"
    );
    report
}

/// Wraps an async lease-expiry function as an [`ExpireLease`].
pub fn expire_with<F, Fut>(f: F) -> ExpireLease
where
    F: Fn(TaskId) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = bool> + Send + 'static,
{
    Arc::new(move |id| Box::pin(f(id)))
}
