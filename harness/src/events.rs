//! The collector: what the task bodies reported, read back from the worker processes' event
//! files.

use std::collections::HashMap;
use std::path::Path;

/// One reported event.
#[derive(Debug, Clone)]
pub struct Event {
    /// `start`, `done`, `callback`, `tick`.
    pub kind: String,
    /// The task.
    pub task_id: String,
    /// Its attempt.
    pub attempt: u32,
    /// The worker process.
    pub pid: u32,
    /// When (unix ms).
    pub at_ms: u64,
}

/// Every event in `dir`, in time order.
pub fn read_all(dir: &Path) -> Vec<Event> {
    let mut all = Vec::new();
    let Ok(entries) = std::fs::read_dir(dir) else {
        return all;
    };
    for entry in entries.flatten() {
        let Ok(text) = std::fs::read_to_string(entry.path()) else {
            continue;
        };
        for line in text.lines() {
            let f: Vec<&str> = line.split(' ').collect();
            // A line cut by a kill mid-write is skipped.
            if f.len() != 5 {
                continue;
            }
            let (Ok(attempt), Ok(pid), Ok(at_ms)) = (f[2].parse(), f[3].parse(), f[4].parse())
            else {
                continue;
            };
            all.push(Event {
                kind: f[0].to_owned(),
                task_id: f[1].to_owned(),
                attempt,
                pid,
                at_ms,
            });
        }
    }
    all.sort_by_key(|e| e.at_ms);
    all
}

/// Events of `kind`, counted per task.
pub fn count(events: &[Event], kind: &str) -> HashMap<String, u32> {
    let mut out = HashMap::new();
    for e in events.iter().filter(|e| e.kind == kind) {
        *out.entry(e.task_id.clone()).or_default() += 1;
    }
    out
}

/// The most runs in progress at once (starts not yet done), over every process — a run cut
/// by its process's death stops counting at that death (`deaths`: pid → unix ms).
pub fn max_in_flight(events: &[Event], deaths: &HashMap<u32, u64>) -> usize {
    let mut marks: Vec<(u64, i64)> = Vec::new();
    let mut open: HashMap<(String, u32, u32), u64> = HashMap::new();
    for e in events {
        let key = (e.task_id.clone(), e.attempt, e.pid);
        match e.kind.as_str() {
            "start" => {
                open.insert(key, e.at_ms);
            }
            // A body its worker cut off (`cut`) ends there too.
            "done" | "cut" => {
                if let Some(start) = open.remove(&key) {
                    marks.push((start, 1));
                    marks.push((e.at_ms, -1));
                }
            }
            _ => {}
        }
    }
    for ((_, _, pid), start) in open {
        let end = deaths.get(&pid).copied().unwrap_or(u64::MAX);
        marks.push((start, 1));
        marks.push((end, -1));
    }
    // Ends before starts at the same instant.
    marks.sort_by_key(|(t, d)| (*t, *d));
    let (mut now, mut most) = (0i64, 0i64);
    for (_, d) in marks {
        now += d;
        most = most.max(now);
    }
    most as usize
}
