//! Two time ranges side by side, per (schema, digest): which digests
//! regressed, improved, appeared or went. Pure: takes the two ranges' top
//! rows (with their merged histograms) and the thresholds.
//!
//! A digest is `regressed` (or `improved`) only when three things hold:
//! - its two latency distributions differ beyond chance: a Mann-Whitney
//!   rank test on the exact histograms, each bucket a group of ties (a
//!   bucket is an eighth of a power of two wide, so a shift smaller than
//!   that is conservatively seen as none), p below `ALPHA`;
//! - the mean changed by at least `min_change` (a ratio), and
//! - by at least `min_delta_ns` per statement.
//!
//! With millions of statements any shift is significant, which is why the
//! size floors exist; with few, nothing is, which is why `min_statements`
//! says so instead of guessing.
//!
//! A digest whose latency did not change is also `regressed` when its rows
//! examined per statement at least doubled and grew by `ROWS_MIN_DELTA` or
//! more (both sides with `min_statements`): a plan that lost its index on
//! a table still in memory reads far more rows long before it is slower.
//! Only sums of rows are kept, not their distribution, so this is a ratio
//! with floors, not a test, and the evidence says so.
use std::collections::BTreeMap;

use sqlbee_proto::v1::{DiffSide, DigestChange, TopDigest};
use sqlbee_vocabulary::histogram::Histogram;

use crate::store::merge::{self, DigestTotals};

/// Changes an answer lists unless asked otherwise.
pub const DEFAULT_LIMIT: usize = 100;
/// The rank test's significance level (two-sided).
pub const ALPHA: f64 = 0.001;
pub const DEFAULT_MIN_CHANGE: f64 = 0.2;
pub const DEFAULT_MIN_DELTA_NS: u64 = 100_000;
pub const DEFAULT_MIN_STATEMENTS: u64 = 30;
/// Rows examined per statement must at least multiply by this...
pub const ROWS_MIN_RATIO: f64 = 2.0;
/// ...and grow by at least this many to call a digest regressed on rows.
pub const ROWS_MIN_DELTA: f64 = 100.0;

#[derive(Clone, Copy, Debug)]
pub struct Thresholds {
    pub min_change: f64,
    pub min_delta_ns: u64,
    pub min_statements: u64,
}

impl Default for Thresholds {
    fn default() -> Self {
        Self {
            min_change: DEFAULT_MIN_CHANGE,
            min_delta_ns: DEFAULT_MIN_DELTA_NS,
            min_statements: DEFAULT_MIN_STATEMENTS,
        }
    }
}

/// One side of a digest: its rows (one per source) merged.
#[derive(Default)]
struct Side {
    text: String,
    totals: DigestTotals,
    histogram: Histogram,
    rows_examined: Option<u64>,
    cpu_ns: Option<u64>,
}

impl Side {
    fn add(&mut self, d: &TopDigest) {
        if self.text.is_empty() {
            self.text.clone_from(&d.digest_text);
        }
        self.totals.add(d.count, d.errors, d.sum_ns, d.min_ns, d.max_ns);
        for b in d.histogram.iter().flat_map(|h| &h.buckets) {
            self.histogram.add_bucket(b.index as usize, b.count);
        }
        let stats = d.stats.as_ref();
        let add = |sum: &mut Option<u64>, value: Option<u64>| {
            if let Some(v) = value {
                *sum = Some(sum.unwrap_or(0).saturating_add(v));
            }
        };
        add(&mut self.rows_examined, stats.and_then(|s| s.rows_examined));
        add(&mut self.cpu_ns, stats.and_then(|s| s.cpu_ns));
    }

    fn mean_ns(&self) -> f64 {
        self.totals.sum_ns as f64 / self.totals.count.max(1) as f64
    }

    fn wire(&self, range_ms: i64) -> DiffSide {
        let t = &self.totals;
        DiffSide {
            count: t.count,
            sum_ns: t.sum_ns,
            p50_ns: merge::percentile(&self.histogram, 0.50, t),
            p95_ns: merge::percentile(&self.histogram, 0.95, t),
            p99_ns: merge::percentile(&self.histogram, 0.99, t),
            rows_examined: self.rows_examined,
            cpu_ns: self.cpu_ns,
            range_ms,
        }
    }
}

