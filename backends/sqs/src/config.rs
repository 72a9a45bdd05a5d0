//! Settings of an [`SqsBroker`](crate::SqsBroker), and the `sqs://` URL forms, parsed here
//! and nowhere else.

use std::fmt;
use std::time::Duration;

use ferriq::SecretUrl;

use crate::SqsError;

/// A queue, by name (resolved with `GetQueueUrl`) or by URL.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum QueueRef {
    Name(String),
    Url(String),
}

impl QueueRef {
    pub(crate) fn parse(s: &str) -> Self {
        if s.starts_with("https://") || s.starts_with("http://") {
            QueueRef::Url(s.to_owned())
        } else {
            QueueRef::Name(s.to_owned())
        }
    }

    /// The queue's name (the last path segment of a URL).
    pub(crate) fn name(&self) -> &str {
        match self {
            QueueRef::Name(n) => n,
            QueueRef::Url(u) => u.rsplit('/').next().unwrap_or(u),
        }
    }
}

/// Static AWS keys. The secret never appears in `Debug`.
#[derive(Clone)]
pub(crate) struct StaticKeys {
    pub(crate) access_key_id: String,
    pub(crate) secret_access_key: String,
    pub(crate) session_token: Option<String>,
}

impl fmt::Debug for StaticKeys {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StaticKeys")
            .field("access_key_id", &self.access_key_id)
            .field("secret_access_key", &"***")
            .finish_non_exhaustive()
    }
}

/// Settings for an [`SqsBroker`](crate::SqsBroker).
///
/// From a URL (see the crate docs for the forms) or from a queue name, then tuned:
///
/// ```
/// use std::time::Duration;
/// let builder = ferriq_sqs::SqsBroker::builder("sqs://jobs?region=eu-west-1")
///     .unwrap()
///     .dead_letter_queue("jobs-dlq")
///     .credentials("AKIDEXAMPLE", "s3cret");
/// assert!(!format!("{builder:?}").contains("s3cret"));
/// ```
#[derive(Debug, Clone)]
pub struct SqsBrokerBuilder {
    pub(crate) lanes: Vec<QueueRef>,
    pub(crate) region: Option<String>,
    pub(crate) endpoint: Option<String>,
    pub(crate) keys: Option<StaticKeys>,
    pub(crate) dead_letter: Option<QueueRef>,
    pub(crate) wait_time: Duration,
    pub(crate) pollers: Option<usize>,
    pub(crate) resend_after_receives: u32,
    pub(crate) call_timeout: Duration,
    pub(crate) heartbeat_timeout: Duration,
    pub(crate) connect_timeout: Duration,
    pub(crate) budget_margin: Duration,
    pub(crate) max_batch_bytes: usize,
    pub(crate) send_only: bool,
}

impl SqsBrokerBuilder {
    /// Settings for the queue `queue` (a name or a queue URL).
    pub fn new(queue: impl Into<String>) -> Self {
        SqsBrokerBuilder {
            lanes: vec![QueueRef::parse(&queue.into())],
            region: None,
            endpoint: None,
            keys: None,
            dead_letter: None,
            wait_time: Duration::from_secs(20),
            pollers: None,
            resend_after_receives: 3,
            call_timeout: Duration::from_secs(5),
            heartbeat_timeout: Duration::from_secs(3),
            connect_timeout: Duration::from_secs(3),
            budget_margin: Duration::from_secs(120),
            max_batch_bytes: 1024 * 1024,
            send_only: false,
        }
    }

