//! SQS holds a message at most 12 hours after a receive. With the broker's clock advanced to
//! near that limit, a run still going is failed with a clear error while its message is still
//! held, and the message is parked: nothing is lost and nothing runs twice.

mod common;

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::{QueueOptions, Queues};
use ferriq::memory::MemoryStore;
use ferriq::testing::RunningWorker;
use ferriq::wire::ErrorKind;
use ferriq::{Client, Registry, State, WaitError, Worker};

#[derive(Default)]
struct Runs(AtomicU32);

#[ferriq::task(name = "sqs.budget.long")]
async fn long(runs: State<Arc<Runs>>) -> u32 {
    runs.0.fetch_add(1, Ordering::SeqCst);
    tokio::time::sleep(Duration::from_secs(3600)).await;
    1
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_near_the_twelve_hour_limit_fails_clearly_and_its_message_is_parked() {
    let queues = Queues::create(QueueOptions::default()).await;
    let broker = queues.broker().await;
    let store = Arc::new(MemoryStore::new());
    let runs = Arc::new(Runs::default());
    let worker = RunningWorker::spawn(
        Worker::builder()
            .broker(Arc::new(broker.clone()))
            .store(store.clone())
            .registry(
                Registry::from_inventory()
                    .unwrap()
                    .only(&[long::NAME])
                    .unwrap(),
            )
            .state(Arc::clone(&runs))
            .lease(Duration::from_secs(3))
            .build()
            .unwrap(),
    );
    let client = Client::new(Arc::new(queues.broker().await), store.clone());
    let h = long::kiq(&client).await.unwrap();
    common::eventually("started", Duration::from_secs(20), || {
        runs.0.load(Ordering::SeqCst) == 1
    })
    .await;
    // 12 h less the 2-minute margin less a little: the next heartbeat finds the budget ending.
    broker.age_deliveries(Duration::from_secs(12 * 3600 - 120 - 2));
    match h.wait(Duration::from_secs(30)).await {
        Err(WaitError::Failed(f)) => {
            assert_eq!(f.kind, Some(ErrorKind::Timeout), "{f}");
            assert!(!f.retryable, "a retry would hit the same limit");
            assert!(f.message.contains("12 hours"), "{}", f.message);
        }
        other => panic!("expected the limit's failure, got {other:?}"),
    }
    let mut dead = Vec::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while dead.is_empty() {
        assert!(tokio::time::Instant::now() < deadline, "not parked");
        dead = queues.dead_letters().await;
    }
    let reason = dead[0].message_attributes.as_ref().unwrap()["ferriq_reason"]
        .string_value()
        .unwrap()
        .to_owned();
    assert_eq!(reason, "non_retryable");
    assert_eq!(runs.0.load(Ordering::SeqCst), 1, "not run again");
    assert_eq!(
        queues.counts().await,
        (0, 0),
        "the original is gone from the queue"
    );
    worker.stop().await;
}
