//! Statements that change the server rather than its rows: schema changes,
//! global settings, privileges, plugins, `FLUSH`, `KILL`, table
//! maintenance and replication commands. Each becomes an event on its
//! instance's timeline, so the agent reads them from their first words
//! (as the server's lexer reads them: comments, case and executable
//! comments alike) and names the objects they touch.
//!
//! Session-only statements are not changes: `SET SESSION`, `SET NAMES`,
//! temporary tables, `START TRANSACTION`.
use super::lexer::{Lexer, Tok};

/// What part of the server a statement changed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ChangeKind {
    /// `CREATE`, `ALTER`, `DROP`, `RENAME`, `TRUNCATE` of tables, indexes,
    /// views, databases, routines, triggers, events, sequences.
    Schema,
    /// `SET GLOBAL`, `SET PERSIST`, `SET @@global.x`.
    Setting,
    /// `GRANT`, `REVOKE`, users and roles, `SET PASSWORD`.
    Privileges,
    /// `INSTALL` and `UNINSTALL` of plugins and components.
    Plugin,
    Flush,
    Kill,
    /// `ANALYZE TABLE`, `OPTIMIZE TABLE`, `REPAIR TABLE`: they change
    /// statistics and so plans.
    Maintenance,
    /// `CHANGE MASTER`, `START`/`STOP`/`RESET` of replication, `PURGE`.
    Replication,
    /// `SHUTDOWN`.
    Server,
}

impl ChangeKind {
    pub fn name(self) -> &'static str {
        match self {
            ChangeKind::Schema => "schema",
            ChangeKind::Setting => "setting",
            ChangeKind::Privileges => "privileges",
            ChangeKind::Plugin => "plugin",
            ChangeKind::Flush => "flush",
            ChangeKind::Kill => "kill",
            ChangeKind::Maintenance => "maintenance",
            ChangeKind::Replication => "replication",
            ChangeKind::Server => "server",
        }
    }
}

/// A change statement read: its kind, what it did in its own first words
/// (`ALTER TABLE`, `SET GLOBAL`, `DROP INDEX`), and the objects it names
/// (`schema.table` for tables, the index or routine name, the variables a
/// `SET GLOBAL` sets), each once, in the order written.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Change {
    pub kind: ChangeKind,
    pub action: String,
    pub objects: Vec<String>,
}

/// Tokens read at most: a change names its objects near its start.
const MAX_TOKENS: usize = 256;
/// Objects named at most (a `DROP TABLE` of many tables keeps the first).
const MAX_OBJECTS: usize = 16;

/// Words that name what a schema statement acts on.
const OBJECT_WORDS: &[&str] = &[
    "TABLE",
    "TABLES",
    "INDEX",
    "VIEW",
    "DATABASE",
    "SCHEMA",
    "PROCEDURE",
    "FUNCTION",
    "TRIGGER",
    "EVENT",
    "SEQUENCE",
    "SERVER",
    "PACKAGE",
    "TABLESPACE",
    "LOGFILE",
];

