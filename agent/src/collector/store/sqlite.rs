//! SQLite store: one file, WAL, one writer connection and one reader
//! connection (WAL lets queries run while a batch is written). Every batch
//! is written in one transaction together with its exactly-once record.
//!
//! SQLite integers are i64; the protocol's u64 counters and digest ids are
//! stored bit-cast (`as i64`) and cast back when read. No SQL arithmetic or
//! comparison runs on them: sums and merges happen in Rust (`merge`), so a
//! value above 2^63 stays exact and a sum can never overflow inside SQLite.
use std::{
    collections::{BTreeMap, BTreeSet, HashMap},
    path::Path,
    sync::{Mutex, MutexGuard},
    time::Duration,
};

use prost::Message;
use rusqlite::{Connection, OptionalExtension, TransactionBehavior, params};
use sqlbee_common::histogram::Histogram;
use sqlbee_proto::v1::{
    AgentWindowRow, Batch, Blocker, CommandCount, CostSummary, InstanceInfo, LockWait, LockWaitRow, TopDigest,
    TotalsResponse,
};

use super::{
    HostsQuery, IngestOutcome, sqlite_costs, LocksQuery, OrderBy, PruneOutcome, Store, StoreError, TopQuery, TotalsQuery, blob,
    merge::{self, DigestTotals, MergedErrors, MergedWaits},
};

/// Bumped when the schema changes; a newer file is refused, not guessed at.
/// An older one is brought up to date on open (`migrate`), keeping its data:
/// - 1: first version.
/// - 2: `digest_windows.waits` (added to version-1 files with ALTER TABLE;
///   their rows read as "no waits") and `error_samples`.
/// - 3: `lock_waits` (a new table: older files simply get it, empty).
/// - 4: `instance_costs`, `agent_windows` (new tables) and
///   `digest_windows.estimated_count` (ALTER TABLE; older rows read 0,
///   "exact").
pub const SCHEMA_VERSION: i64 = 4;

const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS agents (
    agent_id           TEXT PRIMARY KEY,
    host               TEXT NOT NULL,
    version            TEXT NOT NULL,
    first_seen_unix_ms INTEGER NOT NULL,
    last_seen_unix_ms  INTEGER NOT NULL,
    last_sequence      INTEGER NOT NULL
) WITHOUT ROWID;

