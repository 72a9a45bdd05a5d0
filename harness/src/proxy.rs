//! A TCP proxy on loopback between the workers and a server, whose behaviour the harness
//! switches: pass, blackhole (connections stay open and silent: nothing is forwarded either
//! way, as in a partition), and reset (every connection closed at once; new ones pass).

use std::sync::{Arc, Mutex};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// What the proxy does with traffic.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Forward both ways.
    Pass,
    /// Forward nothing; accept new connections and keep them silent too.
    Blackhole,
}

/// A proxy to one upstream address.
pub struct Proxy {
    /// The port workers connect to.
    pub port: u16,
    mode: watch::Sender<Mode>,
    conns: Arc<Mutex<Vec<JoinHandle<()>>>>,
    accept: JoinHandle<()>,
}

/// Copies `from` to `to`, holding bytes while the mode is not `Pass`.
async fn pump(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    mut mode: watch::Receiver<Mode>,
) {
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        // A blackholed connection forwards nothing until it is reset (which ends this task).
        if mode.wait_for(|m| *m == Mode::Pass).await.is_err() {
            return;
        }
        if to.write_all(&buf[..n]).await.is_err() {
            return;
        }
    }
}

impl Proxy {
    /// A proxy to `upstream` (`host:port`) on a free loopback port.
    pub async fn start(upstream: &str) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("a loopback port");
        let port = listener.local_addr().expect("bound").port();
        let (mode, _) = watch::channel(Mode::Pass);
        let conns: Arc<Mutex<Vec<JoinHandle<()>>>> = Arc::default();
        let accept = {
            let (mode, conns, upstream) = (mode.clone(), conns.clone(), upstream.to_owned());
            tokio::spawn(async move {
                while let Ok((inbound, _)) = listener.accept().await {
                    let (mode, upstream) = (mode.subscribe(), upstream.clone());
                    let task = tokio::spawn(async move {
                        let Ok(outbound) = TcpStream::connect(&upstream).await else {
                            return;
                        };
                        let _ = inbound.set_nodelay(true);
                        let _ = outbound.set_nodelay(true);
                        let (in_read, in_write) = inbound.into_split();
                        let (out_read, out_write) = outbound.into_split();
                        tokio::select! {
                            _ = pump(in_read, out_write, mode.clone()) => {}
                            _ = pump(out_read, in_write, mode) => {}
                        }
                    });
                    let mut all = conns.lock().unwrap_or_else(|p| p.into_inner());
                    all.retain(|t| !t.is_finished());
                    all.push(task);
                }
            })
        };
        Proxy {
            port,
            mode,
            conns,
            accept,
        }
    }

    /// Stops forwarding: every connection, old and new, goes silent.
    pub fn blackhole(&self) {
        self.mode.send_replace(Mode::Blackhole);
    }

    /// How many connections it carries now.
    pub fn live(&self) -> usize {
        let mut all = self.conns.lock().unwrap_or_else(|p| p.into_inner());
        all.retain(|t| !t.is_finished());
        all.len()
    }

    /// Closes every connection at once and forwards again for new ones.
    pub fn reset(&self) {
        for task in self
            .conns
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .drain(..)
        {
            task.abort();
        }
        self.mode.send_replace(Mode::Pass);
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.accept.abort();
        self.reset();
    }
}
