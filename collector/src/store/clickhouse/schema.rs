//! The database's tables and their version. The collector creates the
//! database and what is missing on open; a database written by a newer
//! collector is refused, not guessed at.
//!
//! SQL that runs on ClickHouse 18.16 and on current versions alike:
//! new-style `MergeTree` with `PARTITION BY` and `ORDER BY`, plain types
//! (no LowCardinality, DateTime64, Map or codecs, no TTL). Every table with
//! rows that age is partitioned by day (`intDiv(ms, 86400000)`, free of any
//! time zone), so retention drops whole days (see `write::prune`).
//!
//! Every row a batch brings carries the batch's identity (agent_id, epoch,
//! sequence) and the `ingest_id` of the attempt that wrote it; a row counts
//! only if its attempt is its batch's winner (see the module comment of
//! `clickhouse`).

use super::http::{Client, HttpError};
use crate::store::{rank_columns, rollup};

/// Bumped when the schema changes. 1: first version. 2: hour rollups
/// (`digest_rollups`, `instance_rollups`, `agent_rollups`, `rollup_marks`)
/// and the server's insert time of each batch record (`batches.inserted`).
/// 3: rollups at ten minutes and a day beside the hour (`level`).
/// 4: `error_samples.instance`, so one agent's message cannot replace
/// another's (older rows read "", used only when no instance is asked for).
/// 5: `plans`, `plan_changes` and `digest_tables`, and `instance_windows.server_login`
/// (older rows read "", no login).
/// 6: `long_statements` (a new table).
/// 7: `annotations` and `events` (new tables).
/// 8: `export_marks` (a new table).
/// 9: `table_indexes` (a new table).
/// 10: `replication_windows` (a new table).
pub const SCHEMA_VERSION: u32 = 10;

const SERVER_LOGIN: &str = "server_login String DEFAULT ''";

const SAMPLE_INSTANCE: &str = "instance String DEFAULT ''";

/// Columns every batch row starts with.
pub(super) const IDENTITY: &str = "agent_id String, epoch UInt64, sequence UInt64, ingest_id UInt64";

fn day(column: &str) -> String {
    format!("intDiv({column}, 86400000)")
}

/// Where the tables live: in one server's database, or on a cluster.
#[derive(Clone, Copy, Debug)]
pub(super) enum Layout<'a> {
    Single,
    /// Each node holds its shard's rows in `ReplicatedMergeTree` tables of
    /// the database `shard_db`, and `Distributed` tables of the same names
    /// in the store's database read through every shard.
    Cluster {
        cluster: &'a str,
        database: &'a str,
        shard_db: &'a str,
    },
}

impl Layout<'_> {
    /// The CREATE of a table of `name` and its engine's clauses, on every
    /// node of a cluster.
    fn create(&self, name: &str, columns: &str, clauses: &str) -> String {
        match self {
            Layout::Single => format!("CREATE TABLE IF NOT EXISTS {name} ({columns}) ENGINE = MergeTree{clauses}"),
            // The {shard} and {replica} macros are each node's own.
            Layout::Cluster { cluster, shard_db, .. } => format!(
                "CREATE TABLE IF NOT EXISTS {shard_db}.{name} ON CLUSTER {cluster} ({columns})
                 ENGINE = ReplicatedMergeTree('/clickhouse/tables/{{shard}}/{shard_db}/{name}', '{{replica}}'){clauses}"
            ),
        }
    }
}

/// The database of a cluster store's shard tables.
pub(super) fn shard_database(database: &str) -> String {
    format!("{database}_shard")
}

/// The tables of one server's store (see `tables_for`).
pub(super) fn tables() -> Vec<(&'static str, String)> {
    tables_for(Layout::Single)
}

