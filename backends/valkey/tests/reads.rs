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

#[tokio::test]
async fn a_result_that_is_not_text_fails_its_own_read_only() {
    // A Python writer using taskiq's pickle serializer leaves bytes that are not text: that
    // task's read fails, the reads batched with it do not.
    let store = common::store_at(&common::url(), &common::prefix(), |b| b).await;
    let ids: Vec<TaskId> = (0..50).map(|_| TaskId::random()).collect();
    for (i, id) in ids.iter().enumerate().skip(1) {
        let token = common::run_claim(&store, id).await.unwrap();
        store
            .complete(id, token, Some(&ok(json!(i))), None)
            .await
            .unwrap();
    }
    let raw = common::raw_client(&common::url()).await;
    let _: () = fred::prelude::KeysInterface::set(
        &raw,
        store.result_key(&ids[0]),
        fred::types::Value::Bytes(vec![0x80, 0xff, 0x00].into()),
        None,
        None,
        false,
    )
    .await
    .unwrap();
    let alone = store.get(&ids[0]).await;
    assert!(alone.is_err(), "a lone read of it fails: {alone:?}");
    let reads = ids.iter().map(|id| store.get(id));
    let got = futures_util::future::join_all(reads).await;
    assert!(got[0].is_err(), "batched, it fails as alone: {:?}", got[0]);
    for (i, r) in got.into_iter().enumerate().skip(1) {
        assert_eq!(r.unwrap(), ResultStatus::Ready(ok(json!(i))), "task {i}");
    }
    fred::prelude::ClientLike::quit(&raw).await.unwrap();
}
