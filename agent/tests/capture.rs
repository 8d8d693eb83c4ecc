//! The capture path end to end: real mariadbd, real eBPF programs, the real
//! `sqlbee agent` binary. Every count is compared with what the workload
//! executed and with the server's own status counters.
mod common;

use std::time::Duration;

use common::{Agent, NOT_QUESTIONS, PrivateServer, delta, instance_of, privileged};
use mysql::prelude::Queryable;

fn connect(server: &PrivateServer) -> mysql::Conn {
    let opts = mysql::OptsBuilder::new()
        .socket(Some(server.socket.to_str().unwrap()))
        .user(Some("root"))
        .prefer_socket(true);
    mysql::Conn::new(opts).expect("connecting to the private server")
}

fn agent_args(server: &PrivateServer) -> Vec<String> {
    vec![format!("--pid={}", server.pid())]
}

#[test]
fn exact_counts_for_text_and_prepared_statements() {
    if !privileged("exact_counts_for_text_and_prepared_statements") {
        return;
    }
    let server = PrivateServer::start("exact", &[]).unwrap();
    let rows: Vec<String> = (1..=100).map(|i| format!("({i}, 0)")).collect();
    server
        .sql(&format!("CREATE DATABASE app; CREATE TABLE app.t (id INT PRIMARY KEY, v INT); INSERT INTO app.t VALUES {}", rows.join(",")))
        .unwrap();
    let before = server.global_status().unwrap();
    let agent = Agent::start(server.dir(), &agent_args(&server));

    const TEXT: u64 = 157;
    const PREPARED: u64 = 211;
    let mut conn = connect(&server);
    for i in 0..TEXT {
        conn.query_drop(format!("SELECT v FROM app.t WHERE id = {}", i % 100 + 1)).unwrap();
    }
    let stmt = conn.prep("UPDATE app.t SET v = v + ? WHERE id = ?").unwrap();
    for i in 0..PREPARED {
        conn.exec_drop(&stmt, (1, i % 100 + 1)).unwrap();
    }
    conn.close(stmt).unwrap();
    drop(conn);
    std::thread::sleep(Duration::from_millis(100));
    let out = agent.stop();
    let after = server.global_status().unwrap();
    assert!(out.success, "agent failed: {}", out.stderr);

    let counts = out.digest_counts(None);
    assert_eq!(counts.get("SELECT `v` FROM `app`.`t` WHERE ID = ?"), Some(&TEXT), "{counts:#?}");
    assert_eq!(counts.get("UPDATE `app`.`t` SET `v` = `v` + ? WHERE ID = ?"), Some(&PREPARED), "{counts:#?}");

    let commands = out.commands(None);
    let get = |c: &str| commands.get(c).copied().unwrap_or(0);
    assert_eq!(get("COM_STMT_EXECUTE"), PREPARED);
    assert_eq!(get("COM_STMT_EXECUTE"), delta(&before, &after, "Com_stmt_execute"));
    assert_eq!(get("COM_STMT_PREPARE"), delta(&before, &after, "Com_stmt_prepare"));
    assert_eq!(get("COM_STMT_CLOSE"), delta(&before, &after, "Com_stmt_close"));
    // Questions counts every command but the ones MariaDB skips; the
    // status reads themselves fall outside the agent's life except for one
    // QUIT and one SHOW STATUS.
    let questions: u64 = commands.iter().filter(|(c, _)| !NOT_QUESTIONS.contains(&c.as_str())).map(|(_, n)| n).sum();
    assert_eq!(questions + 2, delta(&before, &after, "Questions"), "{commands:?}");
    // Every statement the kernel saw arrived as an event and in a digest.
    let statements = out.summary_total(None, "statements");
    assert_eq!(statements, counts.values().sum::<u64>());
    assert_eq!(out.summary_total(None, "dropped_events"), 0);
}

#[test]
fn slow_statement_latency_is_measured() {
    if !privileged("slow_statement_latency_is_measured") {
        return;
    }
    let server = PrivateServer::start("latency", &[]).unwrap();
    let agent = Agent::start(server.dir(), &agent_args(&server));
    for _ in 0..3 {
        server.sql("SELECT SLEEP(0.2)").unwrap();
    }
    let out = agent.stop();
    let rows: Vec<_> = out.digest_rows("SELECT `SLEEP` (?)").collect();
    let count: u64 = rows.iter().map(|r| r["count"].as_u64().unwrap()).sum();
    assert_eq!(count, 3, "{:#?}", out.lines);
    for row in rows {
        for field in ["min_ns", "max_ns", "p50_ns", "p99_ns"] {
            let ns = row[field].as_u64().unwrap();
            assert!((200_000_000..=260_000_000).contains(&ns), "{field} = {ns} ns");
        }
    }
}

#[test]
fn errors_are_counted_and_statements_kept() {
    if !privileged("errors_are_counted_and_statements_kept") {
        return;
    }
    let server = PrivateServer::start("errors", &[]).unwrap();
    server.sql("CREATE DATABASE app; CREATE TABLE app.u (id INT PRIMARY KEY)").unwrap();
    let agent = Agent::start(server.dir(), &agent_args(&server));
    let mut conn = connect(&server);
    for i in 0..4 {
        assert!(conn.query_drop(format!("SELEC {i} FROM nowhere")).is_err());
    }
    conn.query_drop("INSERT INTO app.u VALUES (1)").unwrap();
    for _ in 0..3 {
        assert!(conn.query_drop("INSERT INTO app.u VALUES (1)").is_err());
    }
    drop(conn);
    let out = agent.stop();
    let insert: Vec<_> = out.digest_rows("INSERT INTO `app`.`u` VALUES (?)").collect();
    let count: u64 = insert.iter().map(|r| r["count"].as_u64().unwrap()).sum();
    let dup: u64 = insert.iter().map(|r| r["error_codes"]["1062"].as_u64().unwrap_or(0)).sum();
    assert_eq!((count, dup), (4, 3), "{insert:#?}");
    let syntax: u64 = out
        .of_type("digest")
        .filter(|r| r["digest_text"].as_str().unwrap().starts_with("`SELEC` ? FROM"))
        .map(|r| r["error_codes"]["1064"].as_u64().unwrap_or(0))
        .sum();
    assert_eq!(syntax, 4, "{:#?}", out.lines);
}
