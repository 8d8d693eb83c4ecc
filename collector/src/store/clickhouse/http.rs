//! The one door to ClickHouse: its HTTP interface, blocking, through
//! `ureq`. Statements go in the POST body; an INSERT names its table and
//! columns in the URL and carries `RowBinary` rows in the body. Values are
//! bound here, on the client side (`quote`), because 18.16 reads unknown
//! URL parameters as settings. Every call sends `wait_end_of_query=1` so
//! that an error arrives as a non-200 answer, never in the middle of rows.
//!
//! The password travels only in the `X-ClickHouse-Key` header: no URL,
//! log line or error carries it.
use std::{
    io::Read as _,
    sync::{
        Arc, Mutex, RwLock,
        atomic::{AtomicUsize, Ordering},
    },
    time::Duration,
};

/// What a call to ClickHouse failed with.
#[derive(Debug, thiserror::Error)]
pub enum HttpError {
    #[error("cannot reach ClickHouse at {url}: {source}")]
    Transport {
        url: String,
        #[source]
        source: Box<ureq::Error>,
    },
    #[error("ClickHouse at {url} answered {status}: {message}")]
    Server { url: String, status: u16, message: String },
    #[error(transparent)]
    Ca(#[from] crate::ca_file::CaFileError),
    #[error("the request this read served was cancelled")]
    Cancelled,
    #[error("the rows for {table} do not name the same columns: {problem} (a bug in the collector)")]
    Columns { table: String, problem: String },
}

impl HttpError {
    /// ClickHouse's own error code (`Code: N.`), when it gave one.
    pub fn code(&self) -> Option<u32> {
        let HttpError::Server { message, .. } = self else { return None };
        let rest = message.split("Code: ").nth(1)?;
        rest.split(|c: char| !c.is_ascii_digit()).next()?.parse().ok()
    }

    /// A server that cannot be reached, or a replica that cannot write now:
    /// another server of the same data may answer.
    pub fn is_unreachable(&self) -> bool {
        matches!(self, HttpError::Transport { .. }) || self.code().is_some_and(|c| REPLICA_UNAVAILABLE.contains(&c))
    }

    /// A full disk (NOT_ENOUGH_SPACE) or an exceeded quota or memory limit:
    /// nothing an agent can fix by changing its batch.
    pub fn is_full(&self) -> bool {
        matches!(self.code(), Some(243 | 201 | 241))
    }
}

/// Seconds a request's read may run on the server: the gRPC deadline.
const READ_DEADLINE_S: &str = "120";

/// How to reach the server: base URLs (`http://host:port/`), credentials
/// and the database queries run in. Several bases are servers that answer
/// alike (a cluster's nodes for reads, one shard's replicas for writes):
/// a call goes to the one that answered last and moves on to the next when
/// it cannot be reached (see `Client::post`).
#[derive(Clone)]
pub struct Endpoint {
    pub bases: Vec<String>,
    pub user: Option<String>,
    pub password: Option<String>,
    /// PEM CA certificates to trust instead of the built-in roots.
    pub ca: Option<std::path::PathBuf>,
}

impl std::fmt::Debug for Endpoint {
    // The password is left out on purpose.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Endpoint").field("bases", &self.bases).field("user", &self.user).finish_non_exhaustive()
    }
}

pub struct Client {
    agent: ureq::Agent,
    endpoint: Endpoint,
    /// Unqualified table names resolve here; None before it exists.
    database: Option<String>,
    /// Settings every call carries (URL parameters).
    settings: Vec<(&'static str, String)>,
    /// The servers, `endpoint.bases` to begin with; clones share them, and
    /// a node that could not be placed when the store opened joins its
    /// shard's client later (`add_base`).
    bases: Arc<RwLock<Vec<String>>>,
    /// The base that answered last; clones share it.
    at: Arc<AtomicUsize>,
    spare: Arc<Spare>,
}

/// Answer buffers kept between calls. A rollup pass reads answers of
/// megabytes, and growing a fresh buffer for each cost a page fault per
/// page and a copy per doubling: a fifth of the collector's CPU while
/// rollups ran beside the ingest.
#[derive(Default)]
struct Spare(Mutex<Vec<Vec<u8>>>);

/// How many buffers are kept, and the largest kept: one outsized answer
/// does not pin its memory for good.
const SPARE_BUFFERS: usize = 4;
const SPARE_MAX_BYTES: usize = 16 << 20;

impl Spare {
    fn take(&self) -> Vec<u8> {
        self.0.lock().ok().and_then(|mut kept| kept.pop()).unwrap_or_default()
    }

