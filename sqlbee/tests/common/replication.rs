//! A private primary and replica pair, for the tests of what a replica
//! applies.
use std::time::{Duration, Instant};

use super::PrivateServer;

/// The sequence number of domain 0 in a GTID position (`0-1-42`).
pub fn seq_no(position: &str) -> u64 {
    position.trim().split(',').find_map(|gtid| gtid.strip_prefix("0-1-")).and_then(|n| n.parse().ok()).unwrap_or(0)
}

/// The sequence number of GTID domain `domain` in a position
/// (`1-11-42,2-12-7`).
pub fn seq_no_in(position: &str, domain: u32) -> u64 {
    position
        .trim()
        .split(',')
        .find_map(|gtid| {
            let mut parts = gtid.trim().splitn(3, '-');
            (parts.next()?.parse::<u32>().ok()? == domain).then_some(())?;
            parts.next()?;
            parts.next()?.parse().ok()
        })
        .unwrap_or(0)
}

/// Each source of [`multi_source`]: its channel (connection name), GTID
/// domain and schema.
pub const SOURCES: [(&str, u32); 2] = [("eu", 1), ("us", 2)];

/// Two primaries writing row-based binary logs, each in a GTID domain of
/// its own (1 and 2), and a replica of both through the channels `eu` and
/// `us` with `workers` parallel workers; each primary has its own schema
/// (`eu.t`, `us.t`). Caught up.
pub fn multi_source(workers: u32) -> (Vec<PrivateServer>, PrivateServer) {
    let primaries: Vec<PrivateServer> = SOURCES
        .iter()
        .map(|(channel, domain)| {
            PrivateServer::start(
                &format!("primary-{channel}"),
                &[
                    "--log-bin=primary-bin",
                    "--binlog-format=ROW",
                    &format!("--server-id={}", 10 + domain),
                    &format!("--gtid-domain-id={domain}"),
                ],
            )
            .unwrap()
        })
        .collect();
    let replica = PrivateServer::start(
        "replica-multi",
        &["--server-id=2", "--relay-log=replica-relay", &format!("--slave-parallel-threads={workers}")],
    )
    .unwrap();
    for (primary, (channel, _)) in primaries.iter().zip(SOURCES) {
        // Kept out of the binary logs: the replica would create the user
        // twice, once per channel, and stop.
        primary
            .sql(
                "SET SESSION sql_log_bin = 0; CREATE USER repl@'127.0.0.1' IDENTIFIED BY 'repl';
                 GRANT REPLICATION SLAVE ON *.* TO repl@'127.0.0.1';",
            )
            .unwrap();
        replica
            .sql(&format!(
                "CHANGE MASTER '{channel}' TO MASTER_HOST='127.0.0.1', MASTER_PORT={}, MASTER_USER='repl',
                 MASTER_PASSWORD='repl', MASTER_USE_GTID=slave_pos",
                primary.port
            ))
            .unwrap();
    }
    replica.sql("START ALL SLAVES").unwrap();
    for (primary, (channel, _)) in primaries.iter().zip(SOURCES) {
        primary
            .sql(&format!(
                "CREATE DATABASE {channel}; CREATE TABLE {channel}.t (id INT PRIMARY KEY, v INT) ENGINE=InnoDB"
            ))
            .unwrap();
    }
    for (primary, (_, domain)) in primaries.iter().zip(SOURCES) {
        caught_up_in(primary, &replica, domain);
    }
    (primaries, replica)
}

/// Waits until the replica applied every transaction `primary` wrote in
/// GTID domain `domain`; the replica's sequence number there then.
pub fn caught_up_in(primary: &PrivateServer, replica: &PrivateServer, domain: u32) -> u64 {
    let started = Instant::now();
    let wanted = seq_no_in(&primary.sql("SELECT @@gtid_binlog_pos").unwrap(), domain);
    loop {
        let applied = seq_no_in(&replica.sql("SELECT @@gtid_slave_pos").unwrap_or_default(), domain);
        if applied == wanted {
            return applied;
        }
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "domain {domain}: the replica is at {applied} of {wanted}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
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
