#![warn(missing_docs)]
//! ferriq's fault-injection harness: worker processes, a private redis-server, the broker
//! behind a proxy, faults injected, and an oracle outside the faulted path (the store's own
//! keyspace notifications, the task bodies' reports, the producer's ids). See RELIABILITY.md.

pub mod bad_input;
pub mod events;
pub mod proxy;
pub mod redis;
pub mod report;
pub mod scenarios;
pub mod tasks;
pub mod world;
