//! `ferriq limits [list] | set TASK [--key K] [--rate R] [--concurrency N] | reset TASK [--key K]`.

use ferriq::store::{LimitOverride, LimiterKind};
use ferriq::task::Rate;
use ferriq::Client;
use serde_json::json;

use crate::args::LimitsCommand;
use crate::output::{outln, Output};
use crate::Failure;

/// The override a `set` line describes, checked before connecting.
fn wanted(rate: Option<&str>, concurrency: Option<u32>) -> Result<LimitOverride, Failure> {
    let mut limits = LimitOverride::default();
    if let Some(rate) = rate {
        limits = limits.rate(Rate::parse(rate).map_err(Failure::Usage)?);
    }
    match concurrency {
        Some(0) => {
            return Err(Failure::Usage(
                "--concurrency must be at least 1 (stop a task's workers to stop it)".into(),
            ))
        }
        Some(n) => limits = limits.concurrency(n),
        None => {}
    }
    if limits == LimitOverride::default() {
        return Err(Failure::Usage(
            "give --rate (as 50/s, 300/m, 1000/h) or --concurrency N, or both".into(),
        ));
    }
    Ok(limits)
}

/// The command line's own mistakes, found before connecting.
pub(crate) fn check_usage(command: &Option<LimitsCommand>) -> Result<(), Failure> {
    match command {
        Some(LimitsCommand::Set {
            rate, concurrency, ..
        }) => wanted(rate.as_deref(), *concurrency).map(drop),
        _ => Ok(()),
    }
}

pub(crate) async fn run(
    client: &Client,
    out: &Output,
    command: &Option<LimitsCommand>,
) -> Result<(), Failure> {
    let limits = client.limits();
    match command {
        None | Some(LimitsCommand::List) => list(client, out).await,
        Some(LimitsCommand::Set {
            task,
            key,
            rate,
            concurrency,
        }) => {
            let set = wanted(rate.as_deref(), *concurrency)?;
            limits.set(task, key.as_deref(), set).await?;
            let target = match key {
                Some(key) => format!("{task} (key {key})"),
                None => task.clone(),
            };
            outln!(
                "set {set} for {target}: every worker applies it within {} s",
                ferriq::store::OVERRIDES_REFRESH.as_secs()
            );
            Ok(())
        }
        Some(LimitsCommand::Reset { task, key }) => {
            if limits.reset(task, key.as_deref()).await? {
                let target = match key {
                    Some(key) => format!("{task} (key {key})"),
                    None => task.clone(),
                };
                outln!(
                    "{target}: back to its declared limits within {} s",
                    ferriq::store::OVERRIDES_REFRESH.as_secs()
                );
                Ok(())
            } else {
                Err(Failure::NotFound(format!(
                    "no limit was set at run time for {task}{} (`ferriq limits` lists them)",
                    key.as_ref()
                        .map(|k| format!(" key {k}"))
                        .unwrap_or_default()
                )))
            }
        }
    }
}

async fn list(client: &Client, out: &Output) -> Result<(), Failure> {
    let limits = client.limits();
    let used = limits.list().await?;
    let set = limits.overrides().await?;
    if out.json {
        let limiters: Vec<_> = used
            .iter()
            .map(|l| {
                json!({
                    "task": l.task, "key": l.key, "kind": l.kind.as_str(), "limit": l.limit,
                    "overridden": l.overridden, "used": l.used, "waiting": l.waiting,
                    "idle_s": (l.idle_s * 10.0).round() / 10.0,
                })
            })
            .collect();
        let overrides: Vec<_> = set
            .iter()
            .map(|o| {
                json!({
                    "task": o.task, "key": o.key,
                    "rate": o.limits.rate.map(|r| r.to_string()),
                    "concurrency": o.limits.concurrency,
                })
            })
            .collect();
        out.json(&json!({ "limiters": limiters, "overrides": overrides }));
        return Ok(());
    }
    if used.is_empty() {
        outln!("no limiter used in the last day");
    } else {
        let rows: Vec<Vec<String>> = used
            .iter()
            .map(|l| {
                let used = match l.kind {
                    LimiterKind::Rate => format!("{} started", l.used),
                    _ => format!("{} running", l.used),
                };
                vec![
                    l.task.clone(),
                    l.key.clone().unwrap_or_else(|| "-".into()),
                    l.kind.as_str().to_owned(),
                    if l.overridden {
                        format!("{} (set)", l.limit)
                    } else {
                        l.limit.clone()
                    },
                    used,
                    l.waiting.to_string(),
                    format!("{:.0}s ago", l.idle_s),
                ]
            })
            .collect();
        out.table(
            &[
                "TASK",
                "KEY",
                "KIND",
                "LIMIT",
                "IN USE",
                "WAITING",
                "LAST USED",
            ],
            &rows,
        );
    }
    if !set.is_empty() {
        outln!();
        let rows: Vec<Vec<String>> = set
            .iter()
            .map(|o| {
                vec![
                    o.task.clone(),
                    o.key.clone().unwrap_or_else(|| "(every key)".into()),
                    o.limits.to_string(),
                ]
            })
            .collect();
        out.table(&["SET AT RUN TIME FOR", "KEY", "LIMITS"], &rows);
    }
    Ok(())
}
