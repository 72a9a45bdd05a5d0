//! The built `ferriq` binary against the real RabbitMQ and Redis: help, exit codes, `--json`
//! shapes, the confirmation prompt, and the dead-letter and task commands end to end.

mod common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use common::{text, Setup};
use ferriq::{TaskError, WaitError};
use serde_json::Value;

const WAIT: Duration = Duration::from_secs(60);

/// Whether `cli.flaky` succeeds yet.
static HEALED: AtomicBool = AtomicBool::new(false);

#[ferriq::task(name = "cli.flaky", max_attempts = 1)]
async fn flaky(n: u32) -> Result<u32, TaskError> {
    if HEALED.load(Ordering::SeqCst) {
        Ok(n)
    } else {
        Err(TaskError::retryable(format!("{n}: the service is down")))
    }
}

#[ferriq::task(name = "cli.fatal")]
async fn fatal(n: u32) -> Result<u32, TaskError> {
    Err(TaskError::fatal(format!("{n} is malformed")))
}

#[tokio::test]
async fn help_is_complete_and_mistakes_exit_with_two() {
    let setup = Setup::new();
    let out = setup.run(&["--help"], None).await;
    assert!(out.status.success());
    let (help, _) = text(&out);
    for word in [
        "queues",
        "workers",
        "dlq",
        "task",
        "--json",
        "--yes",
        "FERRIQ_BROKER_URL",
        "Exit codes",
    ] {
        assert!(help.contains(word), "--help names {word}: {help}");
    }
    for sub in [
        &["dlq", "list", "--help"][..],
        &["dlq", "show", "--help"],
        &["dlq", "redrive", "--help"],
        &["dlq", "purge", "--help"],
        &["task", "status", "--help"],
        &["task", "result", "--help"],
        &["task", "revoke", "--help"],
        &["queues", "--help"],
        &["workers", "--help"],
        &["limits", "--help"],
        &["limits", "set", "--help"],
    ] {
        let out = setup.run(sub, None).await;
        assert!(out.status.success(), "{sub:?}");
    }
    // Checked before connecting: nothing of this setup is on the broker.
    // A redrive must say which dead letters.
    let out = setup.run(&["dlq", "redrive"], None).await;
    assert_eq!(out.status.code(), Some(2), "{:?}", text(&out));
    assert!(text(&out).1.contains("--all"));
    // A duration people cannot read, a reason that does not exist, a task id that is not one.
    for args in [
        &["dlq", "list", "--older-than", "soon"][..],
        &["dlq", "list", "--reason", "bad_luck"],
        &["task", "status", "not a task id"],
    ] {
        let out = setup.run(args, None).await;
        assert_eq!(out.status.code(), Some(2), "{args:?}: {:?}", text(&out));
    }
    // No broker URL at all.
    let out = setup
        .command(&["queues"])
        .env_remove("FERRIQ_BROKER_URL")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(text(&out).1.contains("FERRIQ_BROKER_URL"));
}

#[tokio::test]
async fn a_refused_connection_exits_with_one_and_names_what_to_check_without_the_password() {
    let setup = Setup::new();
    let out = setup
        .command(&["queues"])
        .env(
            "FERRIQ_BROKER_URL",
            "amqp://guest:s3cret-pass@127.0.0.1:5672/%2f",
        )
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let (_, err) = text(&out);
    assert!(err.contains("check the URL"), "{err}");
    assert!(!err.contains("s3cret-pass"), "the password leaked: {err}");

    // A password holding a character URLs reserve, unencoded: the parsers fail on the host or
    // port; the message hides the password all the same and says to encode it.
    let _client = setup.client().await; // the exchange and lane the store's command checks
    let id = ferriq::wire::TaskId::random().to_string();
    for (var, url, args) in [
        (
            "FERRIQ_BROKER_URL",
            "amqp://guest:s3cret?pass@127.0.0.1:5672/%2f",
            vec!["queues"],
        ),
        (
            "FERRIQ_STORE_URL",
            "redis://:s3cret#pass@127.0.0.1:6379",
            vec!["task", "status", id.as_str()],
        ),
    ] {
        let out = setup.command(&args).env(var, url).output().unwrap();
        assert_ne!(out.status.code(), Some(0), "{out:?}");
        let (_, err) = text(&out);
        assert!(!err.contains("s3cret"), "the password leaked: {err}");
        assert!(err.contains("percent-encoded"), "{err}");
    }
}

