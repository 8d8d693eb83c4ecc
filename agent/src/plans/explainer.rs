//! The thread that asks servers for plans. It picks, per server, which
//! digest to explain next (a new digest first, then one whose latency or
//! rows examined per statement moved, then the costliest ones when their
//! plan is due again), paces itself to the configured rate, and keeps one
//! connection per server, reopened with back-off when it fails.
//!
//! EXPLAIN goes through a prepared statement, so a sample can never carry
//! a second statement in with it, and EXPLAIN never runs its statement.
//! Where the schema holds a `sqlbee_explain(statement)` procedure (the
//! least-privilege set-up the manual shows) the agent calls that instead.
use std::{
    collections::{BTreeSet, HashMap, VecDeque, hash_map::Entry},
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, Ordering},
        mpsc::{Receiver, RecvTimeoutError, SyncSender, TrySendError, sync_channel},
    },
    thread,
    time::{Duration, Instant, SystemTime},
};

use mysql::prelude::Queryable;
use tracing::{debug, info, warn};

use super::{
    Explained, LoginState, PlanConfig, PlanRecord, ValueWants,
    indexes::{IndexReading, Indexes},
    plan, quoted,
    settings::Settings,
};
use crate::{
    aggregate::{ChangeRecord, OVERFLOW_DIGEST, RawSample, WindowReport},
    normalize::{ChangeKind, Samples, Tables, redact},
    server_login::{ServerLogin, describe},
};

/// Digests remembered per server, and the bytes of their raw samples;
/// past either, the least recently offered go.
const MAX_KNOWN: usize = 10_000;
const MAX_KNOWN_BYTES: usize = 8 << 20;
/// Digests waiting for an EXPLAIN per server.
const MAX_QUEUED: usize = 1_000;
/// The costliest digests of each window whose plans are kept fresh.
const TOP_DIGESTS: usize = 10;
/// A change in mean latency or rows examined per statement by this factor
/// (either way) asks for the plan again.
const CHANGE_FACTOR: f64 = 2.0;
/// Statements a window must hold before its figures count as a change.
const MIN_STATEMENTS: u64 = 5;
/// Back-off of a failing login: from the first to the last.
const FIRST_RETRY: Duration = Duration::from_secs(1);
const LAST_RETRY: Duration = Duration::from_secs(300);
/// What one EXPLAIN may take, in the server and on the socket.
const EXPLAIN_TIMEOUT: Duration = Duration::from_secs(5);
/// A server no window mentioned for this long is forgotten.
const FORGET_AFTER: Duration = Duration::from_secs(600);
/// How long a prepared statement's digest waits for a sample with the
/// values it ran with before it is recorded as having none.
const VALUES_PATIENCE: Duration = Duration::from_secs(300);

/// The handle the pipeline holds.
pub struct Explainer {
    /// The login's user: digests only it ran are the agent's own
    /// statements (its activity reads), never worth a plan.
    own_user: String,
    offers: SyncSender<Vec<Offer>>,
    done: Arc<Mutex<Explained>>,
    stop: Arc<AtomicBool>,
    thread: Option<thread::JoinHandle<()>>,
}

/// One instance's digests from one closed window.
struct Offer {
    instance: String,
    pid: u32,
    digests: Vec<Candidate>,
    /// The window's changes of settings, to pair with their values, and
    /// of schemas, whose tables' indexes are read again.
    changes: Vec<ChangeRecord>,
    /// The tables its digests touch (schema, table).
    tables: BTreeSet<(String, String)>,
}

struct Candidate {
    schema: Option<Arc<str>>,
    digest: u64,
    raw: RawSample,
    count: u64,
    sum_ns: u64,
    rows_examined: u64,
}

impl Explainer {
    /// `wants` carries the servers whose prepared statements wait for
    /// their values to the probe stage, and its answer back.
    pub fn start(config: PlanConfig, wants: Arc<ValueWants>) -> std::io::Result<Explainer> {
        let (offers, rx) = sync_channel(4);
        let done = Arc::new(Mutex::new(Explained::default()));
        let stop = Arc::new(AtomicBool::new(false));
        let own_user = config.login.user.clone();
        let worker = Worker { config, servers: HashMap::new(), done: done.clone(), wants };
        let thread_stop = stop.clone();
        let thread = thread::Builder::new().name("explain".into()).spawn(move || worker.run(rx, &thread_stop))?;
        Ok(Explainer { own_user, offers, done, stop, thread: Some(thread) })
    }

