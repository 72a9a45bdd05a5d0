//! The command line.

use std::time::Duration;

use clap::{Args, Parser, Subcommand};

const AFTER_HELP: &str = "\
Connection:
  The same URLs and environment as a worker: FERRIQ_BROKER_URL (amqp://…, sqs://…),
  FERRIQ_STORE_URL (redis://…), FERRIQ_QUEUES and the backends' FERRIQ_* settings.
  Flags override the environment.

Exit codes:
  0  done
  1  failed (cannot connect, the broker or store refused); the message says what to check
  2  the command line is wrong (a missing URL, a redrive or purge without a filter)
  3  not found (an exchange, lane or queue not on the broker; no such dead letter; no result yet)
  4  aborted at the confirmation prompt: nothing was changed

Examples:
  ferriq queues
  ferriq workers --json
  ferriq dlq list --reason retries_exhausted
  ferriq dlq redrive --reason retries_exhausted --older-than 10m
  ferriq dlq purge --task reports.render --yes
  ferriq task status 0b6c4f1e7a7e4c1a9f552f4d2f6a0c11
  ferriq schedules add nightly-report --task reports.nightly --cron '0 0 2 * * *' --timezone Europe/Berlin
  ferriq schedules pause nightly-report
  ferriq queues delete typo-lane";

/// Operate ferriq: queues, workers, dead letters and tasks.
#[derive(Debug, Parser)]
#[command(name = "ferriq", version, about, after_help = AFTER_HELP)]
pub(crate) struct Cli {
    /// The broker's URL (amqp://user:pass@host/vhost, sqs://queue?region=…).
    #[arg(long, global = true, env = "FERRIQ_BROKER_URL", hide_env_values = true)]
    pub(crate) broker: Option<String>,
    /// The store's URL (redis://host:port).
    #[arg(long, global = true, env = "FERRIQ_STORE_URL", hide_env_values = true)]
    pub(crate) store: Option<String>,
    /// The lanes (queues), comma-separated; the first is the default.
    #[arg(long, global = true, env = "FERRIQ_QUEUES")]
    pub(crate) queues: Option<String>,
    /// Output JSON for scripts instead of tables.
    #[arg(long, global = true)]
    pub(crate) json: bool,
    /// Do not ask before redriving, purging or revoking.
    #[arg(long, short = 'y', global = true)]
    pub(crate) yes: bool,
    /// How long to wait for the broker and store to connect (30s, 2m, …).
    #[arg(long, global = true, default_value = "30s", value_parser = parse_duration)]
    pub(crate) timeout: Duration,
    /// What to do.
    #[command(subcommand)]
    pub(crate) command: Command,
}

/// The commands.
#[derive(Debug, Subcommand)]
pub(crate) enum Command {
    /// Each lane: ready, in flight, delayed, dead-lettered, consumers, runs; `queues delete LANE`
    /// removes a lane's queues.
    Queues {
        /// Delete a lane.
        #[command(subcommand)]
        action: Option<QueuesCommand>,
    },
    /// Live workers (reported within their heartbeat) and their runs in flight.
    Workers,
    /// Dead letters: list, show, redrive, purge.
    #[command(subcommand)]
    Dlq(DlqCommand),
    /// One task: status, result, revoke.
    #[command(subcommand)]
    Task(TaskCommand),
    /// Schedules: list, add, remove, pause, resume.
    #[command(subcommand)]
    Schedules(ScheduleCommand),
    /// Rate and concurrency limits: each limiter's use per key (the default), and limits set
    /// at run time over the declared ones, which every worker applies within 2 s.
    Limits {
        /// What to do (default: list).
        #[command(subcommand)]
        action: Option<LimitsCommand>,
    },
    /// Serve the dashboard: a web page of lanes, workers, tasks, dead letters, schedules and
    /// limits. Read-only unless `--allow-actions`; a token (FERRIQ_DASHBOARD_TOKEN) is
    /// required to listen beyond loopback.
    Dashboard {
        /// Address to listen on.
        #[arg(long, default_value = "127.0.0.1:8080")]
        listen: std::net::SocketAddr,
        /// Let the page redrive and purge dead letters and pause, resume, remove and run
        /// schedules.
        #[arg(long)]
        allow_actions: bool,
    },
}

/// Limit commands.
#[derive(Debug, Subcommand)]
pub(crate) enum LimitsCommand {
    /// Each limiter used in the last day: its limit, how much of it is in use, how many tasks
    /// wait; then the limits set at run time.
    List,
    /// Set a task's limits (or one key's) over what the task declares.
    Set {
        /// The task's name.
        task: String,
        /// Only this key's limiter (a tenant, a customer), over the task's.
        #[arg(long)]
        key: Option<String>,
        /// Starts per period: 50/s, 300/m, 1000/h, 5/10s.
        #[arg(long)]
        rate: Option<String>,
        /// Runs at once, across every worker.
        #[arg(long)]
        concurrency: Option<u32>,
    },
    /// Go back to the declared limits.
    Reset {
        /// The task's name.
        task: String,
        /// The key, when the limit was set for one.
        #[arg(long)]
        key: Option<String>,
    },
}

/// Lane commands.
#[derive(Debug, Subcommand)]
pub(crate) enum QueuesCommand {
    /// Delete a lane's queues on RabbitMQ (the lane, its dead-letter queue and delay tiers,
    /// which every process listing the lane declares): for a mistyped lane. Refused while they
    /// hold messages or have consumers, unless --force; stop the lane's producers first (a
    /// message sent between the check and the delete goes with the queues).
    Delete {
        /// The lane.
        lane: String,
        /// Delete the messages they hold too.
        #[arg(long)]
        force: bool,
    },
}

/// Schedule commands.
#[derive(Debug, Subcommand)]
pub(crate) enum ScheduleCommand {
    /// Every schedule (declared on tasks, as a scheduler recorded them, and added at run time):
    /// its timing, next tick, latest tick and how it stands, and whether it is paused.
    List,
    /// Add (or replace, by id) a run-time schedule.
    Add(ScheduleArgs),
    /// Remove a run-time schedule (a declared one is removed from its task's code).
    Remove {
        /// The schedule's id.
        id: String,
    },
    /// Pause a schedule: its ticks pass unsent until it is resumed.
    Pause {
        /// The schedule's id (a declared schedule's id is its task's name).
        id: String,
    },
    /// Resume a paused schedule: its next tick is sent (the paused ones are not caught up).
    Resume {
        /// The schedule's id.
        id: String,
    },
}

/// A run-time schedule.
#[derive(Debug, Clone, Args)]
pub(crate) struct ScheduleArgs {
    /// Its id.
    pub(crate) id: String,
    /// The task to send (its registered name).
    #[arg(long)]
    pub(crate) task: String,
    /// A cron expression, with seconds ("0 0 8 * * MON"; 5 fields read seconds as 0).
    #[arg(long, conflicts_with = "every", required_unless_present = "every")]
    pub(crate) cron: Option<String>,
    /// Every so many seconds (at whole multiples since the unix epoch).
    #[arg(long)]
    pub(crate) every: Option<u64>,
    /// The cron expression's IANA time zone (Europe/Berlin); UTC when absent.
    #[arg(long, requires = "cron")]
    pub(crate) timezone: Option<String>,
    /// Positional arguments of each call, a JSON array.
    #[arg(long, default_value = "[]")]
    pub(crate) args: String,
    /// Keyword arguments of each call, a JSON object.
    #[arg(long, default_value = "{}")]
    pub(crate) kwargs: String,
    /// The lane to send to (the default lane when absent).
    #[arg(long)]
    pub(crate) queue: Option<String>,
    /// Missed ticks: skip, latest (run the latest once) or catch_up (every one, up to 100).
    #[arg(long, default_value = "latest", value_parser = ["skip", "latest", "catch_up"])]
    pub(crate) missed: String,
    /// Skip each tick while the previous one has not finished.
    #[arg(long)]
    pub(crate) no_overlap: bool,
}

/// Dead-letter commands.
#[derive(Debug, Subcommand)]
pub(crate) enum DlqCommand {
    /// List dead letters, oldest first (nothing is taken or reordered).
    List {
        /// Which ones.
        #[command(flatten)]
        filter: Filter,
        /// Skip this many.
        #[arg(long, default_value_t = 0)]
        offset: usize,
        /// Show at most this many.
        #[arg(long, default_value_t = 50)]
        limit: usize,
    },
    /// Show one dead letter with its arguments.
    Show {
        /// The dead letter's id (from `dlq list`), or the id of the task it carries.
        id: String,
        /// The lane (default: the first of --queues, else the broker's default).
        #[arg(long)]
        queue: Option<String>,
    },
    /// Send dead letters back to their lane, each with a fresh attempt budget.
    Redrive(Selection),
    /// Remove dead letters for good.
    Purge(Selection),
    /// Rebuild the store's index of a lane's dead letters (what the dashboard lists) from
    /// the queue: after an upgrade, a store that lost it, or letters the broker parked itself.
    Reindex {
        /// The lane (default: the first of --queues, else the broker's default).
        #[arg(long)]
        queue: Option<String>,
    },
}

/// Which dead letters a list shows.
#[derive(Debug, Clone, Args)]
pub(crate) struct Filter {
    /// The lane (default: the first of --queues, else the broker's default).
    #[arg(long)]
    pub(crate) queue: Option<String>,
    /// Only those parked for this reason.
    #[arg(long, value_parser = reasons())]
    pub(crate) reason: Option<String>,
    /// Only those of this task name.
    #[arg(long)]
    pub(crate) task: Option<String>,
    /// Only those parked at least this long ago (90s, 15m, 2h, 7d).
    #[arg(long, value_parser = parse_duration)]
    pub(crate) older_than: Option<Duration>,
}

/// Which dead letters a redrive or purge touches: an id, a filter, or `--all`.
#[derive(Debug, Clone, Args)]
pub(crate) struct Selection {
    /// One dead letter, by its id or the id of the task it carries.
    pub(crate) id: Option<String>,
    /// Which ones.
    #[command(flatten)]
    pub(crate) filter: Filter,
    /// Every dead letter of the lane (required when no id or filter is given).
    #[arg(long)]
    pub(crate) all: bool,
}

/// Task commands.
#[derive(Debug, Subcommand)]
pub(crate) enum TaskCommand {
    /// Status, result, progress and claim (holder, lease, attempts).
    Status {
        /// The task id.
        id: String,
    },
    /// The stored result: the return value, or the error (exit 1 when the task failed; 3 when
    /// there is none, which lasts for a task that stores no result).
    Result {
        /// The task id.
        id: String,
    },
    /// Revoke: it never starts; a running one is cancelled at its next heartbeat.
    Revoke {
        /// The task id.
        id: String,
    },
}

fn reasons() -> clap::builder::PossibleValuesParser {
    clap::builder::PossibleValuesParser::new(
        ferriq::broker::DeadLetterReason::ALL.map(|r| r.as_str()),
    )
}

/// `90s`, `15m`, `2h`, `7d`, `1h30m`, or plain seconds.
pub(crate) fn parse_duration(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    if let Ok(secs) = text.parse::<u64>() {
        return Ok(Duration::from_secs(secs));
    }
    let bad = || format!("{text:?} is not a duration: write 90s, 15m, 2h, 7d or 1h30m");
    let (mut total, mut number) = (0u64, String::new());
    for c in text.chars() {
        if c.is_ascii_digit() {
            number.push(c);
            continue;
        }
        let unit = match c {
            's' => 1,
            'm' => 60,
            'h' => 3600,
            'd' => 86_400,
            _ => return Err(bad()),
        };
        let n: u64 = number.parse().map_err(|_| bad())?;
        total = n
            .checked_mul(unit)
            .and_then(|s| total.checked_add(s))
            .ok_or_else(bad)?;
        number.clear();
    }
    if !number.is_empty() || text.is_empty() {
        return Err(bad());
    }
    Ok(Duration::from_secs(total))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_read_as_people_write_them() {
        assert_eq!(parse_duration("90"), Ok(Duration::from_secs(90)));
        assert_eq!(parse_duration("15m"), Ok(Duration::from_secs(900)));
        assert_eq!(parse_duration("1h30m"), Ok(Duration::from_secs(5400)));
        assert_eq!(parse_duration("7d"), Ok(Duration::from_secs(604_800)));
        assert!(parse_duration("soon").is_err());
        assert!(parse_duration("5").is_ok());
        assert!(parse_duration("5x").is_err());
        assert!(parse_duration("").is_err());
        assert!(parse_duration("m").is_err());
    }

    #[test]
    fn the_command_line_is_consistent() {
        use clap::CommandFactory;
        Cli::command().debug_assert();
    }
}
