//! Fan-out and fan-in: a document split into chunks, each converted by its own task in
//! parallel, and assembled exactly once, by a chord callback, when the last chunk is done — the
//! "did I just finish the last of 25 chunks?" question answered by the store, once.
//!
//! ```text
//! cargo run --example fan_in                      # in memory, one process
//! FERRIQ_BROKER_URL=amqp://guest:guest@127.0.0.1:5672/ FERRIQ_STORE_URL=redis://127.0.0.1:6379 \
//!     cargo run --example fan_in                  # on RabbitMQ and Redis
//! ```

use std::time::Duration;

use ferriq::workflow::{chord, Group};
use ferriq::{Client, Shutdown, TaskContext, TaskError, WorkerBuilder, WorkerConfig};
// Links the schemes the environment may name.
use ferriq_amqp as _;
use ferriq_sqs as _;
use ferriq_valkey as _;

/// Converts one chunk (here: to upper case, slowly).
#[ferriq::task(name = "docs.convert_chunk", max_attempts = 3)]
async fn convert_chunk(document: String, index: u32, text: String) -> String {
    tokio::time::sleep(Duration::from_millis(20)).await;
    let _ = (document, index);
    text.to_uppercase()
}

/// Assembles the document from every chunk, in order: runs once, after the last chunk.
#[ferriq::task(name = "docs.assemble")]
async fn assemble(ctx: TaskContext, document: String) -> Result<String, TaskError> {
    let chunks: Vec<String> = ctx.group_values().await?;
    Ok(format!("{document}: {}", chunks.join(" ")))
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let defaults = [
        ("FERRIQ_BROKER_URL", "memory://fan-in"),
        ("FERRIQ_STORE_URL", "memory://fan-in"),
        ("FERRIQ_QUEUES", "ferriq.fan_in"),
        ("FERRIQ_AMQP_EXCHANGE", "ferriq.fan_in"),
        ("FERRIQ_RESULT_PREFIX", "ferriq-fan-in"),
    ];
    let vars: Vec<(String, String)> = defaults
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .chain(std::env::vars())
        .collect();
    let config = WorkerConfig::from_vars(vars)?;
    let worker = WorkerBuilder::from_config(config.clone())
        .await?
        .registry(ferriq::Registry::from_inventory()?.only(&[convert_chunk::NAME, assemble::NAME])?)
        .build()?;
    let shutdown = Shutdown::new();
    let running = tokio::spawn({
        let (worker, shutdown) = (worker.clone(), shutdown.clone());
        async move { worker.run(shutdown).await }
    });

    let client = Client::from_settings(&config.settings).await?;
    let text = "the quick brown fox jumps over the lazy dog while twenty five chunks \
                of one document are converted in parallel and assembled exactly once";
    let words: Vec<&str> = text.split(' ').collect();
    let document = "report-42".to_owned();
    let parts = Group::new(
        words
            .iter()
            .enumerate()
            .map(|(i, w)| convert_chunk::call(document.clone(), i as u32, (*w).to_owned())),
    );
    println!("{} chunks of {document}", parts.len());
    let chord = client
        .enqueue_chord(chord(parts, assemble::call(document.clone())))
        .await?;
    println!("{}", chord.wait(Duration::from_secs(60)).await?);
    let summary = chord.group().wait_done(Duration::from_secs(5)).await?;
    println!(
        "chunks done: {} of {} ({} failed)",
        summary.succeeded, summary.size, summary.failed
    );

    shutdown.drain();
    running.await?;
    Ok(())
}
