//! Merging digest rows of many windows and instances into one answer per
//! digest, independent of the backend: exact sums, min/max, exact histogram
//! merges (the shared `sqlbee_vocabulary::histogram`) and percentiles computed
//! the way the agent's own output does (upper bound of the bucket, clamped
//! to [min, max]). Wait classes merge per class (sums and statements add,
//! the longest wait is the max) and error codes per code.
use std::{cmp::Ordering, collections::BTreeMap};

use sqlbee_proto::v1::{CostSummary, ErrorCount, WaitStats};

use sqlbee_vocabulary::histogram::Histogram;

use super::OrderBy;

/// Sums of one digest over many rows. Sums saturate rather than wrap: a
/// malicious or broken agent must not be able to make a total small.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DigestTotals {
    pub count: u64,
    pub errors: u64,
    pub sum_ns: u64,
    /// Meaningful only when count > 0.
    pub min_ns: u64,
    pub max_ns: u64,
}

impl DigestTotals {
    pub fn add(&mut self, count: u64, errors: u64, sum_ns: u64, min_ns: u64, max_ns: u64) {
        if count == 0 {
            // An empty row has no latency; its min/max carry no meaning.
            return;
        }
        if self.count == 0 {
            self.min_ns = min_ns;
            self.max_ns = max_ns;
        } else {
            self.min_ns = self.min_ns.min(min_ns);
            self.max_ns = self.max_ns.max(max_ns);
        }
        self.count = self.count.saturating_add(count);
        self.errors = self.errors.saturating_add(errors);
        self.sum_ns = self.sum_ns.saturating_add(sum_ns);
    }

    pub fn avg_ns(&self) -> u64 {
        self.sum_ns.checked_div(self.count).unwrap_or(0)
    }
}

/// Percentile `q` of a digest merged from many rows: the shared
/// histogram's answer, clamped to the digest's exact `[min, max]`, as the
/// agent's own output computes it; 0 for a digest with no statements.
pub fn percentile(histogram: &Histogram, q: f64, totals: &DigestTotals) -> u64 {
    if totals.count == 0 {
        return 0;
    }
    histogram.percentile(q, totals.min_ns, totals.max_ns)
}

/// One wait class merged over many rows.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct WaitTotals {
    pub sum_ns: u64,
    pub max_ns: u64,
    pub statements: u64,
}

/// Wait classes of one digest merged over many rows. Class names are kept
/// as the agents sent them: an unknown class is shown, not dropped.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct MergedWaits {
    classes: BTreeMap<String, WaitTotals>,
}

impl MergedWaits {
    pub fn add(&mut self, class: &str, sum_ns: u64, max_ns: u64, statements: u64) {
        let slot = match self.classes.get_mut(class) {
            Some(slot) => slot,
            None => self.classes.entry(class.to_string()).or_default(),
        };
        slot.sum_ns = slot.sum_ns.saturating_add(sum_ns);
        slot.max_ns = slot.max_ns.max(max_ns);
        slot.statements = slot.statements.saturating_add(statements);
    }

    /// Time spent waiting in every class together.
    pub fn total_ns(&self) -> u64 {
        self.classes.values().fold(0u64, |a, w| a.saturating_add(w.sum_ns))
    }

    /// Most time first, ties by class name.
    pub fn into_stats(self) -> Vec<WaitStats> {
        let mut out: Vec<WaitStats> = self
            .classes
            .into_iter()
            .map(|(class, w)| WaitStats { class, sum_ns: w.sum_ns, max_ns: w.max_ns, statements: w.statements })
            .collect();
        out.sort_by(|a, b| b.sum_ns.cmp(&a.sum_ns).then_with(|| a.class.cmp(&b.class)));
        out
    }
}

/// Error codes of one digest merged over many rows, with one sample
/// message per code.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct MergedErrors {
    counts: BTreeMap<u32, u64>,
}

impl MergedErrors {
    pub fn add(&mut self, code: u32, count: u64) {
        let slot = self.counts.entry(code).or_default();
        *slot = slot.saturating_add(count);
    }

    pub fn is_empty(&self) -> bool {
        self.counts.is_empty()
    }

    /// Most frequent first, ties by code; `message` gives each code's sample.
    pub fn into_counts(self, mut message: impl FnMut(u32) -> String) -> Vec<ErrorCount> {
        let mut out: Vec<ErrorCount> = self
            .counts
            .into_iter()
            .map(|(code, count)| ErrorCount { code, count, sample_message: message(code) })
            .collect();
        out.sort_by(|a, b| b.count.cmp(&a.count).then(a.code.cmp(&b.code)));
        out
    }
}

/// A merged histogram as the wire carries it.
pub fn wire_histogram(h: &Histogram) -> sqlbee_proto::v1::Histogram {
    sqlbee_proto::v1::Histogram {
        scheme: sqlbee_vocabulary::histogram::SCHEME,
        buckets: h.buckets().map(|(index, count)| sqlbee_proto::v1::Bucket { index: index as u32, count }).collect(),
    }
}

/// The statements a window's probe cost is spread over: the agent's
/// scaled count where it sampled, else the statements it counted.
pub fn probed_statements(statements: u64, probes: &sqlbee_proto::v1::ProbeCost) -> u64 {
    if probes.estimated_statements == 0 { statements } else { probes.estimated_statements }
}

/// Whether an agent window shed work: any mode but exact (empty: an agent
/// from before budget mode).
pub fn shedding(mode: &str) -> bool {
    !mode.is_empty() && mode != "exact"
}

