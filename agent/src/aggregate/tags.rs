//! Query tags per digest row: statements per value of each kept key, at
//! most `MAX_TAG_VALUES` values per key (the rest counted in `other`, so
//! counts stay exact), and the trace context of the slowest statement that
//! carried one.
use std::{
    collections::{BTreeMap, HashMap},
    sync::Arc,
};

use crate::normalize::{QueryTags, Trace};

/// Values told apart per key per digest per window.
pub const MAX_TAG_VALUES: usize = 32;

/// Statements per value of one key; `other` had the key with a value
/// beyond those.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TagValues {
    pub values: HashMap<Arc<str>, u64>,
    pub other: u64,
}

impl TagValues {
    /// (value, statements), the most frequent first, ties by value: the
    /// order every output lists them in.
    pub fn most_frequent(&self) -> Vec<(&str, u64)> {
        let mut values: Vec<(&str, u64)> = self.values.iter().map(|(v, n)| (&**v, *n)).collect();
        values.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(b.0)));
        values
    }
}

/// The slowest statement of a row that carried a trace context.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Exemplar {
    pub trace: Trace,
    pub duration_ns: u64,
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RowTags {
    /// By key; the keys are `--query-tags`' (at most 16).
    pub keys: BTreeMap<Arc<str>, TagValues>,
    pub exemplar: Option<Exemplar>,
}

impl RowTags {
    /// Counts `n` statements carrying `tags`, the slowest of which took
    /// `slowest_ns`.
    pub fn count(&mut self, tags: &QueryTags, n: u64, slowest_ns: u64) {
        for (key, value) in tags.tags.iter() {
            let values = self.keys.entry(key.clone()).or_default();
            if let Some(total) = values.values.get_mut(value) {
                *total += n;
            } else if values.values.len() < MAX_TAG_VALUES {
                values.values.insert(value.clone(), n);
            } else {
                values.other += n;
            }
        }
        if let Some(trace) = &tags.trace
            && self.exemplar.as_ref().is_none_or(|e| slowest_ns > e.duration_ns)
        {
            self.exemplar = Some(Exemplar { trace: *trace, duration_ns: slowest_ns });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tagged(value: &str, trace: Option<u8>) -> QueryTags {
        QueryTags {
            tags: Arc::from([(Arc::from("controller"), Arc::from(value))]),
            trace: trace.map(|t| Trace { trace_id: [t; 16], span_id: [t; 8] }),
        }
    }

    #[test]
    fn values_past_the_bound_are_counted_in_other() {
        let mut row = RowTags::default();
        for i in 0..10_000u64 {
            row.count(&tagged(&format!("v{i}"), None), 1, 1);
        }
        row.count(&tagged("v0", None), 5, 1);
        let controller = &row.keys["controller"];
        assert_eq!(controller.values.len(), MAX_TAG_VALUES);
        assert_eq!(controller.values["v0"], 6);
        assert_eq!(controller.values.values().sum::<u64>() + controller.other, 10_005);
    }

    #[test]
    fn the_slowest_traced_statement_is_the_exemplar() {
        let mut row = RowTags::default();
        row.count(&tagged("a", Some(1)), 1, 50);
        row.count(&tagged("a", Some(2)), 1, 90);
        row.count(&tagged("a", Some(3)), 1, 70);
        row.count(&tagged("a", None), 1, 1_000);
        let exemplar = row.exemplar.unwrap();
        assert_eq!((exemplar.trace.trace_hex(), exemplar.duration_ns), ("02".repeat(16), 90));
    }
}
