//! Workflows on Valkey: the conformance kit's workflow scenarios, as the core's memory-store run, on the
//! real server.

use ferriq::testing::conformance::exactly_once as chaos;
mod common;
use ferriq::testing::conformance::workflows;

use std::sync::Arc;

use fred::prelude::LuaInterface;

async fn store() -> Arc<ferriq_valkey::ValkeyStore> {
    Arc::new(common::store_at(&common::url(), &common::prefix(), |b| b.pool_size(8)).await)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn group_results_come_back_in_order() {
    workflows::group_results_come_back_in_order(store().await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_chord_runs_its_callback_once_with_every_outcome() {
    workflows::a_chord_runs_its_callback_once_with_every_outcome(store().await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_chain_feeds_each_result_on_and_stops_at_a_failure() {
    workflows::a_chain_feeds_each_result_on_and_stops_at_a_failure(store().await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn progress_and_started_are_visible() {
    workflows::progress_and_started_are_visible(store().await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_hundred_chords_race_duplicates_and_expired_leases() {
    let prefix = common::prefix();
    let store = Arc::new(common::store_at(&common::url(), &prefix, |b| b.pool_size(8)).await);
    let raw = Arc::new(common::raw_client(&common::url()).await);
    let expire = chaos::expire_with(move |id| {
        let (raw, key) = (raw.clone(), format!("{prefix}:claim:{{{prefix}:{id}}}"));
        async move {
            let hit: i64 = raw
                .eval(
                    "local raw = redis.call('GET', KEYS[1]) \
                     if raw and string.sub(raw, 1, 2) == 'r ' then \
                     local s, t, l, rest = string.match(raw, '^(%a) (%d+) (%d+) (.*)$') \
                     redis.call('SET', KEYS[1], s .. ' ' .. t .. ' 0 ' .. rest, 'KEEPTTL') \
                     return 1 end return 0",
                    vec![key],
                    Vec::<String>::new(),
                )
                .await
                .unwrap();
            hit == 1
        }
    });
    workflows::racing_chords(store, expire, 200, 50).await;
}