    /// Hands the closed windows' digests over, without waiting: when the
    /// thread is behind, this window's offer is skipped (the next one
    /// carries the same digests again).
    pub fn offer(&self, reports: &[WindowReport]) {
        let offers: Vec<Offer> = reports
            .iter()
            .map(|report| Offer {
                instance: report.instance.clone(),
                pid: report.summary.pid,
                digests: report
                    .digests
                    .iter()
                    .filter(|row| !row.lineage.nested && row.digest != OVERFLOW_DIGEST)
                    .filter(|row| {
                        let own: u64 =
                            row.accounts.iter().filter(|(a, _)| a.user == self.own_user).map(|(_, n)| n).sum();
                        own < row.count
                    })
                    .filter_map(|row| {
                        Some(Candidate {
                            schema: row.schema.clone(),
                            digest: row.digest,
                            raw: row.raw_sample.clone()?,
                            count: row.count,
                            sum_ns: row.sum_ns,
                            rows_examined: row.stats.rows_examined,
                        })
                    })
                    .collect(),
                changes: report
                    .changes
                    .iter()
                    .filter(|c| matches!(c.kind, ChangeKind::Setting | ChangeKind::Schema))
                    .cloned()
                    .collect(),
                tables: tables_touched(report),
            })
            .collect();
        match self.offers.try_send(offers) {
            Ok(()) | Err(TrySendError::Full(_)) => {}
            Err(TrySendError::Disconnected(_)) => warn!("the explain thread is gone; no more plans"),
        }
    }

    /// Plans finished since the last call, and each instance's login state.
    pub fn take(&self) -> Explained {
        let mut done = self.done.lock().unwrap_or_else(|e| e.into_inner());
        Explained {
            plans: std::mem::take(&mut done.plans),
            logins: done.logins.clone(),
            explains: std::mem::take(&mut done.explains),
            explain_ns: std::mem::take(&mut done.explain_ns),
            changes: std::mem::take(&mut done.changes),
            indexes: std::mem::take(&mut done.indexes),
        }
    }

    /// Plans for instances without a window this time go back, for the next.
    pub fn put_back(&self, plans: Vec<PlanRecord>) {
        if !plans.is_empty() {
            let mut done = self.done.lock().unwrap_or_else(|e| e.into_inner());
            done.plans.splice(0..0, plans);
        }
    }
}

impl Drop for Explainer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// Why a digest waits for an EXPLAIN.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Reason {
    New,
    Changed,
    Refresh,
}

/// A digest as the explainer knows it.
struct Known {
    raw: RawSample,
    /// Mean latency and rows examined per statement in the latest window
    /// that held enough statements (or the first one).
    latest: (f64, f64),
    last_offered: Instant,
    queued: bool,
    last: Option<LastExplain>,
    /// Since when its sample is a prepared statement's text still waiting
    /// for one with its values.
    awaiting_values: Option<Instant>,
}

struct LastExplain {
    at: Instant,
    hash: u64,
    mean_ns: f64,
    rows_per_statement: f64,
}

type DigestKey = (Option<Arc<str>>, u64);

struct Server {
    pid: u32,
    last_offered: Instant,
    conn: Option<mysql::Conn>,
    retry_at: Instant,
    backoff: Duration,
    warning: Option<String>,
    known: HashMap<DigestKey, Known>,
    /// Bytes of the raw samples in `known`.
    known_bytes: usize,
    queue: VecDeque<(DigestKey, Reason)>,
    next_explain: Instant,
    /// Whether each schema holds a `sqlbee_explain` procedure the login
    /// may run (else EXPLAIN is run directly).
    procedures: HashMap<Arc<str>, bool>,
    /// EXPLAINs sent to the server (statements the agent can tell apart
    /// without asking cost nothing and do not count against the rate).
    asked: u64,
    settings: Settings,
    indexes: Indexes,
}

