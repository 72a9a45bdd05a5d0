//! Private RabbitMQ nodes for the tests that need one of their own (TLS, users and
//! permissions, clusters, killing a node): its own name, ports and data directory, the shared
//! node untouched; run as the `rabbitmq` user when the tests run as root; stopped by its PID.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

/// Runs `program` with `args` in `dir`; panics with its stderr unless it succeeds.
pub fn run(dir: &Path, program: &str, args: &[&str]) {
    let out = Command::new(program)
        .args(args)
        .current_dir(dir)
        .output()
        .unwrap_or_else(|e| panic!("{program}: {e}"));
    assert!(
        out.status.success(),
        "{program} {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

use crate::free_port;

/// Whether this process runs as root (a node then runs as the `rabbitmq` user).
fn as_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| o.stdout.starts_with(b"0\n"))
}

/// A private RabbitMQ node with a TLS listener asking for client certificates, its files in a
/// directory of its own; stopped by its PID when dropped.
pub struct PrivateNode {
    dir: PathBuf,
    /// Its TLS listener's port (client certificates required).
    pub tls_port: u16,
    /// Its plain listener's port.
    pub plain_port: u16,
    pid: Option<u32>,
    node: String,
    /// The shell command that starts it (again, after a kill).
    start: String,
}

impl PrivateNode {
    /// Starts one (about 5 s).
    pub async fn start() -> Self {
        Self::start_with_cookie(None).await
    }

    /// Starts one whose Erlang cookie is `cookie` (nodes that will form a cluster share one).
    /// A node that does not answer within a minute is stopped and a new one (new ports, new
    /// name) started in its place, once: a start rarely hangs on a loaded machine (a port
    /// taken between its pick and the node's bind), and the test is not about that.
    pub async fn start_with_cookie(cookie: Option<&str>) -> Self {
        let mut server = Self::prepare(cookie);
        match server.try_launch().await {
            Ok(()) => server,
            Err(log) => {
                eprintln!(
                    "a private RabbitMQ node did not start; starting another. Its log:\n{log}"
                );
                drop(server);
                let mut server = Self::prepare(cookie);
                if let Err(log) = server.try_launch().await {
                    panic!("the private RabbitMQ node did not start (twice); its log:\n{log}");
                }
                server
            }
        }
    }

