//! Who blocks whom, as the server names it, over `--server-login`:
//! - row locks: `information_schema.INNODB_LOCK_WAITS` joined to
//!   `INNODB_TRX` gives each waiting transaction's connection and the one
//!   holding the lock it waits for (the PROCESS privilege);
//! - metadata locks: `information_schema.METADATA_LOCK_INFO` (where the
//!   `metadata_lock_info` plugin is loaded) lists each connection's
//!   granted locks. A connection waiting for a table's metadata lock is
//!   blocked by a holder of that table's lock; a holder that is itself
//!   waiting (an `ALTER` queued to upgrade its lock) is ahead of the
//!   others and is the one named.
//!
//! - deadlocks: when the server's `Innodb_deadlocks` count grows, its own
//!   report of the latest one (`SHOW ENGINE INNODB STATUS`, the PROCESS
//!   privilege) names both transactions' connections and statements and
//!   the one rolled back. Only those are taken from it (never the lock
//!   dumps, which print row values); the statements are redacted by the
//!   caller like every sample.
//!
//! Apart from that report, only ids are selected. A source the server
//! lacks (no plugin, no grant) is left out and tried again a minute later;
//! a failing login is a warning, never a stop.
use std::{
    collections::HashMap,
    time::{Duration, Instant},
};

use mysql::prelude::Queryable;

use crate::server_login::{ServerLogin, describe};

const TIMEOUT: Duration = Duration::from_secs(2);
const RETRY_SOURCE: Duration = Duration::from_secs(60);
const RETRY_LOGIN: Duration = Duration::from_secs(10);

pub const INNODB: &str = "innodb_lock_waits";
pub const METADATA: &str = "metadata_lock_info";

/// One waiting connection and the one the server says it waits for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Edge {
    pub waiter: u64,
    pub blocker: u64,
    pub source: &'static str,
}

/// A granted metadata lock on a table.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TableLock {
    pub thread_id: u64,
    pub schema: String,
    pub table: String,
}

/// One deadlock as the server reported it: each transaction's
/// connection and statement (raw; the caller redacts), and which one the
/// server rolled back.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeadlockReport {
    /// The report's own time line: a new one is a new deadlock.
    pub stamp: String,
    pub transactions: Vec<(u64, Vec<u8>)>,
    /// Index into `transactions`.
    pub victim: usize,
}

/// What one round read.
#[derive(Default)]
pub struct Reading {
    /// A deadlock newer than the last one seen.
    pub deadlock: Option<DeadlockReport>,
    pub row_lock_edges: Vec<Edge>,
    /// None: the source is not there (no plugin, no grant).
    pub table_locks: Option<Vec<TableLock>>,
    pub sources: Vec<&'static str>,
    pub warning: Option<String>,
}

/// One server's login for blockers.
pub struct BlockerReader {
    pid: u32,
    login: ServerLogin,
    conn: Option<mysql::Conn>,
    login_retry: Option<Instant>,
    innodb_retry: Option<Instant>,
    metadata_retry: Option<Instant>,
    warning: Option<String>,
    /// `Innodb_deadlocks` at the last round (None: not read yet).
    deadlocks: Option<u64>,
    last_stamp: Option<String>,
}

impl BlockerReader {
    pub fn new(pid: u32, login: ServerLogin) -> BlockerReader {
        BlockerReader {
            pid,
            login,
            conn: None,
            login_retry: None,
            innodb_retry: None,
            metadata_retry: None,
            warning: None,
            deadlocks: None,
            last_stamp: None,
        }
    }

    pub fn read(&mut self, now: Instant) -> Reading {
        let mut reading = Reading::default();
        if self.conn.is_none() {
            if self.login_retry.is_some_and(|at| now < at) {
                reading.warning = self.warning.clone();
                return reading;
            }
            match self.login.connect(self.pid, TIMEOUT) {
                Ok((conn, _)) => {
                    self.conn = Some(conn);
                    self.warning = None;
                    self.login_retry = None;
                }
                Err(warning) => {
                    if self.warning.as_ref() != Some(&warning) {
                        tracing::warn!(pid = self.pid, %warning, "no blockers from this server for now");
                    }
                    self.warning = Some(warning);
                    self.login_retry = Some(now + RETRY_LOGIN);
                    reading.warning = self.warning.clone();
                    return reading;
                }
            }
        }
        let conn = self.conn.as_mut().expect("logged in above");
        let mut lost = None;
        if self.innodb_retry.is_none_or(|at| now >= at) {
            match row_lock_edges(conn) {
                Ok(edges) => {
                    reading.row_lock_edges = edges;
                    reading.sources.push(INNODB);
                    self.innodb_retry = None;
                }
                Err(e) => {
                    self.innodb_retry = Some(now + RETRY_SOURCE);
                    lost = lost.or(connection_lost(&e));
                    reading.warning = Some(format!("no row-lock blockers: {}", describe(&e)));
                }
            }
        }
        if self.metadata_retry.is_none_or(|at| now >= at) {
            match table_locks(conn) {
                Ok(locks) => {
                    reading.table_locks = Some(locks);
                    reading.sources.push(METADATA);
                    self.metadata_retry = None;
                }
                Err(e) => {
                    // Most servers lack the plugin: not a warning.
                    self.metadata_retry = Some(now + RETRY_SOURCE);
                    lost = lost.or(connection_lost(&e));
                }
            }
        }
        match newest_deadlock(conn, &mut self.deadlocks, &mut self.last_stamp) {
            Ok(found) => reading.deadlock = found,
            Err(e) => lost = lost.or(connection_lost(&e)),
        }
        if lost.is_some() {
            self.conn = None;
            self.innodb_retry = None;
            self.metadata_retry = None;
        }
        reading
    }
}

