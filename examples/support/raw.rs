//! The raw brokers' own figures, measured beside ferriq's in the same run: the same messages
//! and durability with nothing of ferriq in the way.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ferriq::broker::{Broker, OutgoingMessage};
use ferriq::memory::MemoryBroker;
use ferriq::wire::TaskMessage;
use futures_util::StreamExt;

use crate::amqp_url;

/// A connection to the test RabbitMQ.
async fn connect() -> lapin::Connection {
    lapin::Connection::connect(&amqp_url(), lapin::ConnectionProperties::default())
        .await
        .unwrap()
}

/// A connection to the test RabbitMQ and a channel on it, with `queue` declared as a durable
/// quorum queue.
async fn quorum_queue(queue: &str) -> (lapin::Connection, lapin::Channel) {
    use lapin::options::QueueDeclareOptions;
    use lapin::types::{AMQPValue, FieldTable};
    let conn = connect().await;
    let ch = conn.create_channel().await.unwrap();
    let mut args = FieldTable::default();
    args.insert(
        "x-queue-type".into(),
        AMQPValue::LongString("quorum".into()),
    );
    ch.queue_declare(queue.into(), QueueDeclareOptions::durable(), args)
        .await
        .unwrap();
    (conn, ch)
}

/// A fresh quorum queue, a confirm-mode publishing channel and a consumer on it (`prefetch`, 0
/// for unlimited), on one connection: what the raw lapin benchmarks share.
struct RawRig {
    conn: lapin::Connection,
    ch: lapin::Channel,
    consumer: lapin::Consumer,
}

impl RawRig {
    async fn open(queue: &str, prefetch: u16) -> Self {
        Self::open_on(queue, prefetch, None).await
    }

    /// As [`RawRig::open`], with the consumer on `consumer_conn` when given.
    async fn open_on(
        queue: &str,
        prefetch: u16,
        consumer_conn: Option<&lapin::Connection>,
    ) -> Self {
        use lapin::options::{BasicConsumeOptions, BasicQosOptions, ConfirmSelectOptions};
        use lapin::types::FieldTable;
        let (conn, ch) = quorum_queue(queue).await;
        let consumer_ch = consumer_conn
            .unwrap_or(&conn)
            .create_channel()
            .await
            .unwrap();
        consumer_ch
            .basic_qos(prefetch, BasicQosOptions::default())
            .await
            .unwrap();
        let consumer = consumer_ch
            .basic_consume(
                queue.into(),
                "raw".into(),
                BasicConsumeOptions::default(),
                FieldTable::default(),
            )
            .await
            .unwrap();
        ch.confirm_select(ConfirmSelectOptions::default())
            .await
            .unwrap();
        RawRig { conn, ch, consumer }
    }
}

/// Deletes the benchmark's queue and closes its connection.
async fn remove(conn: lapin::Connection, ch: lapin::Channel, queue: &str) {
    let _ = ch
        .queue_delete(queue.into(), lapin::options::QueueDeleteOptions::default())
        .await;
    let _ = conn.close(200, "".into()).await;
}

/// Raw lapin: persistent messages, confirms in batches of 1000, a prefetch-64 consumer acking
/// each, on a quorum queue; publisher and consumer at once. Messages per second end to end.
pub async fn raw_lapin(queue: &str, n: u64, prefetch: u16) -> f64 {
    use lapin::options::{BasicAckOptions, BasicPublishOptions};
    use lapin::BasicProperties;
    let RawRig {
        conn,
        ch,
        mut consumer,
    } = RawRig::open(queue, prefetch).await;
    let body = TaskMessage::new("bench.noop").to_json().unwrap();
    let start = Instant::now();
    let consumed = tokio::spawn(async move {
        let mut got = 0;
        while got < n {
            let d = consumer.next().await.unwrap().unwrap();
            d.ack(BasicAckOptions::default()).await.unwrap();
            got += 1;
        }
    });
    let props = BasicProperties::default().with_delivery_mode(2);
    for _ in 0..n.div_ceil(1000) {
        let mut confirms = Vec::with_capacity(1000);
        for _ in 0..1000 {
            confirms.push(
                ch.basic_publish(
                    "".into(),
                    queue.into(),
                    BasicPublishOptions::default(),
                    &body,
                    props.clone(),
                )
                .await
                .unwrap(),
            );
        }
        for c in confirms {
            assert!(c.await.unwrap().is_ack());
        }
    }
    consumed.await.unwrap();
    let rate = n as f64 / start.elapsed().as_secs_f64();
    remove(conn, ch, queue).await;
    rate
}

