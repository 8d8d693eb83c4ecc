//! No literal value leaves mysqld by default: passwords in every statement
//! form, an email and a card number in WHERE clauses, and values quoted by
//! error messages and query tags run through a real server, a real agent and a real
//! collector. None of them appears in the agent's JSON lines or log, its
//! state directory (spool, rejected, corrupt), the collector's store files
//! (WAL included), its log or any query answer, while the statements are still
//! counted exactly under their digests. Files are readable by their owner
//! only.
mod common;

use std::{os::unix::fs::PermissionsExt, path::Path, time::Duration};

use common::{Agent, PrivateServer, collector::Collector, collector::sqlbee_query, privileged};
use mysql::prelude::Queryable;

const SECRETS: [&str; 7] = [
    "Pw-S3cret",
    "ann.secret@example.com",
    "4111111111111111",
    "Secret-Card-9",
    "Hush-Key-7",
    "bob.hidden@corp.example",
    // The plans login's password.
    "plans-login-pw",
];

fn connect(server: &PrivateServer) -> mysql::Conn {
    connect_as(server, "redaction-test")
}

/// A connection whose client calls itself `program` at connect.
fn connect_as(server: &PrivateServer, program: &str) -> mysql::Conn {
    let opts = mysql::OptsBuilder::new()
        .socket(Some(server.socket.to_str().unwrap()))
        .user(Some("root"))
        .prefer_socket(true)
        .connect_attrs(Some(std::collections::HashMap::from([("program_name", program)])));
    mysql::Conn::new(opts).unwrap()
}

/// Every file under `dir`, with its bytes and mode.
fn files_under(dir: &Path, out: &mut Vec<(std::path::PathBuf, Vec<u8>, u32)>) {
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let path = entry.path();
        let meta = std::fs::metadata(&path).unwrap();
        if meta.is_dir() {
            files_under(&path, out);
        } else {
            out.push((path.clone(), std::fs::read(&path).unwrap_or_default(), meta.permissions().mode() & 0o777));
        }
    }
}

fn assert_no_secret(what: &str, bytes: &[u8]) {
    let text = String::from_utf8_lossy(bytes);
    for secret in SECRETS {
        assert!(!text.contains(secret), "{secret:?} leaked into {what}: {}", &text[..text.len().min(4000)]);
    }
}

