//! A failover under the Streams broker, whatever promotes the replica (Sentinel, a cluster).

use std::collections::HashMap;
use std::time::Duration;

use ferriq::broker::{Broker, BrokerError, ConsumerSettings, Delivery, OutgoingMessage};
use ferriq::wire::{TaskId, TaskMessage};
use ferriq_valkey::StreamBroker;
use tokio::time::Instant;

fn message() -> (TaskId, OutgoingMessage) {
    let msg = TaskMessage::new("failover.streams");
    (
        msg.task_id.clone(),
        OutgoingMessage::from_message(&msg).unwrap(),
    )
}

fn task_of(d: &Delivery) -> TaskId {
    TaskMessage::peek_task_id(&d.body).unwrap()
}

/// Before the primary dies: ten entries queued on lane `queue` of `url`, one received and acked,
/// one received and held. `replicated` returns once the replica has all of it; `kill` SIGKILLs
/// the primary; `promoted` tells when the replica has taken its place. After the promotion
/// the broker follows by itself: the held entry's lease lapses on the new primary and it comes
/// back with a higher delivery count (its old handle refused), every other entry arrives
/// once, and a publish after the failover arrives too. Nothing is lost.
pub async fn streams_broker_follows(
    url: &str,
    queue: &str,
    replicated: impl FnOnce(),
    kill: impl FnOnce(),
    promoted: impl Fn() -> bool,
) {
    let broker = StreamBroker::builder(url)
        .queues([queue])
        .command_timeout(Duration::from_millis(500))
        .allow_volatile(true)
        .connect()
        .await
        .expect("connect the Streams broker");
    let lease = Duration::from_secs(1);
    broker.prepare_consumer(&ConsumerSettings::new(8, lease));
    let mut queued = Vec::new();
    let mut batch = Vec::new();
    for _ in 0..10 {
        let (id, out) = message();
        queued.push(id);
        batch.push(out);
    }
    broker.publish(batch).await.unwrap();
    let mut first = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(10);
    while first.len() < 2 {
        assert!(Instant::now() < deadline, "received {}", first.len());
        first.extend(
            broker
                .receive(2 - first.len(), Duration::from_secs(1))
                .await
                .unwrap(),
        );
    }
    let (acked, held) = (first.remove(0), first.remove(0));
    broker.ack(&acked.handle).await.unwrap();
    replicated();

    kill();

    let mut expected: Vec<_> = queued
        .iter()
        .filter(|id| **id != task_of(&acked))
        .cloned()
        .collect();
    let mut deliveries: HashMap<TaskId, Vec<u32>> = HashMap::new();
    let mut published_after = false;
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let done = expected.iter().all(|id| deliveries.contains_key(id));
        if done && published_after {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "after 60 s, still missing {:?}",
            expected
                .iter()
                .filter(|id| !deliveries.contains_key(*id))
                .collect::<Vec<_>>()
        );
        let started = Instant::now();
        let received = broker.receive(8, Duration::from_millis(500)).await;
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "a receive during the failover hung"
        );
        let Ok(received) = received else {
            tokio::time::sleep(Duration::from_millis(100)).await;
            continue;
        };
        for d in received {
            deliveries
                .entry(task_of(&d))
                .or_default()
                .push(d.receive_count);
            broker.ack(&d.handle).await.expect("ack on the new primary");
        }
        if !published_after && promoted() {
            let (id, out) = message();
            if broker.publish(vec![out]).await.is_ok() {
                expected.push(id);
                published_after = true;
            }
        }
    }
    for (id, counts) in &deliveries {
        assert_eq!(counts.len(), 1, "{id} delivered {counts:?}");
    }
    assert!(
        deliveries[&task_of(&held)][0] >= 2,
        "the held entry came back as a new delivery"
    );
    assert!(matches!(
        broker.ack(&held.handle).await,
        Err(BrokerError::DeliveryLost)
    ));
    assert!(
        !deliveries.contains_key(&task_of(&acked)),
        "an acked entry came back"
    );
    let depth = broker.depth().await.unwrap();
    assert_eq!((depth.ready, depth.in_flight, depth.delayed), (0, 0, 0));
    broker.close().await;
}
