//! One test per row of design §6, on the memory backends: a delivery's body, its claim, its
//! deadline, a revoke and its retries (the runs' rows are in `worker_rows_runs`). Time is
//! paused: tokio's clock jumps whenever every task is waiting, so backoffs and leases are
//! asserted in virtual seconds.

mod common;
mod rows;

use std::sync::Arc;
use std::time::Duration;

use common::{eventually, Harness};
use ferriq::broker::{Broker, DeadLetterReason, OutgoingMessage};
use ferriq::store::{ClaimOutcome, ClaimStore};
use ferriq::testing::Oracle;
use ferriq::wire::{ErrorKind, TaskId};
use ferriq::worker::Outcome;
use ferriq::{State, TaskContext, TaskError};
use rows::{args, echo, failure, held, DeadLetterLog, Starts};
use tokio::time::Instant;

const LONG: Duration = Duration::from_secs(600);

#[ferriq::task(
    name = "rows.flaky",
    max_attempts = 3,
    backoff_initial = 10,
    backoff_max = 15
)]
async fn flaky(
    starts: State<Arc<Starts>>,
    ctx: TaskContext,
    succeed_on: u32,
) -> Result<u32, TaskError> {
    starts.0.lock().unwrap().push(Instant::now());
    if ctx.attempt() < succeed_on {
        return Err(TaskError::retryable(format!(
            "attempt {} failed",
            ctx.attempt()
        )));
    }
    Ok(ctx.attempt())
}

#[ferriq::task(name = "rows.fatal")]
async fn fatal(oracle: State<Oracle>, ctx: TaskContext) -> Result<(), TaskError> {
    oracle.started(ctx.task_id());
    Err(TaskError::fatal("the invoice is malformed"))
}

#[tokio::test(start_paused = true)]
async fn success_is_stored_once_and_acked() {
    let h = Harness::new();
    let w = h.start(h.worker(&[echo::NAME]));
    let handle = echo::kiq(&h.client, "hi".into()).await.unwrap();
    assert_eq!(handle.wait(LONG).await.unwrap(), "hi");
    assert_eq!(h.memory().write_count(handle.task_id()), 1);
    eventually("ack", LONG, || h.broker.stats().acked == 1).await;
    assert!(h.broker.is_empty());
    assert_eq!(w.worker.stats().count(Outcome::Succeeded), 1);
    w.stop().await;
}

