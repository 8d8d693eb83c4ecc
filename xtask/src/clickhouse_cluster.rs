//! A private ClickHouse cluster for the cluster store's tests: one
//! ZooKeeper and four clickhouse-servers on free loopback ports, two
//! shards of two replicas, every node with the cluster in its
//! `remote_servers`, its `shard` and `replica` macros and the ZooKeeper
//! that `ReplicatedMergeTree` and `ON CLUSTER` need. Everything lives under
//! one temporary directory, and each process is run by a thread that kills
//! it when the test binary ends (see `clickhouse`).
//!
//! One cluster is shared by the whole test process (`shared`), each store
//! on a fresh database; a test that kills nodes gets its own (`private`).
use std::{
    fs,
    path::{Path, PathBuf},
    process::Command,
    sync::{
        OnceLock,
        atomic::{AtomicU32, Ordering},
    },
    time::{Duration, Instant},
};

use anyhow::{Context as _, bail};

use crate::clickhouse::{Ports, PrivateClickHouse, Runner};

/// The cluster's name in every node's `remote_servers`.
pub const CLUSTER: &str = "sqlbee_test";
pub const SHARDS: usize = 2;
pub const REPLICAS: usize = 2;

pub struct ClickHouseCluster {
    /// Shard-major: shard 1's replicas, then shard 2's.
    pub nodes: Vec<PrivateClickHouse>,
    zookeeper: Runner,
    pub zookeeper_port: u16,
    /// Removed on drop (the shared cluster is a static, never dropped:
    /// its directory goes with the next run's orphan sweep).
    dir: PathBuf,
}

static SHARED: OnceLock<Result<ClickHouseCluster, String>> = OnceLock::new();
static CLUSTERS: AtomicU32 = AtomicU32::new(0);

