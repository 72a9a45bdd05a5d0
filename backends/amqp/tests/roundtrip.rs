//! Client → RabbitMQ → worker → result, on the real RabbitMQ with results in Redis.

mod common;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::Topology;
use ferriq::broker::{Broker, OutgoingMessage};
use ferriq::testing::RunningWorker;
use ferriq::wire::{ErrorKind, TaskMessage};
use ferriq::{Client, EnqueueError, Registry, State, TaskContext, TaskError, WaitError, Worker};
use lapin::types::AMQPValue;
use tokio::time::Instant;

const WAIT: Duration = Duration::from_secs(60);

#[derive(Default)]
struct Starts(Mutex<Vec<Instant>>);

#[ferriq::task(name = "amqp.add")]
async fn add(a: i64, b: i64) -> i64 {
    a + b
}

#[ferriq::task(
    name = "amqp.flaky",
    max_attempts = 3,
    backoff_initial = 1,
    backoff_max = 1
)]
async fn flaky(starts: State<Arc<Starts>>, ctx: TaskContext) -> Result<u32, TaskError> {
    starts.0.lock().unwrap().push(Instant::now());
    if ctx.attempt() == 1 {
        return Err(TaskError::retryable("first attempt fails"));
    }
    Ok(ctx.attempt())
}

#[ferriq::task(name = "amqp.always_fails", max_attempts = 2, backoff_initial = 0.2)]
async fn always_fails(ctx: TaskContext) -> Result<(), TaskError> {
    Err(TaskError::retryable(format!(
        "attempt {} failed",
        ctx.attempt()
    )))
}

struct Setup {
    topology: Topology,
    client: Client,
    worker: RunningWorker,
    starts: Arc<Starts>,
}

async fn setup() -> Setup {
    let topology = Topology::new();
    let store = Arc::new(common::store(&topology.queue.replace('.', "_")).await);
    let broker = Arc::new(topology.broker().await);
    let starts = Arc::new(Starts::default());
    let worker = RunningWorker::spawn(
        Worker::builder()
            .broker(broker.clone())
            .store(store.clone())
            .registry(
                Registry::from_inventory()
                    .unwrap()
                    .only(&[add::NAME, flaky::NAME, always_fails::NAME])
                    .unwrap(),
            )
            .state(starts.clone())
            .concurrency(8)
            .build()
            .unwrap(),
    );
    // The client has a connection of its own, as in another process.
    let client = Client::new(Arc::new(topology.broker().await), store);
    Setup {
        topology,
        client,
        worker,
        starts,
    }
}

#[tokio::test]
async fn a_task_round_trips_through_rabbitmq() {
    let s = setup().await;
    let handles = s
        .client
        .enqueue_batch((0..50).map(|i| add::call(i, 1)))
        .await
        .unwrap();
    for (i, h) in handles.iter().enumerate() {
        assert_eq!(h.wait(WAIT).await.unwrap(), i as i64 + 1);
    }
    s.worker.stop().await;
}

#[tokio::test]
async fn a_retry_waits_in_the_delay_tier_then_succeeds() {
    let s = setup().await;
    let handle = flaky::kiq(&s.client).await.unwrap();
    assert_eq!(handle.wait(WAIT).await.unwrap(), 2);
    let starts = s.starts.0.lock().unwrap().clone();
    assert_eq!(starts.len(), 2);
    let gap = starts[1] - starts[0];
    // Backoff 1 s with jitter in [50 %, 100 %]: the delay tier really held it.
    assert!(gap >= Duration::from_millis(480), "retried after {gap:?}");
    assert!(gap < Duration::from_secs(5), "retried after {gap:?}");
    s.worker.stop().await;
}

#[tokio::test]
async fn the_delay_label_delays_the_first_run() {
    let s = setup().await;
    let start = Instant::now();
    let handle = s
        .client
        .enqueue(add::call(2, 2).with_delay(Duration::from_millis(1500)))
        .await
        .unwrap();
    assert_eq!(handle.wait(WAIT).await.unwrap(), 4);
    let took = start.elapsed();
    assert!(took >= Duration::from_millis(1450), "ran after {took:?}");
    s.worker.stop().await;
}

