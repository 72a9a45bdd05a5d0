#![warn(missing_docs)]
#![doc(test(attr(deny(unused_must_use))))]
//! # ferriq
//!
//! Background tasks for Rust that share queues with Python's taskiq: **nothing is lost, a
//! result is written exactly once, and it is fast.**
//!
//! - Define a task with [`#[task]`](macro@task): an `async fn` with a stable name.
//! - Enqueue it with a [`Client`] (`add::kiq(&client, 1, 2)`) and await its [`TaskHandle`].
//! - Run it in a [`Worker`] over a [`Broker`](broker::Broker) (RabbitMQ, SQS, in-memory) with
//!   claims and results in a [`ClaimStore`](store::ClaimStore)/[`ResultStore`](store::ResultStore)
//!   (Valkey, in-memory).
//!
//! Start with the [`prelude`] (`use ferriq::prelude::*;`). The backends are crates of their own:
//! `ferriq-amqp` (RabbitMQ), `ferriq-sqs` (SQS) and `ferriq-valkey` (claims and results on
//! Valkey/Redis), connected from URLs with [`connect`]; `ferriq-dashboard` is the web page and
//! `ferriq-cli` the `ferriq` command. Where to look next:
//!
//! - [`task`](mod@task): options a task declares (retries, timeouts, limits, schedules), its
//!   [`TaskContext`], shared [`State`].
//! - [`client`]: enqueue, batches, delays, waiting on results; [`workflow`] for groups,
//!   chains and chords; [`schedule`] for cron and intervals.
//! - [`worker`]: concurrency, leases, draining, probes and metrics; [`middleware`].
//! - [`ops`]: queues, workers, dead letters and redrive, as the on-call engineer uses them.
//! - [`testing`]: an in-memory environment for your own tests.
//! - [`broker`] and [`store`]: the contracts a backend implements.
//!
//! How the promises are kept — the wire format, claims and fencing, what a worker does with
//! each delivery, how each broker works — is in `docs/design.md` in the repository; "design §N"
//! in these docs refers to its sections.
//!
//! ```
//! use std::time::Duration;
//! use ferriq::testing::TestEnv;
//!
//! #[ferriq::task(name = "docs.lib.add", max_attempts = 3)]
//! async fn add(a: i64, b: i64) -> i64 {
//!     a + b
//! }
//!
//! # #[tokio::main(flavor = "current_thread")] async fn main() {
//! let env = TestEnv::new(); // in-memory broker and store
//! let worker = env.spawn_worker(env.worker().registry(
//!     ferriq::Registry::from_inventory().unwrap().only(&[add::NAME]).unwrap()));
//! let handle = add::kiq(&env.client, 2, 3).await.unwrap();
//! assert_eq!(handle.wait(Duration::from_secs(5)).await.unwrap(), 5);
//! worker.stop().await;
//! # }
//! ```

/// What most apps need, in one import.
///
/// ```
/// use ferriq::prelude::*;
///
/// #[task(name = "docs.prelude.greet")]
/// async fn greet(name: String) -> Result<String, TaskError> {
///     Ok(format!("hello, {name}"))
/// }
/// # fn main() { let _ = greet::NAME; }
/// ```
pub mod prelude {
    pub use crate::client::{Client, TaskHandle, WaitError};
    pub use crate::registry::Registry;
    pub use crate::task::{State, Task, TaskContext, TaskError, TaskOptions};
    pub use crate::worker::{Shutdown, Worker};
    pub use ferriq_macros::task;
}

/// The runtime's maps keyed by task ids, delivery keys and task names: foldhash, seeded per
/// map, instead of SipHash (SipHash of ids was ~8 % of the memory engine's instructions).
pub(crate) type FastMap<K, V> = std::collections::HashMap<K, V, foldhash::fast::RandomState>;

pub mod broker;
pub mod client;
pub mod clock;
pub mod connect;
/// Dead-letter queues as operators use them (the same items as
/// [`broker::dead_letters`]): look at what was parked and why, send it back, or throw it away.
pub mod dead_letters {
    pub use crate::broker::dead_letters::{DeadFilter, DeadLetterQueue, DeadMessage};
}
pub mod limits;
#[cfg(feature = "memory")]
pub mod memory;
pub mod middleware;
pub mod ops;
pub mod registry;
pub mod schedule;
mod secret;
pub mod store;
pub mod task;
#[cfg(feature = "memory")]
pub mod testing;
// The conformance kit's scenarios declare tasks with `#[task]`, whose code names `::ferriq::…`.
#[cfg(feature = "conformance")]
extern crate self as ferriq;
pub mod wire;
pub mod worker;
pub mod workflow;

pub use client::{Call, Client, EnqueueError, TaskHandle, TaskStatus, WaitError};
pub use registry::{Registry, RegistryError};
pub use secret::SecretUrl;
pub use task::{State, Task, TaskContext, TaskError, TaskOptions};
pub use worker::{Shutdown, Worker, WorkerBuilder, WorkerConfig};

/// Defines a task from an `async fn`. See the crate docs and `README.md`.
///
/// Options: `name = "…"` (the stable wire name; default `module_path:function`),
/// `max_attempts = N`, `timeout = SECS`, `queue = "…"`, `backoff_initial = SECS`,
/// `backoff_max = SECS`, `retry_on_error = bool`, `store_result = bool`, `deadline = SECS`,
/// `park_fatal = bool`; flow control: `rate = "50/s"`, `rate_key = "…"`, `concurrency = N`,
/// `concurrency_key = "…"`, `unique_for = SECS`, `dedup = "active" | "window" | "debounce"`,
/// `dedup_key = "…"` (see the README's flow control); and for a task that
/// runs on a schedule, `schedule = "cron with seconds"` or `every = SECS`, `timezone = "…"`,
/// `missed = "latest" | "skip" | "catch_up"`, `catch_up_max = N`, `no_overlap = bool`,
/// `schedule_args = "[JSON array]"` (the arguments each tick is sent with).
/// `inventory = false` keeps the task out of [`Registry::from_inventory`] (a library's or a
/// test kit's task that must not join every worker of the binary): add it with
/// `Registry::from_registrations([my_task::registration()])`.
///
/// Parameters of type [`TaskContext`] and [`State<T>`] are injected; every other parameter is
/// an argument bound from the message's `args`/`kwargs`. The function stays callable directly,
/// and a type of the same name (it implements [`Task`]) holds `NAME`, `OPTIONS`, `call(…)`
/// and `kiq(&client, …)`.
pub use ferriq_macros::task;

/// `#[async_trait]`, for implementing ferriq's traits ([`middleware::Middleware`], brokers, stores).
pub use async_trait::async_trait;
#[doc(hidden)]
pub use inventory;

/// The README's Rust examples not marked `ignore`, compiled and run as doc tests so they stay
/// true.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeExamples;

#[doc(hidden)]
pub mod __private {
    pub use crate::task::__private::*;
    pub use crate::task::{
        Invocation, RunFuture, StateRequirement, StaticSchedule, TaskRegistration,
    };
    pub use serde_json::Value;
}
