//! A worker and a client on RabbitMQ, with claims and results in Valkey/Redis.
//!
//! ```text
//! FERRIQ_BROKER_URL=amqp://guest:guest@127.0.0.1:5672/%2f \
//! FERRIQ_VALKEY_URL=redis://127.0.0.1:6379 \
//! cargo run --example rabbitmq
//! ```
//!
//! The worker and the client share nothing but the broker and the store: run the worker part
//! in your pods (`Worker::run_until_signal`) and the client part in your app.

use std::sync::Arc;
use std::time::Duration;

use ferriq::{Client, Registry, Shutdown, TaskContext, TaskError, Worker, WorkerConfig};
use ferriq_amqp::AmqpBroker;
use ferriq_valkey::ValkeyStore;

#[ferriq::task(name = "example.resize_image", max_attempts = 4, timeout = 60)]
async fn resize_image(ctx: TaskContext, url: String, width: u32) -> Result<String, TaskError> {
    if width == 0 {
        return Err(TaskError::fatal("width must be positive"));
    }
    // ctx.task_id() is the idempotency key for anything this writes elsewhere.
    Ok(format!("{url}@{width}px (task {})", ctx.task_id()))
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let config = WorkerConfig::from_env()?;
    let broker_url = config
        .broker_url
        .clone()
        .unwrap_or_else(|| "amqp://guest:guest@127.0.0.1:5672/%2f".into());
    let valkey_url = config
        .valkey_url
        .clone()
        .unwrap_or_else(|| "redis://127.0.0.1:6379".into());
    println!("broker {broker_url}, store {valkey_url}"); // passwords are never printed

    let queue = "ferriq.example";
    let broker = Arc::new(
        AmqpBroker::builder(broker_url)
            .exchange("ferriq.example")
            .queues([queue])
            .prefetch(config.concurrency as u16)
            .connect()
            .await?,
    );
    let store = Arc::new(
        ValkeyStore::builder(valkey_url)
            .prefix("ferriq-example")
            .connect()
            .await?,
    );

    // The worker (normally its own pod).
    let worker = Worker::builder()
        .broker(broker.clone())
        .store(store.clone())
        .registry(Registry::from_inventory()?.only(&[resize_image::NAME])?)
        .config(config)
        .build()?;
    let shutdown = Shutdown::new();
    let running = tokio::spawn({
        let (worker, shutdown) = (worker.clone(), shutdown.clone());
        async move { worker.run(shutdown).await }
    });

    // The client (normally your app).
    let client = Client::new(broker, store);
    let handles = client
        .enqueue_batch(
            (1..=3).map(|i| resize_image::call(format!("https://img.example/{i}.png"), 200 * i)),
        )
        .await?;
    for handle in handles {
        println!("{}", handle.wait(Duration::from_secs(30)).await?);
    }

    shutdown.drain();
    running.await?;
    Ok(())
}
