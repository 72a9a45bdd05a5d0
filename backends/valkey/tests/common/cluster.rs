//! A Valkey Cluster of the test's own, on free ports.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use super::{eventually, free_port, redis_cli, ServerGroup};

/// A Valkey Cluster of the test's own: `masters` redis-servers on free ports, slots spread
/// over them (each with `replicas` of its own when started so), removed (processes and files)
/// when dropped.
pub struct PrivateCluster {
    pub ports: Vec<u16>,
    servers: ServerGroup,
    /// Whether its nodes speak TLS only (clients and the cluster bus).
    tls: bool,
}

impl PrivateCluster {
    pub async fn start(masters: usize) -> Self {
        Self::start_with(masters, 0, None).await
    }

    /// Each master with one replica, and a node timeout of 1 s, so a replica takes over a
    /// killed master within seconds.
    pub async fn start_with_replicas(masters: usize) -> Self {
        Self::start_with(masters, 1, None).await
    }

    /// Its nodes on TLS ports only (bus included), showing `cert`/`key` signed by `ca`.
    pub async fn start_tls(masters: usize, cert: &Path, key: &Path, ca: &Path) -> Self {
        let files = [cert, key, ca].map(|p| p.to_str().unwrap().to_owned());
        Self::start_with(masters, 0, Some(files)).await
    }

    async fn start_with(masters: usize, replicas: usize, tls: Option<[String; 3]>) -> Self {
        let mut servers = ServerGroup::new("cluster");
        let mut ports = Vec::new();
        // redis-cli's TLS options, when the nodes speak TLS.
        let cli_tls: Vec<String> = match &tls {
            Some([cert, key, ca]) => ["--tls", "--cert", cert, "--key", key, "--cacert", ca]
                .map(str::to_owned)
                .to_vec(),
            None => Vec::new(),
        };
        let cli = |port: u16, args: &[&str]| {
            Command::new("timeout")
                .args(["5", "redis-cli", "-p", &port.to_string()])
                .args(&cli_tls)
                .args(args)
                .output()
                .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
                .unwrap_or_default()
        };
        let nodes_in_all = masters * (1 + replicas);
        for _ in 0..nodes_in_all {
            // The bus port is given too: its default (port + 10000) overflows for free ports
            // above 55535, which redis-server then refuses.
            let (port, bus) = (free_port(), free_port());
            let (port_arg, bus_arg) = (port.to_string(), bus.to_string());
            let nodes_file = format!("nodes-{port}.conf");
            let mut args: Vec<String> = match &tls {
                None => vec!["--port".into(), port_arg.clone()],
                Some([cert, key, ca]) => [
                    "--port",
                    "0",
                    "--tls-port",
                    &port_arg,
                    "--tls-cluster",
                    "yes",
                    "--tls-replication",
                    "yes",
                    "--tls-cert-file",
                    cert,
                    "--tls-key-file",
                    key,
                    "--tls-ca-cert-file",
                    ca,
                    "--tls-auth-clients",
                    "no",
                ]
                .map(str::to_owned)
                .to_vec(),
            };
            let rest = [
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
                "--cluster-enabled",
                "yes",
                "--cluster-port",
                &bus_arg,
                "--cluster-config-file",
                &nodes_file,
                "--cluster-node-timeout",
                if replicas > 0 { "1000" } else { "15000" },
            ];
            args.extend(rest.map(str::to_owned));
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            servers.start(&format!("redis-{port}"), port, &args).await;
            ports.push(port);
        }
        let nodes: Vec<String> = ports.iter().map(|p| format!("127.0.0.1:{p}")).collect();
        // `timeout` kills it if it hangs, even when this test has already given up.
        let mut create = Command::new("timeout")
            .args(["60", "redis-cli"])
            .args(&cli_tls)
            .args(["--cluster", "create"])
            .args(&nodes)
            .args(["--cluster-replicas", &replicas.to_string(), "--cluster-yes"])
            .stdin(Stdio::null())
            .stdout(std::fs::File::create(servers.dir.join("create.log")).unwrap())
            .stderr(Stdio::null())
            .spawn()
            .expect("redis-cli is installed");
        let mut status = None;
        eventually(Duration::from_secs(70), || {
            status = create.try_wait().unwrap();
            status.is_some()
        })
        .await;
        assert!(
            status.is_some_and(|s| s.success()),
            "redis-cli --cluster create failed: {status:?}: {:?}",
            std::fs::read_to_string(servers.dir.join("create.log"))
        );
        // Every node must agree the cluster is up before a client maps its slots, and see a
        // live bus link to every other node: a PUBLISH crosses the cluster on those links and
        // is dropped where one is not up yet. It must also know every replica's master (the
        // news travels by gossip after `--cluster create` returns): a test that looks up the
        // replica of a slot's master found none on a node that had not heard yet.
        for port in &ports {
            eventually(Duration::from_secs(30), || {
                let nodes = cli(*port, &["cluster", "nodes"]);
                let replicas_known = nodes
                    .lines()
                    .filter(|l| {
                        let fields: Vec<&str> = l.split(' ').collect();
                        fields.len() > 3 && fields[2].contains("slave") && fields[3] != "-"
                    })
                    .count();
                cli(*port, &["cluster", "info"]).contains("cluster_state:ok")
                    && nodes.lines().count() == nodes_in_all
                    && nodes.lines().all(|l| l.contains(" connected"))
                    && replicas_known == masters * replicas
            })
            .await;
        }
        PrivateCluster {
            ports,
            servers,
            tls: tls.is_some(),
        }
    }

    /// SIGKILLs the node on `port`.
    pub fn kill(&mut self, port: u16) {
        let index = self.ports.iter().position(|p| *p == port).expect("a node");
        self.servers.kill(index);
    }

    /// The master serving `key` now, and its replica, as seen by the node at `asked`.
    pub fn master_and_replica_of(&self, key: &str, asked: u16) -> (u16, Option<u16>) {
        let slot: u16 = redis_cli(asked, &["cluster", "keyslot", key])
            .trim()
            .parse()
            .expect("a slot");
        let nodes = redis_cli(asked, &["cluster", "nodes"]);
        let port_of =
            |addr: &str| -> u16 { addr.split(['@', ':']).nth(1).unwrap().parse().unwrap() };
        let master = nodes
            .lines()
            .find(|l| {
                let f: Vec<&str> = l.split(' ').collect();
                f[2].contains("master")
                    && !f[2].contains("fail")
                    && f[8..].iter().any(|range| {
                        let mut ends = range.split('-').map(|n| n.parse::<u16>());
                        match (ends.next(), ends.next()) {
                            (Some(Ok(a)), Some(Ok(b))) => (a..=b).contains(&slot),
                            (Some(Ok(a)), None) => a == slot,
                            _ => false,
                        }
                    })
            })
            .expect("a master serves the slot");
        let master_id = master.split(' ').next().unwrap();
        let replica = nodes
            .lines()
            .find(|l| l.split(' ').nth(3) == Some(master_id) && !l.contains("fail"))
            .map(|l| port_of(l.split(' ').nth(1).unwrap()));
        (port_of(master.split(' ').nth(1).unwrap()), replica)
    }

    /// fred's cluster URL form: the first node, the others as `node=` parameters.
    pub fn url(&self) -> String {
        let others: Vec<String> = self.ports[1..]
            .iter()
            .map(|p| format!("node=127.0.0.1:{p}"))
            .collect();
        let scheme = if self.tls {
            "rediss-cluster"
        } else {
            "redis-cluster"
        };
        format!(
            "{scheme}://127.0.0.1:{}?{}",
            self.ports[0],
            others.join("&")
        )
    }
}
