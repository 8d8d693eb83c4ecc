//! The agent's grouping must agree with the server's own digests
//! (`performance_schema`): two statements share a digest in sqlbee exactly
//! when they share one in MariaDB. Needs a real mariadbd, not eBPF.
mod common;

use std::collections::HashMap;

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
    let opts = mysql::OptsBuilder::new().socket(Some(server.socket.to_str().unwrap())).user(Some("root")).db_name(Some("app"));
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
    let ours: Vec<u64> =
        CORPUS.iter().map(|s| sqlbee::normalize::Digest::from_text(&sqlbee::normalize::digest_text(s.as_bytes())).id).collect();

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
                    sqlbee::normalize::digest_text(CORPUS[i].as_bytes()),
                    CORPUS[j],
                    sqlbee::normalize::digest_text(CORPUS[j].as_bytes()),
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
