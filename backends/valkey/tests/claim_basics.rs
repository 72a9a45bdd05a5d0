//! A task's first claim: what it answers and records, and a result that exists without any
//! claim (a taskiq worker's) making it `Done`.

mod common;

use std::time::Duration;

use common::ok;
use ferriq::store::{ClaimOutcome, ClaimStore, ResultStatus, ResultStore};
use ferriq::store::{ClaimState, ProgressStore};
use ferriq::wire::TaskId;
use serde_json::json;

const LEASE: Duration = Duration::from_secs(30);

#[tokio::test]
async fn a_first_claim_runs_once_and_records_its_holder() {
    let store = common::store().await;
    let id = TaskId::random();
    let first = store.claim(&id, "w1", LEASE, None).await.unwrap();
    let ClaimOutcome::Run {
        token,
        failures,
        starts,
        takeovers,
        took_over,
        ..
    } = first
    else {
        panic!("expected Run, got {first:?}");
    };
    assert_eq!((failures, starts, takeovers, took_over), (0, 0, 0, false));
    // Its record: running, held by w1.
    let info = store.claim_info(&id).await.unwrap().expect("a record");
    assert_eq!(info.state, ClaimState::Running);
    assert_eq!(info.holder, "w1");
    // A second claim while it runs is deferred.
    assert!(matches!(
        store.claim(&id, "w2", LEASE, None).await.unwrap(),
        ClaimOutcome::Defer { .. }
    ));
    // Released, the next claim counts the earlier start and gets a larger token.
    store.release(&id, token).await.unwrap();
    match store.claim(&id, "w2", LEASE, None).await.unwrap() {
        ClaimOutcome::Run {
            token: next,
            starts,
            ..
        } => {
            assert!(next > token, "tokens grow");
            assert_eq!(starts, 1);
        }
        other => panic!("expected Run, got {other:?}"),
    }
}

#[tokio::test]
async fn a_result_written_without_a_claim_makes_the_first_claim_done() {
    // taskiq's own workers store results with no claim record: a ferriq worker receiving a
    // copy of such a task must not run it again.
    let store = common::store().await;
    let id = TaskId::random();
    let raw = common::raw_client(&common::url()).await;
    let _: () = fred::prelude::KeysInterface::set(
        &raw,
        store.result_key(&id),
        serde_json::to_string(&ok(json!(3))).unwrap(),
        None,
        None,
        false,
    )
    .await
    .unwrap();
    assert!(matches!(
        store.claim(&id, "w1", LEASE, None).await.unwrap(),
        ClaimOutcome::Done
    ));
    assert!(
        store.claim_info(&id).await.unwrap().is_none(),
        "no record was written"
    );
    assert_eq!(
        store.get(&id).await.unwrap(),
        ResultStatus::Ready(ok(json!(3)))
    );
    fred::prelude::ClientLike::quit(&raw).await.unwrap();
}
