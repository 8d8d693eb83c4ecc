//! The indexes of the tables a server's digests touch, read over the login
//! (`SHOW INDEX`, which needs a grant on the table, as EXPLAIN does; or a
//! schema's `sqlbee_indexes` procedure, for a login that may read nothing),
//! so the collector can say which indexes no plan chooses and which
//! repeat another. A table is read when its digests first name it, soon
//! after a statement the agent saw change it, and every `READ_EVERY`; its
//! indexes go out when they changed, and every `SEND_EVERY` anyway, so a
//! collector that lost one reading gets the next.
use std::{
    collections::{BTreeMap, BTreeSet, HashMap},
    hash::{DefaultHasher, Hash, Hasher},
    time::{Duration, Instant, SystemTime},
};

use mysql::prelude::Queryable;

use super::quoted;
use crate::{aggregate::ChangeRecord, normalize::ChangeKind};

/// How often a table's indexes are read when nothing asks sooner.
const READ_EVERY: Duration = Duration::from_secs(600);
/// A reading that did not change goes out again after this long.
const SEND_EVERY: Duration = Duration::from_secs(3_600);
/// A change to a table is read this long after the agent saw it (its
/// statement may still be running when its window closes).
const AFTER_CHANGE: Duration = Duration::from_secs(1);
/// Tables followed per server, at most; past it, new ones wait until a
/// table no digest named for `FORGET_AFTER` makes room.
const MAX_TABLES: usize = 2_000;
const FORGET_AFTER: Duration = Duration::from_secs(86_400);
/// Tables read per pass of the explain thread, at most.
const MAX_PER_PASS: usize = 20;
/// Indexes and parts kept per table, at most (a table has at most 64).
const MAX_INDEXES: usize = 128;
const MAX_PARTS: usize = 64;
/// Server errors that say the table (or its schema) is not there.
const NO_SUCH_TABLE: &[u16] = &[1146, 1049, 1109];

/// One table's indexes, as `SHOW INDEX` listed them.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct TableIndexes {
    pub schema: String,
    pub table: String,
    pub indexes: Vec<IndexDefinition>,
    /// The server says the table does not exist.
    pub missing: bool,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct IndexDefinition {
    pub name: String,
    /// (column, prefix length or 0); an empty name is an expression.
    pub columns: Vec<(String, u32)>,
    pub unique: bool,
    pub kind: String,
    pub ignored: bool,
    /// Rows read through it since the server started (or the last `FLUSH
    /// INDEX_STATISTICS`), from MariaDB's `INDEX_STATISTICS` with
    /// `userstat` on; None where unknown.
    pub rows_read: Option<u64>,
}

/// A reading to send, with when it was read.
#[derive(Clone, Debug)]
pub struct IndexReading {
    pub read_at: SystemTime,
    pub table: TableIndexes,
}

struct Followed {
    next_read: Instant,
    /// When a window's digests last named it.
    named: Instant,
    /// The hash of the reading last sent, and when.
    sent: Option<(u64, Instant)>,
}

/// One server's followed tables.
#[derive(Default)]
pub struct Indexes {
    tables: BTreeMap<(String, String), Followed>,
    /// Whether each schema holds a `sqlbee_indexes` procedure the login
    /// may run (the least-privilege set-up), else `SHOW INDEX` is used.
    procedures: HashMap<String, bool>,
}

impl Indexes {
    /// Tables the window's digests touch (schema, table), and the window's
    /// changes: a table a statement changed is read again soon.
    pub fn offer(&mut self, tables: &BTreeSet<(String, String)>, changes: &[ChangeRecord], now: Instant) {
        if self.tables.len() + tables.len() > MAX_TABLES {
            self.tables.retain(|key, f| tables.contains(key) || now.duration_since(f.named) < FORGET_AFTER);
        }
        for key in tables {
            let room = self.tables.len() < MAX_TABLES;
            match self.tables.get_mut(key) {
                Some(followed) => followed.named = now,
                None if room => {
                    self.tables.insert(key.clone(), Followed { next_read: now, named: now, sent: None });
                }
                None => {}
            }
        }
        for change in changes.iter().filter(|c| c.kind == ChangeKind::Schema) {
            for object in &change.objects {
                let Some((schema, table)) = object.split_once('.') else { continue };
                if let Some(followed) = self.tables.get_mut(&(schema.to_string(), table.to_string())) {
                    followed.next_read = followed.next_read.min(now + AFTER_CHANGE);
                }
            }
        }
    }