pub(super) fn tables_for(layout: Layout<'_>) -> Vec<(&'static str, String)> {
    let table = |name: &'static str, columns: &str, partition: Option<&str>, order: &str| {
        let partition = partition.map(|c| format!(" PARTITION BY {}", day(c))).unwrap_or_default();
        (name, layout.create(name, columns, &format!("{partition} ORDER BY ({order})")))
    };
    let fine_grained = |(name, sql): (&'static str, String)| (name, sql + " SETTINGS index_granularity = 1024");
    let rank_columns = rank_columns::definitions(rank_column);
    vec![
        table("schema_version", "version UInt32, written_unix_ms Int64", None, "version"),
        // The exactly-once record: one per attempt that got this far. The
        // range covers every time of every row the batch brought (window
        // ends, lock wait starts, gaps), so reads can pick the records of a
        // range; keep_until is the newest of it and the receive time, so a
        // record outlives all its rows.
        table(
            "batches",
            &format!(
                "{IDENTITY}, content_hash UInt64, received_unix_ms Int64, first_unix_ms Int64, last_unix_ms Int64,
                 keep_until_unix_ms Int64, {INSERTED}, {WINDOW_HOURS}"
            ),
            Some("keep_until_unix_ms"),
            "agent_id, epoch, sequence, ingest_id",
        ),
        // Every stored or duplicate batch proves its agent alive.
        table(
            "agent_seen",
            "agent_id String, host String, version String, sequence UInt64, received_unix_ms Int64",
            Some("received_unix_ms"),
            "agent_id, received_unix_ms",
        ),
        // Instance windows with their commands (parallel arrays, one entry
        // per command) and what the probes cost (encoded sqlbee.v1.ProbeCost
        // and ProcessMetrics, empty when absent).
        table(
            "instance_windows",
            &format!(
                "{IDENTITY}, position UInt32, instance String, pid UInt32, start_time_unix_ms Int64,
                 container_id String, container String, build_id String, server_version String,
                 window_start Int64, window_end Int64, statements UInt64, events UInt64, dropped_events UInt64,
                 dropped_in_agent UInt64, unmatched UInt64, overflow_statements UInt64, nested_statements UInt64,
                 replica_statements UInt64, command Array(String), command_count Array(UInt64), has_cost UInt8,
                 aggregated_in_kernel UInt64, probes String, process String, {SERVER_LOGIN}"
            ),
            Some("window_end"),
            "instance, window_end",
        ),
        // One row per digest row of an instance window. The histogram,
        // error codes (increasing) and waits are parallel arrays; figures
        // is an encoded sqlbee.v1.QueryStats and accounts an encoded
        // DigestStats holding only its accounts (both empty when absent);
        // the figures the top list ranks by are repeated as columns
        // (`store::rank_columns`; NULL: unknown).
        // Granules of 1024 rows, not 8192: one holds less of an instance's
        // time, so the raw ends of a range read fewer rows (a sixth in the
        // load bench: 100 agents, 60 s windows of 20 digests).
        fine_grained(table(
            "digest_windows",
            &format!(
                "{IDENTITY}, instance String, window_end Int64, digest UInt64, schema String, nested UInt8,
                 program String, program_kind String, parent_digest UInt64, source String, count UInt64,
                 errors UInt64, sum_ns UInt64, min_ns UInt64, max_ns UInt64, estimated_count UInt64,
                 truncated UInt64, hist_index Array(UInt32), hist_count Array(UInt64), error_code Array(UInt32),
                 error_count Array(UInt64), wait_class Array(String), wait_sum_ns Array(UInt64),
                 wait_max_ns Array(UInt64), wait_statements Array(UInt64), {rank_columns}, figures String,
                 accounts String, sample String, {SAMPLE_END}"
            ),
            Some("window_end"),
            "instance, window_end, digest",
        )),
        // Texts by digest id (a hash of the text, the same everywhere): any
        // copy will do, so these rows need no winner.
        table("digest_texts", "digest UInt64, text String, window_end Int64", Some("window_end"), "digest"),
        // The message of each error code a window carried; per instance,
        // the newest wins.
        table(
            "error_samples",
            &format!(
                "{IDENTITY}, digest UInt64, code UInt32, message String, window_end Int64, position UInt32, \
                 {SAMPLE_INSTANCE}"
            ),
            Some("window_end"),
            "digest, code",
        ),
        table(
            "lock_waits",
            &format!(
                "{IDENTITY}, position UInt32, received_unix_ms Int64, instance String, start_unix_ms Int64,
                 duration_ns UInt64, class String, connection_id UInt64, digest UInt64, digest_text String,
                 sample String, blocker_kind String, blockers String"
            ),
            Some("start_unix_ms"),
            "start_unix_ms",
        ),
        // Long, killed and disconnected statements, each kept whole
        // (encoded sqlbee.v1.LongStatement).
        table(
            "long_statements",
            &format!(
                "{IDENTITY}, position UInt32, received_unix_ms Int64, instance String, start_unix_ms Int64,
                 outcome String, digest UInt64, statement String"
            ),
            Some("start_unix_ms"),
            "start_unix_ms",
        ),
        // An agent's own windows: cost (encoded sqlbee.v1.AgentCost) and
        // host (encoded HostMetrics), each empty when absent.
        table(
            "agent_windows",
            &format!(
                "{IDENTITY}, position UInt32, received_unix_ms Int64, window_start Int64, window_end Int64,
                 cost String, host String"
            ),
            Some("window_end"),
            "agent_id, window_end",
        ),
        // Servers an agent window reported it could not trace.
        table(
            "untraced",
            &format!(
                "{IDENTITY}, instance String, pid UInt32, start_time_unix_ms Int64, container_id String,
                 container String, build_id String, server_version String, reason String, kind String,
                 since_unix_ms Int64, seen_unix_ms Int64"
            ),
            Some("seen_unix_ms"),
            "agent_id, instance",
        ),
        // What agents lost. A gap resent in a later batch is the same gap
        // (agent and sequence range) and counts once. It is placed at its
        // last window's end, or at its receive time without one; keep_until
        // is the newer of that end and the receive time.
        table(
            "gaps",
            &format!(
                "{IDENTITY}, first_sequence UInt64, last_sequence UInt64, batches UInt64, lost_statements UInt64,
                 lost_windows UInt32, first_window_start_unix_ms Int64, last_window_end_unix_ms Int64,
                 reason String, received_unix_ms Int64, keep_until_unix_ms Int64"
            ),
            Some("keep_until_unix_ms"),
            "agent_id, first_sequence, last_sequence",
        ),
        // Plans: one row per sighting (plan is an encoded sqlbee.v1.Plan),
        // and one per plan change. They carry no batch identity: a
        // replayed batch's copy is the same sighting, and reads merge
        // sightings (first, last, newest) and changes (distinct). They do
        // not age with the windows: a digest's plan history is small and
        // outlives them.
        table(
            "plans",
            "instance String, schema String, digest UInt64, plan_hash UInt64, seen_unix_ms Int64, plan String",
            None,
            "digest, instance, schema, plan_hash",
        ),
        // What each digest reads and writes (tables: an encoded
        // sqlbee.v1.DigestStats holding only its tables), one row per
        // description an agent sent; likewise no identity and no aging.
        table(
            "digest_tables",
            "digest UInt64, schema String, kind String, tables String, unknown UInt8, seen_unix_ms Int64",
            None,
            "digest, schema",
        ),
        table(
            "plan_changes",
            "instance String, schema String, digest UInt64, at_unix_ms Int64, from_hash UInt64, to_hash UInt64",
            None,
            "at_unix_ms, digest",
        ),
        // Tables' indexes (`indexes`, an encoded sqlbee.v1.TableIndexes),
        // one row per reading an agent sent; no identity, aging with plans.
        table(
            "table_indexes",
            "instance String, schema String, table_name String, read_unix_ms Int64, indexes String",
            None,
            "instance, schema, table_name",
        ),
        // What replicas applied (`replication`, an encoded
        // sqlbee.v1.Replication), one row per instance, channel and
        // window; a replayed batch's copy is the same window. Ages with
        // plans.
        table(
            "replication_windows",
            "instance String, channel String, window_start_unix_ms Int64, window_end_unix_ms Int64, \
             replication String",
            None,
            "instance, channel, window_start_unix_ms",
        ),
        // Markers and detected events (`events`): no batch identity, no
        // partition (few rows); they age with the hour rollups.
        table("annotations", "id UInt64, at_unix_ms Int64, annotation String", None, "at_unix_ms, id"),
        table(
            "events",
            "id UInt64, instance String, kind String, opened_unix_ms Int64, closed_unix_ms Int64,
             updated_unix_ms Int64, event String",
            None,
            "opened_unix_ms, id",
        ),
        // How far each export has come (`export_marks`): a row per
        // acknowledged request, read furthest first.
        table(
            "export_marks",
            "name String, step_ms Int64, until_unix_ms Int64, instance String",
            None,
            "name, until_unix_ms",
        ),
        // Rollups (see `rollups`): each row merges a bucket's winning rows
        // of one key, written by the pass whose id it carries; rows count
        // only under their bucket's newest mark. The columns are the raw
        // tables' own, so reads take both alike.
        table(
            "digest_rollups",
            &format!(
                "{ROLLUP_LEVEL}, bucket Int64, pass Int64, instance String, window_end Int64, sample_end Int64,
                 digest UInt64, schema String, nested UInt8, program String, program_kind String,
                 parent_digest UInt64, source String, count UInt64, errors UInt64, sum_ns UInt64, min_ns UInt64,
                 max_ns UInt64, estimated_count UInt64, truncated UInt64, hist_index Array(UInt32),
                 hist_count Array(UInt64), error_code Array(UInt32), error_count Array(UInt64),
                 wait_class Array(String), wait_sum_ns Array(UInt64), wait_max_ns Array(UInt64),
                 wait_statements Array(UInt64), {rank_columns}, figures String, accounts String, sample String"
            ),
            Some("bucket"),
            "bucket, pass, instance, digest",
        ),
        table(
            "instance_rollups",
            &format!(
                "{ROLLUP_LEVEL}, bucket Int64, pass Int64, agent_id String, instance String, window_start Int64,
                 window_end Int64, statements UInt64, dropped_events UInt64, unmatched UInt64, command Array(String),
                 command_count Array(UInt64), probes String"
            ),
            Some("bucket"),
            "bucket, pass, agent_id, instance",
        ),
        table(
            "agent_rollups",
            &format!(
                "{ROLLUP_LEVEL}, bucket Int64, pass Int64, agent_id String, window_start Int64, window_end Int64,
                 cost String, windows UInt64, costless_windows UInt64, shedding_windows UInt64, cpu_seconds Float64"
            ),
            Some("bucket"),
            "bucket, pass, agent_id",
        ),
        // A bucket's rollup is complete once its mark exists: the pass
        // writes it after every row.
        table(
            "rollup_marks",
            &format!("{ROLLUP_LEVEL}, bucket Int64, pass Int64, written_unix_ms Int64"),
            Some("bucket"),
            "bucket, pass",
        ),
    ]
}

