//! `fault-harness`: runs the fault scenarios and prints (or writes) RELIABILITY.md's table.
//!
//! ```text
//! cargo run -p ferriq-harness --bin fault-harness -- [--size small|full] [--broker amqp|sqs|cluster|redis|all]
//!     [--only NAME[,NAME…]] [--write RELIABILITY.md]
//! fault-harness --list    # the scenarios, and the backends each runs on
//! fault-harness worker    # a worker process (started by the harness itself)
//! ```

use std::time::Duration;

use ferriq_harness::report::{table, Row};
use ferriq_harness::scenarios::{self, Size};
use ferriq_harness::world::Backend;

// The backends the worker processes' URLs name.
use ferriq_amqp as _;
use ferriq_sqs as _;
use ferriq_valkey as _;

const USAGE: &str = "\
usage: fault-harness [--size small|full] [--broker amqp|sqs|cluster|redis|all]
                     [--only NAME[,NAME...]] [--write RELIABILITY.md]
       fault-harness --list     the scenarios, and the backends each runs on
       fault-harness --help";

/// What the command line asks for.
struct Options {
    size: Size,
    backends: Vec<Backend>,
    /// The scenarios to run (every one unless `--only` names some).
    names: Vec<&'static str>,
    /// Some scenarios or backends only: the rows written replace their own, not the table.
    partial: bool,
    write: Option<String>,
}

/// What to do, or why the command line is wrong.
enum Command {
    Run(Options),
    List,
    Help,
}

fn every_scenario() -> Vec<&'static str> {
    let mut names: Vec<&'static str> = scenarios::ALL.to_vec();
    names.push("bad_input");
    names
}

const EVERY_BACKEND: [Backend; 4] = [
    Backend::Amqp,
    Backend::Sqs,
    Backend::AmqpCluster,
    Backend::Streams,
];

/// Parses `args` (without the program's name). Unknown flags, sizes, backends or scenario
/// names are errors: a misspelt `--only` would otherwise run nothing and pass.
fn parse(args: &[String]) -> Result<Command, String> {
    let mut options = Options {
        size: Size::SMALL,
        backends: EVERY_BACKEND.to_vec(),
        names: every_scenario(),
        partial: false,
        write: None,
    };
    let mut args = args.iter();
    while let Some(flag) = args.next() {
        let mut value = || {
            args.next()
                .ok_or_else(|| format!("{flag} needs a value"))
                .cloned()
        };
        match flag.as_str() {
            "--help" | "-h" => return Ok(Command::Help),
            "--list" => return Ok(Command::List),
            "--size" => {
                options.size = match value()?.as_str() {
                    "small" => Size::SMALL,
                    "full" => Size::FULL,
                    other => return Err(format!("unknown size {other:?}: small or full")),
                }
            }
            "--broker" => {
                let broker = value()?;
                options.backends = match broker.as_str() {
                    "amqp" => vec![Backend::Amqp],
                    "sqs" => vec![Backend::Sqs],
                    "cluster" => vec![Backend::AmqpCluster],
                    "redis" => vec![Backend::Streams],
                    "all" | "both" => EVERY_BACKEND.to_vec(),
                    other => {
                        return Err(format!(
                            "unknown broker {other:?}: amqp, sqs, cluster, redis or all"
                        ))
                    }
                };
                options.partial |= options.backends.len() < EVERY_BACKEND.len();
            }
            "--only" => {
                let only = value()?;
                let every = every_scenario();
                let mut names = Vec::new();
                for name in only.split(',').filter(|n| !n.is_empty()) {
                    match every.iter().find(|known| **known == name) {
                        Some(known) => names.push(*known),
                        None => {
                            return Err(format!(
                                "no scenario {name:?}: `fault-harness --list` names them"
                            ))
                        }
                    }
                }
                options.names = names;
                options.partial = true;
            }
            "--write" => options.write = Some(value()?),
            other => return Err(format!("unknown argument {other:?}")),
        }
    }
    Ok(Command::Run(options))
}

