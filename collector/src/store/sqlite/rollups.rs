//! Keeps `digest_rollups` up to date as windows arrive: each digest row a
//! batch stores is added to its minute, hour and day bucket in the same
//! transaction, so the rollups never lag the raw windows and a batch
//! stored once is rolled up once. Merges follow `store::merge`: sums
//! saturate, min and max are exact, histograms, error codes, waits and
//! figures add per key.
use std::collections::BTreeMap;

use prost::Message as _;
use rusqlite::{OptionalExtension, params};
use sqlbee_proto::v1::{AgentCost, ProbeCost, QueryStats};

use super::{costs::AgentCosts, i, u};
use crate::store::{blob, merge, rollup, senders::MergedSenders};

/// One digest row as stored raw, blobs encoded as in `digest_windows`.
pub(super) struct Row<'a> {
    pub window_end: i64,
    pub instance: &'a str,
    pub schema: &'a str,
    pub digest: u64,
    pub nested: bool,
    pub program: &'a str,
    pub program_kind: &'a str,
    pub parent_digest: u64,
    pub source: &'a str,
    pub count: u64,
    pub errors: u64,
    pub sum_ns: u64,
    pub min_ns: u64,
    pub max_ns: u64,
    pub estimated_count: u64,
    pub stats: Option<&'a QueryStats>,
    pub histogram: &'a [u8],
    pub error_codes: &'a [u8],
    pub waits: &'a [u8],
    pub accounts: &'a [u8],
    pub sample: &'a str,
}

/// A bucket row read back, to be merged with a new window.
struct Stored {
    count: u64,
    errors: u64,
    sum_ns: u64,
    min_ns: u64,
    max_ns: u64,
    estimated_count: u64,
    histogram: Vec<u8>,
    error_codes: Vec<u8>,
    waits: Vec<u8>,
    figures: Vec<u8>,
    accounts: Vec<u8>,
    sample: String,
    sample_end: i64,
}

