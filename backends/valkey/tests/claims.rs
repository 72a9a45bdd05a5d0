//! The claim state machine and fencing, against the real Redis.

mod common;

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use common::{expect_run as run, ok};
use ferriq::store::{
    ClaimLease, ClaimOutcome, ClaimStore, CompleteOutcome, FailureRecord, ProgressStore,
    ResultStatus, ResultStore, Token,
};
use ferriq::wire::{ErrorKind, TaskId, TaskResult};
use ferriq_valkey::ClaimState;
use serde_json::json;

const LEASE: Duration = Duration::from_secs(30);

fn unix_now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs_f64()
}

#[tokio::test]
async fn claim_runs_defers_takes_over_and_finishes() {
    let store = common::store().await;
    let id = TaskId::random();
    assert_eq!(store.claim_state(&id).await.unwrap(), ClaimState::Absent);
    // A lease of 1 s: long enough that the next two calls come before it ends on a loaded
    // machine, short enough to wait out.
    let (t1, failures) = run(store
        .claim(&id, "w1", Duration::from_secs(1), None)
        .await
        .unwrap());
    assert_eq!(failures, 0);
    assert!(
        matches!(store.claim_state(&id).await.unwrap(), ClaimState::Running { token, ref holder, .. } if token == t1.0 && holder == "w1")
    );

    // A second delivery waits until the holder's lease ends.
    match store.claim(&id, "w2", LEASE, None).await.unwrap() {
        ClaimOutcome::Defer { retry_after } => {
            assert!(
                retry_after > Duration::ZERO && retry_after <= Duration::from_secs(1),
                "{retry_after:?}"
            )
        }
        other => panic!("expected Defer, got {other:?}"),
    }
    // The lease is what is under test here: let it run out on the server's clock.
    tokio::time::sleep(Duration::from_millis(1050)).await;
    let (t2, _) = run(store.claim(&id, "w2", LEASE, None).await.unwrap());
    assert!(t2 > t1, "takeover token {t2} must exceed {t1}");

    assert_eq!(
        store
            .complete(&id, t2, Some(&ok(json!(5))), None)
            .await
            .unwrap(),
        CompleteOutcome::Stored
    );
    assert_eq!(
        store.claim(&id, "w3", LEASE, None).await.unwrap(),
        ClaimOutcome::Done
    );
    assert_eq!(store.claim_state(&id).await.unwrap(), ClaimState::Done);
}

#[tokio::test]
async fn a_claim_after_the_deadline_expires_and_is_completed_once() {
    let store = common::store().await;
    let id = TaskId::random();
    let token = match store
        .claim(&id, "w1", LEASE, Some(unix_now() - 10.0))
        .await
        .unwrap()
    {
        ClaimOutcome::Expired { token } => token,
        other => panic!("expected Expired, got {other:?}"),
    };
    let result = TaskResult::failure(
        ErrorKind::DeadlineExceeded,
        "late",
        false,
        0,
        0.0,
        Default::default(),
    );
    assert_eq!(
        store
            .complete(&id, token, Some(&result), None)
            .await
            .unwrap(),
        CompleteOutcome::Stored
    );
    assert_eq!(
        store.claim(&id, "w1", LEASE, None).await.unwrap(),
        ClaimOutcome::Done
    );
    // It never ran: its claim counts no start.
    assert_eq!(store.claim_info(&id).await.unwrap().unwrap().starts, 0);
    // Nor does an expired claim of a task that ran before (a redelivery past its deadline).
    let again = TaskId::random();
    let (t, _) = run(store.claim(&again, "w1", LEASE, None).await.unwrap());
    store.release(&again, t).await.unwrap();
    assert!(matches!(
        store
            .claim(&again, "w2", LEASE, Some(unix_now() - 10.0))
            .await
            .unwrap(),
        ClaimOutcome::Expired { .. }
    ));
    assert_eq!(store.claim_info(&again).await.unwrap().unwrap().starts, 1);
    // A future deadline runs normally.
    let other = TaskId::random();
    run(store
        .claim(&other, "w1", LEASE, Some(unix_now() + 60.0))
        .await
        .unwrap());
}

