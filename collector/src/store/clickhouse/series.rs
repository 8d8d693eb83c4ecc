//! Time series from winning rows and hour rollups: one point per step from `since` to
//! `until`, each holding the windows that ended in it, empty steps as
//! zero points; percentiles from the merged histograms (`merge`).
use std::collections::BTreeMap;

use prost::Message as _;
use sqlbee_proto::v1::{Bucket, DigestSeries, Histogram as WireHistogram, InstanceSeries, ProbeCost, SeriesPoint};
use sqlbee_vocabulary::histogram::Histogram;

use super::{
    costs,
    digest_rows::{DIGEST_COLUMNS, add_hist, read_digest_row},
    equals, error,
    http::{Client, quote},
    malformed,
    rollups::{self, Table},
};
use crate::store::{
    SeriesOf, SeriesQuery, SeriesSplit, SplitKey, StoreError,
    merge::{self, DigestTotals},
};

#[derive(Default)]
struct Step {
    totals: DigestTotals,
    histogram: Histogram,
    agent_cpu_seconds: f64,
    agent_max_rss: u64,
    probe_cpu_seconds: f64,
    windows: u64,
}

/// How many points `query` has; 0 for an empty range.
fn point_count(query: &SeriesQuery) -> usize {
    let (since, until, step) = (query.since_unix_ms, query.until_unix_ms, query.step_ms);
    if step <= 0 || until <= since {
        return 0;
    }
    usize::try_from((until - since - 1) / step + 1).unwrap_or(usize::MAX)
}

fn empty_steps(points: usize) -> Vec<Step> {
    let mut steps: Vec<Step> = Vec::new();
    steps.resize_with(points, Step::default);
    steps
}

pub(super) fn series(db: &Client, query: &SeriesQuery) -> Result<Vec<SeriesPoint>, StoreError> {
    let points = point_count(query);
    if points == 0 {
        return Ok(Vec::new());
    }
    let steps = match query.of {
        SeriesOf::Digest(_) | SeriesOf::Statements => statements(db, query, SeriesSplit::Whole)?
            .pop_first()
            .map_or_else(|| empty_steps(points), |(_, steps)| steps),
        SeriesOf::Cost => costs(db, query)?,
    };
    Ok(finish(query, steps))
}

/// Each instance's statement or digest series; cost series are not split
/// (the query API refuses to ask).
pub(super) fn by_instance(db: &Client, query: &SeriesQuery) -> Result<Vec<InstanceSeries>, StoreError> {
    if point_count(query) == 0 || matches!(query.of, SeriesOf::Cost) {
        return Ok(Vec::new());
    }
    Ok(statements(db, query, SeriesSplit::ByInstance)?
        .into_iter()
        .map(|(key, steps)| InstanceSeries { instance: key.instance, points: finish(query, steps) })
        .collect())
}

/// Each (digest, schema)'s statement series among `digests`.
pub(super) fn by_digest(db: &Client, query: &SeriesQuery, digests: &[u64]) -> Result<Vec<DigestSeries>, StoreError> {
    if point_count(query) == 0 || query.of != SeriesOf::Statements || digests.is_empty() {
        return Ok(Vec::new());
    }
    Ok(statements(db, query, SeriesSplit::ByDigest(digests))?
        .into_iter()
        .map(|(key, steps)| DigestSeries { digest: key.digest, schema: key.schema, points: finish(query, steps) })
        .collect())
}

/// The steps of `query`'s digest rows, one set per key of `split` (one
/// under an empty key when whole); none without a row in the range.
fn statements(
    db: &Client,
    query: &SeriesQuery,
    split: SeriesSplit<'_>,
) -> Result<BTreeMap<SplitKey, Vec<Step>>, StoreError> {
    let (since, until, step) = (query.since_unix_ms, query.until_unix_ms, query.step_ms);
    let points = point_count(query);
    let slot = |end: i64| usize::try_from((end - since).div_euclid(step)).ok().filter(|&i| i < points);
    // Buckets that divide the step answer for their part of it.
    let sources = rollups::sources(db, since, until, Some(step), "series")?;
    let bad = malformed("series");
    let digest = match (query.of, split) {
        (SeriesOf::Digest(d), _) => format!(" AND digest = {d}"),
        (_, SeriesSplit::ByDigest(digests)) => {
            format!(" AND digest IN ({})", digests.iter().map(u64::to_string).collect::<Vec<_>>().join(", "))
        }
        _ => String::new(),
    };
    let filters =
        format!("{digest}{} AND nested = 0", equals(&[("instance", &query.instance), ("schema", &query.schema)]));
    let mut rows =
        db.select(&sources.union(Table::Digests, DIGEST_COLUMNS, &filters)).map_err(|e| error("series", e))?;
    let mut by_key: BTreeMap<SplitKey, Vec<Step>> = BTreeMap::new();
    while !rows.done() {
        let row = read_digest_row(&mut rows).map_err(&bad)?;
        let Some(i) = slot(row.window_end) else { continue };
        let key = match split {
            SeriesSplit::Whole => SplitKey::default(),
            SeriesSplit::ByInstance => SplitKey { instance: row.instance, ..SplitKey::default() },
            SeriesSplit::ByDigest(_) => {
                SplitKey { digest: row.key.digest, schema: row.key.schema, ..SplitKey::default() }
            }
        };
        let steps = by_key.entry(key).or_insert_with(|| empty_steps(points));
        steps[i].totals.add(row.count, row.errors, row.sum_ns, row.min_ns, row.max_ns);
        add_hist(&mut steps[i].histogram, &row.hist);
    }
    Ok(by_key)
}

