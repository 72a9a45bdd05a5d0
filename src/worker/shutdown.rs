use tokio_util::sync::CancellationToken;

/// Asks a running worker to drain, or to stop at once. Clones control the same worker.
///
/// ```
/// let shutdown = ferriq::Shutdown::new();
/// shutdown.drain();
/// assert!(shutdown.is_draining());
/// ```
#[derive(Debug, Clone, Default)]
pub struct Shutdown {
    drain: CancellationToken,
    force: CancellationToken,
}

impl Shutdown {
    /// A shutdown handle that has not fired.
    pub fn new() -> Self {
        Self::default()
    }

    /// Stop receiving and let runs finish within the grace period.
    pub fn drain(&self) {
        self.drain.cancel();
    }

    /// Stop now: cancel runs and release their messages (also drains). The releases are still
    /// waited for (up to 5 s), so the messages are back in their queue when the worker stops.
    pub fn force(&self) {
        self.drain.cancel();
        self.force.cancel();
    }

    /// Whether a drain was asked for.
    pub fn is_draining(&self) -> bool {
        self.drain.is_cancelled()
    }

    pub(crate) async fn draining(&self) {
        self.drain.cancelled().await
    }

    pub(crate) async fn forced(&self) {
        self.force.cancelled().await
    }
}

/// Completes on SIGTERM or SIGINT (Ctrl-C elsewhere).
pub(crate) async fn wait_for_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        match (
            signal(SignalKind::terminate()),
            signal(SignalKind::interrupt()),
        ) {
            (Ok(mut term), Ok(mut int)) => {
                tokio::select! {
                    _ = term.recv() => {}
                    _ = int.recv() => {}
                }
            }
            _ => {
                tracing::error!("cannot install signal handlers; only Ctrl-C will stop the worker");
                let _ = tokio::signal::ctrl_c().await;
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
}
