//! Trace context over RabbitMQ (feature `opentelemetry`): a trace started in a client span
//! continues in the worker's `ferriq.run` span, and so does one started by a Python taskiq
//! producer with taskiq's OpenTelemetryMiddleware. Spans are caught by an in-memory exporter.

mod common;

use std::process::Stdio;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use common::{interop_env, python, Topology};
use ferriq::middleware::TraceContext;
use ferriq::testing::RunningWorker;
use ferriq::{Client, Registry, Worker};
use opentelemetry::trace::{TraceContextExt, TracerProvider as _};
use opentelemetry_sdk::trace::{InMemorySpanExporter, SdkTracerProvider, SpanData};
use tracing_opentelemetry::OpenTelemetrySpanExt;
use tracing_subscriber::layer::SubscriberExt;

#[ferriq::task(name = "interop.add")]
async fn add(a: i64, b: i64) -> i64 {
    tracing::info!("adding");
    a + b
}

/// The process-wide subscriber: every span goes to OpenTelemetry, exported into memory.
fn spans() -> &'static (SdkTracerProvider, InMemorySpanExporter) {
    static SET: OnceLock<(SdkTracerProvider, InMemorySpanExporter)> = OnceLock::new();
    SET.get_or_init(|| {
        let exporter = InMemorySpanExporter::default();
        let provider = SdkTracerProvider::builder()
            .with_simple_exporter(exporter.clone())
            .build();
        let layer = tracing_opentelemetry::layer().with_tracer(provider.tracer("ferriq-tests"));
        tracing::subscriber::set_global_default(tracing_subscriber::registry().with(layer))
            .expect("one subscriber per test process");
        (provider, exporter)
    })
}

/// The finished run span of `task_id`, waiting for it (spans end after the run).
async fn run_span(task_id: &str) -> SpanData {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let finished = spans().1.get_finished_spans().unwrap();
        let found = finished.into_iter().find(|s| {
            s.name == "execute/interop.add"
                && s.attributes
                    .iter()
                    .any(|kv| kv.key.as_str() == "task_id" && kv.value.as_str() == task_id)
        });
        if let Some(span) = found {
            return span;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "no run span for {task_id}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn worker(topology: &Topology, prefix: &str) -> RunningWorker {
    RunningWorker::spawn(
        Worker::builder()
            .broker(Arc::new(topology.broker().await))
            .store(Arc::new(common::store(prefix).await))
            .registry(
                Registry::from_inventory()
                    .unwrap()
                    .only(&[add::NAME])
                    .unwrap(),
            )
            .middleware(Arc::new(TraceContext))
            .build()
            .unwrap(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_trace_started_in_a_client_span_continues_in_the_workers_run_span() {
    spans();
    let topology = Topology::new();
    let prefix = common::unique("trace");
    let worker = worker(&topology, &prefix).await;
    let client = Client::new(
        Arc::new(topology.broker().await),
        Arc::new(common::store(&prefix).await),
    )
    .with_middleware(Arc::new(TraceContext));

    let request = tracing::info_span!("http.request", route = "/sum");
    let (trace_id, span_id) = {
        let cx = request.context();
        let sc = cx.span().span_context().clone();
        (sc.trace_id(), sc.span_id())
    };
    let handle = {
        let _entered = request.enter();
        client.enqueue(add::call(2, 3)).await.unwrap()
    };
    drop(request);
    assert_eq!(handle.wait(Duration::from_secs(30)).await.unwrap(), 5);
    let run = run_span(handle.task_id().as_str()).await;
    assert_eq!(run.span_context.trace_id(), trace_id, "the same trace");
    assert_eq!(run.parent_span_id, span_id, "a child of the client's span");
    worker.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_trace_started_by_a_python_taskiq_producer_continues_in_the_workers_run_span() {
    spans();
    let topology = Topology::new();
    let prefix = topology.queue.replace('.', "_");
    let worker = worker(&topology, &prefix).await;
    let mut cmd = tokio::process::Command::new(python());
    cmd.arg("traced_producer.py")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    interop_env(&mut cmd, &topology, &prefix);
    let out = tokio::time::timeout(Duration::from_secs(120), cmd.output())
        .await
        .expect("the Python producer finished")
        .unwrap();
    assert!(
        out.status.success(),
        "producer failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let printed: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(printed["value"], 42);
    let finished = spans().1.get_finished_spans().unwrap();
    let run = finished
        .iter()
        .rev()
        .find(|s| {
            s.name == "execute/interop.add"
                && s.span_context.trace_id().to_string() == printed["trace_id"].as_str().unwrap()
        })
        .unwrap_or_else(|| panic!("no run span in trace {}", printed["trace_id"]));
    assert_eq!(
        run.parent_span_id.to_string(),
        printed["send_span_id"].as_str().unwrap(),
        "a child of taskiq's send span"
    );
    worker.stop().await;
}
