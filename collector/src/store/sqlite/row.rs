//! A row written as (column, value) pairs: the INSERT's column list and
//! its parameters come from one list, so a column and its value cannot
//! drift apart when a column is added.
use rusqlite::{ToSql, Transaction};

/// `verb table (columns) VALUES (?1, ...)`, `verb` being `INSERT INTO`,
/// `INSERT OR IGNORE INTO` or `INSERT OR REPLACE INTO`.
pub(super) fn insert_sql(verb: &str, table: &str, columns: &[&str]) -> String {
    let marks: Vec<String> = (1..=columns.len()).map(|n| format!("?{n}")).collect();
    format!("{verb} {table} ({}) VALUES ({})", columns.join(", "), marks.join(", "))
}

/// Inserts one row of `(column, value)` pairs into `table`.
pub(super) fn insert(tx: &Transaction<'_>, table: &str, row: &[(&str, &dyn ToSql)]) -> rusqlite::Result<usize> {
    execute(tx, "INSERT INTO", table, row)
}

/// As `insert`, leaving out a row whose key is there already.
pub(super) fn insert_or_ignore(
    tx: &Transaction<'_>,
    table: &str,
    row: &[(&str, &dyn ToSql)],
) -> rusqlite::Result<usize> {
    execute(tx, "INSERT OR IGNORE INTO", table, row)
}

/// As `insert`, replacing a row whose key is there already.
pub(super) fn insert_or_replace(
    tx: &Transaction<'_>,
    table: &str,
    row: &[(&str, &dyn ToSql)],
) -> rusqlite::Result<usize> {
    execute(tx, "INSERT OR REPLACE INTO", table, row)
}

/// A digest row's columns followed by its rank columns (`ranks`: from
/// `rank_values`).
pub(super) fn with_ranks<'a>(
    row: &[(&'a str, &'a dyn ToSql)],
    ranks: &'a [(&'static str, Option<i64>)],
) -> Vec<(&'a str, &'a dyn ToSql)> {
    row.iter().copied().chain(ranks.iter().map(|(column, value)| (*column, value as &dyn ToSql))).collect()
}

/// The rank columns of a digest row's figures (`store::rank_columns`).
pub(super) fn rank_values(stats: Option<&sqlbee_proto::v1::QueryStats>) -> Vec<(&'static str, Option<i64>)> {
    crate::store::rank_columns::values(stats).map(|(column, value)| (column, value.map(super::i))).collect()
}

fn execute(tx: &Transaction<'_>, verb: &str, table: &str, row: &[(&str, &dyn ToSql)]) -> rusqlite::Result<usize> {
    let columns: Vec<&str> = row.iter().map(|(c, _)| *c).collect();
    let mut statement = tx.prepare_cached(&insert_sql(verb, table, &columns))?;
    statement.execute(rusqlite::params_from_iter(row.iter().map(|(_, v)| v)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn columns_and_parameters_come_from_one_list() {
        assert_eq!(insert_sql("INSERT INTO", "t", &["a", "b", "c"]), "INSERT INTO t (a, b, c) VALUES (?1, ?2, ?3)");
        let mut conn = rusqlite::Connection::open_in_memory().unwrap();
        conn.execute_batch("CREATE TABLE t (a INTEGER, b TEXT)").unwrap();
        let tx = conn.transaction().unwrap();
        insert(&tx, "t", &[("b", &"x"), ("a", &7)]).unwrap();
        let (a, b): (i64, String) = tx.query_row("SELECT a, b FROM t", [], |r| Ok((r.get(0)?, r.get(1)?))).unwrap();
        assert_eq!((a, b.as_str()), (7, "x"));
    }
}
