//! ClickHouse store: any number of collectors share one database over
//! ClickHouse's HTTP interface (`http`). `schema` creates and versions the
//! tables, `write` stores batches and prunes, `read` and `costs` answer
//! queries and `series` time series. Merges happen in Rust with the shared
//! `merge`, exactly as the SQLite store does, so both answer alike; values
//! are UInt64 columns read back bit-exact, and no sum runs in SQL (it would
//! wrap where `merge` saturates). No ClickHouse type leaves this folder.
//!
//! ## Exactly once without transactions
//!
//! ClickHouse 18.16 has neither transactions nor insert deduplication for
//! plain MergeTree, and a collector may die (kill -9) between any two
//! inserts, or two collectors may store the same batch at the same time.
//! So nothing is decided in a collector's memory; the rule lives in the
//! rows:
//!
//! - every attempt to store a batch draws an `ingest_id` (a UInt64: the
//!   time in its high bits, random low bits), and every row it writes
//!   carries the batch identity (agent_id, epoch, sequence) and that id;
//! - the data rows are inserted first, the batch record (identity,
//!   ingest_id, content_hash, received time, time range) last;
//! - a batch counts only through its *winning* record, the one with the
//!   smallest ingest_id for its identity, and every read keeps only rows
//!   whose (identity, ingest_id) is a winner (`winners`).
//!
//! An attempt killed before its record is written left rows no record
//! vouches for: they never count and age out with their day. Two attempts
//! that both wrote a record (two collectors racing, or a retry after a
//! record whose acknowledgement was lost) each wrote the whole batch, and
//! only the smaller id's rows count: never both, never half. Before writing,
//! an attempt looks up the identity's records: the same content hash is a
//! duplicate (nothing written), another hash `StoreError::Conflict`. After
//! writing its record it looks again: if a smaller id with other content
//! won, it answers Conflict (its rows never count); with the same content,
//! duplicate. What this cannot order is two attempts with *different*
//! content for one identity whose look-ups both ran before either record
//! existed (two agents sharing a state directory, in the same instant):
//! exactly one content counts, but both may be acknowledged.
//!
//! Batches that arrive while others are written are written with them in
//! one INSERT per table (`group_commit`), each with its own outcome.
//!
//! Rollups (ten minutes, hours, days) are written by a pass every
//! collector runs, kept exact by the same rows-carry-the-rule idea
//! (`rollups`).
//!
//! Retention drops whole day partitions and deletes the rest of the
//! boundary day with `ALTER TABLE ... DELETE` (a mutation, waited for), in
//! `write::prune`.
mod cluster;
#[cfg(test)]
mod cluster_tests;
mod costs;
mod digest_rows;
mod events;
mod export_marks;
mod group_commit;
mod http;
mod indexes;
mod plans;
mod read;
mod replication;
mod rollups;
mod schema;
mod series;
mod tables;
#[cfg(test)]
mod tests;
mod write;

use std::path::PathBuf;

use sqlbee_proto::v1::{
    AgentWindowRow, Annotation, Batch, CostSummary, DigestSeries, Event, InstanceInfo, InstanceSeries, LockWaitRow,
    LongStatementRow, PlanRow, PlansResponse, SeriesPoint, TopDigest, TotalsResponse,
};

use super::{
    AnnotationsQuery, DigestTables, EventsQuery, ExportMark, HostsQuery, IngestOutcome, LocksQuery, Page, PlansQuery,
    PruneCutoffs, PruneOutcome, SeriesQuery, Store, StoreError, StoredIndexes, StoredReplication, TopPage, TopQuery,
    TotalsQuery,
};
pub use cluster::shard_of;
pub use schema::SCHEMA_VERSION;

