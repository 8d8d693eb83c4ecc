//! The capture path end to end: real mariadbd, real eBPF programs, the real
//! `sqlbee agent` binary. Every count is compared with what the workload
//! executed and with the server's own status counters.
mod common;

use std::time::Duration;

use common::{Agent, NOT_QUESTIONS, PrivateServer, delta, instance_of, privileged};
use mysql::prelude::Queryable;

fn connect(server: &PrivateServer) -> mysql::Conn {
    connect_socket(&server.socket)
}

/// For threads, which cannot borrow the server.
fn connect_socket(socket: &std::path::Path) -> mysql::Conn {
    let opts = mysql::OptsBuilder::new().socket(Some(socket.to_str().unwrap())).user(Some("root")).prefer_socket(true);
    mysql::Conn::new(opts).expect("connecting to the private server")
}

fn agent_args(server: &PrivateServer) -> Vec<String> {
    vec![format!("--pid={}", server.pid())]
}

fn with(mut args: Vec<String>, flag: &str) -> Vec<String> {
    args.push(flag.to_string());
    args
}

#[test]
fn exact_counts_for_text_and_prepared_statements() {
    if !privileged("exact_counts_for_text_and_prepared_statements") {
        return;
    }
    let server = PrivateServer::start("exact", &[]).unwrap();
    let rows: Vec<String> = (1..=100).map(|i| format!("({i}, 0)")).collect();
    server
        .sql(&format!(
            "CREATE DATABASE app; CREATE TABLE app.t (id INT PRIMARY KEY, v INT); INSERT INTO app.t VALUES {}",
            rows.join(",")
        ))
        .unwrap();
    let before = common::status_before_agent(&server);
    let agent = Agent::start(server.dir(), &with(agent_args(&server), "--command-probe"));

    const TEXT: u64 = 157;
    const PREPARED: u64 = 211;
    let mut conn = connect(&server);
    let stmt = conn.prep("UPDATE app.t SET v = v + ? WHERE id = ?").unwrap();
    // One of each first, then time for the agent to drain their records
    // and register their text hashes, so the rest is counted in the kernel.
    for i in 0..TEXT {
        conn.query_drop(format!("SELECT v FROM app.t WHERE id = {}", i % 100 + 1)).unwrap();
        conn.exec_drop(&stmt, (1, i % 100 + 1)).unwrap();
        if i == 0 {
            std::thread::sleep(Duration::from_millis(500));
        }
    }
    for i in TEXT..PREPARED {
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
    // The server's own query counter, read from its memory for every
    // window, counts what Questions counts plus the prepared-statement
    // commands MariaDB leaves out of Questions but gives a query id.
    let server_counted: u64 =
        out.of_type("summary").map(|s| s["probes"]["server_statements"].as_u64().unwrap_or(0)).sum();
    let skipped = get("COM_STMT_PREPARE") + get("COM_STMT_CLOSE") + get("COM_STMT_RESET");
    assert_eq!(skipped, 2);
    // Window by window, for a failure to say where the counts parted.
    let by_window: Vec<(u64, u64)> = out
        .of_type("summary")
        .map(|s| (s["probes"]["server_statements"].as_u64().unwrap_or(0), s["statements"].as_u64().unwrap_or(0)))
        .collect();
    assert_eq!(
        server_counted + 2,
        delta(&before, &after, "Questions") + skipped,
        "the server's counter over the windows (server's, agent's per window: {by_window:?})\n{}",
        out.stderr
    );
    // Every statement the kernel saw arrived as an event and in a digest
    // (unmatched: statement ends whose start fell before the attach).
    let statements = out.summary_total(None, "statements") - out.summary_total(None, "unmatched");
    assert_eq!(statements, counts.values().sum::<u64>());
    assert_eq!(out.summary_total(None, "dropped_events"), 0);
    // After its first record, a text's statements are counted in the
    // kernel; the exact counts above include them.
    let in_kernel = out.summary_total(None, "aggregated_in_kernel");
    assert_eq!(in_kernel, TEXT + PREPARED - 2, "counted in the kernel");
}

/// Texts of every length are counted in the kernel once registered (short
/// prepared texts are hashed in line, long ones in a loop), and with fewer
/// kernel slots than texts the rest keep coming as records: either way every
/// text's count is exact.
#[test]
fn kernel_aggregation_keeps_counts_exact_for_long_texts_and_few_slots() {
    if !privileged("kernel_aggregation_keeps_counts_exact_for_long_texts_and_few_slots") {
        return;
    }
    let server = PrivateServer::start("kernel-slots", &[]).unwrap();
    server
        .sql("CREATE DATABASE app; CREATE TABLE app.t (id INT PRIMARY KEY, v INT); INSERT INTO app.t VALUES (1, 0)")
        .unwrap();
    const TEXTS: usize = 8;
    const ROUNDS: u64 = 40;
    // Prepared texts from 40 to 200 bytes, text-protocol ones alike.
    let padding = |k: usize| (0..k * 3).map(|i| format!(", {i} AS p{i}")).collect::<String>();
    let prepared_text = |k: usize| format!("SELECT v AS c{k}{} FROM app.t WHERE id = ?", padding(k));
    let query_text = |k: usize| format!("SELECT v AS q{k}{} FROM app.t WHERE id = 1", padding(k));

    for (slots, all_in_kernel) in [("--kernel-digests=64", true), ("--kernel-digests=2", false)] {
        // Connected and prepared first: the connection's own set-up queries
        // would otherwise take the two slots.
        let mut conn = connect(&server);
        let statements: Vec<_> = (0..TEXTS).map(|k| conn.prep(prepared_text(k)).unwrap()).collect();
        let agent = Agent::start(server.dir(), &with(with(agent_args(&server), slots), "--window=1s"));
        for round in 0..ROUNDS {
            for (k, stmt) in statements.iter().enumerate() {
                conn.exec_drop(stmt, (1,)).unwrap();
                conn.query_drop(query_text(k)).unwrap();
            }
            if round == 0 {
                // Time to drain the first records and register their hashes.
                std::thread::sleep(Duration::from_millis(500));
            }
        }
        for stmt in statements {
            conn.close(stmt).unwrap();
        }
        drop(conn);
        std::thread::sleep(Duration::from_millis(100));
        let out = agent.stop();
        assert!(out.success, "agent failed: {}", out.stderr);
        let counts = out.digest_counts(None);
        for k in 0..TEXTS {
            for alias in [format!("`c{k}`"), format!("`q{k}`")] {
                let of_text: Vec<_> = counts.iter().filter(|(text, _)| text.contains(&alias)).collect();
                assert_eq!(of_text.len(), 1, "one digest for {alias}: {counts:#?}");
                assert_eq!(*of_text[0].1, ROUNDS, "{alias} with {slots}");
            }
        }
        assert_eq!(out.summary_total(None, "dropped_events"), 0);
        let in_kernel = out.summary_total(None, "aggregated_in_kernel");
        let total = ROUNDS * 2 * TEXTS as u64;
        if all_in_kernel {
            assert_eq!(in_kernel, total - 2 * TEXTS as u64, "all but each text's first statement, with {slots}");
        } else {
            let counted = in_kernel > 0 && in_kernel <= 2 * ROUNDS;
            assert!(counted, "two slots counted {in_kernel} of {total}: {}", out.stderr);
        }
    }
}

/// With the binary log on, the server writes the values of an executed
/// prepared write into its text (to log it), so each execution of one
/// statement has a text of its own, which reaches the agent as a record; a
/// read keeps its `?` and counts in the kernel. Both are counted exactly,
/// each under one digest.
#[test]
fn prepared_writes_with_the_binary_log_on_are_counted_exactly() {
    if !privileged("prepared_writes_with_the_binary_log_on_are_counted_exactly") {
        return;
    }
    let server = PrivateServer::start("binlog-prepared", &["--log-bin=sqlbee-bin", "--server-id=1"]).unwrap();
    assert_eq!(server.sql("SELECT @@log_bin").unwrap().trim(), "1", "the binary log is on");
    let rows: Vec<String> = (1..=50).map(|id| format!("({id}, 0)")).collect();
    server
        .sql(&format!(
            "CREATE DATABASE app; CREATE TABLE app.t (id INT PRIMARY KEY, v INT); INSERT INTO app.t VALUES {}",
            rows.join(", ")
        ))
        .unwrap();
    const ROUNDS: u64 = 200;
    let mut conn = connect(&server);
    let update = conn.prep("UPDATE app.t SET v = v + ? WHERE id = ?").unwrap();
    let select = conn.prep("SELECT v FROM app.t WHERE id = ?").unwrap();
    let agent = Agent::start(server.dir(), &with(agent_args(&server), "--window=1s"));
    let mut added = 0;
    for round in 0..ROUNDS {
        let (step, id) = (round % 7 + 1, round % 50 + 1);
        conn.exec_drop(&update, (step, id)).unwrap();
        conn.exec_drop(&select, (id,)).unwrap();
        added += step;
        if round == 0 {
            // Time to drain the first records and register their hashes.
            std::thread::sleep(Duration::from_millis(500));
        }
    }
    conn.close(update).unwrap();
    conn.close(select).unwrap();
    drop(conn);
    std::thread::sleep(Duration::from_millis(100));
    let out = agent.stop();
    assert!(out.success, "agent failed: {}", out.stderr);
    let total: u64 = server.sql("SELECT SUM(v) FROM app.t").unwrap().trim().parse().unwrap();
    assert_eq!(total, added, "every update ran");
    let counts = out.digest_counts(None);
    for (start, what) in [("UPDATE", "the update"), ("SELECT", "the select")] {
        let of: Vec<_> = counts.iter().filter(|(text, _)| text.starts_with(start) && text.contains("WHERE")).collect();
        assert_eq!(of.len(), 1, "one digest for {what}: {counts:#?}");
        assert_eq!(*of[0].1, ROUNDS, "{what}: {counts:#?}");
    }
    assert_eq!(out.summary_total(None, "dropped_events"), 0);
    // The reads count in the kernel; the writes' texts with their values
    // do not (see the kernel-aggregation page).
    let in_kernel = out.summary_total(None, "aggregated_in_kernel");
    assert!((ROUNDS - 10..ROUNDS + 40).contains(&in_kernel), "{in_kernel} of {} in the kernel", 2 * ROUNDS);
    // Samples keep no value.
    let written = serde_json::to_string(&out.lines).unwrap();
    for step in 1..=7 {
        assert!(!written.contains(&format!("v + {step}")), "a write's value left the agent");
    }
}

/// The statement start comes from the server's own THD (`start_utime`), not
/// from a probe at the start: a statement already running when the agent
/// attaches is still timed from its real start, and the default attaches
/// one probe on the statement path only.
#[test]
fn statement_running_at_attach_is_timed_from_its_real_start() {
    if !privileged("statement_running_at_attach_is_timed_from_its_real_start") {
        return;
    }
    let server = PrivateServer::start("running-at-attach", &[]).unwrap();
    let socket = server.socket.clone();
    // Long enough that the agent attaches before it ends even while other
    // tests load both cores (attaching took over 1.2 s in one CI run).
    let sleeper = std::thread::spawn(move || connect_socket(&socket).query_drop("SELECT SLEEP(3)").unwrap());
    std::thread::sleep(Duration::from_millis(300));
    let agent = Agent::start(server.dir(), &agent_args(&server));
    // `calibrate` traps on a function of the agent itself, never on mysqld.
    let mut programs: Vec<String> = agent.programs().into_iter().filter(|p| p != "calibrate").collect();
    programs.sort();
    // account_change traps only when a connection logs in or changes
    // user, schema_change only on USE and its kin, nested_start and
    // nested_end only in stored programs, apply_start and apply_end only
    // on a replica's applier.
    assert_eq!(
        programs,
        [
            "account_change",
            "apply_end",
            "apply_start",
            "error_raised",
            "nested_end",
            "nested_start",
            "schema_change",
            "statement_end"
        ],
        "only the statement end, the error funnel, logins, schema changes, stored programs and a replica's \
         applier by default"
    );
    sleeper.join().unwrap();
    let out = agent.stop();
    let rows: Vec<_> = out.digest_rows("SELECT `SLEEP` (?)").collect();
    assert_eq!(rows.iter().map(|r| r["count"].as_u64().unwrap()).sum::<u64>(), 1, "{:#?}", out.lines);
    let max = rows[0]["max_ns"].as_u64().unwrap();
    assert!((3_000_000_000..=3_200_000_000).contains(&max), "timed {max} ns, not from its start");
    assert_eq!(out.summary_total(None, "unmatched"), 0);
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
    let message = insert.iter().find_map(|r| r["error_messages"]["1062"].as_str()).unwrap_or_default();
    assert!(message.contains("Duplicate entry"), "{insert:#?}");
    let syntax: u64 = out
        .of_type("digest")
        .filter(|r| r["digest_text"].as_str().unwrap().starts_with("`SELEC` ? FROM"))
        .map(|r| r["error_codes"]["1064"].as_u64().unwrap_or(0))
        .sum();
    assert_eq!(syntax, 4, "{:#?}", out.lines);
}

/// sysbench connects and prepares its statements before the agent starts,
/// as a connection pool would. SIGSTOP freezes it around the status reads
/// so the server's counters and the agent's cover the same statements.
fn sysbench_started_before_agent(ps_mode: &'static str) {
    // Each drives its server as fast as it goes: on two cores, two of them
    // side by side starve their agents.
    let _serial = common::one_at_a_time();
    let server = PrivateServer::start(&format!("sysbench-{ps_mode}"), &[]).unwrap();
    // Read-only: a paused writer could leave a statement blocked on its
    // row lock across the attach or the stop, and the server counts
    // `Com_*` when a statement starts, the agent when it ends.
    let run = common::Workload::sysbench(&server, "oltp_read_only", 4, 30, ps_mode);
    std::thread::sleep(Duration::from_millis(1500));
    run.pause();
    let before = common::status_before_agent(&server);
    // The command probe: Questions also counts commands and statements
    // that never reach the statement end (see README, one trap per
    // statement), so the equation below needs the optional start probe.
    let agent = Agent::start(server.dir(), &with(agent_args(&server), "--command-probe"));
    run.resume();
    std::thread::sleep(Duration::from_secs(3));
    run.pause();
    let out = agent.stop();
    let after = server.global_status().unwrap();
    drop(run);
    assert!(out.success, "{}", out.stderr);

    let counts = out.digest_counts(None);
    let total: u64 = counts.values().sum();
    assert!(total > 1000, "too little traffic to judge: {counts:#?}");
    for text in [
        "SELECT `c` FROM `sbtest1` WHERE ID = ?",
        "SELECT DISTINCT `c` FROM `sbtest2` WHERE ID BETWEEN ? AND ? ORDER BY `c`",
        "SELECT SUM (`k`) FROM `sbtest1` WHERE ID BETWEEN ? AND ?",
        "COMMIT",
    ] {
        assert!(counts.get(text).is_some_and(|n| *n > 0), "{text} missing in {counts:#?}");
    }
    assert!(!counts.keys().any(|k| k.contains("text unknown")), "{counts:#?}");

    let commands = out.commands(None);
    let get = |c: &str| commands.get(c).copied().unwrap_or(0);
    assert_eq!(get("COM_STMT_EXECUTE"), delta(&before, &after, "Com_stmt_execute"));
    if ps_mode == "auto" {
        assert!(get("COM_STMT_EXECUTE") > 1000);
        assert_eq!(get("COM_STMT_PREPARE"), 0, "sysbench prepared before the agent attached");
    } else {
        assert_eq!(get("COM_STMT_EXECUTE"), 0);
    }
    let questions: u64 = commands.iter().filter(|(c, _)| !NOT_QUESTIONS.contains(&c.as_str())).map(|(_, n)| n).sum();
    assert_eq!(questions + 2, delta(&before, &after, "Questions"), "{commands:?}");
    // The server's own query counter, read from its memory for every
    // window, counts what Questions counts plus the prepared-statement
    // commands MariaDB leaves out of Questions but gives a query id.
    let server_counted: u64 =
        out.of_type("summary").map(|s| s["probes"]["server_statements"].as_u64().unwrap_or(0)).sum();
    let skipped = get("COM_STMT_PREPARE") + get("COM_STMT_CLOSE") + get("COM_STMT_RESET");
    // Window by window, for a failure to say where the counts parted.
    let by_window: Vec<(u64, u64)> = out
        .of_type("summary")
        .map(|s| (s["probes"]["server_statements"].as_u64().unwrap_or(0), s["statements"].as_u64().unwrap_or(0)))
        .collect();
    assert_eq!(
        server_counted + 2,
        delta(&before, &after, "Questions") + skipped,
        "the server's counter over the windows (server's, agent's per window: {by_window:?})\n{}",
        out.stderr
    );
    assert_eq!(out.summary_total(None, "statements") - out.summary_total(None, "unmatched"), total);
    assert!(out.summary_total(None, "unmatched") <= 1, "only a statement ending at the attach may be unmatched");
    assert_eq!(out.summary_total(None, "dropped_events"), 0);
    assert_eq!(counts["COMMIT"], delta(&before, &after, "Com_commit"));
    let selects: u64 = counts.iter().filter(|(text, _)| text.starts_with("SELECT ")).map(|(_, n)| n).sum();
    assert_eq!(selects, delta(&before, &after, "Com_select"));
    // Counts stay exact whichever way a statement was counted (how many the
    // kernel counted depends on how soon the agent registered each text;
    // exact_counts_for_text_and_prepared_statements pins that).
    assert!(out.summary_total(None, "aggregated_in_kernel") <= total);
}

#[test]
fn sysbench_prepared_before_attach() {
    if privileged("sysbench_prepared_before_attach") {
        sysbench_started_before_agent("auto");
    }
}

#[test]
fn sysbench_text_protocol_before_attach() {
    if privileged("sysbench_text_protocol_before_attach") {
        sysbench_started_before_agent("disable");
    }
}

/// Waits until every connection but this one has ended, and with it the
/// last statement each ran (a client has its answer a moment before the
/// server ends the statement).
fn other_connections_ended(server: &PrivateServer) {
    let others = "SELECT COUNT(*) FROM information_schema.PROCESSLIST WHERE USER = 'root' AND ID <> CONNECTION_ID()";
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while server.sql(others).unwrap().trim() != "0" {
        assert!(std::time::Instant::now() < deadline, "the earlier connections did not end");
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

#[test]
fn server_restart_is_followed() {
    if !privileged("server_restart_is_followed") {
        return;
    }
    let mut server = PrivateServer::start("restart", &[]).unwrap();
    let first_pid = server.pid();
    let agent = Agent::start(server.dir(), &agent_args(&server));
    for _ in 0..5 {
        server.sql("SELECT 'before restart'").unwrap();
    }
    // The restart is a SIGKILL: a connection thread that has answered its
    // client but not yet ended the statement (where the probe fires) would
    // lose it with the server.
    other_connections_ended(&server);
    server.restart().unwrap();
    let second_pid = server.pid();
    assert_ne!(first_pid, second_pid);
    // The agent rescans every 500 ms and attaches the new process; what
    // follows is counted exactly.
    agent.wait_attached(second_pid);
    for _ in 0..7 {
        server.sql("SELECT 'after restart'").unwrap();
    }
    other_connections_ended(&server);
    let out = agent.stop();
    assert!(out.success, "{}", out.stderr);
    let counts = out.digest_counts(None);
    assert_eq!(counts.get("SELECT ?"), Some(&12), "{counts:#?}\n{}", out.stderr);
    let log = common::strip_ansi(&out.stderr);
    for pid in [first_pid, second_pid] {
        assert!(log.lines().any(|l| l.contains("attached") && l.contains(&format!("pid={pid}"))), "{log}");
    }
    assert!(log.contains("server went away"), "{log}");
}

#[test]
fn two_instances_are_kept_apart() {
    if !privileged("two_instances_are_kept_apart") {
        return;
    }
    let a = PrivateServer::start("two-a", &[]).unwrap();
    let b = PrivateServer::start("two-b", &[]).unwrap();
    let agent = Agent::start(a.dir(), &[format!("--pid={},{}", a.pid(), b.pid())]);
    for _ in 0..17 {
        a.sql("SELECT 'instance'").unwrap();
    }
    for _ in 0..29 {
        b.sql("SELECT 'instance'").unwrap();
    }
    let out = agent.stop();
    assert_eq!(out.digest_counts(Some(&instance_of(&a))).get("SELECT ?"), Some(&17));
    assert_eq!(out.digest_counts(Some(&instance_of(&b))).get("SELECT ?"), Some(&29));
}

#[test]
fn bad_input_is_handled() {
    if !privileged("bad_input_is_handled") {
        return;
    }
    let server = PrivateServer::start("bad-input", &["--max-allowed-packet=64M"]).unwrap();
    let agent = Agent::start(server.dir(), &agent_args(&server));
    let mut conn = connect(&server);
    // 1 MiB statement: truncated at the 4 KiB capture limit, still counted.
    let huge = format!("SELECT '{}' AS big", "x".repeat(1 << 20));
    conn.query_drop(&huge).unwrap();
    // Invalid UTF-8 inside a string literal (binary charset connection).
    conn.query_drop("SET NAMES binary").unwrap();
    let mut bytes = b"SELECT '".to_vec();
    bytes.extend_from_slice(&[0xff, 0xfe, 0x80]);
    bytes.extend_from_slice(b"' AS junk");
    let text = unsafe { String::from_utf8_unchecked(bytes) };
    let _ = conn.query_drop(&text);
    // MariaDB-only syntax sqlparser does not know.
    conn.query_drop("CREATE DATABASE app").unwrap();
    conn.query_drop("CREATE SEQUENCE app.s1 START WITH 10 INCREMENT BY 5").unwrap();
    conn.query_drop("SELECT NEXTVAL(app.s1)").unwrap();
    conn.query_drop("SELECT 1 FROM DUAL WHERE 1 = 1 LIMIT ROWS EXAMINED 100").unwrap();
    drop(conn);
    let out = agent.stop();
    assert!(out.success, "{}", out.stderr);
    // Cut inside the string literal, the text still normalizes (the
    // unterminated literal becomes `?`).
    let big: Vec<_> = out.of_type("digest").filter(|d| d["truncated"].as_u64() > Some(0)).collect();
    assert_eq!(big.len(), 1, "{:#?}", out.lines);
    assert_eq!((big[0]["digest_text"].as_str(), big[0]["count"].as_u64()), (Some("SELECT ?"), Some(1)));
    assert!(big[0]["sample"].as_str().unwrap().len() <= 1024);
    let counts = out.digest_counts(None);
    assert_eq!(counts.get("SELECT ? AS `junk`"), Some(&1), "{counts:#?}");
    assert_eq!(counts.get("CREATE SEQUENCE `app`.`s1` START WITH ? INCREMENT BY ?"), Some(&1), "{counts:#?}");
    assert_eq!(counts.get("SELECT NEXTVAL (`app`.`s1`)"), Some(&1), "{counts:#?}");
    assert_eq!(
        out.summary_total(None, "statements") - out.summary_total(None, "unmatched"),
        counts.values().sum::<u64>()
    );
}

#[test]
fn wrong_pid_and_wrong_binary_are_clear_errors() {
    if !privileged("wrong_pid_and_wrong_binary_are_clear_errors") {
        return;
    }
    let out = std::process::Command::new(common::sqlbee()).args(["agent", "--pid", "999999999"]).output().unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("no process with pid 999999999"), "{stderr}");

    let mut sleeper = std::process::Command::new("sleep").arg("30").spawn().unwrap();
    let out = std::process::Command::new(common::sqlbee())
        .args(["agent", "--pid", &sleeper.id().to_string()])
        .output()
        .unwrap();
    let _ = sleeper.kill();
    let _ = sleeper.wait();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("dispatch_command") && stderr.contains("sleep"), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
}

/// Wait rows of one digest (summed over windows): class -> (sum, max, statements).
fn waits_of(out: &common::AgentOutput, text: &str) -> std::collections::BTreeMap<String, (u64, u64, u64)> {
    let mut waits = std::collections::BTreeMap::new();
    for row in out.digest_rows(text) {
        for (class, w) in row["waits"].as_object().unwrap() {
            let e: &mut (u64, u64, u64) = waits.entry(class.clone()).or_default();
            e.0 += w["sum_ns"].as_u64().unwrap();
            e.1 = e.1.max(w["max_ns"].as_u64().unwrap());
            e.2 += w["statements"].as_u64().unwrap();
        }
    }
    waits
}

#[test]
fn row_lock_wait_is_timed_on_the_waiting_statement() {
    if !privileged("row_lock_wait_is_timed_on_the_waiting_statement") {
        return;
    }
    let server = PrivateServer::start("row-lock", &[]).unwrap();
    server.sql("CREATE DATABASE app; CREATE TABLE app.r (id INT PRIMARY KEY, v INT) ENGINE=InnoDB; INSERT INTO app.r VALUES (1, 0)").unwrap();
    let agent = Agent::start(server.dir(), &with(agent_args(&server), "--wait-probes"));
    let mut holder = connect(&server);
    holder.query_drop("BEGIN").unwrap();
    holder.query_drop("SELECT v FROM app.r WHERE id = 1 FOR UPDATE").unwrap();
    let waiter_server = server.socket.clone();
    let waiter = std::thread::spawn(move || {
        let mut conn = connect_socket(&waiter_server);
        conn.query_drop("UPDATE app.r SET v = v + 1 WHERE id = 1").unwrap();
    });
    std::thread::sleep(Duration::from_millis(500));
    holder.query_drop("COMMIT").unwrap();
    waiter.join().unwrap();
    let out = agent.stop();
    let waits = waits_of(&out, "UPDATE `app`.`r` SET `v` = `v` + ? WHERE ID = ?");
    let (sum, max, statements) = waits.get("row_lock").copied().unwrap_or_default();
    assert_eq!(statements, 1, "{waits:?}");
    assert!((450_000_000..=700_000_000).contains(&max) && sum == max, "row lock wait {max} ns: {waits:?}");
    // The holder itself never waited.
    assert!(waits_of(&out, "SELECT `v` FROM `app`.`r` WHERE ID = ? FOR UPDATE").is_empty());
    // One lock-wait record names the waiting statement and, as candidate
    // blocker, the holder's open transaction with its FOR UPDATE. (Its
    // commit may wait long too on a loaded host: a record of another class.)
    let records: Vec<_> = out.of_type("lock_wait").filter(|r| r["class"] == "row_lock").collect();
    assert_eq!(records.len(), 1, "{records:#?}");
    let r = records[0];
    assert_eq!(r["class"], "row_lock");
    assert_eq!(r["digest_text"], "UPDATE `app`.`r` SET `v` = `v` + ? WHERE ID = ?");
    assert_eq!(r["blocker_kind"], "candidates");
    let duration = r["duration_ns"].as_u64().unwrap();
    assert!((450_000_000..=700_000_000).contains(&duration), "{r:#?}");
    let holder_txn = r["blockers"].as_array().unwrap().iter().find(|b| {
        b["transaction"] == true
            && b["statements"]
                .as_array()
                .unwrap()
                .iter()
                .any(|s| s == "SELECT `v` FROM `app`.`r` WHERE ID = ? FOR UPDATE")
    });
    assert!(holder_txn.is_some(), "{r:#?}");
}

#[test]
fn metadata_lock_wait_is_timed_on_the_alter() {
    if !privileged("metadata_lock_wait_is_timed_on_the_alter") {
        return;
    }
    let server = PrivateServer::start("mdl", &[]).unwrap();
    server
        .sql("CREATE DATABASE app; CREATE TABLE app.m (id INT PRIMARY KEY) ENGINE=InnoDB; INSERT INTO app.m VALUES (1)")
        .unwrap();
    let agent = Agent::start(server.dir(), &with(agent_args(&server), "--wait-probes"));
    let mut holder = connect(&server);
    holder.query_drop("BEGIN").unwrap();
    holder.query_drop("SELECT * FROM app.m").unwrap();
    let socket = server.socket.clone();
    let alter = std::thread::spawn(move || {
        let mut conn = connect_socket(&socket);
        conn.query_drop("ALTER TABLE app.m ADD COLUMN note INT").unwrap();
    });
    std::thread::sleep(Duration::from_millis(300));
    holder.query_drop("COMMIT").unwrap();
    alter.join().unwrap();
    let out = agent.stop();
    let waits = waits_of(&out, "ALTER TABLE `app`.`m` ADD COLUMN `note` INT");
    let (_, max, _) = waits.get("metadata_lock").copied().unwrap_or_default();
    // The ALTER's connection is made in its thread: on a loaded machine
    // it starts waiting well after the 300 ms hold began, so the floor is
    // what any measured wait exceeds, not the hold.
    assert!((100_000_000..=600_000_000).contains(&max), "metadata lock wait {max} ns: {waits:?}");
    let record = out
        .of_type("lock_wait")
        .find(|r| r["class"] == "metadata_lock" && r["digest_text"] == "ALTER TABLE `app`.`m` ADD COLUMN `note` INT")
        .unwrap_or_else(|| panic!("no metadata lock record: {:#?}", out.lines));
    let blockers = record["blockers"].as_array().unwrap();
    assert!(
        blockers.iter().any(|b| b["statements"].as_array().unwrap().iter().any(|s| s == "SELECT * FROM `app`.`m`")),
        "{record:#?}"
    );
}

#[test]
fn statements_that_never_wait_report_no_wait() {
    if !privileged("statements_that_never_wait_report_no_wait") {
        return;
    }
    let server = PrivateServer::start("no-wait", &[]).unwrap();
    let agent = Agent::start(server.dir(), &with(agent_args(&server), "--wait-probes"));
    let mut conn = connect(&server);
    for i in 0..300 {
        conn.query_drop(format!("SELECT {i} + 1, SHA2('x', 256)")).unwrap();
    }
    drop(conn);
    let out = agent.stop();
    let rows: Vec<_> = out.digest_rows("SELECT ? + ?, `SHA2` (...)").collect();
    assert_eq!(rows.iter().map(|r| r["count"].as_u64().unwrap()).sum::<u64>(), 300, "{:#?}", out.lines);
    for row in rows {
        assert!(row["waits"].as_object().unwrap().is_empty(), "{row:#?}");
    }
}

/// Error codes counted on one digest over all windows.
fn error_count(out: &common::AgentOutput, text: &str, code: &str) -> u64 {
    out.digest_rows(text).map(|r| r["error_codes"][code].as_u64().unwrap_or(0)).sum()
}

#[test]
fn deadlock_and_lock_wait_timeout_are_counted_on_their_statements() {
    if !privileged("deadlock_and_lock_wait_timeout_are_counted_on_their_statements") {
        return;
    }
    let server = PrivateServer::start("deadlock", &["--innodb-lock-wait-timeout=1"]).unwrap();
    server
        .sql("CREATE DATABASE app; CREATE TABLE app.d (id INT PRIMARY KEY, v INT) ENGINE=InnoDB; INSERT INTO app.d VALUES (1, 0), (2, 0)")
        .unwrap();
    let agent = Agent::start(server.dir(), &with(agent_args(&server), "--wait-probes"));

    // Deadlock: A locks 1 then wants 2, B locks 2 then wants 1.
    let mut a = connect(&server);
    let mut b = connect(&server);
    a.query_drop("BEGIN").unwrap();
    b.query_drop("BEGIN").unwrap();
    a.query_drop("UPDATE app.d SET v = v + 1 WHERE id = 1").unwrap();
    b.query_drop("UPDATE app.d SET v = v + 10 WHERE id = 2").unwrap();
    let a_thread = std::thread::spawn(move || {
        let result = a.query_drop("UPDATE app.d SET v = v + 1 WHERE id = 2");
        (a, result.is_err())
    });
    std::thread::sleep(Duration::from_millis(200));
    let b_failed = b.query_drop("UPDATE app.d SET v = v + 10 WHERE id = 1").is_err();
    let (mut a, a_failed) = a_thread.join().unwrap();
    assert!(a_failed ^ b_failed, "exactly one victim");
    let _ = a.query_drop("ROLLBACK");
    let _ = b.query_drop("ROLLBACK");

    // Lock wait timeout: the holder keeps row 1 longer than 1 s.
    a.query_drop("BEGIN").unwrap();
    a.query_drop("UPDATE app.d SET v = 5 WHERE id = 1").unwrap();
    let timed_out = b.query_drop("UPDATE app.d SET v = 6 WHERE id = 1");
    assert!(timed_out.is_err());
    a.query_drop("ROLLBACK").unwrap();
    drop((a, b));
    let out = agent.stop();

    // Both sides run the same digest; the victim's statement carries 1213.
    let deadlocked = "UPDATE `app`.`d` SET `v` = `v` + ? WHERE ID = ?";
    assert_eq!(error_count(&out, deadlocked, "1213"), 1, "{:#?}", out.lines);
    let waiter = "UPDATE `app`.`d` SET `v` = ? WHERE ID = ?";
    assert_eq!(error_count(&out, waiter, "1205"), 1, "{:#?}", out.lines);
    // The timed-out statement waited on a row lock for about the timeout.
    let rows: Vec<_> = out.digest_rows(waiter).collect();
    let max: u64 = rows.iter().map(|r| r["waits"]["row_lock"]["max_ns"].as_u64().unwrap_or(0)).max().unwrap_or(0);
    assert!((900_000_000..=1_600_000_000).contains(&max), "row lock wait before timeout: {max} ns");
    // Failed statements stay in the totals.
    let count: u64 = rows.iter().map(|r| r["count"].as_u64().unwrap()).sum();
    assert_eq!(count, 2);
}