/// What went wrong adding a row: SQLite, or a stored blob that does not
/// decode (the row is left as it was and the batch fails).
#[derive(Debug, thiserror::Error)]
pub(super) enum RollupError {
    #[error(transparent)]
    Sqlite(#[from] rusqlite::Error),
    #[error("stored rollup {0} is corrupt")]
    Corrupt(&'static str),
}

const KEY: &str = "level = ?1 AND bucket = ?2 AND instance = ?3 AND schema = ?4 AND digest = ?5 AND nested = ?6
     AND program = ?7 AND program_kind = ?8 AND parent_digest = ?9 AND source = ?10";

pub(super) fn add(tx: &rusqlite::Transaction<'_>, row: &Row<'_>) -> Result<(), RollupError> {
    add_to(tx, row, &rollup::LEVELS)
}

fn add_to(tx: &rusqlite::Transaction<'_>, row: &Row<'_>, levels: &[i64]) -> Result<(), RollupError> {
    let figures = row.stats.map(|s| s.encode_to_vec()).unwrap_or_default();
    for &level in levels {
        let bucket = rollup::bucket(row.window_end, level);
        let key = params![
            level,
            bucket,
            row.instance,
            row.schema,
            i(row.digest),
            row.nested,
            row.program,
            row.program_kind,
            i(row.parent_digest),
            row.source
        ];
        let stored = tx
            .prepare_cached(&format!(
                "SELECT count, errors, sum_ns, min_ns, max_ns, estimated_count, histogram, error_codes, waits,
                        figures, accounts, sample, sample_end
                 FROM digest_rollups WHERE {KEY}"
            ))?
            .query_row(key, |r| {
                Ok(Stored {
                    count: u(r.get(0)?),
                    errors: u(r.get(1)?),
                    sum_ns: u(r.get(2)?),
                    min_ns: u(r.get(3)?),
                    max_ns: u(r.get(4)?),
                    estimated_count: u(r.get(5)?),
                    histogram: r.get(6)?,
                    error_codes: r.get(7)?,
                    waits: r.get(8)?,
                    figures: r.get(9)?,
                    accounts: r.get(10)?,
                    sample: r.get(11)?,
                    sample_end: r.get(12)?,
                })
            })
            .optional()?;
        let merged = match stored {
            None => Stored {
                count: row.count,
                errors: row.errors,
                sum_ns: row.sum_ns,
                min_ns: row.min_ns,
                max_ns: row.max_ns,
                estimated_count: row.estimated_count,
                histogram: row.histogram.to_vec(),
                error_codes: row.error_codes.to_vec(),
                waits: row.waits.to_vec(),
                figures: figures.clone(),
                accounts: row.accounts.to_vec(),
                sample: row.sample.to_string(),
                sample_end: if row.sample.is_empty() { 0 } else { row.window_end },
            },
            Some(stored) => merged(stored, row, &figures)?,
        };
        let stats = if merged.figures.is_empty() {
            QueryStats::default()
        } else {
            QueryStats::decode(merged.figures.as_slice()).map_err(|_| RollupError::Corrupt("figures"))?
        };
        let ranks = super::row::rank_values(Some(&stats));
        super::row::insert_or_replace(
            tx,
            "digest_rollups",
            &super::row::with_ranks(
                &[
                    ("level", &level),
                    ("bucket", &bucket),
                    ("instance", &row.instance),
                    ("schema", &row.schema),
                    ("digest", &i(row.digest)),
                    ("nested", &row.nested),
                    ("program", &row.program),
                    ("program_kind", &row.program_kind),
                    ("parent_digest", &i(row.parent_digest)),
                    ("source", &row.source),
                    ("count", &i(merged.count)),
                    ("errors", &i(merged.errors)),
                    ("sum_ns", &i(merged.sum_ns)),
                    ("min_ns", &i(merged.min_ns)),
                    ("max_ns", &i(merged.max_ns)),
                    ("estimated_count", &i(merged.estimated_count)),
                    ("histogram", &merged.histogram),
                    ("error_codes", &merged.error_codes),
                    ("waits", &merged.waits),
                    ("figures", &merged.figures),
                    ("accounts", &merged.accounts),
                    ("sample", &merged.sample),
                    ("sample_end", &merged.sample_end),
                ],
                &ranks,
            ),
        )?;
    }
    Ok(())
}

fn merged(stored: Stored, row: &Row<'_>, figures: &[u8]) -> Result<Stored, RollupError> {
    let mut totals = merge::DigestTotals::default();
    totals.add(stored.count, stored.errors, stored.sum_ns, stored.min_ns, stored.max_ns);
    totals.add(row.count, row.errors, row.sum_ns, row.min_ns, row.max_ns);
    // An empty row (count 0) carries no latency: keep the other's min/max.
    let (min_ns, max_ns) = if totals.count == 0 { (0, 0) } else { (totals.min_ns, totals.max_ns) };
    // Scaled counts: once any window sampled, the bucket holds the scaled
    // count of every window (an exact window's scaled count is its count).
    let scaled = |estimated: u64, count: u64| if estimated > 0 { estimated } else { count };
    let estimated_count = if stored.estimated_count > 0 || row.estimated_count > 0 {
        scaled(stored.estimated_count, stored.count).saturating_add(scaled(row.estimated_count, row.count))
    } else {
        0
    };
    let histogram = add_pairs(&stored.histogram, row.histogram, blob::decode, "histogram")?;
    let error_codes = add_pairs(&stored.error_codes, row.error_codes, blob::decode_any_order, "error codes")?;
    let mut waits = merge::MergedWaits::default();
    for bytes in [stored.waits.as_slice(), row.waits] {
        for (class, sum_ns, max_ns, statements) in blob::decode_waits(bytes).ok_or(RollupError::Corrupt("waits"))? {
            waits.add(&class, sum_ns, max_ns, statements);
        }
    }
    let waits = waits.into_stats();
    let waits = blob::encode_waits(waits.iter().map(|w| (w.class.as_str(), w.sum_ns, w.max_ns, w.statements)));
    let figures = if stored.figures.is_empty() {
        figures.to_vec()
    } else if figures.is_empty() {
        stored.figures
    } else {
        let mut total = QueryStats::decode(stored.figures.as_slice()).map_err(|_| RollupError::Corrupt("figures"))?;
        total.merge(&QueryStats::decode(figures).map_err(|_| RollupError::Corrupt("figures"))?);
        total.encode_to_vec()
    };
    let accounts = if stored.accounts.is_empty() {
        row.accounts.to_vec()
    } else if row.accounts.is_empty() {
        stored.accounts
    } else {
        let mut senders = MergedSenders::default();
        for bytes in [stored.accounts.as_slice(), row.accounts] {
            senders.add_stored(bytes).map_err(|_| RollupError::Corrupt("accounts"))?;
        }
        senders.into_stored()
    };
    // The newest window's sample, whatever order windows arrive in.
    let (sample, sample_end) = if !row.sample.is_empty() && row.window_end >= stored.sample_end {
        (row.sample.to_string(), row.window_end)
    } else {
        (stored.sample, stored.sample_end)
    };
    Ok(Stored {
        count: totals.count,
        errors: totals.errors,
        sum_ns: totals.sum_ns,
        min_ns,
        max_ns,
        estimated_count,
        histogram,
        error_codes,
        waits,
        figures,
        accounts,
        sample,
        sample_end,
    })
}

/// Two (key, count) blobs added per key, written back increasing.
fn add_pairs(
    a: &[u8],
    b: &[u8],
    decode: fn(&[u8]) -> Option<Vec<(u64, u64)>>,
    what: &'static str,
) -> Result<Vec<u8>, RollupError> {
    let mut sums: BTreeMap<u64, u64> = BTreeMap::new();
    for bytes in [a, b] {
        for (key, count) in decode(bytes).ok_or(RollupError::Corrupt(what))? {
            let slot = sums.entry(key).or_default();
            *slot = slot.saturating_add(count);
        }
    }
    Ok(blob::encode(sums))
}

const INSTANCE_COST_COLUMNS: &str =
    "level, bucket, agent_id, instance, windows, statements, probed_windows, probe_cpu_seconds, estimated";
/// Adds a row to the bucket it lands in. Sums that pass i64 saturate
/// (SQLite turns an overflowing `+` into a real, which `min` clamps).
const INSTANCE_COST_MERGE: &str = "ON CONFLICT DO UPDATE SET windows = windows + excluded.windows,
    statements = min(statements + excluded.statements, 9223372036854775807),
    probed_windows = probed_windows + excluded.probed_windows,
    probe_cpu_seconds = probe_cpu_seconds + excluded.probe_cpu_seconds,
    estimated = min(estimated + excluded.estimated, 9223372036854775807)";
const AGENT_COST_COLUMNS: &str = "level, bucket, agent_id, windows, seconds, cpu_seconds, max_rss_bytes,
    dropped_events, shedding_windows, latest_shedding, latest_end";
const AGENT_COST_MERGE: &str = "ON CONFLICT DO UPDATE SET windows = windows + excluded.windows,
    seconds = seconds + excluded.seconds,
    cpu_seconds = cpu_seconds + excluded.cpu_seconds,
    max_rss_bytes = max(max_rss_bytes, excluded.max_rss_bytes),
    dropped_events = min(dropped_events + excluded.dropped_events, 9223372036854775807),
    shedding_windows = shedding_windows + excluded.shedding_windows,
    latest_shedding = CASE WHEN excluded.latest_end >= latest_end
        THEN excluded.latest_shedding ELSE latest_shedding END,
    latest_end = max(latest_end, excluded.latest_end)";

/// Adds one instance window's statements and probe cost to its buckets.
pub(super) fn add_instance_cost(
    tx: &rusqlite::Transaction<'_>,
    agent_id: &str,
    instance: &str,
    window_end: i64,
    statements: u64,
    probes: Option<&ProbeCost>,
) -> rusqlite::Result<()> {
    let (probed, cpu, estimated) = match probes {
        Some(p) => (1, p.probe_cpu_seconds, merge::probed_statements(statements, p)),
        None => (0, 0.0, 0),
    };
    for level in rollup::LEVELS {
        tx.prepare_cached(&format!(
            "INSERT INTO instance_cost_rollups ({INSTANCE_COST_COLUMNS})
             VALUES (?1, ?2, ?3, ?4, 1, ?5, ?6, ?7, ?8) {INSTANCE_COST_MERGE}"
        ))?
        .execute(params![
            level,
            rollup::bucket(window_end, level),
            agent_id,
            instance,
            i(statements.min(i64::MAX as u64)),
            probed,
            cpu,
            i(estimated.min(i64::MAX as u64))
        ])?;
    }
    Ok(())
}

/// Adds one of an agent's own windows to its buckets.
pub(super) fn add_agent_cost(
    tx: &rusqlite::Transaction<'_>,
    agent_id: &str,
    window_end: i64,
    costs: &AgentCosts,
) -> rusqlite::Result<()> {
    for level in rollup::LEVELS {
        tx.prepare_cached(&format!(
            "INSERT INTO agent_cost_rollups ({AGENT_COST_COLUMNS})
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11) {AGENT_COST_MERGE}"
        ))?
        .execute(params![
            level,
            rollup::bucket(window_end, level),
            agent_id,
            i(costs.windows),
            costs.seconds,
            costs.cpu_seconds,
            i(costs.max_rss_bytes.min(i64::MAX as u64)),
            i(costs.dropped_events.min(i64::MAX as u64)),
            i(costs.shedding_windows),
            costs.latest_shedding,
            costs.latest_end,
        ])?;
    }
    Ok(())
}

/// Rolls up every digest row and cost of a file written before rollups
/// existed, in the upgrade's transaction, so ranges read from rollups
/// still see them.
pub(super) fn backfill(tx: &rusqlite::Transaction<'_>) -> Result<u64, RollupError> {
    // Rebuilt whole, never added to: running it twice cannot double a count.
    tx.execute_batch("DELETE FROM digest_rollups; DELETE FROM instance_cost_rollups; DELETE FROM agent_cost_rollups;")?;
    {
        let mut stmt = tx.prepare(
            "SELECT w.agent_id, w.instance, w.window_end, w.statements, coalesce(c.probes, x'')
             FROM instance_windows w LEFT JOIN instance_costs c ON c.window_id = w.id",
        )?;
        let mut rows = stmt.raw_query();
        while let Some(r) = rows.next()? {
            let probes: Vec<u8> = r.get(4)?;
            let probes = if probes.is_empty() {
                None
            } else {
                Some(ProbeCost::decode(probes.as_slice()).map_err(|_| RollupError::Corrupt("probe cost"))?)
            };
            let (agent, instance): (String, String) = (r.get(0)?, r.get(1)?);
            add_instance_cost(tx, &agent, &instance, r.get(2)?, u(r.get(3)?), probes.as_ref())?;
        }
        let mut stmt = tx.prepare("SELECT agent_id, window_start, window_end, cost FROM agent_windows")?;
        let mut rows = stmt.raw_query();
        while let Some(r) = rows.next()? {
            let cost: Vec<u8> = r.get(3)?;
            if cost.is_empty() {
                continue;
            }
            let cost = AgentCost::decode(cost.as_slice()).map_err(|_| RollupError::Corrupt("agent cost"))?;
            let (agent, start, end): (String, i64, i64) = (r.get(0)?, r.get(1)?, r.get(2)?);
            add_agent_cost(tx, &agent, end, &AgentCosts::of_window(&cost, start, end))?;
        }
    }
    let mut stmt = tx.prepare(
        "SELECT window_end, instance, schema, digest, nested, program, program_kind, parent_digest, source, count,
                errors, sum_ns, min_ns, max_ns, estimated_count, figures, histogram, error_codes, waits, accounts,
                sample
         FROM digest_windows",
    )?;
    let mut rows = stmt.raw_query();
    let mut added = 0;
    while let Some(r) = rows.next()? {
        add(tx, &StoredRow::read(r)?.row(r.get(0)?))?;
        added += 1;
    }
    Ok(added)
}

/// A digest row read back whole, from `digest_windows` or `digest_rollups`
/// with the columns in `backfill`'s order (the first, its end or bucket,
/// is read by the caller).
struct StoredRow {
    instance: String,
    schema: String,
    digest: u64,
    nested: bool,
    program: String,
    program_kind: String,
    parent_digest: u64,
    source: String,
    count: u64,
    errors: u64,
    sum_ns: u64,
    min_ns: u64,
    max_ns: u64,
    estimated_count: u64,
    stats: Option<QueryStats>,
    histogram: Vec<u8>,
    error_codes: Vec<u8>,
    waits: Vec<u8>,
    accounts: Vec<u8>,
    sample: String,
}

impl StoredRow {
    fn read(r: &rusqlite::Row<'_>) -> Result<StoredRow, RollupError> {
        let figures: Vec<u8> = r.get(15)?;
        let stats = if figures.is_empty() {
            None
        } else {
            Some(QueryStats::decode(figures.as_slice()).map_err(|_| RollupError::Corrupt("figures"))?)
        };
        Ok(StoredRow {
            instance: r.get(1)?,
            schema: r.get(2)?,
            digest: u(r.get(3)?),
            nested: r.get(4)?,
            program: r.get(5)?,
            program_kind: r.get(6)?,
            parent_digest: u(r.get(7)?),
            source: r.get(8)?,
            count: u(r.get(9)?),
            errors: u(r.get(10)?),
            sum_ns: u(r.get(11)?),
            min_ns: u(r.get(12)?),
            max_ns: u(r.get(13)?),
            estimated_count: u(r.get(14)?),
            stats,
            histogram: r.get(16)?,
            error_codes: r.get(17)?,
            waits: r.get(18)?,
            accounts: r.get(19)?,
            sample: r.get(20)?,
        })
    }

