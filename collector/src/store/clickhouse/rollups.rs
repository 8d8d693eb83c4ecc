//! Rollups at three levels in a store that many collectors share, exact
//! without transactions, and the reads that use them.
//!
//! A pass (`roll_up`, run by every collector now and then) merges one
//! bucket's rows into one row per key, from the batches whose first record
//! the server stored before the pass's *cutoff* (`batches.inserted`, the
//! server's clock, minus `SETTLE_MS` so every insert stamped before it is
//! visible), each batch through its winning attempt among those records.
//! It writes the rows under a *pass id* (the cutoff second in its high
//! bits, random low bits, so two passes in one second differ), then the
//! bucket's *mark* (level, bucket, pass id) last: rows without a mark (a
//! pass killed half way) or under an older mark never count.
//!
//! A read splits its range with `rollup::plan_levels`, coarsest level
//! first. A bucket with marks is read as its newest mark's rollup rows plus
//! the *delta*: raw rows of the batches whose every record was stored at
//! or after that cutoff (a late batch, an agent's spool after an outage),
//! through their winners. Every batch falls on exactly one side, so it
//! counts once however late it comes and however often passes run. A
//! bucket without a mark is read at the next finer level, and raw below
//! the finest. The one assumption: an insert the server stamped is visible
//! within `SETTLE_MS` of the stamp.
//!
//! Each batch record lists the hours its windows end in (`window_hours`),
//! so a pass finds the buckets that changed since their mark and a read
//! finds the late batches of a bucket without scanning rows. A ten-minute
//! bucket is found through its hour: a batch of that hour makes all six
//! due, and those without rows get a mark and no rows.
use std::collections::{BTreeMap, BTreeSet, HashMap};

use prost::Message as _;
use sqlbee_proto::v1::{AgentCost, ProbeCost};

use super::{
    cluster,
    digest_rows::{DIGEST_COLUMNS, MERGE_COLUMNS, Merging, RowKey, read_full_row},
    error,
    http::{Client, RowWriter},
    malformed,
    schema::LEVELS,
    winners_of, write,
};
use crate::store::{StoreError, merge, rollup};

const HOUR: i64 = rollup::HOUR_MS;
/// How long after the server stamps an insert it is surely visible.
pub(super) const SETTLE_MS: i64 = 5 * 60_000;
/// Random low bits of a pass id.
const PASS_RANDOM_BITS: u32 = 22;

/// A pass id for a cutoff (seconds): ordered by cutoff, unique per pass.
pub(super) fn pass_id(cutoff_s: i64) -> i64 {
    // The same draw as an ingest attempt's id: time high, random low.
    let random = super::write::new_ingest_id(0) as i64 & ((1 << PASS_RANDOM_BITS) - 1);
    (cutoff_s.max(0) << PASS_RANDOM_BITS) | random
}

/// The cutoff (seconds) a pass id carries.
fn cutoff_of(pass: i64) -> i64 {
    pass >> PASS_RANDOM_BITS
}
/// Buckets one pass rolls at most, finest level first, oldest first; the
/// next pass goes on.
const BUCKETS_PER_PASS: usize = 24;

/// The raw table and the rollup table of one kind of row.
#[derive(Clone, Copy, Debug)]
pub(super) enum Table {
    Digests,
    Instances,
    Agents,
}

impl Table {
    fn raw(self) -> &'static str {
        match self {
            Table::Digests => "digest_windows",
            Table::Instances => "instance_windows",
            Table::Agents => "agent_windows",
        }
    }

    fn rollup(self) -> &'static str {
        match self {
            Table::Digests => "digest_rollups",
            Table::Instances => "instance_rollups",
            Table::Agents => "agent_rollups",
        }
    }
}

/// A rollup bucket: its level and start (ms).
type Bucket = (i64, i64);

