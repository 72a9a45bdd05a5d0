//! TLS for real on RabbitMQ: a throwaway CA and certificates made with `openssl`, a private
//! RabbitMQ node (its own name, ports and data directory; the shared node untouched) with a TLS
//! listener that asks for client certificates, and a worker and client connecting over
//! `amqps://` end to end. Each refusal names what to fix. Needs the `tls` feature
//! (`scripts/test.sh` runs it).
#![cfg(feature = "tls")]

mod common;

use std::sync::Arc;
use std::time::Duration;

use ferriq::Client;
use ferriq_amqp::AmqpBroker;
use ferriq_valkey::ValkeyStore;

#[ferriq::task(name = "amqp.tls.add")]
async fn add(a: i64, b: i64) -> i64 {
    a + b
}

async fn refusal(
    url: &str,
    tune: impl FnOnce(ferriq_amqp::AmqpBrokerBuilder) -> ferriq_amqp::AmqpBrokerBuilder,
) -> String {
    let builder = AmqpBroker::builder(url)
        .exchange(common::unique("x"))
        .queues([common::unique("q")])
        .connect_timeout(Duration::from_secs(3));
    match tune(builder).connect().await {
        Ok(_) => panic!("{url}: connected"),
        Err(e) => e.to_string(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn over_amqps_with_a_private_ca_and_a_client_certificate_a_task_runs_and_each_refusal_says_what_to_fix(
) {
    let node = ferriq_testkit::rabbitmq::PrivateNode::start().await;
    let (ca, cert, key) = (
        node.path("ca.pem"),
        node.path("client.pem"),
        node.path("client.key"),
    );
    let (exchange, lane) = (common::unique("x"), common::unique("q"));
    let connect = || {
        AmqpBroker::builder(node.url("localhost"))
            .exchange(exchange.clone())
            .queues([lane.clone()])
            .tls_ca_file(&ca)
            .tls_client_cert(&cert, &key)
            .connect()
    };
    let broker = Arc::new(
        connect()
            .await
            .expect("amqps with the CA and a client certificate"),
    );
    let store = Arc::new(
        ValkeyStore::builder(common::redis_url())
            .prefix(common::unique("p").replace('.', "-"))
            .connect()
            .await
            .unwrap(),
    );
    let worker = ferriq::testing::RunningWorker::spawn(
        ferriq::Worker::builder()
            .broker(Arc::new(connect().await.unwrap()))
            .store(store.clone())
            .registry(
                ferriq::Registry::from_inventory()
                    .unwrap()
                    .only(&[add::NAME])
                    .unwrap(),
            )
            .build()
            .unwrap(),
    );
    let client = Client::new(broker, store);
    let handle = add::kiq(&client, 2, 3).await.unwrap();
    assert_eq!(handle.wait(Duration::from_secs(30)).await.unwrap(), 5);
    worker.stop().await;
    client.close().await;

    // No client certificate: the node refuses the handshake.
    let bare = refusal(&node.url("localhost"), |b| b.tls_ca_file(&ca)).await;
    assert!(bare.contains("FERRIQ_BROKER_TLS_CERT"), "{bare}");
    // Our CA not given: the system's roots do not know it.
    let untrusted = refusal(&node.url("localhost"), |b| b.tls_client_cert(&cert, &key)).await;
    assert!(untrusted.contains("FERRIQ_BROKER_TLS_CA"), "{untrusted}");
    // The certificate is for localhost, not 127.0.0.1.
    let mismatch = refusal(&node.url("127.0.0.1"), |b| {
        b.tls_ca_file(&ca).tls_client_cert(&cert, &key)
    })
    .await;
    assert!(mismatch.contains("host name"), "{mismatch}");
    // amqps:// to the plain port.
    let plain = format!("amqps://guest:hunter2@localhost:{}/%2f", node.plain_port);
    let not_tls = refusal(&plain, |b| b.tls_ca_file(&ca)).await;
    assert!(
        not_tls.contains("does not speak TLS") || not_tls.contains("TLS port"),
        "{not_tls}"
    );
    assert!(!not_tls.contains("hunter2"), "{not_tls}");
    // Files that are not there, and TLS files with a plain URL.
    let missing = refusal(&node.url("localhost"), |b| {
        b.tls_ca_file("/nonexistent/ca.pem")
    })
    .await;
    assert!(
        missing.contains("FERRIQ_BROKER_TLS_CA") && missing.contains("/nonexistent/ca.pem"),
        "{missing}"
    );
    let plain_url = format!("amqp://guest:guest@localhost:{}/%2f", node.plain_port);
    let wrong_scheme = refusal(&plain_url, |b| b.tls_ca_file(&ca)).await;
    assert!(wrong_scheme.contains("amqps://"), "{wrong_scheme}");
}
