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
    // A broker URL given as the store: swapped, whatever the binary links. A redis:// broker
    // is the Streams broker of ferriq-valkey, which this binary does not link.
    let text = connect_store("amqp://:s3cret@h:5672/")
        .await
        .expect_err("must fail")
        .to_string();
    assert!(text.contains("swapped"), "{text}");
    assert!(!text.contains("s3cret"), "{text}");
    let text = connect_broker("redis://:s3cret@h:6379")
        .await
        .expect_err("must fail")
        .to_string();
    assert!(
        text.contains("ferriq-valkey") && text.contains("Streams"),
        "{text}"
    );
    assert!(!text.contains("s3cret"), "{text}");
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
fn a_number_out_of_range_is_refused_with_the_range() {
    for (name, value, range) in [
        ("FERRIQ_CONCURRENCY", "0", "from 1 to 100000"),
        ("FERRIQ_CONCURRENCY", "ten", "from 1 to 100000"),
        ("FERRIQ_MAX_PAYLOAD_BYTES", "100", "from 1024 to 1073741824"),
        ("FERRIQ_LEASE_SECS", "0.1", "from 0.3 to 86400"),
        ("FERRIQ_GRACE_SECS", "-1", "from 0 to 86400"),
        ("FERRIQ_MAX_TAKEOVERS", "0", "from 1 to 1000"),
    ] {
        let err = WorkerConfig::from_vars([(name, value)]).expect_err(name);
        let text = err.to_string();
        assert!(text.contains(name) && text.contains(range), "{text}");
    }
    let config = WorkerConfig::from_vars([("FERRIQ_MAX_TAKEOVERS", "20")]).unwrap();
    assert_eq!(config.max_takeovers, 20);
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

/// A `memory://` store configured by the environment keeps results as long as
/// `FERRIQ_RESULT_TTL_SECS` says (7 days by default), and an invalid value is refused with
/// the setting named, as for the Valkey store.
#[tokio::test(start_paused = true)]
async fn a_memory_store_from_settings_keeps_results_for_the_result_ttl() {
    use ferriq::connect::{connect_store_with, ConnectOptions};
    use ferriq::store::{ClaimOutcome, ResultStatus};
    let options =
        |url: &str, ttl: &str| ConnectOptions::new(url).settings([("FERRIQ_RESULT_TTL_SECS", ttl)]);
    let err = connect_store_with(options("memory://ttl-bad", "a week"))
        .await
        .expect_err("must fail")
        .to_string();
    assert!(err.contains("FERRIQ_RESULT_TTL_SECS"), "{err}");

    let store = connect_store_with(options("memory://ttl-60", "60"))
        .await
        .unwrap();
    let id = ferriq::wire::TaskId::random();
    let Ok(ClaimOutcome::Run { token, .. }) =
        store.claim(&id, "w", Duration::from_secs(30), None).await
    else {
        panic!("not claimed");
    };
    let result = ferriq::wire::TaskResult::success(serde_json::json!(1), 0.0, Default::default());
    store
        .complete(&id, token, Some(&result), None)
        .await
        .unwrap();
    assert!(matches!(
        store.get(&id).await.unwrap(),
        ResultStatus::Ready(_)
    ));
    tokio::time::advance(Duration::from_secs(61)).await;
    // Forgotten on the next write (the store sweeps as it writes).
    let other = ferriq::wire::TaskId::random();
    let _ = store
        .claim(&other, "w", Duration::from_secs(30), None)
        .await;
    assert!(
        !matches!(store.get(&id).await.unwrap(), ResultStatus::Ready(_)),
        "kept past FERRIQ_RESULT_TTL_SECS"
    );
}

#[tokio::test]
async fn a_client_from_settings_names_the_missing_url() {
    let mut settings = ferriq::connect::Settings::default();
    settings.insert("FERRIQ_BROKER_URL", "memory://");
    let err = Client::from_settings(&settings)
        .await
        .expect_err("no store URL");
    assert!(
        matches!(err, ConnectError::Missing("FERRIQ_STORE_URL")),
        "{err:?}"
    );
}

#[test]
fn a_misspelt_setting_is_pointed_out_with_the_name_it_likely_meant() {
    let mut settings = ferriq::connect::Settings::default();
    settings.extend([
        ("FERRIQ_CONCURENCY", "4"),
        ("FERRIQ_CONCURRENCY", "4"),
        ("FERRIQ_CONNECT_TEST_LANES", "a"),
        ("FERRIQ_ZZZZZZZZZZZZZZZZZZZZZZ", "1"),
        ("FERRIQ_TEST_URL", "internal"),
        ("HOME", "/root"),
    ]);
    // What a backend asks for (set or not) counts as read.
    let _ = settings.get("FERRIQ_CONNECT_TEST_LANES");
    let unread = settings.unread(WorkerConfig::SETTINGS);
    assert_eq!(
        unread,
        vec![
            (
                "FERRIQ_CONCURENCY".to_owned(),
                Some("FERRIQ_CONCURRENCY".to_owned())
            ),
            ("FERRIQ_ZZZZZZZZZZZZZZZZZZZZZZ".to_owned(), None),
        ]
    );
}

#[tokio::test]
async fn a_url_without_a_scheme_says_so_and_shows_no_password() {
    for (url, shown) in [("", ""), ("guest:s3cret@rabbit:5672", "***")] {
        let err = ferriq::connect::connect_broker(url).await.unwrap_err();
        match &err {
            ConnectError::NoScheme { kind, url, .. } => {
                assert_eq!(*kind, "broker");
                assert_eq!(url, shown);
            }
            other => panic!("expected NoScheme, got {other:?}"),
        }
        let text = err.to_string();
        assert!(
            text.contains("has no scheme") && text.contains("amqp://"),
            "{text}"
        );
        assert!(!text.contains("s3cret"), "{text}");
    }
    let err = ferriq::connect::connect_store("localhost:6379")
        .await
        .unwrap_err();
    assert!(err.to_string().contains("redis://"), "{err}");
}