/// Looking at a deployment does not change it: a lane or exchange nobody declared is an error
/// naming it, and no queue is created for it.
#[tokio::test]
async fn a_lane_nobody_declared_is_named_and_not_created() {
    let setup = Setup::new();
    let out = setup.run(&["queues"], None).await;
    assert_eq!(out.status.code(), Some(3), "{out:?}");
    let (_, err) = text(&out);
    assert!(err.contains(&setup.exchange), "{err}");

    let _client = setup.client().await; // declares the exchange and the lane
    let typo = format!("{}.typo", setup.lane);
    let out = setup.run(&["--queues", &typo, "queues"], None).await;
    assert_eq!(out.status.code(), Some(3), "{out:?}");
    let (_, err) = text(&out);
    assert!(err.contains(&typo) && err.contains("--queues"), "{err}");
    let conn = lapin::Connection::connect(&common::amqp_url(), Default::default())
        .await
        .unwrap();
    let channel = conn.create_channel().await.unwrap();
    let passive = lapin::options::QueueDeclareOptions::default().passive();
    let found = channel
        .queue_declare(typo.as_str().into(), passive, Default::default())
        .await;
    assert!(found.is_err(), "the mistyped lane was created");
    // Without lanes named, only the exchange is checked: commands that use no lane work
    // where the default lane does not exist.
    let id = ferriq::wire::TaskId::random().to_string();
    let out = setup
        .command(&["--json", "task", "status", &id])
        .env_remove("FERRIQ_QUEUES")
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    assert!(text(&out).0.contains("\"pending\""), "{out:?}");
    // The declared lane is listed as before.
    let lanes = setup.json(&["queues"]).await;
    assert_eq!(lanes[0]["name"], setup.lane.as_str(), "{lanes}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dead_letters_are_listed_shown_redriven_and_purged_from_the_command_line() {
    let setup = Setup::new();
    let worker = setup
        .worker(&[flaky::NAME, fatal::NAME], |c| {
            c.min_defer = Duration::from_millis(200)
        })
        .await;
    let client = setup.client().await;
    let flaky_handles = client.enqueue_batch((0..5).map(flaky::call)).await.unwrap();
    let fatal_handles = client.enqueue_batch((0..3).map(fatal::call)).await.unwrap();
    common::settle_all(&flaky_handles, WAIT).await;
    common::settle_all(&fatal_handles, WAIT).await;
    setup.wait_parked(8, WAIT).await;

    // `queues --json`.
    let queues = setup.json(&["queues"]).await;
    let q = &queues[0];
    assert_eq!(q["name"], setup.lane.as_str());
    for key in [
        "ready",
        "in_flight",
        "delayed",
        "dead_lettered",
        "consumers",
        "running",
    ] {
        assert!(q[key].is_u64(), "queues[0].{key}: {q}");
    }
    assert_eq!(q["consumers"], 1);

    // `dlq list --json`: every one, with its reason; filtered by reason; paged.
    let all = setup.json(&["dlq", "list"]).await;
    let all = all.as_array().unwrap();
    assert_eq!(all.len(), 8);
    for key in [
        "id",
        "queue",
        "task_id",
        "task_name",
        "reason",
        "attempts",
        "detail",
        "dead_at_ms",
        "age_secs",
    ] {
        assert!(all[0].get(key).is_some(), "dlq list: {key} in {}", all[0]);
    }
    let exhausted = setup
        .json(&["dlq", "list", "--reason", "retries_exhausted"])
        .await;
    assert_eq!(exhausted.as_array().unwrap().len(), 5);
    assert!(exhausted
        .as_array()
        .unwrap()
        .iter()
        .all(|m| m["task_name"] == flaky::NAME));
    let page = setup
        .json(&["dlq", "list", "--offset", "6", "--limit", "5"])
        .await;
    assert_eq!(page.as_array().unwrap().len(), 2);
    // The table for people.
    let out = setup.run(&["dlq", "list"], None).await;
    let (table, _) = text(&out);
    assert!(table.starts_with("ID"), "{table}");
    assert_eq!(table.lines().count(), 9, "{table}");

    // `dlq show`: the arguments.
    let one = &exhausted[0];
    let id = one["id"].as_str().unwrap();
    let shown = setup.json(&["dlq", "show", id]).await;
    assert_eq!(shown["id"], id);
    assert!(shown["message"]["args"].is_array(), "{shown}");
    // By the id of the task it carries, too.
    let by_task = setup
        .json(&["dlq", "show", one["task_id"].as_str().unwrap()])
        .await;
    assert_eq!(by_task["id"], id);
    let out = setup.run(&["dlq", "show", "no-such-letter"], None).await;
    assert_eq!(out.status.code(), Some(3));

    // `dlq redrive`: the prompt says how many; "n" changes nothing (exit 4), "y" redrives.
    HEALED.store(true, Ordering::SeqCst);
    let out = setup
        .run(
            &["dlq", "redrive", "--reason", "retries_exhausted"],
            Some("n\n"),
        )
        .await;
    assert_eq!(out.status.code(), Some(4), "{:?}", text(&out));
    assert!(
        text(&out).1.contains("Redrive 5 dead letter(s)"),
        "{:?}",
        text(&out)
    );
    assert_eq!(setup.dead_count().await, 8, "nothing changed");
    // No answer at all (stdin closed) is a no as well.
    let out = setup
        .run(&["dlq", "redrive", "--reason", "retries_exhausted"], None)
        .await;
    assert_eq!(out.status.code(), Some(4));
    let out = setup
        .run(
            &["--json", "dlq", "redrive", "--reason", "retries_exhausted"],
            Some("y\n"),
        )
        .await;
    assert!(out.status.success(), "{:?}", text(&out));
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["redriven"], 5);
    assert_eq!(report["running"], 0);
    for (i, h) in flaky_handles.iter().enumerate() {
        assert_eq!(
            h.wait(WAIT).await.unwrap(),
            i as u32,
            "redriven and run again"
        );
    }

    // `task status|result`.
    let tid = flaky_handles[2].task_id().to_string();
    let status = setup.json(&["task", "status", &tid]).await;
    assert_eq!(status["status"], "succeeded");
    assert_eq!(status["result"]["return_value"], 2);
    assert_eq!(status["claim"]["state"], "done");
    assert_eq!(status["claim"]["failures"], 0, "a fresh attempt budget");
    let result = setup.json(&["task", "result", &tid]).await;
    assert_eq!(result["return_value"], 2);
    let out = setup.run(&["task", "result", &tid], None).await;
    assert_eq!(text(&out).0.trim(), "2");
    let unknown = ferriq::wire::TaskId::random().to_string();
    let out = setup.run(&["task", "result", &unknown], None).await;
    assert_eq!(out.status.code(), Some(3));
    let failed = fatal_handles[0].task_id().to_string();
    let status = setup.json(&["task", "status", &failed]).await;
    assert_eq!(status["status"], "failed");
    // A failed task's result is shown, and the exit code tells a script it failed.
    let out = setup.run(&["task", "result", &failed], None).await;
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    assert!(text(&out).0.starts_with("error: "), "{out:?}");

    // `dlq reindex`: the store's index rebuilt from the queue's three.
    let reindexed = setup.json(&["dlq", "reindex"]).await;
    assert_eq!(reindexed["indexed"], 3, "{reindexed}");

    // `dlq purge --task` with `--yes`: exactly those.
    let purged = setup
        .json(&["--yes", "dlq", "purge", "--task", fatal::NAME])
        .await;
    assert_eq!(purged["purged"], 3);
    assert_eq!(purged["answered"], 0, "each had its error result already");
    assert_eq!(setup.dead_count().await, 0);

    // `task revoke`: asks first; a finished task has nothing to revoke.
    let pending = ferriq::wire::TaskId::random().to_string();
    let out = setup.run(&["task", "revoke", &pending], Some("no\n")).await;
    assert_eq!(out.status.code(), Some(4));
    let out = setup
        .run(&["--yes", "task", "revoke", &pending], None)
        .await;
    assert!(out.status.success(), "{out:?}");
    assert!(
        text(&out).0.contains("no worker has received it"),
        "{out:?}"
    );
    let revoked = setup.json(&["--yes", "task", "revoke", &pending]).await;
    assert_eq!(revoked["revoked"], false, "revoked already");
    let revoked = setup.json(&["--yes", "task", "revoke", &tid]).await;
    assert_eq!(revoked["revoked"], false);
    let status = setup.json(&["task", "status", &pending]).await;
    assert_eq!(status["status"], "failed", "revoked: {status}");
    assert!(matches!(
        client
            .handle::<u32>(pending.parse().unwrap())
            .wait(Duration::from_secs(1))
            .await,
        Err(WaitError::Failed(_))
    ));
    worker.stop().await;
}

