//! Fault paths beyond design §6's rows: runs that cancel themselves, errors returned after a
//! stop, crash loops (and runs the broker cuts off again and again), copies of failed tasks,
//! lanes sharing a queue, a store cut off from this worker only. Memory backends, paused time.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::{eventually, Gate, HangingBroker, Hangs, Harness};
use ferriq::broker::{Broker, DeadLetterReason, OutgoingMessage};
use ferriq::store::{ClaimOutcome, ClaimStore, ResultStore};
use ferriq::testing::{Oracle, StoreOp};
use ferriq::wire::{ErrorKind, TaskId, TaskResult};
use ferriq::worker::Outcome;
use ferriq::{State, TaskContext, TaskError, WaitError};

const LONG: Duration = Duration::from_secs(600);

#[ferriq::task(name = "faults.self_cancel")]
async fn self_cancel(oracle: State<Oracle>, ctx: TaskContext) -> String {
    oracle.started(ctx.task_id());
    // A task stopping its own helpers through its token must not look like a worker stop.
    ctx.cancellation_token().cancel();
    tokio::task::yield_now().await;
    "finished".to_owned()
}

#[ferriq::task(name = "faults.polite")]
async fn polite(
    oracle: State<Oracle>,
    gate: State<Arc<Gate>>,
    ctx: TaskContext,
) -> Result<(), TaskError> {
    oracle.started(ctx.task_id());
    tokio::select! {
        _ = gate.pass() => Ok(()),
        // A well-behaved task returns an error when cancelled.
        _ = ctx.cancelled() => Err(TaskError::fatal("cancelled by the worker")),
    }
}

#[ferriq::task(name = "faults.fatal")]
async fn fatal() -> Result<(), TaskError> {
    Err(TaskError::fatal("bad input"))
}

#[ferriq::task(name = "faults.echo")]
async fn echo(oracle: State<Oracle>, ctx: TaskContext, v: String) -> String {
    oracle.started(ctx.task_id());
    v
}

#[ferriq::task(name = "faults.held")]
async fn held(oracle: State<Oracle>, gate: State<Arc<Gate>>, ctx: TaskContext) -> u32 {
    oracle.started(ctx.task_id());
    gate.pass().await;
    ctx.attempt()
}

fn failure(err: WaitError) -> ferriq::wire::TaskFailure {
    match err {
        WaitError::Failed(f) => f,
        other => panic!("expected a task failure, got {other:?}"),
    }
}

/// The failure a task gets once `max_takeovers` of its runs ended without finishing.
fn assert_ended_as_a_crash_loop(err: WaitError) {
    let f = failure(err);
    assert_eq!(f.kind, Some(ErrorKind::RetriesExhausted));
    assert!(
        f.message.contains("ended without finishing"),
        "{}",
        f.message
    );
}

#[tokio::test(start_paused = true)]
async fn a_task_cancelling_its_own_token_still_finishes() {
    let h = Harness::new();
    let w = h.start(h.worker(&[self_cancel::NAME]));
    for _ in 0..20 {
        let handle = self_cancel::kiq(&h.client).await.unwrap();
        assert_eq!(handle.wait(LONG).await.unwrap(), "finished");
        assert_eq!(
            h.oracle.starts(handle.task_id()),
            1,
            "ran once, no release loop"
        );
    }
    assert_eq!(w.worker.stats().count(Outcome::ShutdownReleased), 0);
    w.stop().await;
}

#[tokio::test(start_paused = true)]
async fn an_error_returned_because_of_a_drain_is_a_drain_not_a_failure() {
    let h = Harness::new();
    let w = h.start(h.worker(&[polite::NAME]).grace(Duration::from_secs(1)));
    let handle = polite::kiq(&h.client).await.unwrap();
    h.gate.entered.notified().await;
    let worker = w.worker.clone();
    w.stop().await;
    assert_eq!(worker.stats().count(Outcome::ShutdownReleased), 1);
    assert_eq!(
        worker.stats().count(Outcome::Failed),
        0,
        "no error result for a drain"
    );
    assert!(handle.try_result().await.unwrap().is_none());
    assert!(h.broker.dead_letters().is_empty());
    // The next worker runs it as a first attempt: the drain burned no attempt.
    let (token, failures) = match h
        .memory()
        .claim(handle.task_id(), "next", LONG, None)
        .await
        .unwrap()
    {
        ClaimOutcome::Run {
            token, failures, ..
        } => (token, failures),
        other => panic!("{other:?}"),
    };
    assert_eq!(failures, 0);
    let _ = token;
}

