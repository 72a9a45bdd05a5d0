//! The store suite: claims and the one result, as the worker relies on them from every
//! [`Store`].

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use serde_json::json;
use tokio::time::Instant;

use super::PATIENCE;
use crate::store::{
    ClaimLease, ClaimOutcome, CompleteOutcome, FailureRecord, ResultStatus, Store, Token,
};
use crate::wire::{ErrorKind, TaskId, TaskResult};

/// Runs every store check, each on a store from `new_store` (on a shared server, a key prefix
/// of its own is enough: every check uses fresh task ids). Panics naming the check and the
/// rule it found broken.
pub async fn store_suite<F, Fut>(new_store: F)
where
    F: Fn() -> Fut,
    Fut: Future<Output = Arc<dyn Store>>,
{
    a_claim_is_exclusive_and_a_result_written_once(new_store().await).await;
    only_the_current_token_heartbeats(new_store().await).await;
    a_lease_that_runs_out_is_taken_over(new_store().await).await;
    failures_are_counted_across_claims(new_store().await).await;
    a_revoked_task_never_starts(new_store().await).await;
    a_wait_is_woken_by_the_write(new_store().await).await;
}

const LEASE: Duration = Duration::from_secs(30);

fn ok(n: i64) -> TaskResult {
    TaskResult::success(json!(n), 0.01, Default::default())
}

async fn claimed(store: &dyn Store, id: &TaskId, worker: &str, check: &str) -> Token {
    match store.claim(id, worker, LEASE, None).await.expect("claim") {
        ClaimOutcome::Run { token, .. } => token,
        other => panic!("conformance {check}: a fresh task must be runnable, got {other:?}"),
    }
}

async fn a_claim_is_exclusive_and_a_result_written_once(store: Arc<dyn Store>) {
    let check = "a_claim_is_exclusive_and_a_result_written_once";
    let id = TaskId::random();
    let token = claimed(&*store, &id, "w1", check).await;
    match store.claim(&id, "w2", LEASE, None).await.expect("claim") {
        ClaimOutcome::Defer { .. } => {}
        other => {
            panic!("conformance {check}: a held claim must defer another worker, got {other:?}")
        }
    }
    let stale = Token(token.0.wrapping_sub(1));
    assert_eq!(
        store
            .complete(&id, stale, Some(&ok(0)), None)
            .await
            .expect("complete"),
        CompleteOutcome::Stale,
        "conformance {check}: a token that is not current writes nothing"
    );
    assert!(
        matches!(store.get(&id).await.expect("get"), ResultStatus::Pending),
        "conformance {check}: the stale write left a result"
    );
    assert_eq!(
        store
            .complete(&id, token, Some(&ok(1)), None)
            .await
            .expect("complete"),
        CompleteOutcome::Stored
    );
    assert_eq!(
        store
            .complete(&id, token, Some(&ok(2)), None)
            .await
            .expect("complete"),
        CompleteOutcome::AlreadyStored,
        "conformance {check}: a repeated write (a lost reply) must not write again"
    );
    match store.get(&id).await.expect("get") {
        ResultStatus::Ready(r) => assert_eq!(
            r.return_value,
            json!(1),
            "conformance {check}: the first write stands"
        ),
        other => panic!("conformance {check}: the result is not readable: {other:?}"),
    }
    assert!(
        matches!(
            store.claim(&id, "w3", LEASE, None).await.expect("claim"),
            ClaimOutcome::Done
        ),
        "conformance {check}: a finished task's redelivery is a duplicate"
    );
}

async fn only_the_current_token_heartbeats(store: Arc<dyn Store>) {
    let check = "only_the_current_token_heartbeats";
    let id = TaskId::random();
    let first = claimed(&*store, &id, "w1", check).await;
    assert_eq!(
        store
            .heartbeat(&[(id.clone(), first)], LEASE)
            .await
            .expect("heartbeat"),
        vec![ClaimLease::Kept]
    );
    assert!(
        store.release(&id, first).await.expect("release"),
        "conformance {check}: release"
    );
    let second = claimed(&*store, &id, "w2", check).await;
    assert!(
        second.0 > first.0,
        "conformance {check}: a new claim gets a larger token"
    );
    assert_eq!(
        store
            .heartbeat(&[(id.clone(), first)], LEASE)
            .await
            .expect("heartbeat"),
        vec![ClaimLease::Lost],
        "conformance {check}: the old holder's heartbeat must learn it lost the claim"
    );
    assert_eq!(
        store
            .complete(&id, first, Some(&ok(1)), None)
            .await
            .expect("complete"),
        CompleteOutcome::Stale
    );
    assert_eq!(
        store
            .complete(&id, second, Some(&ok(2)), None)
            .await
            .expect("complete"),
        CompleteOutcome::Stored
    );
}

