//! The agent's grouping must agree with the server's own digests
//! (`performance_schema`): two statements share a digest in sqlbee exactly
//! when they share one in MariaDB. Needs a real mariadbd, not eBPF.
//!
//! Two corpora: a small hand-written one that must agree exactly, and a
//! sample of MariaDB's own test suite (Debian's `mariadb-test`, installed
//! by `./x setup`), statements nobody wrote for sqlbee, that must agree for
//! at least 99% of its statements.
mod common;

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use common::PrivateServer;
use mysql::prelude::Queryable;

const SCHEMA: &str = "CREATE DATABASE app; USE app; \
    CREATE TABLE t1 (id INT PRIMARY KEY, a INT, b VARCHAR(20), c DOUBLE); \
    CREATE TABLE t2 (id INT PRIMARY KEY, note VARCHAR(20)); \
    INSERT INTO t1 VALUES (1, 1, 'x', 1.5), (2, NULL, 'y', 2.5);";

/// Statements run in order against `app`; the grouping of each is compared.
const CORPUS: &[&str] = &[
    "SELECT * FROM t1 WHERE id = 1",
    "SELECT * FROM t1 WHERE id = 2",
    "select * from t1 where id=3",
    "SELECT  *  FROM\n t1\tWHERE id = 4",
    "SELECT * FROM `t1` WHERE `id` = 5",
    "SELECT /* a comment */ * FROM t1 WHERE id = 6",
    "SELECT * FROM t1 WHERE id = 7 -- trailing comment",
    "SELECT * FROM t1 WHERE id = 8 # hash comment",
    "SELECT * FROM t1 WHERE id = -9",
    "SELECT * FROM t1 WHERE id = 'ten'",
    "SELECT * FROM t1 WHERE id = 1.5e3",
    "SELECT * FROM t1 WHERE id = 0x1F",
    // X'1F' is left out: MariaDB 10.11 renders hex strings as `(unknown)`
    // and so groups them apart from every other literal; sqlbee treats them
    // as values like `0x1F` (a documented difference).
    "SELECT a FROM t1 WHERE id = 1",
    "SELECT a, b FROM t1 WHERE id = 1",
    "SELECT a, b FROM t1 WHERE id > 1",
    "SELECT * FROM t1 WHERE id IN (1, 2)",
    "SELECT * FROM t1 WHERE id IN (1, 2, 3, 4, 5)",
    "SELECT * FROM t1 WHERE id IN ('a', 'b', 3)",
    "SELECT * FROM t1 WHERE id IN (7)",
    "SELECT * FROM t1 WHERE id IN (8)",
    "SELECT * FROM t1 WHERE id BETWEEN 1 AND 10",
    "SELECT * FROM t1 WHERE id BETWEEN 20 AND 30",
    "SELECT * FROM t1 WHERE a IS NULL",
    "SELECT * FROM t1 WHERE a IS NOT NULL",
    "SELECT * FROM t1 WHERE b LIKE 'x%'",
    "SELECT * FROM t1 WHERE b LIKE 'y%'",
    "SELECT * FROM t1 ORDER BY id LIMIT 5",
    "SELECT * FROM t1 ORDER BY id LIMIT 10",
    "SELECT * FROM t1 ORDER BY id LIMIT 10, 20",
    "SELECT * FROM t1 ORDER BY id DESC LIMIT 1",
    "SELECT COUNT(*) FROM t1",
    "select count(*) from t1",
    "SELECT COUNT(*) FROM t1 WHERE a > 3",
    "SELECT COUNT(*) FROM t1 WHERE a > 300",
    "SELECT t1.id, t2.note FROM t1 JOIN t2 ON t1.id = t2.id WHERE t1.a = 1",
    "SELECT t1.id, t2.note FROM t1 JOIN t2 ON t1.id = t2.id WHERE t1.a = 2",
    "SELECT t1.id, t2.note FROM t1 LEFT JOIN t2 ON t1.id = t2.id WHERE t1.a = 2",
    "SELECT * FROM t1 WHERE id = (SELECT MAX(id) FROM t2 WHERE note = 'q')",
    "SELECT * FROM t1 WHERE id = (SELECT MAX(id) FROM t2 WHERE note = 'r')",
    "SELECT 1",
    "SELECT 2",
    "SELECT 'one'",
    "SELECT 1, 2",
    "SELECT 1, -2, 3",
    "SELECT * FROM t1 WHERE id = (-9)",
    "SELECT * FROM t1 WHERE id < -9",
    "SELECT * FROM t1 WHERE id BETWEEN -1 AND 5",
    "SELECT * FROM t1 WHERE -1 = id",
    "SELECT CASE WHEN a > 1 THEN -1 ELSE 2 END FROM t1",
    "SELECT CASE WHEN a > 1 THEN 1 ELSE 2 END FROM t1",
    "SELECT NULL",
    "SELECT * FROM t1 WHERE a = NULL",
    "INSERT INTO t2 VALUES (21, NULL)",
    "SELECT 3, 4",
    "INSERT INTO t2 VALUES (10, 'a')",
    "INSERT INTO t2 VALUES (11, 'b')",
    "INSERT INTO t2 VALUES (12, 'c'), (13, 'd')",
    "INSERT INTO t2 VALUES (14, 'e'), (15, 'f'), (16, 'g')",
    "INSERT INTO t2 (id, note) VALUES (17, 'h')",
    "INSERT INTO t2 (id, note) VALUES (18, 'i') ON DUPLICATE KEY UPDATE note = 'j'",
    "INSERT INTO t2 (id, note) VALUES (18, 'k') ON DUPLICATE KEY UPDATE note = 'l'",
    "REPLACE INTO t2 VALUES (19, 'm')",
    "REPLACE INTO t2 VALUES (20, 'n')",
    "UPDATE t1 SET a = a + 1 WHERE id = 1",
    "UPDATE t1 SET a = a + 5 WHERE id = 2",
    "UPDATE t1 SET a = a - 1 WHERE id = 2",
    "UPDATE t1 SET b = 'z', c = 3.25 WHERE id = 1",
    "UPDATE t1 SET b = 'w', c = 9 WHERE id = 2",
    "DELETE FROM t2 WHERE id = 10",
    "DELETE FROM t2 WHERE id = 11",
    "DELETE FROM t2 WHERE id > 100",
    "BEGIN",
    "COMMIT",
    "begin",
    "commit",
    "SET @x = 1",
    "SET @x = 2",
    "SELECT @x",
    "SHOW TABLES",
    "show tables",
    "SELECT * FROM t1 WHERE id = 1 FOR UPDATE",
    "SELECT * FROM t1 WHERE id = 2 FOR UPDATE",
    "SELECT * FROM t1 WHERE id = 1 LOCK IN SHARE MODE",
    "SELECT a, COUNT(*) FROM t1 GROUP BY a HAVING COUNT(*) > 1",
    "SELECT a, COUNT(*) FROM t1 GROUP BY a HAVING COUNT(*) > 7",
    "SELECT CONCAT(b, 'x') FROM t1 WHERE id = 1",
    "SELECT CONCAT(b, 'y') FROM t1 WHERE id = 2",
    "SELECT id FROM t1 UNION SELECT id FROM t2",
    "SELECT id FROM t1 UNION ALL SELECT id FROM t2",
];

