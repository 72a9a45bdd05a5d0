//! `ferriq dlq list|show|redrive|purge`.

use crate::output::{errln, outln};
use ferriq::dead_letters::{DeadFilter, DeadMessage};
use ferriq::wire::TaskMessage;
use ferriq::Client;
use serde_json::{json, Value};

use crate::args::{Cli, DlqCommand, Filter, Selection};
use crate::output::{age, confirm, now_ms, short, timestamp, Output, Progress};
use crate::Failure;

/// The lane asked for, else the broker's first.
fn lane(client: &Client, queue: Option<&String>) -> Result<String, Failure> {
    if let Some(q) = queue {
        return Ok(q.clone());
    }
    client
        .broker()
        .lanes()
        .into_iter()
        .next()
        .ok_or_else(|| Failure::Usage("this broker names no queue: pass --queue NAME".to_owned()))
}

fn dead_filter(filter: &Filter) -> DeadFilter {
    let mut f = DeadFilter::all();
    if let Some(r) = &filter.reason {
        f = f.reason(r.clone());
    }
    if let Some(t) = &filter.task {
        f = f.task_name(t.clone());
    }
    if let Some(age) = filter.older_than {
        f = f.older_than(age);
    }
    f
}

/// What a filter says, for the prompt.
fn describe(selection: &Selection) -> String {
    let f = &selection.filter;
    let mut parts = Vec::new();
    if let Some(id) = &selection.id {
        parts.push(format!("id={id}"));
    }
    if let Some(r) = &f.reason {
        parts.push(format!("reason={r}"));
    }
    if let Some(t) = &f.task {
        parts.push(format!("task={t}"));
    }
    if let Some(a) = f.older_than {
        parts.push(format!("older than {}", age(a)));
    }
    if parts.is_empty() {
        "all".to_owned()
    } else {
        parts.join(", ")
    }
}

fn summary(m: &DeadMessage, now: u64) -> Value {
    json!({
        "id": m.id,
        "queue": m.lane,
        "task_id": m.task_id.as_ref().map(|id| id.to_string()),
        "task_name": m.task_name,
        "reason": m.reason,
        "attempts": m.attempts,
        "detail": m.detail,
        "dead_at_ms": m.dead_at_ms,
        "age_secs": m.age(now).map(|a| a.as_secs()),
    })
}

/// The selection of a redrive or purge, checked before connecting.
pub(crate) fn check_usage(command: &DlqCommand) -> Result<(), Failure> {
    match command {
        DlqCommand::Redrive(selection) => selection_filter("redrive", selection).map(drop),
        DlqCommand::Purge(selection) => selection_filter("purge", selection).map(drop),
        DlqCommand::List { .. } | DlqCommand::Show { .. } | DlqCommand::Reindex { .. } => Ok(()),
    }
}

pub(crate) async fn run(
    client: &Client,
    out: &Output,
    cli: &Cli,
    command: &DlqCommand,
) -> Result<(), Failure> {
    match command {
        DlqCommand::List {
            filter,
            offset,
            limit,
        } => list(client, out, filter, *offset, *limit).await,
        DlqCommand::Show { id, queue } => show(client, out, queue.as_ref(), id).await,
        DlqCommand::Redrive(selection) => redrive(client, out, cli, selection).await,
        DlqCommand::Purge(selection) => purge(client, out, cli, selection).await,
        DlqCommand::Reindex { queue } => reindex(client, out, queue.as_ref()).await,
    }
}

async fn reindex(client: &Client, out: &Output, queue: Option<&String>) -> Result<(), Failure> {
    let lane = lane(client, queue)?;
    let mut progress = Progress::new("indexed", None);
    let indexed = client
        .ops()
        .reindex_dead(&lane, |p| progress.update(p.done))
        .await;
    progress.finish();
    let indexed = indexed?;
    if out.json {
        out.json(&json!({"queue": lane, "indexed": indexed}));
    } else {
        outln!("{indexed} dead letters of {lane} indexed");
    }
    Ok(())
}

async fn list(
    client: &Client,
    out: &Output,
    filter: &Filter,
    offset: usize,
    limit: usize,
) -> Result<(), Failure> {
    let lane = lane(client, filter.queue.as_ref())?;
    let page = client
        .ops()
        .dead_letters_matching(&lane, &dead_filter(filter), offset, limit)
        .await?;
    let now = now_ms();
    if out.json {
        out.json(&Value::Array(
            page.iter().map(|m| summary(m, now)).collect(),
        ));
        return Ok(());
    }
    if page.is_empty() {
        outln!("no dead letters in {lane} match");
        return Ok(());
    }
    let rows: Vec<Vec<String>> = page
        .iter()
        .map(|m| {
            vec![
                m.id.clone(),
                m.task_id.as_ref().map_or("-".into(), |id| id.to_string()),
                short(m.task_name.as_deref().unwrap_or("-"), 32),
                m.reason.clone().unwrap_or_else(|| "-".into()),
                m.attempts.to_string(),
                m.age(now).map_or("-".into(), age),
                short(&m.detail, 60),
            ]
        })
        .collect();
    out.table(
        &[
            "ID", "TASK ID", "TASK", "REASON", "ATTEMPTS", "AGE", "DETAIL",
        ],
        &rows,
    );
    Ok(())
}

