//! Checks every batch before it reaches a store. A batch that fails here
//! will fail the same way every time, so the answer is INVALID_ARGUMENT and
//! the error names the field (`windows[2].digests[5].histogram`) and what is
//! wrong with it. Owns the collector's limits; never touches storage.
//!
//! Invalid UTF-8 in `string` fields never gets here: prost refuses it while
//! decoding, and `status::DecodeErrorsAsInvalid` turns that into
//! INVALID_ARGUMENT as well.
mod measures;
mod path;
mod tags;

use std::{fmt::Display, time::Duration};

use sqlbee_proto::v1::{
    AccountCount, Batch, Change, ClientCount, DigestStats, Gap, Histogram, InstanceWindow, LockWait, LongStatement,
    QueryStats, ServerInstance, UntracedServer, WaitStats,
};

use sqlbee_figures::Unit;
use sqlbee_vocabulary::{clock, digest_id, histogram};

use self::path::Path;

pub const MAX_AGENT_ID: usize = 128;
pub const MAX_WINDOWS: usize = 10_000;
pub const MAX_DIGESTS: usize = 100_000;
pub const MAX_GAPS: usize = 10_000;
/// digest_text and sample.
pub const MAX_TEXT: usize = 64 * 1024;
/// host, version, instance name, command name, gap reason.
pub const MAX_NAME: usize = 1024;
/// Windows older than this are refused: a clock that far off, or a spool
/// that old, would only put data where retention removes it anyway.
pub const MAX_PAST: Duration = Duration::from_secs(30 * 86_400);
/// Allowed clock skew into the future.
pub const MAX_FUTURE: Duration = Duration::from_secs(3600);
/// Wait classes per digest; the agent knows 8.
pub const MAX_WAITS: usize = 16;
/// A wait class name (`row_lock`, `metadata_lock`, ...).
pub const MAX_WAIT_CLASS: usize = 32;
/// An error's sample message (the agent cuts at 256 bytes).
pub const MAX_ERROR_MESSAGE: usize = 1024;
/// Lock waits per window (the agent reports only waits above a threshold).
pub const MAX_LOCK_WAITS: usize = 1000;
/// Candidate blockers per lock wait.
pub const MAX_BLOCKERS: usize = 32;
/// Statement texts per blocker (the agent keeps at most 8).
pub const MAX_BLOCKER_STATEMENTS: usize = 8;
/// `blocker_kind` (`candidates`).
pub const MAX_BLOCKER_KIND: usize = 32;
/// Accounts per digest row (the agent keeps at most 32).
pub const MAX_ACCOUNTS: usize = 64;
/// Clients per digest row (the agent sends at most 32).
pub const MAX_CLIENTS: usize = 64;
/// Untraced servers per agent window (one agent watches one host).
pub const MAX_UNTRACED: usize = 1000;
/// Why a server is not traced (the agent's error message).
pub const MAX_REASON: usize = 4096;

/// A count limit of the decode bounds (`sqlbee_proto::limits`), checked
/// here as well: a message too small to need the scan before decoding is
/// held to the same limits after it.
fn count_limit(field: &str) -> usize {
    sqlbee_proto::limits::COUNT_LIMITS.iter().find(|(k, _)| *k == field).map_or(usize::MAX, |(_, n)| *n as usize)
}

/// A length limit of the decode bounds, as `count_limit`.
fn length_limit(field: &str) -> usize {
    sqlbee_proto::limits::LENGTH_LIMITS.iter().find(|(k, _)| *k == field).map_or(MAX_NAME, |(_, n)| *n as usize)
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("{field}: {problem}")]
pub struct Invalid {
    pub field: String,
    pub problem: String,
}

fn invalid(field: impl Display, problem: impl Into<String>) -> Invalid {
    Invalid { field: field.to_string(), problem: problem.into() }
}

pub fn batch(batch: &Batch, now_unix_ms: i64) -> Result<(), Invalid> {
    let agent = batch.agent.as_ref().ok_or_else(|| invalid("agent", "missing; every batch names its agent"))?;
    if agent.agent_id.is_empty() {
        return Err(invalid("agent.agent_id", "empty; the agent must send its persistent id"));
    }
    if agent.agent_id.len() > MAX_AGENT_ID {
        return Err(invalid("agent.agent_id", format!("{} bytes, at most {MAX_AGENT_ID}", agent.agent_id.len())));
    }
    name_len("agent.host", &agent.host)?;
    name_len("agent.version", &agent.version)?;
    if batch.sequence == 0 {
        return Err(invalid("sequence", "0; sequences start at 1"));
    }
    if batch.windows.len() > MAX_WINDOWS {
        return Err(invalid("windows", format!("{} windows in one batch, at most {MAX_WINDOWS}", batch.windows.len())));
    }
    let digests: usize = batch.windows.iter().map(|w| w.digests.len()).sum();
    if digests > MAX_DIGESTS {
        return Err(invalid("windows[*].digests", format!("{digests} digests in one batch, at most {MAX_DIGESTS}")));
    }
    if batch.gaps.len() > MAX_GAPS {
        return Err(invalid("gaps", format!("{} gaps in one batch, at most {MAX_GAPS}", batch.gaps.len())));
    }
    let range = TimeRange {
        low: now_unix_ms.saturating_sub(MAX_PAST.as_millis() as i64),
        high: now_unix_ms.saturating_add(MAX_FUTURE.as_millis() as i64),
    };
    for (i, w) in batch.windows.iter().enumerate() {
        window(&Path::Root("windows").index(i), w, range)?;
    }
    for (i, g) in batch.gaps.iter().enumerate() {
        gap(&Path::Root("gaps").index(i), g)?;
    }
    for (i, w) in batch.agent_windows.iter().enumerate() {
        if w.untraced.len() > MAX_UNTRACED {
            return Err(invalid(
                Path::Root("agent_windows").index(i).field("untraced"),
                format!("{} servers, at most {MAX_UNTRACED}", w.untraced.len()),
            ));
        }
        for (k, u) in w.untraced.iter().enumerate() {
            untraced(&Path::Root("agent_windows").index(i).field("untraced").index(k), u, range)?;
        }
    }
    if batch.agent_windows.len() > MAX_WINDOWS {
        return Err(invalid(
            "agent_windows",
            format!("{} agent windows in one batch, at most {MAX_WINDOWS}", batch.agent_windows.len()),
        ));
    }
    measures::agent_windows(&batch.agent_windows, range)?;
    Ok(())
}

#[derive(Clone, Copy)]
struct TimeRange {
    low: i64,
    high: i64,
}