fn server_digests(server: &PrivateServer) -> Vec<String> {
    let opts =
        mysql::OptsBuilder::new().socket(Some(server.socket.to_str().unwrap())).user(Some("root")).db_name(Some("app"));
    let mut worker = mysql::Conn::new(opts.clone()).unwrap();
    let mut observer = mysql::Conn::new(opts).unwrap();
    let thread: u64 = worker
        .query_first("SELECT THREAD_ID FROM performance_schema.threads WHERE PROCESSLIST_ID = CONNECTION_ID()")
        .unwrap()
        .unwrap();
    CORPUS
        .iter()
        .map(|sql| {
            worker.query_drop(sql).unwrap_or_else(|e| panic!("{sql}: {e}"));
            // The history row may land a moment after the client has its
            // answer: wait for the row of this very statement.
            let mut digest = None;
            for _ in 0..200 {
                let row: Option<(Option<String>, Option<String>)> = observer
                    .exec_first(
                        "SELECT DIGEST, SQL_TEXT FROM performance_schema.events_statements_history \
                         WHERE THREAD_ID = ? ORDER BY EVENT_ID DESC LIMIT 1",
                        (thread,),
                    )
                    .unwrap();
                if let Some((found, Some(text))) = row
                    && text == *sql
                {
                    digest = found;
                    break;
                }
                std::thread::sleep(std::time::Duration::from_millis(10));
            }
            digest.unwrap_or_else(|| panic!("no server digest for {sql}"))
        })
        .collect()
}

