//! The store file's tables and their versions: created on first open,
//! brought up to date in place on later ones.
use std::time::Duration;

use rusqlite::{Connection, TransactionBehavior};

use crate::store::rank_columns;

/// Bumped when the schema changes; a newer file is refused, not guessed at.
/// An older one is brought up to date on open (`migrate`), keeping its data:
/// - 1: first version.
/// - 2: `digest_windows.waits` (added to version-1 files with ALTER TABLE;
///   their rows read as "no waits") and `error_samples`.
/// - 3: `lock_waits` (a new table: older files simply get it, empty).
/// - 4: `instance_costs`, `agent_windows` (new tables) and
///   `digest_windows.estimated_count` (ALTER TABLE; older rows read 0,
///   "exact").
/// - 5: `batches` keyed by (agent_id, epoch, sequence) with each batch's
///   `content_hash` (the table is rebuilt; older rows get epoch 0 and hash
///   0, "unknown", which never conflicts).
/// - 6: `agent_instances.container_id` and `.container` (ALTER TABLE;
///   older rows read "", on the host).
/// - 7: `agent_instances.build_id`, `.server_version` and the `untraced_*`
///   columns (ALTER TABLE; older rows read "" and 0: unknown build, traced).
/// - 8: `digest_windows.schema`, the rank columns (then `rows_examined`,
///   `cpu_ns` and `tmp_disk_tables`), and the `figures` and `accounts`
///   blobs (ALTER TABLE; older rows read "no schema" and figures unknown).
///   A figure ranked later gets its column on open the same way, with no
///   new version: an older collector reads the file as it did.
/// - 9: `digest_windows.nested`, `program`, `program_kind`,
///   `parent_digest` and `source` (ALTER TABLE; older rows read as client
///   statements at top level), and `instance_windows.nested_statements`
///   and `replica_statements`.
/// - 10: `digest_rollups`, `instance_cost_rollups` and `agent_cost_rollups`
///   (new tables; an upgraded file's stored windows are rolled up at once).
/// - 11: day buckets in the three rollup tables (no new column; a
///   version-10 file's days are built from its hour buckets at once).
/// - 12: `error_samples` keyed by instance as well, so one agent's message
///   cannot replace another's (the table is rebuilt; older rows get
///   instance "", read only when no instance is asked for).
/// - 13: `plans`, `plan_changes` and `digest_tables` (new tables) and
///   `agent_instances.server_login` (ALTER TABLE; older rows read "", no
///   login).
/// - 14: `long_statements` (a new table: older files simply get it, empty).
/// - 15: `annotations` and `events` (new tables, likewise).
/// - 16: `export_marks` (a new table, likewise).
/// - 17: `table_indexes` (a new table, likewise).
/// - 18: `replication_windows` (a new table, likewise).
pub const SCHEMA_VERSION: i64 = 18;

/// The tables, with the rank columns in their place.
pub(super) fn schema() -> String {
    with_rank_columns(SCHEMA)
}

/// `tables` (`SCHEMA` or a test's older version of it) with the rank
/// columns in place of `{rank_columns}`.
pub(super) fn with_rank_columns(tables: &str) -> String {
    tables.replace("{rank_columns}", &rank_columns::definitions(|name| format!("{name} INTEGER")))
}

pub(super) const SCHEMA: &str = "
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
    epoch              INTEGER NOT NULL,
    sequence           INTEGER NOT NULL,
    received_unix_ms   INTEGER NOT NULL,
    keep_until_unix_ms INTEGER NOT NULL,
    content_hash       INTEGER NOT NULL,
    PRIMARY KEY (agent_id, epoch, sequence)
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS batches_keep ON batches (keep_until_unix_ms);

