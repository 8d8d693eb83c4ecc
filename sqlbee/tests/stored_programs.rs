//! Statements inside stored programs: a client's statement is counted once
//! at top level, whatever `log_slow_disabled_statements` says; each
//! statement its procedures, functions and triggers run gets a row of its
//! own, nested, timed from its own start, named by its program and its
//! parent; an event's statements carry `source: event`; a replica's
//! applier `source: replica`. Every count is compared with what the
//! workload ran. Needs root: real eBPF programs on real mariadbd servers.
mod common;

use std::{
    collections::BTreeMap,
    time::{Duration, Instant},
};

use common::{
    Agent, AgentOutput, PrivateServer,
    collector::{Collector, sqlbee_query, top_json},
    privileged,
};
use mysql::prelude::Queryable;
use serde_json::Value;

/// One statement each: procedure and function bodies hold `;`.
const SETUP: &[&str] = &[
    "CREATE DATABASE shop",
    "USE shop",
    "CREATE TABLE shop.t (id INT PRIMARY KEY, v INT)",
    "CREATE TABLE shop.stock (id INT PRIMARY KEY, qty INT)",
    "CREATE TABLE shop.audit (id INT AUTO_INCREMENT PRIMARY KEY, note VARCHAR(20))",
    "CREATE TABLE shop.slow (id INT PRIMARY KEY, v INT)",
    "INSERT INTO shop.t SELECT seq, 0 FROM seq_1_to_10",
    "INSERT INTO shop.stock SELECT seq, 0 FROM seq_1_to_10",
    "INSERT INTO shop.slow SELECT seq, 0 FROM seq_1_to_10",
    "CREATE TRIGGER shop.trg_audit AFTER UPDATE ON shop.t FOR EACH ROW INSERT INTO shop.audit (note) VALUES ('u')",
    "CREATE TRIGGER shop.trg_slow BEFORE UPDATE ON shop.slow FOR EACH ROW SET @slept = SLEEP(0.1)",
    "CREATE PROCEDURE shop.p_restock(k INT) BEGIN
        UPDATE shop.stock SET qty = qty + 1 WHERE id = k;
        SELECT qty INTO @q FROM shop.stock WHERE id = k;
        UPDATE shop.t SET v = v + 1 WHERE id = k;
    END",
    "CREATE FUNCTION shop.f_double(k INT) RETURNS INT READS SQL DATA BEGIN
        DECLARE r INT;
        SELECT v INTO r FROM shop.t WHERE id = k;
        RETURN r * 2;
    END",
    "CREATE EVENT shop.ev_tick ON SCHEDULE EVERY 1 SECOND DO INSERT INTO shop.audit (note) VALUES ('e')",
];

fn setup(server: &PrivateServer) {
    let mut conn = connect(server);
    for statement in SETUP {
        conn.query_drop(statement).unwrap_or_else(|e| panic!("{statement}: {e}"));
    }
}

const CALLS: u64 = 20;
const UPDATES: u64 = 15;
const FUNCTION_ROWS: u64 = 10;
const FUNCTION_RUNS: u64 = 3;
const MULTI: u64 = 5;
const EXECUTES: u64 = 7;

fn connect(server: &PrivateServer) -> mysql::Conn {
    let opts =
        mysql::OptsBuilder::new().socket(Some(server.socket.to_str().unwrap())).user(Some("root")).prefer_socket(true);
    mysql::Conn::new(opts).unwrap()
}

/// Rows of the agent's output by (nested, program, digest text): counts
/// summed over windows, with the parent digest texts they name.
struct Rows<'a> {
    out: &'a AgentOutput,
}

impl<'a> Rows<'a> {
    fn top(&self) -> impl Iterator<Item = &'a Value> + 'a {
        self.out.of_type("digest").filter(|d| d["nested"] == false && d["source"] == "client")
    }

    fn nested(&self, program: &str) -> impl Iterator<Item = &'a Value> + 'a {
        let program = program.to_string();
        self.out.of_type("digest").filter(move |d| d["nested"] == true && d["program"] == program.as_str())
    }

