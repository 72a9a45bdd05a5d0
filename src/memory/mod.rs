//! In-memory broker and store: the embedded default for examples and app tests, and the test kit.
//!
//! They keep the same contract as the real backends — visibility timeouts, release, receive
//! counts, a dead-letter queue, fenced claims with leases, exactly-once results with woken
//! waiters — and they run on tokio's clock, so `tokio::time::pause` drives them. Test helpers
//! (`expire_in_flight`, `take_over`, write counts) inject the faults real deployments see.

mod broker;
mod store;

pub use broker::{MemoryBroker, MemoryBrokerStats, ParkedMessage};
pub use store::MemoryStore;

use crate::clock::Clock;
