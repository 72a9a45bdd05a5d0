//! Raw RabbitMQ through amqprs, an AMQP client that reads and writes its socket on tasks of
//! the application's tokio runtime (lapin does it on a thread of its own): the same workload as
//! the raw lapin baselines, to show what the client's threading costs per message.

use std::sync::Arc;
use std::time::Instant;

use amqprs::callbacks::ChannelCallback;
use amqprs::channel::{
    BasicAckArguments, BasicConsumeArguments, BasicPublishArguments, BasicQosArguments, Channel,
    ConfirmSelectArguments, ConsumerMessage, QueueDeclareArguments, QueueDeleteArguments,
};
use amqprs::connection::{Connection, OpenConnectionArguments};
use amqprs::{Ack, BasicProperties, Cancel, CloseChannel, FieldTable, Nack, Return};
use ferriq::wire::TaskMessage;
use tokio::sync::{mpsc, watch};

use crate::amqp_url;

/// `amqp://user:password@host:port/vhost` as amqprs's arguments (its own URI parser needs a
/// feature this bench does not build).
fn arguments(url: &str) -> OpenConnectionArguments {
    let rest = url.strip_prefix("amqp://").expect("an amqp:// URL");
    let (auth, rest) = rest.split_once('@').unwrap_or(("guest:guest", rest));
    let (user, password) = auth.split_once(':').unwrap_or((auth, ""));
    let rest = rest.split_once('?').map_or(rest, |(before, _)| before);
    let (authority, vhost) = rest.split_once('/').unwrap_or((rest, ""));
    let (host, port) = authority.split_once(':').unwrap_or((authority, "5672"));
    let vhost = match vhost {
        "" | "%2f" | "%2F" => "/".to_owned(),
        v => v.replace("%2f", "/").replace("%2F", "/"),
    };
    OpenConnectionArguments::new(host, port.parse().expect("a port"), user, password)
        .virtual_host(&vhost)
        .finish()
}

async fn connect() -> Connection {
    Connection::open(&arguments(&amqp_url())).await.unwrap()
}

/// Publisher confirms, as amqprs reports them (to a callback): the highest delivery tag
/// confirmed so far, every tag up to it acked.
struct Confirms(watch::Sender<u64>);

#[async_trait::async_trait]
impl ChannelCallback for Confirms {
    async fn close(&mut self, _: &Channel, _: CloseChannel) -> Result<(), amqprs::error::Error> {
        Ok(())
    }
    async fn cancel(&mut self, _: &Channel, _: Cancel) -> Result<(), amqprs::error::Error> {
        Ok(())
    }
    async fn flow(&mut self, _: &Channel, active: bool) -> Result<bool, amqprs::error::Error> {
        Ok(active)
    }
    async fn publish_ack(&mut self, _: &Channel, ack: Ack) {
        // RabbitMQ confirms one queue's publishes in order, singly or `multiple` up to a tag:
        // the highest tag seen is how far they are confirmed (never moved back by a late one).
        let tag = ack.delivery_tag();
        self.0.send_if_modified(|highest| {
            let higher = tag > *highest;
            if higher {
                *highest = tag;
            }
            higher
        });
    }
    async fn publish_nack(&mut self, _: &Channel, nack: Nack) {
        panic!("RabbitMQ refused message {}", nack.delivery_tag());
    }
    async fn publish_return(&mut self, _: &Channel, _: Return, _: BasicProperties, _: Vec<u8>) {}
}

/// A fresh durable quorum queue, a confirm-mode publishing channel and a consumer with
/// `prefetch` on it: the consumer on a connection of its own when `apart`.
struct Rig {
    conns: Vec<Connection>,
    ch: Channel,
    confirmed: watch::Receiver<u64>,
    consumer_ch: Channel,
    deliveries: mpsc::UnboundedReceiver<ConsumerMessage>,
}

impl Rig {
    async fn open(queue: &str, prefetch: u16, apart: bool) -> Rig {
        let conn = connect().await;
        let ch = conn.open_channel(None).await.unwrap();
        let mut args = FieldTable::new();
        args.insert("x-queue-type".try_into().unwrap(), "quorum".into());
        ch.queue_declare(
            QueueDeclareArguments::durable_client_named(queue)
                .arguments(args)
                .finish(),
        )
        .await
        .unwrap();
        let (confirms, confirmed) = watch::channel(0);
        ch.register_callback(Confirms(confirms)).await.unwrap();
        ch.confirm_select(ConfirmSelectArguments::default())
            .await
            .unwrap();
        let mut conns = vec![conn];
        if apart {
            conns.push(connect().await);
        }
        let consumer_ch = conns.last().unwrap().open_channel(None).await.unwrap();
        consumer_ch
            .basic_qos(BasicQosArguments::new(0, prefetch, false))
            .await
            .unwrap();
        let (_, deliveries) = consumer_ch
            .basic_consume_rx(BasicConsumeArguments::new(queue, "raw-amqprs").finish())
            .await
            .unwrap();
        Rig {
            conns,
            ch,
            confirmed,
            consumer_ch,
            deliveries,
        }
    }

