//! Answers: digests merged over windows and instances (`Top`), instances,
//! lock waits and exact totals, each from one read transaction.
use std::collections::{BTreeMap, BTreeSet, HashMap};

use prost::Message as _;
use rusqlite::OptionalExtension;
use sqlbee_proto::v1::{CommandCount, InstanceInfo, LockWait, LockWaitRow, QueryStats, TopDigest, TotalsResponse};
use sqlbee_vocabulary::histogram::Histogram;

use super::{digest_rows, error, i, instance_filter, u};
use crate::store::{
    LocksQuery, OrderBy, Page, StoreError, TopPage, TopQuery, TotalsQuery,
    answer_budget::lean_text,
    blob,
    merge::{self, DigestTotals, MergedErrors, MergedWaits},
    rollup,
    senders::MergedSenders,
};

/// Per (schema, digest) while merging: totals and the instances it was
/// seen on (interned: the same few names repeat on every row), and the
/// rank key that needs more than the totals (p99, the total wait, or a
/// figure's sum).
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

/// A digest row's key in answers: its schema, digest and lineage (nested,
/// program, program kind, parent digest, source).
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
struct RowKey {
    schema: String,
    digest: u64,
    nested: bool,
    program: String,
    program_kind: String,
    parent_digest: u64,
    source: String,
}

/// The key's columns, in `RowKey` order after the digest.
const KEY_COLUMNS: &str = "schema, digest, nested, program, program_kind, parent_digest, source";

fn row_key(row: &rusqlite::Row<'_>, first: usize) -> rusqlite::Result<RowKey> {
    Ok(RowKey {
        schema: row.get(first)?,
        digest: u(row.get(first + 1)?),
        nested: row.get(first + 2)?,
        program: row.get(first + 3)?,
        program_kind: row.get(first + 4)?,
        parent_digest: u(row.get(first + 5)?),
        source: row.get(first + 6)?,
    })
}

/// The filters of a `top` scan as SQL and the values they bind, in order
/// after the ones the statement itself binds first.
struct Filters {
    sql: String,
    values: Vec<String>,
}

fn filters(query: &TopQuery, first: usize) -> Filters {
    let mut sql = String::from("1");
    let mut values = Vec::new();
    for (column, value) in [("instance", &query.instance), ("schema", &query.schema), ("program", &query.program)] {
        if let Some(value) = value {
            sql.push_str(&format!(" AND {column} = ?{}", first + values.len()));
            values.push(value.clone());
        }
    }
    if let Some(digest) = query.digest {
        // Stored as its i64 bit pattern; an integer literal needs no binding.
        sql.push_str(&format!(" AND digest = {}", i(digest)));
    }
    // Client statements only, unless asked (a program's are nested).
    if !query.nested && query.program.is_none() {
        sql.push_str(" AND nested = 0");
    }
    Filters { sql, values }
}

