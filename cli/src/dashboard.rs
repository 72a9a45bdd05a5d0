//! `ferriq dashboard`: the web page, served until Ctrl-C or SIGTERM.

use std::net::SocketAddr;

use ferriq::Client;

use crate::output::errln;
use crate::Failure;

/// The token's variable.
const TOKEN_VAR: &str = "FERRIQ_DASHBOARD_TOKEN";

/// The token from the environment (an empty one is none).
fn token() -> Option<String> {
    std::env::var(TOKEN_VAR)
        .ok()
        .filter(|t| !t.trim().is_empty())
}

/// Beyond loopback, a token is required: the page shows arguments and errors (user data).
pub(crate) fn check_usage(listen: SocketAddr) -> Result<(), Failure> {
    if !listen.ip().is_loopback() && token().is_none() {
        return Err(Failure::Usage(format!(
            "refusing to serve {listen} without a token: set {TOKEN_VAR} to a long random secret \
             (or listen on 127.0.0.1)"
        )));
    }
    Ok(())
}

pub(crate) async fn serve(
    client: &Client,
    listen: SocketAddr,
    allow_actions: bool,
) -> Result<(), Failure> {
    let mut builder =
        ferriq_dashboard::Dashboard::builder(client.clone()).allow_actions(allow_actions);
    if let Some(t) = token() {
        builder = builder.token(t);
    }
    let dashboard = builder.build();
    let listener = tokio::net::TcpListener::bind(listen)
        .await
        .map_err(|e| Failure::Failed(format!("cannot listen on {listen}: {e}")))?;
    let at = listener.local_addr().unwrap_or(listen);
    errln!(
        "dashboard on http://{at}/ ({}{})",
        if allow_actions {
            "actions allowed"
        } else {
            "read-only"
        },
        if token().is_some() {
            ", token required"
        } else {
            ""
        }
    );
    let stop = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let stop = async {
        let mut term =
            tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).ok();
        tokio::select! {
            _ = stop => {}
            _ = async { match term.as_mut() { Some(t) => { t.recv().await; } None => std::future::pending().await } } => {}
        }
    };
    axum::serve(listener, dashboard.router())
        .with_graceful_shutdown(stop)
        .await
        .map_err(|e| Failure::Failed(format!("the dashboard stopped: {e}")))
}
