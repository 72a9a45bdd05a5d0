//! The dead-letter index on Valkey answers every filter as the memory store does (the same
//! entries, the same pages), keeps its per-task and per-reason sets right when an entry is
//! replaced or removed, and — on a server of the test's own — pages through 100,000 dead
//! letters with any filter in well under the dashboard's 500 ms.

mod common;

use std::time::{Duration, Instant};

use ferriq::dead_letters::DeadFilter;
use ferriq::memory::MemoryStore;
use ferriq::store::{DeadEntry, DeadPage, OpsStore};
use ferriq::wire::TaskId;

const NOW: u64 = 1_800_000_000_000;

fn entry(lane: &str, i: u64) -> DeadEntry {
    let task = ["billing.charge", "mail.send", "reports.render"][(i % 3) as usize];
    let reason = [
        "retries_exhausted",
        "non_retryable",
        "expired",
        "unknown_task",
    ][(i % 4) as usize];
    let detail = if i.is_multiple_of(10) {
        format!("HTTP 503 from Upstream (try {i})")
    } else {
        format!("card declined #{i}")
    };
    let body = format!(
        r#"{{"task_id":"{}","task_name":"{task}","args":[{i}],"kwargs":{{}},"labels":{{}}}}"#,
        TaskId::derived(&["dead", &i.to_string()])
    );
    DeadEntry::new(lane, None, body.as_bytes())
        .reason(reason)
        .detail(&detail)
        .attempts((i % 5) as u32)
        // Some share a millisecond: ties are ordered by key on both stores.
        .dead_at_ms(NOW - 1_000 * (i / 2))
}

fn filters() -> Vec<DeadFilter> {
    vec![
        DeadFilter::all(),
        DeadFilter::all().task_name("mail.send"),
        DeadFilter::all().reason("expired"),
        DeadFilter::all()
            .task_name("mail.send")
            .reason("retries_exhausted"),
        DeadFilter::all().detail_contains("upstream"),
        DeadFilter::all()
            .task_name("billing.charge")
            .detail_contains("503"),
        DeadFilter::all().older_than(Duration::from_secs(60)),
        DeadFilter::all()
            .reason("non_retryable")
            .older_than(Duration::from_secs(30))
            .detail_contains("declined"),
        DeadFilter::all().task_name("nobody"),
        DeadFilter::all().task_id(TaskId::derived(&["dead", "7"])),
        DeadFilter::all().any_of_keys([
            TaskId::derived(&["dead", "3"]).to_string(),
            TaskId::derived(&["dead", "4"]).to_string(),
            "missing".to_owned(),
        ]),
    ]
}

async fn page(
    s: &dyn OpsStore,
    lane: &str,
    f: &DeadFilter,
    offset: usize,
    limit: usize,
) -> DeadPage {
    s.dead_index(lane, f, NOW, offset, limit)
        .await
        .unwrap()
        .expect("an index")
}