impl Server {
    fn new(pid: u32, now: Instant) -> Server {
        Server {
            pid,
            last_offered: now,
            conn: None,
            retry_at: now,
            backoff: FIRST_RETRY,
            warning: None,
            known: HashMap::new(),
            known_bytes: 0,
            queue: VecDeque::new(),
            next_explain: now,
            procedures: HashMap::new(),
            asked: 0,
            settings: Settings::default(),
            indexes: Indexes::default(),
        }
    }

    fn enqueue(&mut self, key: DigestKey, reason: Reason) {
        let Some(known) = self.known.get_mut(&key) else { return };
        if known.queued || self.queue.len() >= MAX_QUEUED {
            return;
        }
        known.queued = true;
        // New digests go first: they have no plan at all yet.
        if reason == Reason::New {
            self.queue.push_front((key, reason));
        } else {
            self.queue.push_back((key, reason));
        }
    }

    /// Takes one window's digests in and queues what needs a plan.
    fn take_offer(&mut self, offer: Offer, config: &PlanConfig, now: Instant) {
        if offer.pid != self.pid {
            // A restarted server: a new connection, and its schemas may
            // have changed.
            self.pid = offer.pid;
            self.conn = None;
            self.retry_at = now;
            self.backoff = FIRST_RETRY;
            self.procedures.clear();
            self.settings.forget();
            self.indexes.forget();
        }
        self.last_offered = now;
        self.settings.offer(&offer.changes, now);
        self.indexes.offer(&offer.tables, &offer.changes, now);
        let mut by_time: Vec<(u64, DigestKey)> = Vec::new();
        for candidate in offer.digests {
            let key = (candidate.schema.clone(), candidate.digest);
            let count = candidate.count.max(1) as f64;
            let figures = (candidate.sum_ns as f64 / count, candidate.rows_examined as f64 / count);
            let incoming = candidate.raw.text.len();
            if !self.known.contains_key(&key)
                && (self.known.len() >= MAX_KNOWN || self.known_bytes + incoming > MAX_KNOWN_BYTES)
            {
                self.forget_oldest();
                if self.known_bytes + incoming > MAX_KNOWN_BYTES {
                    continue;
                }
            }
            let known = match self.known.entry(key.clone()) {
                Entry::Occupied(entry) => {
                    let known = entry.into_mut();
                    // A sample with its values stays until another comes.
                    if candidate.raw.bound || !known.raw.bound {
                        self.known_bytes = self.known_bytes - known.raw.text.len() + incoming;
                        known.raw = candidate.raw;
                    }
                    known
                }
                Entry::Vacant(entry) => {
                    self.known_bytes += incoming;
                    entry.insert(Known {
                        raw: candidate.raw,
                        latest: figures,
                        last_offered: now,
                        queued: false,
                        last: None,
                        awaiting_values: None,
                    })
                }
            };
            known.last_offered = now;
            by_time.push((candidate.sum_ns, key.clone()));
            let values_arrived = known.raw.bound && known.awaiting_values.take().is_some();
            let reason = match &known.last {
                _ if values_arrived => Some(Reason::New),
                None => Some(Reason::New),
                Some(last) if candidate.count >= MIN_STATEMENTS && now.duration_since(last.at) >= config.recheck => {
                    (moved(figures.0, last.mean_ns) || moved(figures.1, last.rows_per_statement))
                        .then_some(Reason::Changed)
                }
                Some(_) => None,
            };
            if candidate.count >= MIN_STATEMENTS {
                known.latest = figures;
            }
            if let Some(reason) = reason {
                self.enqueue(key, reason);
            }
        }
        by_time.sort_by_key(|a| std::cmp::Reverse(a.0));
        for (_, key) in by_time.into_iter().take(TOP_DIGESTS) {
            let due = self.known[&key].last.as_ref().is_some_and(|l| now.duration_since(l.at) >= config.refresh);
            if due {
                self.enqueue(key, Reason::Refresh);
            }
        }
    }

    fn forget_oldest(&mut self) {
        let cutoff = self.known.values().map(|k| k.last_offered).min();
        if let Some(cutoff) = cutoff {
            self.known.retain(|_, k| k.last_offered > cutoff || k.queued);
        }
        self.known_bytes = self.known.values().map(|k| k.raw.text.len()).sum();
    }
}