/// The rollup levels this store keeps (bucket lengths, ms), finest first,
/// each dividing the next. Days keep a week's range to a few rows per key,
/// and ten minutes keep its ragged edges to a few raw windows (an hour at
/// each end would be most of the rows read). Rolling up and retention
/// (`write::prune`) both name them.
pub(super) const LEVELS: [i64; 3] = [10 * rollup::MINUTE_MS, rollup::HOUR_MS, rollup::DAY_MS];

/// A rollup row's and mark's level (bucket length, ms); version 2 wrote
/// hours only.
const ROLLUP_LEVEL: &str = "level Int64 DEFAULT 3600000";

/// When the server stored a batch record, by its own clock: the rollups
/// tell what they hold by it (see `rollups`).
const INSERTED: &str = "inserted DateTime DEFAULT now()";

/// The hours (ms / 3600000) the batch's windows end in. A version 1
/// record reads as every hour of its time range, capped at 100 days.
const WINDOW_HOURS: &str =
    "window_hours Array(Int64) DEFAULT arrayMap(i -> intDiv(first_unix_ms, 3600000) + toInt64(i),
    range(toUInt64(least(greatest(intDiv(last_unix_ms, 3600000) - intDiv(first_unix_ms, 3600000) + 1, 0), 2400))))";

