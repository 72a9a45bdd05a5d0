//! What the waiter tests share: a claim, a store that only a notification can wake, a waiter
//! parked on its task's channel, and a completion announced or stored the way another process
//! (or a Python worker) makes it.

use std::time::Duration;

use ferriq::store::{ResultStatus, ResultStore, Token};
use ferriq::wire::TaskId;
use tokio::time::Instant;

use super::ok;

/// Claims `id` on `store`, for a test that completes it.
pub async fn claim(store: &ferriq_valkey::ValkeyStore, id: &TaskId) -> Token {
    super::run_claim(store, id).await.unwrap()
}

/// No re-check within the test's time: only a notification can wake a waiter.
pub async fn notification_only_store() -> ferriq_valkey::ValkeyStore {
    super::store_at(&super::url(), &super::prefix(), |b| {
        b.recheck_interval(Duration::from_secs(3600))
    })
    .await
}

/// A waiter of a fresh task that has read Pending, subscribed to the task's own channel and
/// parked there (what a wait for a task enqueued without `reply_to` does after its first
/// re-read), with a raw client to act on the server.
pub struct Parked {
    pub store: ferriq_valkey::ValkeyStore,
    pub id: TaskId,
    pub waiter: tokio::task::JoinHandle<ResultStatus>,
    pub raw: fred::prelude::Client,
    pub channel: String,
}

impl Parked {
    pub async fn wait(recheck: Duration) -> Self {
        let store = super::store_at(&super::url(), &super::prefix(), |b| {
            b.recheck_interval(recheck)
        })
        .await;
        let id = TaskId::random();
        let waiter = {
            let (store, id) = (store.clone(), id.clone());
            tokio::spawn(async move { store.wait(&id, Duration::from_secs(30)).await.unwrap() })
        };
        let raw = super::raw_client(&super::url()).await;
        let channel = format!("{}:done:{}", store.prefix(), id);
        let deadline = Instant::now() + Duration::from_secs(10);
        while super::subscribers(&raw, &channel).await == 0 {
            assert!(Instant::now() < deadline, "the waiter never parked");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        Parked {
            store,
            id,
            waiter,
            raw,
            channel,
        }
    }
}

/// Publishes a completion on `channel` the way the complete script does: the task id, a tab,
/// the stored result's JSON (nothing is stored here).
pub async fn announce(
    raw: &fred::prelude::Client,
    channel: &str,
    id: &TaskId,
    value: serde_json::Value,
) {
    let line = format!("{id}\t{}", serde_json::to_string(&ok(value)).unwrap());
    let _: i64 = fred::prelude::PubsubInterface::publish(raw, channel, line)
        .await
        .unwrap();
}

/// Stores a result directly, announcing it nowhere (as a Python worker does).
pub async fn store_unannounced(
    raw: &fred::prelude::Client,
    store: &ferriq_valkey::ValkeyStore,
    id: &TaskId,
    value: serde_json::Value,
) {
    let _: () = fred::prelude::KeysInterface::set(
        raw,
        store.result_key(id),
        serde_json::to_string(&ok(value)).unwrap(),
        Some(fred::prelude::Expiration::EX(600)),
        None,
        false,
    )
    .await
    .unwrap();
}