/// Where a range's rows are: raw windows ending in `raw` (each [start,
/// end)), marked buckets with their newest pass id, and the marked buckets
/// that have a delta (batches stored at or after their cutoff).
#[derive(Debug, Default)]
pub(super) struct Sources {
    raw: Vec<(i64, i64)>,
    marks: Vec<(Bucket, i64)>,
    late: BTreeSet<Bucket>,
}

/// The SQL array of the `level` buckets a batch record's windows end in,
/// from its `window_hours` (finer than an hour: every bucket of each hour).
fn record_buckets(level: i64) -> String {
    if level >= HOUR {
        format!("arrayMap(h -> intDiv(h * {HOUR}, {level}) * {level}, window_hours)")
    } else {
        let per = HOUR / level;
        format!(
            "arrayMap(x -> window_hours[intDiv(x, {per}) + 1] * {HOUR} + toInt64(x % {per}) * {level},
                      range(toUInt64(length(window_hours) * {per})))"
        )
    }
}

/// The newest pass of each marked bucket that `filter` selects.
fn newest_marks(db: &Client, filter: &str, action: &'static str) -> Result<BTreeMap<Bucket, i64>, StoreError> {
    let bad = malformed(action);
    let mut rows = db
        .select(&format!("SELECT level, bucket, max(pass) FROM rollup_marks WHERE {filter} GROUP BY level, bucket"))
        .map_err(|e| error(action, e))?;
    let mut marks = BTreeMap::new();
    while !rows.done() {
        let bucket = (rows.i64().map_err(&bad)?, rows.i64().map_err(&bad)?);
        marks.insert(bucket, rows.i64().map_err(&bad)?);
    }
    Ok(marks)
}

/// The marks of `[since, until)` and the raw parts around them; with
/// `step`, only levels that divide it.
pub(super) fn sources(
    db: &Client,
    since: i64,
    until: i64,
    step: Option<i64>,
    action: &'static str,
) -> Result<Sources, StoreError> {
    let levels: Vec<i64> = LEVELS.into_iter().filter(|l| step.is_none_or(|s| s > 0 && s % l == 0)).collect();
    let mut out = Sources::default();
    let marks = if levels.is_empty() || since >= until {
        BTreeMap::new()
    } else {
        newest_marks(db, &format!("bucket >= {since} AND bucket < {until}"), action)?
    };
    out.place(since, until, &levels, &marks);
    out.late = late_buckets(db, &out.marks, action)?;
    Ok(out)
}

impl Sources {
    /// Covers `[since, until)` with the coarsest marked buckets, a gap
    /// between them with finer ones, and raw windows below the finest.
    fn place(&mut self, since: i64, until: i64, levels: &[i64], marks: &BTreeMap<Bucket, i64>) {
        for span in rollup::plan_levels(since, until, None, levels) {
            let Some(level) = span.level else {
                self.push_raw(span.start, span.end);
                continue;
            };
            let finer: Vec<i64> = levels.iter().copied().filter(|&l| l < level).collect();
            let mut at = span.start;
            for (&(_, bucket), &pass) in marks.range((level, span.start)..(level, span.end)) {
                self.place(at, bucket, &finer, marks);
                self.marks.push(((level, bucket), pass));
                at = bucket.saturating_add(level);
            }
            self.place(at, span.end, &finer, marks);
        }
    }

    fn push_raw(&mut self, start: i64, end: i64) {
        if start >= end {
            return;
        }
        match self.raw.last_mut() {
            Some(last) if last.1 == start => last.1 = end,
            _ => self.raw.push((start, end)),
        }
    }

    /// A SELECT of `columns` from every part (the same names in the raw
    /// and the rollup table), each filtered by `filters` (` AND ...`).
    pub(super) fn union(&self, table: Table, columns: &str, filters: &str) -> String {
        self.union_of(table, columns, columns, filters)
    }

