//! The headers ferriq adds to RabbitMQ messages, read and written in one place: names, the
//! clock their times come from, and typed reads of a header table.

use lapin::types::{AMQPValue, FieldTable, LongString};

/// Our receive count, carried on copies made by `release(after)` (a copy is a new message to
/// RabbitMQ, so its own delivery count starts again).
pub(crate) const RECEIVES_HEADER: &str = "x-ferriq-receives";

/// On a released copy: unix milliseconds before which it is not to be handled. A delay tier
/// may hand it back earlier (tiers are coarse); the worker then releases it again.
pub(crate) const NOT_BEFORE_HEADER: &str = "x-ferriq-not-before";

/// Unix milliseconds now, from the core's clock, as AMQP's signed header value.
pub(crate) fn unix_ms_now() -> i64 {
    i64::try_from(ferriq::clock::Clock::system().now_unix_ms()).unwrap_or(i64::MAX)
}

/// On a dead letter: its id, stable while it stays parked.
pub(crate) const DEAD_LETTER_ID_HEADER: &str = "x-ferriq-dead-letter-id";
/// On a dead letter: when it was parked (unix ms).
pub(crate) const DEAD_AT_HEADER: &str = "x-ferriq-dead-at";

/// A text header value.
pub(crate) fn long(s: &str) -> AMQPValue {
    AMQPValue::LongString(LongString::from(s.as_bytes().to_vec()))
}

/// An integer header, whatever integer type (or digits) it was written as.
pub(crate) fn header_int(headers: &FieldTable, name: &str) -> Option<i64> {
    match headers.inner().get(name)? {
        AMQPValue::LongLongInt(n) => Some(*n),
        AMQPValue::LongInt(n) => Some(i64::from(*n)),
        AMQPValue::LongUInt(n) => Some(i64::from(*n)),
        AMQPValue::ShortInt(n) => Some(i64::from(*n)),
        AMQPValue::ShortShortInt(n) => Some(i64::from(*n)),
        AMQPValue::ShortShortUInt(n) => Some(i64::from(*n)),
        AMQPValue::ShortUInt(n) => Some(i64::from(*n)),
        AMQPValue::LongString(s) => std::str::from_utf8(s.as_bytes()).ok()?.parse().ok(),
        _ => None,
    }
}

/// A text header.
pub(crate) fn header_str(headers: &FieldTable, name: &str) -> Option<String> {
    header_text(headers, name).map(str::to_owned)
}

/// A text header, borrowed (read on every delivery: the task id).
pub(crate) fn header_text<'a>(headers: &'a FieldTable, name: &str) -> Option<&'a str> {
    match headers.inner().get(name)? {
        AMQPValue::LongString(s) => std::str::from_utf8(s.as_bytes()).ok(),
        AMQPValue::ShortString(s) => Some(s.as_str()),
        _ => None,
    }
}
