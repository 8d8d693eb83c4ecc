//! SQLite store: one file, WAL, one writer connection and one reader
//! connection (WAL lets queries run while a batch is written). Every batch
//! is written in one transaction together with its exactly-once record.
//! `schema` creates and migrates the file, `write` stores and prunes,
//! `read` answers queries, `costs` the cost answers.
//!
//! SQLite integers are i64; the protocol's u64 counters and digest ids are
//! stored bit-cast (`as i64`) and cast back when read. No SQL arithmetic or
//! comparison runs on them: sums and merges happen in Rust (`merge`), so a
//! value above 2^63 stays exact and a sum can never overflow inside SQLite.
//! No rusqlite type leaves this folder: errors become `StoreError` here.
mod costs;
mod digest_rows;
mod events;
mod export_marks;
mod indexes;
mod long;
mod plans;
mod read;
mod replication;
mod rollups;
mod row;
mod schema;
mod series;
mod tables;
#[cfg(test)]
mod tests;
mod write;

use std::{
    fs,
    os::unix::fs::{OpenOptionsExt, PermissionsExt},
    path::Path,
    sync::{Mutex, MutexGuard},
};

use rusqlite::{Connection, TransactionBehavior};
use sqlbee_proto::v1::{
    AgentWindowRow, Annotation, Batch, CostSummary, DigestSeries, Event, InstanceInfo, InstanceSeries, LockWaitRow,
    LongStatementRow, PlanRow, PlansResponse, SeriesPoint, TopDigest, TotalsResponse,
};

use super::{
    AnnotationsQuery, DigestTables, EventsQuery, ExportMark, HostsQuery, IngestOutcome, LocksQuery, Page, PlansQuery,
    PruneCutoffs, PruneOutcome, SeriesQuery, Store, StoreError, StoredIndexes, StoredReplication, TopPage, TopQuery,
    TotalsQuery, cancel,
};

pub use schema::{Durability, SCHEMA_VERSION};

/// The store holds every agent's statements: only the collector's user may
/// read it. SQLite gives its `-wal` and `-shm` files the database file's
/// mode, so creating that file 0600 (or narrowing it) covers all three.
fn private_file(path: &Path) -> std::io::Result<()> {
    fs::OpenOptions::new().write(true).create(true).truncate(false).mode(0o600).open(path)?;
    let mode = fs::metadata(path)?.permissions().mode() & 0o777;
    if mode != 0o600 {
        tracing::warn!(path = %path.display(), from = format!("{mode:o}"), "narrowing the store's permissions to 0600");
        fs::set_permissions(path, fs::Permissions::from_mode(0o600))?;
    }
    for side in ["-wal", "-shm"] {
        let mut name = path.as_os_str().to_owned();
        name.push(side);
        if let Ok(meta) = fs::metadata(&name)
            && meta.permissions().mode() & 0o077 != 0
        {
            fs::set_permissions(&name, fs::Permissions::from_mode(0o600))?;
        }
    }
    Ok(())
}

/// A SQLite error as a store error, telling a full disk apart: a client
/// retries both, but an operator needs to know which one it is.
pub(super) fn error(action: &'static str, source: rusqlite::Error) -> StoreError {
    if source.sqlite_error_code() == Some(rusqlite::ErrorCode::DiskFull) {
        StoreError::Full { source: source.into() }
    } else {
        StoreError::Backend { action, source: source.into() }
    }
}

pub struct SqliteStore {
    writer: Mutex<Connection>,
    reader: Mutex<Connection>,
}

/// Bit-cast for storage (see the module comment).
pub(super) fn i(v: u64) -> i64 {
    v as i64
}

pub(super) fn u(v: i64) -> u64 {
    v as u64
}

/// A poisoned lock only means another call panicked; its transaction was
/// rolled back when dropped, so the connection is still usable.
pub(super) fn lock(m: &Mutex<Connection>) -> MutexGuard<'_, Connection> {
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// The read connection, held for one call. A request that was cancelled
/// while it waited for the connection does not start; one cancelled while
/// it reads is interrupted (SQLite stops the statement and returns
/// SQLITE_INTERRUPT), so the next reader is not kept waiting by work no
/// one will see.
pub(super) struct ReadConnection<'a> {
    // Unregistered before the lock is released: a late cancel must not
    // interrupt the next caller's read.
    _interrupt: cancel::Registration,
    conn: MutexGuard<'a, Connection>,
}

impl std::ops::Deref for ReadConnection<'_> {
    type Target = Connection;
    fn deref(&self) -> &Connection {
        &self.conn
    }
}

impl std::ops::DerefMut for ReadConnection<'_> {
    fn deref_mut(&mut self) -> &mut Connection {
        &mut self.conn
    }
}

/// `AND <column> = ?2` when an instance filter is given.
pub(super) fn instance_filter(instance: &Option<String>, column: &str) -> String {
    if instance.is_some() { format!(" AND {column} = ?2") } else { String::new() }
}