/// Where the store lives, from
/// `clickhouse://HOST:PORT[,HOST:PORT...]/DATABASE?options`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Location {
    /// Each server's HTTP `host:port`: one, or a cluster's nodes.
    pub nodes: Vec<String>,
    pub database: String,
    /// The cluster (in the servers' `remote_servers`) to create
    /// replicated, sharded tables on; None for one server's tables.
    pub cluster: Option<String>,
    pub user: Option<String>,
    /// A file holding the password (its first line), never the password.
    pub password_file: Option<PathBuf>,
    pub tls: bool,
    pub ca: Option<PathBuf>,
    /// How long after the server stamps an insert it is surely visible to
    /// a rollup pass (`rollup_settle_s`; see `rollups`).
    pub rollup_settle_ms: i64,
}

impl Location {
    /// None when `rest` (after `clickhouse:`) is not such a location.
    pub fn parse(rest: &str) -> Option<Location> {
        let rest = rest.strip_prefix("//")?;
        let (path, options) = rest.split_once('?').unwrap_or((rest, ""));
        let (nodes, database) = path.split_once('/')?;
        let nodes: Vec<String> = nodes.split(',').map(str::to_string).collect();
        let port_ok = nodes.iter().all(|node| {
            node.rsplit_once(':').is_some_and(|(host, port)| !host.is_empty() && port.parse::<u16>().is_ok())
        });
        if !port_ok || !sql_name(database) {
            return None;
        }
        let mut out = Location {
            nodes,
            database: database.to_string(),
            cluster: None,
            user: None,
            password_file: None,
            tls: false,
            ca: None,
            rollup_settle_ms: rollups::SETTLE_MS,
        };
        for option in options.split('&').filter(|o| !o.is_empty()) {
            match option.split_once('=')? {
                ("user", v) if !v.is_empty() => out.user = Some(v.to_string()),
                ("password_file", v) if !v.is_empty() => out.password_file = Some(PathBuf::from(v)),
                ("tls", "1" | "true") => out.tls = true,
                ("tls", "0" | "false") => out.tls = false,
                ("ca", v) if !v.is_empty() => out.ca = Some(PathBuf::from(v)),
                ("rollup_settle_s", v) => out.rollup_settle_ms = v.parse::<u32>().ok()?.max(1) as i64 * 1000,
                ("cluster", v) if sql_name(v) => out.cluster = Some(v.to_string()),
                _ => return None,
            }
        }
        Some(out)
    }

    /// How the store is named in errors and logs: no credentials in it.
    pub fn shown(&self) -> String {
        let cluster = self.cluster.as_ref().map(|c| format!("?cluster={c}")).unwrap_or_default();
        format!("clickhouse://{}/{}{cluster}", self.nodes.join(","), self.database)
    }
}

/// A name that goes into SQL unquoted: letters, digits and underscores,
/// not starting with a digit.
fn sql_name(name: &str) -> bool {
    !name.is_empty()
        && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
        && !name.starts_with(|c: char| c.is_ascii_digit())
}

/// A ClickHouse failure as a store error: a full disk or quota told apart
/// from the rest (a client retries both; an operator must know which).
pub(super) fn error(action: &'static str, source: http::HttpError) -> StoreError {
    if matches!(source, http::HttpError::Cancelled) {
        return StoreError::Cancelled;
    }
    if source.is_full() {
        StoreError::Full { source: source.into() }
    } else {
        StoreError::Backend { action, source: source.into() }
    }
}

pub(super) fn malformed(action: &'static str) -> impl Fn(http::Malformed) -> StoreError {
    move |source| StoreError::Backend { action, source: source.into() }
}

/// The rows of winning attempts only (see the module comment): rows whose
/// (identity, ingest_id) is the smallest ingest_id of its identity, among
/// the batches with a row in `[since, until)`. The minimum is taken over
/// every record of those identities, wherever their ranges fall.
pub(super) fn winners(since: i64, until: i64) -> String {
    winners_of(&[(since, until)])
}

