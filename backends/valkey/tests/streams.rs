//! The Streams broker on the shared Redis: the conformance kit's broker suite (a stream of its
//! own per check), and what is its own — reclaim by lease, acked entries deleted, delays.

mod common;

use std::sync::Arc;
use std::time::Duration;

use ferriq::broker::{Broker, ConsumerSettings, OutgoingMessage};
use ferriq::testing::conformance;
use ferriq::wire::TaskMessage;
use ferriq_valkey::StreamBroker;

async fn broker(queue: &str) -> StreamBroker {
    StreamBroker::builder(common::url())
        .queues([queue])
        // The shared test server runs without appendonly (see RELIABILITY.md for a durable one).
        .allow_volatile(true)
        .connect()
        .await
        .expect("connect the Streams broker")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_streams_broker_keeps_the_broker_contract() {
    conformance::broker_suite(|| async {
        let queue = format!("{}.q", common::prefix());
        Arc::new(broker(&queue).await) as Arc<dyn Broker>
    })
    .await;
}