/// The top digests (`lean`: see `Store::top_lean`).
pub(super) fn top(tx: &rusqlite::Transaction<'_>, query: &TopQuery, lean: bool) -> Result<TopPage, StoreError> {
    let err = |e| error("top", e);
    let spans = rollup::plan(query.since_unix_ms, query.until_unix_ms, None);
    // Step 1: scalar sums per (schema, digest), without reading any blob.
    let mut names: Vec<String> = Vec::new();
    let mut name_ids: HashMap<String, u32> = HashMap::new();
    let mut digests: HashMap<RowKey, Merging> = HashMap::new();
    let figure_column = query.order_by.figure().map_or("0", |f| f.name);
    {
        let columns = format!(
            "instance, count, errors, sum_ns, min_ns, max_ns, estimated_count, coalesce({figure_column}, 0), {KEY_COLUMNS}"
        );
        let mut stmt = scan(tx, query, &spans, &columns, "").map_err(err)?;
        let mut rows = stmt.raw_query();
        while let Some(row) = rows.next().map_err(err)? {
            let name = row.get_ref(0).map_err(err)?.as_str().map_err(|e| err(e.into()))?;
            let id = match name_ids.get(name) {
                Some(id) => *id,
                None => {
                    let id = names.len() as u32;
                    names.push(name.to_string());
                    name_ids.insert(name.to_string(), id);
                    id
                }
            };
            let key = row_key(row, 8).map_err(err)?;
            let entry = digests.entry(key).or_default();
            entry.instances.insert(id);
            let (count, estimated) = (u(row.get(1).map_err(err)?), u(row.get(6).map_err(err)?));
            entry.sampled |= estimated > 0;
            entry.estimated = entry.estimated.saturating_add(if estimated > 0 { estimated } else { count });
            entry.rank = entry.rank.saturating_add(u(row.get(7).map_err(err)?));
            entry.totals.add(
                count,
                u(row.get(2).map_err(err)?),
                u(row.get(3).map_err(err)?),
                u(row.get(4).map_err(err)?),
                u(row.get(5).map_err(err)?),
            );
        }
    }
    // The instance filter after the row key (?1 digest, ?2-?7 the rest of
    // the key).
    let by_row = filters(&TopQuery { schema: None, digest: None, program: None, nested: true, ..query.clone() }, 8);
    let key_match = format!(
        "digest = ?1 AND schema = ?2 AND nested = ?3 AND program = ?4 AND program_kind = ?5 AND parent_digest = ?6
         AND source = ?7 AND {}",
        by_row.sql
    );
    let rows = digest_rows::union(&spans, &key_match);
    let by_row_sql = format!("SELECT histogram, error_codes, waits, figures, accounts FROM {rows}");
    let sample_sql = format!("SELECT sample FROM {rows} WHERE sample <> '' ORDER BY sample_end DESC LIMIT 1");
    let bind = |stmt: &mut rusqlite::Statement<'_>, key: &RowKey| -> rusqlite::Result<()> {
        stmt.raw_bind_parameter(1, i(key.digest))?;
        stmt.raw_bind_parameter(2, &key.schema)?;
        stmt.raw_bind_parameter(3, key.nested)?;
        stmt.raw_bind_parameter(4, &key.program)?;
        stmt.raw_bind_parameter(5, &key.program_kind)?;
        stmt.raw_bind_parameter(6, i(key.parent_digest))?;
        stmt.raw_bind_parameter(7, &key.source)?;
        for (n, value) in by_row.values.iter().enumerate() {
            stmt.raw_bind_parameter(8 + n, value)?;
        }
        Ok(())
    };
    // Step 2: the rank keys that need blobs. Ordering by p99 needs every
    // digest's histogram, by wait every digest's waits; the other orders
    // read blobs only for the digests that make the cut.
    let mut histograms: HashMap<RowKey, Histogram> = HashMap::new();
    match query.order_by {
        OrderBy::P99 => {
            let mut stmt = scan(tx, query, &spans, &format!("histogram, {KEY_COLUMNS}"), "").map_err(err)?;
            let mut rows = stmt.raw_query();
            while let Some(row) = rows.next().map_err(err)? {
                let key = row_key(row, 1).map_err(err)?;
                let bytes = row.get_ref(0).map_err(err)?.as_blob().map_err(|e| err(e.into()))?;
                add_blob(histograms.entry(key).or_default(), bytes)?;
            }
            for (key, m) in digests.iter_mut() {
                m.rank = histograms.get(key).map(|h| merge::percentile(h, 0.99, &m.totals)).unwrap_or(0);
            }
        }
        OrderBy::Wait => {
            let mut stmt =
                scan(tx, query, &spans, &format!("waits, {KEY_COLUMNS}"), " AND waits <> x''").map_err(err)?;
            let mut rows = stmt.raw_query();
            while let Some(row) = rows.next().map_err(err)? {
                let key = row_key(row, 1).map_err(err)?;
                let bytes = row.get_ref(0).map_err(err)?.as_blob().map_err(|e| err(e.into()))?;
                let waited = blob::decode_waits(bytes)
                    .ok_or(StoreError::Corrupt { what: "waits" })?
                    .iter()
                    .fold(0u64, |a, w| a.saturating_add(w.1));
                if let Some(m) = digests.get_mut(&key) {
                    m.rank = m.rank.saturating_add(waited);
                }
            }
        }
        _ => {}
    }
    let mut ranked: Vec<(RowKey, Merging)> = digests.into_iter().collect();
    ranked.sort_by(|(ka, a), (kb, b)| {
        merge::compare(query.order_by, (ka.digest, &a.totals, a.rank), (kb.digest, &b.totals, b.rank))
            .then_with(|| ka.cmp(kb))
    });
    ranked.truncate(query.limit);
    if lean {
        let rows = lean_details(tx, query, &spans, ranked, histograms, &names)?;
        return Ok(TopPage::all(rows));
    }

    // Step 3: details of the digests that made the cut, in rank order and
    // by chunks, until the answer is full: one read per digest for a short
    // chunk, one scan of the range for a long one (thousands of reads cost
    // seconds). A chunk is sized from the rows answered so far, so what
    // is read but not answered stays near the budget.
    let mut text_stmt = tx.prepare_cached("SELECT text FROM digest_texts WHERE digest = ?1").map_err(err)?;
    let mut blobs_stmt = tx.prepare(&by_row_sql).map_err(err)?;
    let mut sample_stmt = tx.prepare(&sample_sql).map_err(err)?;
    // Each instance keeps its own messages; across instances the newest
    // wins (rows come oldest first, so later ones overwrite).
    let mut messages_stmt = tx
        .prepare_cached(
            "SELECT code, message FROM error_samples WHERE digest = ?1 AND (?2 IS NULL OR instance = ?2)
             ORDER BY last_seen",
        )
        .map_err(err)?;
    let mut page = TopPage::default();
    let mut ranked = ranked.into_iter().peekable();
    while ranked.peek().is_some() {
        if page.is_full() {
            ranked.by_ref().for_each(|_| page.skip());
            break;
        }
        let chunk_len = page.more_rows_fitting().map_or(FIRST_CHUNK, |n| n.clamp(1, DETAILS_CHUNK));
        let chunk: Vec<(RowKey, Merging)> = ranked.by_ref().take(chunk_len).collect();
        let mut scanned: HashMap<RowKey, Details> = HashMap::new();
        if chunk.len() > DETAILS_BY_SCAN {
            for (key, _) in &chunk {
                scanned.insert(key.clone(), Details::default());
            }
            let columns =
                format!("histogram, error_codes, waits, figures, accounts, sample, sample_end, {KEY_COLUMNS}");
            let mut stmt = scan(tx, query, &spans, &columns, "").map_err(err)?;
            let mut rows = stmt.raw_query();
            while let Some(row) = rows.next().map_err(err)? {
                let key = row_key(row, 7).map_err(err)?;
                let Some(details) = scanned.get_mut(&key) else { continue };
                details.add(row, !histograms.contains_key(&key))?;
                let sample = row.get_ref(5).map_err(err)?.as_str().map_err(|e| err(e.into()))?;
                let end: i64 = row.get(6).map_err(err)?;
                if !sample.is_empty() && details.sample.as_ref().is_none_or(|(newest, _)| end > *newest) {
                    details.sample = Some((end, sample.to_string()));
                }
            }
        }
        for (key, m) in chunk {
            if page.is_full() {
                page.skip();
                continue;
            }
            let digest = key.digest;
            let preloaded = histograms.remove(&key);
            let (details, sample) = match scanned.remove(&key) {
                Some(mut details) => {
                    let sample = details.sample.take().map(|(_, text)| text).unwrap_or_default();
                    (details, sample)
                }
                None => {
                    let mut details = Details::default();
                    bind(&mut blobs_stmt, &key).map_err(err)?;
                    let mut rows = blobs_stmt.raw_query();
                    while let Some(row) = rows.next().map_err(err)? {
                        details.add(row, preloaded.is_none())?;
                    }
                    drop(rows);
                    bind(&mut sample_stmt, &key).map_err(err)?;
                    let sample: String = match sample_stmt.raw_query().next().map_err(err)? {
                        Some(row) => row.get(0).map_err(err)?,
                        None => String::new(),
                    };
                    (details, sample)
                }
            };
            let Details { histogram, waits, errors, stats, senders, .. } = details;
            let histogram = preloaded.unwrap_or(histogram);
            let digest_text: String =
                text_stmt.query_row([i(digest)], |r| r.get(0)).optional().map_err(err)?.unwrap_or_default();
            let mut messages: HashMap<u32, String> = HashMap::new();
            if !errors.is_empty() {
                let rows = messages_stmt
                    .query_map(rusqlite::params![i(digest), query.instance], |r| {
                        Ok((r.get::<_, u32>(0)?, r.get::<_, String>(1)?))
                    })
                    .map_err(err)?;
                for row in rows {
                    let (code, message) = row.map_err(err)?;
                    messages.insert(code, message);
                }
            }
            let senders = senders.into_top();
            let row = TopDigest {
                sample,
                waits: waits.into_stats(),
                error_codes: errors.into_counts(|code| messages.remove(&code).unwrap_or_default()),
                stats: Some(stats),
                accounts: senders.accounts,
                clients: senders.clients,
                tags: senders.tags,
                exemplars: senders.exemplars,
                ..merged_digest(key, digest_text, &m, &histogram, &names)
            };
            page.push(row);
        }
    }
    Ok(page)
}