-- The exactly-once record of each stored batch. keep_until is the newest of
-- the receive time and the batch's window ends, so the record lives at least
-- as long as every window it brought.
CREATE TABLE IF NOT EXISTS batches (
    agent_id           TEXT NOT NULL,
    sequence           INTEGER NOT NULL,
    received_unix_ms   INTEGER NOT NULL,
    keep_until_unix_ms INTEGER NOT NULL,
    PRIMARY KEY (agent_id, sequence)
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS batches_keep ON batches (keep_until_unix_ms);

-- Latest state of each server instance an agent reported (Instances).
CREATE TABLE IF NOT EXISTS agent_instances (
    agent_id                TEXT NOT NULL,
    instance                TEXT NOT NULL,
    pid                     INTEGER NOT NULL,
    start_time_unix_ms      INTEGER NOT NULL,
    last_window_end_unix_ms INTEGER NOT NULL,
    PRIMARY KEY (agent_id, instance)
) WITHOUT ROWID;

CREATE TABLE IF NOT EXISTS instance_windows (
    id                  INTEGER PRIMARY KEY,
    agent_id            TEXT NOT NULL,
    sequence            INTEGER NOT NULL,
    instance            TEXT NOT NULL,
    pid                 INTEGER NOT NULL,
    start_time_unix_ms  INTEGER NOT NULL,
    window_start        INTEGER NOT NULL,
    window_end          INTEGER NOT NULL,
    statements          INTEGER NOT NULL,
    events              INTEGER NOT NULL,
    dropped_events      INTEGER NOT NULL,
    dropped_in_agent    INTEGER NOT NULL,
    unmatched           INTEGER NOT NULL,
    overflow_statements INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS instance_windows_end ON instance_windows (window_end);
CREATE INDEX IF NOT EXISTS instance_windows_instance ON instance_windows (instance, window_end);

CREATE TABLE IF NOT EXISTS window_commands (
    window_id INTEGER NOT NULL,
    command   TEXT NOT NULL,
    count     INTEGER NOT NULL,
    PRIMARY KEY (window_id, command)
) WITHOUT ROWID;

-- One row per digest per instance window. histogram and error_codes are
-- blob-encoded (index gap, count) varint pairs, error codes increasing;
-- waits is blob-encoded (class, sum_ns, max_ns, statements), empty when
-- the agent sent none. waits and estimated_count (0: count is exact) must
-- stay the last columns, in this order: older files get them appended by
-- ALTER TABLE.
CREATE TABLE IF NOT EXISTS digest_windows (
    window_id   INTEGER NOT NULL,
    instance    TEXT NOT NULL,
    window_end  INTEGER NOT NULL,
    digest      INTEGER NOT NULL,
    count       INTEGER NOT NULL,
    errors      INTEGER NOT NULL,
    sum_ns      INTEGER NOT NULL,
    min_ns      INTEGER NOT NULL,
    max_ns      INTEGER NOT NULL,
    histogram   BLOB NOT NULL,
    error_codes BLOB NOT NULL,
    sample      TEXT NOT NULL,
    truncated   INTEGER NOT NULL,
    waits       BLOB NOT NULL DEFAULT x'',
    estimated_count INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX IF NOT EXISTS digest_windows_end ON digest_windows (window_end);
CREATE INDEX IF NOT EXISTS digest_windows_instance ON digest_windows (instance, window_end);
CREATE INDEX IF NOT EXISTS digest_windows_digest ON digest_windows (digest, window_end);

-- Texts once per digest: the id is a hash of the text, the same everywhere.
CREATE TABLE IF NOT EXISTS digest_texts (
    digest INTEGER PRIMARY KEY,
    text   TEXT NOT NULL
);

-- One message per (digest, error code): the newest by window end. The
-- counts stay in digest_windows.error_codes; this only names them.
CREATE TABLE IF NOT EXISTS error_samples (
    digest    INTEGER NOT NULL,
    code      INTEGER NOT NULL,
    message   TEXT NOT NULL,
    last_seen INTEGER NOT NULL,
    PRIMARY KEY (digest, code)
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS error_samples_last_seen ON error_samples (last_seen);

-- Long waits as agents reported them, each with its candidate blockers
-- (JSON array of {connection_id, transaction, started_unix_ms,
-- statements}). Pruned by start time.
CREATE TABLE IF NOT EXISTS lock_waits (
    id            INTEGER PRIMARY KEY,
    agent_id      TEXT NOT NULL,
    instance      TEXT NOT NULL,
    start_unix_ms INTEGER NOT NULL,
    duration_ns   INTEGER NOT NULL,
    class         TEXT NOT NULL,
    connection_id INTEGER NOT NULL,
    digest        INTEGER NOT NULL,
    digest_text   TEXT NOT NULL,
    sample        TEXT NOT NULL,
    blocker_kind  TEXT NOT NULL,
    blockers      TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS lock_waits_start ON lock_waits (start_unix_ms);
CREATE INDEX IF NOT EXISTS lock_waits_instance ON lock_waits (instance, start_unix_ms);

-- What the probes cost each instance window and what the server process
-- used, as the agent sent them (encoded sqlbee.v1.ProbeCost and
-- ProcessMetrics; empty when absent).
CREATE TABLE IF NOT EXISTS instance_costs (
    window_id            INTEGER PRIMARY KEY,
    aggregated_in_kernel INTEGER NOT NULL,
    probes               BLOB NOT NULL,
    process              BLOB NOT NULL
);

-- Each agent's own window: its cost (encoded sqlbee.v1.AgentCost) and its
-- host (encoded HostMetrics, empty when absent).
CREATE TABLE IF NOT EXISTS agent_windows (
    id           INTEGER PRIMARY KEY,
    agent_id     TEXT NOT NULL,
    sequence     INTEGER NOT NULL,
    window_start INTEGER NOT NULL,
    window_end   INTEGER NOT NULL,
    cost         BLOB NOT NULL,
    host         BLOB NOT NULL
);
CREATE INDEX IF NOT EXISTS agent_windows_end ON agent_windows (window_end);
CREATE INDEX IF NOT EXISTS agent_windows_agent ON agent_windows (agent_id, window_end);

-- What agents lost before it reached us. A gap resent in a later batch is
-- the same gap (same agent and sequence range) and is kept once.
CREATE TABLE IF NOT EXISTS gaps (
    agent_id                   TEXT NOT NULL,
    first_sequence             INTEGER NOT NULL,
    last_sequence              INTEGER NOT NULL,
    batches                    INTEGER NOT NULL,
    lost_statements            INTEGER NOT NULL,
    lost_windows               INTEGER NOT NULL,
    first_window_start_unix_ms INTEGER NOT NULL,
    last_window_end_unix_ms    INTEGER NOT NULL,
    reason                     TEXT NOT NULL,
    received_unix_ms           INTEGER NOT NULL,
    PRIMARY KEY (agent_id, first_sequence, last_sequence)
) WITHOUT ROWID;
";

/// Rows deleted per prune transaction, so ingest never waits long.
const PRUNE_CHUNK: i64 = 5000;

pub struct SqliteStore {
    writer: Mutex<Connection>,
    reader: Mutex<Connection>,
}

/// Bit-cast for storage (see the module comment).
fn i(v: u64) -> i64 {
    v as i64
}

fn u(v: i64) -> u64 {
    v as u64
}

/// A poisoned lock only means another call panicked; its transaction was
/// rolled back when dropped, so the connection is still usable.
fn lock(m: &Mutex<Connection>) -> MutexGuard<'_, Connection> {
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// `AND <column> = ?2` when an instance filter is given.
fn instance_filter(instance: &Option<String>, column: &str) -> String {
    if instance.is_some() { format!(" AND {column} = ?2") } else { String::new() }
}

impl SqliteStore {
    pub fn open(path: &Path) -> Result<SqliteStore, StoreError> {
        let open_err = |source| StoreError::Open { path: path.display().to_string(), source };
        let mut writer = Connection::open(path).map_err(open_err)?;
        configure(&writer).map_err(open_err)?;
        let found = match migrate(&mut writer).map_err(open_err)? {
            Ok(found) => found,
            Err(found) => {
                return Err(StoreError::Version { path: path.display().to_string(), found, known: SCHEMA_VERSION });
            }
        };
        if found > 0 && found < SCHEMA_VERSION {
            tracing::info!(path = %path.display(), from = found, to = SCHEMA_VERSION, "store schema upgraded; existing data kept");
        }
        let reader = Connection::open(path).map_err(open_err)?;
        configure(&reader).map_err(open_err)?;
        Ok(SqliteStore { writer: Mutex::new(writer), reader: Mutex::new(reader) })
    }
}

/// Brings the file to `SCHEMA_VERSION` in one transaction, creating only
/// what is missing, so existing rows stay. Ok(version found), or
/// Err(version found) when the file is newer than this collector.
fn migrate(conn: &mut Connection) -> rusqlite::Result<Result<i64, i64>> {
    let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
    let found: i64 = tx.query_row("PRAGMA user_version", [], |r| r.get(0))?;
    if found > SCHEMA_VERSION {
        return Ok(Err(found));
    }
    // New files get everything; older ones the tables they lack.
    tx.execute_batch(SCHEMA)?;
    // Version 1 -> 2: CREATE TABLE IF NOT EXISTS left digest_windows as it was.
    let has_waits = has_column(&tx, "digest_windows", "waits")?;
    if !has_waits {
        tx.execute_batch("ALTER TABLE digest_windows ADD COLUMN waits BLOB NOT NULL DEFAULT x''")?;
    }
    // Version 3 -> 4, likewise.
    if !has_column(&tx, "digest_windows", "estimated_count")? {
        tx.execute_batch("ALTER TABLE digest_windows ADD COLUMN estimated_count INTEGER NOT NULL DEFAULT 0")?;
    }
    if found != SCHEMA_VERSION {
        tx.pragma_update(None, "user_version", SCHEMA_VERSION)?;
    }
    tx.commit()?;
    Ok(Ok(found))
}

fn has_column(tx: &rusqlite::Transaction<'_>, table: &str, column: &str) -> rusqlite::Result<bool> {
    tx.query_row("SELECT count(*) > 0 FROM pragma_table_info(?1) WHERE name = ?2", [table, column], |r| r.get(0))
}

fn configure(conn: &Connection) -> rusqlite::Result<()> {
    // WAL: readers never block the writer. NORMAL (in WAL mode): a power
    // loss can lose the last committed batches but never corrupts the file;
    // that is the price of not syncing the disk for every batch.
    let mode: String = conn.query_row("PRAGMA journal_mode = WAL", [], |r| r.get(0))?;
    if !mode.eq_ignore_ascii_case("wal") {
        tracing::warn!(mode, "SQLite refused WAL mode; queries will block ingest");
    }
    conn.execute_batch("PRAGMA synchronous = NORMAL; PRAGMA foreign_keys = OFF;")?;
    conn.busy_timeout(Duration::from_secs(10))?;
    Ok(())
}

impl Store for SqliteStore {
    fn ingest(&self, batch: &Batch, received_unix_ms: i64) -> Result<IngestOutcome, StoreError> {
        let mut conn = lock(&self.writer);
        let err = |e| StoreError::sqlite("ingest", e);
        let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate).map_err(err)?;
        let outcome = write_batch(&tx, batch, received_unix_ms).map_err(err)?;
        tx.commit().map_err(err)?;
        Ok(outcome)
    }

    fn top(&self, query: &TopQuery) -> Result<Vec<TopDigest>, StoreError> {
        let mut conn = lock(&self.reader);
        // One read transaction: every step sees the same snapshot, so the
        // merged histograms add up to the counts of the first step.
        let tx = conn.transaction().map_err(|e| StoreError::sqlite("top", e))?;
        top(&tx, query)
    }

    fn instances(&self) -> Result<Vec<InstanceInfo>, StoreError> {
        let mut conn = lock(&self.reader);
        let tx = conn.transaction().map_err(|e| StoreError::sqlite("instances", e))?;
        let mut out = instances(&tx).map_err(|e| StoreError::sqlite("instances", e))?;
        for info in &mut out {
            info.latest = sqlite_costs::latest(&tx, &info.agent_id, &info.instance)?;
        }
        Ok(out)
    }

    fn costs(&self, query: &TotalsQuery) -> Result<Vec<CostSummary>, StoreError> {
        let mut conn = lock(&self.reader);
        let tx = conn.transaction().map_err(|e| StoreError::sqlite("costs", e))?;
        sqlite_costs::summaries(&tx, query)
    }

    fn hosts(&self, query: &HostsQuery) -> Result<Vec<AgentWindowRow>, StoreError> {
        let mut conn = lock(&self.reader);
        let tx = conn.transaction().map_err(|e| StoreError::sqlite("hosts", e))?;
        sqlite_costs::hosts(&tx, query)
    }

    fn totals(&self, query: &TotalsQuery) -> Result<TotalsResponse, StoreError> {
        let mut conn = lock(&self.reader);
        let tx = conn.transaction().map_err(|e| StoreError::sqlite("totals", e))?;
        totals(&tx, query).map_err(|e| StoreError::sqlite("totals", e))
    }

    fn locks(&self, query: &LocksQuery) -> Result<Vec<LockWaitRow>, StoreError> {
        let mut conn = lock(&self.reader);
        let tx = conn.transaction().map_err(|e| StoreError::sqlite("locks", e))?;
        locks(&tx, query)
    }

    fn prune(&self, older_than_unix_ms: i64) -> Result<PruneOutcome, StoreError> {
        let err = |e| StoreError::sqlite("prune", e);
        let mut outcome = PruneOutcome::default();
        // Chunks in separate transactions: the writer lock is released in
        // between, so a large prune delays a batch by one chunk at most.
        let chunked = |sql: &str| -> Result<u64, StoreError> {
            let mut total = 0;
            loop {
                let mut conn = lock(&self.writer);
                let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate).map_err(err)?;
                let mut deleted = 0;
                for statement in sql.split(';').map(str::trim).filter(|s| !s.is_empty()) {
                    deleted = tx.execute(statement, params![older_than_unix_ms, PRUNE_CHUNK]).map_err(err)?;
                }
                tx.commit().map_err(err)?;
                total += deleted as u64;
                if (deleted as i64) < PRUNE_CHUNK {
                    return Ok(total);
                }
            }
        };
        outcome.digest_windows = chunked(
            "DELETE FROM digest_windows WHERE rowid IN
                (SELECT rowid FROM digest_windows WHERE window_end < ?1 LIMIT ?2)",
        )?;
        // The statements pick the same windows (same order, same
        // transaction): commands and costs first, then their windows.
        outcome.instance_windows = chunked(
            "DELETE FROM window_commands WHERE window_id IN
                (SELECT id FROM instance_windows WHERE window_end < ?1 ORDER BY id LIMIT ?2);
             DELETE FROM instance_costs WHERE window_id IN
                (SELECT id FROM instance_windows WHERE window_end < ?1 ORDER BY id LIMIT ?2);
             DELETE FROM instance_windows WHERE id IN
                (SELECT id FROM instance_windows WHERE window_end < ?1 ORDER BY id LIMIT ?2)",
        )?;
        outcome.agent_windows = chunked(
            "DELETE FROM agent_windows WHERE id IN
                (SELECT id FROM agent_windows WHERE window_end < ?1 ORDER BY id LIMIT ?2)",
        )?;
        outcome.lock_waits = chunked(
            "DELETE FROM lock_waits WHERE id IN
                (SELECT id FROM lock_waits WHERE start_unix_ms < ?1 ORDER BY id LIMIT ?2)",
        )?;
        outcome.batches = chunked(
            "DELETE FROM batches WHERE (agent_id, sequence) IN
                (SELECT agent_id, sequence FROM batches WHERE keep_until_unix_ms < ?1 LIMIT ?2)",
        )?;
        let mut conn = lock(&self.writer);
        let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate).map_err(err)?;
        tx.execute_batch(&format!(
            "DELETE FROM gaps WHERE received_unix_ms < {cut} AND last_window_end_unix_ms < {cut};
             DELETE FROM agent_instances WHERE last_window_end_unix_ms < {cut};
             DELETE FROM agents WHERE last_seen_unix_ms < {cut}
                 AND NOT EXISTS (SELECT 1 FROM batches b WHERE b.agent_id = agents.agent_id);
             DELETE FROM digest_texts WHERE NOT EXISTS
                 (SELECT 1 FROM digest_windows d WHERE d.digest = digest_texts.digest);",
            cut = older_than_unix_ms
        ))
        .map_err(err)?;
        // A sample is as old as the newest window that brought its code.
        outcome.error_samples =
            tx.execute("DELETE FROM error_samples WHERE last_seen < ?1", [older_than_unix_ms]).map_err(err)? as u64;
        tx.commit().map_err(err)?;
        Ok(outcome)
    }
}

fn write_batch(tx: &rusqlite::Transaction<'_>, batch: &Batch, received: i64) -> rusqlite::Result<IngestOutcome> {
    let agent = batch.agent.clone().unwrap_or_default();
    let sequence = i(batch.sequence);
    let newest_window = batch
        .windows
        .iter()
        .map(|w| w.window_end_unix_ms)
        .chain(batch.agent_windows.iter().map(|w| w.window_end_unix_ms))
        .max()
        .unwrap_or(received);
    let inserted = tx
        .prepare_cached(
            "INSERT INTO batches (agent_id, sequence, received_unix_ms, keep_until_unix_ms)
             VALUES (?1, ?2, ?3, ?4) ON CONFLICT DO NOTHING",
        )?
        .execute(params![agent.agent_id, sequence, received, newest_window.max(received)])?;
    // A duplicate still proves the agent is alive. Host and version follow
    // the newest sequence so a replayed old batch does not roll them back.
    tx.prepare_cached(
        "INSERT INTO agents (agent_id, host, version, first_seen_unix_ms, last_seen_unix_ms, last_sequence)
         VALUES (?1, ?2, ?3, ?4, ?4, ?5)
         ON CONFLICT (agent_id) DO UPDATE SET
             host = CASE WHEN excluded.last_sequence >= last_sequence THEN excluded.host ELSE host END,
             version = CASE WHEN excluded.last_sequence >= last_sequence THEN excluded.version ELSE version END,
             last_seen_unix_ms = max(last_seen_unix_ms, excluded.last_seen_unix_ms),
             last_sequence = max(last_sequence, excluded.last_sequence)",
    )?
    .execute(params![agent.agent_id, agent.host, agent.version, received, sequence])?;
    if inserted == 0 {
        return Ok(IngestOutcome { duplicate: true });
    }
    let mut insert_window = tx.prepare_cached(
        "INSERT INTO instance_windows (agent_id, sequence, instance, pid, start_time_unix_ms, window_start,
             window_end, statements, events, dropped_events, dropped_in_agent, unmatched, overflow_statements)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13)",
    )?;
    // Same command twice in one window (should not happen) adds up.
    let mut insert_command = tx.prepare_cached(
        "INSERT INTO window_commands (window_id, command, count) VALUES (?1, ?2, ?3)
         ON CONFLICT DO UPDATE SET count = count + excluded.count",
    )?;
    let mut upsert_instance = tx.prepare_cached(
        "INSERT INTO agent_instances (agent_id, instance, pid, start_time_unix_ms, last_window_end_unix_ms)
         VALUES (?1, ?2, ?3, ?4, ?5)
         ON CONFLICT (agent_id, instance) DO UPDATE SET
             pid = CASE WHEN excluded.last_window_end_unix_ms >= last_window_end_unix_ms THEN excluded.pid ELSE pid END,
             start_time_unix_ms = CASE WHEN excluded.last_window_end_unix_ms >= last_window_end_unix_ms
                 THEN excluded.start_time_unix_ms ELSE start_time_unix_ms END,
             last_window_end_unix_ms = max(last_window_end_unix_ms, excluded.last_window_end_unix_ms)",
    )?;
    let mut insert_text = tx.prepare_cached("INSERT OR IGNORE INTO digest_texts (digest, text) VALUES (?1, ?2)")?;
    let mut insert_digest = tx.prepare_cached(
        "INSERT INTO digest_windows (window_id, instance, window_end, digest, count, errors, sum_ns, min_ns,
             max_ns, histogram, error_codes, sample, truncated, waits, estimated_count)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15)",
    )?;
    let mut insert_cost = tx.prepare_cached(
        "INSERT INTO instance_costs (window_id, aggregated_in_kernel, probes, process) VALUES (?1, ?2, ?3, ?4)",
    )?;
    // The newest window's message wins, whatever order batches arrive in.
    let mut upsert_sample = tx.prepare_cached(
        "INSERT INTO error_samples (digest, code, message, last_seen) VALUES (?1, ?2, ?3, ?4)
         ON CONFLICT (digest, code) DO UPDATE SET
             message = CASE WHEN excluded.last_seen >= last_seen THEN excluded.message ELSE message END,
             last_seen = max(last_seen, excluded.last_seen)",
    )?;
    let mut insert_lock_wait = tx.prepare_cached(
        "INSERT INTO lock_waits (agent_id, instance, start_unix_ms, duration_ns, class, connection_id, digest,
             digest_text, sample, blocker_kind, blockers)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11)",
    )?;
    for w in &batch.windows {
        let server = w.instance.clone().unwrap_or_default();
        for l in &w.lock_waits {
            insert_lock_wait.execute(params![
                agent.agent_id,
                server.name,
                l.start_unix_ms,
                i(l.duration_ns),
                l.class,
                i(l.connection_id),
                i(l.digest),
                l.digest_text,
                l.sample,
                l.blocker_kind,
                blockers_json(&l.blockers),
            ])?;
        }
        insert_window.execute(params![
            agent.agent_id,
            sequence,
            server.name,
            server.pid,
            server.start_time_unix_ms,
            w.window_start_unix_ms,
            w.window_end_unix_ms,
            i(w.statements),
            i(w.events),
            i(w.dropped_events),
            i(w.dropped_in_agent),
            i(w.unmatched),
            i(w.overflow_statements),
        ])?;
        let window_id = tx.last_insert_rowid();
        for c in &w.commands {
            insert_command.execute(params![window_id, c.command, i(c.count)])?;
        }
        if w.probes.is_some() || w.process.is_some() || w.aggregated_in_kernel > 0 {
            let encoded = |m: Option<Vec<u8>>| m.unwrap_or_default();
            insert_cost.execute(params![
                window_id,
                i(w.aggregated_in_kernel),
                encoded(w.probes.as_ref().map(Message::encode_to_vec)),
                encoded(w.process.as_ref().map(Message::encode_to_vec)),
            ])?;
        }
        upsert_instance.execute(params![
            agent.agent_id,
            server.name,
            server.pid,
            server.start_time_unix_ms,
            w.window_end_unix_ms
        ])?;
        for d in &w.digests {
            insert_text.execute(params![i(d.digest), d.digest_text])?;
            let histogram = d
                .histogram
                .as_ref()
                .map(|h| blob::encode(h.buckets.iter().map(|b| (u64::from(b.index), b.count))))
                .unwrap_or_default();
            // Increasing codes, as the blob wants; a code sent twice adds up.
            let mut codes: BTreeMap<u32, u64> = BTreeMap::new();
            for e in &d.error_codes {
                let slot = codes.entry(e.code).or_default();
                *slot = slot.saturating_add(e.count);
                if !e.sample_message.is_empty() {
                    upsert_sample.execute(params![i(d.digest), e.code, e.sample_message, w.window_end_unix_ms])?;
                }
            }
            let error_codes = blob::encode(codes.into_iter().map(|(code, count)| (u64::from(code), count)));
            let waits = blob::encode_waits(d.waits.iter().map(|w| (w.class.as_str(), w.sum_ns, w.max_ns, w.statements)));
            insert_digest.execute(params![
                window_id,
                server.name,
                w.window_end_unix_ms,
                i(d.digest),
                i(d.count),
                i(d.errors),
                i(d.sum_ns),
                i(d.min_ns),
                i(d.max_ns),
                histogram,
                error_codes,
                d.sample,
                i(d.truncated),
                waits,
                i(d.estimated_count),
            ])?;
        }
    }
    let mut insert_agent_window = tx.prepare_cached(
        "INSERT INTO agent_windows (agent_id, sequence, window_start, window_end, cost, host)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
    )?;
    for w in &batch.agent_windows {
        insert_agent_window.execute(params![
            agent.agent_id,
            sequence,
            w.window_start_unix_ms,
            w.window_end_unix_ms,
            w.cost.as_ref().map(Message::encode_to_vec).unwrap_or_default(),
            w.host.as_ref().map(Message::encode_to_vec).unwrap_or_default(),
        ])?;
    }
    let mut insert_gap = tx.prepare_cached(
        "INSERT OR IGNORE INTO gaps (agent_id, first_sequence, last_sequence, batches, lost_statements,
             lost_windows, first_window_start_unix_ms, last_window_end_unix_ms, reason, received_unix_ms)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10)",
    )?;
    for g in &batch.gaps {
        insert_gap.execute(params![
            agent.agent_id,
            i(g.first_sequence),
            i(g.last_sequence),
            i(g.batches),
            i(g.lost_statements),
            g.lost_windows,
            g.first_window_start_unix_ms,
            g.last_window_end_unix_ms,
            g.reason,
            received,
        ])?;
    }
    Ok(IngestOutcome { duplicate: false })
}

