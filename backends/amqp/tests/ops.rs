//! Operations on RabbitMQ (with the Valkey store): the shared suite's dead letters listed in
//! order, redriven by reason and purged by task name.

mod common;
use ferriq::testing::conformance::operations as ops_suite;

use std::sync::Arc;

use common::Topology;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dead_letters_are_listed_redriven_and_purged() {
    let topology = Topology::new();
    let (worker, client, healed) = suite_worker(&topology).await;
    ops_suite::dead_letters_are_listed_redriven_and_purged(&client, &topology.queue, healed, true)
        .await;
    worker.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redrive_sends_each_task_back_once() {
    let topology = Topology::new();
    let (worker, client, _) = suite_worker(&topology).await;
    ops_suite::a_redrive_sends_each_task_back_once(&client, &topology.queue).await;
    worker.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stale_worker_from_before_a_redrive_cannot_write_over_the_new_result() {
    let topology = Topology::new();
    let brokers: [Arc<dyn ferriq::broker::Broker>; 2] = [
        Arc::new(topology.broker().await),
        Arc::new(topology.broker().await),
    ];
    let store = Arc::new(common::store(&common::unique("ops")).await);
    let expiring = store.clone();
    ops_suite::a_stale_worker_cannot_write_over_a_redriven_result(
        brokers,
        store,
        &topology.queue,
        move |id| {
            let store = expiring.clone();
            async move { store.expire_lease(&id).await.unwrap() }
        },
    )
    .await;
}

/// The shared suite's worker on `topology` with a store of its own, and a client of both.
async fn suite_worker(
    topology: &Topology,
) -> (
    ferriq::testing::RunningWorker,
    ferriq::Client,
    Arc<ops_suite::Healed>,
) {
    ops_suite::worker_and_client(
        Arc::new(topology.broker().await),
        Arc::new(common::store(&common::unique("ops")).await),
    )
}
