//! Delayed tasks on the memory backends, with paused time: a task runs when it is due (its
//! `due_at`), however long the delay and however early its broker hands it back, and its
//! deadline counts from when it is due.

mod common;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::Harness;
use ferriq::broker::{Broker, OutgoingMessage};
use ferriq::wire::{ErrorKind, TaskMessage};
use ferriq::worker::Outcome;
use ferriq::{State, TaskContext, WaitError};
use tokio::time::Instant;

const DAY: Duration = Duration::from_secs(86_400);

/// When each run started (tokio's paused clock).
#[derive(Default)]
struct Starts(Mutex<Vec<(String, Instant)>>);

impl Starts {
    fn of(&self, id: &str) -> Vec<Instant> {
        let starts = self.0.lock().unwrap();
        starts
            .iter()
            .filter(|(i, _)| i == id)
            .map(|(_, t)| *t)
            .collect()
    }
}

#[ferriq::task(name = "delays.stamp")]
async fn stamp(starts: State<Arc<Starts>>, ctx: TaskContext) -> u32 {
    let mut starts = starts.0.lock().unwrap();
    starts.push((ctx.task_id().to_string(), Instant::now()));
    ctx.attempt()
}

fn harness() -> (Harness, Arc<Starts>) {
    (Harness::new(), Arc::new(Starts::default()))
}

#[tokio::test(start_paused = true)]
async fn a_thirty_day_delay_runs_when_due_and_not_before() {
    let (h, starts) = harness();
    // Long receive waits and leases: a month of virtual time in fewer wake-ups.
    let worker = h
        .worker(&[stamp::NAME])
        .state(Arc::clone(&starts))
        .receive_wait(Duration::from_secs(3600))
        .lease(Duration::from_secs(3600));
    let w = h.start(worker);
    let sent = Instant::now();
    let handle = h
        .client
        .enqueue(stamp::call().with_delay(30 * DAY))
        .await
        .unwrap();
    let id = handle.task_id().to_string();

    tokio::time::sleep(30 * DAY - Duration::from_secs(1)).await;
    assert!(starts.of(&id).is_empty(), "ran before it was due");
    assert_eq!(
        h.memory().current_token(handle.task_id()),
        None,
        "claimed early"
    );

    assert_eq!(handle.wait(2 * DAY).await.unwrap(), 1);
    let ran = starts.of(&id);
    assert_eq!(ran.len(), 1);
    let late = ran[0] - sent - 30 * DAY;
    assert!(
        late < Duration::from_secs(1),
        "ran {late:?} after it was due"
    );
    w.stop().await;
}

#[tokio::test(start_paused = true)]
async fn a_delayed_tasks_deadline_counts_from_when_it_is_due() {
    let (h, starts) = harness();
    let w = h.start(h.worker(&[stamp::NAME]).state(Arc::clone(&starts)));
    let handle = h
        .client
        .enqueue(
            stamp::call()
                .with_delay(Duration::from_secs(3))
                .with_deadline(Some(Duration::from_secs(2))),
        )
        .await
        .unwrap();
    // Before the fix the deadline counted from enqueueing: DeadlineExceeded at 3 s.
    assert_eq!(handle.wait(DAY).await.unwrap(), 1);

    // A task not started within its deadline after it was due still expires: no worker for
    // 10 s after it was due.
    w.stop().await;
    let late = h
        .client
        .enqueue(
            stamp::call()
                .with_delay(Duration::from_secs(3))
                .with_deadline(Some(Duration::from_secs(2))),
        )
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_secs(13)).await;
    let w = h.start(h.worker(&[stamp::NAME]).state(Arc::clone(&starts)));
    match late.wait(DAY).await {
        Err(WaitError::Failed(f)) => assert_eq!(f.kind, Some(ErrorKind::DeadlineExceeded)),
        other => panic!("expected DeadlineExceeded, got {other:?}"),
    }
    w.stop().await;
}

#[tokio::test(start_paused = true)]
async fn a_message_handed_back_early_is_released_until_due_without_a_claim() {
    let (h, starts) = harness();
    let w = h.start(h.worker(&[stamp::NAME]).state(Arc::clone(&starts)));
    let sent = Instant::now();
    let mut msg = TaskMessage::new(stamp::NAME);
    let due = h.clock.now_unix() + 10.25;
    msg.labels.insert("due_at", due);
    // A broker that delivers at once (as a coarse delay tier may): no delay of its own.
    let out = OutgoingMessage::from_message_at(&msg, due).unwrap();
    assert_eq!(out.delay, None);
    h.broker.publish(vec![out]).await.unwrap();

    let handle = h.client.handle::<u32>(msg.task_id.clone());
    tokio::time::sleep(Duration::from_secs(9)).await;
    assert!(starts.of(msg.task_id.as_str()).is_empty());
    assert_eq!(
        h.memory().current_token(&msg.task_id),
        None,
        "claimed early"
    );

    assert_eq!(handle.wait(DAY).await.unwrap(), 1, "no attempt was spent");
    let ran = starts.of(msg.task_id.as_str())[0] - sent;
    assert!(
        ran >= Duration::from_millis(10_250) && ran < Duration::from_millis(10_300),
        "ran at {ran:?}, due at 10.25 s"
    );
    assert_eq!(w.worker.stats().count(Outcome::NotDue), 1);
    w.stop().await;
}

#[tokio::test(start_paused = true)]
async fn a_taskiq_message_with_a_delay_label_and_no_due_time_runs_at_once() {
    let (h, starts) = harness();
    let w = h.start(h.worker(&[stamp::NAME]).state(Arc::clone(&starts)));
    let sent = Instant::now();
    let mut msg = TaskMessage::new(stamp::NAME);
    // As taskiq-aio-pika or taskiq-aio-sqs deliver it: their broker applied the delay.
    msg.labels.insert("delay", 30);
    h.broker
        .publish(vec![OutgoingMessage::from_message(&msg).unwrap()])
        .await
        .unwrap();
    let handle = h.client.handle::<u32>(msg.task_id.clone());
    assert_eq!(handle.wait(DAY).await.unwrap(), 1);
    assert!(starts.of(msg.task_id.as_str())[0] - sent < Duration::from_secs(1));
    w.stop().await;
}

#[tokio::test(start_paused = true)]
async fn a_hand_built_message_with_a_delay_label_is_delayed_by_the_client() {
    let (h, starts) = harness();
    let w = h.start(h.worker(&[stamp::NAME]).state(Arc::clone(&starts)));
    let sent = Instant::now();
    let mut msg = TaskMessage::new(stamp::NAME);
    msg.labels.insert("delay", 30);
    let handle = h.client.enqueue_message(msg).await.unwrap();
    handle.wait(DAY).await.unwrap();
    let ran = starts.of(handle.task_id().as_str())[0] - sent;
    assert!(
        ran >= Duration::from_secs(30) && ran < Duration::from_secs(31),
        "{ran:?}"
    );
    w.stop().await;
}
