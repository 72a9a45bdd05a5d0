//! The one-pass reader against the tree reader it replaced, on every input.

use proptest::prelude::*;
use serde_json::{json, Map, Value};

use crate::wire::{Labels, TaskId, TaskMessage, WireError};

/// The reader this module replaced: the whole body as a `Value` tree, taken apart after.
/// The one-pass reader must agree with it on every input, errors included.
fn through_a_tree(body: &[u8]) -> Result<TaskMessage, WireError> {
    let value: Value =
        serde_json::from_slice(body).map_err(|e| WireError::NotJson(e.to_string()))?;
    let Value::Object(mut obj) = value else {
        return Err(WireError::NotJson(
            "the top-level value is not an object".into(),
        ));
    };
    let kind = |v: &Value| match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    };
    let invalid = |field: &'static str, what: &str, got: Option<Value>| {
        let got = match got {
            None => "it is missing".to_owned(),
            Some(v) => format!("got {}", kind(&v)),
        };
        WireError::InvalidField {
            field,
            reason: format!("{what}; {got}"),
        }
    };
    let task_id = match obj.remove("task_id") {
        Some(Value::String(s)) => TaskId::parse(s)?,
        other => return Err(invalid("task_id", "must be a string", other)),
    };
    let task_name = match obj.remove("task_name") {
        Some(Value::String(s)) if !s.is_empty() => s,
        other => return Err(invalid("task_name", "must be a non-empty string", other)),
    };
    let labels = match obj.remove("labels") {
        None | Some(Value::Null) => Map::new(),
        Some(Value::Object(m)) => m,
        other => return Err(invalid("labels", "must be an object", other)),
    };
    let types = match obj.remove("labels_types") {
        None | Some(Value::Null) => Map::new(),
        Some(Value::Object(m)) => m,
        other => return Err(invalid("labels_types", "must be an object or null", other)),
    };
    let args = match obj.remove("args") {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::Array(a)) => a,
        other => return Err(invalid("args", "must be an array", other)),
    };
    let kwargs = match obj.remove("kwargs") {
        None | Some(Value::Null) => Map::new(),
        Some(Value::Object(m)) => m,
        other => return Err(invalid("kwargs", "must be an object", other)),
    };
    let types: Vec<(String, Value)> = types.into_iter().collect();
    Ok(TaskMessage {
        task_id,
        task_name: task_name.into(),
        labels: Labels::from_wire(labels, &types),
        args,
        kwargs,
    })
}

fn agree(body: &[u8]) -> Result<(), TestCaseError> {
    let one_pass = TaskMessage::from_json(body).map_err(|e| e.to_string());
    let tree = through_a_tree(body).map_err(|e| e.to_string());
    match (&one_pass, &tree) {
        // serde_json words syntax errors by where it stopped; both readers stop there.
        (Err(a), Err(b)) if a.contains("not a JSON") && b.contains("not a JSON") => {}
        _ => prop_assert_eq!(one_pass, tree, "body {}", String::from_utf8_lossy(body)),
    }
    Ok(())
}

fn leaf() -> impl Strategy<Value = Value> {
    prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::from),
        any::<i64>().prop_map(Value::from),
        (-1e6f64..1e6).prop_map(Value::from),
        "[a-z0-9_ ]{0,12}".prop_map(Value::from),
        Just(json!("0123456789abcdef0123456789abcdef")),
        Just(json!("t")),
        Just(json!("")),
        (1i64..7).prop_map(|c| json!(c.to_string())),
    ]
}

fn value() -> impl Strategy<Value = Value> {
    leaf().prop_recursive(3, 24, 4, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
            prop::collection::vec(("[a-e]{1,2}", inner), 0..4)
                .prop_map(|kv| Value::Object(kv.into_iter().collect())),
        ]
    })
}

