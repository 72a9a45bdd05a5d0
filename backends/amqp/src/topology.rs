//! Declaring the exchange, lanes, dead-letter and delay queues (idempotent).

use lapin::options::{ExchangeDeclareOptions, QueueBindOptions, QueueDeclareOptions};
use lapin::types::{AMQPValue, FieldTable, LongString, ShortString};
use lapin::{Channel, ExchangeKind};

use crate::AmqpBrokerBuilder;

/// Why setting up a connection failed: whether the exchange or a lane named is missing (a
/// passive declare answered RabbitMQ's 404), or anything else.
#[derive(Debug)]
pub(crate) struct SetupError {
    /// The exchange or a lane is not on the broker.
    pub(crate) missing: bool,
    /// What failed and what to check.
    pub(crate) message: String,
}

/// What to do when RabbitMQ refuses an operation on a queue or exchange.
const ACCESS_HINT: &str = " — the RabbitMQ user lacks a permission: grant it configure, write and read on its exchange and lanes (with each lane's .dead_letter and .delay.* queues, and write on amq.default) as the README's Security section shows";

impl From<String> for SetupError {
    fn from(mut message: String) -> Self {
        if message.contains("ACCESS_REFUSED") || message.contains("ACCESS-REFUSED") {
            message.push_str(ACCESS_HINT);
        }
        SetupError {
            missing: false,
            message,
        }
    }
}

impl std::fmt::Display for SetupError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

fn long(s: &str) -> AMQPValue {
    AMQPValue::LongString(LongString::from(s.as_bytes().to_vec()))
}

/// Names are checked to be at most 200 bytes when the broker is built, so this cannot panic.
fn short(s: &str) -> ShortString {
    ShortString::from(s)
}

/// The arguments of a lane: exactly taskiq-aio-pika 0.6's, so both sides can declare it.
pub(crate) fn lane_arguments(config: &AmqpBrokerBuilder, queue: &str) -> FieldTable {
    let mut args = FieldTable::default();
    args.insert("x-queue-type".into(), long("quorum"));
    args.insert("x-dead-letter-exchange".into(), long(""));
    args.insert(
        "x-dead-letter-routing-key".into(),
        long(&AmqpBrokerBuilder::dead_letter_queue(queue)),
    );
    if let Some(limit) = config.delivery_limit {
        args.insert(
            "x-delivery-limit".into(),
            AMQPValue::LongLongInt(i64::from(limit)),
        );
    }
    args
}

/// Declares everything; safe to run on every connect and from several processes. Without
/// [`AmqpBrokerBuilder::declare_topology`] it only checks that the exchange and lanes exist.
pub(crate) async fn declare(
    channel: &Channel,
    config: &AmqpBrokerBuilder,
) -> Result<(), SetupError> {
    if !config.declare_topology {
        return check(channel, config).await;
    }
    declare_all(channel, config).await.map_err(|e| {
        let e = e.to_string();
        // The usual cause: taskiq-aio-pika declared the lane first with its own dead-letter
        // queue (`taskiq.dead_letter` whatever the lane), or a process set another limit.
        let hint = if e.contains("x-dead-letter") {
            "; every process declaring a lane must agree on its arguments: ferriq names a \
             lane's dead-letter queue '<lane>.dead_letter', so a taskiq-aio-pika broker on \
             this lane needs dead_letter_queue=Queue(name=\"<lane>.dead_letter\")"
        } else if e.contains("x-delivery-limit") {
            "; every process declaring a lane must set the same FERRIQ_AMQP_DELIVERY_LIMIT"
        } else {
            ""
        };
        SetupError::from(format!("declaring the topology failed: {e}{hint}"))
    })
}