/// Where a raw row's sample came from: its own window (a rollup row keeps
/// the newest sample's end in a column of this name).
const SAMPLE_END: &str = "sample_end Int64 ALIAS window_end";

/// Rollup tables, every level pruned by the hour level's retention.
pub(super) const ROLLUP_AGING: [(&str, &str); 4] = [
    ("digest_rollups", "bucket"),
    ("instance_rollups", "bucket"),
    ("agent_rollups", "bucket"),
    ("rollup_marks", "bucket"),
];

/// Plans, plan changes, digest descriptions, tables' indexes, markers,
/// events and export marks, pruned by the hour rollups' retention (unpartitioned: small, and
/// they go by mutation). An event goes by its opening, which all its
/// versions share; an export's newest mark outlives its older ones.
pub(super) const PLAN_AGING: [(&str, &str); 8] = [
    ("plans", "seen_unix_ms"),
    ("plan_changes", "at_unix_ms"),
    ("digest_tables", "seen_unix_ms"),
    ("table_indexes", "read_unix_ms"),
    ("replication_windows", "window_end_unix_ms"),
    ("annotations", "at_unix_ms"),
    ("events", "opened_unix_ms"),
    ("export_marks", "until_unix_ms"),
];

/// Tables whose rows age, with the column retention goes by.
pub(super) const AGING: [(&str, &str); 10] = [
    ("digest_windows", "window_end"),
    ("instance_windows", "window_end"),
    ("agent_windows", "window_end"),
    ("lock_waits", "start_unix_ms"),
    ("long_statements", "start_unix_ms"),
    ("error_samples", "window_end"),
    ("digest_texts", "window_end"),
    ("untraced", "seen_unix_ms"),
    ("gaps", "keep_until_unix_ms"),
    // A record goes only after every row it vouches for.
    ("batches", "keep_until_unix_ms"),
];

