//! Lock-wait records: each wait longer than the threshold, with the
//! statement that waited and the likely blockers.
//!
//! The agent cannot see who owns a lock, so it reports *candidates*: the
//! transactions of other connections on the same instance that were open
//! when the wait began (including ones that ended during the wait, which
//! is when a holder releases its locks), and statements of other
//! connections that ran for the whole wait. Records are built at window
//! end, once the statements that outlived the wait have arrived; a
//! candidate whose connection moves on before then (its next statement or
//! transaction, or forgotten to bound memory) is kept with the wait as it
//! was. Memory is bounded: at most `MAX_CONNECTIONS` connections, 8
//! statements per transaction, 1000 pending waits per instance, 32
//! blockers per wait (the longest open).
use std::{
    collections::{HashMap, VecDeque},
    sync::Arc,
    time::{Duration, SystemTime},
};

use sqlbee_kernel_abi::{LongWait, wait_class};

use crate::{
    normalize::{Digest, Samples},
    probe::Statement,
};

const MAX_CONNECTIONS: usize = 10_000;
const MAX_TXN_STATEMENTS: usize = 8;
const MAX_PENDING: usize = 1000;
const MAX_BLOCKERS: usize = 32;

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Blocker {
    pub connection_id: u64,
    /// An open transaction (true) or one statement running for the whole wait.
    pub transaction: bool,
    /// CLOCK_MONOTONIC ns.
    pub started_ns: u64,
    pub started: SystemTime,
    pub statements: Vec<Arc<str>>,
}

#[derive(Clone, Debug)]
pub struct LockWaitRecord {
    /// CLOCK_MONOTONIC ns.
    pub start_ns: u64,
    pub start: SystemTime,
    pub duration_ns: u64,
    pub class: &'static str,
    pub connection_id: u64,
    /// The waiting statement (None if its record never arrived).
    pub digest: Option<Digest>,
    pub sample: String,
    pub blockers: Vec<Blocker>,
}

#[derive(Clone, Debug)]
struct Txn {
    begin_ns: u64,
    statements: VecDeque<Arc<str>>,
}

#[derive(Default)]
struct Connection {
    open: Option<Txn>,
    /// The last finished transaction and when it ended.
    closed: Option<(Txn, u64)>,
    /// The last statement: start, end, text.
    last: Option<(u64, u64, Arc<str>)>,
    last_seen_ns: u64,
}

/// What makes a connection a candidate blocker of one wait.
enum Candidate<'a> {
    Transaction(&'a Txn),
    /// Start and text of a statement that ran for the whole wait.
    Statement(u64, &'a Arc<str>),
}

impl Candidate<'_> {
    fn started_ns(&self) -> u64 {
        match self {
            Candidate::Transaction(txn) => txn.begin_ns,
            Candidate::Statement(start, _) => *start,
        }
    }

    fn blocker(&self, connection_id: u64) -> Blocker {
        let (transaction, statements) = match self {
            Candidate::Transaction(txn) => (true, txn.statements.iter().cloned().collect()),
            Candidate::Statement(_, text) => (false, vec![Arc::clone(text)]),
        };
        let started_ns = self.started_ns();
        Blocker { connection_id, transaction, started_ns, started: wall_time(started_ns), statements }
    }
}

impl Connection {
    /// Why this connection may be blocking `wait`, from what has arrived so far.
    fn candidate(&self, wait: &LongWait) -> Option<Candidate<'_>> {
        let (start, end) = (wait.wait_start_ns, wait.wait_start_ns + wait.duration_ns);
        let open = self.open.as_ref().filter(|t| t.begin_ns <= start);
        let closed = self.closed.as_ref().filter(|(t, ended)| t.begin_ns <= start && *ended >= start).map(|(t, _)| t);
        if let Some(txn) = open.or(closed) {
            return Some(Candidate::Transaction(txn));
        }
        let (s_start, s_end, text) = self.last.as_ref()?;
        (*s_start <= start && *s_end >= end).then_some(Candidate::Statement(*s_start, text))
    }

    /// Takes in the connection's next statement; returns the state it
    /// replaced (as a connection of its own) so candidates in it can be kept.
    fn apply(&mut self, s: &Statement, text: &Arc<str>) -> Connection {
        let end_ns = s.start_ns + s.duration_ns;
        let mut replaced = Connection::default();
        self.last_seen_ns = end_ns;
        replaced.last = self.last.replace((s.start_ns, end_ns, Arc::clone(text)));
        if opens(text) {
            // BEGIN inside a transaction commits it first, releasing its locks.
            if let Some(txn) = self.open.take() {
                replaced.closed = self.closed.replace((txn, s.start_ns));
            }
            self.open = Some(Txn { begin_ns: s.start_ns, statements: VecDeque::new() });
        } else if closes(text) {
            if let Some(txn) = self.open.take() {
                replaced.closed = self.closed.replace((txn, end_ns));
            }
        } else if let Some(txn) = self.open.as_mut() {
            if txn.statements.len() == MAX_TXN_STATEMENTS {
                txn.statements.pop_front();
            }
            txn.statements.push_back(Arc::clone(text));
        }
        replaced
    }
}