    fn give_back(&self, mut bytes: Vec<u8>) {
        if bytes.capacity() == 0 || bytes.capacity() > SPARE_MAX_BYTES {
            return;
        }
        bytes.clear();
        if let Ok(mut kept) = self.0.lock()
            && kept.len() < SPARE_BUFFERS
        {
            kept.push(bytes);
        }
    }
}

/// Long enough for a large prune or a scan of a week; a hung server still
/// ends the call.
const TIMEOUT: Duration = Duration::from_secs(300);

/// A server that does not take a connection within this is taken for
/// gone, and the next base is tried.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// ClickHouse's codes for a replica that cannot take writes now (read-only
/// without ZooKeeper, ZooKeeper errors): another replica may.
const REPLICA_UNAVAILABLE: [u32; 3] = [242, 225, 999];

impl Client {
    pub fn new(endpoint: Endpoint, database: Option<String>) -> Result<Client, HttpError> {
        let mut tls = ureq::tls::TlsConfig::builder();
        if let Some(path) = &endpoint.ca {
            tls = tls.root_certs(crate::ca_file::roots(path)?);
        }
        let agent = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .timeout_global(Some(TIMEOUT))
            .timeout_connect(Some(CONNECT_TIMEOUT))
            .tls_config(tls.build())
            .build()
            .new_agent();
        let bases = Arc::new(RwLock::new(endpoint.bases.clone()));
        Ok(Client { agent, endpoint, database, settings: Vec::new(), bases, at: Arc::default(), spare: Arc::default() })
    }

    pub fn with_database(&self, database: &str) -> Client {
        Client {
            agent: self.agent.clone(),
            endpoint: self.endpoint.clone(),
            database: Some(database.to_string()),
            settings: self.settings.clone(),
            bases: self.bases.clone(),
            at: self.at.clone(),
            spare: self.spare.clone(),
        }
    }

    /// This client with its own bases (a subset of this one's servers),
    /// remembering which answered apart from this one.
    pub fn with_bases(&self, bases: Vec<String>) -> Client {
        Client {
            agent: self.agent.clone(),
            endpoint: self.endpoint.clone(),
            database: self.database.clone(),
            settings: self.settings.clone(),
            bases: Arc::new(RwLock::new(bases)),
            at: Arc::default(),
            spare: self.spare.clone(),
        }
    }

    /// This client with a setting every call carries.
    pub fn with_setting(&self, name: &'static str, value: &str) -> Client {
        let mut out = self.with_bases(Vec::new());
        (out.bases, out.at) = (self.bases.clone(), self.at.clone());
        out.settings.push((name, value.to_string()));
        out
    }

    pub fn bases(&self) -> Vec<String> {
        self.bases.read().map(|b| b.clone()).unwrap_or_default()
    }

    /// Adds a server to this client and its clones (a replica found late),
    /// once.
    pub fn add_base(&self, base: &str) {
        if let Ok(mut bases) = self.bases.write()
            && !bases.iter().any(|b| b == base)
        {
            bases.push(base.to_string());
        }
    }

