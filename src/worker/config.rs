use std::time::Duration;

use thiserror::Error;

use crate::clock::Clock;
use crate::SecretUrl;

/// A bad worker setting.
#[derive(Debug, Error, PartialEq)]
#[non_exhaustive]
pub enum ConfigError {
    /// An environment variable that does not parse (numbers and seconds: `InvalidNumber`).
    #[error("environment variable {name}={value:?} is invalid: {reason}")]
    InvalidVar {
        /// The variable.
        name: &'static str,
        /// Its value (never a URL: URLs are not echoed).
        value: String,
        /// What is expected.
        reason: &'static str,
    },
    /// A numeric environment variable that does not parse or is out of its range.
    #[error("environment variable {name}={value:?} is invalid: expected {expected}")]
    InvalidNumber {
        /// The variable.
        name: &'static str,
        /// Its value.
        value: String,
        /// What is expected, with the range.
        expected: String,
    },
    /// A required environment variable is not set.
    #[error("environment variable {0} is not set")]
    Missing(&'static str),
    /// Settings that do not fit together.
    #[error("invalid worker configuration: {0}")]
    Invalid(String),
}

/// How a worker runs: concurrency, leases, grace period and the limits on bad input.
///
/// Built in code (`WorkerConfig::default()` and the setters) or from `FERRIQ_*` environment
/// variables with [`WorkerConfig::from_env`]. Every duration has a safe default.
///
/// ```
/// use std::time::Duration;
/// use ferriq::WorkerConfig;
/// let config = WorkerConfig::from_vars([("FERRIQ_CONCURRENCY", "8"), ("FERRIQ_LEASE_SECS", "60")]).unwrap();
/// assert_eq!(config.concurrency, 8);
/// assert_eq!(config.lease, Duration::from_secs(60));
/// ```
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct WorkerConfig {
    /// This worker's id in claims (default: host name, pid and a random suffix).
    pub worker_id: String,
    /// Most runs at once; the broker is never asked for more (`FERRIQ_CONCURRENCY`, default 32).
    pub concurrency: usize,
    /// Claim lease and broker visibility extension; heartbeats run every third of it
    /// (`FERRIQ_LEASE_SECS`, default 30).
    pub lease: Duration,
    /// How long a drain lets runs finish before cancelling and releasing them
    /// (`FERRIQ_GRACE_SECS`, default 30).
    pub grace: Duration,
    /// Longest wait of one receive call (default 1 s; brokers cap it, SQS at 20 s).
    pub receive_wait: Duration,
    /// Bodies above this many bytes are dead-lettered unparsed (`FERRIQ_MAX_PAYLOAD_BYTES`,
    /// default 262144 = 256 KiB, a standard SQS queue's old maximum). Raise it when producers
    /// send bigger bodies (SQS queues now take up to 1 MiB; RabbitMQ's own limit is higher).
    pub max_payload: usize,
    /// Release delay for a message this worker cannot route yet (newer wire version).
    pub unsupported_release: Duration,
    /// Release delay for a task name this worker does not serve (another lane may).
    pub unknown_task_release: Duration,
    /// Receives after which an unroutable message is dead-lettered (default 5).
    pub max_unroutable_receives: u32,
    /// Release delay when the claim/result store is unreachable (default 5 s).
    pub store_retry_after: Duration,
    /// Shortest delay of any release (deferred duplicates, retries, unroutable messages),
    /// except a drain's hand-back: never 0, since every receive costs (SQS counts it toward its
    /// redrive limit). Default 1 s.
    pub min_defer: Duration,
    /// Results kept in memory while the store is unreachable, stored on redelivery
    /// (default 10 000; beyond it the task simply runs again).
    pub max_pending_results: usize,
    /// Runs of one task that ended without finishing — their worker crashed or stalled past
    /// its lease, or the broker took the delivery back mid-run — before the task is failed
    /// (`RetriesExhausted`) instead of run again: ends crash loops (default 5,
    /// `FERRIQ_MAX_TAKEOVERS`).
    pub max_takeovers: u32,
    /// The broker URL (`FERRIQ_BROKER_URL`: `memory://`, `amqp://…`, `sqs://…`); read by the
    /// backend that connects, never logged whole.
    pub broker_url: Option<SecretUrl>,
    /// The claim/result store URL (`FERRIQ_STORE_URL`, or its older name `FERRIQ_VALKEY_URL`:
    /// `redis://…`, `memory://`).
    pub store_url: Option<SecretUrl>,
    /// Every `FERRIQ_*` variable read, for the backends' own settings (`FERRIQ_QUEUES`,
    /// `FERRIQ_AMQP_EXCHANGE`, `FERRIQ_RESULT_PREFIX`…) when they connect from the URLs.
    pub settings: crate::connect::Settings,
    /// Whether this worker also runs a scheduler (`FERRIQ_SCHEDULER=1`; default off): any
    /// number of workers may, a lease in the store picks one sender.
    pub scheduler: bool,
    /// The wall clock due times and deadlines are read from (the system clock; tests inject
    /// one that follows tokio's paused time, or one that is skewed).
    pub clock: Clock,
    /// Where [`Worker::run`](crate::Worker::run) (and so `run_until_signal`) serves the
    /// probes (`/livez`, `/readyz`, `/metrics`) (`FERRIQ_PROBE_ADDR`, e.g. `0.0.0.0:9090`; none
    /// by default). The worker's `build` binds it.
    pub probe_addr: Option<std::net::SocketAddr>,
    /// Whether this worker adds its counts to the store's history every few seconds (what the
    /// dashboard's charts read): `FERRIQ_HISTORY=0` turns it off; default on.
    pub history: bool,
}

impl Default for WorkerConfig {
    fn default() -> Self {
        WorkerConfig {
            worker_id: default_worker_id(),
            concurrency: 32,
            lease: Duration::from_secs(30),
            grace: Duration::from_secs(30),
            receive_wait: Duration::from_secs(1),
            max_payload: crate::client::DEFAULT_MAX_PAYLOAD_BYTES,
            unsupported_release: Duration::from_secs(30),
            unknown_task_release: Duration::from_secs(5),
            max_unroutable_receives: 5,
            store_retry_after: Duration::from_secs(5),
            min_defer: Duration::from_secs(1),
            max_pending_results: 10_000,
            max_takeovers: 5,
            broker_url: None,
            store_url: None,
            settings: Default::default(),
            scheduler: false,
            clock: Clock::system(),
            probe_addr: None,
            history: true,
        }
    }
}

fn default_worker_id() -> String {
    let host = std::env::var("HOSTNAME")
        .ok()
        .filter(|h| !h.is_empty())
        .or_else(|| {
            std::fs::read_to_string("/etc/hostname")
                .ok()
                .map(|h| h.trim().to_owned())
        })
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "worker".to_owned());
    let suffix = &uuid::Uuid::new_v4().simple().to_string()[..8];
    format!("{host}-{}-{suffix}", std::process::id())
}

