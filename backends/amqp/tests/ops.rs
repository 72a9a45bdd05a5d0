//! Operations on RabbitMQ (with the Valkey store): the shared suite's dead letters listed in
//! order, redriven by reason and purged by task name.

mod common;
#[path = "../../../tests/support/ops.rs"]
mod ops_suite;

use std::sync::Arc;

use common::Topology;
use ferriq::Client;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dead_letters_are_listed_redriven_and_purged() {
    let topology = Topology::new();
    let broker = Arc::new(topology.broker().await);
    let store = Arc::new(common::store(&common::unique("ops")).await);
    let healed = Arc::new(ops_suite::Healed::default());
    let worker = ops_suite::worker(broker.clone(), store.clone(), healed.clone());
    let client = Client::new(broker, store);
    ops_suite::dead_letters_are_listed_redriven_and_purged(&client, &topology.queue, healed, true)
        .await;
    worker.stop().await;
}
