use std::time::Duration;

use ferriq::SecretUrl;

use crate::{AmqpBroker, AmqpError};

/// Publisher channels by default (see [`AmqpBrokerBuilder::publisher_channels`]).
pub(crate) const DEFAULT_PUBLISHER_CHANNELS: usize = 32;

/// Publisher channels opened with each connection; the rest open on demand.
pub(crate) const EAGER_PUBLISHER_CHANNELS: usize = 4;

/// The publisher channels a broker may have.
pub(crate) const PUBLISHER_CHANNELS: std::ops::RangeInclusive<usize> = 1..=64;

/// Settings for an [`AmqpBroker`], built from a URL (`amqp://` or `amqps://`; `amqps` verifies
/// the server certificate and needs this crate's `tls` feature). The password is never logged.
///
/// ```
/// let builder = ferriq_amqp::AmqpBroker::builder("amqp://app:s3cret@rabbit:5672/%2f")
///     .exchange("billing")
///     .queues(["billing", "billing.bulk"]);
/// // No prefetch set: a worker on this broker sets it to its concurrency.
/// assert!(!format!("{builder:?}").contains("s3cret"));
/// ```
#[derive(Debug, Clone)]
pub struct AmqpBrokerBuilder {
    pub(crate) url: SecretUrl,
    pub(crate) exchange: String,
    pub(crate) queues: Vec<String>,
    /// Set explicitly; `None` takes the worker's concurrency.
    pub(crate) prefetch: Option<u16>,
    pub(crate) heartbeat_secs: u16,
    pub(crate) connect_timeout: Duration,
    pub(crate) publish_timeout: Duration,
    pub(crate) delivery_limit: Option<u32>,
    pub(crate) delay_tiers: Vec<Duration>,
    pub(crate) publisher_channels: usize,
    pub(crate) connection_name: String,
    pub(crate) publish_to_lanes_directly: bool,
    pub(crate) declare_topology: bool,
    /// The lanes were set (not the default): without declaring, only named lanes are checked.
    pub(crate) queues_named: bool,
    /// PEM certificates to trust besides the system's roots.
    pub(crate) tls_ca: Option<std::path::PathBuf>,
    /// A client certificate chain (PEM) and its private key (PEM), for mTLS.
    pub(crate) tls_identity: Option<(std::path::PathBuf, std::path::PathBuf)>,
}

impl AmqpBrokerBuilder {
    pub(crate) fn new(url: impl Into<SecretUrl>) -> Self {
        AmqpBrokerBuilder {
            url: url.into(),
            exchange: "taskiq".into(),
            queues: vec!["taskiq".into()],
            prefetch: None,
            heartbeat_secs: 5,
            connect_timeout: Duration::from_secs(5),
            publish_timeout: Duration::from_secs(30),
            delivery_limit: None,
            delay_tiers: [1, 5, 30, 120, 600, 3600, 6 * 3600, 24 * 3600]
                .into_iter()
                .map(Duration::from_secs)
                .collect(),
            publisher_channels: DEFAULT_PUBLISHER_CHANNELS,
            connection_name: "ferriq".into(),
            publish_to_lanes_directly: false,
            declare_topology: true,
            queues_named: false,
            tls_ca: None,
            tls_identity: None,
        }
    }

    /// The topic exchange messages are published to (default `taskiq`, taskiq-aio-pika's).
    pub fn exchange(mut self, name: impl Into<String>) -> Self {
        self.exchange = name.into();
        self
    }

    /// The lanes: queues bound to the exchange by their own name. The first is where messages
    /// without a `queue_name` label go, and a worker consumes all of them (default `taskiq`).
    pub fn queues<I: IntoIterator<Item = S>, S: Into<String>>(mut self, queues: I) -> Self {
        self.queues = queues.into_iter().map(Into::into).collect();
        self.queues_named = true;
        self
    }

    /// Deliveries held unacked at once, in total over the lanes. By default a worker sets it
    /// to its concurrency when it starts (32 before that): set it only to hold a different
    /// number.
    pub fn prefetch(mut self, n: u16) -> Self {
        self.prefetch = Some(n);
        self
    }

    /// AMQP heartbeat in seconds (default 5): a dead connection is noticed within about two.
    /// A `heartbeat=` in the URL wins.
    pub fn heartbeat_secs(mut self, secs: u16) -> Self {
        self.heartbeat_secs = secs;
        self
    }