/// Step 3 of a lean `top`: of the digests that made the cut, only their
/// histograms (unless ranking read them), rows examined and CPU, in one
/// scan of the range.
fn lean_details(
    tx: &rusqlite::Transaction<'_>,
    query: &TopQuery,
    spans: &[rollup::Span],
    ranked: Vec<(RowKey, Merging)>,
    mut histograms: HashMap<RowKey, Histogram>,
    names: &[String],
) -> Result<Vec<TopDigest>, StoreError> {
    let err = |e| error("top", e);
    let preloaded = !histograms.is_empty();
    let mut lean: HashMap<RowKey, (Histogram, QueryStats)> =
        ranked.iter().map(|(key, _)| (key.clone(), Default::default())).collect();
    let columns = format!("histogram, rows_examined, cpu_ns, {KEY_COLUMNS}");
    let mut stmt = scan(tx, query, spans, &columns, "").map_err(err)?;
    let mut rows = stmt.raw_query();
    while let Some(row) = rows.next().map_err(err)? {
        let key = row_key(row, 3).map_err(err)?;
        let Some((histogram, stats)) = lean.get_mut(&key) else { continue };
        if !preloaded {
            add_blob(histogram, row.get_ref(0).map_err(err)?.as_blob().map_err(|e| err(e.into()))?)?;
        }
        let figure =
            |n: usize| -> Result<Option<u64>, StoreError> { Ok(row.get::<_, Option<i64>>(n).map_err(err)?.map(u)) };
        let add = |sum: &mut Option<u64>, value: Option<u64>| {
            if let Some(value) = value {
                *sum = Some(sum.unwrap_or(0).saturating_add(value));
            }
        };
        add(&mut stats.rows_examined, figure(1)?);
        add(&mut stats.cpu_ns, figure(2)?);
    }
    drop(rows);
    let mut text_stmt = tx.prepare_cached("SELECT text FROM digest_texts WHERE digest = ?1").map_err(err)?;
    let mut out = Vec::with_capacity(ranked.len());
    for (key, m) in ranked {
        let (scanned, stats) = lean.remove(&key).unwrap_or_default();
        let histogram = histograms.remove(&key).unwrap_or(scanned);
        let digest_text: String =
            text_stmt.query_row([i(key.digest)], |r| r.get(0)).optional().map_err(err)?.unwrap_or_default();
        out.push(TopDigest { stats: Some(stats), ..merged_digest(key, lean_text(digest_text), &m, &histogram, names) });
    }
    Ok(out)
}