/// Per digest while merging: totals and the instances it was seen on
/// (interned: the same few names repeat on every row), and the rank key
/// that needs more than the totals (p99, or the total wait).
#[derive(Default)]
struct Merging {
    totals: DigestTotals,
    instances: BTreeSet<u32>,
    rank: u64,
    /// Counts scaled to whole windows (sampled windows' estimates, exact
    /// windows' counts), and whether any window sampled.
    estimated: u64,
    sampled: bool,
}

fn top(tx: &rusqlite::Transaction<'_>, query: &TopQuery) -> Result<Vec<TopDigest>, StoreError> {
    let err = |e| StoreError::sqlite("top", e);
    // rusqlite binds only the parameters a statement names.
    let bind = |stmt: &mut rusqlite::Statement<'_>, first: &dyn rusqlite::ToSql| -> rusqlite::Result<()> {
        stmt.raw_bind_parameter(1, first)?;
        stmt.raw_bind_parameter(2, query.since_unix_ms)?;
        if let Some(instance) = &query.instance {
            stmt.raw_bind_parameter(3, instance)?;
        }
        Ok(())
    };
    // Step 1: scalar sums per digest, without reading any blob.
    let mut names: Vec<String> = Vec::new();
    let mut name_ids: HashMap<String, u32> = HashMap::new();
    let mut digests: HashMap<u64, Merging> = HashMap::new();
    {
        let mut stmt =
            scan(tx, query, "digest, instance, count, errors, sum_ns, min_ns, max_ns, estimated_count", "").map_err(err)?;
        let mut rows = stmt.raw_query();
        while let Some(row) = rows.next().map_err(err)? {
            let digest = u(row.get(0).map_err(err)?);
            let name = row.get_ref(1).map_err(err)?.as_str().map_err(|e| err(e.into()))?;
            let id = match name_ids.get(name) {
                Some(id) => *id,
                None => {
                    let id = names.len() as u32;
                    names.push(name.to_string());
                    name_ids.insert(name.to_string(), id);
                    id
                }
            };
            let entry = digests.entry(digest).or_default();
            entry.instances.insert(id);
            let (count, estimated) = (u(row.get(2).map_err(err)?), u(row.get(7).map_err(err)?));
            entry.sampled |= estimated > 0;
            entry.estimated = entry.estimated.saturating_add(if estimated > 0 { estimated } else { count });
            entry.totals.add(
                count,
                u(row.get(3).map_err(err)?),
                u(row.get(4).map_err(err)?),
                u(row.get(5).map_err(err)?),
                u(row.get(6).map_err(err)?),
            );
        }
    }
    let by_digest_filter = instance_filter(&query.instance, "instance").replace("?2", "?3");
    let by_digest_sql = format!(
        "SELECT histogram, error_codes, waits FROM digest_windows WHERE digest = ?1 AND window_end >= ?2{by_digest_filter}"
    );
    let sample_sql = format!(
        "SELECT sample FROM digest_windows WHERE digest = ?1 AND window_end >= ?2{by_digest_filter} AND sample <> ''
         ORDER BY window_end DESC LIMIT 1"
    );
    // Step 2: the rank keys that need blobs. Ordering by p99 needs every
    // digest's histogram, by wait every digest's waits; the other orders
    // read blobs only for the digests that make the cut.
    let mut histograms: HashMap<u64, Histogram> = HashMap::new();
    match query.order_by {
        OrderBy::P99 => {
            let mut stmt = scan(tx, query, "digest, histogram", "").map_err(err)?;
            let mut rows = stmt.raw_query();
            while let Some(row) = rows.next().map_err(err)? {
                let digest = u(row.get(0).map_err(err)?);
                let bytes = row.get_ref(1).map_err(err)?.as_blob().map_err(|e| err(e.into()))?;
                add_blob(histograms.entry(digest).or_default(), bytes)?;
            }
            for (digest, m) in digests.iter_mut() {
                m.rank = histograms.get(digest).map(|h| merge::percentile(h, 0.99, &m.totals)).unwrap_or(0);
            }
        }
        OrderBy::Wait => {
            let mut stmt = scan(tx, query, "digest, waits", " AND waits <> x''").map_err(err)?;
            let mut rows = stmt.raw_query();
            while let Some(row) = rows.next().map_err(err)? {
                let digest = u(row.get(0).map_err(err)?);
                let bytes = row.get_ref(1).map_err(err)?.as_blob().map_err(|e| err(e.into()))?;
                let waited = blob::decode_waits(bytes)
                    .ok_or(StoreError::Corrupt { what: "waits" })?
                    .iter()
                    .fold(0u64, |a, w| a.saturating_add(w.1));
                if let Some(m) = digests.get_mut(&digest) {
                    m.rank = m.rank.saturating_add(waited);
                }
            }
        }
        OrderBy::Total | OrderBy::Avg | OrderBy::Count | OrderBy::Errors => {}
    }
    let mut ranked: Vec<(u64, Merging)> = digests.into_iter().collect();
    ranked.sort_by(|(da, a), (db, b)| merge::compare(query.order_by, (*da, &a.totals, a.rank), (*db, &b.totals, b.rank)));
    ranked.truncate(query.limit);

    // Step 3: details of the digests that made the cut.
    let mut text_stmt = tx.prepare_cached("SELECT text FROM digest_texts WHERE digest = ?1").map_err(err)?;
    let mut blobs_stmt = tx.prepare(&by_digest_sql).map_err(err)?;
    let mut sample_stmt = tx.prepare(&sample_sql).map_err(err)?;
    let mut messages_stmt =
        tx.prepare_cached("SELECT code, message FROM error_samples WHERE digest = ?1").map_err(err)?;
    let mut out = Vec::with_capacity(ranked.len());
    for (digest, m) in ranked {
        let preloaded = histograms.remove(&digest);
        let mut histogram = Histogram::default();
        let mut waits = MergedWaits::default();
        let mut errors = MergedErrors::default();
        bind(&mut blobs_stmt, &i(digest)).map_err(err)?;
        let mut rows = blobs_stmt.raw_query();
        while let Some(row) = rows.next().map_err(err)? {
            if preloaded.is_none() {
                add_blob(&mut histogram, row.get_ref(0).map_err(err)?.as_blob().map_err(|e| err(e.into()))?)?;
            }
            add_error_codes(&mut errors, row.get_ref(1).map_err(err)?.as_blob().map_err(|e| err(e.into()))?)?;
            add_waits(&mut waits, row.get_ref(2).map_err(err)?.as_blob().map_err(|e| err(e.into()))?)?;
        }
        drop(rows);
        let histogram = preloaded.unwrap_or(histogram);
        let digest_text: String =
            text_stmt.query_row([i(digest)], |r| r.get(0)).optional().map_err(err)?.unwrap_or_default();
        bind(&mut sample_stmt, &i(digest)).map_err(err)?;
        let sample: String = match sample_stmt.raw_query().next().map_err(err)? {
            Some(row) => row.get(0).map_err(err)?,
            None => String::new(),
        };
        let mut messages: HashMap<u32, String> = HashMap::new();
        if !errors.is_empty() {
            let rows = messages_stmt
                .query_map([i(digest)], |r| Ok((r.get::<_, u32>(0)?, r.get::<_, String>(1)?)))
                .map_err(err)?;
            for row in rows {
                let (code, message) = row.map_err(err)?;
                messages.insert(code, message);
            }
        }
        let t = &m.totals;
        out.push(TopDigest {
            digest,
            digest_text,
            count: t.count,
            errors: t.errors,
            sum_ns: t.sum_ns,
            min_ns: t.min_ns,
            max_ns: t.max_ns,
            p50_ns: merge::percentile(&histogram, 0.50, t),
            p95_ns: merge::percentile(&histogram, 0.95, t),
            p99_ns: merge::percentile(&histogram, 0.99, t),
            sample,
            instances: m.instances.iter().map(|id| names[*id as usize].clone()).collect(),
            waits: waits.into_stats(),
            error_codes: errors.into_counts(|code| messages.remove(&code).unwrap_or_default()),
            estimated_count: if m.sampled { m.estimated } else { 0 },
        });
    }
    Ok(out)
}