    fn count<'b>(rows: impl Iterator<Item = &'b Value>, needle: &str) -> u64 {
        rows.filter(|d| d["digest_text"].as_str().is_some_and(|t| t.contains(needle)))
            .map(|d| d["count"].as_u64().unwrap())
            .sum()
    }

    /// Digest text of a top-level row, by its digest id.
    fn text_of(&self, digest: &str) -> Option<String> {
        self.out
            .of_type("digest")
            .find(|d| d["digest"] == digest)
            .and_then(|d| d["digest_text"].as_str().map(str::to_string))
    }

    /// Per parent digest text: the nested statements of `program` it ran.
    fn parents(&self, program: &str) -> BTreeMap<String, u64> {
        let mut out = BTreeMap::new();
        for d in self.nested(program) {
            let parent = d["parent_digest"].as_str().and_then(|p| self.text_of(p)).unwrap_or_else(|| "(none)".into());
            *out.entry(parent).or_default() += d["count"].as_u64().unwrap();
        }
        out
    }
}

fn programs_are_counted_apart(disabled: &str) {
    let _serial = common::one_at_a_time();
    let setting = format!("--log-slow-disabled-statements={disabled}");
    let server = PrivateServer::start("stored-programs", &[&setting, "--event-scheduler=OFF"]).unwrap();
    setup(&server);
    // Connected first: what the client library runs at connect is not the
    // workload's.
    let mut conn = connect(&server);
    let collector = Collector::start(&[]);
    let state = server.dir().join("agent-state");
    let agent = Agent::start(
        server.dir(),
        &[
            format!("--pid={}", server.pid()),
            "--window=500ms".into(),
            format!("--collector={}", collector.http_url()),
            format!("--state-dir={}", state.display()),
        ],
    );
    conn.query_drop("SET GLOBAL event_scheduler = ON").unwrap();
    let mut sent = 1u64;
    for i in 0..CALLS {
        conn.query_drop(format!("CALL shop.p_restock({})", i % 5 + 1)).unwrap();
    }
    for i in 0..UPDATES {
        conn.query_drop(format!("UPDATE shop.t SET v = v + 1 WHERE id = {}", i % 5 + 6)).unwrap();
    }
    for _ in 0..FUNCTION_RUNS {
        let doubled: Vec<i64> = conn.query("SELECT shop.f_double(id) AS doubled FROM shop.t").unwrap();
        assert_eq!(doubled.len() as u64, FUNCTION_ROWS);
    }
    // Each part of a multi-statement packet is a statement of its own.
    for _ in 0..MULTI {
        let mut results = conn.query_iter("SELECT 1 AS multi_one; SELECT 2 AS multi_two").unwrap();
        while let Some(set) = results.iter() {
            set.for_each(drop);
        }
    }
    // SQL-level EXECUTE is counted under the prepared text.
    conn.query_drop("PREPARE s FROM 'SELECT v AS executed FROM shop.t WHERE id = ?'").unwrap();
    for i in 0..EXECUTES {
        conn.query_drop(format!("SET @k = {}", i % 10 + 1)).unwrap();
        conn.query_drop("EXECUTE s USING @k").unwrap();
    }
    conn.query_drop("DEALLOCATE PREPARE s").unwrap();
    // Let the event run a few times, then stop it before the agent stops.
    std::thread::sleep(Duration::from_millis(2500));
    conn.query_drop("SET GLOBAL event_scheduler = OFF").unwrap();
    sent += CALLS + UPDATES + FUNCTION_RUNS + 2 * MULTI + 1 + 2 * EXECUTES + 1 + 1;
    std::thread::sleep(Duration::from_millis(1500));
    let out = agent.stop();
    drop(conn);
    assert!(out.success, "{}", out.stderr);
    let events: u64 = server.sql("SELECT COUNT(*) FROM shop.audit WHERE note = 'e'").unwrap().trim().parse().unwrap();
    let rows = Rows { out: &out };

    // Top level: exactly what this connection sent (the agent attached
    // before it connected, and the status read above came after its last).
    let top: u64 = rows.top().map(|d| d["count"].as_u64().unwrap()).sum();
    assert_eq!(top, sent, "client statements: {:#?}", rows.top().collect::<Vec<_>>());
    assert_eq!(out.summary_total(None, "statements") - out.summary_total(None, "unmatched"), top);
    assert_eq!(Rows::count(rows.top(), "CALL `shop`.`p_restock`"), CALLS);
    assert_eq!(Rows::count(rows.top(), "UPDATE `shop`.`t`"), UPDATES);
    assert_eq!(Rows::count(rows.top(), "multi_one"), MULTI);
    assert_eq!(Rows::count(rows.top(), "multi_two"), MULTI);
    assert_eq!(Rows::count(rows.top(), "AS `executed`"), EXECUTES, "EXECUTE under the prepared text");

    // The procedure's three statements, once per CALL, under the CALL.
    let restock = rows.parents("shop.p_restock");
    assert_eq!(restock.len(), 1, "{restock:#?}");
    assert!(restock.keys().next().unwrap().contains("CALL"), "{restock:#?}");
    assert_eq!(restock.values().sum::<u64>(), 3 * CALLS, "{restock:#?}");
    assert!(rows.nested("shop.p_restock").all(|d| d["program_kind"] == "procedure"));
    // The trigger: fired by the client's UPDATEs and by the procedure's.
    let audit = rows.parents("shop.trg_audit");
    assert_eq!(audit.values().sum::<u64>(), UPDATES + CALLS, "{audit:#?}");
    let by_update: u64 = audit.iter().filter(|(p, _)| p.starts_with("UPDATE")).map(|(_, n)| n).sum();
    let by_call: u64 = audit.iter().filter(|(p, _)| p.contains("CALL")).map(|(_, n)| n).sum();
    assert_eq!((by_update, by_call), (UPDATES, CALLS), "{audit:#?}");
    assert!(rows.nested("shop.trg_audit").all(|d| d["program_kind"] == "trigger"));
    // The function's SELECT, once per row it was called for.
    let function = rows.parents("shop.f_double");
    assert_eq!(function.values().sum::<u64>(), FUNCTION_ROWS * FUNCTION_RUNS, "{function:#?}");
    assert!(function.keys().all(|p| p.contains("doubled")), "{function:#?}");
    // The event's statements: no client parent, source event.
    let event_rows: Vec<&Value> = out.of_type("digest").filter(|d| d["program"] == "shop.ev_tick").collect();
    assert!(event_rows.iter().all(|d| d["source"] == "event" && d["parent_digest"].is_null()), "{event_rows:#?}");
    let ran: u64 = event_rows.iter().map(|d| d["count"].as_u64().unwrap()).sum();
    assert_eq!(ran, events, "the event's inserts");
    assert!(events >= 2, "the event ran {events} times");
    // Nested statements are counted apart, every one in a row.
    let nested_rows: u64 =
        out.of_type("digest").filter(|d| d["nested"] == true).map(|d| d["count"].as_u64().unwrap()).sum();
    assert_eq!(out.summary_total(None, "nested_statements"), nested_rows + out.summary_total(None, "nested_unmatched"));
    assert_eq!(nested_rows, 3 * CALLS + UPDATES + CALLS + FUNCTION_ROWS * FUNCTION_RUNS + events);
    // Digest text reads like the source: variables are values, operators
    // whole, words that are not keywords keep their case.
    let texts: Vec<&str> = rows.nested("shop.p_restock").filter_map(|d| d["digest_text"].as_str()).collect();
    assert!(texts.iter().all(|t| !t.contains("NAME_CONST")), "{texts:#?}");
    assert!(texts.iter().any(|t| t.contains("`stock`")), "{texts:#?}");

    // The same through the collector: client statements by default, the
    // nested ones on request, a program's on its own.
    let url = collector.http_url();
    let count = |rows: &Value| -> u64 { rows.as_array().unwrap().iter().map(|r| r["count"].as_u64().unwrap()).sum() };
    let stored_top = top_json(&url, &["--limit", "1000"]);
    assert!(stored_top.as_array().unwrap().iter().all(|r| r["nested"] == false), "{stored_top:#}");
    assert_eq!(count(&stored_top), top);
    let stored_all = top_json(&url, &["--limit", "1000", "--nested"]);
    assert_eq!(count(&stored_all), top + nested_rows);
    let restock = top_json(&url, &["--program", "shop.p_restock", "--limit", "1000"]);
    assert_eq!(count(&restock), 3 * CALLS, "{restock:#}");
    assert!(
        restock.as_array().unwrap().iter().all(|r| r["program_kind"] == "procedure" && r["parent_digest"].is_string())
    );
    let table = sqlbee_query(&["top", "--collector", &url, "--since", "all", "--nested", "--limit", "1000"]);
    let table = String::from_utf8_lossy(&table.stdout);
    assert!(
        table.contains("-> [procedure shop.p_restock]") && table.contains("-> [trigger shop.trg_audit]"),
        "{table}"
    );
}

