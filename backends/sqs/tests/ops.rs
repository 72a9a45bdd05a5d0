//! Operations on SQS (fauxqs, with the Valkey store): the shared suite's dead letters listed,
//! redriven by reason and purged by task name.

mod common;
use ferriq::testing::conformance::operations as ops_suite;

use std::sync::Arc;

use common::{QueueOptions, Queues};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dead_letters_are_listed_redriven_and_purged() {
    let queues = Queues::create(QueueOptions::default()).await;
    let (worker, client, healed) = suite_worker(&queues).await;
    // A standard queue keeps no order.
    ops_suite::dead_letters_are_listed_redriven_and_purged(&client, &queues.name, healed, false)
        .await;
    worker.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redrive_sends_each_task_back_once() {
    let queues = Queues::create(QueueOptions::default()).await;
    let (worker, client, _) = suite_worker(&queues).await;
    ops_suite::a_redrive_sends_each_task_back_once(&client, &queues.name).await;
    worker.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stale_worker_from_before_a_redrive_cannot_write_over_the_new_result() {
    let queues = Queues::create(QueueOptions::default()).await;
    let brokers: [Arc<dyn ferriq::broker::Broker>; 2] = [
        Arc::new(queues.broker().await),
        Arc::new(queues.broker().await),
    ];
    let store = Arc::new(common::store(&common::unique("ops")).await);
    let expiring = store.clone();
    ops_suite::a_stale_worker_cannot_write_over_a_redriven_result(
        brokers,
        store,
        &queues.name,
        move |id| {
            let store = expiring.clone();
            async move { store.expire_lease(&id).await.unwrap() }
        },
    )
    .await;
}

/// The shared suite's worker on `queues` with a store of its own, and a client of both.
async fn suite_worker(
    queues: &Queues,
) -> (
    ferriq::testing::RunningWorker,
    ferriq::Client,
    Arc<ops_suite::Healed>,
) {
    ops_suite::worker_and_client(
        Arc::new(queues.broker().await),
        Arc::new(common::store(&common::unique("ops")).await),
    )
}
