//! The taskiq wire format: real taskiq bytes parse, messages round-trip, and no input panics.

use ferriq::broker::OutgoingMessage;
use ferriq::wire::{ErrorKind, LabelValue, Labels, TaskId, TaskMessage, TaskResult};
use proptest::prelude::*;
use serde_json::{json, Map, Value};

/// Bytes produced by taskiq 0.13 (design §3).
const TASKIQ_MESSAGE: &str = r#"{"task_id": "0123456789abcdef0123456789abcdef", "task_name": "custom.name", "labels": {"retry_on_error": "True", "max_retries": "5", "timeout": "2.5", "priority": "3", "delay": "10", "queue_name": "q2", "blob": "AP8=", "extra": "[1, 2]"}, "labels_types": {"retry_on_error": 5, "max_retries": 2, "timeout": 4, "priority": 2, "delay": 2, "queue_name": 3, "blob": 6, "extra": 1}, "args": ["hi"], "kwargs": {"flag": true}}"#;

const TASKIQ_RESULT: &str = r#"{"is_err": false, "log": null, "return_value": 5, "execution_time": 0.0, "labels": {}, "error": null}"#;

#[test]
fn taskiq_message_parses_with_typed_labels() {
    let msg = TaskMessage::from_json(TASKIQ_MESSAGE.as_bytes()).unwrap();
    assert_eq!(msg.task_id.as_str(), "0123456789abcdef0123456789abcdef");
    assert_eq!(msg.task_name, "custom.name");
    assert_eq!(msg.args, vec![json!("hi")]);
    assert_eq!(msg.kwargs.get("flag"), Some(&json!(true)));
    let l = &msg.labels;
    assert_eq!(l.get("retry_on_error"), Some(&LabelValue::Bool(true)));
    assert_eq!(l.get("max_retries"), Some(&LabelValue::Int(5)));
    assert_eq!(l.get("timeout"), Some(&LabelValue::Float(2.5)));
    assert_eq!(l.get("blob"), Some(&LabelValue::Bytes(vec![0x00, 0xff])));
    assert_eq!(l.get("extra"), Some(&LabelValue::Any(json!("[1, 2]"))));
    assert_eq!(l.retry_on_error(), Some(true));
    assert_eq!(l.max_retries(), Some(5));
    assert_eq!(l.timeout(), Some(std::time::Duration::from_millis(2500)));
    assert_eq!(l.priority(), Some(3));
    assert_eq!(l.delay(), Some(std::time::Duration::from_secs(10)));
    assert_eq!(l.queue_name(), Some("q2"));
    assert_eq!(l.wire_version(), 1);
}

#[test]
fn taskiq_message_is_written_back_the_taskiq_way() {
    let msg = TaskMessage::from_json(TASKIQ_MESSAGE.as_bytes()).unwrap();
    let written = msg.to_json().unwrap();
    let original: Value = serde_json::from_str(TASKIQ_MESSAGE).unwrap();
    let ours: Value = serde_json::from_slice(&written).unwrap();
    assert_eq!(
        ours, original,
        "same labels, same labels_types, same arguments"
    );
    let text = String::from_utf8(written.clone()).unwrap();
    assert!(
        !text.contains('\n') && !text.contains("\": "),
        "compact JSON: {text}"
    );
    assert_eq!(TaskMessage::from_json(&written).unwrap(), msg);
}

#[test]
fn untyped_and_raw_label_values_are_read() {
    // labels_types absent, and a middleware's raw JSON numbers/bools.
    let body = br#"{"task_id":"abc","task_name":"t","labels":{"timeout":3,"retry_on_error":false,"max_retries":"2","x":null},"args":[],"kwargs":{}}"#;
    let msg = TaskMessage::from_json(body).unwrap();
    assert_eq!(
        msg.labels.timeout(),
        Some(std::time::Duration::from_secs(3))
    );
    assert_eq!(msg.labels.retry_on_error(), Some(false));
    assert_eq!(msg.labels.max_retries(), Some(2));
    assert_eq!(msg.labels.get("x"), Some(&LabelValue::Any(Value::Null)));
    // Typed INT given as a raw number (taskiq's requeue writes parsed labels back).
    let body = br#"{"task_id":"abc","task_name":"t","labels":{"delay":5},"labels_types":{"delay":2},"args":[],"kwargs":{}}"#;
    assert_eq!(
        TaskMessage::from_json(body).unwrap().labels.get("delay"),
        Some(&LabelValue::Int(5))
    );
}