impl SqliteStore {
    fn read(&self) -> Result<ReadConnection<'_>, StoreError> {
        let conn = lock(&self.reader);
        if cancel::cancelled() {
            return Err(StoreError::Cancelled);
        }
        let handle = conn.get_interrupt_handle();
        Ok(ReadConnection { _interrupt: cancel::on_cancel(move || handle.interrupt()), conn })
    }

    /// One write transaction of its own (not a batch's).
    fn write(
        &self,
        action: &'static str,
        work: impl FnOnce(&rusqlite::Transaction<'_>) -> rusqlite::Result<()>,
    ) -> Result<(), StoreError> {
        let mut conn = lock(&self.writer);
        let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate).map_err(|e| error(action, e))?;
        work(&tx).map_err(|e| error(action, e))?;
        tx.commit().map_err(|e| error(action, e))
    }

    /// Opens (or creates) the store with durable acknowledgements.
    pub fn open(path: &Path) -> Result<SqliteStore, StoreError> {
        SqliteStore::open_with(path, Durability::Full)
    }

    pub fn open_with(path: &Path, durability: Durability) -> Result<SqliteStore, StoreError> {
        private_file(path)
            .map_err(|source| StoreError::Open { path: path.display().to_string(), source: source.into() })?;
        let open_err =
            |source: rusqlite::Error| StoreError::Open { path: path.display().to_string(), source: source.into() };
        let mut writer = Connection::open(path).map_err(open_err)?;
        schema::configure(&writer, durability).map_err(open_err)?;
        let found = match schema::migrate(&mut writer).map_err(open_err)? {
            Ok(found) => found,
            Err(found) => {
                return Err(StoreError::Version {
                    path: path.display().to_string(),
                    found,
                    known: schema::SCHEMA_VERSION,
                });
            }
        };
        if found > 0 && found < schema::SCHEMA_VERSION {
            tracing::info!(path = %path.display(), from = found, to = schema::SCHEMA_VERSION, "store schema upgraded; existing data kept");
        }
        let mut reader = Connection::open(path).map_err(open_err)?;
        schema::configure(&reader, durability).map_err(open_err)?;
        // A read whose request was given up stops at its next few thousand
        // steps: a read made of many statements is not caught by one
        // interrupt, which only stops the statements running at that moment.
        reader.progress_handler(1_000, Some(cancel::cancelled)).map_err(open_err)?;
        Ok(SqliteStore { writer: Mutex::new(writer), reader: Mutex::new(reader) })
    }
}