/// Schemas whose tables are the server's own: their indexes are no
/// DBA's to change.
const SYSTEM_SCHEMAS: &[&str] = &["information_schema", "performance_schema", "mysql", "sys"];

/// The tables a window's digests read or write, with the digest's schema
/// where the statement named none, of digests with a statement that
/// succeeded.
fn tables_touched(report: &WindowReport) -> BTreeSet<(String, String)> {
    let mut out = BTreeSet::new();
    // A digest whose every statement failed may name a table that is not
    // there: asking for its indexes would only add errors.
    for row in report.digests.iter().filter(|row| row.errors < row.count) {
        let Some(Tables::Known { tables, .. }) = row.tables.as_deref() else { continue };
        for t in tables {
            let schema = if t.schema.is_empty() { row.schema.as_deref().unwrap_or_default() } else { &t.schema };
            if !schema.is_empty() && !SYSTEM_SCHEMAS.iter().any(|s| schema.eq_ignore_ascii_case(s)) {
                out.insert((schema.to_string(), t.table.clone()));
            }
        }
    }
    out
}

/// Whether a figure moved by `CHANGE_FACTOR` either way.
fn moved(now: f64, before: f64) -> bool {
    let (low, high) = if now < before { (now, before) } else { (before, now) };
    high > 0.0 && (low <= 0.0 || high / low >= CHANGE_FACTOR)
}

struct Worker {
    config: PlanConfig,
    servers: HashMap<String, Server>,
    done: Arc<Mutex<Explained>>,
    wants: Arc<ValueWants>,
}

/// What went wrong with one EXPLAIN.
enum Failure {
    /// The connection is unusable (refused, wrong password, server gone):
    /// a warning on the instance and a retry later; the digest waits.
    Login(String),
    /// This statement gets no plan (a grant missing for its tables, a
    /// statement EXPLAIN cannot take); recorded as the reason.
    Statement { reason: String, warning: Option<String> },
    /// A prepared statement's text, without the values it ran with: it
    /// waits for a sample that has them.
    NeedsValues,
}

impl Worker {
    fn run(mut self, offers: Receiver<Vec<Offer>>, stop: &AtomicBool) {
        let gap = Duration::from_secs_f64(1.0 / self.config.explain_rate);
        while !stop.load(Ordering::Relaxed) {
            let now = Instant::now();
            match offers.recv_timeout(Duration::from_millis(50)) {
                Ok(batch) => {
                    for offer in batch {
                        let server =
                            self.servers.entry(offer.instance.clone()).or_insert_with(|| Server::new(offer.pid, now));
                        server.take_offer(offer, &self.config, now);
                    }
                    self.servers.retain(|_, s| now.duration_since(s.last_offered) < FORGET_AFTER);
                }
                Err(RecvTimeoutError::Timeout) => {}
                Err(RecvTimeoutError::Disconnected) => return,
            }
            let instances: Vec<String> = self.servers.keys().cloned().collect();
            for instance in &instances {
                let Some(server) = self.servers.get_mut(instance) else { continue };
                if server.settings.due(now) && now >= server.retry_at {
                    let changes = read_settings(instance, server, &self.config, now);
                    let mut done = self.done.lock().unwrap_or_else(|e| e.into_inner());
                    done.changes.extend(changes.into_iter().map(|c| (instance.clone(), c)));
                    // The read may be the login's first use: its state is
                    // the instance's, as after an EXPLAIN.
                    let state = server.warning.clone().map_or(LoginState::Ok, LoginState::Warning);
                    done.logins.insert(instance.clone(), state);
                }
                let Some(server) = self.servers.get_mut(instance) else { continue };
                if server.indexes.due(now) && now >= server.retry_at {
                    let readings = read_indexes(instance, server, &self.config, now);
                    let mut done = self.done.lock().unwrap_or_else(|e| e.into_inner());
                    done.indexes.extend(readings.into_iter().map(|r| (instance.clone(), r)));
                }
            }
            for instance in instances {
                let Some(server) = self.servers.get_mut(&instance) else { continue };
                if server.queue.is_empty() || now < server.next_explain || now < server.retry_at {
                    continue;
                }
                let asked = server.asked;
                let values_unavailable = self.wants.unavailable(server.pid);
                let record = explain_next(&instance, server, &self.config, values_unavailable);
                let mut done = self.done.lock().unwrap_or_else(|e| e.into_inner());
                if server.asked != asked {
                    server.next_explain = now + gap;
                    let state = server.warning.clone().map_or(LoginState::Ok, LoginState::Warning);
                    done.logins.insert(instance.clone(), state);
                    done.explains += 1;
                    done.explain_ns += record.as_ref().map_or(0, |(_, elapsed)| *elapsed);
                }
                if let Some((record, _)) = record {
                    done.plans.push(record);
                }
            }
            let mut done = self.done.lock().unwrap_or_else(|e| e.into_inner());
            done.logins.retain(|instance, _| self.servers.contains_key(instance));
            drop(done);
            let wanted = self
                .servers
                .values()
                .filter(|s| s.known.values().any(|k| k.awaiting_values.is_some()))
                .map(|s| s.pid)
                .collect();
            self.wants.want(wanted);
        }
    }
}

