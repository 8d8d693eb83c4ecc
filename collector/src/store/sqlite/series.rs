//! Time series: one point per step, each from the windows that ended in
//! it. Digest and statement series read raw windows and rollup buckets
//! through `digest_rows` with the levels that divide the step, so no
//! bucket straddles two points; cost series read the agents' windows.
use std::collections::BTreeMap;

use prost::Message as _;
use sqlbee_proto::v1::{
    AgentCost, Bucket, DigestSeries, Histogram as WireHistogram, InstanceSeries, ProbeCost, SeriesPoint,
};
use sqlbee_vocabulary::histogram::Histogram;

use super::{digest_rows, error, i, u};
use crate::store::{SeriesOf, SeriesQuery, SeriesSplit, SplitKey, StoreError, blob, merge, rollup};

/// The points of `query`, empty, with their times set.
fn empty_points(query: &SeriesQuery) -> Vec<SeriesPoint> {
    let step = query.step_ms.max(1);
    let mut out = Vec::new();
    let mut start = query.since_unix_ms;
    while start < query.until_unix_ms {
        let end = start.saturating_add(step).min(query.until_unix_ms);
        out.push(SeriesPoint { start_unix_ms: start, end_unix_ms: end, ..Default::default() });
        start = end;
    }
    out
}

/// The point a window ending at `window_end` belongs to.
fn point_of(query: &SeriesQuery, window_end: i64, points: usize) -> Option<usize> {
    if window_end < query.since_unix_ms || window_end >= query.until_unix_ms {
        return None;
    }
    let index = ((window_end - query.since_unix_ms) / query.step_ms.max(1)) as usize;
    (index < points).then_some(index)
}

pub(super) fn series(tx: &rusqlite::Transaction<'_>, query: &SeriesQuery) -> Result<Vec<SeriesPoint>, StoreError> {
    match query.of {
        SeriesOf::Digest(_) | SeriesOf::Statements => Ok(statements(tx, query, SeriesSplit::Whole)?
            .pop_first()
            .map_or_else(|| empty_points(query), |(_, steps)| finish(query, steps))),
        SeriesOf::Cost => costs(tx, query),
    }
}

/// Each instance's statement or digest series; cost series are not split
/// (the query API refuses to ask).
pub(super) fn by_instance(
    tx: &rusqlite::Transaction<'_>,
    query: &SeriesQuery,
) -> Result<Vec<InstanceSeries>, StoreError> {
    if matches!(query.of, SeriesOf::Cost) {
        return Ok(Vec::new());
    }
    Ok(statements(tx, query, SeriesSplit::ByInstance)?
        .into_iter()
        .map(|(key, steps)| InstanceSeries { instance: key.instance, points: finish(query, steps) })
        .collect())
}

/// Each (digest, schema)'s statement series among `digests`.
pub(super) fn by_digest(
    tx: &rusqlite::Transaction<'_>,
    query: &SeriesQuery,
    digests: &[u64],
) -> Result<Vec<DigestSeries>, StoreError> {
    if query.of != SeriesOf::Statements || digests.is_empty() {
        return Ok(Vec::new());
    }
    Ok(statements(tx, query, SeriesSplit::ByDigest(digests))?
        .into_iter()
        .map(|(key, steps)| DigestSeries { digest: key.digest, schema: key.schema, points: finish(query, steps) })
        .collect())
}

type Steps = Vec<(merge::DigestTotals, Histogram)>;

/// The steps of `query`, one set per key of `split` (one under an empty
/// key when whole); none without a window in the range.
fn statements(
    tx: &rusqlite::Transaction<'_>,
    query: &SeriesQuery,
    split: SeriesSplit<'_>,
) -> Result<BTreeMap<SplitKey, Steps>, StoreError> {
    let err = |e| error("series", e);
    let points = empty_points(query).len();
    let mut by_key: BTreeMap<SplitKey, Steps> = BTreeMap::new();
    // Client statements: what a program runs is inside its caller's time.
    let mut condition = String::from("nested = 0");
    let mut values: Vec<rusqlite::types::Value> = Vec::new();
    let mut bind = |column: &str, value: rusqlite::types::Value, condition: &mut String| {
        values.push(value);
        condition.push_str(&format!(" AND {column} = ?{}", values.len()));
    };
    if let SeriesOf::Digest(digest) = query.of {
        bind("digest", i(digest).into(), &mut condition);
    }
    if let Some(instance) = &query.instance {
        bind("instance", instance.clone().into(), &mut condition);
    }
    if let Some(schema) = &query.schema {
        bind("schema", schema.clone().into(), &mut condition);
    }
    if let SeriesSplit::ByDigest(digests) = split {
        let mut any = Vec::new();
        for &digest in digests {
            values.push(i(digest).into());
            any.push(format!("?{}", values.len()));
        }
        condition.push_str(&format!(" AND digest IN ({})", any.join(", ")));
    }
    let spans = rollup::plan(query.since_unix_ms, query.until_unix_ms, Some(query.step_ms));
    let rows = digest_rows::union(&spans, &condition);
    let mut stmt = tx
        .prepare(&format!(
            "SELECT window_end, count, errors, sum_ns, min_ns, max_ns, histogram, instance, digest, schema FROM {rows}"
        ))
        .map_err(err)?;
    for (n, value) in values.iter().enumerate() {
        stmt.raw_bind_parameter(n + 1, value).map_err(err)?;
    }
    let mut rows = stmt.raw_query();
    while let Some(row) = rows.next().map_err(err)? {
        let Some(index) = point_of(query, row.get(0).map_err(err)?, points) else { continue };
        let key = match split {
            SeriesSplit::Whole => SplitKey::default(),
            SeriesSplit::ByInstance => SplitKey { instance: row.get(7).map_err(err)?, ..SplitKey::default() },
            SeriesSplit::ByDigest(_) => SplitKey {
                digest: u(row.get(8).map_err(err)?),
                schema: row.get(9).map_err(err)?,
                ..SplitKey::default()
            },
        };
        let steps = by_key.entry(key).or_insert_with(|| vec![Default::default(); points]);
        let (totals, histogram) = &mut steps[index];
        totals.add(
            u(row.get(1).map_err(err)?),
            u(row.get(2).map_err(err)?),
            u(row.get(3).map_err(err)?),
            u(row.get(4).map_err(err)?),
            u(row.get(5).map_err(err)?),
        );
        let bytes = row.get_ref(6).map_err(err)?.as_blob().map_err(|e| err(e.into()))?;
        for (bucket, count) in blob::decode(bytes).ok_or(StoreError::Corrupt { what: "histogram" })? {
            histogram.add_bucket(usize::try_from(bucket).unwrap_or(usize::MAX), count);
        }
    }
    Ok(by_key)
}