    /// As `union`, with the raw table's and the rollup table's own column
    /// lists (the same names and types, in the same order).
    pub(super) fn union_of(&self, table: Table, raw_columns: &str, rollup_columns: &str, filters: &str) -> String {
        let (raw, rollup) = (table.raw(), table.rollup());
        let mut parts = Vec::new();
        if !self.raw.is_empty() {
            let ranges: Vec<String> =
                self.raw.iter().map(|(a, b)| format!("(window_end >= {a} AND window_end < {b})")).collect();
            parts.push(format!(
                "SELECT {raw_columns} FROM {raw} WHERE ({}){filters} AND {}",
                ranges.join(" OR "),
                winners_of(&self.raw)
            ));
        }
        if !self.marks.is_empty() {
            let marks: Vec<String> = self.marks.iter().map(|((l, b), p)| format!("({l}, {b}, {p})")).collect();
            parts.push(format!(
                "SELECT {rollup_columns} FROM {rollup} WHERE (level, bucket, pass) IN ({}){filters}",
                marks.join(", ")
            ));
        }
        // Raw rows only of the buckets with a delta: scanning every marked
        // bucket's would cost a read of rollups most of its time.
        for level in LEVELS {
            let late: Vec<(i64, i64)> =
                of_level(&self.marks, level).filter(|(b, _)| self.late.contains(&(level, *b))).collect();
            if late.is_empty() {
                continue;
            }
            let ranges: Vec<String> =
                late.iter().map(|(b, _)| format!("(window_end >= {b} AND window_end < {})", b + level)).collect();
            parts.push(format!(
                "SELECT {raw_columns} FROM {raw} WHERE ({}){filters}
                 AND (agent_id, epoch, sequence, ingest_id, intDiv(window_end, {level}) * {level}) IN ({})",
                ranges.join(" OR "),
                delta_batches(level, &late)
            ));
        }
        if parts.is_empty() {
            return format!("SELECT {raw_columns} FROM {raw} WHERE 0");
        }
        format!("SELECT * FROM ({})", parts.join("\nUNION ALL\n"))
    }
}

/// The (bucket, pass) of each mark of `level`.
fn of_level(marks: &[(Bucket, i64)], level: i64) -> impl Iterator<Item = (i64, i64)> + '_ {
    marks.iter().filter(move |((l, _), _)| *l == level).map(|((_, b), p)| (*b, *p))
}

/// The marked buckets that have batches stored at or after their cutoff,
/// looked up in the batch records alone.
fn late_buckets(db: &Client, marks: &[(Bucket, i64)], action: &'static str) -> Result<BTreeSet<Bucket>, StoreError> {
    let mut parts = Vec::new();
    for level in LEVELS {
        let of: Vec<(i64, i64)> = of_level(marks, level).collect();
        if !of.is_empty() {
            parts.push(format!("SELECT DISTINCT toInt64({level}), b FROM ({})", delta_batches(level, &of)));
        }
    }
    let mut late = BTreeSet::new();
    if parts.is_empty() {
        return Ok(late);
    }
    let mut rows = db.select(&parts.join("\nUNION ALL\n")).map_err(|e| error(action, e))?;
    while !rows.done() {
        late.insert((rows.i64().map_err(malformed(action))?, rows.i64().map_err(malformed(action))?));
    }
    Ok(late)
}

/// The winning attempt (agent_id, epoch, sequence, ingest_id, bucket `b`)
/// of every batch with windows in a `level` bucket of `marks` (bucket,
/// pass) whose every record was stored at or after that bucket's cutoff.
fn delta_batches(level: i64, marks: &[(i64, i64)]) -> String {
    let lo = marks.iter().map(|(b, _)| *b).min().unwrap_or(0);
    // A late batch has every record stored at or after its bucket's cutoff,
    // so at least one after the oldest: only those batches are gathered.
    let oldest = marks.iter().map(|(_, p)| cutoff_of(*p)).min().unwrap_or(0);
    let buckets: Vec<String> = marks.iter().map(|(b, _)| format!("toInt64({b})")).collect();
    let cutoffs: Vec<String> = marks.iter().map(|(_, p)| format!("toInt64({})", cutoff_of(*p))).collect();
    let (buckets, cutoffs) = (buckets.join(", "), cutoffs.join(", "));
    format!(
        "SELECT agent_id, epoch, sequence, min(ingest_id), b FROM batches ARRAY JOIN {} AS b
         WHERE keep_until_unix_ms >= {lo} AND b IN ({buckets})
         AND (agent_id, epoch, sequence) IN (SELECT agent_id, epoch, sequence FROM batches
             WHERE keep_until_unix_ms >= {lo} AND inserted >= toDateTime({oldest}))
         GROUP BY agent_id, epoch, sequence, b
         HAVING toInt64(toUInt32(min(inserted))) >= transform(b, [{buckets}], [{cutoffs}], toInt64({}))",
        record_buckets(level),
        i64::MAX
    )
}

