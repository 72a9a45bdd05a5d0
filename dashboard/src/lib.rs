//! A web page to see and act on a ferriq deployment: its lanes, workers and their runs, a
//! task's state, dead letters (filtered, redriven, purged), schedules and limits.
//!
//! Served by `ferriq dashboard --listen 127.0.0.1:8080` with the command's URLs and
//! `FERRIQ_*` environment, or mounted in an app's own axum server:
//!
//! ```no_run
//! # async fn demo(client: ferriq::Client) {
//! let dashboard = ferriq_dashboard::Dashboard::builder(client)
//!     .base_path("/ops/ferriq")
//!     .allow_actions(true)
//!     // Who may press which button: the app's own auth layer inserts an `Identity`.
//!     .authorize(|access| !access.action || access.identity.as_deref() == Some("oncall"))
//!     .build();
//! let app = axum::Router::new().nest("/ops/ferriq", dashboard.router());
//! let listener = tokio::net::TcpListener::bind("127.0.0.1:3000").await.unwrap();
//! axum::serve(listener, app).await.unwrap();
//! # }
//! ```
//!
//! **Security.** Read-only unless built with [`DashboardBuilder::allow_actions`]. With a
//! [`token`](DashboardBuilder::token), every request needs it (an `Authorization: Bearer`
//! header, or the cookie the login page sets); the command refuses to listen beyond loopback
//! without one. Every action is a POST carrying the page's CSRF token and, when the browser
//! sends one, an `Origin` of this host. Everything shown is escaped (arguments and errors are
//! user data), pages run no inline script (a `Content-Security-Policy` forbids it), and every
//! asset is served from the binary: it works offline. No password or key is shown: URLs are
//! never rendered.
#![warn(missing_docs)]

mod actions;
mod api;
mod assets;
mod charts;
mod html;
mod jobs;
mod pages;
mod security;

use std::fmt;
use std::sync::Arc;

use axum::routing::{get, post};
use axum::Router;
use ferriq::Client;

pub use security::{Access, Identity};

/// Decides whether a request may go on (`true`), given what it asks and who asks it.
pub type Authorize = Arc<dyn Fn(&Access) -> bool + Send + Sync>;

/// The dashboard: build one with [`Dashboard::builder`], serve [`Dashboard::router`].
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// let env = ferriq::testing::TestEnv::new();
/// let dashboard = ferriq_dashboard::Dashboard::builder(env.client.clone()).build();
/// let _router: axum::Router = dashboard.router();
/// # }
/// ```
#[derive(Clone)]
pub struct Dashboard {
    state: Arc<State>,
}

impl fmt::Debug for Dashboard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Dashboard")
            .field("base_path", &self.state.base)
            .field("actions", &self.state.actions)
            .field("token", &self.state.token.as_ref().map(|_| "<redacted>"))
            .finish_non_exhaustive()
    }
}

/// Options of a [`Dashboard`].
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// let env = ferriq::testing::TestEnv::new();
/// let dashboard = ferriq_dashboard::Dashboard::builder(env.client.clone())
///     .allow_actions(true)
///     .token("a long random secret")
///     .build();
/// assert!(format!("{dashboard:?}").contains("<redacted>"));
/// # }
/// ```
pub struct DashboardBuilder {
    client: Client,
    actions: bool,
    token: Option<String>,
    authorize: Option<Authorize>,
    base: String,
}

impl fmt::Debug for DashboardBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DashboardBuilder")
            .field("base_path", &self.base)
            .field("actions", &self.actions)
            .field("token", &self.token.as_ref().map(|_| "<redacted>"))
            .finish_non_exhaustive()
    }
}

impl Dashboard {
    /// A dashboard on `client`'s broker and store: read-only, no token, served at `/`.
    pub fn builder(client: Client) -> DashboardBuilder {
        DashboardBuilder {
            client,
            actions: false,
            token: None,
            authorize: None,
            base: String::new(),
        }
    }

    /// Its routes, to serve or to [`nest`](Router::nest) under the base path.
    pub fn router(&self) -> Router {
        Router::new()
            .route("/", get(pages::overview))
            .route("/workers", get(pages::workers))
            .route("/tasks", get(pages::task))
            .route("/dead", get(pages::dead_letters))
            .route("/schedules", get(pages::schedules))
            .route("/limits", get(pages::limits))
            .route("/login", get(pages::login).post(actions::login))
            .route("/api/overview", get(api::overview))
            .route("/api/workers", get(api::workers))
            .route("/api/jobs", get(api::jobs))
            .route("/api/history", get(api::history))
            .route("/charts/runs.svg", get(charts::runs))
            .route("/charts/durations.svg", get(charts::durations))
            .route("/dead/redrive", post(actions::redrive))
            .route("/dead/purge", post(actions::purge))
            .route("/dead/reindex", post(actions::reindex))
            .route("/schedules/action", post(actions::schedule))
            .route("/assets/{file}", get(assets::serve))
            .layer(axum::middleware::from_fn_with_state(
                self.state.clone(),
                security::guard,
            ))
            .with_state(self.state.clone())
    }
}

impl DashboardBuilder {
    /// Lets the dashboard change things: redrive and purge dead letters, pause, resume,
    /// remove and run schedules. Off by default: the buttons are not shown, and the routes
    /// answer 403.
    pub fn allow_actions(mut self, on: bool) -> Self {
        self.actions = on;
        self
    }

    /// Requires `token` on every request (an `Authorization: Bearer` header, or the cookie
    /// the login page sets). Use a long random secret.
    pub fn token(mut self, token: impl Into<String>) -> Self {
        self.token = Some(token.into());
        self
    }

    /// Asks `hook` before every request, after the token: `false` answers 403. `Access`
    /// names the method, the path (below the base path), whether it is an action, and the
    /// [`Identity`] an app's own auth layer put in the request's extensions.
    pub fn authorize(mut self, hook: impl Fn(&Access) -> bool + Send + Sync + 'static) -> Self {
        self.authorize = Some(Arc::new(hook));
        self
    }

    /// Where the router is mounted (`/ops/ferriq`), so that links and forms point there.
    pub fn base_path(mut self, path: impl Into<String>) -> Self {
        self.base = path.into().trim_end_matches('/').to_owned();
        self
    }

    /// The dashboard.
    pub fn build(self) -> Dashboard {
        Dashboard {
            state: Arc::new(State {
                client: self.client,
                actions: self.actions,
                token: self.token,
                authorize: self.authorize,
                base: self.base,
                // Random per process: a page from another origin cannot read it.
                csrf: uuid::Uuid::new_v4().simple().to_string(),
                jobs: jobs::Jobs::default(),
                history_cache: HistoryCache::default(),
            }),
        }
    }
}

/// What every handler shares.
pub(crate) struct State {
    pub(crate) client: Client,
    pub(crate) actions: bool,
    pub(crate) token: Option<String>,
    pub(crate) authorize: Option<Authorize>,
    pub(crate) base: String,
    pub(crate) csrf: String,
    pub(crate) jobs: jobs::Jobs,
    /// The last history read (from, to, when, minutes): see `charts::history`.
    pub(crate) history_cache: HistoryCache,
}

/// What `charts::history` keeps between the reads of one page.
pub(crate) type HistoryCache = std::sync::Mutex<
    Option<(
        u64,
        u64,
        std::time::Instant,
        Arc<Vec<ferriq::store::MinuteStats>>,
    )>,
>;