/// Columns added to tables that older versions created: (the version that
/// added it, table, column, definition), in the order they are added to a
/// store found at an older version. Tables a version added are created
/// whole, by their CREATE.
const ADDED_COLUMNS: [(u32, &str, &str, &str); 9] = [
    // Version 1's records read as inserted now (the column's default on
    // old parts), so the rollups leave them to raw reads until retention
    // takes them: counted once either way.
    (2, "batches", "inserted", INSERTED),
    (2, "batches", "window_hours", WINDOW_HOURS),
    (2, "digest_windows", "sample_end", SAMPLE_END),
    (3, "digest_rollups", "level", ROLLUP_LEVEL),
    (3, "instance_rollups", "level", ROLLUP_LEVEL),
    (3, "agent_rollups", "level", ROLLUP_LEVEL),
    (3, "rollup_marks", "level", ROLLUP_LEVEL),
    (4, "error_samples", "instance", SAMPLE_INSTANCE),
    (5, "instance_windows", "server_login", SERVER_LOGIN),
];

/// A rank column's definition (`store::rank_columns`).
fn rank_column(name: &str) -> String {
    format!("{name} Nullable(UInt64)")
}

/// The tables that keep the rank columns. A column one lacks (a figure
/// ranked since the store was made) is added on open with no new version:
/// a row written before reads NULL, unknown, and an older collector reads
/// the store as it did.
const RANKED_TABLES: [&str; 2] = ["digest_windows", "digest_rollups"];

/// Creates the database and what it lacks. Ok(version found: 0 for a new
/// database), or Err(version found) when a newer collector wrote it.
pub(super) fn migrate(server: &Client, database: &str) -> Result<Result<u32, u32>, HttpError> {
    server.execute(&format!("CREATE DATABASE IF NOT EXISTS {database}"))?;
    let db = server.with_database(database);
    let (_, create_version) = &tables()[0];
    db.execute(create_version)?;
    let found = version(&db)?;
    if found > SCHEMA_VERSION {
        return Ok(Err(found));
    }
    for (_, create) in tables().iter().skip(1) {
        db.execute(create)?;
    }
    for (added, table, column, definition) in ADDED_COLUMNS {
        if (1..added).contains(&found) {
            add_column(&db, table, column, definition)?;
        }
    }
    for table in RANKED_TABLES {
        for name in rank_columns::names() {
            add_column(&db, table, name, &rank_column(name))?;
        }
    }
    if found < SCHEMA_VERSION {
        db.execute(&format!(
            "INSERT INTO schema_version (version, written_unix_ms) VALUES ({SCHEMA_VERSION}, {})",
            sqlbee_vocabulary::clock::now_unix_ms()
        ))?;
    }
    Ok(Ok(found))
}

