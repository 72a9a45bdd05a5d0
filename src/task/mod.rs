//! Tasks: the [`Task`] trait `#[task]` implements, its [`TaskOptions`], the [`TaskContext`] a run
//! sees, shared app [`State`], and the [`TaskError`] a task returns.

mod context;
mod error;
mod limits;
mod options;
mod registration;

pub(crate) use context::RunCancel;
pub use context::{AppState, State, TaskContext, TaskContextBuilder};
pub use error::TaskError;
pub(crate) use limits::{concurrency_limiter, rate_limiter, Limiter};
pub use limits::{Dedup, KeySource, Rate};
pub use options::TaskOptions;
pub use registration::TaskRegistration;
// What `#[task]` expands to, not for hand-written code (reached through `ferriq::__private`).
#[doc(hidden)]
pub use registration::{Invocation, RunFuture, StateRequirement, StaticSchedule};

#[doc(hidden)]
pub mod __private {
    pub use super::registration::{ok_output, result_output, to_arg};
}

use serde::de::DeserializeOwned;

/// A task known by its name. `#[ferriq::task]` on `async fn add` generates a type `add` (beside
/// the function, which stays callable) implementing this trait, with `add::NAME`,
/// `add::call(…)` and `add::kiq(&client, …)` for enqueueing with typed arguments.
///
/// ```
/// #[ferriq::task(name = "math.add")]
/// async fn add(a: i64, b: i64) -> i64 {
///     a + b
/// }
///
/// use ferriq::Task;
/// assert_eq!(<add as Task>::NAME, "math.add");
/// assert_eq!(add::NAME, "math.add");
/// ```
pub trait Task: Send + Sync + 'static {
    /// The task's name: its stable wire identity.
    const NAME: &'static str;
    /// The task's options (attempts, timeout, queue, backoff).
    const OPTIONS: TaskOptions;
    /// What a successful run returns.
    type Output: DeserializeOwned + Send + 'static;
}
