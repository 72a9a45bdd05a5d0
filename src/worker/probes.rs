//! Probes for orchestrators: liveness, readiness and Prometheus metrics over plain HTTP/1.1,
//! without a web framework (three fixed paths, tiny responses).

use std::fmt::Write as _;
use std::net::SocketAddr;
use std::sync::atomic::Ordering;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;
use tokio::task::JoinHandle;

use super::metrics::Histogram;
use super::running::Outcome;
use super::Worker;

/// The probe server of a worker; stops when dropped.
#[derive(Debug)]
pub struct ProbeServer {
    addr: SocketAddr,
    task: JoinHandle<()>,
}

impl ProbeServer {
    /// The address it listens on (useful after binding port 0).
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }
}

impl Drop for ProbeServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Worker {
    /// Serves the worker's probes on `addr` until the returned server is dropped:
    ///
    /// - `GET /livez`: 200 while the process answers;
    /// - `GET /readyz`: 200 when the broker and the store both answer, else 503 with the reason;
    /// - `GET /metrics`: Prometheus text: deliveries by outcome, runs started, runs in
    ///   flight, a run-duration histogram and the queue depth (the autoscaling signal).
    ///
    /// [`Worker::run`] serves them by itself when `probe_addr` (`FERRIQ_PROBE_ADDR`) is set:
    /// call this only for a worker without it (or on another address).
    ///
    /// ```no_run
    /// # async fn demo(worker: ferriq::Worker) -> std::io::Result<()> {
    /// let _probes = worker.serve_probes("0.0.0.0:9090".parse().unwrap()).await?;
    /// worker.run_until_signal().await;
    /// # Ok(()) }
    /// ```
    pub async fn serve_probes(&self, addr: SocketAddr) -> std::io::Result<ProbeServer> {
        self.serve_probes_on(TcpListener::bind(addr).await?)
    }

    /// Serves the probes on a bound listener.
    pub(super) fn serve_probes_on(&self, listener: TcpListener) -> std::io::Result<ProbeServer> {
        let addr = listener.local_addr()?;
        let worker = self.clone();
        let task = tokio::spawn(async move {
            loop {
                let Ok((mut stream, _)) = listener.accept().await else {
                    continue;
                };
                let worker = worker.clone();
                tokio::spawn(async move {
                    let mut buf = [0u8; 1024];
                    let n = match tokio::time::timeout(
                        std::time::Duration::from_secs(5),
                        stream.read(&mut buf),
                    )
                    .await
                    {
                        Ok(Ok(n)) => n,
                        _ => return,
                    };
                    let request = String::from_utf8_lossy(&buf[..n]);
                    let path = request
                        .lines()
                        .next()
                        .and_then(|l| l.strip_prefix("GET "))
                        .and_then(|l| l.split_whitespace().next())
                        .unwrap_or("");
                    let (status, body) = worker.probe(path).await;
                    let response = format!(
                        "HTTP/1.1 {status}\r\ncontent-type: text/plain; version=0.0.4\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                        body.len()
                    );
                    let _ = stream.write_all(response.as_bytes()).await;
                    let _ = stream.shutdown().await;
                });
            }
        });
        Ok(ProbeServer { addr, task })
    }

    /// The status line and body for one probe path.
    async fn probe(&self, path: &str) -> (&'static str, String) {
        match path {
            "/livez" => ("200 OK", "ok\n".into()),
            "/readyz" => match self.health().await {
                crate::broker::Health::Healthy => ("200 OK", "ready\n".into()),
                crate::broker::Health::Unhealthy(why) => {
                    ("503 Service Unavailable", format!("not ready: {why}\n"))
                }
            },
            "/metrics" => ("200 OK", self.metrics_text().await),
            _ => ("404 Not Found", "try /livez, /readyz or /metrics\n".into()),
        }
    }

