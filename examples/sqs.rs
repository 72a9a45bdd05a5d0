//! A worker and a client on SQS, with claims and results in Valkey/Redis.
//!
//! ```text
//! cargo run --example sqs        # on the fauxqs emulator (scripts/sqs-emulator.sh starts it)
//! FERRIQ_SQS_ENDPOINT=$(bash scripts/sqs-emulator.sh | tail -n1) cargo run --example sqs
//! ```
//!
//! Claims and results go to Redis/Valkey on 127.0.0.1:6379.
//!
//! On AWS, a worker pod is configured by its environment instead:
//! `FERRIQ_BROKER_URL=sqs://jobs?region=eu-west-1 FERRIQ_STORE_URL=rediss://…` and the usual
//! AWS credentials, then `Worker::builder_from_env()`.

use std::sync::Arc;
use std::time::Duration;

use ferriq::{Client, Registry, Shutdown, TaskContext, TaskError, Worker};
use ferriq_sqs::SqsBrokerBuilder;
use ferriq_valkey::ValkeyStore;

#[ferriq::task(name = "example.transcode", max_attempts = 4, timeout = 600)]
async fn transcode(ctx: TaskContext, video: String, height: u32) -> Result<String, TaskError> {
    if height == 0 {
        return Err(TaskError::fatal("height must be positive"));
    }
    Ok(format!("{video} at {height}p (task {})", ctx.task_id()))
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    // A queue of this run's own, with its dead-letter queue, on the emulator.
    let endpoint = ferriq_examples::sqs::endpoint();
    let admin = ferriq_examples::sqs::client(&endpoint);
    let name = format!(
        "ferriq-example-{}",
        &uuid::Uuid::new_v4().simple().to_string()[..8]
    );
    let (url, dlq) = ferriq_examples::sqs::create_queue_pair(&admin, &name).await;
    println!("queue {name} on {endpoint}");

    let sqs = || {
        SqsBrokerBuilder::new(name.as_str())
            .endpoint_url(endpoint.as_str())
            .region("us-east-1")
            .credentials("test", "test")
            .connect()
    };
    let store = Arc::new(
        ValkeyStore::builder(ferriq_examples::redis_url())
            .prefix("ferriq-example")
            .connect()
            .await?,
    );

    // The worker (normally its own pod).
    let worker = Worker::builder()
        .broker(Arc::new(sqs().await?))
        .store(store.clone())
        .registry(Registry::from_inventory()?.only(&[transcode::NAME])?)
        .build()?;
    let shutdown = Shutdown::new();
    let running = tokio::spawn({
        let (worker, shutdown) = (worker.clone(), shutdown.clone());
        async move { worker.run(shutdown).await }
    });

    // The client (normally your app).
    let client = Client::new(Arc::new(sqs().await?), store);
    let handles = client
        .enqueue_batch([360, 720, 1080].map(|h| transcode::call("intro.mp4".into(), h)))
        .await?;
    for handle in handles {
        println!("{}", handle.wait(Duration::from_secs(30)).await?);
    }

    shutdown.drain();
    running.await?;
    ferriq_examples::sqs::delete_queues(&admin, &[url, dlq]).await;
    Ok(())
}