impl Store for SqliteStore {
    fn ingest(&self, batch: Batch, received_unix_ms: i64, content_hash: u64) -> Result<IngestOutcome, StoreError> {
        let mut conn = lock(&self.writer);
        let err = |e| error("ingest", e);
        let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate).map_err(err)?;
        let outcome = write::batch(&tx, &batch, received_unix_ms, content_hash).map_err(err)?;
        if outcome.conflict {
            // Dropping the transaction rolls back what it touched.
            return Err(StoreError::Conflict {
                agent_id: batch.agent.as_ref().map(|a| a.agent_id.clone()).unwrap_or_default(),
                epoch: batch.epoch,
                sequence: batch.sequence,
            });
        }
        if !outcome.duplicate {
            write::rollups(&tx, &batch)?;
        }
        tx.commit().map_err(err)?;
        Ok(outcome)
    }

    fn top_page(&self, query: &TopQuery) -> Result<TopPage, StoreError> {
        let mut conn = self.read()?;
        // One read transaction: every step sees the same snapshot, so the
        // merged histograms add up to the counts of the first step.
        let tx = conn.transaction().map_err(|e| error("top", e))?;
        read::top(&tx, query, false)
    }

    fn top_lean(&self, query: &TopQuery) -> Result<Vec<TopDigest>, StoreError> {
        let mut conn = self.read()?;
        let tx = conn.transaction().map_err(|e| error("top", e))?;
        Ok(read::top(&tx, query, true)?.rows)
    }

    fn instances(&self) -> Result<Vec<InstanceInfo>, StoreError> {
        let mut conn = self.read()?;
        let tx = conn.transaction().map_err(|e| error("instances", e))?;
        let mut out = read::instances(&tx).map_err(|e| error("instances", e))?;
        for info in &mut out {
            info.latest = costs::latest(&tx, &info.agent_id, &info.instance)?;
        }
        Ok(out)
    }

    fn costs(&self, query: &TotalsQuery) -> Result<Vec<CostSummary>, StoreError> {
        let mut conn = self.read()?;
        let tx = conn.transaction().map_err(|e| error("costs", e))?;
        costs::summaries(&tx, query)
    }

    fn hosts(&self, query: &HostsQuery) -> Result<Vec<AgentWindowRow>, StoreError> {
        let mut conn = self.read()?;
        let tx = conn.transaction().map_err(|e| error("hosts", e))?;
        costs::hosts(&tx, query)
    }

    fn totals(&self, query: &TotalsQuery) -> Result<TotalsResponse, StoreError> {
        let mut conn = self.read()?;
        let tx = conn.transaction().map_err(|e| error("totals", e))?;
        read::totals(&tx, query).map_err(|e| error("totals", e))
    }

    fn locks_page(&self, query: &LocksQuery) -> Result<Page<LockWaitRow>, StoreError> {
        let mut conn = self.read()?;
        let tx = conn.transaction().map_err(|e| error("locks", e))?;
        read::locks(&tx, query)
    }

    fn long_statements_page(&self, query: &LocksQuery) -> Result<Page<LongStatementRow>, StoreError> {
        let mut conn = self.read()?;
        let tx = conn.transaction().map_err(|e| error("long_statements", e))?;
        long::read(&tx, query)
    }

    fn series(&self, query: &SeriesQuery) -> Result<Vec<SeriesPoint>, StoreError> {
        let mut conn = self.read()?;
        let tx = conn.transaction().map_err(|e| error("series", e))?;
        series::series(&tx, query)
    }

    fn series_by_instance(&self, query: &SeriesQuery) -> Result<Vec<InstanceSeries>, StoreError> {
        let mut conn = self.read()?;
        let tx = conn.transaction().map_err(|e| error("series", e))?;
        series::by_instance(&tx, query)
    }

    fn series_by_digest(&self, query: &SeriesQuery, digests: &[u64]) -> Result<Vec<DigestSeries>, StoreError> {
        let mut conn = self.read()?;
        let tx = conn.transaction().map_err(|e| error("series", e))?;
        series::by_digest(&tx, query, digests)
    }

    fn plans(&self, query: &PlansQuery) -> Result<PlansResponse, StoreError> {
        let mut conn = self.read()?;
        let tx = conn.transaction().map_err(|e| error("plans", e))?;
        plans::read(&tx, query)
    }

    fn digest_tables(&self, digests: &[u64]) -> Result<Vec<DigestTables>, StoreError> {
        let mut conn = self.read()?;
        let tx = conn.transaction().map_err(|e| error("tables", e))?;
        tables::read(&tx, digests)
    }

    fn table_indexes(&self, instance: Option<&str>) -> Result<Vec<StoredIndexes>, StoreError> {
        let mut conn = self.read()?;
        let tx = conn.transaction().map_err(|e| error("table_indexes", e))?;
        indexes::read(&tx, instance)
    }

    fn replication_each(
        &self,
        instance: Option<&str>,
        since_unix_ms: i64,
        until_unix_ms: i64,
        visit: &mut dyn FnMut(StoredReplication),
    ) -> Result<(), StoreError> {
        let mut conn = self.read()?;
        let tx = conn.transaction().map_err(|e| error("replication_windows", e))?;
        replication::read(&tx, instance, since_unix_ms, until_unix_ms, visit)
    }

    fn plans_of(
        &self,
        digests: &[u64],
        instance: Option<&str>,
        until_unix_ms: i64,
    ) -> Result<Vec<PlanRow>, StoreError> {
        let mut conn = self.read()?;
        let tx = conn.transaction().map_err(|e| error("plans", e))?;
        indexes::plans_of(&tx, digests, instance, until_unix_ms)
    }

    fn annotate(&self, annotation: &Annotation) -> Result<(), StoreError> {
        self.write("annotate", |tx| events::annotate(tx, annotation))
    }

    fn annotations(&self, query: &AnnotationsQuery) -> Result<Vec<Annotation>, StoreError> {
        let mut conn = self.read()?;
        let tx = conn.transaction().map_err(|e| error("annotations", e))?;
        events::annotations(&tx, query)
    }

    fn put_events(&self, list: &[Event]) -> Result<(), StoreError> {
        self.write("events", |tx| events::put(tx, list))
    }

    fn events(&self, query: &EventsQuery) -> Result<Vec<Event>, StoreError> {
        let mut conn = self.read()?;
        let tx = conn.transaction().map_err(|e| error("events", e))?;
        events::read(&tx, query)
    }

    fn prune(&self, cutoffs: &PruneCutoffs) -> Result<PruneOutcome, StoreError> {
        write::prune(&self.writer, cutoffs)
    }

    fn export_mark(&self, name: &str) -> Result<Option<ExportMark>, StoreError> {
        let mut conn = self.read()?;
        let tx = conn.transaction().map_err(|e| error("export_mark", e))?;
        export_marks::read(&tx, name)
    }

    fn set_export_mark(&self, name: &str, mark: &ExportMark) -> Result<(), StoreError> {
        self.write("export_marks", |tx| export_marks::write(tx, name, mark))
    }
}
