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
    /// The exchange or a lane named is not on the broker (with
    /// `declare_topology(false)`, which only checks them): the message names it.
    #[error("RabbitMQ at {url}: {reason}")]
    NotDeclared {
        /// The URL with its password hidden.
        url: String,
        /// What is missing and which setting names it.
        reason: String,
    },
    /// The broker did not answer, refused the credentials, or refused the topology.
    #[error("cannot connect to RabbitMQ at {url}: {reason}")]
    Connect {
        /// The URL with its password hidden.
        url: String,
        /// What went wrong.
        reason: String,
    },
}
