//! The conformance kit's broker suite on RabbitMQ: each check on a lane of its own.

mod common;

use std::sync::{Arc, Mutex};

use common::Topology;
use ferriq::broker::Broker;
use ferriq::testing::conformance;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rabbitmq_keeps_the_broker_contract() {
    // Kept until the end: a topology deletes its queues when dropped.
    let lanes: Arc<Mutex<Vec<Topology>>> = Arc::default();
    conformance::broker_suite(|| {
        let lanes = Arc::clone(&lanes);
        async move {
            let topology = Topology::new();
            let broker = topology.broker().await;
            lanes.lock().unwrap().push(topology);
            Arc::new(broker) as Arc<dyn Broker>
        }
    })
    .await;
}
