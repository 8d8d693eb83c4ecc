//! What runs now, from a real agent reading a real MariaDB's memory and a
//! real collector answering `sqlbee activity`: a row-lock wait names its
//! blocker (idle in its transaction), a metadata-lock chain of three shows
//! as a tree, the page draws it, and no literal leaves in any answer. And
//! what ended badly: a statement killed and one whose client vanished are
//! events with their durations (`sqlbee long`), as is the long row-lock
//! wait with its blocker, each counted once in its digest.
mod common;

use std::{
    thread,
    time::{Duration, Instant},
};

use common::{
    Agent, PrivateServer, browser,
    collector::{Collector, sqlbee_query},
    login_file, privileged, root_conn,
};
use mysql::prelude::Queryable;
use serde_json::Value;

const EMAIL: &str = "ann.secret@example.com";

/// `sqlbee activity --format json` until `accept` takes the answer.
fn activity_until(url: &str, what: &str, within: Duration, accept: impl Fn(&Value) -> bool) -> (Value, Duration) {
    let started = Instant::now();
    loop {
        let out = sqlbee_query(&["activity", "--format", "json", "--collector", url]);
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        let answer: Value = serde_json::from_slice(&out.stdout).unwrap();
        assert!(!answer.to_string().contains(EMAIL), "a literal left in an activity answer: {answer}");
        if accept(&answer) {
            return (answer, started.elapsed());
        }
        assert!(started.elapsed() < within, "{what} not shown within {within:?}: {answer}");
        thread::sleep(Duration::from_millis(200));
    }
}

fn connection(answer: &Value, thread_id: u64) -> Option<&Value> {
    answer["activity"].as_array()?.iter().find(|c| c["thread_id"] == thread_id)
}

/// Runs `sql` on a connection of its own in a thread; returns its
/// connection id at once and the statement's outcome when it ends.
fn run_blocked(server: &PrivateServer, sql: &'static str) -> (u64, thread::JoinHandle<Result<(), String>>) {
    let mut conn = root_conn(server);
    let id: u64 = conn.query_first("SELECT CONNECTION_ID()").unwrap().unwrap();
    conn.query_drop("SET SESSION lock_wait_timeout = 60, SESSION innodb_lock_wait_timeout = 60").unwrap();
    (id, thread::spawn(move || conn.query_drop(sql).map_err(|e| e.to_string())))
}