#[tokio::test]
async fn a_reader_that_goes_away_ends_the_command_quietly() {
    let setup = Setup::new();
    let _client = setup.client().await; // declares the lane the command looks at
                                        // The pipe's reading end is closed before the command writes: its first line fails.
    let (reader, writer) = std::io::pipe().unwrap();
    drop(reader);
    let out = setup
        .command(&["queues"])
        .stdout(writer)
        .stderr(std::process::Stdio::piped())
        .output()
        .unwrap();
    let (_, err) = text(&out);
    assert_eq!(out.status.code(), Some(0), "{err}");
    assert!(
        !err.contains("panicked") && !err.contains("Broken pipe"),
        "{err}"
    );
}

#[tokio::test]
async fn a_misspelt_setting_is_named_and_an_id_nobody_knows_is_a_usage_error() {
    let setup = Setup::new();
    let _client = setup.client().await;
    let id = ferriq::wire::TaskId::random().to_string();
    let out = setup
        .command(&["task", "status", &id])
        .env("FERRIQ_RESULT_PREFX", "app")
        .env("FERRIQ_QUEUE", "other")
        .output()
        .unwrap();
    let (stdout, err) = text(&out);
    assert_eq!(out.status.code(), Some(0), "{err}");
    assert!(stdout.contains("pending"), "{stdout}");
    assert!(
        err.contains("FERRIQ_RESULT_PREFX is set but nothing")
            && err.contains("did you mean FERRIQ_RESULT_PREFIX?"),
        "{err}"
    );
    assert!(err.contains("did you mean FERRIQ_QUEUES?"), "{err}");
    // A clean exit prints nothing else.
    assert_eq!(err.lines().count(), 2, "{err}");

    let out = setup
        .command(&["task", "status", "not-an-id"])
        .output()
        .unwrap();
    let (_, err) = text(&out);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("is not a task id"), "{err}");
}

