//! One test per row of design §6, on the memory backends: a run's panics, timeouts and
//! fatal errors, a delivery or claim lost under it, the store unreachable, drains and the
//! worker's concurrency (a delivery's own rows are in `worker_rows`). Time is paused: tokio's
//! clock jumps whenever every task is waiting, so backoffs and leases are asserted in
//! virtual seconds.

mod common;
mod rows;

use std::sync::Arc;
use std::time::Duration;

use common::{eventually, Harness};
use ferriq::broker::{Broker, OutgoingMessage};
use ferriq::store::{ClaimOutcome, ClaimStore};
use ferriq::testing::{Oracle, StoreOp};
use ferriq::wire::{ErrorKind, TaskId};
use ferriq::worker::Outcome;
use ferriq::{State, TaskContext, TaskError};
use rows::{args, echo, failure, held, DeadLetterLog, Starts};
use tokio::time::Instant;

const LONG: Duration = Duration::from_secs(600);

#[ferriq::task(name = "rows.panics", max_attempts = 3, backoff_initial = 1)]
async fn panics(ctx: TaskContext, succeed_on: u32) -> u32 {
    if ctx.attempt() < succeed_on {
        panic!("boom on attempt {}", ctx.attempt());
    }
    ctx.attempt()
}

#[ferriq::task(
    name = "rows.sleepy",
    timeout = 1,
    max_attempts = 2,
    backoff_initial = 1
)]
async fn sleepy(oracle: State<Oracle>, ctx: TaskContext, secs: u64) -> u64 {
    oracle.started(ctx.task_id());
    tokio::time::sleep(Duration::from_secs(secs)).await;
    secs
}

#[ferriq::task(name = "rows.validates", park_fatal = false)]
async fn validates(oracle: State<Oracle>, ctx: TaskContext) -> Result<(), TaskError> {
    oracle.started(ctx.task_id());
    Err(TaskError::fatal("the e-mail address is not valid"))
}

#[tokio::test(start_paused = true)]
async fn a_fatal_error_of_a_task_that_does_not_park_is_its_answer_and_the_message_is_acked() {
    let h = Harness::new();
    let heard = DeadLetterLog::default();
    let w = h.start(
        h.worker(&[validates::NAME])
            .middleware(Arc::new(heard.clone())),
    );
    let handle = validates::kiq(&h.client).await.unwrap();
    let f = failure(handle.wait(LONG).await.unwrap_err());
    assert_eq!(f.kind, Some(ErrorKind::TaskError));
    assert!(f.message.contains("not valid"));
    eventually("acked", LONG, || h.broker.stats().acked == 1).await;
    // A second copy of the message (a redelivery) is acked as a duplicate, not parked.
    let mut copy = ferriq::wire::TaskMessage::new(validates::NAME);
    copy.task_id = handle.task_id().clone();
    h.broker
        .publish(vec![OutgoingMessage::from_message(&copy).unwrap()])
        .await
        .unwrap();
    eventually("the copy acked", LONG, || h.broker.stats().acked == 2).await;
    assert!(h.broker.dead_letters().is_empty());
    assert!(heard.0.lock().unwrap().is_empty());
    assert_eq!(h.oracle.starts(handle.task_id()), 1);
    w.stop().await;
}

#[ferriq::task(name = "rows.rate_limited", max_attempts = 3, backoff_initial = 5)]
async fn rate_limited(starts: State<Arc<Starts>>, ctx: TaskContext) -> Result<u32, TaskError> {
    starts.0.lock().unwrap().push(Instant::now());
    if ctx.attempt() == 1 {
        // An upstream's 429 with Retry-After: 42.
        return Err(
            TaskError::retryable("429 Too Many Requests").retry_after(Duration::from_secs(42))
        );
    }
    Ok(ctx.attempt())
}

