//! The contract every backend keeps, as runnable checks (feature `conformance`): a broker suite
//! and a store suite that the memory backend, RabbitMQ, SQS and Valkey run — and that a
//! backend of your own runs with a few lines:
//!
//! ```
//! use std::sync::Arc;
//! use ferriq::broker::Broker;
//! use ferriq::memory::{MemoryBroker, MemoryStore};
//! use ferriq::store::Store;
//! use ferriq::testing::conformance;
//!
//! # #[tokio::main(flavor = "current_thread")] async fn main() {
//! // A fresh, empty broker for each check (on a real server: a lane of its own).
//! conformance::broker_suite(|| async { Arc::new(MemoryBroker::new()) as Arc<dyn Broker> }).await;
//! conformance::store_suite(|| async { Arc::new(MemoryStore::new()) as Arc<dyn Store> }).await;
//! # }
//! ```
//!
//! Each check panics with its name and the rule it found broken. They use only the traits, so
//! they hold a backend to what the worker relies on: a published message is received, a
//! released one comes back, a held one stays held while it is extended, a parked one leaves its
//! lane with its reason, a dropped receive loses nothing; a claim is exclusive, a result is
//! written once and only by the current token, a lease that runs out can be taken over, a
//! revoked task never starts. [`flow_suite`] holds a store's flow control to the same: a rate
//! admits its limit per window and no more, a slot no longer renewed frees itself within its
//! lease, no waiter is told to wait past the first lease's end, limits set at run time are
//! kept and listed with their use.
//!
//! Beyond the two suites, scenarios that run a real worker on a backend:
//! [`operations`] (dead letters listed, redriven and purged through `client.ops()`, and a
//! stale worker fenced off after a redrive — for a broker), [`exactly_once`] (1,000 tasks
//! delivered twice to four workers while leases and deliveries expire at random — for a
//! store) and [`workflows`] (groups, chords, chains, progress, and chords racing duplicated
//! deliveries — for a store). Their tasks, named `conformance.*`, are declared with
//! `inventory = false`: a registry built with `Registry::from_inventory()` never lists them.

// The scenarios set up workers as a backend's own tests would, field by field on a default
// configuration (outside this crate the configuration's fields can only be set that way).
#![allow(clippy::field_reassign_with_default)]
mod broker;
pub mod exactly_once;
mod flow;
mod gate;
pub mod operations;
mod store;
pub mod workflows;

pub use broker::broker_suite;
pub use flow::flow_suite;
pub use store::store_suite;

use std::time::Duration;

/// How long a check waits for something that should happen at once on a healthy server
/// (generous: CI machines are slow and SQS emulators poll).
pub const PATIENCE: Duration = Duration::from_secs(15);
