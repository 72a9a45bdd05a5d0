//! The broker suite: what the worker relies on from every [`Broker`].

use std::collections::HashSet;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use super::PATIENCE;
use crate::broker::{Broker, DeadLetter, DeadLetterReason, Delivery, LeaseStatus, OutgoingMessage};
use crate::clock::Clock;
use crate::wire::{TaskId, TaskMessage};

/// Runs every broker check, each on a broker from `new_broker` (fresh and empty: on a real
/// server, a lane of its own). Panics naming the check and the rule it found broken.
pub async fn broker_suite<F, Fut>(new_broker: F)
where
    F: Fn() -> Fut,
    Fut: Future<Output = Arc<dyn Broker>>,
{
    published_is_received_and_acked_is_gone(new_broker().await).await;
    released_comes_back(new_broker().await).await;
    released_with_a_delay_waits(new_broker().await).await;
    extended_stays_held(new_broker().await).await;
    dead_lettered_leaves_its_lane_with_its_reason(new_broker().await).await;
    a_batch_arrives_once_each(new_broker().await).await;
    a_dropped_receive_loses_nothing(new_broker().await).await;
}

fn message(name: &str) -> (TaskId, OutgoingMessage) {
    let msg = TaskMessage::new(name);
    let out = OutgoingMessage::from_message(&msg).expect("a message serialises");
    (msg.task_id, out)
}

/// The task id a delivery carries (its header, or its body).
fn task_of(d: &Delivery) -> Option<TaskId> {
    d.task_id
        .clone()
        .or_else(|| TaskMessage::peek_task_id(&d.body))
}

/// Receives until `want` deliveries came or `limit` passed.
async fn receive_n(broker: &dyn Broker, want: usize, limit: Duration) -> Vec<Delivery> {
    let deadline = Instant::now() + limit;
    let mut got = Vec::new();
    while got.len() < want && Instant::now() < deadline {
        let left = deadline.saturating_duration_since(Instant::now());
        let batch = broker
            .receive(want - got.len(), left.min(Duration::from_secs(2)))
            .await
            .unwrap_or_else(|e| panic!("conformance: receive failed: {e}"));
        got.extend(batch);
    }
    got
}

async fn one(broker: &dyn Broker, check: &str) -> Delivery {
    receive_n(broker, 1, PATIENCE)
        .await
        .into_iter()
        .next()
        .unwrap_or_else(|| {
            panic!("conformance {check}: a published message was not received within {PATIENCE:?}")
        })
}

/// Nothing arrives within `quiet`.
async fn nothing_within(broker: &dyn Broker, quiet: Duration, check: &str, why: &str) {
    let got = receive_n(broker, 1, quiet).await;
    assert!(
        got.is_empty(),
        "conformance {check}: {why}, yet a delivery came: {got:?}"
    );
}

async fn published_is_received_and_acked_is_gone(broker: Arc<dyn Broker>) {
    let check = "published_is_received_and_acked_is_gone";
    let (id, out) = message("conformance.one");
    let body = out.body.clone();
    broker.publish(vec![out]).await.expect("publish");
    let d = one(&*broker, check).await;
    assert_eq!(
        d.body, body,
        "conformance {check}: the body changed on the way"
    );
    assert_eq!(
        task_of(&d),
        Some(id),
        "conformance {check}: the task id changed"
    );
    assert!(
        d.receive_count >= 1,
        "conformance {check}: receive_count starts at 1"
    );
    broker.ack(&d.handle).await.expect("ack");
    nothing_within(
        &*broker,
        Duration::from_secs(2),
        check,
        "an acked message must be gone",
    )
    .await;
}

async fn released_comes_back(broker: Arc<dyn Broker>) {
    let check = "released_comes_back";
    let (id, out) = message("conformance.release");
    broker.publish(vec![out]).await.expect("publish");
    let first = one(&*broker, check).await;
    broker
        .release(&first.handle, Duration::ZERO)
        .await
        .expect("release");
    let again = one(&*broker, check).await;
    assert_eq!(
        task_of(&again),
        Some(id),
        "conformance {check}: another message came back"
    );
    assert!(
        again.receive_count > first.receive_count,
        "conformance {check}: a message received again counts it ({} then {})",
        first.receive_count,
        again.receive_count
    );
    broker.ack(&again.handle).await.expect("ack");
}

async fn released_with_a_delay_waits(broker: Arc<dyn Broker>) {
    let check = "released_with_a_delay_waits";
    let (id, out) = message("conformance.later");
    broker.publish(vec![out]).await.expect("publish");
    let first = one(&*broker, check).await;
    let delay = Duration::from_secs(2);
    let due = Clock::system().now_unix() + delay.as_secs_f64();
    broker.release(&first.handle, delay).await.expect("release");
    let again = receive_n(&*broker, 1, PATIENCE + delay)
        .await
        .into_iter()
        .next()
        .unwrap_or_else(|| {
            panic!("conformance {check}: a message released with a delay never came back")
        });
    let arrived = Clock::system().now_unix();
    assert_eq!(task_of(&again), Some(id));
    // Early is allowed only with its due time on it (coarse delay tiers), so the worker waits.
    let told = again.not_before.is_some_and(|nb| nb >= due - 0.5);
    assert!(
        arrived >= due - 0.25 || told,
        "conformance {check}: back {:.2} s early without its due time",
        due - arrived
    );
    broker.ack(&again.handle).await.expect("ack");
}

