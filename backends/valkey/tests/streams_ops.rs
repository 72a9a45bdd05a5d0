//! The conformance kit's operations scenarios on a Streams lane (with the Valkey store):
//! dead letters listed, redriven and purged; a redrive sending each task back once; a stale
//! worker from before a redrive fenced off.

mod common;

use std::sync::Arc;

use ferriq::broker::Broker;
use ferriq::testing::conformance::operations as ops_suite;

async fn suite_worker(
    queue: &str,
) -> (
    ferriq::testing::RunningWorker,
    ferriq::Client,
    Arc<ops_suite::Healed>,
) {
    ops_suite::worker_and_client(
        Arc::new(common::stream_broker(queue).await),
        Arc::new(common::store_at(&common::url(), &common::prefix(), |b| b).await),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dead_letters_are_listed_redriven_and_purged() {
    let queue = format!("{}.ops", common::prefix());
    let (worker, client, healed) = suite_worker(&queue).await;
    ops_suite::dead_letters_are_listed_redriven_and_purged(&client, &queue, healed, true).await;
    worker.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redrive_sends_each_task_back_once() {
    let queue = format!("{}.ops", common::prefix());
    let (worker, client, _) = suite_worker(&queue).await;
    ops_suite::a_redrive_sends_each_task_back_once(&client, &queue).await;
    worker.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stale_worker_from_before_a_redrive_cannot_write_over_the_new_result() {
    let queue = format!("{}.ops", common::prefix());
    let brokers: [Arc<dyn Broker>; 2] = [
        Arc::new(common::stream_broker(&queue).await),
        Arc::new(common::stream_broker(&queue).await),
    ];
    let store = Arc::new(common::store().await);
    let expiring = store.clone();
    ops_suite::a_stale_worker_cannot_write_over_a_redriven_result(
        brokers,
        store,
        &queue,
        move |id| {
            let store = expiring.clone();
            async move { store.expire_lease(&id).await.unwrap() }
        },
    )
    .await;
}