/// Creates a cluster store's databases and what they lack on every node
/// (`ON CLUSTER`: each node's DDL queue, so a node that is down takes it
/// when it is back). Ok(version found: 0 for a new store), or Err(version
/// found) when a newer collector wrote it. `server` may be any node;
/// `reachable` are the nodes that answered, each waited for until it has
/// applied the DDL.
pub(super) fn migrate_cluster(
    server: &Client,
    cluster: &str,
    database: &str,
    reachable: &[String],
) -> Result<Result<u32, u32>, HttpError> {
    let shard_db = shard_database(database);
    let layout = Layout::Cluster { cluster, database, shard_db: &shard_db };
    let tables = tables_for(layout);
    let present = present_tables(server, database, &shard_db, &tables)?;
    let wait_for_tables = |tables: &[(&str, String)]| {
        let names: Vec<String> = tables.iter().map(|(name, _)| super::http::quote(name)).collect();
        let check = format!(
            "SELECT toUInt64(count()) FROM system.tables WHERE database IN ({}, {}) AND name IN ({})",
            super::http::quote(&shard_db),
            super::http::quote(database),
            names.join(", ")
        );
        wait_until_applied(server, reachable, &check, 2 * tables.len() as u64)
    };
    if present < tables.len() {
        for db in [&shard_db, database] {
            on_cluster(server, &format!("CREATE DATABASE IF NOT EXISTS {db} ON CLUSTER {cluster}"))?;
        }
        create_on_cluster(server, layout, &tables[..1])?;
        wait_for_tables(&tables[..1])?;
    }
    let found = version(&server.with_database(database))?;
    if found > SCHEMA_VERSION {
        return Ok(Err(found));
    }
    if present < tables.len() {
        create_on_cluster(server, layout, &tables[1..])?;
        wait_for_tables(&tables[1..])?;
    }
    // The first cluster store was version 7, but an upgrade runs the same
    // way from any version: a column goes to the shard table, then to the
    // `Distributed` table that reads it.
    for (added, table, column, definition) in ADDED_COLUMNS {
        if (1..added).contains(&found) {
            add_column_on_cluster(server, layout, reachable, (table, column, definition))?;
        }
    }
    for table in RANKED_TABLES {
        for name in rank_columns::names() {
            let missing = |db: &str| has_column(&server.with_database(db), table, name).map(|has| !has);
            if missing(&shard_db)? || missing(database)? {
                add_column_on_cluster(server, layout, reachable, (table, name, &rank_column(name)))?;
            }
        }
    }
    if found < SCHEMA_VERSION {
        // Any one shard's row will do: reads take the largest version.
        server.with_database(&shard_db).execute(&format!(
            "INSERT INTO schema_version (version, written_unix_ms) VALUES ({SCHEMA_VERSION}, {})",
            sqlbee_vocabulary::clock::now_unix_ms()
        ))?;
    }
    Ok(Ok(found))
}

/// Each table's shard table, then the `Distributed` table that reads
/// through every shard.
fn create_on_cluster(server: &Client, layout: Layout<'_>, tables: &[(&str, String)]) -> Result<(), HttpError> {
    let Layout::Cluster { cluster, database, shard_db } = layout else { return Ok(()) };
    for (name, create) in tables {
        on_cluster(server, create)?;
        on_cluster(server, &create_distributed(cluster, database, shard_db, name))?;
    }
    Ok(())
}

/// ClickHouse's code for a distributed DDL not yet applied on every node
/// when its wait ended (TIMEOUT_EXCEEDED).
const DDL_NOT_EVERYWHERE: u32 = 159;

/// How long the nodes that answer get to apply the DDL queued for them.
const APPLY_LIMIT: std::time::Duration = std::time::Duration::from_secs(180);

/// Queues a statement `ON CLUSTER` for every node without waiting for
/// them: ClickHouse would hold each statement `distributed_ddl_task_timeout`
/// (180 s) for a node that is down, which takes it from its queue when it
/// is back. The nodes that answer are waited for by `wait_until_applied`.
fn on_cluster(server: &Client, sql: &str) -> Result<(), HttpError> {
    match server.with_setting("distributed_ddl_task_timeout", "0").execute(sql) {
        Err(e) if e.code() == Some(DDL_NOT_EVERYWHERE) => Ok(()),
        other => other,
    }
}

