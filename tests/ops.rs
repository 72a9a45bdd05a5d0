//! Operations on the memory backends: dead letters listed, redriven, purged; workers listed;
//! a task inspected; a stale worker from before a redrive fenced off.

use ferriq::testing::conformance::operations as ops_suite;

use std::sync::Arc;
use std::time::Duration;

use ferriq::broker::{Broker, DeadLetter, DeadLetterReason};
use ferriq::dead_letters::DeadFilter;
use ferriq::testing::TestEnv;
use ferriq::wire::ErrorKind;
use ferriq::WaitError;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dead_letters_are_listed_redriven_and_purged() {
    let env = TestEnv::new();
    let (worker, client, healed) = suite_worker(&env);
    ops_suite::dead_letters_are_listed_redriven_and_purged(&client, "taskiq", healed, true).await;
    worker.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redrive_sends_each_task_back_once() {
    let env = TestEnv::new();
    let (worker, client, _) = suite_worker(&env);
    ops_suite::a_redrive_sends_each_task_back_once(&client, "taskiq").await;
    worker.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn workers_report_themselves_and_their_runs() {
    let env = TestEnv::new();
    let (worker, _, _) = suite_worker(&env);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    let workers = loop {
        let w = env.client.ops().workers().await.unwrap();
        if !w.is_empty() {
            break w;
        }
        assert!(tokio::time::Instant::now() < deadline, "no worker listed");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_eq!(workers.len(), 1);
    let w = &workers[0];
    assert_eq!(w.pid, std::process::id());
    assert_eq!(w.lanes, ["taskiq"]);
    assert_eq!(w.concurrency, 32);
    worker.stop().await;
    assert!(
        env.client.ops().workers().await.unwrap().is_empty(),
        "a stopped worker leaves"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stale_worker_from_before_a_redrive_cannot_write_over_the_new_result() {
    let env = TestEnv::new();
    let store = env.store.clone();
    ops_suite::a_stale_worker_cannot_write_over_a_redriven_result(
        [Arc::new(env.broker.clone()), Arc::new(env.broker.clone())],
        Arc::new(env.store.clone()),
        "taskiq",
        move |id| {
            let store = store.clone();
            async move { store.expire_lease(&id) }
        },
    )
    .await;
}

#[ferriq::task(name = "ops.parked")]
async fn parked() -> u32 {
    1
}

#[tokio::test]
async fn purging_a_dead_letter_that_has_no_result_answers_its_caller() {
    let env = TestEnv::new();
    // Parked by the broker itself (its redrive limit), as SQS does under a crash storm: no
    // worker wrote a result, and the caller waits.
    let handle = parked::kiq(&env.client).await.unwrap();
    let delivery = env
        .broker
        .receive(1, Duration::from_secs(1))
        .await
        .unwrap()
        .pop()
        .expect("the message is there");
    let why = DeadLetter::new(
        DeadLetterReason::RedriveLimit,
        "moved by the broker",
        None,
        0,
    );
    env.broker.dead_letter(&delivery, &why).await.unwrap();
    // A letter parked with its result whose result is gone now: a redrive reset it and stopped
    // before removing the letter; its copy is on its way, and a purge must not cancel it.
    let reset = parked::kiq(&env.client).await.unwrap();
    let delivery = env
        .broker
        .receive(1, Duration::from_secs(1))
        .await
        .unwrap()
        .pop()
        .expect("the second message is there");
    let why = DeadLetter::new(DeadLetterReason::RetriesExhausted, "failed", None, 3);
    env.broker.dead_letter(&delivery, &why).await.unwrap();
    assert!(matches!(
        handle.wait(Duration::from_millis(50)).await,
        Err(WaitError::TimedOut(_) | WaitError::NoConsumers { .. })
    ));
    let report = env
        .client
        .ops()
        .purge(&delivery.queue, &DeadFilter::all(), |_| {})
        .await
        .unwrap();
    assert_eq!((report.purged, report.answered), (2, 1));
    assert!(matches!(
        reset.status().await.unwrap(),
        ferriq::TaskStatus::Pending
    ));
    match handle.wait(Duration::from_secs(5)).await {
        Err(WaitError::Failed(f)) => {
            assert_eq!(f.kind, Some(ErrorKind::Cancelled));
            assert!(f.message.contains("purge"), "{}", f.message);
        }
        other => panic!("the caller was not answered: {other:?}"),
    }
}

/// The shared suite's worker on the memory backends of `env`, and a client of them.
fn suite_worker(
    env: &TestEnv,
) -> (
    ferriq::testing::RunningWorker,
    ferriq::Client,
    Arc<ops_suite::Healed>,
) {
    ops_suite::worker_and_client(Arc::new(env.broker.clone()), Arc::new(env.store.clone()))
}
