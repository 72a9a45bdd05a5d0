//! The conformance kit on the memory backend (with feature `conformance`, which the test
//! script's workspace run turns on through the backends' tests).

use std::sync::Arc;

use ferriq::broker::Broker;
use ferriq::memory::{MemoryBroker, MemoryStore};
use ferriq::store::Store;
use ferriq::testing::conformance;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_memory_broker_keeps_the_broker_contract() {
    conformance::broker_suite(|| async { Arc::new(MemoryBroker::new()) as Arc<dyn Broker> }).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_memory_store_keeps_the_store_contract() {
    conformance::store_suite(|| async { Arc::new(MemoryStore::new()) as Arc<dyn Store> }).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_memory_store_keeps_the_flow_contract() {
    conformance::flow_suite(|| async { Arc::new(MemoryStore::new()) as Arc<dyn Store> }).await;
}