/// Waits until `check` (a count) answers at least `expected` on each of
/// `nodes`, so that what follows finds the queued DDL applied there.
fn wait_until_applied(server: &Client, nodes: &[String], check: &str, expected: u64) -> Result<(), HttpError> {
    let deadline = std::time::Instant::now() + APPLY_LIMIT;
    for node in nodes {
        let one = server.with_bases(vec![node.clone()]);
        loop {
            let found = one.select(check)?.u64().map_err(|e| HttpError::Server {
                url: node.clone(),
                status: 200,
                message: e.to_string(),
            })?;
            if found >= expected {
                break;
            }
            if std::time::Instant::now() > deadline {
                return Err(HttpError::Server {
                    url: node.clone(),
                    status: 0,
                    message: format!(
                        "the node has not applied the store's cluster DDL within {} s ({found} of {expected} for {check})",
                        APPLY_LIMIT.as_secs()
                    ),
                });
            }
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
    }
    Ok(())
}

/// The `Distributed` table `name` of `database`, with its shard table's
/// columns, on every node.
fn create_distributed(cluster: &str, database: &str, shard_db: &str, name: &str) -> String {
    format!(
        "CREATE TABLE IF NOT EXISTS {database}.{name} ON CLUSTER {cluster} AS {shard_db}.{name}
         ENGINE = Distributed({cluster}, {shard_db}, {name})"
    )
}

/// How many of the store's tables this node holds both of (its shard
/// table and its `Distributed` table).
fn present_tables(
    server: &Client,
    database: &str,
    shard_db: &str,
    tables: &[(&str, String)],
) -> Result<usize, HttpError> {
    let names: Vec<String> = tables.iter().map(|(name, _)| super::http::quote(name)).collect();
    let mut rows = server.select(&format!(
        "SELECT toUInt64(count()) FROM (SELECT name FROM system.tables
             WHERE database IN ({}, {}) AND name IN ({}) GROUP BY name HAVING count() = 2)",
        super::http::quote(shard_db),
        super::http::quote(database),
        names.join(", ")
    ))?;
    let n = rows.u64().map_err(|e| HttpError::Server { url: String::new(), status: 200, message: e.to_string() })?;
    Ok(n as usize)
}

/// The store's schema version: the largest any collector wrote.
fn version(db: &Client) -> Result<u32, HttpError> {
    let mut rows = db.select("SELECT toUInt32(max(version)) FROM schema_version")?;
    rows.u32().map_err(|e| HttpError::Server { url: String::new(), status: 200, message: e.to_string() })
}

/// Adds a column to a table written by an older collector, unless a
/// collector upgrading beside this one added it first.
/// Adds a column to a table's shard table and `Distributed` table on every
/// node (`ON CLUSTER`), each where this node lacks it: a node that had it
/// from an upgrade cut short would refuse the ALTER.
fn add_column_on_cluster(
    server: &Client,
    layout: Layout<'_>,
    reachable: &[String],
    (table, name, definition): (&str, &str, &str),
) -> Result<(), HttpError> {
    let Layout::Cluster { cluster, database, shard_db } = layout else { return Ok(()) };
    let has_it = |db: &str| {
        format!(
            "SELECT count() FROM system.columns WHERE database = {} AND table = {} AND name = {}",
            super::http::quote(db),
            super::http::quote(table),
            super::http::quote(name)
        )
    };
    if !has_column(&server.with_database(shard_db), table, name)? {
        on_cluster(server, &format!("ALTER TABLE {shard_db}.{table} ON CLUSTER {cluster} ADD COLUMN {definition}"))?;
    }
    // Each node's `Distributed` table is made from its own shard table.
    wait_until_applied(server, reachable, &has_it(shard_db), 1)?;
    if !has_column(&server.with_database(database), table, name)? {
        // ClickHouse refuses ALTER ... ON CLUSTER of a table that is not
        // replicated when the cluster's shards are (18.16: "isn't
        // replicated, but shard is replicated"). The `Distributed` table
        // holds no rows, so it is made again from its shard table.
        on_cluster(server, &format!("DROP TABLE IF EXISTS {database}.{table} ON CLUSTER {cluster}"))?;
        on_cluster(server, &create_distributed(cluster, database, shard_db, table))?;
    }
    wait_until_applied(server, reachable, &has_it(database), 1)?;
    Ok(())
}

fn has_column(db: &Client, table: &str, name: &str) -> Result<bool, HttpError> {
    let mut rows = db.select(&format!(
        "SELECT count() FROM system.columns WHERE database = currentDatabase() AND table = '{table}'
         AND name = '{name}'"
    ))?;
    let has = rows.u64().map_err(|e| HttpError::Server { url: String::new(), status: 200, message: e.to_string() })?;
    Ok(has > 0)
}

fn add_column(db: &Client, table: &str, name: &str, definition: &str) -> Result<(), HttpError> {
    if !has_column(db, table, name)? {
        db.execute(&format!("ALTER TABLE {table} ADD COLUMN {definition}"))?;
    }
    Ok(())
}