#[tokio::test(start_paused = true)]
async fn a_task_chooses_its_next_retry_delay_within_its_attempts() {
    let h = Harness::new();
    let starts = Arc::new(Starts::default());
    let w = h.start(h.worker(&[rate_limited::NAME]).state(Arc::clone(&starts)));
    let handle = rate_limited::kiq(&h.client).await.unwrap();
    assert_eq!(handle.wait(LONG).await.unwrap(), 2);
    let at = starts.0.lock().unwrap().clone();
    assert_eq!(at.len(), 2);
    let waited = at[1] - at[0];
    // Its own 42 s, not the task's 2.5-5 s backoff.
    assert!(
        waited >= Duration::from_secs(42) && waited < Duration::from_secs(44),
        "{waited:?}"
    );
    w.stop().await;
}

#[tokio::test(start_paused = true)]
async fn arguments_bind_like_a_python_call_and_bad_ones_are_not_retried() {
    let h = Harness::new();
    let w = h.start(h.worker(&[args::NAME]));
    let send = |body: &str| {
        let id = TaskId::random();
        let raw = format!(r#"{{"task_id":"{id}","task_name":"rows.args","labels":{{}},{body}}}"#);
        (id, OutgoingMessage::raw(raw))
    };
    let (by_position, m1) = send(r#""args":[1,"x"],"kwargs":{}"#);
    let (by_keyword, m2) = send(r#""args":[],"kwargs":{"b":"y","a":2}"#);
    let (optional_missing, m3) = send(r#""args":[3],"kwargs":{}"#);
    let (wrong_type, m4) = send(r#""args":["three"],"kwargs":{}"#);
    let (extra, m5) = send(r#""args":[1],"kwargs":{"c":1}"#);
    let (twice, m6) = send(r#""args":[1],"kwargs":{"a":1}"#);
    h.broker
        .publish(vec![m1, m2, m3, m4, m5, m6])
        .await
        .unwrap();
    let get = |id: TaskId| h.client.handle::<String>(id);
    assert_eq!(get(by_position).wait(LONG).await.unwrap(), "1:Some(\"x\")");
    assert_eq!(get(by_keyword).wait(LONG).await.unwrap(), "2:Some(\"y\")");
    assert_eq!(get(optional_missing).wait(LONG).await.unwrap(), "3:None");
    for (id, says) in [
        (wrong_type, "wrong type"),
        (extra, "unexpected keyword argument `c`"),
        (twice, "both by position and by keyword"),
    ] {
        let f = failure(get(id).wait(LONG).await.unwrap_err());
        assert_eq!(f.kind, Some(ErrorKind::InvalidArguments));
        assert_eq!(f.attempts, 1, "never retried");
        assert!(f.message.contains(says), "{} should say {says}", f.message);
    }
    w.stop().await;
}

#[tokio::test(start_paused = true)]
async fn a_panic_is_a_retryable_error_and_the_worker_keeps_running() {
    let h = Harness::new();
    let w = h.start(h.worker(&[panics::NAME, echo::NAME]));
    let handle = panics::kiq(&h.client, 2).await.unwrap();
    assert_eq!(handle.wait(LONG).await.unwrap(), 2);
    assert_eq!(w.worker.stats().count(Outcome::Retried), 1);
    // Still serving.
    assert_eq!(
        echo::kiq(&h.client, "alive".into())
            .await
            .unwrap()
            .wait(LONG)
            .await
            .unwrap(),
        "alive"
    );
    let exhausted = panics::kiq(&h.client, 99).await.unwrap();
    let f = failure(exhausted.wait(LONG).await.unwrap_err());
    assert!(
        f.message.contains("panicked: boom on attempt 3"),
        "{}",
        f.message
    );
    w.stop().await;
}

#[tokio::test(start_paused = true)]
async fn a_run_over_its_timeout_is_cancelled_and_retried() {
    let h = Harness::new();
    let w = h.start(h.worker(&[sleepy::NAME]));
    let start = Instant::now();
    let handle = sleepy::kiq(&h.client, 3600).await.unwrap();
    let f = failure(handle.wait(LONG).await.unwrap_err());
    assert_eq!(f.kind, Some(ErrorKind::Timeout));
    assert_eq!(f.attempts, 2);
    assert!(
        start.elapsed() < Duration::from_secs(60),
        "the 1 s timeout cut both runs short"
    );
    assert_eq!(h.oracle.starts(handle.task_id()), 2);
    // The timeout label overrides the option.
    let quick = h
        .client
        .enqueue(sleepy::call(5).with_timeout(Duration::from_secs(10)))
        .await
        .unwrap();
    assert_eq!(quick.wait(LONG).await.unwrap(), 5);
    w.stop().await;
}

#[tokio::test(start_paused = true)]
async fn a_lost_delivery_cancels_the_run_and_writes_nothing() {
    let h = Harness::new();
    let w = h.start(h.worker(&[held::NAME]).lease(Duration::from_secs(3)));
    let handle = held::kiq(&h.client).await.unwrap();
    h.gate.entered.notified().await;
    // The broker takes the message back (visibility ran out, as after a long pause).
    assert_eq!(h.broker.expire_in_flight(), 1);
    eventually("run cancelled", LONG, || {
        w.worker.stats().count(Outcome::DeliveryLost) == 1
    })
    .await;
    assert_eq!(
        h.memory().write_count(handle.task_id()),
        0,
        "the lost run wrote nothing"
    );
    // The redelivered copy runs (the claim was released for it) and answers once.
    eventually("second run", LONG, || {
        h.oracle.starts(handle.task_id()) == 2
    })
    .await;
    h.gate.open();
    assert_eq!(handle.wait(LONG).await.unwrap(), "done on attempt 1");
    assert_eq!(h.oracle.finishes(handle.task_id()), 1);
    assert_eq!(h.memory().write_count(handle.task_id()), 1);
    w.stop().await;
}

#[tokio::test(start_paused = true)]
async fn a_lost_claim_cancels_the_run_and_never_acks() {
    let h = Harness::new();
    let w = h.start(h.worker(&[held::NAME]).lease(Duration::from_secs(3)));
    let handle = held::kiq(&h.client).await.unwrap();
    h.gate.entered.notified().await;
    // Another worker takes the claim over (this one was partitioned past its lease).
    h.memory()
        .take_over(handle.task_id(), Duration::from_secs(20))
        .unwrap();
    eventually("run cancelled", LONG, || {
        w.worker.stats().count(Outcome::ClaimLost) == 1
    })
    .await;
    assert_eq!(h.broker.stats().acked, 0, "released, never acked");
    assert_eq!(h.memory().write_count(handle.task_id()), 0);
    h.gate.open();
    // The intruder never finishes; after its lease the message runs again here (a takeover,
    // not a failed attempt).
    assert_eq!(handle.wait(LONG).await.unwrap(), "done on attempt 1");
    assert_eq!(h.memory().write_count(handle.task_id()), 1);
    eventually("acked", LONG, || h.broker.stats().acked == 1).await;
    w.stop().await;
}

#[tokio::test(start_paused = true)]
async fn store_unreachable_at_claim_releases_the_message_unrun() {
    let h = Harness::new();
    h.store.set_failing(StoreOp::Claim, true);
    let w = h.start(h.worker(&[echo::NAME]));
    let handle = echo::kiq(&h.client, "later".into()).await.unwrap();
    eventually("released", LONG, || {
        w.worker.stats().count(Outcome::Released) >= 2
    })
    .await;
    assert_eq!(h.oracle.distinct_started(), 0, "never run unclaimed");
    assert_eq!(h.broker.stats().acked, 0);
    h.store.set_failing(StoreOp::Claim, false);
    assert_eq!(handle.wait(LONG).await.unwrap(), "later");
    w.stop().await;
}

#[tokio::test(start_paused = true)]
async fn store_unreachable_at_complete_keeps_the_result_for_the_redelivery() {
    let h = Harness::new();
    h.store.set_failing(StoreOp::Complete, true);
    let w = h.start(h.worker(&[echo::NAME]));
    let handle = echo::kiq(&h.client, "kept".into()).await.unwrap();
    eventually("released with result kept", LONG, || {
        w.worker.stats().count(Outcome::Released) >= 1
    })
    .await;
    assert_eq!(h.oracle.starts(handle.task_id()), 1);
    assert_eq!(
        h.broker.stats().acked,
        0,
        "not acked before the result is durable"
    );
    h.store.set_failing(StoreOp::Complete, false);
    assert_eq!(handle.wait(LONG).await.unwrap(), "kept");
    assert_eq!(
        h.oracle.starts(handle.task_id()),
        1,
        "stored on the redelivery without a rerun"
    );
    assert_eq!(h.memory().write_count(handle.task_id()), 1);
    eventually("acked", LONG, || h.broker.stats().acked == 1).await;
    w.stop().await;
}

#[tokio::test(start_paused = true)]
async fn a_lost_complete_reply_is_answered_by_already_stored() {
    let h = Harness::new();
    // The write lands but its reply is lost: the retry must not write twice.
    h.store.set_failing(StoreOp::CompleteAfterWrite, true);
    let w = h.start(h.worker(&[echo::NAME]));
    let handle = echo::kiq(&h.client, "once".into()).await.unwrap();
    eventually("released", LONG, || {
        w.worker.stats().count(Outcome::Released) >= 1
    })
    .await;
    h.store.set_failing(StoreOp::CompleteAfterWrite, false);
    assert_eq!(handle.wait(LONG).await.unwrap(), "once");
    eventually("acked", LONG, || h.broker.stats().acked == 1).await;
    assert_eq!(h.memory().write_count(handle.task_id()), 1);
    assert_eq!(h.oracle.starts(handle.task_id()), 1);
    w.stop().await;
}

#[tokio::test(start_paused = true)]
async fn drain_releases_leftovers_after_the_grace_period() {
    let h = Harness::new();
    let w = h.start(h.worker(&[held::NAME]).grace(Duration::from_secs(5)));
    let handle = held::kiq(&h.client).await.unwrap();
    h.gate.entered.notified().await;
    let start = Instant::now();
    let worker = w.worker.clone();
    w.stop().await;
    assert!(
        start.elapsed() >= Duration::from_secs(5),
        "waited the grace period"
    );
    assert_eq!(worker.stats().count(Outcome::ShutdownReleased), 1);
    let depth = h.broker.depth().await.unwrap();
    assert_eq!(
        (depth.ready, depth.in_flight),
        (1, 0),
        "visible again at once"
    );
    // The claim was given back: the next worker runs it without waiting for a lease.
    let again = h
        .memory()
        .claim(handle.task_id(), "next", Duration::from_secs(30), None)
        .await
        .unwrap();
    assert!(matches!(again, ClaimOutcome::Run { .. }), "{again:?}");
    assert_eq!(h.memory().write_count(handle.task_id()), 0);
}

#[tokio::test(start_paused = true)]
async fn drain_lets_runs_finish_within_the_grace_period() {
    let h = Harness::new();
    let w = h.start(h.worker(&[held::NAME]).grace(Duration::from_secs(30)));
    let handle = held::kiq(&h.client).await.unwrap();
    h.gate.entered.notified().await;
    w.shutdown.drain();
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(!w.is_finished(), "waits for the run");
    h.gate.open();
    w.join().await;
    assert_eq!(handle.wait(LONG).await.unwrap(), "done on attempt 1");
    assert_eq!(h.broker.stats().acked, 1);
}

#[tokio::test(start_paused = true)]
async fn a_stale_complete_is_never_acked() {
    let h = Harness::new();
    let w = h.start(h.worker(&[held::NAME]).lease(Duration::from_secs(30)));
    let handle = held::kiq(&h.client).await.unwrap();
    h.gate.entered.notified().await;
    // Taken over between heartbeats: only the fenced write can notice.
    h.memory()
        .take_over(handle.task_id(), Duration::from_secs(60))
        .unwrap();
    h.gate.open();
    eventually("stale", LONG, || {
        w.worker.stats().count(Outcome::Stale) == 1
    })
    .await;
    assert_eq!(h.broker.stats().acked, 0, "the new holder owns the message");
    assert_eq!(
        h.memory().write_count(handle.task_id()),
        0,
        "rejected by the store"
    );
    // After the intruder's lease the message runs again and answers once.
    assert_eq!(handle.wait(LONG).await.unwrap(), "done on attempt 1");
    assert_eq!(h.memory().write_count(handle.task_id()), 1);
    w.stop().await;
}

#[tokio::test(start_paused = true)]
async fn concurrency_is_bounded_and_prefetch_does_not_exceed_it() {
    let h = Harness::new();
    let w = h.start(h.worker(&[held::NAME]).concurrency(3));
    let handles = h
        .client
        .enqueue_batch((0..10).map(|_| held::call()))
        .await
        .unwrap();
    eventually("three running", LONG, || h.oracle.distinct_started() == 3).await;
    tokio::time::sleep(Duration::from_secs(10)).await;
    assert_eq!(h.oracle.distinct_started(), 3);
    let depth = h.broker.depth().await.unwrap();
    assert_eq!(
        (depth.in_flight, depth.ready),
        (3, 7),
        "no message taken beyond the free slots"
    );
    h.gate.open();
    for handle in handles {
        handle.wait(LONG).await.unwrap();
    }
    w.stop().await;
}

#[test]
fn an_empty_registry_is_a_build_error_naming_the_linked_tasks() {
    let h = Harness::new();
    let err = h
        .worker(&[echo::NAME])
        .registry(ferriq::Registry::default())
        .build()
        .unwrap_err();
    let text = err.to_string();
    assert!(
        text.contains("registry given to WorkerBuilder::registry is empty"),
        "{text}"
    );
    assert!(text.contains("rows."), "{text}");
}

#[ferriq::task(name = "rows.quick_retry", max_attempts = 2, backoff_initial = 0.2)]
async fn quick_retry(ctx: TaskContext) -> Result<u32, TaskError> {
    if ctx.attempt() == 1 {
        return Err(TaskError::retryable("first attempt fails"));
    }
    Ok(ctx.attempt())
}

#[tokio::test(start_paused = true)]
async fn the_retry_log_says_when_the_retry_really_comes() {
    common::capture_logs();
    let h = Harness::new();
    // Built with the default min_defer (1 s), above this task's 0.2 s backoff: a warning.
    let w = h.start(h.worker(&[quick_retry::NAME]));
    let started = Instant::now();
    let handle = quick_retry::kiq(&h.client).await.unwrap();
    assert_eq!(handle.wait(LONG).await.unwrap(), 2);
    assert!(
        started.elapsed() >= Duration::from_secs(1),
        "the floor holds"
    );
    let logs = common::logs();
    let retry = logs
        .lines()
        .find(|l| l.contains("rows.quick_retry") && l.contains("will retry"))
        .unwrap_or_else(|| panic!("no retry line:\n{logs}"));
    // Before the fix it said the jittered backoff (100-200 ms) though the retry came at 1 s.
    assert!(retry.contains("retry_in=1s"), "{retry}");
    assert!(
        logs.lines().any(|l| l.contains("WARN")
            && l.contains("rows.quick_retry")
            && l.contains("shorter than the worker's min_defer")),
        "no warning about the backoff option:\n{logs}"
    );
    w.stop().await;
}
