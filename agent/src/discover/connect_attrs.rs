//! What a client says it is: the connection attributes it sent at connect
//! (`program_name`, `_client_name`, `_client_version`, `_pid`). MariaDB and
//! MySQL keep them only in `performance_schema.session_connect_attrs`, so
//! reading them needs `performance_schema=ON` and the optional login
//! (`--server-login`) with `SELECT` on that one table.
//!
//! Read once per connection, on a thread of its own (`AttrAsker`), never
//! on the drain's: the server scans every connection's attributes to answer
//! (about 5 us per open connection: 5 ms at 1,000), so the connections
//! asked for meanwhile are batched into one query, and queries are spaced
//! at least `MIN_GAP` and twenty times the last one's time apart, which
//! keeps what they cost the server under a twentieth of a core in a
//! connection storm. Every wait is bounded (`TIMEOUT`), a failed login or
//! a missing grant is retried with back-off, and a server without
//! performance_schema is not asked again: a connection named meanwhile
//! simply has no program.
use std::{
    collections::{HashMap, HashSet},
    sync::mpsc::{Receiver, Sender, TryRecvError, channel},
    thread,
    time::{Duration, Instant},
};

use mysql::prelude::Queryable;
use tracing::{info, warn};

use crate::{
    normalize::tags,
    server_login::{ServerLogin, describe},
};

/// Each wait on the server (connect, query): the naming round waits on it.
const TIMEOUT: Duration = Duration::from_millis(250);
const FIRST_RETRY: Duration = Duration::from_secs(1);
const LAST_RETRY: Duration = Duration::from_secs(300);
/// Connections named in a query's list; past this, one query reads every
/// connection's attributes (the server scans them all either way).
const MAX_LISTED: usize = 256;
/// The shortest time between two queries.
const MIN_GAP: Duration = Duration::from_millis(50);
/// ... and the last query's time, times this.
const GAP_PER_QUERY_TIME: u32 = 20;

/// What a connection's client sent about itself; each `None` where it sent
/// nothing.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ConnectAttrs {
    /// `program_name`: what the application calls itself.
    pub program: Option<String>,
    /// `_client_name` and `_client_version`: the client library.
    pub driver: Option<String>,
    /// `_pid`: the client's pid on its own host.
    pub pid: Option<u32>,
}

/// The connections of one request and what the server said of each it
/// still held (an absent one sent nothing, has closed, or the server was
/// not asked: see the log).
pub type Answer = (Vec<u64>, HashMap<u64, ConnectAttrs>);

/// An `AttrReader` on a thread of its own: requests go in, answers come
/// back, and neither side ever waits for the other. The thread ends when
/// the asker is dropped.
pub struct AttrAsker {
    requests: Sender<Vec<u64>>,
    answers: Receiver<Answer>,
}

impl AttrAsker {
    pub fn start(login: ServerLogin, server_pid: u32) -> std::io::Result<Self> {
        let (requests, asked) = channel();
        let (answer, answers) = channel();
        let reader = AttrReader::new(login, server_pid);
        thread::Builder::new()
            .name(format!("client-attrs-{server_pid}"))
            .spawn(move || serve(reader, asked, answer))?;
        Ok(Self { requests, answers })
    }

    /// Asks for `connections`; false when the thread is gone.
    pub fn ask(&self, connections: Vec<u64>) -> bool {
        self.requests.send(connections).is_ok()
    }

    /// The answers so far; `None` when the thread is gone.
    pub fn answers(&self) -> Option<Vec<Answer>> {
        let mut out = Vec::new();
        loop {
            match self.answers.try_recv() {
                Ok(answer) => out.push(answer),
                Err(TryRecvError::Empty) => return Some(out),
                Err(TryRecvError::Disconnected) => return (!out.is_empty()).then_some(out),
            }
        }
    }
}

