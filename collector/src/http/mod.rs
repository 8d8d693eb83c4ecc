//! The web UI and the same answers as JSON under `/api/`, served by the
//! collector on its own HTTP listener (`--http-listen`, default
//! 127.0.0.1:7879). Pages are HTML rendered here, with plots as inline SVG
//! (`svg`), so the binary carries the whole UI: no CDN, no npm, no
//! JavaScript library.
//!
//! Every page and endpoint reads through the Query service
//! (`query_api::QueryService`), called in process: the UI sees what `sqlbee
//! top` sees, with the same defaults and limits, and never reaches into a
//! store or into ingest. Reading needs a read token when tokens are
//! configured (`session`).
mod api;
mod html;
pub mod openapi;
mod page_error;
mod pages;
mod params;
mod routes;
pub(crate) mod server;
mod session;
mod svg;
mod turns;

use std::sync::Arc;

use sqlbee_proto::v1::{
    ActivityRequest, ActivityResponse, Annotation, AnnotationsRequest, DiffRequest, DiffResponse, Event, EventsRequest,
    HostsRequest, HostsResponse, InstanceInfo, InstancesRequest, LocksRequest, LocksResponse, LongStatementsRequest,
    LongStatementsResponse, PlansRequest, PlansResponse, ReplicationRequest, ReplicationResponse, SeriesRequest,
    SeriesResponse, TablesRequest, TablesResponse, TopRequest, TopResponse, TotalsRequest, TotalsResponse,
    query_server::Query,
};
use tokio::sync::Semaphore;
use tonic::{Request, Status};

pub use server::{HttpServer, HttpSettings};

use super::{
    annotate::AnnotateService,
    auth::Auth,
    query_api::{self, QueryService},
};

/// Store calls the UI makes at once. Each holds a blocking thread, and the
/// collector sizes its pool for these on top of ingest's and the gRPC
/// queries', so a busy page never takes a thread ingest needs.
pub const UI_QUERIES_IN_FLIGHT: usize = 2;

#[derive(Debug, thiserror::Error)]
pub enum HttpError {
    #[error("--http-listen {addr:?}: expected IP:PORT (127.0.0.1:7879) or `none`")]
    InvalidAddress { addr: String },
    #[error("cannot listen on {addr} for the web UI: {source} (choose another --http-listen, or `none`)")]
    Bind {
        addr: std::net::SocketAddr,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot read {path} for the web UI's TLS: {source}")]
    ReadFile {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("the web UI's TLS certificate or key in {path} is not usable PEM: {reason}")]
    Pem { path: String, reason: String },
    #[error("the web UI's TLS setup failed: {reason}")]
    Tls { reason: String },
}

/// What every request handler shares.
pub struct Ui {
    query: QueryService,
    /// Markers posted to `/api/annotations` (with an `annotate` token).
    annotate: AnnotateService,
    auth: Auth,
    sessions: session::Sessions,
    /// Served over TLS: cookies get `Secure`.
    secure: bool,
    gate: Arc<Semaphore>,
    /// One place at a time per reader.
    turns: turns::Turns,
    /// Host names answered besides IP addresses and `localhost`.
    hosts: Vec<String>,
    /// What the OTLP export did, per signal (None: no export).
    exports: Option<ExportStatusFn>,
}

/// What the OTLP export did for one signal since the collector started,
/// as the cost page shows it. The server reads it from the export, so no
/// page reaches past the query API into the export itself.
#[derive(Clone, Debug, Default)]
pub struct ExportStatus {
    pub signal: &'static str,
    pub requests: u64,
    pub items: u64,
    pub retries: u64,
    pub dropped_items: u64,
    pub skipped_steps: u64,
    /// The oldest step not yet sent begins here (ms since epoch); 0: not
    /// known yet.
    pub mark_unix_ms: i64,
}

pub type ExportStatusFn = Arc<dyn Fn() -> Vec<ExportStatus> + Send + Sync>;

impl Ui {
    pub fn new(query: QueryService, annotate: AnnotateService, auth: Auth, secure: bool) -> Ui {
        Ui {
            query,
            annotate,
            auth: auth.clone(),
            sessions: session::Sessions::new(auth),
            secure,
            gate: Arc::new(Semaphore::new(UI_QUERIES_IN_FLIGHT)),
            turns: turns::Turns::default(),
            hosts: Vec::new(),
            exports: None,
        }
    }

    /// Shows what the OTLP export did on the cost page.
    pub fn exporting(mut self, exports: ExportStatusFn) -> Ui {
        self.exports = Some(exports);
        self
    }

    pub(crate) fn exports(&self) -> Vec<ExportStatus> {
        self.exports.as_ref().map(|f| f()).unwrap_or_default()
    }

    /// Answers these host names too (`--http-host`).
    pub fn answering(mut self, hosts: Vec<String>) -> Ui {
        self.hosts = hosts;
        self
    }