    /// Longest wait for a connection (default 5 s).
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout;
        self
    }

    /// Longest wait for a publish to be confirmed, reconnects included (default 30 s).
    pub fn publish_timeout(mut self, timeout: Duration) -> Self {
        self.publish_timeout = timeout;
        self
    }

    /// Whether connecting declares the exchange and the lanes' queues (default `true`: every
    /// worker and client can start first). With `false` it only checks that the exchange and
    /// the lanes set with [`queues`](Self::queues) exist, and fails naming the missing one:
    /// for tools that inspect a deployment (the `ferriq` command), where a mistyped lane must
    /// not create queues. Not for workers and clients: their lanes' dead-letter and delay
    /// queues are neither declared nor checked.
    ///
    /// ```
    /// let builder = ferriq_amqp::AmqpBroker::builder("amqp://127.0.0.1:5672/%2f")
    ///     .declare_topology(false);
    /// ```
    pub fn declare_topology(mut self, declare: bool) -> Self {
        self.declare_topology = declare;
        self
    }

    /// `x-delivery-limit` on the lanes: RabbitMQ dead-letters a message delivered more often.
    /// Off by default (see the crate docs: taskiq-aio-pika declares the queue without it).
    pub fn delivery_limit(mut self, limit: Option<u32>) -> Self {
        self.delivery_limit = limit;
        self
    }

    /// The delay tiers (default 1 s, 5 s, 30 s, 2 min, 10 min, 1 h, 6 h, 24 h). A delay waits
    /// in the largest tier not longer than it, and comes back for the rest: every message in a
    /// tier has the same TTL, so none waits behind one due later. Delays longer than the
    /// largest tier go round it again; fewer tiers mean more round trips, never a late task.
    /// A delay under a second goes straight to the queue, and the worker holds it until due.
    /// Keep a 1 s tier: a delay shorter than the smallest tier waits in it with an expiration
    /// of its own, which RabbitMQ applies only at the head of the queue, so it can run up to
    /// that tier's length late.
    pub fn delay_tiers(mut self, tiers: impl IntoIterator<Item = Duration>) -> Self {
        self.delay_tiers = tiers.into_iter().collect();
        self.delay_tiers.sort();
        self.delay_tiers.dedup();
        self
    }

    /// Confirm-mode channels for publishing, 1 to 64 (default 32): each carries one batch at
    /// a time until RabbitMQ confirms it, so this is how many enqueues (or batches) can wait
    /// for their confirms at once. An app that enqueues tasks one at a time from many
    /// concurrent requests gets about this many divided by the confirm time per second
    /// (4 channels held it near 2,000 tasks/s in our benchmarks, BENCHMARKS.md). The first
    /// four open with the connection, the rest when concurrent publishes first need them.
    pub fn publisher_channels(mut self, n: usize) -> Self {
        self.publisher_channels = n;
        self
    }

    /// Publish each task straight to its lane's queue through RabbitMQ's default exchange,
    /// instead of through the topic exchange (off by default).
    ///
    /// RabbitMQ spends less CPU on a message that skips topic routing (~9 % per task in our
    /// benchmarks, BENCHMARKS.md): a lever when the broker's CPU is what a deployment runs
    /// out of (on a small machine shared with the workers it did not raise throughput).
    /// Turn it on only when nothing else is bound to the exchange: the task reaches the same
    /// queue (taskiq-aio-pika binds a queue by its name too, so Python workers on it still get
    /// it), but other queues bound to the exchange (an audit queue bound with `#`, say) no
    /// longer receive copies of the tasks this broker publishes. (Delayed tasks go to a delay
    /// queue directly either way, and come back to the lane through the exchange when due.)
    ///
    /// ```
    /// let builder = ferriq_amqp::AmqpBroker::builder("amqp://guest:guest@127.0.0.1:5672/%2f")
    ///     .publish_to_lanes_directly(true);
    /// # drop(builder);
    /// ```
    pub fn publish_to_lanes_directly(mut self, on: bool) -> Self {
        self.publish_to_lanes_directly = on;
        self
    }

    /// The connection's name in RabbitMQ's management UI (default `ferriq`).
    pub fn connection_name(mut self, name: impl Into<String>) -> Self {
        self.connection_name = name.into();
        self
    }

    /// Checks the settings, connects and declares the topology. Consumption starts with the
    /// first `receive`, so a client that only publishes never takes messages.
    pub async fn connect(self) -> Result<AmqpBroker, AmqpError> {
        self.validate()?;
        AmqpBroker::connect(self).await
    }

    /// Trusts the certificate authorities in this PEM file, besides the system's roots
    /// (`FERRIQ_BROKER_TLS_CA`): for a broker whose certificate a private CA signed. For
    /// `amqps://` URLs; needs the `tls` feature. The broker's certificate and host name are
    /// always verified.
    pub fn tls_ca_file(mut self, pem: impl Into<std::path::PathBuf>) -> Self {
        self.tls_ca = Some(pem.into());
        self
    }

    /// Presents this client certificate (PEM chain) and its private key (PEM, PKCS#8, PKCS#1
    /// or SEC1) to a broker that asks for one (mTLS; `FERRIQ_BROKER_TLS_CERT`,
    /// `FERRIQ_BROKER_TLS_KEY`). The key is read when connecting and never logged.
    pub fn tls_client_cert(
        mut self,
        cert_pem: impl Into<std::path::PathBuf>,
        key_pem: impl Into<std::path::PathBuf>,
    ) -> Self {
        self.tls_identity = Some((cert_pem.into(), key_pem.into()));
        self
    }

    /// The TLS files read for lapin (`None`: none set).
    pub(crate) fn tls_config(&self) -> Result<Option<lapin::tcp::OwnedTLSConfig>, String> {
        if self.tls_ca.is_none() && self.tls_identity.is_none() {
            return Ok(None);
        }
        let read = |setting: &str, path: &std::path::Path| {
            std::fs::read(path).map_err(|e| format!("{setting} ({}): {e}", path.display()))
        };
        let mut config = lapin::tcp::OwnedTLSConfig::default();
        if let Some(ca) = &self.tls_ca {
            let pem = read("FERRIQ_BROKER_TLS_CA", ca)?;
            let pem = String::from_utf8(pem)
                .ok()
                .filter(|p| p.contains("-----BEGIN CERTIFICATE-----"))
                .ok_or_else(|| {
                    format!(
                        "FERRIQ_BROKER_TLS_CA ({}): not a PEM certificate file",
                        ca.display()
                    )
                })?;
            config.cert_chain = Some(pem);
        }
        if let Some((cert, key)) = &self.tls_identity {
            let pem = read("FERRIQ_BROKER_TLS_CERT", cert)?;
            if !pem.windows(27).any(|w| w == b"-----BEGIN CERTIFICATE-----") {
                return Err(format!(
                    "FERRIQ_BROKER_TLS_CERT ({}): not a PEM certificate file",
                    cert.display()
                ));
            }
            let key_pem = read("FERRIQ_BROKER_TLS_KEY", key)?;
            config.identity = Some(lapin::tcp::OwnedIdentity::PKCS8 { pem, key: key_pem });
        }
        Ok(Some(config))
    }

    /// One node's URL: its scheme, and a host lapin can connect to.
    fn validate_node(&self, node: &SecretUrl, tls_files: bool) -> Result<(), AmqpError> {
        let bad_url = |reason: &str| AmqpError::Url {
            url: node.redacted(),
            reason: reason.to_owned(),
        };
        match node.scheme().as_str() {
            "amqp" if tls_files => return Err(bad_url(
                "TLS files are set (FERRIQ_BROKER_TLS_*) but amqp:// is plain text: use amqps://",
            )),
            "amqp" => {}
            // Without a TLS feature lapin would fall back to plain TCP: refuse instead.
            "amqps" if cfg!(feature = "tls") => {}
            "amqps" => {
                return Err(bad_url(
                    "amqps:// needs TLS: enable the `tls` feature of ferriq-amqp",
                ))
            }
            _ => return Err(bad_url("use amqp:// or amqps://")),
        }
        let authority = node.expose().split_once("://").map_or("", |(_, rest)| rest);
        let host = authority
            .rsplit_once('@')
            .map_or(authority, |(_, host)| host);
        if host.starts_with('[') {
            return Err(bad_url(
                "IPv6 literal hosts are not supported by the AMQP client; use a host name",
            ));
        }
        Ok(())
    }

    fn validate(&self) -> Result<(), AmqpError> {
        let bad_url = |reason: &str| AmqpError::Url {
            url: self.url.redacted(),
            reason: reason.to_owned(),
        };
        let tls_files = self.tls_ca.is_some() || self.tls_identity.is_some();
        let nodes = self.url.nodes();
        if nodes.iter().any(|n| n.scheme() != nodes[0].scheme()) {
            return Err(bad_url(
                "every node of a list must use the same scheme (all amqp:// or all amqps://)",
            ));
        }
        for node in &nodes {
            self.validate_node(node, tls_files)?;
        }
        let name_ok = |n: &str| !n.is_empty() && n.len() <= 200;
        if !name_ok(&self.exchange)
            || self.queues.is_empty()
            || !self.queues.iter().all(|q| name_ok(q))
        {
            return Err(AmqpError::Setting(
                "exchange and queue names must be 1-200 bytes, and at least one queue is needed"
                    .into(),
            ));
        }
        if self.prefetch == Some(0) {
            return Err(AmqpError::Setting("prefetch must be at least 1".into()));
        }
        if self.delay_tiers.is_empty() || self.delay_tiers[0].is_zero() {
            return Err(AmqpError::Setting(
                "at least one delay tier above zero is needed".into(),
            ));
        }
        if !PUBLISHER_CHANNELS.contains(&self.publisher_channels) {
            return Err(AmqpError::Setting(
                "publisher_channels must be 1 to 64".into(),
            ));
        }
        if self.connect_timeout.is_zero() || self.publish_timeout.is_zero() {
            return Err(AmqpError::Setting("timeouts must be above zero".into()));
        }
        Ok(())
    }

    /// The URL handed to lapin: an empty vhost read as `/` (see [`vhost_as_pika_reads_it`]),
    /// the heartbeat and [`FRAME_MAX`] added when the URL has none.
    pub(crate) fn connect_url(&self, node: &SecretUrl) -> String {
        let mut url = vhost_as_pika_reads_it(node.expose());
        for (key, value) in [
            ("heartbeat", self.heartbeat_secs.to_string()),
            ("frame_max", FRAME_MAX.to_string()),
        ] {
            if !url.contains(&format!("{key}=")) {
                let sep = if url.contains('?') { '&' } else { '?' };
                url = format!("{url}{sep}{key}={value}");
            }
        }
        url
    }

    /// The dead-letter queue of a lane.
    pub(crate) fn dead_letter_queue(queue: &str) -> String {
        format!("{queue}.dead_letter")
    }

    /// The delay queue of a lane for one tier.
    pub(crate) fn delay_queue(queue: &str, tier: Duration) -> String {
        let ms = tier.as_millis();
        let label = if ms.is_multiple_of(3_600_000) {
            format!("{}h", ms / 3_600_000)
        } else if ms.is_multiple_of(60_000) {
            format!("{}m", ms / 60_000)
        } else if ms.is_multiple_of(1000) {
            format!("{}s", ms / 1000)
        } else {
            format!("{ms}ms")
        };
        format!("{queue}.delay.{label}")
    }

    /// The tier a delay waits in, and the expiration the message needs there: the largest
    /// tier not longer than the delay (no expiration of its own: the tier's TTL keeps it in
    /// expiry order), else the smallest tier with the delay as its expiration.
    pub(crate) fn tier_for(&self, delay: Duration) -> (Duration, Option<Duration>) {
        match self.delay_tiers.iter().rev().find(|t| **t <= delay) {
            Some(tier) => (*tier, None),
            None => (self.delay_tiers[0], Some(delay)),
        }
    }
}

