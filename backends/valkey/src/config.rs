use std::time::Duration;

use ferriq::SecretUrl;
use fred::prelude::{Builder, Config, ReconnectPolicy};

use crate::{ValkeyError, ValkeyStore};

/// Settings for a [`ValkeyStore`], built from a URL.
///
/// Accepted URLs (fred's forms): `redis://`, `valkey://`, `rediss://`, `valkeys://` (TLS with
/// certificate verification; needs this crate's `tls` feature), `redis-cluster://`,
/// `valkey-cluster://` (`?node=host:port` for more seeds), `redis-sentinel://`,
/// `valkey-sentinel://`, `rediss-sentinel://`, `valkeys-sentinel://`
/// (`?sentinelServiceName=…`). The password is never logged.
///
/// ```
/// use std::time::Duration;
/// let builder = ferriq_valkey::ValkeyStore::builder("redis://:s3cret@127.0.0.1:6379/0")
///     .prefix("billing")
///     .command_timeout(Duration::from_secs(1))
///     .result_ttl(Some(Duration::from_secs(3600)));
/// assert!(!format!("{builder:?}").contains("s3cret"));
/// ```
#[derive(Debug, Clone)]
pub struct ValkeyStoreBuilder {
    pub(crate) url: SecretUrl,
    pub(crate) prefix: String,
    pub(crate) pool_size: usize,
    pub(crate) command_timeout: Duration,
    pub(crate) connect_timeout: Duration,
    pub(crate) result_ttl: Option<Duration>,
    pub(crate) claim_ttl: Duration,
    /// Whether `claim_ttl` was set by the caller (else it follows `result_ttl`).
    claim_ttl_set: bool,
    pub(crate) recheck_interval: Duration,
    pub(crate) tls: crate::tls::TlsFiles,
}

/// The claim TTL unless results are kept longer: past SQS's 14-day retention.
const DEFAULT_CLAIM_TTL: Duration = Duration::from_secs(15 * 24 * 3600);

/// The longest claim (and result) TTL: far past any broker's retention, and far from the
/// numbers a server's Lua (doubles, 64-bit `%d`) can no longer add exactly.
const MAX_TTL: Duration = Duration::from_secs(10 * 365 * 86_400);

/// Slots of the result subscriber's event channels (messages, reconnections).
const SUBSCRIBER_EVENTS: usize = 4096;

impl ValkeyStoreBuilder {
    pub(crate) fn new(url: impl Into<SecretUrl>) -> Self {
        ValkeyStoreBuilder {
            url: url.into(),
            prefix: "ferriq".to_owned(),
            pool_size: 4,
            command_timeout: Duration::from_secs(2),
            connect_timeout: Duration::from_secs(2),
            result_ttl: Some(Duration::from_secs(7 * 24 * 3600)),
            claim_ttl: DEFAULT_CLAIM_TTL,
            claim_ttl_set: false,
            recheck_interval: Duration::from_secs(1),
            tls: Default::default(),
        }
    }

    /// Key prefix (default `ferriq`): results at `{prefix}:{task_id}`. Python taskiq-redis reads
    /// them with `prefix_str` set to the same value.
    pub fn prefix(mut self, prefix: impl Into<String>) -> Self {
        self.prefix = prefix.into();
        self
    }

    /// Connections in the command pool (default 4).
    pub fn pool_size(mut self, n: usize) -> Self {
        self.pool_size = n;
        self
    }

    /// Longest wait for any one call, reconnects included (default 2 s): an unreachable Valkey
    /// gives a `StoreError::Unavailable` within this time.
    pub fn command_timeout(mut self, timeout: Duration) -> Self {
        self.command_timeout = timeout;
        self
    }