/// What a pass did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RollupOutcome {
    pub buckets: usize,
    pub rows: u64,
    /// Buckets still due after this pass (it rolls at most
    /// `BUCKETS_PER_PASS`).
    pub left: usize,
}

/// Rolls up the buckets that ended before the cutoff and have batches
/// stored since their newest mark (or no mark): finest level first, oldest
/// first.
///
/// On a cluster, `db` reads through every shard and `shards` are each
/// shard's own tables (one server's store: its one database): each
/// bucket's rows are rolled shard by shard, under one pass id, and its
/// mark goes to every shard after every shard's rows.
pub(super) fn roll_up(db: &Client, shards: &Shards<'_>, settle_ms: i64) -> Result<RollupOutcome, StoreError> {
    let bad = malformed("roll up");
    let err = |e| error("roll up", e);
    let now_s = db.select("SELECT toInt64(toUInt32(now()))").map_err(err)?.i64().map_err(&bad)?;
    let cutoff_s = now_s - settle_ms.max(0) / 1000;
    let cutoff = cutoff_s.saturating_mul(1000);
    let marks = newest_marks(db, "1", "roll up")?;
    let mut due = Vec::new();
    for level in LEVELS {
        let mut rows = db
            .select(&format!(
                "SELECT b, toInt64(toUInt32(max(inserted))) FROM batches ARRAY JOIN {} AS b
                 WHERE inserted < toDateTime({cutoff_s}) GROUP BY b HAVING b + {level} <= {cutoff} ORDER BY b",
                record_buckets(level)
            ))
            .map_err(err)?;
        while !rows.done() {
            let bucket = rows.i64().map_err(&bad)?;
            let newest_s = rows.i64().map_err(&bad)?;
            if marks.get(&(level, bucket)).is_none_or(|&pass| newest_s >= cutoff_of(pass)) {
                due.push((level, bucket));
            }
        }
    }
    let mut outcome = RollupOutcome { left: due.len().saturating_sub(BUCKETS_PER_PASS), ..Default::default() };
    if shards.replicated && !due.is_empty() {
        for (n, shard) in shards.all.iter().enumerate() {
            if !cluster::caught_up(shard, settle_ms).map_err(err)? {
                return Err(StoreError::Backend {
                    action: "roll up",
                    source: format!(
                        "the replica of shard {} this collector reads is still catching up with its shard; the \
                         pass waits for it",
                        n + 1
                    )
                    .into(),
                });
            }
        }
    }
    for (level, bucket) in due.into_iter().take(BUCKETS_PER_PASS) {
        outcome.rows += roll_bucket(&shards.all, level, bucket, cutoff_s)?;
        outcome.buckets += 1;
    }
    Ok(outcome)
}

/// Where a pass writes: each shard's tables, and whether they are
/// replicated (a replica must have caught up before a pass reads it).
pub(super) struct Shards<'a> {
    pub all: Vec<&'a Client>,
    pub replicated: bool,
}

/// The rows of `[start, end)` (within one hour) of the batches stored
/// before `cutoff_s`, each through its winning record among those.
pub(super) fn counted(start: i64, end: i64, cutoff_s: i64) -> String {
    format!(
        "window_end >= {start} AND window_end < {end} AND (agent_id, epoch, sequence, ingest_id) IN (
             SELECT agent_id, epoch, sequence, min(ingest_id) FROM batches
             WHERE keep_until_unix_ms >= {start} AND has(window_hours, toInt64({}))
             AND inserted < toDateTime({cutoff_s})
             GROUP BY agent_id, epoch, sequence)",
        start.div_euclid(HOUR)
    )
}

