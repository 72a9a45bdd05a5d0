//! A concurrency slot is the task's, held by the run that holds its claim: a copy of the task
//! received while it runs (a broker's duplicate, a redelivery, the same id published twice)
//! is deferred and frees nothing, nor does one of a revoked task whose run still goes; a copy
//! of a finished task frees the slot it took; a failed attempt frees its slot before its
//! retry's backoff; a result kept through a store outage frees its run's slot when the
//! redelivery writes it (the slot its run held, whatever the limits are by then), and frees
//! nothing when a newer run took the task over and was revoked meanwhile (the older write is
//! stale). Memory backends, paused time.

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::{eventually, Harness};
use ferriq::broker::{Broker, OutgoingMessage};
use ferriq::store::{FlowStore, SlotDecision};
use ferriq::testing::RunningWorker;
use ferriq::worker::Outcome;
use ferriq::{State, TaskContext, TaskError};

const LONG: Duration = Duration::from_secs(600);

/// Runs going on now, and the most at once.
#[derive(Default)]
struct Running {
    now: AtomicUsize,
    most: AtomicUsize,
}

#[ferriq::task(name = "slots.one_at_a_time", concurrency = 1)]
async fn one_at_a_time(running: State<Arc<Running>>, n: u32) -> u32 {
    let now = running.now.fetch_add(1, Ordering::SeqCst) + 1;
    running.most.fetch_max(now, Ordering::SeqCst);
    tokio::time::sleep(Duration::from_secs(5)).await;
    running.now.fetch_sub(1, Ordering::SeqCst);
    n
}

/// A worker serving `one_at_a_time`, what its runs count, and a task of it already published
/// once (publish the copy again for a second copy of the same task).
async fn published_once(h: &Harness) -> (RunningWorker, Arc<Running>, OutgoingMessage) {
    let running = Arc::new(Running::default());
    let w = h.start(h.worker(&[one_at_a_time::NAME]).state(Arc::clone(&running)));
    let msg = one_at_a_time::call(1).into_message().unwrap();
    let copy = OutgoingMessage::from_message(&msg).unwrap();
    h.broker.publish(vec![copy.clone()]).await.unwrap();
    (w, running, copy)
}

#[tokio::test(start_paused = true)]
async fn a_copy_of_a_running_task_leaves_it_its_slot() {
    let h = Harness::new();
    let (w, running, copy) = published_once(&h).await;
    eventually("the first copy runs", LONG, || {
        running.now.load(Ordering::SeqCst) == 1
    })
    .await;
    // The same task again while it runs: told its slot is held (the task's), then deferred
    // by the claim.
    h.broker.publish(vec![copy]).await.unwrap();
    eventually("the second copy deferred", LONG, || {
        w.worker.stats().count(Outcome::Deferred) == 1
    })
    .await;
    // Another task waits for the slot the running copy still holds.
    let other = one_at_a_time::kiq(&h.client, 2).await.unwrap();
    assert_eq!(other.wait(LONG).await.unwrap(), 2);
    assert_eq!(
        running.most.load(Ordering::SeqCst),
        1,
        "a deferred copy freed the running copy's slot"
    );
    w.stop().await;
}

#[tokio::test(start_paused = true)]
async fn a_copy_of_a_revoked_task_leaves_the_slot_to_its_run_until_it_stops() {
    let h = Harness::new();
    let (w, running, copy) = published_once(&h).await;
    eventually("the first copy runs", LONG, || {
        running.now.load(Ordering::SeqCst) == 1
    })
    .await;
    // Another task waits for the one slot.
    let other = one_at_a_time::kiq(&h.client, 2).await.unwrap();
    // Revoked while it runs (the run stops at its next heartbeat, or ends first); a copy of
    // it comes meanwhile: told its slot was the task's already, then revoked by its claim.
    assert!(h.client.revoke(&copy.task_id).await.unwrap());
    h.broker.publish(vec![copy]).await.unwrap();
    eventually("the copy acked as revoked", LONG, || {
        w.worker.stats().count(Outcome::Revoked) >= 1
    })
    .await;
    assert_eq!(other.wait(LONG).await.unwrap(), 2);
    assert_eq!(
        running.most.load(Ordering::SeqCst),
        1,
        "a copy of a revoked task freed the slot of its run still going"
    );
    w.stop().await;
}

