//! Least privilege on RabbitMQ: a worker and a client connected as a user whose configure,
//! write and read permissions match only their exchange and lanes (with the lanes' dead-letter
//! and delay queues) run tasks end to end — one delayed, one parked as a dead letter — and a
//! user missing a permission gets a clear error, not a hang. On a private node.

mod common;

use std::sync::Arc;
use std::time::Duration;

use ferriq::{Client, TaskError};
use ferriq_amqp::AmqpBroker;
use ferriq_testkit::rabbitmq::PrivateNode;
use ferriq_valkey::ValkeyStore;

/// The permissions the README's Security section documents: `(configure, write, read)`.
fn permissions(exchange: &str, lanes: &[&str]) -> (String, String, String) {
    let names = std::iter::once(exchange)
        .chain(lanes.iter().copied())
        .map(|n| n.replace('.', "\\."))
        .collect::<Vec<_>>()
        .join("|");
    let own = format!("^({names})(\\.dead_letter|\\.delay\\..+)?$");
    let write = format!("^(amq\\.default|({names})(\\.dead_letter|\\.delay\\..+)?)$");
    (own.clone(), write, own)
}

#[ferriq::task(name = "amqp.perm.add")]
async fn add(a: i64, b: i64) -> i64 {
    a + b
}

#[ferriq::task(name = "amqp.perm.refuse", max_attempts = 1)]
async fn refuse() -> Result<(), TaskError> {
    Err(TaskError::retryable("no"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_user_with_only_its_lanes_permissions_runs_everything_and_one_without_is_refused() {
    let node = PrivateNode::start().await;
    let (exchange, lane) = ("billing", "billing.tasks");
    let (configure, write, read) = permissions(exchange, &[lane]);
    node.ctl(&["add_user", "ferriq", "s3cret"]);
    node.ctl(&[
        "set_permissions",
        "-p",
        "/",
        "ferriq",
        &configure,
        &write,
        &read,
    ]);
    let url = node.plain_url("ferriq", "s3cret");
    let connect = || {
        AmqpBroker::builder(url.as_str())
            .exchange(exchange)
            .queues([lane])
            .connect()
    };
    let store = Arc::new(
        ValkeyStore::builder(common::redis_url())
            .prefix(common::unique("p").replace('.', "-"))
            .connect()
            .await
            .unwrap(),
    );
    let worker = ferriq::testing::RunningWorker::spawn(
        ferriq::Worker::builder()
            .broker(Arc::new(connect().await.expect("the worker connects")))
            .store(store.clone())
            .registry(
                ferriq::Registry::from_inventory()
                    .unwrap()
                    .only(&[add::NAME, refuse::NAME])
                    .unwrap(),
            )
            .build()
            .unwrap(),
    );
    let client = Client::new(
        Arc::new(connect().await.expect("the client connects")),
        store,
    );
    let now = add::kiq(&client, 2, 3).await.unwrap();
    let later = client
        .enqueue(add::call(1, 1).with_delay(Duration::from_secs(1)))
        .await
        .unwrap();
    let parked = refuse::kiq(&client).await.unwrap();
    assert_eq!(now.wait(Duration::from_secs(30)).await.unwrap(), 5);
    assert_eq!(later.wait(Duration::from_secs(30)).await.unwrap(), 2);
    assert!(parked.wait(Duration::from_secs(30)).await.is_err());
    let dead = client.ops().dead_letters(lane, 0, 10).await.unwrap();
    assert_eq!(dead.len(), 1);
    worker.stop().await;

    // Without write permission on its exchange: refused at once, saying so.
    node.ctl(&["add_user", "reader", "s3cret"]);
    node.ctl(&[
        "set_permissions",
        "-p",
        "/",
        "reader",
        &configure,
        "^$",
        &read,
    ]);
    let started = std::time::Instant::now();
    let refused = AmqpBroker::builder(node.plain_url("reader", "s3cret").as_str())
        .exchange(exchange)
        .queues([lane])
        .connect_timeout(Duration::from_secs(5))
        .connect()
        .await;
    let text = match refused {
        Err(e) => e.to_string(),
        Ok(broker) => {
            use ferriq::broker::{Broker, OutgoingMessage};
            let msg = add::call(1, 2).into_message().unwrap();
            let out = OutgoingMessage::from_message(&msg).unwrap();
            broker.publish(vec![out]).await.unwrap_err().to_string()
        }
    };
    assert!(started.elapsed() < Duration::from_secs(15), "it hung");
    assert!(
        text.contains("ACCESS_REFUSED") && text.contains("permission"),
        "{text}"
    );
    assert!(!text.contains("s3cret"), "{text}");
}