/// Explains the server's next queued digest; None when the login failed
/// (the digest stays first in line for the retry).
fn explain_next(
    instance: &str,
    server: &mut Server,
    config: &PlanConfig,
    values_unavailable: Option<&'static str>,
) -> Option<(PlanRecord, u64)> {
    let (key, reason) = server.queue.pop_front()?;
    let raw = server.known.get(&key)?.raw.clone();
    let started = Instant::now();
    let outcome = explain(server, &key.0, &raw, config);
    let elapsed = started.elapsed().as_nanos() as u64;
    let plan = match outcome {
        Ok(plan) => Ok(plan),
        Err(Failure::Login(warning)) => {
            if server.warning.as_ref() != Some(&warning) {
                warn!(instance, %warning, retry_in = ?server.backoff, "no plans from this server for now");
            }
            server.warning = Some(warning);
            server.conn = None;
            server.retry_at = Instant::now() + server.backoff;
            server.backoff = (server.backoff * 2).min(LAST_RETRY);
            server.queue.push_front((key, reason));
            return None;
        }
        Err(Failure::Statement { reason, warning }) => {
            if let Some(w) = warning {
                server.warning = Some(w);
            }
            Err(reason)
        }
        Err(Failure::NeedsValues) => {
            let known = server.known.get_mut(&key)?;
            known.queued = false;
            let since = *known.awaiting_values.get_or_insert_with(Instant::now);
            let waited = since.elapsed();
            let reason = match values_unavailable {
                Some(why) => format!("a prepared statement's text, and its values cannot be captured: {why}"),
                // Asked of the probe stage; a later window brings them.
                None if waited < VALUES_PATIENCE => return None,
                None => format!(
                    "a prepared statement's text, and no execution's values were caught in {} s",
                    waited.as_secs()
                ),
            };
            known.awaiting_values = None;
            Err(reason)
        }
    };
    let known = server.known.get_mut(&key)?;
    known.queued = false;
    let previous_hash = known.last.as_ref().map_or(0, |l| l.hash);
    let hash = plan.as_ref().map_or(0, |p| p.hash);
    debug!(instance, digest = key.1, ?reason, hash, previous_hash, "explained");
    // The figures later windows are compared with: those the plan ran under.
    known.last =
        Some(LastExplain { at: Instant::now(), hash, mean_ns: known.latest.0, rows_per_statement: known.latest.1 });
    let record = PlanRecord {
        instance: instance.to_string(),
        schema: key.0,
        digest: key.1,
        explained_at: SystemTime::now(),
        plan,
        previous_hash,
        explain_ns: elapsed,
    };
    Some((record, elapsed))
}

/// Statements EXPLAIN takes, by their first word.
const EXPLAINABLE: [&str; 6] = ["SELECT", "WITH", "UPDATE", "DELETE", "INSERT", "REPLACE"];

/// The statement's first word, upper case, past comments and parentheses.
fn first_word(text: &str) -> String {
    let mut rest = text.trim_start();
    loop {
        rest = rest.trim_start_matches(|c: char| c.is_whitespace() || c == '(');
        if let Some(comment) = rest.strip_prefix("/*") {
            rest = comment.split_once("*/").map_or("", |(_, after)| after);
        } else if rest.starts_with("--") || rest.starts_with('#') {
            rest = rest.split_once('\n').map_or("", |(_, after)| after);
        } else {
            break;
        }
    }
    rest.chars().take_while(|c| c.is_ascii_alphabetic()).collect::<String>().to_ascii_uppercase()
}

