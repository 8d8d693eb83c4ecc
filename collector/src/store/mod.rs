//! Where batches live. `Store` is the only thing ingest and the query API
//! know, so another backend can be added without touching either. A store
//! receives batches that `validate` accepted; it must store each
//! (agent_id, sequence) at most once and must never decide what is valid.
//! Calls block: the services run them on tokio's blocking pool.
pub mod answer_budget;
pub mod blob;
pub mod cancel;
pub mod clickhouse;
pub mod merge;
pub mod rank_columns;
pub mod retention;
pub mod rollup;
pub mod rollup_pass;
pub mod senders;
#[cfg(test)]
mod shared_tests;
pub mod sqlite;

use sqlbee_proto::v1::{
    AgentWindowRow, Annotation, Batch, CostSummary, DigestSeries, Event, InstanceInfo, InstanceSeries, LockWaitRow,
    LongStatementRow, PlanRow, PlansResponse, SeriesPoint, TopDigest, TotalsResponse,
};

pub use answer_budget::{Page, TopPage};
use sqlbee_figures::{FIGURES, Figure, RANK_FIGURES, RANKED};
pub use sqlite::SqliteStore;

/// How the digests of `Top` are ranked (all descending).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OrderBy {
    Total,
    Avg,
    P99,
    Count,
    Errors,
    /// Time spent waiting, every wait class together.
    Wait,
    /// The sum of a figure the figure list ranks by (its place in
    /// `sqlbee_figures::FIGURES`; see `ALL`). Each store keeps it in a
    /// column of the figure's name.
    Figure(usize),
}

/// The rankings by what every digest has, before the figures'.
const BY_TOTALS: [OrderBy; 6] =
    [OrderBy::Count, OrderBy::Errors, OrderBy::Total, OrderBy::Avg, OrderBy::P99, OrderBy::Wait];

impl OrderBy {
    /// Every ranking, in the order the top page shows its columns: the
    /// totals', then each figure marked `rank` in the figure list. The
    /// stores, the Query service and the pages take the keys from here;
    /// the query tools from the wire crate's `ORDER_KEYS`, which a test
    /// holds to these.
    pub const ALL: [OrderBy; BY_TOTALS.len() + RANKED] = {
        let mut all = [OrderBy::Count; BY_TOTALS.len() + RANKED];
        let mut i = 0;
        while i < all.len() {
            all[i] =
                if i < BY_TOTALS.len() { BY_TOTALS[i] } else { OrderBy::Figure(RANK_FIGURES[i - BY_TOTALS.len()]) };
            i += 1;
        }
        all
    };

    /// Every key the wire's `order_by` accepts, in `ALL`'s order.
    pub const NAMES: [&'static str; OrderBy::ALL.len()] = {
        let mut names = [""; OrderBy::ALL.len()];
        let mut i = 0;
        while i < names.len() {
            names[i] = OrderBy::ALL[i].key();
            i += 1;
        }
        names
    };

    /// The wire's `order_by` (and the query tools' `--order-by`).
    pub const fn key(self) -> &'static str {
        match self {
            OrderBy::Total => "total",
            OrderBy::Avg => "avg",
            OrderBy::P99 => "p99",
            OrderBy::Count => "count",
            OrderBy::Errors => "errors",
            OrderBy::Wait => "wait",
            OrderBy::Figure(place) => match FIGURES[place].rank {
                Some(rank) => rank.key,
                None => FIGURES[place].name,
            },
        }
    }

    /// The top page's column that sorts by it.
    pub const fn label(self) -> &'static str {
        match self {
            OrderBy::Total => "Total",
            OrderBy::Avg => "Avg",
            OrderBy::P99 => "p99",
            OrderBy::Count => "Count",
            OrderBy::Errors => "Errors",
            OrderBy::Wait => "Wait",
            OrderBy::Figure(place) => match FIGURES[place].rank {
                Some(rank) => rank.label,
                None => FIGURES[place].label,
            },
        }
    }

    /// The figure it ranks by: the store column of its name holds it.
    pub fn figure(self) -> Option<&'static Figure> {
        match self {
            OrderBy::Figure(place) => FIGURES.get(place),
            _ => None,
        }
    }

    /// The wire's `order_by`; empty means the default (total).
    pub fn parse(key: &str) -> Option<OrderBy> {
        if key.is_empty() {
            return Some(OrderBy::Total);
        }
        OrderBy::ALL.into_iter().find(|o| o.key() == key)
    }
}