    /// Its directory, certificates and configuration, ready to launch.
    fn prepare(cookie: Option<&str>) -> Self {
        let dir =
            std::env::temp_dir().join(format!("fq-rmq-tls-{}", uuid::Uuid::new_v4().simple()));
        std::fs::create_dir_all(&dir).unwrap();
        let ec = [
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
        ];
        let mut ca = vec!["req", "-x509"];
        ca.extend(ec);
        ca.extend([
            "-keyout",
            "ca.key",
            "-out",
            "ca.pem",
            "-days",
            "2",
            "-subj",
            "/CN=ferriq test CA",
        ]);
        run(&dir, "openssl", &ca);
        for (name, san) in [("server", "DNS:localhost"), ("client", "DNS:ferriq-worker")] {
            std::fs::write(
                dir.join(format!("{name}.ext")),
                format!("subjectAltName={san}\n"),
            )
            .unwrap();
            let mut req = vec!["req"];
            req.extend(ec);
            let (key, csr, pem, ext) = (
                format!("{name}.key"),
                format!("{name}.csr"),
                format!("{name}.pem"),
                format!("{name}.ext"),
            );
            let subject = format!("/CN={name}");
            req.extend(["-keyout", &key, "-out", &csr, "-subj", &subject]);
            run(&dir, "openssl", &req);
            run(
                &dir,
                "openssl",
                &[
                    "x509",
                    "-req",
                    "-in",
                    &csr,
                    "-CA",
                    "ca.pem",
                    "-CAkey",
                    "ca.key",
                    "-CAcreateserial",
                    "-out",
                    &pem,
                    "-days",
                    "2",
                    "-extfile",
                    &ext,
                ],
            );
        }
        let (tls_port, plain_port, dist_port) = (free_port(), free_port(), free_port());
        let d = dir.display();
        std::fs::write(
            dir.join("rabbitmq.conf"),
            format!(
                "listeners.tcp.default = {plain_port}\nlisteners.ssl.default = {tls_port}\n\
                 ssl_options.cacertfile = {d}/ca.pem\nssl_options.certfile = {d}/server.pem\n\
                 ssl_options.keyfile = {d}/server.key\nssl_options.verify = verify_peer\n\
                 ssl_options.fail_if_no_peer_cert = true\nloopback_users = none\n"
            ),
        )
        .unwrap();
        std::fs::write(dir.join("enabled_plugins"), "[].\n").unwrap();
        if let Some(cookie) = cookie {
            let path = dir.join(".erlang.cookie");
            std::fs::write(&path, cookie).unwrap();
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o400)).unwrap();
        }
        let node = format!(
            "fqtls{}@localhost",
            &uuid::Uuid::new_v4().simple().to_string()[..8]
        );
        let start = format!(
            "HOME={d} RABBITMQ_NODENAME={node} RABBITMQ_DIST_PORT={dist_port} \
             RABBITMQ_MNESIA_BASE={d}/mnesia RABBITMQ_LOG_BASE={d}/log \
             RABBITMQ_CONFIG_FILE={d}/rabbitmq RABBITMQ_ENABLED_PLUGINS_FILE={d}/enabled_plugins \
             RABBITMQ_PID_FILE={d}/pid rabbitmq-server -detached"
        );
        if as_root() {
            run(&dir, "chown", &["-R", "rabbitmq:rabbitmq", &d.to_string()]);
        }
        PrivateNode {
            dir,
            tls_port,
            plain_port,
            pid: None,
            node,
            start,
        }
    }

    /// Runs its start command and waits until both listeners answer (up to a minute); the
    /// tail of its log if they do not.
    async fn try_launch(&mut self) -> Result<(), String> {
        let _ = std::fs::remove_file(self.dir.join("pid"));
        self.pid = None;
        // As root, the node runs as the rabbitmq user (it refuses files it cannot own).
        if as_root() {
            run(
                &self.dir,
                "su",
                &["rabbitmq", "-s", "/bin/sh", "-c", &self.start],
            );
        } else {
            run(&self.dir, "sh", &["-c", &self.start]);
        }
        let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
        loop {
            if self.pid.is_none() {
                self.pid = std::fs::read_to_string(self.dir.join("pid"))
                    .ok()
                    .and_then(|p| p.trim().parse().ok());
            }
            let up = |port: u16| std::net::TcpStream::connect(("127.0.0.1", port)).is_ok();
            if self.pid.is_some() && up(self.tls_port) && up(self.plain_port) {
                return Ok(());
            }
            if tokio::time::Instant::now() >= deadline {
                return Err(self.log_tail());
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// The last lines of its log files (its directory goes when it is dropped).
    fn log_tail(&self) -> String {
        let mut tail = String::new();
        for entry in std::fs::read_dir(self.dir.join("log"))
            .into_iter()
            .flatten()
        {
            let Ok(entry) = entry else { continue };
            let text = std::fs::read_to_string(entry.path()).unwrap_or_default();
            let lines: Vec<&str> = text.lines().collect();
            tail.push_str(&format!("--- {}\n", entry.path().display()));
            for line in &lines[lines.len().saturating_sub(30)..] {
                tail.push_str(line);
                tail.push('\n');
            }
        }
        tail
    }

    /// SIGKILLs the node (no shutdown of any kind) and waits until its process is gone.
    pub async fn kill(&mut self) {
        let Some(pid) = self.pid.take() else {
            return;
        };
        let _ = Command::new("kill").args(["-9", &pid.to_string()]).status();
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        while Path::new(&format!("/proc/{pid}")).exists() && tokio::time::Instant::now() < deadline
        {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Starts the node again after [`kill`](Self::kill): same name, ports and data.
    pub async fn restart(&mut self) {
        if let Err(log) = self.try_launch().await {
            panic!("the private RabbitMQ node did not start again; its log:\n{log}");
        }
    }

    /// Its TLS listener, as guest.
    pub fn url(&self, host: &str) -> String {
        format!("amqps://guest:guest@{host}:{}/%2f", self.tls_port)
    }

    /// A file of its directory (`ca.pem`, `client.pem`, `client.key`).
    pub fn path(&self, file: &str) -> PathBuf {
        self.dir.join(file)
    }
}

impl Drop for PrivateNode {
    fn drop(&mut self) {
        if self.pid.is_none() {
            // Started but never wrote its PID file (it hung starting): found by its name.
            let _ = Command::new("pkill")
                .args(["-9", "-f", self.node.as_str()])
                .stderr(std::process::Stdio::null())
                .status();
        }
        if let Some(pid) = self.pid {
            let _ = Command::new("kill")
                .arg(pid.to_string())
                .stderr(std::process::Stdio::null())
                .status();
            // Its files go once it has stopped (bounded: a stuck node is killed).
            for _ in 0..100 {
                if !Path::new(&format!("/proc/{pid}")).exists() {
                    break;
                }
                std::thread::sleep(Duration::from_millis(100));
            }
            let _ = Command::new("kill")
                .args(["-9", &pid.to_string()])
                .stderr(std::process::Stdio::null())
                .status();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

impl PrivateNode {
    /// Runs `rabbitmqctl` against this node (as the user the node runs as).
    pub fn ctl(&self, args: &[&str]) {
        // The CLI reads the cookie of its user's home, not HOME: given explicitly.
        let cookie = std::fs::read_to_string(self.dir.join(".erlang.cookie")).unwrap_or_default();
        let command = format!(
            "rabbitmqctl --erlang-cookie {} -n {} {}",
            cookie.trim(),
            self.node,
            args.iter()
                .map(|a| format!("'{}'", a.replace('\'', "")))
                .collect::<Vec<_>>()
                .join(" ")
        );
        if as_root() {
            run(
                &self.dir,
                "su",
                &["rabbitmq", "-s", "/bin/sh", "-c", &command],
            );
        } else {
            run(&self.dir, "sh", &["-c", &command]);
        }
    }

    /// Its plain listener as `user`.
    pub fn plain_url(&self, user: &str, password: &str) -> String {
        format!("amqp://{user}:{password}@127.0.0.1:{}/%2f", self.plain_port)
    }
}

impl PrivateNode {
    /// Its Erlang node name.
    pub fn name(&self) -> &str {
        &self.node
    }

    /// Its OS process.
    pub fn pid(&self) -> Option<u32> {
        self.pid
    }

    /// `rabbitmqctl` against this node, its output.
    pub fn ctl_output(&self, args: &[&str]) -> String {
        let cookie = std::fs::read_to_string(self.dir.join(".erlang.cookie")).unwrap_or_default();
        let mut command = vec![
            "rabbitmqctl".to_owned(),
            "--erlang-cookie".into(),
            cookie.trim().to_owned(),
            "-n".into(),
            self.node.clone(),
        ];
        command.extend(args.iter().map(|a| a.to_string()));
        let out = if as_root() {
            Command::new("su")
                .args(["rabbitmq", "-s", "/bin/sh", "-c", &command.join(" ")])
                .output()
        } else {
            Command::new(&command[0]).args(&command[1..]).output()
        };
        out.map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
            .unwrap_or_default()
    }
}

/// A private RabbitMQ cluster: three nodes sharing a cookie, joined to the first.
pub struct PrivateCluster {
    /// Its nodes.
    pub nodes: Vec<PrivateNode>,
}

impl PrivateCluster {
    /// Starts three nodes and joins the second and third to the first (about 20 s).
    pub async fn start() -> Self {
        let cookie = uuid::Uuid::new_v4().simple().to_string().to_uppercase();
        let mut nodes = Vec::new();
        for _ in 0..3 {
            nodes.push(PrivateNode::start_with_cookie(Some(&cookie)).await);
        }
        let first = nodes[0].name().to_owned();
        for node in &nodes[1..] {
            node.ctl(&["stop_app"]);
            node.ctl(&["join_cluster", &first]);
            node.ctl(&["start_app"]);
        }
        // Every node answers on its plain port again.
        for node in &nodes {
            let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
            while std::net::TcpStream::connect(("127.0.0.1", node.plain_port)).is_err() {
                assert!(
                    tokio::time::Instant::now() < deadline,
                    "a cluster node did not come back"
                );
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
        PrivateCluster { nodes }
    }

    /// The node leading `queue`'s quorum queue, as the cluster lists it (its index); `None`
    /// while no live node lists one.
    pub fn leader(&self, queue: &str) -> Option<usize> {
        for node in self.nodes.iter().filter(|n| n.pid.is_some()) {
            let listed =
                node.ctl_output(&["list_queues", "-q", "--no-table-headers", "name", "leader"]);
            if let Some(name) = listed
                .lines()
                .find(|l| l.split_whitespace().next() == Some(queue))
                .and_then(|l| l.split_whitespace().nth(1))
            {
                if let Some(i) = self.nodes.iter().position(|n| n.name() == name) {
                    return Some(i);
                }
            }
        }
        None
    }

    /// Every node, as a list URL (guest).
    pub fn url(&self) -> String {
        self.nodes
            .iter()
            .map(|n| n.plain_url("guest", "guest"))
            .collect::<Vec<_>>()
            .join(";")
    }
}