/// The server's latest deadlock report, when its count grew since the
/// last round (a deadlock before the agent started is not reported).
fn newest_deadlock(
    conn: &mut mysql::Conn,
    deadlocks: &mut Option<u64>,
    last_stamp: &mut Option<String>,
) -> Result<Option<DeadlockReport>, mysql::Error> {
    let count: Option<u64> = conn.query_first(
        "SELECT VARIABLE_VALUE FROM information_schema.GLOBAL_STATUS WHERE VARIABLE_NAME = 'INNODB_DEADLOCKS'",
    )?;
    let Some(count) = count else { return Ok(None) };
    let grew = deadlocks.is_some_and(|before| count > before);
    *deadlocks = Some(count);
    if !grew {
        return Ok(None);
    }
    let status: Option<(String, String, String)> = conn.query_first("SHOW ENGINE INNODB STATUS")?;
    let Some(report) = status.and_then(|(_, _, text)| latest_deadlock(&text)) else { return Ok(None) };
    if last_stamp.as_ref() == Some(&report.stamp) {
        return Ok(None);
    }
    *last_stamp = Some(report.stamp.clone());
    Ok(Some(report))
}

/// The LATEST DETECTED DEADLOCK section of `SHOW ENGINE INNODB STATUS`:
/// each `*** (N) TRANSACTION:` with its `thread id` line and the statement
/// after it (up to the next `***` line), and `*** WE ROLL BACK TRANSACTION (N)`.
pub fn latest_deadlock(status: &str) -> Option<DeadlockReport> {
    let section = status.split("LATEST DETECTED DEADLOCK").nth(1)?;
    let section = section.split("\nTRANSACTIONS\n").next()?;
    let mut lines = section.lines().skip_while(|l| l.trim().is_empty() || l.starts_with('-'));
    let stamp = lines.next()?.trim().to_string();
    let mut transactions: Vec<(u64, Vec<u8>)> = Vec::new();
    let mut victim = None;
    let mut reading: Option<(u64, Vec<u8>)> = None;
    for line in lines {
        if line.starts_with("***") {
            transactions.extend(reading.take());
            if let Some(n) = line.strip_prefix("*** WE ROLL BACK TRANSACTION (").and_then(|r| r.strip_suffix(')')) {
                victim = n.parse::<usize>().ok().and_then(|n| n.checked_sub(1));
            }
            continue;
        }
        if let Some((_, rest)) = line.split_once(" thread id ")
            && (line.starts_with("MySQL") || line.starts_with("MariaDB"))
        {
            let id = rest.split(',').next()?.trim().parse().ok()?;
            reading = Some((id, Vec::new()));
            continue;
        }
        if let Some((_, text)) = &mut reading {
            if !text.is_empty() {
                text.push(b'\n');
            }
            text.extend_from_slice(line.as_bytes());
        }
    }
    let victim = victim?;
    (transactions.len() >= 2 && victim < transactions.len()).then_some(DeadlockReport { stamp, transactions, victim })
}

fn connection_lost(error: &mysql::Error) -> Option<()> {
    (!matches!(error, mysql::Error::MySqlError(_))).then_some(())
}

fn row_lock_edges(conn: &mut mysql::Conn) -> Result<Vec<Edge>, mysql::Error> {
    let rows: Vec<(u64, u64)> = conn.query(
        "SELECT r.trx_mysql_thread_id, b.trx_mysql_thread_id \
         FROM information_schema.INNODB_LOCK_WAITS w \
         JOIN information_schema.INNODB_TRX r ON r.trx_id = w.requesting_trx_id \
         JOIN information_schema.INNODB_TRX b ON b.trx_id = w.blocking_trx_id",
    )?;
    Ok(rows.into_iter().map(|(waiter, blocker)| Edge { waiter, blocker, source: INNODB }).collect())
}