#[derive(Clone, Debug)]
pub struct TopQuery {
    /// None: every instance.
    pub instance: Option<String>,
    /// None: every digest.
    pub digest: Option<u64>,
    /// None: every schema.
    pub schema: Option<String>,
    /// Also the statements stored programs ran (default: client ones).
    pub nested: bool,
    /// Only this program's statements (`schema.name`).
    pub program: Option<String>,
    /// Windows ending at or after this (ms since epoch); 0: all.
    pub since_unix_ms: i64,
    /// Windows ending before this; `i64::MAX`: no end.
    pub until_unix_ms: i64,
    pub order_by: OrderBy,
    pub limit: usize,
}

#[derive(Clone, Debug)]
pub struct TotalsQuery {
    pub instance: Option<String>,
    pub since_unix_ms: i64,
    /// Windows ending before this; `i64::MAX`: no end.
    pub until_unix_ms: i64,
}

/// What a series follows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SeriesOf {
    /// One digest's client statements (every schema unless filtered).
    Digest(u64),
    /// Every client statement: an instance's rate and latency.
    Statements,
    /// The agents' own cost and the probes' cost to the servers.
    Cost,
}

/// How a series read is split: not at all, by instance, or by (digest,
/// schema) among these digests.
#[derive(Clone, Copy, Debug)]
pub enum SeriesSplit<'a> {
    Whole,
    ByInstance,
    ByDigest(&'a [u64]),
}

/// What one series of a split read is keyed by, in both stores: the
/// parts the split does not use stay empty.
#[derive(Clone, Debug, Default, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct SplitKey {
    pub instance: String,
    pub digest: u64,
    pub schema: String,
}

/// A time series: one point per step from `since` (rounded down to a
/// multiple of the step) to `until`, each point holding the windows that
/// ended in its step. Empty steps are points with zero counts, so a plot
/// shows a gap as zero rather than a line across it.
#[derive(Clone, Debug)]
pub struct SeriesQuery {
    pub of: SeriesOf,
    /// None: every instance (for `Cost`, the agents that served it).
    pub instance: Option<String>,
    pub schema: Option<String>,
    pub since_unix_ms: i64,
    pub until_unix_ms: i64,
    pub step_ms: i64,
}

/// How long each level of detail is kept: raw windows, and the minute and
/// hour rollups (see [`rollup`]). Day rollups go with the hours.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Retention {
    pub raw: std::time::Duration,
    pub minute: std::time::Duration,
    pub hour: std::time::Duration,
}

impl Retention {
    /// Each level's cutoff (ms since epoch) at `now_unix_ms`.
    pub fn cutoffs(&self, now_unix_ms: i64) -> PruneCutoffs {
        let before = |d: std::time::Duration| now_unix_ms.saturating_sub(d.as_millis().min(i64::MAX as u128) as i64);
        PruneCutoffs { raw: before(self.raw), minute: before(self.minute), hour: before(self.hour) }
    }
}

/// Data older than these (ms since epoch) goes: raw windows and everything
/// else by `raw`, each rollup level by its own.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PruneCutoffs {
    pub raw: i64,
    pub minute: i64,
    pub hour: i64,
}

impl PruneCutoffs {
    /// One cutoff for every level.
    pub fn all(older_than_unix_ms: i64) -> PruneCutoffs {
        PruneCutoffs { raw: older_than_unix_ms, minute: older_than_unix_ms, hour: older_than_unix_ms }
    }
}

/// Lock waits, newest first.
#[derive(Clone, Debug)]
pub struct LocksQuery {
    /// None: every instance.
    pub instance: Option<String>,
    /// Waits that started at or after this (ms since epoch); 0: all.
    pub since_unix_ms: i64,
    pub limit: usize,
}