    /// Deletes the queue and closes the connections.
    async fn remove(self, queue: &str) {
        let _ = self.ch.queue_delete(QueueDeleteArguments::new(queue)).await;
        let _ = self.consumer_ch.close().await;
        let _ = self.ch.close().await;
        for conn in self.conns {
            let _ = conn.close().await;
        }
    }
}

/// Acks a delivery. amqprs returns once the ack is queued for its writer task, where lapin's
/// `ack().await` returns once its I/O thread has written it: a round trip timed here stops
/// that much earlier than raw lapin's.
async fn ack(ch: &Channel, delivery: &ConsumerMessage) {
    let tag = delivery.deliver.as_ref().unwrap().delivery_tag();
    ch.basic_ack(BasicAckArguments::new(tag, false))
        .await
        .unwrap();
}

/// Raw amqprs, the workload of `raw_lapin_pipelined`: persistent messages confirmed in
/// batches of 1000, a consumer with `prefetch` acking each (acks not awaited one by one), on a
/// quorum queue; publisher and consumer at once, on one connection. With `store_floor`, each
/// delivery first writes the floor's two keys, as `raw_lapin_pipelined` does. Messages per
/// second end to end.
pub async fn raw_amqprs(
    queue: &str,
    n: u64,
    prefetch: u16,
    store_floor: Option<&fred::clients::Pool>,
) -> f64 {
    let mut rig = Rig::open(queue, prefetch, false).await;
    let body = TaskMessage::new("bench.noop").to_json().unwrap();
    let pool = store_floor.cloned();
    let prefix = format!("fqbench:floor:{queue}");
    let start = Instant::now();
    let (consumer_ch, mut deliveries) = (
        Arc::new(rig.consumer_ch.clone()),
        std::mem::replace(&mut rig.deliveries, mpsc::unbounded_channel().1),
    );
    let consumed = {
        let (pool, prefix) = (pool.clone(), prefix.clone());
        let deliveries = futures_util::stream::poll_fn(move |cx| deliveries.poll_recv(cx));
        tokio::spawn(crate::raw::consume_pipelined(n, deliveries, move |d, i| {
            let (pool, prefix, ch) = (pool.clone(), prefix.clone(), Arc::clone(&consumer_ch));
            async move {
                if let Some(pool) = pool {
                    crate::raw::floor_writes(&pool, &prefix, i).await;
                }
                ack(&ch, &d).await;
            }
        }))
    };
    let props = BasicProperties::default().with_persistence(true).finish();
    let publish = BasicPublishArguments::new("", queue);
    let mut sent = 0;
    while sent < n {
        let batch = (n - sent).min(1000);
        for _ in 0..batch {
            rig.ch
                .basic_publish(props.clone(), body.clone(), publish.clone())
                .await
                .unwrap();
        }
        sent += batch;
        rig.confirmed.wait_for(|&tag| tag >= sent).await.unwrap();
    }
    consumed.await.unwrap();
    let rate = n as f64 / start.elapsed().as_secs_f64();
    if let Some(pool) = &pool {
        crate::raw::delete_floor_keys(pool, &prefix, n).await;
    }
    rig.remove(queue).await;
    rate
}

/// Raw amqprs round trips, as `raw_lapin_round_trips` with the consumer apart: `n` times,
/// one persistent message published and its confirm awaited, then its delivery awaited and
/// acked, the consumer on a connection of its own. Milliseconds, sorted.
pub async fn raw_amqprs_round_trips(queue: &str, n: usize) -> Vec<f64> {
    let mut rig = Rig::open(queue, 0, true).await;
    let body = TaskMessage::new("bench.noop").to_json().unwrap();
    let props = BasicProperties::default().with_persistence(true).finish();
    let publish = BasicPublishArguments::new("", queue);
    let mut lat = Vec::with_capacity(n);
    for sent in 1..=n as u64 {
        let t = Instant::now();
        rig.ch
            .basic_publish(props.clone(), body.clone(), publish.clone())
            .await
            .unwrap();
        rig.confirmed.wait_for(|&tag| tag >= sent).await.unwrap();
        let d = rig.deliveries.recv().await.unwrap();
        ack(&rig.consumer_ch, &d).await;
        lat.push(t.elapsed().as_secs_f64() * 1e3);
    }
    lat.sort_by(|a, b| a.total_cmp(b));
    rig.remove(queue).await;
    lat
}

#[cfg(test)]
mod tests {
    use super::arguments;

    #[test]
    fn reads_the_test_url() {
        let a = arguments("amqp://guest:secret@127.0.0.1:5673/%2f");
        assert_eq!(
            (a.get_host(), a.get_port(), a.get_virtual_host()),
            ("127.0.0.1", 5673, "/")
        );
        let a = arguments("amqp://u:p@rabbit/tenant");
        assert_eq!((a.get_port(), a.get_virtual_host()), (5672, "tenant"));
        let a = arguments("amqp://u:p@rabbit:5671/tenant?heartbeat=10");
        assert_eq!((a.get_port(), a.get_virtual_host()), (5671, "tenant"));
    }
}