    /// Longest wait for a TCP/TLS connection (default 2 s).
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout;
        self
    }

    /// How long results are kept (default 7 days, at most 10 years; `None` keeps them until
    /// deleted). Unless [`claim_ttl`](Self::claim_ttl) is set, claims are then kept a day
    /// longer than results (never less than 15 days, never more than 10 years).
    pub fn result_ttl(mut self, ttl: Option<Duration>) -> Self {
        self.result_ttl = ttl;
        if !self.claim_ttl_set {
            let day = Duration::from_secs(24 * 3600);
            self.claim_ttl = ttl.map_or(DEFAULT_CLAIM_TTL, |t| {
                DEFAULT_CLAIM_TTL.max(t.saturating_add(day)).min(MAX_TTL)
            });
        }
        self
    }

    /// How long a claim record is kept after it was last claimed, renewed, released or
    /// completed (default 15 days, or a day longer than `result_ttl` when that is longer):
    /// longer than any copy of the message may still arrive, and never shorter than
    /// `result_ttl`. At most 10 years.
    pub fn claim_ttl(mut self, ttl: Duration) -> Self {
        self.claim_ttl = ttl;
        self.claim_ttl_set = true;
        self
    }

    /// How often a waiter re-reads the result if no notification came (default 1 s): covers
    /// completions announced on another process's channel or lost during a reconnect. A wait
    /// re-reads first after at most 100 ms (a Python worker announces nothing) — except a wait
    /// for a task this client enqueued while completions are reaching the client, whose
    /// completion will come too: it re-reads after this interval.
    pub fn recheck_interval(mut self, interval: Duration) -> Self {
        self.recheck_interval = interval;
        self
    }

    /// Trusts the certificate authorities in this PEM file instead of the system's roots
    /// (`FERRIQ_STORE_TLS_CA`): for a server whose certificate a private CA signed. For
    /// `rediss://`/`valkeys://` URLs; needs the `tls` feature. The server's certificate and
    /// host name are always verified.
    pub fn tls_ca_file(mut self, pem: impl Into<std::path::PathBuf>) -> Self {
        self.tls.ca = Some(pem.into());
        self
    }

    /// Presents this client certificate (PEM chain) and its private key (PEM) to a server that
    /// asks for one (mTLS; `FERRIQ_STORE_TLS_CERT`, `FERRIQ_STORE_TLS_KEY`). The key is read
    /// when the store connects and never logged.
    pub fn tls_client_cert(
        mut self,
        cert_pem: impl Into<std::path::PathBuf>,
        key_pem: impl Into<std::path::PathBuf>,
    ) -> Self {
        self.tls.identity = Some((cert_pem.into(), key_pem.into()));
        self
    }

    /// Checks the settings and the URL, connects the pool and the subscriber, loads the
    /// scripts.
    pub async fn connect(self) -> Result<ValkeyStore, ValkeyError> {
        self.validate()?;
        ValkeyStore::connect(self).await
    }

    fn validate(&self) -> Result<(), ValkeyError> {
        if self.prefix.is_empty()
            || self.prefix.contains(['{', '}'])
            || self.prefix.contains(char::is_whitespace)
        {
            return Err(ValkeyError::Setting(format!(
                "prefix {:?} must be non-empty, without spaces or braces (braces would break the cluster hash tag)",
                self.prefix
            )));
        }
        if self.pool_size == 0 || self.pool_size > 64 {
            return Err(ValkeyError::Setting("pool_size must be 1 to 64".into()));
        }
        if self.recheck_interval.is_zero() {
            return Err(ValkeyError::Setting(
                "recheck_interval must be above zero".into(),
            ));
        }
        if self.command_timeout.is_zero() || self.connect_timeout.is_zero() {
            return Err(ValkeyError::Setting(
                "timeouts must be above zero: a call without one can hang while Valkey is down"
                    .into(),
            ));
        }
        if let Some(ttl) = self.result_ttl {
            if ttl < Duration::from_secs(1) || ttl > MAX_TTL {
                return Err(ValkeyError::Setting(
                    "result_ttl must be between 1 s and 10 years (None keeps results until deleted)"
                        .into(),
                ));
            }
            if self.claim_ttl < ttl {
                return Err(ValkeyError::Setting(format!(
                    "claim_ttl ({:?}) is shorter than result_ttl ({ttl:?}): a late duplicate would run again; raise claim_ttl or leave it unset (it then follows result_ttl)",
                    self.claim_ttl
                )));
            }
        }
        if self.claim_ttl < Duration::from_secs(60) || self.claim_ttl > MAX_TTL {
            return Err(ValkeyError::Setting(
                "claim_ttl must be between 60 s and 10 years".into(),
            ));
        }
        Ok(())
    }

    /// The fred builder for this URL, for the client that subscribes to result notifications:
    /// room for a burst of them while its reader is busy (a missed one is only a late wake-up,
    /// but each costs a waiter a poll).
    pub(crate) fn fred_subscriber_builder(&self) -> Result<Builder, ValkeyError> {
        let mut builder = self.fred_builder()?;
        builder.with_performance_config(|p| p.broadcast_channel_capacity = SUBSCRIBER_EVENTS);
        Ok(builder)
    }

    /// The fred builder for this URL, with timeouts and a reconnect policy that never gives up.
    pub(crate) fn fred_builder(&self) -> Result<Builder, ValkeyError> {
        let scheme = self.url.scheme();
        const PLAIN: [&str; 6] = [
            "redis",
            "valkey",
            "redis-cluster",
            "valkey-cluster",
            "redis-sentinel",
            "valkey-sentinel",
        ];
        const TLS: [&str; 6] = [
            "rediss",
            "valkeys",
            "rediss-cluster",
            "valkeys-cluster",
            "rediss-sentinel",
            "valkeys-sentinel",
        ];
        let bad = |reason: String| ValkeyError::Url {
            url: self.url.redacted(),
            reason,
        };
        let tls = TLS.contains(&scheme.as_str());
        if tls {
            // Without a TLS feature fred would connect in plain text: refuse instead.
            if !cfg!(feature = "tls") {
                return Err(bad(format!(
                    "{scheme}:// needs TLS: enable the `tls` feature of ferriq-valkey"
                )));
            }
        } else if self.tls.is_set() && PLAIN.contains(&scheme.as_str()) {
            return Err(bad(format!(
                "TLS files are set (FERRIQ_STORE_TLS_*) but {scheme}:// is plain text: use the TLS form of the URL (rediss://, valkeys://)"
            )));
        } else if !PLAIN.contains(&scheme.as_str()) {
            return Err(bad(format!(
                "unsupported scheme {scheme:?}; use redis://, rediss://, valkey://, valkeys:// or their -cluster/-sentinel forms"
            )));
        }
        // fred's own error text may quote the URL: keep only its kind.
        #[allow(unused_mut)] // set only with TLS
        let mut config = Config::from_url(self.url.expose()).map_err(|e| {
            bad(self
                .url
                .explain(format_args!("{:?} error while parsing", e.kind())))
        })?;
        #[cfg(feature = "tls")]
        if let Some(connector) = crate::tls::connector(&self.tls)? {
            config.tls = Some(connector.into());
        }
        #[cfg(not(feature = "tls"))]
        crate::tls::refuse_without_feature(&self.tls)?;
        let mut builder = Builder::from_config(config);
        let (connect, command) = (self.connect_timeout, self.command_timeout);
        builder
            .with_connection_config(|c| {
                c.connection_timeout = connect;
                c.internal_command_timeout = connect;
                // A dropped connection fails its in-flight calls at once rather than replaying
                // them later: the worker then releases the message (design §6).
                c.max_command_attempts = 1;
            })
            .with_performance_config(|p| {
                p.default_command_timeout = command;
                // Each client keeps seven event channels of this many slots: 4,096 cost ~2 MiB
                // per client, most of an idle worker's memory. Only the result subscriber
                // reads one that fills (see `SUBSCRIBER_EVENTS`); command clients read none.
                p.broadcast_channel_capacity = 16;
            })
            .set_policy(ReconnectPolicy::new_exponential(0, 50, 2_000, 2));
        Ok(builder)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const DAY: Duration = Duration::from_secs(24 * 3600);

    #[test]
    fn claims_outlive_results_kept_longer_than_the_default_claim_ttl() {
        let b = ValkeyStore::builder("redis://127.0.0.1:6379").result_ttl(Some(DAY * 30));
        assert_eq!(b.claim_ttl, DAY * 31);
        assert!(b.validate().is_ok());
        // Kept for less than 15 days, or forever: the default claim TTL.
        for ttl in [Some(DAY), None] {
            let b = ValkeyStore::builder("redis://127.0.0.1:6379").result_ttl(ttl);
            assert_eq!(b.claim_ttl, DEFAULT_CLAIM_TTL);
        }
    }

    #[test]
    fn an_explicit_claim_ttl_shorter_than_the_results_is_refused() {
        let b = ValkeyStore::builder("redis://127.0.0.1:6379")
            .claim_ttl(DAY * 20)
            .result_ttl(Some(DAY * 30));
        let e = b.validate().unwrap_err().to_string();
        assert!(e.contains("raise claim_ttl"), "{e}");
    }

    #[test]
    fn results_kept_up_to_ten_years_need_no_claim_ttl_and_longer_is_refused_as_result_ttl() {
        // Before, a day over the result TTL took the claim TTL it derived past its own bound:
        // refused as "claim_ttl must be between 60 s and 10 years", a setting never made.
        for ttl in [MAX_TTL - DAY / 2, MAX_TTL] {
            let b = ValkeyStore::builder("redis://127.0.0.1:6379").result_ttl(Some(ttl));
            assert_eq!(b.claim_ttl, MAX_TTL);
            assert!(b.validate().is_ok(), "{ttl:?}");
        }
        let b = ValkeyStore::builder("redis://127.0.0.1:6379").result_ttl(Some(MAX_TTL + DAY));
        let e = b.validate().unwrap_err().to_string();
        assert!(e.contains("result_ttl must be between"), "{e}");
    }

    #[test]
    fn tls_sentinel_urls_are_accepted_schemes() {
        for url in ["rediss-sentinel://h:26379", "valkeys-sentinel://h:26379"] {
            let b = ValkeyStore::builder(url);
            let e = b.fred_builder().err().map(|e| e.to_string());
            // Refused only for the missing `tls` feature, never as an unknown scheme.
            if let Some(e) = e {
                assert!(!e.contains("unsupported scheme"), "{url}: {e}");
                assert!(e.contains("tls") || e.contains("sentinel"), "{url}: {e}");
            }
        }
    }
}