/// A digest's plans and the plan changes of a range.
#[derive(Clone, Debug)]
pub struct PlansQuery {
    /// None: no plans, only the changes of every digest.
    pub digest: Option<u64>,
    /// None: every schema.
    pub schema: Option<String>,
    /// None: every instance.
    pub instance: Option<String>,
    /// Changes at or after this (ms since epoch); 0: all.
    pub since_unix_ms: i64,
    /// Changes before this; `i64::MAX`: no end.
    pub until_unix_ms: i64,
    /// Plans at most (newest last sighting first), and changes at most
    /// (newest first): an answer's size is bounded whatever agents sent.
    pub limit: usize,
}

/// What a digest (run in a schema) reads and writes, as its agent parsed it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DigestTables {
    pub digest: u64,
    pub schema: String,
    /// `SELECT`, `INSERT`, ...; empty when unknown.
    pub kind: String,
    pub tables: Vec<sqlbee_proto::v1::TableUse>,
    /// The agent's parser could not read the text.
    pub unknown: bool,
}

/// A table's indexes as an agent last read them on an instance.
#[derive(Clone, Debug, PartialEq)]
pub struct StoredIndexes {
    pub instance: String,
    pub table: sqlbee_proto::v1::TableIndexes,
}

/// One window of what a replica applied, as its agent sent it.
#[derive(Clone, Debug, PartialEq)]
pub struct StoredReplication {
    pub instance: String,
    pub window_start_unix_ms: i64,
    pub window_end_unix_ms: i64,
    pub replication: sqlbee_proto::v1::Replication,
}

/// Agents' own windows, newest first.
#[derive(Clone, Debug)]
pub struct HostsQuery {
    /// None: every host.
    pub host: Option<String>,
    /// Windows ending at or after this (ms since epoch); 0: all.
    pub since_unix_ms: i64,
    pub limit: usize,
}

/// Markers, oldest first.
#[derive(Clone, Debug)]
pub struct AnnotationsQuery {
    /// Markers of this instance and of the whole fleet; None: every marker.
    pub instance: Option<String>,
    /// Markers at or after this (ms since epoch).
    pub since_unix_ms: i64,
    /// Markers before this; `i64::MAX`: no end.
    pub until_unix_ms: i64,
    /// Only this marker, wherever it is.
    pub id: Option<u64>,
    pub limit: usize,
}

/// Events open at any time of a range, newest opened first.
#[derive(Clone, Debug)]
pub struct EventsQuery {
    pub instance: Option<String>,
    /// None: every kind.
    pub kind: Option<String>,
    /// Events still open at or after this (ms since epoch); 0: all.
    pub since_unix_ms: i64,
    /// Events opened before this; `i64::MAX`: no end.
    pub until_unix_ms: i64,
    pub open_only: bool,
    pub limit: usize,
}

impl EventsQuery {
    /// Whether `event` (its newest version) answers this query: stores
    /// that filter in SQL use it too, for the parts SQL cannot see.
    pub fn admits(&self, event: &Event) -> bool {
        let closed = event.closed_unix_ms;
        self.instance.as_ref().is_none_or(|i| *i == event.instance)
            && self.kind.as_ref().is_none_or(|k| *k == event.kind)
            && event.opened_unix_ms < self.until_unix_ms
            && (closed == 0 || (!self.open_only && closed >= self.since_unix_ms))
    }
}

