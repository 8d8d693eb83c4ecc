//! The server's own per-statement figures, per (schema, digest), against
//! performance_schema's digest table: rows examined, sent and affected,
//! index use, temporary tables, sort merge passes, scans and full joins,
//! through text and prepared statements, with kernel digests on and off.
//! And CPU time per statement against what a statement does. Needs root:
//! real eBPF programs on a real mariadbd.
mod common;

use std::{collections::BTreeMap, time::Duration};

use common::{
    Agent, AgentOutput, PrivateServer,
    collector::{Collector, top_json},
    privileged,
};
use mysql::prelude::Queryable;
use serde_json::Value;

const SCHEMAS: [&str; 2] = ["qa_one", "qa_two"];
const ROWS: u32 = 3000;

/// One statement shape of the corpus: a marker its digest text keeps (an
/// alias or a table name), the text with `?` for its one parameter, and
/// the values it runs with.
struct Shape {
    marker: &'static str,
    sql: &'static str,
    values: &'static [i64],
}

/// Each hits counters: full scans without an index, a join without one,
/// a filesort that spills past a tiny sort buffer, temporary tables on
/// disk (a TEXT column), and writes with known affected rows.
const SHAPES: &[Shape] = &[
    Shape { marker: "q_scan", sql: "SELECT id AS q_scan FROM t WHERE a = ?", values: &[5, 7, 11] },
    Shape {
        marker: "q_join",
        sql: "SELECT t.id AS q_join FROM t JOIN u ON t.a = u.a WHERE u.id < ?",
        values: &[10, 50],
    },
    Shape { marker: "q_sort", sql: "SELECT id AS q_sort FROM t WHERE id > ? ORDER BY b", values: &[0, 1000] },
    Shape { marker: "q_tmp", sql: "SELECT c AS q_tmp, COUNT(*) FROM t WHERE id > ? GROUP BY c", values: &[0, 2500] },
    Shape { marker: "q_point", sql: "SELECT b AS q_point FROM t WHERE id = ?", values: &[1, 2, 3, 4] },
    Shape { marker: "q_upd", sql: "UPDATE t AS q_upd SET a = a + 1 WHERE id <= ?", values: &[37, 5] },
    Shape { marker: "q_del", sql: "DELETE FROM q_del WHERE id <= ?", values: &[20, 40] },
    Shape { marker: "q_ins", sql: "INSERT INTO q_ins (id, a) VALUES (?, 0)", values: &[100001, 100002, 100003] },
];

/// performance_schema's columns and the agent's fields they match.
const FIGURES: &[(&str, &str)] = &[
    ("COUNT_STAR", "count"),
    ("SUM_ROWS_EXAMINED", "rows_examined"),
    ("SUM_ROWS_SENT", "rows_sent"),
    ("SUM_ROWS_AFFECTED", "rows_affected"),
    ("SUM_NO_INDEX_USED", "no_index_used"),
    ("SUM_NO_GOOD_INDEX_USED", "no_good_index_used"),
    ("SUM_CREATED_TMP_TABLES", "tmp_tables"),
    ("SUM_CREATED_TMP_DISK_TABLES", "tmp_disk_tables"),
    ("SUM_SORT_MERGE_PASSES", "sort_merge_passes"),
    ("SUM_SELECT_SCAN", "select_scan"),
    ("SUM_SELECT_FULL_JOIN", "select_full_join"),
];

fn server() -> PrivateServer {
    let server = PrivateServer::start(
        "analytics",
        &[
            // In the server's own datadir.
            "--slow-query-log-file=slow.log",
            "--performance-schema=ON",
            // Every statement in the slow log, with its plan: the server's
            // own record of prepared statements, which its digest table
            // leaves out.
            "--slow-query-log=ON",
            "--long-query-time=0",
            "--log-slow-verbosity=query_plan",
            // Small enough that the corpus sorts in merge passes and puts
            // its temporary tables on disk.
            "--sort-buffer-size=32768",
            "--max-heap-table-size=16384",
            "--tmp-table-size=16384",
        ],
    )
    .unwrap();
    for schema in SCHEMAS {
        // The sequence engine makes the rows in the server: no statement
        // text as long as the table.
        server
            .sql(&format!(
                "CREATE DATABASE {schema}; USE {schema};
                 CREATE TABLE t (id INT PRIMARY KEY, a INT, b VARCHAR(200), c TEXT);
                 CREATE TABLE u (id INT PRIMARY KEY, a INT);
                 CREATE TABLE q_del (id INT PRIMARY KEY, a INT);
                 CREATE TABLE q_ins (id INT PRIMARY KEY, a INT);
                 INSERT INTO t SELECT seq, seq % 97, REPEAT(HEX(seq * 2654435761), 6), seq % 50 FROM seq_1_to_{ROWS};
                 INSERT INTO u SELECT seq, seq % 97 FROM seq_1_to_300;
                 INSERT INTO q_del SELECT seq, 0 FROM seq_1_to_60;"
            ))
            .unwrap();
    }
    server
}

