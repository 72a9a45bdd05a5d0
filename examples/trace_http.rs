//! Trace propagation from an HTTP handler to the worker (feature `opentelemetry`), over
//! RabbitMQ and Valkey: a tiny HTTP server handles `GET /sum?a=2&b=3` inside a span, enqueues
//! a task with `TraceContext` on the client, and the worker's run span continues the same
//! trace. Spans are exported into memory and printed as a tree; an app installs
//! `opentelemetry-otlp` (or any exporter) on the same `SdkTracerProvider` instead.
//!
//! `cargo run -p ferriq-examples --example trace_http` (RabbitMQ on 127.0.0.1:5672 and Redis
//! on 127.0.0.1:6379, or `FERRIQ_BROKER_URL` / `FERRIQ_STORE_URL`).

use std::sync::Arc;
use std::time::Duration;

use ferriq::middleware::TraceContext;
use ferriq::{Client, Registry, Worker};
use opentelemetry::trace::TracerProvider as _;
use opentelemetry_sdk::trace::{InMemorySpanExporter, SdkTracerProvider};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tracing::Instrument;
use tracing_subscriber::layer::SubscriberExt;
// The backends the URLs name: linked so their schemes are registered.
use ferriq_amqp as _;
use ferriq_valkey as _;

#[ferriq::task(name = "trace.sum")]
async fn sum(a: i64, b: i64) -> i64 {
    tracing::info!(a, b, "summing");
    a + b
}

/// One request: parse, enqueue inside the request's span, wait, answer.
async fn handle(mut conn: tokio::net::TcpStream, client: Client) {
    let mut buf = vec![0; 1024];
    let n = conn.read(&mut buf).await.unwrap_or(0);
    let request = String::from_utf8_lossy(&buf[..n]).into_owned();
    let query = request.split_whitespace().nth(1).unwrap_or("/").to_owned();
    let arg = |name: &str| {
        query
            .split(['?', '&'])
            .find_map(|kv| kv.strip_prefix(&format!("{name}=")))
            .and_then(|v| v.parse::<i64>().ok())
            .unwrap_or(0)
    };
    let span = tracing::info_span!("GET /sum", otel.kind = "server");
    let answer = async {
        let handle = client.enqueue(sum::call(arg("a"), arg("b"))).await.unwrap();
        handle.wait(Duration::from_secs(10)).await.unwrap()
    }
    .instrument(span)
    .await;
    let body = format!("{answer}\n");
    let _ = conn
        .write_all(
            format!(
                "HTTP/1.1 200 OK\r\ncontent-length: {}\r\n\r\n{body}",
                body.len()
            )
            .as_bytes(),
        )
        .await;
}

#[tokio::main]
async fn main() {
    let exporter = InMemorySpanExporter::default();
    let provider = SdkTracerProvider::builder()
        .with_simple_exporter(exporter.clone())
        .build();
    let layer = tracing_opentelemetry::layer().with_tracer(provider.tracer("trace_http"));
    tracing::subscriber::set_global_default(tracing_subscriber::registry().with(layer)).unwrap();

    let broker_url = std::env::var("FERRIQ_BROKER_URL")
        .unwrap_or_else(|_| "amqp://guest:guest@127.0.0.1:5672/%2f".into());
    let store_url =
        std::env::var("FERRIQ_STORE_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".into());
    let lane = "ferriq-example-trace-http".to_owned();
    let mut settings = ferriq::connect::Settings::default();
    settings.extend([
        ("FERRIQ_BROKER_URL", broker_url.as_str()),
        ("FERRIQ_STORE_URL", store_url.as_str()),
        ("FERRIQ_QUEUES", lane.as_str()),
    ]);
    let client = Client::from_settings(&settings)
        .await
        .expect("RabbitMQ and Redis answer")
        .with_middleware(Arc::new(TraceContext));
    let mut config = ferriq::WorkerConfig::from_vars(settings_vars(&settings)).unwrap();
    config.grace = Duration::from_secs(1);
    let worker = ferriq::WorkerBuilder::from_config(config)
        .await
        .unwrap()
        .registry(
            Registry::from_inventory()
                .unwrap()
                .only(&[sum::NAME])
                .unwrap(),
        )
        .middleware(Arc::new(TraceContext))
        .build()
        .unwrap();
    let shutdown = ferriq::Shutdown::new();
    let running = tokio::spawn(worker_run(worker, shutdown.clone()));

    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let server = tokio::spawn(async move {
        while let Ok((conn, _)) = listener.accept().await {
            tokio::spawn(handle(conn, client.clone()));
        }
    });
    // A caller.
    let mut conn = tokio::net::TcpStream::connect(addr).await.unwrap();
    conn.write_all(b"GET /sum?a=2&b=3 HTTP/1.1\r\nhost: x\r\n\r\n")
        .await
        .unwrap();
    let mut response = String::new();
    let _ = conn.read_to_string(&mut response).await;
    println!("HTTP answer: {}", response.lines().last().unwrap_or(""));
    server.abort();
    shutdown.drain();
    let _ = running.await;
    let _ = provider.force_flush();

    let spans = exporter.get_finished_spans().unwrap();
    for s in spans
        .iter()
        .filter(|s| s.name == "GET /sum" || s.name.starts_with("execute/"))
    {
        println!(
            "span {:<16} trace {} span {} parent {}",
            s.name,
            s.span_context.trace_id(),
            s.span_context.span_id(),
            s.parent_span_id
        );
    }
}

fn settings_vars(settings: &ferriq::connect::Settings) -> Vec<(String, String)> {
    ["FERRIQ_BROKER_URL", "FERRIQ_STORE_URL", "FERRIQ_QUEUES"]
        .iter()
        .filter_map(|k| Some((k.to_string(), settings.get(k)?.to_owned())))
        .collect()
}

async fn worker_run(worker: Worker, shutdown: ferriq::Shutdown) {
    worker.run(shutdown).await;
}