#[test]
fn invalid_messages_say_what_is_wrong() {
    let cases: [(&[u8], &str); 6] = [
        (b"", "not a JSON object"),
        (b"[1]", "not an object"),
        (br#"{"task_name":"t"}"#, "task_id"),
        (br#"{"task_id":"a b","task_name":"t"}"#, "invalid task id"),
        (br#"{"task_id":"a","task_name":""}"#, "task_name"),
        (br#"{"task_id":"a","task_name":"t","args":{}}"#, "args"),
    ];
    for (body, says) in cases {
        let err = TaskMessage::from_json(body).unwrap_err().to_string();
        assert!(err.contains(says), "{err:?} should mention {says:?}");
    }
}

#[test]
fn taskiq_result_parses_and_round_trips() {
    let result: TaskResult = serde_json::from_str(TASKIQ_RESULT).unwrap();
    assert!(!result.is_err);
    assert_eq!(result.return_value, json!(5));
    let back: Value = serde_json::to_value(&result).unwrap();
    assert_eq!(back, serde_json::from_str::<Value>(TASKIQ_RESULT).unwrap());
}

#[test]
fn result_labels_are_written_as_plain_json_and_read_back() {
    let labels: Labels = [
        ("queue_name", LabelValue::from("q")),
        ("max_retries", LabelValue::from(3)),
        ("timeout", LabelValue::from(2.5)),
        ("retry_on_error", LabelValue::from(true)),
        ("custom", LabelValue::Any(json!({"a": [1, 2]}))),
    ]
    .into_iter()
    .collect();
    let result = TaskResult::success(json!(1), 0.5, labels);
    let v = serde_json::to_value(&result).unwrap();
    assert_eq!(
        v["labels"],
        json!({"queue_name": "q", "max_retries": 3, "timeout": 2.5, "retry_on_error": true, "custom": {"a": [1, 2]}})
    );
    let back: TaskResult = serde_json::from_value(v).unwrap();
    assert_eq!(back, result);
    // taskiq writers that leave labels out or null.
    let raw = r#"{"is_err": false, "log": null, "return_value": 5, "execution_time": 0.0, "labels": null, "error": null}"#;
    let read: TaskResult = serde_json::from_str(raw).unwrap();
    assert!(read.labels.is_empty());
}

#[test]
fn ferriq_errors_are_taskiq_exception_reprs() {
    let r = TaskResult::failure(
        ErrorKind::RetriesExhausted,
        "gave up",
        true,
        3,
        1.5,
        Labels::new(),
    );
    let v = serde_json::to_value(&r).unwrap();
    let err = &v["error"];
    // Every key taskiq's ExceptionRepr requires, exc_module included.
    for key in [
        "exc_type",
        "exc_message",
        "exc_module",
        "exc_cause",
        "exc_context",
        "exc_suppress_context",
    ] {
        assert!(err.get(key).is_some(), "missing {key}");
    }
    assert_eq!(err["exc_type"], "RetriesExhausted");
    assert_eq!(err["exc_module"], "ferriq");
    assert_eq!(
        err["exc_message"],
        json!(["gave up", {"retryable": true, "attempts": 3}])
    );
    let f = r.failure_details().unwrap();
    assert_eq!(
        (f.kind, f.retryable, f.attempts),
        (Some(ErrorKind::RetriesExhausted), true, 3)
    );
    // A Python worker's error reads too.
    let py = json!({"is_err": true, "log": null, "return_value": null, "execution_time": 0.02, "labels": {},
        "error": {"exc_type": "ValueError", "exc_message": ["plain"], "exc_module": "builtins",
                  "exc_cause": null, "exc_context": null, "exc_suppress_context": false}});
    let f = serde_json::from_value::<TaskResult>(py)
        .unwrap()
        .failure_details()
        .unwrap();
    assert_eq!(
        (f.kind, f.exc_type.as_str(), f.message.as_str()),
        (None, "ValueError", "plain")
    );
}

#[test]
fn outgoing_messages_carry_taskiq_aio_pika_headers() {
    let msg = TaskMessage::from_json(TASKIQ_MESSAGE.as_bytes()).unwrap();
    let out = OutgoingMessage::from_message(&msg).unwrap();
    let header = |k: &str| {
        out.headers()
            .find(|(n, _)| *n == k)
            .map(|(_, v)| v.into_owned())
    };
    assert_eq!(
        header("task_id").as_deref(),
        Some("0123456789abcdef0123456789abcdef")
    );
    assert_eq!(header("task_name").as_deref(), Some("custom.name"));
    assert_eq!(header("retry_on_error").as_deref(), Some("True"));
    assert_eq!(header("priority").as_deref(), Some("3"));
    assert_eq!(out.queue.as_deref(), Some("q2"));
    // taskiq's `delay` is relative to a send time the message does not carry: a message that
    // arrives with it (and no `due_at`) was delayed by its producer's broker and runs at once.
    assert_eq!(out.delay, None);
    assert_eq!(out.priority, Some(3));
    // A raw body names no task: no made-up id in its headers.
    assert_eq!(
        OutgoingMessage::raw(b"not json".to_vec()).headers().count(),
        0
    );
}

#[test]
fn a_due_time_becomes_the_brokers_delay() {
    let mut msg = TaskMessage::new("t");
    msg.labels.insert("due_at", 1_000_010.5);
    let out = OutgoingMessage::from_message_at(&msg, 1_000_000.0).unwrap();
    assert_eq!(out.delay, Some(std::time::Duration::from_secs_f64(10.5)));
    let late = OutgoingMessage::from_message_at(&msg, 1_000_020.0).unwrap();
    assert_eq!(late.delay, None);
}

#[test]
fn huge_delays_and_timeouts_are_clamped() {
    let mut labels = Labels::new();
    labels.insert("delay", 1e12);
    labels.insert("timeout", -5.0);
    assert_eq!(labels.delay(), Some(ferriq::wire::MAX_DELAY));
    assert_eq!(labels.timeout(), None);
}

fn json_leaf() -> impl Strategy<Value = Value> {
    prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(Value::from),
        any::<f64>()
            .prop_filter("finite", |f| f.is_finite())
            .prop_map(Value::from),
        ".{0,12}".prop_map(Value::String),
    ]
}

fn json_value() -> impl Strategy<Value = Value> {
    json_leaf().prop_recursive(3, 24, 4, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
            prop::collection::btree_map(".{0,6}", inner, 0..4)
                .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

fn label_value() -> impl Strategy<Value = LabelValue> {
    prop_oneof![
        ".{0,12}".prop_map(LabelValue::Str),
        any::<i64>().prop_map(LabelValue::Int),
        any::<f64>()
            .prop_filter("finite", |f| f.is_finite())
            .prop_map(LabelValue::Float),
        any::<bool>().prop_map(LabelValue::Bool),
        prop::collection::vec(any::<u8>(), 0..16).prop_map(LabelValue::Bytes),
        json_value().prop_map(LabelValue::Any),
    ]
}

prop_compose! {
    fn message()(
        id in "[!-z|~]{1,40}",
        name in ".{1,30}",
        labels in prop::collection::btree_map("[a-z_]{1,10}", label_value(), 0..6),
        args in prop::collection::vec(json_value(), 0..4),
        kwargs in prop::collection::btree_map("[a-z_]{1,8}", json_value(), 0..4),
    ) -> TaskMessage {
        let mut msg = TaskMessage::new(name);
        msg.task_id = TaskId::parse(id).unwrap();
        msg.labels = labels.into_iter().collect();
        msg.args = args;
        msg.kwargs = kwargs.into_iter().collect();
        msg
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn any_message_round_trips(msg in message()) {
        let bytes = msg.to_json().unwrap();
        prop_assert_eq!(TaskMessage::from_json(&bytes).unwrap(), msg);
    }

    #[test]
    fn arbitrary_bytes_never_panic_the_parser(bytes in prop::collection::vec(any::<u8>(), 0..512)) {
        let _ = TaskMessage::from_json(&bytes);
        let _ = TaskMessage::peek_task_id(&bytes);
        let _ = TaskMessage::peek_task_name(&bytes);
        let _ = serde_json::from_slice::<TaskResult>(&bytes);
    }

    #[test]
    fn arbitrary_json_never_panics_the_parser(v in json_value(), labels in json_value(), types in json_value()) {
        let mut obj = Map::new();
        obj.insert("task_id".into(), json!("abc"));
        obj.insert("task_name".into(), json!("t"));
        obj.insert("args".into(), v);
        obj.insert("labels".into(), labels);
        obj.insert("labels_types".into(), types);
        let _ = TaskMessage::from_json(&serde_json::to_vec(&Value::Object(obj)).unwrap());
    }
}

#[test]
fn debug_output_shows_no_argument_or_body() {
    let mut msg = TaskMessage::new("billing.charge");
    msg.args.push(serde_json::json!("4111 1111 1111 1111"));
    msg.kwargs
        .insert("cvc".into(), serde_json::json!("secret-cvc"));
    msg.labels.insert("tenant", "acme-secret");
    let out = ferriq::broker::OutgoingMessage::from_message_at(&msg, 0.0).unwrap();
    for text in [format!("{msg:?}"), format!("{out:?}")] {
        assert!(text.contains("billing.charge"), "{text}");
        for secret in ["4111", "secret-cvc", "acme-secret"] {
            assert!(!text.contains(secret), "{secret} in {text}");
        }
    }
    assert!(
        format!("{msg:?}").contains("cvc"),
        "keyword names are shown"
    );
}