#[test]
fn programs_are_counted_apart_with_default_slow_log_settings() {
    if !privileged("programs_are_counted_apart_with_default_slow_log_settings") {
        return;
    }
    programs_are_counted_apart("sp");
}

#[test]
fn programs_are_counted_apart_with_every_statement_slow_logged() {
    if !privileged("programs_are_counted_apart_with_every_statement_slow_logged") {
        return;
    }
    programs_are_counted_apart("");
}

/// A trigger that sleeps 100 ms per row: the client's UPDATEs take that
/// long, the trigger's statements too, and top-level time counts it once.
#[test]
fn a_sleeping_trigger_is_not_counted_twice() {
    if !privileged("a_sleeping_trigger_is_not_counted_twice") {
        return;
    }
    let _serial = common::one_at_a_time();
    let server = PrivateServer::start("stored-programs-slow", &[]).unwrap();
    setup(&server);
    let mut conn = connect(&server);
    let agent = Agent::start(server.dir(), &[format!("--pid={}", server.pid()), "--window=500ms".into()]);
    const N: u64 = 10;
    let started = Instant::now();
    for i in 0..N {
        conn.query_drop(format!("UPDATE shop.slow SET v = v + 1 WHERE id = {}", i + 1)).unwrap();
    }
    let wall = started.elapsed().as_nanos() as u64;
    drop(conn);
    std::thread::sleep(Duration::from_millis(700));
    let out = agent.stop();
    assert!(out.success, "{}", out.stderr);
    let sum = |rows: Vec<&Value>| -> (u64, u64) {
        rows.iter().fold((0, 0), |(n, ns), d| (n + d["count"].as_u64().unwrap(), ns + d["sum_ns"].as_u64().unwrap()))
    };
    let updates = sum(out
        .of_type("digest")
        .filter(|d| d["nested"] == false && d["digest_text"].as_str().is_some_and(|t| t.contains("`slow`")))
        .collect());
    let sleeps = sum(out.of_type("digest").filter(|d| d["program"] == "shop.trg_slow").collect());
    assert_eq!((updates.0, sleeps.0), (N, N));
    let slept = N * 100_000_000;
    assert!(sleeps.1 >= slept && sleeps.1 < slept + slept / 2, "the trigger's statements: {} ns", sleeps.1);
    assert!(updates.1 >= slept && updates.1 <= wall, "the client's UPDATEs: {} ns of {wall} ns wall", updates.1);
    // All top-level time together fits in the wall time: nothing twice.
    let top: u64 = out.of_type("digest").filter(|d| d["nested"] == false).map(|d| d["sum_ns"].as_u64().unwrap()).sum();
    assert!(top <= wall, "top-level time {top} ns, wall {wall} ns");
}