/// `amqp://host:5672/` — the URL taskiq, aio-pika and pika users have — means vhost `/` to
/// them, but the empty vhost to the AMQP URI spec (and lapin), which RabbitMQ refuses with
/// `vhost  not found`. Read an empty vhost as `/`, as they do; name another vhost in the path
/// (`/%2f` is `/` too).
pub(crate) fn vhost_as_pika_reads_it(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_owned();
    };
    let end = rest.find(['?', '#']).unwrap_or(rest.len());
    let (authority_and_path, tail) = rest.split_at(end);
    match authority_and_path.split_once('/') {
        Some((authority, "")) => format!("{scheme}://{authority}/%2f{tail}"),
        _ => url.to_owned(),
    }
}

/// The largest AMQP frame asked for (bytes), unless the URL sets `frame_max`. lapin keeps two
/// buffers of 32 frames per connection, written through: at RabbitMQ's default of 128 KiB
/// that is 8 MiB resident per connection (a worker has two). Bodies larger than a frame are
/// split into several frames, as they are at any size.
pub(crate) const FRAME_MAX: u32 = 32 * 1024;

/// How many publisher channels a connection may have: the configured number, never more than
/// the server allows on one connection (`channel_max`, 0: no limit; one kept spare), and at
/// least one. Channels past the eager ones open on demand, so an enqueue waits for a free
/// channel instead of failing to open one past the server's limit.
pub(crate) fn publisher_slots(configured: usize, channel_max: u16) -> usize {
    match usize::from(channel_max) {
        0 => configured,
        max => configured.min(max.saturating_sub(1).max(1)),
    }
}