/// `winners` of the batches with rows in any of `ranges` (each [since,
/// until)): a read of two ragged ends need not gather every batch between.
pub(super) fn winners_of(ranges: &[(i64, i64)]) -> String {
    let range = if ranges.iter().any(|&(since, until)| since == i64::MIN && until == i64::MAX) {
        String::new()
    } else {
        let any: Vec<String> =
            ranges.iter().map(|(a, b)| format!("(last_unix_ms >= {a} AND first_unix_ms < {b})")).collect();
        format!(
            " WHERE (agent_id, epoch, sequence) IN (SELECT agent_id, epoch, sequence FROM batches
                 WHERE {})",
            any.join(" OR ")
        )
    };
    format!(
        "(agent_id, epoch, sequence, ingest_id) IN (SELECT agent_id, epoch, sequence, min(ingest_id)
             FROM batches{range} GROUP BY agent_id, epoch, sequence)"
    )
}

/// `AND column = 'value'` for each filter given.
pub(super) fn equals(filters: &[(&str, &Option<String>)]) -> String {
    filters
        .iter()
        .filter_map(|(column, value)| value.as_ref().map(|v| format!(" AND {column} = {}", http::quote(v))))
        .collect()
}

pub struct ClickHouseStore {
    /// Reads (through every shard, on a cluster).
    db: http::Client,
    /// Where writes go: one server's database, or each shard's tables
    /// (see `cluster`), shard 1 first.
    shards: Vec<Shard>,
    /// A cluster's: shards of replicated tables.
    replicated: bool,
    /// A cluster's name and the nodes given for it that did not answer when
    /// the store opened: each joins its shard's writes once it answers.
    cluster: Option<(String, std::sync::Mutex<Vec<String>>)>,
    shown: String,
    rollup_settle_ms: i64,
}

/// One shard's tables and the batches waiting to be written to them.
struct Shard {
    db: http::Client,
    groups: group_commit::GroupCommit,
}

impl Shard {
    fn new(db: http::Client) -> Shard {
        Shard { db, groups: group_commit::GroupCommit::default() }
    }
}

impl ClickHouseStore {
    pub fn open(location: &Location) -> Result<ClickHouseStore, StoreError> {
        let shown = location.shown();
        let open_err = |source: http::HttpError| StoreError::Open { path: shown.clone(), source: source.into() };
        let password = match &location.password_file {
            Some(path) => {
                let text = std::fs::read_to_string(path).map_err(|source| StoreError::Open {
                    path: shown.clone(),
                    source: format!("cannot read the password file {}: {source}", path.display()).into(),
                })?;
                Some(text.lines().next().unwrap_or("").to_string())
            }
            None => None,
        };
        let scheme = if location.tls { "https" } else { "http" };
        let endpoint = http::Endpoint {
            bases: location.nodes.iter().map(|node| format!("{scheme}://{node}/")).collect(),
            user: location.user.clone(),
            password,
            ca: location.ca.clone(),
        };
        let server = http::Client::new(endpoint, None).map_err(open_err)?;
        let database = &location.database;
        let (migrated, db, shards, unplaced) = match &location.cluster {
            None => {
                let migrated = schema::migrate(&server, database).map_err(open_err)?;
                let db = server.with_database(database);
                let shards = vec![Shard::new(server.with_database(database))];
                (migrated, db, shards, Vec::new())
            }
            Some(cluster) => {
                let placement = cluster::discover(&server, cluster)
                    .map_err(|source| StoreError::Open { path: shown.clone(), source: source.into() })?;
                let reachable: Vec<String> = placement.shards.iter().flatten().cloned().collect();
                let migrated = schema::migrate_cluster(&server, cluster, database, &reachable).map_err(open_err)?;
                // The winners' subqueries read each shard's own records.
                // Each shard is read from its first replica that answers,
                // in the cluster's order, as writes go to the first listed
                // replica that answers: a batch just acknowledged is read
                // back at once, not after the other replica fetched it.
                let db = server
                    .with_database(database)
                    .with_setting("distributed_product_mode", "local")
                    .with_setting("load_balancing", "in_order");
                let shard_db = schema::shard_database(database);
                let shards: Vec<Shard> = placement
                    .shards
                    .into_iter()
                    .map(|b| Shard::new(server.with_bases(b).with_database(&shard_db)))
                    .collect();
                tracing::info!(store = %shown, shards = shards.len(), "opened the cluster store");
                (migrated, db, shards, placement.unplaced)
            }
        };
        let found = match migrated {
            Ok(found) => found,
            Err(found) => {
                return Err(StoreError::Version {
                    path: shown,
                    found: i64::from(found),
                    known: i64::from(SCHEMA_VERSION),
                });
            }
        };
        if found == 0 {
            tracing::info!(store = %shown, version = SCHEMA_VERSION, "created the ClickHouse store's tables");
        }
        Ok(ClickHouseStore {
            db,
            shards,
            replicated: location.cluster.is_some(),
            cluster: location.cluster.clone().map(|name| (name, std::sync::Mutex::new(unplaced))),
            shown,
            rollup_settle_ms: location.rollup_settle_ms,
        })
    }