struct Pending {
    wait: LongWait,
    statement: Option<(Digest, String)>,
    /// Candidates whose connection has moved on since, as they were.
    kept: Vec<Blocker>,
}

impl Pending {
    fn keeps(&self, connection_id: u64) -> bool {
        self.kept.iter().any(|b| b.connection_id == connection_id)
    }

    /// Keeps the candidates of `connection_id` that `now` no longer shows.
    fn keep_lost(&mut self, connection_id: u64, was: &Connection, now: Option<&Connection>) {
        // Cheapest test first: this runs for every statement while waits are pending.
        if connection_id == self.wait.connection_id {
            return;
        }
        let Some(candidate) = was.candidate(&self.wait) else { return };
        if now.is_some_and(|c| c.candidate(&self.wait).is_some()) || self.keeps(connection_id) {
            return;
        }
        self.kept.push(candidate.blocker(connection_id));
        if self.kept.len() > MAX_BLOCKERS {
            self.kept.sort_by_key(|b| (b.started_ns, b.connection_id));
            self.kept.truncate(MAX_BLOCKERS);
        }
    }
}

#[derive(Default)]
pub struct LockTracker {
    connections: HashMap<u64, Connection>,
    pending: Vec<Pending>,
}

/// The wall-clock time of a CLOCK_MONOTONIC instant (kernel timestamps).
pub fn wall_time(monotonic_ns: u64) -> SystemTime {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: clock_gettime writes into the timespec we own.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    let now_ns = ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64;
    SystemTime::now() - Duration::from_nanos(now_ns.saturating_sub(monotonic_ns))
}

fn opens(text: &str) -> bool {
    text == "BEGIN" || text.starts_with("START TRANSACTION") || text.starts_with("BEGIN WORK")
}

fn closes(text: &str) -> bool {
    // ROLLBACK [WORK] TO [SAVEPOINT] undoes part of a transaction, which stays open.
    text.starts_with("COMMIT") || (text.starts_with("ROLLBACK") && !text.contains(" TO "))
}

impl LockTracker {
    pub fn wait(&mut self, wait: LongWait) {
        if self.pending.len() < MAX_PENDING {
            self.pending.push(Pending { wait, statement: None, kept: Vec::new() });
        }
    }

    pub fn statement(&mut self, s: &Statement, digest: &Digest, samples: Samples) {
        for p in self.pending.iter_mut().filter(|p| p.statement.is_none()) {
            if p.wait.tid == s.tid && p.wait.statement_start_ns == s.start_ns {
                p.statement = Some((digest.clone(), samples.statement(&s.text, super::MAX_SAMPLE)));
            }
        }
        if self.connections.len() >= MAX_CONNECTIONS && !self.connections.contains_key(&s.connection_id) {
            // Forget the connection idle for longest.
            if let Some(oldest) = self.connections.iter().min_by_key(|(_, c)| c.last_seen_ns).map(|(id, _)| *id)
                && let Some(gone) = self.connections.remove(&oldest)
            {
                for p in &mut self.pending {
                    p.keep_lost(oldest, &gone, None);
                }
            }
        }
        let conn = self.connections.entry(s.connection_id).or_default();
        let replaced = conn.apply(s, &digest.text);
        for p in &mut self.pending {
            p.keep_lost(s.connection_id, &replaced, Some(conn));
        }
    }

    /// Turns every pending wait into a record (called at window end).
    pub fn take_records(&mut self) -> Vec<LockWaitRecord> {
        let pending = std::mem::take(&mut self.pending);
        pending.into_iter().map(|p| self.record(p)).collect()
    }