/// Points with the figures of their steps, percentiles from the merged
/// histograms.
fn finish(query: &SeriesQuery, steps: Steps) -> Vec<SeriesPoint> {
    let mut points = empty_points(query);
    for (point, (totals, histogram)) in points.iter_mut().zip(steps) {
        point.count = totals.count;
        point.errors = totals.errors;
        point.sum_ns = totals.sum_ns;
        point.max_ns = if totals.count > 0 { totals.max_ns } else { 0 };
        point.p50_ns = merge::percentile(&histogram, 0.50, &totals);
        point.p95_ns = merge::percentile(&histogram, 0.95, &totals);
        point.p99_ns = merge::percentile(&histogram, 0.99, &totals);
        if totals.count > 0 {
            point.histogram = Some(WireHistogram {
                scheme: sqlbee_vocabulary::histogram::SCHEME,
                buckets: histogram.buckets().map(|(index, count)| Bucket { index: index as u32, count }).collect(),
            });
        }
    }
    points
}

/// The agents' cores summed over agents and averaged over each step, their
/// largest memory, and what the probes cost the servers they watch.
fn costs(tx: &rusqlite::Transaction<'_>, query: &SeriesQuery) -> Result<Vec<SeriesPoint>, StoreError> {
    let err = |e| error("series", e);
    let mut points = empty_points(query);
    let mut cpu_seconds = vec![0f64; points.len()];
    // With an instance filter, the agents that watched it.
    let agents = if query.instance.is_some() {
        " AND agent_id IN (SELECT agent_id FROM agent_instances WHERE instance = ?3)"
    } else {
        ""
    };
    let mut stmt = tx
        .prepare(&format!(
            "SELECT window_start, window_end, cost FROM agent_windows
             WHERE window_end >= ?1 AND window_end < ?2{agents}"
        ))
        .map_err(err)?;
    stmt.raw_bind_parameter(1, query.since_unix_ms).map_err(err)?;
    stmt.raw_bind_parameter(2, query.until_unix_ms).map_err(err)?;
    if let Some(instance) = &query.instance {
        stmt.raw_bind_parameter(3, instance).map_err(err)?;
    }
    let mut rows = stmt.raw_query();
    while let Some(row) = rows.next().map_err(err)? {
        let (start, end): (i64, i64) = (row.get(0).map_err(err)?, row.get(1).map_err(err)?);
        let Some(index) = point_of(query, end, points.len()) else { continue };
        let bytes = row.get_ref(2).map_err(err)?.as_blob().map_err(|e| err(e.into()))?;
        if bytes.is_empty() {
            continue;
        }
        let cost = AgentCost::decode(bytes).map_err(|_| StoreError::Corrupt { what: "agent cost" })?;
        let point = &mut points[index];
        point.windows += 1;
        point.agent_max_rss_bytes = point.agent_max_rss_bytes.max(cost.rss_bytes);
        cpu_seconds[index] += cost.cpu_cores * (end - start).max(0) as f64 / 1e3;
    }
    drop(rows);
    let mut stmt = tx
        .prepare(&format!(
            "SELECT w.window_end, c.probes FROM instance_windows w JOIN instance_costs c ON c.window_id = w.id
             WHERE w.window_end >= ?1 AND w.window_end < ?2{}",
            if query.instance.is_some() { " AND w.instance = ?3" } else { "" }
        ))
        .map_err(err)?;
    stmt.raw_bind_parameter(1, query.since_unix_ms).map_err(err)?;
    stmt.raw_bind_parameter(2, query.until_unix_ms).map_err(err)?;
    if let Some(instance) = &query.instance {
        stmt.raw_bind_parameter(3, instance).map_err(err)?;
    }
    let mut rows = stmt.raw_query();
    while let Some(row) = rows.next().map_err(err)? {
        let Some(index) = point_of(query, row.get(0).map_err(err)?, points.len()) else { continue };
        let bytes = row.get_ref(1).map_err(err)?.as_blob().map_err(|e| err(e.into()))?;
        if bytes.is_empty() {
            continue;
        }
        let probes = ProbeCost::decode(bytes).map_err(|_| StoreError::Corrupt { what: "probe cost" })?;
        points[index].probe_cpu_seconds += probes.probe_cpu_seconds;
    }
    for (point, seconds) in points.iter_mut().zip(cpu_seconds) {
        let length = (point.end_unix_ms - point.start_unix_ms) as f64 / 1e3;
        if length > 0.0 {
            point.agent_cpu_cores = seconds / length;
        }
    }
    Ok(points)
}