-- Latest state of each server instance an agent reported (Instances). A
-- server the agent could not trace has a row too: untraced_seen_unix_ms is
-- the end of the newest agent window that reported it untraced, so it is
-- untraced while that is newer than its newest instance window. The
-- untraced columns must stay the last ones: older files get them appended.
CREATE TABLE IF NOT EXISTS agent_instances (
    agent_id                TEXT NOT NULL,
    instance                TEXT NOT NULL,
    pid                     INTEGER NOT NULL,
    start_time_unix_ms      INTEGER NOT NULL,
    last_window_end_unix_ms INTEGER NOT NULL,
    container_id            TEXT NOT NULL DEFAULT '',
    container               TEXT NOT NULL DEFAULT '',
    build_id                TEXT NOT NULL DEFAULT '',
    server_version          TEXT NOT NULL DEFAULT '',
    untraced_reason         TEXT NOT NULL DEFAULT '',
    untraced_kind           TEXT NOT NULL DEFAULT '',
    untraced_since_unix_ms  INTEGER NOT NULL DEFAULT 0,
    untraced_seen_unix_ms   INTEGER NOT NULL DEFAULT 0,
    server_login            TEXT NOT NULL DEFAULT '',
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
    overflow_statements INTEGER NOT NULL,
    nested_statements   INTEGER NOT NULL DEFAULT 0,
    replica_statements  INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX IF NOT EXISTS instance_windows_end ON instance_windows (window_end);
CREATE INDEX IF NOT EXISTS instance_windows_instance ON instance_windows (instance, window_end);

CREATE TABLE IF NOT EXISTS window_commands (
    window_id INTEGER NOT NULL,
    command   TEXT NOT NULL,
    count     INTEGER NOT NULL,
    PRIMARY KEY (window_id, command)
) WITHOUT ROWID;

-- One row per (schema, digest) per instance window. histogram and
-- error_codes are blob-encoded (index gap, count) varint pairs, error codes
-- increasing; waits is blob-encoded (class, sum_ns, max_ns, statements),
-- empty when the agent sent none. figures is an encoded sqlbee.v1.QueryStats
-- and accounts an encoded sqlbee.v1.DigestStats holding only its accounts
-- (both empty when absent); the rank columns repeat the figures the top
-- list ranks by (`store::rank_columns`; NULL: unknown) so `top` can rank
-- by them without decoding. The columns from waits on must stay last, in
-- this order: older files get them appended by ALTER TABLE.
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
    estimated_count INTEGER NOT NULL DEFAULT 0,
    schema      TEXT NOT NULL DEFAULT '',
    {rank_columns},
    figures     BLOB NOT NULL DEFAULT x'',
    accounts    BLOB NOT NULL DEFAULT x'',
    nested      INTEGER NOT NULL DEFAULT 0,
    program     TEXT NOT NULL DEFAULT '',
    program_kind TEXT NOT NULL DEFAULT '',
    parent_digest INTEGER NOT NULL DEFAULT 0,
    source      TEXT NOT NULL DEFAULT ''
);
CREATE INDEX IF NOT EXISTS digest_windows_end ON digest_windows (window_end);
CREATE INDEX IF NOT EXISTS digest_windows_instance ON digest_windows (instance, window_end);
CREATE INDEX IF NOT EXISTS digest_windows_digest ON digest_windows (digest, window_end);