/// Passive declares of the exchange and each lane set by name (the default lane is not
/// checked: commands that use no lane must work where it does not exist): a missing one is
/// named (RabbitMQ closes the channel on the first, so the check stops there).
async fn check(channel: &Channel, config: &AmqpBrokerBuilder) -> Result<(), SetupError> {
    let exchange = format!("exchange {:?}", config.exchange);
    declare_exchange(channel, config, true)
        .await
        .map_err(|e| checked(&exchange, e, "the exchange name (FERRIQ_AMQP_EXCHANGE)"))?;
    let named = if config.queues_named {
        &config.queues[..]
    } else {
        &[]
    };
    for queue in named {
        channel
            .queue_declare(
                short(queue),
                QueueDeclareOptions::default().passive(),
                FieldTable::default(),
            )
            .await
            .map_err(|e| {
                checked(
                    &format!("lane {queue:?}"),
                    e,
                    "the lane names (--queues / FERRIQ_QUEUES)",
                )
            })?;
    }
    Ok(())
}

/// What a failed passive declare of `what` says: RabbitMQ's 404 NOT_FOUND means it is not
/// there; any other error (an exclusive queue's 405, a refused permission) is reported as it is.
fn checked(what: &str, e: lapin::Error, names: &str) -> SetupError {
    use lapin::protocol::{AMQPErrorKind, AMQPSoftError};
    let not_found = matches!(
        e.kind(),
        lapin::ErrorKind::ProtocolError(p)
            if matches!(p.kind(), AMQPErrorKind::Soft(AMQPSoftError::NOTFOUND))
    );
    if not_found {
        SetupError {
            missing: true,
            message: format!(
                "{what} is not on the broker ({e}): check {names}; workers and clients \
                 declare the exchange and their lanes when they connect"
            ),
        }
    } else {
        SetupError::from(format!("checking {what} failed: {e}"))
    }
}

/// The durable topic exchange, declared (or with `passive`, only checked).
async fn declare_exchange(
    channel: &Channel,
    config: &AmqpBrokerBuilder,
    passive: bool,
) -> Result<(), lapin::Error> {
    channel
        .exchange_declare(
            short(&config.exchange),
            ExchangeKind::Topic,
            ExchangeDeclareOptions {
                durable: true,
                passive,
                ..Default::default()
            },
            FieldTable::default(),
        )
        .await
}

async fn declare_all(channel: &Channel, config: &AmqpBrokerBuilder) -> Result<(), lapin::Error> {
    declare_exchange(channel, config, false).await?;
    for queue in &config.queues {
        let dead = AmqpBrokerBuilder::dead_letter_queue(queue);
        let mut dead_args = FieldTable::default();
        dead_args.insert("x-queue-type".into(), long("quorum"));
        channel
            .queue_declare(short(&dead), QueueDeclareOptions::durable(), dead_args)
            .await?;
        channel
            .queue_declare(
                short(queue),
                QueueDeclareOptions::durable(),
                lane_arguments(config, queue),
            )
            .await?;
        channel
            .queue_bind(
                short(queue),
                short(&config.exchange),
                short(queue),
                QueueBindOptions::default(),
                FieldTable::default(),
            )
            .await?;
        for tier in &config.delay_tiers {
            // Expired messages go back through the exchange to the lane. At-least-once
            // dead-lettering: a broker crash mid-transfer must not lose a delayed retry.
            let mut args = FieldTable::default();
            args.insert("x-queue-type".into(), long("quorum"));
            args.insert(
                "x-message-ttl".into(),
                AMQPValue::LongLongInt(tier.as_millis() as i64),
            );
            args.insert("x-dead-letter-exchange".into(), long(&config.exchange));
            args.insert("x-dead-letter-routing-key".into(), long(queue));
            args.insert("x-dead-letter-strategy".into(), long("at-least-once"));
            args.insert("x-overflow".into(), long("reject-publish"));
            channel
                .queue_declare(
                    short(&AmqpBrokerBuilder::delay_queue(queue, *tier)),
                    QueueDeclareOptions::durable(),
                    args,
                )
                .await?;
        }
    }
    Ok(())
}
