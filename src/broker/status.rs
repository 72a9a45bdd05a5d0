//! What a broker reports about itself: queue depths and health.

/// Messages waiting in a queue, for autoscaling.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct QueueDepth {
    /// Ready to be received.
    pub ready: u64,
    /// Received and not yet acked (when the broker knows).
    pub in_flight: u64,
    /// Delayed (not yet visible), when the broker knows.
    pub delayed: u64,
}

impl QueueDepth {
    /// A depth reading.
    pub fn new(ready: u64, in_flight: u64, delayed: u64) -> Self {
        QueueDepth {
            ready,
            in_flight,
            delayed,
        }
    }
}

/// A backend's health, for readiness probes.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Health {
    /// Connected and working.
    Healthy,
    /// Not usable right now; the string says why.
    Unhealthy(String),
}

impl Health {
    /// Whether it is healthy.
    pub fn is_healthy(&self) -> bool {
        matches!(self, Health::Healthy)
    }
}
