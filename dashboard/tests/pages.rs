//! Pages read at the router: a finished group member's task page names its group and the
//! group's count.

use std::time::Duration;

use axum::body::Body;
use axum::http::{header, Request, StatusCode};
use ferriq::WaitError;
use tower::ServiceExt;

#[ferriq::task(name = "pages.double")]
async fn double(n: u32) -> u32 {
    n * 2
}

#[tokio::test]
async fn a_group_members_page_names_its_group_and_count() {
    let env = ferriq::testing::TestEnv::new();
    let worker = env.spawn_worker(
        env.worker().registry(
            ferriq::Registry::from_inventory()
                .unwrap()
                .only(&[double::NAME])
                .unwrap(),
        ),
    );
    let group = env
        .client
        .enqueue_group(ferriq::workflow::Group::new([
            double::call(1),
            double::call(2),
        ]))
        .await
        .unwrap();
    group.wait_done(Duration::from_secs(10)).await.unwrap();
    let member = group.member(1);
    let router = ferriq_dashboard::Dashboard::builder(env.client.clone())
        .build()
        .router();
    let req = Request::get(format!("/tasks?id={}", member.task_id().as_str()))
        .header(header::HOST, "127.0.0.1:8080")
        .body(Body::empty())
        .unwrap();
    let res = router.oneshot(req).await.unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    let page = axum::body::to_bytes(res.into_body(), 1 << 20)
        .await
        .unwrap();
    let page = String::from_utf8_lossy(&page);
    let expected = format!(
        "member 1 of group {}: 2 of 2 finished, 0 failed",
        group.id().as_str()
    );
    assert!(page.contains(&expected), "{page}");
    worker.stop().await;
}

#[ferriq::task(name = "pages.fails", max_attempts = 1)]
async fn fails(n: u32) -> Result<u32, ferriq::TaskError> {
    Err(ferriq::TaskError::fatal(format!("no {n}")))
}

async fn get_json(router: &axum::Router, path: &str) -> serde_json::Value {
    let req = Request::get(path)
        .header(header::HOST, "127.0.0.1:8080")
        .body(Body::empty())
        .unwrap();
    let res = router.clone().oneshot(req).await.unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    let body = axum::body::to_bytes(res.into_body(), 1 << 20)
        .await
        .unwrap();
    serde_json::from_slice(&body).unwrap()
}

