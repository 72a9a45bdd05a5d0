//! Who may see and do what, at the router: read-only by default, the token and its login
//! cookie, the authorize hook with the app's identity, and the CSRF and origin checks.

use axum::body::Body;
use axum::http::{header, Request, StatusCode};
use axum::Router;
use tower::ServiceExt;

/// Requests name this host: loopback, which a dashboard without a token requires.
const HOST: &str = "127.0.0.1:8080";

fn get(path: &str) -> Request<Body> {
    Request::get(path)
        .header(header::HOST, HOST)
        .body(Body::empty())
        .unwrap()
}

fn post(path: &str, form: &str) -> Request<Body> {
    Request::post(path)
        .header(header::HOST, HOST)
        .header(header::CONTENT_TYPE, "application/x-www-form-urlencoded")
        .body(Body::from(form.to_owned()))
        .unwrap()
}

async fn send(router: &Router, req: Request<Body>) -> (StatusCode, axum::http::HeaderMap, String) {
    let res = router.clone().oneshot(req).await.unwrap();
    let (parts, body) = res.into_parts();
    let bytes = axum::body::to_bytes(body, 1 << 20).await.unwrap();
    (
        parts.status,
        parts.headers,
        String::from_utf8_lossy(&bytes).into_owned(),
    )
}

/// The CSRF token a page carries.
fn csrf_of(page: &str) -> String {
    let at = page.find("name=\"csrf\" value=\"").expect("a CSRF field") + 19;
    page[at..at + 32].to_owned()
}

#[tokio::test]
async fn read_only_by_default_and_every_answer_carries_the_headers() {
    let env = ferriq::testing::TestEnv::new();
    let router = ferriq_dashboard::Dashboard::builder(env.client.clone())
        .build()
        .router();
    let (status, headers, page) = send(&router, get("/dead")).await;
    assert_eq!(status, StatusCode::OK);
    assert!(!page.contains("Redrive"), "no buttons when read-only");
    let csp = headers[header::CONTENT_SECURITY_POLICY].to_str().unwrap();
    assert!(csp.contains("script-src 'self'") && csp.contains("frame-ancestors 'none'"));
    let (status, _, body) = send(&router, post("/dead/redrive", "lane=taskiq&scope=filter")).await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    assert!(body.contains("--allow-actions"), "{body}");
    // Without a token, another name (a DNS-rebinding page's) is not served.
    let mut rebound = get("/");
    rebound
        .headers_mut()
        .insert(header::HOST, "evil.test:8080".parse().unwrap());
    assert_eq!(
        send(&router, rebound).await.0,
        StatusCode::MISDIRECTED_REQUEST
    );
}

#[tokio::test]
async fn a_token_is_asked_for_and_the_login_sets_a_strict_cookie() {
    let env = ferriq::testing::TestEnv::new();
    let router = ferriq_dashboard::Dashboard::builder(env.client.clone())
        .token("a long+random/secret=")
        .build()
        .router();
    let (status, headers, _) = send(&router, get("/")).await;
    assert_eq!(status, StatusCode::SEE_OTHER);
    assert_eq!(headers[header::LOCATION], "/login");
    assert_eq!(
        send(&router, get("/api/overview")).await.0,
        StatusCode::UNAUTHORIZED
    );
    let mut with_bearer = get("/");
    with_bearer.headers_mut().insert(
        header::AUTHORIZATION,
        "Bearer a long+random/secret=".parse().unwrap(),
    );
    assert_eq!(send(&router, with_bearer).await.0, StatusCode::OK);

    let (status, _, login) = send(&router, get("/login")).await;
    assert_eq!(status, StatusCode::OK);
    let csrf = csrf_of(&login);
    let wrong = send(&router, post("/login", &format!("csrf={csrf}&token=nope"))).await;
    assert_eq!(wrong.0, StatusCode::UNAUTHORIZED);
    // Any token works through the login, whatever its characters (the form encodes them,
    // and so does the cookie).
    let (status, headers, _) = send(
        &router,
        post(
            "/login",
            &format!("csrf={csrf}&token=a+long%2Brandom%2Fsecret%3D"),
        ),
    )
    .await;
    assert_eq!(status, StatusCode::SEE_OTHER);
    let cookie = headers[header::SET_COOKIE].to_str().unwrap();
    assert!(
        cookie.contains("HttpOnly") && cookie.contains("SameSite=Strict"),
        "{cookie}"
    );
    let mut with_cookie = get("/workers");
    with_cookie.headers_mut().insert(
        header::COOKIE,
        cookie.split(';').next().unwrap().parse().unwrap(),
    );
    assert_eq!(send(&router, with_cookie).await.0, StatusCode::OK);
}

#[tokio::test]
async fn actions_need_the_csrf_token_the_same_origin_and_the_hook() {
    let env = ferriq::testing::TestEnv::new();
    env.client
        .schedules()
        .add(ferriq::schedule::ScheduleSpec::every(
            "nightly",
            "some.task",
            3600,
        ))
        .await
        .unwrap();
    let router = ferriq_dashboard::Dashboard::builder(env.client.clone())
        .allow_actions(true)
        .authorize(|a| !a.action || a.identity.as_deref() == Some("oncall"))
        .build()
        .router();
    let (_, _, page) = send(&router, get("/schedules")).await;
    let csrf = csrf_of(&page);
    let form = format!("csrf={csrf}&id=nightly&action=pause");
    let as_oncall = |mut r: Request<Body>| {
        r.extensions_mut()
            .insert(ferriq_dashboard::Identity("oncall".into()));
        r
    };
    // No identity: the hook says no.
    assert_eq!(
        send(&router, post("/schedules/action", &form)).await.0,
        StatusCode::FORBIDDEN
    );
    // A stale or forged form.
    let (status, _, body) = send(
        &router,
        as_oncall(post(
            "/schedules/action",
            "csrf=forged&id=nightly&action=pause",
        )),
    )
    .await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    assert!(body.contains("not from this dashboard"), "{body}");
    // From another site's page.
    let mut cross = as_oncall(post("/schedules/action", &form));
    cross
        .headers_mut()
        .insert("sec-fetch-site", "cross-site".parse().unwrap());
    assert_eq!(send(&router, cross).await.0, StatusCode::FORBIDDEN);
    let mut other_origin = as_oncall(post("/schedules/action", &form));
    other_origin
        .headers_mut()
        .insert(header::ORIGIN, "https://evil.test".parse().unwrap());
    assert_eq!(send(&router, other_origin).await.0, StatusCode::FORBIDDEN);
    let listed = env.client.schedules().list().await.unwrap();
    assert!(!listed[0].paused, "nothing refused went through");
    // The real thing goes through.
    let (status, _, body) = send(&router, as_oncall(post("/schedules/action", &form))).await;
    assert_eq!(status, StatusCode::SEE_OTHER, "{body}");
    let listed = env.client.schedules().list().await.unwrap();
    assert!(listed[0].paused);
}