/// Every digest row in range of `query`, for the steps that read all digests.
fn scan<'t>(
    tx: &'t rusqlite::Transaction<'_>,
    query: &TopQuery,
    columns: &str,
    extra: &str,
) -> rusqlite::Result<rusqlite::Statement<'t>> {
    let filter = instance_filter(&query.instance, "instance");
    let mut stmt = tx.prepare(&format!("SELECT {columns} FROM digest_windows WHERE window_end >= ?1{filter}{extra}"))?;
    stmt.raw_bind_parameter(1, query.since_unix_ms)?;
    if let Some(instance) = &query.instance {
        stmt.raw_bind_parameter(2, instance)?;
    }
    Ok(stmt)
}

fn add_blob(h: &mut Histogram, bytes: &[u8]) -> Result<(), StoreError> {
    for (index, count) in blob::decode(bytes).ok_or(StoreError::Corrupt { what: "histogram" })? {
        h.add_bucket(usize::try_from(index).unwrap_or(usize::MAX), count);
    }
    Ok(())
}

fn add_error_codes(errors: &mut MergedErrors, bytes: &[u8]) -> Result<(), StoreError> {
    let corrupt = StoreError::Corrupt { what: "error codes" };
    for (code, count) in blob::decode_any_order(bytes).ok_or(corrupt)? {
        let code = u32::try_from(code).map_err(|_| StoreError::Corrupt { what: "error codes" })?;
        errors.add(code, count);
    }
    Ok(())
}

