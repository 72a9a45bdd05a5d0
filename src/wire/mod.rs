//! The taskiq-compatible wire format: messages, labels, argument binding and results.
//!
//! A message body is a taskiq `TaskiqMessage` (JSON). ferriq reads any valid JSON form taskiq or
//! its middlewares produce and writes compact JSON the way taskiq writes it, so Python and Rust
//! services can share queues. See `docs/design.md` §3 and `STABILITY.md`.

mod args;
mod error;
mod float;
mod label_map;
mod label_value;
pub(crate) mod labels;
mod message;
mod parse;
mod result;
mod task_id;
mod task_name;
mod typed_labels;
mod words;
mod write;

pub use args::{ArgumentBinder, ArgumentError};
pub use error::WireError;
pub use label_value::LabelValue;
pub(crate) use labels::names;
pub use labels::{Labels, MAX_DELAY};
pub use message::{TaskMessage, WIRE_VERSION};
pub use result::{ErrorKind, ExceptionRepr, TaskFailure, TaskResult};
pub use task_id::TaskId;
pub use task_name::TaskName;
