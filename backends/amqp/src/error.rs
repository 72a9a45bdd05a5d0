use thiserror::Error;

/// Why an [`AmqpBroker`](crate::AmqpBroker) could not be built or connected.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum AmqpError {
    /// The URL is not an AMQP URL this build supports.
    #[error("invalid AMQP URL {url}: {reason}")]
    Url {
        /// The URL with its password hidden.
        url: String,
        /// What is wrong.
        reason: String,
    },
    /// A setting is out of range.
    #[error("invalid AMQP broker setting: {0}")]
    Setting(String),
    /// The broker did not answer, refused the credentials, or refused the topology.
    #[error("cannot connect to RabbitMQ at {url}: {reason}")]
    Connect {
        /// The URL with its password hidden.
        url: String,
        /// What went wrong.
        reason: String,
    },
}