-- The digest rows of every window added up per bucket of one minute
-- (level 60000) and one hour (level 3600000) as they arrive: a bucket
-- holds the windows whose end falls in [bucket, bucket + level), the
-- rule raw reads filter by, so a range cut along bucket edges reads the
-- same statements either way. Columns mean what they mean in
-- digest_windows; estimated_count is the scaled count of all its windows
-- when any was sampled (0: every window exact), accounts keeps every
-- account (no top-N cut, so merges stay exact), and sample is the newest
-- window's (sample_end: that window's end).
CREATE TABLE IF NOT EXISTS digest_rollups (
    level           INTEGER NOT NULL,
    bucket          INTEGER NOT NULL,
    instance        TEXT NOT NULL,
    schema          TEXT NOT NULL,
    digest          INTEGER NOT NULL,
    nested          INTEGER NOT NULL,
    program         TEXT NOT NULL,
    program_kind    TEXT NOT NULL,
    parent_digest   INTEGER NOT NULL,
    source          TEXT NOT NULL,
    count           INTEGER NOT NULL,
    errors          INTEGER NOT NULL,
    sum_ns          INTEGER NOT NULL,
    min_ns          INTEGER NOT NULL,
    max_ns          INTEGER NOT NULL,
    estimated_count INTEGER NOT NULL,
    {rank_columns},
    histogram       BLOB NOT NULL,
    error_codes     BLOB NOT NULL,
    waits           BLOB NOT NULL,
    figures         BLOB NOT NULL,
    accounts        BLOB NOT NULL,
    sample          TEXT NOT NULL,
    sample_end      INTEGER NOT NULL,
    PRIMARY KEY (level, bucket, instance, schema, digest, nested, program, program_kind, parent_digest, source)
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS digest_rollups_digest ON digest_rollups (digest, level, bucket);

-- What watching cost, per bucket as digest_rollups: per (agent, instance)
-- the statements of its windows and, over the windows that carried a probe
-- cost (probed_windows), the probes' CPU and the statements scaled where
-- sampled; per agent its own windows added up, with the shedding step of
-- the newest (latest_end: that window's end).
CREATE TABLE IF NOT EXISTS instance_cost_rollups (
    level             INTEGER NOT NULL,
    bucket            INTEGER NOT NULL,
    agent_id          TEXT NOT NULL,
    instance          TEXT NOT NULL,
    windows           INTEGER NOT NULL,
    statements        INTEGER NOT NULL,
    probed_windows    INTEGER NOT NULL,
    probe_cpu_seconds REAL NOT NULL,
    estimated         INTEGER NOT NULL,
    PRIMARY KEY (level, bucket, agent_id, instance)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS agent_cost_rollups (
    level            INTEGER NOT NULL,
    bucket           INTEGER NOT NULL,
    agent_id         TEXT NOT NULL,
    windows          INTEGER NOT NULL,
    seconds          REAL NOT NULL,
    cpu_seconds      REAL NOT NULL,
    max_rss_bytes    INTEGER NOT NULL,
    dropped_events   INTEGER NOT NULL,
    shedding_windows INTEGER NOT NULL,
    latest_shedding  TEXT NOT NULL,
    latest_end       INTEGER NOT NULL,
    PRIMARY KEY (level, bucket, agent_id)
) WITHOUT ROWID;

-- Texts once per digest: the id is a hash of the text, the same everywhere.
CREATE TABLE IF NOT EXISTS digest_texts (
    digest INTEGER PRIMARY KEY,
    text   TEXT NOT NULL
);

-- One message per (instance, digest, error code): the newest by window end.
-- The counts stay in digest_windows.error_codes; this only names them.
CREATE TABLE IF NOT EXISTS error_samples (
    instance  TEXT NOT NULL,
    digest    INTEGER NOT NULL,
    code      INTEGER NOT NULL,
    message   TEXT NOT NULL,
    last_seen INTEGER NOT NULL,
    PRIMARY KEY (digest, code, instance)
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

/// Brings the file to `SCHEMA_VERSION` in one transaction, creating only
/// what is missing, so existing rows stay. Ok(version found), or
/// Err(version found) when the file is newer than this collector.
pub(super) fn migrate(conn: &mut Connection) -> rusqlite::Result<Result<i64, i64>> {
    let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
    let found: i64 = tx.query_row("PRAGMA user_version", [], |r| r.get(0))?;
    if found > SCHEMA_VERSION {
        return Ok(Err(found));
    }
    // New files get everything; older ones the tables they lack.
    tx.execute_batch(&schema())?;
    tx.execute_batch(super::plans::TABLES)?;
    tx.execute_batch(super::tables::TABLES)?;
    tx.execute_batch(super::long::TABLES)?;
    tx.execute_batch(super::events::TABLES)?;
    tx.execute_batch(super::export_marks::TABLES)?;
    tx.execute_batch(super::indexes::TABLES)?;
    tx.execute_batch(super::replication::TABLES)?;
    // Version 1 -> 2: CREATE TABLE IF NOT EXISTS left digest_windows as it was.
    let has_waits = has_column(&tx, "digest_windows", "waits")?;
    if !has_waits {
        tx.execute_batch("ALTER TABLE digest_windows ADD COLUMN waits BLOB NOT NULL DEFAULT x''")?;
    }
    // Version 3 -> 4, likewise.
    if !has_column(&tx, "digest_windows", "estimated_count")? {
        tx.execute_batch("ALTER TABLE digest_windows ADD COLUMN estimated_count INTEGER NOT NULL DEFAULT 0")?;
    }
    // Version 4 -> 5: a primary key cannot change in place; the old table
    // moves aside, SCHEMA creates the new one, and the rows come over.
    if !has_column(&tx, "batches", "epoch")? {
        tx.execute_batch("ALTER TABLE batches RENAME TO batches_v4")?;
        tx.execute_batch(&schema())?;
        tx.execute_batch(
            "INSERT INTO batches (agent_id, epoch, sequence, received_unix_ms, keep_until_unix_ms, content_hash)
                 SELECT agent_id, 0, sequence, received_unix_ms, keep_until_unix_ms, 0 FROM batches_v4;
             DROP TABLE batches_v4;
             CREATE INDEX IF NOT EXISTS batches_keep ON batches (keep_until_unix_ms);",
        )?;
    }
    // Version 11 -> 12, as 4 -> 5.
    if !has_column(&tx, "error_samples", "instance")? {
        tx.execute_batch(
            "ALTER TABLE error_samples RENAME TO error_samples_v11;
             DROP INDEX IF EXISTS error_samples_last_seen;",
        )?;
        tx.execute_batch(&schema())?;
        tx.execute_batch(
            "INSERT INTO error_samples (instance, digest, code, message, last_seen)
                 SELECT '', digest, code, message, last_seen FROM error_samples_v11;
             DROP TABLE error_samples_v11;",
        )?;
    }
    // Version 5 -> 6.
    if !has_column(&tx, "agent_instances", "container_id")? {
        tx.execute_batch(
            "ALTER TABLE agent_instances ADD COLUMN container_id TEXT NOT NULL DEFAULT '';
             ALTER TABLE agent_instances ADD COLUMN container TEXT NOT NULL DEFAULT '';",
        )?;
    }
    // Version 8 -> 9.
    if !has_column(&tx, "digest_windows", "nested")? {
        tx.execute_batch(
            "ALTER TABLE digest_windows ADD COLUMN nested INTEGER NOT NULL DEFAULT 0;
             ALTER TABLE digest_windows ADD COLUMN program TEXT NOT NULL DEFAULT '';
             ALTER TABLE digest_windows ADD COLUMN program_kind TEXT NOT NULL DEFAULT '';
             ALTER TABLE digest_windows ADD COLUMN parent_digest INTEGER NOT NULL DEFAULT 0;
             ALTER TABLE digest_windows ADD COLUMN source TEXT NOT NULL DEFAULT '';",
        )?;
    }
    if !has_column(&tx, "instance_windows", "nested_statements")? {
        tx.execute_batch(
            "ALTER TABLE instance_windows ADD COLUMN nested_statements INTEGER NOT NULL DEFAULT 0;
             ALTER TABLE instance_windows ADD COLUMN replica_statements INTEGER NOT NULL DEFAULT 0;",
        )?;
    }
    // Version 7 -> 8.
    if !has_column(&tx, "digest_windows", "schema")? {
        tx.execute_batch(
            "ALTER TABLE digest_windows ADD COLUMN schema TEXT NOT NULL DEFAULT '';
             ALTER TABLE digest_windows ADD COLUMN figures BLOB NOT NULL DEFAULT x'';
             ALTER TABLE digest_windows ADD COLUMN accounts BLOB NOT NULL DEFAULT x'';",
        )?;
    }
    // Version 6 -> 7.
    if !has_column(&tx, "agent_instances", "untraced_seen_unix_ms")? {
        tx.execute_batch(
            "ALTER TABLE agent_instances ADD COLUMN build_id TEXT NOT NULL DEFAULT '';
             ALTER TABLE agent_instances ADD COLUMN server_version TEXT NOT NULL DEFAULT '';
             ALTER TABLE agent_instances ADD COLUMN untraced_reason TEXT NOT NULL DEFAULT '';
             ALTER TABLE agent_instances ADD COLUMN untraced_kind TEXT NOT NULL DEFAULT '';
             ALTER TABLE agent_instances ADD COLUMN untraced_since_unix_ms INTEGER NOT NULL DEFAULT 0;
             ALTER TABLE agent_instances ADD COLUMN untraced_seen_unix_ms INTEGER NOT NULL DEFAULT 0;",
        )?;
    }
    // Version 7 -> 8 and any figure the list ranks by since: its column.
    // A row written before reads NULL, unknown.
    for table in ["digest_windows", "digest_rollups"] {
        for name in rank_columns::names() {
            if !has_column(&tx, table, name)? {
                tx.execute_batch(&format!("ALTER TABLE {table} ADD COLUMN {name} INTEGER"))?;
            }
        }
    }
    // Version 12 -> 13.
    if !has_column(&tx, "agent_instances", "server_login")? {
        tx.execute_batch("ALTER TABLE agent_instances ADD COLUMN server_login TEXT NOT NULL DEFAULT ''")?;
    }
    // Version 9 -> 10: the rollups start with every window already stored.
    if found > 0 && found < 10 {
        let rows = super::rollups::backfill(&tx).map_err(rollup_error)?;
        tracing::info!(rows, "rolled up the digest rows stored before rollups existed");
    }
    // Version 10 -> 11 (older files got their days from the backfill).
    if found == 10 {
        let rows = super::rollups::days_from_hours(&tx).map_err(rollup_error)?;
        tracing::info!(rows, "rolled the stored hour buckets up into days");
    }
    if found != SCHEMA_VERSION {
        tx.pragma_update(None, "user_version", SCHEMA_VERSION)?;
    }
    tx.commit()?;
    Ok(Ok(found))
}

/// A rollup rebuilt during an upgrade fails the upgrade as SQLite would,
/// a corrupt stored blob included.
fn rollup_error(e: super::rollups::RollupError) -> rusqlite::Error {
    match e {
        super::rollups::RollupError::Sqlite(e) => e,
        corrupt => rusqlite::Error::ToSqlConversionFailure(Box::new(corrupt)),
    }
}

fn has_column(tx: &rusqlite::Transaction<'_>, table: &str, column: &str) -> rusqlite::Result<bool> {
    tx.query_row("SELECT count(*) > 0 FROM pragma_table_info(?1) WHERE name = ?2", [table, column], |r| r.get(0))
}

/// What an acknowledgement promises about power loss.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Durability {
    /// `synchronous=FULL`: the WAL is synced at every commit, so a batch
    /// the collector acknowledged survives a power loss (the default).
    #[default]
    Full,
    /// `synchronous=NORMAL`: a power loss may lose the last acknowledged
    /// batches (never the file); agents would not send them again.
    Normal,
}

pub(super) fn configure(conn: &Connection, durability: Durability) -> rusqlite::Result<()> {
    // WAL: readers never block the writer.
    let mode: String = conn.query_row("PRAGMA journal_mode = WAL", [], |r| r.get(0))?;
    if !mode.eq_ignore_ascii_case("wal") {
        tracing::warn!(mode, "SQLite refused WAL mode; queries will block ingest");
    }
    let synchronous = match durability {
        Durability::Full => "FULL",
        Durability::Normal => "NORMAL",
    };
    conn.execute_batch(&format!("PRAGMA synchronous = {synchronous}; PRAGMA foreign_keys = OFF;"))?;
    conn.busy_timeout(Duration::from_secs(10))?;
    Ok(())
}