#[tokio::main]
async fn main() {
    if std::env::args().nth(1).as_deref() == Some("worker") {
        ferriq_harness::tasks::worker_main().await;
        return;
    }
    let args: Vec<String> = std::env::args().skip(1).collect();
    let options = match parse(&args) {
        Ok(Command::Run(options)) => options,
        Ok(Command::Help) => {
            println!("{USAGE}");
            return;
        }
        Ok(Command::List) => {
            for name in every_scenario() {
                let on: Vec<&str> = EVERY_BACKEND
                    .iter()
                    .filter(|b| scenarios::runs_on(name, **b))
                    .map(|b| b.name())
                    .collect();
                println!("{name}: {}", on.join("; "));
            }
            return;
        }
        Err(e) => {
            eprintln!("fault-harness: {e}\n\n{USAGE}");
            std::process::exit(2);
        }
    };
    let Options {
        size,
        backends,
        names,
        partial,
        write,
    } = options;
    let root = std::env::temp_dir().join(format!("ferriq-harness-{}", std::process::id()));
    let started = std::time::Instant::now();
    let mut rows: Vec<Row> = Vec::new();
    for backend in &backends {
        for name in names.iter().filter(|n| scenarios::runs_on(n, *backend)) {
            let t = std::time::Instant::now();
            eprintln!("==> {name} on {}", backend.name());
            let row = tokio::time::timeout(
                Duration::from_secs(900),
                scenarios::run(name, *backend, size, &root),
            )
            .await
            .unwrap_or_else(|_| Row {
                scenario: (*name).to_owned(),
                backend: backend.name(),
                tasks: 0,
                faults: "-".into(),
                lost: 0,
                dup_writes: 0,
                dup_starts: 0,
                recovery_s: None,
                notes: vec![],
                failures: vec!["timed out after 15 minutes".into()],
            });
            eprintln!(
                "    {} in {:.0} s{}",
                if row.passed() { "passed" } else { "FAILED" },
                t.elapsed().as_secs_f64(),
                if row.passed() {
                    String::new()
                } else {
                    format!(": {}", row.failures.join("; "))
                }
            );
            rows.push(row);
        }
    }
    if std::env::var_os("FERRIQ_HARNESS_KEEP").is_some() {
        eprintln!("kept the worlds' files in {}", root.display());
    } else {
        let _ = std::fs::remove_dir_all(&root);
    }
    let size_name = if size.flow == Size::FULL.flow {
        "full"
    } else {
        "small"
    };
    let text = table(&rows);
    println!("{text}");
    println!(
        "{} rows, {} failed, {:.0} s, size {size_name}",
        rows.len(),
        rows.iter().filter(|r| !r.passed()).count(),
        started.elapsed().as_secs_f64()
    );
    if let Some(write) = write {
        write_reliability(&write, &text, partial);
    }
    if rows.iter().any(|r| !r.passed()) {
        std::process::exit(1);
    }
}

/// Writes `table` into the generated section of `path` (between its markers). A whole run
/// replaces the section; a partial one (`--only`, `--broker`) replaces its own rows (same
/// scenario and backend) and adds new ones, keeping the rest, and says so under the header.
fn write_reliability(path: &str, table: &str, partial: bool) {
    const BEGIN: &str = "<!-- fault-harness:begin -->";
    const END: &str = "<!-- fault-harness:end -->";
    let doc = std::fs::read_to_string(path).unwrap_or_else(|_| format!("{BEGIN}\n{END}\n"));
    let (head, rest) = doc
        .split_once(BEGIN)
        .expect("RELIABILITY.md has the begin marker");
    let (old, tail) = rest
        .split_once(END)
        .expect("RELIABILITY.md has the end marker");
    let date = jiff::Timestamp::now()
        .strftime("%Y-%m-%d %H:%M UTC")
        .to_string();
    let args: Vec<String> = std::env::args().skip(1).collect();
    let how = format!(
        "`cargo run --release -p ferriq-harness --bin fault-harness -- {}` on {date}, CPU {}",
        args.join(" "),
        ferriq_examples::cpu_model()
    );
    let section = if partial && old.contains("| scenario |") {
        merge(old, table, &how)
    } else {
        format!("\nGenerated by {how}.\n\n{table}")
    };
    std::fs::write(path, format!("{head}{BEGIN}{section}{END}{tail}"))
        .expect("write RELIABILITY.md");
}

/// `old`'s section with `table`'s rows in place of its own of the same scenario and backend.
fn merge(old: &str, table: &str, how: &str) -> String {
    let key = |line: &str| -> Option<String> {
        let cells: Vec<&str> = line.split('|').map(str::trim).collect();
        (line.starts_with("| ") && cells.len() > 3 && cells[1] != "scenario")
            .then(|| format!("{}|{}", cells[1], cells[2]))
    };
    let new_rows: Vec<&str> = table.lines().filter(|l| key(l).is_some()).collect();
    let mut used = vec![false; new_rows.len()];
    let mut out = Vec::new();
    for line in old.lines() {
        match key(line) {
            Some(k) => match new_rows.iter().position(|n| key(n).as_deref() == Some(&k)) {
                Some(i) => {
                    out.push(new_rows[i].to_owned());
                    used[i] = true;
                }
                None => out.push(line.to_owned()),
            },
            None if line.starts_with("Generated by") => {
                out.push(line.to_owned());
                out.push(String::new());
                out.push(format!("Rows re-run or added by {how}."));
            }
            None => out.push(line.to_owned()),
        }
    }
    // New rows go at the table's end (its last row line).
    let last = out
        .iter()
        .rposition(|l| key(l).is_some())
        .map_or(out.len(), |i| i + 1);
    let added: Vec<String> = new_rows
        .iter()
        .zip(&used)
        .filter(|(_, u)| !**u)
        .map(|(r, _)| (*r).to_owned())
        .collect();
    out.splice(last..last, added);
    let mut text = out.join("\n");
    text.push('\n');
    text
}
