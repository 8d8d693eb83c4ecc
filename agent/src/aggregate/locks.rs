//! Lock-wait records: each wait longer than the threshold, with the
//! statement that waited and the likely blockers.
//!
//! The agent cannot see who owns a lock, so it reports *candidates*: the
//! transactions of other connections on the same instance that were open
//! when the wait began (including ones that ended during the wait, which
//! is when a holder releases its locks), and statements of other
//! connections that ran for the whole wait. Memory is bounded: at most
//! `MAX_CONNECTIONS` connections, 8 statements per transaction, 1000
//! pending waits per instance.
use std::{
    collections::{HashMap, VecDeque},
    sync::Arc,
    time::{Duration, SystemTime},
};

use agent_common::{LongWait, wait_class};

use crate::{normalize::Digest, probe::Statement};

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

struct Pending {
    wait: LongWait,
    statement: Option<(Digest, String)>,
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
    text.starts_with("COMMIT") || text.starts_with("ROLLBACK")
}

impl LockTracker {
    pub fn wait(&mut self, wait: LongWait) {
        if self.pending.len() < MAX_PENDING {
            self.pending.push(Pending { wait, statement: None });
        }
    }

    pub fn statement(&mut self, s: &Statement, digest: &Digest) {
        for p in self.pending.iter_mut().filter(|p| p.statement.is_none()) {
            if p.wait.tid == s.tid && p.wait.statement_start_ns == s.start_ns {
                let end = s.text.len().min(super::MAX_SAMPLE);
                p.statement = Some((digest.clone(), String::from_utf8_lossy(&s.text[..end]).into_owned()));
            }
        }
        if self.connections.len() >= MAX_CONNECTIONS && !self.connections.contains_key(&s.connection_id) {
            // Forget the connection idle for longest.
            if let Some(oldest) = self.connections.iter().min_by_key(|(_, c)| c.last_seen_ns).map(|(id, _)| *id) {
                self.connections.remove(&oldest);
            }
        }
        let end_ns = s.start_ns + s.duration_ns;
        let conn = self.connections.entry(s.connection_id).or_default();
        conn.last_seen_ns = end_ns;
        conn.last = Some((s.start_ns, end_ns, digest.text.clone()));
        let text = &*digest.text;
        if opens(text) {
            conn.open = Some(Txn { begin_ns: s.start_ns, statements: VecDeque::new() });
        } else if closes(text) {
            if let Some(txn) = conn.open.take() {
                conn.closed = Some((txn, end_ns));
            }
        } else if let Some(txn) = conn.open.as_mut() {
            if txn.statements.len() == MAX_TXN_STATEMENTS {
                txn.statements.pop_front();
            }
            txn.statements.push_back(digest.text.clone());
        }
    }

    /// Turns every pending wait into a record (called at window end).
    pub fn take_records(&mut self) -> Vec<LockWaitRecord> {
        let pending = std::mem::take(&mut self.pending);
        pending.into_iter().map(|p| self.record(p)).collect()
    }

    fn record(&self, p: Pending) -> LockWaitRecord {
        let w = p.wait;
        let (start, end) = (w.wait_start_ns, w.wait_start_ns + w.duration_ns);
        let mut blockers = Vec::new();
        for (id, conn) in &self.connections {
            if *id == w.connection_id || blockers.len() >= MAX_BLOCKERS {
                continue;
            }
            let txn_then = conn
                .open
                .as_ref()
                .filter(|t| t.begin_ns <= start)
                .or(conn.closed.as_ref().filter(|(t, ended)| t.begin_ns <= start && *ended >= start).map(|(t, _)| t));
            if let Some(txn) = txn_then {
                blockers.push(Blocker {
                    connection_id: *id,
                    transaction: true,
                    started_ns: txn.begin_ns,
                    started: wall_time(txn.begin_ns),
                    statements: txn.statements.iter().cloned().collect(),
                });
            } else if let Some((s_start, s_end, text)) = &conn.last
                && *s_start <= start
                && *s_end >= end
            {
                blockers.push(Blocker {
                    connection_id: *id,
                    transaction: false,
                    started_ns: *s_start,
                    started: wall_time(*s_start),
                    statements: vec![text.clone()],
                });
            }
        }
        blockers.sort_by_key(|b| b.started_ns);
        let (digest, sample) = match p.statement {
            Some((d, s)) => (Some(d), s),
            None => (None, String::new()),
        };
        LockWaitRecord {
            start_ns: start,
            start: wall_time(start),
            duration_ns: w.duration_ns,
            class: wait_class::NAMES.get(w.class as usize).copied().unwrap_or("other"),
            connection_id: w.connection_id,
            digest,
            sample,
            blockers,
        }
    }
}