/// Raw lapin as [`raw_lapin`], written for throughput: each batch of 1000 publishes handed to
/// lapin at once (`join_all`) rather than one awaited after another, and acks not awaited one
/// by one (the consumer keeps taking deliveries while earlier acks are in flight).
///
/// With `store_floor`, each delivery first writes the two keys any exactly-once result needs
/// (a claim and a result, bare `SET NX PX`, one after the other, as the Valkey bench's floor)
/// and is acked after them: the least store work a task queue with results can do, beside the
/// broker's. The keys are deleted afterwards.
pub async fn raw_lapin_pipelined(
    queue: &str,
    n: u64,
    prefetch: u16,
    store_floor: Option<&fred::clients::Pool>,
) -> f64 {
    use lapin::options::{BasicAckOptions, BasicPublishOptions};
    use lapin::BasicProperties;
    let RawRig { conn, ch, consumer } = RawRig::open(queue, prefetch).await;
    let body = TaskMessage::new("bench.noop").to_json().unwrap();
    let pool = store_floor.cloned();
    let prefix = format!("fqbench:floor:{queue}");
    let start = Instant::now();
    let consumed = {
        let (pool, prefix) = (pool.clone(), prefix.clone());
        let deliveries = consumer.map(|d| d.unwrap());
        tokio::spawn(consume_pipelined(n, deliveries, move |d, i| {
            let (pool, prefix) = (pool.clone(), prefix.clone());
            async move {
                if let Some(pool) = pool {
                    floor_writes(&pool, &prefix, i).await;
                }
                d.ack(BasicAckOptions::default()).await.unwrap();
            }
        }))
    };
    let props = BasicProperties::default().with_delivery_mode(2);
    for _ in 0..n.div_ceil(1000) {
        let publishes = (0..1000).map(|_| {
            ch.basic_publish(
                "".into(),
                queue.into(),
                BasicPublishOptions::default(),
                &body,
                props.clone(),
            )
        });
        for c in futures_util::future::join_all(publishes).await {
            assert!(c.unwrap().await.unwrap().is_ack());
        }
    }
    consumed.await.unwrap();
    let rate = n as f64 / start.elapsed().as_secs_f64();
    if let Some(pool) = &pool {
        delete_floor_keys(pool, &prefix, n).await;
    }
    remove(conn, ch, queue).await;
    rate
}

/// Takes `n` deliveries, handling each (`handle(delivery, its number)`: the floor's writes,
/// then the ack) while the next ones come in, and returns once every one is handled: the
/// consumer of the pipelined baselines, whatever the client.
pub(crate) async fn consume_pipelined<D, Fut>(
    n: u64,
    mut deliveries: impl futures_util::Stream<Item = D> + Unpin,
    handle: impl Fn(D, u64) -> Fut,
) where
    Fut: std::future::Future<Output = ()>,
{
    let (mut got, mut handled) = (0, futures_util::stream::FuturesUnordered::new());
    while got < n || !handled.is_empty() {
        tokio::select! {
            Some(d) = deliveries.next(), if got < n => {
                handled.push(handle(d, got));
                got += 1;
            }
            Some(()) = handled.next(), if !handled.is_empty() => {}
        }
    }
}

/// The two keys of task `i`: a claim record and a result, each `SET NX PX` (values shaped as
/// ferriq's).
pub(crate) async fn floor_writes(pool: &fred::clients::Pool, prefix: &str, i: u64) {
    use fred::prelude::{Expiration, KeysInterface, SetOptions};
    for (kind, value) in [
        ("c", "r 1764430000000000 1764430030000000 0 0 0 bench"),
        (
            "r",
            r#"{"is_err":false,"log":null,"return_value":1,"execution_time":0.0,"labels":{},"error":null}"#,
        ),
    ] {
        let _: Option<String> = pool
            .set(
                format!("{prefix}:{kind}:{i}"),
                value,
                Some(Expiration::PX(120_000)),
                Some(SetOptions::NX),
                false,
            )
            .await
            .expect("floor SET");
    }
}