/// Whether the text holds a `?` outside quotes and comments.
fn has_placeholder(text: &str) -> bool {
    let bytes = text.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            quote @ (b'\'' | b'"' | b'`') => {
                i += 1;
                while i < bytes.len() && bytes[i] != quote {
                    i += if bytes[i] == b'\\' { 2 } else { 1 };
                }
            }
            b'/' if bytes.get(i + 1) == Some(&b'*') => {
                i = text[i + 2..].find("*/").map_or(bytes.len(), |end| i + 2 + end + 1);
            }
            b'#' => i = text[i..].find('\n').map_or(bytes.len(), |end| i + end),
            b'-' if bytes.get(i + 1) == Some(&b'-') => i = text[i..].find('\n').map_or(bytes.len(), |end| i + end),
            b'?' => return true,
            _ => {}
        }
        i += 1;
    }
    false
}

fn explain(
    server: &mut Server,
    schema: &Option<Arc<str>>,
    raw: &RawSample,
    config: &PlanConfig,
) -> Result<plan::Plan, Failure> {
    let not = |reason: String| Failure::Statement { reason, warning: None };
    let text = std::str::from_utf8(&raw.text).map_err(|_| not("the statement's text is not UTF-8".into()))?;
    let word = first_word(text);
    if !EXPLAINABLE.contains(&word.as_str()) {
        return Err(not(format!("EXPLAIN does not take {} statements", if word.is_empty() { "these" } else { &word })));
    }
    // A sample with `?` placeholders is a prepared statement's text: its
    // values are not in it.
    if has_placeholder(text) {
        return Err(Failure::NeedsValues);
    }
    server.asked += 1;
    let known_procedure = schema.as_ref().and_then(|s| server.procedures.get(s).copied());
    let conn = connection(server, &config.login)?;
    // Only a routine the login may run is listed to it.
    let procedure = match (schema, known_procedure) {
        (None, _) => false,
        (Some(_), Some(known)) => known,
        (Some(schema), None) => conn
            .exec_first::<u8, _, _>(
                "SELECT 1 FROM information_schema.ROUTINES WHERE ROUTINE_SCHEMA = ? AND ROUTINE_NAME = 'sqlbee_explain'",
                (schema.as_ref(),),
            )
            .map_err(|e| classify(e, "information_schema.ROUTINES"))?
            .is_some(),
    };
    let redact_plan = |s: &str| match config.samples {
        Samples::Raw if !redact::carries_secret(raw.text.as_ref()) => s.to_string(),
        _ => redact::statement(s.as_bytes()),
    };
    let answer = match schema {
        // The procedure runs in its own schema, which is the statement's:
        // the login needs no right to use the schema itself.
        Some(schema) if procedure => conn
            .exec_first::<String, _, _>(format!("CALL {}.sqlbee_explain(?)", quoted(schema)), (text,))
            .map_err(|e| classify(e, "sqlbee_explain")),
        _ => explain_directly(conn, schema, text),
    };
    if let Some(schema) = schema {
        server.procedures.insert(schema.clone(), procedure);
    }
    let answer = answer?;
    let answer = answer.ok_or_else(|| not("EXPLAIN answered no rows".into()))?;
    plan::from_explain(&answer, &redact_plan).map_err(|e| not(e.to_string()))
}

/// EXPLAIN in the statement's schema, with the login's own rights.
fn explain_directly(conn: &mut mysql::Conn, schema: &Option<Arc<str>>, text: &str) -> Result<Option<String>, Failure> {
    if let Some(schema) = schema {
        conn.select_db(schema).map_err(|e| classify(e, &format!("schema {schema}")))?;
    }
    conn.exec_first::<String, _, _>(format!("EXPLAIN FORMAT=JSON {text}"), ()).map_err(|e| classify(e, "EXPLAIN"))
}