/// A digest's answer from its key, text, sums and histogram; what step 3
/// read besides is for the caller to add.
fn merged_digest(key: RowKey, digest_text: String, m: &Merging, histogram: &Histogram, names: &[String]) -> TopDigest {
    let t = &m.totals;
    TopDigest {
        digest: key.digest,
        digest_text,
        schema: key.schema,
        nested: key.nested,
        program: key.program,
        program_kind: key.program_kind,
        parent_digest: key.parent_digest,
        source: key.source,
        count: t.count,
        errors: t.errors,
        sum_ns: t.sum_ns,
        min_ns: t.min_ns,
        max_ns: t.max_ns,
        p50_ns: merge::percentile(histogram, 0.50, t),
        p95_ns: merge::percentile(histogram, 0.95, t),
        p99_ns: merge::percentile(histogram, 0.99, t),
        instances: m.instances.iter().map(|id| names[*id as usize].clone()).collect(),
        estimated_count: if m.sampled { m.estimated } else { 0 },
        histogram: Some(merge::wire_histogram(histogram)),
        ..Default::default()
    }
}

/// A cut this long has its details read in one scan of the range rather
/// than one read per digest.
pub(super) const DETAILS_BY_SCAN: usize = 64;
/// Most digests whose details are read at once (their senders are held
/// until each is answered), and the first read's, before any row's size
/// is known.
const DETAILS_CHUNK: usize = 1_000;
const FIRST_CHUNK: usize = 250;

