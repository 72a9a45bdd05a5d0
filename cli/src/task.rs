//! `ferriq task status|result|revoke ID`.

use crate::output::outln;
use ferriq::store::ClaimState;
use ferriq::wire::{TaskId, TaskResult};
use ferriq::{Client, TaskStatus};
use serde_json::{json, Value};

use crate::args::{Cli, TaskCommand};
use crate::output::{confirm, timestamp, Output};
use crate::Failure;

fn task_id(text: &str) -> Result<TaskId, Failure> {
    TaskId::parse(text).map_err(|e| Failure::Usage(format!("{text:?} is not a task id: {e}")))
}

fn status_name(status: &TaskStatus) -> &'static str {
    match status {
        TaskStatus::Pending => "pending",
        TaskStatus::Started { .. } => "started",
        TaskStatus::Succeeded => "succeeded",
        TaskStatus::Failed(_) => "failed",
        TaskStatus::Expired(_) => "expired",
        TaskStatus::FinishedWithoutResult => "finished_without_result",
        _ => "unknown",
    }
}

fn claim_state(state: ClaimState) -> &'static str {
    match state {
        ClaimState::Running => "running",
        ClaimState::Released => "released",
        ClaimState::Done => "done",
        ClaimState::Revoked => "revoked",
        _ => "unknown",
    }
}

fn result_json(r: &TaskResult) -> Value {
    serde_json::to_value(r).unwrap_or(Value::Null)
}

/// The task id, checked before connecting.
pub(crate) fn check_usage(command: &TaskCommand) -> Result<(), Failure> {
    match command {
        TaskCommand::Status { id } | TaskCommand::Result { id } | TaskCommand::Revoke { id } => {
            task_id(id).map(drop)
        }
    }
}

pub(crate) async fn run(
    client: &Client,
    out: &Output,
    cli: &Cli,
    command: &TaskCommand,
) -> Result<(), Failure> {
    match command {
        TaskCommand::Status { id } => status(client, out, &task_id(id)?).await,
        TaskCommand::Result { id } => result(client, out, &task_id(id)?).await,
        TaskCommand::Revoke { id } => revoke(client, out, cli, &task_id(id)?).await,
    }
}

/// Whether `id` has the shape ferriq and taskiq give task ids: 32 lowercase hex characters.
fn generated_shape(id: &TaskId) -> bool {
    let id = id.as_str();
    id.len() == 32
        && id
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

async fn status(client: &Client, out: &Output, id: &TaskId) -> Result<(), Failure> {
    let info = client.ops().task(id).await?;
    // A custom id (chosen by its producer) may be anything printable, so only an id the store
    // knows nothing of and that is not of the generated shape is a mistake on the command line.
    let unknown = info.result.is_none() && info.claim.is_none() && info.progress.is_none();
    if unknown && !generated_shape(id) {
        return Err(Failure::Usage(format!(
            "{id:?} is not a task id: ferriq and taskiq make ids of 32 lowercase hex \
             characters, and the store knows no task by this one"
        )));
    }
    if out.json {
        out.json(&json!({
            "id": id.to_string(),
            "status": status_name(&info.status),
            "result": info.result.as_ref().map(result_json),
            "progress": info.progress,
            "claim": info.claim.as_ref().map(|c| json!({
                "state": claim_state(c.state),
                "token": c.token.to_string(),
                "holder": c.holder,
                "started_at_ms": c.started_at_ms,
                "lease_until_ms": c.lease_until_ms,
                "failures": c.failures,
                "starts": c.starts,
                "takeovers": c.takeovers,
            })),
        }));
        return Ok(());
    }
    let field = |k: &str, v: String| outln!("{k:<10} {v}");
    field("task", id.to_string());
    field(
        "status",
        match &info.status {
            TaskStatus::Started { worker, .. } => format!("started (on {worker})"),
            TaskStatus::Failed(f) => format!("failed: {} {}", f.exc_type, f.message),
            TaskStatus::Expired(f) => format!(
                "expired, not started by its deadline: {} (parked as `expired`; `ferriq dlq \
                 redrive --reason expired` runs it)",
                f.message
            ),
            TaskStatus::FinishedWithoutResult => {
                "finished without a stored result (store_result = false, or it expired)".to_owned()
            }
            other => status_name(other).to_owned(),
        },
    );
    if let Some(r) = &info.result {
        if !r.is_err {
            field("result", r.return_value.to_string());
        }
        field("took", format!("{:.3}s", r.execution_time));
    }
    if let Some(p) = &info.progress {
        field("progress", p.to_string());
    }
    match &info.claim {
        Some(c) => {
            field("claim", claim_state(c.state).to_owned());
            if !c.holder.is_empty() {
                field("holder", c.holder.clone());
            }
            if let Some(ms) = c.lease_until_ms {
                field("lease end", timestamp(ms));
            }
            field(
                "attempts",
                format!(
                    "{} started, {} failed and retried, {} taken over",
                    c.starts, c.failures, c.takeovers
                ),
            );
        }
        None => field("claim", "none (never received, or expired)".to_owned()),
    }
    Ok(())
}

async fn result(client: &Client, out: &Output, id: &TaskId) -> Result<(), Failure> {
    let info = client.ops().task(id).await?;
    let Some(r) = info.result else {
        return Err(Failure::NotFound(match info.status {
            TaskStatus::FinishedWithoutResult => format!(
                "task {id} finished without a stored result (store_result = false, or it expired)"
            ),
            other => format!("task {id} has no result yet ({})", status_name(&other)),
        }));
    };
    if out.json {
        out.json(&result_json(&r));
    } else if r.is_err {
        let e = r.error.as_ref();
        outln!(
            "error: {} {}",
            e.map_or("", |e| e.exc_type.as_str()),
            e.map_or(String::new(), |e| Value::Array(e.exc_message.clone())
                .to_string())
        );
    } else {
        outln!(
            "{}",
            serde_json::to_string_pretty(&r.return_value).unwrap_or_default()
        );
    }
    // A script must tell a failed task from a value by the exit code, not by parsing.
    if r.is_err {
        return Err(Failure::Failed(format!("task {id} failed")));
    }
    Ok(())
}

async fn revoke(client: &Client, out: &Output, cli: &Cli, id: &TaskId) -> Result<(), Failure> {
    confirm(&format!("Revoke task {id}?"), cli.yes)?;
    // Whether any worker has seen it: a task still queued has no claim either, so an unknown
    // id cannot be refused, but the operator is told (a mistyped id revokes nothing real).
    let seen = client.ops().task(id).await?.claim.is_some();
    let revoked = client.revoke(id).await?;
    if out.json {
        out.json(&json!({"id": id.to_string(), "revoked": revoked, "seen": seen}));
    } else if revoked && !seen {
        outln!(
            "revoked {id}: no worker has received it yet, so if the id is right it is \
             cancelled when one does (check the id: an unknown one is revoked all the same)"
        );
    } else if revoked {
        outln!("revoked {id}: it will not start, and a running one stops at its next heartbeat");
    } else {
        outln!("{id} had already finished: nothing to revoke");
    }
    Ok(())
}