/// The changes between the two ranges' rows, by the change in total time
/// per second of range, largest first.
pub fn compare(
    before: &[TopDigest],
    after: &[TopDigest],
    ranges_ms: (i64, i64),
    thresholds: Thresholds,
) -> Vec<DigestChange> {
    let mut sides: BTreeMap<(String, u64), (Side, Side)> = BTreeMap::new();
    for d in before {
        sides.entry((d.schema.clone(), d.digest)).or_default().0.add(d);
    }
    for d in after {
        sides.entry((d.schema.clone(), d.digest)).or_default().1.add(d);
    }
    let (before_ms, after_ms) = (ranges_ms.0.max(1), ranges_ms.1.max(1));
    let mut out: Vec<(f64, DigestChange)> = sides
        .into_iter()
        .map(|((schema, digest), (b, a))| {
            let load = a.totals.sum_ns as f64 / after_ms as f64 - b.totals.sum_ns as f64 / before_ms as f64;
            let (status, evidence, p_value) = judge(&b, &a, thresholds);
            let text = if a.text.is_empty() { b.text.clone() } else { a.text.clone() };
            let change = DigestChange {
                digest,
                schema,
                digest_text: text,
                before: (b.totals.count > 0).then(|| b.wire(before_ms)),
                after: (a.totals.count > 0).then(|| a.wire(after_ms)),
                status: status.into(),
                evidence,
                p_value,
                // Named by `blame`, which reads the store.
                changes: Vec::new(),
            };
            (load.abs(), change)
        })
        .collect();
    out.sort_by(|x, y| y.0.total_cmp(&x.0).then(x.1.digest.cmp(&y.1.digest)).then(x.1.schema.cmp(&y.1.schema)));
    out.into_iter().map(|(_, c)| c).collect()
}

/// (status, evidence, p-value).
fn judge(before: &Side, after: &Side, t: Thresholds) -> (&'static str, String, f64) {
    let (n_b, n_a) = (before.totals.count, after.totals.count);
    if n_b == 0 {
        return ("new", format!("no statement in the first range, {n_a} in the second"), 1.0);
    }
    if n_a == 0 {
        return ("gone", format!("{n_b} statements in the first range, none in the second"), 1.0);
    }
    let rows = rows_evidence(before, after);
    if n_b < t.min_statements || n_a < t.min_statements {
        let why = format!(
            "too few statements to judge ({n_b} before, {n_a} after; at least {} on each side){rows}",
            t.min_statements
        );
        return ("unchanged", why, 1.0);
    }
    let test = rank_test(&before.histogram, &after.histogram);
    let (mean_b, mean_a) = (before.mean_ns(), after.mean_ns());
    let ratio = mean_a / mean_b.max(1.0);
    let delta = mean_a - mean_b;
    let tested = format!(
        "Mann-Whitney rank test on the latency histograms ({n_b} and {n_a} statements): p = {:.3e}, \
         P(a statement after is slower than one before) = {:.2}; mean {} -> {} ({:+.0}%)",
        test.p_value,
        test.slower,
        ms(mean_b),
        ms(mean_a),
        (ratio - 1.0) * 100.0
    );
    let significant = test.p_value < ALPHA;
    let slower = significant && test.slower > 0.5 && ratio >= 1.0 + t.min_change && delta >= t.min_delta_ns as f64;
    let faster = significant
        && test.slower < 0.5
        && 1.0 / ratio.max(f64::MIN_POSITIVE) >= 1.0 + t.min_change
        && -delta >= t.min_delta_ns as f64;
    let rows_grew = rows_per_statement(before)
        .zip(rows_per_statement(after))
        .is_some_and(|(b, a)| a >= b * ROWS_MIN_RATIO && a - b >= ROWS_MIN_DELTA);
    let status = if slower {
        "regressed"
    } else if faster {
        "improved"
    } else if rows_grew {
        return (
            "regressed",
            format!(
                "{tested}; latency unchanged, but rows examined per statement grew at least {ROWS_MIN_RATIO}x and by \
                 {ROWS_MIN_DELTA} or more (a ratio with floors: only sums of rows are kept){rows}"
            ),
            test.p_value,
        );
    } else {
        "unchanged"
    };
    let verdict = match status {
        "unchanged" if !significant => format!("; not significant at {ALPHA}"),
        "unchanged" => format!(
            "; significant, but below the floors ({:.0}% and {} per statement)",
            t.min_change * 100.0,
            ms(t.min_delta_ns as f64)
        ),
        _ => String::new(),
    };
    (status, format!("{tested}{verdict}{rows}"), test.p_value)
}