/// One bucket's rollup rows of the batches stored before `cutoff_s`, under
/// a pass id of their own, each shard's from its own rows, then its mark on
/// every shard. A bucket longer than an hour is read an hour at a time, so
/// a collector holds one hour's raw rows.
pub(super) fn roll_bucket(shards: &[&Client], level: i64, bucket: i64, cutoff_s: i64) -> Result<u64, StoreError> {
    let err = |e| error("roll up", e);
    let step = level.min(HOUR);
    let chunks: Vec<String> =
        (0..level / step).map(|n| counted(bucket + n * step, bucket + (n + 1) * step, cutoff_s)).collect();
    let pass = pass_id(cutoff_s);
    let mut rows = 0;
    for db in shards {
        let digests = roll_digests(db, &chunks, (level, bucket), pass)?;
        let instances = roll_instances(db, &chunks, (level, bucket), pass)?;
        let agents = roll_agents(db, &chunks, (level, bucket), pass)?;
        tracing::debug!(level, bucket, cutoff_s, pass, digests, instances, agents, "rolled up");
        rows += digests + instances + agents;
    }
    let mut mark = RowWriter::default();
    bucket_key(&mut mark, (level, bucket), pass).col("written_unix_ms").i64(sqlbee_vocabulary::clock::now_unix_ms());
    mark.end_row();
    // Reads take a bucket's newest mark from any shard: each copy says
    // every shard's rows of its pass are there.
    for db in shards {
        db.insert("rollup_marks", &mark).map_err(err)?;
    }
    Ok(rows)
}

/// The columns every rollup row (and mark) starts with.
fn bucket_key(w: &mut RowWriter, (level, bucket): Bucket, pass: i64) -> &mut RowWriter {
    w.col("level").i64(level).col("bucket").i64(bucket).col("pass").i64(pass)
}

/// Each chunk is a `counted` filter; the chunks of a bucket go in time
/// order.
pub(super) fn roll_digests(
    db: &Client,
    chunks: &[String],
    (level, bucket): Bucket,
    pass: i64,
) -> Result<u64, StoreError> {
    let bad = malformed("roll up");
    let mut merged: HashMap<(String, RowKey), Merging> = HashMap::new();
    for counted in chunks {
        let mut rows = db
            .select(&format!("SELECT {DIGEST_COLUMNS}, {MERGE_COLUMNS} FROM digest_windows WHERE {counted}"))
            .map_err(|e| error("roll up", e))?;
        while !rows.done() {
            let full = read_full_row(&mut rows, &bad)?;
            merged.entry((full.row.instance.clone(), full.row.key.clone())).or_default().add(full)?;
        }
    }
    let mut w = RowWriter::default();
    for ((instance, key), m) in merged {
        let t = &m.totals;
        let (min_ns, max_ns) = if t.count == 0 { (0, 0) } else { (t.min_ns, t.max_ns) };
        let (sample_end, sample) = m.sample.unwrap_or_default();
        bucket_key(&mut w, (level, bucket), pass).col("instance").str(&instance);
        w.col("window_end").i64(m.newest_end).col("sample_end").i64(sample_end);
        w.col("digest").u64(key.digest).col("schema").str(&key.schema).col("nested").u8(u8::from(key.nested));
        w.col("program").str(&key.program).col("program_kind").str(&key.program_kind);
        w.col("parent_digest").u64(key.parent_digest).col("source").str(&key.source);
        w.col("count").u64(t.count).col("errors").u64(t.errors).col("sum_ns").u64(t.sum_ns);
        w.col("min_ns").u64(min_ns).col("max_ns").u64(max_ns);
        w.col("estimated_count").u64(if m.sampled { m.estimated } else { 0 }).col("truncated").u64(m.truncated);
        let buckets: Vec<sqlbee_proto::v1::Bucket> = m
            .histogram
            .buckets()
            .map(|(index, count)| sqlbee_proto::v1::Bucket { index: index as u32, count })
            .collect();
        let codes: Vec<(u32, u64)> =
            m.errors.into_counts(|_| String::new()).into_iter().map(|e| (e.code, e.count)).collect();
        write::digest_arrays(&mut w, &buckets, &codes, &m.waits.into_stats());
        write::rank_figures(&mut w, Some(&m.stats));
        w.col("figures").bytes(&m.stats.encode_to_vec());
        w.col("accounts").bytes(&m.senders.into_stored());
        w.col("sample").str(&sample);
        w.end_row();
    }
    db.insert("digest_rollups", &w).map_err(|e| error("roll up", e))?;
    Ok(w.len() as u64)
}