impl AnnotationsQuery {
    pub fn admits(&self, annotation: &Annotation) -> bool {
        match self.id {
            Some(id) => annotation.id == id,
            None => {
                annotation.at_unix_ms >= self.since_unix_ms
                    && annotation.at_unix_ms < self.until_unix_ms
                    && self
                        .instance
                        .as_ref()
                        .is_none_or(|i| annotation.instances.is_empty() || annotation.instances.iter().any(|n| n == i))
            }
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct IngestOutcome {
    /// The (agent_id, epoch, sequence) was stored before with the same
    /// content; nothing was written.
    pub duplicate: bool,
    /// It was stored before with other content; nothing was written (the
    /// store turns this into `StoreError::Conflict`).
    pub conflict: bool,
}

/// A batch's content hash (see [`sqlbee_proto::content_hash`]): the one
/// its agent sent, or for agents from before that, taken here.
pub fn content_hash(batch: &Batch) -> u64 {
    match batch.content_hash {
        0 => sqlbee_proto::content_hash(batch),
        claimed => claimed,
    }
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PruneOutcome {
    pub instance_windows: u64,
    pub digest_windows: u64,
    pub batches: u64,
    pub error_samples: u64,
    pub lock_waits: u64,
    pub long_statements: u64,
    pub agent_windows: u64,
    pub rollup_rows: u64,
    /// Plans, plan changes and digest descriptions (by the hour retention).
    pub plan_rows: u64,
    /// Markers and events (by the hour retention).
    pub event_rows: u64,
}

impl PruneOutcome {
    /// Adds what another part of the store (a cluster's shard) pruned.
    pub fn add(&mut self, other: PruneOutcome) {
        self.instance_windows += other.instance_windows;
        self.digest_windows += other.digest_windows;
        self.batches += other.batches;
        self.error_samples += other.error_samples;
        self.lock_waits += other.lock_waits;
        self.long_statements += other.long_statements;
        self.agent_windows += other.agent_windows;
        self.rollup_rows += other.rollup_rows;
        self.plan_rows += other.plan_rows;
        self.event_rows += other.event_rows;
    }
}

/// A backend's own error, kept as the cause: the trait and its callers
/// name no backend type.
pub type BackendError = Box<dyn std::error::Error + Send + Sync>;

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("cannot open the store at {path}: {source}")]
    Open {
        path: String,
        #[source]
        source: BackendError,
    },
    #[error("the store at {path} has schema version {found}, written by a newer collector (this one knows {known})")]
    Version { path: String, found: i64, known: i64 },
    #[error(
        "unsupported store location {location:?}: expected sqlite:PATH, sqlite:PATH?synchronous=normal or \
         clickhouse://HOST:HTTP_PORT[,HOST:HTTP_PORT...]/DATABASE (options: \
         ?user=U&password_file=PATH&tls=1&ca=PATH&cluster=NAME)"
    )]
    Location { location: String },
    #[error("the store is full (disk or quota): {source}")]
    Full {
        #[source]
        source: BackendError,
    },
    #[error("store {action} failed: {source}")]
    Backend {
        action: &'static str,
        #[source]
        source: BackendError,
    },
    #[error("stored {what} is corrupt")]
    Corrupt { what: &'static str },
    #[error("the request was cancelled (its client went away or its deadline passed) before the store answered")]
    Cancelled,
    #[error(
        "batch {sequence} of agent {agent_id} (epoch {epoch}) was stored before with other content: two agents \
         share a state directory, or it was restored from a backup or cloned; this batch is not stored"
    )]
    Conflict { agent_id: String, epoch: u64, sequence: u64 },
}

/// How far an export (`crate::otlp`) has come: every step of `step_ms`
/// that ends at or before `until_unix_ms` is exported, and of the step that
/// starts there, the instances up to `instance` (in byte order; empty:
/// none). Kept in the store, so a restarted collector goes on where the
/// last acknowledged request left off.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ExportMark {
    pub step_ms: i64,
    pub until_unix_ms: i64,
    pub instance: String,
}

