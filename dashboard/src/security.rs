//! Who may see and do what: the token, the app's authorize hook, same-origin checks on
//! actions, and the headers every answer carries.

use std::sync::Arc;

use axum::extract::{Request, State as Shared};
use axum::http::{header, HeaderMap, HeaderValue, Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Redirect, Response};

use crate::State;

/// The cookie the login page sets.
pub(crate) const COOKIE: &str = "ferriq_dashboard";

/// Who is asking, as the embedding app's own auth layer established it: insert one into the
/// request's extensions before the dashboard's router, and the [authorize
/// hook](crate::DashboardBuilder::authorize) sees it.
///
/// ```
/// let who = ferriq_dashboard::Identity("oncall@example.com".into());
/// assert_eq!(who.0, "oncall@example.com");
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Identity(pub String);

/// One request, as the authorize hook sees it.
///
/// ```
/// let hook = |a: &ferriq_dashboard::Access| !a.action || a.identity.is_some();
/// # let _ = hook;
/// ```
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct Access {
    /// `GET`, `POST`.
    pub method: String,
    /// The path below the base path (`/dead/redrive`).
    pub path: String,
    /// It changes something (a redrive, a purge, a schedule's state).
    pub action: bool,
    /// Who, when the app said.
    pub identity: Option<String>,
}

/// Equal in time independent of where they differ (a token compared byte by byte leaks
/// its prefix through timing).
pub(crate) fn same(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |d, (x, y)| d | (x ^ y)) == 0
}

/// The token a request carries (header, else cookie; the cookie holds it percent-encoded).
fn presented(headers: &HeaderMap) -> Option<String> {
    if let Some(v) = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
    {
        if let Some((scheme, t)) = v.split_once(' ') {
            if scheme.eq_ignore_ascii_case("bearer") {
                return Some(t.trim().to_owned());
            }
        }
    }
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|c| c.trim().split_once('='))
        .find(|(k, _)| *k == COOKIE)
        .map(|(_, v)| {
            form_urlencoded::parse(format!("v={v}").as_bytes())
                .next()
                .map_or_else(String::new, |(_, d)| d.into_owned())
        })
}

/// The host a request names (`Host`, else the URI's authority, as HTTP/2 sends it).
fn host_of<B>(req: &axum::http::Request<B>) -> Option<String> {
    req.headers()
        .get(header::HOST)
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned)
        .or_else(|| req.uri().authority().map(|a| a.to_string()))
}

