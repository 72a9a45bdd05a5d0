//! The dashboard in a real browser (Debian's headless `chromium`, driven over the DevTools
//! protocol): every page renders with no console error, exception or dialog; an argument
//! `<script>alert(1)</script>` shows as text; a filter is typed; a dead letter redriven by
//! clicking runs and succeeds. Screenshots of every page go to
//! `target/dashboard-screenshots/` for people to look at.

mod cdp;

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use ferriq::client::TaskStatus;
use ferriq::schedule::ScheduleSpec;

static FAILING: AtomicBool = AtomicBool::new(true);
static RELEASED: AtomicBool = AtomicBool::new(false);

/// Runs until the test releases it (bounded: a minute).
#[ferriq::task(name = "dash.slow")]
async fn slow() -> u32 {
    for _ in 0..3000 {
        if RELEASED.load(Ordering::SeqCst) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    1
}

#[ferriq::task(name = "dash.flaky", max_attempts = 1)]
async fn flaky(text: String) -> Result<String, ferriq::TaskError> {
    if FAILING.load(Ordering::SeqCst) {
        return Err(ferriq::TaskError::fatal(format!("failed on {text}")));
    }
    Ok(text)
}

fn screenshots() -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target/dashboard-screenshots");
    std::fs::create_dir_all(&dir).expect("the screenshots folder");
    dir
}

