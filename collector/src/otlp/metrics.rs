//! One instance's step as OTLP metrics, in OpenTelemetry's database
//! conventions: `db.client.operation.duration` (seconds) per digest and
//! schema, with `db.system.name`, `db.namespace`, `db.operation.name`,
//! `db.collection.name` (when the digest touches one table) and
//! `db.query.summary`, beside sqlbee's own counts, errors, rows examined
//! and CPU. Every point is a delta over the step.
//!
//! The histogram carries sqlbee's buckets as they are: each bucket's
//! upper bound (inclusive, as OTLP's are) becomes an explicit bound, from
//! the lowest bucket that holds a statement to the highest, so nothing is
//! re-binned and percentiles read from it are `sqlbee top`'s.
//!
//! Cardinality is bounded: the `max_digests` digests that took the most
//! time keep their own points; the rest of the step is one point whose
//! `sqlbee.digest` is `other`, its histogram their buckets added up.
use std::collections::{BTreeMap, HashMap};

use sqlbee_figures::histogram::bucket_high;
use sqlbee_proto::v1::TopDigest;

use super::{
    resource::{Instance, resource, scope},
    wire::{
        DELTA, Histogram, HistogramDataPoint, KeyValue, Metric, MetricData, NumberDataPoint, NumberValue,
        ResourceMetrics, ScopeMetrics, Sum,
    },
};
use crate::store::DigestTables;

/// The digest of the point that holds the digests past the limit.
pub const OTHER: &str = "other";

pub struct Step {
    pub since_unix_ms: i64,
    pub until_unix_ms: i64,
}

pub struct Shape {
    pub max_digests: usize,
    /// Also the redacted digest text, as `db.query.text`.
    pub query_text: bool,
}

/// What one point stands for.
struct Row {
    attributes: Vec<KeyValue>,
    count: u64,
    errors: u64,
    sum_ns: u64,
    min_ns: u64,
    max_ns: u64,
    buckets: BTreeMap<u32, u64>,
    rows_examined: Option<u64>,
    cpu_ns: Option<u64>,
}

impl Row {
    fn empty(attributes: Vec<KeyValue>) -> Row {
        Row {
            attributes,
            count: 0,
            errors: 0,
            sum_ns: 0,
            min_ns: u64::MAX,
            max_ns: 0,
            buckets: BTreeMap::new(),
            rows_examined: None,
            cpu_ns: None,
        }
    }
}

/// The instance's resource with its points, or None when the step holds
/// no statement of it. `digests` come busiest first (`OrderBy::Total`).
pub fn instance_metrics(
    instance: &Instance<'_>,
    step: &Step,
    digests: &[TopDigest],
    tables: &HashMap<(u64, String), DigestTables>,
    shape: &Shape,
) -> Option<ResourceMetrics> {
    if digests.is_empty() {
        return None;
    }
    let mut rows: Vec<Row> = Vec::new();
    let mut other: Option<Row> = None;
    for (rank, d) in digests.iter().enumerate() {
        if rank < shape.max_digests {
            rows.push(own_row(instance, d, tables.get(&(d.digest, d.schema.clone())), shape));
            continue;
        }
        let o = other.get_or_insert_with(|| {
            Row::empty(vec![
                KeyValue::string("db.system.name", instance.system),
                KeyValue::string("db.query.summary", OTHER),
                KeyValue::string("sqlbee.digest", OTHER),
            ])
        });
        add(o, d);
    }
    rows.extend(other);
    let (since, until) = (nanos(step.since_unix_ms), nanos(step.until_unix_ms));
    let duration = Histogram {
        aggregation_temporality: DELTA,
        data_points: rows
            .iter()
            .map(|r| {
                let (explicit_bounds, bucket_counts) = bounds_and_counts(&r.buckets);
                HistogramDataPoint {
                    attributes: r.attributes.clone(),
                    start_time_unix_nano: since,
                    time_unix_nano: until,
                    count: bucket_counts.iter().sum(),
                    sum: Some(seconds(r.sum_ns)),
                    bucket_counts,
                    explicit_bounds,
                    min: (r.count > 0).then(|| seconds(r.min_ns)),
                    max: (r.count > 0).then(|| seconds(r.max_ns)),
                }
            })
            .collect(),
    };
    let sum = |name: &str, description: &str, unit: &str, value: &dyn Fn(&Row) -> Option<NumberValue>| {
        let data_points: Vec<NumberDataPoint> = rows
            .iter()
            .filter_map(|r| {
                value(r).map(|v| NumberDataPoint {
                    attributes: r.attributes.clone(),
                    start_time_unix_nano: since,
                    time_unix_nano: until,
                    value: Some(v),
                })
            })
            .collect();
        (!data_points.is_empty()).then(|| Metric {
            name: name.into(),
            description: description.into(),
            unit: unit.into(),
            data: Some(MetricData::Sum(Sum { data_points, aggregation_temporality: DELTA, is_monotonic: true })),
        })
    };
    let int = |v: u64| NumberValue::AsInt(i64::try_from(v).unwrap_or(i64::MAX));
    let mut metrics = vec![Metric {
        name: "db.client.operation.duration".into(),
        description: "Time the server took per statement, as sqlbee timed it from the kernel.".into(),
        unit: "s".into(),
        data: Some(MetricData::Histogram(duration)),
    }];
    metrics.extend(
        [
            sum("sqlbee.statement.count", "Statements that ended in the interval.", "{statement}", &|r| {
                Some(int(r.count))
            }),
            sum("sqlbee.statement.errors", "Statements that ended with an error.", "{statement}", &|r| {
                Some(int(r.errors))
            }),
            sum("sqlbee.statement.rows_examined", "Rows the statements read in the storage engines.", "{row}", &|r| {
                r.rows_examined.map(int)
            }),
            sum("sqlbee.statement.cpu_time", "On-CPU time of the statements' threads.", "s", &|r| {
                r.cpu_ns.map(|ns| NumberValue::AsDouble(seconds(ns)))
            }),
        ]
        .into_iter()
        .flatten(),
    );
    Some(ResourceMetrics {
        resource: Some(resource(instance)),
        scope_metrics: vec![ScopeMetrics { scope: Some(scope()), metrics, schema_url: String::new() }],
        schema_url: String::new(),
    })
}

