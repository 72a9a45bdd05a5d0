//! The dashboard's HTTP as a browser speaks it: one request per connection, timed whole.

use std::time::Instant;

use ferriq_examples::percentile;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// One HTTP/1.1 request; the status line and the body.
pub(crate) async fn http(
    addr: &str,
    method: &str,
    path: &str,
    form: Option<&str>,
) -> (String, String) {
    let mut s = tokio::net::TcpStream::connect(addr).await.expect("connect");
    let body = form.unwrap_or("");
    let extra = if form.is_some() {
        format!(
            "content-type: application/x-www-form-urlencoded\r\norigin: http://{addr}\r\ncontent-length: {}\r\n",
            body.len()
        )
    } else {
        String::new()
    };
    let req = format!(
        "{method} {path} HTTP/1.1\r\nhost: {addr}\r\nconnection: close\r\n{extra}\r\n{body}"
    );
    s.write_all(req.as_bytes()).await.expect("write");
    let mut out = String::new();
    s.read_to_string(&mut out).await.expect("read");
    let (head, body) = out.split_once("\r\n\r\n").unwrap_or((&out, ""));
    (
        head.lines().next().unwrap_or("").to_owned(),
        body.to_owned(),
    )
}

/// p50 and p95 of `n` GETs of `path` (ms), after one unmeasured whose body must contain
/// `shows` (so a fast answer is not an empty one).
pub(crate) async fn timed(addr: &str, path: &str, shows: &str, n: usize) -> (f64, f64) {
    let (status, body) = http(addr, "GET", path, None).await;
    assert!(status.contains("200"), "{path}: {status} {body}");
    assert!(body.contains(shows), "{path} does not show {shows:?}");
    let mut ms = Vec::with_capacity(n);
    for _ in 0..n {
        let t = Instant::now();
        let (status, _) = http(addr, "GET", path, None).await;
        ms.push(t.elapsed().as_secs_f64() * 1000.0);
        assert!(status.contains("200"), "{path}: {status}");
    }
    ms.sort_by(f64::total_cmp);
    (percentile(&ms, 50.0), percentile(&ms, 95.0))
}

pub(crate) fn csrf(page: &str) -> String {
    let at = page.find("name=\"csrf\" value=\"").expect("a csrf field") + 19;
    page[at..at + 32].to_owned()
}

/// The dashboard's jobs, as `/api/jobs` lists them.
pub(crate) async fn jobs(addr: &str) -> Vec<serde_json::Value> {
    let (_, body) = http(addr, "GET", "/api/jobs", None).await;
    let v: serde_json::Value = serde_json::from_str(&body).unwrap_or_default();
    v["jobs"].as_array().cloned().unwrap_or_default()
}

/// A lane name as a query value.
pub(crate) fn ferriq_dashboard_enc(s: &str) -> String {
    form_urlencoded::byte_serialize(s.as_bytes()).collect()
}
