//! `redis://`, `rediss://`, `valkey://`, `valkeys://` and their `-cluster`/`-sentinel` forms
//! for [`ferriq::connect`]: a worker or client built from `FERRIQ_STORE_URL` connects through
//! here.
//!
//! Settings read: `FERRIQ_RESULT_PREFIX` (key prefix, default `ferriq`; taskiq-redis's
//! `prefix_str`), `FERRIQ_RESULT_TTL_SECS` (default 7 days; `0` keeps results forever).
//! Claims are kept a day longer than results, and at least 15 days. TLS: `FERRIQ_STORE_TLS_CA`
//! (a PEM file of CAs to trust instead of the system's), `FERRIQ_STORE_TLS_CERT` and
//! `FERRIQ_STORE_TLS_KEY` (a client certificate and its key, for mTLS).

use std::sync::Arc;

use ferriq::broker::Broker;
use ferriq::connect::{
    BrokerConnector, ConnectError, ConnectFuture, ConnectOptions, StoreConnector,
};
use ferriq::store::Store;

use crate::ValkeyStore;

fn connect(options: ConnectOptions) -> ConnectFuture<Arc<dyn Store>> {
    Box::pin(async move {
        let mut builder = ValkeyStore::builder(options.url.clone());
        if let Some(prefix) = options.setting("FERRIQ_RESULT_PREFIX") {
            builder = builder.prefix(prefix);
        }
        if let Some(ttl) = options.result_ttl()? {
            builder = builder.result_ttl(ttl);
        }
        if let Some(ca) = options.setting("FERRIQ_STORE_TLS_CA") {
            builder = builder.tls_ca_file(ca);
        }
        match (
            options.setting("FERRIQ_STORE_TLS_CERT"),
            options.setting("FERRIQ_STORE_TLS_KEY"),
        ) {
            (Some(cert), Some(key)) => builder = builder.tls_client_cert(cert, key),
            (None, None) => {}
            _ => {
                return Err(ConnectError::Backend(
                    "FERRIQ_STORE_TLS_CERT and FERRIQ_STORE_TLS_KEY go together: set both (the client certificate and its key) or neither".into(),
                ))
            }
        }
        let store = builder
            .connect()
            .await
            .map_err(|e| ConnectError::Backend(e.to_string()))?;
        Ok(Arc::new(store) as Arc<dyn Store>)
    })
}

/// The schemes of both the store and the Streams broker.
const SCHEMES: &[&str] = &[
    "redis",
    "rediss",
    "valkey",
    "valkeys",
    "redis-cluster",
    "rediss-cluster",
    "valkey-cluster",
    "valkeys-cluster",
    "redis-sentinel",
    "valkey-sentinel",
    "rediss-sentinel",
    "valkeys-sentinel",
];

ferriq::inventory::submit!(StoreConnector {
    schemes: SCHEMES,
    connect,
});

/// The Streams broker from `FERRIQ_BROKER_URL=redis://…`: lanes from `FERRIQ_QUEUES` (default
/// `taskiq`), the consumer group from `FERRIQ_STREAM_GROUP` (default `taskiq`), TLS files
/// from `FERRIQ_BROKER_TLS_CA` / `_CERT` / `_KEY`, and `FERRIQ_BROKER_VOLATILE=1` to accept a
/// server without `appendonly`.
fn connect_broker(options: ConnectOptions) -> ConnectFuture<Arc<dyn Broker>> {
    Box::pin(async move {
        let mut builder = crate::StreamBroker::builder(options.url.clone());
        if let Some(queues) = options.queues() {
            builder = builder.queues(queues);
        }
        if let Some(group) = options.setting("FERRIQ_STREAM_GROUP") {
            builder = builder.group(group);
        }
        if let Some(volatile) = options.flag("FERRIQ_BROKER_VOLATILE")? {
            builder = builder.allow_volatile(volatile);
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
            _ => return Err(ConnectError::Backend(
                "FERRIQ_BROKER_TLS_CERT and FERRIQ_BROKER_TLS_KEY go together: set both or neither"
                    .into(),
            )),
        }
        let broker = builder
            .connect()
            .await
            .map_err(|e| ConnectError::Backend(e.to_string()))?;
        Ok(Arc::new(broker) as Arc<dyn Broker>)
    })
}

ferriq::inventory::submit!(BrokerConnector {
    schemes: SCHEMES,
    connect: connect_broker,
});
