//! The SQLite store against real files: exactly-once, merges, pruning and
//! migrations of files written by older collectors.
use sqlbee_proto::v1::{
    AgentCost, AgentIdentity, AgentWindow, Bucket, DigestStats, ErrorCount, Gap, Histogram, HostMetrics,
    InstanceWindow, ProbeCost, ProcessMetrics, QueryStats, ServerInstance, WaitStats,
};

use rusqlite::Connection;
use sqlbee_proto::v1::{Blocker, CommandCount, LockWait};

use super::{
    SCHEMA_VERSION, SqliteStore, lock,
    schema::{SCHEMA, schema, with_rank_columns},
};
use crate::store::*;

/// `ingest` with the batch's own content hash, as the Ingest service calls it.
trait Put {
    fn put(&self, batch: &Batch, received_unix_ms: i64) -> Result<IngestOutcome, StoreError>;
}

impl Put for SqliteStore {
    fn put(&self, batch: &Batch, received_unix_ms: i64) -> Result<IngestOutcome, StoreError> {
        self.ingest(batch.clone(), received_unix_ms, content_hash(batch))
    }
}

fn temp_store(name: &str) -> (SqliteStore, std::path::PathBuf) {
    let dir = std::env::temp_dir().join(format!("sqlbee-store-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    (SqliteStore::open(&dir.join("s.db")).unwrap(), dir)
}

fn batch(sequence: u64, end: i64, buckets: &[(u32, u64)]) -> Batch {
    let count = buckets.iter().map(|b| b.1).sum();
    Batch {
        agent: Some(AgentIdentity { host: "h".into(), agent_id: "a".into(), version: "v".into() }),
        sequence,
        created_unix_ms: end,
        epoch: 0,
        content_hash: 0,
        windows: vec![InstanceWindow {
            instance: Some(ServerInstance {
                name: "h:1".into(),
                pid: sequence as u32,
                start_time_unix_ms: 0,
                ..Default::default()
            }),
            window_start_unix_ms: end - 10,
            window_end_unix_ms: end,
            digests: vec![DigestStats {
                digest: u64::MAX - 1,
                digest_text: "SELECT ?".into(),
                count,
                sum_ns: u64::MAX / 2 + 10,
                min_ns: 1,
                max_ns: u64::MAX / 4,
                histogram: Some(Histogram {
                    scheme: 1,
                    buckets: buckets.iter().map(|&(index, count)| Bucket { index, count }).collect(),
                }),
                ..Default::default()
            }],
            commands: vec![CommandCount { command: "COM_QUERY".into(), count }],
            statements: count,
            ..Default::default()
        }],
        gaps: vec![Gap { first_sequence: 1, last_sequence: 1, lost_statements: 5, ..Default::default() }],
        agent_windows: vec![],
    }
}

/// `batch` plus what the agent measured: the probes (half attached,
/// so the digest's count is an estimate), the server process and the
/// agent's own window with its host.
fn costed(sequence: u64, end: i64, agent_cpu: f64, shedding: &str) -> Batch {
    let mut b = batch(sequence, end, &[(10, 2)]);
    let w = &mut b.windows[0];
    w.probes = Some(ProbeCost {
        attached_fraction: 0.5,
        probe_cpu_seconds: 0.002,
        extra_cores_per_10k_qps: 0.3,
        estimated_statements: 4,
        ..Default::default()
    });
    w.process =
        Some(ProcessMetrics { pid: 7, status: "running".into(), rss_bytes: Some(5 << 20), ..Default::default() });
    w.aggregated_in_kernel = 1;
    w.digests[0].estimated_count = 4;
    b.agent_windows = vec![AgentWindow {
        window_start_unix_ms: end - 10,
        window_end_unix_ms: end,
        cost: Some(AgentCost {
            cpu_cores: agent_cpu,
            rss_bytes: sequence << 20,
            shedding: shedding.into(),
            ..Default::default()
        }),
        host: Some(HostMetrics { load1: sequence as f64, ..Default::default() }),
        untraced: Vec::new(),
    }];
    b
}

#[test]
fn costs_hosts_and_latest() {
    let (store, dir) = temp_store("costs");
    store.put(&costed(1, 1000, 0.5, "exact"), 1000).unwrap();
    store.put(&costed(2, 2000, 1.5, "no-samples"), 2000).unwrap();
    let all = TotalsQuery { instance: None, since_unix_ms: 0, until_unix_ms: i64::MAX };
    let costs = store.costs(&all).unwrap();
    assert_eq!(costs.len(), 1, "{costs:?}");
    let c = &costs[0];
    // 0.5 and 1.5 cores over 10 ms each; 4 statements seen, 8 estimated.
    assert_eq!((c.windows, c.statements, c.shedding_windows), (2, 4, 1));
    assert!((c.agent_cpu_seconds - 0.02).abs() < 1e-9, "{c:?}");
    assert!((c.agent_cores_per_10k_qps - 0.02 / 4.0 * 1e4).abs() < 1e-6, "{c:?}");
    assert!((c.server_extra_cores_per_10k_qps - 0.004 / 8.0 * 1e4).abs() < 1e-6, "{c:?}");
    assert_eq!((c.agent_max_rss_bytes, c.latest_shedding.as_str(), c.host.as_str()), (2 << 20, "no-samples", "h"));
    let other = TotalsQuery { instance: Some("elsewhere:1".into()), since_unix_ms: 0, until_unix_ms: i64::MAX };
    assert!(store.costs(&other).unwrap().is_empty());

    let top = store
        .top(&TopQuery {
            instance: None,
            digest: None,
            schema: None,
            nested: false,
            program: None,
            since_unix_ms: 0,
            until_unix_ms: i64::MAX,
            order_by: OrderBy::Total,
            limit: 5,
        })
        .unwrap();
    assert_eq!((top[0].count, top[0].estimated_count), (4, 8));

    let instances = store.instances().unwrap();
    let latest = instances[0].latest.as_ref().expect("a cost");
    assert_eq!(
        (latest.window_end_unix_ms, latest.agent_cpu_cores, latest.shedding.as_str()),
        (2000, 1.5, "no-samples")
    );
    assert_eq!((latest.attached_fraction, latest.aggregated_in_kernel), (0.5, 1));
    assert_eq!(latest.server.as_ref().and_then(|p| p.rss_bytes), Some(5 << 20));

    let hosts = store.hosts(&HostsQuery { host: None, since_unix_ms: 1500, limit: 10 }).unwrap();
    assert_eq!(hosts.len(), 1);
    assert_eq!(hosts[0].window.as_ref().and_then(|w| w.host.as_ref()).map(|h| h.load1), Some(2.0));
    assert!(store.hosts(&HostsQuery { host: Some("other".into()), since_unix_ms: 0, limit: 10 }).unwrap().is_empty());

    let pruned = store.prune(&PruneCutoffs::all(1500)).unwrap();
    assert_eq!((pruned.agent_windows, pruned.instance_windows), (1, 1));
    // Raw, one window is left; the rollups, whose buckets reach past the
    // cutoff, still hold both.
    let raw = TotalsQuery { until_unix_ms: 30_000, ..all.clone() };
    assert_eq!(store.costs(&raw).unwrap()[0].windows, 1);
    let c = &store.costs(&all).unwrap()[0];
    assert_eq!((c.windows, c.statements, c.shedding_windows, c.latest_shedding.as_str()), (2, 4, 1, "no-samples"));
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn once_merged_and_pruned() {
    let (store, dir) = temp_store("once");
    assert!(!store.put(&batch(2, 1000, &[(10, 2), (40, 1)]), 1000).unwrap().duplicate);
    assert!(store.put(&batch(2, 1000, &[(10, 2), (40, 1)]), 1001).unwrap().duplicate);
    assert!(!store.put(&batch(3, 2000, &[(40, 1), (60, 1)]), 2000).unwrap().duplicate);
    let query = TopQuery {
        instance: None,
        digest: None,
        schema: None,
        nested: false,
        program: None,
        since_unix_ms: 0,
        until_unix_ms: i64::MAX,
        order_by: OrderBy::P99,
        limit: 20,
    };
    let top = store.top(&query).unwrap();
    assert_eq!(top.len(), 1);
    let d = &top[0];
    // u64 values above i64::MAX come back exact; the sum saturates.
    assert_eq!((d.digest, d.count, d.sum_ns, d.max_ns), (u64::MAX - 1, 5, u64::MAX, u64::MAX / 4));
    assert_eq!(d.p50_ns, sqlbee_vocabulary::histogram::bucket_high(40));
    assert_eq!(d.p99_ns, sqlbee_vocabulary::histogram::bucket_high(60));
    let totals = store
        .totals(&TotalsQuery { instance: Some("h:1".into()), since_unix_ms: 1500, until_unix_ms: i64::MAX })
        .unwrap();
    // The gap has no window times: it counts at the time it was received.
    assert_eq!((totals.statements, totals.digest_count, totals.lost_statements), (2, 1, 0));
    let totals = store.totals(&TotalsQuery { instance: None, since_unix_ms: 0, until_unix_ms: i64::MAX }).unwrap();
    assert_eq!((totals.statements, totals.commands[0].count, totals.lost_statements), (5, 5, 5));
    let instances = store.instances().unwrap();
    assert_eq!((instances[0].pid, instances[0].batches, instances[0].gaps), (3, 2, 1));
    let pruned = store.prune(&PruneCutoffs::all(1500)).unwrap();
    assert_eq!((pruned.digest_windows, pruned.instance_windows, pruned.batches, pruned.rollup_rows), (1, 1, 1, 0));
    // Raw windows are gone before 1500; the minute, hour and day buckets
    // they were rolled into reach past the cutoff and stay whole.
    let raw = TopQuery { since_unix_ms: 0, until_unix_ms: 30_000, ..query.clone() };
    assert_eq!(store.top(&raw).unwrap()[0].count, 2);
    assert_eq!(store.top(&query).unwrap()[0].count, 5);
    let pruned = store.prune(&PruneCutoffs { raw: 1500, minute: 60_000, hour: 1500 }).unwrap();
    assert_eq!(pruned.rollup_rows, 1, "the minute bucket [0, 60 s) is past its retention");
    let pruned = store.prune(&PruneCutoffs::all(rollup::HOUR_MS)).unwrap();
    assert_eq!((pruned.digest_windows, pruned.rollup_rows), (1, 1), "the hour bucket goes, the day stays");
    assert_eq!(store.top(&query).unwrap()[0].count, 5);
    let pruned = store.prune(&PruneCutoffs::all(rollup::DAY_MS)).unwrap();
    assert_eq!(pruned.rollup_rows, 1);
    assert!(store.top(&query).unwrap().is_empty());
    std::fs::remove_dir_all(dir).ok();
}

fn wait(class: &str, sum_ns: u64, max_ns: u64, statements: u64) -> WaitStats {
    WaitStats { class: class.into(), sum_ns, max_ns, statements }
}

fn error(code: u32, count: u64, message: &str) -> ErrorCount {
    ErrorCount { code, count, sample_message: message.into() }
}

/// A batch of one digest (id 7) with waits and error codes.
fn waiting(sequence: u64, instance: &str, end: i64, waits: Vec<WaitStats>, errors: Vec<ErrorCount>) -> Batch {
    let mut b = batch(sequence, end, &[(10, 5)]);
    let w = &mut b.windows[0];
    w.instance.as_mut().unwrap().name = instance.into();
    let d = &mut w.digests[0];
    d.digest = 7;
    d.sum_ns = 1_000_000;
    d.max_ns = 500_000;
    d.errors = errors.iter().map(|e| e.count).sum();
    d.waits = waits;
    d.error_codes = errors;
    b.gaps.clear();
    b
}

#[test]
fn waits_and_error_codes_merge() {
    let (store, dir) = temp_store("waits");
    let first = waiting(
        1,
        "h:1",
        1000,
        vec![wait("row_lock", 300, 200, 2), wait("disk_io", 40, 30, 1)],
        // Out of order and twice: stored increasing, added up.
        vec![error(1213, 1, "Deadlock (old)"), error(1062, 1, "Duplicate entry"), error(1213, 1, "")],
    );
    let second = waiting(
        2,
        "h:2",
        2000,
        vec![wait("row_lock", 500, 450, 1), wait("some_new_class", 7, 7, 1)],
        vec![error(1213, 1, "Deadlock found when trying to get lock")],
    );
    // The newer window's message wins even when it arrives first.
    store.put(&second, 2000).unwrap();
    store.put(&first, 2001).unwrap();
    // Without waits (an old agent).
    store.put(&waiting(3, "h:1", 3000, vec![], vec![]), 3000).unwrap();
    let query = TopQuery {
        instance: None,
        digest: None,
        schema: None,
        nested: false,
        program: None,
        since_unix_ms: 0,
        until_unix_ms: i64::MAX,
        order_by: OrderBy::Total,
        limit: 20,
    };
    let d = store.top(&query).unwrap().into_iter().find(|d| d.digest == 7).unwrap();
    assert_eq!(d.count, 15);
    assert_eq!(
        d.waits,
        vec![wait("row_lock", 800, 450, 3), wait("disk_io", 40, 30, 1), wait("some_new_class", 7, 7, 1)]
    );
    assert_eq!(
        d.error_codes,
        vec![error(1213, 3, "Deadlock found when trying to get lock"), error(1062, 1, "Duplicate entry")]
    );
    // One instance: only its windows count.
    let only = TopQuery { instance: Some("h:1".into()), ..query.clone() };
    let d = store.top(&only).unwrap().remove(0);
    assert_eq!(d.waits, vec![wait("row_lock", 300, 200, 2), wait("disk_io", 40, 30, 1)]);
    assert_eq!(d.error_codes[0].count, 2);
    assert_eq!(d.error_codes[0].sample_message, "Deadlock (old)", "h:1's own message, not h:2's newer one");

    // Ordering by total wait.
    store.put(&waiting(4, "h:1", 3000, vec![wait("commit", 10_000, 10_000, 1)], vec![]), 3000).unwrap();
    let mut other = waiting(5, "h:1", 3000, vec![], vec![]);
    other.windows[0].digests[0].digest = 8;
    store.put(&other, 3000).unwrap();
    let by_wait = store.top(&TopQuery { order_by: OrderBy::Wait, ..query.clone() }).unwrap();
    assert_eq!(by_wait.iter().map(|d| d.digest).collect::<Vec<_>>(), vec![7, 8]);
    assert_eq!(by_wait[0].waits[0], wait("commit", 10_000, 10_000, 1));

    // Samples go with their windows (read raw: the rollups keep the codes).
    let pruned = store.prune(&PruneCutoffs::all(1500)).unwrap();
    assert_eq!(pruned.error_samples, 2, "h:1's two messages");
    let raw = TopQuery { until_unix_ms: 30_000, ..query.clone() };
    let d = store.top(&raw).unwrap().into_iter().find(|d| d.digest == 7).unwrap();
    assert_eq!(d.error_codes, vec![error(1213, 1, "Deadlock found when trying to get lock")]);
    std::fs::remove_dir_all(dir).ok();
}

fn lock_wait(start: i64, connection_id: u64, blockers: Vec<Blocker>) -> LockWait {
    LockWait {
        start_unix_ms: start,
        duration_ns: u64::MAX - 3,
        class: "row_lock".into(),
        connection_id,
        digest: u64::MAX - 5,
        digest_text: "UPDATE t SET a = ? WHERE id = ?".into(),
        sample: "UPDATE t SET a = 1 WHERE id = 1".into(),
        blocker_kind: "candidates".into(),
        blockers,
    }
}

#[test]
fn lock_waits_newest_first_filtered_and_pruned() {
    let (store, dir) = temp_store("locks");
    let blocker = Blocker {
        connection_id: u64::MAX,
        transaction: true,
        started_unix_ms: 900,
        statements: vec!["SELECT * FROM t WHERE id = ? FOR UPDATE".into(), "UPDATE t SET b = ?".into()],
    };
    let mut b = batch(1, 2000, &[(10, 1)]);
    b.windows[0].lock_waits = vec![lock_wait(1000, 1, vec![blocker.clone()]), lock_wait(1500, 2, vec![])];
    let mut other = batch(2, 2000, &[(10, 1)]);
    other.windows[0].instance.as_mut().unwrap().name = "h:2".into();
    other.windows[0].lock_waits = vec![lock_wait(1200, 3, vec![])];
    store.put(&b, 2000).unwrap();
    store.put(&other, 2000).unwrap();
    // A duplicate stores nothing.
    store.put(&b, 2001).unwrap();
    let all = LocksQuery { instance: None, since_unix_ms: 0, limit: 100 };
    let rows = store.locks(&all).unwrap();
    let ids: Vec<u64> = rows.iter().map(|r| r.wait.as_ref().unwrap().connection_id).collect();
    assert_eq!(ids, vec![2, 3, 1]);
    assert_eq!((rows[1].instance.as_str(), rows[1].agent_id.as_str()), ("h:2", "a"));
    assert_eq!(rows[2].wait, Some(lock_wait(1000, 1, vec![blocker])));
    let one = store.locks(&LocksQuery { instance: Some("h:1".into()), ..all.clone() }).unwrap();
    assert_eq!(one.len(), 2);
    assert_eq!(store.locks(&LocksQuery { since_unix_ms: 1200, ..all.clone() }).unwrap().len(), 2);
    assert_eq!(store.locks(&LocksQuery { limit: 1, ..all.clone() }).unwrap().len(), 1);
    assert_eq!(store.prune(&PruneCutoffs::all(1300)).unwrap().lock_waits, 2);
    assert_eq!(store.locks(&all).unwrap().len(), 1);
    std::fs::remove_dir_all(dir).ok();
}

/// One digest row (5 statements of `SELECT ?`, bucket 10) in the
/// version-2 and -3 layout.
const ONE_V2_ROW: &str = "INSERT INTO digest_texts VALUES (7, 'SELECT ?');
    INSERT INTO digest_windows (window_id, instance, window_end, digest, count, errors, sum_ns,
        min_ns, max_ns, histogram, error_codes, sample, truncated, waits)
    VALUES (1, 'h:1', 1000, 7, 5, 0, 1000000, 1, 500000, x'0a05', x'', 'SELECT 1', 0, x'');";

/// A store file as an older collector left it: `schema`, then `rows`
/// (SQL), in a fresh directory named after `version`.
fn old_store(version: &str, schema: &str, rows: &str) -> (std::path::PathBuf, std::path::PathBuf) {
    let dir = std::env::temp_dir().join(format!("sqlbee-store-{version}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("s.db");
    let conn = Connection::open(&path).unwrap();
    conn.execute_batch(schema).unwrap();
    conn.execute_batch(rows).unwrap();
    (dir, path)
}

#[test]
fn version_2_files_get_lock_waits() {
    let v3 = schema_v3();
    let start = v3.find("-- Long waits as agents reported them").unwrap();
    let end = v3.find("-- What agents lost").unwrap();
    let v2 = format!("{}{}", &v3[..start], &v3[end..]);
    let (dir, path) = old_store("v2", &v2, &format!("{ONE_V2_ROW} PRAGMA user_version = 2;"));
    let store = SqliteStore::open(&path).unwrap();
    let version: i64 = lock(&store.writer).query_row("PRAGMA user_version", [], |r| r.get(0)).unwrap();
    assert_eq!(version, SCHEMA_VERSION);
    let query = TopQuery {
        instance: None,
        digest: None,
        schema: None,
        nested: false,
        program: None,
        since_unix_ms: 0,
        until_unix_ms: i64::MAX,
        order_by: OrderBy::Total,
        limit: 20,
    };
    assert_eq!(store.top(&query).unwrap()[0].count, 5);
    let all = LocksQuery { instance: None, since_unix_ms: 0, limit: 100 };
    assert!(store.locks(&all).unwrap().is_empty());
    let mut b = batch(1, 2000, &[(10, 1)]);
    b.windows[0].lock_waits = vec![lock_wait(1900, 4, vec![])];
    store.put(&b, 2000).unwrap();
    assert_eq!(store.locks(&all).unwrap().len(), 1);
    std::fs::remove_dir_all(dir).ok();
}

/// The version-3 schema, from today's: without the cost tables and
/// digest_windows' columns from estimated_count on.
fn schema_v3() -> String {
    let later_columns = ",\n    estimated_count INTEGER NOT NULL DEFAULT 0,\n    schema      TEXT NOT NULL DEFAULT '',\n    {rank_columns},\n    figures     BLOB NOT NULL DEFAULT x'',\n    accounts    BLOB NOT NULL DEFAULT x'',\n    nested      INTEGER NOT NULL DEFAULT 0,\n    program     TEXT NOT NULL DEFAULT '',\n    program_kind TEXT NOT NULL DEFAULT '',\n    parent_digest INTEGER NOT NULL DEFAULT 0,\n    source      TEXT NOT NULL DEFAULT ''\n";
    let without_estimates = SCHEMA.replace(later_columns, "\n");
    assert_ne!(without_estimates, SCHEMA, "the estimated_count column moved; update this test");
    let start = without_estimates.find("-- What the probes cost each instance window").unwrap();
    let end = without_estimates.find("-- What agents lost").unwrap();
    with_rank_columns(&format!("{}{}", &without_estimates[..start], &without_estimates[end..]))
}

#[test]
fn version_3_files_get_costs() {
    let (dir, path) = old_store("v3", &schema_v3(), &format!("{ONE_V2_ROW} PRAGMA user_version = 3;"));
    let store = SqliteStore::open(&path).unwrap();
    let query = TopQuery {
        instance: None,
        digest: None,
        schema: None,
        nested: false,
        program: None,
        since_unix_ms: 0,
        until_unix_ms: i64::MAX,
        order_by: OrderBy::Total,
        limit: 20,
    };
    let d = store.top(&query).unwrap().remove(0);
    // An old row is exact: no estimate.
    assert_eq!((d.count, d.estimated_count), (5, 0));
    store.put(&costed(1, 2000, 0.25, "exact"), 2000).unwrap();
    assert_eq!(
        store.costs(&TotalsQuery { instance: None, since_unix_ms: 0, until_unix_ms: i64::MAX }).unwrap()[0].windows,
        1
    );
    std::fs::remove_dir_all(dir).ok();
}

/// Version 11 kept one message per (digest, code) for the whole fleet;
/// its messages come over with instance "" (read fleet-wide only).
#[test]
fn version_11_error_samples_get_an_instance() {
    let v12 = "CREATE TABLE IF NOT EXISTS error_samples (
    instance  TEXT NOT NULL,
    digest    INTEGER NOT NULL,
    code      INTEGER NOT NULL,
    message   TEXT NOT NULL,
    last_seen INTEGER NOT NULL,
    PRIMARY KEY (digest, code, instance)
) WITHOUT ROWID;";
    let v11 = "CREATE TABLE IF NOT EXISTS error_samples (
    digest    INTEGER NOT NULL,
    code      INTEGER NOT NULL,
    message   TEXT NOT NULL,
    last_seen INTEGER NOT NULL,
    PRIMARY KEY (digest, code)
) WITHOUT ROWID;";
    assert!(schema().contains(v12), "error_samples changed; update this test");
    let rows = "INSERT INTO error_samples VALUES (7, 1062, 'Duplicate entry', 1000); PRAGMA user_version = 11;";
    let (dir, path) = old_store("v11", &schema().replace(v12, v11), rows);
    drop(SqliteStore::open(&path).unwrap());
    let conn = Connection::open(&path).unwrap();
    let moved: (String, i64, String) = conn
        .query_row("SELECT instance, digest, message FROM error_samples", [], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
        .unwrap();
    assert_eq!(moved, (String::new(), 7, "Duplicate entry".to_string()));
    let indexed: i64 = conn
        .query_row("SELECT count(*) FROM sqlite_master WHERE name = 'error_samples_last_seen'", [], |r| r.get(0))
        .unwrap();
    assert_eq!(indexed, 1, "the prune index is rebuilt");
    std::fs::remove_dir_all(dir).ok();
}

/// The version-1 schema, from today's: without digest_windows.waits
/// and without error_samples.
fn schema_v1() -> String {
    let v3 = schema_v3();
    let without_waits = v3.replace(",\n    waits       BLOB NOT NULL DEFAULT x''\n", "\n");
    assert_ne!(without_waits, v3, "the waits column moved; update this test");
    let start = without_waits.find("-- One message per (instance, digest, error code)").unwrap();
    let end = without_waits.find("-- What agents lost").unwrap();
    let v1 = format!("{}{}", &without_waits[..start], &without_waits[end..]);
    assert!(!v1.contains("DEFAULT x''") && !v1.contains("error_samples"), "{v1}");
    v1
}

#[test]
fn version_1_files_are_upgraded_in_place() {
    let (dir, path) = old_store(
        "v1",
        &schema_v1(),
        "INSERT INTO digest_texts VALUES (7, 'SELECT ?');
         INSERT INTO digest_windows (window_id, instance, window_end, digest, count, errors, sum_ns,
             min_ns, max_ns, histogram, error_codes, sample, truncated)
         VALUES (1, 'h:1', 1000, 7, 5, 2, 1000000, 1, 500000, x'0a05', x'a608010501', 'SELECT 1', 0);
         PRAGMA user_version = 1;",
    );
    // Histogram: bucket 10 holds 5. Error codes: 1062 (gap a6 08) once, 1067 (gap 05) once.
    let store = SqliteStore::open(&path).unwrap();
    let version: i64 = lock(&store.writer).query_row("PRAGMA user_version", [], |r| r.get(0)).unwrap();
    assert_eq!(version, SCHEMA_VERSION);
    let query = TopQuery {
        instance: None,
        digest: None,
        schema: None,
        nested: false,
        program: None,
        since_unix_ms: 0,
        until_unix_ms: i64::MAX,
        order_by: OrderBy::Wait,
        limit: 20,
    };
    let d = store.top(&query).unwrap().remove(0);
    assert_eq!((d.digest, d.count, d.digest_text.as_str(), d.sample.as_str()), (7, 5, "SELECT ?", "SELECT 1"));
    assert!(d.waits.is_empty());
    assert_eq!(d.error_codes, vec![error(1062, 1, ""), error(1067, 1, "")]);
    store.put(&waiting(1, "h:1", 2000, vec![wait("row_lock", 9, 9, 1)], vec![error(1062, 1, "dup")]), 2000).unwrap();
    let d = store.top(&query).unwrap().remove(0);
    assert_eq!((d.count, d.waits.clone()), (10, vec![wait("row_lock", 9, 9, 1)]));
    assert_eq!(d.error_codes, vec![error(1062, 2, "dup"), error(1067, 1, "")]);
    drop(store);
    // Opening again changes nothing; a newer file is refused.
    let store = SqliteStore::open(&path).unwrap();
    assert_eq!(store.top(&query).unwrap()[0].count, 10);
    lock(&store.writer).pragma_update(None, "user_version", SCHEMA_VERSION + 1).unwrap();
    drop(store);
    assert!(matches!(
        SqliteStore::open(&path),
        Err(StoreError::Version { found, known: SCHEMA_VERSION, .. }) if found == SCHEMA_VERSION + 1
    ));
    std::fs::remove_dir_all(dir).ok();
}

/// `count` windows `spacing` ms apart from `start`, two instances, two
/// digests, histograms and errors that differ window by window.
fn spread_batches(start: i64, count: i64, spacing: i64) -> Vec<Batch> {
    let mut seed = 0x2545_f491_4f6c_dd1du64;
    let mut next = move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    };
    let mut out = Vec::new();
    for n in 0..count {
        let end = start + n * spacing;
        let mut b = batch(n as u64 + 1, end, &[]);
        b.gaps.clear();
        b.windows[0].instance.as_mut().unwrap().name = if n % 3 == 0 { "h:2".into() } else { "h:1".into() };
        let mut digests = Vec::new();
        for digest in [7u64, 8] {
            let buckets: Vec<(u32, u64)> =
                (0..3).map(|k| (30 + (next() % 40) as u32 + k * 41, 1 + next() % 9)).collect();
            let mut buckets = buckets;
            buckets.sort();
            buckets.dedup_by_key(|b| b.0);
            let count: u64 = buckets.iter().map(|b| b.1).sum();
            // Every figure, each now and then absent (a build that could
            // not read it): merged rollups keep what raw windows keep.
            let mut stats = sqlbee_proto::v1::QueryStats::default();
            for (slot, figure) in stats.values_mut().into_iter().zip(sqlbee_figures::FIGURES) {
                let roll = next();
                *slot = (roll % 5 != 0).then(|| match figure.unit {
                    sqlbee_figures::Unit::Statements => roll % (count + 1),
                    _ => roll % 1_000_000,
                });
            }
            let min = sqlbee_vocabulary::histogram::bucket_high(buckets[0].0 as usize) - 1;
            let max = sqlbee_vocabulary::histogram::bucket_high(buckets.last().unwrap().0 as usize);
            // Query tags from a few values, and now and then a traced statement.
            let orders = next() % (count + 1);
            let carts = next() % (count - orders + 1);
            let tags = vec![sqlbee_proto::v1::TagCount {
                key: "controller".into(),
                values: [("orders", orders), ("carts", carts)]
                    .into_iter()
                    .filter(|(_, n)| *n > 0)
                    .map(|(value, count)| sqlbee_proto::v1::TagValue { value: value.into(), count })
                    .collect(),
                other: (count - orders - carts) / 2,
            }];
            // Two client programs, one with a pid per window.
            let web = next() % (count + 1);
            let clients = [("php-fpm".to_string(), 10, web), (format!("cron-{}", next() % 5), 11, count - web)]
                .into_iter()
                .filter(|(_, _, n)| *n > 0)
                .map(|(process, pid, count)| sqlbee_proto::v1::ClientCount {
                    process,
                    pid,
                    count,
                    ..Default::default()
                })
                .collect();
            let exemplar = (next() % 3 != 0).then(|| sqlbee_proto::v1::TraceExemplar {
                trace_id: format!("{:016x}{:016x}", next(), next() | 1),
                span_id: format!("{:016x}", next() | 1),
                duration_ns: min + next() % (max - min + 1),
            });
            digests.push(DigestStats {
                digest,
                digest_text: format!("SELECT {digest}"),
                count,
                errors: next() % 2,
                sum_ns: count * (min / 2 + max / 2),
                min_ns: min,
                max_ns: max,
                histogram: Some(Histogram {
                    scheme: 1,
                    buckets: buckets.iter().map(|&(index, count)| Bucket { index, count }).collect(),
                }),
                stats: Some(stats),
                tags,
                clients,
                exemplar,
                ..Default::default()
            });
        }
        b.windows[0].statements = digests.iter().map(|d| d.count).sum();
        b.windows[0].digests = digests;
        b.agent_windows = vec![AgentWindow {
            window_start_unix_ms: end - spacing,
            window_end_unix_ms: end,
            cost: Some(AgentCost { cpu_cores: 0.25 * (1 + n % 4) as f64, rss_bytes: 30 << 20, ..Default::default() }),
            host: None,
            untraced: Vec::new(),
        }];
        out.push(b);
    }
    out
}

/// What the raw windows say about `digest` over [since, until): totals and
/// the merged histogram's percentiles, computed here from what was sent.
fn expected(
    batches: &[Batch],
    digest: u64,
    instance: Option<&str>,
    since: i64,
    until: i64,
) -> (u64, u64, u64, u64, u64, [u64; 3]) {
    let mut totals = merge::DigestTotals::default();
    let mut histogram = sqlbee_vocabulary::histogram::Histogram::default();
    for w in batches.iter().flat_map(|b| &b.windows) {
        if w.window_end_unix_ms < since || w.window_end_unix_ms >= until {
            continue;
        }
        if instance.is_some_and(|i| w.instance.as_ref().unwrap().name != i) {
            continue;
        }
        for d in w.digests.iter().filter(|d| d.digest == digest) {
            totals.add(d.count, d.errors, d.sum_ns, d.min_ns, d.max_ns);
            for b in &d.histogram.as_ref().unwrap().buckets {
                histogram.add_bucket(b.index as usize, b.count);
            }
        }
    }
    let p = |q| merge::percentile(&histogram, q, &totals);
    (totals.count, totals.errors, totals.sum_ns, totals.min_ns, totals.max_ns, [p(0.5), p(0.95), p(0.99)])
}

/// The figures of `digest` in the raw windows of `batches` in range,
/// merged: each figure summed over the windows that carried it.
fn expected_stats(
    batches: &[Batch],
    digest: u64,
    instance: Option<&str>,
    since: i64,
    until: i64,
) -> sqlbee_proto::v1::QueryStats {
    let mut total = sqlbee_proto::v1::QueryStats::default();
    let windows = batches.iter().flat_map(|b| &b.windows).filter(|w| {
        (since..until).contains(&w.window_end_unix_ms)
            && instance.is_none_or(|i| w.instance.as_ref().unwrap().name == i)
    });
    for d in windows.flat_map(|w| &w.digests).filter(|d| d.digest == digest) {
        total.merge(d.stats.as_ref().unwrap());
    }
    total
}

/// Every read of `ranges` (top per digest, costs) and series at `steps`
/// equal what the raw windows of `batches` hold.
fn assert_rollups_match(store: &SqliteStore, batches: &[Batch], ranges: &[(i64, i64, Option<&str>)], steps: &[i64]) {
    let query = TopQuery {
        instance: None,
        digest: None,
        schema: None,
        nested: false,
        program: None,
        since_unix_ms: 0,
        until_unix_ms: i64::MAX,
        order_by: OrderBy::Total,
        limit: 20,
    };
    for &(since, until, instance) in ranges {
        let spans = rollup::plan(since, until, None);
        shared_tests::lean_top_answers_as_top_does(
            store,
            &TopQuery {
                since_unix_ms: since,
                until_unix_ms: until,
                instance: instance.map(str::to_string),
                ..query.clone()
            },
        );
        let answer = store
            .top(&TopQuery {
                since_unix_ms: since,
                until_unix_ms: until,
                instance: instance.map(str::to_string),
                ..query.clone()
            })
            .unwrap();
        for digest in [7, 8] {
            let d =
                answer.iter().find(|d| d.digest == digest).unwrap_or_else(|| panic!("{digest} missing for {spans:?}"));
            let got = (d.count, d.errors, d.sum_ns, d.min_ns, d.max_ns, [d.p50_ns, d.p95_ns, d.p99_ns]);
            assert_eq!(got, expected(batches, digest, instance, since, until), "digest {digest} over {spans:?}");
            assert_eq!(
                d.stats.unwrap_or_default(),
                expected_stats(batches, digest, instance, since, until),
                "figures of {digest} over {spans:?}"
            );
        }
        // The agent's cost counts all its windows and statements in range,
        // whichever instance the filter names.
        let windows: Vec<&Batch> =
            batches.iter().filter(|b| (since..until).contains(&b.windows[0].window_end_unix_ms)).collect();
        let costs = store
            .costs(&TotalsQuery { instance: instance.map(str::to_string), since_unix_ms: since, until_unix_ms: until })
            .unwrap();
        assert_eq!(costs.len(), 1, "costs over {spans:?}");
        let statements: u64 = windows.iter().map(|b| b.windows[0].statements).sum();
        assert_eq!((costs[0].windows, costs[0].statements), (windows.len() as u64, statements), "costs over {spans:?}");
        let cpu: f64 = windows
            .iter()
            .map(|b| &b.agent_windows[0])
            .map(|a| a.cost.as_ref().unwrap().cpu_cores * (a.window_end_unix_ms - a.window_start_unix_ms) as f64 / 1e3)
            .sum();
        assert!((costs[0].agent_cpu_seconds - cpu).abs() < 1e-6 * cpu.max(1.0), "{costs:?} over {spans:?}");
    }

    // A series: per-step points equal the raw windows of their step, and
    // add up to the range's total.
    let first = batches[0].created_unix_ms;
    let last = batches.last().unwrap().created_unix_ms;
    for &step in steps {
        let since = first.div_euclid(step) * step;
        let until = last + 1;
        let series = SeriesQuery {
            of: SeriesOf::Digest(7),
            instance: None,
            schema: None,
            since_unix_ms: since,
            until_unix_ms: until,
            step_ms: step,
        };
        let points = store.series(&series).unwrap();
        assert_eq!(points.len() as i64, (until - since + step - 1) / step);
        for p in &points {
            let e = expected(batches, 7, None, p.start_unix_ms, p.end_unix_ms);
            assert_eq!(
                (p.count, p.errors, p.sum_ns, [p.p50_ns, p.p95_ns, p.p99_ns]),
                (e.0, e.1, e.2, e.5),
                "step {step}"
            );
        }
        let total: u64 = points.iter().map(|p| p.count).sum();
        assert_eq!(total, expected(batches, 7, None, since, until).0);
        let all = store.series(&SeriesQuery { of: SeriesOf::Statements, ..series.clone() }).unwrap();
        let both: u64 = all.iter().map(|p| p.count).sum();
        assert_eq!(both, expected(batches, 7, None, since, until).0 + expected(batches, 8, None, since, until).0);
    }
}

#[test]
fn rollups_answer_what_the_raw_windows_hold() {
    let (store, dir) = temp_store("rollups");
    // Windows of 10 s over three hours and a bit.
    let batches = spread_batches(5 * rollup::HOUR_MS - 7 * rollup::MINUTE_MS - 3_000, 3 * 360 + 100, 10_000);
    for b in &batches {
        store.put(b, b.created_unix_ms).unwrap();
    }
    let first = batches[0].created_unix_ms;
    let last = batches.last().unwrap().created_unix_ms;
    // Every range shape: all, hours and minutes with ragged edges, within
    // one minute, and one instance.
    let ranges = [
        (0, i64::MAX, None),
        (first + 4_321, last - 17_000, None),
        (5 * rollup::HOUR_MS, 7 * rollup::HOUR_MS, None),
        (6 * rollup::HOUR_MS + 5_000, 6 * rollup::HOUR_MS + 45_000, None),
        (first, last + 1, Some("h:2")),
    ];
    // The week-long shape reads day buckets, not windows.
    assert!(rollup::plan(0, i64::MAX, None).iter().any(|s| s.level == Some(rollup::DAY_MS)));
    assert_rollups_match(
        &store,
        &batches,
        &ranges,
        &[10_000, rollup::MINUTE_MS, 5 * rollup::MINUTE_MS, rollup::HOUR_MS],
    );
    std::fs::remove_dir_all(dir).ok();
}

/// Windows about five minutes apart over thirty hours, so a whole day
/// lies inside them with hours and minutes on either side.
fn day_batches() -> Vec<Batch> {
    spread_batches(rollup::DAY_MS - 3 * rollup::HOUR_MS - 7 * rollup::MINUTE_MS - 3_000, 360, 299_000)
}

fn day_ranges(batches: &[Batch]) -> Vec<(i64, i64, Option<&'static str>)> {
    let first = batches[0].created_unix_ms;
    let last = batches.last().unwrap().created_unix_ms;
    assert!(first < rollup::DAY_MS && last >= 2 * rollup::DAY_MS);
    vec![
        (0, i64::MAX, None),
        (first + 4_321, last - 17_000, None),
        (rollup::DAY_MS, 2 * rollup::DAY_MS, None),
        (rollup::DAY_MS - 3 * rollup::MINUTE_MS, 2 * rollup::DAY_MS + rollup::HOUR_MS + 1_000, Some("h:1")),
    ]
}

#[test]
fn day_rollups_answer_what_the_raw_windows_hold() {
    let (store, dir) = temp_store("day-rollups");
    let batches = day_batches();
    for b in &batches {
        store.put(b, b.created_unix_ms).unwrap();
    }
    let ranges = day_ranges(&batches);
    assert!(rollup::plan(ranges[1].0, ranges[1].1, None).iter().any(|s| s.level == Some(rollup::DAY_MS)));
    assert_rollups_match(&store, &batches, &ranges, &[rollup::HOUR_MS, rollup::DAY_MS]);
    std::fs::remove_dir_all(dir).ok();
}

#[test]
fn version_10_files_get_days_from_their_hours() {
    let (store, dir) = temp_store("v10-days");
    let batches = day_batches();
    for b in &batches {
        store.put(b, b.created_unix_ms).unwrap();
    }
    // What a version-10 collector left: minutes and hours, no days. Raw
    // windows past the hours' edges are pruned, so only hours can rebuild
    // the days.
    let day_rows = |store: &SqliteStore| -> i64 {
        lock(&store.writer)
            .query_row(
                "SELECT (SELECT count(*) FROM digest_rollups WHERE level = ?1)
                      + (SELECT count(*) FROM instance_cost_rollups WHERE level = ?1)
                      + (SELECT count(*) FROM agent_cost_rollups WHERE level = ?1)",
                [rollup::DAY_MS],
                |r| r.get(0),
            )
            .unwrap()
    };
    let before = day_rows(&store);
    assert!(before > 0);
    lock(&store.writer)
        .execute_batch(&format!(
            "DELETE FROM digest_rollups WHERE level = {day}; DELETE FROM instance_cost_rollups WHERE level = {day};
             DELETE FROM agent_cost_rollups WHERE level = {day}; PRAGMA user_version = 10;",
            day = rollup::DAY_MS
        ))
        .unwrap();
    drop(store);
    let store = SqliteStore::open(&dir.join("s.db")).unwrap();
    assert_eq!(day_rows(&store), before);
    let ranges = day_ranges(&batches);
    assert_rollups_match(&store, &batches, &ranges, &[rollup::HOUR_MS, rollup::DAY_MS]);
    // Rollups outlive the raw windows: with the day's windows pruned, the
    // day still counts all of them.
    let cutoff = 2 * rollup::DAY_MS;
    store.prune(&PruneCutoffs { raw: cutoff, minute: 0, hour: 0 }).unwrap();
    let day = store
        .top(&TopQuery {
            instance: None,
            digest: Some(7),
            schema: None,
            nested: false,
            program: None,
            since_unix_ms: rollup::DAY_MS,
            until_unix_ms: 2 * rollup::DAY_MS,
            order_by: OrderBy::Total,
            limit: 5,
        })
        .unwrap();
    assert_eq!(day[0].count, expected(&batches, 7, None, rollup::DAY_MS, 2 * rollup::DAY_MS).0);
    std::fs::remove_dir_all(dir).ok();
}

#[test]
fn series_split_by_instance_add_up_to_the_fleet() {
    let (store, dir) = temp_store("series-by-instance");
    shared_tests::series_split_by_instance_add_up_to_the_fleet(&store, batch);
    drop(store);
    std::fs::remove_dir_all(dir).ok();
}

#[test]
fn series_split_by_digest_match_filtered_reads() {
    let (store, dir) = temp_store("series-by-digest");
    shared_tests::series_split_by_digest_match_filtered_reads(&store, batch);
    drop(store);
    std::fs::remove_dir_all(dir).ok();
}

#[test]
fn error_messages_are_kept_per_instance() {
    let (store, dir) = temp_store("messages");
    shared_tests::error_messages_are_kept_per_instance(&store, batch);
    drop(store);
    std::fs::remove_dir_all(dir).ok();
}

#[test]
fn latest_cost_takes_each_agents_nearest_window() {
    let (store, dir) = temp_store("latest");
    shared_tests::latest_cost_takes_each_agents_nearest_window(&store, costed);
    drop(store);
    std::fs::remove_dir_all(dir).ok();
}

#[test]
fn plans_merge_sightings_and_list_changes() {
    let (store, dir) = temp_store("plans");
    shared_tests::plans_merge_sightings_and_list_changes(&store, batch);
    drop(store);
    std::fs::remove_dir_all(dir).ok();
}

#[test]
fn tags_and_exemplars_merge_over_windows() {
    let (store, dir) = temp_store("tags");
    shared_tests::tags_and_exemplars_merge_over_windows(&store, batch);
    drop(store);
    std::fs::remove_dir_all(dir).ok();
}

#[test]
fn long_statements_newest_first_once_and_pruned() {
    let (store, dir) = temp_store("long");
    shared_tests::long_statements_newest_first_once_and_pruned(&store, batch);
    drop(store);
    std::fs::remove_dir_all(dir).ok();
}

#[test]
fn replication_windows_read_once_per_window() {
    let (store, dir) = temp_store("replication");
    shared_tests::replication_windows_read_once_per_window(&store, batch);
    drop(store);
    std::fs::remove_dir_all(dir).ok();
}

#[test]
fn table_indexes_keep_the_newest_reading() {
    let (store, dir) = temp_store("table_indexes");
    shared_tests::table_indexes_keep_the_newest_reading(&store, batch);
    drop(store);
    std::fs::remove_dir_all(dir).ok();
}

#[test]
fn export_marks_read_back_the_furthest() {
    let (store, dir) = temp_store("export_marks");
    shared_tests::export_marks_read_back_the_furthest(&store);
    drop(store);
    std::fs::remove_dir_all(dir).ok();
}

#[test]
fn markers_and_events_keep_their_newest_version() {
    let (store, dir) = temp_store("events");
    shared_tests::markers_and_events_keep_their_newest_version(&store);
    drop(store);
    std::fs::remove_dir_all(dir).ok();
}

/// A long cut (a diff asks for every digest) reads its details in one scan;
/// a short one digest by digest. Both give each digest the same answer.
#[test]
fn a_long_cut_reads_details_in_one_scan_with_the_same_answers() {
    let (store, dir) = temp_store("long-cut");
    let digests = 3 * super::read::DETAILS_BY_SCAN as u64 / 2;
    let mut sequence = 0;
    for (end, instance) in [(10_000, "h:1"), (20_000, "h:2"), (30_000, "h:1")] {
        sequence += 1;
        let mut b = batch(sequence, end, &[(3, 2), (9, 1)]);
        let window = &mut b.windows[0];
        window.instance.as_mut().unwrap().name = instance.into();
        let template = window.digests[0].clone();
        window.digests = (1..=digests)
            .map(|d| DigestStats {
                digest: d,
                digest_text: format!("SELECT {d}"),
                sample: if (d + sequence) % 3 == 0 { String::new() } else { format!("SELECT {d} -- {end}") },
                count: 3 + d,
                sum_ns: 1_000 * d + end as u64,
                min_ns: 10,
                max_ns: 10_000,
                errors: d % 2,
                error_codes: if d % 2 == 1 {
                    vec![ErrorCount { code: 1062, count: 1, sample_message: "dup".into() }]
                } else {
                    Vec::new()
                },
                stats: Some(QueryStats { rows_examined: Some(d * 7), cpu_ns: Some(d * 100), ..Default::default() }),
                ..template.clone()
            })
            .collect();
        store.ingest(b.clone(), end, content_hash(&b)).unwrap();
    }
    let query = |digest: Option<u64>, limit: usize| TopQuery {
        instance: None,
        digest,
        schema: None,
        nested: false,
        program: None,
        since_unix_ms: 0,
        until_unix_ms: i64::MAX,
        order_by: OrderBy::Total,
        limit,
    };
    let all = store.top(&query(None, 1_000)).unwrap();
    assert_eq!(all.len() as u64, digests);
    for d in &all {
        let alone = store.top(&query(Some(d.digest), 20)).unwrap();
        assert_eq!(alone.len(), 1);
        assert_eq!(&alone[0], d, "digest {}", d.digest);
    }
    assert!(all.iter().any(|d| !d.sample.is_empty() && !d.error_codes.is_empty()));
    drop(store);
    std::fs::remove_dir_all(dir).ok();
}

/// A figure the list ranks by that the file's tables lack (one ranked
/// after the file was made) gets its column on open, with no new schema
/// version: rows written before rank as unknown, later ones by their sum.
#[test]
fn a_rank_column_the_file_lacks_is_added_on_open() {
    let newest = crate::store::rank_columns::names().last().unwrap();
    let older = SCHEMA.replace(
        "{rank_columns}",
        &crate::store::rank_columns::names()
            .filter(|name| *name != newest)
            .map(|name| format!("{name} INTEGER"))
            .collect::<Vec<_>>()
            .join(", "),
    );
    let (dir, path) = old_store("unranked", &older, &format!("{ONE_V2_ROW} PRAGMA user_version = {SCHEMA_VERSION};"));
    let store = SqliteStore::open(&path).unwrap();
    let order_by = OrderBy::ALL.into_iter().find(|o| o.figure().is_some_and(|f| f.name == newest)).unwrap();
    let mut ranked = batch(1, 2000, &[(10, 1)]);
    let digest = &mut ranked.windows[0].digests[0];
    digest.digest = 42;
    let mut stats = QueryStats::default();
    let place = sqlbee_figures::FIGURES.iter().position(|f| f.name == newest).unwrap();
    *stats.values_mut()[place] = Some(9);
    digest.stats = Some(stats);
    store.put(&ranked, 2000).unwrap();
    let top = store.top(&TopQuery { order_by, ..crate::store::shared_tests::all_time(None) }).unwrap();
    assert_eq!(top.iter().map(|d| d.digest).collect::<Vec<_>>()[0], 42, "ranked by {newest}");
    assert_eq!(top[0].stats.unwrap().values()[place], Some(9));
    let version: i64 = lock(&store.writer).query_row("PRAGMA user_version", [], |r| r.get(0)).unwrap();
    assert_eq!(version, SCHEMA_VERSION);
    std::fs::remove_dir_all(dir).ok();
}