#[test]
fn grouping_agrees_with_performance_schema() {
    let server = PrivateServer::start(
        "digests",
        &[
            "--performance-schema=ON",
            "--performance-schema-consumer-events-statements-current=ON",
            "--performance-schema-consumer-events-statements-history=ON",
        ],
    )
    .unwrap();
    server.sql(SCHEMA).unwrap();
    let theirs = server_digests(&server);
    let ours: Vec<u64> = CORPUS
        .iter()
        .map(|s| sqlbee_agent::normalize::Digest::from_text(&sqlbee_agent::normalize::digest_text(s.as_bytes())).id)
        .collect();

    let mut disagreements = Vec::new();
    for i in 0..CORPUS.len() {
        for j in i + 1..CORPUS.len() {
            let server_same = theirs[i] == theirs[j];
            let ours_same = ours[i] == ours[j];
            if server_same != ours_same {
                disagreements.push(format!(
                    "server {} / sqlbee {}:\n    {}   => {}\n    {}   => {}",
                    if server_same { "same" } else { "different" },
                    if ours_same { "same" } else { "different" },
                    CORPUS[i],
                    sqlbee_agent::normalize::digest_text(CORPUS[i].as_bytes()),
                    CORPUS[j],
                    sqlbee_agent::normalize::digest_text(CORPUS[j].as_bytes()),
                ));
            }
        }
    }
    let groups: HashMap<&String, usize> = theirs.iter().fold(HashMap::new(), |mut m, d| {
        *m.entry(d).or_default() += 1;
        m
    });
    assert!(groups.len() > 30, "corpus too uniform to test grouping");
    assert!(disagreements.is_empty(), "{} disagreements:\n{}", disagreements.len(), disagreements.join("\n"));
}

// ---------------------------------------------------------------------
// MariaDB's test suite as a corpus
// ---------------------------------------------------------------------

/// Where Debian's `mariadb-test` puts the suite.
const SUITE: &str = "/usr/share/mysql/mysql-test";
/// Statements sampled from the suite; each runs once on the server
/// (`SQLBEE_DIGEST_SAMPLE` overrides it).
const SAMPLE: usize = 5000;
/// Fixed, so every run samples the same statements from the same package.
const SAMPLE_SEED: u64 = 0x005e_edd1_6e57;
/// Longer statements are left out: sqlbee cuts digest texts at 4096 bytes.
const MAX_STATEMENT: usize = 3000;
const REQUIRED_AGREEMENT: f64 = 0.99;

/// mysqltest's own commands (client/mysqltest.cc), which are not SQL. A
/// command missing here costs nothing but a sample slot: the server does not
/// parse it, so it gets no digest and is left out.
const MYSQLTEST_COMMANDS: &[&str] = &[
    "append_file",
    "assert",
    "cat_file",
    "change_user",
    "character_set",
    "chmod",
    "connect",
    "connection",
    "copy_file",
    "copy_files_wildcard",
    "dec",
    "delimiter",
    "die",
    "diff_files",
    "dirty_close",
    "disable_abort_on_error",
    "disable_connect_log",
    "disable_info",
    "disable_metadata",
    "disable_parsing",
    "disable_ps_protocol",
    "disable_query_log",
    "disable_reconnect",
    "disable_result_log",
    "disable_warnings",
    "disconnect",
    "echo",
    "enable_abort_on_error",
    "enable_connect_log",
    "enable_info",
    "enable_metadata",
    "enable_parsing",
    "enable_ps_protocol",
    "enable_query_log",
    "enable_reconnect",
    "enable_result_log",
    "enable_warnings",
    "end_timer",
    "error",
    "exec",
    "exec_in_background",
    "execw",
    "exit",
    "expr",
    "file_exists",
    "horizontal_results",
    "inc",
    "let",
    "list_files",
    "list_files_append_file",
    "list_files_write_file",
    "lowercase_result",
    "mkdir",
    "move_file",
    "output",
    "partially_sorted_result",
    "perl",
    "ping",
    "query_get_value",
    "real_sleep",
    "reap",
    "remove_file",
    "remove_files_wildcard",
    "replace_column",
    "replace_numeric_round",
    "replace_regex",
    "replace_result",
    "reset_connection",
    "result_format",
    "rmdir",
    "save_master_pos",
    "send_quit",
    "send_shutdown",
    "shutdown_server",
    "skip",
    "sleep",
    "sorted_result",
    "source",
    "start_timer",
    "sync_slave_with_master",
    "sync_with_master",
    "system",
    "vertical_results",
    "wait_for_slave_to_stop",
    "while",
    "if",
    "write_file",
];

