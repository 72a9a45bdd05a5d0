//! Backends from URLs and a worker built wholly from the environment, on `memory://`.

use std::time::Duration;

use ferriq::connect::{connect_broker, connect_store, ConnectError};
use ferriq::{Client, WorkerBuilder, WorkerConfig};

#[ferriq::task(name = "connect.add")]
async fn add(a: i64, b: i64) -> i64 {
    a + b
}

#[tokio::test]
async fn a_worker_and_a_client_from_urls_share_a_named_memory_backend() {
    let config = WorkerConfig::from_vars([
        ("FERRIQ_BROKER_URL", "memory://connect-test"),
        ("FERRIQ_STORE_URL", "memory://connect-test"),
        ("FERRIQ_CONCURRENCY", "4"),
    ])
    .unwrap();
    let worker = WorkerBuilder::from_config(config)
        .await
        .unwrap()
        .registry(
            ferriq::Registry::from_inventory()
                .unwrap()
                .only(&[add::NAME])
                .unwrap(),
        )
        .build()
        .unwrap();
    let running = ferriq::testing::RunningWorker::spawn(worker);
    let client = Client::connect("memory://connect-test", "memory://connect-test")
        .await
        .unwrap();
    let handle = add::kiq(&client, 2, 3).await.unwrap();
    assert_eq!(handle.wait(Duration::from_secs(10)).await.unwrap(), 5);
    running.stop().await;
}

#[tokio::test]
async fn an_unknown_scheme_names_the_crate_to_link() {
    let err = connect_broker("amqp://guest:s3cret@rabbit:5672/")
        .await
        .expect_err("must fail");
    assert!(matches!(err, ConnectError::UnknownScheme { .. }), "{err:?}");
    let text = err.to_string();
    assert!(
        text.contains("ferriq-amqp") && text.contains("use ferriq_amqp as _;"),
        "{text}"
    );
    assert!(!text.contains("s3cret"), "{text}");

    let text = connect_store("rediss://h:6379")
        .await
        .expect_err("must fail")
        .to_string();
    assert!(text.contains("ferriq-valkey"), "{text}");
    let text = connect_broker("kafka://k:9092")
        .await
        .expect_err("must fail")
        .to_string();
    assert!(
        text.contains("kafka://") && text.contains("check the URL"),
        "{text}"
    );
}

#[tokio::test]
async fn a_worker_from_the_environment_needs_its_urls() {
    let config = WorkerConfig::from_vars([("FERRIQ_STORE_URL", "memory://")]).unwrap();
    let err = WorkerBuilder::from_config(config)
        .await
        .expect_err("must fail");
    assert!(err.to_string().contains("FERRIQ_BROKER_URL"), "{err}");
}

#[test]
fn settings_never_show_urls_or_secrets_in_debug() {
    let config = WorkerConfig::from_vars([
        ("FERRIQ_BROKER_URL", "amqp://app:s3cret@rabbit/%2f"),
        ("FERRIQ_VALKEY_URL", "redis://:s3cret@valkey:6379"),
        ("FERRIQ_API_TOKEN", "s3cret"),
    ])
    .unwrap();
    let debug = format!("{config:?}");
    assert!(!debug.contains("s3cret"), "{debug}");
    assert_eq!(
        config.store_url.as_ref().unwrap().expose(),
        "redis://:s3cret@valkey:6379"
    );
}