async fn check(valkey: &dyn OpsStore, memory: &dyn OpsStore, lane: &str, label: &str) {
    for f in filters() {
        for (offset, limit) in [(0, 50), (40, 25), (290, 50)] {
            let v = page(valkey, lane, &f, offset, limit).await;
            let m = page(memory, lane, &f, offset, limit).await;
            assert_eq!(v, m, "{label}: {f:?} at {offset}+{limit}");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn answers_every_filter_as_the_memory_store_does() {
    let valkey = common::store_at(&common::url(), &common::prefix(), |b| b).await;
    let memory = MemoryStore::new();
    let lane = "dead-index-a";
    let entries: Vec<DeadEntry> = (0..300).map(|i| entry(lane, i)).collect();
    for s in [&valkey as &dyn OpsStore, &memory] {
        s.index_dead(&entries).await.unwrap();
        // Another lane's entries stay apart.
        s.index_dead(&[entry("dead-index-b", 1)]).await.unwrap();
    }
    check(&valkey, &memory, lane, "as added").await;
    let all = page(&valkey, lane, &DeadFilter::all(), 0, 1).await;
    assert_eq!((all.total, all.indexed), (300, 300));
    let first = &all.entries[0];
    assert_eq!(first.arguments, "[0]");
    assert_eq!(first.task_name.as_deref(), Some("billing.charge"));
    assert_eq!(first.reason.as_deref(), Some("retries_exhausted"));

    // Parked again under another task name and reason: it leaves its old sets.
    let moved = entry(lane, 7).task_name("moved.task").reason("too_large");
    for s in [&valkey as &dyn OpsStore, &memory] {
        s.index_dead(std::slice::from_ref(&moved)).await.unwrap();
    }
    check(&valkey, &memory, lane, "after a replacement").await;
    let old_set = page(
        &valkey,
        lane,
        &DeadFilter::all().task_name("billing.charge"),
        0,
        500,
    )
    .await;
    assert!(old_set.entries.iter().all(|e| e.key != moved.key));
    assert_eq!(
        page(&valkey, lane, &DeadFilter::all().reason("too_large"), 0, 5)
            .await
            .total,
        1
    );

    // Removed (a redrive or a purge): gone from every set; a key not there is skipped.
    let gone: Vec<String> = (0..300)
        .step_by(3)
        .map(|i| entry(lane, i).key)
        .chain(["nope".into()])
        .collect();
    for s in [&valkey as &dyn OpsStore, &memory] {
        s.unindex_dead(lane, &gone).await.unwrap();
    }
    check(&valkey, &memory, lane, "after removals").await;
    assert_eq!(
        page(&valkey, lane, &DeadFilter::all(), 0, 1).await.indexed,
        200
    );
    assert_eq!(
        page(
            &valkey,
            lane,
            &DeadFilter::all().task_name("billing.charge"),
            0,
            1
        )
        .await
        .total,
        0
    );

    // Cleared: empty, and the other lane untouched.
    valkey.clear_dead_index(lane).await.unwrap();
    let cleared = page(
        &valkey,
        lane,
        &DeadFilter::all().task_name("mail.send"),
        0,
        10,
    )
    .await;
    assert_eq!((cleared.total, cleared.indexed), (0, 0));
    assert_eq!(
        page(&valkey, "dead-index-b", &DeadFilter::all(), 0, 10)
            .await
            .total,
        1
    );
}

fn p95(mut ms: Vec<f64>) -> f64 {
    ms.sort_by(f64::total_cmp);
    ms[(ms.len() * 95).div_ceil(100) - 1]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pages_through_100_000_dead_letters_quickly() {
    let server = common::PrivateRedis::start().await;
    let store = common::store_at(&server.url(), &common::prefix(), |b| b).await;
    let lane = "big";
    let entries: Vec<DeadEntry> = (0..100_000).map(|i| entry(lane, i)).collect();
    let before = common::used_memory(server.port);
    let started = Instant::now();
    for chunk in entries.chunks(5_000) {
        store.index_dead(chunk).await.unwrap();
    }
    let bytes = common::used_memory(server.port) - before;
    eprintln!(
        "indexed 100,000 dead letters in {:.1} s: {:.1} MB of server memory",
        started.elapsed().as_secs_f64(),
        bytes as f64 / 1e6
    );
    // The documented bound: at most about 2 KB per entry (error text and arguments cut).
    assert!(bytes < 100_000 * 2_000, "{bytes} bytes for 100,000 entries");
    let mut worst = 0f64;
    for (f, offset) in filters()
        .into_iter()
        .zip([0, 5_000, 0, 50, 0, 0, 20_000, 0, 0, 0, 0])
    {
        let mut times = Vec::new();
        let mut total = 0;
        for _ in 0..20 {
            let t = Instant::now();
            let p = page(&store, lane, &f, offset, 50).await;
            times.push(t.elapsed().as_secs_f64() * 1000.0);
            total = p.total;
            assert_eq!(p.indexed, 100_000);
        }
        let p95 = p95(times);
        worst = worst.max(p95);
        eprintln!("{f:?} from {offset}: {total} match, p95 {p95:.1} ms");
    }
    // Everything but the error-text scans reads only its page; a scan of all 100,000 texts
    // takes the server ~100 ms alone. The dashboard's target (500 ms p95) is measured by
    // `examples/dashboard_scale.rs` in a release build on a quiet machine; here, beside the
    // rest of the suite, only a page that reads the whole index into the client (seconds)
    // fails.
    assert!(worst < 5_000.0, "a filtered page took {worst:.0} ms at p95");
}