#[tokio::test]
async fn exhausted_retries_are_dead_lettered_with_reason_headers() {
    let s = setup().await;
    let handle = always_fails::kiq(&s.client).await.unwrap();
    match handle.wait(WAIT).await {
        Err(WaitError::Failed(f)) => {
            assert_eq!(f.kind, Some(ErrorKind::RetriesExhausted));
            assert_eq!(f.attempts, 2);
        }
        other => panic!("{other:?}"),
    }
    // The dead-letter copy is written before the ack: read it back.
    let deadline = Instant::now() + WAIT;
    let dead = loop {
        if let Some(m) = s.topology.take_dead_letter().await {
            break m;
        }
        assert!(Instant::now() < deadline, "nothing dead-lettered");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let headers = dead.delivery.properties.headers().clone().unwrap();
    let get = |k: &str| headers.inner().get(k).cloned();
    let text = |v: Option<AMQPValue>| match v {
        Some(AMQPValue::LongString(s)) => String::from_utf8(s.as_bytes().to_vec()).unwrap(),
        other => panic!("{other:?}"),
    };
    assert_eq!(text(get("x-ferriq-reason")), "retries_exhausted");
    assert_eq!(text(get("x-ferriq-task-name")), always_fails::NAME);
    assert!(text(get("x-ferriq-detail")).contains("attempt 2 failed"));
    assert_eq!(get("x-ferriq-attempts"), Some(AMQPValue::LongLongInt(2)));
    assert_eq!(text(get("task_id")), handle.task_id().as_str());
    let body = TaskMessage::from_json(&dead.delivery.data).unwrap();
    assert_eq!(
        body.task_id,
        *handle.task_id(),
        "the body is kept as it was"
    );
    s.worker.stop().await;
}

#[tokio::test]
async fn an_unroutable_publish_is_an_error() {
    let s = setup().await;
    let err = s
        .client
        .enqueue(add::call(1, 1).with_queue("no.such.lane"))
        .await
        .unwrap_err();
    assert!(
        matches!(
            &err,
            EnqueueError::Broker(ferriq::broker::BrokerError::Rejected(why))
                if why.contains("no.such.lane") && why.contains("FERRIQ_QUEUES")
        ),
        "the error names the lane and what declares it: {err:?}"
    );
    s.worker.stop().await;
}

#[tokio::test]
async fn concurrent_single_publishes_open_more_channels_and_all_arrive() {
    let topology = Topology::new();
    // More publishes at once than the channels opened with the connection: the rest open on
    // demand, go back to the pool, and every message is confirmed exactly once.
    let broker = Arc::new(
        topology
            .builder(&common::amqp_url())
            .publisher_channels(16)
            .connect()
            .await
            .unwrap(),
    );
    // The second round runs on the channels the first one pooled.
    for _round in 0..2 {
        let publishes = (0..100).map(|i| {
            let broker = Arc::clone(&broker);
            async move {
                let msg = add::call(i, i).into_message().unwrap();
                broker
                    .publish(vec![OutgoingMessage::from_message(&msg).unwrap()])
                    .await
            }
        });
        for published in futures_util::future::join_all(publishes).await {
            published.unwrap();
        }
    }
    assert_eq!(broker.depth().await.unwrap().ready, 200);
    broker.close().await;
}

#[tokio::test]
async fn depth_and_health_report_the_queue() {
    let topology = Topology::new();
    let broker = topology.broker().await;
    assert!(broker.health().await.is_healthy());
    let msgs: Vec<_> = (0..7)
        .map(|i| OutgoingMessage::from_message(&add::call(i, i).into_message().unwrap()).unwrap())
        .collect();
    broker.publish(msgs).await.unwrap();
    let delayed = add::call(0, 0)
        .with_delay(Duration::from_secs(4))
        .into_message()
        .unwrap();
    broker
        .publish(vec![OutgoingMessage::from_message(&delayed).unwrap()])
        .await
        .unwrap();
    let depth = broker.depth().await.unwrap();
    assert_eq!((depth.ready, depth.delayed), (7, 1));
    broker.close().await;
    assert!(!broker.health().await.is_healthy());
}

/// Receives `n` deliveries (acking each) and returns their task ids in the order they arrived.
async fn receive_acking(broker: &ferriq_amqp::AmqpBroker, n: usize) -> Vec<String> {
    let mut received = Vec::new();
    let deadline = Instant::now() + WAIT;
    while received.len() < n {
        assert!(
            Instant::now() < deadline,
            "{} of {n} arrived",
            received.len()
        );
        for d in broker
            .receive(64, Duration::from_millis(200))
            .await
            .unwrap()
        {
            received.push(d.task_id.as_ref().expect("the task_id header").to_string());
            broker.ack(&d.handle).await.unwrap();
        }
    }
    received
}

#[tokio::test]
async fn a_batch_arrives_in_the_order_it_was_published() {
    // A batch is handed to the connection all at once (pipelined), not one message per write:
    // it must still go out, and so arrive, in order.
    let topology = Topology::new();
    let broker = topology.broker().await;
    let msgs: Vec<_> = (0..2000)
        .map(|i| OutgoingMessage::from_message(&add::call(i, 0).into_message().unwrap()).unwrap())
        .collect();
    let sent: Vec<String> = msgs.iter().map(|m| m.task_id.to_string()).collect();
    broker.publish(msgs).await.unwrap();
    let received = receive_acking(&broker, sent.len()).await;
    assert!(received == sent, "the batch arrived out of order");
}

#[tokio::test]
async fn a_delivery_is_settled_once_whichever_way_comes_first() {
    // Acks go to the channel directly and nacks through lapin's acker: one gate for both, so a
    // second settle is refused here instead of reaching RabbitMQ (which would close the
    // channel over an unknown delivery tag, taking every other held delivery with it).
    use ferriq::broker::BrokerError;
    let topology = Topology::new();
    let broker = topology.broker().await;
    let msgs: Vec<_> = (0..3)
        .map(|i| OutgoingMessage::from_message(&add::call(i, 0).into_message().unwrap()).unwrap())
        .collect();
    broker.publish(msgs).await.unwrap();
    let mut held = Vec::new();
    let deadline = Instant::now() + WAIT;
    while held.len() < 3 {
        assert!(Instant::now() < deadline, "{} of 3 arrived", held.len());
        held.extend(broker.receive(3, Duration::from_millis(200)).await.unwrap());
    }
    let (a, b, c) = (&held[0], &held[1], &held[2]);
    broker.ack(&a.handle).await.unwrap();
    assert!(matches!(
        broker.ack(&a.handle).await,
        Err(BrokerError::DeliveryLost)
    ));
    assert!(matches!(
        broker.release(&a.handle, Duration::ZERO).await,
        Err(BrokerError::DeliveryLost)
    ));
    broker.release(&b.handle, Duration::ZERO).await.unwrap();
    assert!(matches!(
        broker.ack(&b.handle).await,
        Err(BrokerError::DeliveryLost)
    ));
    // The channel survived: the third is still ours to ack, and the released one comes back.
    broker.ack(&c.handle).await.unwrap();
    let deadline = Instant::now() + WAIT;
    loop {
        assert!(
            Instant::now() < deadline,
            "the released delivery never came back"
        );
        if let Some(d) = broker
            .receive(1, Duration::from_millis(200))
            .await
            .unwrap()
            .pop()
        {
            assert_eq!(d.task_id, b.task_id);
            broker.ack(&d.handle).await.unwrap();
            break;
        }
    }
}

#[tokio::test]
async fn the_delivery_limit_backstop_parks_a_looping_message() {
    let topology = Topology::new();
    let broker = topology
        .builder(&common::amqp_url())
        .delivery_limit(Some(2))
        .connect()
        .await
        .unwrap();
    let msg = OutgoingMessage::from_message(&add::call(1, 1).into_message().unwrap()).unwrap();
    broker.publish(vec![msg]).await.unwrap();
    let mut receives = Vec::new();
    let deadline = Instant::now() + WAIT;
    // Released at once, again and again, as a buggy consumer would.
    while topology.take_dead_letter().await.is_none() {
        assert!(Instant::now() < deadline, "never dead-lettered");
        for d in broker.receive(1, Duration::from_millis(200)).await.unwrap() {
            receives.push(d.receive_count);
            broker.release(&d.handle, Duration::ZERO).await.unwrap();
        }
    }
    assert_eq!(
        receives,
        [1, 2, 3],
        "receive counts follow x-delivery-count"
    );
}

#[tokio::test]
async fn urls_are_checked_and_passwords_never_shown() {
    let err = ferriq_amqp::AmqpBroker::builder("http://user:s3cret@localhost:5672")
        .connect()
        .await
        .unwrap_err()
        .to_string();
    assert!(err.contains("amqp://") && !err.contains("s3cret"), "{err}");
    #[cfg(not(feature = "tls"))]
    {
        let err = ferriq_amqp::AmqpBroker::builder("amqps://user:s3cret@localhost:5671/%2f")
            .connect()
            .await
            .unwrap_err()
            .to_string();
        assert!(err.contains("tls") && !err.contains("s3cret"), "{err}");
    }
    // Wrong password: a clear error, without the password.
    let err = ferriq_amqp::AmqpBroker::builder("amqp://guest:wrong-s3cret@127.0.0.1:5672/%2f")
        .connect()
        .await
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("cannot connect") && !err.contains("wrong-s3cret"),
        "{err}"
    );
    let broker = Topology::new().broker().await;
    assert!(!format!("{broker:?}").contains("guest:guest"), "{broker:?}");
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
    let mut received = receive_acking(&through_exchange, 2).await;
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