/// Commands whose argument is a statement sent as it is (after variable
/// expansion, so only those without `$` are kept).
const STATEMENT_COMMANDS: &[&str] =
    &["eval", "evalp", "query", "query_horizontal", "query_vertical", "send", "send_eval", "single_query"];

/// Commands followed by a block of lines up to a terminator (`EOF` unless
/// named), which is data, not SQL.
const BLOCK_COMMANDS: &[&str] = &["perl", "write_file", "append_file"];

/// The statements of one mysqltest script, split as mysqltest splits them:
/// a command ends at the current delimiter outside quotes; a line starting
/// with `#` or `-` at the start of a command is a comment or a `--command`;
/// `if (...)` and `while (...)` end at `{`, and a `}` alone closes them.
fn script_statements(text: &str, out: &mut Vec<String>) {
    let bytes = text.as_bytes();
    let mut delimiter = b";".to_vec();
    let mut i = 0;
    let mut block_end: Option<String> = None;
    let mut parsing = true;
    let line_end = |from: usize| bytes[from..].iter().position(|&b| b == b'\n').map_or(bytes.len(), |p| from + p);
    while i < bytes.len() {
        if let Some(end) = &block_end {
            let e = line_end(i);
            if text[i..e].trim() == end {
                block_end = None;
            }
            i = e + 1;
            continue;
        }
        // At the start of a command.
        while i < bytes.len() && bytes[i].is_ascii_whitespace() {
            i += 1;
        }
        if i >= bytes.len() {
            break;
        }
        let command: &str;
        // A `--command` line is never a statement of its own.
        let mut dashed = false;
        match bytes[i] {
            b'#' => {
                i = line_end(i) + 1;
                continue;
            }
            b'-' => {
                let e = line_end(i);
                command = text[i..e].trim_start_matches('-').trim();
                dashed = true;
                i = e + 1;
            }
            b'}' => {
                i += 1;
                continue;
            }
            _ => {
                let start = i;
                let mut quote = None;
                let mut slash = false;
                loop {
                    if i >= bytes.len() {
                        command = text[start..].trim();
                        break;
                    }
                    let c = bytes[i];
                    match quote {
                        Some(q) => {
                            if slash {
                                slash = false;
                            } else if c == b'\\' {
                                slash = true;
                            } else if c == q {
                                quote = None;
                            }
                            i += 1;
                        }
                        None => {
                            if bytes[i..].starts_with(&delimiter) {
                                command = text[start..i].trim();
                                i += delimiter.len();
                                break;
                            }
                            let opens_block = || {
                                let head = bytes[start..i].trim_ascii_start();
                                [&b"while"[..], b"if"]
                                    .iter()
                                    .any(|w| head.len() >= w.len() && head[..w.len()].eq_ignore_ascii_case(w))
                            };
                            if c == b'{' && opens_block() {
                                command = "if";
                                i += 1;
                                break;
                            }
                            if matches!(c, b'\'' | b'"' | b'`') && !slash {
                                quote = Some(c);
                            }
                            slash = c == b'\\';
                            i += 1;
                        }
                    }
                }
            }
        }
        let (word, rest) = match command.find(|c: char| c.is_whitespace() || c == '(' || c == ';') {
            Some(at) => (&command[..at], command[at..].trim()),
            None => (command, ""),
        };
        let word = word.to_ascii_lowercase();
        match word.as_str() {
            "delimiter" if !rest.is_empty() => delimiter = rest.as_bytes().to_vec(),
            "disable_parsing" => parsing = false,
            "enable_parsing" => parsing = true,
            w if BLOCK_COMMANDS.contains(&w) => {
                // `perl [END];`, `write_file FILE [END];`
                let args: Vec<&str> = rest.split_whitespace().collect();
                let named = if w == "perl" { args.first() } else { args.get(1) };
                block_end = Some(named.map_or("EOF", |t| t.trim_end_matches(';')).to_string());
                // The block starts on the next line.
                if !dashed {
                    i = line_end(i) + 1;
                }
            }
            _ if !parsing => {}
            w if STATEMENT_COMMANDS.contains(&w) => {
                if !rest.is_empty() {
                    out.push(rest.to_string());
                }
            }
            w if dashed || MYSQLTEST_COMMANDS.contains(&w) => {}
            _ => out.push(command.to_string()),
        }
    }
}