pub(crate) async fn delete_floor_keys(pool: &fred::clients::Pool, prefix: &str, n: u64) {
    use fred::prelude::KeysInterface;
    let keys: Vec<String> = (0..n)
        .flat_map(|i| [format!("{prefix}:c:{i}"), format!("{prefix}:r:{i}")])
        .collect();
    for chunk in keys.chunks(1000) {
        let _: i64 = pool.del(chunk.to_vec()).await.unwrap_or(0);
    }
}

/// Raw lapin round trips on a fresh quorum queue: `n` times, one persistent message published
/// and its confirm awaited, then its delivery awaited and acked. Milliseconds, sorted: the
/// broker's share of a task's round trip, with no store. `apart`: the consumer on a connection
/// of its own, as a producer and a worker are (RabbitMQ takes longer to hand a message from
/// one connection to another than within one).
pub async fn raw_lapin_round_trips(queue: &str, n: usize, apart: bool) -> Vec<f64> {
    use lapin::options::{BasicAckOptions, BasicPublishOptions};
    use lapin::BasicProperties;
    let consumer_conn = if apart { Some(connect().await) } else { None };
    // Prefetch 0: unlimited (one message is in flight at a time anyway).
    let RawRig {
        conn,
        ch,
        mut consumer,
    } = RawRig::open_on(queue, 0, consumer_conn.as_ref()).await;
    let body = TaskMessage::new("bench.noop").to_json().unwrap();
    let props = BasicProperties::default().with_delivery_mode(2);
    let mut lat = Vec::with_capacity(n);
    for _ in 0..n {
        let t = Instant::now();
        let confirm = ch
            .basic_publish(
                "".into(),
                queue.into(),
                BasicPublishOptions::default(),
                &body,
                props.clone(),
            )
            .await
            .unwrap();
        assert!(confirm.await.unwrap().is_ack());
        let d = consumer.next().await.unwrap().unwrap();
        d.ack(BasicAckOptions::default()).await.unwrap();
        lat.push(t.elapsed().as_secs_f64() * 1e3);
    }
    lat.sort_by(|a, b| a.total_cmp(b));
    remove(conn, ch, queue).await;
    if let Some(c) = consumer_conn {
        let _ = c.close(200, "".into()).await;
    }
    lat
}

/// Raw lapin under open-loop load on a fresh quorum queue: `rate` persistent messages a second
/// for `secs`, each published and its confirm awaited by a task of its own when due (on one
/// confirm-mode channel), while a prefetch-64 consumer on a connection of its own (as a
/// worker's is) acks each. Each body is the size of a task's message. Milliseconds from when
/// each message was due to its ack, sorted: the broker's share of `bench_e2e --steady`.
pub async fn raw_lapin_steady(queue: &str, rate: f64, secs: u64) -> Vec<f64> {
    use lapin::options::{BasicAckOptions, BasicPublishOptions};
    use lapin::BasicProperties;
    let consumer_conn = connect().await;
    let RawRig {
        conn,
        ch,
        mut consumer,
    } = RawRig::open_on(queue, 64, Some(&consumer_conn)).await;
    // The message's index (when it was due), then a task's message as padding.
    let padding = String::from_utf8(TaskMessage::new("bench.noop").to_json().unwrap()).unwrap();
    let total = (rate * secs as f64) as u64;
    let period = Duration::from_secs_f64(1.0 / rate);
    let start = Instant::now();
    let acker = tokio::spawn(async move {
        let mut lat = Vec::with_capacity(total as usize);
        while (lat.len() as u64) < total {
            let Some(Ok(d)) = consumer.next().await else {
                break;
            };
            // The body starts with the message's index: when it was due.
            let due = std::str::from_utf8(&d.data)
                .ok()
                .and_then(|s| s.split(' ').next()?.parse::<f64>().ok())
                .map(|i| start + period.mul_f64(i));
            d.ack(BasicAckOptions::default()).await.unwrap();
            if let Some(due) = due {
                lat.push(due.elapsed().as_secs_f64() * 1e3);
            }
        }
        lat
    });
    let props = BasicProperties::default().with_delivery_mode(2);
    let mut publishes = tokio::task::JoinSet::new();
    for i in 0..total {
        tokio::time::sleep_until((start + period.mul_f64(i as f64)).into()).await;
        let (ch, props, queue) = (ch.clone(), props.clone(), queue.to_owned());
        let body = format!("{i} {padding}");
        publishes.spawn(async move {
            let confirm = ch
                .basic_publish(
                    "".into(),
                    queue.as_str().into(),
                    BasicPublishOptions::default(),
                    body.as_bytes(),
                    props,
                )
                .await
                .unwrap();
            assert!(confirm.await.unwrap().is_ack());
        });
        while publishes.try_join_next().is_some() {}
    }
    while publishes.join_next().await.is_some() {}
    let mut lat = acker.await.unwrap();
    lat.sort_by(|a, b| a.total_cmp(b));
    remove(conn, ch, queue).await;
    let _ = consumer_conn.close(200, "".into()).await;
    lat
}

