//! The server's global variables, read over the login now and then
//! (`SHOW GLOBAL VARIABLES`, which needs no grant), so a change of a
//! setting carries its old and new value. A `SET GLOBAL` the agent saw run
//! gets the values of the variables it names; a value that changed with
//! no such statement seen (set before the agent came, by a statement whose
//! record was lost, or by the server itself) is a change of its own.
//! Variables that may hold a secret are never read out.
use std::{
    collections::BTreeMap,
    time::{Duration, Instant, SystemTime},
};

use mysql::prelude::Queryable;

use crate::{
    aggregate::{ChangeRecord, SettingValue},
    normalize::ChangeKind,
};

/// How often the variables are read when no change asks sooner.
pub const READ_EVERY: Duration = Duration::from_secs(60);
/// `SET GLOBAL` statements waiting for their values, per server, at most.
const MAX_WAITING: usize = 100;
/// A statement whose variables never changed (it set the value they had)
/// is let go after this long.
const WAIT_AT_MOST: Duration = Duration::from_secs(300);
/// Variables kept per server, at most (a server has about 700).
const MAX_VARIABLES: usize = 4_096;
/// Bytes of a value kept.
const MAX_VALUE: usize = 1_024;

/// Parts of names of variables whose value may be a secret (a password, a
/// key or the path to one).
const SECRET: &[&str] = &["password", "secret", "auth", "credential", "private", "filekey", "_key", "token"];

/// MariaDB's other names of variables (a statement may set one name while
/// `SHOW GLOBAL VARIABLES` lists the other).
const ALIASES: &[(&str, &str)] = &[
    ("long_query_time", "log_slow_query_time"),
    ("slow_query_log", "log_slow_query"),
    ("slow_query_log_file", "log_slow_query_file"),
    ("min_examined_row_limit", "log_slow_min_examined_row_limit"),
    ("tx_isolation", "transaction_isolation"),
    ("tx_read_only", "transaction_read_only"),
    ("storage_engine", "default_storage_engine"),
];

/// Whether a statement that names `set` set the variable listed as `listed`.
fn names(set: &str, listed: &str) -> bool {
    set == listed || ALIASES.iter().any(|(a, b)| (set == *a && listed == *b) || (set == *b && listed == *a))
}

fn may_be_secret(name: &str) -> bool {
    let name = name.to_ascii_lowercase();
    SECRET.iter().any(|part| name.contains(part))
}

/// One server's variables as last read, and the statements that wait for
/// their values.
#[derive(Default)]
pub struct Settings {
    last: Option<BTreeMap<String, String>>,
    next_read: Option<Instant>,
    waiting: Vec<(Instant, ChangeRecord)>,
}

impl Settings {
    /// `SET GLOBAL` statements of a closed window: the next read comes now.
    pub fn offer(&mut self, changes: &[ChangeRecord], now: Instant) {
        for change in changes.iter().filter(|c| c.kind == ChangeKind::Setting) {
            if self.waiting.len() < MAX_WAITING {
                self.waiting.push((now, change.clone()));
            }
            self.next_read = Some(now);
        }
    }

    pub fn due(&self, now: Instant) -> bool {
        self.next_read.is_none_or(|at| now >= at)
    }

    /// A restarted server: what was read of the old one says nothing.
    pub fn forget(&mut self) {
        self.last = None;
        self.waiting.clear();
    }

