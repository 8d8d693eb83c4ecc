//! Plans, from a real agent logged in to a real MariaDB: a query on a
//! table without an index shows a full scan, adding the index brings a
//! second plan with the key (a plan change), and dropping it brings the
//! first plan back as a change again; an index added while no agent runs
//! is a change too, found by the collector. EXPLAIN never changes data,
//! plans keep no literal, and a login that fails is a warning while
//! counting stays exact.
mod common;

use std::{
    path::Path,
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

fn agent_args(server: &PrivateServer, login: &Path, collector: &Collector) -> Vec<String> {
    vec![
        format!("--pid={}", server.pid()),
        format!("--collector={}", collector.http_url()),
        format!("--state-dir={}", server.dir().join(format!("state-{}", collector.pid())).display()),
        "--window=1s".into(),
        format!("--server-login={}", login.display()),
        "--explain-rate=20".into(),
        "--plan-recheck=1s".into(),
    ]
}

/// Runs `sql` `times` times, then waits for a plan line `accept` takes.
fn plan_after(
    agent: &Agent,
    conn: &mut mysql::Conn,
    sql: &str,
    times: usize,
    accept: impl Fn(&Value) -> bool,
) -> Value {
    let started = Instant::now();
    loop {
        for _ in 0..times {
            conn.query_drop(sql).unwrap();
        }
        if let Some(plan) = agent.lines_so_far().into_iter().rev().find(|l| l["type"] == "plan" && accept(l)) {
            return plan;
        }
        if started.elapsed() > Duration::from_secs(60) {
            let plans: Vec<String> = agent
                .lines_so_far()
                .iter()
                .filter(|l| l["type"] == "plan" || l["type"] == "server_login")
                .map(Value::to_string)
                .collect();
            panic!("no such plan for {sql}: {}\nplans so far:\n{}", agent.stderr_text(), plans.join("\n"));
        }
        std::thread::sleep(Duration::from_millis(300));
    }
}

/// `sqlbee plans DIGEST --format json` once the collector holds a plan
/// `accept` takes.
fn stored_plans(url: &str, digest: &str, accept: impl Fn(&Value) -> bool) -> Value {
    let started = Instant::now();
    loop {
        let answer = sqlbee_query(&["plans", digest, "--format", "json", "--since", "all", "--collector", url]);
        assert!(answer.status.success(), "{}", String::from_utf8_lossy(&answer.stderr));
        let answer: Value = serde_json::from_slice(&answer.stdout).unwrap();
        if answer["plans"].as_array().is_some_and(|plans| plans.first().is_some_and(&accept)) {
            return answer;
        }
        assert!(started.elapsed() < Duration::from_secs(30), "the collector has no such plan: {answer}");
        std::thread::sleep(Duration::from_millis(300));
    }
}

fn scans(plan: &Value, table: &str) -> bool {
    plan["access"].as_array().is_some_and(|a| a.iter().any(|t| t["table"] == table && t["type"] == "ALL"))
}

fn uses_key(plan: &Value, table: &str, key: &str) -> bool {
    plan["access"].as_array().is_some_and(|a| a.iter().any(|t| t["table"] == table && t["key"] == key))
}

#[test]
fn plans_follow_an_index_and_explain_changes_nothing() {
    if !privileged("plans_follow_an_index_and_explain_changes_nothing") {
        return;
    }
    let _serial = common::one_at_a_time();
    let server = PrivateServer::start("plans", &[]).unwrap();
    let mut root = root_conn(&server);
    root.query_drop(
        "CREATE DATABASE app; CREATE TABLE app.orders (id INT PRIMARY KEY, email VARCHAR(64), total INT) ENGINE=InnoDB",
    )
    .unwrap();
    root.query_drop(
        "INSERT INTO app.orders SELECT seq, CONCAT('user', seq, '@example.com'), seq % 100 FROM app.seq_1_to_2000",
    )
    .unwrap();
    // The plain way: a login that may run the statements themselves.
    root.query_drop(
        "CREATE USER 'sqlbee_plans'@'localhost' IDENTIFIED BY 'plans-pw'; \
         GRANT SELECT, INSERT, UPDATE, DELETE ON app.* TO 'sqlbee_plans'@'localhost'",
    )
    .unwrap();
    let login = login_file(server.dir(), "sqlbee_plans", "plans-pw");
    let collector = Collector::start(&[]);
    let agent = Agent::start(server.dir(), &agent_args(&server, &login, &collector));
    let mut app = root_conn(&server);
    app.query_drop("USE app").unwrap();

    let query = format!("SELECT id, total FROM orders WHERE email = '{EMAIL}'");
    let first = plan_after(&agent, &mut app, &query, 20, |p| scans(p, "orders"));
    let digest = first["digest"].clone();
    assert_eq!(first["schema"], "app");
    assert!(first["previous_plan_hash"].is_null(), "the first plan changes nothing: {first}");
    let scan_hash = first["plan_hash"].clone();
    let url = collector.http_url();
    let stored = stored_plans(&url, digest.as_str().unwrap(), |p| p["plan_hash"] == scan_hash);
    let findings = &stored["plans"][0]["findings"];
    assert_eq!(findings[0]["kind"], "full_scan", "{stored}");
    assert_eq!(findings[0]["plan_line"], "orders (access ALL)");
    assert_eq!(findings[0]["suggestion"], "suggestion: ALTER TABLE `app`.`orders` ADD INDEX (`email`)", "{stored}");

    root.query_drop("ALTER TABLE app.orders ADD INDEX by_email (email)").unwrap();
    let indexed =
        plan_after(&agent, &mut app, &query, 20, |p| p["digest"] == digest && uses_key(p, "orders", "by_email"));
    let stored = stored_plans(&url, digest.as_str().unwrap(), |p| p["plan_hash"] == indexed["plan_hash"]);
    assert!(
        stored["plans"].as_array().unwrap().iter().all(|p| p["findings"].as_array().unwrap().is_empty()),
        "the index took the finding away: {stored}"
    );
    assert_ne!(indexed["plan_hash"], scan_hash);
    assert_eq!(indexed["previous_plan_hash"], scan_hash, "the index is a plan change: {indexed}");

    root.query_drop("ALTER TABLE app.orders DROP INDEX by_email").unwrap();
    let back = plan_after(&agent, &mut app, &query, 20, |p| {
        p["digest"] == digest && p["previous_plan_hash"] == indexed["plan_hash"]
    });
    assert_eq!(back["plan_hash"], scan_hash, "the same plan has the same hash: {back}");

    // A range, and a sort after an equality: each gets its candidate index,
    // the range's column after the equalities, or the sort's columns.
    let plan_text = |p: &Value, part: &str| p["plan"].as_str().is_some_and(|j| j.contains(part));
    for (sql, part, columns) in [
        ("SELECT id FROM orders WHERE total BETWEEN 10 AND 12", "between", "(`total`)"),
        ("SELECT id FROM orders WHERE total = 7 ORDER BY email", "sort_key", "(`total`, `email`)"),
    ] {
        let plan = plan_after(&agent, &mut app, sql, 20, |p| scans(p, "orders") && plan_text(p, part));
        let stored = stored_plans(&url, plan["digest"].as_str().unwrap(), |p| p["plan_hash"] == plan["plan_hash"]);
        let finding = &stored["plans"][0]["findings"][0];
        assert_eq!(finding["kind"], "full_scan", "{sql}: {stored}");
        assert_eq!(
            finding["suggestion"],
            format!("suggestion: ALTER TABLE `app`.`orders` ADD INDEX {columns}"),
            "{stored}"
        );
        assert!(finding["check_first"].as_str().unwrap().starts_with("SHOW INDEX FROM `orders`"), "{stored}");
    }

    // EXPLAIN of an UPDATE and a DELETE runs neither.
    app.query_drop("UPDATE orders SET total = total + 1000 WHERE id = 7").unwrap();
    app.query_drop("DELETE FROM orders WHERE id = 1999").unwrap();
    let update =
        plan_after(&agent, &mut app, "SELECT 1", 0, |p| p["plan"].as_str().is_some_and(|j| j.contains("\"update\"")));
    let delete =
        plan_after(&agent, &mut app, "SELECT 1", 0, |p| p["plan"].as_str().is_some_and(|j| j.contains("\"delete\"")));
    assert!(update["plan_hash"].is_string(), "the UPDATE has a plan: {update}");
    assert!(delete["plan_hash"].is_string(), "the DELETE has a plan: {delete}");
    let total: i64 = root.query_first("SELECT total FROM app.orders WHERE id = 7").unwrap().unwrap();
    let rows: i64 = root.query_first("SELECT COUNT(*) FROM app.orders").unwrap().unwrap();
    assert_eq!((total, rows), (1007, 1999), "EXPLAIN ran an UPDATE or a DELETE");

    // A prepared statement: the server keeps its text with `?`
    // placeholders; the agent catches the values of one execution and
    // explains the text with them (the primary key, by its value).
    let before = agent.lines_so_far().len();
    let prepared = app.prep("SELECT total FROM orders WHERE id = ? AND total >= ?").unwrap();
    let started = Instant::now();
    loop {
        for id in 1..10 {
            let _: Vec<i64> = app.exec(&prepared, (id, 0)).unwrap();
        }
        let explained = agent.lines_so_far().into_iter().skip(before).any(|p| {
            p["type"] == "plan"
                && uses_key(&p, "orders", "PRIMARY")
                && p["plan"].as_str().is_some_and(|j| !j.contains("\"update\"") && !j.contains("\"delete\""))
        });
        if explained {
            break;
        }
        assert!(started.elapsed() < Duration::from_secs(60), "no plan of the prepared statement: {}", agent.progress());
        std::thread::sleep(Duration::from_millis(300));
    }

    let out = agent.stop();
    assert!(out.success, "{}", out.stderr);
    for line in &out.lines {
        assert!(!line.to_string().contains(EMAIL), "a literal left in the agent's output: {line}");
    }
    assert!(!out.stderr.contains(EMAIL) && !out.stderr.contains("plans-pw"), "{}", out.stderr);
    let explains: u64 = out.lines.iter().filter(|l| l["type"] == "agent").filter_map(|l| l["explains"].as_u64()).sum();
    assert!(explains >= 5, "the agent's cost counts its EXPLAINs: {explains}");

    // Through the collector: both plans, and both changes, newest first.
    let digest = digest.as_str().unwrap();
    let answer = sqlbee_query(&["plans", digest, "--format", "json", "--since", "all", "--collector", &url]);
    assert!(answer.status.success(), "{}", String::from_utf8_lossy(&answer.stderr));
    let answer: Value = serde_json::from_slice(&answer.stdout).unwrap();
    let hashes: Vec<&Value> = answer["plans"].as_array().unwrap().iter().map(|p| &p["plan_hash"]).collect();
    assert_eq!(hashes.len(), 2, "{answer}");
    assert!(hashes.contains(&&scan_hash) && hashes.contains(&&indexed["plan_hash"]), "{answer}");
    let scan = answer["plans"].as_array().unwrap().iter().find(|p| p["plan_hash"] == scan_hash).unwrap();
    assert_eq!(scan["tables"], serde_json::json!(["orders"]));
    assert_eq!(
        (&scan["access"][0]["type"], &scan["schema"], &scan["instance"]),
        (&"ALL".into(), &"app".into(), &first["instance"])
    );
    assert!(scan["first_seen_unix_ms"].as_i64() <= scan["last_seen_unix_ms"].as_i64());
    let changes: Vec<(&Value, &Value)> =
        answer["changes"].as_array().unwrap().iter().map(|c| (&c["from_plan_hash"], &c["to_plan_hash"])).collect();
    assert_eq!(changes, [(&indexed["plan_hash"], &scan_hash), (&scan_hash, &indexed["plan_hash"])], "{answer}");
    let table = sqlbee_query(&["plans", digest, "--since", "all", "--collector", &url]);
    let table = String::from_utf8_lossy(&table.stdout);
    assert!(table.contains("orders") && table.contains("by_email") && !table.contains(EMAIL), "{table}");
    let stored = sqlbee_query(&["plans", "--format", "json", "--since", "all", "--collector", &url]);
    assert!(!String::from_utf8_lossy(&stored.stdout).contains(EMAIL));
    let instances = sqlbee_query(&["instances", "--format", "json", "--collector", &url]);
    let instances: Value = serde_json::from_slice(&instances.stdout).unwrap();
    assert_eq!(instances[0]["server_login"], "ok", "{instances}");

    // In a real browser: the digest page shows the newest plan as a tree
    // with its finding and both changes on the latency plot, and the plan
    // changes page lists both.
    if browser::available("plans_follow_an_index_and_explain_changes_nothing") {
        let range = "since=all";
        let page = format!("{}digest?{range}&id={digest}&schema=app", collector.ui);
        let loaded = browser::load(&page);
        assert!(loaded.console.is_empty(), "{:#?}", loaded.console);
        let dom = &loaded.dom;
        assert!(dom.contains("id=\"plan-tree\"") && dom.contains("data-table=\"orders\" data-access=\"ALL\""));
        assert!(dom.contains("data-kind=\"full_scan\"") && dom.contains("ADD INDEX (`email`)"), "no finding");
        // Every time plot marks them: rate, latency and the heatmap.
        assert_eq!(dom.matches("class=\"marker plan\"").count(), 3 * 2, "two plan changes on each plot");
        assert_eq!(dom.matches("<tr data-plan-hash=").count(), 2, "two plans in the history");
        assert!(!dom.contains(EMAIL));
        let changes = browser::load(&format!("{}plans?{range}", collector.ui));
        assert!(changes.console.is_empty(), "{:#?}", changes.console);
        assert_eq!(changes.dom.matches(&format!("data-digest=\"{digest}\"")).count(), 2);
        let shots = browser::screenshot_dir();
        assert!(browser::screenshot(&page, &shots.join("plan.png")).is_empty());
        assert!(
            browser::screenshot(&format!("{}plans?{range}", collector.ui), &shots.join("plan-changes.png")).is_empty()
        );
    }

    // The index comes back while no agent runs. The next agent knows no
    // plan from before (its first plan changes nothing as far as it
    // knows); the collector compares it with the plan it stored last.
    root.query_drop("ALTER TABLE app.orders ADD INDEX by_email (email)").unwrap();
    let agent = Agent::start(server.dir(), &agent_args(&server, &login, &collector));
    let again =
        plan_after(&agent, &mut app, &query, 20, |p| p["digest"] == digest && uses_key(p, "orders", "by_email"));
    assert!(again["previous_plan_hash"].is_null(), "a new agent knows no plan from before: {again}");
    let started = Instant::now();
    let changes = loop {
        let answer = sqlbee_query(&["plans", digest, "--format", "json", "--since", "all", "--collector", &url]);
        let answer: Value = serde_json::from_slice(&answer.stdout).unwrap();
        let changes = answer["changes"].as_array().cloned().unwrap_or_default();
        if changes.len() >= 3 {
            break changes;
        }
        assert!(started.elapsed() < Duration::from_secs(30), "no change across the restart: {answer}");
        std::thread::sleep(Duration::from_millis(300));
    };
    assert_eq!(changes.len(), 3, "{changes:?}");
    assert_eq!((&changes[0]["from_plan_hash"], &changes[0]["to_plan_hash"]), (&scan_hash, &again["plan_hash"]));
    assert!(agent.stop().success);
}

#[test]
fn a_login_that_fails_is_a_warning_and_counting_stays_exact() {
    if !privileged("a_login_that_fails_is_a_warning_and_counting_stays_exact") {
        return;
    }
    let _serial = common::one_at_a_time();
    let mut server = PrivateServer::start("plans-login", &[]).unwrap();
    let mut root = root_conn(&server);
    root.query_drop("CREATE DATABASE app; CREATE TABLE app.t (id INT PRIMARY KEY, v INT)").unwrap();
    root.query_drop(
        "CREATE USER 'no_grant'@'localhost' IDENTIFIED BY 'ng-pw'; \
         CREATE USER 'right_user'@'localhost' IDENTIFIED BY 'right-pw'",
    )
    .unwrap();
    let collector = Collector::start(&[]);
    for (login, expect) in [
        (login_file(server.dir(), "right_user", "wrong-pw"), "Access denied"),
        (login_file(server.dir(), "no_grant", "ng-pw"), "lacks a grant"),
    ] {
        let agent = Agent::start(server.dir(), &agent_args(&server, &login, &collector));
        let statements = 300;
        let run = |server: &PrivateServer| {
            let mut app = root_conn(server);
            for i in 0..statements {
                app.query_drop(format!("SELECT v FROM app.t WHERE id = {i}")).unwrap();
            }
        };
        run(&server);
        let started = Instant::now();
        while !agent
            .lines_so_far()
            .iter()
            .any(|l| l["type"] == "server_login" && l["warning"].as_str().is_some_and(|w| w.contains(expect)))
        {
            assert!(started.elapsed() < Duration::from_secs(30), "no warning {expect:?}: {}", agent.progress());
            std::thread::sleep(Duration::from_millis(200));
        }
        // The server restarted mid-run: the agent follows it (it rescans
        // every 500 ms) and keeps counting.
        server.restart().unwrap();
        agent.wait_attached(server.pid());
        run(&server);
        let out = agent.stop();
        assert!(out.success, "{}", out.stderr);
        let counted: u64 = out
            .lines
            .iter()
            .filter(|l| l["type"] == "digest" && l["digest_text"] == "SELECT `v` FROM `app`.`t` WHERE ID = ?")
            .filter_map(|l| l["count"].as_u64())
            .sum();
        let texts: Vec<&Value> =
            out.lines.iter().filter(|l| l["type"] == "digest").map(|l| &l["digest_text"]).collect();
        assert_eq!(counted, 2 * statements, "counting does not depend on the login: {texts:?}");
        let digest = out.lines.iter().find(|l| l["digest_text"] == "SELECT `v` FROM `app`.`t` WHERE ID = ?").unwrap();
        let plans: Vec<&Value> =
            out.lines.iter().filter(|l| l["type"] == "plan" && l["digest"] == digest["digest"]).collect();
        assert!(plans.iter().all(|p| p["plan_hash"].is_null()), "{plans:?}");
        // The collector shows the warning on the instance.
        let url = collector.http_url();
        let instances = sqlbee_query(&["instances", "--format", "json", "--collector", &url]);
        let instances: Value = serde_json::from_slice(&instances.stdout).unwrap();
        assert!(
            instances
                .as_array()
                .unwrap()
                .iter()
                .any(|i| i["server_login"].as_str().is_some_and(|w| w.contains(expect))),
            "{instances}"
        );
        let table = sqlbee_query(&["instances", "--collector", &url]);
        assert!(String::from_utf8_lossy(&table.stdout).contains("NO PLANS"));
        if browser::available("a_login_that_fails_is_a_warning_and_counting_stays_exact") {
            let fleet = browser::load(&format!("{}?since=all", collector.ui));
            assert!(fleet.dom.contains("no plans:") && fleet.dom.contains(expect), "the fleet page shows the warning");
        }
    }
}

/// The least-privilege set-up the manual shows: a definer-rights
/// procedure in the application's schema runs EXPLAIN, and the agent's
/// login may run only that procedure (no SELECT on any table).
#[test]
fn a_login_that_may_only_run_the_procedure_gets_plans() {
    if !privileged("a_login_that_may_only_run_the_procedure_gets_plans") {
        return;
    }
    let _serial = common::one_at_a_time();
    let server = PrivateServer::start("plans-procedure", &[]).unwrap();
    let mut root = root_conn(&server);
    root.query_drop("CREATE DATABASE shop; CREATE TABLE shop.items (id INT PRIMARY KEY, sku VARCHAR(32), n INT)")
        .unwrap();
    root.query_drop("INSERT INTO shop.items SELECT seq, CONCAT('sku-', seq), seq FROM shop.seq_1_to_500").unwrap();
    root.query_drop(include_str!("../../docs/src/using/sqlbee_explain.sql").replace("APP_SCHEMA", "shop")).unwrap();
    root.query_drop(include_str!("../../docs/src/using/sqlbee_indexes.sql").replace("APP_SCHEMA", "shop")).unwrap();
    root.query_drop(
        "CREATE USER 'sqlbee'@'localhost' IDENTIFIED BY 'least-pw'; \
         GRANT EXECUTE ON PROCEDURE shop.sqlbee_explain TO 'sqlbee'@'localhost'; \
         GRANT EXECUTE ON PROCEDURE shop.sqlbee_indexes TO 'sqlbee'@'localhost'",
    )
    .unwrap();
    let login = login_file(server.dir(), "sqlbee", "least-pw");
    let mut as_agent = mysql::Conn::new(
        mysql::OptsBuilder::new()
            .socket(Some(server.socket.to_str().unwrap()))
            .user(Some("sqlbee"))
            .pass(Some("least-pw")),
    )
    .unwrap();
    assert!(as_agent.query_drop("SELECT * FROM shop.items").is_err(), "the login must not read the tables");

    let collector = Collector::start(&[]);
    let agent = Agent::start(server.dir(), &agent_args(&server, &login, &collector));
    let mut app = root_conn(&server);
    app.query_drop("USE shop").unwrap();
    let plan = plan_after(&agent, &mut app, "SELECT n FROM items WHERE sku = 'sku-42'", 10, |p| scans(p, "items"));
    assert_eq!(plan["schema"], "shop");
    // The indexes come through the schema's sqlbee_indexes, and the full
    // scan's plan chose none of them.
    let url = collector.http_url();
    let started = Instant::now();
    let items = loop {
        let answer = sqlbee_query(&["tables", "--format", "json", "--since", "all", "--collector", &url]);
        let answer: Value = serde_json::from_slice(&answer.stdout).unwrap();
        let items = answer["tables"].as_array().unwrap().iter().find(|t| t["table"] == "items").cloned();
        if let Some(items) = items.filter(|t| !t["indexes"].as_array().unwrap().is_empty()) {
            break items;
        }
        assert!(started.elapsed() < Duration::from_secs(30), "no indexes: {answer:#}");
        std::thread::sleep(Duration::from_millis(300));
    };
    let names: Vec<&str> = items["indexes"].as_array().unwrap().iter().map(|i| i["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["PRIMARY"], "{items:#}");
    assert_eq!(
        (items["indexes"][0]["unique"].as_bool(), items["indexes"][0]["digests"].as_u64()),
        (Some(true), Some(0))
    );
    let out = agent.stop();
    assert!(out.success, "{}", out.stderr);
    let login_states: Vec<&Value> = out.lines.iter().filter(|l| l["type"] == "server_login").collect();
    assert!(login_states.iter().all(|l| l["status"] == "ok"), "{login_states:?}");
}

/// Tables per digest, with no login: a join of two tables in two schemas
/// names both, schema-qualified; an UPDATE writes its table; and each
/// table's totals are the sums of the digests that touch it, as `sqlbee
/// top` gives them over the same range.
#[test]
fn tables_add_up_to_the_digests_that_touch_them() {
    if !privileged("tables_add_up_to_the_digests_that_touch_them") {
        return;
    }
    let _serial = common::one_at_a_time();
    let server = PrivateServer::start("tables", &[]).unwrap();
    let mut root = root_conn(&server);
    root.query_drop(
        "CREATE DATABASE app; CREATE DATABASE crm; \
         CREATE TABLE app.orders (id INT PRIMARY KEY, customer INT, total INT); \
         CREATE TABLE crm.customers (id INT PRIMARY KEY, name VARCHAR(32)); \
         INSERT INTO crm.customers VALUES (1, 'a'), (2, 'b'); INSERT INTO app.orders VALUES (1, 1, 10), (2, 2, 20)",
    )
    .unwrap();
    let collector = Collector::start(&[]);
    let state = server.dir().join("agent-state");
    let agent = Agent::start(
        server.dir(),
        &[
            format!("--pid={}", server.pid()),
            format!("--collector={}", collector.http_url()),
            format!("--state-dir={}", state.display()),
            "--window=1s".into(),
        ],
    );
    let mut app = root_conn(&server);
    app.query_drop("USE app").unwrap();
    let (joins, updates) = (40, 15);
    for i in 0..joins {
        let _: Vec<u32> = app
            .query(format!("SELECT o.id FROM orders o JOIN crm.customers c ON c.id = o.customer WHERE o.total > {i}"))
            .unwrap();
    }
    for i in 0..updates {
        app.query_drop(format!("UPDATE orders SET total = total + 1 WHERE id = {}", 1 + i % 2)).unwrap();
    }
    std::thread::sleep(Duration::from_millis(1500));
    let out = agent.stop();
    assert!(out.success, "{}", out.stderr);
    let join_line = out
        .lines
        .iter()
        .find(|l| l["type"] == "digest" && l["digest_text"].as_str().is_some_and(|t| t.contains("JOIN")))
        .expect("the join's digest");
    assert_eq!(join_line["statement_kind"], "SELECT");
    let named: Vec<String> = join_line["tables"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| format!("{}.{}:{}", t["schema"].as_str().unwrap(), t["table"].as_str().unwrap(), t["write"]))
        .collect();
    assert_eq!(named, ["app.orders:false", "crm.customers:false"]);

    let url = collector.http_url();
    let answer = sqlbee_query(&["tables", "--format", "json", "--since", "all", "--collector", &url]);
    assert!(answer.status.success(), "{}", String::from_utf8_lossy(&answer.stderr));
    let answer: Value = serde_json::from_slice(&answer.stdout).unwrap();
    let table = |name: &str| -> Value {
        let (schema, table) = name.split_once('.').unwrap();
        answer["tables"]
            .as_array()
            .unwrap()
            .iter()
            .find(|t| t["schema"] == schema && t["table"] == table)
            .cloned()
            .unwrap_or_else(|| panic!("no {name}: {answer}"))
    };
    let orders = table("app.orders");
    let customers = table("crm.customers");
    assert_eq!(orders["statements"], joins + updates, "{orders}");
    assert_eq!(
        (orders["writing_statements"].as_u64(), orders["reading_statements"].as_u64()),
        (Some(updates), Some(joins))
    );
    assert_eq!(customers["statements"], joins);
    // Each table's totals are its digests' sums, as `top` gives them.
    let top = common::collector::top_json(&url, &["--limit", "10000"]);
    for t in [&orders, &customers] {
        let (mut count, mut sum) = (0, 0);
        for d in t["digests"].as_array().unwrap() {
            let row = top
                .as_array()
                .unwrap()
                .iter()
                .find(|r| r["digest"] == d["digest"] && r["schema"] == d["schema"])
                .unwrap();
            count += row["count"].as_u64().unwrap();
            sum += row["sum_ns"].as_u64().unwrap();
        }
        assert_eq!((t["statements"].as_u64(), t["sum_ns"].as_u64()), (Some(count), Some(sum)), "{t}");
    }
    // In a real browser: the tables page lists both, each linking to its digests.
    if browser::available("tables_add_up_to_the_digests_that_touch_them") {
        let page = format!("{}tables?since=all", collector.ui);
        let loaded = browser::load(&page);
        assert!(loaded.console.is_empty(), "{:#?}", loaded.console);
        assert!(
            loaded.dom.contains("data-table=\"app.orders\"") && loaded.dom.contains("data-table=\"crm.customers\"")
        );
        assert!(loaded.dom.matches("class=\"table-digest\"").count() >= 3, "two digests on orders, one on customers");
        assert!(browser::screenshot(&page, &browser::screenshot_dir().join("tables.png")).is_empty());
    }
}

/// Prepared statements get plans too, with values they ran with: while a
/// prepared digest waits for a plan, the agent attaches the value probes
/// for a moment, binds one execution's values (a string, a datetime, a
/// double, an integer and a NULL) into the text, and explains that. No
/// value leaves the agent, and every execution is counted exactly, those
/// whose values were caught too.
#[test]
fn prepared_statements_are_explained_with_the_values_they_ran_with() {
    if !privileged("prepared_statements_are_explained_with_the_values_they_ran_with") {
        return;
    }
    let _serial = common::one_at_a_time();
    let server = PrivateServer::start("plans-prepared", &[]).unwrap();
    let mut root = root_conn(&server);
    root.query_drop(
        "CREATE DATABASE app; CREATE TABLE app.orders (id INT PRIMARY KEY, email VARCHAR(64), total INT, \
         placed DATETIME, price DOUBLE) ENGINE=InnoDB",
    )
    .unwrap();
    root.query_drop(
        "INSERT INTO app.orders SELECT seq, CONCAT('user', seq, '@example.com'), seq % 100, \
         '2026-01-01' + INTERVAL seq MINUTE, seq / 10 FROM app.seq_1_to_2000",
    )
    .unwrap();
    root.query_drop(
        "CREATE USER 'sqlbee_plans'@'localhost' IDENTIFIED BY 'plans-pw'; \
         GRANT SELECT ON app.* TO 'sqlbee_plans'@'localhost'",
    )
    .unwrap();
    let login = login_file(server.dir(), "sqlbee_plans", "plans-pw");
    let collector = Collector::start(&[]);
    let agent = Agent::start(server.dir(), &agent_args(&server, &login, &collector));
    let mut app = root_conn(&server);
    app.query_drop("USE app").unwrap();
    let statement = app
        .prep("SELECT id, total, ? AS note FROM orders WHERE email = ? AND placed >= ? AND price > ? AND total <> ?")
        .unwrap();
    let values = || {
        (
            mysql::Value::NULL,
            mysql::Value::Bytes(EMAIL.into()),
            mysql::Value::Date(2026, 1, 2, 3, 4, 5, 0),
            mysql::Value::Double(1.5),
            mysql::Value::Int(7),
        )
    };

    let mut executed = 0u64;
    let started = Instant::now();
    let plan = loop {
        for _ in 0..20 {
            app.exec_drop(&statement, values()).unwrap();
            executed += 1;
        }
        let lines = agent.lines_so_far();
        let ours = |l: &&Value| {
            l["type"] == "plan"
                && (scans(l, "orders") || l["not_explained"].as_str().is_some_and(|r| r.contains("prepared")))
        };
        if let Some(plan) = lines.iter().find(ours) {
            break plan.clone();
        }
        // No pause: the executions outrun the capture's bound.
        assert!(started.elapsed() < Duration::from_secs(60), "no plan: {}\n{lines:?}", agent.stderr_text());
    };
    assert!(plan["not_explained"].is_null(), "explained with its values: {plan}");
    assert!(scans(&plan, "orders"), "{plan}");
    let digest = plan["digest"].as_str().unwrap().to_string();
    let text = plan["plan"].to_string();
    assert!(text.contains("orders.email = "), "the condition is in the plan: {text}");
    stored_plans(&collector.http_url(), &digest, |p| p["plan_hash"] == plan["plan_hash"]);
    // Until the capture is over (2 s at most), so its bound is in the log.
    let started = Instant::now();
    while !agent.stderr_text().contains("value capture over") {
        app.exec_drop(&statement, values()).unwrap();
        executed += 1;
        assert!(started.elapsed() < Duration::from_secs(20), "the capture never ended: {}", agent.stderr_text());
    }
    drop(statement);
    let out = agent.stop();
    assert!(out.success, "{}", out.stderr);
    assert!(out.stderr.contains("capturing prepared statements' values"), "{}", out.stderr);
    // Each capture copied 2,000 values at most, however fast they came.
    let log = common::strip_ansi(&out.stderr);
    let caught: Vec<u64> = log
        .lines()
        .filter(|l| l.contains("value capture over"))
        .filter_map(|l| l.split("caught=").nth(1)?.split_whitespace().next()?.parse().ok())
        .collect();
    assert!(!caught.is_empty() && caught.iter().all(|n| *n <= 2_000), "{caught:?}\n{log}");
    let rows: Vec<&Value> = out.of_type("digest").filter(|d| d["digest"] == digest.as_str()).collect();
    assert!(rows.iter().all(|r| r["digest_text"].as_str().is_some_and(|t| t.contains('?'))), "{rows:?}");
    let counted: u64 = rows.iter().map(|r| r["count"].as_u64().unwrap()).sum();
    assert_eq!(counted, executed, "every execution counted once: {rows:#?}");
    // The literals never leave: not in the agent's lines, not in the store.
    for line in &out.lines {
        assert!(!line.to_string().contains(EMAIL), "a value left the agent: {line}");
    }
    let answer =
        sqlbee_query(&["plans", &digest, "--format", "json", "--since", "all", "--collector", &collector.http_url()]);
    assert!(!String::from_utf8_lossy(&answer.stdout).contains(EMAIL), "a value reached the store");
}

/// Index advice from what the server holds and what its plans chose: with
/// a login that may only read the tables, the agent reads each table's
/// indexes; the collector names the index that is a left prefix of
/// another (redundant), the one that repeats a unique one (duplicate) and
/// the one no plan chose (unused), and the one a range that sorts asks
/// for (missing), each once and with the digests behind it, and counts
/// each index's statements exactly. A dropped index is
/// read again soon after the agent saw its ALTER, and goes from the
/// answer with its finding.
#[test]
fn indexes_nobody_needs_are_named_once_with_the_statements_behind_them() {
    if !privileged("indexes_nobody_needs_are_named_once_with_the_statements_behind_them") {
        return;
    }
    let _serial = common::one_at_a_time();
    // userstat: MariaDB's own count of rows read per index, a second opinion.
    let server = PrivateServer::start("indexes", &["--userstat=1"]).unwrap();
    let mut root = root_conn(&server);
    root.query_drop(
        "CREATE DATABASE app; \
         CREATE TABLE app.items (id INT PRIMARY KEY, k INT, c INT, pad VARCHAR(32), \
             KEY k_idx (k), KEY k_pad (k, pad), KEY c_idx (c)) ENGINE=InnoDB; \
         CREATE TABLE app.tags (id INT PRIMARY KEY, name VARCHAR(32), n INT, UNIQUE KEY name_u (name), KEY name_i (name)); \
         INSERT INTO app.items SELECT seq, seq % 50, seq % 7, CONCAT('pad-', seq) FROM app.seq_1_to_2000; \
         INSERT INTO app.tags SELECT seq, CONCAT('tag-', seq), seq FROM app.seq_1_to_200",
    )
    .unwrap();
    root.query_drop(
        "CREATE USER 'sqlbee_plans'@'localhost' IDENTIFIED BY 'plans-pw'; \
         GRANT SELECT ON app.* TO 'sqlbee_plans'@'localhost'",
    )
    .unwrap();
    let rows: Vec<u64> = root.query("SELECT COUNT(*) FROM app.items UNION ALL SELECT COUNT(*) FROM app.tags").unwrap();
    assert_eq!(rows, [2000, 200]);
    let login = login_file(server.dir(), "sqlbee_plans", "plans-pw");
    let collector = Collector::start(&[]);
    let agent = Agent::start(server.dir(), &agent_args(&server, &login, &collector));
    let mut app = root_conn(&server);
    app.query_drop("USE app").unwrap();
    let url = collector.http_url();
    // Rounds run: each runs each of the four statements once.
    let mut executed = 0u64;
    let work = |app: &mut mysql::Conn, rounds: u64, executed: &mut u64| {
        for i in 0..rounds {
            let _: Vec<String> =
                app.query(format!("SELECT pad FROM items WHERE k = {} AND pad = 'pad-{}'", i % 50, i)).unwrap();
            let _: Vec<u32> = app.query(format!("SELECT id FROM items WHERE id = {}", 1 + i % 2000)).unwrap();
            let _: Vec<u32> = app.query(format!("SELECT id FROM tags WHERE name = 'tag-{}'", 1 + i % 200)).unwrap();
            let _: Vec<String> =
                app.query(format!("SELECT name FROM tags WHERE n > {} ORDER BY n LIMIT 5", i % 100)).unwrap();
            app.query_drop(format!("INSERT INTO items VALUES ({}, 1, 1, 'new')", 100_000 + *executed)).unwrap();
            *executed += 1;
        }
    };
    let tables = || -> Value {
        let answer = sqlbee_query(&["tables", "--format", "json", "--since", "all", "--collector", &url]);
        assert!(answer.status.success(), "{}", String::from_utf8_lossy(&answer.stderr));
        serde_json::from_slice(&answer.stdout).unwrap()
    };
    let table = |answer: &Value, name: &str| -> Value {
        answer["tables"].as_array().unwrap().iter().find(|t| t["table"] == name).cloned().unwrap_or(Value::Null)
    };
    let index = |t: &Value, name: &str| -> Value {
        t["indexes"].as_array().and_then(|a| a.iter().find(|i| i["name"] == name).cloned()).unwrap_or(Value::Null)
    };
    // Until every digest that may choose an index has a plan, and the
    // definitions are in.
    let started = Instant::now();
    loop {
        work(&mut app, 20, &mut executed);
        let answer = tables();
        let (items, tags) = (table(&answer, "items"), table(&answer, "tags"));
        let planned =
            |t: &Value| t["planned_statements"].as_u64().is_some_and(|p| p > 0 && t["plannable_statements"] == p);
        if planned(&items) && planned(&tags) && !index(&items, "c_idx").is_null() {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "no indexes or plans: {answer:#}\n{}",
            agent.stderr_text()
        );
        std::thread::sleep(Duration::from_millis(500));
    }
    // Every window in: the counts settle.
    std::thread::sleep(Duration::from_millis(2500));
    let answer = tables();
    let (items, tags) = (table(&answer, "items"), table(&answer, "tags"));
    assert!(!items["indexes_instance"].as_str().unwrap().is_empty(), "{items:#}");
    assert_eq!(items["plannable_statements"], 2 * executed, "neither INSERTs nor EXPLAINs choose one: {items:#}");
    let explains: u64 = items["digests"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|d| d["digest_text"].as_str().unwrap().starts_with("EXPLAIN"))
        .map(|d| d["count"].as_u64().unwrap())
        .sum();
    assert_eq!(items["statements"], 3 * executed + explains, "the agent's own EXPLAINs read it too");
    let names: Vec<&str> = items["indexes"].as_array().unwrap().iter().map(|i| i["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["PRIMARY", "k_idx", "k_pad", "c_idx"], "as SHOW INDEX lists them");
    assert_eq!(index(&items, "k_pad")["columns"], serde_json::json!(["k", "pad"]));
    assert_eq!(
        (index(&items, "k_pad")["digests"].as_u64(), index(&items, "k_pad")["statements"].as_u64()),
        (Some(1), Some(executed)),
        "{items:#}"
    );
    assert_eq!(index(&items, "PRIMARY")["statements"], executed, "{items:#}");
    assert!(index(&items, "k_pad")["rows_read"].as_u64().is_some_and(|n| n > 0), "{items:#}");
    let k_lookup = items["digests"]
        .as_array()
        .unwrap()
        .iter()
        .find(|d| d["digest_text"] == "SELECT `pad` FROM `items` WHERE `k` = ? AND `pad` = ?")
        .unwrap()["digest"]
        .clone();
    assert_eq!(index(&items, "k_pad")["digest_ids"], serde_json::json!([k_lookup]), "the digest that chose it");
    assert_eq!(index(&items, "c_idx")["rows_read"], 0, "{items:#}");
    let found = |t: &Value| -> Vec<(String, String)> {
        t["findings"]
            .as_array()
            .unwrap()
            .iter()
            .map(|f| (f["kind"].as_str().unwrap().to_string(), f["plan_line"].as_str().unwrap().to_string()))
            .collect()
    };
    assert_eq!(
        found(&items),
        [
            ("redundant_index".to_string(), "index k_idx (k)".to_string()),
            ("unused_index".to_string(), "index c_idx (c)".to_string())
        ],
        "{items:#}"
    );
    let unused = &items["findings"][1];
    assert_eq!(unused["suggestion"], "suggestion: ALTER TABLE `app`.`items` DROP INDEX `c_idx`");
    assert!(unused["detail"].as_str().unwrap().contains("100%"), "{unused:#}");
    assert!(unused["detail"].as_str().unwrap().contains("INDEX_STATISTICS counts no row read"), "{unused:#}");
    assert_eq!(unused["digests"].as_array().unwrap().len(), 2, "the two digests whose plans read items: {unused:#}");
    assert!(!unused["check_first"].as_str().unwrap().is_empty());
    // A range that sorts, with no index to read it by: the candidate.
    assert_eq!(
        found(&tags),
        [
            ("duplicate_index".to_string(), "index name_i (name)".to_string()),
            ("missing_index".to_string(), "tags (access ALL)".to_string())
        ],
        "{tags:#}"
    );
    let missing = &tags["findings"][1];
    assert_eq!(missing["suggestion"], "suggestion: ALTER TABLE `app`.`tags` ADD INDEX (`n`)", "{missing:#}");
    assert_eq!(missing["digests"].as_array().unwrap().len(), 1);
    assert!(
        missing["detail"].as_str().unwrap().starts_with(&format!("1 digests ({executed} statements")),
        "{missing:#}"
    );
    let text = answer.to_string();
    assert!(!text.contains("pad-1") && !text.contains("tag-1"), "no literal in the answer");

    // The page shows the same.
    if browser::available("indexes_nobody_needs_are_named_once_with_the_statements_behind_them") {
        let page = format!("{}tables?since=all", collector.ui);
        let loaded = browser::load(&page);
        assert!(loaded.console.is_empty(), "{:#?}", loaded.console);
        assert_eq!(loaded.dom.matches("class=\"table-index\"").count(), 4 + 3, "{}", loaded.dom);
        // Each index lists the digests that chose it: k_pad its lookup,
        // PRIMARY the id lookup, name_u the name lookup.
        assert_eq!(loaded.dom.matches("class=\"index-digest\"").count(), 3, "{}", loaded.dom);
        for kind in ["redundant_index", "unused_index", "duplicate_index", "missing_index"] {
            assert_eq!(loaded.dom.matches(&format!("data-kind=\"{kind}\"")).count(), 1, "{kind}");
        }
        assert!(browser::screenshot(&page, &browser::screenshot_dir().join("table-indexes.png")).is_empty());
    }

    // The DBA drops it: the agent reads the table again after its ALTER.
    root.query_drop("ALTER TABLE app.items DROP INDEX c_idx").unwrap();
    let started = Instant::now();
    loop {
        work(&mut app, 5, &mut executed);
        let items = table(&tables(), "items");
        if index(&items, "c_idx").is_null() {
            assert_eq!(found(&items), [("redundant_index".to_string(), "index k_idx (k)".to_string())]);
            break;
        }
        assert!(started.elapsed() < Duration::from_secs(30), "c_idx is still listed: {items:#}");
        std::thread::sleep(Duration::from_millis(300));
    }
    let out = agent.stop();
    assert!(out.success, "{}", out.stderr);
}
