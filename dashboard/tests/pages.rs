//! Pages read at the router: a finished group member's task page names its group and the
//! group's count.

use std::time::Duration;

use axum::body::Body;
use axum::http::{header, Request, StatusCode};
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
