//! Statements worth an event of their own: those that ran at least
//! `--long-statement`, were killed, lost their client, or were a
//! deadlock's victim. Each is counted
//! in its digest like every statement (an event adds to nothing), so the
//! totals stay exact. At most `MAX_PER_WINDOW` per instance and window,
//! the longest kept; the rest are counted.
use std::{sync::Arc, time::SystemTime};

use sqlbee_kernel_abi::wait_class;

use super::locks::wall_time;
use crate::{
    normalize::{Digest, Samples},
    probe::Statement,
};

pub const MAX_PER_WINDOW: usize = 1_000;

/// Bytes of a statement's sample an event keeps.
const SAMPLE_BYTES: usize = 4096;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    Long,
    /// `KILL`, `KILL QUERY`, or the server's `max_statement_time`.
    Killed,
    /// The client went away (the server could not read from or write to it).
    Disconnected,
    /// InnoDB chose it as a deadlock's victim and rolled its transaction back.
    Deadlock,
}

impl Outcome {
    pub fn name(self) -> &'static str {
        match self {
            Outcome::Long => "long",
            Outcome::Killed => "killed",
            Outcome::Disconnected => "disconnected",
            Outcome::Deadlock => "deadlock",
        }
    }

    /// What a statement that ended with `error_code` after `duration_ns`
    /// was worth, if anything (`long_ns` 0: only killed and disconnected).
    pub fn of(duration_ns: u64, error_code: u32, long_ns: u64) -> Option<Outcome> {
        match error_code {
            // ER_QUERY_INTERRUPTED, ER_CONNECTION_KILLED, ER_STATEMENT_TIMEOUT.
            1317 | 1927 | 1969 => Some(Outcome::Killed),
            // ER_NET_READ_ERROR, _READ_INTERRUPTED, _ERROR_ON_WRITE, _WRITE_INTERRUPTED.
            1158..=1161 => Some(Outcome::Disconnected),
            // ER_LOCK_DEADLOCK.
            1213 => Some(Outcome::Deadlock),
            _ if long_ns > 0 && duration_ns >= long_ns => Some(Outcome::Long),
            _ => None,
        }
    }
}

#[derive(Clone, Debug)]
pub struct LongStatement {
    pub connection_id: u64,
    pub digest: u64,
    pub digest_text: Arc<str>,
    pub schema: Option<Arc<str>>,
    pub user: Option<String>,
    pub host: Option<String>,
    pub sample: String,
    /// CLOCK_MONOTONIC ns, and the same as wall time.
    pub start_ns: u64,
    pub start: SystemTime,
    pub duration_ns: u64,
    pub outcome: Outcome,
    pub error_code: u32,
    pub waits: [u64; wait_class::COUNT],
    /// Named later, from what the activity reads saw while it ran.
    pub blocked_by: Option<u64>,
    /// A deadlock's other transaction, as the server's deadlock report
    /// names it (named later, with a login).
    pub deadlock_with: Option<DeadlockPartner>,
}

/// The other side of a deadlock: its connection and its statement.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeadlockPartner {
    pub connection_id: u64,
    pub digest: u64,
    pub digest_text: String,
    /// Redacted as samples are.
    pub sample: String,
}

/// One instance's events in the current window.
#[derive(Default)]
pub struct LongStatements {
    pub kept: Vec<LongStatement>,
    pub dropped: u64,
}

impl LongStatements {
    pub fn offer(&mut self, statement: &Statement, digest: &Digest, samples: Samples, long_ns: u64) {
        let Some(outcome) = Outcome::of(statement.duration_ns, statement.error_code, long_ns) else { return };
        let event = LongStatement {
            connection_id: statement.connection_id,
            digest: digest.id,
            digest_text: digest.text.clone(),
            schema: statement.schema.clone(),
            user: statement.account.as_ref().map(|a| a.user.clone()),
            host: statement.account.as_ref().map(|a| a.host.clone()),
            sample: samples.statement(&statement.text, SAMPLE_BYTES),
            start_ns: statement.start_ns,
            start: wall_time(statement.start_ns),
            duration_ns: statement.duration_ns,
            outcome,
            error_code: statement.error_code,
            waits: statement.waits,
            blocked_by: None,
            deadlock_with: None,
        };
        if self.kept.len() < MAX_PER_WINDOW {
            self.kept.push(event);
            return;
        }
        self.dropped += 1;
        // Keep the longest: replace the shortest kept when this one is longer.
        if let Some((at, shortest)) = self.kept.iter().enumerate().min_by_key(|(_, e)| e.duration_ns)
            && shortest.duration_ns < event.duration_ns
        {
            self.kept[at] = event;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn outcomes_follow_the_error_then_the_duration() {
        let long = 10_000_000_000;
        assert_eq!(Outcome::of(1_000, 1317, long), Some(Outcome::Killed));
        assert_eq!(Outcome::of(1_000, 1969, 0), Some(Outcome::Killed));
        assert_eq!(Outcome::of(4_000_000_000, 1160, long), Some(Outcome::Disconnected));
        assert_eq!(Outcome::of(1_000, 1213, long), Some(Outcome::Deadlock));
        assert_eq!(Outcome::of(long, 0, long), Some(Outcome::Long));
        assert_eq!(Outcome::of(long, 1062, long), Some(Outcome::Long), "any other error still ran long");
        assert_eq!(Outcome::of(long - 1, 0, long), None);
        assert_eq!(Outcome::of(long * 9, 0, 0), None, "0 turns long statements off");
    }

    #[test]
    fn bounded_and_the_longest_kept() {
        let mut events = LongStatements::default();
        let digest = Digest::from_text("SELECT ?");
        for i in 0..(MAX_PER_WINDOW as u64 + 5) {
            let statement = crate::aggregate::fixtures::statement(1, 1, 10 + i, "SELECT 1");
            events.offer(&statement, &digest, Samples::Redacted, 1);
        }
        assert_eq!((events.kept.len(), events.dropped), (MAX_PER_WINDOW, 5));
        assert!(events.kept.iter().all(|e| e.duration_ns >= 15));
    }
}
