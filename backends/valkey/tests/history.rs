//! History on Valkey (on a server of the test's own: a day of minutes is written): counts add
//! up per minute and task, read back in minute order, and a day of one task with every count
//! used stays under the stated memory bound; reading a day answers quickly.

mod common;

use std::time::Instant;

use ferriq::store::{MinuteStats, OpsStore, HISTORY_BUCKETS};

/// The server's `used_memory`, bytes.
fn used_memory(port: u16) -> u64 {
    let out = std::process::Command::new("redis-cli")
        .args(["-p", &port.to_string(), "info", "memory"])
        .output()
        .expect("redis-cli");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .find_map(|l| l.strip_prefix("used_memory:"))
        .and_then(|v| v.trim().parse().ok())
        .expect("used_memory")
}

fn full_minute(minute: u64, task: &str) -> MinuteStats {
    let mut s = MinuteStats::new(minute, task);
    s.succeeded = 1_000;
    s.failed = 17;
    for (i, b) in s.durations.iter_mut().enumerate() {
        *b = 100 + i as u64;
    }
    s
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn counts_add_up_and_a_day_stays_within_its_bound() {
    let server = common::PrivateRedis::start().await;
    let prefix = common::prefix();
    let store = common::store_at(&server.url(), &prefix, |b| b).await;
    let start = 29_000_000u64;

    // Two workers add to the same minute; another task and minute beside them.
    let mut a = MinuteStats::new(start, "t.a");
    a.succeeded = 3;
    a.durations[2] = 3;
    let mut b = MinuteStats::new(start, "t.a");
    b.failed = 1;
    b.durations[2] = 1;
    let mut c = MinuteStats::new(start + 1, "t.b");
    c.succeeded = 2;
    c.durations[HISTORY_BUCKETS.len()] = 2;
    store.add_history(&[a, c.clone()]).await.unwrap();
    store.add_history(&[b]).await.unwrap();
    let read = store.history(start, start + 1).await.unwrap();
    let mut want = MinuteStats::new(start, "t.a");
    want.succeeded = 3;
    want.failed = 1;
    want.durations[2] = 4;
    assert_eq!(read, vec![want, c]);
    assert_eq!(read[1].quantile(0.5), Some(f64::INFINITY));

    // A day of one task with every count in use.
    let day: Vec<MinuteStats> = (0..1440)
        .map(|m| full_minute(start + 10 + m, "t.day"))
        .collect();
    let before = used_memory(server.port);
    for chunk in day.chunks(60) {
        store.add_history(chunk).await.unwrap();
    }
    let bytes = used_memory(server.port).saturating_sub(before);
    eprintln!("a day of one task with every count used: {bytes} bytes of server memory");
    // The bound README states: under 600 KB per task name and day, every count used.
    assert!(bytes < 600_000, "{bytes} bytes");

    let t = Instant::now();
    let read = store.history(start + 10, start + 10 + 1439).await.unwrap();
    let took = t.elapsed();
    eprintln!("a day read back in {took:?}");
    assert_eq!(read.len(), 1440);
    assert_eq!(read, day);
}
