//! Keeping a live session: the supervisor that replaces a dead connection (with backoff, and
//! the next node of the list), the watch that tells it a connection died, and what a
//! connection error means in words an operator can act on.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt;
use lapin::Event;

use crate::session::{Session, Shared};

impl Shared {
    /// Keeps a live session: serves `first`, and whenever a session dies, reconnects with
    /// backoff. Ends when the broker is dropped or closed.
    pub(crate) async fn supervise(self: Arc<Self>, first: Arc<Session>) {
        let mut next = Some(first);
        let mut backoff = Duration::from_millis(100);
        loop {
            let session = match next.take() {
                Some(s) => s,
                None => {
                    tokio::select! {
                        _ = self.stop.cancelled() => return,
                        connected = self.connect_any() => match connected {
                            Ok(s) => {
                                tracing::info!(node = %self.current_node(), "reconnected to RabbitMQ");
                                s
                            }
                            Err(e) => {
                                tracing::warn!(error = %e, retry_in = ?backoff, "cannot reconnect to RabbitMQ");
                                self.set_error(&e);
                                if !self.pause(&mut backoff).await {
                                    return;
                                }
                                continue;
                            }
                        },
                    }
                }
            };
            let connected_at = tokio::time::Instant::now();
            self.session.send_replace(Some(Arc::clone(&session)));
            loop {
                if self.consume.load(Ordering::SeqCst) {
                    self.start_consumers(&session).await;
                }
                tokio::select! {
                    _ = session.dead.cancelled() => break,
                    _ = self.start_consuming.notified() => continue,
                    _ = self.stop.cancelled() => {
                        self.session.send_replace(None);
                        session.dead.cancel();
                        session.close(Duration::from_secs(5), "closed by ferriq").await;
                        return;
                    }
                }
            }
            self.session.send_replace(None);
            tracing::warn!(
                error = %self.last_error.lock().unwrap_or_else(|p| p.into_inner()),
                "RabbitMQ connection lost; held deliveries will be redelivered, reconnecting"
            );
            session.close(Duration::from_secs(1), "reconnecting").await;
            // Its node may be gone: the next attempt starts with the next node of the list.
            self.next_node();
            // A session that died at once (a refused consumer, a failing declare) must not turn
            // into a tight reconnect loop: back off unless it lived a while.
            if connected_at.elapsed() > Duration::from_secs(10) {
                backoff = Duration::from_millis(100);
            }
            if !self.pause(&mut backoff).await {
                return;
            }
        }
    }

    /// Sleeps the backoff (doubling it, up to 5 s); `false` when the broker was closed meanwhile.
    async fn pause(&self, backoff: &mut Duration) -> bool {
        let wait = *backoff;
        *backoff = (*backoff * 2).min(Duration::from_secs(5));
        tokio::select! {
            _ = self.stop.cancelled() => false,
            _ = tokio::time::sleep(wait) => true,
        }
    }
}

/// Marks the session dead on the first connection error the connection reports.
pub(crate) fn watch_events(
    events: impl futures_util::Stream<Item = Event> + Send + 'static,
    session: Arc<Session>,
    shared: Arc<Shared>,
) {
    tokio::spawn(async move {
        let mut events = std::pin::pin!(events);
        loop {
            tokio::select! {
                _ = session.dead.cancelled() => return,
                event = events.next() => match event {
                    // A channel closed by the broker (a refused publish, a missing queue) is that
                    // channel's problem; only a connection-level error ends the session.
                    Some(Event::Error(e)) if e.is_amqp_soft_error() => {
                        tracing::warn!(error = %e, "a RabbitMQ channel was closed by the broker");
                    }
                    Some(Event::Error(e)) => {
                        shared.set_error(&e);
                        session.dead.cancel();
                        return;
                    }
                    Some(_) => {}
                    None => {
                        session.dead.cancel();
                        return;
                    }
                },
            }
        }
    });
}

/// A connection error with, for a TLS failure, what to fix.
pub(crate) fn explain(error: &str, tls: bool) -> String {
    let e = error.to_ascii_lowercase();
    let hint = if e.contains("unknownissuer") || e.contains("unknown issuer") {
        "the broker's certificate is not signed by a CA this client trusts: set FERRIQ_BROKER_TLS_CA (builder: tls_ca_file) to the PEM file of the CA that signed it"
    } else if e.contains("notvalidforname") || e.contains("not valid for name") {
        "the broker's certificate is not for the host name in the URL: connect with a name the certificate lists (its subjectAltName), or have it reissued"
    } else if e.contains("expired") {
        "the broker's certificate has expired: have it renewed"
    } else if e.contains("certificaterequired")
        || e.contains("badcertificate")
        || e.contains("unknownca")
        || e.contains("handshakefailure")
    {
        "the broker refused this client's certificate (or wants one): set FERRIQ_BROKER_TLS_CERT and FERRIQ_BROKER_TLS_KEY (builder: tls_client_cert) to a certificate signed by a CA the broker trusts"
    } else if e.contains("corrupt message") || e.contains("invalidcontenttype") {
        "the broker does not speak TLS on this port: use amqp:// for a plain port, or the broker's TLS port (5671 by default)"
    } else if tls && (e.contains("connection reset") || e.contains("broken pipe")) {
        // With TLS 1.3 a server refusing the client's certificate (or its absence) may close
        // the connection before its alert is read: the usual cause of a reset right here.
        "the broker closed the TLS connection during the handshake: if it asks for client certificates, set FERRIQ_BROKER_TLS_CERT and FERRIQ_BROKER_TLS_KEY (builder: tls_client_cert) to one signed by a CA it trusts; if the port is a plain one, use the broker's TLS port (a plain port does not speak TLS)"
    } else if e.contains("private key") || e.contains("no keys found") {
        "FERRIQ_BROKER_TLS_KEY is not a readable PEM private key (PKCS#8, PKCS#1 or SEC1)"
    } else {
        return error.to_owned();
    };
    format!("{error} — {hint}")
}