    /// A restarted server: everything is read and sent again.
    pub fn forget(&mut self) {
        for followed in self.tables.values_mut() {
            followed.sent = None;
        }
        self.procedures.clear();
    }

    pub fn due(&self, now: Instant) -> bool {
        self.tables.values().any(|f| now >= f.next_read)
    }

    /// Reads the tables that are due (at most `MAX_PER_PASS`) and returns
    /// the readings to send. A table the login may not see says nothing and
    /// is asked for again a day later; one that is gone is said to be, and
    /// forgotten; a failing connection stops the pass with its error.
    pub fn read(&mut self, conn: &mut mysql::Conn, now: Instant) -> Result<Vec<IndexReading>, mysql::Error> {
        let due: Vec<(String, String)> =
            self.tables.iter().filter(|(_, f)| now >= f.next_read).map(|(k, _)| k.clone()).take(MAX_PER_PASS).collect();
        if due.is_empty() {
            return Ok(Vec::new());
        }
        // MySQL has no such variable: an error is "off".
        let userstat = conn.query_first::<u8, _>("SELECT @@global.userstat").ok().flatten() == Some(1);
        let mut out = Vec::new();
        for key in due {
            let reading = match self.show_index(conn, &key.0, &key.1, userstat) {
                Ok(indexes) => {
                    Some(TableIndexes { schema: key.0.clone(), table: key.1.clone(), indexes, missing: false })
                }
                Err(mysql::Error::MySqlError(e)) if NO_SUCH_TABLE.contains(&e.code) => Some(TableIndexes {
                    schema: key.0.clone(),
                    table: key.1.clone(),
                    indexes: Vec::new(),
                    missing: true,
                }),
                Err(mysql::Error::MySqlError(_)) => None,
                Err(other) => return Err(other),
            };
            let followed = self.tables.get_mut(&key).expect("due tables are followed");
            let Some(table) = reading else {
                // Refused (a grant the login lacks): each ask is an error
                // on the server under the login's name, so asked again
                // only a day later.
                followed.next_read = now + FORGET_AFTER;
                continue;
            };
            followed.next_read = now + READ_EVERY;
            if table.missing {
                // Said once, then no longer asked for (each ask is an
                // error on the server): a digest that names it again
                // follows it again.
                self.tables.remove(&key);
                out.push(IndexReading { read_at: SystemTime::now(), table });
                continue;
            }
            let hash = {
                let mut h = DefaultHasher::new();
                table.hash(&mut h);
                h.finish()
            };
            let unchanged = followed.sent.is_some_and(|(h, at)| h == hash && now.duration_since(at) < SEND_EVERY);
            if !unchanged {
                followed.sent = Some((hash, now));
                out.push(IndexReading { read_at: SystemTime::now(), table });
            }
        }
        Ok(out)
    }
}

impl Indexes {
    /// The table's index rows: from the schema's `sqlbee_indexes(table)`
    /// where the login may call one (it answers with `SHOW INDEX`'s column
    /// names), else from `SHOW INDEX` with the login's own rights.
    fn show_index(
        &mut self,
        conn: &mut mysql::Conn,
        schema: &str,
        table: &str,
        userstat: bool,
    ) -> Result<Vec<IndexDefinition>, mysql::Error> {
        let procedure = match self.procedures.get(schema) {
            Some(known) => *known,
            None => {
                let found: Option<u8> = conn.exec_first(
                    "SELECT 1 FROM information_schema.ROUTINES WHERE ROUTINE_SCHEMA = ? AND ROUTINE_NAME = 'sqlbee_indexes'",
                    (schema,),
                )?;
                self.procedures.insert(schema.to_string(), found.is_some());
                found.is_some()
            }
        };
        if procedure {
            let rows: Vec<mysql::Row> = conn.exec(format!("CALL {}.sqlbee_indexes(?)", quoted(schema)), (table,))?;
            // INDEX_STATISTICS lists only what the login may see, which
            // through the procedure is nothing: rows read stay unknown.
            return Ok(grouped(&rows));
        }
        let rows: Vec<mysql::Row> = conn.query(format!("SHOW INDEX FROM {}.{}", quoted(schema), quoted(table)))?;
        let mut indexes = grouped(&rows);
        if userstat {
            let read: Vec<(String, u64)> = conn.exec(
                "SELECT INDEX_NAME, ROWS_READ FROM information_schema.INDEX_STATISTICS \
                 WHERE TABLE_SCHEMA = ? AND TABLE_NAME = ?",
                (schema, table),
            )?;
            for index in &mut indexes {
                // Not listed: no row read through it yet.
                index.rows_read = Some(read.iter().find(|(name, _)| *name == index.name).map_or(0, |(_, n)| *n));
            }
        }
        Ok(indexes)
    }
}

