//! The core worker end to end on the memory broker with claims and results in Valkey, and the
//! exactly-once scenario on Valkey.

mod common;

use ferriq::testing::conformance::exactly_once as chaos;

use std::sync::Arc;
use std::time::Duration;

use ferriq::wire::ErrorKind;
use ferriq::{Client, TaskContext, TaskError, WaitError};
use fred::prelude::LuaInterface;

#[ferriq::task(name = "valkey.e2e.flaky", max_attempts = 3, backoff_initial = 0.05)]
async fn flaky(ctx: TaskContext, word: String) -> Result<String, TaskError> {
    if ctx.attempt() < 2 {
        return Err(TaskError::retryable("first attempt fails"));
    }
    Ok(format!("{word} on attempt {}", ctx.attempt()))
}

#[ferriq::task(name = "valkey.e2e.fatal")]
async fn fatal() -> Result<(), TaskError> {
    Err(TaskError::fatal("bad input"))
}

#[tokio::test]
async fn the_worker_runs_on_the_memory_broker_with_valkey_claims_and_results() {
    let store = Arc::new(common::store().await);
    let broker = Arc::new(ferriq::memory::MemoryBroker::new());
    let worker = common::spawn_worker(broker.clone(), store.clone(), &[flaky::NAME, fatal::NAME]);
    let client = Client::new(broker.clone(), store.clone());
    let ok = flaky::kiq(&client, "hello".into()).await.unwrap();
    let bad = fatal::kiq(&client).await.unwrap();
    assert_eq!(
        ok.wait(Duration::from_secs(30)).await.unwrap(),
        "hello on attempt 2"
    );
    match bad.wait(Duration::from_secs(30)).await {
        Err(WaitError::Failed(f)) => assert_eq!(f.kind, Some(ErrorKind::TaskError)),
        other => panic!("{other:?}"),
    }
    worker.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn every_task_is_answered_exactly_once_on_valkey() {
    let prefix = common::prefix();
    let store = Arc::new(common::store_at(&common::url(), &prefix, |b| b.pool_size(8)).await);
    // Lease expiry injected on the server: the claim's lease_until is set to 0 if it runs.
    let raw = Arc::new(common::raw_client(&common::url()).await);
    let expire = {
        let prefix = prefix.clone();
        chaos::expire_with(move |id| {
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
        })
    };
    chaos::exactly_once(store, expire, 1_000).await;
}
