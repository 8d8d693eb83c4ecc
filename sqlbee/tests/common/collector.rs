//! A real `sqlbee collector` process on a private port and store, plus
//! builders for batches and clients, for tests of the collector and of
//! anything that ships to one. The store is a SQLite file in the
//! collector's directory, or with SQLBEE_TEST_STORE=clickhouse a fresh
//! database on the test process's private ClickHouse server
//! (`xtask::clickhouse`).
use std::{
    path::{Path, PathBuf},
    process::{Child, Command, Output},
    time::{Duration, Instant, SystemTime, UNIX_EPOCH},
};

use serde_json::Value;
use sqlbee_proto::client::{self, BearerToken, ClientOptions};
use sqlbee_proto::v1::{
    AgentIdentity, Batch, Bucket, CommandCount, DigestStats, Histogram, InstanceWindow, PushResponse, ServerInstance,
    ingest_client::IngestClient, query_client::QueryClient,
};
use sqlbee_vocabulary::histogram::{Histogram as AgentHistogram, bucket_of};
use tonic::{service::interceptor::InterceptedService, transport::Channel};

/// A directory removed when dropped.
pub struct TempDir(pub PathBuf);

impl TempDir {
    pub fn new(name: &str) -> TempDir {
        use std::sync::atomic::{AtomicU32, Ordering};
        static N: AtomicU32 = AtomicU32::new(0);
        let dir = std::env::temp_dir().join(format!(
            "sqlbee-{name}-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        TempDir(dir)
    }

    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// True when the tests run against ClickHouse (SQLBEE_TEST_STORE=clickhouse,
/// or clickhouse-cluster for a cluster of two shards of two replicas).
pub fn clickhouse_store() -> bool {
    std::env::var("SQLBEE_TEST_STORE").is_ok_and(|s| s == "clickhouse" || s == "clickhouse-cluster")
}

fn clickhouse_cluster_store() -> bool {
    std::env::var("SQLBEE_TEST_STORE").is_ok_and(|s| s == "clickhouse-cluster")
}

/// False, after saying why, when `test` checks the SQLite file itself and
/// the tests run against ClickHouse.
pub fn sqlite_store(test: &str, why: &str) -> bool {
    if clickhouse_store() {
        eprintln!("skipping {test} with SQLBEE_TEST_STORE=clickhouse: {why}");
        return false;
    }
    true
}

/// A fresh store for one collector: a SQLite file in `dir`, or a new
/// database on the shared ClickHouse server or cluster.
fn default_store(dir: &Path) -> String {
    if clickhouse_cluster_store() {
        let cluster = xtask::clickhouse_cluster::ClickHouseCluster::shared().unwrap_or_else(|why| {
            panic!("SQLBEE_TEST_STORE=clickhouse-cluster, but there is no ClickHouse cluster: {why}")
        });
        return cluster.location(&cluster.fresh_database("collector"));
    }
    if clickhouse_store() {
        let server = xtask::clickhouse::PrivateClickHouse::shared()
            .unwrap_or_else(|why| panic!("SQLBEE_TEST_STORE=clickhouse, but there is no ClickHouse server: {why}"));
        return server.location(&server.fresh_database("collector"));
    }
    format!("sqlite:{}", dir.join("store.db").display())
}

pub fn now_ms() -> i64 {
    SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_millis() as i64
}

/// A running `sqlbee collector`, killed when dropped.
pub struct Collector {
    child: Option<Child>,
    pub addr: String,
    pub dir: TempDir,
    stderr: PathBuf,
    args: Vec<String>,
    /// `--store`, kept across restarts.
    store: String,
    /// The `sqlbee` binary that runs it.
    pub binary: PathBuf,
    /// The web UI's URL (`http://127.0.0.1:PORT/`), on a port of its own
    /// unless the test's arguments say otherwise.
    pub ui: String,
}

impl Collector {
    /// Starts a collector on 127.0.0.1:0 with its own store and waits for
    /// its ready file (which holds the bound address).
    pub fn start(args: &[String]) -> Collector {
        Collector::start_binary(Path::new(env!("CARGO_BIN_EXE_sqlbee")), args)
    }

    /// As `start`, with another build of `sqlbee` (the collector-only one).
    pub fn start_binary(binary: &Path, args: &[String]) -> Collector {
        Self::start_with(binary, None, args)
    }

    /// With its SQLite file at `store` (a small filesystem, say).
    pub fn start_on_store(store: &Path, args: &[String]) -> Collector {
        Self::start_with(Path::new(env!("CARGO_BIN_EXE_sqlbee")), Some(format!("sqlite:{}", store.display())), args)
    }

    /// With `--store location` (another collector's store, say).
    pub fn start_at(location: &str, args: &[String]) -> Collector {
        Self::start_with(Path::new(env!("CARGO_BIN_EXE_sqlbee")), Some(location.to_string()), args)
    }

    fn start_with(binary: &Path, store: Option<String>, args: &[String]) -> Collector {
        let dir = TempDir::new("collector");
        let stderr = dir.path().join("collector.log");
        let mut collector = Collector {
            child: None,
            addr: "127.0.0.1:0".into(),
            store: store.unwrap_or_else(|| default_store(dir.path())),
            dir,
            stderr,
            args: args.to_vec(),
            binary: binary.to_path_buf(),
            ui: String::new(),
        };
        collector.spawn();
        collector
    }

    fn spawn(&mut self) {
        let ready = self.dir.path().join("ready");
        let ui_ready = self.dir.path().join("ui-ready");
        let _ = std::fs::remove_file(&ready);
        let _ = std::fs::remove_file(&ui_ready);
        let log = std::fs::OpenOptions::new().create(true).append(true).open(&self.stderr).unwrap();
        // Many collectors run at once in tests: each UI on a port of its own.
        let ui_listen: &[&str] = if self.args.iter().any(|a| a.starts_with("--http-listen")) {
            &[]
        } else {
            &["--http-listen", "127.0.0.1:0"]
        };
        let child = Command::new(&self.binary)
            .arg("collector")
            .args(["--listen", &self.addr])
            .arg("--store")
            .arg(&self.store)
            .arg("--ready-file")
            .arg(&ready)
            .arg("--http-ready-file")
            .arg(&ui_ready)
            .args(ui_listen)
            .args(&self.args)
            .env("SQLBEE_LOG", "info,sqlbee=debug")
            .stdout(std::process::Stdio::null())
            .stderr(log)
            .spawn()
            .expect("starting sqlbee collector");
        self.child = Some(child);
        let started = Instant::now();
        loop {
            if let Ok(text) = std::fs::read_to_string(&ready)
                && !text.trim().is_empty()
            {
                self.addr = text.trim().to_string();
                self.ui = std::fs::read_to_string(&ui_ready).unwrap_or_default().trim().to_string();
                break;
            }
            if let Some(status) = self.child.as_mut().unwrap().try_wait().unwrap() {
                panic!("collector exited before listening ({status}): {}", self.stderr_text());
            }
            assert!(started.elapsed() < Duration::from_secs(30), "collector not ready: {}", self.stderr_text());
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    pub fn pid(&self) -> u32 {
        self.child.as_ref().map_or(0, |c| c.id())
    }

    /// A crash: SIGKILL, store and address kept for `restart`.
    pub fn kill9(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts again on the same address and store.
    pub fn restart(&mut self) {
        self.kill9();
        self.spawn();
    }

    pub fn http_url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// With the port of `addr` but the name `localhost`, as in the
    /// certificates the tests generate.
    pub fn https_url(&self) -> String {
        format!("https://localhost:{}", self.addr.rsplit(':').next().unwrap())
    }

    pub fn stderr_text(&self) -> String {
        std::fs::read_to_string(&self.stderr).unwrap_or_default()
    }

    /// SIGTERM and wait; returns whether it exited successfully.
    pub fn stop(mut self) -> (bool, String) {
        let mut child = self.child.take().unwrap();
        // SAFETY: kill(2) on our own child.
        unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
        let status = child.wait().unwrap();
        (status.success(), self.stderr_text())
    }
}

impl Drop for Collector {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

pub type Authed = InterceptedService<Channel, BearerToken>;

pub async fn channel(opts: &ClientOptions) -> Channel {
    client::connect(opts).await.unwrap_or_else(|e| panic!("connecting to {}: {e}", opts.url))
}

pub async fn ingest_client(opts: &ClientOptions) -> IngestClient<Authed> {
    let token = BearerToken::new(opts.token.as_deref()).unwrap();
    IngestClient::with_interceptor(channel(opts).await, token).max_decoding_message_size(64 << 20)
}

pub async fn query_client(opts: &ClientOptions) -> QueryClient<Authed> {
    let token = BearerToken::new(opts.token.as_deref()).unwrap();
    QueryClient::with_interceptor(channel(opts).await, token)
}

pub fn plain(url: &str) -> ClientOptions {
    ClientOptions { url: url.to_string(), ..Default::default() }
}

/// The id an agent gives `text`.
pub fn id_of(text: &str) -> u64 {
    sqlbee_vocabulary::digest_id::of(text)
}

/// One digest whose statements took `durations_ns`, as an agent reports it.
pub fn digest(text: &str, durations_ns: &[u64]) -> DigestStats {
    let mut histogram = std::collections::BTreeMap::<u32, u64>::new();
    for &ns in durations_ns {
        *histogram.entry(bucket_of(ns) as u32).or_default() += 1;
    }
    DigestStats {
        digest: id_of(text),
        digest_text: text.to_string(),
        count: durations_ns.len() as u64,
        errors: 0,
        sum_ns: durations_ns.iter().sum(),
        min_ns: durations_ns.iter().copied().min().unwrap_or(0),
        max_ns: durations_ns.iter().copied().max().unwrap_or(0),
        histogram: Some(Histogram {
            scheme: 1,
            buckets: histogram.into_iter().map(|(index, count)| Bucket { index, count }).collect(),
        }),
        sample: text.replace('?', "1"),
        truncated: 0,
        estimated_count: 0,
        error_codes: vec![],
        waits: vec![],
        ..Default::default()
    }
}

/// p-quantile of `durations_ns` the way the agent computes it.
pub fn agent_quantile(durations_ns: &[u64], q: f64) -> u64 {
    let mut h = AgentHistogram::default();
    for &ns in durations_ns {
        h.record(ns);
    }
    let (min, max) = (*durations_ns.iter().min().unwrap(), *durations_ns.iter().max().unwrap());
    h.quantile(q).clamp(min, max)
}

pub fn window(instance: &str, pid: u32, end_ms: i64, digests: Vec<DigestStats>) -> InstanceWindow {
    let statements: u64 = digests.iter().map(|d| d.count).sum();
    InstanceWindow {
        instance: Some(ServerInstance {
            name: instance.to_string(),
            pid,
            start_time_unix_ms: end_ms - 3_600_000,
            ..Default::default()
        }),
        window_start_unix_ms: end_ms - 10_000,
        window_end_unix_ms: end_ms,
        digests,
        commands: vec![CommandCount { command: "COM_QUERY".into(), count: statements }],
        statements,
        events: statements,
        ..Default::default()
    }
}

pub fn batch(agent_id: &str, sequence: u64, windows: Vec<InstanceWindow>) -> Batch {
    Batch {
        agent: Some(AgentIdentity {
            host: "test-host".into(),
            agent_id: agent_id.into(),
            version: "0.1.0-test".into(),
        }),
        sequence,
        created_unix_ms: now_ms(),
        windows,
        gaps: vec![],
        agent_windows: vec![],
        epoch: 0,
        // As agents from before the field: the collector hashes the
        // content itself, so a test may change a batch after making it.
        content_hash: 0,
    }
}

pub async fn push(client: &mut IngestClient<Authed>, batch: Batch) -> Result<PushResponse, tonic::Status> {
    client.push(batch).await.map(|r| r.into_inner())
}

/// Runs a `sqlbee` query command (top, instances) and returns its output.
pub fn sqlbee_query(args: &[&str]) -> Output {
    sqlbee_query_with(Path::new(env!("CARGO_BIN_EXE_sqlbee")), args)
}

/// As `sqlbee_query`, with another build of `sqlbee`.
pub fn sqlbee_query_with(binary: &Path, args: &[&str]) -> Output {
    Command::new(binary).args(args).env("SQLBEE_LOG", "warn").output().expect("running sqlbee")
}

/// `sqlbee top --format json ...`: its digests array.
pub fn top_json(url: &str, extra: &[&str]) -> Value {
    top_answer(url, extra)["digests"].take()
}

/// `sqlbee top --format json ...` whole ({digests, costs}), parsed; panics
/// with stderr on failure.
pub fn top_answer(url: &str, extra: &[&str]) -> Value {
    let mut args = vec!["top", "--collector", url, "--format", "json"];
    if !extra.contains(&"--since") {
        args.extend(["--since", "all"]);
    }
    args.extend_from_slice(extra);
    let out = sqlbee_query(&args);
    assert!(out.status.success(), "sqlbee top failed: {}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("sqlbee top printed no JSON ({e}): {}", String::from_utf8_lossy(&out.stdout)))
}

/// Statement texts of `rich_window`.
pub const RICH_POINT: &str = "SELECT `v` FROM `app`.`orders` WHERE `email` = ?";
pub const RICH_UPDATE: &str = "UPDATE `app`.`orders` SET `v` = ? WHERE `id` = ?";

/// A window ending at `now` with something in every part of an answer:
/// seven point reads (waits, an error code, the server's figures, an
/// account) and three updates of `app.orders`, a change to that table, a
/// plan that scans it, a lock wait and a long statement.
#[allow(dead_code)]
pub fn rich_window(instance: &str, now: i64) -> InstanceWindow {
    use sqlbee_proto::v1::{
        AccountCount, Blocker, Change, ErrorCount, LockWait, LongStatement, Plan, QueryStats, TableAccess, TableUse,
        WaitStats,
    };
    let orders = |write| TableUse { schema: "app".into(), table: "orders".into(), write };
    let point = DigestStats {
        statement_kind: "SELECT".into(),
        tables: vec![orders(false)],
        schema: "app".into(),
        errors: 1,
        error_codes: vec![ErrorCount { code: 1205, count: 1, sample_message: "Lock wait timeout exceeded".into() }],
        waits: vec![WaitStats {
            class: "row_lock".into(),
            sum_ns: 2_000_000_000,
            max_ns: 2_000_000_000,
            statements: 1,
        }],
        accounts: vec![AccountCount { user: "app".into(), host: "10.0.0.%".into(), count: 7 }],
        stats: Some(QueryStats { rows_examined: Some(140_000), rows_sent: Some(7), ..Default::default() }),
        ..digest(RICH_POINT, &[900_000; 7])
    };
    let update = DigestStats {
        statement_kind: "UPDATE".into(),
        tables: vec![orders(true)],
        schema: "app".into(),
        ..digest(RICH_UPDATE, &[50_000, 60_000, 70_000])
    };
    let mut w = window(instance, 1, now, vec![point, update]);
    w.changes = vec![Change {
        kind: "schema".into(),
        action: "ALTER TABLE".into(),
        objects: vec!["app.orders".into(), "index by_email".into()],
        digest: id_of("ALTER TABLE `app`.`orders` DROP INDEX `by_email`"),
        digest_text: "ALTER TABLE `app`.`orders` DROP INDEX `by_email`".into(),
        user: "deploy".into(),
        host: "localhost".into(),
        start_unix_ms: now - 5_000,
        duration_ns: 3_000_000,
        ..Default::default()
    }];
    w.plans = vec![Plan {
        digest: id_of(RICH_POINT),
        schema: "app".into(),
        explained_unix_ms: now - 1_000,
        plan_hash: 7,
        access: vec![TableAccess {
            table: "orders".into(),
            r#type: "ALL".into(),
            rows: Some(20_000),
            ..Default::default()
        }],
        plan_json: serde_json::json!({"query_block": {"table": {"table_name": "orders", "access_type": "ALL",
            "attached_condition": "orders.email = ?"}}})
        .to_string(),
        ..Default::default()
    }];
    w.lock_waits = vec![LockWait {
        start_unix_ms: now - 4_000,
        duration_ns: 2_000_000_000,
        class: "row_lock".into(),
        connection_id: 41,
        digest: id_of(RICH_POINT),
        digest_text: RICH_POINT.into(),
        sample: RICH_POINT.replace('?', "'?'"),
        blocker_kind: "transaction".into(),
        blockers: vec![Blocker {
            connection_id: 42,
            transaction: true,
            started_unix_ms: now - 6_000,
            statements: vec![RICH_UPDATE.into()],
        }],
    }];
    w.long_statements = vec![LongStatement {
        connection_id: 41,
        digest: id_of(RICH_POINT),
        digest_text: RICH_POINT.into(),
        schema: "app".into(),
        user: "app".into(),
        host: "10.0.0.7".into(),
        sample: RICH_POINT.replace('?', "'?'"),
        start_unix_ms: now - 4_000,
        duration_ns: 2_100_000_000,
        outcome: "long".into(),
        error_code: 1205,
        blocked_by: 42,
        ..Default::default()
    }];
    w
}