/// Every `.test` file under `root`, in a stable order.
fn test_files(root: &Path) -> Vec<PathBuf> {
    let mut files = Vec::new();
    let mut dirs = vec![root.to_path_buf()];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).unwrap_or_else(|e| panic!("reading {}: {e}", dir.display())) {
            let path = entry.unwrap().path();
            if path.is_dir() {
                dirs.push(path);
            } else if path.extension().is_some_and(|e| e == "test") {
                files.push(path);
            }
        }
    }
    files.sort();
    files
}

/// The distinct statements of the whole suite that could be sent as they
/// are: valid UTF-8 (some suites are written in other character sets), no
/// mysqltest variable, no NUL, not too long. Read once per test binary.
fn suite_statements() -> &'static [String] {
    static STATEMENTS: std::sync::OnceLock<Vec<String>> = std::sync::OnceLock::new();
    STATEMENTS.get_or_init(read_suite)
}

fn read_suite() -> Vec<String> {
    let root = Path::new(SUITE);
    assert!(
        root.join("main").is_dir(),
        "{SUITE} not found: the digest agreement test samples MariaDB's own test suite; \
         run `./x setup` (it installs Debian's mariadb-test) or `apt-get install mariadb-test`"
    );
    let mut statements = Vec::new();
    for file in test_files(root) {
        let Ok(text) = std::fs::read(&file) else { continue };
        // Scripts in other character sets are read as far as they are UTF-8:
        // a statement with a stray byte is dropped below, not the file.
        script_statements(&String::from_utf8_lossy(&text), &mut statements);
    }
    let mut seen = HashSet::new();
    statements.retain(|s| {
        !s.is_empty() && s.len() <= MAX_STATEMENT && !s.contains(['$', '\0', '\u{fffd}']) && seen.insert(s.clone())
    });
    statements
}

/// A deterministic sample: the statements whose seeded hash is smallest.
fn sample(statements: &[String], n: usize) -> Vec<String> {
    let mut keyed: Vec<(u64, &String)> =
        statements.iter().map(|s| (xxhash_rust::xxh3::xxh3_64_with_seed(s.as_bytes(), SAMPLE_SEED), s)).collect();
    keyed.sort();
    keyed.into_iter().take(n).map(|(_, s)| s.clone()).collect()
}

/// The server's reading of one statement.
struct ServerDigest {
    digest: Option<String>,
    errno: u32,
}

