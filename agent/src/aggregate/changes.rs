//! Statements that changed the server (`normalize::change_of`: DDL, global
//! settings, privileges, plugins, `FLUSH`, `KILL`, ...), each an event of
//! its own with who ran it, how long it took and how it ended. Each is
//! also counted in its digest like every statement. At most
//! `MAX_PER_WINDOW` per instance and window, the first kept (a change
//! script's first statement is the one that explains what follows); the
//! rest are counted.
use std::{sync::Arc, time::SystemTime};

use super::locks::wall_time;
use crate::{
    discover::Client,
    normalize::{ChangeKind, Digest, Samples, change_of},
    probe::{Statement, Stopped},
};

pub const MAX_PER_WINDOW: usize = 1_000;

/// Bytes of a statement's sample a change keeps.
const SAMPLE_BYTES: usize = 4096;

#[derive(Clone, Debug)]
pub struct ChangeRecord {
    pub kind: ChangeKind,
    /// `ALTER TABLE`, `SET GLOBAL`, ...
    pub action: String,
    /// Tables (`schema.table`), indexes (`index name`), variables.
    pub objects: Vec<String>,
    pub connection_id: u64,
    pub digest: u64,
    pub digest_text: Arc<str>,
    pub schema: Option<Arc<str>>,
    pub user: Option<String>,
    pub host: Option<String>,
    pub client: Option<Arc<Client>>,
    /// The stored program it ran in (`schema.name`), if it ran in one.
    pub program: Option<String>,
    /// Redacted as samples are.
    pub sample: String,
    pub start: SystemTime,
    pub duration_ns: u64,
    pub error_code: u32,
    /// For a setting, with a login: the variables' values before and
    /// after (`plans::settings`).
    pub values: Vec<SettingValue>,
}

impl ChangeRecord {
    /// A change no statement the agent saw made (a stop, a variable read
    /// with a new value): nobody named, no digest.
    pub fn unattributed(kind: ChangeKind, action: &str, objects: Vec<String>, start: SystemTime) -> ChangeRecord {
        ChangeRecord {
            kind,
            action: action.into(),
            objects,
            connection_id: 0,
            digest: 0,
            digest_text: Arc::from(""),
            schema: None,
            user: None,
            host: None,
            client: None,
            program: None,
            sample: String::new(),
            start,
            duration_ns: 0,
            error_code: 0,
            values: Vec::new(),
        }
    }
}

/// One global variable's value before and after a change.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SettingValue {
    pub name: String,
    pub old: String,
    pub new: String,
}

/// One instance's changes in the current window.
#[derive(Default)]
pub struct Changes {
    pub kept: Vec<ChangeRecord>,
    pub dropped: u64,
}

impl Changes {
    pub fn offer(&mut self, statement: &Statement, digest: &Digest, samples: Samples) {
        let Some(change) = change_of(&statement.text, statement.schema.as_deref()) else { return };
        if self.kept.len() >= MAX_PER_WINDOW {
            self.dropped += 1;
            return;
        }
        self.kept.push(ChangeRecord {
            kind: change.kind,
            action: change.action,
            objects: change.objects,
            connection_id: statement.connection_id,
            digest: digest.id,
            digest_text: digest.text.clone(),
            schema: statement.schema.clone(),
            user: statement.account.as_ref().map(|a| a.user.clone()),
            host: statement.account.as_ref().map(|a| a.host.clone()),
            client: statement.client.clone(),
            program: statement.program.as_ref().map(|p| p.name.clone()),
            sample: samples.statement(&statement.text, SAMPLE_BYTES),
            start: wall_time(statement.start_ns),
            duration_ns: statement.duration_ns,
            error_code: statement.error_code,
            values: Vec::new(),
        });
    }
}

impl Changes {
    /// The server's process exited between `stopped.last_seen` and
    /// `stopped.noticed`: a change of its own, timed over that span (no
    /// statement ran it that the agent saw; a `SHUTDOWN` is its own).
    pub fn server_stopped(&mut self, stopped: Stopped) {
        if self.kept.len() >= MAX_PER_WINDOW {
            self.dropped += 1;
            return;
        }
        let span = stopped.noticed.duration_since(stopped.last_seen).unwrap_or_default();
        self.kept.push(ChangeRecord {
            duration_ns: u64::try_from(span.as_nanos()).unwrap_or(u64::MAX),
            ..ChangeRecord::unattributed(ChangeKind::Server, "server stop", Vec::new(), stopped.last_seen)
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::aggregate::fixtures::statement;

    #[test]
    fn changes_are_kept_with_who_and_redacted_and_bounded() {
        let mut changes = Changes::default();
        let samples = Samples::default();
        for text in ["SELECT 1", "SET NAMES utf8mb4", "GRANT ALL ON *.* TO 'bob'@'%' IDENTIFIED BY 's3cret!'"] {
            changes.offer(&statement(7, 1, 1_000, text), &Digest::from_text(text), samples);
        }
        assert_eq!(changes.kept.len(), 1);
        let grant = &changes.kept[0];
        assert_eq!((grant.kind, grant.action.as_str()), (ChangeKind::Privileges, "GRANT"));
        assert!(!grant.sample.contains("s3cret"), "{}", grant.sample);
        for _ in 0..MAX_PER_WINDOW + 5 {
            changes.offer(&statement(7, 1, 1_000, "TRUNCATE TABLE t"), &Digest::from_text("TRUNCATE TABLE t"), samples);
        }
        assert_eq!((changes.kept.len(), changes.dropped), (MAX_PER_WINDOW, 6));
    }

    #[test]
    fn a_stop_spans_from_when_the_server_was_last_seen_to_when_it_was_missed() {
        let mut changes = Changes::default();
        let last_seen = SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(1_800_000_000);
        changes.server_stopped(Stopped { last_seen, noticed: last_seen + std::time::Duration::from_millis(480) });
        let stop = &changes.kept[0];
        assert_eq!((stop.kind, stop.action.as_str(), stop.digest), (ChangeKind::Server, "server stop", 0));
        assert_eq!((stop.start, stop.duration_ns), (last_seen, 480_000_000));
    }
}
