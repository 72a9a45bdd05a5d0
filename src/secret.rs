//! Connection URLs that may carry passwords: parsed once, never printed whole.

use std::fmt;

/// A connection URL whose password never appears in `Debug` or `Display` output.
///
/// ```
/// use ferriq::SecretUrl;
/// let url = SecretUrl::new("amqp://app:s3cret@rabbit:5672/%2f");
/// assert_eq!(url.to_string(), "amqp://app:***@rabbit:5672/%2f");
/// assert!(!format!("{url:?}").contains("s3cret"));
/// assert_eq!(url.expose(), "amqp://app:s3cret@rabbit:5672/%2f");
/// assert_eq!(url.scheme(), "amqp");
/// // Malformed URLs never show the password either.
/// assert_eq!(SecretUrl::new("redis://:ab/cd@host:6379").to_string(), "redis://:***@host:6379");
/// assert_eq!(SecretUrl::new("redis://s3cret@host").to_string(), "redis://***@host");
/// // A '?' or '#' in an unencoded password: where it ends cannot be told, so nothing is shown.
/// let unencoded = SecretUrl::new("amqp://guest:pa?ss#w@rd@host:5672/");
/// assert_eq!(unencoded.to_string(), "amqp://***");
/// assert!(unencoded.userinfo_hint().is_some());
/// assert!(url.userinfo_hint().is_none());
/// // An '@' in a query value is not mistaken for the end of the user info.
/// let sentinel = SecretUrl::new("redis-sentinel://:pw@s1:26379/0?sentinelUsername=ops@corp&sentinelPassword=s3cret");
/// assert!(!sentinel.to_string().contains("s3cret") && !sentinel.to_string().contains("pw"));
/// assert!(sentinel.userinfo_hint().is_none());
/// // An '@' in the user name and a '?' in the password, both unencoded: nothing is shown.
/// assert_eq!(SecretUrl::new("amqp://us@er:pa?x=1@host/").to_string(), "amqp://***");
/// assert_eq!(SecretUrl::new("redis://[::1]:6379/0").to_string(), "redis://[::1]:6379/0");
/// ```
#[derive(Clone, PartialEq, Eq)]
pub struct SecretUrl(String);

impl SecretUrl {
    /// Wraps a URL.
    pub fn new(url: impl Into<String>) -> Self {
        SecretUrl(url.into())
    }

    /// The full URL, password included: only for handing to a client library.
    pub fn expose(&self) -> &str {
        &self.0
    }

    /// The scheme (`amqp`, `rediss`, `memory`…), lowercased; empty when there is none.
    pub fn scheme(&self) -> String {
        self.0
            .split_once("://")
            .map(|(s, _)| s.to_ascii_lowercase())
            .unwrap_or_default()
    }

    /// The URL with any password (and any `password=`/secret query values) replaced by `***`.
    /// A URL that does not split cleanly loses more than its password, never less. A list
    /// ([`SecretUrl::nodes`]) is redacted URL by URL.
    ///
    /// ```
    /// let nodes = ferriq::SecretUrl::new("amqp://u:p1@rabbit-1;amqp://u:p2@rabbit-2");
    /// assert_eq!(nodes.redacted(), "amqp://u:***@rabbit-1;amqp://u:***@rabbit-2");
    /// assert!(nodes.userinfo_hint().is_none());
    /// ```
    pub fn redacted(&self) -> String {
        self.parts()
            .iter()
            .map(|part| redact_one(part))
            .collect::<Vec<_>>()
            .join(";")
    }

    /// The URLs of a list written `URL;URL;…` (Celery's spelling of a failover list: a `;`
    /// followed by `scheme://` starts the next URL, so a `;` inside a password does not), or
    /// this URL alone.
    ///
    /// ```
    /// let nodes = ferriq::SecretUrl::new("amqp://u:p;w@rabbit-1; amqp://u:p@rabbit-2");
    /// let nodes: Vec<String> = nodes.nodes().iter().map(|n| n.expose().to_owned()).collect();
    /// assert_eq!(nodes, ["amqp://u:p;w@rabbit-1", "amqp://u:p@rabbit-2"]);
    /// ```
    pub fn nodes(&self) -> Vec<SecretUrl> {
        self.parts()
            .into_iter()
            .map(|p| SecretUrl::new(p.trim()))
            .collect()
    }

