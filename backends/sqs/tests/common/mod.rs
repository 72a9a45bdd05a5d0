//! Helpers for tests against an SQS emulator: the endpoint (started by the project's script
//! when absent), unique queues with a dead-letter queue, deleted when dropped, and brokers on
//! them.
#![allow(dead_code)]

use std::sync::OnceLock;
use std::time::Duration;

use aws_sdk_sqs::config::{BehaviorVersion, Credentials, Region};
use aws_sdk_sqs::types::{MessageSystemAttributeName, QueueAttributeName};
use aws_sdk_sqs::Client;
use ferriq_sqs::{SqsBroker, SqsBrokerBuilder};

/// The fauxqs endpoint: `FERRIQ_SQS_ENDPOINT`, else the one `scripts/sqs-emulator.sh` starts.
pub fn endpoint() -> String {
    emulator("FERRIQ_SQS_ENDPOINT", "fauxqs")
}

/// The moto endpoint: `FERRIQ_MOTO_ENDPOINT`, else the one `scripts/sqs-emulator.sh moto`
/// starts.
pub fn moto_endpoint() -> String {
    emulator("FERRIQ_MOTO_ENDPOINT", "moto")
}

fn emulator(var: &str, which: &str) -> String {
    static FOUND: OnceLock<std::sync::Mutex<std::collections::HashMap<String, String>>> =
        OnceLock::new();
    if let Ok(e) = std::env::var(var) {
        if !e.is_empty() {
            return e;
        }
    }
    let mut found = FOUND.get_or_init(Default::default).lock().unwrap();
    found
        .entry(which.to_owned())
        .or_insert_with(|| {
            let script = concat!(env!("CARGO_MANIFEST_DIR"), "/../../scripts/sqs-emulator.sh");
            let out = std::process::Command::new("bash")
                .args([script, which])
                .stderr(std::process::Stdio::inherit())
                .output()
                .expect("bash runs scripts/sqs-emulator.sh");
            assert!(
                out.status.success(),
                "scripts/sqs-emulator.sh {which} failed"
            );
            String::from_utf8(out.stdout)
                .unwrap()
                .lines()
                .last()
                .expect("the script prints the endpoint last")
                .trim()
                .to_owned()
        })
        .clone()
}

pub use ferriq_testkit::services::redis_url;

/// A Valkey store under its own key prefix.
pub async fn store(prefix: &str) -> ferriq_valkey::ValkeyStore {
    ferriq_valkey::ValkeyStore::builder(redis_url())
        .prefix(prefix)
        .result_ttl(Some(Duration::from_secs(600)))
        .claim_ttl(Duration::from_secs(600))
        .connect()
        .await
        .expect("connect to the test Redis")
}

pub fn unique(kind: &str) -> String {
    format!(
        "fqt-{kind}-{}",
        &uuid::Uuid::new_v4().simple().to_string()[..10]
    )
}

/// A raw SDK client on `endpoint`, for setting queues up and looking into them.
pub fn admin(endpoint: &str) -> Client {
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
        .credentials_provider(Credentials::new("test", "test", None, None, "tests"))
        .build();
    Client::from_conf(config)
}

/// A unique queue and its dead-letter queue; both deleted when dropped.
pub struct Queues {
    pub endpoint: String,
    pub name: String,
    pub url: String,
    pub dlq_name: String,
    pub dlq_url: String,
    pub admin: Client,
}

/// How the test queue is made.
#[derive(Clone)]
pub struct QueueOptions {
    pub visibility_secs: u32,
    pub max_receive_count: u32,
    pub max_message_bytes: Option<u32>,
    /// A FIFO queue with a FIFO dead-letter queue (names ending `.fifo`).
    pub fifo: bool,
}

impl Default for QueueOptions {
    fn default() -> Self {
        QueueOptions {
            visibility_secs: 30,
            max_receive_count: 10,
            max_message_bytes: None,
            fifo: false,
        }
    }
}

impl Queues {
    pub async fn create(options: QueueOptions) -> Self {
        Self::create_at(&endpoint(), options).await
    }

