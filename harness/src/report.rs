//! A scenario's row, judged from the oracle's writes and the collector's events, and the
//! table the harness prints and writes into RELIABILITY.md.

use std::collections::HashMap;

use crate::events::{self, Event};
use crate::world::World;

/// One scenario on one broker.
#[derive(Debug, Clone)]
pub struct Row {
    /// The scenario.
    pub scenario: String,
    /// The broker.
    pub backend: &'static str,
    /// Tasks sent.
    pub tasks: usize,
    /// The faults injected.
    pub faults: String,
    /// Tasks with no result ever written.
    pub lost: usize,
    /// Writes over an existing result.
    pub dup_writes: usize,
    /// Runs started beyond the first, per task (a run cut by a fault starts again).
    pub dup_starts: usize,
    /// From the end of the fault to the last result written, seconds.
    pub recovery_s: Option<f64>,
    /// What else was measured.
    pub notes: Vec<String>,
    /// Checks that failed (empty: the row passes).
    pub failures: Vec<String>,
}

impl Row {
    /// Adds a failure unless `ok`.
    pub fn check(&mut self, ok: bool, what: impl Into<String>) {
        if !ok {
            self.failures.push(what.into());
        }
    }

    /// Whether every check passed.
    pub fn passed(&self) -> bool {
        self.failures.is_empty()
    }
}

/// What the oracle and collector say about `world`'s sent tasks. `persistent`: the store kept
/// its data across restarts (a second write in a later lifetime is an overwrite too).
pub struct Judgement {
    /// The row's measurements (scenario-specific checks are added by the caller).
    pub row: Row,
    /// Every event reported.
    pub events: Vec<Event>,
    /// Result writes per task id.
    pub writes: HashMap<String, Vec<crate::redis::Write>>,
}

/// Judges a world's run: lost, overwrites, duplicate starts, recovery since `fault_end_ms`.
pub fn judge(
    world: &World,
    scenario: &str,
    faults: String,
    persistent: bool,
    fault_end_ms: Option<u64>,
) -> Judgement {
    let events = events::read_all(&world.events_dir);
    let writes = world.oracle.writes();
    let starts = events::count(&events, "start");
    let lost = world
        .sent
        .iter()
        .filter(|id| !writes.contains_key(id.as_str()))
        .count();
    // Over every result key the oracle saw (ticks and chord callbacks too, not only `sent`).
    let dup_writes = writes
        .values()
        .map(|w| {
            if persistent {
                w.len().saturating_sub(1)
            } else {
                let mut per_epoch: HashMap<u32, usize> = HashMap::new();
                for x in w {
                    *per_epoch.entry(x.epoch).or_default() += 1;
                }
                per_epoch.values().map(|n| n.saturating_sub(1)).sum()
            }
        })
        .sum();
    let dup_starts = world
        .sent
        .iter()
        .map(|id| {
            starts
                .get(id.as_str())
                .copied()
                .unwrap_or(0)
                .saturating_sub(1) as usize
        })
        .sum();
    let last_write = writes.values().flatten().map(|w| w.at_ms).max();
    let recovery_s = match (fault_end_ms, last_write) {
        (Some(end), Some(last)) => Some(last.saturating_sub(end) as f64 / 1000.0),
        _ => None,
    };
    let mut row = Row {
        scenario: scenario.to_owned(),
        backend: world.backend.name(),
        tasks: world.sent.len(),
        faults,
        lost,
        dup_writes,
        dup_starts,
        recovery_s,
        notes: Vec::new(),
        failures: Vec::new(),
    };
    row.check(lost == 0, format!("{lost} task(s) never got a result"));
    row.check(
        dup_writes == 0,
        format!("{dup_writes} write(s) over an existing result"),
    );
    Judgement {
        row,
        events,
        writes,
    }
}

/// The table, in Markdown.
pub fn table(rows: &[Row]) -> String {
    let mut out = String::from(
        "| scenario | backend | tasks | faults injected | lost | duplicate writes | duplicate starts | recovery s | notes |\n|---|---|---|---|---|---|---|---|---|\n",
    );
    for r in rows {
        out.push_str(&format!(
            "| {} | {} | {} | {} | {} | {} | {} | {} | {}{} |\n",
            r.scenario,
            r.backend,
            r.tasks,
            r.faults,
            r.lost,
            r.dup_writes,
            r.dup_starts,
            r.recovery_s.map_or("-".to_owned(), |s| format!("{s:.1}")),
            r.notes.join("; "),
            if r.passed() {
                String::new()
            } else {
                format!(" **FAILED: {}**", r.failures.join("; "))
            }
        ));
    }
    out
}