    /// Settings from an `sqs://` URL:
    ///
    /// - `sqs://QUEUE?region=R&endpoint=E&dlq=D`: a queue by name; `region` (else
    ///   `AWS_REGION`), `endpoint` (an emulator's, else `AWS_ENDPOINT_URL_SQS` or
    ///   `AWS_ENDPOINT_URL`, else AWS's) and `dlq` (a dead-letter queue by name or URL, else
    ///   the queue's RedrivePolicy) are optional;
    /// - `sqs+https://sqs.eu-west-1.amazonaws.com/123456789012/QUEUE` (the region is read from
    ///   the host) and `sqs+http://127.0.0.1:4566/000000000000/QUEUE` (an emulator): a queue by
    ///   URL, with the same query parameters.
    ///
    /// Credentials are never part of the URL.
    pub fn from_url(url: impl Into<SecretUrl>) -> Result<Self, SqsError> {
        let url: SecretUrl = url.into();
        let bad = |reason: &str| SqsError::Url {
            url: url.redacted(),
            reason: reason.to_owned(),
        };
        let raw = url.expose();
        let (scheme, rest) = raw
            .split_once("://")
            .ok_or_else(|| bad("expected sqs://QUEUE or sqs+https://HOST/ACCOUNT/QUEUE"))?;
        let (location, query) = rest.split_once('?').unwrap_or((rest, ""));
        if location.contains('@') {
            return Err(bad(
                "credentials do not belong in the URL: use AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY",
            ));
        }
        let mut builder = match scheme.to_ascii_lowercase().as_str() {
            "sqs" => {
                let name = location.trim_matches('/');
                if name.is_empty() || name.contains('/') {
                    return Err(bad("sqs:// takes a queue name: sqs://QUEUE"));
                }
                SqsBrokerBuilder::new(name)
            }
            "sqs+https" | "sqs+http" => {
                let plain = &scheme[4..];
                let (host, path) = location
                    .split_once('/')
                    .ok_or_else(|| bad("expected sqs+https://HOST/ACCOUNT/QUEUE"))?;
                if path.trim_matches('/').split('/').count() != 2 {
                    return Err(bad("expected sqs+https://HOST/ACCOUNT/QUEUE"));
                }
                let mut b =
                    SqsBrokerBuilder::new(format!("{plain}://{host}/{}", path.trim_matches('/')));
                // sqs.REGION.amazonaws.com: AWS itself; anything else is an endpoint.
                let labels: Vec<&str> = host.split('.').collect();
                if labels.len() >= 4 && labels[0] == "sqs" && host.ends_with(".amazonaws.com") {
                    b.region = Some(labels[1].to_owned());
                } else {
                    b.endpoint = Some(format!("{plain}://{host}"));
                }
                b
            }
            _ => return Err(bad("use sqs://, sqs+https:// or sqs+http://")),
        };
        for pair in query.split('&').filter(|p| !p.is_empty()) {
            let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
            let v = percent_decode(v);
            match k {
                "region" => builder.region = Some(v),
                "endpoint" => builder.endpoint = Some(v),
                "dlq" => builder.dead_letter = Some(QueueRef::parse(&v)),
                _ => {
                    return Err(bad(&format!(
                        "unknown parameter {k:?}: the URL takes region, endpoint and dlq"
                    )))
                }
            }
        }
        Ok(builder)
    }

    /// The lanes: queues (by name or URL) the worker consumes; the first is where messages
    /// without a `queue_name` label go. Replaces the URL's queue.
    pub fn queues<I: IntoIterator<Item = S>, S: Into<String>>(mut self, queues: I) -> Self {
        self.lanes = queues
            .into_iter()
            .map(|q| QueueRef::parse(&q.into()))
            .collect();
        self
    }

    /// The AWS region (default: the URL's, else `AWS_REGION`/`AWS_DEFAULT_REGION`).
    pub fn region(mut self, region: impl Into<String>) -> Self {
        self.region = Some(region.into());
        self
    }

    /// An endpoint URL other than AWS's (an emulator).
    pub fn endpoint_url(mut self, url: impl Into<String>) -> Self {
        self.endpoint = Some(url.into());
        self
    }

    /// Static AWS keys (default: the environment's, or the `aws-config` chain).
    pub fn credentials(
        mut self,
        access_key_id: impl Into<String>,
        secret_access_key: impl Into<String>,
    ) -> Self {
        self.keys = Some(StaticKeys {
            access_key_id: access_key_id.into(),
            secret_access_key: secret_access_key.into(),
            session_token: None,
        });
        self
    }

    /// The dead-letter queue for every lane, by name or URL (default: each lane's
    /// RedrivePolicy target).
    pub fn dead_letter_queue(mut self, queue: impl Into<String>) -> Self {
        self.dead_letter = Some(QueueRef::parse(&queue.into()));
        self
    }

    /// A broker that only sends (app code enqueuing tasks): `connect` does not require the
    /// lanes to have a dead-letter queue (one they name is still found, for the
    /// dead-letter operations), and `receive` refuses — a worker needs the dead-letter queue
    /// to park what fails for good, and `WorkerBuilder::build` refuses such a broker
    /// (`BuildError::BrokerCannotConsume`). Off by default; a client connected from a URL
    /// ([`ferriq::connect`] without a worker's concurrency) is send-only.
    ///
    /// ```
    /// let builder = ferriq_sqs::SqsBroker::builder("sqs://jobs?region=eu-west-1")
    ///     .unwrap()
    ///     .send_only(true);
    /// ```
    pub fn send_only(mut self, send_only: bool) -> Self {
        self.send_only = send_only;
        self
    }

    /// Long-poll wait of each receive call, 1–20 s (default 20).
    pub fn wait_time(mut self, wait: Duration) -> Self {
        self.wait_time = wait;
        self
    }

