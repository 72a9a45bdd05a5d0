//! design §1.3 under duress, on the memory store (the same scenario runs on Valkey in
//! ferriq-valkey's tests).

use ferriq::testing::conformance::exactly_once as chaos;

use std::sync::Arc;

use ferriq::memory::MemoryStore;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn every_task_is_answered_exactly_once_despite_duplicates_and_lease_expiries() {
    let store = Arc::new(MemoryStore::new());
    let expire = {
        let store = store.clone();
        chaos::expire_with(move |id| {
            let hit = store.expire_lease(&id);
            async move { hit }
        })
    };
    let report = chaos::exactly_once(store.clone(), expire, 1_000).await;
    // The store's own count agrees with the oracle's.
    assert_eq!(store.total_writes(), report.writes);
    assert!(store.duplicate_writes().is_empty());
}
