//! The built `ferriq` binary's schedule and limit commands end to end, against the real
//! RabbitMQ and Redis.

mod common;

use common::{text, Setup};

#[tokio::test]
async fn schedules_are_added_listed_paused_resumed_and_removed_from_the_command_line() {
    let setup = Setup::new();
    let _client = setup.client().await;
    let bad = setup
        .run(
            &[
                "schedules",
                "add",
                "bad",
                "--task",
                "x",
                "--cron",
                "every monday",
            ],
            None,
        )
        .await;
    assert_eq!(bad.status.code(), Some(2), "{}", text(&bad).1);
    let added = setup
        .run(
            &[
                "schedules",
                "add",
                "nightly",
                "--task",
                "reports.nightly",
                "--cron",
                "0 0 2 * * *",
                "--timezone",
                "Europe/Berlin",
                "--args",
                r#"["acme"]"#,
            ],
            None,
        )
        .await;
    assert!(added.status.success(), "{}", text(&added).1);
    let listed = setup.json(&["schedules", "list"]).await;
    let nightly = listed
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["id"] == "nightly")
        .expect("listed");
    assert_eq!(nightly["paused"], false);
    assert_eq!(nightly["timing"], "cron 0 0 2 * * * (Europe/Berlin)");
    assert!(nightly["next_run"].as_i64().is_some());

    assert!(setup
        .run(&["schedules", "pause", "nightly"], None)
        .await
        .status
        .success());
    let listed = setup.json(&["schedules", "list"]).await;
    assert_eq!(listed[0]["paused"], true, "{listed}");
    let (table, _) = text(&setup.run(&["schedules", "list"], None).await);
    assert!(
        table.contains("paused") && table.contains("run-time"),
        "{table}"
    );
    assert!(setup
        .run(&["schedules", "resume", "nightly"], None)
        .await
        .status
        .success());
    assert_eq!(setup.json(&["schedules", "list"]).await[0]["paused"], false);
    assert_eq!(
        setup
            .run(&["schedules", "pause", "nope"], None)
            .await
            .status
            .code(),
        Some(3)
    );
    assert!(setup
        .run(&["schedules", "remove", "nightly"], None)
        .await
        .status
        .success());
    assert_eq!(
        setup
            .run(&["schedules", "remove", "nightly"], None)
            .await
            .status
            .code(),
        Some(3)
    );
}

#[tokio::test]
async fn limits_are_listed_set_and_reset_from_the_command_line() {
    use ferriq::store::{LimiterKind, LimiterSeen};
    let setup = Setup::new();
    let client = setup.client().await;
    // Mistakes are found before connecting.
    for args in [
        &["limits", "set", "api.call"][..],
        &["limits", "set", "api.call", "--rate", "fast"],
        &["limits", "set", "api.call", "--concurrency", "0"],
    ] {
        let out = setup.run(args, None).await;
        assert_eq!(out.status.code(), Some(2), "{args:?}: {:?}", text(&out));
    }
    let out = setup
        .run(
            &[
                "limits", "set", "api.call", "--key", "acme", "--rate", "20/s",
            ],
            None,
        )
        .await;
    assert!(out.status.success(), "{:?}", text(&out));
    assert!(text(&out).0.contains("within 2 s"), "{:?}", text(&out));
    // A worker used the key's limiter (workers note them every 2 s).
    client
        .store()
        .note_limiters(&[LimiterSeen {
            kind: LimiterKind::Rate,
            limiter: "api.call\nacme".into(),
            limit: "20/s".into(),
        }])
        .await
        .unwrap();
    let listed = setup.json(&["limits"]).await;
    assert_eq!(listed["overrides"][0]["rate"], "20/s", "{listed}");
    assert_eq!(listed["overrides"][0]["key"], "acme", "{listed}");
    let limiter = &listed["limiters"][0];
    assert_eq!(
        (&limiter["task"], &limiter["key"], &limiter["overridden"]),
        (&"api.call".into(), &"acme".into(), &true.into()),
        "{listed}"
    );
    let (table, _) = text(&setup.run(&["limits", "list"], None).await);
    assert!(table.contains("20/s (set)"), "{table}");
    let reset = ["limits", "reset", "api.call", "--key", "acme"];
    assert!(setup.run(&reset, None).await.status.success());
    assert_eq!(setup.run(&reset, None).await.status.code(), Some(3));
}
