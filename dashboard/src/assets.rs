//! The stylesheet and the script, compiled into the binary: no CDN, works offline.

use axum::extract::Path;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};

const CSS: &str = include_str!("../assets/app.css");
const JS: &str = include_str!("../assets/app.js");

/// `/assets/app.css`, `/assets/app.js`.
pub(crate) async fn serve(Path(file): Path<String>) -> Response {
    let (body, kind) = match file.as_str() {
        "app.css" => (CSS, "text/css; charset=utf-8"),
        "app.js" => (JS, "text/javascript; charset=utf-8"),
        _ => return (StatusCode::NOT_FOUND, "no such asset\n").into_response(),
    };
    (
        [
            (header::CONTENT_TYPE, kind),
            (header::CACHE_CONTROL, "max-age=300"),
        ],
        body,
    )
        .into_response()
}