fn connect(server: &PrivateServer, schema: &str) -> mysql::Conn {
    let opts = mysql::OptsBuilder::new()
        .socket(Some(server.socket.to_str().unwrap()))
        .user(Some("root"))
        .db_name(Some(schema))
        .prefer_socket(true);
    mysql::Conn::new(opts).unwrap()
}

/// Statements that tell the slow log's prepared executions from the text
/// ones of the same connection.
const PREPARED_PHASE: &str = "SELECT 1 AS q_phase_prepared";
const TEXT_PHASE: &str = "SELECT 1 AS q_phase_text";

/// A schema's connection, left open with its prepared statements: the
/// server keeps their figures only while they exist.
struct Session {
    schema: &'static str,
    conn: mysql::Conn,
    prepared: Vec<mysql::Statement>,
}

/// Runs every shape with every value, over the text protocol and as a
/// prepared statement, in each schema. The first statement of each text
/// comes alone, then a pause: the agent registers its hash, so the rest
/// is counted in the kernel when kernel digests are on.
fn workload(server: &PrivateServer) -> Vec<Session> {
    let mut sessions = Vec::new();
    for schema in SCHEMAS {
        let mut conn = connect(server, schema);
        let mut prepared = Vec::new();
        for shape in SHAPES {
            for (i, value) in shape.values.iter().enumerate() {
                conn.query_drop(shape.sql.replace('?', &value.to_string())).unwrap();
                if i == 0 {
                    std::thread::sleep(Duration::from_millis(150));
                }
            }
            conn.query_drop(PREPARED_PHASE).unwrap();
            let stmt = conn.prep(shape.sql).unwrap();
            for value in shape.values {
                // The inserts' ids must not repeat between protocols.
                let value = if shape.marker == "q_ins" { value + 1000 } else { *value };
                conn.exec_drop(&stmt, (value,)).unwrap();
            }
            prepared.push(stmt);
            conn.query_drop(TEXT_PHASE).unwrap();
        }
        sessions.push(Session { schema, conn, prepared });
    }
    sessions
}

/// One slow log entry: its connection, its `# Key: value` figures, its text.
struct SlowEntry {
    thread: u64,
    figures: BTreeMap<String, String>,
    text: String,
}

fn slow_log(path: &std::path::Path) -> Vec<SlowEntry> {
    let log = std::fs::read_to_string(path).unwrap();
    let mut entries: Vec<SlowEntry> = Vec::new();
    for line in log.lines() {
        if line.starts_with("# User@Host:") {
            entries.push(SlowEntry { thread: 0, figures: BTreeMap::new(), text: String::new() });
            continue;
        }
        let Some(entry) = entries.last_mut() else { continue };
        if let Some(pairs) = line.strip_prefix("# ") {
            // "Key: value  Key: value"
            let mut words = pairs.split_whitespace();
            while let (Some(key), Some(value)) = (words.next(), words.next()) {
                entry.figures.insert(key.trim_end_matches(':').to_string(), value.to_string());
            }
            entry.thread = entry.figures.get("Thread_id").and_then(|t| t.parse().ok()).unwrap_or(entry.thread);
        } else if !line.starts_with("SET timestamp=") && !line.starts_with("use ") {
            entry.text.push_str(line);
        }
    }
    entries
}

