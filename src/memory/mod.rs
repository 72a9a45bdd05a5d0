//! In-memory broker and store: the embedded default for examples and app tests, and the test kit.
//!
//! They keep the same contract as the real backends — visibility timeouts, release, receive
//! counts, a dead-letter queue, fenced claims with leases, exactly-once results with woken
//! waiters — and they run on tokio's clock, so `tokio::time::pause` drives them. Test helpers
//! (`expire_in_flight`, `take_over`, write counts) inject the faults real deployments see.

mod broker;
mod store;

pub use broker::{DeadLettered, MemoryBroker, MemoryBrokerStats};
pub use store::MemoryStore;

use std::time::{SystemTime, UNIX_EPOCH};

use tokio::time::Instant;

/// Wall-clock seconds that follow tokio's (pausable) clock, so deadlines and leases agree in
/// tests with paused time.
#[derive(Debug, Clone, Copy)]
struct Clock {
    base_unix: f64,
    base: Instant,
}

impl Clock {
    fn new() -> Self {
        let base_unix = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_secs_f64())
            .unwrap_or(0.0);
        Clock {
            base_unix,
            base: Instant::now(),
        }
    }

    fn now_unix(&self) -> f64 {
        self.base_unix + self.base.elapsed().as_secs_f64()
    }
}