    fn record(&self, p: Pending) -> LockWaitRecord {
        let w = p.wait;
        let mut found: Vec<(u64, Candidate)> = self
            .connections
            .iter()
            .filter(|(id, _)| **id != w.connection_id && !p.keeps(**id))
            .filter_map(|(id, conn)| Some((*id, conn.candidate(&w)?)))
            .collect();
        // Keep the longest open: they have held locks longest, and a choice
        // by age, unlike the map's order, is the same in every run.
        found.sort_unstable_by_key(|(id, c)| (c.started_ns(), *id));
        found.truncate(MAX_BLOCKERS);
        let mut blockers = p.kept;
        blockers.extend(found.iter().map(|(id, c)| c.blocker(*id)));
        blockers.sort_by_key(|b| (b.started_ns, b.connection_id));
        blockers.truncate(MAX_BLOCKERS);
        let (digest, sample) = match p.statement {
            Some((d, s)) => (Some(d), s),
            None => (None, String::new()),
        };
        LockWaitRecord {
            start_ns: w.wait_start_ns,
            start: wall_time(w.wait_start_ns),
            duration_ns: w.duration_ns,
            class: wait_class::NAMES.get(w.class as usize).copied().unwrap_or("other"),
            connection_id: w.connection_id,
            digest,
            sample,
            blockers,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::normalize::Normalizer;

    const MS: u64 = 1_000_000;

    /// Feeds a tracker the way the aggregator does; times are in ms.
    struct Feed {
        tracker: LockTracker,
        normalizer: Normalizer,
    }

    impl Feed {
        fn new() -> Self {
            Self { tracker: LockTracker::default(), normalizer: Normalizer::new(100) }
        }

        fn run(&mut self, connection: u64, start: u64, end: u64, sql: &str) {
            let digest = self.normalizer.normalize(sql.as_bytes());
            self.tracker.statement(&statement(connection, start, end, sql), &digest, Samples::Raw);
        }

        /// A wait of `connection`'s statement that started at `statement_start`.
        fn wait(&mut self, connection: u64, start: u64, end: u64, statement_start: u64) {
            self.tracker.wait(LongWait {
                tid: tid(connection),
                class: wait_class::ROW_LOCK as u32,
                thd: connection,
                connection_id: connection,
                wait_start_ns: start * MS,
                duration_ns: (end - start) * MS,
                statement_start_ns: statement_start * MS,
            });
        }

        fn only_record(&mut self) -> LockWaitRecord {
            let mut records = self.tracker.take_records();
            assert_eq!(records.len(), 1, "{records:?}");
            records.remove(0)
        }
    }

    fn tid(connection: u64) -> u32 {
        1000 + connection as u32
    }

    fn statement(connection: u64, start: u64, end: u64, sql: &str) -> Statement {
        crate::aggregate::fixtures::statement(connection, start * MS, (end - start) * MS, sql)
    }

    /// Each blocker as (connection, transaction, started ms, statements).
    fn blockers(record: &LockWaitRecord) -> Vec<(u64, bool, u64, Vec<&str>)> {
        record
            .blockers
            .iter()
            .map(|b| (b.connection_id, b.transaction, b.started_ns / MS, b.statements.iter().map(|s| &**s).collect()))
            .collect()
    }

    #[test]
    fn statements_running_for_the_whole_wait_are_candidates() {
        let mut feed = Feed::new();
        feed.wait(1, 100, 200, 90);
        feed.run(1, 90, 260, "UPDATE t SET a = 1 WHERE k = 7");
        feed.run(2, 50, 250, "ALTER TABLE t ADD COLUMN b INT");
        feed.run(3, 150, 300, "SELECT 3");
        feed.run(4, 50, 180, "SELECT 4");
        feed.run(5, 100, 200, "SELECT 5");
        let record = feed.only_record();
        assert_eq!(
            blockers(&record),
            [(2, false, 50, vec!["ALTER TABLE `t` ADD COLUMN `b` INT"]), (5, false, 100, vec!["SELECT ?"]),]
        );
        assert_eq!((record.start_ns, record.duration_ns, record.connection_id), (100 * MS, 100 * MS, 1));
        assert_eq!(record.class, "row_lock");
    }

    #[test]
    fn blockers_come_from_the_waits_instance_only() {
        use crate::{aggregate::Aggregator, probe::ProbeBatch};
        let batch = |instance: &str, long_waits: Vec<LongWait>, statements: Vec<Statement>| ProbeBatch {
            long_waits,
            applied: Vec::new(),
            ..crate::aggregate::fixtures::probe_batch(instance, Default::default(), statements)
        };
        let wait = LongWait {
            tid: tid(1),
            class: wait_class::METADATA_LOCK as u32,
            thd: 1,
            connection_id: 1,
            wait_start_ns: 100 * MS,
            duration_ns: 100 * MS,
            statement_start_ns: 90 * MS,
        };
        let mut aggregator = Aggregator::new(Normalizer::new(100), 100, SystemTime::now());
        // Connection ids restart on every server: both instances have a connection 2.
        aggregator.ingest(batch("a:3306", vec![wait], vec![statement(1, 90, 260, "ALTER TABLE t FORCE")]));
        let other = vec![statement(2, 50, 250, "SELECT SLEEP(1)"), statement(3, 50, 250, "SELECT SLEEP(2)")];
        aggregator.ingest(batch("b:3306", Vec::new(), other));
        aggregator.ingest(batch("a:3306", Vec::new(), vec![statement(2, 60, 250, "SELECT * FROM t")]));
        let reports = aggregator.flush(SystemTime::now());
        let a = reports.iter().find(|r| r.instance == "a:3306").expect("a report for a:3306");
        assert_eq!(a.lock_waits.len(), 1);
        assert_eq!(blockers(&a.lock_waits[0]), [(2, false, 60, vec!["SELECT * FROM `t`"])]);
        let b = reports.iter().find(|r| r.instance == "b:3306").expect("a report for b:3306");
        assert!(b.lock_waits.is_empty(), "{:?}", b.lock_waits);
    }

    #[test]
    fn transactions_group_the_statements_after_begin() {
        let mut feed = Feed::new();
        feed.run(1, 10, 11, "BEGIN");
        feed.run(2, 1, 2, "SELECT 1");
        feed.run(2, 10, 11, "BEGIN");
        feed.run(2, 20, 21, "UPDATE t SET a = 1 WHERE k = 7");
        feed.run(2, 30, 31, "SELECT a FROM t WHERE k = 7");
        // Over before the wait began.
        feed.run(3, 10, 11, "BEGIN");
        feed.run(3, 20, 21, "UPDATE t SET a = 2 WHERE k = 8");
        feed.run(3, 40, 41, "COMMIT");
        // Began during the wait.
        feed.run(4, 150, 151, "BEGIN");
        feed.run(4, 160, 161, "UPDATE t SET a = 3 WHERE k = 9");
        // Ended during the wait: the moment a holder releases its locks.
        feed.run(5, 20, 21, "START TRANSACTION");
        feed.run(5, 30, 31, "DELETE FROM t WHERE k = 7");
        feed.run(5, 190, 195, "COMMIT");
        // Ended after the wait.
        feed.run(6, 5, 6, "begin work");
        feed.run(6, 7, 8, "INSERT INTO u VALUES (1)");
        feed.wait(1, 100, 200, 90);
        feed.run(1, 90, 260, "UPDATE t SET a = 4 WHERE k = 7");
        feed.run(6, 300, 301, "ROLLBACK");
        assert_eq!(
            blockers(&feed.only_record()),
            [
                (6, true, 5, vec!["INSERT INTO `u` VALUES (?)"]),
                (2, true, 10, vec!["UPDATE `t` SET `a` = ? WHERE `k` = ?", "SELECT `a` FROM `t` WHERE `k` = ?"]),
                (5, true, 20, vec!["DELETE FROM `t` WHERE `k` = ?"]),
            ]
        );
    }

    #[test]
    fn savepoint_rollback_keeps_the_transaction_open() {
        for rollback in ["ROLLBACK TO SAVEPOINT sp", "rollback work to sp"] {
            let mut feed = Feed::new();
            feed.run(2, 10, 11, "BEGIN");
            feed.run(2, 12, 13, "SAVEPOINT sp");
            feed.run(2, 14, 15, "UPDATE t SET a = 1 WHERE k = 7");
            feed.run(2, 16, 17, rollback);
            feed.wait(1, 100, 200, 90);
            let record = feed.only_record();
            assert_eq!(record.blockers.len(), 1, "{rollback}: {record:?}");
            assert!(record.blockers[0].transaction, "{rollback}: {record:?}");
        }
    }

    #[test]
    fn begin_inside_a_transaction_ends_it() {
        let mut feed = Feed::new();
        feed.run(2, 10, 11, "BEGIN");
        feed.run(2, 20, 21, "UPDATE t SET a = 1 WHERE k = 7");
        // Commits the first transaction, releasing its locks, and opens another.
        feed.run(2, 150, 151, "BEGIN");
        feed.run(2, 160, 161, "DELETE FROM t WHERE k = 8");
        feed.wait(1, 100, 200, 90);
        feed.wait(3, 170, 180, 170);
        let records = feed.tracker.take_records();
        assert_eq!(records.len(), 2);
        assert_eq!(blockers(&records[0]), [(2, true, 10, vec!["UPDATE `t` SET `a` = ? WHERE `k` = ?"])]);
        assert_eq!(blockers(&records[1]), [(2, true, 150, vec!["DELETE FROM `t` WHERE `k` = ?"])]);
    }

    #[test]
    fn candidates_outlive_their_connection_moving_on_before_window_end() {
        let mut feed = Feed::new();
        feed.run(2, 10, 11, "BEGIN");
        feed.run(2, 20, 21, "UPDATE t SET a = 1 WHERE k = 7");
        feed.run(4, 10, 11, "BEGIN");
        feed.run(4, 20, 21, "UPDATE t SET a = 2 WHERE k = 8");
        feed.wait(1, 100, 200, 90);
        feed.run(1, 90, 260, "UPDATE t SET a = 3 WHERE k = 7");
        // The holder commits, then runs and commits another transaction.
        feed.run(2, 195, 199, "COMMIT");
        feed.run(2, 300, 301, "BEGIN");
        feed.run(2, 310, 311, "UPDATE t SET a = 5 WHERE k = 9");
        feed.run(2, 320, 321, "COMMIT");
        // A statement that outlived the wait, then the next one.
        feed.run(3, 50, 250, "ALTER TABLE t ADD COLUMN b INT");
        feed.run(3, 300, 301, "SELECT 1");
        // Looked open when the wait arrived, but had committed before it began.
        feed.run(4, 60, 70, "COMMIT");
        feed.run(4, 300, 301, "BEGIN");
        feed.run(4, 320, 321, "COMMIT");
        // Still a candidate as a transaction after its long statement is
        // replaced: named once, as the transaction.
        feed.run(5, 30, 31, "BEGIN");
        feed.run(5, 40, 250, "UPDATE t SET a = 6 WHERE k = 7");
        feed.run(5, 300, 301, "SELECT 1");
        assert_eq!(
            blockers(&feed.only_record()),
            [
                (2, true, 10, vec!["UPDATE `t` SET `a` = ? WHERE `k` = ?"]),
                (5, true, 30, vec!["UPDATE `t` SET `a` = ? WHERE `k` = ?", "SELECT ?"]),
                (3, false, 50, vec!["ALTER TABLE `t` ADD COLUMN `b` INT"]),
            ]
        );
    }

    #[test]
    fn record_carries_its_waiting_statement_once_it_arrives() {
        let mut feed = Feed::new();
        feed.wait(1, 100, 200, 90);
        feed.wait(5, 120, 180, 110);
        // The connection's previous statement, and another thread's statement
        // that started at the same instant.
        feed.run(1, 80, 85, "SELECT 1");
        feed.run(9, 90, 95, "SELECT 2");
        let long = format!("UPDATE t SET a = '{}' WHERE k = 7", "x".repeat(2 * super::super::MAX_SAMPLE));
        feed.run(1, 90, 260, &long);
        let records = feed.tracker.take_records();
        assert_eq!(records.len(), 2);
        let digest = records[0].digest.as_ref().expect("the waiting statement's digest");
        assert_eq!(&*digest.text, "UPDATE `t` SET `a` = ? WHERE `k` = ?");
        assert_eq!(records[0].sample, long[..super::super::MAX_SAMPLE]);
        // Its statement never arrived: the record says so.
        assert_eq!((records[1].connection_id, records[1].digest.as_ref(), records[1].sample.as_str()), (5, None, ""));
    }

    #[test]
    fn connections_are_bounded_by_forgetting_the_longest_idle() {
        let mut tracker = LockTracker::default();
        let run = |tracker: &mut LockTracker, connection: u64, start: u64, sql: &str| {
            tracker.statement(&statement(connection, start, start + 1, sql), &Digest::from_text(sql), Samples::Raw);
        };
        run(&mut tracker, 1, 1, "BEGIN");
        run(&mut tracker, 1, 3, "UPDATE t SET a = ?");
        tracker.wait(LongWait {
            tid: tid(0),
            class: wait_class::ROW_LOCK as u32,
            thd: 0,
            connection_id: 0,
            wait_start_ns: 10 * MS,
            duration_ns: 10 * MS,
            statement_start_ns: 10 * MS,
        });
        for connection in 2..=MAX_CONNECTIONS as u64 {
            run(&mut tracker, connection, 100 + connection, "SELECT ?");
        }
        assert_eq!(tracker.connections.len(), MAX_CONNECTIONS);
        // Seen again: no longer the longest idle.
        run(&mut tracker, 2, 50_000, "SELECT ?");
        run(&mut tracker, 50_000, 50_001, "SELECT ?");
        assert_eq!(tracker.connections.len(), MAX_CONNECTIONS);
        assert!(!tracker.connections.contains_key(&1));
        run(&mut tracker, 50_001, 50_002, "SELECT ?");
        assert_eq!(tracker.connections.len(), MAX_CONNECTIONS);
        assert!(tracker.connections.contains_key(&2) && !tracker.connections.contains_key(&3));
        assert!(tracker.connections.contains_key(&50_000) && tracker.connections.contains_key(&50_001));
        // The wait still names the forgotten holder.
        let records = tracker.take_records();
        assert_eq!(blockers(&records[0]), [(1, true, 1, vec!["UPDATE t SET a = ?"])]);
    }

    #[test]
    fn transaction_keeps_its_last_statements() {
        let mut feed = Feed::new();
        feed.run(2, 10, 11, "BEGIN");
        let texts: Vec<String> = (0..MAX_TXN_STATEMENTS + 4).map(|i| format!("UPDATE t{i} SET a = 1")).collect();
        for (i, text) in texts.iter().enumerate() {
            feed.run(2, 20 + i as u64, 21 + i as u64, text);
        }
        feed.wait(1, 100, 200, 90);
        let record = feed.only_record();
        let want: Vec<String> = (4..MAX_TXN_STATEMENTS + 4).map(|i| format!("UPDATE `t{i}` SET `a` = ?")).collect();
        assert_eq!(blockers(&record)[0].3, want);
    }

    #[test]
    fn pending_waits_are_bounded() {
        let mut feed = Feed::new();
        for i in 0..MAX_PENDING as u64 + 5 {
            feed.wait(1, 100 + i, 101 + i, 100 + i);
        }
        let records = feed.tracker.take_records();
        assert_eq!(records.len(), MAX_PENDING);
        assert_eq!(records.last().map(|r| r.start_ns), Some((100 + MAX_PENDING as u64 - 1) * MS));
        // Taken once; the next window starts empty and takes waits again.
        assert!(feed.tracker.take_records().is_empty());
        feed.wait(1, 5000, 5100, 5000);
        assert_eq!(feed.tracker.take_records().len(), 1);
    }

    #[test]
    fn blockers_are_bounded_keeping_the_oldest() {
        let many = MAX_BLOCKERS as u64 + 8;
        for moves_on in [false, true] {
            let mut feed = Feed::new();
            // Connection c began at 100 - c: the highest ids are the oldest.
            for c in 2..2 + many {
                feed.run(c, 100 - c, 100 - c, "BEGIN");
            }
            feed.wait(1, 100, 200, 90);
            if moves_on {
                for c in 2..2 + many {
                    feed.run(c, 300, 301, "COMMIT");
                    feed.run(c, 310, 311, "BEGIN");
                    feed.run(c, 320, 321, "COMMIT");
                }
            }
            let record = feed.only_record();
            let ids: Vec<u64> = record.blockers.iter().map(|b| b.connection_id).collect();
            let oldest: Vec<u64> = (2 + many - MAX_BLOCKERS as u64..2 + many).rev().collect();
            assert_eq!(ids, oldest, "moves on: {moves_on}");
        }
    }
}
