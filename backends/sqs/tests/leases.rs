//! Holding messages on SQS: heartbeats keep a long run's message from a second worker, and a
//! task held elsewhere does not spend its copies' redrive budget while they wait for it.

mod common;

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::{QueueOptions, Queues};
use ferriq::memory::MemoryStore;
use ferriq::testing::RunningWorker;
use ferriq::wire::TaskId;
use ferriq::worker::Outcome;
use ferriq::{Client, Registry, State, Worker};

#[derive(Default)]
struct Runs(AtomicU32);

#[ferriq::task(name = "sqs.leases.slow")]
async fn slow(runs: State<Arc<Runs>>, secs: u64) -> u64 {
    runs.0.fetch_add(1, Ordering::SeqCst);
    tokio::time::sleep(Duration::from_secs(secs)).await;
    secs
}

/// The lease the heartbeat tests give their workers: shorter than the queue's visibility.
const SHORT_LEASE: Duration = Duration::from_secs(3);

fn spawn(
    broker: ferriq_sqs::SqsBroker,
    store: Arc<MemoryStore>,
    runs: Arc<Runs>,
    lease: Duration,
) -> RunningWorker {
    RunningWorker::spawn(
        Worker::builder()
            .broker(Arc::new(broker))
            .store(store)
            .registry(
                Registry::from_inventory()
                    .unwrap()
                    .only(&[slow::NAME])
                    .unwrap(),
            )
            .state(runs)
            .concurrency(4)
            .lease(lease)
            .build()
            .unwrap(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn heartbeats_keep_a_twenty_second_run_from_a_second_worker() {
    // The queue would hand the message out again after 5 s without heartbeats.
    let queues = Queues::create(QueueOptions {
        visibility_secs: 5,
        ..Default::default()
    })
    .await;
    let store = Arc::new(MemoryStore::new());
    let runs = Arc::new(Runs::default());
    let first = spawn(
        queues.broker().await,
        store.clone(),
        Arc::clone(&runs),
        SHORT_LEASE,
    );
    let second = spawn(
        queues.broker().await,
        store.clone(),
        Arc::clone(&runs),
        SHORT_LEASE,
    );
    let client = Client::new(Arc::new(queues.broker().await), store);
    let h = slow::kiq(&client, 20).await.unwrap();
    assert_eq!(h.wait(Duration::from_secs(60)).await.unwrap(), 20);
    assert_eq!(runs.0.load(Ordering::SeqCst), 1, "started once");
    for w in [&first, &second] {
        let stats = w.worker.stats();
        assert_eq!(
            stats.count(Outcome::Deferred),
            0,
            "never received by another worker"
        );
    }
    first.stop().await;
    second.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn copies_of_a_held_task_are_deferred_without_being_redriven() {
    // SQS parks a message received 5 times; the task runs for 15 s on a 3 s lease, so its
    // copies come back five times each while they wait.
    let queues = Queues::create(QueueOptions {
        max_receive_count: 5,
        ..Default::default()
    })
    .await;
    let store = Arc::new(MemoryStore::new());
    let runs = Arc::new(Runs::default());
    let holder = spawn(
        queues.broker().await,
        store.clone(),
        Arc::clone(&runs),
        SHORT_LEASE,
    );
    let client = Client::new(Arc::new(queues.broker().await), store.clone());
    let id = TaskId::random();
    let h = client
        .enqueue(slow::call(15).with_task_id(id.clone()))
        .await
        .unwrap();
    common::eventually("the holder started", Duration::from_secs(20), || {
        runs.0.load(Ordering::SeqCst) == 1
    })
    .await;
    // Three more copies of the same task, for three other workers.
    for _ in 0..3 {
        client
            .enqueue(slow::call(15).with_task_id(id.clone()))
            .await
            .unwrap();
    }
    let others: Vec<_> = {
        let mut v = Vec::new();
        for _ in 0..3 {
            v.push(spawn(
                queues.broker().await,
                store.clone(),
                Arc::clone(&runs),
                SHORT_LEASE,
            ));
        }
        v
    };
    assert_eq!(h.wait(Duration::from_secs(60)).await.unwrap(), 15);
    // Every copy ends acked as a duplicate of the finished task.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        let (ready, in_flight) = queues.counts().await;
        if ready + in_flight == 0 {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{ready} ready, {in_flight} in flight"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // Counted on every worker: the holder (concurrency 4) takes its share of the copies too.
    let deferred: u64 = others
        .iter()
        .chain(std::iter::once(&holder))
        .map(|w| w.worker.stats().count(Outcome::Deferred))
        .sum();
    assert!(
        deferred >= 6,
        "the copies were deferred repeatedly ({deferred})"
    );
    assert!(
        queues.dead_letters().await.is_empty(),
        "nothing redriven by SQS"
    );
    assert_eq!(runs.0.load(Ordering::SeqCst), 1, "one run");
    assert_eq!(store.write_count(&id), 1, "one result");
    for w in others {
        w.stop().await;
    }
    holder.stop().await;
}

/// A worker that stops waits for its open long poll to end: cut off, the poll's connection
/// closes, and a message the queue hands to it anyway stays invisible for a whole lease (10
/// minutes here) instead of going to the next worker at once — a rolling restart's tasks.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopping_worker_leaves_no_message_to_its_closed_poll() {
    let queues = Queues::create(QueueOptions::default()).await;
    let store = Arc::new(MemoryStore::new());
    let runs = Arc::new(Runs::default());
    let worker = |wait: u64| {
        let (queues, store, runs) = (&queues, store.clone(), Arc::clone(&runs));
        async move {
            let broker = queues
                .builder()
                .wait_time(Duration::from_secs(wait))
                .connect()
                .await
                .unwrap();
            spawn(broker, store, runs, Duration::from_secs(600))
        }
    };
    let client = Client::new(Arc::new(queues.broker().await), store.clone());
    let first = worker(5).await;
    // A task run proves the first worker polls; its poller is back in a 5 s long poll after.
    let h = slow::kiq(&client, 0).await.unwrap();
    assert_eq!(h.wait(Duration::from_secs(30)).await.unwrap(), 0);
    first.stop().await;
    // Sent after the first worker stopped: the next worker runs it at once.
    let second = worker(1).await;
    let h = slow::kiq(&client, 0).await.unwrap();
    assert_eq!(
        h.wait(Duration::from_secs(20)).await.unwrap(),
        0,
        "held by the stopped worker's poll"
    );
    second.stop().await;
}

/// Waits until the main queue holds `ready` visible messages and `in_flight` hidden ones.
async fn counts_reach(queues: &Queues, ready: u64, in_flight: u64, limit: Duration, what: &str) {
    let deadline = tokio::time::Instant::now() + limit;
    loop {
        let counts = queues.counts().await;
        if counts == (ready, in_flight) {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{what}: (ready, in flight) = {counts:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Deliveries a poll brought that the worker has not taken when it begins to drain go back at
/// once, visible to the next worker, instead of after their lease (10 minutes here).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deliveries_buffered_when_the_drain_starts_go_back_at_once() {
    use ferriq::broker::{Broker, ConsumerSettings};
    let queues = Queues::create(QueueOptions::default()).await;
    let client = Client::new(
        Arc::new(queues.broker().await),
        Arc::new(MemoryStore::new()),
    );
    for _ in 0..3 {
        slow::kiq(&client, 0).await.unwrap();
    }
    let broker = queues.broker().await;
    broker.prepare_consumer(&ConsumerSettings::new(3, Duration::from_secs(600)));
    // Slots for three offered, with no wait: the pollers bring the messages into the
    // buffer, where nobody takes them (any taken at once stay with this test).
    let taken = broker.receive(3, Duration::ZERO).await.unwrap().len() as u64;
    counts_reach(&queues, 0, 3, Duration::from_secs(20), "polled").await;
    broker.drain_started();
    counts_reach(
        &queues,
        3 - taken,
        taken,
        Duration::from_secs(10),
        "buffered deliveries handed back",
    )
    .await;
    broker.stop_receiving().await;
}