/// Index rows grouped into indexes, in the order the server lists them.
/// Columns are read by name: MariaDB and MySQL list different ones
/// (`Ignored`, `Visible`, `Expression`), and the procedure fewer.
fn grouped(rows: &[mysql::Row]) -> Vec<IndexDefinition> {
    let mut indexes: Vec<IndexDefinition> = Vec::new();
    for row in rows {
        let text = |column: &str| -> Option<String> { row.get_opt::<Option<String>, _>(column)?.ok().flatten() };
        let number = |column: &str| -> Option<u64> { row.get_opt::<Option<u64>, _>(column)?.ok().flatten() };
        let Some(name) = text("Key_name") else { continue };
        let position = match indexes.iter().position(|i| i.name == name) {
            Some(p) => p,
            None if indexes.len() < MAX_INDEXES => {
                let ignored = text("Ignored").is_some_and(|v| v.eq_ignore_ascii_case("YES"))
                    || text("Visible").is_some_and(|v| v.eq_ignore_ascii_case("NO"));
                indexes.push(IndexDefinition {
                    name,
                    columns: Vec::new(),
                    unique: number("Non_unique") == Some(0),
                    kind: text("Index_type").unwrap_or_default(),
                    ignored,
                    rows_read: None,
                });
                indexes.len() - 1
            }
            None => continue,
        };
        let index = &mut indexes[position];
        if index.columns.len() < MAX_PARTS {
            let prefix = number("Sub_part").unwrap_or(0).min(u64::from(u32::MAX)) as u32;
            index.columns.push((text("Column_name").unwrap_or_default(), prefix));
        }
    }
    indexes
}

#[cfg(test)]
mod tests {
    use super::*;

    fn alter(objects: &[&str]) -> ChangeRecord {
        ChangeRecord::unattributed(
            ChangeKind::Schema,
            "ALTER TABLE",
            objects.iter().map(|o| o.to_string()).collect(),
            SystemTime::now(),
        )
    }

    #[test]
    fn new_tables_are_due_at_once_and_a_changed_one_soon_after_its_change() {
        let mut indexes = Indexes::default();
        let now = Instant::now();
        let tables: BTreeSet<(String, String)> = [("app".to_string(), "items".to_string())].into();
        indexes.offer(&tables, &[], now);
        assert!(indexes.due(now));
        indexes.tables.get_mut(&("app".into(), "items".into())).unwrap().next_read = now + READ_EVERY;
        assert!(!indexes.due(now));
        indexes.offer(&tables, &[alter(&["app.items", "index k_idx"])], now);
        assert!(!indexes.due(now) && indexes.due(now + AFTER_CHANGE));
        indexes.offer(&tables, &[alter(&["app.other"])], now);
        assert_eq!(indexes.tables.len(), 1, "a change does not follow a table no digest touches");
    }

    #[test]
    fn followed_tables_are_bounded() {
        let mut indexes = Indexes::default();
        let tables: BTreeSet<(String, String)> =
            (0..MAX_TABLES + 10).map(|n| ("app".to_string(), format!("t{n}"))).collect();
        let now = Instant::now();
        indexes.offer(&tables, &[], now);
        assert_eq!(indexes.tables.len(), MAX_TABLES);
        // A day on, the tables no digest names any more make room.
        let later = now + FORGET_AFTER;
        let new: BTreeSet<(String, String)> = [("app".to_string(), "fresh".to_string())].into();
        indexes.offer(&new, &[], later);
        assert_eq!(indexes.tables.len(), 1);
        assert!(indexes.due(later));
    }
}