fn table_locks(conn: &mut mysql::Conn) -> Result<Vec<TableLock>, mysql::Error> {
    let rows: Vec<(u64, Option<String>, Option<String>)> = conn.query(
        "SELECT THREAD_ID, TABLE_SCHEMA, TABLE_NAME FROM information_schema.METADATA_LOCK_INFO \
         WHERE TABLE_NAME IS NOT NULL AND TABLE_NAME <> ''",
    )?;
    Ok(rows
        .into_iter()
        .map(|(thread_id, schema, table)| TableLock {
            thread_id,
            schema: schema.unwrap_or_default(),
            table: table.unwrap_or_default(),
        })
        .collect())
}

/// The metadata-lock blocker of each connection waiting for a table's
/// metadata lock. `waiting`: each such connection and the tables its
/// statement names (schema resolved); `waiting_ids`: every connection
/// waiting for a metadata lock.
pub fn metadata_edges(
    waiting: &[(u64, Vec<(String, String)>)],
    locks: &[TableLock],
    waiting_ids: &[u64],
    started: &HashMap<u64, u64>,
) -> Vec<Edge> {
    let mut edges = Vec::new();
    for (waiter, tables) in waiting {
        let holders = locks.iter().filter(|l| {
            l.thread_id != *waiter
                && tables.iter().any(|(s, t)| s.eq_ignore_ascii_case(&l.schema) && t.eq_ignore_ascii_case(&l.table))
        });
        // Queued ahead first, then the longest running.
        let blocker = holders
            .map(|l| l.thread_id)
            .min_by_key(|id| (!waiting_ids.contains(id), started.get(id).copied().unwrap_or(u64::MAX)));
        if let Some(blocker) = blocker {
            edges.push(Edge { waiter: *waiter, blocker, source: METADATA });
        }
    }
    edges
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lock(thread_id: u64, table: &str) -> TableLock {
        TableLock { thread_id, schema: "app".into(), table: table.into() }
    }

    #[test]
    fn a_deadlock_report_names_both_statements_and_the_victim() {
        let status = "\n------------------------\nLATEST DETECTED DEADLOCK\n------------------------\n\
            2026-11-28 10:13:08 0x7faa6805c6c0\n*** (1) TRANSACTION:\nTRANSACTION 45, ACTIVE 1 sec starting index read\n\
            mysql tables in use 1, locked 1\nLOCK WAIT 3 lock struct(s), heap size 1128, 2 row lock(s)\n\
            MariaDB thread id 25, OS thread handle 140369866376896, query id 4506 localhost root Updating\n\
            update t.d set v=2 where id=1\n*** WAITING FOR THIS LOCK TO BE GRANTED:\nRECORD LOCKS space id 6\n\
            Record lock, heap no 2 PHYSICAL RECORD: n_fields 4; compact format; info bits 0\n 0: len 4; hex 80000001; asc ;;\n\
            \n*** (2) TRANSACTION:\nTRANSACTION 44, ACTIVE 1 sec starting index read\n\
            MariaDB thread id 24, OS thread handle 140369531287232, query id 4505 localhost root Updating\n\
            update t.d set v=1\nwhere id=2\n*** WAITING FOR THIS LOCK TO BE GRANTED:\nRECORD LOCKS space id 6\n\
            *** WE ROLL BACK TRANSACTION (1)\n------------\nTRANSACTIONS\n------------\nTrx id counter 50\n";
        let report = latest_deadlock(status).unwrap();
        assert_eq!(report.stamp, "2026-11-28 10:13:08 0x7faa6805c6c0");
        assert_eq!(report.victim, 0);
        assert_eq!(report.transactions[0], (25, b"update t.d set v=2 where id=1".to_vec()));
        assert_eq!(report.transactions[1], (24, b"update t.d set v=1\nwhere id=2".to_vec()));
        assert!(latest_deadlock("no deadlock here").is_none());
    }

    #[test]
    fn a_holder_queued_to_upgrade_comes_first() {
        // 1 holds t in an open transaction; 2 (ALTER) holds t upgradable
        // and waits; 3 waits behind 2.
        let locks = [lock(1, "t"), lock(2, "t"), lock(9, "other")];
        let t = vec![("app".to_string(), "t".to_string())];
        let started = HashMap::from([(1, 10), (2, 20), (3, 30)]);
        let edges = metadata_edges(&[(2, t.clone()), (3, t)], &locks, &[2, 3], &started);
        let pairs: Vec<(u64, u64)> = edges.iter().map(|e| (e.waiter, e.blocker)).collect();
        assert_eq!(pairs, [(2, 1), (3, 2)]);
        let none = metadata_edges(&[(3, vec![("app".into(), "nothing".into())])], &locks, &[3], &started);
        assert!(none.is_empty(), "no holder of the table: no blocker named");
    }
}