fn serve(mut reader: AttrReader, asked: Receiver<Vec<u64>>, answers: Sender<Answer>) {
    let mut next_query = Instant::now();
    while let Ok(mut connections) = asked.recv() {
        // Whatever is asked while the gap runs joins this query.
        thread::sleep(next_query.saturating_duration_since(Instant::now()));
        while let Ok(more) = asked.try_recv() {
            connections.extend(more);
        }
        let started = Instant::now();
        let said = reader.read(&connections);
        next_query = Instant::now() + MIN_GAP.max(started.elapsed() * GAP_PER_QUERY_TIME);
        if answers.send((connections, said)).is_err() {
            return;
        }
    }
}

/// Why attributes are not read from a server.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Off {
    /// Asked again at `retry_at`.
    Failing { reason: String, retry_at: Instant, backoff: Duration },
    /// performance_schema is OFF: not asked again (a restart of the server
    /// is a new attach).
    NoPerformanceSchema,
}

/// Reads the connection attributes of one server's connections.
pub struct AttrReader {
    login: ServerLogin,
    server_pid: u32,
    conn: Option<mysql::Conn>,
    off: Option<Off>,
}

impl AttrReader {
    pub fn new(login: ServerLogin, server_pid: u32) -> Self {
        Self { login, server_pid, conn: None, off: None }
    }

    /// The attributes of `connections` (connection ids) the server holds;
    /// a connection missing from the answer sent none, or has closed.
    pub fn read(&mut self, connections: &[u64]) -> HashMap<u64, ConnectAttrs> {
        let mut out = HashMap::new();
        if connections.is_empty() || !self.may_ask() {
            return out;
        }
        let listed = (connections.len() <= MAX_LISTED).then_some(connections);
        match self.query(listed) {
            Ok(rows) => {
                let wanted: HashSet<u64> = connections.iter().copied().collect();
                for (connection, name, value) in rows.into_iter().filter(|(c, ..)| wanted.contains(c)) {
                    take(out.entry(connection).or_default(), &name, &value);
                }
            }
            Err(reason) => self.fail(reason),
        }
        out
    }

    fn may_ask(&mut self) -> bool {
        match &self.off {
            None => true,
            Some(Off::NoPerformanceSchema) => false,
            Some(Off::Failing { retry_at, .. }) => Instant::now() >= *retry_at,
        }
    }

    fn fail(&mut self, reason: String) {
        self.conn = None;
        let backoff = match &self.off {
            Some(Off::Failing { backoff, .. }) => (*backoff * 2).min(LAST_RETRY),
            _ => FIRST_RETRY,
        };
        if !matches!(&self.off, Some(Off::Failing { reason: r, .. }) if *r == reason) {
            warn!(pid = self.server_pid, %reason, retry_in_s = backoff.as_secs(), "no connection attributes (client programs)");
        }
        self.off = Some(Off::Failing { reason, retry_at: Instant::now() + backoff, backoff });
    }

    /// (connection, attribute, value) rows for the `listed` connections,
    /// or for all.
    fn query(&mut self, listed: Option<&[u64]>) -> Result<Vec<(u64, String, String)>, String> {
        let conn = self.connection()?;
        let only = match listed {
            Some(ids) => {
                let ids: Vec<String> = ids.iter().map(u64::to_string).collect();
                format!("PROCESSLIST_ID IN ({}) AND ", ids.join(","))
            }
            None => String::new(),
        };
        let sql = format!(
            "SELECT PROCESSLIST_ID, ATTR_NAME, ATTR_VALUE FROM performance_schema.session_connect_attrs \
             WHERE {only}ATTR_NAME IN ('program_name', '_client_name', '_client_version', '_pid')"
        );
        conn.query::<(u64, String, Option<String>), _>(sql)
            .map(|rows| rows.into_iter().map(|(c, n, v)| (c, n, v.unwrap_or_default())).collect())
            .map_err(|e| match &e {
                mysql::Error::MySqlError(m) if [1142, 1143].contains(&m.code) => {
                    format!("the login lacks SELECT on performance_schema.session_connect_attrs: {}", describe(&e))
                }
                _ => format!("reading performance_schema.session_connect_attrs failed: {}", describe(&e)),
            })
    }