async fn show(
    client: &Client,
    out: &Output,
    queue: Option<&String>,
    id: &str,
) -> Result<(), Failure> {
    let lane = lane(client, queue)?;
    let first = |filter: DeadFilter| {
        let lane = lane.clone();
        async move {
            let found = client
                .ops()
                .dead_letters_matching(&lane, &filter, 0, 1)
                .await?;
            Ok::<_, Failure>(found.into_iter().next())
        }
    };
    // The dead letter's own id, or else the id of the task it carries (the two look alike).
    let mut found = first(DeadFilter::all().id(id)).await?;
    if found.is_none() {
        if let Ok(task_id) = ferriq::wire::TaskId::parse(id) {
            found = first(DeadFilter::all().task_id(task_id)).await?;
        }
    }
    let Some(m) = found else {
        return Err(Failure::NotFound(format!(
            "no dead letter and no dead-lettered task {id} in {lane} (see `ferriq dlq list`)"
        )));
    };
    let now = now_ms();
    // The body as JSON, when it is a task message.
    let message = TaskMessage::from_json(&m.body)
        .ok()
        .and_then(|_| serde_json::from_slice::<Value>(&m.body).ok());
    if out.json {
        let mut v = summary(&m, now);
        v["message"] = match &message {
            Some(msg) => msg.clone(),
            None => Value::Null,
        };
        v["body"] = Value::String(String::from_utf8_lossy(&m.body).into_owned());
        out.json(&v);
        return Ok(());
    }
    let field = |k: &str, v: String| outln!("{k:<10} {v}");
    field("id", m.id.clone());
    field("queue", m.lane.clone());
    field(
        "task id",
        m.task_id.as_ref().map_or("-".into(), |id| id.to_string()),
    );
    field("task", m.task_name.clone().unwrap_or_else(|| "-".into()));
    field("reason", m.reason.clone().unwrap_or_else(|| "-".into()));
    field("attempts", m.attempts.to_string());
    field(
        "parked",
        m.dead_at_ms.map_or("-".into(), |ms| {
            format!(
                "{} ({} ago)",
                timestamp(ms),
                age(m.age(now).unwrap_or_default())
            )
        }),
    );
    field("detail", m.detail.clone());
    match message {
        Some(msg) => {
            let pretty = |v: &Value| serde_json::to_string(v).unwrap_or_default();
            field("args", pretty(&msg["args"]));
            field("kwargs", pretty(&msg["kwargs"]));
            field("labels", pretty(&msg["labels"]));
        }
        None => field("body", String::from_utf8_lossy(&m.body).into_owned()),
    }
    Ok(())
}

/// The filter of a redrive or purge; one must be given (or `--all`).
fn selection_filter(verb: &str, selection: &Selection) -> Result<DeadFilter, Failure> {
    let f = &selection.filter;
    let narrowed =
        selection.id.is_some() || f.reason.is_some() || f.task.is_some() || f.older_than.is_some();
    if !narrowed && !selection.all {
        return Err(Failure::Usage(format!(
            "say which dead letters to {verb}: an ID, --reason, --task, --older-than, or --all"
        )));
    }
    let mut filter = dead_filter(f);
    if let Some(id) = &selection.id {
        filter = filter.id(id.clone());
    }
    Ok(filter)
}

/// A selection by ID names the dead letter, or else the task it carries (as `dlq show`): the
/// filter by task id when no dead letter has that id and the ID is a task id.
async fn by_letter_or_task_id(
    client: &Client,
    lane: &str,
    filter: DeadFilter,
) -> Result<DeadFilter, Failure> {
    let Some(id) = filter.id.clone() else {
        return Ok(filter);
    };
    let Ok(task_id) = ferriq::wire::TaskId::parse(&id) else {
        return Ok(filter);
    };
    if client.ops().count_dead_letters(lane, &filter).await? > 0 {
        return Ok(filter);
    }
    let mut by_task = filter;
    by_task.id = None;
    Ok(by_task.task_id(task_id))
}

