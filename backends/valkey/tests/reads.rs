//! Concurrent result reads share round trips (one `MGET`): each caller still gets its own.

mod common;

use std::time::Duration;

use common::ok;
use ferriq::store::{ResultStatus, ResultStore};
use ferriq::wire::TaskId;
use serde_json::json;

#[tokio::test]
async fn concurrent_reads_each_get_their_own_result() {
    let store = common::store_at(&common::url(), &common::prefix(), |b| b).await;
    let ids: Vec<TaskId> = (0..200).map(|_| TaskId::random()).collect();
    // Every other task has a result, each its own.
    for (i, id) in ids.iter().enumerate().filter(|(i, _)| i % 2 == 0) {
        let token = common::run_claim(&store, id).await.unwrap();
        store
            .complete(id, token, Some(&ok(json!(i))), None)
            .await
            .unwrap();
    }
    for _ in 0..3 {
        let reads = ids.iter().map(|id| store.get(id));
        let got = tokio::time::timeout(
            Duration::from_secs(10),
            futures_util::future::join_all(reads),
        )
        .await
        .expect("the reads are answered");
        for (i, r) in got.into_iter().enumerate() {
            let want = if i % 2 == 0 {
                ResultStatus::Ready(ok(json!(i)))
            } else {
                ResultStatus::Pending
            };
            assert_eq!(r.unwrap(), want, "task {i}");
        }
    }
}