#[tokio::test(start_paused = true)]
async fn malformed_body_is_dead_lettered_with_a_copy_and_an_error_result() {
    let h = Harness::new();
    let w = h.start(h.worker(&[echo::NAME]));
    let not_json = b"\x00\xffnot json".to_vec();
    let id = TaskId::random();
    let no_name = format!(r#"{{"task_id":"{id}","args":[1]}}"#).into_bytes();
    h.broker
        .publish(vec![
            OutgoingMessage::raw(not_json.clone()),
            OutgoingMessage::raw(no_name.clone()),
        ])
        .await
        .unwrap();
    eventually("both dead-lettered", LONG, || {
        h.broker.dead_letters().len() == 2
    })
    .await;
    let dead = h.broker.dead_letters();
    let bodies: Vec<_> = dead.iter().map(|d| d.body.clone()).collect();
    assert!(
        bodies.contains(&not_json) && bodies.contains(&no_name),
        "copies kept byte for byte"
    );
    assert!(dead
        .iter()
        .all(|d| d.why.reason == DeadLetterReason::InvalidMessage));
    assert!(h.broker.is_empty(), "both acked from the main queue");
    // The caller of the message whose id could be read gets an error instead of hanging.
    let f = failure(
        h.client
            .handle::<i64>(id.clone())
            .wait(LONG)
            .await
            .unwrap_err(),
    );
    assert_eq!(f.kind, Some(ErrorKind::InvalidMessage));
    assert!(
        f.message.contains("task_name"),
        "says what is wrong: {}",
        f.message
    );
    w.stop().await;
}

#[tokio::test(start_paused = true)]
async fn too_large_body_is_dead_lettered_unparsed() {
    let h = Harness::new();
    let mut config = ferriq::WorkerConfig::default();
    config.max_payload = 1024;
    let w = h.start(h.worker(&[echo::NAME]).config(config));
    common::capture_logs();
    let handle = echo::kiq(&h.client, "x".repeat(2000)).await.unwrap();
    let f = failure(handle.wait(LONG).await.unwrap_err());
    assert_eq!(f.kind, Some(ErrorKind::InvalidMessage));
    assert!(
        f.message.contains("FERRIQ_MAX_PAYLOAD_BYTES"),
        "{}",
        f.message
    );
    eventually("dead-lettered", LONG, || h.broker.dead_letters().len() == 1).await;
    assert_eq!(
        h.broker.dead_letters()[0].why.reason,
        DeadLetterReason::TooLarge
    );
    assert_eq!(h.oracle.distinct_started(), 0);
    let id = handle.task_id().to_string();
    assert!(
        common::logs()
            .lines()
            .any(|l| l.contains("WARN") && l.contains("too_large") && l.contains(&id)),
        "no warning when parking:\n{}",
        common::logs()
    );
    w.stop().await;
}

#[tokio::test(start_paused = true)]
async fn a_client_refuses_a_body_over_the_limit_before_sending_it() {
    let h = Harness::new();
    let client = h.client.clone().with_max_payload(1024);
    let err = echo::kiq(&client, "x".repeat(2000)).await.unwrap_err();
    match &err {
        ferriq::EnqueueError::TooLarge { size, limit, .. } => {
            assert!(*size > 2000, "{size}");
            assert_eq!(*limit, 1024);
        }
        other => panic!("expected TooLarge, got {other:?}"),
    }
    assert!(
        err.to_string().contains("FERRIQ_MAX_PAYLOAD_BYTES"),
        "{err}"
    );
    assert_eq!(h.broker.len("taskiq"), 0, "nothing sent");
    // The default is the workers' default.
    assert!(echo::kiq(&h.client, "x".repeat(2000)).await.is_ok());
}

#[tokio::test(start_paused = true)]
async fn newer_wire_version_is_released_then_dead_lettered() {
    let h = Harness::new();
    let w = h.start(h.worker(&[echo::NAME]));
    let start = Instant::now();
    let handle = h
        .client
        .enqueue(echo::call("v2".into()).with_label("ferriq_wire", 2))
        .await
        .unwrap();
    eventually("dead-lettered", LONG, || h.broker.dead_letters().len() == 1).await;
    let dead = &h.broker.dead_letters()[0];
    assert_eq!(dead.why.reason, DeadLetterReason::UnsupportedWireVersion);
    // Released 30 s at a time for the default 5 receives: never run, never answered.
    assert!(
        start.elapsed() >= Duration::from_secs(4 * 30),
        "released 30 s each time"
    );
    assert_eq!(w.worker.stats().count(Outcome::Released), 4);
    assert_eq!(h.oracle.distinct_started(), 0);
    assert!(
        handle.try_result().await.unwrap().is_none(),
        "an older worker writes no result"
    );
    w.stop().await;
}

#[tokio::test(start_paused = true)]
async fn unknown_task_is_released_for_other_lanes_then_dead_lettered_with_an_error() {
    let h = Harness::new();
    // This worker serves only `rows.args`: `rows.echo` belongs to another lane.
    let w = h.start(h.worker(&[args::NAME]));
    let handle = echo::kiq(&h.client, "lost".into()).await.unwrap();
    let f = failure(handle.wait(LONG).await.unwrap_err());
    assert_eq!(f.kind, Some(ErrorKind::UnknownTask));
    eventually("dead-lettered", LONG, || h.broker.dead_letters().len() == 1).await;
    assert_eq!(
        h.broker.dead_letters()[0].why.reason,
        DeadLetterReason::UnknownTask
    );
    assert_eq!(w.worker.stats().count(Outcome::Released), 4);
    w.stop().await;
}

#[tokio::test(start_paused = true)]
async fn done_claim_acks_the_duplicate_without_running_it() {
    let h = Harness::new();
    let w = h.start(h.worker(&[echo::NAME]));
    let call = || echo::call("once".into()).with_task_id(TaskId::parse("dup-1").unwrap());
    let first = h.client.enqueue(call()).await.unwrap();
    assert_eq!(first.wait(LONG).await.unwrap(), "once");
    h.client.enqueue(call()).await.unwrap();
    eventually("duplicate acked", LONG, || {
        w.worker.stats().count(Outcome::Duplicate) == 1
    })
    .await;
    assert_eq!(h.oracle.starts(first.task_id()), 1);
    assert_eq!(h.memory().write_count(first.task_id()), 1);
    assert!(h.broker.is_empty());
    w.stop().await;
}

#[tokio::test(start_paused = true)]
async fn defer_claim_releases_until_the_holders_lease_ends() {
    let h = Harness::new();
    let id = TaskId::parse("held-elsewhere").unwrap();
    let holder = h
        .memory()
        .claim(&id, "other-worker", Duration::from_secs(60), None)
        .await
        .unwrap();
    assert!(matches!(holder, ClaimOutcome::Run { .. }));
    let start = Instant::now();
    let w = h.start(h.worker(&[echo::NAME]));
    let handle = h
        .client
        .enqueue(echo::call("x".into()).with_task_id(id.clone()))
        .await
        .unwrap();
    eventually("deferred", LONG, || {
        w.worker.stats().count(Outcome::Deferred) == 1
    })
    .await;
    tokio::time::sleep(Duration::from_secs(30)).await;
    assert_eq!(
        h.oracle.starts(&id),
        0,
        "no second run while the holder's lease is live"
    );
    assert_eq!(
        w.worker.stats().count(Outcome::Deferred),
        1,
        "released until the lease ends, not polled"
    );
    assert_eq!(handle.wait(LONG).await.unwrap(), "x");
    assert!(
        start.elapsed() >= Duration::from_secs(60),
        "ran after the holder's lease expired"
    );
    w.stop().await;
}

#[tokio::test(start_paused = true)]
async fn a_task_without_a_deadline_waits_for_a_worker_as_long_as_it_takes() {
    let h = Harness::new();
    let handle = h
        .client
        .enqueue(echo::call("patient".into()))
        .await
        .unwrap();
    // Two days with no worker: an outage's backlog.
    tokio::time::sleep(Duration::from_secs(2 * 86_400)).await;
    let w = h.start(h.worker(&[echo::NAME]));
    assert_eq!(handle.wait(LONG).await.unwrap(), "patient");
    assert!(h.broker.dead_letters().is_empty());
    w.stop().await;
}

#[tokio::test(start_paused = true)]
async fn an_expired_task_is_parked_loudly_never_run_and_redrivable() {
    common::capture_logs();
    let h = Harness::new();
    let handle = h
        .client
        .enqueue(echo::call("late".into()).with_deadline(Some(Duration::from_secs(2))))
        .await
        .unwrap();
    // No worker while its deadline passes.
    tokio::time::sleep(Duration::from_secs(5)).await;
    let heard = DeadLetterLog::default();
    let w = h.start(h.worker(&[echo::NAME]).middleware(Arc::new(heard.clone())));
    let f = failure(handle.wait(LONG).await.unwrap_err());
    assert_eq!(f.kind, Some(ErrorKind::DeadlineExceeded));
    assert!(f.message.contains("not run"), "{}", f.message);
    eventually("parked", LONG, || h.broker.dead_letters().len() == 1).await;
    let dead = &h.broker.dead_letters()[0];
    assert_eq!(dead.why.reason, DeadLetterReason::Expired);
    assert_eq!(h.oracle.distinct_started(), 0);
    let id = handle.task_id().to_string();
    eventually("on_dead_letter heard it", LONG, || {
        heard.0.lock().unwrap().contains(&format!("expired {id}"))
    })
    .await;
    assert!(
        common::logs()
            .lines()
            .any(|l| l.contains("WARN") && l.contains("deadline passed") && l.contains(&id)),
        "no warning naming the task:\n{}",
        common::logs()
    );
    // Its status says it never ran: expired, and no start counted.
    match handle.status().await.unwrap() {
        ferriq::TaskStatus::Expired(f) => assert_eq!(f.kind, Some(ErrorKind::DeadlineExceeded)),
        other => panic!("expected Expired, got {other:?}"),
    }
    let info = h.client.ops().task(handle.task_id()).await.unwrap();
    assert_eq!(info.claim.unwrap().starts, 0);

    // Redriven, it runs (without its deadline: the redrive is the decision to run it).
    let report = h
        .client
        .ops()
        .redrive(
            "taskiq",
            &ferriq::dead_letters::DeadFilter::all().reason("expired"),
            |_| {},
        )
        .await
        .unwrap();
    assert_eq!(report.redriven, 1);
    assert_eq!(handle.wait(LONG).await.unwrap(), "late");
    assert_eq!(h.oracle.distinct_started(), 1);
    w.stop().await;
}

#[tokio::test(start_paused = true)]
async fn revoked_task_never_starts() {
    let h = Harness::new();
    let id = TaskId::random();
    assert!(h.client.revoke(&id).await.unwrap());
    let w = h.start(h.worker(&[echo::NAME]));
    let handle = h
        .client
        .enqueue(echo::call("no".into()).with_task_id(id.clone()))
        .await
        .unwrap();
    eventually("acked as revoked", LONG, || {
        w.worker.stats().count(Outcome::Revoked) == 1
    })
    .await;
    assert_eq!(h.oracle.starts(&id), 0);
    assert_eq!(
        failure(handle.wait(LONG).await.unwrap_err()).kind,
        Some(ErrorKind::Cancelled)
    );
    assert!(!h.client.revoke(&id).await.unwrap(), "already finished");
    assert_eq!(h.memory().write_count(&id), 1);
    w.stop().await;
}

#[tokio::test(start_paused = true)]
async fn revoking_a_running_task_cancels_it_at_the_next_heartbeat() {
    let h = Harness::new();
    let w = h.start(h.worker(&[held::NAME]).lease(Duration::from_secs(3)));
    let handle = held::kiq(&h.client).await.unwrap();
    h.gate.entered.notified().await;
    assert!(h.client.revoke(handle.task_id()).await.unwrap());
    eventually("revoked copy acked", LONG, || {
        w.worker.stats().count(Outcome::Revoked) == 1
    })
    .await;
    let stats = w.worker.stats();
    // A revoke is its own outcome: not a claim lost to another worker, not a stale write.
    assert_eq!(stats.count(Outcome::ClaimLost), 0);
    assert_eq!(stats.count(Outcome::Stale), 0);
    assert!(h.broker.is_empty(), "the message was acked at once");
    assert_eq!(
        h.oracle.finishes(handle.task_id()),
        0,
        "the run never finished"
    );
    assert_eq!(
        failure(handle.wait(LONG).await.unwrap_err()).kind,
        Some(ErrorKind::Cancelled)
    );
    assert_eq!(h.memory().write_count(handle.task_id()), 1);
    assert!(h.broker.is_empty());
    w.stop().await;
}

#[tokio::test(start_paused = true)]
async fn retryable_errors_are_retried_after_exponential_backoff() {
    let h = Harness::new();
    let starts = Arc::new(Starts::default());
    let w = h.start(h.worker(&[flaky::NAME]).state(Arc::clone(&starts)));
    let handle = flaky::kiq(&h.client, 3).await.unwrap();
    assert_eq!(handle.wait(LONG).await.unwrap(), 3);
    let starts = starts.0.lock().unwrap().clone();
    assert_eq!(starts.len(), 3);
    let gaps: Vec<_> = starts.windows(2).map(|p| p[1] - p[0]).collect();
    // backoff_initial 10 s doubling, capped at 15 s, with jitter in [50 %, 100 %].
    assert!(
        gaps[0] >= Duration::from_secs(5) && gaps[0] <= Duration::from_secs(11),
        "{gaps:?}"
    );
    assert!(
        gaps[1] >= Duration::from_millis(7500) && gaps[1] <= Duration::from_secs(16),
        "{gaps:?}"
    );
    assert_eq!(w.worker.stats().count(Outcome::Retried), 2);
    assert_eq!(h.memory().write_count(handle.task_id()), 1);
    w.stop().await;
}

#[tokio::test(start_paused = true)]
async fn exhausted_retries_dead_letter_with_an_error_result() {
    let h = Harness::new();
    let w = h.start(h.worker(&[flaky::NAME]).state(Arc::new(Starts::default())));
    let handle = flaky::kiq(&h.client, 99).await.unwrap();
    let f = failure(handle.wait(LONG).await.unwrap_err());
    assert_eq!(f.kind, Some(ErrorKind::RetriesExhausted));
    assert_eq!(f.attempts, 3);
    assert!(f.retryable);
    assert!(f.message.contains("attempt 3 failed"), "{}", f.message);
    eventually("dead-lettered", LONG, || h.broker.dead_letters().len() == 1).await;
    let dead = &h.broker.dead_letters()[0];
    assert_eq!(dead.why.reason, DeadLetterReason::RetriesExhausted);
    assert_eq!(dead.why.attempts, 3);
    assert_eq!(dead.why.task_name.as_deref(), Some(flaky::NAME));
    assert!(h.broker.is_empty());
    assert_eq!(h.memory().write_count(handle.task_id()), 1);
    w.stop().await;
}

#[tokio::test(start_paused = true)]
async fn max_retries_label_overrides_the_task_option() {
    let h = Harness::new();
    let w = h.start(h.worker(&[flaky::NAME]).state(Arc::new(Starts::default())));
    let handle = h
        .client
        .enqueue(flaky::call(99).with_max_attempts(1))
        .await
        .unwrap();
    let f = failure(handle.wait(LONG).await.unwrap_err());
    assert_eq!(f.attempts, 1);
    assert_eq!(w.worker.stats().count(Outcome::Retried), 0);
    w.stop().await;
}

#[tokio::test(start_paused = true)]
async fn non_retryable_errors_dead_letter_at_once() {
    let h = Harness::new();
    let w = h.start(h.worker(&[fatal::NAME]));
    let handle = fatal::kiq(&h.client).await.unwrap();
    let f = failure(handle.wait(LONG).await.unwrap_err());
    assert_eq!(f.kind, Some(ErrorKind::TaskError));
    assert!(!f.retryable);
    assert_eq!(f.attempts, 1);
    assert_eq!(h.oracle.starts(handle.task_id()), 1);
    eventually("dead-lettered", LONG, || h.broker.dead_letters().len() == 1).await;
    assert_eq!(
        h.broker.dead_letters()[0].why.reason,
        DeadLetterReason::NonRetryable
    );
    w.stop().await;
}

#[tokio::test(start_paused = true)]
async fn an_expired_schedule_tick_is_answered_and_acked_not_parked() {
    let h = Harness::new();
    let w = h.start(h.worker(&[echo::NAME]));
    let past = (h.clock.now_unix() - 60.0) as i64;
    let handle = h
        .client
        .enqueue(
            echo::call("tick".into())
                .with_label("ferriq_schedule", "nightly")
                .with_label("deadline_at", past),
        )
        .await
        .unwrap();
    let f = failure(handle.wait(LONG).await.unwrap_err());
    assert_eq!(f.kind, Some(ErrorKind::DeadlineExceeded));
    eventually("acked", LONG, || h.broker.stats().acked == 1).await;
    assert!(h.broker.dead_letters().is_empty());
    assert_eq!(h.oracle.distinct_started(), 0);
    w.stop().await;
}
