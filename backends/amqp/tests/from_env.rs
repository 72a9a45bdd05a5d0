//! A worker built wholly from `FERRIQ_*` settings on the real RabbitMQ and Redis: the URL forms
//! taskiq users have, settings for the topology, and the prefetch derived from the worker's
//! concurrency.

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::{unique, Topology};
use ferriq::connect::{connect_broker_with, ConnectOptions};
use ferriq::testing::RunningWorker;
use ferriq::{Client, Registry, State, WorkerBuilder, WorkerConfig};
// Links the redis:// scheme (nothing else here names the crate).
use ferriq_valkey as _;
use tokio::sync::Semaphore;

/// Runs in progress, and a gate that holds them.
struct Held {
    running: AtomicUsize,
    gate: Semaphore,
}

#[ferriq::task(name = "amqp.env.held")]
async fn held(h: State<Arc<Held>>) -> u32 {
    h.running.fetch_add(1, Ordering::SeqCst);
    let _permit = h.gate.acquire().await.unwrap();
    7
}

/// The broker URL with an empty vhost, as taskiq and aio-pika users write it.
fn url_with_trailing_slash() -> String {
    common::amqp_url().trim_end_matches("%2f").to_owned()
}

async fn eventually(what: &str, mut check: impl FnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while !check() {
        assert!(tokio::time::Instant::now() < deadline, "timed out: {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_from_the_environment_takes_its_prefetch_from_its_concurrency() {
    let topology = Topology::with_default_tiers();
    let url = url_with_trailing_slash();
    assert!(url.ends_with('/'), "{url}");
    let vars = [
        ("FERRIQ_BROKER_URL", url.clone()),
        ("FERRIQ_STORE_URL", common::redis_url()),
        ("FERRIQ_QUEUES", topology.queue.clone()),
        ("FERRIQ_AMQP_EXCHANGE", topology.exchange.clone()),
        ("FERRIQ_RESULT_PREFIX", unique("env").replace('.', "_")),
        ("FERRIQ_CONCURRENCY", "2".to_owned()),
    ];
    let config = WorkerConfig::from_vars(vars.clone()).unwrap();
    let gate = Arc::new(Held {
        running: AtomicUsize::new(0),
        gate: Semaphore::new(0),
    });
    let worker = WorkerBuilder::from_config(config)
        .await
        .expect("amqp://host:5672/ means vhost / (as in aio-pika and pika)")
        .registry(
            Registry::from_inventory()
                .unwrap()
                .only(&[held::NAME])
                .unwrap(),
        )
        .state(Arc::clone(&gate))
        .build()
        .unwrap();
    let running = RunningWorker::spawn(worker);

    let options = ConnectOptions::new(url).settings(vars.clone());
    let broker = connect_broker_with(options).await.unwrap();
    let store = ferriq::connect::connect_store_with(
        ConnectOptions::new(common::redis_url()).settings(vars),
    )
    .await
    .unwrap();
    let client = Client::new(Arc::clone(&broker), store);
    let handles = client
        .enqueue_batch((0..6).map(|_| held::call()))
        .await
        .unwrap();

    eventually("two runs", || gate.running.load(Ordering::SeqCst) == 2).await;
    // Prefetch 2: the other four wait in the queue, not in the worker's buffer (before the
    // fix the prefetch stayed 32 whatever the concurrency, and the queue showed 0).
    let mut ready = 0;
    for _ in 0..100 {
        ready = broker.depth().await.unwrap().ready;
        if ready == 4 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(ready, 4, "messages left in the queue with 2 runs held");
    assert_eq!(gate.running.load(Ordering::SeqCst), 2);

    gate.gate.add_permits(6);
    for h in handles {
        assert_eq!(h.wait(Duration::from_secs(30)).await.unwrap(), 7);
    }
    running.stop().await;
}

#[tokio::test]
async fn publishing_to_lanes_directly_is_read_as_an_on_off_switch() {
    let topology = Topology::new();
    let options = |value: &str| {
        ConnectOptions::new(common::amqp_url()).settings([
            ("FERRIQ_QUEUES", topology.queue.clone()),
            ("FERRIQ_AMQP_EXCHANGE", topology.exchange.clone()),
            ("FERRIQ_AMQP_PUBLISH_TO_LANES_DIRECTLY", value.to_owned()),
        ])
    };
    // Read as every FERRIQ_* switch is (FERRIQ_SCHEDULER too).
    for good in ["true", "false", "1", "0", "On", "no"] {
        connect_broker_with(options(good))
            .await
            .unwrap_or_else(|e| panic!("{good}: {e}"));
    }
    let err = connect_broker_with(options("maybe")).await.unwrap_err();
    assert!(
        err.to_string()
            .contains("FERRIQ_AMQP_PUBLISH_TO_LANES_DIRECTLY=\"maybe\" is invalid"),
        "{err}"
    );
}

#[tokio::test]
async fn publisher_channels_are_read_and_checked() {
    let topology = Topology::new();
    let options = |value: &str| {
        ConnectOptions::new(common::amqp_url()).settings([
            ("FERRIQ_QUEUES", topology.queue.clone()),
            ("FERRIQ_AMQP_EXCHANGE", topology.exchange.clone()),
            ("FERRIQ_AMQP_PUBLISHER_CHANNELS", value.to_owned()),
        ])
    };
    for good in ["1", "8", "64"] {
        connect_broker_with(options(good))
            .await
            .unwrap_or_else(|e| panic!("{good}: {e}"));
    }
    for bad in ["0", "65", "many"] {
        let err = connect_broker_with(options(bad)).await.unwrap_err();
        assert!(
            err.to_string().contains(&format!(
                "FERRIQ_AMQP_PUBLISHER_CHANNELS={bad:?} is invalid: expected 1 to 64"
            )),
            "{err}"
        );
    }
}
