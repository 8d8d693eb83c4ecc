//! `--statement-hook send` end to end: statements end at the server's
//! answer (the `sendto` and `write` tracepoints, or with `send-raw` the raw
//! tracepoint at every syscall's entry), with no trap in mysqld.
//! Real mariadbd, real programs, the real `sqlbee agent`; every count is
//! compared with what the workload ran and with the server's own counters.
mod common;

use std::time::Duration;

use common::{Agent, PrivateServer, delta, privileged};
use mysql::prelude::Queryable;

fn send_hook_args(server: &PrivateServer, hook: Hook) -> Vec<String> {
    vec![format!("--pid={}", server.pid()), format!("--statement-hook={}", hook.option())]
}

/// Which of the send hook's programs the agent is asked for.
#[derive(Clone, Copy)]
enum Hook {
    /// `send`: the syscall tracepoints (tracefs is mounted here).
    Tracepoints,
    /// `send-raw`: the raw `sys_enter` tracepoint.
    Raw,
    /// `send` with the tracepoint program refused as a kernel would: the
    /// agent falls back to the raw one.
    RefusedTracepoints,
}

impl Hook {
    fn option(self) -> &'static str {
        match self {
            Hook::Tracepoints | Hook::RefusedTracepoints => "send",
            Hook::Raw => "send-raw",
        }
    }

    fn program(self) -> &'static str {
        match self {
            Hook::Tracepoints => "sendto_or_write",
            Hook::Raw | Hook::RefusedTracepoints => "statement_send",
        }
    }

    fn env(self) -> &'static [(&'static str, &'static str)] {
        match self {
            Hook::RefusedTracepoints => &[("SQLBEE_TEST_REFUSE_PROGRAMS", "sendto_or_write")],
            Hook::Tracepoints | Hook::Raw => &[],
        }
    }
}

fn connect(server: &PrivateServer) -> mysql::Conn {
    let socket = server.socket.to_str().unwrap();
    let opts = mysql::OptsBuilder::new().socket(Some(socket)).user(Some("root")).prefer_socket(true);
    mysql::Conn::new(opts).expect("connecting to the private server")
}

/// How sysbench reaches the server.
#[derive(Clone, Copy, PartialEq)]
enum Connections {
    /// A thread per connection, plain.
    Plain,
    /// The thread pool's workers, each connection over TLS: the answers
    /// leave by `write`, on whichever worker took the statement.
    TlsOnThreadPool,
}

/// sysbench connected and prepared before the agent, paused around the
/// status reads: each answer the server sent is one statement, and the
/// digests' counts are the server's `Com_*` counters.
fn sysbench_through_the_send_hook(ps_mode: &'static str, connections: Connections, hook: Hook) {
    let _serial = common::one_at_a_time();
    let certs = tempfile_dir(&format!("send-certs-{ps_mode}"));
    let server_flags = match connections {
        Connections::Plain => Vec::new(),
        Connections::TlsOnThreadPool => {
            let (cert, key) = self_signed(&certs);
            vec![
                format!("--ssl-cert={cert}"),
                format!("--ssl-key={key}"),
                format!("--ssl-ca={cert}"),
                "--thread-handling=pool-of-threads".into(),
            ]
        }
    };
    let flags: Vec<&str> = server_flags.iter().map(String::as_str).collect();
    let server = PrivateServer::start(&format!("send-{ps_mode}"), &flags).unwrap();
    let ssl: &[&str] = if connections == Connections::TlsOnThreadPool { &["--mysql-ssl=on"] } else { &[] };
    let run = common::Workload::sysbench_with(&server, "oltp_read_only", 4, 30, ps_mode, ssl, Some(&certs));
    std::thread::sleep(Duration::from_millis(1500));
    run.pause();
    let before = common::status_before_agent(&server);
    let agent = Agent::start_with_env(server.dir(), &send_hook_args(&server, hook), hook.env());
    let programs = agent.programs();
    run.resume();
    std::thread::sleep(Duration::from_secs(3));
    run.pause();
    let out = agent.stop();
    let after = server.global_status().unwrap();
    drop(run);
    if matches!(hook, Hook::RefusedTracepoints) {
        assert!(out.stderr.contains("falling back to the raw sys_enter tracepoint"), "{}", out.stderr);
    }
    std::fs::remove_dir_all(&certs).ok();
    if connections == Connections::TlsOnThreadPool {
        // The four sysbench connections spoke TLS.
        let tls = before["Ssl_finished_accepts"];
        assert!(tls >= 4, "{tls} TLS connections");
    }
    assert!(out.success, "{}", out.stderr);
    assert!(programs.iter().any(|p| p == hook.program()), "{programs:?}");
    assert!(!programs.iter().any(|p| p == "statement_end"), "the uprobe stays off: {programs:?}");

    let counts = out.digest_counts(None);
    let total: u64 = counts.values().sum();
    assert!(total > 1000, "too little traffic to judge: {counts:#?}");
    assert!(!counts.keys().any(|k| k.contains("text unknown")), "{counts:#?}");
    assert_eq!(counts["COMMIT"], delta(&before, &after, "Com_commit"), "{counts:#?}");
    assert_eq!(counts["BEGIN"], delta(&before, &after, "Com_begin"), "{counts:#?}");
    let selects: u64 = counts.iter().filter(|(text, _)| text.starts_with("SELECT ")).map(|(_, n)| n).sum();
    assert_eq!(selects, delta(&before, &after, "Com_select"), "{counts:#?}");
    let commands = out.commands(None);
    let executes = commands.get("COM_STMT_EXECUTE").copied().unwrap_or(0);
    assert_eq!(executes, delta(&before, &after, "Com_stmt_execute"), "{commands:?}");
    if ps_mode == "auto" {
        assert!(executes > 1000, "{commands:?}");
    }
    // And nothing else: no status read of the harness falls inside the
    // agent's life.
    let server_total: u64 = ["Com_select", "Com_begin", "Com_commit"].iter().map(|c| delta(&before, &after, c)).sum();
    assert_eq!(total, server_total, "{counts:#?}");
    assert_eq!(out.summary_total(None, "statements") - out.summary_total(None, "unmatched"), total);
    assert_eq!(out.summary_total(None, "dropped_events"), 0);
    // The kernel skips a tracepoint's programs on a CPU busy with another
    // BPF program or a bpf() call, and says how often (6.7 and later): it
    // answered, and skipped none of the runs counted exactly above.
    let skipped: Vec<u64> = out.of_type("summary").filter_map(|l| l["skipped_runs"].as_u64()).collect();
    assert!(!skipped.is_empty(), "no window said how many runs the kernel skipped:\n{}", out.stderr);
    assert_eq!(skipped.iter().sum::<u64>(), 0, "{}", out.stderr);
}