fn own_row(instance: &Instance<'_>, d: &TopDigest, tables: Option<&DigestTables>, shape: &Shape) -> Row {
    let operation =
        tables.map(|t| t.kind.clone()).filter(|k| !k.is_empty()).unwrap_or_else(|| first_word(&d.digest_text));
    let mut attributes = vec![KeyValue::string("db.system.name", instance.system)];
    if !d.schema.is_empty() {
        attributes.push(KeyValue::string("db.namespace", d.schema.clone()));
    }
    if !operation.is_empty() {
        attributes.push(KeyValue::string("db.operation.name", operation.clone()));
    }
    let names: Vec<&str> = tables.map(|t| t.tables.iter().map(|u| u.table.as_str()).collect()).unwrap_or_default();
    if let [one] = names.as_slice() {
        attributes.push(KeyValue::string("db.collection.name", *one));
    }
    let summary = std::iter::once(operation.as_str()).chain(names.iter().copied()).filter(|s| !s.is_empty());
    attributes.push(KeyValue::string("db.query.summary", summary.collect::<Vec<_>>().join(" ")));
    attributes.push(KeyValue::string("sqlbee.digest", format!("{:016x}", d.digest)));
    if shape.query_text {
        attributes.push(KeyValue::string("db.query.text", d.digest_text.clone()));
    }
    let mut row = Row::empty(attributes);
    add(&mut row, d);
    row
}

fn add(row: &mut Row, d: &TopDigest) {
    row.count = row.count.saturating_add(d.count);
    row.errors = row.errors.saturating_add(d.errors);
    row.sum_ns = row.sum_ns.saturating_add(d.sum_ns);
    if d.count > 0 {
        row.min_ns = row.min_ns.min(d.min_ns);
        row.max_ns = row.max_ns.max(d.max_ns);
    }
    for b in d.histogram.iter().flat_map(|h| &h.buckets) {
        *row.buckets.entry(b.index).or_default() += b.count;
    }
    let stats = d.stats.as_ref();
    let plus = |acc: Option<u64>, v: Option<u64>| match (acc, v) {
        (None, None) => None,
        (a, b) => Some(a.unwrap_or(0).saturating_add(b.unwrap_or(0))),
    };
    row.rows_examined = plus(row.rows_examined, stats.and_then(|s| s.rows_examined));
    row.cpu_ns = plus(row.cpu_ns, stats.and_then(|s| s.cpu_ns));
}

/// OTLP's explicit bounds and counts for sqlbee's buckets `lo..=hi` (the
/// lowest and highest that hold a value): a bucket below `lo` when `lo`
/// is not the first, then one per sqlbee bucket; OTLP's last bucket, open
/// above, is sqlbee's `hi`.
/// The data points of every metric of a resource.
pub fn point_count(resource: &ResourceMetrics) -> u64 {
    resource
        .scope_metrics
        .iter()
        .flat_map(|s| &s.metrics)
        .map(|m| match &m.data {
            Some(MetricData::Histogram(h)) => h.data_points.len() as u64,
            Some(MetricData::Sum(s)) => s.data_points.len() as u64,
            None => 0,
        })
        .sum()
}