    /// The string split at each `;` that starts another `scheme://`.
    fn parts(&self) -> Vec<&str> {
        let starts_url = |s: &str| {
            s.trim_start().split_once("://").is_some_and(|(scheme, _)| {
                !scheme.is_empty()
                    && scheme
                        .chars()
                        .all(|c| c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.'))
            })
        };
        let mut parts = Vec::new();
        let mut start = 0;
        for (at, _) in self.0.match_indices(';') {
            if starts_url(&self.0[at + 1..]) {
                parts.push(&self.0[start..at]);
                start = at + 1;
            }
        }
        parts.push(&self.0[start..]);
        parts
    }
}

/// [`SecretUrl::redacted`] of one URL.
fn redact_one(url: &str) -> String {
    {
        let url = url.trim();
        let Some((scheme, rest)) = url.split_once("://") else {
            return "***".to_owned();
        };
        // An '@' only after a '?' or '#': an unencoded password holding one of them, or an
        // '@' in the query of a URL without user info. Which one cannot be told: show nothing.
        if ambiguous_userinfo(rest) {
            return format!("{scheme}://***");
        }
        // The user info ends at the last '@' before any query or fragment: a malformed
        // password may itself contain '/', which would end the authority early.
        let query_at = rest.find(['?', '#']).unwrap_or(rest.len());
        let (userinfo, after) = match rest[..query_at].rfind('@') {
            Some(at) => (Some(&rest[..at]), &rest[at + 1..]),
            None => (None, rest),
        };
        // What follows the user info must be a host with at most a numeric port: anything
        // else means the split went wrong (say '@' unencoded in the user name and '?' in the
        // password), and what looks like a host may be part of the password.
        if !plausible_authority(&after[..after.find(['/', '?', '#']).unwrap_or(after.len())]) {
            return format!("{scheme}://***");
        }
        let userinfo = match userinfo {
            // `user:password@` keeps the user; a lone `secret@` may be a password (redis).
            Some(info) => match info.split_once(':') {
                Some((user, _)) if !user.contains('/') => format!("{user}:***@"),
                _ => "***@".to_owned(),
            },
            None => String::new(),
        };
        format!("{scheme}://{userinfo}{}", redact_query(after))
    }
}

impl SecretUrl {
    /// What to add to an error about this URL when its user info seems to hold a character
    /// URLs reserve: an `@` after a `/`, `?` or `#` (which end the host in every URL parser,
    /// so the parser reports a bad port or host instead).
    pub fn userinfo_hint(&self) -> Option<&'static str> {
        self.parts().into_iter().find_map(userinfo_hint_one)
    }

    /// `reason`, followed by [`userinfo_hint`](Self::userinfo_hint) when there is one: for
    /// backends' connection and URL errors.
    pub fn explain(&self, reason: impl fmt::Display) -> String {
        match self.userinfo_hint() {
            Some(hint) => format!("{reason} ({hint})"),
            None => reason.to_string(),
        }
    }
}

/// `host`, `host:port` or `[v6]:port`, the port all digits (an empty authority too).
fn plausible_authority(authority: &str) -> bool {
    let port = match authority.strip_prefix('[') {
        Some(v6) => match v6.split_once(']') {
            Some((_, "")) => return true,
            Some((_, rest)) => rest.strip_prefix(':'),
            None => return false,
        },
        None => authority.rsplit_once(':').map(|(_, port)| port),
    };
    match port {
        Some(port) => port.bytes().all(|b| b.is_ascii_digit()),
        None => !authority.contains('@'),
    }
}

/// Whether the URL (after `scheme://`) has an '@' only after its first '?' or '#'.
fn ambiguous_userinfo(rest: &str) -> bool {
    match rest.find(['?', '#']) {
        Some(q) => !rest[..q].contains('@') && rest[q..].contains('@'),
        None => false,
    }
}

fn redact_query(tail: &str) -> String {
    let Some((path, query)) = tail.split_once('?') else {
        return tail.to_owned();
    };
    let parts: Vec<String> = query
        .split('&')
        .map(|kv| match kv.split_once('=') {
            Some((k, _)) if is_secret_key(k) => format!("{k}=***"),
            _ => kv.to_owned(),
        })
        .collect();
    format!("{path}?{}", parts.join("&"))
}

fn is_secret_key(k: &str) -> bool {
    let k = k.to_ascii_lowercase();
    ["pass", "secret", "token", "key", "auth"]
        .iter()
        .any(|s| k.contains(s))
}

impl fmt::Display for SecretUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.redacted())
    }
}

impl fmt::Debug for SecretUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "SecretUrl({})", self.redacted())
    }
}

impl From<&str> for SecretUrl {
    fn from(s: &str) -> Self {
        SecretUrl::new(s)
    }
}

impl From<String> for SecretUrl {
    fn from(s: String) -> Self {
        SecretUrl::new(s)
    }
}

/// [`SecretUrl::userinfo_hint`] of one URL.
fn userinfo_hint_one(url: &str) -> Option<&'static str> {
    let (_, rest) = url.trim().split_once("://")?;

    let before_query = &rest[..rest.find(['?', '#']).unwrap_or(rest.len())];
    let slash_in_userinfo = before_query
        .rfind('@')
        .is_some_and(|at| before_query[..at].contains('/'));
    (ambiguous_userinfo(rest) || slash_in_userinfo).then_some(
        "a user name or password holding '/', '?', '#' or '@' must be percent-encoded \
             in the URL (%2F, %3F, %23, %40)",
    )
}
