//! The shared servers the tests run against, by URL — checked on first use, so a test whose
//! server is down fails at once with the command that starts it, instead of a connection
//! error deep inside a test (or a timeout).

use std::net::{TcpStream, ToSocketAddrs};
use std::sync::OnceLock;
use std::time::Duration;

/// The shared RabbitMQ: `FERRIQ_TEST_AMQP_URL`, else the local server. Panics, naming the
/// command that starts it, when it does not answer.
pub fn amqp_url() -> String {
    static CHECKED: OnceLock<String> = OnceLock::new();
    CHECKED
        .get_or_init(|| {
            let url = std::env::var("FERRIQ_TEST_AMQP_URL")
                .unwrap_or_else(|_| "amqp://guest:guest@127.0.0.1:5672/%2f".into());
            require(&url, "RabbitMQ", "rabbitmq-server -detached");
            url
        })
        .clone()
}

/// The shared Redis (the Valkey stand-in): `FERRIQ_TEST_REDIS_URL`, else the local server.
/// Panics, naming the command that starts it, when it does not answer.
pub fn redis_url() -> String {
    static CHECKED: OnceLock<String> = OnceLock::new();
    CHECKED
        .get_or_init(|| {
            let url = std::env::var("FERRIQ_TEST_REDIS_URL")
                .unwrap_or_else(|_| "redis://127.0.0.1:6379".into());
            require(
                &url,
                "Redis",
                "redis-server --daemonize yes --port 6379 --save \"\" --appendonly no",
            );
            url
        })
        .clone()
}

/// The Python of the interop venv: `FERRIQ_TEST_PYTHON`, else `.venv-interop` at the
/// workspace's root (`scripts/test.sh` creates it with taskiq, taskiq-aio-pika, taskiq-redis
/// and taskiq-aio-sqs). Panics, naming the command that creates it, when it is missing.
pub fn python() -> std::path::PathBuf {
    if let Ok(p) = std::env::var("FERRIQ_TEST_PYTHON") {
        return p.into();
    }
    let venv =
        std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../.venv-interop/bin/python");
    assert!(
        venv.exists(),
        "the Python interop venv is missing: run `bash scripts/test.sh` (it creates .venv-interop)"
    );
    venv
}

/// `host:port` of a `scheme://[user[:password]@]host:port[/…]` URL.
fn address(url: &str) -> Option<String> {
    let rest = url.split_once("://")?.1;
    let authority = rest.split(['/', '?']).next()?;
    let host_port = authority.rsplit_once('@').map_or(authority, |(_, h)| h);
    Some(host_port.to_owned())
}

fn require(url: &str, what: &str, start: &str) {
    let Some(addr) = address(url) else {
        panic!("the test {what} URL cannot be read (check FERRIQ_TEST_*_URL)");
    };
    let answers = addr
        .to_socket_addrs()
        .ok()
        .into_iter()
        .flatten()
        .any(|a| TcpStream::connect_timeout(&a, Duration::from_secs(2)).is_ok());
    // The address only: a URL may hold a password.
    assert!(
        answers,
        "the test {what} at {addr} does not answer: start it with `{start}`, or run \
         `bash scripts/test.sh`, which starts what is missing"
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_address_leaves_the_password_out() {
        assert_eq!(
            address("amqp://guest:secret@127.0.0.1:5672/%2f").as_deref(),
            Some("127.0.0.1:5672")
        );
        assert_eq!(
            address("redis://127.0.0.1:6379").as_deref(),
            Some("127.0.0.1:6379")
        );
        assert_eq!(address("not a url"), None);
    }

    #[test]
    #[should_panic(expected = "start it with `redis-server")]
    fn a_server_that_does_not_answer_names_the_command_that_starts_it() {
        let port = crate::free_port();
        require(
            &format!("redis://127.0.0.1:{port}"),
            "Redis",
            "redis-server --daemonize yes --port 6379 --save \"\" --appendonly no",
        );
    }
}
