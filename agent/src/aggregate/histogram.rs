//! Latency histogram with fixed log-linear buckets: every power of two is
//! split into 8 equal buckets (relative error under 12.5%). Bucket bounds
//! depend on nothing but the index, so histograms from any agent or window
//! merge exactly by adding counts.
use serde::Serialize;

/// Sub-buckets per power of two, as a power of two.
const SUB_BITS: u32 = 3;
const SUB: u64 = 1 << SUB_BITS;
/// Enough buckets for every u64 nanosecond value.
pub const BUCKETS: usize = ((64 - SUB_BITS as usize) + 1) * SUB as usize;

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Histogram {
    /// Counts from bucket `offset` on; empty buckets at both ends are not
    /// stored.
    offset: u16,
    counts: Vec<u64>,
}

/// Bucket index of a value in nanoseconds.
pub fn bucket_of(ns: u64) -> usize {
    if ns < SUB {
        return ns as usize;
    }
    let top = 63 - ns.leading_zeros();
    let shift = top - SUB_BITS;
    let sub = (ns >> shift) & (SUB - 1);
    ((shift as u64 + 1) * SUB + sub) as usize
}

/// Smallest value that falls into `index`.
pub fn bucket_low(index: usize) -> u64 {
    let index = index as u64;
    if index < SUB {
        return index;
    }
    let shift = index / SUB - 1;
    let sub = index % SUB;
    (SUB + sub) << shift
}

/// Largest value that falls into `index`.
pub fn bucket_high(index: usize) -> u64 {
    if index + 1 >= BUCKETS { u64::MAX } else { bucket_low(index + 1) - 1 }
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
            let grow = offset - index;
            self.counts.splice(0..0, std::iter::repeat_n(0, grow));
            self.offset = index as u16;
        }
        let slot = index - self.offset as usize;
        if slot >= self.counts.len() {
            self.counts.resize(slot + 1, 0);
        }
        self.counts[slot] += count;
    }

    pub fn merge(&mut self, other: &Histogram) {
        for (i, &c) in other.counts.iter().enumerate() {
            if c > 0 {
                self.add(other.offset as usize + i, c);
            }
        }
    }

    pub fn total(&self) -> u64 {
        self.counts.iter().sum()
    }

    /// Non-empty buckets as (index, count).
    pub fn buckets(&self) -> impl Iterator<Item = (usize, u64)> + '_ {
        self.counts
            .iter()
            .enumerate()
            .filter(|(_, c)| **c > 0)
            .map(|(i, c)| (self.offset as usize + i, *c))
    }

    /// Value at quantile `q` (0..=1): the upper bound of the bucket that
    /// holds it, so the answer never understates a latency.
    pub fn quantile(&self, q: f64) -> u64 {
        let total = self.total();
        if total == 0 {
            return 0;
        }
        let rank = ((q.clamp(0.0, 1.0) * total as f64).ceil() as u64).max(1);
        let mut seen = 0;
        for (index, count) in self.buckets() {
            seen += count;
            if seen >= rank {
                return bucket_high(index);
            }
        }
        u64::MAX
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_cover_values_in_order() {
        let mut last = 0;
        for ns in (0..100_000u64).chain([u64::MAX / 2, u64::MAX]) {
            let b = bucket_of(ns);
            assert!(b < BUCKETS, "{ns} -> {b}");
            assert!(bucket_low(b) <= ns && ns <= bucket_high(b), "{ns} not in bucket {b}");
            assert!(b >= last || ns > 100_000);
            last = b;
        }
    }

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
    }
}
