//! The Redis server's own count of what a run asked of it (`INFO commandstats`, read-only):
//! calls and server time per task, by command, between two readings. It tells a run's server
//! cost from what else the machine did meanwhile, which the process CPU meter cannot (a busy
//! machine stretches a script's wall time; this counts the calls and the time inside them).

use std::collections::BTreeMap;

use fred::prelude::{ClientLike, Pool};

/// Calls and server µs per task, by command.
pub(super) type PerTask = BTreeMap<String, (f64, f64)>;

/// One reading: calls and µs by command name.
#[derive(Clone, Default)]
pub(super) struct CommandStats(BTreeMap<String, (u64, u64)>);

impl CommandStats {
    /// Reads the server's counters (an empty reading when it cannot).
    pub(super) async fn read(pool: &Pool) -> Self {
        let text: String = match pool
            .next()
            .info(Some(fred::types::InfoKind::CommandStats))
            .await
        {
            Ok(text) => text,
            Err(_) => return Self::default(),
        };
        let mut by_name = BTreeMap::new();
        for line in text.lines() {
            let Some((name, fields)) = line
                .strip_prefix("cmdstat_")
                .and_then(|l| l.split_once(':'))
            else {
                continue;
            };
            let field = |key: &str| {
                fields
                    .split(',')
                    .find_map(|f| f.strip_prefix(key))
                    .and_then(|v| v.parse::<u64>().ok())
                    .unwrap_or(0)
            };
            by_name.insert(name.to_owned(), (field("calls="), field("usec=")));
        }
        Self(by_name)
    }

    /// Calls and µs per task since `before`, by command (those called at all).
    pub(super) fn per_task_since(&self, before: &Self, tasks: u64) -> PerTask {
        let tasks = tasks.max(1) as f64;
        self.0
            .iter()
            .filter_map(|(name, (calls, us))| {
                let (c0, u0) = before.0.get(name).copied().unwrap_or((0, 0));
                let calls = calls.saturating_sub(c0);
                (calls > 0).then(|| {
                    let us = us.saturating_sub(u0);
                    (name.clone(), (calls as f64 / tasks, us as f64 / tasks))
                })
            })
            .collect()
    }
}

/// Prints, per kind of run, the median calls and server µs per task of each command a run
/// called at least once in 100 tasks (`info` itself left out). A script's time includes the
/// commands it called, which are also counted in their own columns.
pub(super) fn print_table(runs: &[(&str, Vec<PerTask>)]) {
    let median = |mut v: Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v.get(v.len() / 2).copied().unwrap_or(f64::NAN)
    };
    let get = |rows: &[PerTask], name: &str, pick: fn(&(f64, f64)) -> f64| {
        median(
            rows.iter()
                .map(|r| r.get(name).map(pick).unwrap_or(0.0))
                .collect(),
        )
    };
    let mut names: Vec<&str> = runs
        .iter()
        .flat_map(|(_, rows)| rows.iter().flat_map(|r| r.keys().map(String::as_str)))
        .filter(|n| *n != "info")
        .collect();
    names.sort_unstable();
    names.dedup();
    names.retain(|n| runs.iter().any(|(_, rows)| get(rows, n, |c| c.0) >= 0.01));
    if names.is_empty() {
        return;
    }
    println!(
        "| Redis per task (INFO commandstats): calls / server µs, medians | {} |",
        names.join(" | ")
    );
    println!("|---|{}", "---|".repeat(names.len()));
    for (what, rows) in runs {
        let cells: Vec<String> = names
            .iter()
            .map(|n| {
                format!(
                    "{:.2} / {:.1}",
                    get(rows, n, |c| c.0),
                    get(rows, n, |c| c.1)
                )
            })
            .collect();
        println!("| {what} | {} |", cells.join(" | "));
    }
}
