//! The conformance kit's store and flow suites on Valkey (a key prefix of its own).

mod common;

use std::sync::Arc;

use ferriq::store::Store;
use ferriq::testing::conformance;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn valkey_keeps_the_store_contract() {
    let prefix = common::prefix();
    conformance::store_suite(|| {
        let prefix = prefix.clone();
        async move { Arc::new(common::store_at(&common::url(), &prefix, |b| b).await) as Arc<dyn Store> }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn valkey_keeps_the_flow_contract() {
    let prefix = common::prefix();
    conformance::flow_suite(|| {
        let prefix = prefix.clone();
        async move { Arc::new(common::store_at(&common::url(), &prefix, |b| b).await) as Arc<dyn Store> }
    })
    .await;
}