    fn row(&self, window_end: i64) -> Row<'_> {
        Row {
            window_end,
            instance: &self.instance,
            schema: &self.schema,
            digest: self.digest,
            nested: self.nested,
            program: &self.program,
            program_kind: &self.program_kind,
            parent_digest: self.parent_digest,
            source: &self.source,
            count: self.count,
            errors: self.errors,
            sum_ns: self.sum_ns,
            min_ns: self.min_ns,
            max_ns: self.max_ns,
            estimated_count: self.estimated_count,
            stats: self.stats.as_ref(),
            histogram: &self.histogram,
            error_codes: &self.error_codes,
            waits: &self.waits,
            accounts: &self.accounts,
            sample: &self.sample,
        }
    }
}

/// Builds the day buckets of a file written before they existed from its
/// hour buckets, in the upgrade's transaction. Hours are kept longer than
/// raw windows, so they, not the windows, hold every day still covered.
/// Rebuilt whole, never added to: running it twice cannot double a count.
pub(super) fn days_from_hours(tx: &rusqlite::Transaction<'_>) -> Result<u64, RollupError> {
    let (day, hour) = (rollup::DAY_MS, rollup::HOUR_MS);
    for table in ["digest_rollups", "instance_cost_rollups", "agent_cost_rollups"] {
        tx.execute(&format!("DELETE FROM {table} WHERE level = ?1"), [day])?;
    }
    // The SELECT ends in a WHERE so that SQLite's parser reads the ON
    // CONFLICT as the upsert's, not as a join's constraint.
    let day_of = format!("bucket - ((bucket % {day}) + {day}) % {day}");
    tx.execute_batch(&format!(
        "INSERT INTO instance_cost_rollups ({INSTANCE_COST_COLUMNS})
             SELECT {day}, {day_of}, agent_id, instance, windows, statements, probed_windows, probe_cpu_seconds,
                 estimated
             FROM instance_cost_rollups WHERE level = {hour} {INSTANCE_COST_MERGE};
         INSERT INTO agent_cost_rollups ({AGENT_COST_COLUMNS})
             SELECT {day}, {day_of}, agent_id, windows, seconds, cpu_seconds, max_rss_bytes, dropped_events,
                 shedding_windows, latest_shedding, latest_end
             FROM agent_cost_rollups WHERE level = {hour} {AGENT_COST_MERGE};"
    ))?;
    let mut stmt = tx.prepare(
        "SELECT bucket, instance, schema, digest, nested, program, program_kind, parent_digest, source, count,
                errors, sum_ns, min_ns, max_ns, estimated_count, figures, histogram, error_codes, waits, accounts,
                sample, sample_end
         FROM digest_rollups WHERE level = ?1",
    )?;
    let mut rows = stmt.query([hour])?;
    let mut added = 0;
    while let Some(r) = rows.next()? {
        // The sample keeps its own window's end so the newest still wins;
        // both ends lie in the hour, so in the same day.
        let (bucket, sample_end): (i64, i64) = (r.get(0)?, r.get(21)?);
        add_to(tx, &StoredRow::read(r)?.row(if sample_end > 0 { sample_end } else { bucket }), &[day])?;
        added += 1;
    }
    Ok(added)
}