/// What changed in the server's settings since the last read; nothing
/// when the login fails (the read comes again with the next EXPLAIN's
/// retry) or the read does.
fn read_settings(instance: &str, server: &mut Server, config: &PlanConfig, now: Instant) -> Vec<ChangeRecord> {
    over_login(
        instance,
        server,
        config,
        now,
        |s| &mut s.settings,
        "SHOW GLOBAL VARIABLES",
        |settings, conn| settings.read(conn, now),
    )
}

/// The indexes of the tables due for a read; nothing when the login
/// fails (read again with the retry).
fn read_indexes(instance: &str, server: &mut Server, config: &PlanConfig, now: Instant) -> Vec<IndexReading> {
    over_login(instance, server, config, now, |s| &mut s.indexes, "SHOW INDEX", |indexes, conn| indexes.read(conn, now))
}

/// One read over the login with the state `part` of the server keeps for
/// it; nothing when the login or the read fails (`login_failed`).
fn over_login<S: Default, T>(
    instance: &str,
    server: &mut Server,
    config: &PlanConfig,
    now: Instant,
    part: fn(&mut Server) -> &mut S,
    what: &str,
    read: impl FnOnce(&mut S, &mut mysql::Conn) -> Result<Vec<T>, mysql::Error>,
) -> Vec<T> {
    let mut state = std::mem::take(part(server));
    let outcome = match connection(server, &config.login) {
        Ok(conn) => read(&mut state, conn).map_err(|e| classify(e, what)),
        Err(failure) => Err(failure),
    };
    *part(server) = state;
    outcome.unwrap_or_else(|failure| {
        login_failed(instance, server, failure, now);
        Vec::new()
    })
}

/// A read over the login (settings, indexes) failed: a lost connection is
/// the instance's warning and waits for the back-off; a refused statement
/// is only logged.
fn login_failed(instance: &str, server: &mut Server, failure: Failure, now: Instant) {
    match failure {
        Failure::Login(warning) => {
            if server.warning.as_ref() != Some(&warning) {
                warn!(instance, %warning, retry_in = ?server.backoff, "no plans or settings from this server for now");
            }
            server.warning = Some(warning);
            server.conn = None;
            server.retry_at = now + server.backoff;
            server.backoff = (server.backoff * 2).min(LAST_RETRY);
        }
        Failure::Statement { reason, .. } => debug!(pid = server.pid, %reason, "a read over the login failed"),
        Failure::NeedsValues => {}
    }
}

/// The open connection to the server, or a new one.
fn connection<'a>(server: &'a mut Server, login: &ServerLogin) -> Result<&'a mut mysql::Conn, Failure> {
    if server.conn.as_mut().is_some_and(|c| c.ping().is_ok()) {
        return Ok(server.conn.as_mut().expect("checked above"));
    }
    let (mut conn, address) = login.connect(server.pid, EXPLAIN_TIMEOUT).map_err(Failure::Login)?;
    // MariaDB's bound on a statement's time; MySQL has none for EXPLAIN and
    // answers with an error, which changes nothing.
    let _ = conn.query_drop(format!("SET SESSION max_statement_time = {}", EXPLAIN_TIMEOUT.as_secs()));
    if server.warning.take().is_some() {
        info!(pid = server.pid, %address, "logged in to the server; plans resume");
    }
    server.backoff = FIRST_RETRY;
    Ok(server.conn.insert(conn))
}