impl WorkerConfig {
    /// The `FERRIQ_*` variables the worker itself reads (backends read their own).
    pub const SETTINGS: &'static [&'static str] = &[
        "FERRIQ_WORKER_ID",
        "FERRIQ_CONCURRENCY",
        "FERRIQ_LEASE_SECS",
        "FERRIQ_GRACE_SECS",
        "FERRIQ_MAX_TAKEOVERS",
        "FERRIQ_MAX_UNROUTABLE_RECEIVES",
        "FERRIQ_UNKNOWN_TASK_RELEASE_SECS",
        "FERRIQ_UNSUPPORTED_RELEASE_SECS",
        "FERRIQ_MAX_PAYLOAD_BYTES",
        "FERRIQ_BROKER_URL",
        "FERRIQ_STORE_URL",
        "FERRIQ_VALKEY_URL",
        "FERRIQ_SCHEDULER",
        "FERRIQ_PROBE_ADDR",
        "FERRIQ_HISTORY",
    ];

    /// Reads `FERRIQ_*` variables from the process environment over the defaults.
    pub fn from_env() -> Result<Self, ConfigError> {
        Self::from_vars(std::env::vars())
    }

    /// Reads `FERRIQ_*` variables from `vars` over the defaults (testable without touching the
    /// process environment).
    pub fn from_vars<K: AsRef<str>, V: AsRef<str>>(
        vars: impl IntoIterator<Item = (K, V)>,
    ) -> Result<Self, ConfigError> {
        let mut c = WorkerConfig::default();
        for (k, v) in vars {
            let (name, value) = (k.as_ref(), v.as_ref());
            if name.starts_with("FERRIQ_") {
                c.settings.insert(name.to_owned(), value.to_owned());
            }
            match name {
                "FERRIQ_WORKER_ID" if !value.is_empty() => c.worker_id = value.to_owned(),
                "FERRIQ_CONCURRENCY" => {
                    c.concurrency = parse_num("FERRIQ_CONCURRENCY", value, 1, 100_000)? as usize
                }
                "FERRIQ_LEASE_SECS" => c.lease = parse_secs("FERRIQ_LEASE_SECS", value, 0.3)?,
                "FERRIQ_GRACE_SECS" => c.grace = parse_secs("FERRIQ_GRACE_SECS", value, 0.0)?,
                "FERRIQ_MAX_TAKEOVERS" => {
                    c.max_takeovers = parse_num("FERRIQ_MAX_TAKEOVERS", value, 1, 1000)? as u32
                }
                "FERRIQ_MAX_UNROUTABLE_RECEIVES" => {
                    c.max_unroutable_receives =
                        parse_num("FERRIQ_MAX_UNROUTABLE_RECEIVES", value, 1, 1000)? as u32
                }
                "FERRIQ_UNKNOWN_TASK_RELEASE_SECS" => {
                    c.unknown_task_release =
                        parse_secs("FERRIQ_UNKNOWN_TASK_RELEASE_SECS", value, 0.0)?
                }
                "FERRIQ_UNSUPPORTED_RELEASE_SECS" => {
                    c.unsupported_release =
                        parse_secs("FERRIQ_UNSUPPORTED_RELEASE_SECS", value, 0.0)?
                }
                "FERRIQ_MAX_PAYLOAD_BYTES" => {
                    c.max_payload =
                        parse_num("FERRIQ_MAX_PAYLOAD_BYTES", value, 1024, 1 << 30)? as usize
                }
                "FERRIQ_BROKER_URL" => c.broker_url = Some(SecretUrl::new(value)),
                "FERRIQ_STORE_URL" => c.store_url = Some(SecretUrl::new(value)),
                "FERRIQ_VALKEY_URL" if c.store_url.is_none() => {
                    c.store_url = Some(SecretUrl::new(value))
                }
                "FERRIQ_SCHEDULER" => {
                    c.scheduler = crate::connect::parse_flag(value).ok_or_else(|| {
                        ConfigError::InvalidVar {
                            name: "FERRIQ_SCHEDULER",
                            value: value.to_owned(),
                            reason: "expected 1 or 0 (true or false)",
                        }
                    })?
                }
                "FERRIQ_HISTORY" => {
                    c.history = crate::connect::parse_flag(value).ok_or_else(|| {
                        ConfigError::InvalidVar {
                            name: "FERRIQ_HISTORY",
                            value: value.to_owned(),
                            reason: "expected 1 or 0 (true or false)",
                        }
                    })?
                }
                "FERRIQ_PROBE_ADDR" if !value.is_empty() => {
                    c.probe_addr =
                        Some(value.trim().parse().map_err(|_| ConfigError::InvalidVar {
                            name: "FERRIQ_PROBE_ADDR",
                            value: value.to_owned(),
                            reason: "expected an address like 0.0.0.0:9090",
                        })?)
                }
                _ => {}
            }
        }
        c.validate()?;
        Ok(c)
    }

    /// Checks that the settings fit together.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.concurrency == 0 {
            return Err(ConfigError::Invalid(
                "concurrency must be at least 1".into(),
            ));
        }
        if self.lease < Duration::from_millis(300) {
            return Err(ConfigError::Invalid(
                "lease must be at least 300 ms (heartbeats run every third of it)".into(),
            ));
        }
        if self.min_defer.is_zero() {
            return Err(ConfigError::Invalid(
                "min_defer must be above 0: an immediate release burns a receive".into(),
            ));
        }
        Ok(())
    }

    /// The heartbeat period: a third of the lease.
    pub fn heartbeat_interval(&self) -> Duration {
        self.lease / 3
    }
}

fn parse_num(name: &'static str, value: &str, min: u64, max: u64) -> Result<u64, ConfigError> {
    match value.trim().parse::<u64>() {
        Ok(n) if (min..=max).contains(&n) => Ok(n),
        _ => Err(ConfigError::InvalidNumber {
            name,
            value: value.to_owned(),
            expected: format!("a whole number from {min} to {max}"),
        }),
    }
}

fn parse_secs(name: &'static str, value: &str, min: f64) -> Result<Duration, ConfigError> {
    match value.trim().parse::<f64>() {
        Ok(s) if s.is_finite() && s >= min && s <= 86_400.0 => Ok(Duration::from_secs_f64(s)),
        _ => Err(ConfigError::InvalidNumber {
            name,
            value: value.to_owned(),
            expected: format!("seconds, a number from {min} to 86400"),
        }),
    }
}