fn bounds_and_counts(buckets: &BTreeMap<u32, u64>) -> (Vec<f64>, Vec<u64>) {
    let (Some((&lo, _)), Some((&hi, _))) = (buckets.first_key_value(), buckets.last_key_value()) else {
        return (Vec::new(), Vec::new());
    };
    let mut bounds = Vec::new();
    let mut counts = Vec::new();
    if lo > 0 {
        bounds.push(seconds(bucket_high(lo as usize - 1)));
        counts.push(0);
    }
    for index in lo..=hi {
        if index < hi {
            bounds.push(seconds(bucket_high(index as usize)));
        }
        counts.push(buckets.get(&index).copied().unwrap_or(0));
    }
    (bounds, counts)
}

fn first_word(text: &str) -> String {
    text.split(|c: char| !c.is_ascii_alphabetic()).find(|w| !w.is_empty()).unwrap_or("").to_ascii_uppercase()
}

fn seconds(ns: u64) -> f64 {
    ns as f64 / 1e9
}

pub(super) fn nanos(unix_ms: i64) -> u64 {
    u64::try_from(unix_ms).unwrap_or(0).saturating_mul(1_000_000)
}

#[cfg(test)]
mod tests {
    use sqlbee_figures::histogram::bucket_of;
    use sqlbee_proto::v1::{Bucket, Histogram as WireHistogram};

    use super::*;

    fn digest(id: u64, latencies_ns: &[u64]) -> TopDigest {
        let mut buckets: BTreeMap<u32, u64> = BTreeMap::new();
        for &ns in latencies_ns {
            *buckets.entry(bucket_of(ns) as u32).or_default() += 1;
        }
        TopDigest {
            digest: id,
            digest_text: "select * from t where id = ?".into(),
            count: latencies_ns.len() as u64,
            sum_ns: latencies_ns.iter().sum(),
            min_ns: *latencies_ns.iter().min().unwrap(),
            max_ns: *latencies_ns.iter().max().unwrap(),
            histogram: Some(WireHistogram {
                scheme: 1,
                buckets: buckets.into_iter().map(|(index, count)| Bucket { index, count }).collect(),
            }),
            ..TopDigest::default()
        }
    }

    fn point(resource: &ResourceMetrics, n: usize) -> &HistogramDataPoint {
        match &resource.scope_metrics[0].metrics[0].data {
            Some(MetricData::Histogram(h)) => &h.data_points[n],
            _ => panic!("the first metric is the duration histogram"),
        }
    }

    #[test]
    fn buckets_become_bounds_each_value_in_the_bucket_its_bound_closes() {
        let latencies = [1_000, 1_100, 250_000, 3_000_000];
        let instance = Instance { name: "db1", system: "mariadb", host: "h" };
        let shape = Shape { max_digests: 10, query_text: false };
        let step = Step { since_unix_ms: 60_000, until_unix_ms: 120_000 };
        let r = instance_metrics(&instance, &step, &[digest(7, &latencies)], &HashMap::new(), &shape).unwrap();
        let p = point(&r, 0);
        assert_eq!(p.bucket_counts.len(), p.explicit_bounds.len() + 1);
        assert_eq!(p.count, 4);
        assert_eq!(p.bucket_counts.first(), Some(&0), "nothing below the lowest bucket");
        // Each latency falls where OTLP's rule puts it: the first bound at
        // or above it.
        for ns in latencies {
            let s = ns as f64 / 1e9;
            let at = p.explicit_bounds.iter().position(|&b| s <= b).unwrap_or(p.explicit_bounds.len());
            assert!(p.bucket_counts[at] > 0, "{ns} ns");
        }
        assert_eq!(p.start_time_unix_nano, 60_000_000_000);
        assert!(p.attributes.iter().any(|kv| kv.key == "db.operation.name"));
    }

    #[test]
    fn digests_past_the_limit_are_one_point_that_adds_them_up() {
        let digests: Vec<TopDigest> = (0..5).map(|i| digest(i, &[1_000 * (i + 1), 2_000_000])).collect();
        let instance = Instance { name: "db1", system: "mysql", host: "" };
        let shape = Shape { max_digests: 2, query_text: false };
        let step = Step { since_unix_ms: 0, until_unix_ms: 1 };
        let r = instance_metrics(&instance, &step, &digests, &HashMap::new(), &shape).unwrap();
        let other = point(&r, 2);
        assert!(other.attributes.contains(&KeyValue::string("sqlbee.digest", OTHER)));
        assert_eq!(other.count, 6);
        assert_eq!(other.min, Some(3e-6));
        let total: u64 = (0..3).map(|n| point(&r, n).count).sum();
        assert_eq!(total, 10);
    }
}