    /// The open connection, or a new one.
    fn connection(&mut self) -> Result<&mut mysql::Conn, String> {
        if self.conn.is_none() {
            let conn = self.open()?;
            self.conn = Some(conn);
        }
        self.conn.as_mut().ok_or_else(|| "no connection".to_string())
    }

    /// A new connection, checked for performance_schema.
    fn open(&mut self) -> Result<mysql::Conn, String> {
        let (mut conn, address) = self.login.connect(self.server_pid, TIMEOUT)?;
        let on: Option<u64> = conn
            .query_first("SELECT @@performance_schema")
            .map_err(|e| format!("login works, but {}", describe(&e)))?;
        if on != Some(1) {
            warn!(
                pid = self.server_pid,
                "performance_schema is OFF on this server: it keeps no connection attributes, so clients \
                 have no program (start the server with performance_schema=ON to have them)"
            );
            self.off = Some(Off::NoPerformanceSchema);
            return Err("performance_schema is OFF".into());
        }
        if self.off.take().is_some() {
            info!(pid = self.server_pid, %address, "reading connection attributes again");
        }
        Ok(conn)
    }
}

/// One attribute row into what it says.
fn take(attrs: &mut ConnectAttrs, name: &str, value: &str) {
    // A pid is a number, not a literal: kept as it is, or not at all.
    if name == "_pid" {
        attrs.pid = value.trim().parse().ok().filter(|p| *p != 0);
        return;
    }
    let value = clean(value);
    if value.is_empty() {
        return;
    }
    match name {
        "program_name" => attrs.program = Some(value),
        "_client_name" => {
            let version = attrs.driver.take().unwrap_or_default();
            attrs.driver = Some(join(&value, &version));
        }
        // A version before its name: held in `driver` until the name comes.
        "_client_version" => {
            let name = attrs.driver.take().unwrap_or_default();
            attrs.driver = Some(join(&name, &value));
        }
        _ => {}
    }
}

fn join(name: &str, version: &str) -> String {
    match (name.is_empty(), version.is_empty()) {
        (false, false) => format!("{name} {version}"),
        (true, _) => version.to_string(),
        (false, true) => name.to_string(),
    }
}

/// A client-chosen string as a name: redacted and bounded as query tag
/// values are (it may hold anything).
fn clean(value: &str) -> String {
    tags::redact(value.trim())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn attrs(rows: &[(&str, &str)]) -> ConnectAttrs {
        let mut a = ConnectAttrs::default();
        for (name, value) in rows {
            take(&mut a, name, value);
        }
        a
    }

    #[test]
    fn attributes_in_any_order_make_one_client() {
        let expected =
            ConnectAttrs { program: Some("orders".into()), driver: Some("libmariadb 3.3.8".into()), pid: Some(4242) };
        let rows = [("_client_name", "libmariadb"), ("_client_version", "3.3.8"), ("program_name", "orders")];
        assert_eq!(attrs(&[rows[0], rows[1], rows[2], ("_pid", "4242"), ("_os", "Linux")]), expected);
        assert_eq!(attrs(&[("_pid", "4242"), rows[2], rows[1], rows[0]]), expected);
        assert_eq!(attrs(&[("_client_name", "pymysql")]).driver.as_deref(), Some("pymysql"));
        assert_eq!(attrs(&[("_pid", "x"), ("program_name", " ")]), ConnectAttrs::default());
    }

    #[test]
    fn a_program_name_is_redacted_and_bounded() {
        assert_eq!(attrs(&[("program_name", "ops@example.com")]).program.as_deref(), Some("?"));
        assert_eq!(attrs(&[("program_name", "job-4111111111111111")]).program.as_deref(), Some("job-?"));
        let long = "a".repeat(1000);
        assert!(attrs(&[("program_name", &long)]).program.unwrap().len() <= tags::MAX_VALUE_LEN);
    }
}