    pub async fn create_at(endpoint: &str, options: QueueOptions) -> Self {
        let admin = admin(endpoint);
        let base = unique("q");
        let suffix = if options.fifo { ".fifo" } else { "" };
        let name = format!("{base}{suffix}");
        let dlq_name = format!("{base}-dlq{suffix}");
        let fifo =
            |create: aws_sdk_sqs::operation::create_queue::builders::CreateQueueFluentBuilder| {
                if options.fifo {
                    create.attributes(QueueAttributeName::FifoQueue, "true")
                } else {
                    create
                }
            };
        let dlq_url = fifo(admin.create_queue().queue_name(&dlq_name))
            .send()
            .await
            .expect("the SQS emulator answers")
            .queue_url
            .unwrap();
        let dlq_arn = admin
            .get_queue_attributes()
            .queue_url(&dlq_url)
            .attribute_names(QueueAttributeName::QueueArn)
            .send()
            .await
            .unwrap()
            .attributes
            .unwrap()
            .remove(&QueueAttributeName::QueueArn)
            .unwrap();
        let mut create = fifo(admin.create_queue().queue_name(&name))
            .attributes(
                QueueAttributeName::VisibilityTimeout,
                options.visibility_secs.to_string(),
            )
            .attributes(
                QueueAttributeName::RedrivePolicy,
                format!(
                    r#"{{"deadLetterTargetArn":"{dlq_arn}","maxReceiveCount":"{}"}}"#,
                    options.max_receive_count
                ),
            );
        if let Some(max) = options.max_message_bytes {
            create = create.attributes(QueueAttributeName::MaximumMessageSize, max.to_string());
        }
        let url = create.send().await.unwrap().queue_url.unwrap();
        Queues {
            endpoint: endpoint.to_owned(),
            name,
            url,
            dlq_name,
            dlq_url,
            admin,
        }
    }

    /// Broker settings on the queue.
    pub fn builder(&self) -> SqsBrokerBuilder {
        SqsBrokerBuilder::new(self.name.clone())
            .endpoint_url(self.endpoint.clone())
            .region("us-east-1")
            .credentials("test", "test")
            .wait_time(Duration::from_secs(1))
    }

    pub async fn broker(&self) -> SqsBroker {
        self.builder()
            .connect()
            .await
            .expect("connect to the emulator")
    }

    /// Every message in the dead-letter queue (received, not deleted), with attributes.
    pub async fn dead_letters(&self) -> Vec<aws_sdk_sqs::types::Message> {
        let mut all = Vec::new();
        loop {
            let out = self
                .admin
                .receive_message()
                .queue_url(&self.dlq_url)
                .max_number_of_messages(10)
                .visibility_timeout(60)
                .message_attribute_names("All")
                .message_system_attribute_names(MessageSystemAttributeName::All)
                .send()
                .await
                .unwrap();
            let got = out.messages.unwrap_or_default();
            if got.is_empty() {
                return all;
            }
            all.extend(got);
        }
    }

    /// ApproximateNumberOfMessages (ready) and ...NotVisible (in flight) of the main queue.
    pub async fn counts(&self) -> (u64, u64) {
        let attributes = self
            .admin
            .get_queue_attributes()
            .queue_url(&self.url)
            .attribute_names(QueueAttributeName::All)
            .send()
            .await
            .unwrap()
            .attributes
            .unwrap_or_default();
        let get =
            |n: QueueAttributeName| attributes.get(&n).and_then(|v| v.parse().ok()).unwrap_or(0);
        (
            get(QueueAttributeName::ApproximateNumberOfMessages),
            get(QueueAttributeName::ApproximateNumberOfMessagesNotVisible),
        )
    }
}

impl Drop for Queues {
    fn drop(&mut self) {
        let (admin, urls) = (self.admin.clone(), [self.url.clone(), self.dlq_url.clone()]);
        let _ = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async move {
                for url in urls {
                    let _ = admin.delete_queue().queue_url(url).send().await;
                }
            });
        })
        .join();
    }
}

/// Polls `check` every 20 ms until it holds; panics after `limit`.
pub async fn eventually(what: &str, limit: Duration, mut check: impl FnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + limit;
    while !check() {
        assert!(tokio::time::Instant::now() < deadline, "timed out: {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
