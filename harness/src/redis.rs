//! A private redis-server on a free port (killed and restarted by the scenarios, never the
//! shared one), and the oracle that counts result writes as the server itself announces them:
//! keyspace notifications, read on a connection of its own that bypasses the proxy.

use std::collections::HashMap;
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncBufRead, AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::tcp::OwnedWriteHalf;
use tokio::net::TcpStream;
use tokio::process::{Child, Command};
use tokio::sync::mpsc;

/// A free loopback port (bound, then released for the server).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

/// A redis-server of the harness's own.
pub struct PrivateRedis {
    /// Its port.
    pub port: u16,
    dir: PathBuf,
    /// Append-only file with `appendfsync always`.
    pub aof: bool,
    child: Option<Child>,
}

impl PrivateRedis {
    /// Starts one in `dir` (its AOF lives there).
    pub async fn start(dir: PathBuf, aof: bool) -> PrivateRedis {
        std::fs::create_dir_all(&dir).expect("the redis dir");
        let mut redis = PrivateRedis {
            port: free_port(),
            dir,
            aof,
            child: None,
        };
        redis.spawn().await;
        redis
    }

    async fn spawn(&mut self) {
        let mut cmd = Command::new("redis-server");
        cmd.args(["--port", &self.port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--daemonize", "no", "--protected-mode", "no"])
            .arg("--dir")
            .arg(&self.dir)
            // Keyspace events for string commands: the oracle's count of result writes.
            .args(["--notify-keyspace-events", "K$"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .kill_on_drop(true);
        if self.aof {
            cmd.args(["--appendonly", "yes", "--appendfsync", "always"]);
        } else {
            cmd.args(["--appendonly", "no"]);
        }
        self.child = Some(cmd.spawn().expect("redis-server runs"));
        let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
        loop {
            if let Ok(mut s) = TcpStream::connect(("127.0.0.1", self.port)).await {
                let _ = s.write_all(b"PING\r\n").await;
                let mut buf = [0u8; 16];
                if matches!(s.read(&mut buf).await, Ok(n) if buf[..n].starts_with(b"+PONG")) {
                    return;
                }
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "redis-server on {} did not start",
                self.port
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// SIGKILL, as a crash: nothing is flushed beyond what `appendfsync` already wrote.
    pub async fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.start_kill();
            let _ = child.wait().await;
        }
    }

    /// Starts it again on the same port and directory.
    pub async fn restart(&mut self) {
        self.kill().await;
        self.spawn().await;
    }

    /// `host:port`.
    pub fn addr(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }
}

/// One observed result write.
#[derive(Debug, Clone)]
pub struct Write {
    /// Which server lifetime (0 first; +1 on each restart).
    pub epoch: u32,
    /// When (unix ms, as the oracle saw it).
    pub at_ms: u64,
}

/// Counts `set` events on result keys (`{prefix}:{32 hex}`), per key, per server lifetime.
#[derive(Clone)]
pub struct Oracle {
    writes: Arc<Mutex<HashMap<String, Vec<Write>>>>,
    epoch: Arc<std::sync::atomic::AtomicU32>,
    prefix: String,
    /// The current subscription's writing half and its answers to `PING`, for [`Oracle::flush`].
    control: Arc<tokio::sync::Mutex<Option<Control>>>,
}

/// The writing half of the oracle's subscription, and a signal per `PING` answered on it.
type Control = (OwnedWriteHalf, mpsc::UnboundedReceiver<()>);

fn now_ms() -> u64 {
    ferriq::clock::Clock::system().now_unix_ms()
}

/// Reads one RESP value as a list of bulk strings (arrays flattened; other replies as text).
async fn read_reply<R: AsyncBufRead + Unpin + Send>(r: &mut R) -> std::io::Result<Vec<String>> {
    let mut line = String::new();
    if r.read_line(&mut line).await? == 0 {
        return Err(std::io::ErrorKind::UnexpectedEof.into());
    }
    let line = line.trim_end();
    match line.as_bytes().first() {
        Some(b'*') => {
            let n: i64 = line[1..].parse().unwrap_or(0);
            let mut out = Vec::new();
            for _ in 0..n.max(0) {
                out.extend(Box::pin(read_reply(r)).await?);
            }
            Ok(out)
        }
        Some(b'$') => {
            let n: i64 = line[1..].parse().unwrap_or(-1);
            if n < 0 {
                return Ok(vec![]);
            }
            let mut buf = vec![0u8; n as usize + 2];
            r.read_exact(&mut buf).await?;
            buf.truncate(n as usize);
            Ok(vec![String::from_utf8_lossy(&buf).into_owned()])
        }
        _ => Ok(vec![line.get(1..).unwrap_or("").to_owned()]),
    }
}

impl Oracle {
    /// An oracle for results under `prefix`; call [`Oracle::attach`] after each (re)start.
    pub fn new(prefix: &str) -> Oracle {
        Oracle {
            writes: Arc::default(),
            epoch: Arc::default(),
            prefix: prefix.to_owned(),
            control: Arc::default(),
        }
    }

    /// Subscribes to the server at `port` (a new epoch after the first); returns once the
    /// subscription is confirmed, so no write after this call is missed.
    pub async fn attach(&self, port: u16, first: bool) {
        if !first {
            self.epoch.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        }
        let epoch = self.epoch.load(std::sync::atomic::Ordering::SeqCst);
        let stream = TcpStream::connect(("127.0.0.1", port))
            .await
            .expect("the oracle reaches its redis");
        let (read_half, mut write_half) = stream.into_split();
        let mut reader = BufReader::new(read_half);
        let pattern = format!("__keyspace@0__:{}:*", self.prefix);
        let cmd = format!(
            "*2\r\n$10\r\nPSUBSCRIBE\r\n${}\r\n{pattern}\r\n",
            pattern.len()
        );
        write_half
            .write_all(cmd.as_bytes())
            .await
            .expect("subscribe");
        let confirm = read_reply(&mut reader).await.expect("psubscribe confirmed");
        assert_eq!(confirm.first().map(String::as_str), Some("psubscribe"));
        let (writes, skip) = (
            self.writes.clone(),
            format!("__keyspace@0__:{}:", self.prefix),
        );
        let (pongs, answers) = mpsc::unbounded_channel();
        *self.control.lock().await = Some((write_half, answers));
        tokio::spawn(async move {
            // Ends when the server goes away (killed): the next attach starts a new epoch.
            while let Ok(msg) = read_reply(&mut reader).await {
                if msg.first().map(String::as_str) == Some("pong") {
                    let _ = pongs.send(());
                    continue;
                }
                // pmessage, pattern, channel, event
                let (Some(channel), Some(event)) = (msg.get(2), msg.get(3)) else {
                    continue;
                };
                let Some(key) = channel.strip_prefix(&skip) else {
                    continue;
                };
                let is_result = key.len() == 32 && key.bytes().all(|b| b.is_ascii_hexdigit());
                if is_result && event == "set" {
                    writes
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .entry(key.to_owned())
                        .or_default()
                        .push(Write {
                            epoch,
                            at_ms: now_ms(),
                        });
                }
            }
        });
    }

    /// Returns once every notice the server queued before this call has been read and
    /// counted: a `PING` on the subscription is answered after them, in order. A scenario that
    /// cuts the workers off the store (the proxy) and then kills it calls this in between: a
    /// worker told its write succeeded heard so before the cut, so the write's notice was
    /// queued before the `PING` and is counted even though the server dies right after.
    pub async fn flush(&self) {
        let mut control = self.control.lock().await;
        let Some((write_half, answers)) = control.as_mut() else {
            return;
        };
        write_half
            .write_all(b"*1\r\n$4\r\nPING\r\n")
            .await
            .expect("the oracle's server answers a PING");
        tokio::time::timeout(Duration::from_secs(10), answers.recv())
            .await
            .expect("PING answered within 10 s")
            .expect("the oracle's reader is running");
    }

    /// Results the restarted server holds whose write the oracle never heard of: a server
    /// SIGKILLed right after a write (and its `appendfsync always`) dies before it sends the
    /// notice. Read directly from the server (`EXISTS`), each recorded as a write of the
    /// previous lifetime at `before_ms`; returns how many.
    pub async fn recover(&self, port: u16, ids: &[String], before_ms: u64) -> usize {
        let stream = TcpStream::connect(("127.0.0.1", port))
            .await
            .expect("the oracle reaches its redis");
        let mut reader = BufReader::new(stream);
        let epoch = self
            .epoch
            .load(std::sync::atomic::Ordering::SeqCst)
            .saturating_sub(1);
        let mut found = 0;
        for id in ids {
            if self.writes().contains_key(id) {
                continue;
            }
            let key = format!("{}:{id}", self.prefix);
            let cmd = format!("*2\r\n$6\r\nEXISTS\r\n${}\r\n{key}\r\n", key.len());
            reader
                .get_mut()
                .write_all(cmd.as_bytes())
                .await
                .expect("EXISTS");
            let reply = read_reply(&mut reader).await.expect("EXISTS answered");
            if reply.first().map(String::as_str) == Some("1") {
                found += 1;
                self.writes
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .entry(id.clone())
                    .or_default()
                    .push(Write {
                        epoch,
                        at_ms: before_ms,
                    });
            }
        }
        found
    }

    /// Every write seen, by task id.
    pub fn writes(&self) -> HashMap<String, Vec<Write>> {
        self.writes
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }
}