/// The slow log's figures of a connection's prepared executions (between
/// `PREPARED_PHASE` and `TEXT_PHASE`) of one shape.
fn prepared_figures(entries: &[SlowEntry], thread: u64, marker: &str) -> BTreeMap<&'static str, u64> {
    let mut out: BTreeMap<&'static str, u64> = FIGURES.iter().map(|(_, ours)| (*ours, 0)).collect();
    let mut prepared = false;
    for entry in entries.iter().filter(|e| e.thread == thread) {
        if entry.text.contains("q_phase_prepared") {
            prepared = true;
            continue;
        }
        if entry.text.contains("q_phase_text") {
            prepared = false;
            continue;
        }
        if !prepared || !entry.text.contains(marker) {
            continue;
        }
        let number = |key: &str| entry.figures.get(key).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
        let yes = |key: &str| u64::from(entry.figures.get(key).is_some_and(|v| v == "Yes"));
        for (field, value) in [
            ("count", 1),
            ("rows_sent", number("Rows_sent")),
            ("rows_examined", number("Rows_examined")),
            ("rows_affected", number("Rows_affected")),
            ("tmp_tables", number("Tmp_tables")),
            ("tmp_disk_tables", number("Tmp_disk_tables")),
            ("sort_merge_passes", number("Merge_passes")),
            ("select_scan", yes("Full_scan")),
            ("select_full_join", yes("Full_join")),
        ] {
            *out.get_mut(field).unwrap() += value;
        }
    }
    out
}

