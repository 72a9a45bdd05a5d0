//! What the RabbitMQ broker does when parts of RabbitMQ refuse: a missing delay queue, a
//! channel closed by the broker, a worker draining with deliveries buffered.

mod common;

use std::time::Duration;

use common::Topology;
use ferriq::broker::{Broker, BrokerError, OutgoingMessage};
use ferriq::dead_letters::DeadLetterQueue;
use ferriq::wire::TaskMessage;
use lapin::options::QueueDeleteOptions;
use lapin::{Connection, ConnectionProperties};

fn message() -> OutgoingMessage {
    OutgoingMessage::from_message(&TaskMessage::new("failures.any")).unwrap()
}

async fn delete_queue(name: &str) {
    let conn = Connection::connect(&common::amqp_url(), ConnectionProperties::default())
        .await
        .unwrap();
    let ch = conn.create_channel().await.unwrap();
    ch.queue_delete(name.into(), QueueDeleteOptions::default())
        .await
        .unwrap();
    let _ = conn.close(200, "".into()).await;
}

/// A fresh topology and broker with one message published and received (held, unsettled).
async fn one_held() -> (Topology, ferriq_amqp::AmqpBroker, ferriq::broker::Delivery) {
    let topology = Topology::new();
    let broker = topology.broker().await;
    broker.publish(vec![message()]).await.unwrap();
    let held = broker
        .receive(1, Duration::from_secs(5))
        .await
        .unwrap()
        .remove(0);
    (topology, broker, held)
}

#[tokio::test]
async fn a_release_whose_copy_is_refused_puts_the_original_back() {
    let (topology, broker, first) = one_held().await;
    delete_queue(&format!("{}.delay.1s", topology.queue)).await;

    let err = broker
        .release(&first.handle, Duration::from_secs(1))
        .await
        .unwrap_err();
    assert!(matches!(err, BrokerError::Rejected(_)), "{err:?}");
    // Not held forever on a live channel: it is back in the lane at once.
    let again = broker.receive(1, Duration::from_secs(5)).await.unwrap();
    assert_eq!(again.len(), 1, "the original came back");
    assert_eq!(again[0].body, first.body);
    assert!(again[0].receive_count >= 2);
    broker.ack(&again[0].handle).await.unwrap();
}

#[tokio::test]
async fn a_channel_closed_by_the_broker_does_not_end_the_session() {
    let (topology, broker, held) = one_held().await;
    // A basic.get on a missing queue makes RabbitMQ close that (operator) channel with 404.
    delete_queue(&format!("{}.dead_letter", topology.queue)).await;
    let err = broker.take_dead(&topology.queue, 1).await.unwrap_err();
    assert!(err.to_string().contains("dead-letter queue"), "{err}");
    // The next call opens a fresh channel: it fails with the same 404, not "channel closed".
    let again = broker.take_dead(&topology.queue, 1).await.unwrap_err();
    assert!(again.to_string().contains("NOT_FOUND"), "{again}");
    assert!(broker.health().await.is_healthy());
    // Held deliveries are still ours: no reconnect happened.
    let kept = broker
        .extend(std::slice::from_ref(&held.handle), Duration::from_secs(30))
        .await
        .unwrap();
    assert_eq!(kept, [ferriq::broker::LeaseStatus::Kept]);
    broker.ack(&held.handle).await.unwrap();
}

#[tokio::test]
async fn a_lane_deleted_under_its_consumer_is_declared_again_and_consumed() {
    let (topology, broker, first) = one_held().await;
    broker.ack(&first.handle).await.unwrap();
    // RabbitMQ cancels the consumer of a deleted queue: the session is replaced, which
    // declares the lane again and consumes it anew.
    delete_queue(&topology.queue).await;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    let mut published = false;
    loop {
        assert!(
            tokio::time::Instant::now() < deadline,
            "nothing received from the lane declared again (published: {published})"
        );
        // Until the lane exists again a publish is unroutable, and refused.
        if !published {
            published = broker.publish(vec![message()]).await.is_ok();
        }
        let got = broker.receive(1, Duration::from_millis(200)).await.unwrap();
        if let Some(d) = got.into_iter().next() {
            assert!(published, "a delivery before any publish went through");
            broker.ack(&d.handle).await.unwrap();
            break;
        }
    }
    assert!(broker.health().await.is_healthy());
}

#[ferriq::task(name = "failures.slow")]
async fn slow(ctx: ferriq::TaskContext) -> u32 {
    // Runs until the worker gives up on it (a drain), or finishes at once on its redelivery.
    if ctx.receive_count() == 1 {
        std::future::pending::<()>().await;
    }
    ctx.attempt()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_drain_hands_unfinished_runs_back_for_another_worker() {
    hands_unfinished_runs_back(false).await;
}

/// Told to stop now (a second signal): the runs are cut off at once, and still handed back
/// before the channel closes (not nacked on a closing channel).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forced_stop_still_hands_unfinished_runs_back() {
    hands_unfinished_runs_back(true).await;
}

async fn hands_unfinished_runs_back(forced: bool) {
    use std::sync::Arc;
    let topology = Topology::new();
    let prefix = topology.queue.replace('.', "_");
    let store = Arc::new(common::store(&prefix).await);
    let worker = |broker: ferriq_amqp::AmqpBroker| {
        ferriq::Worker::builder()
            .broker(Arc::new(broker))
            .store(store.clone())
            .registry(
                ferriq::Registry::from_inventory()
                    .unwrap()
                    .only(&[slow::NAME])
                    .unwrap(),
            )
            .concurrency(2)
            .grace(Duration::from_millis(500))
            .build()
            .unwrap()
    };
    let first_broker = topology
        .builder(&common::amqp_url())
        .prefetch(2)
        .connect()
        .await
        .unwrap();
    let first = ferriq::testing::RunningWorker::spawn(worker(first_broker.clone()));
    let client = ferriq::Client::new(Arc::new(topology.broker().await), store.clone());
    let handles = client
        .enqueue_batch([slow::call(), slow::call()])
        .await
        .unwrap();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while first.worker.stats().in_flight < 2 {
        assert!(tokio::time::Instant::now() < deadline, "runs did not start");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let stats = first.worker.clone();
    if forced {
        first.shutdown.force();
        first.join().await;
    } else {
        first.stop().await;
    }
    assert_eq!(
        stats
            .stats()
            .count(ferriq::worker::Outcome::ShutdownReleased),
        2
    );
    // Back in the lane at once, and their claims were handed back: a new worker runs them
    // without waiting for a lease.
    let start = tokio::time::Instant::now();
    let second = ferriq::testing::RunningWorker::spawn(worker(topology.broker().await));
    for h in &handles {
        assert_eq!(
            h.wait(Duration::from_secs(30)).await.unwrap(),
            1,
            "the drain burned no attempt"
        );
    }
    assert!(
        start.elapsed() < Duration::from_secs(10),
        "took {:?}",
        start.elapsed()
    );
    second.stop().await;
    drop(first_broker);
}
