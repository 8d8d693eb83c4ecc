//! The latency histogram scheme every part of sqlbee speaks: the kernel
//! programs count into it, the agent merges and ships it, the collector
//! validates, stores and merges it. Written once here, so no side can
//! drift from another and silently corrupt percentiles.
//!
//! Scheme 1, log-linear: every power of two is split into [`SUB`] equal
//! buckets (relative error under 12.5%). A bucket's bounds depend on
//! nothing but its index, so histograms from any agent, window or CPU
//! merge exactly by adding counts.

/// The scheme number that travels with every histogram on the wire.
pub const SCHEME: u32 = 1;
/// Sub-buckets per power of two, as a power of two.
pub const SUB_BITS: u32 = 3;
pub const SUB: u64 = 1 << SUB_BITS;
/// Enough buckets for every u64 nanosecond value.
pub const BUCKETS: usize = ((64 - SUB_BITS as usize) + 1) * SUB as usize;

/// Bucket of a value `ns >= SUB` whose highest set bit is `top`. The
/// kernel finds `top` without a count-leading-zeros instruction (BPF has
/// none) and passes it here; [`bucket_of`] uses the CPU's.
#[inline(always)]
pub const fn bucket_at(ns: u64, top: u32) -> usize {
    let shift = top - SUB_BITS;
    let sub = (ns >> shift) & (SUB - 1);
    ((shift as u64 + 1) * SUB + sub) as usize
}

/// Bucket index of a value in nanoseconds.
#[inline(always)]
pub const fn bucket_of(ns: u64) -> usize {
    if ns < SUB {
        return ns as usize;
    }
    bucket_at(ns, 63 - ns.leading_zeros())
}

/// Smallest value that falls into `index`.
pub const fn bucket_low(index: usize) -> u64 {
    let index = index as u64;
    if index < SUB {
        return index;
    }
    let shift = index / SUB - 1;
    let sub = index % SUB;
    (SUB + sub) << shift
}

/// Largest value that falls into `index`.
pub const fn bucket_high(index: usize) -> u64 {
    if index + 1 >= BUCKETS { u64::MAX } else { bucket_low(index + 1) - 1 }
}

/// The rank (1-based) of quantile `q` among `total` values: the value at
/// that rank answers the quantile.
pub fn quantile_rank(q: f64, total: u64) -> u64 {
    let q = q.clamp(0.0, 1.0);
    let rank = q * total as f64;
    // ceil without std: the rank is at most u64::MAX as f64.
    let floor = rank as u64;
    let ceil = if (floor as f64) < rank { floor + 1 } else { floor };
    if ceil == 0 { 1 } else { ceil }
}

/// Value at quantile `q` of sparse `(index, count)` buckets given in
/// increasing index order: the upper bound of the bucket that holds it, so
/// the answer never understates a latency. 0 when there is no value.
pub fn quantile(buckets: impl Iterator<Item = (usize, u64)> + Clone, q: f64) -> u64 {
    let total = buckets.clone().fold(0u64, |a, (_, c)| a.saturating_add(c));
    if total == 0 {
        return 0;
    }
    let rank = quantile_rank(q, total);
    let mut seen = 0u64;
    for (index, count) in buckets {
        seen = seen.saturating_add(count);
        if seen >= rank {
            return bucket_high(index);
        }
    }
    u64::MAX
}

#[cfg(test)]
mod tests {
    extern crate std;
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
    fn ranks_round_up() {
        assert_eq!(quantile_rank(0.5, 10), 5);
        assert_eq!(quantile_rank(0.99, 10), 10);
        assert_eq!(quantile_rank(0.0, 10), 1);
        assert_eq!(quantile_rank(2.0, 10), 10);
    }
}
