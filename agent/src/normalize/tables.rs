//! The tables a digest touches and whether it writes them, from its text
//! parsed with sqlparser-rs (MySQL dialect). The digest lexer stays the
//! source of digests (it agrees with the server's own); this parse only
//! describes them, once per digest, off the statement path.
//!
//! A name without a schema is the one the statements ran in. A text the
//! parser cannot read keeps its digest and says so (`Tables::Unknown`).
use std::{collections::HashSet, ops::ControlFlow};

use sqlparser::{
    ast::{FromTable, ObjectName, Query, Statement, TableFactor, TableObject, Visit, Visitor, visit_relations},
    dialect::MySqlDialect,
    parser::Parser,
};

/// One table a statement reads or writes.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct TableUse {
    /// Empty when the statement named none and ran in none.
    pub schema: String,
    pub table: String,
    /// Written (the target of INSERT, REPLACE, UPDATE or DELETE); else read.
    pub write: bool,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Tables {
    /// The statement's kind (`SELECT`, `INSERT`, ...) and its tables, each
    /// once, written ones first.
    Known { kind: String, tables: Vec<TableUse> },
    /// The parser could not read the text.
    Unknown,
}

/// Which digests' tables go out with this window: each digest once when
/// first seen, and again every `RESEND` (a collector that came later, or
/// lost them, learns them within that time). Parses at most
/// `PARSES_PER_WINDOW` new texts per window; the others wait for a later one.
#[derive(Default)]
pub struct Describer {
    known: std::collections::HashMap<(Option<std::sync::Arc<str>>, u64), (std::sync::Arc<Tables>, std::time::Instant)>,
    parses: usize,
}

/// Digests remembered; past it the memory starts over (each is then
/// described once more).
const MAX_KNOWN: usize = 100_000;
const PARSES_PER_WINDOW: usize = 2_000;
const RESEND: std::time::Duration = std::time::Duration::from_secs(3600);

impl Describer {
    /// Starts a window's parse budget.
    pub fn begin_window(&mut self) {
        self.parses = 0;
    }

    /// The digest's tables when they go out in this window, else None.
    pub fn describe(
        &mut self,
        schema: &Option<std::sync::Arc<str>>,
        digest: u64,
        digest_text: &str,
        now: std::time::Instant,
    ) -> Option<std::sync::Arc<Tables>> {
        let key = (schema.clone(), digest);
        if let Some((tables, sent)) = self.known.get_mut(&key) {
            if now.duration_since(*sent) < RESEND {
                return None;
            }
            *sent = now;
            return Some(tables.clone());
        }
        if self.parses >= PARSES_PER_WINDOW {
            return None;
        }
        self.parses += 1;
        if self.known.len() >= MAX_KNOWN {
            self.known.clear();
        }
        let tables = std::sync::Arc::new(tables_of(digest_text, schema.as_deref()));
        self.known.insert(key, (tables.clone(), now));
        Some(tables)
    }
}

/// Digest texts stand for lists with `...`; the parser needs values.
fn parsable(digest_text: &str) -> String {
    digest_text.replace("(...)", "(?)").replace("?, ...", "?")
}

/// What `digest_text` (run in `schema`) reads and writes.
pub fn tables_of(digest_text: &str, schema: Option<&str>) -> Tables {
    let Ok(statements) = Parser::parse_sql(&MySqlDialect {}, &parsable(digest_text)) else {
        return Tables::Unknown;
    };
    let [statement] = statements.as_slice() else {
        return Tables::Unknown;
    };
    let mut ctes = CteNames::default();
    let _ = statement.visit(&mut ctes);
    let qualify = |name: &ObjectName| -> Option<(String, String)> {
        let parts: Vec<&str> = name.0.iter().filter_map(|p| p.as_ident()).map(|i| i.value.as_str()).collect();
        match parts.as_slice() {
            [table] if ctes.0.contains(*table) => None,
            [table] => Some((schema.unwrap_or_default().to_string(), table.to_string())),
            [.., db, table] => Some((db.to_string(), table.to_string())),
            [] => None,
        }
    };
    let (kind, written) = kind_and_targets(statement);
    let written: HashSet<(String, String)> = written.iter().filter_map(&qualify).collect();
    let mut seen = HashSet::new();
    let mut tables = Vec::new();
    let _ = visit_relations(statement, |name| {
        if let Some(key) = qualify(name)
            && seen.insert(key.clone())
        {
            let write = written.contains(&key);
            tables.push(TableUse { schema: key.0, table: key.1, write });
        }
        ControlFlow::<()>::Continue(())
    });
    // Multi-table DELETE names its targets by alias or name; a target that
    // is no relation of its own is still written.
    for key in written {
        if seen.insert(key.clone()) {
            tables.push(TableUse { schema: key.0, table: key.1, write: true });
        }
    }
    tables.sort_by(|a, b| b.write.cmp(&a.write).then(a.cmp(b)));
    Tables::Known { kind, tables }
}