/// Per (agent, instance), windows with probe costs and windows without
/// apart, so a reader's "probed statements" stay exact.
#[derive(Default)]
struct InstanceBucket {
    window_start: i64,
    window_end: i64,
    statements: u64,
    dropped_events: u64,
    unmatched: u64,
    commands: BTreeMap<String, u64>,
    probe_cpu_seconds: f64,
    estimated: u64,
}

fn roll_instances(db: &Client, chunks: &[String], (level, bucket): Bucket, pass: i64) -> Result<u64, StoreError> {
    let bad = malformed("roll up");
    let mut merged: BTreeMap<(String, String, bool), InstanceBucket> = BTreeMap::new();
    for counted in chunks {
        let mut rows = db
            .select(&format!(
                "SELECT agent_id, instance, window_start, window_end, statements, dropped_events, unmatched, command,
                        command_count, probes
                 FROM instance_windows WHERE {counted}"
            ))
            .map_err(|e| error("roll up", e))?;
        while !rows.done() {
            let (agent, instance) = (rows.string().map_err(&bad)?, rows.string().map_err(&bad)?);
            let (start, end) = (rows.i64().map_err(&bad)?, rows.i64().map_err(&bad)?);
            let statements = rows.u64().map_err(&bad)?;
            let (dropped, unmatched) = (rows.u64().map_err(&bad)?, rows.u64().map_err(&bad)?);
            let names = rows.array(|r| r.string()).map_err(&bad)?;
            let counts = rows.array(|r| r.u64()).map_err(&bad)?;
            let probes = decode_probes(&rows.bytes().map_err(&bad)?)?;
            let b = merged.entry((agent, instance, probes.is_some())).or_insert_with(|| InstanceBucket {
                window_start: start,
                window_end: end,
                ..Default::default()
            });
            b.window_start = b.window_start.min(start);
            b.window_end = b.window_end.max(end);
            b.statements = b.statements.saturating_add(statements);
            b.dropped_events = b.dropped_events.saturating_add(dropped);
            b.unmatched = b.unmatched.saturating_add(unmatched);
            for (name, count) in names.into_iter().zip(counts) {
                let slot = b.commands.entry(name).or_default();
                *slot = slot.saturating_add(count);
            }
            if let Some(p) = probes {
                b.probe_cpu_seconds += p.probe_cpu_seconds;
                let estimated = merge::probed_statements(statements, &p);
                b.estimated = b.estimated.saturating_add(estimated);
            }
        }
    }
    let mut w = RowWriter::default();
    for ((agent, instance, probed), b) in merged {
        bucket_key(&mut w, (level, bucket), pass).col("agent_id").str(&agent).col("instance").str(&instance);
        w.col("window_start").i64(b.window_start).col("window_end").i64(b.window_end);
        w.col("statements").u64(b.statements).col("dropped_events").u64(b.dropped_events);
        w.col("unmatched").u64(b.unmatched);
        let (names, counts): (Vec<String>, Vec<u64>) = b.commands.into_iter().unzip();
        w.col("command").array(&names, |w, n| {
            w.str(n);
        });
        w.col("command_count").array(&counts, |w, c| {
            w.u64(*c);
        });
        let probes = if probed {
            ProbeCost {
                probe_cpu_seconds: b.probe_cpu_seconds,
                estimated_statements: b.estimated,
                ..Default::default()
            }
            .encode_to_vec()
        } else {
            Vec::new()
        };
        w.col("probes").bytes(&probes);
        w.end_row();
    }
    db.insert("instance_rollups", &w).map_err(|e| error("roll up", e))?;
    Ok(w.len() as u64)
}

