//! Rollups: every digest row is also added, as it arrives, to a one-minute,
//! a one-hour and a one-day bucket, keeping exact counts, sums, min, max
//! and the mergeable histogram, so a week is read from about 30 day and
//! hour rows per digest and instance instead of 60 000 windows. A window belongs to the
//! bucket its end falls in, the same rule raw reads filter by, so a range
//! split along bucket edges (`plan`) reads the same statements from the
//! rollups as from the raw windows. Backend-neutral: each store keeps its
//! buckets its own way.

pub const MINUTE_MS: i64 = 60_000;
pub const HOUR_MS: i64 = 3_600_000;
pub const DAY_MS: i64 = 24 * HOUR_MS;
/// Finest first.
pub const LEVELS: [i64; 3] = [MINUTE_MS, HOUR_MS, DAY_MS];

/// The start of the bucket of `level` a window ending at `window_end` is in.
pub fn bucket(window_end: i64, level: i64) -> i64 {
    window_end.div_euclid(level).saturating_mul(level)
}

/// A part of a queried range and where to read it: raw windows (`level`
/// None: windows ending in `[start, end)`) or a rollup level (buckets
/// starting in `[start, end)`, both multiples of the level).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Span {
    pub level: Option<i64>,
    pub start: i64,
    pub end: i64,
}

/// Splits `[since, until)` (by window end) into spans, each read from the
/// coarsest level that covers it exactly: day buckets in the middle, hour
/// and minute buckets next to them, raw windows at the ragged edges. With
/// `step`, only levels that divide it are used, so no bucket straddles two
/// steps of a series.
pub fn plan(since: i64, until: i64, step: Option<i64>) -> Vec<Span> {
    plan_levels(since, until, step, &LEVELS)
}

/// `plan` over the levels a store keeps (finest first).
pub fn plan_levels(since: i64, until: i64, step: Option<i64>, kept: &[i64]) -> Vec<Span> {
    let levels: Vec<i64> =
        kept.iter().copied().filter(|level| step.is_none_or(|step| step > 0 && step % level == 0)).collect();
    let mut out = Vec::new();
    split(since, until, &levels, &mut out);
    out
}

fn split(since: i64, until: i64, levels: &[i64], out: &mut Vec<Span>) {
    if since >= until {
        return;
    }
    let Some((&level, finer)) = levels.split_last() else {
        out.push(Span { level: None, start: since, end: until });
        return;
    };
    let first = bucket(since, level);
    let first = if first < since { first.saturating_add(level) } else { first };
    let last = bucket(until, level);
    if first >= last {
        split(since, until, finer, out);
        return;
    }
    split(since, first, finer, out);
    out.push(Span { level: Some(level), start: first, end: last });
    split(last, until, finer, out);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_range_splits_into_raw_edges_minutes_and_hours() {
        let since = 2 * HOUR_MS - 90_500; // 1:58:29.5
        let until = 5 * HOUR_MS + 2 * MINUTE_MS + 1_000; // 5:02:01
        let spans = plan(since, until, None);
        assert_eq!(
            spans,
            vec![
                Span { level: None, start: since, end: 2 * HOUR_MS - MINUTE_MS },
                Span { level: Some(MINUTE_MS), start: 2 * HOUR_MS - MINUTE_MS, end: 2 * HOUR_MS },
                Span { level: Some(HOUR_MS), start: 2 * HOUR_MS, end: 5 * HOUR_MS },
                Span { level: Some(MINUTE_MS), start: 5 * HOUR_MS, end: 5 * HOUR_MS + 2 * MINUTE_MS },
                Span { level: None, start: 5 * HOUR_MS + 2 * MINUTE_MS, end: until },
            ]
        );
        // The spans tile the range with no hole and no overlap.
        for pair in spans.windows(2) {
            assert_eq!(pair[0].end, pair[1].start);
        }
    }

    #[test]
    fn a_week_reads_whole_days_and_hours_at_the_edges() {
        let since = 3 * DAY_MS + 5 * HOUR_MS;
        let until = since + 7 * DAY_MS;
        let spans = plan(since, until, None);
        assert_eq!(
            spans,
            vec![
                Span { level: Some(HOUR_MS), start: since, end: 4 * DAY_MS },
                Span { level: Some(DAY_MS), start: 4 * DAY_MS, end: 10 * DAY_MS },
                Span { level: Some(HOUR_MS), start: 10 * DAY_MS, end: until },
            ]
        );
        // A series by the hour cannot use days.
        assert_eq!(plan(since, until, Some(HOUR_MS)), vec![Span { level: Some(HOUR_MS), start: since, end: until }]);
    }

    #[test]
    fn short_and_unaligned_ranges_stay_raw() {
        assert_eq!(plan(1_000, 50_000, None), vec![Span { level: None, start: 1_000, end: 50_000 }]);
        assert!(plan(5, 5, None).is_empty());
        assert!(plan(9, 5, None).is_empty());
    }

    #[test]
    fn a_step_uses_only_levels_that_divide_it() {
        let spans = plan(0, 2 * HOUR_MS, Some(10_000));
        assert_eq!(spans, vec![Span { level: None, start: 0, end: 2 * HOUR_MS }]);
        let spans = plan(0, 2 * HOUR_MS, Some(5 * MINUTE_MS));
        assert_eq!(spans, vec![Span { level: Some(MINUTE_MS), start: 0, end: 2 * HOUR_MS }]);
        let spans = plan(0, 2 * HOUR_MS, Some(HOUR_MS));
        assert_eq!(spans, vec![Span { level: Some(HOUR_MS), start: 0, end: 2 * HOUR_MS }]);
    }

    #[test]
    fn every_time_and_no_end_are_covered() {
        let spans = plan(0, i64::MAX, None);
        assert_eq!(spans.first().map(|s| s.start), Some(0));
        assert_eq!(spans.last().map(|s| s.end), Some(i64::MAX));
        assert!(spans.iter().any(|s| s.level == Some(HOUR_MS)));
    }
}