#[test]
fn no_literal_leaves_by_default_and_counts_stay_exact() {
    if !privileged("no_literal_leaves_by_default_and_counts_stay_exact") {
        return;
    }
    let _serial = common::one_at_a_time();
    // performance_schema keeps the program names clients send (read with
    // the login).
    let server = PrivateServer::start("redaction", &["--performance-schema=ON"]).unwrap();
    server
        .sql(
            "CREATE DATABASE app; CREATE TABLE app.people (id INT PRIMARY KEY, email VARCHAR(64) UNIQUE, \
             card VARCHAR(32), n INT) ENGINE=InnoDB",
        )
        .unwrap();
    // Plans too: a login that may explain the application's statements.
    server
        .sql(
            "CREATE USER 'redact_plans'@'localhost' IDENTIFIED BY 'plans-login-pw'; \
             GRANT SELECT, UPDATE ON app.* TO 'redact_plans'@'localhost'; \
             GRANT SELECT ON performance_schema.session_connect_attrs TO 'redact_plans'@'localhost'",
        )
        .unwrap();
    let login = server.dir().join("login.toml");
    std::fs::write(&login, "user = \"redact_plans\"\npassword = \"plans-login-pw\"\n").unwrap();
    std::fs::set_permissions(&login, std::fs::Permissions::from_mode(0o600)).unwrap();
    let collector = Collector::start(&[]);
    let state = server.dir().join("agent-state");
    let agent = Agent::start(
        server.dir(),
        &[
            format!("--pid={}", server.pid()),
            format!("--collector={}", collector.http_url()),
            format!("--state-dir={}", state.display()),
            "--window=1s".into(),
            // Lock-wait records carry the waiting statement's sample.
            "--wait-probes".into(),
            format!("--server-login={}", login.display()),
            "--explain-rate=20".into(),
            "--long-statement=2s".into(),
        ],
    );

    // Program names are the client's own words: data may be in them.
    let mut conn = connect_as(&server, "mailer for ann.secret@example.com");
    let mut card_client = connect_as(&server, "card-4111111111111111");
    card_client.query_drop("SELECT 1").unwrap();
    let passwords = [
        "CREATE USER 'redact1'@'localhost' IDENTIFIED BY 'Pw-S3cret-1'",
        "ALTER USER 'redact1'@'localhost' IDENTIFIED BY 'Pw-S3cret-2'",
        "SET PASSWORD FOR 'redact1'@'localhost' = PASSWORD('Pw-S3cret-3')",
        "GRANT SELECT ON app.* TO 'redact2'@'localhost' IDENTIFIED BY 'Pw-S3cret-4'",
        "CREATE USER 'redact3'@'localhost' IDENTIFIED VIA mysql_native_password USING PASSWORD('Pw-S3cret-5')",
        "SELECT AES_ENCRYPT('Secret-Card-9', 'Hush-Key-7') IS NOT NULL",
    ];
    for sql in passwords {
        conn.query_drop(sql).unwrap_or_else(|e| panic!("{sql}: {e}"));
    }
    conn.query_drop("INSERT INTO app.people VALUES (1, 'ann.secret@example.com', '4111111111111111', 1)").unwrap();
    const SELECTS: u64 = 5;
    for _ in 0..SELECTS {
        let _: Vec<u64> = conn
            .query("SELECT id FROM app.people WHERE email = 'ann.secret@example.com' AND card = '4111111111111111'")
            .unwrap();
    }
    // Query tags whose values are data: counted, never sent as they are.
    conn.query_drop(
        "SELECT id FROM app.people WHERE id = 1 /*controller='ann.secret@example.com',route='/cards/4111111111111111'*/",
    )
    .unwrap();
    // Errors whose messages quote the values.
    let duplicate = conn.query_drop("INSERT INTO app.people VALUES (2, 'ann.secret@example.com', '1', 1)");
    assert!(duplicate.unwrap_err().to_string().contains("ann.secret@example.com"), "the server quotes the value");
    let not_a_number = conn.query_drop("INSERT INTO app.people VALUES (3, 'x@y', '1', 'Secret-Card-9')");
    assert!(not_a_number.unwrap_err().to_string().contains("Secret-Card-9"));

    // A lock wait whose waiting statement holds an email.
    conn.query_drop("INSERT INTO app.people VALUES (4, 'bob.hidden@corp.example', '2', 2)").unwrap();
    let mut holder = connect(&server);
    holder.query_drop("BEGIN").unwrap();
    holder.query_drop("SELECT id FROM app.people WHERE id = 4 FOR UPDATE").unwrap();
    let mut waiter = connect(&server);
    let waiting = std::thread::spawn(move || {
        waiter.query_drop("UPDATE app.people SET n = n + 1 WHERE email = 'bob.hidden@corp.example'").unwrap();
    });
    std::thread::sleep(Duration::from_millis(400));
    holder.query_drop("COMMIT").unwrap();
    waiting.join().unwrap();
    drop((conn, holder, card_client));

    // A statement running with literals in it: live activity shows it
    // redacted, and, past --long-statement, it is an event, redacted.
    let mut slow = connect(&server);
    let running = std::thread::spawn(move || {
        let _: Vec<u64> = slow
            .query("SELECT SLEEP(2.5) FROM app.people WHERE email = 'ann.secret@example.com' AND card = '4111111111111111'")
            .unwrap();
    });
    let url = collector.http_url();
    let started = std::time::Instant::now();
    loop {
        let live = sqlbee_query(&["activity", "--format", "json", "--collector", &url]);
        assert_no_secret("sqlbee activity", &live.stdout);
        let live: serde_json::Value = serde_json::from_slice(&live.stdout).unwrap();
        let samples: Vec<&str> =
            live["activity"].as_array().into_iter().flatten().filter_map(|c| c["sample"].as_str()).collect();
        if samples.contains(&"SELECT SLEEP(?) FROM app.people WHERE email = ? AND card = ?") {
            break;
        }
        assert!(started.elapsed() < Duration::from_secs(10), "the running statement is not shown: {live}");
        std::thread::sleep(Duration::from_millis(200));
    }
    running.join().unwrap();

    // The SELECT's plan (whose condition holds the email and the card
    // number) is explained, then shipped, acknowledged and stored.
    let select_digest = sqlbee_agent::normalize::digest_text(
        b"SELECT id FROM app.people WHERE email = 'ann.secret@example.com' AND card = '4111111111111111'",
    );
    let select_id = format!("{:016x}", common::collector::id_of(&select_digest));
    let started = std::time::Instant::now();
    while !agent.lines_so_far().iter().any(|l| l["type"] == "plan" && l["digest"] == select_id.as_str()) {
        assert!(started.elapsed() < Duration::from_secs(30), "the SELECT got no plan: {}", agent.progress());
        std::thread::sleep(Duration::from_millis(200));
    }
    // The same values sent apart, by a prepared statement: its plan is
    // explained with them bound in (in the agent's memory), and they
    // appear nowhere either.
    let mut app = connect(&server);
    let prepared = app.prep("SELECT id, n FROM app.people WHERE email = ? AND card = ?").unwrap();
    let prepared_digest =
        sqlbee_agent::normalize::digest_text(b"SELECT id, n FROM app.people WHERE email = ? AND card = ?");
    let prepared_id = format!("{:016x}", common::collector::id_of(&prepared_digest));
    let started = std::time::Instant::now();
    loop {
        for _ in 0..10 {
            let _: Vec<(u64, u64)> = app.exec(&prepared, ("ann.secret@example.com", "4111111111111111")).unwrap();
        }
        let lines = agent.lines_so_far();
        if lines
            .iter()
            .any(|l| l["type"] == "plan" && l["digest"] == prepared_id.as_str() && l["plan_hash"].is_string())
        {
            break;
        }
        assert!(started.elapsed() < Duration::from_secs(30), "the prepared SELECT got no plan: {}", agent.progress());
        std::thread::sleep(Duration::from_millis(100));
    }
    drop(app);
    std::thread::sleep(Duration::from_millis(1500));
    let out = agent.stop();
    assert!(out.success, "{}", out.stderr);

    // The agent's own output and log.
    let jsonl: String = out.lines.iter().map(|l| l.to_string() + "\n").collect();
    assert_no_secret("the agent's JSON lines", jsonl.as_bytes());
    assert_no_secret("the agent's log", out.stderr.as_bytes());
    // Samples are there, redacted, in the statement's own shape.
    let select = out
        .of_type("digest")
        .find(|d| d["sample"].as_str().is_some_and(|s| s.starts_with("SELECT id FROM app.people WHERE email")))
        .unwrap_or_else(|| panic!("no SELECT sample: {jsonl}"));
    assert_eq!(select["sample"], "SELECT id FROM app.people WHERE email = ? AND card = ?");
    let counts = out.digest_counts(None);
    assert_eq!(counts.get(&select_digest), Some(&SELECTS), "{counts:#?}");
    let inserts: u64 = counts.iter().filter(|(t, _)| t.starts_with("INSERT INTO `app`.`people`")).map(|(_, n)| n).sum();
    assert_eq!(inserts, 4, "{counts:#?}");
    let tagged = out.of_type("digest").find(|d| d["tags"]["route"].is_array()).expect("the tagged statement's row");
    assert_eq!(tagged["tags"]["controller"][0]["value"], "?", "{tagged}");
    assert_eq!(tagged["tags"]["route"][0]["value"], "/cards/?", "{tagged}");
    // The clients' program names were read, and only redacted.
    let programs: std::collections::BTreeSet<&str> = out
        .of_type("digest")
        .flat_map(|d| d["clients"].as_array().into_iter().flatten())
        .filter_map(|c| c["program"].as_str())
        .collect();
    assert!(programs.contains("?") && programs.contains("card-?"), "{programs:?}");
    let messages: Vec<&str> = out
        .of_type("digest")
        .filter_map(|d| d["error_messages"].as_object())
        .flat_map(|m| m.values().filter_map(|v| v.as_str()))
        .collect();
    assert!(messages.iter().any(|m| m.starts_with("Duplicate entry '?'")), "{messages:?}");
    let waits: Vec<_> = out.of_type("lock_wait").collect();
    assert!(
        waits.iter().any(|w| w["sample"] == "UPDATE app.people SET n = n + ? WHERE email = ?"),
        "no redacted lock-wait sample: {waits:#?}"
    );
    for sql in passwords {
        let statement = sql.split_whitespace().take_while(|w| !w.contains(['\'', '('])).collect::<Vec<_>>().join(" ");
        assert!(
            out.of_type("digest").any(|d| d["sample"].as_str().is_some_and(|s| s.starts_with(&statement))),
            "{statement} was not counted with a sample"
        );
    }

    // The state directory: spool, rejected, corrupt, identity.
    let mut state_files = Vec::new();
    files_under(&state, &mut state_files);
    assert!(!state_files.is_empty());
    let mode = std::fs::metadata(&state).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o700, "state directory mode {mode:o}");
    for (path, bytes, mode) in &state_files {
        assert_no_secret(&path.display().to_string(), bytes);
        assert_eq!(*mode, 0o600, "{} has mode {mode:o}", path.display());
    }

    // Every query answer.
    for args in [
        vec!["long", "--format", "json", "--since", "all"],
        vec!["activity", "--format", "json"],
        vec!["top", "--format", "json", "--since", "all", "--limit", "10000"],
        vec!["locks", "--format", "json", "--since", "all"],
        vec!["instances", "--format", "json"],
        vec!["top", "--since", "all", "--limit", "10000"],
        vec!["plans", &select_id, "--format", "json", "--since", "all"],
        vec!["plans", &select_id, "--since", "all"],
        vec!["plans", &prepared_id, "--format", "json", "--since", "all"],
        vec!["plans", "--format", "json", "--since", "all"],
    ] {
        let mut full = args.clone();
        full.extend(["--collector", url.as_str()]);
        let answer = sqlbee_query(&full);
        assert!(answer.status.success(), "{args:?}: {}", String::from_utf8_lossy(&answer.stderr));
        assert_no_secret(&format!("sqlbee {args:?}"), &answer.stdout);
    }
    let long = sqlbee_query(&["long", "--format", "json", "--since", "all", "--collector", &url]);
    let long: serde_json::Value = serde_json::from_slice(&long.stdout).unwrap();
    assert!(
        long["statements"]
            .as_array()
            .unwrap()
            .iter()
            .any(|e| e["outcome"] == "long"
                && e["sample"] == "SELECT SLEEP(?) FROM app.people WHERE email = ? AND card = ?"),
        "the long statement is an event, redacted: {long}"
    );
    let stored = sqlbee_query(&["top", "--format", "json", "--since", "all", "--limit", "10000", "--collector", &url]);
    let stored: serde_json::Value = serde_json::from_slice(&stored.stdout).unwrap();
    let select_row = stored["digests"]
        .as_array()
        .unwrap()
        .iter()
        .find(|d| d["digest_text"] == select_digest.as_str())
        .expect("the SELECT digest in the store");
    assert_eq!(select_row["count"], SELECTS);
    let plans = sqlbee_query(&["plans", &select_id, "--format", "json", "--since", "all", "--collector", &url]);
    let plans: serde_json::Value = serde_json::from_slice(&plans.stdout).unwrap();
    let stored_plan = plans["plans"].as_array().and_then(|p| p.first()).cloned().unwrap_or_default();
    assert!(stored_plan["plan_hash"].is_string(), "the SELECT's plan is stored: {plans}");
    assert!(stored_plan["access"][0]["table"] == "people", "{plans}");

    // The store's files, WAL included, while the collector runs and after.
    let mut store_files = Vec::new();
    files_under(collector.dir.path(), &mut store_files);
    let stores: Vec<_> = store_files.iter().filter(|(p, _, _)| p.to_string_lossy().contains("store.db")).collect();
    assert!(stores.iter().any(|(p, _, _)| p.to_string_lossy().ends_with("-wal")), "no WAL file: {store_files:?}");
    for (path, bytes, mode) in &stores {
        assert_no_secret(&path.display().to_string(), bytes);
        assert_eq!(*mode & 0o077, 0, "{} has mode {mode:o}", path.display());
    }
    assert_no_secret("the collector's log", collector.stderr_text().as_bytes());
}