/// The statement's kind and the names it writes.
fn kind_and_targets(statement: &Statement) -> (String, Vec<ObjectName>) {
    let first_table = |factor: &TableFactor| match factor {
        TableFactor::Table { name, .. } => vec![name.clone()],
        _ => Vec::new(),
    };
    match statement {
        Statement::Query(_) => ("SELECT".into(), Vec::new()),
        Statement::Insert(insert) => {
            let kind = if insert.replace_into { "REPLACE" } else { "INSERT" };
            let targets = match &insert.table {
                TableObject::TableName(name) => vec![name.clone()],
                _ => Vec::new(),
            };
            (kind.into(), targets)
        }
        Statement::Update { table, .. } => ("UPDATE".into(), first_table(&table.relation)),
        Statement::Delete(delete) => {
            let targets = if delete.tables.is_empty() {
                match &delete.from {
                    FromTable::WithFromKeyword(from) | FromTable::WithoutKeyword(from) => {
                        from.first().map(|t| first_table(&t.relation)).unwrap_or_default()
                    }
                }
            } else {
                delete.tables.clone()
            };
            ("DELETE".into(), targets)
        }
        other => {
            let text = other.to_string();
            (text.split_whitespace().next().unwrap_or_default().to_ascii_uppercase(), Vec::new())
        }
    }
}

/// Names a WITH clause defines: relations by those names are not tables.
#[derive(Default)]
struct CteNames(HashSet<String>);

impl Visitor for CteNames {
    type Break = ();

    fn pre_visit_query(&mut self, query: &Query) -> ControlFlow<()> {
        if let Some(with) = &query.with {
            self.0.extend(with.cte_tables.iter().map(|cte| cte.alias.name.value.clone()));
        }
        ControlFlow::Continue(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn uses(digest_text: &str, schema: Option<&str>) -> Vec<(String, bool)> {
        match tables_of(digest_text, schema) {
            Tables::Known { tables, .. } => {
                tables.into_iter().map(|t| (format!("{}.{}", t.schema, t.table), t.write)).collect()
            }
            Tables::Unknown => panic!("{digest_text} did not parse"),
        }
    }

    #[test]
    fn each_digest_goes_out_once_an_hour() {
        let mut describer = Describer::default();
        let now = std::time::Instant::now();
        let schema: Option<std::sync::Arc<str>> = Some("s".into());
        assert!(describer.describe(&schema, 1, "SELECT * FROM `t`", now).is_some());
        assert!(describer.describe(&schema, 1, "SELECT * FROM `t`", now).is_none());
        assert!(describer.describe(&None, 1, "SELECT * FROM `t`", now).is_some(), "another schema, another row");
        assert!(describer.describe(&schema, 1, "SELECT * FROM `t`", now + RESEND).is_some());
    }

    #[test]
    fn joins_across_schemas_are_qualified() {
        let text = "SELECT `o` . `id` FROM `orders` `o` JOIN `crm` . `customers` `c` ON `c` . `id` = `o` . `cid` WHERE `o` . `total` > ?";
        assert_eq!(uses(text, Some("shop")), [("crm.customers".into(), false), ("shop.orders".into(), false)]);
    }

    #[test]
    fn writes_and_reads_are_told_apart() {
        let text = "INSERT INTO `archive` SELECT * FROM `orders` WHERE ID IN (...)";
        assert_eq!(uses(text, Some("app")), [("app.archive".into(), true), ("app.orders".into(), false)]);
        assert_eq!(uses("UPDATE `t` SET `n` = `n` + ? WHERE ID = ?", Some("a")), [("a.t".into(), true)]);
        assert_eq!(uses("DELETE FROM `x` . `t` WHERE `k` = ?", None), [("x.t".into(), true)]);
        let multi = "DELETE `a` FROM `a` JOIN `b` ON `a` . `id` = `b` . `id` WHERE `b` . `k` = ?";
        assert_eq!(uses(multi, Some("s")), [("s.a".into(), true), ("s.b".into(), false)]);
        assert_eq!(uses("INSERT INTO `t` ( `a` , `b` ) VALUES (...) /* , ... */", Some("s")), [("s.t".into(), true)]);
    }

    #[test]
    fn ctes_are_not_tables_and_kinds_are_named() {
        let text = "WITH `recent` AS ( SELECT * FROM `orders` WHERE `d` > ? ) SELECT COUNT ( * ) FROM `recent`";
        assert_eq!(uses(text, Some("s")), [("s.orders".into(), false)]);
        let Tables::Known { kind, tables } = tables_of("REPLACE INTO `t` VALUES (...)", Some("s")) else { panic!() };
        assert_eq!((kind.as_str(), tables.len()), ("REPLACE", 1));
        assert!(
            matches!(tables_of("SET `autocommit` = ?", None), Tables::Known { kind, tables } if kind == "SET" && tables.is_empty())
        );
        assert_eq!(tables_of("SELECT FROM WHERE (", None), Tables::Unknown);
    }
}
