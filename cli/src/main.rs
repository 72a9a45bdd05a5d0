#![warn(missing_docs)]
//! `ferriq`: the on-call engineer's command. It connects with the same URLs and `FERRIQ_*`
//! environment as a worker, and shows queues, workers and their runs, dead letters (listed,
//! shown, redriven, purged), tasks (status, result, revoke), schedules and limits. Tables for people, `--json`
//! for scripts; destructive commands ask first unless `--yes`. `ferriq dashboard` serves the
//! same as a web page.

mod args;
mod dashboard;
mod dlq;
mod limits;
mod output;
mod schedules;
mod task;
mod views;

use crate::output::errln;
use std::process::ExitCode;

use clap::Parser;
use ferriq::connect::{ConnectError, Settings};
use ferriq::Client;

// Every backend this command can reach: linked so their URL schemes are registered.
use ferriq_amqp as _;
use ferriq_sqs as _;
use ferriq_valkey as _;

use args::{Cli, Command, QueuesCommand};

/// Why a command failed, and the exit code that says so.
#[derive(Debug, thiserror::Error)]
pub(crate) enum Failure {
    /// The command line asks for something that cannot be done as asked (exit 2).
    #[error("{0}")]
    Usage(String),
    /// Cannot connect (exit 1).
    #[error("cannot connect: {0}\n  check the URL (--broker / FERRIQ_BROKER_URL, --store / FERRIQ_STORE_URL), the credentials in it, and that the server answers")]
    Connect(String),
    /// The operation failed (exit 1).
    #[error("{0}")]
    Failed(String),
    /// What was asked for does not exist (exit 3).
    #[error("{0}")]
    NotFound(String),
    /// The operator said no at the prompt (exit 4).
    #[error("aborted: nothing was changed")]
    Aborted,
}

impl Failure {
    fn exit_code(&self) -> u8 {
        match self {
            Failure::Failed(_) | Failure::Connect(_) => 1,
            Failure::Usage(_) => 2,
            Failure::NotFound(_) => 3,
            Failure::Aborted => 4,
        }
    }
}

impl From<ferriq::ops::OpsError> for Failure {
    fn from(e: ferriq::ops::OpsError) -> Self {
        Failure::Failed(e.to_string())
    }
}

impl From<ferriq::store::StoreError> for Failure {
    fn from(e: ferriq::store::StoreError) -> Self {
        Failure::Failed(format!(
            "{e}\n  check the store URL (--store / FERRIQ_STORE_URL) and that it answers"
        ))
    }
}

/// The client on the command line's URLs, else the environment's.
async fn connect(cli: &Cli) -> Result<Client, Failure> {
    let mut settings = Settings::default();
    settings.extend(std::env::vars().filter(|(k, _)| k.starts_with("FERRIQ_")));
    if let Some(url) = &cli.broker {
        settings.insert("FERRIQ_BROKER_URL", url.clone());
    }
    if let Some(url) = &cli.store {
        settings.insert("FERRIQ_STORE_URL", url.clone());
    }
    if let Some(queues) = &cli.queues {
        settings.insert("FERRIQ_QUEUES", queues.clone());
    }
    // Looking at a deployment must not change it: a mistyped lane is an error, not new queues.
    if settings.get("FERRIQ_AMQP_DECLARE_TOPOLOGY").is_none() {
        settings.insert("FERRIQ_AMQP_DECLARE_TOPOLOGY", "0".to_owned());
    }
    if settings.get("FERRIQ_BROKER_URL").is_none() {
        return Err(Failure::Usage(
            "no broker: pass --broker URL or set FERRIQ_BROKER_URL (amqp://…, sqs://…)".into(),
        ));
    }
    if settings.get("FERRIQ_STORE_URL").is_none() && settings.get("FERRIQ_VALKEY_URL").is_none() {
        return Err(Failure::Usage(
            "no store: pass --store URL or set FERRIQ_STORE_URL (redis://…)".into(),
        ));
    }
    let connecting = Client::from_settings(&settings);
    match tokio::time::timeout(cli.timeout, connecting).await {
        Ok(Ok(client)) => Ok(client),
        // The broker answered, but an exchange or lane named is not there (the command
        // never declares them): not a connection problem.
        Ok(Err(e @ ConnectError::NotFound(_))) => Err(Failure::NotFound(e.to_string())),
        Ok(Err(e)) => Err(Failure::Connect(e.to_string())),
        Err(_) => Err(Failure::Connect(format!(
            "no answer within {:?} (--timeout)",
            cli.timeout
        ))),
    }
}

/// The command line's own mistakes, found before connecting: they exit 2 whether or not the
/// broker answers.
fn check_usage(cli: &Cli) -> Result<(), Failure> {
    match &cli.command {
        Command::Dlq(command) => dlq::check_usage(command),
        Command::Task(command) => task::check_usage(command),
        Command::Schedules(command) => schedules::check_usage(command),
        Command::Limits { action } => limits::check_usage(action),
        Command::Dashboard { listen, .. } => dashboard::check_usage(*listen),
        Command::Queues { .. } | Command::Workers => Ok(()),
    }
}

async fn run(cli: Cli) -> Result<(), Failure> {
    check_usage(&cli)?;
    let client = connect(&cli).await?;
    let out = output::Output::new(cli.json);
    let done = match &cli.command {
        Command::Queues { action: None } => views::queues(&client, &out).await,
        Command::Queues {
            action: Some(QueuesCommand::Delete { lane, force }),
        } => views::delete_lane(&client, &cli, lane, *force).await,
        Command::Schedules(command) => schedules::run(&client, &out, command).await,
        Command::Workers => views::workers(&client, &out).await,
        Command::Limits { action } => limits::run(&client, &out, action).await,
        Command::Dlq(command) => dlq::run(&client, &out, &cli, command).await,
        Command::Task(command) => task::run(&client, &out, &cli, command).await,
        Command::Dashboard {
            listen,
            allow_actions,
        } => dashboard::serve(&client, *listen, *allow_actions).await,
    };
    client.close().await;
    done
}

/// Warnings (a misspelt setting, a reconnect) on stderr. Returned messages are never logged
/// whole: lapin would print their bodies.
fn log_warnings() {
    use tracing_subscriber::layer::SubscriberExt;
    let targets = tracing_subscriber::filter::Targets::new()
        .with_default(tracing::Level::WARN)
        .with_target("lapin::returned_messages", tracing::Level::ERROR);
    let subscriber = tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_ansi(false)
        .with_target(false)
        .without_time()
        .finish()
        .with(targets);
    let _ = tracing::subscriber::set_global_default(subscriber);
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    log_warnings();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            errln!("error: cannot start: {e}");
            return ExitCode::from(1);
        }
    };
    match runtime.block_on(run(cli)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            errln!("error: {e}");
            ExitCode::from(e.exit_code())
        }
    }
}