    /// Sends to the base that answered last, and to the next one while a
    /// base cannot be reached or is a replica that cannot write now. A
    /// statement sent twice this way is safe: reads and DDL (`IF NOT
    /// EXISTS`) are idempotent, and an INSERT that reached a replicated
    /// table before its answer was lost is dropped by the shard's own
    /// insert deduplication (the same rows make the same block).
    fn post(&self, query_in_url: Option<&str>, select: bool, body: &[u8]) -> Result<Vec<u8>, HttpError> {
        let all = self.bases();
        let bases = all.len().max(1);
        let first = self.at.load(Ordering::Relaxed);
        let mut tried = 0;
        loop {
            let at = (first + tried) % bases;
            match self.post_to(&all[at], query_in_url, select, body) {
                Err(e) if tried + 1 < bases && e.is_unreachable() => {
                    tracing::warn!(error = %e, next = %all[(at + 1) % bases], "trying the next ClickHouse server");
                    tried += 1;
                }
                answer => {
                    if answer.is_ok() {
                        self.at.store(at, Ordering::Relaxed);
                    }
                    return answer;
                }
            }
        }
    }

    fn post_to(&self, url: &str, query_in_url: Option<&str>, select: bool, body: &[u8]) -> Result<Vec<u8>, HttpError> {
        let mut request = self.agent.post(url);
        for (name, value) in &self.settings {
            request = request.query(*name, value);
        }
        if let Some(database) = &self.database {
            request = request.query("database", database);
        }
        if let Some(query) = query_in_url {
            request = request.query("query", query);
        }
        // DDL too: a distributed one streams each node's status, and an
        // error must arrive as a non-200 answer, not in the middle of it.
        request = request.query("wait_end_of_query", "1");
        if select {
            // A read for a request (not the rollup pass) stops on the
            // server when the request's deadline would have passed anyway.
            if crate::store::cancel::in_scope() {
                request = request.query("max_execution_time", READ_DEADLINE_S);
            }
        }
        if let Some(user) = &self.endpoint.user {
            request = request.header("X-ClickHouse-User", user);
        }
        if let Some(password) = &self.endpoint.password {
            request = request.header("X-ClickHouse-Key", password);
        }
        let transport = |source: ureq::Error| HttpError::Transport { url: url.to_string(), source: Box::new(source) };
        let mut response = request.send(body).map_err(transport)?;
        let status = response.status().as_u16();
        let mut bytes = self.spare.take();
        response
            .body_mut()
            .with_config()
            .limit(u64::MAX)
            .reader()
            .read_to_end(&mut bytes)
            .map_err(|e| transport(ureq::Error::from(e)))?;
        if status != 200 {
            let mut message = String::from_utf8_lossy(&bytes).trim().to_string();
            if message.len() > 2000 {
                let mut cut = 2000;
                while !message.is_char_boundary(cut) {
                    cut -= 1;
                }
                message.truncate(cut);
                message.push_str("...");
            }
            return Err(HttpError::Server { url: url.to_string(), status, message });
        }
        #[cfg(test)]
        recording::sent(self.database.as_deref(), query_in_url, body, select.then_some(bytes.len()));
        Ok(bytes)
    }

    /// A statement that returns nothing (DDL, ALTER).
    pub fn execute(&self, sql: &str) -> Result<(), HttpError> {
        tracing::trace!(sql, "clickhouse execute");
        self.post(None, false, sql.as_bytes()).map(|answer| self.spare.give_back(answer))
    }

    /// A SELECT answered in `RowBinary`. A read whose request was given
    /// up is not sent: a reader that went away does not keep ClickHouse
    /// busy with the rest of its statements.
    pub fn select(&self, sql: &str) -> Result<Rows, HttpError> {
        if crate::store::cancel::cancelled() {
            return Err(HttpError::Cancelled);
        }
        tracing::trace!(sql, "clickhouse select");
        let body = format!("{sql}\nFORMAT RowBinary");
        Ok(Rows { bytes: self.post(None, true, body.as_bytes())?, at: 0, spare: Some(self.spare.clone()) })
    }

