//! The figures the top list ranks by (marked `rank` in the figure list),
//! each kept by both stores in a column of the figure's name beside the
//! encoded figures, so ranking reads one number per row instead of
//! decoding every row's figures. The stores' tables, the rows they write
//! and the columns an older store gains on open all come from here.
use sqlbee_figures::{FIGURES, RANK_FIGURES};
use sqlbee_proto::v1::QueryStats;

/// The column names, in list order.
pub fn names() -> impl Iterator<Item = &'static str> {
    RANK_FIGURES.iter().map(|&place| FIGURES[place].name)
}

/// Each column with its value for a row's figures (None: unknown, which
/// ranks as 0).
pub fn values(stats: Option<&QueryStats>) -> impl Iterator<Item = (&'static str, Option<u64>)> {
    let values = stats.map(QueryStats::values);
    RANK_FIGURES.iter().map(move |&place| (FIGURES[place].name, values.and_then(|v| v[place])))
}

/// The columns' definitions, each as `format` makes it of a name, joined
/// for a CREATE TABLE.
pub fn definitions(format: impl Fn(&str) -> String) -> String {
    names().map(format).collect::<Vec<_>>().join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_column_carries_its_own_figure() {
        // Each figure a different value, so a column that took another's
        // would show it.
        let mut stats = QueryStats::default();
        for (place, slot) in stats.values_mut().into_iter().enumerate() {
            *slot = Some(100 + place as u64);
        }
        for (column, value) in values(Some(&stats)) {
            let place = FIGURES.iter().position(|f| f.name == column).unwrap();
            assert!(FIGURES[place].rank.is_some(), "{column} is not ranked by");
            assert_eq!(value, Some(100 + place as u64), "{column}");
        }
        assert_eq!(values(Some(&stats)).count(), RANK_FIGURES.len());
        assert!(values(None).all(|(_, v)| v.is_none()));
        let names: Vec<_> = names().collect();
        assert_eq!(
            definitions(|n| format!("{n} INTEGER")),
            names.iter().map(|n| format!("{n} INTEGER")).collect::<Vec<_>>().join(", ")
        );
    }
}