/// Runs every statement once on `server` and reads its digest from
/// `events_statements_history_long`. The statements run as a user with
/// rights on the scratch schema `test` only, so that nothing in the suite
/// can shut the server down, change global settings or switch off the
/// instrumentation; the session is reset after each statement so that a
/// `SET NAMES` or `SET sql_mode` cannot change how the next one is lexed.
/// A statement that fails still has a digest as long as it parsed.
fn run_on_server(server: &PrivateServer, statements: &[String]) -> Vec<Option<ServerDigest>> {
    let socket = server.socket.to_str().unwrap().to_string();
    let root_opts = mysql::OptsBuilder::new().socket(Some(socket.clone())).user(Some("root"));
    let mut observer = mysql::Conn::new(root_opts).unwrap();
    let make_user = |observer: &mut mysql::Conn| {
        observer
            .query_drop(
                "DROP USER IF EXISTS corpus@localhost; \
                 CREATE USER corpus@localhost WITH MAX_STATEMENT_TIME 0.5; \
                 GRANT ALL ON test.* TO corpus@localhost",
            )
            .unwrap();
    };
    observer.query_drop("CREATE DATABASE IF NOT EXISTS test").unwrap();
    make_user(&mut observer);
    let worker_opts = mysql::OptsBuilder::new()
        .socket(Some(socket))
        .user(Some("corpus"))
        .db_name(Some("test"))
        .read_timeout(Some(Duration::from_secs(20)));
    // The worker, its performance_schema thread and its last event so far
    // (the client library's own queries at connect time).
    let connect = |observer: &mut mysql::Conn| -> (mysql::Conn, u64, u64) {
        let worker = mysql::Conn::new(worker_opts.clone()).or_else(|_| {
            // A statement changed the user's password, or dropped it.
            make_user(observer);
            mysql::Conn::new(worker_opts.clone())
        });
        let worker = worker.expect("connecting as the corpus user");
        let thread: u64 = observer
            .exec_first(
                "SELECT THREAD_ID FROM performance_schema.threads WHERE PROCESSLIST_ID = ?",
                (worker.connection_id(),),
            )
            .unwrap()
            .expect("the worker's performance_schema thread");
        let last: Option<u64> = observer
            .exec_first(
                "SELECT MAX(EVENT_ID) FROM performance_schema.events_statements_history_long WHERE THREAD_ID = ?",
                (thread,),
            )
            .unwrap()
            .flatten();
        (worker, thread, last.unwrap_or(0))
    };
    let (mut worker, mut thread, mut last_event) = connect(&mut observer);
    let mut results = Vec::with_capacity(statements.len());
    for sql in statements {
        let sent = match worker.query_iter(sql.as_str()) {
            Ok(mut result) => {
                // Drain every result set; an error in a later one is the
                // statement's own.
                while let Some(set) = result.iter() {
                    for row in set {
                        if row.is_err() {
                            break;
                        }
                    }
                }
                true
            }
            Err(mysql::Error::MySqlError(_)) => true,
            Err(_) => false,
        };
        // The statement's row in the history, matched by its text; it may
        // land a moment after the client has its answer.
        let mut found = None;
        let deadline = Instant::now() + Duration::from_secs(2);
        while sent && Instant::now() < deadline {
            let rows: Vec<(u64, Option<String>, Option<String>, u32)> = observer
                .exec(
                    "SELECT EVENT_ID, DIGEST, SQL_TEXT, MYSQL_ERRNO \
                     FROM performance_schema.events_statements_history_long \
                     WHERE THREAD_ID = ? AND EVENT_ID > ? AND NESTING_EVENT_ID IS NULL AND SQL_TEXT IS NOT NULL \
                     ORDER BY EVENT_ID",
                    (thread, last_event),
                )
                .unwrap();
            if let Some(&(event, ..)) = rows.last() {
                last_event = event;
                // A text holding several statements shows as several rows,
                // none with the whole text: left out.
                found = rows
                    .into_iter()
                    .find(|(_, _, text, _)| text.as_deref() == Some(sql.as_str()))
                    .map(|(_, digest, _, errno)| ServerDigest { digest, errno });
                break;
            }
            std::thread::sleep(Duration::from_millis(2));
        }
        results.push(found);
        // Back to the scratch schema, which the statement may have left or
        // dropped: a statement without a current schema may fail to parse.
        let reset = sent && worker.reset().is_ok() && {
            if worker.select_db("test").is_err() {
                observer.query_drop("CREATE DATABASE IF NOT EXISTS test").unwrap();
            }
            worker.select_db("test").is_ok()
        };
        if !reset {
            observer.query_drop("CREATE DATABASE IF NOT EXISTS test").unwrap();
            (worker, thread, last_event) = connect(&mut observer);
        }
    }
    results
}