fn add_waits(waits: &mut MergedWaits, bytes: &[u8]) -> Result<(), StoreError> {
    for (class, sum_ns, max_ns, statements) in blob::decode_waits(bytes).ok_or(StoreError::Corrupt { what: "waits" })? {
        waits.add(&class, sum_ns, max_ns, statements);
    }
    Ok(())
}

fn instances(tx: &rusqlite::Transaction<'_>) -> rusqlite::Result<Vec<InstanceInfo>> {
    let mut batches: HashMap<String, u64> = HashMap::new();
    let mut stmt = tx.prepare("SELECT agent_id, count(*) FROM batches GROUP BY agent_id")?;
    for row in stmt.query_map([], |r| Ok((r.get::<_, String>(0)?, r.get::<_, i64>(1)?)))? {
        let (agent, n) = row?;
        batches.insert(agent, u(n));
    }
    let mut gaps: HashMap<String, (u64, u64)> = HashMap::new();
    let mut stmt = tx.prepare("SELECT agent_id, lost_statements FROM gaps")?;
    for row in stmt.query_map([], |r| Ok((r.get::<_, String>(0)?, r.get::<_, i64>(1)?)))? {
        let (agent, lost) = row?;
        let entry = gaps.entry(agent).or_default();
        entry.0 += 1;
        entry.1 = entry.1.saturating_add(u(lost));
    }
    // Agents that reported no instance yet still show, with an empty one.
    let mut stmt = tx.prepare(
        "SELECT a.agent_id, a.host, a.version, a.last_seen_unix_ms, a.last_sequence,
                coalesce(i.instance, ''), coalesce(i.pid, 0), coalesce(i.last_window_end_unix_ms, 0)
         FROM agents a LEFT JOIN agent_instances i ON i.agent_id = a.agent_id
         ORDER BY coalesce(i.instance, ''), a.agent_id",
    )?;
    let rows = stmt.query_map([], |r| {
        Ok(InstanceInfo {
            agent_id: r.get(0)?,
            host: r.get(1)?,
            version: r.get(2)?,
            last_seen_unix_ms: r.get(3)?,
            last_sequence: u(r.get(4)?),
            instance: r.get(5)?,
            pid: r.get(6)?,
            last_window_end_unix_ms: r.get(7)?,
            ..Default::default()
        })
    })?;
    let mut out = Vec::new();
    for row in rows {
        let mut info = row?;
        info.batches = batches.get(&info.agent_id).copied().unwrap_or(0);
        let (count, lost) = gaps.get(&info.agent_id).copied().unwrap_or_default();
        info.gaps = count;
        info.lost_statements = lost;
        out.push(info);
    }
    Ok(out)
}

