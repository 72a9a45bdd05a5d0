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
    let received = common::receive_acking(&broker, sent.len()).await;
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
