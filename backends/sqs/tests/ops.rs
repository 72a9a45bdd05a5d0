//! Operations on SQS (fauxqs, with the Valkey store): the shared suite's dead letters listed,
//! redriven by reason and purged by task name.

mod common;
#[path = "../../../tests/support/ops.rs"]
mod ops_suite;

use std::sync::Arc;

use common::{QueueOptions, Queues};
use ferriq::Client;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dead_letters_are_listed_redriven_and_purged() {
    let queues = Queues::create(QueueOptions::default()).await;
    let broker = Arc::new(queues.broker().await);
    let store = Arc::new(common::store(&common::unique("ops")).await);
    let healed = Arc::new(ops_suite::Healed::default());
    let worker = ops_suite::worker(broker.clone(), store.clone(), healed.clone());
    let client = Client::new(broker, store);
    // A standard queue keeps no order.
    ops_suite::dead_letters_are_listed_redriven_and_purged(&client, &queues.name, healed, false)
        .await;
    worker.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redrive_sends_each_task_back_once() {
    let queues = Queues::create(QueueOptions::default()).await;
    let broker = Arc::new(queues.broker().await);
    let store = Arc::new(common::store(&common::unique("ops")).await);
    let worker = ops_suite::worker(broker.clone(), store.clone(), Default::default());
    let client = Client::new(broker, store);
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
