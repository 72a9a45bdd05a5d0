//! Probes for orchestrators: liveness, readiness and Prometheus metrics over plain HTTP/1.1,
//! without a web framework (three fixed paths, tiny responses).

use std::fmt::Write as _;
use std::net::SocketAddr;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;
use tokio::task::JoinHandle;

use super::running::RUN_SECONDS_BUCKETS;
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
    /// - `GET /readyz`: 200 when the broker is healthy, else 503 with the reason;
    /// - `GET /metrics`: Prometheus text: deliveries by outcome, runs started, runs in
    ///   flight, a run-duration histogram and the queue depth (the autoscaling signal).
    ///
    /// ```no_run
    /// # async fn demo(worker: ferriq::Worker) -> std::io::Result<()> {
    /// let _probes = worker.serve_probes("0.0.0.0:9090".parse().unwrap()).await?;
    /// worker.run_until_signal().await;
    /// # Ok(()) }
    /// ```
    pub async fn serve_probes(&self, addr: SocketAddr) -> std::io::Result<ProbeServer> {
        let listener = TcpListener::bind(addr).await?;
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
                other => ("503 Service Unavailable", format!("{other:?}\n")),
            },
            "/metrics" => ("200 OK", self.metrics_text().await),
            _ => ("404 Not Found", "try /livez, /readyz or /metrics\n".into()),
        }
    }

    /// The metrics in Prometheus' text format.
    pub async fn metrics_text(&self) -> String {
        let stats = self.stats();
        let mut out = String::new();
        let _ = writeln!(
            out,
            "# HELP ferriq_deliveries_total Deliveries settled, by outcome."
        );
        let _ = writeln!(out, "# TYPE ferriq_deliveries_total counter");
        for (outcome, n) in &stats.outcomes {
            let _ = writeln!(
                out,
                "ferriq_deliveries_total{{outcome=\"{}\"}} {n}",
                outcome.as_str()
            );
        }
        let _ = writeln!(out, "# HELP ferriq_runs_started_total Task runs started.");
        let _ = writeln!(out, "# TYPE ferriq_runs_started_total counter");
        let _ = writeln!(out, "ferriq_runs_started_total {}", stats.started);
        let _ = writeln!(out, "# HELP ferriq_runs_in_flight Task runs in progress.");
        let _ = writeln!(out, "# TYPE ferriq_runs_in_flight gauge");
        let _ = writeln!(out, "ferriq_runs_in_flight {}", stats.in_flight);
        let _ = writeln!(out, "# HELP ferriq_run_seconds How long runs took.");
        let _ = writeln!(out, "# TYPE ferriq_run_seconds histogram");
        let mut cumulative = 0;
        for (i, n) in stats.run_histogram.iter().enumerate() {
            cumulative += n;
            let le = RUN_SECONDS_BUCKETS
                .get(i)
                .map_or_else(|| "+Inf".to_owned(), |b| b.to_string());
            let _ = writeln!(out, "ferriq_run_seconds_bucket{{le=\"{le}\"}} {cumulative}");
        }
        let _ = writeln!(out, "ferriq_run_seconds_sum {}", stats.run_seconds);
        let _ = writeln!(out, "ferriq_run_seconds_count {cumulative}");
        if let Ok(depth) = self.depth().await {
            let _ = writeln!(
                out,
                "# HELP ferriq_queue_messages Messages in the worker's queues."
            );
            let _ = writeln!(out, "# TYPE ferriq_queue_messages gauge");
            let _ = writeln!(
                out,
                "ferriq_queue_messages{{state=\"ready\"}} {}",
                depth.ready
            );
            let _ = writeln!(
                out,
                "ferriq_queue_messages{{state=\"delayed\"}} {}",
                depth.delayed
            );
            let _ = writeln!(
                out,
                "ferriq_queue_messages{{state=\"in_flight\"}} {}",
                depth.in_flight
            );
        }
        out
    }
}
