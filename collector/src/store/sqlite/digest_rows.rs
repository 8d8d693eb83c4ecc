//! The digest rows of a time range as one SQL source: raw windows at the
//! range's ragged edges and rollup buckets in between (`rollup::plan`),
//! with the same columns either way, so a read does not care which level
//! answered. `window_end` is a raw window's end or a bucket's start, and
//! `sample_end` the end of the window the sample came from.
use crate::store::{rank_columns, rollup::Span};

/// The columns both tables give, the rank columns among them.
fn columns() -> String {
    format!(
        "instance, schema, digest, nested, program, program_kind, parent_digest, source, count, errors, sum_ns,
         min_ns, max_ns, estimated_count, {}, histogram, error_codes, waits, figures, accounts, sample",
        rank_columns::definitions(str::to_string)
    )
}

/// A parenthesised subquery over `spans`; `condition` filters each part
/// (it may name any column both tables share, and bind numbered
/// parameters, which every part reuses).
pub(super) fn union(spans: &[Span], condition: &str) -> String {
    let columns = columns();
    let arms: Vec<String> = spans
        .iter()
        .map(|span| match span.level {
            None => format!(
                "SELECT {columns}, window_end, window_end AS sample_end FROM digest_windows
                 WHERE window_end >= {} AND window_end < {} AND ({condition})",
                span.start, span.end
            ),
            Some(level) => format!(
                "SELECT {columns}, bucket AS window_end, sample_end FROM digest_rollups
                 WHERE level = {level} AND bucket >= {} AND bucket < {} AND ({condition})",
                span.start, span.end
            ),
        })
        .collect();
    if arms.is_empty() {
        return format!("(SELECT {columns}, window_end, window_end AS sample_end FROM digest_windows WHERE 0)");
    }
    format!("({})", arms.join("\n UNION ALL "))
}