/// Whether `raw` is a change, and what it changes; `schema` is the one the
/// statement ran in, which qualifies a table named without one.
pub fn change_of(raw: &[u8], schema: Option<&str>) -> Option<Change> {
    // Every statement the agent decodes asks: most answer at their first
    // word, read straight from the bytes when nothing comes before it.
    match plain_first_word(raw) {
        Some(word) if !LEADING.iter().any(|w| w.as_bytes().eq_ignore_ascii_case(word)) => return None,
        Some(word) if word.eq_ignore_ascii_case(b"SET") && !names_a_global_word(raw) => return None,
        Some(_) => {}
        // A comment, a parenthesis, an executable comment: the lexer reads it.
        None if !Lexer::new(raw).next().is_some_and(|first| leads_a_change(&first)) => return None,
        None => {}
    }
    let tokens: Vec<Tok<'_>> = Lexer::new(raw).take(MAX_TOKENS).collect();
    let words: Vec<Option<String>> = tokens.iter().map(word).collect();
    let is = |i: usize, w: &str| words.get(i).and_then(|x| x.as_deref()) == Some(w);
    let first = words.first()?.as_deref()?;
    let action = |n: usize| words.iter().take(n).flatten().cloned().collect::<Vec<_>>().join(" ");
    let kind = match first {
        "CREATE" | "ALTER" | "DROP" | "RENAME" | "TRUNCATE" => {
            let mut i = 1;
            // CREATE OR REPLACE, CREATE DEFINER = user@host, ALTER ONLINE
            // IGNORE, CREATE UNIQUE/FULLTEXT/SPATIAL INDEX, ALGORITHM=...
            while i < words.len() && i < 24 {
                match words[i].as_deref() {
                    Some("TEMPORARY") => return None,
                    Some(w) if OBJECT_WORDS.contains(&w) || w == "USER" || w == "ROLE" => break,
                    _ => i += 1,
                }
            }
            // `DROP PREPARE` deallocates a session's statement.
            if is(1, "PREPARE") {
                return None;
            }
            let object = words.get(i).and_then(|w| w.as_deref());
            if matches!(object, Some("USER" | "ROLE")) {
                return Some(Change {
                    kind: ChangeKind::Privileges,
                    action: format!("{first} {}", object.unwrap_or_default()),
                    objects: Vec::new(),
                });
            }
            let action = match object {
                Some(object) => format!("{first} {object}"),
                None => first.to_string(),
            };
            let objects = schema_objects(&tokens, &words, i, schema);
            return Some(Change { kind: ChangeKind::Schema, action, objects });
        }
        "SET" => {
            if is(1, "PASSWORD") || (is(1, "DEFAULT") && is(2, "ROLE")) {
                return Some(Change { kind: ChangeKind::Privileges, action: action(2), objects: Vec::new() });
            }
            let objects = global_variables(&tokens, &words);
            if objects.is_empty() {
                return None;
            }
            let scope =
                if words.iter().flatten().any(|w| w.starts_with("PERSIST")) { "SET PERSIST" } else { "SET GLOBAL" };
            return Some(Change { kind: ChangeKind::Setting, action: scope.into(), objects });
        }
        "GRANT" | "REVOKE" => ChangeKind::Privileges,
        "INSTALL" | "UNINSTALL" => ChangeKind::Plugin,
        "FLUSH" => ChangeKind::Flush,
        "KILL" => ChangeKind::Kill,
        "SHUTDOWN" => ChangeKind::Server,
        "ANALYZE" | "OPTIMIZE" | "REPAIR" => {
            // `ANALYZE SELECT ...` runs a statement; only tables change.
            let at = (1..4).find(|&i| is(i, "TABLE") || is(i, "TABLES"))?;
            let objects = table_list(&tokens, at + 1, schema);
            return Some(Change { kind: ChangeKind::Maintenance, action: format!("{first} TABLE"), objects });
        }
        "CHANGE" if is(1, "MASTER") || is(1, "REPLICATION") => ChangeKind::Replication,
        "START" | "STOP" if is(1, "SLAVE") || is(1, "REPLICA") || is(1, "ALL") => ChangeKind::Replication,
        "RESET" if is(1, "MASTER") || is(1, "SLAVE") || is(1, "REPLICA") => ChangeKind::Replication,
        "PURGE" => ChangeKind::Replication,
        _ => return None,
    };
    let n = match kind {
        ChangeKind::Plugin | ChangeKind::Replication => 2,
        _ => 1,
    };
    Some(Change { kind, action: action(n), objects: Vec::new() })
}

/// First words of the statements `change_of` reads further.
const LEADING: &[&str] = &[
    "CREATE",
    "ALTER",
    "DROP",
    "RENAME",
    "TRUNCATE",
    "SET",
    "GRANT",
    "REVOKE",
    "INSTALL",
    "UNINSTALL",
    "FLUSH",
    "KILL",
    "SHUTDOWN",
    "ANALYZE",
    "OPTIMIZE",
    "REPAIR",
    "CHANGE",
    "START",
    "STOP",
    "RESET",
    "PURGE",
];

/// The first word when the text starts with one (after white space): its
/// letters, up to the first byte that is not a letter.
fn plain_first_word(raw: &[u8]) -> Option<&[u8]> {
    let start = raw.iter().position(|b| !b.is_ascii_whitespace())?;
    let rest = &raw[start..];
    let len = rest.iter().take_while(|b| b.is_ascii_alphabetic()).count();
    let next = rest.get(len).copied();
    // `SELECT*`, `SET@@x`: a word ends at any byte an identifier cannot hold.
    (len > 0 && !next.is_some_and(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'$' || b >= 0x80))
        .then(|| &rest[..len])
}

