//! A row written as (column, value) pairs: the INSERT's column list and
//! its parameters come from one list, so a column and its value cannot
//! drift apart when a column is added.
use rusqlite::{ToSql, Transaction};

/// `INSERT INTO table (columns) VALUES (?1, ...)`, then `tail` (an
/// `ON CONFLICT` clause, or nothing).
pub(super) fn insert_sql(table: &str, columns: &[&str], tail: &str) -> String {
    let marks: Vec<String> = (1..=columns.len()).map(|n| format!("?{n}")).collect();
    format!("INSERT INTO {table} ({}) VALUES ({}){tail}", columns.join(", "), marks.join(", "))
}

/// Inserts one row of `(column, value)` pairs into `table`.
pub(super) fn insert(tx: &Transaction<'_>, table: &str, row: &[(&str, &dyn ToSql)]) -> rusqlite::Result<usize> {
    let columns: Vec<&str> = row.iter().map(|(c, _)| *c).collect();
    let mut statement = tx.prepare_cached(&insert_sql(table, &columns, ""))?;
    statement.execute(rusqlite::params_from_iter(row.iter().map(|(_, v)| v)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn columns_and_parameters_come_from_one_list() {
        assert_eq!(insert_sql("t", &["a", "b", "c"], ""), "INSERT INTO t (a, b, c) VALUES (?1, ?2, ?3)");
        let mut conn = rusqlite::Connection::open_in_memory().unwrap();
        conn.execute_batch("CREATE TABLE t (a INTEGER, b TEXT)").unwrap();
        let tx = conn.transaction().unwrap();
        insert(&tx, "t", &[("b", &"x"), ("a", &7)]).unwrap();
        let (a, b): (i64, String) = tx.query_row("SELECT a, b FROM t", [], |r| Ok((r.get(0)?, r.get(1)?))).unwrap();
        assert_eq!((a, b.as_str()), (7, "x"));
    }
}