/// The steps of a cost series.
fn costs(db: &Client, query: &SeriesQuery) -> Result<Vec<Step>, StoreError> {
    let (since, until, step) = (query.since_unix_ms, query.until_unix_ms, query.step_ms);
    let points = point_count(query);
    let mut steps = empty_steps(points);
    let slot = |end: i64| usize::try_from((end - since).div_euclid(step)).ok().filter(|&i| i < points);
    let sources = rollups::sources(db, since, until, Some(step), "series")?;
    let bad = malformed("series");
    let err = |e| error("series", e);
    // With an instance, the agents that served it in the range.
    let agents = match &query.instance {
        Some(instance) => format!(
            " AND agent_id IN (SELECT agent_id FROM instance_windows
                 WHERE instance = {} AND window_end >= {since} AND window_end < {until})",
            quote(instance)
        ),
        None => String::new(),
    };
    let mut rows =
        db.select(&sources.union_of(Table::Agents, costs::AGENT_RAW, costs::AGENT_ROLLUP, &agents)).map_err(err)?;
    while !rows.done() {
        let row = costs::read_agent_row(&mut rows)?;
        let Some(i) = slot(row.end) else { continue };
        steps[i].windows += row.rolled.as_ref().map_or(1, |r| r.windows + r.costless_windows);
        if let Some(cost) = &row.cost {
            steps[i].agent_cpu_seconds += row.cpu_seconds(cost);
            steps[i].agent_max_rss = steps[i].agent_max_rss.max(cost.rss_bytes);
        }
    }
    let mut rows = db
        .select(&sources.union(
            Table::Instances,
            "window_end, probes",
            &format!("{} AND probes != ''", equals(&[("instance", &query.instance)])),
        ))
        .map_err(err)?;
    while !rows.done() {
        let end = rows.i64().map_err(&bad)?;
        let probes = rows.bytes().map_err(&bad)?;
        let Some(i) = slot(end) else { continue };
        let p = ProbeCost::decode(probes.as_slice()).map_err(|_| StoreError::Corrupt { what: "probe cost" })?;
        steps[i].probe_cpu_seconds += p.probe_cpu_seconds;
    }
    Ok(steps)
}

/// Points from steps: percentiles from the merged histograms, cores from
/// CPU seconds over the step.
fn finish(query: &SeriesQuery, steps: Vec<Step>) -> Vec<SeriesPoint> {
    let (since, until, step) = (query.since_unix_ms, query.until_unix_ms, query.step_ms);
    let step_seconds = step as f64 / 1e3;
    steps
        .into_iter()
        .enumerate()
        .map(|(i, s)| {
            let start = since + i as i64 * step;
            let t = &s.totals;
            let buckets: Vec<Bucket> =
                s.histogram.buckets().map(|(index, count)| Bucket { index: index as u32, count }).collect();
            SeriesPoint {
                start_unix_ms: start,
                end_unix_ms: start.saturating_add(step).min(until),
                count: t.count,
                errors: t.errors,
                sum_ns: t.sum_ns,
                p50_ns: merge::percentile(&s.histogram, 0.50, t),
                p95_ns: merge::percentile(&s.histogram, 0.95, t),
                p99_ns: merge::percentile(&s.histogram, 0.99, t),
                max_ns: if t.count > 0 { t.max_ns } else { 0 },
                histogram: (t.count > 0).then_some(WireHistogram { scheme: 1, buckets }),
                agent_cpu_cores: s.agent_cpu_seconds / step_seconds,
                agent_max_rss_bytes: s.agent_max_rss,
                probe_cpu_seconds: s.probe_cpu_seconds,
                windows: s.windows,
            }
        })
        .collect()
}
