//! History on Valkey (on a server of the test's own: a day of minutes is written): counts add
//! up per minute and task, read back in minute order, and a day of one task with every count
//! used stays under the stated memory bound; reading a day answers quickly.

mod common;

use std::time::Instant;

use ferriq::store::{FinishedTask, MinuteStats, OpsStore, HISTORY_BUCKETS};
use ferriq::wire::TaskId;

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

    // Operators' job records: replaced by id, listed as recorded.
    let week = std::time::Duration::from_secs(7 * 24 * 3600);
    store.record_job("j1", r#"{"done":1}"#, week).await.unwrap();
    store.record_job("j2", r#"{"done":5}"#, week).await.unwrap();
    store.record_job("j1", r#"{"done":2}"#, week).await.unwrap();
    let mut jobs = store.jobs().await.unwrap();
    jobs.sort();
    assert_eq!(
        jobs,
        vec![r#"{"done":2}"#.to_owned(), r#"{"done":5}"#.to_owned()]
    );

    // A day of one task with every count in use.
    let day: Vec<MinuteStats> = (0..1440)
        .map(|m| full_minute(start + 10 + m, "t.day"))
        .collect();
    let before = common::used_memory(server.port);
    for chunk in day.chunks(60) {
        store.add_history(chunk).await.unwrap();
    }
    let bytes = common::used_memory(server.port).saturating_sub(before);
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_million_finished_tasks_are_searched_by_name_outcome_and_time() {
    let server = common::PrivateRedis::start().await;
    let store = common::store_at(&server.url(), &common::prefix(), |b| b).await;
    let start_ms = 1_800_000_000_000u64;
    // A million of one task over an hour (a twentieth failed), and a rare one beside it.
    let n = 1_000_000u64;
    let before = common::used_memory(server.port);
    let mut batch = Vec::with_capacity(10_000);
    for i in 0..n {
        let at = start_ms + i * 3_600_000 / n;
        batch.push(FinishedTask::new(
            TaskId::random(),
            "t.hot",
            i % 20 == 0,
            at,
        ));
        if batch.len() == 10_000 {
            store.add_finished(&batch).await.unwrap();
            batch.clear();
        }
    }
    let rare: Vec<FinishedTask> = (0..3)
        .map(|i| FinishedTask::new(TaskId::random(), "t.rare", i == 1, start_ms + i * 1_200_000))
        .collect();
    store.add_finished(&rare).await.unwrap();
    let end = start_ms + 3_600_000;
    let bytes = common::used_memory(server.port).saturating_sub(before);
    eprintln!(
        "a million finished tasks indexed: {} MB of server memory",
        bytes / 1_000_000
    );
    // The bound README states: under 80 bytes per finished task.
    assert!(bytes < 80 * n, "{bytes} bytes");

    let newest = store
        .finished("t.rare", None, start_ms, end, 50)
        .await
        .unwrap();
    assert_eq!(newest.len(), 3);
    assert_eq!(newest[0], rare[2], "newest first");
    assert_eq!(
        store
            .finished("t.rare", Some(true), start_ms, end, 50)
            .await
            .unwrap(),
        vec![rare[1].clone()]
    );
    assert_eq!(
        store
            .finished("t.rare", None, start_ms + 1, start_ms + 1_200_000, 50)
            .await
            .unwrap(),
        vec![rare[1].clone()],
        "the time range is inclusive and exact"
    );

    // The dashboard's searches: a page of 50, of the hot task, each outcome, over the window.
    let mut took = Vec::new();
    for round in 0..20 {
        let failed = [None, Some(true), Some(false)][round % 3];
        let t = Instant::now();
        let found = store
            .finished("t.hot", failed, start_ms, end, 50)
            .await
            .unwrap();
        took.push(t.elapsed());
        assert_eq!(found.len(), 50);
        assert!(found.iter().all(|f| failed.is_none_or(|x| f.failed == x)));
        assert!(found.windows(2).all(|w| w[0].at_ms >= w[1].at_ms));
        let t = Instant::now();
        let rare = store
            .finished("t.rare", Some(false), start_ms, end, 50)
            .await
            .unwrap();
        took.push(t.elapsed());
        assert_eq!(rare.len(), 2);
    }
    took.sort();
    let p95 = took[took.len() * 95 / 100];
    eprintln!(
        "search among 1,000,000 finished tasks: p50 {:?}, p95 {p95:?}",
        took[took.len() / 2]
    );
    assert!(p95 < std::time::Duration::from_millis(500), "p95 {p95:?}");
}
