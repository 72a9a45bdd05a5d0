//! `#[task]`: what it generates, and what it refuses at compile time (trybuild).

use std::time::Duration;

use ferriq::testing::TestEnv;
use ferriq::{Registry, State, Task, TaskContext, TaskError};

#[ferriq::task]
async fn default_named(x: u8) -> u8 {
    x
}

#[ferriq::task(
    name = "macros.options",
    max_attempts = 7,
    timeout = 2.5,
    queue = "billing",
    backoff_initial = 0.5,
    backoff_max = 60,
    retry_on_error = false,
    store_result = false,
    deadline = 90
)]
async fn with_options() {}

type AppResult<T> = Result<T, TaskError>;

/// A parameter called `client` does not clash with `kiq`'s client parameter.
#[ferriq::task(name = "macros.alias")]
async fn aliased(client: String, ctx: TaskContext) -> AppResult<String> {
    Ok(format!("{client}@{}", ctx.attempt()))
}

struct Prefix(String);

#[ferriq::task(name = "macros.state")]
async fn prefixed(prefix: State<Prefix>, word: String) -> String {
    format!("{}{word}", prefix.0)
}

#[test]
fn names_and_options_are_generated() {
    assert_eq!(
        default_named::NAME,
        concat!(module_path!(), ":default_named")
    );
    assert_eq!(<with_options as Task>::NAME, "macros.options");
    let o = with_options::OPTIONS;
    assert_eq!(o.get_max_attempts(), 7);
    assert_eq!(o.get_timeout(), Some(Duration::from_millis(2500)));
    assert_eq!(o.get_queue(), Some("billing"));
    assert_eq!(o.get_backoff_initial(), Duration::from_millis(500));
    assert_eq!(o.get_backoff_max(), Duration::from_secs(60));
    assert!(!o.get_retry_on_error() && !o.get_store_result());
    // Options become labels any taskiq worker understands.
    let msg = with_options::call().into_message().unwrap();
    assert_eq!(msg.labels.timeout(), Some(Duration::from_millis(2500)));
    assert_eq!(msg.labels.queue_name(), Some("billing"));
    // The task's deadline, counted from now (no delay): it must start within 90 s.
    assert_eq!(o.get_deadline(), Some(Duration::from_secs(90)));
    let left = msg.labels.deadline_at().unwrap() - ferriq::clock::Clock::system().now_unix();
    assert!((89.0..=91.0).contains(&left), "{left}");
    // A task without one has none: it waits for a worker as long as it takes.
    let plain = default_named::call(1).into_message().unwrap();
    assert_eq!(plain.labels.deadline_at(), None);
}

#[tokio::test]
async fn tasks_stay_callable_directly() {
    assert_eq!(default_named(4).await, 4);
    let ctx = TaskContext::builder("t-1").attempt(2).build().unwrap();
    assert_eq!(aliased("ann".into(), ctx).await.unwrap(), "ann@2");
    assert_eq!(
        prefixed(State::new(Prefix("re".into())), "do".into()).await,
        "redo"
    );
}

#[tokio::test]
async fn context_state_and_result_aliases_work_on_a_worker() {
    let env = TestEnv::new();
    let registry = Registry::from_inventory()
        .unwrap()
        .only(&[aliased::NAME, prefixed::NAME])
        .unwrap();
    let w = env.spawn_worker(env.worker().registry(registry).state(Prefix("pre-".into())));
    let a = aliased::kiq(&env.client, "bob".into()).await.unwrap();
    let p = prefixed::kiq(&env.client, "fix".into()).await.unwrap();
    assert_eq!(a.wait(Duration::from_secs(10)).await.unwrap(), "bob@1");
    assert_eq!(p.wait(Duration::from_secs(10)).await.unwrap(), "pre-fix");
    w.stop().await;
}

#[ferriq::task(name = "macros.private", inventory = false)]
async fn kept_out_of_the_inventory(x: u8) -> u8 {
    x + 1
}

/// `inventory = false`: the task is in no registry built from the inventory, and runs once it
/// is added by hand.
#[tokio::test]
async fn a_task_kept_out_of_the_inventory_runs_when_added_by_hand() {
    let everything = Registry::from_inventory().unwrap();
    assert!(everything.get(kept_out_of_the_inventory::NAME).is_none());
    assert!(everything.get(aliased::NAME).is_some());
    let env = TestEnv::new();
    let registry =
        Registry::from_registrations([kept_out_of_the_inventory::registration()]).unwrap();
    let w = env.spawn_worker(env.worker().registry(registry));
    let h = kept_out_of_the_inventory::kiq(&env.client, 41)
        .await
        .unwrap();
    assert_eq!(h.wait(Duration::from_secs(10)).await.unwrap(), 42);
    w.stop().await;
}

#[ferriq::task(name = "macros.unstored", store_result = false)]
async fn unstored() -> u8 {
    1
}

/// A task that stores no result reads as finished, and a wait for it says why no value comes
/// instead of "may still be running".
#[tokio::test]
async fn a_task_without_a_stored_result_reads_as_finished_and_its_wait_says_so() {
    use ferriq::{TaskStatus, WaitError};
    let env = TestEnv::new();
    let registry = Registry::from_inventory()
        .unwrap()
        .only(&[unstored::NAME])
        .unwrap();
    let w = env.spawn_worker(env.worker().registry(registry));
    let handle = unstored::kiq(&env.client).await.unwrap();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        match handle.status().await.unwrap() {
            TaskStatus::FinishedWithoutResult => break,
            other => assert!(
                tokio::time::Instant::now() < deadline,
                "still {other:?} after 10 s"
            ),
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    match handle.wait(Duration::from_millis(20)).await {
        Err(e @ WaitError::NoResult { .. }) => {
            assert!(e.to_string().contains("store_result = false"), "{e}")
        }
        other => panic!("{other:?}"),
    }
    w.stop().await;
}

#[test]
fn a_worker_refuses_to_start_without_the_state_its_tasks_take() {
    let env = TestEnv::new();
    let registry = Registry::from_inventory()
        .unwrap()
        .only(&[prefixed::NAME])
        .unwrap();
    let err = env
        .worker()
        .registry(registry)
        .build()
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("macros.state") && err.contains("Prefix"),
        "{err}"
    );
}

#[test]
fn bad_uses_are_compile_errors() {
    let t = trybuild::TestCases::new();
    t.compile_fail("tests/ui/*.rs");
}
