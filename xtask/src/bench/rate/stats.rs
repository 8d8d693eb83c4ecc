//! Medians and their bootstrap confidence intervals, alone and paired by
//! round. Pure arithmetic with a fixed-seed generator, so a report is the
//! same every time it is computed from the same runs.

/// Resamples per interval: enough that the 2.5th and 97.5th percentiles
/// move by well under the intervals' width between seeds.
pub const RESAMPLES: usize = 10_000;
const SEED: u64 = 0x5eed_b007_57a7;

/// splitmix64: tiny, fast and good enough to draw resampling indices.
pub struct SplitMix64(u64);

impl SplitMix64 {
    pub fn new(seed: u64) -> SplitMix64 {
        SplitMix64(seed)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in 0..n (n > 0), by multiply-shift rather than a biased modulo.
    pub fn below(&mut self, n: usize) -> usize {
        ((self.next_u64() as u128 * n as u128) >> 64) as usize
    }
}

/// The median (the mean of the middle two for an even count); None when
/// there is nothing.
pub fn median(values: &[f64]) -> Option<f64> {
    let mut v: Vec<f64> = values.iter().copied().filter(|x| x.is_finite()).collect();
    if v.is_empty() {
        return None;
    }
    v.sort_by(f64::total_cmp);
    let n = v.len();
    Some(if n % 2 == 1 { v[n / 2] } else { (v[n / 2 - 1] + v[n / 2]) / 2.0 })
}

/// A median with its 95% bootstrap interval (percentile method).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Estimate {
    pub median: f64,
    pub lo: f64,
    pub hi: f64,
    /// How many values it came from.
    pub n: usize,
}

impl Estimate {
    /// True when the interval leaves 0 out: the difference is resolved.
    pub fn resolved(&self) -> bool {
        self.n >= 2 && (self.lo > 0.0 || self.hi < 0.0)
    }

    /// The same estimate in another unit (a positive factor keeps medians
    /// and percentiles where they are).
    pub fn scaled(&self, factor: f64) -> Estimate {
        Estimate { median: self.median * factor, lo: self.lo * factor, hi: self.hi * factor, n: self.n }
    }
}

/// The median of `values` and its 95% bootstrap interval from `resamples`
/// resamples drawn with `rng`.
pub fn bootstrap_with(values: &[f64], resamples: usize, rng: &mut SplitMix64) -> Option<Estimate> {
    let values: Vec<f64> = values.iter().copied().filter(|x| x.is_finite()).collect();
    let median_all = median(&values)?;
    let n = values.len();
    let mut medians = Vec::with_capacity(resamples);
    let mut sample = vec![0.0; n];
    for _ in 0..resamples {
        for slot in sample.iter_mut() {
            *slot = values[rng.below(n)];
        }
        medians.extend(median(&sample));
    }
    medians.sort_by(f64::total_cmp);
    let at = |q: f64| medians[((medians.len() - 1) as f64 * q).round() as usize];
    Some(Estimate { median: median_all, lo: at(0.025), hi: at(0.975), n })
}

/// `bootstrap_with` with the fixed seed and `RESAMPLES`.
pub fn bootstrap(values: &[f64]) -> Option<Estimate> {
    bootstrap_with(values, RESAMPLES, &mut SplitMix64::new(SEED))
}

/// `a - b` for every round both have a value in, in round order: the
/// paired differences that let drift between rounds cancel.
pub fn paired(a: &[(u32, f64)], b: &[(u32, f64)]) -> Vec<f64> {
    let mut out: Vec<(u32, f64)> =
        a.iter().filter_map(|&(round, x)| b.iter().find(|&&(r, _)| r == round).map(|&(_, y)| (round, x - y))).collect();
    out.sort_by_key(|&(round, _)| round);
    out.into_iter().map(|(_, d)| d).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn median_of_odd_even_and_empty() {
        assert_eq!(median(&[3.0, 1.0, 2.0]), Some(2.0));
        assert_eq!(median(&[4.0, 1.0, 3.0, 2.0]), Some(2.5));
        assert_eq!(median(&[7.0]), Some(7.0));
        assert_eq!(median(&[]), None);
        assert_eq!(median(&[f64::NAN, 1.0]), Some(1.0), "a non-number is left out");
    }

    #[test]
    fn generator_is_fixed_and_in_range() {
        let (mut a, mut b) = (SplitMix64::new(1), SplitMix64::new(1));
        assert!((0..100).all(|_| a.next_u64() == b.next_u64()));
        let mut seen = [0u32; 7];
        for _ in 0..7000 {
            seen[a.below(7)] += 1;
        }
        assert!(seen.iter().all(|&c| (800..1200).contains(&c)), "{seen:?}");
    }

    /// Values drawn uniformly from 0..1000, whose true median is 500.
    fn uniform_sample(rng: &mut SplitMix64, n: usize) -> Vec<f64> {
        (0..n).map(|_| (rng.next_u64() % 1_000_000) as f64 / 1000.0).collect()
    }

    #[test]
    fn bootstrap_interval_holds_the_true_median() {
        let sample = uniform_sample(&mut SplitMix64::new(42), 41);
        let e = bootstrap(&sample).unwrap();
        assert!(e.lo <= e.median && e.median <= e.hi, "{e:?}");
        assert!(e.lo < 500.0 && 500.0 < e.hi, "{e:?}");
        assert!(e.hi - e.lo < 500.0, "a useful width: {e:?}");
        assert_eq!(bootstrap(&sample), Some(e), "the same runs give the same report");
        // Coverage over many samples: close to the nominal 95%.
        let mut rng = SplitMix64::new(7);
        let trials = 200;
        let covered = (0..trials)
            .filter(|_| {
                let e = bootstrap_with(&uniform_sample(&mut rng, 25), 1000, &mut rng).unwrap();
                e.lo <= 500.0 && 500.0 <= e.hi
            })
            .count();
        assert!(covered >= trials * 85 / 100, "covered {covered} of {trials}");
    }

    #[test]
    fn resolved_means_the_interval_leaves_zero_out() {
        let around_zero = bootstrap(&[-3.0, -1.0, 0.5, 2.0, 4.0]).unwrap();
        assert!(!around_zero.resolved(), "{around_zero:?}");
        let above = bootstrap(&[10.0, 11.0, 12.0, 9.0, 13.0, 10.5]).unwrap();
        assert!(above.resolved() && above.lo >= 9.0 && above.hi <= 13.0, "{above:?}");
        assert!(!bootstrap(&[5.0]).unwrap().resolved(), "one value resolves nothing");
        let cores = above.scaled(10_000.0 / 1e9);
        assert!((cores.median - above.median * 1e-5).abs() < 1e-12 && cores.lo < cores.hi);
    }

    #[test]
    fn pairs_are_matched_by_round() {
        // Round 1 of `b` failed and round 3 of `a`: only 0 and 2 pair up,
        // whatever order the runs were recorded in.
        let a = [(2, 30.0), (0, 10.0), (1, 20.0)];
        let b = [(0, 1.0), (3, 4.0), (2, 3.0)];
        assert_eq!(paired(&a, &b), vec![9.0, 27.0]);
        // A drift every arm shares cancels in the pairs.
        let control: Vec<(u32, f64)> = (0..6).map(|r| (r, 100.0 + 10.0 * r as f64)).collect();
        let treated: Vec<(u32, f64)> = control.iter().map(|&(r, v)| (r, v + 5.0)).collect();
        let d = bootstrap(&paired(&treated, &control)).unwrap();
        assert_eq!((d.median, d.lo, d.hi), (5.0, 5.0, 5.0));
    }
}