#[tokio::test]
async fn a_typo_lane_is_deleted_and_one_with_messages_only_with_force() {
    let setup = Setup::new();
    let _client = setup.client().await;
    // A process that listed a mistyped lane declared its queues.
    let typo = format!("{}-typo", setup.lane);
    let typo_client = setup.client_with_lanes(&[&setup.lane, &typo]).await;
    typo_client
        .enqueue(flaky::call(1).with_queue(typo.as_str()))
        .await
        .unwrap();
    let refused = setup.run(&["queues", "delete", &typo, "--yes"], None).await;
    let (_, err) = text(&refused);
    assert_eq!(refused.status.code(), Some(1), "{err}");
    assert!(
        err.contains("holds 1 message") && err.contains("--force"),
        "{err}"
    );
    let deleted = setup
        .run(&["queues", "delete", &typo, "--force", "--yes"], None)
        .await;
    let (out, err) = text(&deleted);
    assert!(deleted.status.success(), "{err}");
    assert!(out.contains("1 message"), "{out}");
    let again = setup.run(&["queues", "delete", &typo, "--yes"], None).await;
    assert_eq!(again.status.code(), Some(3), "{}", text(&again).1);
    // An empty one goes without --force.
    let empty = format!("{}-empty", setup.lane);
    let _declares = setup.client_with_lanes(&[&setup.lane, &empty]).await;
    let deleted = setup
        .run(&["queues", "delete", &empty, "--yes"], None)
        .await;
    assert!(deleted.status.success(), "{}", text(&deleted).1);
}