    /// Asks each node that did not answer when the store opened which
    /// shard it serves, and adds those that answer to their shard's writes.
    /// A node that answers as a stranger, or for a cluster of another
    /// shape, is left out for good, with a warning.
    fn place_late_nodes(&self) {
        let Some((name, unplaced)) = &self.cluster else { return };
        let Ok(mut unplaced) = unplaced.lock() else { return };
        unplaced.retain(|base| match cluster::shard_of_node(&self.db, base, name) {
            Ok((count, own)) if count as usize == self.shards.len() => {
                self.shards[own as usize - 1].db.add_base(base);
                tracing::info!(store = %self.shown, node = %base, shard = own, "a ClickHouse node that was unreachable now takes its shard's writes");
                false
            }
            Ok((count, _)) => {
                tracing::warn!(store = %self.shown, node = %base, shards = count, opened_with = self.shards.len(), "a ClickHouse node answers for a cluster of another number of shards; restart the collector to use it");
                false
            }
            Err(cluster::ClusterError::Http(e)) if e.is_unreachable() => true,
            Err(error) => {
                tracing::warn!(store = %self.shown, node = %base, %error, "a ClickHouse node given for the cluster store cannot take writes");
                false
            }
        });
    }

    /// A rollup pass that takes inserts as visible `settle_ms` after the
    /// server stamped them (see `rollups`).
    fn roll_up_settled(&self, settle_ms: i64) -> Result<rollups::RollupOutcome, StoreError> {
        let shards = rollups::Shards { all: self.shards.iter().map(|s| &s.db).collect(), replicated: self.replicated };
        rollups::roll_up(&self.db, &shards, settle_ms)
    }

    /// The shard an agent's rows live on.
    fn shard(&self, agent_id: &str) -> &Shard {
        &self.shards[cluster::shard_of(agent_id, self.shards.len())]
    }

    /// Where rows that belong to no agent (markers, events) are written:
    /// the first shard. Reads find them through every shard.
    fn first_shard(&self) -> &Shard {
        &self.shards[0]
    }
}

impl Store for ClickHouseStore {
    fn ingest(&self, batch: Batch, received_unix_ms: i64, content_hash: u64) -> Result<IngestOutcome, StoreError> {
        let shard = self.shard(batch.agent.as_ref().map_or("", |a| a.agent_id.as_str()));
        shard.groups.ingest(&shard.db, batch, received_unix_ms, content_hash)
    }

    fn top_page(&self, query: &TopQuery) -> Result<TopPage, StoreError> {
        read::top(&self.db, query, false)
    }

    fn top_lean(&self, query: &TopQuery) -> Result<Vec<TopDigest>, StoreError> {
        Ok(read::top(&self.db, query, true)?.rows)
    }

    fn instances(&self) -> Result<Vec<InstanceInfo>, StoreError> {
        let mut out = read::instances(&self.db)?;
        let mut latest = costs::latest(&self.db)?;
        for info in &mut out {
            info.latest = latest.remove(&(info.agent_id.clone(), info.instance.clone()));
        }
        Ok(out)
    }

    fn costs(&self, query: &TotalsQuery) -> Result<Vec<CostSummary>, StoreError> {
        costs::summaries(&self.db, query)
    }