pub trait Store: Send + Sync {
    /// Stores a validated batch in one transaction, or reports that its
    /// (agent_id, epoch, sequence) was stored before: a duplicate when
    /// `content_hash` (see [`content_hash`]) matches, `StoreError::Conflict`
    /// when it does not. `received_unix_ms` is the collector's clock, used
    /// for last-seen and retention. Takes the batch whole, so a store that
    /// queues it (ClickHouse's group commit) need not copy it.
    fn ingest(&self, batch: Batch, received_unix_ms: i64, content_hash: u64) -> Result<IngestOutcome, StoreError>;
    /// The top digests of `query`, as many of its `limit` as fit
    /// `answer_budget::ANSWER_BYTES`; the rest are counted.
    fn top_page(&self, query: &TopQuery) -> Result<TopPage, StoreError>;
    fn top(&self, query: &TopQuery) -> Result<Vec<TopDigest>, StoreError> {
        Ok(self.top_page(query)?.rows)
    }
    /// `top` with only what comparing two ranges needs (`diff` and
    /// detection read every digest of both): counts, sums, min and max,
    /// the histogram and its percentiles, instances, the digest text, and
    /// of the figures rows examined and CPU, each as `top` gives it.
    /// Accounts, clients, tags, exemplars, samples, waits, error codes and
    /// the other figures are left empty, which spares reading and decoding
    /// them; texts are cut to `answer_budget::LEAN_TEXT_BYTES`. Every
    /// digest of the cut is answered (a comparison needs them all).
    fn top_lean(&self, query: &TopQuery) -> Result<Vec<TopDigest>, StoreError>;
    /// Every agent/instance pair, each with its newest window's cost.
    fn instances(&self) -> Result<Vec<InstanceInfo>, StoreError>;
    /// What watching cost per agent over the windows `query` covers.
    fn costs(&self, query: &TotalsQuery) -> Result<Vec<CostSummary>, StoreError>;
    fn hosts(&self, query: &HostsQuery) -> Result<Vec<AgentWindowRow>, StoreError>;
    fn totals(&self, query: &TotalsQuery) -> Result<TotalsResponse, StoreError>;
    /// Lock waits newest first (by start, then arrival), at most `limit`
    /// and as many as fit `answer_budget::ANSWER_BYTES`; the rest counted.
    fn locks_page(&self, query: &LocksQuery) -> Result<Page<LockWaitRow>, StoreError>;
    fn locks(&self, query: &LocksQuery) -> Result<Vec<LockWaitRow>, StoreError> {
        Ok(self.locks_page(query)?.rows)
    }
    /// Long, killed and disconnected statements, asked, ordered and bounded
    /// as lock waits are.
    fn long_statements_page(&self, query: &LocksQuery) -> Result<Page<LongStatementRow>, StoreError>;
    fn long_statements(&self, query: &LocksQuery) -> Result<Vec<LongStatementRow>, StoreError> {
        Ok(self.long_statements_page(query)?.rows)
    }
    /// One point per step, oldest first (see [`SeriesQuery`]).
    fn series(&self, query: &SeriesQuery) -> Result<Vec<SeriesPoint>, StoreError>;
    /// The statement or digest series of `query` for every instance (or
    /// the one it names) in one read, by instance name; instances without a
    /// window in the range are left out. Cost series are not split.
    fn series_by_instance(&self, query: &SeriesQuery) -> Result<Vec<InstanceSeries>, StoreError>;
    /// The statement series of `query` for each (digest, schema) of
    /// `digests` in one read; pairs without a window in the range are left
    /// out. Only `SeriesOf::Statements` is split.
    fn series_by_digest(&self, query: &SeriesQuery, digests: &[u64]) -> Result<Vec<DigestSeries>, StoreError>;
    /// Each distinct plan of `query.digest` (newest last seen first) and
    /// the plan changes of the range (newest first, at most `limit`).
    fn plans(&self, query: &PlansQuery) -> Result<PlansResponse, StoreError>;
    /// The newest description of each (digest, schema) of `digests` the
    /// store holds.
    fn digest_tables(&self, digests: &[u64]) -> Result<Vec<DigestTables>, StoreError>;
    /// The newest reading of each table's indexes, on `instance` or on
    /// every instance.
    fn table_indexes(&self, instance: Option<&str>) -> Result<Vec<StoredIndexes>, StoreError>;
    /// What replicas applied, window by window (oldest first, each window
    /// once), for windows that ended in `since..until` on `instance` or on
    /// every instance: each handed to `visit` as it is read, so a reader
    /// that merges them holds one at a time, whatever the range.
    fn replication_each(
        &self,
        instance: Option<&str>,
        since_unix_ms: i64,
        until_unix_ms: i64,
        visit: &mut dyn FnMut(StoredReplication),
    ) -> Result<(), StoreError>;
    /// `replication_each`, collected.
    fn replication(
        &self,
        instance: Option<&str>,
        since_unix_ms: i64,
        until_unix_ms: i64,
    ) -> Result<Vec<StoredReplication>, StoreError> {
        let mut out = Vec::new();
        self.replication_each(instance, since_unix_ms, until_unix_ms, &mut |w| out.push(w))?;
        Ok(out)
    }
    /// Every plan (with a hash) of `digests` first seen before `until`, on
    /// `instance` or on every instance: which indexes they chose.
    fn plans_of(&self, digests: &[u64], instance: Option<&str>, until_unix_ms: i64)
    -> Result<Vec<PlanRow>, StoreError>;
    /// Stores a marker (its id chosen by the caller).
    fn annotate(&self, annotation: &Annotation) -> Result<(), StoreError>;
    fn annotations(&self, query: &AnnotationsQuery) -> Result<Vec<Annotation>, StoreError>;
    /// Writes events; of the versions of one id, the newest
    /// `updated_unix_ms` is the event (two collectors writing one event
    /// leave it once).
    fn put_events(&self, events: &[Event]) -> Result<(), StoreError>;
    /// Each event's newest version that `query` admits.
    fn events(&self, query: &EventsQuery) -> Result<Vec<Event>, StoreError>;
    /// Rolls up what arrived since the last pass, for a store that does
    /// not roll windows up as they arrive; how many buckets are still due
    /// (more than one pass takes). The SQLite store rolls up in `ingest`.
    fn roll_up(&self) -> Result<usize, StoreError> {
        Ok(0)
    }
    /// Deletes windows that ended before `cutoffs.raw`, lock waits that
    /// started before it, the exactly-once records of batches whose
    /// windows are all gone, and rollup rows older than their level's
    /// cutoff.
    fn prune(&self, cutoffs: &PruneCutoffs) -> Result<PruneOutcome, StoreError>;
    /// The export `name`'s furthest mark; None: it never ran on this store.
    fn export_mark(&self, name: &str) -> Result<Option<ExportMark>, StoreError>;
    /// Records that the export `name` came to `mark`.
    fn set_export_mark(&self, name: &str, mark: &ExportMark) -> Result<(), StoreError>;
}