#[test]
fn waits_name_their_blockers_live() {
    if !privileged("waits_name_their_blockers_live") {
        return;
    }
    let _serial = common::one_at_a_time();
    let server = PrivateServer::start("activity", &["--plugin-load-add=metadata_lock_info"]).unwrap();
    let mut root = root_conn(&server);
    root.query_drop(
        "CREATE DATABASE app; CREATE TABLE app.orders (id INT PRIMARY KEY, email VARCHAR(64), total INT) ENGINE=InnoDB; \
         INSERT INTO app.orders VALUES (1, 'a@example.com', 1), (2, 'b@example.com', 2); \
         CREATE USER 'sqlbee_live'@'localhost' IDENTIFIED BY 'live-pw'; \
         GRANT PROCESS ON *.* TO 'sqlbee_live'@'localhost'",
    )
    .unwrap();
    let login = login_file(server.dir(), "sqlbee_live", "live-pw");
    let collector = Collector::start(&[]);
    let url = collector.http_url();
    let agent = Agent::start(
        server.dir(),
        &[
            format!("--pid={}", server.pid()),
            format!("--collector={url}"),
            format!("--state-dir={}", server.dir().join("state").display()),
            "--window=1s".into(),
            format!("--server-login={}", login.display()),
            "--long-statement=1500ms".into(),
            // So a long statement carries its time waited per class.
            "--wait-probes".into(),
        ],
    );
    activity_until(&url, "the agent's first snapshot", Duration::from_secs(60), |a| {
        a["instances"].as_array().is_some_and(|i| !i.is_empty())
    });

    // A row lock held by a transaction that went idle.
    let mut holder = root_conn(&server);
    let holder_id: u64 = holder.query_first("SELECT CONNECTION_ID()").unwrap().unwrap();
    holder.query_drop("BEGIN").unwrap();
    holder.query_drop(format!("UPDATE app.orders SET email = '{EMAIL}' WHERE id = 1")).unwrap();
    let (waiter_id, waiter) =
        run_blocked(&server, "UPDATE app.orders SET email = 'ann.secret@example.com', total = 7 WHERE id = 1");
    let (answer, took) = activity_until(&url, "the row-lock wait", Duration::from_secs(10), |a| {
        connection(a, waiter_id).is_some_and(|c| c["blocked_by"] == holder_id)
    });
    eprintln!("the row-lock wait and its blocker showed {took:?} after it began");
    let waiting = connection(&answer, waiter_id).unwrap();
    assert_eq!(waiting["wait"], "row_lock", "{waiting}");
    assert_eq!(waiting["blocked_by_source"], "innodb_lock_waits");
    assert_eq!(waiting["command"], "Query");
    let live_digest = waiting["digest"].as_str().unwrap().to_string();
    let holding = connection(&answer, holder_id).unwrap();
    assert_eq!((holding["state"].as_str(), holding["command"].as_str()), (Some("idle in transaction"), Some("Sleep")));
    assert_eq!(holding["account"], "root@localhost");
    let first_ms = waiting["running_ms"].as_u64().unwrap();
    let (answer, _) = activity_until(&url, "the wait growing", Duration::from_secs(10), |a| {
        connection(a, waiter_id).is_some_and(|c| c["running_ms"].as_u64().unwrap() >= first_ms + 1000)
    });
    let chain = &answer["chains"][0];
    assert_eq!(
        (chain["thread_id"].as_u64(), chain["blocked"][0]["thread_id"].as_u64()),
        (Some(holder_id), Some(waiter_id))
    );
    holder.query_drop("ROLLBACK").unwrap();
    waiter.join().unwrap().unwrap();
    // The live digest is the one the statement is counted under once it ends.
    let started = Instant::now();
    loop {
        let top = sqlbee_query(&["top", "--format", "json", "--since", "all", "--limit", "100", "--collector", &url]);
        let top: Value = serde_json::from_slice(&top.stdout).unwrap();
        let counted = top["digests"].as_array().unwrap().iter().find(|d| d["digest"] == live_digest.as_str());
        if counted.is_some_and(|d| d["count"] == 1) {
            break;
        }
        assert!(started.elapsed() < Duration::from_secs(30), "{live_digest} is not counted once: {top}");
        thread::sleep(Duration::from_millis(300));
    }

    // A metadata-lock chain of three: ALTER waits behind an open
    // transaction, a SELECT waits behind the ALTER.
    holder.query_drop("BEGIN").unwrap();
    let _: Vec<(i64, String, i64)> = holder.query("SELECT id, email, total FROM app.orders").unwrap();
    let (alter_id, alter) = run_blocked(&server, "ALTER TABLE app.orders ADD COLUMN note VARCHAR(16)");
    activity_until(&url, "the ALTER waiting", Duration::from_secs(10), |a| {
        connection(a, alter_id).is_some_and(|c| c["wait"] == "metadata_lock")
    });
    let (select_id, select) =
        run_blocked(&server, "SELECT total FROM app.orders WHERE email = 'ann.secret@example.com'");
    let (answer, _) = activity_until(&url, "the chain of three", Duration::from_secs(10), |a| {
        connection(a, select_id).is_some_and(|c| c["blocked_by"] == alter_id)
            && connection(a, alter_id).is_some_and(|c| c["blocked_by"] == holder_id)
    });
    let chain = answer["chains"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["thread_id"] == holder_id)
        .unwrap_or_else(|| panic!("no chain rooted at the transaction: {answer}"));
    assert_eq!(chain["blocked"][0]["thread_id"], alter_id, "{chain}");
    assert_eq!(chain["blocked"][0]["blocked"][0]["thread_id"], select_id, "{chain}");
    assert_eq!(chain["blocked"][0]["source"], "metadata_lock_info");
    let slow = sqlbee_query(&["activity", "--min-duration", "1h", "--format", "json", "--collector", &url]);
    let slow: Value = serde_json::from_slice(&slow.stdout).unwrap();
    assert_eq!(slow["activity"].as_array().map(Vec::len), Some(0), "nothing has run an hour: {slow}");

    if browser::available("waits_name_their_blockers_live") {
        let page = browser::load(&format!("{}activity", collector.ui));
        assert!(page.console.is_empty(), "{:?}", page.console);
        assert!(
            page.dom.contains(&format!("data-thread=\"{select_id}\" data-blocked-by=\"{alter_id}\"")),
            "{}",
            page.dom
        );
        assert!(page.dom.contains("class=\"chain\""), "the page draws the chain");
        assert!(!page.dom.contains(EMAIL));
        let shots = browser::screenshot_dir();
        assert!(browser::screenshot(&format!("{}activity", collector.ui), &shots.join("activity.png")).is_empty());
    }
    holder.query_drop("COMMIT").unwrap();
    alter.join().unwrap().unwrap();
    select.join().unwrap().unwrap();

    // A statement killed, and one whose client goes away mid-statement.
    let (killed_id, killed) = run_blocked(&server, "SELECT SLEEP(30) AS killed_one");
    activity_until(&url, "the statement to kill", Duration::from_secs(10), |a| {
        connection(a, killed_id).is_some_and(|c| c["running_ms"].as_u64().unwrap() >= 1000)
    });
    root.query_drop(format!("KILL QUERY {killed_id}")).unwrap();
    // The server ends it with error 1317 (the client library may report the
    // error or the row SLEEP returns when interrupted; the event says).
    let _ = killed.join().unwrap();
    let mut client = std::process::Command::new("mariadb")
        .args(["--no-defaults", "-S", server.socket.to_str().unwrap(), "-uroot", "-e", "SELECT SLEEP(3) AS gone_one"])
        .spawn()
        .unwrap();
    let (answer, _) = activity_until(&url, "the statement whose client goes", Duration::from_secs(10), |a| {
        a["activity"].as_array().unwrap().iter().any(|c| c["sample"].as_str().is_some_and(|t| t.contains("gone_one")))
    });
    let gone_id = answer["activity"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["sample"].as_str().is_some_and(|t| t.contains("gone_one")))
        .unwrap()["thread_id"]
        .as_u64()
        .unwrap();
    client.kill().unwrap();
    client.wait().unwrap();

    let started = Instant::now();
    let events = loop {
        let out = sqlbee_query(&["long", "--format", "json", "--since", "all", "--collector", &url]);
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        let answer: Value = serde_json::from_slice(&out.stdout).unwrap();
        assert!(!answer.to_string().contains(EMAIL), "a literal left in an event: {answer}");
        let events = answer["statements"].as_array().unwrap().clone();
        let has =
            |thread: u64, outcome: &str| events.iter().any(|e| e["thread_id"] == thread && e["outcome"] == outcome);
        if has(killed_id, "killed") && has(gone_id, "disconnected") && has(waiter_id, "long") {
            break events;
        }
        assert!(started.elapsed() < Duration::from_secs(30), "not every event arrived: {answer}");
        thread::sleep(Duration::from_millis(300));
    };
    let event = |thread: u64| events.iter().find(|e| e["thread_id"] == thread).unwrap();
    let killed = event(killed_id);
    assert_eq!(killed["error_code"], 1317);
    assert!(killed["duration_ms"].as_u64().unwrap() >= 1000, "{killed}");
    let gone = event(gone_id);
    assert_eq!(gone["error_code"], 1160, "the server could not write to the vanished client: {gone}");
    assert!(gone["duration_ms"].as_u64().unwrap() >= 2900, "it ran to its end: {gone}");
    let waited = event(waiter_id);
    assert_eq!(waited["blocked_by"], holder_id, "the blocker the activity reads saw: {waited}");
    assert!(waited["waits"]["row_lock"].as_u64().unwrap() > 1_000_000_000, "{waited}");
    assert_eq!(waited["digest"], live_digest.as_str());
    // An event adds to no total: each of these digests counted once.
    let top = sqlbee_query(&["top", "--format", "json", "--since", "all", "--limit", "200", "--collector", &url]);
    let top: Value = serde_json::from_slice(&top.stdout).unwrap();
    for e in [killed, gone, waited] {
        let row = top["digests"].as_array().unwrap().iter().find(|d| d["digest"] == e["digest"]);
        assert_eq!(row.map(|d| d["count"].clone()), Some(Value::from(1)), "{e} in {top}");
    }
    // A deadlock: each session locks one row, then wants the other's.
    root.query_drop("INSERT INTO app.orders (id, email, total) VALUES (3, 'c@example.com', 3)").unwrap();
    let mut first = root_conn(&server);
    let first_id: u64 = first.query_first("SELECT CONNECTION_ID()").unwrap().unwrap();
    let mut second = root_conn(&server);
    let second_id: u64 = second.query_first("SELECT CONNECTION_ID()").unwrap().unwrap();
    first.query_drop("BEGIN; UPDATE app.orders SET total = 1 WHERE id = 2").unwrap();
    second.query_drop("BEGIN; UPDATE app.orders SET total = 2 WHERE id = 3").unwrap();
    let crossing = thread::spawn(move || {
        let outcome = first.query_drop("UPDATE app.orders SET total = 1 WHERE id = 3").map_err(|e| e.to_string());
        let _ = first.query_drop("ROLLBACK");
        outcome
    });
    thread::sleep(Duration::from_millis(300));
    let second_outcome =
        second.query_drop(format!("UPDATE app.orders SET email = '{EMAIL}' WHERE id = 2")).map_err(|e| e.to_string());
    let _ = second.query_drop("ROLLBACK");
    let first_outcome = crossing.join().unwrap();
    let (victim, other) = match (&first_outcome, &second_outcome) {
        (Err(e), Ok(())) if e.contains("1213") => (first_id, second_id),
        (Ok(()), Err(e)) if e.contains("1213") => (second_id, first_id),
        outcomes => panic!("one side is a deadlock's victim: {outcomes:?}"),
    };
    let started = Instant::now();
    let deadlock = loop {
        let out = sqlbee_query(&["long", "--format", "json", "--since", "all", "--collector", &url]);
        let answer: Value = serde_json::from_slice(&out.stdout).unwrap();
        assert!(!answer.to_string().contains(EMAIL), "a literal left in a deadlock: {answer}");
        let found = answer["statements"].as_array().unwrap().iter().find(|e| e["outcome"] == "deadlock").cloned();
        if let Some(found) = found {
            break found;
        }
        assert!(started.elapsed() < Duration::from_secs(30), "no deadlock event: {answer}");
        thread::sleep(Duration::from_millis(300));
    };
    assert_eq!(deadlock["thread_id"], victim, "the victim's statement is the event: {deadlock}");
    assert_eq!(deadlock["error_code"], 1213);
    assert_eq!(deadlock["deadlock_with"]["thread_id"], other, "the other side, as the server named it: {deadlock}");
    assert!(deadlock["deadlock_with"]["digest_text"].as_str().unwrap().starts_with("UPDATE `app`.`orders` SET"));

    if browser::available("waits_name_their_blockers_live") {
        let page = browser::load(&format!("{}activity?since=all", collector.ui));
        assert!(page.dom.contains(&format!("class=\"deadlock-with\" data-thread=\"{other}\"")), "{}", page.dom);
        assert!(page.dom.contains(&format!("data-outcome=\"killed\" data-thread=\"{killed_id}\"")), "{}", page.dom);
    }
    let out = agent.stop();
    assert!(!out.stderr.contains("panicked"), "{}", out.stderr);
}