/// What the server counted per (schema, marker): its digest table for the
/// statements sent as text, and its slow log for the prepared executions
/// (MariaDB's digest table leaves `COM_STMT_EXECUTE` out: checked here, its
/// `prepared_statements_instances` keeps `COUNT_EXECUTE` at 0). The slow log
/// has no index-use figures; a shape's plan is the same in both protocols,
/// so its prepared executions flag as its text ones do.
fn server_figures(
    server: &PrivateServer,
    sessions: &mut [Session],
) -> BTreeMap<(String, &'static str), BTreeMap<&'static str, u64>> {
    let columns: Vec<String> = FIGURES.iter().map(|(c, _)| format!("COALESCE(SUM({c}), 0)")).collect();
    server.sql("FLUSH SLOW LOGS").unwrap();
    let entries = slow_log(&server.dir().join("data/slow.log"));
    let mut out = BTreeMap::new();
    for session in sessions.iter_mut() {
        let thread = u64::from(session.conn.connection_id());
        for shape in SHAPES {
            let text: Vec<u64> = server
                .sql(&format!(
                    "SELECT {} FROM performance_schema.events_statements_summary_by_digest
                     WHERE SCHEMA_NAME = '{}' AND DIGEST_TEXT LIKE '%{}%'",
                    columns.join(", "),
                    session.schema,
                    shape.marker
                ))
                .unwrap()
                .trim()
                .split('\t')
                .map(|v| v.parse().unwrap())
                .collect();
            let text: BTreeMap<&'static str, u64> = FIGURES.iter().zip(text).map(|((_, ours), v)| (*ours, v)).collect();
            let mut figures = prepared_figures(&entries, thread, shape.marker);
            assert_eq!(
                figures["count"],
                shape.values.len() as u64,
                "{}: prepared executions in the slow log",
                shape.marker
            );
            for flag in ["no_index_used", "no_good_index_used"] {
                assert!(
                    text[flag] == 0 || text[flag] == text["count"],
                    "{}: {flag} differs between statements",
                    shape.marker
                );
                figures.insert(flag, if text[flag] == 0 { 0 } else { figures["count"] });
            }
            for (field, value) in &text {
                *figures.get_mut(field).unwrap() += value;
            }
            out.insert((session.schema.to_string(), shape.marker), figures);
        }
    }
    out
}

/// The agent's sums per (schema, marker), over every window.
fn agent_figures(out: &AgentOutput) -> BTreeMap<(String, &'static str), BTreeMap<&'static str, u64>> {
    let mut sums = BTreeMap::new();
    for schema in SCHEMAS {
        for shape in SHAPES {
            let mut figures: BTreeMap<&'static str, u64> = FIGURES.iter().map(|(_, ours)| (*ours, 0)).collect();
            for row in out.of_type("digest").filter(|d| {
                d["schema"] == schema && d["digest_text"].as_str().is_some_and(|t| t.contains(shape.marker))
            }) {
                for (_, field) in FIGURES {
                    let value = row[field].as_u64().unwrap_or_else(|| panic!("{field} missing in {row:#}"));
                    *figures.get_mut(field).unwrap() += value;
                }
            }
            sums.insert((schema.to_string(), shape.marker), figures);
        }
    }
    sums
}

/// An agent on `server` with short windows, shipping to `collector`, with
/// `extra` flags, after performance_schema's digest table was emptied.
fn start_agent(server: &PrivateServer, collector: &Collector, extra: &[&str]) -> Agent {
    let state = server.dir().join("agent-state");
    let mut args = vec![
        format!("--pid={}", server.pid()),
        "--window=500ms".into(),
        format!("--collector={}", collector.http_url()),
        format!("--state-dir={}", state.display()),
    ];
    args.extend(extra.iter().map(|a| a.to_string()));
    server.sql("TRUNCATE performance_schema.events_statements_summary_by_digest").unwrap();
    Agent::start(server.dir(), &args)
}

fn figures_equal_performance_schema(kernel_digests: bool) {
    let _serial = common::one_at_a_time();
    let server = server();
    let collector = Collector::start(&[]);
    let extra: &[&str] = if kernel_digests { &[] } else { &["--kernel-digests=0"] };
    let agent = start_agent(&server, &collector, extra);
    let mut sessions = workload(&server);
    std::thread::sleep(Duration::from_millis(700));
    let out = agent.stop();
    assert!(out.success, "{}", out.stderr);
    let expected = server_figures(&server, &mut sessions);
    for session in sessions {
        let mut conn = session.conn;
        for stmt in session.prepared {
            conn.close(stmt).unwrap();
        }
    }
    let got = agent_figures(&out);
    for (key, figures) in &expected {
        // Every shape ran in every schema, and each figure the corpus is
        // meant to hit did hit somewhere.
        assert!(figures["count"] > 0, "{key:?} never reached performance_schema");
        assert_eq!(got.get(key), Some(figures), "{key:?}: agent (left) against performance_schema (right)");
    }
    for field in
        ["rows_examined", "rows_affected", "no_index_used", "tmp_disk_tables", "sort_merge_passes", "select_full_join"]
    {
        assert!(expected.values().any(|f| f[field] > 0), "the corpus never hit {field}: {expected:#?}");
    }
    if kernel_digests {
        assert!(out.summary_total(None, "aggregated_in_kernel") > 0, "no statement was counted in the kernel");
    }
    // The same text in two schemas is two rows.
    let scans: Vec<&Value> =
        out.of_type("digest").filter(|d| d["digest_text"].as_str().is_some_and(|t| t.contains("q_scan"))).collect();
    let schemas: std::collections::BTreeSet<&str> = scans.iter().filter_map(|d| d["schema"].as_str()).collect();
    assert_eq!(schemas.into_iter().collect::<Vec<_>>(), SCHEMAS.to_vec());
    stored_figures_equal(&collector, &got);
    // Accounts: every statement here ran as root over the socket.
    for row in out.of_type("digest").filter(|d| d["schema"] == SCHEMAS[0]) {
        let count = row["count"].as_u64().unwrap();
        assert_eq!(row["users"]["root"].as_u64(), Some(count), "{row:#}");
        assert_eq!(row["hosts"]["localhost"].as_u64(), Some(count), "{row:#}");
    }
}

/// The collector's answer (`sqlbee top --schema`) holds the same figures
/// per (schema, marker), ranks by them, and names the accounts.
fn stored_figures_equal(collector: &Collector, agent: &BTreeMap<(String, &'static str), BTreeMap<&'static str, u64>>) {
    let url = collector.http_url();
    for schema in SCHEMAS {
        let rows = top_json(&url, &["--schema", schema, "--limit", "1000"]);
        let rows = rows.as_array().unwrap();
        assert!(rows.iter().all(|r| r["schema"] == schema), "{rows:#?}");
        for shape in SHAPES {
            let mut figures: BTreeMap<&'static str, u64> = FIGURES.iter().map(|(_, ours)| (*ours, 0)).collect();
            for row in rows.iter().filter(|r| r["digest_text"].as_str().is_some_and(|t| t.contains(shape.marker))) {
                for (_, field) in FIGURES {
                    *figures.get_mut(field).unwrap() +=
                        row[field].as_u64().unwrap_or_else(|| panic!("{field}: {row:#}"));
                }
                let accounts: u64 =
                    row["accounts"].as_array().unwrap().iter().map(|a| a["count"].as_u64().unwrap()).sum();
                assert_eq!(accounts, row["count"].as_u64().unwrap(), "{row:#}");
            }
            assert_eq!(
                Some(&figures),
                agent.get(&(schema.to_string(), shape.marker)),
                "{schema} {}: stored",
                shape.marker
            );
        }
    }
    for (order, field) in [("rows_examined", "rows_examined"), ("cpu", "cpu_ns"), ("tmp_disk", "tmp_disk_tables")] {
        let rows = top_json(&url, &["--order-by", order, "--limit", "1000"]);
        let ranked: Vec<u64> = rows.as_array().unwrap().iter().map(|r| r[field].as_u64().unwrap_or(0)).collect();
        assert!(ranked.windows(2).all(|w| w[0] >= w[1]), "--order-by {order}: {ranked:?}");
        assert!(ranked[0] > 0, "--order-by {order}: {ranked:?}");
    }
}

#[test]
fn figures_equal_performance_schema_with_kernel_digests() {
    if !privileged("figures_equal_performance_schema_with_kernel_digests") {
        return;
    }
    figures_equal_performance_schema(true);
}

#[test]
fn figures_equal_performance_schema_without_kernel_digests() {
    if !privileged("figures_equal_performance_schema_without_kernel_digests") {
        return;
    }
    figures_equal_performance_schema(false);
}

/// `--figures lean,rows_examined`: every statement still counted in its
/// digest and schema, through the kernel digests too, with the one server
/// figure asked for exact against performance_schema, and every other one
/// absent (never 0) from the agent's lines and the collector's answer.
#[test]
fn a_lean_agent_counts_every_statement_and_reads_only_the_figures_asked_for() {
    if !privileged("a_lean_agent_counts_every_statement_and_reads_only_the_figures_asked_for") {
        return;
    }
    let _serial = common::one_at_a_time();
    let server = server();
    let collector = Collector::start(&[]);
    let agent = start_agent(&server, &collector, &["--figures=lean,rows_examined"]);
    let mut sessions = workload(&server);
    std::thread::sleep(Duration::from_millis(700));
    let out = agent.stop();
    assert!(out.success, "{}", out.stderr);
    assert!(out.stderr.contains("figures not read"), "{}", out.stderr);
    let expected = server_figures(&server, &mut sessions);
    let asked = ["count", "rows_examined"];
    let left_out: Vec<&str> = sqlbee_figures::FIGURES
        .iter()
        .filter(|f| f.needs != sqlbee_figures::needs::ALWAYS && f.name != "rows_examined")
        .map(|f| f.name)
        .collect();
    assert!(left_out.contains(&"cpu_ns") && left_out.contains(&"tmp_tables"), "{left_out:?}");
    for ((schema, marker), figures) in &expected {
        let rows: Vec<&Value> = out
            .of_type("digest")
            .filter(|d| d["schema"] == schema.as_str() && d["digest_text"].as_str().is_some_and(|t| t.contains(marker)))
            .collect();
        for field in asked {
            let got: u64 = rows.iter().map(|r| r[field].as_u64().unwrap_or_else(|| panic!("{field}: {r:#}"))).sum();
            assert_eq!(got, figures[field], "{schema} {marker}: {field}, agent against performance_schema");
        }
        for row in &rows {
            assert!(row["lock_ns"].is_u64(), "lock time is always read: {row:#}");
            for field in &left_out {
                assert!(row[field].is_null(), "{field} was not asked for: {row:#}");
            }
        }
    }
    assert!(expected.values().any(|f| f["rows_examined"] > 0));
    assert!(out.summary_total(None, "aggregated_in_kernel") > 0, "no statement was counted in the kernel");
    for session in sessions {
        let mut conn = session.conn;
        for stmt in session.prepared {
            conn.close(stmt).unwrap();
        }
    }
    // The collector keeps the absence: its answer has the asked figure and
    // no other.
    for schema in SCHEMAS {
        let rows = top_json(&collector.http_url(), &["--schema", schema, "--limit", "1000"]);
        for shape in SHAPES {
            let rows: Vec<&Value> = rows
                .as_array()
                .unwrap()
                .iter()
                .filter(|r| r["digest_text"].as_str().is_some_and(|t| t.contains(shape.marker)))
                .collect();
            let stored: u64 = rows.iter().map(|r| r["rows_examined"].as_u64().unwrap()).sum();
            assert_eq!(
                stored,
                expected[&(schema.to_string(), shape.marker)]["rows_examined"],
                "{schema} {}",
                shape.marker
            );
            for row in rows {
                for field in &left_out {
                    assert!(row.get(*field).is_none_or(Value::is_null), "{field} stored: {row:#}");
                }
            }
        }
    }
}

/// `--figures lean` keeps of the counters' window only what tells
/// connections and statement ends apart (connection id, applier flag,
/// query id). Connections of two accounts come and go one after the other
/// (a new one can get the last one's THD address and thread),
/// with one thread per connection and with a one-thread pool, and every
/// statement still lands on its own account, an `EXECUTE IMMEDIATE` and a
/// prepared statement the server prepares again after an `ALTER TABLE`
/// are counted once, and each statement of a multi-statement packet once.
#[test]
fn a_lean_agent_keeps_connections_and_statement_ends_apart() {
    if !privileged("a_lean_agent_keeps_connections_and_statement_ends_apart") {
        return;
    }
    let _serial = common::one_at_a_time();
    const ROUNDS: u64 = 8;
    const REPEATS: u64 = 5;
    for (name, handling) in [
        ("lean-threads", &["--thread-handling=one-thread-per-connection"][..]),
        ("lean-pool", &["--thread-handling=pool-of-threads", "--thread-pool-size=1"][..]),
    ] {
        let server = PrivateServer::start(name, handling).unwrap();
        server.sql("CREATE DATABASE lean").unwrap();
        server.sql("CREATE TABLE lean.t (id INT PRIMARY KEY)").unwrap();
        for user in ["lean_a", "lean_b"] {
            server.sql(&format!("CREATE USER {user}@localhost IDENTIFIED BY 'lean-pw'")).unwrap();
            server.sql(&format!("GRANT SELECT ON *.* TO {user}@localhost")).unwrap();
        }
        let agent = Agent::start(
            server.dir(),
            &[format!("--pid={}", server.pid()), "--window=500ms".into(), "--figures=lean".into()],
        );
        for round in 0..ROUNDS {
            let user = if round % 2 == 0 { "lean_a" } else { "lean_b" };
            let opts = mysql::OptsBuilder::new()
                .socket(Some(server.socket.to_str().unwrap()))
                .user(Some(user))
                .pass(Some("lean-pw"))
                .prefer_socket(true);
            let mut conn = mysql::Conn::new(opts).unwrap();
            for i in 0..REPEATS {
                conn.query_drop(format!("SELECT {i} AS q_{user}")).unwrap();
            }
            conn.query_drop("EXECUTE IMMEDIATE 'SELECT 7 AS q_lean_immediate'").unwrap();
            let mut results = conn.query_iter("SELECT 1 AS q_lean_multi_one; SELECT 2 AS q_lean_multi_two").unwrap();
            while let Some(set) = results.iter() {
                set.for_each(drop);
            }
            drop(results);
            // Its second execution follows a change of its table: the
            // server prepares it again, and it ends twice.
            let prepared = conn.prep("SELECT id AS q_lean_prepared FROM lean.t WHERE id = ?").unwrap();
            conn.exec_drop(&prepared, (1,)).unwrap();
            server.sql(&format!("ALTER TABLE lean.t ADD COLUMN c{round} INT")).unwrap();
            conn.exec_drop(&prepared, (2,)).unwrap();
            conn.close(prepared).unwrap();
            drop(conn);
        }
        std::thread::sleep(Duration::from_millis(700));
        let out = agent.stop();
        assert!(out.success, "{handling:?}: {}", out.stderr);
        let rows = |marker: &str| -> Vec<Value> {
            out.of_type("digest")
                .filter(|d| d["digest_text"].as_str().is_some_and(|t| t.contains(marker)))
                .cloned()
                .collect()
        };
        let count = |marker: &str| -> u64 { rows(marker).iter().map(|r| r["count"].as_u64().unwrap()).sum() };
        for user in ["lean_a", "lean_b"] {
            let mut accounts = BTreeMap::new();
            for row in rows(&format!("q_{user}")) {
                for (account, n) in row["accounts"].as_object().unwrap_or_else(|| panic!("no accounts: {row:#}")) {
                    *accounts.entry(account.clone()).or_insert(0) += n.as_u64().unwrap();
                }
            }
            let expected = BTreeMap::from([(format!("{user}@localhost"), ROUNDS / 2 * REPEATS)]);
            assert_eq!(accounts, expected, "{handling:?}: statements of {user}, by account");
        }
        assert_eq!(count("q_lean_immediate"), ROUNDS, "{handling:?}: EXECUTE IMMEDIATE counted once each");
        assert_eq!(count("q_lean_prepared"), 2 * ROUNDS, "{handling:?}: a reprepared statement counted once");
        assert!(out.summary_total(None, "duplicate_hits") >= ROUNDS, "{handling:?}: the second ends");
        assert_eq!(count("q_lean_multi_one"), ROUNDS, "{handling:?}");
        assert_eq!(count("q_lean_multi_two"), ROUNDS, "{handling:?}");
        // Nothing the lean tier leaves out is there.
        for row in rows("q_lean_") {
            assert!(row["rows_examined"].is_null() && row["cpu_ns"].is_null(), "{row:#}");
        }
    }
}

/// A statement that computes for its whole run reports most of its
/// latency as CPU time; one that sleeps reports almost none.
#[test]
fn cpu_time_is_the_statements_own() {
    if !privileged("cpu_time_is_the_statements_own") {
        return;
    }
    let _serial = common::one_at_a_time();
    let server = PrivateServer::start("analytics-cpu", &[]).unwrap();
    let agent = Agent::start(server.dir(), &[format!("--pid={}", server.pid()), "--window=500ms".into()]);
    let mut conn = connect(&server, "mysql");
    // The thread's first statement since the attach has no mark to
    // measure from.
    conn.query_drop("SELECT 1 AS q_first").unwrap();
    for _ in 0..3 {
        conn.query_drop("SELECT BENCHMARK(2000000, MD5('sqlbee')) AS q_cpu").unwrap();
        conn.query_drop("SELECT SLEEP(0.3) AS q_sleep").unwrap();
    }
    std::thread::sleep(Duration::from_millis(700));
    let out = agent.stop();
    assert!(out.success, "{}", out.stderr);
    let sum = |marker: &str, field: &str| -> u64 {
        out.of_type("digest")
            .filter(|d| d["digest_text"].as_str().is_some_and(|t| t.contains(marker)))
            .map(|d| d[field].as_u64().unwrap())
            .sum()
    };
    assert_eq!((sum("q_cpu", "count"), sum("q_cpu", "cpu_statements")), (3, 3));
    let (busy, busy_latency) = (sum("q_cpu", "cpu_ns"), sum("q_cpu", "sum_ns"));
    assert!(busy * 10 >= busy_latency * 6, "BENCHMARK: cpu {busy} ns of {busy_latency} ns");
    let (idle, idle_latency) = (sum("q_sleep", "cpu_ns"), sum("q_sleep", "sum_ns"));
    assert!(idle_latency >= 3 * 300_000_000, "{idle_latency}");
    assert!(idle * 20 <= idle_latency, "SLEEP: cpu {idle} ns of {idle_latency} ns");
}

/// One connection that switches schema between statements, by `USE` and by
/// the protocol's COM_INIT_DB, between two names of the same length: the
/// kernel keeps a thread's schema until the server changes it, and each
/// statement still lands on the schema it ran in.
#[test]
fn schema_follows_every_change_on_one_connection() {
    if !privileged("schema_follows_every_change_on_one_connection") {
        return;
    }
    let _serial = common::one_at_a_time();
    let server = PrivateServer::start("analytics-use", &[]).unwrap();
    for schema in SCHEMAS {
        server.sql(&format!("CREATE DATABASE {schema}")).unwrap();
    }
    let agent = Agent::start(server.dir(), &[format!("--pid={}", server.pid()), "--window=500ms".into()]);
    let mut conn = connect(&server, SCHEMAS[0]);
    const ROUNDS: u64 = 25;
    for _ in 0..ROUNDS {
        for schema in SCHEMAS {
            conn.query_drop(format!("USE {schema}")).unwrap();
            conn.query_drop("SELECT 1 AS q_after_use").unwrap();
        }
        for schema in SCHEMAS.iter().rev() {
            conn.select_db(schema).unwrap();
            conn.query_drop("SELECT 1 AS q_after_init_db").unwrap();
        }
    }
    std::thread::sleep(Duration::from_millis(700));
    let out = agent.stop();
    assert!(out.success, "{}", out.stderr);
    for marker in ["q_after_use", "q_after_init_db"] {
        for schema in SCHEMAS {
            let count: u64 = out
                .of_type("digest")
                .filter(|d| d["schema"] == schema && d["digest_text"].as_str().is_some_and(|t| t.contains(marker)))
                .map(|d| d["count"].as_u64().unwrap())
                .sum();
            assert_eq!(count, ROUNDS, "{marker} in {schema}");
        }
    }
}
