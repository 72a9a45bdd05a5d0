//! `amqp://` and `amqps://` for [`ferriq::connect`]: a worker or client built from
//! `FERRIQ_BROKER_URL` connects through here.
//!
//! Settings read: `FERRIQ_QUEUES` (lanes, comma-separated; the first is the default),
//! `FERRIQ_AMQP_EXCHANGE` (default `taskiq`), `FERRIQ_AMQP_PREFETCH` (default: the worker's
//! concurrency), `FERRIQ_AMQP_PUBLISHER_CHANNELS` (1 to 64, default 32: see
//! [`AmqpBrokerBuilder::publisher_channels`](crate::AmqpBrokerBuilder::publisher_channels)),
//! `FERRIQ_AMQP_PUBLISH_TO_LANES_DIRECTLY` (on or off as `FERRIQ_SCHEDULER`, default off: see
//! [`AmqpBrokerBuilder::publish_to_lanes_directly`](crate::AmqpBrokerBuilder::publish_to_lanes_directly)),
//! `FERRIQ_AMQP_DELIVERY_LIMIT` (the lanes' `x-delivery-limit`, 1 or more, default none: see
//! [`AmqpBrokerBuilder::delivery_limit`](crate::AmqpBrokerBuilder::delivery_limit); every
//! process declaring a lane must use the same value, or RabbitMQ refuses the declare),
//! `FERRIQ_AMQP_DECLARE_TOPOLOGY` (on or off, default on: see
//! [`AmqpBrokerBuilder::declare_topology`](crate::AmqpBrokerBuilder::declare_topology)),
//! `FERRIQ_BROKER_TLS_CA` (a PEM file of CAs to trust besides the system's),
//! `FERRIQ_BROKER_TLS_CERT` and `FERRIQ_BROKER_TLS_KEY` (a client certificate and its key, for
//! mTLS).

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
        if let Some(ca) = options.setting("FERRIQ_BROKER_TLS_CA") {
            builder = builder.tls_ca_file(ca);
        }
        match (
            options.setting("FERRIQ_BROKER_TLS_CERT"),
            options.setting("FERRIQ_BROKER_TLS_KEY"),
        ) {
            (Some(cert), Some(key)) => builder = builder.tls_client_cert(cert, key),
            (None, None) => {}
            _ => {
                return Err(ConnectError::Backend(
                    "FERRIQ_BROKER_TLS_CERT and FERRIQ_BROKER_TLS_KEY go together: set both (the client certificate and its key) or neither".into(),
                ))
            }
        }
        if let Some(on) = options.flag("FERRIQ_AMQP_DECLARE_TOPOLOGY")? {
            builder = builder.declare_topology(on);
        }
        if let Some(limit) = options.setting("FERRIQ_AMQP_DELIVERY_LIMIT") {
            builder = builder.delivery_limit(Some(delivery_limit(limit)?));
        }
        let broker = builder.connect().await.map_err(connect_error)?;
        Ok(Arc::new(broker) as Arc<dyn Broker>)
    })
}

/// An exchange or lane that is not on the broker is `NotFound` (the `ferriq` command exits 3
/// for it); the rest are the backend's.
fn connect_error(e: crate::AmqpError) -> ConnectError {
    match e {
        crate::AmqpError::NotDeclared { .. } => ConnectError::NotFound(e.to_string()),
        e => ConnectError::Backend(e.to_string()),
    }
}

/// The lanes' `x-delivery-limit` from its setting.
fn delivery_limit(setting: &str) -> Result<u32, ConnectError> {
    setting
        .trim()
        .parse::<u32>()
        .ok()
        .filter(|n| *n >= 1)
        .ok_or_else(|| {
            ConnectError::Backend(format!(
                "FERRIQ_AMQP_DELIVERY_LIMIT={setting:?} is invalid: expected a whole number of \
                 deliveries, 1 or more (unset it for no limit)"
            ))
        })
}

ferriq::inventory::submit!(BrokerConnector {
    schemes: &["amqp", "amqps"],
    connect,
});

#[cfg(test)]
mod tests {
    use super::{connect_error, delivery_limit, ConnectError};

    #[test]
    fn a_lane_not_on_the_broker_is_not_found_and_other_errors_are_the_backends() {
        let missing = crate::AmqpError::NotDeclared {
            url: "amqp://rabbit:5672/".into(),
            reason: "lane \"jobs\" is not on the broker".into(),
        };
        assert!(matches!(connect_error(missing), ConnectError::NotFound(m) if m.contains("jobs")));
        let refused = crate::AmqpError::Connect {
            url: "amqp://rabbit:5672/".into(),
            reason: "connection refused".into(),
        };
        assert!(matches!(connect_error(refused), ConnectError::Backend(_)));
    }

    #[test]
    fn a_delivery_limit_is_a_positive_whole_number() {
        assert_eq!(delivery_limit("50").unwrap(), 50);
        assert_eq!(delivery_limit(" 7 ").unwrap(), 7);
        for bad in ["0", "-1", "ten", "", "1.5"] {
            let e = delivery_limit(bad).unwrap_err().to_string();
            assert!(e.contains("FERRIQ_AMQP_DELIVERY_LIMIT"), "{e}");
        }
    }
}
