#![warn(missing_docs)]
//! # ferriq-valkey
//!
//! ferriq's claims and results on Valkey (or Redis 7): the piece that turns at-least-once
//! brokers into "runs once at a time, answers exactly once" (design §1, §5).
//!
//! - One Lua script per operation (claim, heartbeat, release, record_failure, complete,
//!   revoke), loaded once and called by SHA, reloaded on `NOSCRIPT`. Every time comes from the
//!   server's `TIME`.
//! - Fencing tokens are `max(previous + 1, server time in µs)`: strictly increasing per task,
//!   and larger after a restart of a Valkey without persistence than any token issued before.
//! - Results are taskiq `TaskiqResult` JSON at `{prefix}:{task_id}` (taskiq-redis reads them with
//!   `prefix_str=prefix` and `JSONSerializer`), written `NX` by the fenced `complete` script.
//! - `wait` is woken by a pub/sub notification on this process's reply channel (one
//!   subscriber connection for every waiter), which carries the stored result (up to 8 KiB) so
//!   the waiter does not read it back. A task enqueued without a `reply_to` (by a Python
//!   producer) is announced on its own channel, so every wait still unanswered after its first
//!   re-read (100 ms) subscribes there as well (a subscription per long wait, whoever enqueued
//!   the task), and leaves when its last waiter does. A task another
//!   ferriq process enqueued is announced on that process's channel: waits here find it by
//!   re-reads (100 ms doubling to `recheck_interval`), the safety net for every wait.
//! - Off cluster, concurrent claims (and completes) are gathered into one script run per round
//!   trip. On Valkey Cluster (`redis-cluster://host:port?node=host2:port2…`, tested against a
//!   three-master cluster) every call is its own script in its task's slot, and a heartbeat is
//!   one call per slot, sent together.
//! - Through Redis Sentinel (`redis-sentinel://sentinel:port?sentinelServiceName=name`), the
//!   store follows a failover by itself: calls fail fast (typed `Unavailable`) while there is no
//!   primary, then go to the promoted replica (tested with a SIGKILLed primary).
//!
//! ```no_run
//! # async fn demo() -> Result<(), ferriq_valkey::ValkeyError> {
//! use std::sync::Arc;
//! let store = Arc::new(
//!     ferriq_valkey::ValkeyStore::builder("redis://127.0.0.1:6379")
//!         .prefix("myapp")
//!         .connect()
//!         .await?,
//! );
//! // Worker::builder().store(store.clone()) … ; Client::new(broker, store)
//! # Ok(()) }
//! ```
//!
//! ## Retention
//! A claim must outlive every copy of its message that may still arrive, or a late duplicate
//! runs again: `claim_ttl` (default 15 days, or a day longer than a `result_ttl` longer than
//! that) is longer than SQS's 14-day retention and is never shorter than `result_ttl`
//! (default 7 days).
//!
//! ## Durability
//! A Valkey restart without persistence forgets claims and results: tokens stay monotonic (they
//! follow server time), a lost result makes its task run again (its result is stored then).
//! Only AOF with `appendfsync always` keeps every written result.

mod argv;
mod batch;
mod claims;
mod config;
mod dead_index;
mod debounce;
mod error;
mod flow;
mod from_url;
mod gate;
mod history;
mod keys;
mod limiter_keys;
mod limits;
mod limits_live;
mod ops;
mod schedules;
mod scripts;
mod slots;
mod store;
mod streams;
mod tls;
mod waiters;
mod workflow;

pub use config::ValkeyStoreBuilder;
pub use error::ValkeyError;
pub use store::{ClaimState, ValkeyStore};
pub use streams::{StreamBroker, StreamBrokerBuilder};
