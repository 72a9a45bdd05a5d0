//! Workflows on the memory store: groups, chords, chains, progress and Started status, and
//! chords racing duplicated deliveries and expired leases.

use ferriq::testing::conformance::{exactly_once as chaos, workflows};

use std::sync::Arc;

use ferriq::memory::MemoryStore;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn group_results_come_back_in_order() {
    workflows::group_results_come_back_in_order(Arc::new(MemoryStore::new())).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_chord_runs_its_callback_once_with_every_outcome() {
    workflows::a_chord_runs_its_callback_once_with_every_outcome(Arc::new(MemoryStore::new()))
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_chain_feeds_each_result_on_and_stops_at_a_failure() {
    workflows::a_chain_feeds_each_result_on_and_stops_at_a_failure(Arc::new(MemoryStore::new()))
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn progress_and_started_are_visible() {
    workflows::progress_and_started_are_visible(Arc::new(MemoryStore::new())).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_hundred_chords_race_duplicates_and_expired_leases() {
    let store = Arc::new(MemoryStore::new());
    let expire = {
        let store = store.clone();
        chaos::expire_with(move |id| {
            let store = store.clone();
            async move { store.expire_lease(&id) }
        })
    };
    workflows::racing_chords(store, expire, 200, 50).await;
}