    /// Inserts `rows` (RowBinary, in `columns` order) into `table`.
    /// Inserts `rows` into the columns they named (`RowWriter::col`).
    pub fn insert(&self, table: &str, rows: &RowWriter) -> Result<(), HttpError> {
        if rows.count == 0 {
            return Ok(());
        }
        let columns = rows.columns().map_err(|problem| HttpError::Columns { table: table.to_string(), problem })?;
        let query = format!("INSERT INTO {table} ({columns}) FORMAT RowBinary");
        self.post(Some(&query), false, &rows.bytes).map(|answer| self.spare.give_back(answer))
    }
}

/// What the store sent, for a test that replays its SQL on a current
/// ClickHouse (`chdb`): each statement 18.16 took, in order, with the
/// database it ran in, an INSERT's rows and a SELECT's answer length. Test
/// builds only, and only on a thread that asked for it, so the collector
/// never pays for it.
#[cfg(test)]
pub mod recording {
    use std::cell::RefCell;

    #[derive(Clone, Debug)]
    pub struct Sent {
        pub database: Option<String>,
        /// The statement; for a SELECT with its `FORMAT RowBinary`.
        pub sql: String,
        /// An INSERT's rows, in `RowBinary`.
        pub rows: Option<Vec<u8>>,
        /// A SELECT's answer, in bytes.
        pub answer_len: Option<usize>,
    }

    thread_local! {
        static SENT: RefCell<Option<Vec<Sent>>> = const { RefCell::new(None) };
    }

    /// Records what this thread sends from now on.
    pub fn start() {
        SENT.with(|s| *s.borrow_mut() = Some(Vec::new()));
    }

    /// What this thread sent since `start`, and stops recording.
    pub fn take() -> Vec<Sent> {
        SENT.with(|s| s.borrow_mut().take().unwrap_or_default())
    }

    pub(super) fn sent(database: Option<&str>, query_in_url: Option<&str>, body: &[u8], answer_len: Option<usize>) {
        SENT.with(|s| {
            if let Some(sent) = s.borrow_mut().as_mut() {
                let (sql, rows) = match query_in_url {
                    Some(query) => (query.to_string(), Some(body.to_vec())),
                    None => (String::from_utf8_lossy(body).into_owned(), None),
                };
                sent.push(Sent { database: database.map(str::to_string), sql, rows, answer_len });
            }
        });
    }
}

/// A string literal for ClickHouse SQL: quoted, with `\` and `'` escaped
/// (ClickHouse reads backslash escapes in literals).
pub fn quote(value: &str) -> String {
    let mut out = String::with_capacity(value.len() + 2);
    out.push('\'');
    for c in value.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\'' => out.push_str("\\'"),
            '\0' => out.push_str("\\0"),
            c => out.push(c),
        }
    }
    out.push('\'');
    out
}

/// Rows in ClickHouse's `RowBinary` format: integers little-endian,
/// strings and arrays behind a LEB128 length, Nullable behind one flag byte.
#[derive(Default)]
pub struct RowWriter {
    bytes: Vec<u8>,
    count: usize,
    /// The columns of every row, in the order each row names them: the
    /// INSERT's column list, so a value and its column cannot part.
    columns: Vec<&'static str>,
    /// Columns named so far in the row being written.
    at: usize,
    /// A row that named other columns than the first did (a bug); the
    /// insert refuses rather than put values under the wrong columns.
    drift: Option<String>,
}

impl RowWriter {
    /// Names the column the next value goes to. The first row's names are
    /// the columns; every later row must name the same, in order.
    pub fn col(&mut self, name: &'static str) -> &mut Self {
        if self.count == 0 && self.at == self.columns.len() {
            self.columns.push(name);
        } else if self.columns.get(self.at) != Some(&name) && self.drift.is_none() {
            self.drift = Some(format!(
                "row {} names column {name:?} where the first named {:?}",
                self.count + 1,
                self.columns.get(self.at)
            ));
        }
        self.at += 1;
        self
    }

    /// Marks the end of a row (only counted: RowBinary has no separator).
    pub fn end_row(&mut self) {
        if self.at != self.columns.len() && self.drift.is_none() {
            self.drift = Some(format!(
                "row {} has {} columns where the first had {}",
                self.count + 1,
                self.at,
                self.columns.len()
            ));
        }
        self.at = 0;
        self.count += 1;
    }