/// Whether a `SET` may change more than its session: only one that says
/// `GLOBAL`, `PERSIST`, `PASSWORD` or `ROLE` somewhere can.
fn names_a_global_word(raw: &[u8]) -> bool {
    ["GLOBAL", "PERSIST", "PASSWORD", "ROLE"]
        .iter()
        .any(|word| raw.windows(word.len()).any(|w| w.eq_ignore_ascii_case(word.as_bytes())))
}

fn leads_a_change(tok: &Tok<'_>) -> bool {
    let bytes = match tok {
        Tok::Keyword(k) => k.name().as_bytes(),
        Tok::Ident(bytes) => bytes,
        _ => return false,
    };
    LEADING.iter().any(|w| w.as_bytes().eq_ignore_ascii_case(bytes))
}

/// A token as an upper-case word: keywords and plain identifiers (a
/// word the server does not reserve, such as `REPLICA` in older builds).
fn word(tok: &Tok<'_>) -> Option<String> {
    match tok {
        Tok::Keyword(k) => Some(k.name().to_ascii_uppercase()),
        Tok::Ident(bytes) => Some(String::from_utf8_lossy(bytes).to_ascii_uppercase()),
        _ => None,
    }
}

/// An identifier as written (keywords too: a column may be called `status`).
fn name(tok: &Tok<'_>) -> Option<String> {
    match tok {
        Tok::Keyword(k) => Some(k.name().to_ascii_lowercase()),
        Tok::Ident(bytes) => Some(String::from_utf8_lossy(bytes).into_owned()),
        _ => None,
    }
}

