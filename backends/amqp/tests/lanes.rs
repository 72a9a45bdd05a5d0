//! Lanes on the real RabbitMQ: one worker serving several, a lane nobody consumes, publishing
//! to a lane directly, and a lane declared before with another dead-letter queue.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::Topology;
use ferriq::broker::{Broker, OutgoingMessage};
use ferriq::testing::RunningWorker;
use ferriq::{Client, Registry, WaitError, Worker};

const WAIT: Duration = Duration::from_secs(60);

#[ferriq::task(name = "amqp.add")]
async fn add(a: i64, b: i64) -> i64 {
    a + b
}

#[tokio::test]
async fn a_worker_serves_several_lanes() {
    let (first, second) = (Topology::new(), Topology::new());
    let prefix = first.queue.replace('.', "_");
    let store = Arc::new(common::store(&prefix).await);
    let lanes = |url: &str| {
        ferriq_amqp::AmqpBroker::builder(url)
            .exchange(first.exchange.as_str())
            .queues([first.queue.as_str(), second.queue.as_str()])
            .delay_tiers(common::TIERS)
    };
    let worker_broker = Arc::new(lanes(&common::amqp_url()).connect().await.unwrap());
    let client_broker = Arc::new(lanes(&common::amqp_url()).connect().await.unwrap());
    let client = Client::new(client_broker.clone(), store.clone());
    // The first lane is the default; the second is chosen per call (label `queue_name`).
    let on_first = add::kiq(&client, 1, 1).await.unwrap();
    let on_second = client
        .enqueue(add::call(2, 2).with_queue(second.queue.as_str()))
        .await
        .unwrap();
    let delayed_second = client
        .enqueue(
            add::call(3, 3)
                .with_queue(second.queue.as_str())
                .with_delay(Duration::from_millis(1500)),
        )
        .await
        .unwrap();
    let only_second = ferriq_amqp::AmqpBroker::builder(common::amqp_url())
        .exchange(first.exchange.as_str())
        .queues([second.queue.as_str()])
        .delay_tiers(common::TIERS)
        .connect()
        .await
        .unwrap();
    let depth = only_second.depth().await.unwrap();
    assert_eq!(
        (depth.ready, depth.delayed),
        (1, 1),
        "routed to the second lane"
    );
    let worker = RunningWorker::spawn(
        Worker::builder()
            .broker(worker_broker)
            .store(store)
            .registry(
                Registry::from_inventory()
                    .unwrap()
                    .only(&[add::NAME])
                    .unwrap(),
            )
            .build()
            .unwrap(),
    );
    assert_eq!(on_first.wait(WAIT).await.unwrap(), 2);
    assert_eq!(on_second.wait(WAIT).await.unwrap(), 4);
    assert_eq!(delayed_second.wait(WAIT).await.unwrap(), 6);
    worker.stop().await;
}

#[tokio::test]
async fn waiting_on_a_queue_nobody_consumes_says_so() {
    let topology = Topology::new();
    let store = Arc::new(common::store(&topology.queue.replace('.', "_")).await);
    let broker = Arc::new(topology.broker().await);
    let client = Client::new(broker, store);
    let handle = add::kiq(&client, 1, 2).await.unwrap();
    match handle.wait(Duration::from_millis(300)).await {
        Err(WaitError::NoConsumers { queue, .. }) => assert_eq!(queue, topology.queue),
        other => panic!("expected NoConsumers, got {other:?}"),
    }
    // A handle made from an id alone does not know the queue: a plain timeout.
    let by_id = client.handle::<i64>(handle.task_id().clone());
    assert!(matches!(
        by_id.wait(Duration::from_millis(100)).await,
        Err(WaitError::TimedOut(_))
    ));
}

#[tokio::test]
async fn publishing_to_lanes_directly_skips_the_exchanges_other_bindings() {
    use lapin::options::{BasicGetOptions, QueueBindOptions, QueueDeclareOptions};
    let topology = Topology::new();
    let through_exchange = topology.broker().await;
    let direct = topology
        .builder(&common::amqp_url())
        .publish_to_lanes_directly(true)
        .connect()
        .await
        .unwrap();
    // An audit queue bound to the exchange by pattern (exclusive: gone with its connection).
    let conn = lapin::Connection::connect(&common::amqp_url(), Default::default())
        .await
        .unwrap();
    let ch = conn.create_channel().await.unwrap();
    let audit = common::unique("audit");
    let exclusive = QueueDeclareOptions {
        exclusive: true,
        ..Default::default()
    };
    ch.queue_declare(audit.as_str().into(), exclusive, Default::default())
        .await
        .unwrap();
    ch.queue_bind(
        audit.as_str().into(),
        topology.exchange.as_str().into(),
        "#".into(),
        QueueBindOptions::default(),
        Default::default(),
    )
    .await
    .unwrap();

    let message = |n| OutgoingMessage::from_message(&add::call(n, 0).into_message().unwrap());
    let (a, b) = (message(1).unwrap(), message(2).unwrap());
    let (via_exchange, via_default) = (a.task_id.to_string(), b.task_id.to_string());
    through_exchange.publish(vec![a]).await.unwrap();
    direct.publish(vec![b]).await.unwrap();

    // Both reach the lane.
    let mut received = common::receive_acking(&through_exchange, 2).await;
    received.sort();
    let mut expected = vec![via_exchange.clone(), via_default];
    expected.sort();
    assert_eq!(received, expected);
    // Only the one published through the exchange was copied to the audit queue.
    let get = || ch.basic_get(audit.as_str().into(), BasicGetOptions { no_ack: true });
    let copied = get()
        .await
        .unwrap()
        .expect("a copy of the exchange's message");
    let copied_id = copied
        .delivery
        .properties
        .message_id()
        .as_ref()
        .map(|s| s.to_string());
    assert_eq!(copied_id.as_deref(), Some(via_exchange.as_str()));
    assert!(
        get().await.unwrap().is_none(),
        "the direct publish was copied"
    );
    let _ = conn.close(200, "".into()).await;
}

/// A lane taskiq-aio-pika declared first with its default dead-letter queue: the refusal says
/// which argument disagrees and what the Python side must set.
#[tokio::test]
async fn a_lane_declared_with_another_dead_letter_queue_says_what_to_set() {
    use lapin::options::QueueDeclareOptions;
    use lapin::types::{AMQPValue, FieldTable};
    let topology = Topology::new();
    let conn = lapin::Connection::connect(&common::amqp_url(), Default::default())
        .await
        .unwrap();
    let ch = conn.create_channel().await.unwrap();
    // As taskiq-aio-pika 0.6 declares its queue with default settings (deleted with the
    // topology when the test ends).
    let mut args = FieldTable::default();
    args.insert(
        "x-queue-type".into(),
        AMQPValue::LongString("quorum".into()),
    );
    args.insert(
        "x-dead-letter-exchange".into(),
        AMQPValue::LongString("".into()),
    );
    args.insert(
        "x-dead-letter-routing-key".into(),
        AMQPValue::LongString("taskiq.dead_letter".into()),
    );
    let durable = QueueDeclareOptions {
        durable: true,
        ..Default::default()
    };
    ch.queue_declare(topology.queue.as_str().into(), durable, args)
        .await
        .unwrap();
    let err = topology
        .builder(&common::amqp_url())
        .connect()
        .await
        .expect_err("the lane's arguments disagree")
        .to_string();
    assert!(
        err.contains("x-dead-letter-routing-key")
            && err.contains("<lane>.dead_letter")
            && err.contains("dead_letter_queue=Queue"),
        "{err}"
    );
}