    /// The INSERT's column list, as the rows named them.
    pub fn columns(&self) -> Result<String, String> {
        match &self.drift {
            Some(drift) => Err(drift.clone()),
            None => Ok(self.columns.join(", ")),
        }
    }

    pub fn len(&self) -> usize {
        self.count
    }

    /// Forgets the rows but keeps the buffer, up to `keep` bytes of it.
    pub fn clear(&mut self, keep: usize) {
        self.bytes.clear();
        self.bytes.shrink_to(keep);
        self.count = 0;
        self.at = 0;
        self.columns.clear();
        self.drift = None;
    }

    pub fn u8(&mut self, v: u8) -> &mut Self {
        self.bytes.push(v);
        self
    }

    pub fn u32(&mut self, v: u32) -> &mut Self {
        self.bytes.extend_from_slice(&v.to_le_bytes());
        self
    }

    pub fn u64(&mut self, v: u64) -> &mut Self {
        self.bytes.extend_from_slice(&v.to_le_bytes());
        self
    }

    pub fn i64(&mut self, v: i64) -> &mut Self {
        self.bytes.extend_from_slice(&v.to_le_bytes());
        self
    }

    pub fn f64(&mut self, v: f64) -> &mut Self {
        self.bytes.extend_from_slice(&v.to_le_bytes());
        self
    }

    fn len_prefix(&mut self, mut n: usize) {
        while n >= 0x80 {
            self.bytes.push((n as u8) | 0x80);
            n >>= 7;
        }
        self.bytes.push(n as u8);
    }

    pub fn bytes(&mut self, v: &[u8]) -> &mut Self {
        self.len_prefix(v.len());
        self.bytes.extend_from_slice(v);
        self
    }

    /// A String column of `len` bytes that `write` appends in place (an
    /// encoded message, without a buffer of its own).
    pub fn encoded(&mut self, len: usize, write: impl FnOnce(&mut Vec<u8>)) -> &mut Self {
        self.len_prefix(len);
        let start = self.bytes.len();
        write(&mut self.bytes);
        debug_assert_eq!(self.bytes.len() - start, len, "the length written ahead of an encoding");
        self
    }

    /// A message encoded as a String column, empty for none.
    pub fn message<M: prost::Message>(&mut self, m: Option<&M>) -> &mut Self {
        match m {
            // A Vec grows to any length, so encoding into one cannot fail.
            Some(m) => self.encoded(m.encoded_len(), |out| {
                let _ = m.encode(out);
            }),
            None => self.bytes(&[]),
        }
    }

    pub fn str(&mut self, v: &str) -> &mut Self {
        self.bytes(v.as_bytes())
    }

    pub fn opt_u64(&mut self, v: Option<u64>) -> &mut Self {
        match v {
            Some(v) => self.u8(0).u64(v),
            None => self.u8(1),
        }
    }

    pub fn array<T>(&mut self, items: &[T], mut each: impl FnMut(&mut Self, &T)) -> &mut Self {
        self.len_prefix(items.len());
        for item in items {
            each(self, item);
        }
        self
    }
}

/// A `RowBinary` answer, read column by column in the SELECT's order.
pub struct Rows {
    bytes: Vec<u8>,
    at: usize,
    /// Where the buffer goes back when the answer has been read.
    spare: Option<Arc<Spare>>,
}

impl Drop for Rows {
    fn drop(&mut self) {
        if let Some(spare) = self.spare.take() {
            spare.give_back(std::mem::take(&mut self.bytes));
        }
    }
}

/// The answer was shorter than its columns or held a bad length: a bug or
/// a server that answered in another format.
#[derive(Debug, thiserror::Error)]
#[error("ClickHouse's RowBinary answer ended early or is malformed at byte {at}")]
pub struct Malformed {
    pub at: usize,
}

impl Rows {
    pub fn done(&self) -> bool {
        self.at >= self.bytes.len()
    }

    fn take(&mut self, n: usize) -> Result<&[u8], Malformed> {
        let end = self.at.checked_add(n).filter(|&end| end <= self.bytes.len()).ok_or(Malformed { at: self.at })?;
        let out = &self.bytes[self.at..end];
        self.at = end;
        Ok(out)
    }