/// `a` or `a.b` at `at`: the name and the index past it.
fn qualified(tokens: &[Tok<'_>], at: usize) -> Option<(Option<String>, String, usize)> {
    let first = name(tokens.get(at)?)?;
    if tokens.get(at + 1) == Some(&Tok::Char(b'.'))
        && let Some(second) = tokens.get(at + 2).and_then(name)
    {
        return Some((Some(first), second, at + 3));
    }
    Some((None, first, at + 1))
}

fn qualify(schema_of_name: Option<String>, table: String, schema: Option<&str>) -> String {
    match schema_of_name.as_deref().or(schema) {
        Some(s) => format!("{s}.{table}"),
        None => table,
    }
}

fn push_once(objects: &mut Vec<String>, object: String) {
    if objects.len() < MAX_OBJECTS && !objects.contains(&object) {
        objects.push(object);
    }
}

/// The objects of a schema statement whose object word is at `at`: the
/// name after it (past `IF [NOT] EXISTS`), a table list for `DROP TABLE`
/// and `RENAME TABLE`, the table an index is `ON`, and the indexes an
/// `ALTER TABLE` adds or drops.
fn schema_objects(tokens: &[Tok<'_>], words: &[Option<String>], at: usize, schema: Option<&str>) -> Vec<String> {
    let mut objects = Vec::new();
    let object = words.get(at).and_then(|w| w.as_deref()).unwrap_or("TABLE");
    let mut i = at + 1;
    while matches!(words.get(i).and_then(|w| w.as_deref()), Some("IF" | "NOT" | "EXISTS")) {
        i += 1;
    }
    match object {
        "TABLE" | "TABLES" => {
            // DROP TABLE a, b; RENAME TABLE a TO b, c TO d; ALTER TABLE a.
            for table in table_list(tokens, i, schema) {
                push_once(&mut objects, table);
            }
            // ALTER TABLE t ... ADD/DROP INDEX|KEY name: the index by name.
            for j in i..tokens.len() {
                let is_index = matches!(words[j].as_deref(), Some("INDEX" | "KEY"));
                let before = j.checked_sub(1).and_then(|b| words[b].as_deref());
                if is_index
                    && matches!(before, Some("ADD" | "DROP" | "RENAME" | "UNIQUE" | "FULLTEXT" | "SPATIAL"))
                    && let Some(index) = tokens.get(j + 1).and_then(name)
                    && !matches!(index.to_ascii_uppercase().as_str(), "IF" | "ON" | "USING")
                {
                    push_once(&mut objects, format!("index {index}"));
                }
            }
        }
        "INDEX" => {
            // CREATE INDEX i ON t (...), DROP INDEX i ON t.
            if let Some(index) = tokens.get(i).and_then(name) {
                if let Some(on) = (i + 1..tokens.len()).find(|&j| words[j].as_deref() == Some("ON"))
                    && let Some((s, table, _)) = qualified(tokens, on + 1)
                {
                    push_once(&mut objects, qualify(s, table, schema));
                }
                push_once(&mut objects, format!("index {index}"));
            }
        }
        "DATABASE" | "SCHEMA" => {
            if let Some(db) = tokens.get(i).and_then(name) {
                push_once(&mut objects, db);
            }
        }
        _ => {
            if let Some((s, n, _)) = qualified(tokens, i) {
                push_once(&mut objects, qualify(s, n, schema));
            }
        }
    }
    objects
}

/// `a, b.c` or `a TO b, c TO d` from `at` on, each qualified.
fn table_list(tokens: &[Tok<'_>], mut at: usize, schema: Option<&str>) -> Vec<String> {
    let mut out = Vec::new();
    while let Some((s, table, next)) = qualified(tokens, at) {
        push_once(&mut out, qualify(s, table, schema));
        match tokens.get(next) {
            Some(Tok::Char(b',')) => at = next + 1,
            Some(t) if word(t).as_deref() == Some("TO") => at = next + 1,
            _ => break,
        }
    }
    out
}

/// The variables a `SET` sets globally: `GLOBAL x`, `PERSIST x`,
/// `@@global.x`, `@@persist.x`, each lower case.
fn global_variables(tokens: &[Tok<'_>], words: &[Option<String>]) -> Vec<String> {
    let mut out = Vec::new();
    let mut i = 1;
    while i < tokens.len() {
        let scope = words[i].as_deref();
        let global = matches!(scope, Some("GLOBAL" | "PERSIST" | "PERSIST_ONLY"));
        let after_at = i >= 2 && tokens[i - 1] == Tok::Char(b'@') && tokens[i - 2] == Tok::Char(b'@');
        if global {
            let at = if after_at && tokens.get(i + 1) == Some(&Tok::Char(b'.')) { i + 2 } else { i + 1 };
            match words.get(at).and_then(|w| w.as_deref()) {
                // SET GLOBAL TRANSACTION ISOLATION LEVEL ...
                Some("TRANSACTION") => push_once(&mut out, "transaction".into()),
                Some(_) => {
                    if let Some(variable) = tokens.get(at).and_then(name) {
                        push_once(&mut out, variable.to_ascii_lowercase());
                    }
                }
                None => {}
            }
            i = at + 1;
            continue;
        }
        i += 1;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn change(sql: &str) -> Option<(ChangeKind, String, Vec<String>)> {
        change_of(sql.as_bytes(), Some("app")).map(|c| (c.kind, c.action, c.objects))
    }

    fn objects(sql: &str) -> Vec<String> {
        change(sql).map(|c| c.2).unwrap_or_default()
    }

    #[test]
    fn schema_changes_name_their_tables_and_indexes() {
        let (kind, action, named) = change("ALTER TABLE shop.orders DROP INDEX idx_email").unwrap();
        assert_eq!((kind, action.as_str()), (ChangeKind::Schema, "ALTER TABLE"));
        assert_eq!(named, ["shop.orders", "index idx_email"]);
        assert_eq!(
            objects("/* migrate */ alter table `orders` add index idx_c (c), ALGORITHM=INPLACE"),
            ["app.orders", "index idx_c"]
        );
        assert_eq!(objects("CREATE UNIQUE INDEX u ON shop.t (a)"), ["shop.t", "index u"]);
        assert_eq!(objects("DROP INDEX i ON t"), ["app.t", "index i"]);
        assert_eq!(objects("DROP TABLE IF EXISTS a, b.c"), ["app.a", "b.c"]);
        assert_eq!(objects("RENAME TABLE a TO a_old, b TO a"), ["app.a", "app.a_old", "app.b"]);
        assert_eq!(objects("TRUNCATE TABLE t"), ["app.t"]);
        assert_eq!(objects("CREATE OR REPLACE DEFINER=`u`@`%` VIEW v AS SELECT 1"), ["app.v"]);
        assert_eq!(objects("CREATE DATABASE IF NOT EXISTS shop"), ["shop"]);
        assert_eq!(change("CREATE PROCEDURE p() SELECT 1").unwrap().1, "CREATE PROCEDURE");
        assert_eq!(change("/*!40000 ALTER TABLE `orders` DISABLE KEYS */").unwrap().2, ["app.orders"]);
    }

    #[test]
    fn session_only_statements_are_not_changes() {
        for sql in [
            "CREATE TEMPORARY TABLE t (a INT)",
            "DROP TEMPORARY TABLE IF EXISTS t",
            "CREATE OR REPLACE TEMPORARY TABLE t (a INT)",
            "SET NAMES utf8mb4",
            "SET SESSION sql_mode = ''",
            "SET @@session.x = 1",
            "SET @a = 'global'",
            "START TRANSACTION",
            "ANALYZE SELECT 1",
            "SELECT * FROM `create`",
            "DROP PREPARE s",
            "",
            "   ",
        ] {
            assert_eq!(change(sql), None, "{sql}");
        }
    }

    #[test]
    fn global_settings_name_their_variables() {
        assert_eq!(
            change("SET GLOBAL max_connections = 500").unwrap(),
            (ChangeKind::Setting, "SET GLOBAL".into(), vec!["max_connections".into()])
        );
        assert_eq!(
            objects("set @@global.Long_Query_Time = 2, @@session.x = 1, GLOBAL slow_query_log = ON"),
            ["long_query_time", "slow_query_log"]
        );
        assert_eq!(change("SET PERSIST innodb_io_capacity = 400").unwrap().1, "SET PERSIST");
        assert_eq!(objects("SET GLOBAL TRANSACTION ISOLATION LEVEL READ COMMITTED"), ["transaction"]);
    }

    #[test]
    fn the_other_kinds() {
        let kind = |sql: &str| change(sql).map(|c| (c.0, c.1));
        assert_eq!(kind("GRANT SELECT ON app.* TO 'app'@'%'"), Some((ChangeKind::Privileges, "GRANT".into())));
        assert_eq!(
            kind("CREATE USER 'x'@'%' IDENTIFIED BY 'pw'"),
            Some((ChangeKind::Privileges, "CREATE USER".into()))
        );
        assert_eq!(kind("SET PASSWORD FOR 'x'@'%' = PASSWORD('pw')").unwrap().0, ChangeKind::Privileges);
        assert_eq!(kind("INSTALL SONAME 'ha_blackhole'"), Some((ChangeKind::Plugin, "INSTALL SONAME".into())));
        assert_eq!(kind("UNINSTALL PLUGIN blackhole"), Some((ChangeKind::Plugin, "UNINSTALL PLUGIN".into())));
        assert_eq!(kind("FLUSH TABLES WITH READ LOCK"), Some((ChangeKind::Flush, "FLUSH".into())));
        assert_eq!(kind("KILL QUERY 1234"), Some((ChangeKind::Kill, "KILL".into())));
        assert_eq!(kind("OPTIMIZE TABLE t"), Some((ChangeKind::Maintenance, "OPTIMIZE TABLE".into())));
        assert_eq!(objects("ANALYZE NO_WRITE_TO_BINLOG TABLE a, shop.b"), ["app.a", "shop.b"]);
        assert_eq!(kind("STOP SLAVE").unwrap().0, ChangeKind::Replication);
        assert_eq!(kind("CHANGE MASTER TO master_host = 'h'").unwrap().0, ChangeKind::Replication);
        assert_eq!(kind("SHUTDOWN").unwrap().0, ChangeKind::Server);
    }

    #[test]
    fn the_first_word_is_read_from_the_bytes_when_it_can_be() {
        assert_eq!(plain_first_word(b"  select * from t"), Some(&b"select"[..]));
        assert_eq!(plain_first_word(b"SET@@global.x=1"), Some(&b"SET"[..]));
        assert_eq!(plain_first_word(b"/* c */ ALTER TABLE t"), None, "the lexer reads past comments");
        assert_eq!(plain_first_word(b"alter_x"), None);
        assert!(change(" /* c */ ALTER TABLE t ADD c INT").is_some());
        assert!(change("(SELECT 1)").is_none());
        assert!(change("SET@@GLOBAL.max_connections = 1").is_some());
    }

    #[test]
    fn any_bytes_read_without_a_panic() {
        for sql in
            [&b"ALTER TABLE"[..], b"ALTER TABLE `", b"SET GLOBAL", b"SET @@", b"DROP INDEX i ON", b"\xff\xfe ALTER"]
        {
            let _ = change_of(sql, None);
        }
        let long = format!("DROP TABLE {}", (0..5000).map(|i| format!("t{i}")).collect::<Vec<_>>().join(", "));
        assert_eq!(objects(&long).len(), MAX_OBJECTS);
    }
}
