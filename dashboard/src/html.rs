//! Rendering: escaping, the page frame, times. Every string that reaches a page goes
//! through [`esc`]; the frame links one stylesheet and one script, both from the binary.

use std::fmt::Write;

use axum::response::Html;

use crate::State;

/// `s` as HTML text or attribute value: `<`, `>`, `&`, `"`, `'` escaped.
pub(crate) fn esc(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '&' => out.push_str("&amp;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

/// `s` cut to `max` characters, with an ellipsis when cut.
pub(crate) fn cut(s: &str, max: usize) -> String {
    match s.char_indices().nth(max) {
        Some((i, _)) => format!("{}…", &s[..i]),
        None => s.to_owned(),
    }
}

/// A unix time in ms as `2026-12-05 04:03:05 UTC`.
pub(crate) fn time_ms(ms: u64) -> String {
    jiff::Timestamp::from_millisecond(ms as i64)
        .map(|t| t.strftime("%Y-%m-%d %H:%M:%S UTC").to_string())
        .unwrap_or_else(|_| "-".into())
}

/// How long ago `ms` was, at `now_ms`: `42 s`, `3 min`, `2 h`, `5 d`.
pub(crate) fn age(now_ms: u64, ms: u64) -> String {
    let s = now_ms.saturating_sub(ms) / 1000;
    match s {
        0..120 => format!("{s} s"),
        120..7200 => format!("{} min", s / 60),
        7200..172_800 => format!("{} h", s / 3600),
        _ => format!("{} d", s / 86_400),
    }
}

/// The pages of the navigation: path, title.
const NAV: [(&str, &str); 6] = [
    ("/", "Overview"),
    ("/workers", "Workers"),
    ("/tasks", "Tasks"),
    ("/dead", "Dead letters"),
    ("/schedules", "Schedules"),
    ("/limits", "Limits"),
];

/// A whole page: `body` (already escaped) in the frame, `active` the nav entry's path.
pub(crate) fn page(state: &State, title: &str, active: &str, body: &str) -> Html<String> {
    let base = esc(&state.base);
    let mut nav = String::new();
    for (path, name) in NAV {
        let current = if path == active {
            " aria-current=\"page\""
        } else {
            ""
        };
        let _ = write!(nav, "<a href=\"{base}{path}\"{current}>{name}</a>");
    }
    let mode = if state.actions {
        "<span class=\"mode write\">actions allowed</span>"
    } else {
        "<span class=\"mode\">read-only</span>"
    };
    Html(format!(
        "<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\">\
         <meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\
         <meta name=\"color-scheme\" content=\"light dark\">\
         <meta name=\"ferriq-base\" content=\"{base}\">\
         <title>{title} · ferriq</title>\
         <link rel=\"icon\" href=\"data:,\">\
         <link rel=\"stylesheet\" href=\"{base}/assets/app.css\">\
         <script src=\"{base}/assets/app.js\" defer></script></head>\
         <body><header><strong>ferriq</strong><nav>{nav}</nav>{mode}</header>\
         <main><h1>{title}</h1>{body}</main></body></html>",
        title = esc(title)
    ))
}

/// A hidden CSRF field for a form.
pub(crate) fn csrf_field(state: &State) -> String {
    format!(
        "<input type=\"hidden\" name=\"csrf\" value=\"{}\">",
        esc(&state.csrf)
    )
}

/// A table: headers, then rows of cells already escaped. `id` names its body for live updates.
pub(crate) fn table(id: &str, headers: &[&str], rows: &[Vec<String>], empty: &str) -> String {
    let mut out = String::from("<table><thead><tr>");
    for h in headers {
        let _ = write!(out, "<th>{}</th>", esc(h));
    }
    let _ = write!(out, "</tr></thead><tbody id=\"{}\">", esc(id));
    if rows.is_empty() {
        let _ = write!(
            out,
            "<tr><td colspan=\"{}\" class=\"empty\">{}</td></tr>",
            headers.len(),
            esc(empty)
        );
    }
    for row in rows {
        out.push_str("<tr>");
        for cell in row {
            let _ = write!(out, "<td>{cell}</td>");
        }
        out.push_str("</tr>");
    }
    out.push_str("</tbody></table>");
    out
}

/// An error shown in the page (escaped).
pub(crate) fn error_box(what: &str) -> String {
    format!("<p class=\"error\" role=\"alert\">{}</p>", esc(what))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn user_data_is_escaped() {
        assert_eq!(
            esc("<script>alert('x')</script> & \"y\""),
            "&lt;script&gt;alert(&#39;x&#39;)&lt;/script&gt; &amp; &quot;y&quot;"
        );
        assert_eq!(cut("abcdef", 3), "abc…");
        assert_eq!(cut("ab", 3), "ab");
        assert_eq!(age(200_000, 80_000), "2 min");
        assert_eq!(age(200_000, 190_000), "10 s");
    }
}