    fn hosts(&self, query: &HostsQuery) -> Result<Vec<AgentWindowRow>, StoreError> {
        costs::hosts(&self.db, query)
    }

    fn totals(&self, query: &TotalsQuery) -> Result<TotalsResponse, StoreError> {
        read::totals(&self.db, query)
    }

    fn plans(&self, query: &PlansQuery) -> Result<PlansResponse, StoreError> {
        plans::read(&self.db, query)
    }

    fn digest_tables(&self, digests: &[u64]) -> Result<Vec<DigestTables>, StoreError> {
        tables::read(&self.db, digests)
    }

    fn table_indexes(&self, instance: Option<&str>) -> Result<Vec<StoredIndexes>, StoreError> {
        indexes::read(&self.db, instance)
    }

    fn replication_each(
        &self,
        instance: Option<&str>,
        since_unix_ms: i64,
        until_unix_ms: i64,
        visit: &mut dyn FnMut(StoredReplication),
    ) -> Result<(), StoreError> {
        replication::read(&self.db, instance, since_unix_ms, until_unix_ms, visit)
    }

    fn plans_of(
        &self,
        digests: &[u64],
        instance: Option<&str>,
        until_unix_ms: i64,
    ) -> Result<Vec<PlanRow>, StoreError> {
        indexes::plans_of(&self.db, digests, instance, until_unix_ms)
    }

    fn long_statements_page(&self, query: &LocksQuery) -> Result<Page<LongStatementRow>, StoreError> {
        read::long_statements(&self.db, query)
    }

    fn annotate(&self, annotation: &Annotation) -> Result<(), StoreError> {
        events::annotate(&self.first_shard().db, annotation)
    }

    fn annotations(&self, query: &AnnotationsQuery) -> Result<Vec<Annotation>, StoreError> {
        events::annotations(&self.db, query)
    }

    fn put_events(&self, list: &[Event]) -> Result<(), StoreError> {
        events::put(&self.first_shard().db, list)
    }

    fn events(&self, query: &EventsQuery) -> Result<Vec<Event>, StoreError> {
        events::read(&self.db, query)
    }

    fn export_mark(&self, name: &str) -> Result<Option<ExportMark>, StoreError> {
        export_marks::read(&self.db, name)
    }

    fn set_export_mark(&self, name: &str, mark: &ExportMark) -> Result<(), StoreError> {
        export_marks::write(&self.first_shard().db, name, mark)
    }

    fn locks_page(&self, query: &LocksQuery) -> Result<Page<LockWaitRow>, StoreError> {
        read::locks(&self.db, query)
    }

    fn series(&self, query: &SeriesQuery) -> Result<Vec<SeriesPoint>, StoreError> {
        series::series(&self.db, query)
    }

    fn series_by_instance(&self, query: &SeriesQuery) -> Result<Vec<InstanceSeries>, StoreError> {
        series::by_instance(&self.db, query)
    }

    fn series_by_digest(&self, query: &SeriesQuery, digests: &[u64]) -> Result<Vec<DigestSeries>, StoreError> {
        series::by_digest(&self.db, query, digests)
    }

    fn roll_up(&self) -> Result<usize, StoreError> {
        // The pass's interval paces the retries of nodes not yet placed.
        self.place_late_nodes();
        let outcome = self.roll_up_settled(self.rollup_settle_ms)?;
        if outcome.buckets > 0 {
            tracing::info!(store = %self.shown, buckets = outcome.buckets, rows = outcome.rows, left = outcome.left, "rolled up");
        }
        Ok(outcome.left)
    }

    fn prune(&self, cutoffs: &PruneCutoffs) -> Result<PruneOutcome, StoreError> {
        let mut outcome = PruneOutcome::default();
        for shard in &self.shards {
            outcome.add(write::prune(&shard.db, cutoffs)?);
        }
        tracing::debug!(store = %self.shown, ?outcome, "pruned");
        Ok(outcome)
    }
}
