//! A digest row as reads take it (raw window or hour rollup alike), and
//! the exact merge of many: shared by `read`, `series` and the rollup pass
//! (`rollups`). Sums, min, max and histograms follow `store::merge`.
use std::collections::BTreeSet;

use prost::Message as _;
use sqlbee_proto::v1::QueryStats;
use sqlbee_vocabulary::histogram::Histogram;

use super::http::{Malformed, Rows};
use crate::store::{
    StoreError,
    merge::{DigestTotals, MergedErrors, MergedWaits},
    senders::MergedSenders,
};

/// A digest row's key in answers: schema, digest and lineage.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(super) struct RowKey {
    pub schema: String,
    pub digest: u64,
    pub nested: bool,
    pub program: String,
    pub program_kind: String,
    pub parent_digest: u64,
    pub source: String,
}

pub(super) fn read_key(r: &mut Rows) -> Result<RowKey, Malformed> {
    Ok(RowKey {
        schema: r.string()?,
        digest: r.u64()?,
        nested: r.u8()? != 0,
        program: r.string()?,
        program_kind: r.string()?,
        parent_digest: r.u64()?,
        source: r.string()?,
    })
}

/// Everything one digest row brings to a merge.
pub(super) struct DigestRow {
    pub instance: String,
    pub key: RowKey,
    pub window_end: i64,
    pub count: u64,
    pub errors: u64,
    pub sum_ns: u64,
    pub min_ns: u64,
    pub max_ns: u64,
    pub estimated: u64,
    pub hist: Vec<(u32, u64)>,
}

/// The columns `read_digest_row` reads, in its order.
pub(super) const DIGEST_COLUMNS: &str = "instance, schema, digest, nested, program, program_kind, parent_digest,
    source, window_end, count, errors, sum_ns, min_ns, max_ns, estimated_count, hist_index, hist_count";

pub(super) fn read_digest_row(r: &mut Rows) -> Result<DigestRow, Malformed> {
    let instance = r.string()?;
    let key = read_key(r)?;
    let window_end = r.i64()?;
    let (count, errors, sum_ns, min_ns, max_ns, estimated) =
        (r.u64()?, r.u64()?, r.u64()?, r.u64()?, r.u64()?, r.u64()?);
    let index = r.array(|r| r.u32())?;
    let counts = r.array(|r| r.u64())?;
    if index.len() != counts.len() {
        return Err(Malformed { at: 0 });
    }
    let hist = index.into_iter().zip(counts).collect();
    Ok(DigestRow { instance, key, window_end, count, errors, sum_ns, min_ns, max_ns, estimated, hist })
}

pub(super) fn add_hist(h: &mut Histogram, buckets: &[(u32, u64)]) {
    for &(index, count) in buckets {
        h.add_bucket(index as usize, count);
    }
}

/// Per key while merging.
#[derive(Default)]
pub(super) struct Merging {
    pub totals: DigestTotals,
    pub instances: BTreeSet<String>,
    pub rank: u64,
    /// Scaled counts, each window's count where it was exact.
    pub estimated: u64,
    pub sampled: bool,
    pub truncated: u64,
    pub histogram: Histogram,
    pub waits: MergedWaits,
    pub errors: MergedErrors,
    pub stats: QueryStats,
    pub senders: MergedSenders,
    /// The newest window's non-empty sample.
    pub sample: Option<(i64, String)>,
    /// The newest window's end.
    pub newest_end: i64,
}

/// The columns after `DIGEST_COLUMNS` that `read_full_row` reads, in its
/// order: all a digest row brings to a merge. `sample_end` is the end of
/// the window the sample came from (a raw row's own end).
pub(super) const MERGE_COLUMNS: &str = "truncated, error_code, error_count, wait_class, wait_sum_ns, wait_max_ns,
    wait_statements, figures, accounts, sample, sample_end";

/// A digest row with everything a merge takes.
pub(super) struct FullRow {
    pub row: DigestRow,
    pub truncated: u64,
    pub errors: Vec<(u32, u64)>,
    pub waits: Vec<(String, u64, u64, u64)>,
    pub figures: Vec<u8>,
    pub accounts: Vec<u8>,
    pub sample: String,
    pub sample_end: i64,
}

/// Reads `DIGEST_COLUMNS` then `MERGE_COLUMNS`.
pub(super) fn read_full_row(rows: &mut Rows, bad: &impl Fn(Malformed) -> StoreError) -> Result<FullRow, StoreError> {
    let row = read_digest_row(rows).map_err(bad)?;
    let truncated = rows.u64().map_err(bad)?;
    let codes = rows.array(|r| r.u32()).map_err(bad)?;
    let code_counts = rows.array(|r| r.u64()).map_err(bad)?;
    let classes = rows.array(|r| r.string()).map_err(bad)?;
    let wait_sums = rows.array(|r| r.u64()).map_err(bad)?;
    let wait_maxes = rows.array(|r| r.u64()).map_err(bad)?;
    let wait_statements = rows.array(|r| r.u64()).map_err(bad)?;
    let figures = rows.bytes().map_err(bad)?;
    let accounts = rows.bytes().map_err(bad)?;
    let sample = rows.string().map_err(bad)?;
    let sample_end = rows.i64().map_err(bad)?;
    if codes.len() != code_counts.len() {
        return Err(StoreError::Corrupt { what: "error codes" });
    }
    if [wait_sums.len(), wait_maxes.len(), wait_statements.len()].iter().any(|&n| n != classes.len()) {
        return Err(StoreError::Corrupt { what: "waits" });
    }
    let errors = codes.into_iter().zip(code_counts).collect();
    let waits = classes
        .into_iter()
        .enumerate()
        .map(|(n, class)| (class, wait_sums[n], wait_maxes[n], wait_statements[n]))
        .collect();
    Ok(FullRow { row, truncated, errors, waits, figures, accounts, sample, sample_end })
}

impl Merging {
    /// Adds one row: a raw window or a rollup alike.
    pub(super) fn add(&mut self, full: FullRow) -> Result<(), StoreError> {
        let row = full.row;
        // Rows come ordered by instance: the newest member is the one to
        // check first.
        if self.instances.last() != Some(&row.instance) && !self.instances.contains(&row.instance) {
            self.instances.insert(row.instance);
        }
        self.sampled |= row.estimated > 0;
        self.estimated = self.estimated.saturating_add(if row.estimated > 0 { row.estimated } else { row.count });
        self.truncated = self.truncated.saturating_add(full.truncated);
        self.totals.add(row.count, row.errors, row.sum_ns, row.min_ns, row.max_ns);
        add_hist(&mut self.histogram, &row.hist);
        for (code, count) in full.errors {
            self.errors.add(code, count);
        }
        for (class, sum_ns, max_ns, statements) in &full.waits {
            self.waits.add(class, *sum_ns, *max_ns, *statements);
        }
        if !full.figures.is_empty() {
            let row =
                QueryStats::decode(full.figures.as_slice()).map_err(|_| StoreError::Corrupt { what: "figures" })?;
            self.stats.merge(&row);
        }
        self.senders.add_stored(&full.accounts).map_err(|_| StoreError::Corrupt { what: "accounts" })?;
        if !full.sample.is_empty() && self.sample.as_ref().is_none_or(|(end, _)| full.sample_end > *end) {
            self.sample = Some((full.sample_end, full.sample));
        }
        self.newest_end = self.newest_end.max(row.window_end);
        Ok(())
    }
}
