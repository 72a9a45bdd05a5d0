//! `ferriq dashboard` against the real RabbitMQ and Redis: it refuses to listen beyond
//! loopback without a token, and serves the lanes it is given.

mod common;

use std::time::Duration;

use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};

/// A plain HTTP/1.1 GET; the whole answer.
async fn http_get(addr: &str, path: &str) -> String {
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    s.write_all(
        format!("GET {path} HTTP/1.1\r\nhost: {addr}\r\nconnection: close\r\n\r\n").as_bytes(),
    )
    .await
    .unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).await.unwrap();
    out
}

#[tokio::test]
async fn beyond_loopback_a_token_is_required() {
    let setup = common::Setup::new();
    let out = setup
        .run(&["dashboard", "--listen", "0.0.0.0:0"], None)
        .await;
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("FERRIQ_DASHBOARD_TOKEN"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn it_serves_the_lanes_live() {
    let setup = common::Setup::new();
    // Declares the lane (the command never does).
    let client = setup.client_with_lanes(&[setup.lane.as_str()]).await;
    let mut child =
        tokio::process::Command::from(setup.command(&["dashboard", "--listen", "127.0.0.1:0"]))
            .stderr(std::process::Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .unwrap();
    let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
    let addr = tokio::time::timeout(Duration::from_secs(30), async {
        while let Some(line) = lines.next_line().await.unwrap() {
            if let Some(rest) = line.split("dashboard on http://").nth(1) {
                return rest.split('/').next().unwrap().to_owned();
            }
        }
        panic!("the dashboard exited before serving")
    })
    .await
    .expect("serving within 30 s");
    let page = http_get(&addr, "/").await;
    assert!(page.starts_with("HTTP/1.1 200"), "{page}");
    assert!(page.contains(&setup.lane) && page.contains("read-only"));
    let api = http_get(&addr, "/api/overview").await;
    let json = api.split("\r\n\r\n").nth(1).unwrap();
    let v: serde_json::Value = serde_json::from_str(json).unwrap();
    assert!(
        v["lanes"]
            .as_array()
            .unwrap()
            .iter()
            .any(|l| l["lane"] == setup.lane.as_str()),
        "{v}"
    );
    let refused = http_get(&addr, "/dead/redrive").await;
    assert!(refused.starts_with("HTTP/1.1 405"), "POST only: {refused}");
    child.start_kill().unwrap();
    let _ = child.wait().await;
    client.close().await;
}
