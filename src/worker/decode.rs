//! Decode: the delivery's body read as a task message — or the reason it cannot be: over the
//! size limit (never parsed), unreadable, or written by a newer ferriq. A pure step: what to
//! do about a message that cannot run is the caller's ([`super::delivery`]).

use crate::broker::{DeadLetter, DeadLetterReason, Delivery};
use crate::wire::{TaskId, TaskMessage, WIRE_VERSION};

/// Why a delivery's body is not a task message this worker can run.
#[derive(Debug)]
pub(super) enum NotRunnable {
    /// A body that can never run: parked with an `InvalidMessage` error result for its task,
    /// when its id can be found.
    Unrunnable {
        /// The task's id, from the body or the broker's metadata.
        id: Option<TaskId>,
        /// `TooLarge` or `InvalidMessage`.
        reason: DeadLetterReason,
        /// What is wrong, for the result and the dead-letter record.
        detail: String,
        /// The task's name, when the body shows it.
        task_name: Option<String>,
    },
    /// A message in a newer wire version: released for a newer worker, or, once it has been
    /// received `max_unroutable_receives` times, parked as `park` says.
    Newer {
        /// Why it cannot run here.
        detail: String,
        /// `Some` once it has waited long enough for a newer worker.
        park: Option<DeadLetter>,
    },
}

/// Reads `d`'s body: at most `max_payload` bytes are parsed; a newer message is parked after
/// `max_unroutable_receives` receives.
pub(super) fn decode(
    d: &Delivery,
    max_payload: usize,
    max_unroutable_receives: u32,
) -> Result<TaskMessage, NotRunnable> {
    let id_from_broker = || d.task_id.clone();
    if d.body.len() > max_payload {
        // Never parse it: the limit exists to keep such bodies out of memory twice over.
        tracing::warn!(
            task_id = d.task_id.as_ref().map_or("unknown", TaskId::as_str),
            queue = %d.queue,
            size = d.body.len(),
            limit = max_payload,
            "message over FERRIQ_MAX_PAYLOAD_BYTES: parked unread as `too_large`"
        );
        return Err(NotRunnable::Unrunnable {
            id: id_from_broker(),
            reason: DeadLetterReason::TooLarge,
            detail: format!(
                "body is {} bytes, over the {max_payload}-byte limit (FERRIQ_MAX_PAYLOAD_BYTES); \
                 raise it on the workers and redrive it, or send large data by reference",
                d.body.len(),
            ),
            task_name: None,
        });
    }
    let msg = match TaskMessage::from_json(&d.body) {
        Ok(msg) => msg,
        Err(e) => {
            tracing::warn!(error = %e, "unreadable message");
            return Err(NotRunnable::Unrunnable {
                id: TaskMessage::peek_task_id(&d.body).or_else(id_from_broker),
                reason: DeadLetterReason::InvalidMessage,
                detail: e.to_string(),
                task_name: TaskMessage::peek_task_name(&d.body),
            });
        }
    };
    let version = msg.labels.wire_version();
    if version > WIRE_VERSION {
        let detail = format!("wire version {version} is newer than this worker's {WIRE_VERSION}");
        let park = (d.receive_count >= max_unroutable_receives).then(|| {
            DeadLetter::new(
                DeadLetterReason::UnsupportedWireVersion,
                detail.clone(),
                Some(msg.task_name.to_string()),
                0,
            )
        });
        return Err(NotRunnable::Newer { detail, park });
    }
    Ok(msg)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::broker::DeliveryHandle;

    fn delivery(body: &str, receive_count: u32) -> Delivery {
        Delivery::new(
            body.as_bytes().to_vec(),
            Some(TaskId::parse("7d3bd5b2-3d43-4c84-a3c6-0a8b3c8b9b4e").unwrap()),
            receive_count,
            "q",
            DeliveryHandle::new(1u32),
        )
    }

    fn message(labels: &str) -> String {
        format!(
            r#"{{"task_id":"5c0f4cd4-8a9b-4d59-9d1e-7c8e0f2a3b4c","task_name":"add","labels":{{{labels}}},"labels_types":{{}},"args":[1,2],"kwargs":{{}}}}"#
        )
    }

    #[test]
    fn a_readable_message_is_decoded() {
        match decode(&delivery(&message(""), 1), 1024, 5) {
            Ok(msg) => assert_eq!(msg.task_name, "add"),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_body_over_the_limit_is_not_parsed_and_keeps_the_brokers_task_id() {
        let body = message("");
        match decode(&delivery(&body, 1), body.len() - 1, 5) {
            Err(NotRunnable::Unrunnable {
                id,
                reason,
                detail,
                task_name,
            }) => {
                assert_eq!(reason, DeadLetterReason::TooLarge);
                assert_eq!(
                    id.map(|i| i.to_string()).as_deref(),
                    Some("7d3bd5b2-3d43-4c84-a3c6-0a8b3c8b9b4e")
                );
                assert!(detail.contains("FERRIQ_MAX_PAYLOAD_BYTES"), "{detail}");
                assert_eq!(task_name, None, "an unparsed body names no task");
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn an_unreadable_body_names_the_task_it_shows() {
        // JSON, but not a task message: its arguments are not a list.
        let body =
            r#"{"task_id":"5c0f4cd4-8a9b-4d59-9d1e-7c8e0f2a3b4c","task_name":"add","args":"1, 2"}"#;
        match decode(&delivery(body, 1), 1024, 5) {
            Err(NotRunnable::Unrunnable {
                id,
                reason,
                task_name,
                ..
            }) => {
                assert_eq!(reason, DeadLetterReason::InvalidMessage);
                // The body's own id wins over the broker's.
                assert_eq!(
                    id.map(|i| i.to_string()).as_deref(),
                    Some("5c0f4cd4-8a9b-4d59-9d1e-7c8e0f2a3b4c")
                );
                assert_eq!(task_name.as_deref(), Some("add"));
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_newer_message_waits_for_a_newer_worker_then_is_parked() {
        let newer = message(&format!(r#""ferriq_wire":"{}""#, WIRE_VERSION + 1));
        match decode(&delivery(&newer, 4), 1024, 5) {
            Err(NotRunnable::Newer { park: None, detail }) => {
                assert!(detail.contains("newer"), "{detail}")
            }
            other => panic!("{other:?}"),
        }
        match decode(&delivery(&newer, 5), 1024, 5) {
            Err(NotRunnable::Newer {
                park: Some(why), ..
            }) => {
                assert_eq!(why.reason, DeadLetterReason::UnsupportedWireVersion);
                assert_eq!(why.task_name.as_deref(), Some("add"));
            }
            other => panic!("{other:?}"),
        }
    }
}