    /// Concurrent long pollers (default: one per 10 runs of the worker's concurrency, 1–8,
    /// and at least one per lane).
    pub fn pollers(mut self, n: usize) -> Self {
        self.pollers = Some(n);
        self
    }

    /// Receives after which a release sends a fresh copy and deletes the original instead of
    /// changing the visibility (default 3): every receive counts toward the queue's
    /// `maxReceiveCount`, and a copy starts again at zero, so tasks deferred or delayed many
    /// times are never moved to the dead-letter queue by SQS. FIFO queues always change the
    /// visibility.
    pub fn resend_after_receives(mut self, n: u32) -> Self {
        self.resend_after_receives = n;
        self
    }

    /// Time limit of each send, delete and visibility call (default 5 s). Receives wait their
    /// long poll plus this.
    pub fn call_timeout(mut self, timeout: Duration) -> Self {
        self.call_timeout = timeout;
        self
    }

    /// Time limit of a heartbeat's visibility calls (default 3 s; one attempt each, so an
    /// outage never drains the retry budget of the other calls).
    pub fn heartbeat_timeout(mut self, timeout: Duration) -> Self {
        self.heartbeat_timeout = timeout;
        self
    }

    /// How long before the end of SQS's 12-hour visibility budget a run is failed (default
    /// 2 min): the margin to store its result and park its message while it is still held.
    pub fn budget_margin(mut self, margin: Duration) -> Self {
        self.budget_margin = margin;
        self
    }

    pub(crate) fn validate(&self) -> Result<(), SqsError> {
        let setting = |s: &str| Err(SqsError::Setting(s.to_owned()));
        if self.lanes.is_empty() || self.lanes.iter().any(|q| q.name().is_empty()) {
            return setting("at least one queue is needed, each with a name");
        }
        if !(1..=20).contains(&self.wait_time.as_secs()) {
            return setting("wait_time must be 1 to 20 seconds (SQS's long-poll range)");
        }
        if self.pollers == Some(0) || self.pollers.is_some_and(|n| n > 64) {
            return setting("pollers must be 1 to 64");
        }
        if self.call_timeout.is_zero() || self.heartbeat_timeout.is_zero() {
            return setting("timeouts must be above zero");
        }
        if self.budget_margin > Duration::from_secs(6 * 3600) {
            return setting("budget_margin must be at most 6 hours");
        }
        Ok(())
    }
}

fn percent_decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = |b: u8| (b as char).to_digit(16).map(|d| d as u8);
        match bytes[i] {
            b'%' if i + 2 < bytes.len() => match (hex(bytes[i + 1]), hex(bytes[i + 2])) {
                (Some(h), Some(l)) => {
                    out.push(h * 16 + l);
                    i += 3;
                    continue;
                }
                _ => out.push(b'%'),
            },
            b => out.push(b),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn url_forms() {
        let b = SqsBrokerBuilder::from_url("sqs://jobs?region=eu-west-1&dlq=jobs-dlq").unwrap();
        assert_eq!(b.lanes, [QueueRef::Name("jobs".into())]);
        assert_eq!(b.region.as_deref(), Some("eu-west-1"));
        assert_eq!(b.dead_letter, Some(QueueRef::Name("jobs-dlq".into())));

        let b =
            SqsBrokerBuilder::from_url("sqs+https://sqs.us-east-2.amazonaws.com/123456789012/jobs")
                .unwrap();
        assert_eq!(
            b.lanes,
            [QueueRef::Url(
                "https://sqs.us-east-2.amazonaws.com/123456789012/jobs".into()
            )]
        );
        assert_eq!(b.region.as_deref(), Some("us-east-2"));
        assert_eq!(b.endpoint, None);

        let b = SqsBrokerBuilder::from_url(
            "sqs+http://127.0.0.1:4566/000000000000/jobs?region=us-east-1",
        )
        .unwrap();
        assert_eq!(b.endpoint.as_deref(), Some("http://127.0.0.1:4566"));
        assert_eq!(b.lanes[0].name(), "jobs");

        let b = SqsBrokerBuilder::from_url("sqs://jobs?endpoint=http%3A%2F%2F127.0.0.1%3A9324")
            .unwrap();
        assert_eq!(b.endpoint.as_deref(), Some("http://127.0.0.1:9324"));

        for bad in [
            "sqs://",
            "sqs://a/b",
            "sqs://key:secret@jobs",
            "kafka://jobs",
            "sqs://jobs?colour=red",
            "sqs+https://host/onlyone",
        ] {
            let err = SqsBrokerBuilder::from_url(bad).unwrap_err().to_string();
            assert!(!err.contains("secret"), "{err}");
        }
    }
}