    fn fixed<const N: usize>(&mut self) -> Result<[u8; N], Malformed> {
        let at = self.at;
        self.take(N)?.try_into().map_err(|_| Malformed { at })
    }

    pub fn u8(&mut self) -> Result<u8, Malformed> {
        Ok(self.fixed::<1>()?[0])
    }

    pub fn u32(&mut self) -> Result<u32, Malformed> {
        Ok(u32::from_le_bytes(self.fixed()?))
    }

    pub fn u64(&mut self) -> Result<u64, Malformed> {
        Ok(u64::from_le_bytes(self.fixed()?))
    }

    pub fn i64(&mut self) -> Result<i64, Malformed> {
        Ok(i64::from_le_bytes(self.fixed()?))
    }

    pub fn f64(&mut self) -> Result<f64, Malformed> {
        Ok(f64::from_le_bytes(self.fixed()?))
    }

    fn len_prefix(&mut self) -> Result<usize, Malformed> {
        let mut value = 0usize;
        for shift in (0..64).step_by(7) {
            let byte = self.u8()?;
            value |= usize::from(byte & 0x7f).checked_shl(shift).ok_or(Malformed { at: self.at })?;
            if byte & 0x80 == 0 {
                return Ok(value);
            }
        }
        Err(Malformed { at: self.at })
    }

    pub fn bytes(&mut self) -> Result<Vec<u8>, Malformed> {
        let n = self.len_prefix()?;
        Ok(self.take(n)?.to_vec())
    }

    pub fn string(&mut self) -> Result<String, Malformed> {
        let at = self.at;
        String::from_utf8(self.bytes()?).map_err(|_| Malformed { at })
    }

    pub fn array<T>(&mut self, mut each: impl FnMut(&mut Self) -> Result<T, Malformed>) -> Result<Vec<T>, Malformed> {
        let n = self.len_prefix()?;
        if n > self.bytes.len() - self.at {
            return Err(Malformed { at: self.at });
        }
        (0..n).map(|_| each(self)).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quoting_escapes_what_ends_a_literal() {
        assert_eq!(quote("a'b\\c"), r"'a\'b\\c'");
        assert_eq!(quote(""), "''");
    }

    #[test]
    fn rows_name_their_columns_and_a_row_that_names_others_is_refused() {
        let mut w = RowWriter::default();
        for n in 0..3 {
            w.col("a").u64(n).col("b").str("x");
            w.end_row();
        }
        assert_eq!(w.columns().unwrap(), "a, b");
        w.col("a").u64(3).col("c").str("y");
        w.end_row();
        assert!(w.columns().unwrap_err().contains("\"c\""), "{:?}", w.columns());
        w.clear(0);
        w.col("a").u64(1);
        w.end_row();
        assert_eq!(w.columns().unwrap(), "a", "a cleared writer learns its columns again");
        w.col("a").u64(1).col("b").u64(2);
        w.end_row();
        assert!(w.columns().unwrap_err().contains("\"b\""), "a column the first row did not have");
    }

    #[test]
    fn row_binary_round_trip() {
        let mut w = RowWriter::default();
        w.u64(u64::MAX).i64(-5).str("hé").opt_u64(None).opt_u64(Some(7)).array(&[1u32, 300], |w, v| {
            w.u32(*v);
        });
        w.bytes(&[0xff; 200]);
        let mut r = Rows { bytes: w.bytes.clone(), at: 0, spare: None };
        assert_eq!(r.u64().unwrap(), u64::MAX);
        assert_eq!(r.i64().unwrap(), -5);
        assert_eq!(r.string().unwrap(), "hé");
        assert_eq!((r.u8().unwrap(), r.u8().unwrap(), r.u64().unwrap()), (1, 0, 7));
        assert_eq!(r.array(|r| r.u32()).unwrap(), vec![1, 300]);
        assert_eq!(r.bytes().unwrap().len(), 200);
        assert!(r.done());
        assert!(r.u8().is_err());
    }
}