/// A second stop signal while the worker waits for its hand-backs after the grace period cuts
/// that wait from 30 s to 5 s: a broker call that never answers keeps the process no longer.
#[tokio::test(start_paused = true)]
async fn a_forced_stop_during_the_settle_waits_five_seconds_more_not_thirty() {
    let h = Harness::new();
    let broker = HangingBroker {
        inner: h.broker.clone(),
        hangs: Hangs {
            release: true,
            ..Default::default()
        },
    };
    let w = h.start(
        h.worker(&[polite::NAME])
            .broker(Arc::new(broker))
            .grace(Duration::from_secs(1)),
    );
    polite::kiq(&h.client).await.unwrap();
    h.gate.entered.notified().await;
    let shutdown = w.shutdown.clone();
    shutdown.drain();
    // Virtual time: the grace ends at 1 s, the run is cancelled and its release hangs; the
    // settle would wait until 31 s.
    tokio::time::sleep(Duration::from_secs(10)).await;
    assert!(!w.is_finished(), "still waiting for the hanging release");
    let forced_at = tokio::time::Instant::now();
    shutdown.force();
    w.join().await;
    let waited = forced_at.elapsed();
    assert!(
        waited >= Duration::from_secs(5) && waited < Duration::from_secs(6),
        "stopped {waited:?} after the second signal"
    );
}

#[tokio::test(start_paused = true)]
async fn a_crash_loop_ends_after_max_takeovers_without_running_again() {
    let h = Harness::new();
    let id = TaskId::random();
    // Three workers took the task and died mid-run (their leases ran out unfinished): the
    // next claim is the third takeover.
    for worker in ["w1", "w2", "w3"] {
        assert!(matches!(
            h.memory()
                .claim(&id, worker, Duration::from_secs(30), None)
                .await
                .unwrap(),
            ClaimOutcome::Run { .. }
        ));
        h.memory().expire_lease(&id);
    }
    let mut config = ferriq::WorkerConfig::default();
    config.max_takeovers = 3;
    let w = h.start(h.worker(&[echo::NAME]).config(config));
    let handle = h
        .client
        .enqueue(echo::call("x".into()).with_task_id(id.clone()))
        .await
        .unwrap();
    assert_ended_as_a_crash_loop(handle.wait(LONG).await.unwrap_err());
    assert_eq!(h.oracle.starts(&id), 0, "not run a fourth time");
    eventually("parked", LONG, || h.broker.dead_letters().len() == 1).await;
    w.stop().await;
}

#[ferriq::task(name = "faults.cut_off")]
async fn cut_off(oracle: State<Oracle>, gate: State<Arc<Gate>>, ctx: TaskContext) -> String {
    oracle.started(ctx.task_id());
    gate.pass().await;
    "finished".to_owned()
}

#[tokio::test(start_paused = true)]
async fn runs_whose_delivery_keeps_being_taken_back_end_after_max_takeovers() {
    let h = Harness::new();
    let mut config = ferriq::WorkerConfig::default();
    config.max_takeovers = 3;
    let w = h.start(
        h.worker(&[cut_off::NAME])
            .config(config)
            .lease(Duration::from_secs(3)),
    );
    let handle = cut_off::kiq(&h.client).await.unwrap();
    for cut in 1..=3 {
        h.gate.entered.notified().await;
        // The broker takes the message back mid-run, every run (as RabbitMQ's
        // consumer_timeout does to a task longer than it): each run is cancelled and its
        // claim released, counted.
        assert_eq!(h.broker.expire_in_flight(), 1);
        eventually("run cut off", LONG, || {
            w.worker.stats().count(Outcome::DeliveryLost) == cut
        })
        .await;
    }
    assert_ended_as_a_crash_loop(handle.wait(LONG).await.unwrap_err());
    assert_eq!(
        h.oracle.starts(handle.task_id()),
        3,
        "not run a fourth time"
    );
    assert_eq!(h.memory().write_count(handle.task_id()), 1);
    w.stop().await;
}