#[cfg(test)]
mod tests {

    #[test]
    fn a_node_list_is_checked_node_by_node_and_shown_without_passwords() {
        let mixed = AmqpBrokerBuilder::new("amqp://u:p1@a:5672/;amqps://u:p2@b:5671/")
            .validate()
            .unwrap_err()
            .to_string();
        assert!(mixed.contains("same scheme"), "{mixed}");
        assert!(!mixed.contains("p1") && !mixed.contains("p2"), "{mixed}");
        let bad = AmqpBrokerBuilder::new("amqp://u:p1@a:5672/;redis://u:p2@b/")
            .validate()
            .unwrap_err()
            .to_string();
        assert!(!bad.contains("p1") && !bad.contains("p2"), "{bad}");
        assert!(
            AmqpBrokerBuilder::new("amqp://u:p@a:5672/; amqp://u:p@b:5672/")
                .validate()
                .is_ok()
        );
    }
    use super::*;

    #[test]
    fn the_heartbeat_and_frame_size_are_added_unless_the_url_sets_them() {
        let url = |u: &str| {
            let builder = AmqpBrokerBuilder::new(u).heartbeat_secs(7);
            builder.connect_url(&builder.url)
        };
        assert_eq!(url("amqp://h/"), "amqp://h/%2f?heartbeat=7&frame_max=32768");
        assert_eq!(
            url("amqp://h/v?frame_max=4096"),
            "amqp://h/v?frame_max=4096&heartbeat=7"
        );
        assert_eq!(
            url("amqp://h/v?heartbeat=3&frame_max=8192"),
            "amqp://h/v?heartbeat=3&frame_max=8192"
        );
    }