#[tokio::test]
async fn revoke_stores_cancelled_and_fences_the_holder() {
    let store = common::store().await;
    let cancelled = TaskResult::failure(
        ErrorKind::Cancelled,
        "revoked",
        false,
        0,
        0.0,
        Default::default(),
    );
    // Not started: never runs.
    let idle = TaskId::random();
    assert!(store.revoke(&idle, &cancelled).await.unwrap());
    assert_eq!(
        store.claim(&idle, "w1", LEASE, None).await.unwrap(),
        ClaimOutcome::Revoked
    );
    assert!(
        !store.revoke(&idle, &cancelled).await.unwrap(),
        "revoked once"
    );
    // Running: its heartbeat and result write are rejected.
    let busy = TaskId::random();
    let (t, _) = run(store.claim(&busy, "w1", LEASE, None).await.unwrap());
    assert!(store.revoke(&busy, &cancelled).await.unwrap());
    assert_eq!(
        store.heartbeat(&[(busy.clone(), t)], LEASE).await.unwrap(),
        [ClaimLease::Revoked]
    );
    assert_eq!(
        store
            .complete(&busy, t, Some(&ok(json!(1))), None)
            .await
            .unwrap(),
        CompleteOutcome::Revoked
    );
    match store.get(&busy).await.unwrap() {
        ResultStatus::Ready(r) => assert_eq!(
            r.failure_details().unwrap().kind,
            Some(ErrorKind::Cancelled)
        ),
        other => panic!("{other:?}"),
    }
    // Finished: nothing to revoke, the success stays.
    let done = TaskId::random();
    let (t, _) = run(store.claim(&done, "w1", LEASE, None).await.unwrap());
    store
        .complete(&done, t, Some(&ok(json!("kept"))), None)
        .await
        .unwrap();
    assert!(!store.revoke(&done, &cancelled).await.unwrap());
}

#[tokio::test]
async fn failures_are_counted_and_release_hands_the_claim_back() {
    let store = common::store().await;
    let id = TaskId::random();
    let (t1, _) = run(store.claim(&id, "w1", LEASE, None).await.unwrap());
    assert_eq!(
        store.record_failure(&id, t1).await.unwrap(),
        FailureRecord::Recorded { failures: 1 }
    );
    assert_eq!(
        store.claim_state(&id).await.unwrap(),
        ClaimState::Released { failures: 1 }
    );
    let (t2, failures) = run(store.claim(&id, "w1", LEASE, None).await.unwrap());
    assert_eq!(failures, 1);
    assert_eq!(
        store.record_failure(&id, t1).await.unwrap(),
        FailureRecord::Stale
    );
    // Released: the next delivery runs at once, no lease to wait for.
    assert!(store.release(&id, t2).await.unwrap());
    assert!(
        !store.release(&id, t2).await.unwrap(),
        "only the current holder releases"
    );
    let (t3, failures) = run(store.claim(&id, "w2", LEASE, None).await.unwrap());
    assert!(t3 > t2);
    assert_eq!(failures, 1);
}

#[tokio::test]
async fn heartbeat_extends_current_claims_and_reports_lost_ones_in_one_call() {
    let store = common::store().await;
    let (a, b, c) = (TaskId::random(), TaskId::random(), TaskId::random());
    // a's lease (2 s) outlasts the calls below on a loaded machine; b's (100 ms) is waited out.
    let (ta, _) = run(store
        .claim(&a, "w1", Duration::from_secs(2), None)
        .await
        .unwrap());
    let (tb, _) = run(store
        .claim(&b, "w1", Duration::from_millis(100), None)
        .await
        .unwrap());
    tokio::time::sleep(Duration::from_millis(150)).await;
    // b's lease ran out and another worker took it over.
    run(store.claim(&b, "w2", LEASE, None).await.unwrap());
    let kept = store
        .heartbeat(
            &[(a.clone(), ta), (b.clone(), tb), (c.clone(), Token(1))],
            Duration::from_secs(5),
        )
        .await
        .unwrap();
    assert_eq!(kept, [ClaimLease::Kept, ClaimLease::Lost, ClaimLease::Lost]);
    // a's lease now runs 5 s from the heartbeat, well past its original 2 s.
    tokio::time::sleep(Duration::from_millis(2100)).await;
    assert!(matches!(
        store.claim(&a, "w2", LEASE, None).await.unwrap(),
        ClaimOutcome::Defer { .. }
    ));
}

#[tokio::test]
async fn takeovers_are_counted_apart_from_failures() {
    let store = common::store().await;
    let id = TaskId::random();
    let short = Duration::from_millis(50);
    for _ in 0..3 {
        run(store.claim(&id, "dies", short, None).await.unwrap());
        tokio::time::sleep(Duration::from_millis(70)).await; // the holder "dies": its lease runs out
    }
    match store.claim(&id, "next", LEASE, None).await.unwrap() {
        ClaimOutcome::Run {
            failures,
            starts,
            takeovers,
            ..
        } => {
            assert_eq!((failures, starts, takeovers), (0, 3, 3));
        }
        other => panic!("{other:?}"),
    }
}