#[tokio::test(start_paused = true)]
async fn a_copy_of_a_failed_task_is_parked_too() {
    let h = Harness::new();
    let w = h.start(h.worker(&[fatal::NAME]));
    let msg = fatal::call().into_message().unwrap();
    let out = OutgoingMessage::from_message(&msg).unwrap();
    h.broker.publish(vec![out.clone()]).await.unwrap();
    eventually("first copy parked", LONG, || {
        h.broker.dead_letters().len() == 1
    })
    .await;
    // A late duplicate (the first dead-letter might never have happened): parked, not acked away.
    h.broker.publish(vec![out]).await.unwrap();
    eventually("second copy parked", LONG, || {
        h.broker.dead_letters().len() == 2
    })
    .await;
    assert!(h
        .broker
        .dead_letters()
        .iter()
        .all(|d| d.why.reason == DeadLetterReason::NonRetryable));
    assert_eq!(h.memory().write_count(&msg.task_id), 1);
    w.stop().await;
}

#[tokio::test(start_paused = true)]
async fn a_task_another_lane_has_run_is_not_failed_as_unknown() {
    let h = Harness::new();
    let id = TaskId::random();
    // Another lane ran it and released it for a retry.
    match h
        .memory()
        .claim(&id, "lane-b", Duration::from_secs(30), None)
        .await
        .unwrap()
    {
        ClaimOutcome::Run { token, .. } => {
            h.memory().record_failure(&id, token).await.unwrap();
        }
        other => panic!("{other:?}"),
    }
    // This worker serves a different lane only.
    let w = h.start(h.worker(&[fatal::NAME]));
    let handle = h
        .client
        .enqueue(echo::call("x".into()).with_task_id(id.clone()))
        .await
        .unwrap();
    eventually("many receives", LONG, || {
        w.worker.stats().count(Outcome::Released) >= 8
    })
    .await;
    assert!(
        handle.try_result().await.unwrap().is_none(),
        "no UnknownTask for a task some lane serves"
    );
    assert!(h.broker.dead_letters().is_empty());
    // A bound remains: at four times the limit it is parked.
    let f = failure(handle.wait(LONG).await.unwrap_err());
    assert_eq!(f.kind, Some(ErrorKind::UnknownTask));
    w.stop().await;
}

#[tokio::test(start_paused = true)]
async fn a_worker_cut_off_from_the_store_stops_runs_before_their_claims_can_lapse() {
    let h = Harness::new();
    let w = h.start(h.worker(&[held::NAME]).lease(Duration::from_secs(3)));
    let handle = held::kiq(&h.client).await.unwrap();
    h.gate.entered.notified().await;
    // Only this worker loses the store: others could take the task once the lease runs out.
    h.store.set_failing(StoreOp::Heartbeat, true);
    let start = tokio::time::Instant::now();
    eventually("run stopped", LONG, || {
        w.worker.stats().count(Outcome::ClaimLost) == 1
    })
    .await;
    assert!(
        start.elapsed() < Duration::from_secs(3),
        "stopped within the lease: {:?}",
        start.elapsed()
    );
    assert_eq!(h.broker.stats().acked, 0);
    h.store.set_failing(StoreOp::Heartbeat, false);
    h.gate.open();
    assert!(handle.wait(LONG).await.unwrap() >= 1);
    w.stop().await;
}

#[tokio::test(start_paused = true)]
async fn revoking_a_finished_task_without_a_result_does_nothing() {
    let h = Harness::new();
    let id = TaskId::random();
    let ClaimOutcome::Run { token, .. } = h.memory().claim(&id, "w", LONG, None).await.unwrap()
    else {
        panic!()
    };
    h.memory().complete(&id, token, None, None).await.unwrap(); // store_result = false
    let cancelled = TaskResult::failure(
        ErrorKind::Cancelled,
        "revoked",
        false,
        0,
        0.0,
        Default::default(),
    );
    assert!(!h.memory().revoke(&id, &cancelled).await.unwrap());
    assert!(h
        .client
        .handle::<()>(id)
        .try_result()
        .await
        .unwrap()
        .is_none());
}

#[tokio::test(start_paused = true)]
async fn the_memory_brokers_redrive_limit_parks_a_message_it_keeps_getting_back() {
    use ferriq::memory::MemoryBroker;
    let broker = MemoryBroker::with_settings(Duration::from_secs(1), Some(3));
    broker
        .publish(vec![OutgoingMessage::raw(b"{}".to_vec())])
        .await
        .unwrap();
    let mut receives = 0;
    // A consumer that never settles: the visibility timeout gives it back every second.
    for _ in 0..10 {
        receives += broker
            .receive(1, Duration::from_secs(2))
            .await
            .unwrap()
            .len();
    }
    assert_eq!(receives, 3);
    let dead = broker.dead_letters();
    assert_eq!(dead.len(), 1);
    assert_eq!(dead[0].why.reason, DeadLetterReason::RedriveLimit);
    assert!(broker.is_empty());
}
