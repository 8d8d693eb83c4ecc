//! A private primary and replica pair, for the tests of what a replica
//! applies.
use std::time::{Duration, Instant};

use super::PrivateServer;

/// The sequence number of domain 0 in a GTID position (`0-1-42`).
pub fn seq_no(position: &str) -> u64 {
    position.trim().split(',').find_map(|gtid| gtid.strip_prefix("0-1-")).and_then(|n| n.parse().ok()).unwrap_or(0)
}

/// A primary with its binary log in `format` and a replica of it with
/// `workers` parallel workers (0: one applier thread), replicating
/// `rep.t`, caught up.
pub fn pair(format: &str, workers: u32) -> (PrivateServer, PrivateServer) {
    let primary = PrivateServer::start(
        "primary",
        &["--log-bin=primary-bin", &format!("--binlog-format={format}"), "--server-id=1"],
    )
    .unwrap();
    let replica = PrivateServer::start(
        "replica",
        &["--server-id=2", "--relay-log=replica-relay", &format!("--slave-parallel-threads={workers}")],
    )
    .unwrap();
    primary
        .sql("CREATE USER repl@'127.0.0.1' IDENTIFIED BY 'repl'; GRANT REPLICATION SLAVE ON *.* TO repl@'127.0.0.1';")
        .unwrap();
    replica
        .sql(&format!(
            "CHANGE MASTER TO MASTER_HOST='127.0.0.1', MASTER_PORT={}, MASTER_USER='repl', MASTER_PASSWORD='repl',
             MASTER_USE_GTID=slave_pos; START SLAVE;",
            primary.port
        ))
        .unwrap();
    primary.sql("CREATE DATABASE rep; CREATE TABLE rep.t (id INT PRIMARY KEY, v INT) ENGINE=InnoDB").unwrap();
    caught_up(&primary, &replica);
    (primary, replica)
}

/// Waits until the replica applied every transaction the primary wrote;
/// the replica's GTID sequence number then.
pub fn caught_up(primary: &PrivateServer, replica: &PrivateServer) -> u64 {
    let started = Instant::now();
    let wanted = seq_no(&primary.sql("SELECT @@gtid_binlog_pos").unwrap());
    loop {
        let applied = seq_no(&replica.sql("SELECT @@gtid_slave_pos").unwrap_or_default());
        if applied == wanted {
            return applied;
        }
        assert!(started.elapsed() < Duration::from_secs(60), "the replica is at {applied} of {wanted}");
        std::thread::sleep(Duration::from_millis(100));
    }
}