/// Opens the store named by `--store`: `sqlite:PATH`, or
/// `sqlite:PATH?synchronous=normal` to trade the durability of the last
/// acknowledged batches on power loss for ingest rate; or
/// `clickhouse://HOST:HTTP_PORT/DATABASE` with `user`, `password_file`,
/// `tls=1`, `ca` and `rollup_settle_s` options, shared by any number of
/// collectors.
pub fn open(location: &str) -> Result<Box<dyn Store>, StoreError> {
    let bad = || StoreError::Location { location: location.to_string() };
    match location.split_once(':') {
        Some(("sqlite", rest)) => {
            let (path, options) = rest.split_once('?').unwrap_or((rest, ""));
            if path.is_empty() {
                return Err(bad());
            }
            let durability = match options {
                "" | "synchronous=full" => sqlite::Durability::Full,
                "synchronous=normal" => sqlite::Durability::Normal,
                _ => return Err(bad()),
            };
            Ok(Box::new(SqliteStore::open_with(std::path::Path::new(path), durability)?))
        }
        Some(("clickhouse", rest)) => {
            let location = clickhouse::Location::parse(rest).ok_or_else(bad)?;
            Ok(Box::new(clickhouse::ClickHouseStore::open(&location)?))
        }
        _ => Err(bad()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_ranking_key_names_one_ranking() {
        for order in OrderBy::ALL {
            assert_eq!(OrderBy::parse(order.key()), Some(order));
        }
        assert_eq!(OrderBy::parse(""), Some(OrderBy::Total));
        assert_eq!(OrderBy::parse("fastest"), None);
        let keys: std::collections::BTreeSet<_> = OrderBy::NAMES.into_iter().collect();
        let labels: std::collections::BTreeSet<_> = OrderBy::ALL.map(OrderBy::label).into_iter().collect();
        assert_eq!((keys.len(), labels.len()), (OrderBy::ALL.len(), OrderBy::ALL.len()));
        assert_eq!(OrderBy::NAMES, sqlbee_proto::query_client::ORDER_KEYS, "the query tools offer other keys");
    }
}
