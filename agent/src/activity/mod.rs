//! What runs now on each traced server, read from its memory once a
//! second: no probe fires for it and no statement pays for it (the reads
//! are `process_vm_readv` calls by the agent, see `threads`). With
//! `--server-login`, the blockers the server names are added (`blockers`).
//!
//! The `activity` thread owns the readers; the probe thread hands it the
//! servers it traces, and each snapshot goes to the ship stage, which
//! sends it to the collector at once (a newer one replaces it, nothing is
//! stored). Texts are redacted as samples are.
mod blockers;
mod memory;
mod threads;

use std::{
    collections::HashMap,
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, Ordering},
    },
    thread,
    time::{Duration, Instant, SystemTime},
};

use sqlbee_kernel_abi::ServerLayout;
use tracing::warn;

use blockers::{BlockerReader, INNODB};
pub use blockers::{Edge, metadata_edges};
use threads::{RawConnection, ThreadReader};

use crate::{
    aggregate::DeadlockPartner,
    discover::{ActivityLayout, ServerProcess},
    normalize::{Normalizer, Samples, TableUse, Tables, tables_of},
    server_login::ServerLogin,
};

/// Bytes of a running statement's sample kept.
const SAMPLE_BYTES: usize = 4096;

#[derive(Clone, Debug)]
pub struct ActivityConfig {
    pub interval: Duration,
    pub samples: Samples,
    /// Adds the blockers the server names.
    pub login: Option<ServerLogin>,
}

/// A traced server, as the probe stage knows it.
#[derive(Clone, Debug)]
pub struct Target {
    pub server: ServerProcess,
    pub build_id: Option<String>,
    pub version: Option<String>,
    pub layout: ServerLayout,
    pub activity: Result<ActivityLayout, String>,
}

/// One server's connections at one moment.
#[derive(Clone, Debug)]
pub struct Snapshot {
    pub server: ServerProcess,
    pub build_id: Option<String>,
    pub version: Option<String>,
    pub connections: Vec<Connection>,
    pub warning: Option<String>,
    pub blocker_sources: Vec<&'static str>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Connection {
    pub thread_id: u64,
    pub user: String,
    pub host: String,
    pub schema: String,
    pub command: String,
    /// The server's stage, or `idle in transaction`.
    pub state: String,
    /// 0 when it runs no statement.
    pub digest: u64,
    pub digest_text: String,
    pub sample: String,
    pub running_ms: u64,
    pub wait: Option<&'static str>,
    pub blocked_by: Option<(u64, &'static str)>,
    pub in_transaction: bool,
    pub killed: bool,
    pub system: bool,
}

/// Hands each round's snapshots on.
pub type Deliver = Box<dyn FnMut(SystemTime, Vec<Snapshot>) + Send>;

/// The blocker last named for each waiting connection, and when: a long
/// statement that ends later learns from it who blocked it while it ran.
#[derive(Default)]
pub struct BlockersSeen {
    seen: Mutex<HashMap<(String, u64), (u64, u64)>>,
    /// Each deadlock victim's other side, by (instance, victim), and when
    /// the report was read.
    deadlocks: Mutex<HashMap<(String, u64), (DeadlockPartner, u64)>>,
}

/// Deadlocks remembered at most.
const DEADLOCKS_MAX: usize = 10_000;

/// Waiters remembered at most, and for how long.
const SEEN_MAX: usize = 100_000;
const SEEN_FOR_NS: u64 = 600_000_000_000;

impl BlockersSeen {
    fn note(&self, instance: &str, connections: &[Connection], now_ns: u64) {
        let mut seen = self.seen.lock().unwrap_or_else(|e| e.into_inner());
        seen.retain(|_, (_, at)| now_ns.saturating_sub(*at) < SEEN_FOR_NS);
        for c in connections {
            if let Some((blocker, _)) = c.blocked_by
                && (seen.len() < SEEN_MAX || seen.contains_key(&(instance.to_string(), c.thread_id)))
            {
                seen.insert((instance.to_string(), c.thread_id), (blocker, now_ns));
            }
        }
    }

    fn note_deadlock(&self, instance: &str, victim: u64, partner: DeadlockPartner, now_ns: u64) {
        let mut seen = self.deadlocks.lock().unwrap_or_else(|e| e.into_inner());
        seen.retain(|_, (_, at)| now_ns.saturating_sub(*at) < SEEN_FOR_NS);
        if seen.len() < DEADLOCKS_MAX {
            seen.insert((instance.to_string(), victim), (partner, now_ns));
        }
    }