/// The normalizer's keywords are the server's: the words it lists in
/// `information_schema.KEYWORDS` (but for the operators there, which the
/// lexer reads itself), and function names that are keywords only before
/// `(`, among its `SQL_FUNCTIONS`.
fn keywords_agree_with_the_server(server: &PrivateServer) {
    let opts = mysql::OptsBuilder::new().socket(Some(server.socket.to_str().unwrap())).user(Some("root"));
    let mut conn = mysql::Conn::new(opts).unwrap();
    let words: HashSet<String> = conn
        .query::<String, _>("SELECT WORD FROM information_schema.KEYWORDS")
        .unwrap()
        .into_iter()
        .filter(|w| w.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_'))
        .collect();
    let functions: HashSet<String> =
        conn.query::<String, _>("SELECT FUNCTION FROM information_schema.SQL_FUNCTIONS").unwrap().into_iter().collect();
    let (only_calls, always): (Vec<_>, Vec<_>) = sqlbee_agent::normalize::keyword_list().partition(|&(_, call)| call);
    let ours: HashSet<String> = always.into_iter().map(|(w, _)| w.to_string()).collect();
    let missing: Vec<&String> = words.difference(&ours).collect();
    let extra: Vec<&String> = ours.difference(&words).collect();
    assert!(
        missing.is_empty() && extra.is_empty(),
        "keywords: the server's not in sqlbee {missing:?}, sqlbee's not in the server {extra:?}"
    );
    let unknown: Vec<&str> = only_calls.iter().map(|&(w, _)| w).filter(|w| !functions.contains(*w)).collect();
    assert!(unknown.is_empty(), "function keywords the server does not list: {unknown:?}");
}

/// How the server and sqlbee partition the same statements.
struct Agreement {
    statements: usize,
    agreeing: usize,
    server_groups: usize,
    shared_groups: usize,
    /// Pairs grouped by one side only, as printable lines.
    examples: Vec<String>,
}

/// A statement agrees when the statements that share its server digest are
/// exactly those that share its sqlbee digest.
fn compare(statements: &[&str], theirs: &[&str], ours: &[sqlbee_agent::normalize::Digest]) -> Agreement {
    let mut by_server: HashMap<&str, Vec<usize>> = HashMap::new();
    let mut by_ours: HashMap<u64, Vec<usize>> = HashMap::new();
    for i in 0..statements.len() {
        by_server.entry(theirs[i]).or_default().push(i);
        by_ours.entry(ours[i].id).or_default().push(i);
    }
    let mut agreeing = 0;
    let mut examples = Vec::new();
    let mut reported = HashSet::new();
    for i in 0..statements.len() {
        let server_group = &by_server[theirs[i]];
        let our_group = &by_ours[&ours[i].id];
        if server_group == our_group {
            agreeing += 1;
            continue;
        }
        let show =
            |j: usize| format!("    {}\n      server: {}\n      sqlbee: {}", statements[j], theirs[j], ours[j].text);
        if let Some(&j) = server_group.iter().find(|j| !our_group.contains(j))
            && reported.insert((i.min(j), i.max(j)))
        {
            examples.push(format!("  same for the server, apart in sqlbee:\n{}\n{}", show(i), show(j)));
        }
        if let Some(&j) = our_group.iter().find(|j| !server_group.contains(j))
            && reported.insert((i.min(j), i.max(j)))
        {
            examples.push(format!("  apart for the server, same in sqlbee:\n{}\n{}", show(i), show(j)));
        }
    }
    Agreement {
        statements: statements.len(),
        agreeing,
        server_groups: by_server.len(),
        shared_groups: by_server.values().filter(|g| g.len() > 1).count(),
        examples,
    }
}

#[test]
fn mariadb_test_suite_agrees_with_performance_schema() {
    let started = Instant::now();
    let all = suite_statements();
    let size = std::env::var("SQLBEE_DIGEST_SAMPLE").ok().and_then(|n| n.parse().ok()).unwrap_or(SAMPLE);
    let sampled = sample(all, size);
    let extracted = started.elapsed();

    let server = PrivateServer::start(
        "digest-suite",
        &[
            "--performance-schema=ON",
            "--performance-schema-consumer-events-statements-current=ON",
            "--performance-schema-consumer-events-statements-history-long=ON",
            "--performance-schema-events-statements-history-long-size=1000",
            "--performance-schema-digests-size=100",
            // Room for the longest statement's tokens, so that the server
            // never cuts a digest short where sqlbee does not.
            "--max-digest-length=8192",
            "--performance-schema-max-digest-length=8192",
            "--performance-schema-max-sql-text-length=8192",
            "--character-set-server=utf8mb4",
            "--collation-server=utf8mb4_general_ci",
        ],
    )
    .unwrap();
    keywords_agree_with_the_server(&server);
    let run_started = Instant::now();
    let results = run_on_server(&server, &sampled);
    let ran = run_started.elapsed();

    if let Some(path) = std::env::var_os("SQLBEE_DIGEST_DUMP") {
        // The server's digests, for working on the normalizer without a server.
        let lines: Vec<String> = sampled
            .iter()
            .zip(&results)
            .filter_map(|(sql, r)| {
                let r = r.as_ref()?;
                Some(serde_json::json!({"sql": sql, "digest": r.digest, "errno": r.errno}).to_string())
            })
            .collect();
        std::fs::write(&path, lines.join("\n")).unwrap();
    }

    let mut statements = Vec::new();
    let mut theirs = Vec::new();
    let (mut unmatched, mut unparsed) = (0, 0);
    for (sql, result) in sampled.iter().zip(&results) {
        match result {
            None => unmatched += 1,
            Some(ServerDigest { digest: None, .. }) => unparsed += 1,
            Some(ServerDigest { digest: Some(d), .. }) => {
                statements.push(sql.as_str());
                theirs.push(d.as_str());
            }
        }
    }
    let mut normalizer = sqlbee_agent::normalize::Normalizer::new(1 << 16);
    let ours: Vec<sqlbee_agent::normalize::Digest> =
        statements.iter().map(|s| normalizer.normalize(s.as_bytes())).collect();
    let agreement = compare(&statements, &theirs, &ours);
    let share = agreement.agreeing as f64 / agreement.statements as f64;
    eprintln!(
        "suite: {} distinct statements, {} sampled ({extracted:.1?}); server: {ran:.1?}, {} with a digest, \
         {unparsed} not parsed, {unmatched} not matched (several statements in one text, or a lost connection); \
         {} server digests, {} shared by two statements or more; agreement {}/{} = {:.2}%",
        all.len(),
        sampled.len(),
        agreement.statements,
        agreement.server_groups,
        agreement.shared_groups,
        agreement.agreeing,
        agreement.statements,
        share * 100.0,
    );
    for example in agreement.examples.iter().take(40) {
        eprintln!("{example}");
    }
    assert!(agreement.statements >= size / 2, "too few statements with a server digest: {}", agreement.statements);
    assert!(
        share >= REQUIRED_AGREEMENT,
        "sqlbee groups {:.2}% of the suite's statements as the server does, below {:.0}%",
        share * 100.0,
        REQUIRED_AGREEMENT * 100.0
    );
}

/// The kernel's text hash may split what the normalizer groups, never merge
/// what it keeps apart (`sqlbee_kernel_abi::text_hash`): checked on every
/// statement of the suite, which needs no server.
#[test]
fn kernel_hash_never_merges_suite_digests() {
    let all = suite_statements();
    let mut normalizer = sqlbee_agent::normalize::Normalizer::new(1 << 16);
    let mut by_hash: HashMap<u64, (usize, sqlbee_agent::normalize::Digest)> = HashMap::new();
    let mut merged = Vec::new();
    for (i, sql) in all.iter().enumerate() {
        let digest = normalizer.normalize(sql.as_bytes());
        let (first, first_digest) =
            by_hash.entry(sqlbee_kernel_abi::text_hash::hash(sql.as_bytes())).or_insert((i, digest.clone()));
        if *first_digest != digest && merged.len() < 20 {
            merged.push(format!("    {}\n    {}\n      => {} / {}", all[*first], sql, first_digest.text, digest.text));
        }
    }
    assert!(merged.is_empty(), "equal kernel text hashes, different digests:\n{}", merged.join("\n"));
    // The check says little if the hash kept everything apart.
    let shared = all.len() - by_hash.len();
    eprintln!("suite: {} distinct statements, {} kernel text hashes", all.len(), by_hash.len());
    assert!(shared > all.len() / 20, "only {shared} of {} statements share a kernel hash", all.len());
}