/// What a digest's rows add up to beyond the scalar sums.
#[derive(Default)]
struct Details {
    histogram: Histogram,
    waits: MergedWaits,
    errors: MergedErrors,
    stats: QueryStats,
    senders: MergedSenders,
    /// The newest sample and the end of its window.
    sample: Option<(i64, String)>,
}

impl Details {
    /// Adds a row whose first five columns are the histogram, error codes,
    /// waits, figures and accounts blobs; its histogram only when asked
    /// (an order by p99 read every histogram already).
    fn add(&mut self, row: &rusqlite::Row<'_>, histogram: bool) -> Result<(), StoreError> {
        let err = |e| error("top", e);
        let blob = |n: usize| -> Result<&[u8], StoreError> {
            row.get_ref(n).map_err(err)?.as_blob().map_err(|e| err(e.into()))
        };
        if histogram {
            add_blob(&mut self.histogram, blob(0)?)?;
        }
        add_error_codes(&mut self.errors, blob(1)?)?;
        add_waits(&mut self.waits, blob(2)?)?;
        let figures = blob(3)?;
        if !figures.is_empty() {
            let row = QueryStats::decode(figures).map_err(|_| StoreError::Corrupt { what: "figures" })?;
            self.stats.merge(&row);
        }
        self.senders.add_stored(blob(4)?).map_err(|_| StoreError::Corrupt { what: "accounts" })
    }
}