/// Whether `host` (with its port) names this machine's loopback. Without a token or a hook,
/// only such requests are served: a hostile site whose name is re-pointed at 127.0.0.1 (DNS
/// rebinding) would otherwise be "same origin" with the dashboard.
fn loopback_host(host: &str) -> bool {
    let name = match host.strip_prefix('[') {
        Some(rest) => rest.split(']').next().unwrap_or(""),
        None => host.rsplit_once(':').map_or(host, |(h, _)| h),
    };
    name.eq_ignore_ascii_case("localhost")
        || name
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

/// Whether the request comes from a page of this host (or says nothing: a script's request,
/// which the form's CSRF token still guards). A browser's `Sec-Fetch-Site` decides when sent;
/// else its `Origin` must name `host`.
fn same_origin(headers: &HeaderMap, host: &str) -> bool {
    let text = |name: header::HeaderName| headers.get(name).and_then(|v| v.to_str().ok());
    if let Some(site) = text(header::HeaderName::from_static("sec-fetch-site")) {
        return site == "same-origin" || site == "none";
    }
    let Some(origin) = text(header::ORIGIN) else {
        return true;
    };
    let origin_host = origin.split_once("://").map_or(origin, |(_, h)| h);
    !host.is_empty() && origin_host == host
}

/// Whether `token` opens this dashboard.
pub(crate) fn token_ok(state: &State, token: &str) -> bool {
    state
        .token
        .as_deref()
        .is_none_or(|t| same(t.as_bytes(), token.as_bytes()))
}

/// Before every route: the token, the hook, same origin for actions; after: the headers.
pub(crate) async fn guard(Shared(state): Shared<Arc<State>>, req: Request, next: Next) -> Response {
    let path = req.uri().path().to_owned();
    let open = path.starts_with("/assets/") || path == "/login";
    let action = req.method() == Method::POST && path != "/login";
    let host = host_of(&req).unwrap_or_default();
    let mut answer = if state.token.is_none() && state.authorize.is_none() && !loopback_host(&host)
    {
        (
            StatusCode::MISDIRECTED_REQUEST,
            "this dashboard has no token: it answers requests for localhost only (give it a \
             token to serve other names)\n",
        )
            .into_response()
    } else if !open
        && state.token.is_some()
        && !presented(req.headers()).is_some_and(|t| token_ok(&state, &t))
    {
        if req.method() == Method::GET && !path.starts_with("/api/") {
            Redirect::to(&format!("{}/login", state.base)).into_response()
        } else {
            (StatusCode::UNAUTHORIZED, "a token is required\n").into_response()
        }
    } else if req.method() == Method::POST && !same_origin(req.headers(), &host) {
        (
            StatusCode::FORBIDDEN,
            "refused: the request did not come from this dashboard's own pages\n",
        )
            .into_response()
    } else if action && !state.actions {
        (
            StatusCode::FORBIDDEN,
            "this dashboard is read-only: start it with actions allowed (ferriq dashboard --allow-actions)\n",
        )
            .into_response()
    } else {
        let access = Access {
            method: req.method().to_string(),
            path: path.clone(),
            action,
            identity: req.extensions().get::<Identity>().map(|i| i.0.clone()),
        };
        if state.authorize.as_ref().is_some_and(|hook| !hook(&access)) {
            (StatusCode::FORBIDDEN, "not allowed\n").into_response()
        } else {
            next.run(req).await
        }
    };
    let headers = answer.headers_mut();
    headers.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(
            "default-src 'self'; img-src 'self' data:; style-src 'self'; script-src 'self'; \
             connect-src 'self'; frame-ancestors 'none'; form-action 'self'; base-uri 'none'",
        ),
    );
    headers.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    headers.insert(
        header::REFERRER_POLICY,
        // Not `no-referrer`: with it a browser sends `Origin: null` on a form's POST.
        HeaderValue::from_static("same-origin"),
    );
    headers.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    if !path.starts_with("/assets/") {
        headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    }
    answer
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_loopback_names_without_a_token() {
        for ok in [
            "127.0.0.1:8080",
            "localhost:80",
            "LOCALHOST",
            "[::1]:9000",
            "127.0.0.2",
        ] {
            assert!(loopback_host(ok), "{ok}");
        }
        for no in ["evil.test:8080", "10.0.0.1", "", "localhost.evil.test"] {
            assert!(!loopback_host(no), "{no}");
        }
    }

    #[test]
    fn the_origin_must_be_this_host() {
        let check = |h: &HeaderMap| same_origin(h, "127.0.0.1:8080");
        let mut h = HeaderMap::new();
        assert!(check(&h), "no Origin: a script, not a browser page");
        h.insert(
            header::ORIGIN,
            HeaderValue::from_static("http://127.0.0.1:8080"),
        );
        assert!(check(&h));
        h.insert(header::ORIGIN, HeaderValue::from_static("http://evil.test"));
        assert!(!check(&h));
        h.insert(
            header::ORIGIN,
            HeaderValue::from_static("http://127.0.0.1:8080"),
        );
        h.insert("sec-fetch-site", HeaderValue::from_static("cross-site"));
        assert!(!check(&h));
        h.insert("sec-fetch-site", HeaderValue::from_static("same-origin"));
        assert!(check(&h));
        h.remove("sec-fetch-site");
        h.insert(header::ORIGIN, HeaderValue::from_static("null"));
        assert!(!check(&h), "an opaque origin is not this host");
    }

    #[test]
    fn the_token_is_read_from_the_header_or_the_cookie() {
        let mut h = HeaderMap::new();
        assert_eq!(presented(&h), None);
        h.insert(
            header::COOKIE,
            HeaderValue::from_static("a=1; ferriq_dashboard=a+long%2Bsecret%3D"),
        );
        assert_eq!(presented(&h).as_deref(), Some("a long+secret="));
        h.insert(
            header::AUTHORIZATION,
            HeaderValue::from_static("bearer other"),
        );
        assert_eq!(presented(&h).as_deref(), Some("other"));
        assert!(same(b"abc", b"abc") && !same(b"abc", b"abd") && !same(b"abc", b"ab"));
    }
}