impl TimeRange {
    fn check(&self, field: impl Display, ms: i64) -> Result<(), Invalid> {
        if ms < self.low || ms > self.high {
            return Err(invalid(
                field,
                format!(
                    "{ms} ({}) is outside the accepted range {} .. {} (30 days back to 1 hour ahead of the collector's clock); check the agent's clock",
                    time(ms),
                    time(self.low),
                    time(self.high)
                ),
            ));
        }
        Ok(())
    }
}

fn time(ms: i64) -> String {
    if ms < 0 {
        return "before 1970".into();
    }
    clock::rfc3339(clock::from_unix_ms(ms))
}

fn name_len(field: impl Display, value: &str) -> Result<(), Invalid> {
    if value.len() > MAX_NAME {
        return Err(invalid(field, format!("{} bytes, at most {MAX_NAME}", value.len())));
    }
    Ok(())
}

fn text_len(field: impl Display, value: &str) -> Result<(), Invalid> {
    if value.len() > MAX_TEXT {
        return Err(invalid(field, format!("{} bytes, at most {MAX_TEXT}", value.len())));
    }
    Ok(())
}

/// An id that is not the hash of its text would put one agent's
/// statements under another's text, or another's under its own.
fn digest_id(field: impl Display, id: u64, text: &str) -> Result<(), Invalid> {
    if digest_id::matches(id, text) {
        return Ok(());
    }
    let expected = if id == digest_id::OVERFLOW_ID {
        format!("id 0 is the overflow row's, whose text is {:?}", digest_id::OVERFLOW_TEXT)
    } else {
        format!("the digest of this text is {:016x} (XXH3-64 of digest_text)", digest_id::of(text))
    };
    Err(invalid(field, format!("{id:016x} is not the id of its digest_text: {expected}")))
}

fn server_instance<'a>(at: &Path<'_>, instance: Option<&'a ServerInstance>) -> Result<&'a ServerInstance, Invalid> {
    let instance = instance.ok_or_else(|| invalid(at.field("instance"), "missing"))?;
    if instance.name.is_empty() {
        return Err(invalid(at.field("instance").field("name"), "empty; expected host:port or a socket path"));
    }
    for (name, value) in [
        ("name", &instance.name),
        ("container_id", &instance.container_id),
        ("container", &instance.container),
        ("build_id", &instance.build_id),
        ("server_version", &instance.server_version),
    ] {
        let most = length_limit(&format!("ServerInstance.{name}"));
        if value.len() > most {
            return Err(invalid(at.field("instance").field(name), format!("{} bytes, at most {most}", value.len())));
        }
    }
    Ok(instance)
}

fn untraced(at: &Path<'_>, u: &UntracedServer, range: TimeRange) -> Result<(), Invalid> {
    server_instance(at, u.instance.as_ref())?;
    if u.reason.len() > MAX_REASON {
        return Err(invalid(at.field("reason"), format!("{} bytes, at most {MAX_REASON}", u.reason.len())));
    }
    name_len(at.field("kind"), &u.kind)?;
    // A server may stay untraced for longer than windows are kept.
    if u.since_unix_ms < 0 || u.since_unix_ms > range.high {
        return Err(invalid(at.field("since_unix_ms"), format!("{} is not a time the agent saw", u.since_unix_ms)));
    }
    Ok(())
}

fn window(at: &Path<'_>, w: &InstanceWindow, range: TimeRange) -> Result<(), Invalid> {
    server_instance(at, w.instance.as_ref())?;
    range.check(at.field("window_start_unix_ms"), w.window_start_unix_ms)?;
    range.check(at.field("window_end_unix_ms"), w.window_end_unix_ms)?;
    if w.window_start_unix_ms >= w.window_end_unix_ms {
        return Err(invalid(
            at.field("window_end_unix_ms"),
            format!("{} is not after window_start_unix_ms {}", w.window_end_unix_ms, w.window_start_unix_ms),
        ));
    }
    for (i, c) in w.commands.iter().enumerate() {
        if c.command.is_empty() {
            return Err(invalid(at.field("commands").index(i).field("command"), "empty"));
        }
        name_len(at.field("commands").index(i).field("command"), &c.command)?;
    }
    let most = count_limit("InstanceWindow.digests");
    if w.digests.len() > most {
        return Err(invalid(at.field("digests"), format!("{} digests in one window, at most {most}", w.digests.len())));
    }
    for (i, d) in w.digests.iter().enumerate() {
        digest(&at.field("digests").index(i), d)?;
    }
    if w.lock_waits.len() > MAX_LOCK_WAITS {
        return Err(invalid(
            at.field("lock_waits"),
            format!("{} lock waits in one window, at most {MAX_LOCK_WAITS}", w.lock_waits.len()),
        ));
    }
    for (i, l) in w.lock_waits.iter().enumerate() {
        lock_wait(&at.field("lock_waits").index(i), l, range)?;
    }
    let most = count_limit("InstanceWindow.long_statements");
    if w.long_statements.len() > most {
        return Err(invalid(
            at.field("long_statements"),
            format!("{} long statements in one window, at most {most}", w.long_statements.len()),
        ));
    }
    for (i, l) in w.long_statements.iter().enumerate() {
        long_statement(&at.field("long_statements").index(i), l, range)?;
    }
    let most = count_limit("InstanceWindow.changes");
    if w.changes.len() > most {
        return Err(invalid(at.field("changes"), format!("{} changes in one window, at most {most}", w.changes.len())));
    }
    for (i, c) in w.changes.iter().enumerate() {
        change(&at.field("changes").index(i), c, range)?;
    }
    let most = count_limit("InstanceWindow.plans");
    if w.plans.len() > most {
        return Err(invalid(at.field("plans"), format!("{} plans in one window, at most {most}", w.plans.len())));
    }
    for (i, p) in w.plans.iter().enumerate() {
        plan(&at.field("plans").index(i), p, w)?;
    }
    let most = count_limit("InstanceWindow.table_indexes");
    if w.table_indexes.len() > most {
        return Err(invalid(
            at.field("table_indexes"),
            format!("{} tables' indexes in one window, at most {most}", w.table_indexes.len()),
        ));
    }
    for (i, t) in w.table_indexes.iter().enumerate() {
        table_indexes(&at.field("table_indexes").index(i), t, w)?;
    }
    let channels = at.field("replication");
    for (i, r) in w.replication.iter().enumerate() {
        let at = channels.index(i);
        if w.replication[..i].iter().any(|earlier| earlier.channel == r.channel) {
            return Err(invalid(at.field("channel"), format!("channel {:?} twice in one window", r.channel)));
        }
        limited(at.field("channel"), &r.channel, "Replication.channel")?;
        replication(&at, r)?;
    }
    if let Some(c) = &w.probes {
        measures::probe_cost(&at.field("probes"), c, w.statements)?;
    }
    if let Some(p) = &w.process {
        measures::process(&at.field("process"), p)?;
    }
    Ok(())
}