    /// Whether a request's Host names this UI: an IP address, `localhost`
    /// or a configured name (any port). A name a page on another site
    /// resolved to this host is none of these (DNS rebinding).
    pub fn answers_host(&self, host: Option<&str>) -> bool {
        let Some(host) = host.map(str::trim).filter(|h| !h.is_empty()) else { return false };
        let name = match host.strip_prefix('[') {
            // [v6]:port
            Some(rest) => return rest.split(']').next().is_some_and(|ip| ip.parse::<std::net::Ipv6Addr>().is_ok()),
            None => host
                .rsplit_once(':')
                .map_or(host, |(name, port)| if port.bytes().all(|b| b.is_ascii_digit()) { name } else { host }),
        };
        let name = name.to_ascii_lowercase();
        name.parse::<std::net::Ipv4Addr>().is_ok()
            || name == "localhost"
            || name.parse::<std::net::Ipv6Addr>().is_ok()
            || self.hosts.contains(&name)
    }

    /// The UI over `query` without tokens, for tests that render pages in
    /// process.
    #[cfg(any(test, feature = "test-support"))]
    pub fn for_test(query: QueryService, annotate: AnnotateService) -> Ui {
        Ui::new(query, annotate, Auth::open(), false)
    }

    async fn ask<T, F>(&self, call: F) -> Result<T, Status>
    where
        F: Future<Output = Result<tonic::Response<T>, Status>>,
    {
        // The reader's turn first, then a place: a reader waiting for its
        // own previous call holds no place another reader could use.
        let turn = self.turns.take().await;
        let permit =
            self.gate.clone().acquire_owned().await.map_err(|_| Status::unavailable("the collector is stopping"))?;
        // Both are given back when the store work ends, not when the page
        // is given up: an abandoned page cannot pile up store calls.
        query_api::holding((turn, permit), call).await.map(tonic::Response::into_inner)
    }

    async fn top(&self, request: TopRequest) -> Result<TopResponse, Status> {
        self.ask(self.query.top(Request::new(request))).await
    }

    async fn series(&self, request: SeriesRequest) -> Result<SeriesResponse, Status> {
        self.ask(self.query.series(Request::new(request))).await
    }

    async fn instances(&self) -> Result<Vec<InstanceInfo>, Status> {
        Ok(self.ask(self.query.instances(Request::new(InstancesRequest {}))).await?.instances)
    }

    async fn long_statements(&self, request: LongStatementsRequest) -> Result<LongStatementsResponse, Status> {
        self.ask(self.query.long_statements(Request::new(request))).await
    }

    async fn replication(&self, request: ReplicationRequest) -> Result<ReplicationResponse, Status> {
        self.ask(self.query.replication(Request::new(request))).await
    }

    async fn activity(&self, request: ActivityRequest) -> Result<ActivityResponse, Status> {
        self.ask(self.query.activity(Request::new(request))).await
    }

    async fn diff(&self, request: DiffRequest) -> Result<DiffResponse, Status> {
        self.ask(self.query.diff(Request::new(request))).await
    }

    async fn events(&self, request: EventsRequest) -> Result<Vec<Event>, Status> {
        Ok(self.ask(self.query.events(Request::new(request))).await?.events)
    }

    async fn annotations(&self, request: AnnotationsRequest) -> Result<Vec<Annotation>, Status> {
        Ok(self.ask(self.query.annotations(Request::new(request))).await?.annotations)
    }

    async fn tables(&self, request: TablesRequest) -> Result<TablesResponse, Status> {
        self.ask(self.query.tables(Request::new(request))).await
    }

    async fn plans(&self, request: PlansRequest) -> Result<PlansResponse, Status> {
        self.ask(self.query.plans(Request::new(request))).await
    }

    async fn locks(&self, request: LocksRequest) -> Result<LocksResponse, Status> {
        self.ask(self.query.locks(Request::new(request))).await
    }

    async fn hosts(&self, request: HostsRequest) -> Result<HostsResponse, Status> {
        self.ask(self.query.hosts(Request::new(request))).await
    }

    async fn totals(&self, request: TotalsRequest) -> Result<TotalsResponse, Status> {
        self.ask(self.query.totals(Request::new(request))).await
    }
}

pub type Shared = Arc<Ui>;

/// The HTML of the page at `path` with the query string `query`, as a
/// signed-in request would get it (tests that render pages in process).
#[cfg(any(test, feature = "test-support"))]
pub async fn page_for_test(ui: &Ui, path: &str, query: &str) -> String {
    let params = params::Params::parse(query);
    let now = sqlbee_vocabulary::clock::now_unix_ms();
    let view = params::View::from(&params, now).expect("a valid view");
    match pages::render(ui, path, &view, &params, now, false).await {
        Some(Ok(html)) => html,
        Some(Err(e)) => panic!("{path}?{query}: {e:?}"),
        None => panic!("no page at {path}"),
    }
}