    /// The other side of the deadlock this connection's statement, which
    /// ended at `ended_ns`, lost: a report read at most a minute after.
    pub fn deadlock_partner(&self, instance: &str, connection_id: u64, ended_ns: u64) -> Option<DeadlockPartner> {
        let seen = self.deadlocks.lock().unwrap_or_else(|e| e.into_inner());
        let (partner, at) = seen.get(&(instance.to_string(), connection_id))?;
        (*at + 1_000_000_000 >= ended_ns && *at <= ended_ns + 60_000_000_000).then(|| partner.clone())
    }

    /// The blocker named for this connection between `from_ns` and
    /// `to_ns` (CLOCK_MONOTONIC), if any.
    pub fn blocker_of(&self, instance: &str, connection_id: u64, from_ns: u64, to_ns: u64) -> Option<u64> {
        let seen = self.seen.lock().unwrap_or_else(|e| e.into_inner());
        let (blocker, at) = seen.get(&(instance.to_string(), connection_id))?;
        (from_ns <= *at && *at <= to_ns).then_some(*blocker)
    }
}

pub struct Watcher {
    targets: Arc<Mutex<Vec<Target>>>,
    stop: Arc<AtomicBool>,
    thread: Option<thread::JoinHandle<()>>,
}

impl Watcher {
    pub fn start(config: ActivityConfig, deliver: Deliver, seen: Arc<BlockersSeen>) -> std::io::Result<Watcher> {
        let targets = Arc::new(Mutex::new(Vec::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let (shared, stopping) = (targets.clone(), stop.clone());
        let thread = thread::Builder::new().name("activity".into()).spawn(move || {
            let mut rounds = Rounds::new(config, deliver);
            rounds.seen = seen;
            rounds.run(&shared, &stopping)
        })?;
        Ok(Watcher { targets, stop, thread: Some(thread) })
    }

    /// The servers to read from the next round on.
    pub fn set_targets(&self, targets: Vec<Target>) {
        *self.targets.lock().unwrap_or_else(|e| e.into_inner()) = targets;
    }
}

impl Drop for Watcher {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// Snapshots read one at a time, with no login (benchmarks and tools; the
/// agent reads through `Watcher`). It keeps what it learned of each server
/// between reads, as the agent does.
pub struct SnapshotReader(Rounds);

impl SnapshotReader {
    pub fn new(samples: Samples) -> SnapshotReader {
        let config = ActivityConfig { interval: Duration::from_secs(1), samples, login: None };
        SnapshotReader(Rounds::new(config, Box::new(|_, _| {})))
    }

    pub fn read(&mut self, target: &Target) -> Snapshot {
        self.0.snapshot(target, Instant::now())
    }
}

/// A server's readers, kept while it runs.
struct ServerState {
    threads: Result<ThreadReader, String>,
    blockers: Option<BlockerReader>,
    warned: bool,
}

struct Rounds {
    config: ActivityConfig,
    deliver: Deliver,
    normalizer: Normalizer,
    servers: HashMap<(u32, u64), ServerState>,
    seen: Arc<BlockersSeen>,
}

impl Rounds {
    fn new(config: ActivityConfig, deliver: Deliver) -> Rounds {
        Rounds { config, deliver, normalizer: Normalizer::new(4096), servers: HashMap::new(), seen: Arc::default() }
    }

    fn run(mut self, targets: &Mutex<Vec<Target>>, stop: &AtomicBool) {
        let mut next = Instant::now();
        while !stop.load(Ordering::Relaxed) {
            let now = Instant::now();
            if now < next {
                thread::sleep((next - now).min(Duration::from_millis(100)));
                continue;
            }
            next = now + self.config.interval;
            let targets = targets.lock().unwrap_or_else(|e| e.into_inner()).clone();
            if targets.is_empty() {
                continue;
            }
            self.servers.retain(|key, _| targets.iter().any(|t| (t.server.pid, t.server.start_ticks) == *key));
            let snapshots = targets.iter().map(|t| self.snapshot(t, now)).collect();
            (self.deliver)(SystemTime::now(), snapshots);
        }
    }

    fn snapshot(&mut self, target: &Target, now: Instant) -> Snapshot {
        let key = (target.server.pid, target.server.start_ticks);
        let login = self.config.login.clone();
        let state = self.servers.entry(key).or_insert_with(|| ServerState {
            threads: target.activity.clone().and_then(|layout| {
                ThreadReader::new(target.server.pid, target.layout, layout)
                    .ok_or_else(|| "the server's image is not mapped where the agent looks".to_string())
            }),
            blockers: login.map(|login| BlockerReader::new(target.server.pid, login)),
            warned: false,
        });
        let mut snapshot = Snapshot {
            server: target.server.clone(),
            build_id: target.build_id.clone(),
            version: target.version.clone(),
            connections: Vec::new(),
            warning: None,
            blocker_sources: Vec::new(),
        };
        let walk = match &mut state.threads {
            Ok(reader) => reader.read().map_err(|e| e.to_string()),
            Err(why) => Err(why.clone()),
        };
        let walk = match walk {
            Ok(walk) => walk,
            Err(why) => {
                if !state.warned {
                    warn!(instance = target.server.instance, reason = why, "no activity from this server");
                    state.warned = true;
                }
                snapshot.warning = Some(format!("no activity: {why}"));
                return snapshot;
            }
        };
        if walk.partial {
            snapshot.warning = Some("the connection list changed while it was read; some may be missing".into());
        }
        let now_us = monotonic_us();
        let samples = self.config.samples;
        let mut connections: Vec<Connection> =
            walk.connections.into_iter().map(|raw| describe(raw, now_us, samples, &mut self.normalizer)).collect();
        if let Some(blockers) = &mut state.blockers {
            let reading = blockers.read(now);
            if let Some(warning) = reading.warning {
                snapshot.warning.get_or_insert(warning);
            }
            snapshot.blocker_sources = reading.sources;
            if let Some(deadlock) = reading.deadlock {
                self.note_deadlock(&target.server.instance, deadlock, now_us * 1000);
            }
            let mut edges = reading.row_lock_edges;
            if let Some(locks) = &reading.table_locks {
                edges.extend(metadata_blockers(&connections, locks));
            }
            for connection in &mut connections {
                // A connection waits on one thing at a time; the first
                // named wins.
                if let Some(edge) = edges.iter().find(|e| e.waiter == connection.thread_id) {
                    connection.blocked_by = Some((edge.blocker, edge.source));
                    if edge.source == INNODB {
                        connection.wait = Some("row_lock");
                    }
                }
            }
        }
        connections.sort_by_key(|c| c.thread_id);
        self.seen.note(&target.server.instance, &connections, now_us * 1000);
        snapshot.connections = connections;
        snapshot
    }
}

impl Rounds {
    /// Remembers the victim's other side, digested and redacted.
    fn note_deadlock(&mut self, instance: &str, report: blockers::DeadlockReport, now_ns: u64) {
        let victim = report.transactions[report.victim].0;
        let Some((other, text)) =
            report.transactions.iter().enumerate().find(|(i, _)| *i != report.victim).map(|(_, t)| t)
        else {
            return;
        };
        let digest = self.normalizer.normalize(text);
        let partner = DeadlockPartner {
            connection_id: *other,
            digest: digest.id,
            digest_text: digest.text.to_string(),
            sample: self.config.samples.statement(text, SAMPLE_BYTES),
        };
        tracing::info!(instance, victim, other, "a deadlock: the server rolled back one side");
        self.seen.note_deadlock(instance, victim, partner, now_ns);
    }
}

fn metadata_blockers(connections: &[Connection], locks: &[blockers::TableLock]) -> Vec<Edge> {
    let waiting: Vec<&Connection> = connections.iter().filter(|c| c.wait == Some("metadata_lock")).collect();
    if waiting.is_empty() {
        return Vec::new();
    }
    let tables: Vec<(u64, Vec<(String, String)>)> = waiting
        .iter()
        .map(|c| {
            let schema = (!c.schema.is_empty()).then_some(c.schema.as_str());
            let mut names = match tables_of(&c.digest_text, schema) {
                Tables::Known { tables, .. } => {
                    tables.into_iter().map(|TableUse { schema, table, .. }| (schema, table)).collect()
                }
                Tables::Unknown => Vec::new(),
            };
            // DDL the parser cannot read (`VARCHAR (?)`): the tables whose
            // locks are held that the text names.
            if names.is_empty() {
                names = locks
                    .iter()
                    .filter(|l| names_table(&c.digest_text, schema, &l.schema, &l.table))
                    .map(|l| (l.schema.clone(), l.table.clone()))
                    .collect();
            }
            (c.thread_id, names)
        })
        .collect();
    let ids: Vec<u64> = waiting.iter().map(|c| c.thread_id).collect();
    let started: HashMap<u64, u64> = connections.iter().map(|c| (c.thread_id, u64::MAX - c.running_ms)).collect();
    metadata_edges(&tables, locks, &ids, &started)
}

/// Whether a digest text (run in `schema`) names `lock_schema.table`.
fn names_table(digest_text: &str, schema: Option<&str>, lock_schema: &str, table: &str) -> bool {
    digest_text.contains(&format!("`{lock_schema}`.`{table}`"))
        || (schema == Some(lock_schema) && digest_text.contains(&format!("`{table}`")))
}

fn describe(raw: RawConnection, now_us: u64, samples: Samples, normalizer: &mut Normalizer) -> Connection {
    let command = command_name(raw.command);
    let sleeping = raw.command == 0;
    let (digest, digest_text, sample) = if sleeping || raw.text.is_empty() {
        (0, String::new(), String::new())
    } else {
        let digest = normalizer.normalize(&raw.text);
        (digest.id, digest.text.to_string(), samples.statement(&raw.text, SAMPLE_BYTES))
    };
    let stage = raw.stage.unwrap_or_default();
    let state = if sleeping && raw.in_transaction { "idle in transaction".to_string() } else { stage.clone() };
    let running_ms =
        if raw.start_utime > 0 && raw.start_utime <= now_us { (now_us - raw.start_utime) / 1000 } else { 0 };
    Connection {
        thread_id: raw.thread_id,
        user: raw.user.unwrap_or_default(),
        host: raw.host.unwrap_or_default(),
        schema: raw.schema.unwrap_or_default(),
        command,
        state,
        digest,
        digest_text,
        sample,
        running_ms,
        wait: wait_of(&stage),
        blocked_by: None,
        in_transaction: raw.in_transaction,
        killed: raw.killed,
        system: raw.system,
    }
}

/// The wait class a stage names; row-lock waits have no stage of their
/// own (they come from `INNODB_LOCK_WAITS`).
fn wait_of(stage: &str) -> Option<&'static str> {
    let lower = stage.to_ascii_lowercase();
    if lower.contains("metadata lock") {
        Some("metadata_lock")
    } else if lower.contains("table level lock") || lower.contains("table lock") {
        Some("table_lock")
    } else if lower.starts_with("waiting for") {
        Some("other")
    } else {
        None
    }
}

/// As `SHOW PROCESSLIST` names commands.
fn command_name(command: u32) -> String {
    match command {
        0 => "Sleep".into(),
        1 => "Quit".into(),
        2 => "Init DB".into(),
        3 => "Query".into(),
        14 => "Ping".into(),
        18 => "Binlog Dump".into(),
        22 => "Prepare".into(),
        23 => "Execute".into(),
        26 => "Reset stmt".into(),
        28 => "Fetch".into(),
        29 => "Daemon".into(),
        other => crate::aggregate::command_name(other).trim_start_matches("COM_").to_string(),
    }
}

fn monotonic_us() -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: a valid timespec to write into.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000 + ts.tv_nsec as u64 / 1000
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ddl_the_parser_cannot_read_still_names_its_table() {
        let alter = "ALTER TABLE `app`.`orders` ADD COLUMN `note` VARCHAR (?)";
        assert!(matches!(tables_of(alter, None), Tables::Unknown));
        assert!(names_table(alter, None, "app", "orders"));
        assert!(!names_table(alter, None, "other", "orders"));
        assert!(names_table("ALTER TABLE `orders` ADD `x` INT", Some("app"), "app", "orders"));
    }

    #[test]
    fn waits_come_from_the_stage() {
        assert_eq!(wait_of("Waiting for table metadata lock"), Some("metadata_lock"));
        assert_eq!(wait_of("Waiting for table level lock"), Some("table_lock"));
        assert_eq!(wait_of("Waiting for commit lock"), Some("other"));
        assert_eq!(wait_of("Sending data"), None);
        assert_eq!(command_name(0), "Sleep");
        assert_eq!(command_name(3), "Query");
    }

    #[test]
    fn an_idle_transaction_says_so_and_texts_are_redacted() {
        let mut normalizer = Normalizer::new(16);
        let raw = RawConnection { thread_id: 7, in_transaction: true, start_utime: 1_000_000, ..Default::default() };
        let idle = describe(raw, 3_500_000, Samples::Redacted, &mut normalizer);
        assert_eq!((idle.state.as_str(), idle.running_ms, idle.digest), ("idle in transaction", 2500, 0));
        let raw = RawConnection {
            thread_id: 8,
            command: 3,
            text: b"SELECT * FROM t WHERE email = 'a@b.example'".to_vec(),
            stage: Some("Sending data".into()),
            ..Default::default()
        };
        let busy = describe(raw, 10, Samples::Redacted, &mut normalizer);
        assert!(!busy.sample.contains("a@b.example") && !busy.digest_text.contains("a@b.example"));
        assert_ne!(busy.digest, 0);
    }
}
