//! A worker and a client on RabbitMQ, with claims and results in Valkey/Redis, both built
//! from `FERRIQ_*` settings.
//!
//! ```text
//! FERRIQ_BROKER_URL=amqp://guest:guest@127.0.0.1:5672/ \
//! FERRIQ_STORE_URL=redis://127.0.0.1:6379 \
//! cargo run --example rabbitmq
//! ```
//!
//! The worker and the client share nothing but the broker and the store: run the worker part
//! in your pods (`Worker::run_until_signal`) and the client part in your app.

use std::time::Duration;

use ferriq::{Client, Shutdown, TaskContext, TaskError, WorkerBuilder, WorkerConfig};
// Links the amqp:// and redis:// schemes: a crate the binary never names is dropped.
use ferriq_amqp as _;
use ferriq_valkey as _;

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
    // Defaults for this example: the local servers, and a lane of its own.
    let defaults = [
        ("FERRIQ_BROKER_URL", ferriq_examples::amqp_url()),
        ("FERRIQ_STORE_URL", ferriq_examples::redis_url()),
        ("FERRIQ_QUEUES", "ferriq.example".to_owned()),
        ("FERRIQ_AMQP_EXCHANGE", "ferriq.example".to_owned()),
        ("FERRIQ_RESULT_PREFIX", "ferriq-example".to_owned()),
    ];
    let vars: Vec<(String, String)> = defaults
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v))
        .chain(std::env::vars())
        .collect();
    let config = WorkerConfig::from_vars(vars)?;
    // Passwords are never printed.
    println!("settings {:?}", config.settings);

    // The worker (normally its own pod: `Worker::builder_from_env().await?.build()?`).
    let worker = WorkerBuilder::from_config(config.clone()).await?.build()?;
    let shutdown = Shutdown::new();
    let running = tokio::spawn({
        let (worker, shutdown) = (worker.clone(), shutdown.clone());
        async move { worker.run(shutdown).await }
    });

    // The client (normally your app: `Client::from_env().await?`).
    let client = Client::from_settings(&config.settings).await?;
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
