//! DESIGN §1.3 under duress: 1,000 tasks, each message delivered twice, four workers, and a
//! chaos loop that expires claim leases and broker visibility at random. Every task must end
//! with exactly one result, written once.

mod common;

use std::sync::Arc;
use std::time::Duration;

use ferriq::broker::{Broker, OutgoingMessage};
use ferriq::memory::{MemoryBroker, MemoryStore};
use ferriq::testing::{Oracle, RunningWorker};
use ferriq::worker::Outcome;
use ferriq::{Client, Registry, State, TaskContext, Worker, WorkerConfig};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

#[ferriq::task(name = "exactly.double")]
async fn double(oracle: State<Oracle>, ctx: TaskContext, n: u64, pause_ms: u64) -> u64 {
    oracle.started(ctx.task_id());
    tokio::time::sleep(Duration::from_millis(pause_ms)).await;
    oracle.finished(ctx.task_id());
    n * 2
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn every_task_is_answered_exactly_once_despite_duplicates_and_lease_expiries() {
    const TASKS: u64 = 1_000;
    let broker = MemoryBroker::with_visibility(Duration::from_secs(3));
    let store = MemoryStore::new();
    let oracle = Oracle::default();
    let client = Client::new(Arc::new(broker.clone()), Arc::new(store.clone()));

    let mut rng = SmallRng::seed_from_u64(42);
    let calls: Vec<_> = (0..TASKS)
        .map(|n| {
            double::call(n, rng.random_range(20..200))
                .into_message()
                .unwrap()
        })
        .collect();
    let ids: Vec<_> = calls.iter().map(|m| m.task_id.clone()).collect();
    let outgoing: Vec<_> = calls
        .iter()
        .map(|m| OutgoingMessage::from_message(m).unwrap())
        .collect();
    // Every message twice, side by side, so both copies are in flight together: the
    // at-least-once broker's duplicates.
    let doubled: Vec<_> = outgoing
        .iter()
        .flat_map(|m| [m.clone(), m.clone()])
        .collect();
    broker.publish(doubled).await.unwrap();

    let workers: Vec<RunningWorker> = (0..4)
        .map(|i| {
            RunningWorker::spawn(
                Worker::builder()
                    .broker(Arc::new(broker.clone()))
                    .store(Arc::new(store.clone()))
                    .registry(
                        Registry::from_inventory()
                            .unwrap()
                            .only(&[double::NAME])
                            .unwrap(),
                    )
                    .state(oracle.clone())
                    .config(config())
                    .jitter_seed(i)
                    .build()
                    .unwrap(),
            )
        })
        .collect();

    // Chaos (the deferred copies come back every 20 ms, ready to take over): random claim leases run out (a holder paused or partitioned), and now and then
    // every in-flight delivery's visibility runs out (its redelivery races the first run).
    let chaos = {
        let (store, broker, ids) = (store.clone(), broker.clone(), ids.clone());
        tokio::spawn(async move {
            let mut rng = SmallRng::seed_from_u64(7);
            let (mut expired_leases, mut expired_deliveries) = (0usize, 0usize);
            for round in 0.. {
                for _ in 0..100 {
                    let id = &ids[rng.random_range(0..ids.len())];
                    expired_leases += usize::from(store.expire_lease(id));
                }
                if round % 50 == 0 {
                    expired_deliveries += broker.expire_in_flight();
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
                if store.result_count() as u64 == TASKS {
                    break;
                }
            }
            (expired_leases, expired_deliveries)
        })
    };

    for (n, id) in ids.iter().enumerate() {
        let value: u64 = client
            .handle(id.clone())
            .wait(Duration::from_secs(120))
            .await
            .unwrap_or_else(|e| panic!("task {n} lost: {e}"));
        assert_eq!(value, n as u64 * 2);
    }
    let (expired_leases, expired_deliveries) = chaos.await.unwrap();
    // Every duplicate copy is acked as Done in the end: nothing left behind.
    common::eventually("all copies settled", Duration::from_secs(120), || {
        broker.is_empty()
    })
    .await;
    let mut fenced = 0;
    for w in workers {
        let stats = w.worker.stats();
        fenced += stats.count(Outcome::Stale) + stats.count(Outcome::ClaimLost);
        w.stop().await;
    }

    let duplicate_writes = store.duplicate_writes();
    println!(
        "tasks={TASKS} results={} writes={} duplicate_writes={} duplicate_starts={} \
         fenced_off={fenced} expired_leases={expired_leases} expired_deliveries={expired_deliveries}",
        store.result_count(),
        store.total_writes(),
        duplicate_writes.len(),
        oracle.duplicate_starts(),
    );
    assert_eq!(store.result_count() as u64, TASKS, "lost = 0");
    assert_eq!(store.total_writes(), TASKS, "every result written once");
    assert!(
        duplicate_writes.is_empty(),
        "duplicate result writes: {duplicate_writes:?}"
    );
    assert_eq!(oracle.distinct_started() as u64, TASKS);
    assert!(
        expired_leases > 0 && expired_deliveries > 0,
        "the chaos really happened"
    );
    assert!(
        oracle.duplicate_starts() > 0 && fenced > 0,
        "takeovers raced real runs"
    );
}

fn config() -> WorkerConfig {
    let mut config = WorkerConfig::default();
    config.concurrency = 16;
    config.lease = Duration::from_secs(3);
    config.min_defer = Duration::from_millis(20);
    config
}
