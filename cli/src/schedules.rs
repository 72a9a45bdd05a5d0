//! `ferriq schedules list|add|remove|pause|resume`.

use ferriq::schedule::{MissedTicks, ScheduleSpec, Timing};
use ferriq::{Client, TaskStatus};
use serde_json::{json, Map, Value};

use crate::args::{ScheduleArgs, ScheduleCommand};
use crate::output::{outln, timestamp, Output};
use crate::Failure;

/// The schedule a command line describes, checked before connecting.
pub(crate) fn spec(args: &ScheduleArgs) -> Result<ScheduleSpec, Failure> {
    let usage =
        |what: &str, e: serde_json::Error| Failure::Usage(format!("--{what} must be JSON ({e})"));
    let positional: Vec<Value> = serde_json::from_str(&args.args).map_err(|e| usage("args", e))?;
    let keywords: Map<String, Value> =
        serde_json::from_str(&args.kwargs).map_err(|e| usage("kwargs", e))?;
    let mut spec = match (&args.cron, args.every) {
        (Some(expr), _) => {
            let spec = ScheduleSpec::cron(&args.id, &args.task, expr);
            match &args.timezone {
                Some(tz) => spec.in_timezone(tz),
                None => spec,
            }
        }
        (None, Some(seconds)) => ScheduleSpec::every(&args.id, &args.task, seconds),
        (None, None) => return Err(Failure::Usage("give --cron EXPR or --every SECONDS".into())),
    }
    .with_args(positional)
    .with_kwargs(keywords)
    .with_missed(match args.missed.as_str() {
        "skip" => MissedTicks::Skip,
        "catch_up" => MissedTicks::CatchUp { max: 100 },
        _ => MissedTicks::Latest,
    });
    if let Some(queue) = &args.queue {
        spec = spec.with_queue(queue);
    }
    if args.no_overlap {
        spec = spec.without_overlap();
    }
    spec.compile().map_err(|e| Failure::Usage(e.to_string()))?;
    Ok(spec)
}

/// The command line's own mistakes, found before connecting.
pub(crate) fn check_usage(command: &ScheduleCommand) -> Result<(), Failure> {
    match command {
        ScheduleCommand::Add(args) => spec(args).map(drop),
        _ => Ok(()),
    }
}

pub(crate) async fn run(
    client: &Client,
    out: &Output,
    command: &ScheduleCommand,
) -> Result<(), Failure> {
    let schedules = client.schedules();
    let store = |e: ferriq::store::StoreError| Failure::from(e);
    match command {
        ScheduleCommand::List => list(client, out).await,
        ScheduleCommand::Add(args) => {
            let spec = spec(args)?;
            schedules
                .add(spec)
                .await
                .map_err(|e| Failure::Failed(e.to_string()))?;
            outln!(
                "added schedule {}: every scheduler sends it from its next round",
                args.id
            );
            Ok(())
        }
        ScheduleCommand::Remove { id } => {
            if schedules.remove(id).await.map_err(store)? {
                outln!("removed schedule {id}");
                Ok(())
            } else {
                Err(Failure::NotFound(format!(
                    "no run-time schedule {id:?} (a schedule declared on a task goes with its \
                     task's code; pause it instead)"
                )))
            }
        }
        ScheduleCommand::Pause { id } | ScheduleCommand::Resume { id } => {
            let pause = matches!(command, ScheduleCommand::Pause { .. });
            let known = schedules
                .list()
                .await
                .map_err(|e| Failure::Failed(e.to_string()))?
                .iter()
                .any(|s| s.spec.id == *id);
            if !known {
                return Err(Failure::NotFound(format!(
                    "no schedule {id:?} (`ferriq schedules list` shows them; a declared one \
                     shows once a scheduler has run)"
                )));
            }
            if pause {
                schedules.pause(id).await.map_err(store)?;
                outln!("paused schedule {id}: its ticks pass unsent until it is resumed");
            } else {
                schedules.resume(id).await.map_err(store)?;
                outln!("resumed schedule {id}: its next tick is sent");
            }
            Ok(())
        }
    }
}

fn timing(spec: &ScheduleSpec) -> String {
    match &spec.timing {
        Timing::Cron { expr, timezone } => match timezone {
            Some(tz) => format!("cron {expr} ({tz})"),
            None => format!("cron {expr}"),
        },
        Timing::Every { seconds } => format!("every {seconds}s"),
        _ => "-".to_owned(),
    }
}

fn status(status: Option<&TaskStatus>) -> &'static str {
    match status {
        None => "-",
        Some(TaskStatus::Pending) => "pending",
        Some(TaskStatus::Started { .. }) => "running",
        Some(TaskStatus::Succeeded) => "succeeded",
        Some(TaskStatus::Failed(_)) => "failed",
        Some(TaskStatus::Expired(_)) => "expired",
        Some(TaskStatus::FinishedWithoutResult) => "finished",
        Some(_) => "unknown",
    }
}

async fn list(client: &Client, out: &Output) -> Result<(), Failure> {
    let all = client
        .schedules()
        .list()
        .await
        .map_err(|e| Failure::Failed(e.to_string()))?;
    let at = |unix: Option<i64>| unix.map(|t| t.max(0) as u64 * 1000);
    if out.json {
        let rows: Vec<Value> = all
            .iter()
            .map(|s| {
                json!({
                    "id": s.spec.id,
                    "task": s.spec.task,
                    "timing": timing(&s.spec),
                    "declared": s.declared,
                    "paused": s.paused,
                    "next_run": s.next_run,
                    "last_tick": s.last_tick,
                    "last_status": status(s.last_status.as_ref()),
                })
            })
            .collect();
        out.json(&Value::Array(rows));
        return Ok(());
    }
    if all.is_empty() {
        outln!("no schedules");
        return Ok(());
    }
    let rows: Vec<Vec<String>> = all
        .iter()
        .map(|s| {
            vec![
                s.spec.id.clone(),
                s.spec.task.clone(),
                timing(&s.spec),
                if s.declared { "declared" } else { "run-time" }.to_owned(),
                if s.paused { "paused" } else { "active" }.to_owned(),
                at(s.next_run).map_or_else(|| "-".into(), timestamp),
                at(s.last_tick).map_or_else(|| "-".into(), timestamp),
                status(s.last_status.as_ref()).to_owned(),
            ]
        })
        .collect();
    out.table(
        &[
            "ID", "TASK", "TIMING", "KIND", "STATE", "NEXT", "LAST", "LAST RUN",
        ],
        &rows,
    );
    Ok(())
}