    /// The metrics in Prometheus' text format. Per-task series carry a `task` label (the
    /// registry's names, and `_other` for deliveries of tasks this worker does not serve);
    /// a task appears once it has had a delivery.
    pub async fn metrics_text(&self) -> String {
        let counters = &self.inner.counters;
        let tasks: Vec<_> = counters
            .per_task()
            .into_iter()
            .filter(|(_, c)| c.outcomes.iter().any(|n| n.load(Ordering::Relaxed) > 0))
            .collect();
        let mut out = String::new();
        header(
            &mut out,
            "ferriq_deliveries_total",
            "counter",
            "Deliveries settled, by task and outcome.",
        );
        for (task, c) in &tasks {
            for (i, outcome) in Outcome::ALL.iter().enumerate() {
                let n = c.outcomes[i].load(Ordering::Relaxed);
                let _ = writeln!(
                    out,
                    "ferriq_deliveries_total{{task=\"{}\",outcome=\"{}\"}} {n}",
                    escape(task),
                    outcome.as_str()
                );
            }
        }
        header(
            &mut out,
            "ferriq_runs_started_total",
            "counter",
            "Task runs started, by task.",
        );
        for (task, c) in &tasks {
            let _ = writeln!(
                out,
                "ferriq_runs_started_total{{task=\"{}\"}} {}",
                escape(task),
                c.started.load(Ordering::Relaxed)
            );
        }
        header(
            &mut out,
            "ferriq_runs_in_flight",
            "gauge",
            "Task runs in progress.",
        );
        let _ = writeln!(out, "ferriq_runs_in_flight {}", self.inner.running.len());
        header(
            &mut out,
            "ferriq_concurrency_limit",
            "gauge",
            "Most task runs this worker holds at once.",
        );
        let _ = writeln!(
            out,
            "ferriq_concurrency_limit {}",
            self.inner.config.concurrency
        );
        header(
            &mut out,
            "ferriq_run_seconds",
            "histogram",
            "How long runs took, by task.",
        );
        for (task, c) in &tasks {
            histogram(&mut out, "ferriq_run_seconds", task, &c.run_seconds);
        }
        header(
            &mut out,
            "ferriq_queue_wait_seconds",
            "histogram",
            "Time from enqueue (or the due time of a delayed task) to the run's start, by task.",
        );
        for (task, c) in &tasks {
            histogram(&mut out, "ferriq_queue_wait_seconds", task, &c.queue_wait);
        }
        header(
            &mut out,
            "ferriq_task_attempts",
            "histogram",
            "Attempts a task took until its result was written, by task.",
        );
        for (task, c) in &tasks {
            histogram(&mut out, "ferriq_task_attempts", task, &c.attempts);
        }
        header(
            &mut out,
            "ferriq_results_written_total",
            "counter",
            "Results this worker wrote, by task and status (succeeded, failed).",
        );
        for (task, c) in &tasks {
            for (i, status) in ["succeeded", "failed"].iter().enumerate() {
                let _ = writeln!(
                    out,
                    "ferriq_results_written_total{{task=\"{}\",status=\"{status}\"}} {}",
                    escape(task),
                    c.results[i].load(Ordering::Relaxed)
                );
            }
        }
        header(
            &mut out,
            "ferriq_claims_total",
            "counter",
            "Claims deferred (another worker holds a live lease) or taken over (its holder's \
             lease ran out), by task.",
        );
        for (task, c) in &tasks {
            for (outcome, n) in [
                ("deferred", &c.claims_deferred),
                ("taken_over", &c.claims_taken_over),
            ] {
                let _ = writeln!(
                    out,
                    "ferriq_claims_total{{task=\"{}\",outcome=\"{outcome}\"}} {}",
                    escape(task),
                    n.load(Ordering::Relaxed)
                );
            }
        }
        // A broker that does not answer leaves the gauge out, quickly: a scrape must still
        // get the rest (Prometheus gives up after 10 s by default).
        let depth = tokio::time::timeout(std::time::Duration::from_secs(2), self.depth()).await;
        if let Ok(Ok(depth)) = depth {
            header(
                &mut out,
                "ferriq_queue_messages",
                "gauge",
                "Messages in the worker's queues, by state.",
            );
            for (state, n) in [
                ("ready", depth.ready),
                ("delayed", depth.delayed),
                ("in_flight", depth.in_flight),
            ] {
                let _ = writeln!(out, "ferriq_queue_messages{{state=\"{state}\"}} {n}");
            }
        }
        out
    }
}

fn header(out: &mut String, name: &str, kind: &str, help: &str) {
    let _ = writeln!(out, "# HELP {name} {help}");
    let _ = writeln!(out, "# TYPE {name} {kind}");
}

fn histogram(out: &mut String, name: &str, task: &str, h: &Histogram) {
    let (counts, sum) = h.read();
    let task = escape(task);
    let mut cumulative = 0;
    for (i, n) in counts.iter().enumerate() {
        cumulative += n;
        let le = h
            .bounds
            .get(i)
            .map_or_else(|| "+Inf".to_owned(), |b| b.to_string());
        let _ = writeln!(
            out,
            "{name}_bucket{{task=\"{task}\",le=\"{le}\"}} {cumulative}"
        );
    }
    let _ = writeln!(out, "{name}_sum{{task=\"{task}\"}} {sum}");
    let _ = writeln!(out, "{name}_count{{task=\"{task}\"}} {cumulative}");
}

/// A label value in Prometheus' text format: backslash, quote and newline escaped.
fn escape(value: &str) -> String {
    value
        .replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}
