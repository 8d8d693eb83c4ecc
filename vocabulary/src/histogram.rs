//! The latency histogram of scheme 1 (see `sqlbee_figures::histogram` for
//! its buckets): the one type the agent fills and ships and the collector
//! merges back, so a percentile means the same on both sides of the wire.
pub use sqlbee_figures::histogram::{BUCKETS, SCHEME, bucket_high, bucket_low, bucket_of};

/// Counts per bucket. Only the range from the lowest to the highest
/// non-empty bucket is stored. Counts saturate rather than wrap: a broken
/// or hostile agent must not be able to make a merged total small.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Histogram {
    offset: u16,
    counts: Vec<u64>,
}

impl Histogram {
    pub fn record(&mut self, ns: u64) {
        self.add(bucket_of(ns), 1);
    }

    /// Adds `count` values of bucket `index` (clamped to the last bucket).
    pub fn add_bucket(&mut self, index: usize, count: u64) {
        self.add(index.min(BUCKETS - 1), count);
    }

    fn add(&mut self, index: usize, count: u64) {
        if self.counts.is_empty() {
            self.offset = index as u16;
        }
        let offset = self.offset as usize;
        if index < offset {
            self.counts.splice(0..0, std::iter::repeat_n(0, offset - index));
            self.offset = index as u16;
        }
        let slot = index - self.offset as usize;
        if slot >= self.counts.len() {
            self.counts.resize(slot + 1, 0);
        }
        self.counts[slot] = self.counts[slot].saturating_add(count);
    }

    /// Exact: bucket bounds depend only on the index.
    pub fn merge(&mut self, other: &Histogram) {
        for (index, count) in other.buckets() {
            self.add(index, count);
        }
    }

    pub fn total(&self) -> u64 {
        self.counts.iter().fold(0u64, |a, c| a.saturating_add(*c))
    }

    /// Non-empty buckets as (index, count), lowest first.
    pub fn buckets(&self) -> impl Iterator<Item = (usize, u64)> + Clone + '_ {
        self.counts.iter().enumerate().filter(|(_, c)| **c > 0).map(|(i, c)| (self.offset as usize + i, *c))
    }

    /// Value at quantile `q` (0..=1): the upper bound of the bucket that
    /// holds it, so the answer never understates a latency.
    pub fn quantile(&self, q: f64) -> u64 {
        sqlbee_figures::histogram::quantile(self.buckets(), q)
    }

    /// [`Self::quantile`] clamped to the exact `[min_ns, max_ns]` that
    /// travel beside the histogram: a bucket's upper bound must not exceed
    /// the slowest statement actually seen. 0 when empty.
    pub fn percentile(&self, q: f64, min_ns: u64, max_ns: u64) -> u64 {
        if self.counts.is_empty() {
            return 0;
        }
        self.quantile(q).clamp(min_ns.min(max_ns), max_ns)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn merge_is_exact() {
        let (mut a, mut b, mut both) = (Histogram::default(), Histogram::default(), Histogram::default());
        for ns in [5, 900, 1_000_000, 250_000_000] {
            a.record(ns);
            both.record(ns);
        }
        for ns in [3, 7_000, 12_000_000_000] {
            b.record(ns);
            both.record(ns);
        }
        a.merge(&b);
        assert_eq!(a, both);
        assert_eq!(a.total(), 7);
    }

    #[test]
    fn quantile_within_bucket_error() {
        let mut h = Histogram::default();
        for ns in 1..=1000u64 {
            h.record(ns * 1000);
        }
        let p50 = h.quantile(0.5) as f64;
        assert!((p50 - 500_000.0).abs() / 500_000.0 < 0.13, "p50 {p50}");
        let p99 = h.quantile(0.99) as f64;
        assert!((p99 - 990_000.0).abs() / 990_000.0 < 0.13, "p99 {p99}");
        assert_eq!(h.percentile(1.0, 1000, 1_000_000), 1_000_000, "clamped to the exact max");
        assert_eq!(Histogram::default().percentile(0.5, 0, 0), 0);
    }

    #[test]
    fn counts_saturate_and_indices_clamp() {
        let mut h = Histogram::default();
        h.add_bucket(BUCKETS + 40, u64::MAX);
        h.add_bucket(BUCKETS - 1, 5);
        assert_eq!(h.buckets().collect::<Vec<_>>(), vec![(BUCKETS - 1, u64::MAX)]);
        assert_eq!(h.quantile(0.5), u64::MAX);
    }
}