#[tokio::test(start_paused = true)]
async fn a_copy_of_a_finished_task_frees_the_slot_it_took() {
    let h = Harness::new();
    let (w, _running, copy) = published_once(&h).await;
    eventually("the first copy done", LONG, || {
        w.worker.stats().count(Outcome::Succeeded) == 1
    })
    .await;
    h.broker.publish(vec![copy]).await.unwrap();
    eventually("the late copy acked", LONG, || {
        w.worker.stats().count(Outcome::Duplicate) == 1
    })
    .await;
    // Its one slot is free again at once, not after a lease.
    let limiter = one_at_a_time::NAME;
    let next = ferriq::wire::TaskId::random();
    assert_eq!(
        h.memory()
            .acquire_slot(limiter, &next, 1, Duration::from_secs(30))
            .await
            .unwrap(),
        SlotDecision::Held
    );
    w.stop().await;
}

#[ferriq::task(name = "slots.fails_first", concurrency = 1)]
async fn fails_first(ctx: TaskContext, n: u32) -> Result<u32, TaskError> {
    if ctx.attempt() == 1 && n == 1 {
        return Err(TaskError::retryable("not yet").retry_after(Duration::from_secs(60)));
    }
    Ok(n)
}

#[tokio::test(start_paused = true)]
async fn a_failed_attempt_frees_its_slot_through_its_backoff() {
    let h = Harness::new();
    let w = h.start(h.worker(&[fails_first::NAME]));
    let first = fails_first::kiq(&h.client, 1).await.unwrap();
    eventually("the first attempt failed", LONG, || {
        w.worker.stats().count(Outcome::Retried) == 1
    })
    .await;
    // Its retry comes back in a minute; meanwhile another task takes the one slot at once,
    // not after the failed attempt's lease.
    let sent = tokio::time::Instant::now();
    let other = fails_first::kiq(&h.client, 2).await.unwrap();
    assert_eq!(other.wait(LONG).await.unwrap(), 2);
    assert!(
        sent.elapsed() < Duration::from_secs(3),
        "waited {:?} for a slot nothing ran in",
        sent.elapsed()
    );
    assert_eq!(first.wait(LONG).await.unwrap(), 1);
    w.stop().await;
}

#[tokio::test(start_paused = true)]
async fn a_result_kept_through_a_store_outage_frees_its_slot_when_written() {
    use ferriq::testing::StoreOp;
    let h = Harness::new();
    // The run's result cannot be written: kept for the redelivery, its message back in the
    // queue, and its slot left to the task.
    h.store.set_failing(StoreOp::Complete, true);
    let (w, running, copy) = published_once(&h).await;
    eventually("released with its result kept", LONG, || {
        w.worker.stats().count(Outcome::Released) >= 1
    })
    .await;
    h.store.set_failing(StoreOp::Complete, false);
    let handle = h.client.handle::<u32>(copy.task_id.clone());
    assert_eq!(handle.wait(LONG).await.unwrap(), 1);
    let written = tokio::time::Instant::now();
    eventually("acked", LONG, || h.broker.stats().acked == 1).await;
    assert_eq!(running.most.load(Ordering::SeqCst), 1);
    // The kept result written by the redelivery frees the task's slot then, not a lease later.
    let next = ferriq::wire::TaskId::random();
    assert_eq!(
        h.memory()
            .acquire_slot(one_at_a_time::NAME, &next, 1, Duration::from_secs(30))
            .await
            .unwrap(),
        SlotDecision::Held,
        "the slot was still held {:?} after the kept result was written",
        written.elapsed()
    );
    w.stop().await;
}

#[ferriq::task(name = "slots.limited_at_run_time")]
async fn limited_at_run_time(n: u32) -> u32 {
    tokio::time::sleep(Duration::from_secs(5)).await;
    n
}

#[tokio::test(start_paused = true)]
async fn a_kept_result_frees_the_slot_its_run_held_though_the_limit_is_gone() {
    use ferriq::store::{LimitOverride, OVERRIDES_REFRESH};
    use ferriq::testing::StoreOp;
    const NAME: &str = limited_at_run_time::NAME;
    let h = Harness::new();
    let w = h.start(h.worker(&[NAME]));
    // A limit set at run time (none declared): the run takes a slot of it.
    let one = LimitOverride::default().concurrency(1);
    h.client.limits().set(NAME, None, one).await.unwrap();
    tokio::time::sleep(OVERRIDES_REFRESH + Duration::from_millis(100)).await;
    h.store.set_failing(StoreOp::Complete, true);
    let handle = limited_at_run_time::kiq(&h.client, 7).await.unwrap();
    eventually("released with its result kept", LONG, || {
        w.worker.stats().count(Outcome::Released) >= 1
    })
    .await;
    // The limit is gone before the result can be written: the redelivery's message and the
    // limits of now name no limiter, but the run's slot is still held.
    assert!(h.client.limits().reset(NAME, None).await.unwrap());
    tokio::time::sleep(OVERRIDES_REFRESH + Duration::from_millis(100)).await;
    h.store.set_failing(StoreOp::Complete, false);
    assert_eq!(handle.wait(LONG).await.unwrap(), 7);
    eventually("acked", LONG, || h.broker.stats().acked == 1).await;
    assert_eq!(w.worker.stats().count(Outcome::Succeeded), 1);
    let next = ferriq::wire::TaskId::random();
    assert_eq!(
        h.memory()
            .acquire_slot(NAME, &next, 1, Duration::from_secs(30))
            .await
            .unwrap(),
        SlotDecision::Held,
        "the kept result's run still holds its slot"
    );
    w.stop().await;
}