/// The same for the memory broker: publish in batches, receive and ack.
pub async fn raw_memory(n: u64, batch: usize) -> f64 {
    let broker = MemoryBroker::new();
    let msg = OutgoingMessage::from_message(&TaskMessage::new("bench.noop")).unwrap();
    let start = Instant::now();
    let consumer = {
        let broker = broker.clone();
        tokio::spawn(async move {
            let mut got = 0;
            while got < n {
                for d in broker.receive(batch, Duration::from_secs(1)).await.unwrap() {
                    broker.ack(&d.handle).await.unwrap();
                    got += 1;
                }
            }
        })
    };
    for _ in 0..n.div_ceil(1000) {
        broker.publish(vec![msg.clone(); 1000]).await.unwrap();
    }
    consumer.await.unwrap();
    n as f64 / start.elapsed().as_secs_f64()
}

/// Raw aws-sdk-sqs on `queue_url`: 8 senders in batches of 10 while 4 long pollers receive
/// up to 10 at a time and delete each batch with `DeleteMessageBatch`. Messages per second
/// from the first send to the last delete.
pub async fn raw_sqs(client: &aws_sdk_sqs::Client, queue_url: &str, n: u64) -> f64 {
    use aws_sdk_sqs::types::{DeleteMessageBatchRequestEntry, SendMessageBatchRequestEntry};
    let body = String::from_utf8(TaskMessage::new("bench.noop").to_json().unwrap()).unwrap();
    let received = Arc::new(AtomicU64::new(0));
    let start = Instant::now();
    let receivers: Vec<_> = (0..4)
        .map(|_| {
            let (client, url, received) = (client.clone(), queue_url.to_owned(), received.clone());
            tokio::spawn(async move {
                while received.load(Ordering::SeqCst) < n {
                    let out = client
                        .receive_message()
                        .queue_url(&url)
                        .max_number_of_messages(10)
                        .wait_time_seconds(1)
                        .send()
                        .await
                        .expect("receive");
                    let messages = out.messages.unwrap_or_default();
                    if messages.is_empty() {
                        continue;
                    }
                    let mut delete = client.delete_message_batch().queue_url(&url);
                    for (i, m) in messages.iter().enumerate() {
                        delete = delete.entries(
                            DeleteMessageBatchRequestEntry::builder()
                                .id(i.to_string())
                                .receipt_handle(m.receipt_handle().unwrap_or_default())
                                .build()
                                .unwrap(),
                        );
                    }
                    delete.send().await.expect("delete");
                    received.fetch_add(messages.len() as u64, Ordering::SeqCst);
                }
            })
        })
        .collect();
    let batches: Vec<u64> = (0..n.div_ceil(10)).collect();
    futures_util::stream::iter(batches)
        .for_each_concurrent(8, |b| {
            let (client, body) = (client.clone(), body.clone());
            async move {
                let count = (n - b * 10).min(10);
                let mut send = client.send_message_batch().queue_url(queue_url);
                for i in 0..count {
                    send = send.entries(
                        SendMessageBatchRequestEntry::builder()
                            .id(i.to_string())
                            .message_body(body.as_str())
                            .build()
                            .unwrap(),
                    );
                }
                send.send().await.expect("send");
            }
        })
        .await;
    for r in receivers {
        r.await.unwrap();
    }
    n as f64 / start.elapsed().as_secs_f64()
}
