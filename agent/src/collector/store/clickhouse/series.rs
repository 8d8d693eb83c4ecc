//! Time series from raw winning rows: one point per step from `since` to
//! `until`, each holding the windows that ended in it, empty steps as
//! zero points; percentiles from the merged histograms (`merge`).
use prost::Message as _;
use sqlbee_common::histogram::Histogram;
use sqlbee_proto::v1::{AgentCost, Bucket, Histogram as WireHistogram, ProbeCost, SeriesPoint};

use super::{
    equals, error,
    http::{Client, quote},
    malformed,
    read::{DIGEST_COLUMNS, add_hist, read_digest_row},
    winners,
};
use crate::collector::store::{
    SeriesOf, SeriesQuery, StoreError,
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

pub(super) fn series(db: &Client, query: &SeriesQuery) -> Result<Vec<SeriesPoint>, StoreError> {
    let (since, until, step) = (query.since_unix_ms, query.until_unix_ms, query.step_ms);
    if step <= 0 || until <= since {
        return Ok(Vec::new());
    }
    let points = usize::try_from((until - since - 1) / step + 1).unwrap_or(usize::MAX);
    let mut steps: Vec<Step> = Vec::new();
    steps.resize_with(points, Step::default);
    let slot = |end: i64| usize::try_from((end - since).div_euclid(step)).ok().filter(|&i| i < points);
    let range = format!("window_end >= {since} AND window_end < {until}");
    let bad = malformed("series");
    let err = |e| error("series", e);
    match query.of {
        SeriesOf::Digest(_) | SeriesOf::Statements => {
            let digest = match query.of {
                SeriesOf::Digest(d) => format!(" AND digest = {d}"),
                _ => String::new(),
            };
            let mut rows = db
                .select(&format!(
                    "SELECT {DIGEST_COLUMNS} FROM digest_windows WHERE {range}{digest}{} AND nested = 0 AND {}",
                    equals(&[("instance", &query.instance), ("schema", &query.schema)]),
                    winners(since, until)
                ))
                .map_err(err)?;
            while !rows.done() {
                let row = read_digest_row(&mut rows).map_err(&bad)?;
                let Some(i) = slot(row.window_end) else { continue };
                steps[i].totals.add(row.count, row.errors, row.sum_ns, row.min_ns, row.max_ns);
                add_hist(&mut steps[i].histogram, &row.hist);
            }
        }
        SeriesOf::Cost => {
            // With an instance, the agents that served it in the range.
            let agents = match &query.instance {
                Some(instance) => format!(
                    " AND agent_id IN (SELECT agent_id FROM instance_windows WHERE instance = {} AND {range})",
                    quote(instance)
                ),
                None => String::new(),
            };
            let mut rows = db
                .select(&format!(
                    "SELECT window_start, window_end, cost FROM agent_windows WHERE {range}{agents} AND {}",
                    winners(since, until)
                ))
                .map_err(err)?;
            while !rows.done() {
                let (start, end) = (rows.i64().map_err(&bad)?, rows.i64().map_err(&bad)?);
                let cost = rows.bytes().map_err(&bad)?;
                let Some(i) = slot(end) else { continue };
                steps[i].windows += 1;
                if !cost.is_empty() {
                    let cost = AgentCost::decode(cost.as_slice()).map_err(|_| StoreError::Corrupt { what: "agent cost" })?;
                    steps[i].agent_cpu_seconds += cost.cpu_cores * ((end - start).max(0) as f64 / 1e3);
                    steps[i].agent_max_rss = steps[i].agent_max_rss.max(cost.rss_bytes);
                }
            }
            let mut rows = db
                .select(&format!(
                    "SELECT window_end, probes FROM instance_windows WHERE {range}{} AND probes != '' AND {}",
                    equals(&[("instance", &query.instance)]),
                    winners(since, until)
                ))
                .map_err(err)?;
            while !rows.done() {
                let end = rows.i64().map_err(&bad)?;
                let probes = rows.bytes().map_err(&bad)?;
                let Some(i) = slot(end) else { continue };
                let p = ProbeCost::decode(probes.as_slice()).map_err(|_| StoreError::Corrupt { what: "probe cost" })?;
                steps[i].probe_cpu_seconds += p.probe_cpu_seconds;
            }
        }
    }
    let step_seconds = step as f64 / 1e3;
    Ok(steps
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
                histogram: (t.count > 0).then(|| WireHistogram { scheme: 1, buckets }),
                agent_cpu_cores: s.agent_cpu_seconds / step_seconds,
                agent_max_rss_bytes: s.agent_max_rss,
                probe_cpu_seconds: s.probe_cpu_seconds,
                windows: s.windows,
            }
        })
        .collect())
}
