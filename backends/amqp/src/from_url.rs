//! `amqp://` and `amqps://` for [`ferriq::connect`]: a worker or client built from
//! `FERRIQ_BROKER_URL` connects through here.
//!
//! Settings read: `FERRIQ_QUEUES` (lanes, comma-separated; the first is the default),
//! `FERRIQ_AMQP_EXCHANGE` (default `taskiq`), `FERRIQ_AMQP_PREFETCH` (default: the worker's
//! concurrency), `FERRIQ_AMQP_PUBLISHER_CHANNELS` (1 to 64, default 32: see
//! [`AmqpBrokerBuilder::publisher_channels`](crate::AmqpBrokerBuilder::publisher_channels)), `FERRIQ_AMQP_PUBLISH_TO_LANES_DIRECTLY` (on or off as `FERRIQ_SCHEDULER`, default off:
//! see [`AmqpBrokerBuilder::publish_to_lanes_directly`](crate::AmqpBrokerBuilder::publish_to_lanes_directly)).

use std::sync::Arc;

use ferriq::broker::Broker;
use ferriq::connect::{BrokerConnector, ConnectError, ConnectFuture, ConnectOptions};

use crate::AmqpBroker;

fn connect(options: ConnectOptions) -> ConnectFuture<Arc<dyn Broker>> {
    Box::pin(async move {
        let mut builder = AmqpBroker::builder(options.url.clone());
        if let Some(queues) = options.queues() {
            builder = builder.queues(queues);
        }
        if let Some(exchange) = options.setting("FERRIQ_AMQP_EXCHANGE") {
            builder = builder.exchange(exchange);
        }
        if let Some(on) = options.flag("FERRIQ_AMQP_PUBLISH_TO_LANES_DIRECTLY")? {
            builder = builder.publish_to_lanes_directly(on);
        }
        if let Some(channels) = options.setting("FERRIQ_AMQP_PUBLISHER_CHANNELS") {
            let n = channels
                .parse::<usize>()
                .ok()
                .filter(|n| crate::config::PUBLISHER_CHANNELS.contains(n))
                .ok_or_else(|| {
                    ConnectError::Backend(format!(
                        "FERRIQ_AMQP_PUBLISHER_CHANNELS={channels:?} is invalid: expected 1 to 64"
                    ))
                })?;
            builder = builder.publisher_channels(n);
        }
        if let Some(prefetch) = options.setting("FERRIQ_AMQP_PREFETCH") {
            let n = prefetch.parse::<u16>().map_err(|_| {
                ConnectError::Backend(format!(
                    "FERRIQ_AMQP_PREFETCH={prefetch:?} is invalid: expected 1 to 65535"
                ))
            })?;
            builder = builder.prefetch(n);
        }
        let broker = builder
            .connect()
            .await
            .map_err(|e| ConnectError::Backend(e.to_string()))?;
        Ok(Arc::new(broker) as Arc<dyn Broker>)
    })
}

ferriq::inventory::submit!(BrokerConnector {
    schemes: &["amqp", "amqps"],
    connect,
});