fn rows_per_statement(side: &Side) -> Option<f64> {
    side.rows_examined.map(|rows| rows as f64 / side.totals.count.max(1) as f64)
}

fn rows_evidence(before: &Side, after: &Side) -> String {
    match (rows_per_statement(before), rows_per_statement(after)) {
        (Some(b), Some(a)) => format!("; rows examined per statement {b:.1} -> {a:.1}"),
        _ => String::new(),
    }
}

fn ms(ns: f64) -> String {
    format!("{:.3} ms", ns / 1e6)
}

/// What the rank test found.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RankTest {
    /// Two-sided, normal approximation with the tie correction.
    pub p_value: f64,
    /// U over the product of the sizes: the chance that a statement of
    /// `after` is slower than one of `before`, ties counting half.
    pub slower: f64,
}

/// Mann-Whitney U of `after` against `before`, each histogram bucket a
/// group of ties (bucket indices order the values, as they order time).
pub fn rank_test(before: &Histogram, after: &Histogram) -> RankTest {
    let mut counts: BTreeMap<usize, (f64, f64)> = BTreeMap::new();
    for (i, n) in before.buckets() {
        counts.entry(i).or_default().0 += n as f64;
    }
    for (i, n) in after.buckets() {
        counts.entry(i).or_default().1 += n as f64;
    }
    let n_b: f64 = counts.values().map(|c| c.0).sum();
    let n_a: f64 = counts.values().map(|c| c.1).sum();
    let total = n_b + n_a;
    if n_b == 0.0 || n_a == 0.0 {
        return RankTest { p_value: 1.0, slower: 0.5 };
    }
    let (mut below, mut rank_sum_after, mut ties) = (0.0f64, 0.0f64, 0.0f64);
    for (b, a) in counts.values() {
        let group = b + a;
        let mid_rank = below + (group + 1.0) / 2.0;
        rank_sum_after += a * mid_rank;
        ties += group * group * group - group;
        below += group;
    }
    let u = rank_sum_after - n_a * (n_a + 1.0) / 2.0;
    let mean = n_a * n_b / 2.0;
    let variance = n_a * n_b / 12.0 * ((total + 1.0) - ties / (total * (total - 1.0)));
    let slower = u / (n_a * n_b);
    if variance <= 0.0 {
        // Every statement in one bucket: no evidence of any shift.
        return RankTest { p_value: 1.0, slower };
    }
    let z = ((u - mean).abs() - 0.5).max(0.0) / variance.sqrt();
    RankTest { p_value: erfc(z / std::f64::consts::SQRT_2).min(1.0), slower }
}