/// How many match, asked unless `--yes`; `None` when nothing matches.
async fn count_and_confirm(
    client: &Client,
    cli: &Cli,
    verb: &str,
    lane: &str,
    filter: &DeadFilter,
    selection: &Selection,
) -> Result<Option<u64>, Failure> {
    if cli.yes {
        return Ok(Some(0));
    }
    let n = client.ops().count_dead_letters(lane, filter).await?;
    if n == 0 {
        return Ok(None);
    }
    confirm(
        &format!(
            "{verb} {n} dead letter(s) of queue {lane} ({})?",
            describe(selection)
        ),
        false,
    )?;
    Ok(Some(n))
}

async fn redrive(
    client: &Client,
    out: &Output,
    cli: &Cli,
    selection: &Selection,
) -> Result<(), Failure> {
    let filter = selection_filter("redrive", selection)?;
    let lane = lane(client, selection.filter.queue.as_ref())?;
    let filter = by_letter_or_task_id(client, &lane, filter).await?;
    let Some(total) = count_and_confirm(client, cli, "Redrive", &lane, &filter, selection).await?
    else {
        return nothing(
            out,
            &lane,
            selection,
            json!({"redriven": 0, "kept": 0, "running": 0, "parked_again": 0}),
        );
    };
    let mut progress = Progress::new("redriven", (total > 0).then_some(total));
    let report = client
        .ops()
        .redrive(&lane, &filter, |p| progress.update(p.done))
        .await;
    progress.finish();
    let report = report?;
    if out.json {
        out.json(&json!({
            "redriven": report.redriven,
            "kept": report.kept,
            "running": report.running,
            "parked_again": report.parked_again,
        }));
    } else {
        outln!("redriven {} dead letter(s) to {lane}", report.redriven);
        if report.running > 0 {
            outln!(
                "left {} parked: a run holds the task now (try again once it ends)",
                report.running
            );
        }
        if report.parked_again > 0 {
            outln!(
                "left {} parked: their tasks were already redriven by this command (a second \
                 dead letter of a task, or one that failed again meanwhile)",
                report.parked_again
            );
        }
    }
    unseen_note(
        client,
        &lane,
        report.kept + report.running + report.parked_again,
    )
    .await;
    if selection.id.is_some() && report.redriven == 0 && report.running == 0 {
        return Err(Failure::NotFound(format!(
            "no dead letter {} in {lane}",
            selection.id.as_deref().unwrap_or_default()
        )));
    }
    Ok(())
}

async fn purge(
    client: &Client,
    out: &Output,
    cli: &Cli,
    selection: &Selection,
) -> Result<(), Failure> {
    let filter = selection_filter("purge", selection)?;
    let lane = lane(client, selection.filter.queue.as_ref())?;
    let filter = by_letter_or_task_id(client, &lane, filter).await?;
    let Some(total) = count_and_confirm(client, cli, "Purge", &lane, &filter, selection).await?
    else {
        return nothing(
            out,
            &lane,
            selection,
            json!({"purged": 0, "kept": 0, "answered": 0}),
        );
    };
    let mut progress = Progress::new("purged", (total > 0).then_some(total));
    let report = client
        .ops()
        .purge(&lane, &filter, |p| progress.update(p.done))
        .await;
    progress.finish();
    let report = report?;
    if out.json {
        out.json(
            &json!({"purged": report.purged, "kept": report.kept, "answered": report.answered}),
        );
    } else {
        outln!("purged {} dead letter(s) from {lane}", report.purged);
        if report.answered > 0 {
            outln!(
                "{} of them had no result yet: their callers got a Cancelled one",
                report.answered
            );
        }
    }
    unseen_note(client, &lane, report.kept).await;
    if selection.id.is_some() && report.purged == 0 {
        return Err(Failure::NotFound(format!(
            "no dead letter {} in {lane}",
            selection.id.as_deref().unwrap_or_default()
        )));
    }
    Ok(())
}

fn nothing(out: &Output, lane: &str, selection: &Selection, empty: Value) -> Result<(), Failure> {
    if let Some(id) = &selection.id {
        return Err(Failure::NotFound(format!("no dead letter {id} in {lane}")));
    }
    if out.json {
        out.json(&empty);
    } else {
        outln!("no dead letters in {lane} match");
    }
    Ok(())
}

/// Says so when the dead-letter queue holds more than the operation looked at: messages held
/// by another session (an interrupted listing or redrive: SQS hides them for 30 s), or
/// another lane's in a shared dead-letter queue.
async fn unseen_note(client: &Client, lane: &str, left_seen: u64) {
    let Some(dlq) = client.broker().dead_letters() else {
        return;
    };
    let Ok(count) = dlq.dead_count(lane).await else {
        return;
    };
    if count > left_seen {
        errln!(
            "note: {} more message(s) in the dead-letter queue were not looked at: held by \
             another session (an interrupted listing or redrive; on SQS they are visible again \
             within {} s), or another queue's; run this again to reach them",
            count - left_seen,
            30
        );
    }
}