/// Bounded polling: `check` true within 15 s.
async fn eventually<F: std::future::Future<Output = bool>>(what: &str, check: impl Fn() -> F) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(15);
    while !check().await {
        assert!(
            tokio::time::Instant::now() < deadline,
            "not within 15 s: {what}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_page_renders_and_a_dead_letter_is_redriven_by_clicking() {
    let env = ferriq::testing::TestEnv::new();
    // A short lease: the worker reports its runs every third of it, and the workers page
    // must show the running task well within a wait's 15 s (the default 30 s lease reports
    // every 10 s).
    let worker = env.spawn_worker(
        env.worker()
            .registry(
                ferriq::Registry::from_inventory()
                    .unwrap()
                    .only(&[flaky::NAME, slow::NAME])
                    .unwrap(),
            )
            .lease(Duration::from_secs(3)),
    );
    let script = "<script>alert(1)</script>";
    let hostile = env
        .client
        .enqueue(flaky::call(script.into()))
        .await
        .unwrap();
    let plain = env
        .client
        .enqueue(flaky::call("plain".into()))
        .await
        .unwrap();
    let ops = env.client.ops();
    eventually("both tasks parked", || async {
        ops.dead_letters("taskiq", 0, 10)
            .await
            .is_ok_and(|d| d.len() == 2)
    })
    .await;
    env.client
        .schedules()
        .add(ScheduleSpec::every("nightly-<b>", flaky::NAME, 3600).with_args(vec!["x".into()]))
        .await
        .unwrap();

    let dashboard = ferriq_dashboard::Dashboard::builder(env.client.clone())
        .allow_actions(true)
        .build();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, dashboard.router()).await });

    let running = env.client.enqueue(slow::call()).await.unwrap();
    let mut b = cdp::Browser::start().await;
    let shots = screenshots();
    let pages = [
        ("overview", "/".to_owned(), "#lanes"),
        ("workers", "/workers".to_owned(), "#workers"),
        (
            "task",
            format!("/tasks?id={}", hostile.task_id().as_str()),
            "dl.task",
        ),
        ("dead-letters", "/dead".to_owned(), "#dead"),
        ("schedules", "/schedules".to_owned(), "#schedules"),
        ("limits", "/limits".to_owned(), "#limits"),
    ];
    for (name, path, selector) in &pages {
        b.open(&format!("{base}{path}")).await;
        b.wait_for(&format!("document.querySelector({selector:?})"))
            .await;
        if *name == "overview" || *name == "workers" {
            // The script polled once and rewrote the table without error (the page comes
            // with "live: updated every 2 s"; a poll writes the time, a failed one says
            // "not updated: …").
            b.wait_for(
                "document.querySelector('[data-live]').textContent.startsWith('live: updated ') \
                 && !document.querySelector('[data-live]').textContent.includes('every 2 s')",
            )
            .await;
        }
        if *name == "workers" {
            b.wait_for("document.querySelector('#runs').textContent.includes('dash.slow')")
                .await;
        }
        b.screenshot(&shots.join(format!("{name}.png"))).await;
        let problems = b.take_problems();
        assert!(problems.is_empty(), "{name}: {problems:?}");
    }

    RELEASED.store(true, Ordering::SeqCst);
    assert_eq!(running.wait(Duration::from_secs(10)).await.unwrap(), 1);

    // The overview lists the lane with its two dead letters (live data, not the first render).
    b.open(&format!("{base}/")).await;
    b.wait_for("[...document.querySelectorAll('#lanes tr')].some(r => r.cells[0].textContent === 'taskiq' && r.cells[4].textContent === '2')").await;

    // The history the worker adds every 10 s: both failures, charted and listed.
    let minute = env.clock.now_unix_ms() / 60_000;
    eventually("the worker's history reached the store", || async {
        use ferriq::store::OpsStore;
        env.store
            .history(minute - 2, minute + 1)
            .await
            .unwrap()
            .iter()
            .map(|m| m.failed)
            .sum::<u64>()
            == 2
    })
    .await;
    b.open(&format!("{base}/?hours=1")).await;
    b.wait_for("[...document.querySelectorAll('.charts img')].every(i => i.complete && i.naturalWidth > 0)").await;
    b.wait_for("[...document.querySelectorAll('#history tr')].some(r => r.cells[0].textContent === 'dash.flaky' && r.cells[3].textContent === '2')").await;
    b.screenshot(&shots.join("overview-history.png")).await;

    // The hostile argument is text, on the dead letters page and nowhere a script.
    b.open(&format!("{base}/dead")).await;
    let shown = b
        .eval("[...document.querySelectorAll('code.args')].map(c => c.textContent).join('|')")
        .await;
    assert!(
        shown.as_str().unwrap().contains(script),
        "the argument is shown as text: {shown}"
    );
    assert_eq!(
        b.eval("document.querySelectorAll('script').length").await,
        1,
        "only the dashboard's own script"
    );
    assert_eq!(
        b.eval("document.querySelector('#schedules, td b')").await,
        serde_json::Value::Null
    );

    // A filter typed: the error text of one of them.
    b.type_into("input[name=text]", "on plain").await;
    b.click_and_wait("#filters button").await;
    assert_eq!(
        b.eval("document.querySelectorAll('#dead tr').length").await,
        1
    );
    assert!(b
        .eval("document.querySelector('#dead').textContent")
        .await
        .as_str()
        .unwrap()
        .contains("failed on plain"));
    b.screenshot(&shots.join("dead-letters-filtered.png")).await;

    // Redriven by clicking, now that the task works: it runs and succeeds.
    FAILING.store(false, Ordering::SeqCst);
    b.eval("document.querySelector('#dead input[type=checkbox]').click()")
        .await;
    b.click_and_wait("#redrive-selected").await;
    b.wait_for("document.querySelector('#jobs .job[data-finished=true]')")
        .await;
    let job = b.eval("document.querySelector('#jobs').textContent").await;
    assert!(
        job.as_str().unwrap().contains("1 redriven"),
        "the job's report: {job}"
    );
    eventually("the redriven task succeeded", || async {
        matches!(plain.status().await, Ok(TaskStatus::Succeeded))
    })
    .await;
    assert_eq!(ops.dead_letters("taskiq", 0, 10).await.unwrap().len(), 1);
    b.screenshot(&shots.join("dead-letters-redriven.png")).await;

    // Finished tasks searched by name and outcome (the index the worker adds with history).
    b.open(&format!("{base}/tasks")).await;
    b.type_into("#search input[name=name]", flaky::NAME).await;
    b.eval("document.querySelector('#search select[name=outcome]').value = 'failed'")
        .await;
    b.click_and_wait("#search button").await;
    assert_eq!(
        b.eval("document.querySelectorAll('#found tr').length")
            .await,
        2,
        "both failures found"
    );
    assert!(b
        .eval("document.querySelector('#found').textContent")
        .await
        .as_str()
        .unwrap()
        .contains(hostile.task_id().as_str()));
    b.screenshot(&shots.join("tasks-search.png")).await;

    // A schedule's name is user data too: shown as text.
    b.open(&format!("{base}/schedules")).await;
    assert!(b
        .eval("document.querySelector('#schedules').textContent")
        .await
        .as_str()
        .unwrap()
        .contains("nightly-<b>"));
    let problems = b.take_problems();
    assert!(problems.is_empty(), "{problems:?}");
    worker.stop().await;
}