/// An agent's cost over a range, finished: its own CPU over all the
/// statements it saw, and the probes' CPU over the statements (scaled
/// where sampled) of the instances that matched, each per 10k QPS.
pub fn cost_summary(agent_id: String, mut s: CostSummary, estimated: u64) -> CostSummary {
    if s.statements > 0 {
        s.agent_cores_per_10k_qps = s.agent_cpu_seconds / s.statements as f64 * 10_000.0;
    }
    if estimated > 0 {
        s.server_extra_cores_per_10k_qps = s.probe_cpu_seconds / estimated as f64 * 10_000.0;
    }
    s.agent_id = agent_id;
    s
}

/// An instance's newest cost window as an answer: its rate over the
/// window, the probes' figures, and the agent's own cost from the window
/// of its that ended closest (None: the agent reported none).
pub fn instance_cost(
    (start, end, statements): (i64, i64, u64),
    aggregated_in_kernel: u64,
    probes: Option<sqlbee_proto::v1::ProbeCost>,
    server: Option<sqlbee_proto::v1::ProcessMetrics>,
    agent_cost: Option<sqlbee_proto::v1::AgentCost>,
) -> sqlbee_proto::v1::InstanceCost {
    let mut out =
        sqlbee_proto::v1::InstanceCost { window_end_unix_ms: end, aggregated_in_kernel, server, ..Default::default() };
    let seconds = (end - start).max(0) as f64 / 1e3;
    if seconds > 0.0 {
        out.statements_per_s = statements as f64 / seconds;
    }
    // Agents before budget mode were always attached.
    out.attached_fraction = 1.0;
    if let Some(p) = probes {
        out.server_extra_cores_per_10k_qps = p.extra_cores_per_10k_qps;
        out.attached_fraction = p.attached_fraction;
    }
    if let Some(cost) = agent_cost {
        out.agent_cpu_cores = cost.cpu_cores;
        out.agent_cores_per_10k_qps = cost.cores_per_10k_qps;
        out.agent_rss_bytes = cost.rss_bytes;
        out.shedding = cost.shedding;
        out.events_per_s = cost.events_per_s;
        out.dropped_events = cost.dropped_events;
    }
    out
}

/// Descending by the order key; ties by digest id so answers are stable.
/// The third element is the key computed from more than the totals: each
/// digest's p99 when ordering by `p99`, its total wait when by `wait`,
/// and the sum of its figure when by a figure.
pub fn compare(order: OrderBy, a: (u64, &DigestTotals, u64), b: (u64, &DigestTotals, u64)) -> Ordering {
    let (da, ta, pa) = a;
    let (db, tb, pb) = b;
    let key = match order {
        OrderBy::Total => tb.sum_ns.cmp(&ta.sum_ns),
        // sum_a/count_a vs sum_b/count_b without losing precision.
        OrderBy::Avg => (u128::from(tb.sum_ns) * u128::from(ta.count.max(1)))
            .cmp(&(u128::from(ta.sum_ns) * u128::from(tb.count.max(1)))),
        OrderBy::P99 | OrderBy::Wait | OrderBy::Figure(_) => pb.cmp(&pa),
        OrderBy::Count => tb.count.cmp(&ta.count),
        OrderBy::Errors => tb.errors.cmp(&ta.errors),
    };
    key.then(da.cmp(&db))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn totals_skip_empty_rows_and_saturate() {
        let mut t = DigestTotals::default();
        t.add(0, 0, 0, u64::MAX, 0);
        t.add(2, 1, 300, 100, 200);
        t.add(1, 0, u64::MAX, 50, 60);
        assert_eq!((t.count, t.errors, t.sum_ns, t.min_ns, t.max_ns), (3, 1, u64::MAX, 50, 200));
    }

    #[test]
    fn avg_order_is_exact() {
        let a = DigestTotals { count: 3, sum_ns: 10, ..Default::default() };
        let b = DigestTotals { count: 1, sum_ns: 3, ..Default::default() };
        assert_eq!(compare(OrderBy::Avg, (1, &a, 0), (2, &b, 0)), Ordering::Less);
        assert_eq!(compare(OrderBy::Total, (1, &a, 0), (2, &b, 0)), Ordering::Less);
        assert_eq!(compare(OrderBy::Count, (2, &a, 0), (1, &a, 0)), Ordering::Greater);
        assert_eq!(compare(OrderBy::Wait, (1, &a, 5), (2, &b, 7)), Ordering::Greater);
    }

    #[test]
    fn waits_and_errors_merge_per_key() {
        let mut w = MergedWaits::default();
        w.add("row_lock", 300, 200, 2);
        w.add("disk_io", 50, 50, 1);
        w.add("row_lock", 500, 400, 3);
        w.add("disk_io", u64::MAX, 1, u64::MAX);
        assert_eq!(w.total_ns(), u64::MAX);
        let stats = w.into_stats();
        assert_eq!(stats.len(), 2);
        assert_eq!((stats[0].class.as_str(), stats[0].sum_ns, stats[0].statements), ("disk_io", u64::MAX, u64::MAX));
        assert_eq!(stats[1], WaitStats { class: "row_lock".into(), sum_ns: 800, max_ns: 400, statements: 5 });

        let mut e = MergedErrors::default();
        e.add(1213, 1);
        e.add(1062, 2);
        e.add(1213, 2);
        let counts = e.into_counts(|code| if code == 1062 { "dup".into() } else { String::new() });
        assert_eq!((counts[0].code, counts[0].count, counts[0].sample_message.as_str()), (1213, 3, ""));
        assert_eq!((counts[1].code, counts[1].count, counts[1].sample_message.as_str()), (1062, 2, "dup"));
    }
}