#[tokio::test]
async fn bulk_jobs_are_recorded_in_the_store_and_outlive_their_dashboard() {
    use ferriq::store::OpsStore;
    let env = ferriq::testing::TestEnv::new();
    let worker = env.spawn_worker(
        env.worker().registry(
            ferriq::Registry::from_inventory()
                .unwrap()
                .only(&[fails::NAME])
                .unwrap(),
        ),
    );
    for n in 0..3 {
        let h = env.client.enqueue(fails::call(n)).await.unwrap();
        assert!(
            matches!(
                h.wait(Duration::from_secs(30)).await,
                Err(WaitError::Failed(_))
            ),
            "the task fails (not a wait that timed out)"
        );
    }
    worker.stop().await;
    let first = ferriq_dashboard::Dashboard::builder(env.client.clone())
        .allow_actions(true)
        .build()
        .router();
    let page = {
        let req = Request::get("/dead")
            .header(header::HOST, "127.0.0.1:8080")
            .body(Body::empty())
            .unwrap();
        let res = first.clone().oneshot(req).await.unwrap();
        let body = axum::body::to_bytes(res.into_body(), 1 << 20)
            .await
            .unwrap();
        String::from_utf8_lossy(&body).into_owned()
    };
    let at = page.find("name=\"csrf\" value=\"").unwrap() + 19;
    let csrf = &page[at..at + 32];
    let req = Request::post("/dead/purge")
        .header(header::HOST, "127.0.0.1:8080")
        .header(header::CONTENT_TYPE, "application/x-www-form-urlencoded")
        .body(Body::from(format!("csrf={csrf}&lane=taskiq&scope=filter")))
        .unwrap();
    assert_eq!(
        first.clone().oneshot(req).await.unwrap().status(),
        StatusCode::SEE_OTHER
    );

    // Another dashboard (a restart, a replica) lists it from the store once it ended.
    let second = ferriq_dashboard::Dashboard::builder(env.client.clone())
        .build()
        .router();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(15);
    loop {
        let jobs = get_json(&second, "/api/jobs").await;
        let done = jobs["jobs"]
            .as_array()
            .unwrap()
            .iter()
            .any(|j| j["finished"] == true && j["outcome"] == "3 purged, 0 kept");
        if done {
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "{jobs}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    // A running job whose dashboard stopped recording it shows as interrupted.
    let stale = serde_json::json!({
        "id": "abc", "kind": "redrive", "lane": "taskiq", "seen": 40, "done": 12,
        "finished": false, "outcome": null,
        "started_ms": env.clock.now_unix_ms() - 60_000, "updated_ms": env.clock.now_unix_ms() - 30_000,
    });
    env.store
        .record_job("abc", &stale.to_string(), Duration::from_secs(60))
        .await
        .unwrap();
    let jobs = get_json(&second, "/api/jobs").await;
    let abc = jobs["jobs"]
        .as_array()
        .unwrap()
        .iter()
        .find(|j| j["id"] == "abc")
        .unwrap()
        .clone();
    assert_eq!(abc["finished"], true);
    assert!(
        abc["outcome"].as_str().unwrap().starts_with("interrupted"),
        "{abc}"
    );
    assert_eq!(abc["done"], 12);
}

async fn get_html(router: &axum::Router, path: &str) -> String {
    let req = Request::get(path)
        .header(header::HOST, "127.0.0.1:8080")
        .body(Body::empty())
        .unwrap();
    let res = router.clone().oneshot(req).await.unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    let body = axum::body::to_bytes(res.into_body(), 1 << 22)
        .await
        .unwrap();
    String::from_utf8_lossy(&body).into_owned()
}

/// How many rows the dead letters table shows.
fn rows(page: &str) -> usize {
    let table = &page[page.find("<tbody id=\"dead\">").unwrap()..];
    let table = &table[..table.find("</tbody>").unwrap()];
    table.matches("<code class=\"args\">").count()
}

#[tokio::test]
async fn the_dead_letters_page_lists_from_the_index_and_rebuilds_it() {
    use ferriq::store::OpsStore;
    let env = ferriq::testing::TestEnv::new();
    let worker = env.spawn_worker(
        env.worker().registry(
            ferriq::Registry::from_inventory()
                .unwrap()
                .only(&[fails::NAME])
                .unwrap(),
        ),
    );
    let mut ids = Vec::new();
    for n in 0..60 {
        let h = env.client.enqueue(fails::call(n)).await.unwrap();
        assert!(
            matches!(
                h.wait(Duration::from_secs(30)).await,
                Err(WaitError::Failed(_))
            ),
            "the task fails (not a wait that timed out)"
        );
        ids.push(h.task_id().clone());
    }
    worker.stop().await;
    let router = ferriq_dashboard::Dashboard::builder(env.client.clone())
        .allow_actions(true)
        .build()
        .router();

    // A parked task's page shows where it is parked, and its arguments from the index.
    let task = get_html(&router, &format!("/tasks?id={}", ids[5].as_str())).await;
    assert!(task.contains("<dt>dead letter</dt><dd>parked in"), "{task}");
    assert!(task.contains("<code class=\"args\">[5]</code>"), "{task}");

    // From the index: newest first, 50 a page, the total, nothing to mend.
    let page = get_html(&router, "/dead?lane=taskiq").await;
    assert!(
        page.contains("Listed from the store's index: 60 indexed, 60 in the queue."),
        "{page}"
    );
    assert!(page.contains("1–50 of 60"), "{page}");
    assert_eq!(rows(&page), 50);
    assert!(page.contains("name=\"key\""));
    assert!(!page.contains("id=\"reindex\""), "index and queue agree");
    assert!(
        page.contains("<code class=\"args\">[59]</code>"),
        "newest first"
    );
    let filtered = get_html(&router, "/dead?lane=taskiq&text=no+7").await;
    assert!(filtered.contains("1–1 of 1"), "{filtered}");
    let second = get_html(&router, "/dead?lane=taskiq&offset=50").await;
    assert_eq!(rows(&second), 10);

    // The index lost (a store restarted without it): the page says so and offers both ways.
    env.store.clear_dead_index("taskiq").await.unwrap();
    let page = get_html(&router, "/dead?lane=taskiq").await;
    assert!(page.contains("0 indexed, 60 in the queue"), "{page}");
    assert!(page.contains("id=\"reindex\""));
    assert_eq!(rows(&page), 0);
    let queue = get_html(&router, "/dead?lane=taskiq&source=queue").await;
    assert!(queue.contains("Listed from the broker"), "{queue}");
    assert_eq!(rows(&queue), 50);
    assert!(queue.contains("name=\"id\""));

    // Re-indexed by the button's form: listed from the index again.
    let at = page.find("name=\"csrf\" value=\"").unwrap() + 19;
    let csrf = page[at..at + 32].to_owned();
    let req = Request::post("/dead/reindex")
        .header(header::HOST, "127.0.0.1:8080")
        .header(header::CONTENT_TYPE, "application/x-www-form-urlencoded")
        .body(Body::from(format!("csrf={csrf}&lane=taskiq&scope=lane")))
        .unwrap();
    assert_eq!(
        router.clone().oneshot(req).await.unwrap().status(),
        StatusCode::SEE_OTHER
    );
    let deadline = tokio::time::Instant::now() + Duration::from_secs(15);
    loop {
        let page = get_html(&router, "/dead?lane=taskiq").await;
        if page.contains("60 indexed, 60 in the queue") {
            assert_eq!(rows(&page), 50);
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "{page}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    // A selection from the index purges those letters from the queue.
    let page = get_html(&router, "/dead?lane=taskiq&text=no+3").await;
    let keys: Vec<&str> = page
        .match_indices("name=\"key\" value=\"")
        .map(|(i, m)| &page[i + m.len()..i + m.len() + 32])
        .collect();
    assert!(!keys.is_empty());
    let form = keys
        .iter()
        .fold(format!("csrf={csrf}&lane=taskiq&scope=selected"), |f, k| {
            f + "&key=" + k
        });
    let req = Request::post("/dead/purge")
        .header(header::HOST, "127.0.0.1:8080")
        .header(header::CONTENT_TYPE, "application/x-www-form-urlencoded")
        .body(Body::from(form))
        .unwrap();
    assert_eq!(
        router.clone().oneshot(req).await.unwrap().status(),
        StatusCode::SEE_OTHER
    );
    let left = 60 - keys.len();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(15);
    loop {
        let page = get_html(&router, "/dead?lane=taskiq").await;
        if page.contains(&format!("{left} indexed, {left} in the queue")) {
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "{page}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
