//! SQS for the examples and benchmarks: the emulator's endpoint, and queues made for one run.

use aws_sdk_sqs::config::{BehaviorVersion, Credentials, Region};
use aws_sdk_sqs::types::QueueAttributeName;
use aws_sdk_sqs::Client;

/// The SQS endpoint: `FERRIQ_SQS_ENDPOINT`, else the fauxqs emulator that
/// `scripts/sqs-emulator.sh` starts (installing it the first time).
pub fn endpoint() -> String {
    if let Ok(e) = std::env::var("FERRIQ_SQS_ENDPOINT") {
        if !e.is_empty() {
            return e;
        }
    }
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/../scripts/sqs-emulator.sh");
    let out = std::process::Command::new("bash")
        .arg(script)
        .stderr(std::process::Stdio::inherit())
        .output()
        .expect("bash runs scripts/sqs-emulator.sh");
    assert!(out.status.success(), "scripts/sqs-emulator.sh failed");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .last()
        .expect("the script prints the endpoint last")
        .trim()
        .to_owned()
}

/// A raw SDK client on `endpoint` (static test keys, us-east-1), with the same lean HTTP/TLS
/// stack the broker uses.
pub fn client(endpoint: &str) -> Client {
    let http = aws_smithy_http_client::Builder::new()
        .tls_provider(aws_smithy_http_client::tls::Provider::Rustls(
            aws_smithy_http_client::tls::rustls_provider::CryptoMode::Ring,
        ))
        .build_https();
    let config = aws_sdk_sqs::Config::builder()
        .behavior_version(BehaviorVersion::v2026_01_12())
        .http_client(http)
        .region(Region::new("us-east-1"))
        .endpoint_url(endpoint)
        .credentials_provider(Credentials::new("test", "test", None, None, "examples"))
        .build();
    Client::from_conf(config)
}

/// A queue named `name` with a dead-letter queue `{name}-dlq` (maxReceiveCount 10); their
/// URLs.
pub async fn create_queue_pair(client: &Client, name: &str) -> (String, String) {
    create_queue_pair_with(client, name, 10).await
}

/// [`create_queue_pair`] with the given `maxReceiveCount`.
pub async fn create_queue_pair_with(
    client: &Client,
    name: &str,
    max_receive_count: u32,
) -> (String, String) {
    // A FIFO queue (its name ends `.fifo`) needs a FIFO dead-letter queue.
    let fifo = name.strip_suffix(".fifo");
    let with_type =
        |create: aws_sdk_sqs::operation::create_queue::builders::CreateQueueFluentBuilder| {
            if fifo.is_some() {
                create.attributes(QueueAttributeName::FifoQueue, "true")
            } else {
                create
            }
        };
    let dlq_name = match fifo {
        Some(base) => format!("{base}-dlq.fifo"),
        None => format!("{name}-dlq"),
    };
    let dlq = with_type(client.create_queue().queue_name(dlq_name))
        .send()
        .await
        .expect("the SQS endpoint answers")
        .queue_url
        .unwrap_or_default();
    let arn = client
        .get_queue_attributes()
        .queue_url(&dlq)
        .attribute_names(QueueAttributeName::QueueArn)
        .send()
        .await
        .expect("queue attributes")
        .attributes
        .and_then(|mut a| a.remove(&QueueAttributeName::QueueArn))
        .unwrap_or_default();
    let url = with_type(client.create_queue().queue_name(name))
        .attributes(
            QueueAttributeName::RedrivePolicy,
            format!(r#"{{"deadLetterTargetArn":"{arn}","maxReceiveCount":"{max_receive_count}"}}"#),
        )
        .send()
        .await
        .expect("create the queue")
        .queue_url
        .unwrap_or_default();
    (url, dlq)
}

/// Deletes queues by URL (errors ignored: cleanup).
pub async fn delete_queues(client: &Client, urls: &[String]) {
    for url in urls {
        let _ = client.delete_queue().queue_url(url).send().await;
    }
}