/// An object's text with fields from the message's own names and others, some of them
/// repeated (which a `Map` cannot hold, so the text is written by hand).
fn body() -> impl Strategy<Value = Vec<u8>> {
    let name = prop_oneof![
        Just("task_id"),
        Just("task_name"),
        Just("labels"),
        Just("labels_types"),
        Just("args"),
        Just("kwargs"),
        Just("other"),
    ];
    prop::collection::vec((name, value()), 0..9).prop_map(|fields| {
        let inner: Vec<String> = fields
            .iter()
            .map(|(k, v)| format!("{}:{}", json!(k), v))
            .collect();
        format!("{{{}}}", inner.join(",")).into_bytes()
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]
    #[test]
    fn the_one_pass_reader_agrees_with_the_tree(body in body()) {
        agree(&body)?;
    }

    #[test]
    fn valid_messages_with_typed_labels_read_the_same(
        labels in prop::collection::vec(("[a-d]{1,2}", leaf()), 0..6),
        types in prop::collection::vec(("[a-d]{1,2}", leaf()), 0..6),
        args in prop::collection::vec(value(), 0..3),
    ) {
        let text = format!(
            r#"{{"task_id":"0123456789abcdef0123456789abcdef","task_name":"t","labels":{{{}}},"labels_types":{{{}}},"args":{},"kwargs":{{"k":1}}}}"#,
            labels.iter().map(|(k, v)| format!("{}:{}", json!(k), v)).collect::<Vec<_>>().join(","),
            types.iter().map(|(k, v)| format!("{}:{}", json!(k), v)).collect::<Vec<_>>().join(","),
            Value::Array(args),
        );
        agree(text.as_bytes())?;
    }
}

/// Label and type names are borrowed from the body; ones written with escapes are read too.
#[test]
fn escaped_type_names_still_type_their_labels() {
    let body = br#"{"task_id":"0123456789abcdef0123456789abcdef","task_name":"t","labels":{"retry_on_error":"True","n":"7","\u0078":"y"},"labels_types":{"retry_on_err\u006fr":5,"\u006e":2}}"#;
    agree(body).unwrap();
    let msg = TaskMessage::from_json(body).unwrap();
    assert_eq!(msg.labels.retry_on_error(), Some(true));
    assert_eq!(msg.labels.get("x").and_then(|v| v.as_str()), Some("y"));
    assert_eq!(msg.labels.get("n").and_then(|v| v.as_i64()), Some(7));
    assert!(matches!(
        msg.labels.get("n"),
        Some(crate::wire::LabelValue::Int(7))
    ));
}

/// Bodies the tree reader refused as JSON wherever the fault sits: in a field the message
/// does not use, in one of the wrong type, or in a top-level array.
#[test]
fn invalid_json_is_refused_wherever_it_hides() {
    let deep = format!("{}1{}", "[".repeat(200), "]".repeat(200));
    let id = r#""task_id":"0123456789abcdef0123456789abcdef","task_name":"t""#;
    for fault in [r#""\ud800""#, "1e400", deep.as_str()] {
        let mut bodies: Vec<Vec<u8>> = [
            format!("{{{id},\"other\":{fault}}}"),
            format!("{{{id},\"labels\":[{fault}]}}"),
            format!("{{{id},\"task_name\":{{\"x\":{fault}}}}}"),
            format!("[{fault}]"),
        ]
        .into_iter()
        .map(String::into_bytes)
        .collect();
        // A byte that is not UTF-8, as such (a JSON text cannot hold it any other way).
        let mut raw = format!("{{{id},\"other\":\"").into_bytes();
        raw.extend([0x80, b'"', b'}']);
        bodies.push(raw);
        for body in bodies {
            let err = TaskMessage::from_json(&body).unwrap_err().to_string();
            assert!(
                err.contains("not a JSON"),
                "{err}: {}",
                String::from_utf8_lossy(&body)
            );
            agree(&body).unwrap();
        }
    }
}

#[test]
fn what_is_not_an_object_is_refused_as_such() {
    for body in [&b"[1,2]"[..], b"\"x\"", b"3", b"null", b"true"] {
        let err = TaskMessage::from_json(body).unwrap_err().to_string();
        assert!(err.contains("not an object"), "{err}");
    }
    let err = TaskMessage::from_json(b"{} trailing")
        .unwrap_err()
        .to_string();
    assert!(err.contains("not a JSON"), "{err}");
}

#[test]
fn labels_written_twice_read_as_the_last_and_more_than_fit_in_place_read_whole() {
    let id = r#""task_id":"0123456789abcdef0123456789abcdef","task_name":"t""#;
    let many = (0..20)
        .map(|i| format!(r#""l{i}":"{i}""#))
        .collect::<Vec<_>>()
        .join(",");
    for (labels, expect) in [
        (r#""labels":{"a":"1"},"labels":null"#.to_owned(), Ok(0)),
        (r#""labels":{"a":"1"},"labels":{"b":"2"}"#.to_owned(), Ok(1)),
        (
            r#""labels":{"a":"1"},"labels":"x""#.to_owned(),
            Err("got a string"),
        ),
        (
            r#""labels":[1],"labels":{"a":"1","a":"2"}"#.to_owned(),
            Ok(1),
        ),
        (
            r#""labels_types":{"a":2},"labels_types":[],"labels":{"a":"1"}"#.to_owned(),
            Err("got an array"),
        ),
        (format!(r#""labels":{{{many}}}"#), Ok(20)),
    ] {
        let body = format!("{{{id},{labels}}}");
        agree(body.as_bytes()).unwrap();
        match (TaskMessage::from_json(body.as_bytes()), expect) {
            (Ok(msg), Ok(n)) => assert_eq!(msg.labels.len(), n, "{body}"),
            (Err(e), Err(got)) => assert!(e.to_string().contains(got), "{body}: {e}"),
            (other, _) => panic!("{body}: {other:?}"),
        }
    }
    let twice = format!(r#"{{{id},"labels":{{"a":"1","a":"2"}}}}"#);
    let msg = TaskMessage::from_json(twice.as_bytes()).unwrap();
    assert_eq!(msg.labels.get("a").and_then(|v| v.as_str()), Some("2"));
}

/// The fast reader's answer and the general reader's, side by side, as text; `None` where the
/// fast reader declined.
fn both_readers(body: &str) -> (Option<String>, String) {
    let (mut labels, mut types) = (super::Pairs::new(), super::Pairs::new());
    let fast = super::fast::read(body, &mut labels, &mut types)
        .map(|raw| format!("{raw:?} {labels:?} {types:?}"));
    let (mut labels, mut types) = (super::Pairs::new(), super::Pairs::new());
    let general = match super::read_general(body.as_bytes(), &mut labels, &mut types) {
        Ok(Some(raw)) => format!("{raw:?} {labels:?} {types:?}"),
        Ok(None) => "not an object".to_owned(),
        Err(e) => format!("error: {e}"),
    };
    (fast, general)
}

/// What the fast reader accepts, it reads as the general reader does (`Some(..)` there: it
/// never accepts what that one refuses, nor what is not an object).
fn fast_agrees(body: &str) -> Result<bool, TestCaseError> {
    let (fast, general) = both_readers(body);
    if let Some(fast) = &fast {
        prop_assert_eq!(fast, &general, "body {}", body);
    }
    Ok(fast.is_some())
}

/// A message in the common shape, its parts spaced and ordered as a producer may write them.
fn common_body() -> impl Strategy<Value = String> {
    let label = ("[a-z_]{1,12}", "[ -~]{0,16}");
    (
        prop::collection::vec(label, 0..5),
        prop::collection::vec(("[a-z_]{1,12}", 0u64..7), 0..5),
        prop::collection::vec(value(), 0..3),
        prop::collection::vec(("[a-c]{1,2}", value()), 0..3),
        prop::sample::select(vec!["", " ", "\n  ", "\t"]),
        any::<prop::sample::Index>(),
    )
        .prop_map(|(labels, types, args, kwargs, ws, order)| {
            let object =
                |items: Vec<String>| format!("{{{ws}{}{ws}}}", items.join(&format!(",{ws}")));
            let mut fields = [
                format!(r#""task_id"{ws}:{ws}"0123456789abcdef0123456789abcdef""#),
                format!(r#""task_name":{ws}"bench.noop""#),
                format!(
                    r#""labels":{}"#,
                    object(
                        labels
                            .iter()
                            .map(|(k, v)| format!("{}:{ws}{}", json!(k), json!(v)))
                            .collect()
                    )
                ),
                format!(
                    r#""labels_types":{}"#,
                    object(
                        types
                            .iter()
                            .map(|(k, v)| format!("{}:{v}", json!(k)))
                            .collect()
                    )
                ),
                format!(r#""args":{ws}{}"#, Value::Array(args)),
                format!(
                    r#""kwargs":{}"#,
                    Value::Object(kwargs.into_iter().collect())
                ),
            ];
            let turn = order.index(fields.len());
            fields.rotate_left(turn);
            format!("{ws}{{{ws}{}{ws}}}{ws}", fields.join(&format!(",{ws}")))
        })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]
    #[test]
    fn the_fast_reader_reads_the_common_shape_as_the_general_one_does(body in common_body()) {
        // A label value with an escape (`"` or `\` among the printable characters) is left to
        // the general reader; every other body of this shape is read fast.
        let escaped = body.contains('\\');
        prop_assert!(fast_agrees(&body)? || escaped, "declined: {}", body);
        agree(body.as_bytes())?;
    }

    #[test]
    fn the_fast_reader_accepts_nothing_the_general_one_reads_otherwise(body in body()) {
        let text = String::from_utf8(body).expect("generated bodies are UTF-8");
        fast_agrees(&text)?;
    }

    #[test]
    fn the_fast_reader_accepts_nothing_a_cut_or_changed_body_breaks(
        body in common_body(),
        at in any::<prop::sample::Index>(),
        byte in prop::sample::select(b"{}[]\":,\\ 0an-e.\x01".to_vec()),
        cut in any::<bool>(),
    ) {
        let mut bytes = body.into_bytes();
        let at = at.index(bytes.len());
        if cut {
            bytes.truncate(at);
        } else {
            bytes[at] = byte;
        }
        if let Ok(text) = String::from_utf8(bytes) {
            fast_agrees(&text)?;
        }
    }
}

/// Bodies the fast reader must leave to the general one, each for its own reason.
#[test]
fn the_fast_reader_declines_what_it_does_not_read_exactly() {
    let id = r#""task_id":"0123456789abcdef0123456789abcdef","task_name":"t""#;
    let deep = format!("{}1{}", "[".repeat(127), "]".repeat(127));
    for rest in [
        r#""other":1"#.to_owned(),
        r#""labels":{"a":"1"},"labels":{"b":"2"}"#.to_owned(),
        r#""labels":{"a":1}"#.to_owned(),
        r#""labels":{"a":"\u0031"}"#.to_owned(),
        r#""labels_types":{"a":-0}"#.to_owned(),
        r#""labels_types":{"a":01}"#.to_owned(),
        r#""labels_types":{"a":1.0}"#.to_owned(),
        r#""labels_types":{"a":1e0}"#.to_owned(),
        format!(r#""args":[{deep}]"#),
        r#""args":{}"#.to_owned(),
        r#""kwargs":[]"#.to_owned(),
        r#""args":[1,]"#.to_owned(),
    ] {
        let body = format!("{{{id},{rest}}}");
        let (fast, _) = both_readers(&body);
        assert_eq!(fast, None, "{body}");
        agree(body.as_bytes()).unwrap();
    }
    for body in [
        "[]",
        "{} x",
        "{",
        "",
        " ",
        r#"{"task_id":"a\u0000"}"#,
        "{\"task_id\":\"a\u{1}\"}",
    ] {
        assert_eq!(both_readers(body).0, None, "{body}");
    }
    // serde_json's depth limit counts from the top: 126 brackets inside `args` are read.
    let nested = format!("{}1{}", "[".repeat(98), "]".repeat(98));
    let body = format!(r#"{{{id},"args":[{nested}]}}"#);
    assert!(both_readers(&body).0.is_some());
}
