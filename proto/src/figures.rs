//! The wire's `QueryStats` seen through the one list of figures
//! (`sqlbee_figures`): each figure's value by its place in the
//! list, so code that merges, checks or shows figures takes them all from
//! the list instead of naming each field.
use sqlbee_figures::{FIGURES, Figure};

use crate::v1::QueryStats;

pub use sqlbee_figures::COUNT;

macro_rules! access {
    ($(($name:ident, $($rest:tt)*)),* $(,)?) => {
        impl QueryStats {
            /// Each figure's value (None: unknown), in list order.
            pub fn values(&self) -> [Option<u64>; COUNT] {
                [$(self.$name,)*]
            }

            /// Each figure's slot, in list order.
            pub fn values_mut(&mut self) -> [&mut Option<u64>; COUNT] {
                [$(&mut self.$name,)*]
            }
        }
    };
}

sqlbee_figures::figures!(access);

impl QueryStats {
    /// Each figure with its value.
    pub fn figures(&self) -> impl Iterator<Item = (&'static Figure, Option<u64>)> {
        FIGURES.iter().zip(self.values())
    }

    /// Adds `row` into `self`, each figure as it merges: one that no row
    /// carried stays unknown (an older agent, a build that could not read
    /// it), and a sum saturates.
    pub fn merge(&mut self, row: &QueryStats) {
        for ((total, value), figure) in self.values_mut().into_iter().zip(row.values()).zip(FIGURES) {
            match (figure.merge, value) {
                (sqlbee_figures::Merge::Sum, Some(v)) => *total = Some(total.unwrap_or(0).saturating_add(v)),
                (_, None) => {}
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_wire_has_every_figure_in_list_order_and_nothing_else() {
        let names: Vec<&str> = FIGURES.iter().map(|f| f.name).collect();
        let declared: Vec<&str> = crate::bounds::QUERY_STATS_FIELDS.iter().map(|(name, _)| *name).collect();
        assert_eq!(declared, names, "sqlbee.v1.QueryStats and sqlbee_figures disagree");
        let numbers: Vec<i32> = crate::bounds::QUERY_STATS_FIELDS.iter().map(|(_, n)| *n).collect();
        assert_eq!(numbers, (1..=COUNT as i32).collect::<Vec<_>>(), "fields numbered in list order");
    }

    #[test]
    fn merging_sums_what_rows_carried_and_keeps_unknown_unknown() {
        let mut total = QueryStats::default();
        total.merge(&QueryStats { rows_examined: Some(10), cpu_ns: None, ..Default::default() });
        total.merge(&QueryStats { rows_examined: Some(5), cpu_ns: Some(7), ..Default::default() });
        total.merge(&QueryStats { rows_examined: Some(u64::MAX), ..Default::default() });
        assert_eq!((total.rows_examined, total.cpu_ns, total.rows_sent), (Some(u64::MAX), Some(7), None));
        for (i, slot) in total.values_mut().into_iter().enumerate() {
            *slot = Some(i as u64);
        }
        assert_eq!(total.figures().map(|(_, v)| v.unwrap()).collect::<Vec<_>>(), (0..COUNT as u64).collect::<Vec<_>>());
    }
}