impl ClickHouseCluster {
    /// The process's cluster, started on first use. Err says why there is
    /// none (not installed, failed to start).
    pub fn shared() -> Result<&'static ClickHouseCluster, String> {
        SHARED.get_or_init(|| Self::launch("shared").map_err(|e| format!("{e:#}"))).as_ref().map_err(Clone::clone)
    }

    /// A cluster of the caller's own, whose nodes it may stop and start.
    pub fn private(name: &str) -> anyhow::Result<ClickHouseCluster> {
        let clean: String = name.chars().map(|c| if c.is_ascii_alphanumeric() { c } else { '_' }).collect();
        Self::launch(&clean)
    }

    /// The node of `shard` and `replica` (both from 1).
    pub fn node(&self, shard: usize, replica: usize) -> &PrivateClickHouse {
        &self.nodes[(shard - 1) * REPLICAS + (replica - 1)]
    }

    /// A database name nobody used yet: the store creates it.
    pub fn fresh_database(&self, name: &str) -> String {
        self.nodes[0].fresh_database(name)
    }

    /// `clickhouse://NODE,NODE,.../DATABASE?cluster=NAME` for `--store`.
    pub fn location(&self, database: &str) -> String {
        let nodes: Vec<&str> = self.nodes.iter().map(|n| n.host_port.as_str()).collect();
        format!("clickhouse://{}/{database}?cluster={CLUSTER}", nodes.join(","))
    }

    /// Waits until every replica on every node has copied its shard's
    /// log and fetched every inserted part (replication is asynchronous: a
    /// read through a replica still fetching gives a short answer).
    pub fn wait_replicated(&self, limit: Duration) -> anyhow::Result<()> {
        let started = Instant::now();
        // log_pointer is the next entry of the shard's log a replica will
        // copy: past log_max_index once it copied them all (an empty log
        // has both at 0).
        let behind = "SELECT database, table, is_readonly, inserts_in_queue, log_pointer, log_max_index
                      FROM system.replicas
                      WHERE is_readonly OR inserts_in_queue > 0 OR (log_max_index > 0 AND log_pointer <= log_max_index)
                      FORMAT TSV";
        loop {
            let lagging: Vec<String> = self
                .nodes
                .iter()
                .filter_map(|n| match n.sql(behind) {
                    Ok(rows) if rows.trim().is_empty() => None,
                    Ok(rows) => Some(format!("{}: {}", n.host_port, rows.lines().next().unwrap_or(""))),
                    Err(e) => Some(format!("{}: {e:#}", n.host_port)),
                })
                .collect();
            if lagging.is_empty() {
                return Ok(());
            }
            if started.elapsed() > limit {
                bail!(
                    "replicas still behind after {limit:?} (database, table, is_readonly, inserts_in_queue, log_pointer, log_max_index): {lagging:?}"
                );
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// Kills ZooKeeper (SIGKILL).
    pub fn stop_zookeeper(&self) -> anyhow::Result<()> {
        self.zookeeper.stop()
    }

    /// Starts ZooKeeper again on its data and port, and waits until it
    /// answers.
    pub fn start_zookeeper(&self) -> anyhow::Result<()> {
        self.zookeeper.start().context("starting ZooKeeper")?;
        wait_zookeeper(self.zookeeper_port, &self.dir)
    }

    fn launch(name: &str) -> anyhow::Result<ClickHouseCluster> {
        crate::clickhouse::remove_orphaned_dirs();
        crate::clickhouse::twice(&format!("the ClickHouse cluster {name}"), || Self::launch_once(name))
    }

    fn launch_once(name: &str) -> anyhow::Result<ClickHouseCluster> {
        let n = CLUSTERS.fetch_add(1, Ordering::Relaxed);
        let dir = std::env::temp_dir().join(format!("sqlbee-clickhouse-{}-cluster-{name}-{n}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir)?;
        let zookeeper_port = crate::ports::free_port()?;
        let zookeeper = start_zookeeper(&dir.join("zookeeper"), zookeeper_port)?;
        let ports: Vec<Ports> = (0..SHARDS * REPLICAS).map(|_| Ports::free()).collect::<anyhow::Result<_>>()?;
        let mut nodes = Vec::new();
        for (at, own) in ports.iter().enumerate() {
            let (shard, replica) = (at / REPLICAS + 1, at % REPLICAS + 1);
            let include = substitutions(&ports, zookeeper_port, shard, replica);
            let node_dir = dir.join(format!("s{shard}r{replica}"));
            nodes.push(PrivateClickHouse::prepare(&node_dir, *own, Some(&include))?);
        }
        let cluster = ClickHouseCluster { nodes, zookeeper, zookeeper_port, dir };
        for node in &cluster.nodes {
            node.start()?;
        }
        Ok(cluster)
    }
}

/// A node's substitutions: the cluster (every node, by TCP port), the
/// ZooKeeper and this node's macros.
fn substitutions(ports: &[Ports], zookeeper_port: u16, shard: usize, replica: usize) -> String {
    let mut shards = String::new();
    for s in ports.chunks(REPLICAS) {
        shards.push_str("<shard><internal_replication>true</internal_replication>");
        for p in s {
            shards.push_str(&format!("<replica><host>127.0.0.1</host><port>{}</port></replica>", p.tcp));
        }
        shards.push_str("</shard>");
    }
    format!(
        "<yandex>\n<clickhouse_remote_servers><{CLUSTER}>{shards}</{CLUSTER}></clickhouse_remote_servers>\n\
         <zookeeper-servers><node><host>127.0.0.1</host><port>{zookeeper_port}</port></node>\
         <session_timeout_ms>10000</session_timeout_ms></zookeeper-servers>\n\
         <macros><shard>{shard}</shard><replica>r{replica}</replica></macros>\n</yandex>\n"
    )
}

/// Debian's ZooKeeper, run in the foreground with a config of its own.
fn start_zookeeper(dir: &Path, port: u16) -> anyhow::Result<Runner> {
    let jar = Path::new("/usr/share/java/zookeeper.jar");
    if !jar.exists() || Command::new("java").arg("-version").output().is_err() {
        bail!("ZooKeeper is not installed: run `./x setup` (installs Debian's zookeeper)");
    }
    fs::create_dir_all(dir.join("data"))?;
    let config = dir.join("zoo.cfg");
    fs::write(
        &config,
        format!(
            "tickTime=2000\ninitLimit=10\nsyncLimit=5\ndataDir={}\nclientPort={port}\nclientPortAddress=127.0.0.1\n\
             admin.enableServer=false\n4lw.commands.whitelist=ruok\nmaxClientCnxns=0\n",
            dir.join("data").display()
        ),
    )?;
    let runner = Runner::spawn("zookeeper", dir.join("stderr.log"), move || {
        let mut cmd = Command::new("java");
        // Small heap: four test servers' metadata is a few megabytes.
        cmd.args(["-Xmx256m", "-XX:+UseSerialGC", "-cp", "/usr/share/java/zookeeper.jar"])
            .arg("org.apache.zookeeper.server.quorum.QuorumPeerMain")
            .arg(&config);
        cmd
    })?;
    runner.start().context("starting ZooKeeper")?;
    wait_zookeeper(port, dir)?;
    Ok(runner)
}

/// Waits until ZooKeeper answers `ruok`.
fn wait_zookeeper(port: u16, dir: &Path) -> anyhow::Result<()> {
    use std::io::{Read as _, Write as _};
    let started = Instant::now();
    loop {
        let answer = std::net::TcpStream::connect(("127.0.0.1", port)).and_then(|mut s| {
            s.set_read_timeout(Some(Duration::from_secs(2)))?;
            s.write_all(b"ruok")?;
            let mut out = String::new();
            s.read_to_string(&mut out)?;
            Ok(out)
        });
        if answer.is_ok_and(|a| a == "imok") {
            return Ok(());
        }
        if started.elapsed() > crate::clickhouse::READY_WITHIN {
            let log = fs::read_to_string(dir.join("stderr.log")).unwrap_or_default();
            bail!(
                "ZooKeeper did not answer within {:?}: {}",
                crate::clickhouse::READY_WITHIN,
                log.lines().rev().take(20).collect::<Vec<_>>().join("\n")
            );
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

impl Drop for ClickHouseCluster {
    fn drop(&mut self) {
        for node in &self.nodes {
            let _ = node.stop();
        }
        let _ = self.zookeeper.stop();
        let _ = fs::remove_dir_all(&self.dir);
    }
}

/// The shared cluster for a test named `test`, or None after saying why
/// it skips; under SQLBEE_REQUIRE_PRIVILEGED (CI, `./x test`) a missing
/// cluster is a failure instead.
pub fn cluster_for_test(test: &str) -> Option<&'static ClickHouseCluster> {
    match ClickHouseCluster::shared() {
        Ok(cluster) => Some(cluster),
        Err(why) => skip_or_fail(test, &why),
    }
}

/// A cluster of its own for a test named `test` that stops and starts its
/// nodes, or None after saying why it skips (as `cluster_for_test`).
pub fn private_cluster_for_test(test: &str) -> Option<ClickHouseCluster> {
    match ClickHouseCluster::private(test) {
        Ok(cluster) => Some(cluster),
        Err(why) => skip_or_fail(test, &format!("{why:#}")),
    }
}

fn skip_or_fail<T>(test: &str, why: &str) -> Option<T> {
    if std::env::var_os("SQLBEE_REQUIRE_PRIVILEGED").is_some() {
        panic!("{test}: needs a ClickHouse cluster, and SQLBEE_REQUIRE_PRIVILEGED is set: {why}");
    }
    eprintln!("skipping {test}: {why}");
    None
}