async fn extended_stays_held(broker: Arc<dyn Broker>) {
    let check = "extended_stays_held";
    let (_, out) = message("conformance.extend");
    broker.publish(vec![out]).await.expect("publish");
    let d = one(&*broker, check).await;
    let status = broker
        .extend(std::slice::from_ref(&d.handle), Duration::from_secs(30))
        .await
        .expect("extend");
    assert_eq!(
        status,
        vec![LeaseStatus::Kept],
        "conformance {check}: a held delivery is kept"
    );
    nothing_within(
        &*broker,
        Duration::from_secs(2),
        check,
        "a held delivery must stay hidden",
    )
    .await;
    broker.ack(&d.handle).await.expect("ack");
}

async fn dead_lettered_leaves_its_lane_with_its_reason(broker: Arc<dyn Broker>) {
    let check = "dead_lettered_leaves_its_lane_with_its_reason";
    let (id, out) = message("conformance.dead");
    broker.publish(vec![out]).await.expect("publish");
    let d = one(&*broker, check).await;
    let why = DeadLetter::new(
        DeadLetterReason::RetriesExhausted,
        "conformance: boom",
        Some("conformance.dead".into()),
        3,
    );
    broker.dead_letter(&d, &why).await.expect("dead_letter");
    nothing_within(
        &*broker,
        Duration::from_secs(2),
        check,
        "a parked message must leave its lane",
    )
    .await;
    let Some(dlq) = broker.dead_letters() else {
        return;
    };
    let deadline = Instant::now() + PATIENCE;
    loop {
        let held = dlq.take_dead(&d.queue, 100).await.expect("take_dead");
        let found = held
            .iter()
            .find(|m| m.task_id.as_ref() == Some(&id))
            .map(|m| (m.reason.clone(), m.detail.clone(), m.attempts));
        dlq.return_dead(held).await.expect("return_dead");
        if let Some((reason, detail, attempts)) = found {
            assert_eq!(
                reason.as_deref(),
                Some("retries_exhausted"),
                "conformance {check}: the reason"
            );
            assert!(
                detail.contains("boom"),
                "conformance {check}: the detail: {detail}"
            );
            assert_eq!(attempts, 3, "conformance {check}: the attempts");
            return;
        }
        assert!(
            Instant::now() < deadline,
            "conformance {check}: the parked copy is not in the dead-letter queue"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

async fn a_batch_arrives_once_each(broker: Arc<dyn Broker>) {
    let check = "a_batch_arrives_once_each";
    let batch: Vec<(TaskId, OutgoingMessage)> =
        (0..50).map(|_| message("conformance.batch")).collect();
    let want: HashSet<TaskId> = batch.iter().map(|(id, _)| id.clone()).collect();
    broker
        .publish(batch.into_iter().map(|(_, m)| m).collect())
        .await
        .expect("publish");
    // Settled as they come, as a worker does (a broker may hold back deliveries beyond its
    // prefetch while earlier ones are unsettled).
    let deadline = Instant::now() + PATIENCE * 2;
    let mut ids = Vec::new();
    while ids.len() < 50 && Instant::now() < deadline {
        for d in broker
            .receive(50, Duration::from_secs(1))
            .await
            .expect("receive")
        {
            ids.extend(task_of(&d));
            broker.ack(&d.handle).await.expect("ack");
        }
    }
    let distinct: HashSet<TaskId> = ids.iter().cloned().collect();
    assert_eq!(
        ids.len(),
        distinct.len(),
        "conformance {check}: a message came twice"
    );
    assert_eq!(
        distinct,
        want,
        "conformance {check}: {} of 50 arrived",
        distinct.len()
    );
}

async fn a_dropped_receive_loses_nothing(broker: Arc<dyn Broker>) {
    let check = "a_dropped_receive_loses_nothing";
    // A worker that drains drops its pending receive: whatever that receive had in hand
    // must still reach someone.
    let pending = tokio::time::timeout(
        Duration::from_millis(300),
        broker.receive(1, Duration::from_secs(5)),
    )
    .await;
    assert!(
        pending.is_err(),
        "conformance {check}: an empty lane delivered something"
    );
    let (id, out) = message("conformance.cancel");
    broker.publish(vec![out]).await.expect("publish");
    // Dropped after 50 ms, unless it got the message by then (then it is ours to settle).
    let raced = tokio::time::timeout(
        Duration::from_millis(50),
        broker.receive(1, Duration::from_secs(5)),
    )
    .await;
    let d = match raced {
        Ok(Ok(mut got)) if !got.is_empty() => got.remove(0),
        _ => one(&*broker, check).await,
    };
    assert_eq!(
        task_of(&d),
        Some(id),
        "conformance {check}: another message came"
    );
    broker.ack(&d.handle).await.expect("ack");
}