async fn a_lease_that_runs_out_is_taken_over(store: Arc<dyn Store>) {
    let check = "a_lease_that_runs_out_is_taken_over";
    let id = TaskId::random();
    let short = Duration::from_millis(500);
    let ClaimOutcome::Run { token: first, .. } =
        store.claim(&id, "w1", short, None).await.expect("claim")
    else {
        panic!("conformance {check}: a fresh task must be runnable");
    };
    let deadline = Instant::now() + PATIENCE;
    let second = loop {
        match store.claim(&id, "w2", LEASE, None).await.expect("claim") {
            ClaimOutcome::Run {
                token,
                took_over,
                takeovers,
                ..
            } => {
                assert!(
                    took_over,
                    "conformance {check}: the claim says it took over"
                );
                assert!(
                    takeovers >= 1,
                    "conformance {check}: the takeover is counted"
                );
                break token;
            }
            ClaimOutcome::Defer { .. } => {
                assert!(
                    Instant::now() < deadline,
                    "conformance {check}: a lease of 500 ms never ran out"
                );
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            other => panic!("conformance {check}: {other:?}"),
        }
    };
    assert_eq!(
        store
            .complete(&id, first, Some(&ok(1)), None)
            .await
            .expect("complete"),
        CompleteOutcome::Stale,
        "conformance {check}: the holder whose lease ran out is fenced off"
    );
    assert_eq!(
        store
            .complete(&id, second, Some(&ok(2)), None)
            .await
            .expect("complete"),
        CompleteOutcome::Stored
    );
}

async fn failures_are_counted_across_claims(store: Arc<dyn Store>) {
    let check = "failures_are_counted_across_claims";
    let id = TaskId::random();
    let token = claimed(&*store, &id, "w1", check).await;
    assert_eq!(
        store
            .record_failure(&id, token)
            .await
            .expect("record_failure"),
        FailureRecord::Recorded { failures: 1 }
    );
    match store.claim(&id, "w2", LEASE, None).await.expect("claim") {
        ClaimOutcome::Run {
            failures,
            starts,
            token: next,
            ..
        } => {
            assert_eq!(
                failures, 1,
                "conformance {check}: failures carry to the next claim"
            );
            assert_eq!(starts, 1, "conformance {check}: one run was granted before");
            assert_eq!(
                store
                    .record_failure(&id, token)
                    .await
                    .expect("record_failure"),
                FailureRecord::Stale,
                "conformance {check}: an old token records nothing"
            );
            assert!(store.release(&id, next).await.expect("release"));
        }
        other => panic!("conformance {check}: a released task must be runnable, got {other:?}"),
    }
}

async fn a_revoked_task_never_starts(store: Arc<dyn Store>) {
    let check = "a_revoked_task_never_starts";
    let id = TaskId::random();
    let cancelled = TaskResult::failure(
        ErrorKind::Cancelled,
        "revoked by conformance",
        false,
        0,
        0.0,
        Default::default(),
    );
    assert!(store.revoke(&id, &cancelled).await.expect("revoke"));
    assert!(
        matches!(
            store.claim(&id, "w1", LEASE, None).await.expect("claim"),
            ClaimOutcome::Revoked
        ),
        "conformance {check}: a revoked task must not be claimed"
    );
    assert!(
        matches!(store.get(&id).await.expect("get"), ResultStatus::Ready(r) if r.is_err),
        "conformance {check}: its Cancelled result is stored"
    );
    // A running one loses its claim at its next heartbeat.
    let running = TaskId::random();
    let token = claimed(&*store, &running, "w1", check).await;
    assert!(store.revoke(&running, &cancelled).await.expect("revoke"));
    assert_eq!(
        store
            .heartbeat(&[(running.clone(), token)], LEASE)
            .await
            .expect("heartbeat"),
        vec![ClaimLease::Revoked]
    );
    // Result writes: the run that held the claim when the task was revoked is told so (it
    // frees what it holds, a concurrency slot); an older run's — its claim released and taken
    // again since — is stale, like any other, and must not free what the newer run holds.
    let retried = TaskId::random();
    let first = claimed(&*store, &retried, "w1", check).await;
    assert!(store.release(&retried, first).await.expect("release"));
    let second = claimed(&*store, &retried, "w2", check).await;
    assert!(store.revoke(&retried, &cancelled).await.expect("revoke"));
    assert_eq!(
        store
            .complete(&retried, first, Some(&ok(1)), None)
            .await
            .expect("complete"),
        CompleteOutcome::Stale,
        "conformance {check}: an older run's write to a revoked task is stale"
    );
    assert_eq!(
        store
            .complete(&retried, second, Some(&ok(2)), None)
            .await
            .expect("complete"),
        CompleteOutcome::Revoked,
        "conformance {check}: the revoked run's own write is told it was revoked"
    );
}

async fn a_wait_is_woken_by_the_write(store: Arc<dyn Store>) {
    let check = "a_wait_is_woken_by_the_write";
    let id = TaskId::random();
    let token = claimed(&*store, &id, "w1", check).await;
    let waiter = {
        let (store, id) = (Arc::clone(&store), id.clone());
        tokio::spawn(async move {
            let started = Instant::now();
            (store.wait(&id, PATIENCE).await, started.elapsed())
        })
    };
    // The waiter is listening before the write, or reads the result when it starts: either
    // way it must end with the result, well before its timeout.
    tokio::task::yield_now().await;
    let reply_to = store.reply_channel_for(&id);
    assert_eq!(
        store
            .complete(&id, token, Some(&ok(7)), reply_to.as_deref())
            .await
            .expect("complete"),
        CompleteOutcome::Stored
    );
    let (status, took) = waiter.await.expect("the waiter");
    match status.expect("wait") {
        ResultStatus::Ready(r) => assert_eq!(r.return_value, json!(7)),
        other => panic!(
            "conformance {check}: the wait ended without the result ({other:?}) after {took:?}"
        ),
    }
    assert!(
        took < PATIENCE,
        "conformance {check}: the wait was not woken by the write"
    );
}