/// A statement-based replica: what its applier runs is marked `replica`
/// and kept out of the client statements.
#[test]
fn a_replicas_applier_is_kept_apart() {
    if !privileged("a_replicas_applier_is_kept_apart") {
        return;
    }
    let _serial = common::one_at_a_time();
    let (primary, replica) = common::replication::pair("STATEMENT", 0);
    let caught_up = |expected: u64| {
        common::replication::caught_up(&primary, &replica);
        let n: u64 = replica.sql("SELECT COUNT(*) FROM rep.t").map(|r| r.trim().parse().unwrap_or(0)).unwrap_or(0);
        assert_eq!(n, expected, "the replica's rows");
    };
    caught_up(0);
    let agent = Agent::start(replica.dir(), &[format!("--pid={}", replica.pid()), "--window=500ms".into()]);
    const N: u64 = 40;
    for i in 0..N {
        primary.sql(&format!("INSERT INTO rep.t VALUES ({i}, {i})")).unwrap();
    }
    caught_up(N);
    const CLIENT: u64 = 9;
    for i in 0..CLIENT {
        replica.sql(&format!("SELECT v AS on_the_replica FROM rep.t WHERE id = {i}")).unwrap();
    }
    std::thread::sleep(Duration::from_millis(700));
    let out = agent.stop();
    assert!(out.success, "{}", out.stderr);
    let applied: u64 = out
        .of_type("digest")
        .filter(|d| {
            d["source"] == "replica" && d["digest_text"].as_str().is_some_and(|t| t.contains("INSERT INTO `rep`.`t`"))
        })
        .map(|d| d["count"].as_u64().unwrap())
        .sum();
    assert_eq!(applied, N, "{:#?}", out.of_type("digest").collect::<Vec<_>>());
    assert!(out.summary_total(None, "replica_statements") >= N);
    let client: u64 = out
        .of_type("digest")
        .filter(|d| d["source"] == "client")
        .filter(|d| d["digest_text"].as_str().is_some_and(|t| t.contains("on_the_replica")))
        .map(|d| d["count"].as_u64().unwrap())
        .sum();
    assert_eq!(client, CLIENT);
    assert!(
        !out.of_type("digest")
            .any(|d| d["source"] == "client"
                && d["digest_text"].as_str().is_some_and(|t| t.contains("INSERT INTO `rep`"))),
        "the applier's statements are not a client's"
    );
}