/// Every digest row in range of `query` (raw or rolled up, per `spans`),
/// for the steps that read all digests.
fn scan<'t>(
    tx: &'t rusqlite::Transaction<'_>,
    query: &TopQuery,
    spans: &[rollup::Span],
    columns: &str,
    extra: &str,
) -> rusqlite::Result<rusqlite::Statement<'t>> {
    let filters = filters(query, 1);
    let rows = digest_rows::union(spans, &format!("{}{extra}", filters.sql));
    let mut stmt = tx.prepare(&format!("SELECT {columns} FROM {rows}"))?;
    for (n, value) in filters.values.iter().enumerate() {
        stmt.raw_bind_parameter(1 + n, value)?;
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

pub(super) fn instances(tx: &rusqlite::Transaction<'_>) -> rusqlite::Result<Vec<InstanceInfo>> {
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
                coalesce(i.instance, ''), coalesce(i.pid, 0), coalesce(i.last_window_end_unix_ms, 0),
                coalesce(i.container_id, ''), coalesce(i.container, ''),
                coalesce(i.build_id, ''), coalesce(i.server_version, ''),
                CASE WHEN i.untraced_seen_unix_ms > i.last_window_end_unix_ms THEN i.untraced_reason ELSE '' END,
                CASE WHEN i.untraced_seen_unix_ms > i.last_window_end_unix_ms THEN i.untraced_kind ELSE '' END,
                CASE WHEN i.untraced_seen_unix_ms > i.last_window_end_unix_ms THEN i.untraced_since_unix_ms ELSE 0 END,
                coalesce(i.untraced_seen_unix_ms, 0), coalesce(i.server_login, '')
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
            container_id: r.get(8)?,
            container: r.get(9)?,
            build_id: r.get(10)?,
            server_version: r.get(11)?,
            untraced_reason: r.get::<_, Option<String>>(12)?.unwrap_or_default(),
            untraced_kind: r.get::<_, Option<String>>(13)?.unwrap_or_default(),
            untraced_since_unix_ms: r.get::<_, Option<i64>>(14)?.unwrap_or(0),
            untraced_seen_unix_ms: r.get(15)?,
            server_login: r.get(16)?,
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

pub(super) fn locks(tx: &rusqlite::Transaction<'_>, query: &LocksQuery) -> Result<Page<LockWaitRow>, StoreError> {
    let err = |e| error("locks", e);
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
    let mut out = Page::default();
    while let Some(row) = rows.next().map_err(err)? {
        if out.is_full() {
            out.skip();
            continue;
        }
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
            blockers: blob::decode_blockers(&blockers).ok_or(StoreError::Corrupt { what: "lock_waits.blockers" })?,
        };
        out.push(LockWaitRow {
            agent_id: row.get(0).map_err(err)?,
            instance: row.get(1).map_err(err)?,
            wait: Some(wait),
        });
    }
    Ok(out)
}

pub(super) fn totals(tx: &rusqlite::Transaction<'_>, query: &TotalsQuery) -> rusqlite::Result<TotalsResponse> {
    let mut out = TotalsResponse::default();
    let bind = |stmt: &mut rusqlite::Statement<'_>| -> rusqlite::Result<()> {
        stmt.raw_bind_parameter(1, query.since_unix_ms)?;
        if let Some(instance) = &query.instance {
            stmt.raw_bind_parameter(2, instance)?;
        }
        Ok(())
    };
    let mut stmt = tx.prepare(&format!(
        "SELECT statements, dropped_events, unmatched FROM instance_windows WHERE window_end >= ?1
         AND window_end < {}{}",
        query.until_unix_ms,
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
         WHERE w.window_end >= ?1 AND w.window_end < {}{}",
        query.until_unix_ms,
        instance_filter(&query.instance, "w.instance")
    ))?;
    bind(&mut stmt)?;
    let mut rows = stmt.raw_query();
    while let Some(row) = rows.next()? {
        let slot = commands.entry(row.get(0)?).or_default();
        *slot = slot.saturating_add(u(row.get(1)?));
    }
    out.commands = commands.into_iter().map(|(command, count)| CommandCount { command, count }).collect();
    let spans = rollup::plan(query.since_unix_ms, query.until_unix_ms, None);
    let rows = digest_rows::union(&spans, if query.instance.is_some() { "instance = ?1" } else { "1" });
    let mut stmt = tx.prepare(&format!("SELECT count(DISTINCT digest) FROM {rows}"))?;
    if let Some(instance) = &query.instance {
        stmt.raw_bind_parameter(1, instance)?;
    }
    if let Some(row) = stmt.raw_query().next()? {
        out.digest_count = u(row.get(0)?);
    }
    // Gaps belong to agents, not instances: with an instance filter, count
    // the gaps of the agents that served it. A gap without window times
    // is placed at the time it was reported.
    let mut stmt = tx.prepare(&format!(
        "SELECT lost_statements FROM gaps WHERE
             (CASE WHEN last_window_end_unix_ms > 0 THEN last_window_end_unix_ms ELSE received_unix_ms END) >= ?1
             AND (CASE WHEN last_window_end_unix_ms > 0 THEN last_window_end_unix_ms ELSE received_unix_ms END) < {}{}",
        query.until_unix_ms,
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
