//! `sqs://`, `sqs+https://` and `sqs+http://` for [`ferriq::connect`]: a worker or client built
//! from `FERRIQ_BROKER_URL` connects through here.
//!
//! Settings read: `FERRIQ_QUEUES` (lanes, comma-separated, by name or URL; replaces the URL's
//! queue), `FERRIQ_SQS_DLQ` (the dead-letter queue, by name or URL), `FERRIQ_SQS_ENDPOINT`
//! (an emulator's endpoint, when the URL names none; what `scripts/sqs-emulator.sh` prints).
//! Region, endpoint and credentials otherwise come from the URL and the `AWS_*` variables
//! (see the crate docs).

use std::sync::Arc;

use ferriq::broker::Broker;
use ferriq::connect::{BrokerConnector, ConnectError, ConnectFuture, ConnectOptions};

use crate::SqsBrokerBuilder;

fn connect(options: ConnectOptions) -> ConnectFuture<Arc<dyn Broker>> {
    Box::pin(async move {
        let broker = builder_for(&options)
            .map_err(connect_error)?
            .connect()
            .await
            .map_err(connect_error)?;
        Ok(Arc::new(broker) as Arc<dyn Broker>)
    })
}

/// A queue that does not exist is `NotFound` (the `ferriq` command exits 3 for it); the rest
/// are the backend's.
fn connect_error(e: crate::SqsError) -> ConnectError {
    match e {
        crate::SqsError::QueueMissing { .. } => ConnectError::NotFound(e.to_string()),
        e => ConnectError::Backend(e.to_string()),
    }
}

/// The builder the options describe.
fn builder_for(options: &ConnectOptions) -> Result<SqsBrokerBuilder, crate::SqsError> {
    let mut builder = SqsBrokerBuilder::from_url(options.url.clone())?;
    if let Some(queues) = options.queues() {
        builder = builder.queues(queues);
    }
    if let Some(dlq) = options.setting("FERRIQ_SQS_DLQ") {
        builder = builder.dead_letter_queue(dlq);
    }
    // A client sends (and runs the dead-letter operations): only a worker, which connects
    // with its concurrency, needs every lane's dead-letter queue.
    builder = builder.send_only(options.concurrency.is_none());
    if let (None, Some(endpoint)) = (&builder.endpoint, options.setting("FERRIQ_SQS_ENDPOINT")) {
        builder = builder.endpoint_url(endpoint);
    }
    Ok(builder)
}

ferriq::inventory::submit!(BrokerConnector {
    schemes: &["sqs", "sqs+https", "sqs+http"],
    connect,
});

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_queue_is_not_found_and_other_errors_are_the_backends() {
        let missing = crate::SqsError::QueueMissing {
            queue: "jobs".into(),
            hint: "check the name".into(),
        };
        assert!(matches!(connect_error(missing), ConnectError::NotFound(m) if m.contains("jobs")));
        let other = crate::SqsError::NoDeadLetterQueue {
            queue: "jobs".into(),
        };
        assert!(matches!(connect_error(other), ConnectError::Backend(_)));
    }

    #[test]
    fn a_client_from_a_url_only_sends_and_a_worker_does_not() {
        let client = ConnectOptions::new("sqs://jobs?region=eu-west-1");
        assert!(builder_for(&client).unwrap().send_only);
        let worker = ConnectOptions::new("sqs://jobs?region=eu-west-1").concurrency(8);
        assert!(!builder_for(&worker).unwrap().send_only);
    }
}
