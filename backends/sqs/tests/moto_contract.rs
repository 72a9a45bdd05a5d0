//! A small contract suite on moto's SQS server, which validates requests the way AWS does:
//! the round trip and the dead-letter queue work there too, and the broker never sends what
//! SQS refuses (visibility beyond 12 hours, delays beyond 15 minutes).

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::{QueueOptions, Queues};
use ferriq::broker::Broker;
use ferriq::memory::MemoryStore;
use ferriq::testing::RunningWorker;
use ferriq::wire::ErrorKind;
use ferriq::{Client, Registry, TaskError, WaitError, Worker};

#[ferriq::task(name = "moto.add")]
async fn add(a: i64, b: i64) -> i64 {
    a + b
}

#[ferriq::task(name = "moto.fatal")]
async fn fatal() -> Result<(), TaskError> {
    Err(TaskError::fatal("malformed invoice"))
}

async fn moto_queues() -> Queues {
    Queues::create_at(&common::moto_endpoint(), QueueOptions::default()).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_round_trip_and_the_dead_letter_queue_work_on_moto() {
    let queues = moto_queues().await;
    let store = Arc::new(MemoryStore::new());
    let worker = RunningWorker::spawn(
        Worker::builder()
            .broker(Arc::new(queues.broker().await))
            .store(store.clone())
            .registry(
                Registry::from_inventory()
                    .unwrap()
                    .only(&[add::NAME, fatal::NAME])
                    .unwrap(),
            )
            .build()
            .unwrap(),
    );
    let client = Client::new(Arc::new(queues.broker().await), store);
    let sums = client
        .enqueue_batch((0..5).map(|i| add::call(i, 1)))
        .await
        .unwrap();
    for (i, h) in sums.iter().enumerate() {
        assert_eq!(h.wait(Duration::from_secs(60)).await.unwrap(), i as i64 + 1);
    }
    let bad = fatal::kiq(&client).await.unwrap();
    match bad.wait(Duration::from_secs(60)).await {
        Err(WaitError::Failed(f)) => assert_eq!(f.kind, Some(ErrorKind::TaskError)),
        other => panic!("expected a failure, got {other:?}"),
    }
    let mut dead = Vec::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while dead.is_empty() {
        assert!(tokio::time::Instant::now() < deadline, "not parked");
        dead = queues.dead_letters().await;
    }
    let attributes = dead[0].message_attributes.as_ref().unwrap();
    assert_eq!(
        attributes["ferriq_reason"].string_value(),
        Some("non_retryable")
    );
    assert_eq!(
        attributes["ferriq_task_name"].string_value(),
        Some("moto.fatal")
    );
    worker.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqs_refuses_out_of_range_values_and_the_broker_never_sends_them() {
    let queues = moto_queues().await;
    let admin = &queues.admin;
    admin
        .send_message()
        .queue_url(&queues.url)
        .message_body("{}")
        .send()
        .await
        .unwrap();
    let received = admin
        .receive_message()
        .queue_url(&queues.url)
        .send()
        .await
        .unwrap()
        .messages
        .unwrap();
    let handle = received[0].receipt_handle.clone().unwrap();
    // What AWS refuses, moto refuses.
    let over = admin
        .change_message_visibility()
        .queue_url(&queues.url)
        .receipt_handle(&handle)
        .visibility_timeout(43_201)
        .send()
        .await;
    assert!(over.is_err(), "a visibility over 12 hours is refused");
    let too_late = admin
        .send_message()
        .queue_url(&queues.url)
        .message_body("{}")
        .delay_seconds(901)
        .send()
        .await;
    assert!(too_late.is_err(), "a delay over 15 minutes is refused");

    // The broker sends a delay of a day and a release of 13 hours within range.
    let broker = queues.broker().await;
    let client = Client::new(Arc::new(broker.clone()), Arc::new(MemoryStore::new()));
    client
        .enqueue(add::call(1, 2).with_delay(Duration::from_secs(86_400)))
        .await
        .expect("a long delay is sent as 15 minutes plus its due time");
    broker
        .publish(vec![ferriq::broker::OutgoingMessage::from_message(
            &ferriq::wire::TaskMessage::new("moto.add"),
        )
        .unwrap()])
        .await
        .unwrap();
    let mut delivered = Vec::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while delivered.is_empty() {
        assert!(tokio::time::Instant::now() < deadline, "nothing to receive");
        delivered = broker.receive(1, Duration::from_secs(2)).await.unwrap();
    }
    broker
        .release(&delivered[0].handle, Duration::from_secs(13 * 3600))
        .await
        .expect("a 13-hour release goes out as a fresh copy within range");
    broker
        .extend(&[], Duration::from_secs(30))
        .await
        .expect("an empty heartbeat is fine");
}
