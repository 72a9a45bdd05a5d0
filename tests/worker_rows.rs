//! One test per row of design §6, on the memory backends. Time is paused: tokio's clock jumps
//! whenever every task is waiting, so backoffs and leases are asserted in virtual seconds.

mod common;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::{eventually, Gate, Harness};
use ferriq::broker::{Broker, DeadLetterReason, OutgoingMessage};
use ferriq::store::{ClaimOutcome, ClaimStore};
use ferriq::testing::{Oracle, StoreOp};
use ferriq::wire::{ErrorKind, TaskId};
use ferriq::worker::Outcome;
use ferriq::{State, TaskContext, TaskError, WaitError};
use tokio::time::Instant;

const LONG: Duration = Duration::from_secs(600);

#[ferriq::task(name = "rows.echo")]
async fn echo(oracle: State<Oracle>, ctx: TaskContext, value: String) -> String {
    oracle.started(ctx.task_id());
    value
}

/// Start instants of `rows.flaky`, to assert the backoff.
#[derive(Default)]
struct Starts(Mutex<Vec<Instant>>);

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

#[ferriq::task(name = "rows.held")]
async fn held(oracle: State<Oracle>, gate: State<Arc<Gate>>, ctx: TaskContext) -> String {
    oracle.started(ctx.task_id());
    gate.pass().await;
    oracle.finished(ctx.task_id());
    format!("done on attempt {}", ctx.attempt())
}

#[ferriq::task(name = "rows.args")]
async fn args(a: i64, b: Option<String>) -> String {
    format!("{a}:{b:?}")
}

fn failure(err: WaitError) -> ferriq::wire::TaskFailure {
    match err {
        WaitError::Failed(f) => f,
        other => panic!("expected a task failure, got {other:?}"),
    }
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

/// Hears the dead letters the worker parks.
#[derive(Default, Clone)]
struct DeadLetterLog(Arc<Mutex<Vec<String>>>);

#[ferriq::async_trait]
impl ferriq::middleware::Middleware for DeadLetterLog {
    async fn on_dead_letter(&self, dead: &ferriq::middleware::DeadLettered<'_>) {
        self.0.lock().unwrap().push(format!(
            "{} {}",
            dead.reason.as_str(),
            dead.task_id.map(|id| id.to_string()).unwrap_or_default()
        ));
    }
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