    #[test]
    fn an_empty_vhost_is_the_default_vhost_as_in_pika() {
        let read = vhost_as_pika_reads_it;
        assert_eq!(read("amqp://u:p@h:5672/"), "amqp://u:p@h:5672/%2f");
        assert_eq!(read("amqp://h/?heartbeat=5"), "amqp://h/%2f?heartbeat=5");
        assert_eq!(read("amqp://h:5672"), "amqp://h:5672");
        assert_eq!(read("amqp://h:5672/%2f"), "amqp://h:5672/%2f");
        assert_eq!(read("amqp://h:5672/billing"), "amqp://h:5672/billing");
    }

    #[test]
    fn a_delay_waits_in_the_largest_tier_not_longer_than_it() {
        let b = AmqpBrokerBuilder::new("amqp://localhost");
        let s = Duration::from_secs;
        assert_eq!(b.tier_for(s(25)), (s(5), None));
        assert_eq!(b.tier_for(s(6)), (s(5), None));
        assert_eq!(b.tier_for(s(5)), (s(5), None));
        assert_eq!(b.tier_for(s(30 * 86_400)), (s(86_400), None));
        let short = Duration::from_millis(300);
        assert_eq!(b.tier_for(short), (s(1), Some(short)));
    }

    #[test]
    fn publisher_channels_stay_below_the_servers_channel_max() {
        assert_eq!(publisher_slots(32, 0), 32, "0: the server sets no limit");
        assert_eq!(publisher_slots(32, 2047), 32);
        assert_eq!(publisher_slots(32, 16), 15, "one channel kept spare");
        assert_eq!(publisher_slots(32, 2), 1);
        assert_eq!(publisher_slots(32, 1), 1, "never none");
    }
}
