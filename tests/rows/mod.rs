//! Tasks and helpers both halves of the design §6 rows use (`worker_rows`,
//! `worker_rows_runs`).

#![allow(dead_code)]

use std::sync::{Arc, Mutex};

use ferriq::testing::Oracle;
use ferriq::{State, TaskContext, WaitError};
use tokio::time::Instant;

use crate::common::Gate;

#[ferriq::task(name = "rows.echo")]
pub async fn echo(oracle: State<Oracle>, ctx: TaskContext, value: String) -> String {
    oracle.started(ctx.task_id());
    value
}

/// Start instants of a task's attempts, to assert its backoff.
#[derive(Default)]
pub struct Starts(pub Mutex<Vec<Instant>>);

#[ferriq::task(name = "rows.held")]
pub async fn held(oracle: State<Oracle>, gate: State<Arc<Gate>>, ctx: TaskContext) -> String {
    oracle.started(ctx.task_id());
    gate.pass().await;
    oracle.finished(ctx.task_id());
    format!("done on attempt {}", ctx.attempt())
}

#[ferriq::task(name = "rows.args")]
pub async fn args(a: i64, b: Option<String>) -> String {
    format!("{a}:{b:?}")
}

pub fn failure(err: WaitError) -> ferriq::wire::TaskFailure {
    match err {
        WaitError::Failed(f) => f,
        other => panic!("expected a task failure, got {other:?}"),
    }
}

/// Hears the dead letters the worker parks.
#[derive(Default, Clone)]
pub struct DeadLetterLog(pub Arc<Mutex<Vec<String>>>);

#[ferriq::async_trait]
impl ferriq::middleware::Middleware for DeadLetterLog {
    async fn on_dead_letter(&self, dead: &ferriq::middleware::DeadLettered<'_>) {
        self.0.lock().unwrap().push(format!(
            "{} {}",
            dead.reason.as_str(),
            dead.task_id.map(|id| id.to_string()).unwrap_or_default()
        ));
    }
}
