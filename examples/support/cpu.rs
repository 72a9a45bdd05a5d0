//! CPU time per process, from /proc: the benchmarks' "CPU per task" figures. On a small
//! machine every process of a run (producer, worker, broker, store) shares the same cores, so
//! throughput follows the CPU a task costs all of them together; this says which one pays.

/// Linux reports process times in clock ticks of 1/100 s on every architecture it runs on
/// (`USER_HZ`), whatever the kernel's own tick.
const TICKS_PER_SEC: f64 = 100.0;

/// The first process whose command name (`/proc/<pid>/comm`) is `comm`.
///
/// ```
/// // Some process is always running this example's own name.
/// let me = std::fs::read_to_string("/proc/self/comm").unwrap();
/// assert!(ferriq_examples::cpu::find_process(me.trim()).is_some());
/// ```
pub fn find_process(comm: &str) -> Option<u32> {
    std::fs::read_dir("/proc").ok()?.find_map(|entry| {
        let pid: u32 = entry.ok()?.file_name().to_str()?.parse().ok()?;
        let name = std::fs::read_to_string(format!("/proc/{pid}/comm")).ok()?;
        (name.trim() == comm).then_some(pid)
    })
}

/// User + system CPU seconds a process has used so far (all its threads); `None` once it
/// is gone.
pub fn cpu_seconds(pid: u32) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    Some(stat_cpu(&stat)?.1)
}

/// The command name and user + system CPU seconds of a `/proc/…/stat` line.
fn stat_cpu(stat: &str) -> Option<(&str, f64)> {
    // The command name is in parentheses and may hold spaces: count fields after it.
    let name = &stat[stat.find('(')? + 1..stat.rfind(')')?];
    let after_name = &stat[stat.rfind(')')? + 2..];
    let mut fields = after_name.split_whitespace();
    // Fields 14 (utime) and 15 (stime) of proc(5); `after_name` starts at field 3.
    let utime: f64 = fields.nth(11)?.parse().ok()?;
    let stime: f64 = fields.next()?.parse().ok()?;
    Some((name, (utime + stime) / TICKS_PER_SEC))
}

/// A process's CPU seconds and context switches so far, summed by thread name (tokio's
/// `tokio-rt-worker`s, lapin's `lapin-io-loop`, …): which threads pay. Threads that exited
/// are not counted; `None` once the process is gone.
///
/// ```
/// let threads = ferriq_examples::cpu::cpu_by_thread(std::process::id()).unwrap();
/// assert!(!threads.is_empty());
/// ```
pub fn cpu_by_thread(pid: u32) -> Option<std::collections::BTreeMap<String, (f64, u64)>> {
    let mut by_name = std::collections::BTreeMap::new();
    for task in std::fs::read_dir(format!("/proc/{pid}/task"))
        .ok()?
        .flatten()
    {
        // A thread may exit between the listing and the reads: it is then left out.
        let (Ok(stat), Ok(status)) = (
            std::fs::read_to_string(task.path().join("stat")),
            std::fs::read_to_string(task.path().join("status")),
        ) else {
            continue;
        };
        let Some((name, cpu)) = stat_cpu(&stat) else {
            continue;
        };
        let entry = by_name.entry(name.to_owned()).or_insert((0.0, 0));
        entry.0 += cpu;
        entry.1 += switches_in(&status);
    }
    Some(by_name)
}

/// What each thread name of [`cpu_by_thread`] spent between two readings, per task: CPU µs
/// and context switches, largest CPU first (names that spent nothing are left out).
pub fn threads_per_task(
    before: &std::collections::BTreeMap<String, (f64, u64)>,
    after: &std::collections::BTreeMap<String, (f64, u64)>,
    tasks: u64,
) -> Vec<(String, f64, f64)> {
    let mut spent: Vec<_> = after
        .iter()
        .map(|(name, (cpu, switches))| {
            let (cpu0, switches0) = before.get(name).copied().unwrap_or((0.0, 0));
            (
                name.clone(),
                (cpu - cpu0) * 1e6 / tasks as f64,
                switches.saturating_sub(switches0) as f64 / tasks as f64,
            )
        })
        .filter(|(_, cpu, switches)| *cpu > 0.0 || *switches > 0.0)
        .collect();
    spent.sort_by(|a, b| b.1.total_cmp(&a.1));
    spent
}

/// Context switches the threads of a process have made so far, voluntary and involuntary
/// (summed over `/proc/<pid>/task/*/status`, so threads that already exited are not
/// counted); `None` once it is gone. Each is a thread going to sleep or being preempted: on a
/// small virtual machine waking a sleeping thread costs tens of µs, which is most of what a
/// lone task's round trip spends outside the broker.
///
/// ```
/// let switches = ferriq_examples::cpu::context_switches(std::process::id());
/// assert!(switches.is_some());
/// ```
pub fn context_switches(pid: u32) -> Option<u64> {
    let tasks = std::fs::read_dir(format!("/proc/{pid}/task")).ok()?;
    let mut total = 0;
    for task in tasks.flatten() {
        // A thread may exit between the listing and the read: it then counts as gone.
        let Ok(status) = std::fs::read_to_string(task.path().join("status")) else {
            continue;
        };
        total += switches_in(&status);
    }
    Some(total)
}

