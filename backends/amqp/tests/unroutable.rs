//! A publish RabbitMQ cannot route is an error before anything is sent, so lapin never logs
//! the returned message — headers and body, the task's arguments — at WARN. (Its own binary:
//! the log capture is process-wide.)

mod common;

use std::sync::{Arc, Mutex};

use common::Topology;
use ferriq::broker::BrokerError;
use ferriq::{Client, EnqueueError};
use lapin::options::BasicPublishOptions;
use lapin::{BasicProperties, Connection, ConnectionProperties};
use tracing_subscriber::layer::{Context, SubscriberExt};
use tracing_subscriber::Layer;

#[ferriq::task(name = "unroutable.secret")]
async fn secret(card_number: String) -> String {
    card_number
}

/// The targets of every event logged in this process.
#[derive(Clone, Default)]
struct Targets(Arc<Mutex<Vec<String>>>);

impl<S: tracing::Subscriber> Layer<S> for Targets {
    fn on_event(&self, event: &tracing::Event<'_>, _: Context<'_, S>) {
        self.0
            .lock()
            .unwrap()
            .push(event.metadata().target().to_owned());
    }
}

impl Targets {
    fn returned_messages_logged(&self) -> usize {
        let seen = self.0.lock().unwrap();
        seen.iter()
            .filter(|t| t.starts_with("lapin::returned_messages"))
            .count()
    }
}

#[tokio::test]
async fn an_unroutable_task_is_refused_before_it_is_sent_and_its_body_never_logged() {
    let seen = Targets::default();
    tracing::subscriber::set_global_default(tracing_subscriber::registry().with(seen.clone()))
        .unwrap();
    let topology = Topology::new();
    let store = Arc::new(common::store(&topology.queue.replace('.', "_")).await);
    let client = Client::new(Arc::new(topology.broker().await), store);
    let lane = common::unique("nobody-declared");

    let err = client
        .enqueue(secret::call("4111 1111 1111 1111".into()).with_queue(lane.as_str()))
        .await
        .unwrap_err();
    assert!(
        matches!(
            &err,
            EnqueueError::Broker(BrokerError::Rejected(why))
                if why.contains(&lane) && why.contains("FERRIQ_QUEUES")
        ),
        "the error names the lane and what declares it: {err:?}"
    );
    assert_eq!(seen.returned_messages_logged(), 0);

    // A lane another process declared (a Python-only lane, say) is checked once, then sent to.
    let other = Topology::new();
    let _declares_it = other
        .builder(&common::amqp_url())
        .exchange(topology.exchange.as_str())
        .connect()
        .await
        .unwrap();
    client
        .enqueue(secret::call("4111".into()).with_queue(other.queue.as_str()))
        .await
        .unwrap();
    assert_eq!(seen.returned_messages_logged(), 0);

    // The capture does see lapin's log: a raw mandatory publish to a missing queue is
    // returned, and lapin logs it (what ferriq's check keeps from happening).
    let conn = Connection::connect(&common::amqp_url(), ConnectionProperties::default())
        .await
        .unwrap();
    let channel = conn.create_channel().await.unwrap();
    channel.confirm_select(Default::default()).await.unwrap();
    let confirm = channel
        .basic_publish(
            "".into(),
            lane.as_str().into(),
            BasicPublishOptions {
                mandatory: true,
                ..Default::default()
            },
            b"{}",
            BasicProperties::default(),
        )
        .await
        .unwrap()
        .await
        .unwrap();
    assert!(confirm.take_message().is_some(), "returned as unroutable");
    assert_eq!(seen.returned_messages_logged(), 1);
    let _ = conn.close(200, "".into()).await;
}