/// Which kind of failure an error is.
fn classify(error: mysql::Error, what: &str) -> Failure {
    let described = describe(&error);
    match error {
        // Missing grants: the statement gets no plan and the instance says why.
        mysql::Error::MySqlError(e) if [1044, 1142, 1143, 1227, 1370].contains(&e.code) => Failure::Statement {
            reason: format!("{what}: {described}"),
            warning: Some(format!("the login lacks a grant: {described}")),
        },
        mysql::Error::MySqlError(_) => Failure::Statement { reason: format!("{what}: {described}"), warning: None },
        _ => Failure::Login(format!("the server went away during {what}: {described}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn first_words_past_comments() {
        assert_eq!(first_word("  /* app */ select 1"), "SELECT");
        assert_eq!(first_word("-- x\n(SELECT 1) UNION (SELECT 2)"), "SELECT");
        assert_eq!(first_word("CALL p()"), "CALL");
        assert_eq!(first_word(""), "");
    }

    #[test]
    fn placeholders_outside_quotes_only() {
        assert!(has_placeholder("SELECT * FROM t WHERE id = ?"));
        assert!(!has_placeholder("SELECT '?', \"a?\", `q?` FROM t /* ? */ WHERE a = 'it\\'s?' -- ?\n"));
        assert!(has_placeholder("SELECT 'x' FROM t WHERE a = ? # ?"));
    }

    fn config() -> PlanConfig {
        PlanConfig {
            login: ServerLogin { user: "u".into(), password: "p".into() },
            explain_rate: 1.0,
            refresh: Duration::from_secs(3600),
            recheck: Duration::from_secs(60),
            samples: Samples::Redacted,
        }
    }

    /// (digest, statements, sum_ns, rows examined, raw bytes)
    fn offer(digests: &[(u64, u64, u64, u64, usize)]) -> Offer {
        Offer {
            instance: "db:3306".into(),
            pid: 1,
            digests: digests
                .iter()
                .map(|&(digest, count, sum_ns, rows_examined, bytes)| Candidate {
                    schema: None,
                    digest,
                    raw: RawSample { text: vec![b'x'; bytes].into(), bound: false },
                    count,
                    sum_ns,
                    rows_examined,
                })
                .collect(),
            changes: Vec::new(),
            tables: BTreeSet::new(),
        }
    }

    fn explained(server: &mut Server, at: Instant) {
        while let Some((key, _)) = server.queue.pop_front() {
            let known = server.known.get_mut(&key).unwrap();
            known.queued = false;
            known.last = Some(LastExplain { at, hash: 7, mean_ns: known.latest.0, rows_per_statement: known.latest.1 });
        }
    }

    fn queued(server: &Server) -> Vec<(u64, Reason)> {
        server.queue.iter().map(|((_, digest), reason)| (*digest, *reason)).collect()
    }

    #[test]
    fn new_digests_then_moved_figures_then_the_costliest_when_due() {
        let (config, now) = (config(), Instant::now());
        let mut server = Server::new(1, now);
        server.take_offer(offer(&[(1, 10, 1_000, 20_000, 10), (2, 10, 9_000, 10, 10)]), &config, now);
        assert_eq!(queued(&server), [(2, Reason::New), (1, Reason::New)]);
        explained(&mut server, now);
        let later = now + Duration::from_secs(120);
        server.take_offer(offer(&[(1, 10, 1_100, 21_000, 10), (2, 10, 9_000, 10, 10)]), &config, later);
        assert!(queued(&server).is_empty(), "nothing moved twofold");
        // An index: rows examined per statement fall from 2,000 to 1.
        server.take_offer(offer(&[(1, 10, 900, 10, 10)]), &config, later);
        assert_eq!(queued(&server), [(1, Reason::Changed)]);
        explained(&mut server, later);
        let due = later + config.refresh;
        server.take_offer(offer(&[(1, 10, 900, 10, 10), (2, 10, 9_000, 10, 10)]), &config, due);
        assert_eq!(queued(&server), [(2, Reason::Refresh), (1, Reason::Refresh)], "the costliest first");
    }

    #[test]
    fn raw_samples_are_bounded_in_bytes() {
        let (config, now) = (config(), Instant::now());
        let mut server = Server::new(1, now);
        let big = MAX_KNOWN_BYTES / 2 + 1;
        server.take_offer(offer(&[(1, 1, 1, 1, big), (2, 1, 1, 1, big)]), &config, now);
        assert_eq!(server.known.len(), 1, "the second would pass the bound");
        assert!(server.known_bytes <= MAX_KNOWN_BYTES);
        explained(&mut server, now);
        server.take_offer(offer(&[(3, 1, 1, 1, big)]), &config, now + Duration::from_secs(1));
        assert_eq!(server.known.keys().map(|k| k.1).collect::<Vec<_>>(), [3], "the least recently offered went");
        assert_eq!(server.known_bytes, big);
    }

    #[test]
    fn a_change_is_a_factor_either_way() {
        assert!(moved(2000.0, 1.0) && moved(1.0, 2000.0));
        assert!(!moved(1.5, 1.0) && !moved(0.0, 0.0));
        assert!(moved(3.0, 0.0));
    }
}