#[tokio::test(start_paused = true)]
async fn a_kept_result_written_after_a_newer_run_was_revoked_frees_nothing() {
    use ferriq::store::{ClaimOutcome, ClaimStore};
    use ferriq::testing::StoreOp;
    const NAME: &str = one_at_a_time::NAME;
    common::capture_logs();
    let h = Harness::new();
    // The first run's result cannot be written: kept, its message back in the queue (and
    // back again at each redelivery while the store stays down).
    h.store.set_failing(StoreOp::Complete, true);
    let (w, _running, copy) = published_once(&h).await;
    let id = copy.task_id.clone();
    eventually("released with its result kept", LONG, || {
        w.worker.stats().count(Outcome::Released) >= 1
    })
    .await;
    // Its claim lapses (nothing renews a finished run's), and another worker takes the task
    // over and runs it in the task's slot; the task is revoked while that newer run goes.
    tokio::time::sleep(Duration::from_secs(31)).await;
    let newer = h
        .memory()
        .claim(&id, "another-worker", Duration::from_secs(600), None)
        .await
        .unwrap();
    assert!(
        matches!(
            newer,
            ClaimOutcome::Run {
                took_over: true,
                ..
            }
        ),
        "the lapsed claim was not taken over: {newer:?}"
    );
    let taken = h
        .memory()
        .acquire_slot(NAME, &id, 1, Duration::from_secs(600))
        .await
        .unwrap();
    assert!(
        matches!(taken, SlotDecision::Held | SlotDecision::AlreadyHeld),
        "the newer run found the slot taken: {taken:?}"
    );
    // Revoked straight in the store behind the faults (the revoke writes its result as a
    // completion does, and completions still fail here).
    let store_side = ferriq::Client::new(Arc::new(h.broker.clone()), Arc::new(h.memory().clone()));
    assert!(store_side.revoke(&id).await.unwrap());
    // The store is back: the kept result, computed under the older claim, is fenced off
    // (stale: the revoked claim is the newer run's) and frees nothing; the redelivery's claim
    // says revoked and acks it.
    h.store.set_failing(StoreOp::Complete, false);
    eventually("acked as revoked", LONG, || {
        w.worker.stats().count(Outcome::Revoked) == 1 && h.broker.stats().acked == 1
    })
    .await;
    assert_eq!(w.worker.stats().count(Outcome::Succeeded), 0);
    // The kept result was tried, and fenced off: not dropped unseen (its time to keep is
    // ten leases; this is under two).
    let logs = common::logs();
    let fenced: Vec<&str> = logs
        .lines()
        .filter(|l| {
            l.contains(id.as_str()) && l.contains("kept through a store outage was not written")
        })
        .collect();
    assert!(
        fenced.len() == 1 && fenced[0].contains("Stale"),
        "the kept result's write was not answered stale once:\n{logs}"
    );
    // The newer, revoked run still goes: its slot is still held.
    let next = ferriq::wire::TaskId::random();
    assert!(
        matches!(
            h.memory()
                .acquire_slot(NAME, &next, 1, Duration::from_secs(30))
                .await
                .unwrap(),
            SlotDecision::Wait(_)
        ),
        "the older run's write freed the slot of the newer, revoked run still going"
    );
    // The outcome stored is the revoke's, not the older run's value.
    let handle = h.client.handle::<u32>(id);
    match handle.wait(LONG).await {
        Err(ferriq::WaitError::Failed(f)) => {
            assert_eq!(f.kind, Some(ferriq::wire::ErrorKind::Cancelled), "{f:?}")
        }
        other => panic!("the revoke's outcome was not stored: {other:?}"),
    }
    w.stop().await;
}
