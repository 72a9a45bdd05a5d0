//! Bad input: each malformed message ends in the dead-letter queue with its reason, absurd
//! labels are clamped (the task runs), and no worker panics or dies.

use std::collections::HashMap;
use std::path::Path;
use std::time::Duration;

use ferriq::broker::OutgoingMessage;
use ferriq::store::ResultStore;
use ferriq::wire::{TaskId, TaskMessage};
use tokio::time::Instant;

use crate::report::{judge, Row};
use crate::tasks;
use crate::world::{Backend, Settings, World};

/// A message whose body is `body`, with `task_id` set where the body carries one.
fn raw(body: Vec<u8>) -> OutgoingMessage {
    OutgoingMessage::raw(body)
}

fn message(name: &str, args: serde_json::Value) -> TaskMessage {
    let mut m = TaskMessage::new(name);
    if let serde_json::Value::Array(a) = args {
        m.args = a;
    }
    m
}

/// Runs the bad-input row on `backend`.
pub async fn run(backend: Backend, root: &Path) -> Row {
    let settings = Settings {
        max_payload: Some(64 * 1024),
        env: vec![
            ("FERRIQ_MAX_UNROUTABLE_RECEIVES", "2".into()),
            ("FERRIQ_UNKNOWN_TASK_RELEASE_SECS", "1".into()),
            ("FERRIQ_UNSUPPORTED_RELEASE_SECS", "1".into()),
        ],
        ..Settings::default()
    };
    let mut w = World::new(backend, root, settings).await;
    let worker = w.spawn_worker();
    // (what, message, expected reason)
    let mut cases: Vec<(&str, OutgoingMessage, &str)> = vec![
        ("not JSON", raw(b"hello, worker".to_vec()), "invalid_message"),
        ("JSON, not a message", raw(b"[1, 2, 3]".to_vec()), "invalid_message"),
        (
            "missing fields",
            raw(format!(r#"{{"task_id": "{}"}}"#, TaskId::random()).into_bytes()),
            "invalid_message",
        ),
        (
            "10,000-deep nesting",
            raw(format!(
                r#"{{"task_id":"{}","task_name":"fault.work","labels":{{}},"args":[{}1{}],"kwargs":{{}}}}"#,
                TaskId::random(),
                "[".repeat(10_000),
                "]".repeat(10_000)
            )
            .into_bytes()),
            "invalid_message",
        ),
        (
            "payload above the limit",
            OutgoingMessage::from_message(&message(
                tasks::work::NAME,
                serde_json::json!(["x".repeat(100 * 1024)]),
            ))
            .unwrap(),
            "too_large",
        ),
        (
            "wrong argument types",
            OutgoingMessage::from_message(&message(tasks::work::NAME, serde_json::json!(["ten"])))
                .unwrap(),
            "non_retryable",
        ),
        (
            "unknown task name",
            OutgoingMessage::from_message(&TaskMessage::new("fault.nobody")).unwrap(),
            "unknown_task",
        ),
        (
            "newer wire version",
            {
                let mut m = message(tasks::work::NAME, serde_json::json!([1]));
                m.labels.insert("ferriq_wire", 99i64);
                OutgoingMessage::from_message(&m).unwrap()
            },
            "unsupported_wire_version",
        ),
    ];
    if backend == Backend::Amqp {
        // SQS carries text only, at most 256 KiB.
        cases.push((
            "non-UTF-8 body",
            raw(vec![0xff, 0xfe, 0x00, 0x9f, 0x92, 0x96]),
            "invalid_message",
        ));
        cases.push((
            "a 10 MB label",
            {
                let mut m = message(tasks::work::NAME, serde_json::json!([1]));
                m.labels.insert("huge", "x".repeat(10 * 1024 * 1024));
                let mut out = OutgoingMessage::from_message(&m).unwrap();
                // Not as a header too: RabbitMQ caps a frame's headers, not its body.
                out.labels.remove("huge");
                out
            },
            "too_large",
        ));
    }
    let n_bad = cases.len();
    for (_, msg, _) in &cases {
        w.broker.publish(vec![msg.clone()]).await.expect("publish");
    }
    // Absurd labels are clamped: these run.
    let mut clamped = Vec::new();
    for (label, value) in [
        ("max_retries", 1_000_000_000i64),
        ("timeout", 1_000_000_000_000),
    ] {
        let mut m = message(tasks::work::NAME, serde_json::json!([5]));
        m.labels.insert(label, value);
        clamped.push(m.task_id.clone());
        w.broker
            .publish(vec![OutgoingMessage::from_message(&m).unwrap()])
            .await
            .expect("publish");
    }
    // An absurd delay waits (clamped to a year): neither run nor parked.
    let mut delayed = message(tasks::work::NAME, serde_json::json!([5]));
    delayed.labels.insert("delay", 1e15);
    let delayed_id = delayed.task_id.clone();
    w.client.enqueue_message(delayed).await.expect("enqueue");
    w.sent = clamped.clone();

    let deadline = Instant::now() + Duration::from_secs(120);
    let mut reasons: HashMap<String, usize> = HashMap::new();
    while Instant::now() < deadline {
        reasons.clear();
        if let Ok(all) = w.client.ops().dead_letters(&w.lane, 0, 1000).await {
            for m in all {
                *reasons.entry(m.reason.unwrap_or_default()).or_default() += 1;
            }
        }
        if reasons.values().sum::<usize>() >= n_bad && w.written() >= w.sent.len() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let alive = w.alive(worker);
    let stderr = std::fs::read_to_string(w.events_dir.join("w1.stderr")).unwrap_or_default();
    let mut expected: HashMap<String, usize> = HashMap::new();
    for (_, _, reason) in &cases {
        *expected.entry((*reason).to_owned()).or_default() += 1;
    }
    let delayed_result = w.store.get(&delayed_id).await;
    let mut j = judge(
        &w,
        "bad input (each malformed message parked)",
        format!("{} malformed, 3 absurd labels", n_bad),
        false,
        None,
    );
    j.row.tasks = n_bad + 3;
    j.row.notes.push(format!("parked by reason {:?}", {
        let mut r: Vec<_> = reasons.iter().collect();
        r.sort();
        r
    }));
    j.row.check(
        reasons == expected,
        format!("parked {reasons:?}, expected {expected:?}"),
    );
    j.row.check(alive, "the worker died");
    j.row
        .check(!stderr.contains("panicked"), "the worker panicked");
    j.row.check(
        matches!(delayed_result, Ok(ferriq::store::ResultStatus::Pending)),
        "the absurdly delayed task ran or was parked",
    );
    let row = j.row;
    w.cleanup().await;
    row
}