    /// Reads the variables and returns what changed since the last read.
    pub fn read(&mut self, conn: &mut mysql::Conn, now: Instant) -> Result<Vec<ChangeRecord>, mysql::Error> {
        self.next_read = Some(now + READ_EVERY);
        let rows: Vec<(String, Option<String>)> = conn.query("SHOW GLOBAL VARIABLES")?;
        let current: BTreeMap<String, String> = rows
            .into_iter()
            .filter(|(name, _)| !may_be_secret(name))
            .take(MAX_VARIABLES)
            .map(|(name, value)| {
                let mut value = value.unwrap_or_default();
                if value.len() > MAX_VALUE {
                    let mut cut = MAX_VALUE;
                    while !value.is_char_boundary(cut) {
                        cut -= 1;
                    }
                    value.truncate(cut);
                }
                (name.to_ascii_lowercase(), value)
            })
            .collect();
        let Some(last) = self.last.replace(current) else { return Ok(Vec::new()) };
        let current = self.last.as_ref().expect("just set");
        let changed: Vec<SettingValue> = current
            .iter()
            .filter_map(|(name, new)| {
                let old = last.get(name)?;
                (old != new).then(|| SettingValue { name: name.clone(), old: old.clone(), new: new.clone() })
            })
            .collect();
        self.waiting.retain(|(since, _)| now.duration_since(*since) < WAIT_AT_MOST);
        Ok(self.pair(changed))
    }

    /// Each changed value to the oldest waiting statement that names its
    /// variable; the rest as changes of their own.
    fn pair(&mut self, changed: Vec<SettingValue>) -> Vec<ChangeRecord> {
        let mut out: Vec<ChangeRecord> = Vec::new();
        let mut alone: Vec<SettingValue> = Vec::new();
        for value in changed {
            match self.waiting.iter_mut().find(|(_, c)| c.objects.iter().any(|o| names(o, &value.name))) {
                Some((_, statement)) => statement.values.push(value),
                None => alone.push(value),
            }
        }
        let (answered, still): (Vec<_>, Vec<_>) =
            std::mem::take(&mut self.waiting).into_iter().partition(|(_, c)| !c.values.is_empty());
        self.waiting = still;
        out.extend(answered.into_iter().map(|(_, c)| c));
        if !alone.is_empty() {
            let names = alone.iter().map(|v| v.name.clone()).collect();
            out.push(ChangeRecord {
                values: alone,
                ..ChangeRecord::unattributed(ChangeKind::Setting, "variables changed", names, SystemTime::now())
            });
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set_global(variables: &[&str]) -> ChangeRecord {
        ChangeRecord {
            connection_id: 7,
            digest: 1,
            digest_text: std::sync::Arc::from("SET GLOBAL ..."),
            user: Some("root".into()),
            host: Some("localhost".into()),
            duration_ns: 1_000,
            ..ChangeRecord::unattributed(
                ChangeKind::Setting,
                "SET GLOBAL",
                variables.iter().map(|v| v.to_string()).collect(),
                SystemTime::now(),
            )
        }
    }

    fn value(name: &str, old: &str, new: &str) -> SettingValue {
        SettingValue { name: name.into(), old: old.into(), new: new.into() }
    }

    #[test]
    fn values_go_to_the_statement_that_set_them_and_the_rest_stand_alone() {
        let mut settings = Settings::default();
        let now = Instant::now();
        settings.offer(&[set_global(&["long_query_time", "max_connections"]), set_global(&["sort_buffer_size"])], now);
        assert!(settings.due(now));
        let out = settings.pair(vec![
            value("log_slow_query_time", "10.000000", "7.250000"),
            value("max_connections", "151", "200"),
            value("wait_timeout", "28800", "600"),
        ]);
        assert_eq!(out.len(), 2, "{out:#?}");
        assert_eq!(out[0].values.len(), 2);
        assert_eq!(out[0].user.as_deref(), Some("root"));
        assert_eq!(
            (out[1].action.as_str(), out[1].objects.as_slice()),
            ("variables changed", &["wait_timeout".to_string()][..])
        );
        assert_eq!(settings.waiting.len(), 1, "sort_buffer_size did not change yet: it waits");
    }

    #[test]
    fn secrets_are_never_read_out() {
        for name in ["wsrep_sst_auth", "ssl_key", "file_key_management_filekey", "server_audit_password", "Some_Secret"]
        {
            assert!(may_be_secret(name), "{name}");
        }
        for name in ["long_query_time", "key_buffer_size", "max_connections", "innodb_buffer_pool_size"] {
            assert!(!may_be_secret(name), "{name}");
        }
    }
}