/// A time an agent's login read something at (a plan, a table's indexes):
/// no later than a minute after its window's end (one dated ahead would
/// stay the newest for ever, and never be pruned), and no earlier than a
/// day before its start.
fn near_window(field: impl Display, at_ms: i64, w: &InstanceWindow) -> Result<(), Invalid> {
    let low = w.window_start_unix_ms.saturating_sub(PLAN_MAX_AGE_MS);
    let high = w.window_end_unix_ms.saturating_add(PLAN_SLACK_MS);
    if at_ms < low || at_ms > high {
        return Err(invalid(
            field,
            format!(
                "{at_ms} ({}) is outside its window's range {} .. {} (a day before the window to a minute after it)",
                time(at_ms),
                time(low),
                time(high)
            ),
        ));
    }
    Ok(())
}

/// `value` within the decode bound `name` (`Message.field`).
fn limited(field: impl Display, value: &str, name: &str) -> Result<(), Invalid> {
    let most = length_limit(name);
    if value.len() > most {
        return Err(invalid(field, format!("{} bytes, at most {most}", value.len())));
    }
    Ok(())
}

/// A table's indexes: dated as a plan may be (a reading dated ahead would
/// stay the newest for ever), named, and within the decode bounds.
fn table_indexes(at: &Path<'_>, t: &sqlbee_proto::v1::TableIndexes, w: &InstanceWindow) -> Result<(), Invalid> {
    near_window(at.field("read_unix_ms"), t.read_unix_ms, w)?;
    if t.table.is_empty() {
        return Err(invalid(at.field("table"), "empty; a reading names its table"));
    }
    limited(at.field("schema"), &t.schema, "TableIndexes.schema")?;
    limited(at.field("table"), &t.table, "TableIndexes.table")?;
    for (i, index) in t.indexes.iter().enumerate() {
        let indexes = at.field("indexes");
        let at = indexes.index(i);
        limited(at.field("name"), &index.name, "IndexDefinition.name")?;
        limited(at.field("type"), &index.r#type, "IndexDefinition.type")?;
        let columns = at.field("columns");
        for (j, c) in index.columns.iter().enumerate() {
            limited(columns.index(j).field("name"), &c.name, "IndexColumn.name")?;
        }
    }
    Ok(())
}

/// What a replica applied: its lag histogram well formed, its classes
/// and kinds the ones agents name, its tables within the decode bounds.
fn replication(at: &Path<'_>, r: &sqlbee_proto::v1::Replication) -> Result<(), Invalid> {
    if let Some(lag) = &r.lag {
        let samples = lag.buckets.iter().try_fold(0u64, |sum, b| sum.checked_add(b.count));
        let samples = samples.ok_or_else(|| invalid(at.field("lag").field("buckets"), "counts overflow 64 bits"))?;
        histogram_of(&at.field("lag"), lag, samples)?;
    }
    let classes = at.field("classes");
    for (i, c) in r.classes.iter().enumerate() {
        let at = classes.index(i);
        if !REPLICATION_CLASSES.contains(&c.class.as_str()) {
            return Err(invalid(
                at.field("class"),
                format!("{:?} is not one of {}", c.class, REPLICATION_CLASSES.join(", ")),
            ));
        }
        if let Some(latency) = &c.latency {
            histogram_of(&at.field("latency"), latency, c.events)?;
        }
    }
    let tables = at.field("tables");
    for (i, t) in r.tables.iter().enumerate() {
        let at = tables.index(i);
        if !ROWS_KINDS.contains(&t.kind.as_str()) {
            return Err(invalid(at.field("kind"), format!("{:?} is not one of {}", t.kind, ROWS_KINDS.join(", "))));
        }
        if let Some(latency) = &t.latency {
            histogram_of(&at.field("latency"), latency, t.events)?;
        }
        limited(at.field("schema"), &t.schema, "AppliedTable.schema")?;
        limited(at.field("table"), &t.table, "AppliedTable.table")?;
    }
    Ok(())
}

/// The classes of replicated events agents name.
pub const REPLICATION_CLASSES: [&str; 6] = ["gtid", "xid", "query", "table_map", "rows", "other"];
/// The kinds of rows events agents name.
pub const ROWS_KINDS: [&str; 3] = ["write_rows", "update_rows", "delete_rows"];

/// How far a plan may be dated before its window began: the explainer
/// works through a backlog, and a prepared statement's plan waits for its
/// values.
pub const PLAN_MAX_AGE_MS: i64 = 86_400_000;
/// How far after its window's end: none, but for clock jitter.
pub const PLAN_SLACK_MS: i64 = 60_000;

/// A plan the agent got since its previous window: dated no later than the
/// window's end (a plan dated ahead would stay a digest's newest plan for
/// ever, and never be pruned), and no earlier than a day before its start.
fn plan(at: &Path<'_>, p: &sqlbee_proto::v1::Plan, w: &InstanceWindow) -> Result<(), Invalid> {
    near_window(at.field("explained_unix_ms"), p.explained_unix_ms, w)?;
    if p.digest == 0 {
        return Err(invalid(at.field("digest"), "0; a plan names the digest it explains"));
    }
    limited(at.field("schema"), &p.schema, "Plan.schema")?;
    limited(at.field("plan_json"), &p.plan_json, "Plan.plan_json")?;
    limited(at.field("not_explained"), &p.not_explained, "Plan.not_explained")?;
    let most = count_limit("Plan.access");
    if p.access.len() > most {
        return Err(invalid(at.field("access"), format!("{} tables, at most {most}", p.access.len())));
    }
    let access = at.field("access");
    for (i, a) in p.access.iter().enumerate() {
        let at = access.index(i);
        for (field, value, name) in [
            ("table", &a.table, "TableAccess.table"),
            ("type", &a.r#type, "TableAccess.type"),
            ("key", &a.key, "TableAccess.key"),
        ] {
            if value.len() > length_limit(name) {
                return Err(invalid(at.field(field), format!("{} bytes, at most {}", value.len(), length_limit(name))));
            }
        }
        for (field, values, count, name) in [
            ("key_parts", &a.key_parts, "TableAccess.key_parts", "TableAccess.key_parts"),
            ("possible_keys", &a.possible_keys, "TableAccess.possible_keys", "TableAccess.possible_keys"),
        ] {
            if values.len() > count_limit(count) {
                return Err(invalid(
                    at.field(field),
                    format!("{} names, at most {}", values.len(), count_limit(count)),
                ));
            }
            if let Some(long) = values.iter().find(|v| v.len() > length_limit(name)) {
                return Err(invalid(
                    at.field(field),
                    format!("a name of {} bytes, at most {}", long.len(), length_limit(name)),
                ));
            }
        }
    }
    Ok(())
}

/// A statement that ran long, was killed or lost its client: it ran in
/// the window, and its digest id matches its text.
fn long_statement(at: &Path<'_>, l: &LongStatement, range: TimeRange) -> Result<(), Invalid> {
    range.check(at.field("start_unix_ms"), l.start_unix_ms)?;
    if l.outcome.is_empty() {
        return Err(invalid(at.field("outcome"), "empty; expected long, killed, disconnected or deadlock"));
    }
    text_len(at.field("digest_text"), &l.digest_text)?;
    if l.digest != 0 || !l.digest_text.is_empty() {
        digest_id(at.field("digest"), l.digest, &l.digest_text)?;
    }
    text_len(at.field("sample"), &l.sample)?;
    text_len(at.field("deadlock_with_digest_text"), &l.deadlock_with_digest_text)?;
    if l.deadlock_with_digest != 0 || !l.deadlock_with_digest_text.is_empty() {
        digest_id(at.field("deadlock_with_digest"), l.deadlock_with_digest, &l.deadlock_with_digest_text)?;
    }
    text_len(at.field("deadlock_with_sample"), &l.deadlock_with_sample)?;
    Ok(())
}

/// A statement that changed the server: it ran in the window, says what
/// kind of change it is, and its digest id matches its text.
fn change(at: &Path<'_>, c: &Change, range: TimeRange) -> Result<(), Invalid> {
    range.check(at.field("start_unix_ms"), c.start_unix_ms)?;
    if c.kind.is_empty() || c.action.is_empty() {
        let field = if c.kind.is_empty() { "kind" } else { "action" };
        return Err(invalid(at.field(field), "empty; a change says what it changed"));
    }
    name_len(at.field("kind"), &c.kind)?;
    name_len(at.field("action"), &c.action)?;
    text_len(at.field("digest_text"), &c.digest_text)?;
    if c.digest != 0 || !c.digest_text.is_empty() {
        digest_id(at.field("digest"), c.digest, &c.digest_text)?;
    }
    text_len(at.field("sample"), &c.sample)?;
    for (i, o) in c.objects.iter().enumerate() {
        name_len(at.field("objects").index(i), o)?;
    }
    Ok(())
}

/// Old agents send no lock waits: an empty list is always valid.
fn lock_wait(at: &Path<'_>, l: &LockWait, range: TimeRange) -> Result<(), Invalid> {
    range.check(at.field("start_unix_ms"), l.start_unix_ms)?;
    if l.duration_ns == 0 {
        return Err(invalid(at.field("duration_ns"), "0; a reported wait has a duration"));
    }
    if l.class.is_empty() {
        return Err(invalid(at.field("class"), "empty; expected a wait class such as row_lock"));
    }
    if l.class.len() > MAX_WAIT_CLASS {
        return Err(invalid(at.field("class"), format!("{} bytes, at most {MAX_WAIT_CLASS}", l.class.len())));
    }
    text_len(at.field("digest_text"), &l.digest_text)?;
    // 0 and no text: the waiting statement's digest is unknown.
    if l.digest != 0 || !l.digest_text.is_empty() {
        digest_id(at.field("digest"), l.digest, &l.digest_text)?;
    }
    text_len(at.field("sample"), &l.sample)?;
    if l.blocker_kind.len() > MAX_BLOCKER_KIND {
        return Err(invalid(
            at.field("blocker_kind"),
            format!("{} bytes, at most {MAX_BLOCKER_KIND}", l.blocker_kind.len()),
        ));
    }
    if l.blockers.len() > MAX_BLOCKERS {
        return Err(invalid(at.field("blockers"), format!("{} blockers, at most {MAX_BLOCKERS}", l.blockers.len())));
    }
    for (i, b) in l.blockers.iter().enumerate() {
        if b.statements.len() > MAX_BLOCKER_STATEMENTS {
            return Err(invalid(
                at.field("blockers").index(i).field("statements"),
                format!("{} statements, at most {MAX_BLOCKER_STATEMENTS}", b.statements.len()),
            ));
        }
        for (j, s) in b.statements.iter().enumerate() {
            text_len(at.field("blockers").index(i).field("statements").index(j), s)?;
        }
    }
    Ok(())
}

/// Figures that count statements cannot exceed the statements counted.
fn figures(at: &Path<'_>, s: &QueryStats, count: u64) -> Result<(), Invalid> {
    for (figure, value) in s.figures() {
        if figure.unit == Unit::Statements
            && let Some(value) = value
            && value > count
        {
            return Err(invalid(at.field(figure.name), format!("{value} statements, above count {count}")));
        }
    }
    Ok(())
}

fn accounts(at: &Path<'_>, accounts: &[AccountCount], count: u64) -> Result<(), Invalid> {
    if accounts.len() > MAX_ACCOUNTS {
        return Err(invalid(at, format!("{} accounts, at most {MAX_ACCOUNTS}", accounts.len())));
    }
    let mut sum = 0u64;
    for (i, a) in accounts.iter().enumerate() {
        name_len(at.index(i).field("user"), &a.user)?;
        name_len(at.index(i).field("host"), &a.host)?;
        sum = sum.saturating_add(a.count);
    }
    if sum > count {
        return Err(invalid(at, format!("counts sum to {sum}, above count {count}")));
    }
    Ok(())
}

/// Counts per client add up to at most the row's count; the strings are
/// bounded before decoding (`sqlbee_proto::limits`).
fn clients(at: &Path<'_>, clients: &[ClientCount], count: u64) -> Result<(), Invalid> {
    if clients.len() > MAX_CLIENTS {
        return Err(invalid(at, format!("{} clients, at most {MAX_CLIENTS}", clients.len())));
    }
    let sum = clients.iter().try_fold(0u64, |sum, c| sum.checked_add(c.count));
    match sum {
        Some(sum) if sum <= count => Ok(()),
        Some(sum) => Err(invalid(at, format!("counts sum to {sum}, above count {count}"))),
        None => Err(invalid(at, "counts overflow 64 bits")),
    }
}

fn digest(at: &Path<'_>, d: &DigestStats) -> Result<(), Invalid> {
    text_len(at.field("digest_text"), &d.digest_text)?;
    digest_id(at.field("digest"), d.digest, &d.digest_text)?;
    text_len(at.field("sample"), &d.sample)?;
    if d.count > 0 && d.min_ns > d.max_ns {
        return Err(invalid(at.field("min_ns"), format!("{} is above max_ns {}", d.min_ns, d.max_ns)));
    }
    if d.count > 0 && d.sum_ns < d.max_ns {
        return Err(invalid(at.field("sum_ns"), format!("{} is below max_ns {}", d.sum_ns, d.max_ns)));
    }
    if d.errors > d.count {
        return Err(invalid(at.field("errors"), format!("{} is above count {}", d.errors, d.count)));
    }
    if d.estimated_count != 0 && d.estimated_count < d.count {
        return Err(invalid(
            at.field("estimated_count"),
            format!("{} is below count {}; an estimate scales the count up", d.estimated_count, d.count),
        ));
    }
    if d.truncated > d.count {
        return Err(invalid(at.field("truncated"), format!("{} is above count {}", d.truncated, d.count)));
    }
    let coded = d.error_codes.iter().try_fold(0u64, |sum, e| sum.checked_add(e.count));
    match coded {
        Some(coded) if coded <= d.errors => {}
        Some(coded) => {
            return Err(invalid(at.field("error_codes"), format!("counts sum to {coded}, above errors {}", d.errors)));
        }
        None => return Err(invalid(at.field("error_codes"), "counts overflow 64 bits")),
    }
    for (i, e) in d.error_codes.iter().enumerate() {
        if e.sample_message.len() > MAX_ERROR_MESSAGE {
            return Err(invalid(
                at.field("error_codes").index(i).field("sample_message"),
                format!("{} bytes, at most {MAX_ERROR_MESSAGE}", e.sample_message.len()),
            ));
        }
    }
    waits(&at.field("waits"), &d.waits, d.count)?;
    name_len(at.field("schema"), &d.schema)?;
    name_len(at.field("program"), &d.program)?;
    name_len(at.field("program_kind"), &d.program_kind)?;
    name_len(at.field("source"), &d.source)?;
    if let Some(stats) = &d.stats {
        figures(&at.field("stats"), stats, d.count)?;
    }
    accounts(&at.field("accounts"), &d.accounts, d.count)?;
    clients(&at.field("clients"), &d.clients, d.count)?;
    tags::tags(&at.field("tags"), &d.tags, d.count)?;
    tags::exemplar(&at.field("exemplar"), d.exemplar.as_ref(), d.max_ns)?;
    match &d.histogram {
        None if d.count == 0 => Ok(()),
        None => Err(invalid(at.field("histogram"), format!("missing; count is {}", d.count))),
        Some(h) => histogram_of(&at.field("histogram"), h, d.count),
    }
}

/// Old agents send no waits: an empty list is always valid.
fn waits(at: &Path<'_>, waits: &[WaitStats], count: u64) -> Result<(), Invalid> {
    if waits.len() > MAX_WAITS {
        return Err(invalid(at, format!("{} wait classes, at most {MAX_WAITS}", waits.len())));
    }
    for (i, w) in waits.iter().enumerate() {
        if w.class.is_empty() {
            return Err(invalid(at.index(i).field("class"), "empty; expected a wait class such as row_lock"));
        }
        if w.class.len() > MAX_WAIT_CLASS {
            return Err(invalid(
                at.index(i).field("class"),
                format!("{} bytes, at most {MAX_WAIT_CLASS}", w.class.len()),
            ));
        }
        if let Some(j) = waits[..i].iter().position(|o| o.class == w.class) {
            return Err(invalid(
                at.index(i).field("class"),
                format!("{:?} already appears at {at}[{j}]; one entry per class", w.class),
            ));
        }
        if w.max_ns > w.sum_ns {
            return Err(invalid(at.index(i).field("max_ns"), format!("{} is above sum_ns {}", w.max_ns, w.sum_ns)));
        }
        if w.statements > count {
            return Err(invalid(
                at.index(i).field("statements"),
                format!("{} is above the digest's count {count}", w.statements),
            ));
        }
    }
    Ok(())
}

fn histogram_of(at: &Path<'_>, h: &Histogram, count: u64) -> Result<(), Invalid> {
    let empty = h.buckets.is_empty() && count == 0;
    if h.scheme != histogram::SCHEME && !empty {
        return Err(invalid(
            at.field("scheme"),
            format!("{} is not supported; this collector knows scheme {}", h.scheme, histogram::SCHEME),
        ));
    }
    let mut sum = 0u64;
    let mut last: Option<u32> = None;
    for (i, b) in h.buckets.iter().enumerate() {
        if b.index as usize >= histogram::BUCKETS {
            return Err(invalid(
                at.field("buckets").index(i).field("index"),
                format!("{} is out of range; scheme {} has {} buckets", b.index, histogram::SCHEME, histogram::BUCKETS),
            ));
        }
        if last.is_some_and(|l| b.index <= l) {
            return Err(invalid(
                at.field("buckets").index(i).field("index"),
                format!("{} does not follow {}; indices must be strictly increasing", b.index, last.unwrap_or(0)),
            ));
        }
        last = Some(b.index);
        sum = sum.checked_add(b.count).ok_or_else(|| invalid(at.field("buckets"), "counts overflow 64 bits"))?;
    }
    if sum != count {
        return Err(invalid(at.field("buckets"), format!("counts sum to {sum} but the digest's count is {count}")));
    }
    Ok(())
}

fn gap(at: &Path<'_>, g: &Gap) -> Result<(), Invalid> {
    if g.first_sequence == 0 {
        return Err(invalid(at.field("first_sequence"), "0; sequences start at 1"));
    }
    if g.first_sequence > g.last_sequence {
        return Err(invalid(
            at.field("last_sequence"),
            format!("{} is below first_sequence {}", g.last_sequence, g.first_sequence),
        ));
    }
    if g.first_window_start_unix_ms > g.last_window_end_unix_ms {
        return Err(invalid(
            at.field("last_window_end_unix_ms"),
            format!(
                "{} is before first_window_start_unix_ms {}",
                g.last_window_end_unix_ms, g.first_window_start_unix_ms
            ),
        ));
    }
    name_len(at.field("reason"), &g.reason)
}

#[cfg(test)]
mod tests {
    use sqlbee_proto::v1::{
        AgentCost, AgentIdentity, AgentWindow, Bucket, CpuModes, DiskIo, ErrorCount, HostMetrics, ProbeCost,
        ServerInstance,
    };

    use super::*;

    const NOW: i64 = 1_800_000_000_000;

    fn good() -> Batch {
        Batch {
            agent: Some(AgentIdentity { host: "h".into(), agent_id: "a1".into(), version: "0.1.0".into() }),
            sequence: 1,
            created_unix_ms: NOW,
            epoch: 0,
            content_hash: 0,
            windows: vec![InstanceWindow {
                instance: Some(ServerInstance {
                    name: "h:3306".into(),
                    pid: 7,
                    start_time_unix_ms: NOW - 1000,
                    ..Default::default()
                }),
                window_start_unix_ms: NOW - 10_000,
                window_end_unix_ms: NOW,
                digests: vec![DigestStats {
                    digest: digest_id::of("SELECT ?"),
                    digest_text: "SELECT ?".into(),
                    count: 3,
                    errors: 1,
                    sum_ns: 600,
                    min_ns: 100,
                    max_ns: 300,
                    histogram: Some(Histogram {
                        scheme: 1,
                        buckets: vec![Bucket { index: 40, count: 1 }, Bucket { index: 50, count: 2 }],
                    }),
                    error_codes: vec![ErrorCount {
                        code: 1062,
                        count: 1,
                        sample_message: "Duplicate entry '1' for key 'PRIMARY'".into(),
                    }],
                    waits: vec![
                        WaitStats { class: "row_lock".into(), sum_ns: 500, max_ns: 300, statements: 2 },
                        WaitStats { class: "disk_io".into(), sum_ns: 20, max_ns: 20, statements: 1 },
                    ],
                    ..Default::default()
                }],
                probes: Some(ProbeCost { attached_fraction: 0.5, probe_cpu_seconds: 0.01, ..Default::default() }),
                ..Default::default()
            }],
            gaps: vec![],
            agent_windows: vec![AgentWindow {
                window_start_unix_ms: NOW - 10_000,
                window_end_unix_ms: NOW,
                cost: Some(AgentCost { cpu_cores: 0.01, shedding: "exact".into(), ..Default::default() }),
                host: Some(HostMetrics {
                    cpu: Some(CpuModes { user: 1.0, idle: 1.0, ..Default::default() }),
                    disks: vec![DiskIo { device: "vda".into(), ..Default::default() }],
                    ..Default::default()
                }),
                untraced: Vec::new(),
            }],
        }
    }

    #[test]
    fn a_reading_of_indexes_is_dated_near_its_window_named_and_bounded() {
        use sqlbee_proto::v1::{IndexColumn, IndexDefinition, TableIndexes};
        let mut b = good();
        b.windows[0].table_indexes = vec![TableIndexes {
            schema: "app".into(),
            table: "items".into(),
            read_unix_ms: NOW - 5_000,
            indexes: vec![IndexDefinition {
                name: "k_idx".into(),
                columns: vec![IndexColumn { name: "k".into(), prefix: 0 }],
                r#type: "BTREE".into(),
                ..Default::default()
            }],
            missing: false,
        }];
        batch(&b, NOW).unwrap();
        let mut ahead = b.clone();
        ahead.windows[0].table_indexes[0].read_unix_ms = NOW + PLAN_SLACK_MS + 1;
        assert_eq!(field_of(&ahead), "windows[0].table_indexes[0].read_unix_ms");
        let mut unnamed = b.clone();
        unnamed.windows[0].table_indexes[0].table.clear();
        assert_eq!(field_of(&unnamed), "windows[0].table_indexes[0].table");
        let mut long = b.clone();
        long.windows[0].table_indexes[0].indexes[0].columns[0].name = "c".repeat(2_000);
        assert_eq!(field_of(&long), "windows[0].table_indexes[0].indexes[0].columns[0].name");
    }

    #[test]
    fn a_replicas_window_names_known_classes_and_kinds_with_a_sound_histogram() {
        use sqlbee_proto::v1::{AppliedClass, AppliedTable, Replication};
        let mut b = good();
        b.windows[0].replication = vec![Replication {
            transactions: 2,
            lag: Some(Histogram { scheme: 1, buckets: vec![Bucket { index: 10, count: 2 }] }),
            lag_max_ns: 900,
            classes: vec![AppliedClass { class: "xid".into(), events: 2, apply_ns: 5, rows: None, latency: None }],
            tables: vec![AppliedTable {
                schema: "shop".into(),
                table: "orders".into(),
                kind: "update_rows".into(),
                events: 2,
                apply_ns: 3,
                rows: None,
                latency: Some(Histogram { scheme: 1, buckets: vec![Bucket { index: 1, count: 2 }] }),
            }],
            lost_events: 0,
            channel: String::new(),
        }];
        batch(&b, NOW).unwrap();
        let mut class = b.clone();
        class.windows[0].replication[0].classes[0].class = "mystery".into();
        assert_eq!(field_of(&class), "windows[0].replication[0].classes[0].class");
        let mut kind = b.clone();
        kind.windows[0].replication[0].tables[0].kind = "truncate".into();
        assert_eq!(field_of(&kind), "windows[0].replication[0].tables[0].kind");
        let mut long = b.clone();
        long.windows[0].replication[0].tables[0].table = "t".repeat(2_000);
        assert_eq!(field_of(&long), "windows[0].replication[0].tables[0].table");
        let mut unordered = b.clone();
        unordered.windows[0].replication[0].lag.as_mut().unwrap().buckets =
            vec![Bucket { index: 10, count: 1 }, Bucket { index: 9, count: 1 }];
        assert_eq!(field_of(&unordered), "windows[0].replication[0].lag.buckets[1].index");
        let mut short = b.clone();
        short.windows[0].replication[0].tables[0].latency.as_mut().unwrap().buckets[0].count = 1;
        assert_eq!(field_of(&short), "windows[0].replication[0].tables[0].latency.buckets");
        let mut twice = b.clone();
        let again = twice.windows[0].replication[0].clone();
        twice.windows[0].replication.push(again);
        assert_eq!(field_of(&twice), "windows[0].replication[1].channel");
    }

    #[test]
    fn client_counts_stay_within_the_row() {
        let client = |count| ClientCount { process: "php-fpm".into(), count, ..Default::default() };
        let mut b = good();
        b.windows[0].digests[0].clients = vec![client(2), client(1)];
        batch(&b, NOW).unwrap();
        b.windows[0].digests[0].clients = vec![client(2), client(2)];
        assert_eq!(field_of(&b), "windows[0].digests[0].clients");
        b.windows[0].digests[0].clients = vec![client(u64::MAX), client(2)];
        assert_eq!(field_of(&b), "windows[0].digests[0].clients");
    }

    #[test]
    fn checks_measurements() {
        let mut b = good();
        b.windows[0].probes.as_mut().unwrap().attached_fraction = 1.5;
        assert_eq!(field_of(&b), "windows[0].probes.attached_fraction");
        let mut b = good();
        b.agent_windows[0].cost.as_mut().unwrap().cpu_cores = f64::NAN;
        assert_eq!(field_of(&b), "agent_windows[0].cost.cpu_cores");
        let mut b = good();
        b.agent_windows[0].host.as_mut().unwrap().cpu.as_mut().unwrap().iowait = -1.0;
        assert_eq!(field_of(&b), "agent_windows[0].host.cpu.iowait");
        let mut b = good();
        b.agent_windows[0].host.as_mut().unwrap().disks[0].device.clear();
        assert_eq!(field_of(&b), "agent_windows[0].host.disks[0].device");
        let mut b = good();
        b.agent_windows[0].window_start_unix_ms = NOW + 1;
        assert_eq!(field_of(&b), "agent_windows[0].window_end_unix_ms");
        let mut b = good();
        b.agent_windows.push(b.agent_windows[0].clone());
        assert_eq!(field_of(&b), "agent_windows[1]");
        let mut b = good();
        b.agent_windows[0].cost.as_mut().unwrap().cpu_cores = 1e300;
        assert_eq!(field_of(&b), "agent_windows[0].cost.cpu_cores");
        let mut b = good();
        b.windows[0].statements = 10;
        b.windows[0].probes.as_mut().unwrap().estimated_statements = 5;
        assert_eq!(field_of(&b), "windows[0].probes.estimated_statements");
        let mut b = good();
        b.windows[0].digests[0].estimated_count = 2;
        assert_eq!(field_of(&b), "windows[0].digests[0].estimated_count");
        // Older agents send none of these.
        let mut b = good();
        b.agent_windows.clear();
        b.windows[0].probes = None;
        batch(&b, NOW).unwrap();
    }

    fn field_of(b: &Batch) -> String {
        batch(b, NOW).unwrap_err().field
    }

    #[test]
    fn accepts_a_good_batch() {
        batch(&good(), NOW).unwrap();
    }

    #[test]
    fn names_the_field() {
        let mut b = good();
        b.agent.as_mut().unwrap().agent_id = "x".repeat(129);
        assert_eq!(field_of(&b), "agent.agent_id");
        let mut b = good();
        b.sequence = 0;
        assert_eq!(field_of(&b), "sequence");
        let mut b = good();
        b.windows[0].digests[0].min_ns = 400;
        assert_eq!(field_of(&b), "windows[0].digests[0].min_ns");
        let mut b = good();
        b.windows[0].digests[0].sum_ns = 200;
        assert_eq!(field_of(&b), "windows[0].digests[0].sum_ns");
        let mut b = good();
        b.windows[0].window_start_unix_ms = NOW + 1;
        assert_eq!(field_of(&b), "windows[0].window_end_unix_ms");
        let mut b = good();
        b.windows[0].window_start_unix_ms = NOW - 31 * 86_400_000;
        assert_eq!(field_of(&b), "windows[0].window_start_unix_ms");
        let mut b = good();
        b.windows[0].digests[0].histogram.as_mut().unwrap().buckets[1].count = 1;
        let err = batch(&b, NOW).unwrap_err();
        assert_eq!(err.field, "windows[0].digests[0].histogram.buckets");
        assert!(err.problem.contains("sum to 2"), "{err}");
        let mut b = good();
        b.windows[0].digests[0].histogram.as_mut().unwrap().buckets[1].index = 40;
        assert_eq!(field_of(&b), "windows[0].digests[0].histogram.buckets[1].index");
        let mut b = good();
        b.windows[0].digests[0].histogram.as_mut().unwrap().buckets[1].index = 496;
        assert_eq!(field_of(&b), "windows[0].digests[0].histogram.buckets[1].index");
        let mut b = good();
        b.windows[0].digests[0].histogram.as_mut().unwrap().scheme = 2;
        assert_eq!(field_of(&b), "windows[0].digests[0].histogram.scheme");
        let mut b = good();
        b.windows[0].digests[0].errors = 4;
        assert_eq!(field_of(&b), "windows[0].digests[0].errors");
        let mut b = good();
        b.windows[0].digests[0].error_codes[0].count = 2;
        assert_eq!(field_of(&b), "windows[0].digests[0].error_codes");
        let mut b = good();
        b.windows[0].instance.as_mut().unwrap().name.clear();
        assert_eq!(field_of(&b), "windows[0].instance.name");
        let mut b = good();
        b.windows[0].digests[0].sample = "x".repeat(MAX_TEXT + 1);
        assert_eq!(field_of(&b), "windows[0].digests[0].sample");
        let mut b = good();
        b.windows[0].digests = vec![DigestStats::default(); MAX_DIGESTS + 1];
        assert_eq!(field_of(&b), "windows[*].digests");
    }

    #[test]
    fn query_tags_and_exemplars_are_bounded_and_within_the_row() {
        use sqlbee_proto::v1::{TagCount, TagValue, TraceExemplar};
        let tagged = |values: Vec<(&str, u64)>, other: u64| TagCount {
            key: "controller".into(),
            values: values.into_iter().map(|(v, count)| TagValue { value: v.into(), count }).collect(),
            other,
        };
        let mut b = good();
        b.windows[0].digests[0].tags = vec![tagged(vec![("orders", 2)], 1)];
        b.windows[0].digests[0].exemplar =
            Some(TraceExemplar { trace_id: "ab".repeat(16), span_id: "cd".repeat(8), duration_ns: 300 });
        batch(&b, NOW).unwrap();
        let mut bad = b.clone();
        bad.windows[0].digests[0].tags = vec![tagged(vec![("orders", 2)], 2)];
        assert_eq!(field_of(&bad), "windows[0].digests[0].tags[0]");
        let mut bad = b.clone();
        bad.windows[0].digests[0].tags = vec![tagged(vec![("a", 1), ("a", 1)], 0)];
        assert_eq!(field_of(&bad), "windows[0].digests[0].tags[0].values[1].value");
        let mut bad = b.clone();
        bad.windows[0].digests[0].tags = vec![tagged(vec![], 0), tagged(vec![], 0)];
        assert_eq!(field_of(&bad), "windows[0].digests[0].tags[1].key");
        let mut bad = b.clone();
        bad.windows[0].digests[0].tags[0].key = "a key".into();
        assert_eq!(field_of(&bad), "windows[0].digests[0].tags[0].key");
        let mut bad = b.clone();
        bad.windows[0].digests[0].exemplar.as_mut().unwrap().trace_id = "0".repeat(32);
        assert_eq!(field_of(&bad), "windows[0].digests[0].exemplar.trace_id");
        let mut bad = b.clone();
        bad.windows[0].digests[0].exemplar.as_mut().unwrap().duration_ns = 301;
        assert_eq!(field_of(&bad), "windows[0].digests[0].exemplar.duration_ns");
    }

    #[test]
    fn a_digest_id_is_the_hash_of_its_text() {
        let mut b = good();
        b.windows[0].digests[0].digest_text = "SELECT ? FROM secrets".into();
        let refused = batch(&b, NOW).unwrap_err();
        assert_eq!(refused.field, "windows[0].digests[0].digest");
        assert!(refused.problem.contains(&format!("{:016x}", digest_id::of("SELECT ? FROM secrets"))), "{refused}");
        let mut b = good();
        b.windows[0].digests[0].digest = 0;
        assert_eq!(field_of(&b), "windows[0].digests[0].digest");
        b.windows[0].digests[0].digest_text = digest_id::OVERFLOW_TEXT.into();
        batch(&b, NOW).unwrap();
        let mut b = good();
        let mut l = lock_wait();
        l.digest = 7;
        b.windows[0].lock_waits = vec![l];
        assert_eq!(field_of(&b), "windows[0].lock_waits[0].digest");
        let mut l = lock_wait();
        (l.digest, l.digest_text) = (0, String::new());
        b.windows[0].lock_waits = vec![l];
        batch(&b, NOW).unwrap();
    }

    fn lock_wait() -> LockWait {
        LockWait {
            start_unix_ms: NOW - 5000,
            duration_ns: 120_000_000,
            class: "row_lock".into(),
            connection_id: 9,
            digest: digest_id::of("UPDATE t SET a = ? WHERE id = ?"),
            digest_text: "UPDATE t SET a = ? WHERE id = ?".into(),
            sample: "UPDATE t SET a = 1 WHERE id = 1".into(),
            blocker_kind: "candidates".into(),
            blockers: vec![sqlbee_proto::v1::Blocker {
                connection_id: 12,
                transaction: true,
                started_unix_ms: NOW - 9000,
                statements: vec!["SELECT * FROM t WHERE id = ? FOR UPDATE".into()],
            }],
        }
    }

    #[test]
    fn checks_lock_waits() {
        let with = |f: &dyn Fn(&mut LockWait)| {
            let mut b = good();
            let mut l = lock_wait();
            f(&mut l);
            b.windows[0].lock_waits = vec![lock_wait(), l];
            b
        };
        batch(&with(&|_| {}), NOW).unwrap();
        // Old agents send none.
        batch(&good(), NOW).unwrap();
        let at = "windows[0].lock_waits[1]";
        assert_eq!(field_of(&with(&|l| l.duration_ns = 0)), format!("{at}.duration_ns"));
        assert_eq!(field_of(&with(&|l| l.class.clear())), format!("{at}.class"));
        assert_eq!(field_of(&with(&|l| l.class = "x".repeat(MAX_WAIT_CLASS + 1))), format!("{at}.class"));
        batch(&with(&|l| l.class = "x".repeat(MAX_WAIT_CLASS)), NOW).unwrap();
        assert_eq!(field_of(&with(&|l| l.start_unix_ms = NOW + 2 * 3_600_000)), format!("{at}.start_unix_ms"));
        assert_eq!(field_of(&with(&|l| l.start_unix_ms = NOW - 31 * 86_400_000)), format!("{at}.start_unix_ms"));
        assert_eq!(field_of(&with(&|l| l.blocker_kind = "k".repeat(33))), format!("{at}.blocker_kind"));
        assert_eq!(field_of(&with(&|l| l.digest_text = "x".repeat(MAX_TEXT + 1))), format!("{at}.digest_text"));
        assert_eq!(field_of(&with(&|l| l.sample = "x".repeat(MAX_TEXT + 1))), format!("{at}.sample"));
        let blocker = lock_wait().blockers[0].clone();
        assert_eq!(
            field_of(&with(&|l| l.blockers = vec![blocker.clone(); MAX_BLOCKERS + 1])),
            format!("{at}.blockers")
        );
        batch(&with(&|l| l.blockers = vec![blocker.clone(); MAX_BLOCKERS]), NOW).unwrap();
        assert_eq!(
            field_of(&with(&|l| l.blockers[0].statements = vec!["SELECT ?".into(); MAX_BLOCKER_STATEMENTS + 1])),
            format!("{at}.blockers[0].statements")
        );
        assert_eq!(
            field_of(&with(&|l| l.blockers[0].statements.push("x".repeat(MAX_TEXT + 1)))),
            format!("{at}.blockers[0].statements[1]")
        );
        let mut b = good();
        b.windows[0].lock_waits = vec![lock_wait(); MAX_LOCK_WAITS + 1];
        assert_eq!(field_of(&b), "windows[0].lock_waits");
        b.windows[0].lock_waits.pop();
        batch(&b, NOW).unwrap();
    }

    #[test]
    fn checks_waits_and_error_messages() {
        fn waits_of(b: &mut Batch) -> &mut Vec<WaitStats> {
            &mut b.windows[0].digests[0].waits
        }
        // Old agents send neither.
        let mut b = good();
        waits_of(&mut b).clear();
        b.windows[0].digests[0].error_codes[0].sample_message.clear();
        batch(&b, NOW).unwrap();

        let mut b = good();
        waits_of(&mut b)[1].max_ns = 21;
        let err = batch(&b, NOW).unwrap_err();
        assert_eq!(err.field, "windows[0].digests[0].waits[1].max_ns");
        assert!(err.problem.contains("above sum_ns 20"), "{err}");
        let mut b = good();
        waits_of(&mut b)[1].class = "row_lock".into();
        let err = batch(&b, NOW).unwrap_err();
        assert_eq!(err.field, "windows[0].digests[0].waits[1].class");
        assert!(err.problem.contains("waits[0]"), "{err}");
        let mut b = good();
        waits_of(&mut b)[0].class.clear();
        assert_eq!(field_of(&b), "windows[0].digests[0].waits[0].class");
        let mut b = good();
        waits_of(&mut b)[0].class = "x".repeat(MAX_WAIT_CLASS + 1);
        assert_eq!(field_of(&b), "windows[0].digests[0].waits[0].class");
        let mut b = good();
        waits_of(&mut b)[0].class = "x".repeat(MAX_WAIT_CLASS);
        batch(&b, NOW).unwrap();
        let mut b = good();
        waits_of(&mut b)[0].statements = 4;
        assert_eq!(field_of(&b), "windows[0].digests[0].waits[0].statements");
        let mut b = good();
        *waits_of(&mut b) = (0..=MAX_WAITS)
            .map(|n| WaitStats { class: format!("c{n}"), sum_ns: 1, max_ns: 1, statements: 1 })
            .collect();
        assert_eq!(field_of(&b), "windows[0].digests[0].waits");
        waits_of(&mut b).pop();
        batch(&b, NOW).unwrap();
        // Unknown classes are not an error (readers treat them as other).
        let mut b = good();
        waits_of(&mut b)[0].class = "some_future_class".into();
        batch(&b, NOW).unwrap();

        let mut b = good();
        b.windows[0].digests[0].error_codes[0].sample_message = "x".repeat(MAX_ERROR_MESSAGE);
        batch(&b, NOW).unwrap();
        b.windows[0].digests[0].error_codes[0].sample_message.push('x');
        assert_eq!(field_of(&b), "windows[0].digests[0].error_codes[0].sample_message");
    }
}