fn decode_probes(bytes: &[u8]) -> Result<Option<ProbeCost>, StoreError> {
    if bytes.is_empty() {
        return Ok(None);
    }
    ProbeCost::decode(bytes).map(Some).map_err(|_| StoreError::Corrupt { what: "probe cost" })
}

/// Per agent: windows with a cost (a summary counts only these) and
/// windows without (a series counts both).
#[derive(Default)]
struct AgentBucket {
    windows: u64,
    costless_windows: u64,
    ms: i64,
    cpu_seconds: f64,
    max_rss: u64,
    dropped_events: u64,
    shedding_windows: u64,
    latest_shedding: String,
    latest_end: i64,
}

fn roll_agents(db: &Client, chunks: &[String], (level, bucket): Bucket, pass: i64) -> Result<u64, StoreError> {
    let bad = malformed("roll up");
    let mut merged: BTreeMap<String, AgentBucket> = BTreeMap::new();
    for counted in chunks {
        let mut rows = db
            .select(&format!(
                "SELECT agent_id, window_start, window_end, cost FROM agent_windows WHERE {counted}
                 ORDER BY window_end, received_unix_ms, ingest_id, position"
            ))
            .map_err(|e| error("roll up", e))?;
        while !rows.done() {
            let agent = rows.string().map_err(&bad)?;
            let (start, end) = (rows.i64().map_err(&bad)?, rows.i64().map_err(&bad)?);
            let cost = rows.bytes().map_err(&bad)?;
            let b = merged.entry(agent).or_default();
            // As the readers do: an empty encoding is a window without a cost.
            if cost.is_empty() {
                b.costless_windows += 1;
                continue;
            }
            let cost = AgentCost::decode(cost.as_slice()).map_err(|_| StoreError::Corrupt { what: "agent cost" })?;
            let ms = (end - start).max(0);
            b.windows += 1;
            b.latest_end = b.latest_end.max(end);
            b.ms = b.ms.saturating_add(ms);
            b.cpu_seconds += cost.cpu_cores * (ms as f64 / 1e3);
            b.max_rss = b.max_rss.max(cost.rss_bytes);
            b.dropped_events = b.dropped_events.saturating_add(cost.dropped_events);
            if merge::shedding(&cost.shedding) {
                b.shedding_windows += 1;
            }
            b.latest_shedding = cost.shedding;
        }
    }
    let mut w = RowWriter::default();
    for (agent, b) in merged {
        let seconds = b.ms as f64 / 1e3;
        let cost = AgentCost {
            cpu_cores: if seconds > 0.0 { b.cpu_seconds / seconds } else { 0.0 },
            rss_bytes: b.max_rss,
            dropped_events: b.dropped_events,
            shedding: b.latest_shedding,
            ..Default::default()
        };
        // Costless windows alone are placed at the bucket's start.
        let end = if b.windows > 0 { b.latest_end } else { bucket };
        bucket_key(&mut w, (level, bucket), pass).col("agent_id").str(&agent);
        w.col("window_start").i64(end - b.ms).col("window_end").i64(end).col("cost").bytes(&cost.encode_to_vec());
        w.col("windows").u64(b.windows).col("costless_windows").u64(b.costless_windows);
        w.col("shedding_windows").u64(b.shedding_windows).col("cpu_seconds").f64(b.cpu_seconds);
        w.end_row();
    }
    db.insert("agent_rollups", &w).map_err(|e| error("roll up", e))?;
    Ok(w.len() as u64)
}