/// The complementary error function, to about 1e-7 (Abramowitz and
/// Stegun 7.1.26).
fn erfc(x: f64) -> f64 {
    let t = 1.0 / (1.0 + 0.327_591_1 * x.abs());
    let poly =
        t * (0.254_829_592 + t * (-0.284_496_736 + t * (1.421_413_741 + t * (-1.453_152_027 + t * 1.061_405_429))));
    let y = poly * (-x * x).exp();
    if x >= 0.0 { y } else { 2.0 - y }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A seeded generator for the property tests (xorshift64*).
    struct Rng(u64);

    impl Rng {
        fn unit(&mut self) -> f64 {
            self.0 ^= self.0 >> 12;
            self.0 ^= self.0 << 25;
            self.0 ^= self.0 >> 27;
            (self.0.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 11) as f64 / (1u64 << 53) as f64
        }

        /// Log-normal latency around `median_ns`, sigma 0.5.
        fn latency(&mut self, median_ns: f64) -> u64 {
            let (u1, u2) = (self.unit().max(1e-12), self.unit());
            let normal = (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos();
            (median_ns * (0.5 * normal).exp()) as u64
        }
    }

    fn sample(rng: &mut Rng, n: usize, median_ns: f64) -> Histogram {
        let mut h = Histogram::default();
        for _ in 0..n {
            h.record(rng.latency(median_ns));
        }
        h
    }

    #[test]
    fn equal_distributions_flag_at_most_the_false_positive_rate() {
        let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
        let runs = 2_000;
        let flagged = (0..runs)
            .filter(|_| {
                let (a, b) = (sample(&mut rng, 300, 200_000.0), sample(&mut rng, 300, 200_000.0));
                rank_test(&a, &b).p_value < ALPHA
            })
            .count();
        // Ties within buckets make the test conservative: at most the rate,
        // with room for chance (2 expected at 0.001).
        assert!(flagged <= 8, "{flagged} of {runs} equal pairs flagged at {ALPHA}");
    }

    #[test]
    fn a_shift_of_a_quarter_is_found() {
        let mut rng = Rng(42);
        let runs = 200;
        let found = (0..runs)
            .filter(|_| {
                let (a, b) = (sample(&mut rng, 300, 200_000.0), sample(&mut rng, 300, 250_000.0));
                let test = rank_test(&a, &b);
                test.p_value < ALPHA && test.slower > 0.5
            })
            .count();
        assert!(found >= runs * 95 / 100, "a 25% shift found in {found} of {runs}");
    }

    fn row(digest: u64, latencies: &[u64], rows_examined: u64) -> TopDigest {
        let mut h = Histogram::default();
        latencies.iter().for_each(|ns| h.record(*ns));
        TopDigest {
            digest,
            digest_text: format!("SELECT {digest}"),
            count: latencies.len() as u64,
            sum_ns: latencies.iter().sum(),
            min_ns: *latencies.iter().min().unwrap(),
            max_ns: *latencies.iter().max().unwrap(),
            histogram: Some(sqlbee_proto::v1::Histogram {
                scheme: 1,
                buckets: h
                    .buckets()
                    .map(|(index, count)| sqlbee_proto::v1::Bucket { index: index as u32, count })
                    .collect(),
            }),
            stats: Some(sqlbee_proto::v1::QueryStats { rows_examined: Some(rows_examined), ..Default::default() }),
            ..Default::default()
        }
    }

    #[test]
    fn statuses_follow_the_test_and_the_floors() {
        let mut rng = Rng(7);
        let lat = |rng: &mut Rng, n, median| (0..n).map(|_| rng.latency(median)).collect::<Vec<u64>>();
        let before = vec![
            row(1, &lat(&mut rng, 500, 200_000.0), 500),
            row(2, &lat(&mut rng, 500, 200_000.0), 500),
            row(3, &lat(&mut rng, 500, 20_000.0), 500),
            row(4, &lat(&mut rng, 10, 200_000.0), 10),
            row(5, &lat(&mut rng, 50, 200_000.0), 50),
            row(7, &lat(&mut rng, 500, 200_000.0), 500),
            row(8, &lat(&mut rng, 500, 200_000.0), 500),
        ];
        let after = vec![
            row(1, &lat(&mut rng, 500, 2_000_000.0), 500_000),
            row(2, &lat(&mut rng, 500, 200_000.0), 500),
            // Significant, but 20 us more per statement: below the floor.
            row(3, &lat(&mut rng, 500, 40_000.0), 500),
            row(4, &lat(&mut rng, 10, 2_000_000.0), 10),
            row(6, &lat(&mut rng, 50, 200_000.0), 50),
            // Same latency, 200 rows per statement instead of 1.
            row(7, &lat(&mut rng, 500, 200_000.0), 100_000),
            // Rows doubled, but by 1 per statement: below the floor.
            row(8, &lat(&mut rng, 500, 200_000.0), 1_000),
        ];
        let changes = compare(&before, &after, (3_600_000, 3_600_000), Thresholds::default());
        let status: BTreeMap<u64, &str> = changes.iter().map(|c| (c.digest, c.status.as_str())).collect();
        assert_eq!(
            status,
            BTreeMap::from([
                (1, "regressed"),
                (2, "unchanged"),
                (3, "unchanged"),
                (4, "unchanged"),
                (5, "gone"),
                (6, "new"),
                (7, "regressed"),
                (8, "unchanged"),
            ])
        );
        let seven = changes.iter().find(|c| c.digest == 7).unwrap();
        assert!(seven.evidence.contains("latency unchanged, but rows examined"), "{seven:?}");
        assert_eq!(changes[0].digest, 1, "the largest change in total time first");
        assert!(changes[0].evidence.contains("rows examined per statement 1.0 -> 1000.0"), "{}", changes[0].evidence);
        let three = changes.iter().find(|c| c.digest == 3).unwrap();
        assert!(three.p_value < ALPHA && three.evidence.contains("below the floors"), "{three:?}");
        let four = changes.iter().find(|c| c.digest == 4).unwrap();
        assert!(four.evidence.contains("too few statements"), "{four:?}");
        // The other way round, the regression is an improvement.
        let back = compare(&after, &before, (3_600_000, 3_600_000), Thresholds::default());
        assert_eq!(back.iter().find(|c| c.digest == 1).unwrap().status, "improved");
    }
}
