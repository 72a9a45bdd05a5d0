//! The conformance kit's broker suite on SQS (the fauxqs emulator): each check on a queue and
//! dead-letter queue of its own.

mod common;

use std::sync::{Arc, Mutex};

use common::{QueueOptions, Queues};
use ferriq::broker::Broker;
use ferriq::testing::conformance;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqs_keeps_the_broker_contract() {
    let queues: Arc<Mutex<Vec<Queues>>> = Arc::default();
    conformance::broker_suite(|| {
        let queues = Arc::clone(&queues);
        async move {
            let q = Queues::create(QueueOptions::default()).await;
            let broker = q.broker().await;
            queues.lock().unwrap().push(q);
            Arc::new(broker) as Arc<dyn Broker>
        }
    })
    .await;
}