/// Blockers as stored: a JSON array, u64 ids exact (JSON numbers, not i64).
fn blockers_json(blockers: &[Blocker]) -> String {
    serde_json::Value::Array(
        blockers
            .iter()
            .map(|b| {
                serde_json::json!({
                    "connection_id": b.connection_id,
                    "transaction": b.transaction,
                    "started_unix_ms": b.started_unix_ms,
                    "statements": b.statements,
                })
            })
            .collect(),
    )
    .to_string()
}

fn blockers_of(text: &str) -> Option<Vec<Blocker>> {
    let value: serde_json::Value = serde_json::from_str(text).ok()?;
    value
        .as_array()?
        .iter()
        .map(|b| {
            Some(Blocker {
                connection_id: b.get("connection_id")?.as_u64()?,
                transaction: b.get("transaction")?.as_bool()?,
                started_unix_ms: b.get("started_unix_ms")?.as_i64()?,
                statements: b
                    .get("statements")?
                    .as_array()?
                    .iter()
                    .map(|s| s.as_str().map(str::to_string))
                    .collect::<Option<Vec<_>>>()?,
            })
        })
        .collect()
}

fn locks(tx: &rusqlite::Transaction<'_>, query: &LocksQuery) -> Result<Vec<LockWaitRow>, StoreError> {
    let err = |e| StoreError::sqlite("locks", e);
    let mut stmt = tx
        .prepare(&format!(
            "SELECT agent_id, instance, start_unix_ms, duration_ns, class, connection_id, digest, digest_text,
                    sample, blocker_kind, blockers
             FROM lock_waits WHERE start_unix_ms >= ?1{}
             ORDER BY start_unix_ms DESC, id DESC LIMIT {}",
            instance_filter(&query.instance, "instance"),
            query.limit
        ))
        .map_err(err)?;
    stmt.raw_bind_parameter(1, query.since_unix_ms).map_err(err)?;
    if let Some(instance) = &query.instance {
        stmt.raw_bind_parameter(2, instance).map_err(err)?;
    }
    let mut rows = stmt.raw_query();
    let mut out = Vec::new();
    while let Some(row) = rows.next().map_err(err)? {
        let blockers: String = row.get(10).map_err(err)?;
        let wait = LockWait {
            start_unix_ms: row.get(2).map_err(err)?,
            duration_ns: u(row.get(3).map_err(err)?),
            class: row.get(4).map_err(err)?,
            connection_id: u(row.get(5).map_err(err)?),
            digest: u(row.get(6).map_err(err)?),
            digest_text: row.get(7).map_err(err)?,
            sample: row.get(8).map_err(err)?,
            blocker_kind: row.get(9).map_err(err)?,
            blockers: blockers_of(&blockers).ok_or(StoreError::Corrupt { what: "lock_waits.blockers" })?,
        };
        out.push(LockWaitRow { agent_id: row.get(0).map_err(err)?, instance: row.get(1).map_err(err)?, wait: Some(wait) });
    }
    Ok(out)
}