/// The context switches, voluntary and involuntary, a thread's `/proc/…/status` reports.
fn switches_in(status: &str) -> u64 {
    status
        .lines()
        .filter(|l| l.contains("ctxt_switches:"))
        .filter_map(|l| l.split_whitespace().nth(1)?.parse::<u64>().ok())
        .sum()
}

/// Named processes whose CPU a benchmark phase is charged to.
///
/// ```
/// let me = std::process::id();
/// let meter = ferriq_examples::cpu::Meter::new(vec![("bench", Some(me)), ("nobody", None)]);
/// let before = meter.read();
/// let spent = meter.per_task_us(&before, 1);
/// assert_eq!(spent.len(), 2);
/// assert!(spent[1].is_nan(), "a process that was not found reads as NaN");
/// ```
pub struct Meter {
    processes: Vec<(&'static str, Option<u32>)>,
}

impl Meter {
    /// Meters the given processes (`None`: not found; its figures read as NaN).
    pub fn new(processes: Vec<(&'static str, Option<u32>)>) -> Self {
        Meter { processes }
    }

    /// The process metered as `name`, if it was found.
    pub fn pid(&self, name: &str) -> Option<u32> {
        self.processes
            .iter()
            .find(|(n, _)| *n == name)
            .and_then(|(_, pid)| *pid)
    }

    /// The names, in order.
    pub fn names(&self) -> Vec<&'static str> {
        self.processes.iter().map(|(name, _)| *name).collect()
    }

    /// Each process's CPU seconds so far.
    pub fn read(&self) -> Vec<f64> {
        self.processes
            .iter()
            .map(|(_, pid)| pid.and_then(cpu_seconds).unwrap_or(f64::NAN))
            .collect()
    }

    /// CPU µs per task each process spent since `before`, over `tasks` tasks.
    pub fn per_task_us(&self, before: &[f64], tasks: u64) -> Vec<f64> {
        per_task(self.read(), before, 1e6 / tasks as f64)
    }

    /// Each process's [`context_switches`] so far (NaN: not found).
    pub fn read_switches(&self) -> Vec<f64> {
        self.processes
            .iter()
            .map(|(_, pid)| {
                pid.and_then(context_switches)
                    .map_or(f64::NAN, |n| n as f64)
            })
            .collect()
    }

    /// Context switches per task each process made since `before` (from
    /// [`read_switches`](Meter::read_switches)), over `tasks` tasks.
    pub fn switches_per_task(&self, before: &[f64], tasks: u64) -> Vec<f64> {
        per_task(self.read_switches(), before, 1.0 / tasks as f64)
    }
}

/// Each process's growth from `before` to `after`, times `scale`.
fn per_task(after: Vec<f64>, before: &[f64], scale: f64) -> Vec<f64> {
    after
        .iter()
        .zip(before)
        .map(|(after, before)| (after - before) * scale)
        .collect()
}

/// Busy and total CPU time of the whole machine so far, in ticks (`/proc/stat`'s first
/// line; idle and iowait count as not busy).
fn machine_ticks() -> Option<(f64, f64)> {
    let stat = std::fs::read_to_string("/proc/stat").ok()?;
    let line = stat.lines().next()?.strip_prefix("cpu ")?;
    let ticks: Vec<f64> = line
        .split_whitespace()
        .filter_map(|t| t.parse().ok())
        .collect();
    // user nice system idle iowait irq softirq steal (guest time is already in user).
    let total: f64 = ticks.iter().take(8).sum();
    let idle = ticks.get(3)? + ticks.get(4).unwrap_or(&0.0);
    Some((total - idle, total))
}

/// How busy the whole machine is over a window: every core, every process.
///
/// ```
/// let busy = ferriq_examples::cpu::MachineBusy::start();
/// let share = busy.share();
/// assert!(share.is_nan() || (0.0..=1.0).contains(&share));
/// ```
pub struct MachineBusy {
    start: Option<(f64, f64)>,
}

impl MachineBusy {
    /// Starts the window now.
    pub fn start() -> Self {
        MachineBusy {
            start: machine_ticks(),
        }
    }

    /// The share (0–1) of all cores' time that was busy since `start`; NaN where
    /// `/proc/stat` cannot be read or no tick has passed.
    pub fn share(&self) -> f64 {
        match (self.start, machine_ticks()) {
            (Some((busy0, total0)), Some((busy1, total1))) if total1 > total0 => {
                (busy1 - busy0) / (total1 - total0)
            }
            _ => f64::NAN,
        }
    }
}

/// The median of each column of `rows` (NaN where a column is all NaN).
pub fn column_medians(rows: &[Vec<f64>]) -> Vec<f64> {
    let width = rows.first().map_or(0, Vec::len);
    (0..width)
        .map(|c| {
            let mut column: Vec<f64> = rows.iter().map(|r| r[c]).filter(|v| !v.is_nan()).collect();
            column.sort_by(|a, b| a.total_cmp(b));
            column.get(column.len() / 2).copied().unwrap_or(f64::NAN)
        })
        .collect()
}
