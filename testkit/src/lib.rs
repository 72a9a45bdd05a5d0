//! Tools for ferriq's own tests and its fault harness (not published): servers of a test's
//! own, started and stopped by PID, so a test that kills or restarts a server never touches
//! the shared ones.
//!
//! - [`rabbitmq::PrivateNode`]: one RabbitMQ node (plain and TLS listeners, its own name, ports
//!   and data directory), run as the `rabbitmq` user when the tests run as root.
//! - [`rabbitmq::PrivateCluster`]: three such nodes joined into one cluster.
//! - [`services`]: the shared servers' URLs, checked on first use.
#![warn(missing_docs)]

pub mod rabbitmq;
pub mod services;

/// A loopback port free now (the kernel picks it).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free loopback port")
}