fn totals(tx: &rusqlite::Transaction<'_>, query: &TotalsQuery) -> rusqlite::Result<TotalsResponse> {
    let mut out = TotalsResponse::default();
    let bind = |stmt: &mut rusqlite::Statement<'_>| -> rusqlite::Result<()> {
        stmt.raw_bind_parameter(1, query.since_unix_ms)?;
        if let Some(instance) = &query.instance {
            stmt.raw_bind_parameter(2, instance)?;
        }
        Ok(())
    };
    let mut stmt = tx.prepare(&format!(
        "SELECT statements, dropped_events, unmatched FROM instance_windows WHERE window_end >= ?1{}",
        instance_filter(&query.instance, "instance")
    ))?;
    bind(&mut stmt)?;
    let mut rows = stmt.raw_query();
    while let Some(row) = rows.next()? {
        out.statements = out.statements.saturating_add(u(row.get(0)?));
        out.dropped_events = out.dropped_events.saturating_add(u(row.get(1)?));
        out.unmatched = out.unmatched.saturating_add(u(row.get(2)?));
    }
    let mut commands: BTreeMap<String, u64> = BTreeMap::new();
    let mut stmt = tx.prepare(&format!(
        "SELECT c.command, c.count FROM window_commands c JOIN instance_windows w ON w.id = c.window_id
         WHERE w.window_end >= ?1{}",
        instance_filter(&query.instance, "w.instance")
    ))?;
    bind(&mut stmt)?;
    let mut rows = stmt.raw_query();
    while let Some(row) = rows.next()? {
        let slot = commands.entry(row.get(0)?).or_default();
        *slot = slot.saturating_add(u(row.get(1)?));
    }
    out.commands = commands.into_iter().map(|(command, count)| CommandCount { command, count }).collect();
    let mut stmt = tx.prepare(&format!(
        "SELECT count(DISTINCT digest) FROM digest_windows WHERE window_end >= ?1{}",
        instance_filter(&query.instance, "instance")
    ))?;
    bind(&mut stmt)?;
    if let Some(row) = stmt.raw_query().next()? {
        out.digest_count = u(row.get(0)?);
    }
    // Gaps belong to agents, not instances: with an instance filter, count
    // the gaps of the agents that served it. A gap without window times
    // is placed at the time it was reported.
    let mut stmt = tx.prepare(&format!(
        "SELECT lost_statements FROM gaps WHERE
             (CASE WHEN last_window_end_unix_ms > 0 THEN last_window_end_unix_ms ELSE received_unix_ms END) >= ?1{}",
        if query.instance.is_some() {
            " AND agent_id IN (SELECT agent_id FROM agent_instances WHERE instance = ?2)"
        } else {
            ""
        }
    ))?;
    bind(&mut stmt)?;
    let mut rows = stmt.raw_query();
    while let Some(row) = rows.next()? {
        out.lost_statements = out.lost_statements.saturating_add(u(row.get(0)?));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use sqlbee_proto::v1::{
        AgentCost, AgentIdentity, AgentWindow, Bucket, DigestStats, ErrorCount, Gap, Histogram, HostMetrics,
        InstanceWindow, ProbeCost, ProcessMetrics, ServerInstance, WaitStats,
    };

    use super::*;

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
            windows: vec![InstanceWindow {
                instance: Some(ServerInstance { name: "h:1".into(), pid: sequence as u32, start_time_unix_ms: 0 }),
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
        w.process = Some(ProcessMetrics { pid: 7, status: "running".into(), rss_bytes: Some(5 << 20), ..Default::default() });
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
        }];
        b
    }

    #[test]
    fn costs_hosts_and_latest() {
        let (store, dir) = temp_store("costs");
        store.ingest(&costed(1, 1000, 0.5, "exact"), 1000).unwrap();
        store.ingest(&costed(2, 2000, 1.5, "no-samples"), 2000).unwrap();
        let all = TotalsQuery { instance: None, since_unix_ms: 0 };
        let costs = store.costs(&all).unwrap();
        assert_eq!(costs.len(), 1, "{costs:?}");
        let c = &costs[0];
        // 0.5 and 1.5 cores over 10 ms each; 4 statements seen, 8 estimated.
        assert_eq!((c.windows, c.statements, c.shedding_windows), (2, 4, 1));
        assert!((c.agent_cpu_seconds - 0.02).abs() < 1e-9, "{c:?}");
        assert!((c.agent_cores_per_10k_qps - 0.02 / 4.0 * 1e4).abs() < 1e-6, "{c:?}");
        assert!((c.server_extra_cores_per_10k_qps - 0.004 / 8.0 * 1e4).abs() < 1e-6, "{c:?}");
        assert_eq!((c.agent_max_rss_bytes, c.latest_shedding.as_str(), c.host.as_str()), (2 << 20, "no-samples", "h"));
        let other = TotalsQuery { instance: Some("elsewhere:1".into()), since_unix_ms: 0 };
        assert!(store.costs(&other).unwrap().is_empty());

        let top = store.top(&TopQuery { instance: None, since_unix_ms: 0, order_by: OrderBy::Total, limit: 5 }).unwrap();
        assert_eq!((top[0].count, top[0].estimated_count), (4, 8));

        let instances = store.instances().unwrap();
        let latest = instances[0].latest.as_ref().expect("a cost");
        assert_eq!((latest.window_end_unix_ms, latest.agent_cpu_cores, latest.shedding.as_str()), (2000, 1.5, "no-samples"));
        assert_eq!((latest.attached_fraction, latest.aggregated_in_kernel), (0.5, 1));
        assert_eq!(latest.server.as_ref().and_then(|p| p.rss_bytes), Some(5 << 20));

        let hosts = store.hosts(&HostsQuery { host: None, since_unix_ms: 1500, limit: 10 }).unwrap();
        assert_eq!(hosts.len(), 1);
        assert_eq!(hosts[0].window.as_ref().and_then(|w| w.host.as_ref()).map(|h| h.load1), Some(2.0));
        assert!(store.hosts(&HostsQuery { host: Some("other".into()), since_unix_ms: 0, limit: 10 }).unwrap().is_empty());

        let pruned = store.prune(1500).unwrap();
        assert_eq!((pruned.agent_windows, pruned.instance_windows), (1, 1));
        assert_eq!(store.costs(&all).unwrap()[0].windows, 1);
        let _ = std::fs::remove_dir_all(dir);
    }

    #[test]
    fn once_merged_and_pruned() {
        let (store, dir) = temp_store("once");
        assert!(!store.ingest(&batch(2, 1000, &[(10, 2), (40, 1)]), 1000).unwrap().duplicate);
        assert!(store.ingest(&batch(2, 1000, &[(10, 2), (40, 1)]), 1001).unwrap().duplicate);
        assert!(!store.ingest(&batch(3, 2000, &[(40, 1), (60, 1)]), 2000).unwrap().duplicate);
        let query = TopQuery { instance: None, since_unix_ms: 0, order_by: OrderBy::P99, limit: 20 };
        let top = store.top(&query).unwrap();
        assert_eq!(top.len(), 1);
        let d = &top[0];
        // u64 values above i64::MAX come back exact; the sum saturates.
        assert_eq!((d.digest, d.count, d.sum_ns, d.max_ns), (u64::MAX - 1, 5, u64::MAX, u64::MAX / 4));
        assert_eq!(d.p50_ns, sqlbee_common::histogram::bucket_high(40));
        assert_eq!(d.p99_ns, sqlbee_common::histogram::bucket_high(60));
        let totals = store.totals(&TotalsQuery { instance: Some("h:1".into()), since_unix_ms: 1500 }).unwrap();
        // The gap has no window times: it counts at the time it was received.
        assert_eq!((totals.statements, totals.digest_count, totals.lost_statements), (2, 1, 0));
        let totals = store.totals(&TotalsQuery { instance: None, since_unix_ms: 0 }).unwrap();
        assert_eq!((totals.statements, totals.commands[0].count, totals.lost_statements), (5, 5, 5));
        let instances = store.instances().unwrap();
        assert_eq!((instances[0].pid, instances[0].batches, instances[0].gaps), (3, 2, 1));
        let pruned = store.prune(1500).unwrap();
        assert_eq!((pruned.digest_windows, pruned.instance_windows, pruned.batches), (1, 1, 1));
        assert_eq!(store.top(&query).unwrap()[0].count, 2);
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
        store.ingest(&second, 2000).unwrap();
        store.ingest(&first, 2001).unwrap();
        // Without waits (an old agent).
        store.ingest(&waiting(3, "h:1", 3000, vec![], vec![]), 3000).unwrap();
        let query = TopQuery { instance: None, since_unix_ms: 0, order_by: OrderBy::Total, limit: 20 };
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

        // Ordering by total wait.
        store.ingest(&waiting(4, "h:1", 3000, vec![wait("commit", 10_000, 10_000, 1)], vec![]), 3000).unwrap();
        let mut other = waiting(5, "h:1", 3000, vec![], vec![]);
        other.windows[0].digests[0].digest = 8;
        store.ingest(&other, 3000).unwrap();
        let by_wait = store.top(&TopQuery { order_by: OrderBy::Wait, ..query.clone() }).unwrap();
        assert_eq!(by_wait.iter().map(|d| d.digest).collect::<Vec<_>>(), vec![7, 8]);
        assert_eq!(by_wait[0].waits[0], wait("commit", 10_000, 10_000, 1));

        // Samples go with their windows.
        let pruned = store.prune(1500).unwrap();
        assert_eq!(pruned.error_samples, 1);
        let d = store.top(&query).unwrap().into_iter().find(|d| d.digest == 7).unwrap();
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
        store.ingest(&b, 2000).unwrap();
        store.ingest(&other, 2000).unwrap();
        // A duplicate stores nothing.
        store.ingest(&b, 2001).unwrap();
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
        assert_eq!(store.prune(1300).unwrap().lock_waits, 2);
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
        let query = TopQuery { instance: None, since_unix_ms: 0, order_by: OrderBy::Total, limit: 20 };
        assert_eq!(store.top(&query).unwrap()[0].count, 5);
        let all = LocksQuery { instance: None, since_unix_ms: 0, limit: 100 };
        assert!(store.locks(&all).unwrap().is_empty());
        let mut b = batch(1, 2000, &[(10, 1)]);
        b.windows[0].lock_waits = vec![lock_wait(1900, 4, vec![])];
        store.ingest(&b, 2000).unwrap();
        assert_eq!(store.locks(&all).unwrap().len(), 1);
        std::fs::remove_dir_all(dir).ok();
    }

    /// The version-3 schema, from today's: without the cost tables and
    /// digest_windows.estimated_count.
    fn schema_v3() -> String {
        let without_estimates = SCHEMA.replace(",\n    estimated_count INTEGER NOT NULL DEFAULT 0\n", "\n");
        assert_ne!(without_estimates, SCHEMA, "the estimated_count column moved; update this test");
        let start = without_estimates.find("-- What the probes cost each instance window").unwrap();
        let end = without_estimates.find("-- What agents lost").unwrap();
        format!("{}{}", &without_estimates[..start], &without_estimates[end..])
    }

    #[test]
    fn version_3_files_get_costs() {
        let (dir, path) = old_store("v3", &schema_v3(), &format!("{ONE_V2_ROW} PRAGMA user_version = 3;"));
        let store = SqliteStore::open(&path).unwrap();
        let query = TopQuery { instance: None, since_unix_ms: 0, order_by: OrderBy::Total, limit: 20 };
        let d = store.top(&query).unwrap().remove(0);
        // An old row is exact: no estimate.
        assert_eq!((d.count, d.estimated_count), (5, 0));
        store.ingest(&costed(1, 2000, 0.25, "exact"), 2000).unwrap();
        assert_eq!(store.costs(&TotalsQuery { instance: None, since_unix_ms: 0 }).unwrap()[0].windows, 1);
        std::fs::remove_dir_all(dir).ok();
    }

    /// The version-1 schema, from today's: without digest_windows.waits
    /// and without error_samples.
    fn schema_v1() -> String {
        let v3 = schema_v3();
        let without_waits = v3.replace(",\n    waits       BLOB NOT NULL DEFAULT x''\n", "\n");
        assert_ne!(without_waits, v3, "the waits column moved; update this test");
        let start = without_waits.find("-- One message per (digest, error code)").unwrap();
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
        let query = TopQuery { instance: None, since_unix_ms: 0, order_by: OrderBy::Wait, limit: 20 };
        let d = store.top(&query).unwrap().remove(0);
        assert_eq!((d.digest, d.count, d.digest_text.as_str(), d.sample.as_str()), (7, 5, "SELECT ?", "SELECT 1"));
        assert!(d.waits.is_empty());
        assert_eq!(d.error_codes, vec![error(1062, 1, ""), error(1067, 1, "")]);
        store.ingest(&waiting(1, "h:1", 2000, vec![wait("row_lock", 9, 9, 1)], vec![error(1062, 1, "dup")]), 2000).unwrap();
        let d = store.top(&query).unwrap().remove(0);
        assert_eq!((d.count, d.waits.clone()), (10, vec![wait("row_lock", 9, 9, 1)]));
        assert_eq!(d.error_codes, vec![error(1062, 2, "dup"), error(1067, 1, "")]);
        drop(store);
        // Opening again changes nothing; a newer file is refused.
        let store = SqliteStore::open(&path).unwrap();
        assert_eq!(store.top(&query).unwrap()[0].count, 10);
        lock(&store.writer).pragma_update(None, "user_version", SCHEMA_VERSION + 1).unwrap();
        drop(store);
        assert!(matches!(SqliteStore::open(&path), Err(StoreError::Version { found: 5, known: 4, .. })));
        std::fs::remove_dir_all(dir).ok();
    }
}