#[test]
fn prepared_statements_end_at_their_answers() {
    if privileged("prepared_statements_end_at_their_answers") {
        sysbench_through_the_send_hook("auto", Connections::Plain, Hook::Tracepoints);
    }
}

#[test]
fn text_statements_end_at_their_answers() {
    if privileged("text_statements_end_at_their_answers") {
        sysbench_through_the_send_hook("disable", Connections::Plain, Hook::RefusedTracepoints);
    }
}

#[test]
fn answers_over_tls_on_the_thread_pool_are_statements_too() {
    if privileged("answers_over_tls_on_the_thread_pool_are_statements_too") {
        sysbench_through_the_send_hook("auto", Connections::TlsOnThreadPool, Hook::Tracepoints);
    }
}

#[test]
fn answers_over_tls_reach_the_raw_tracepoint_too() {
    if privileged("answers_over_tls_reach_the_raw_tracepoint_too") {
        sysbench_through_the_send_hook("disable", Connections::TlsOnThreadPool, Hook::Raw);
    }
}

fn tempfile_dir(name: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("sqlbee-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// A throwaway self-signed certificate and key for the server's TLS, also
/// as the client's (sysbench presents `client-cert.pem` and
/// `client-key.pem` and checks the server against `cacert.pem`, all in its
/// working directory, and the server checks the client's against its CA).
fn self_signed(dir: &std::path::Path) -> (String, String) {
    let (cert, key) = (dir.join("cert.pem"), dir.join("key.pem"));
    let made = std::process::Command::new("openssl")
        .args(["req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=sqlbee-test"])
        .arg("-keyout")
        .arg(&key)
        .arg("-out")
        .arg(&cert)
        .output()
        .expect("openssl (Debian's openssl package) makes the test certificate");
    assert!(made.status.success(), "{}", String::from_utf8_lossy(&made.stderr));
    for (from, to) in [(&cert, "client-cert.pem"), (&key, "client-key.pem"), (&cert, "cacert.pem")] {
        std::fs::copy(from, dir.join(to)).unwrap();
    }
    (cert.display().to_string(), key.display().to_string())
}

/// The answers a send cannot tell apart by itself: a result larger than
/// the network buffer (many sends, one statement), each statement of a
/// multi-statement packet, errors, statement preparations (answered,
/// not statements), a ping and a slow statement's time.
#[test]
fn each_answer_is_one_statement() {
    if !privileged("each_answer_is_one_statement") {
        return;
    }
    let _serial = common::one_at_a_time();
    let server = PrivateServer::start("send-answers", &["--slow-query-log=1", "--long-query-time=0"]).unwrap();
    let rows: Vec<String> = (1..=5000).map(|i| format!("({i}, REPEAT('x', 200))")).collect();
    server
        .sql(&format!(
            "CREATE DATABASE app; CREATE TABLE app.t (id INT PRIMARY KEY, v TEXT); INSERT INTO app.t VALUES {}",
            rows.join(",")
        ))
        .unwrap();
    // One statement for the server, not split at its semicolons as the
    // command-line client would.
    connect(&server)
        .query_drop(
            "CREATE PROCEDURE app.two() BEGIN SELECT COUNT(*) FROM app.t; SELECT id FROM app.t WHERE id < 3; END",
        )
        .unwrap();
    let agent = Agent::start(server.dir(), &send_hook_args(&server, Hook::Tracepoints));
    let mut multi = connect(&server);
    let mut conn = connect(&server);
    const BIG: u64 = 3;
    for _ in 0..BIG {
        let rows: Vec<(u32, String)> = conn.query("SELECT id, v FROM app.t").unwrap();
        assert_eq!(rows.len(), 5000);
    }
    // Each statement of the packet answers on its own.
    multi.query_iter("SELECT 1; SELECT 2 FROM DUAL; DO 3").unwrap().for_each(drop);
    for i in 0..4 {
        assert!(conn.query_drop(format!("SELEC {i} FROM nowhere")).is_err());
    }
    let stmt = conn.prep("SELECT v FROM app.t WHERE id = ?").unwrap();
    for i in 1..=20u32 {
        let _: Option<String> = conn.exec_first(&stmt, (i,)).unwrap();
    }
    conn.close(stmt).unwrap();
    assert!(conn.ping().is_ok());
    conn.query_drop("DO SLEEP(0.3)").unwrap();
    // A procedure's result sets leave while it runs, each with a final
    // status: the stack tells them from the CALL's own answer.
    const CALLS: u64 = 3;
    for _ in 0..CALLS {
        conn.query_iter("CALL app.two()").unwrap().for_each(drop);
    }
    drop((conn, multi));
    std::thread::sleep(Duration::from_millis(300));
    let out = agent.stop();
    assert!(out.success, "{}", out.stderr);

    let nested = |want: bool| out.of_type("digest").filter(move |r| (r["nested"] == true) == want);
    let calls: u64 = nested(false)
        .filter(|r| r["digest_text"].as_str().unwrap().starts_with("CALL"))
        .map(|r| r["count"].as_u64().unwrap())
        .sum();
    assert_eq!(calls, CALLS, "{:#?}", nested(false).collect::<Vec<_>>());
    let inside: u64 = nested(true).filter(|r| r["program"] == "app.two").map(|r| r["count"].as_u64().unwrap()).sum();
    assert_eq!(inside, 2 * CALLS, "{:#?}", nested(true).collect::<Vec<_>>());
    let client_total: u64 = nested(false).map(|r| r["count"].as_u64().unwrap()).sum();
    let counts = out.digest_counts(None);
    assert_eq!(counts.get("SELECT ID, `v` FROM `app`.`t`"), Some(&BIG), "{counts:#?}");
    assert_eq!(counts.get("SELECT ?"), Some(&1), "{counts:#?}");
    assert_eq!(counts.get("SELECT ? FROM DUAL"), Some(&1), "{counts:#?}");
    assert_eq!(counts.get("DO ?"), Some(&1), "{counts:#?}");
    assert_eq!(counts.get("SELECT `v` FROM `app`.`t` WHERE ID = ?"), Some(&20), "{counts:#?}");
    let syntax: u64 = out
        .of_type("digest")
        .filter(|r| r["digest_text"].as_str().unwrap().starts_with("`SELEC` ? FROM"))
        .map(|r| r["error_codes"]["1064"].as_u64().unwrap_or(0))
        .sum();
    assert_eq!(syntax, 4, "{counts:#?}");
    let sleep: Vec<_> = out.digest_rows("DO `SLEEP` (?)").collect();
    assert_eq!(sleep.len(), 1, "{counts:#?}");
    let ns = sleep[0]["max_ns"].as_u64().unwrap_or(0);
    assert!((300_000_000..=500_000_000).contains(&ns), "{:#?}", sleep[0]);
    // The client asks two variables when it connects, twice.
    assert_eq!(counts.get("SELECT @@SOCKET"), Some(&2), "{counts:#?}");
    assert_eq!(counts.get("SELECT @@`max_allowed_packet`"), Some(&2), "{counts:#?}");
    // Nothing else: the ping, the preparation, the close, the logins, the
    // slow log's writes after each answer and the procedure's result sets
    // are not clients' statements.
    assert_eq!(client_total, BIG + 3 + 4 + 20 + 1 + 4 + CALLS, "{counts:#?}");
}
