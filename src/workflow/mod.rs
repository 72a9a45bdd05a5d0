//! Workflows: groups of tasks awaited together, chords that run a callback exactly once when
//! every member is done, and chains that feed each step's result to the next.
//!
//! Nothing here is a separate scheduler: a workflow's record is written once to the store when
//! it is enqueued, and the worker that stores a member's (or step's) outcome takes the next
//! step. Every decision is made once: a member is counted by a bit of its own (so a redelivered
//! copy counts nothing), the callback and the next steps have ids derived from the workflow's,
//! so a step sent twice after a crash is one task, and a worker that dies between storing an
//! outcome and acting on it leaves the message unacked: its redelivery finds the outcome stored
//! and acts again.
//!
//! ```
//! use std::time::Duration;
//! use ferriq::testing::TestEnv;
//! use ferriq::workflow::{chord, Group};
//! use ferriq::{TaskContext, TaskError};
//!
//! #[ferriq::task(name = "docs.wf.square")]
//! async fn square(x: i64) -> i64 { x * x }
//!
//! #[ferriq::task(name = "docs.wf.total")]
//! async fn total(ctx: TaskContext) -> Result<i64, TaskError> {
//!     let squares: Vec<i64> = ctx.group_values().await?; // the members' results, in order
//!     Ok(squares.iter().sum())
//! }
//!
//! # #[tokio::main(flavor = "current_thread")] async fn main() {
//! let env = TestEnv::new();
//! let worker = env.spawn_worker(env.worker().registry(
//!     ferriq::Registry::from_inventory().unwrap().only(&[square::NAME, total::NAME]).unwrap()));
//! let sums = env.client.enqueue_chord(chord(Group::new((1..=4).map(square::call)), total::call()))
//!     .await.unwrap();
//! assert_eq!(sums.wait(Duration::from_secs(5)).await.unwrap(), 30);
//! worker.stop().await;
//! # }
//! ```

pub(crate) mod advance;
mod chain;
mod group;

pub use chain::{Chain, ChainHandle, Step};
pub use group::{chord, Chord, ChordHandle, Group, GroupHandle, GroupSummary};

pub use crate::store::ChordPolicy;

use crate::wire::TaskId;

/// The id of member `index` of group `group`.
pub fn member_id(group: &TaskId, index: u32) -> TaskId {
    group.group_member(index)
}

/// The id of the chord callback of group `group`.
pub fn callback_id(group: &TaskId) -> TaskId {
    group.chord_callback()
}

/// The id of step `index` of chain `chain`.
pub fn step_id(chain: &TaskId, index: u32) -> TaskId {
    chain.chain_step(index)
}