#[tokio::test]
async fn an_interrupted_run_counts_with_the_takeovers_and_a_plain_release_does_not() {
    let store = common::store().await;
    let id = TaskId::random();
    let (token, _) = run(store.claim(&id, "w1", LEASE, None).await.unwrap());
    assert!(store.release(&id, token).await.unwrap());
    let (token, _) = run(store.claim(&id, "w2", LEASE, None).await.unwrap());
    assert!(store.release_interrupted(&id, token).await.unwrap());
    assert!(
        !store.release_interrupted(&id, token).await.unwrap(),
        "a stale token changes nothing"
    );
    match store.claim(&id, "w3", LEASE, None).await.unwrap() {
        ClaimOutcome::Run {
            failures,
            starts,
            takeovers,
            took_over,
            ..
        } => {
            assert_eq!((failures, starts, takeovers, took_over), (0, 2, 1, false));
        }
        other => panic!("{other:?}"),
    }
}

#[tokio::test]
async fn a_finished_claim_lives_as_long_as_its_result_and_keeps_its_token() {
    // A running claim's TTL covers claim_ttl + lease (renewed by heartbeats); complete
    // rewrites the record as done with claim_ttl from then, never shorter than the result's.
    let store = common::store().await;
    let id = TaskId::random();
    let claim_key = format!("{p}:claim:{{{p}:{id}}}", p = store.prefix());
    let raw = common::raw_client(&common::url()).await;
    let pttl = |key: String| {
        let raw = raw.clone();
        async move {
            let ms: i64 = fred::prelude::KeysInterface::pttl(&raw, key).await.unwrap();
            Duration::from_millis(ms.max(0) as u64)
        }
    };
    let claim_ttl = Duration::from_secs(600); // common::store's setting
    let (token, _) = run(store.claim(&id, "w", LEASE, None).await.unwrap());
    let running = pttl(claim_key.clone()).await;
    assert!(
        running > claim_ttl + LEASE - Duration::from_secs(5),
        "running claim TTL {running:?}"
    );
    assert_eq!(
        store
            .heartbeat(&[(id.clone(), token)], LEASE)
            .await
            .unwrap(),
        [ClaimLease::Kept]
    );
    assert_eq!(
        store
            .complete(&id, token, Some(&ok(json!(1))), None)
            .await
            .unwrap(),
        CompleteOutcome::Stored
    );
    let done = pttl(claim_key).await;
    let result = pttl(store.result_key(&id)).await;
    assert!(
        done >= claim_ttl - Duration::from_secs(5),
        "done claim TTL {done:?}"
    );
    assert!(
        result > Duration::ZERO && result <= Duration::from_secs(600),
        "result TTL {result:?}"
    );
    // Written by the same script, so with equal TTLs (this store's) they expire together.
    assert!(done >= result, "the claim must live as long as the result");
    assert_eq!(store.claim_state(&id).await.unwrap(), ClaimState::Done);
    assert!(matches!(
        store.claim(&id, "late", LEASE, None).await.unwrap(),
        ClaimOutcome::Done
    ));
    // The done record keeps the holder's token: it still answers AlreadyStored.
    assert_eq!(
        store
            .complete(&id, token, Some(&ok(json!(2))), None)
            .await
            .unwrap(),
        CompleteOutcome::AlreadyStored
    );

    // A holder completing after its lease ran out (heartbeats failing, nobody took over): the
    // TTL left from its last renewal is short of claim_ttl, and complete sets it anew.
    let late = TaskId::random();
    let late_key = format!("{p}:claim:{{{p}:{late}}}", p = store.prefix());
    let lease = Duration::from_millis(200);
    let (token, _) = run(store.claim(&late, "w", lease, None).await.unwrap());
    let _: bool = fred::prelude::KeysInterface::pexpire(&raw, late_key.clone(), 5_000, None)
        .await
        .unwrap();
    tokio::time::sleep(lease).await; // the lease runs out on the server's clock
    assert_eq!(
        store.complete(&late, token, None, None).await.unwrap(),
        CompleteOutcome::Stored
    );
    let restored = pttl(late_key).await;
    assert!(
        restored >= claim_ttl - Duration::from_secs(5),
        "late done claim TTL {restored:?}"
    );
    fred::prelude::ClientLike::quit(&raw).await.unwrap();
}
