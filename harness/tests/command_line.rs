//! The harness's command line: a misspelt scenario or flag is an error, not a run of nothing
//! that passes. (This test also has `cargo test` build the `fault-harness` binary with the
//! rest of the workspace's tests, which `scripts/test.sh` then runs.)

use std::process::{Command, Output};

fn harness(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_fault-harness"))
        .args(args)
        .output()
        .expect("run fault-harness")
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

#[test]
fn help_prints_the_usage() {
    let out = harness(&["--help"]);
    assert!(out.status.success());
    assert!(text(&out.stdout).contains("usage: fault-harness"));
}

#[test]
fn list_names_every_scenario_with_its_backends() {
    let out = harness(&["--list"]);
    assert!(out.status.success());
    let listed = text(&out.stdout);
    let line = |name: &str| {
        listed
            .lines()
            .find(|l| l.starts_with(&format!("{name}: ")))
            .unwrap_or_else(|| panic!("{name} not listed: {listed}"))
            .to_owned()
    };
    assert_eq!(line("fifo_sigkill"), "fifo_sigkill: SQS (fauxqs)");
    assert!(line("slot_holder_sigkill").contains("RabbitMQ; SQS (fauxqs)"));
    assert!(
        listed.lines().any(|l| l.starts_with("bad_input: ")),
        "{listed}"
    );
}

#[test]
fn an_unknown_scenario_is_an_error_naming_it() {
    let out = harness(&["--only", "sigkill_workers,no_such_scenario"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(text(&out.stderr).contains("no scenario \"no_such_scenario\""));
}

#[test]
fn an_unknown_flag_or_broker_is_an_error() {
    let out = harness(&["--brokers", "sqs"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(text(&out.stderr).contains("unknown argument \"--brokers\""));
    let out = harness(&["--broker", "kafka"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(text(&out.stderr).contains("unknown broker \"kafka\""));
}
