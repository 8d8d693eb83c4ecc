//! The fleet collector: receives agents' batches over gRPC (Ingest),
//! validates and stores them exactly once, answers Top/Instances/Totals
//! (Query) and forgets data past the retention. Owns its own tokio runtime.
//! It depends on the wire, the figures and the shared vocabulary, never on
//! the agent: no aya and no kernel type is anywhere in its build.
mod admission;
pub mod annotate;
mod auth;
mod ca_file;
mod decode_status;
pub(crate) mod detect;
pub mod holds;
pub mod http;
mod ingest;
mod live;
pub mod otlp;
mod ownership;
mod places;
pub mod query_api;
mod quota;
mod server;
pub mod store;
mod store_task;
mod throttle;
pub mod validate;

use std::{net::SocketAddr, path::PathBuf, sync::Arc, time::Duration};

use clap::builder::TypedValueParser;

pub use server::MAX_MESSAGE;
use tokio::signal::unix::{SignalKind, signal};

use sqlbee_vocabulary::{duration, error_chain};

use self::{
    auth::{Auth, AuthError},
    server::{Settings, Tls},
    store::StoreError,
};

#[derive(clap::Args, Debug, Clone)]
pub struct CollectorArgs {
    /// Address to listen on for gRPC (Ingest, Query, health).
    #[arg(long, env = "SQLBEE_COLLECTOR_LISTEN", default_value = "127.0.0.1:7878")]
    pub listen: SocketAddr,
    /// Where to store batches: `sqlite:PATH` (one collector; add
    /// `?synchronous=normal` to trade the last acknowledged batches on
    /// power loss for ingest rate), or `clickhouse://HOST:HTTP_PORT/DATABASE`
    /// (any number of collectors), with the options `user=U`,
    /// `password_file=PATH`, `tls=1`, `ca=PATH`, `rollup_settle_s=N` and
    /// `cluster=NAME` after a `?`, joined by `&`. With `cluster`, list the
    /// cluster's nodes: `clickhouse://HOST:PORT,HOST:PORT,.../DATABASE`.
    #[arg(long, env = "SQLBEE_COLLECTOR_STORE", default_value = "sqlite:./sqlbee-collector.db")]
    pub store: String,
    /// File of accepted bearer tokens, one per line (# comments):
    /// `TOKEN`, or `ingest|read|both TOKEN [agents=ID,ID]
    /// [instances=NAME,NAME]` to let a token only send batches (of those
    /// agents, of those instances) or only read. Reloaded on SIGHUP.
    /// Without it, no authentication.
    #[arg(long, env = "SQLBEE_COLLECTOR_TOKENS")]
    pub tokens: Option<PathBuf>,
    /// Server certificate (PEM); with --tls-key enables TLS.
    #[arg(long, env = "SQLBEE_COLLECTOR_TLS_CERT", requires = "tls_key")]
    pub tls_cert: Option<PathBuf>,
    /// Server private key (PEM).
    #[arg(long, env = "SQLBEE_COLLECTOR_TLS_KEY", requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,
    /// CA (PEM) that client certificates must be signed by: requires
    /// a client certificate from every caller (mTLS).
    #[arg(long, env = "SQLBEE_COLLECTOR_TLS_CLIENT_CA", requires = "tls_cert")]
    pub tls_client_ca: Option<PathBuf>,
    /// Keep raw windows (and lock waits, hosts and costs) this long (10s,
    /// 5m, 2h, 7d).
    #[arg(long, env = "SQLBEE_COLLECTOR_RETENTION", default_value = "7d", value_parser = duration::parse)]
    pub retention: Duration,
    /// Keep the one-minute rollups of digests this long.
    #[arg(long, env = "SQLBEE_COLLECTOR_RETENTION_MINUTE", default_value = "14d", value_parser = duration::parse)]
    pub retention_minute: Duration,
    /// Keep the one-hour and one-day rollups of digests this long.
    #[arg(long, env = "SQLBEE_COLLECTOR_RETENTION_HOUR", default_value = "90d", value_parser = duration::parse)]
    pub retention_hour: Duration,
    /// How often to delete data past the retention.
    #[arg(long, env = "SQLBEE_COLLECTOR_PRUNE_INTERVAL", default_value = "10m", value_parser = duration::parse)]
    pub prune_interval: Duration,
    /// Written with the listening address once the collector accepts
    /// connections.
    #[arg(long, env = "SQLBEE_COLLECTOR_READY_FILE")]
    pub ready_file: Option<PathBuf>,
    /// Address of the web UI and its JSON (`/api/`): IP:PORT, or `none`.
    /// Over TLS with --tls-cert/--tls-key; with --tokens it asks for a
    /// read token.
    #[arg(long, env = "SQLBEE_COLLECTOR_HTTP_LISTEN", default_value = "127.0.0.1:7879")]
    pub http_listen: String,
    /// Host names the web UI answers to (comma-separated, as in the
    /// browser's address bar, without the port): a DNS name or a reverse
    /// proxy's. IP addresses and `localhost` are always answered; a request
    /// for any other name is refused, so that a page on another site cannot
    /// read a UI through a name it points at this host (DNS rebinding).
    #[arg(long, env = "SQLBEE_COLLECTOR_HTTP_HOST", value_delimiter = ',')]
    pub http_host: Vec<String>,
    /// Written with the web UI's URL once it accepts connections.
    #[arg(long, env = "SQLBEE_COLLECTOR_HTTP_READY_FILE")]
    pub http_ready_file: Option<PathBuf>,
    /// Pushes decoded at once; more are answered RESOURCE_EXHAUSTED (the
    /// agents retry). Each may hold up to 32 MiB decoded.
    #[arg(long, env = "SQLBEE_COLLECTOR_MAX_PUSHES", default_value_t = server::INGEST_IN_FLIGHT,
        value_parser = TypedValueParser::map(clap::value_parser!(u32).range(1..=4096), |n| n as usize))]
    pub max_pushes_in_flight: usize,
    /// Pushes from one client address in flight at once (an agent sends
    /// one at a time); more are answered RESOURCE_EXHAUSTED, so one host
    /// cannot take every place. Raise it for many agents behind one NAT.
    #[arg(long, env = "SQLBEE_COLLECTOR_MAX_PUSHES_PER_ADDRESS", default_value_t = 4,
        value_parser = TypedValueParser::map(clap::value_parser!(u32).range(1..=4096), |n| n as usize))]
    pub max_pushes_per_address: usize,
    /// Pushes sent with one token in flight at once (with --tokens); more
    /// are answered RESOURCE_EXHAUSTED. Raise it when one token serves
    /// many agents.
    #[arg(long, env = "SQLBEE_COLLECTOR_MAX_PUSHES_PER_TOKEN", default_value_t = 4,
        value_parser = TypedValueParser::map(clap::value_parser!(u32).range(1..=4096), |n| n as usize))]
    pub max_pushes_per_token: usize,
    /// How long the agent that reports an instance may fall silent before
    /// another agent may report it (an agent replaced under a new id);
    /// until then the other agent's batches are refused. A token's
    /// `instances=` pins instances to it instead.
    #[arg(long, env = "SQLBEE_COLLECTOR_INSTANCE_HANDOVER", default_value = "15m", value_parser = duration::parse)]
    pub instance_handover: Duration,
    /// Take windows only of instances a token pins (`instances=` in the
    /// tokens file), so no agent can claim a name another one will report:
    /// what a fleet should run with. Needs --tokens.
    #[arg(long, env = "SQLBEE_COLLECTOR_REQUIRE_INSTANCE_PINS", requires = "tokens")]
    pub require_instance_pins: bool,
    /// Rows one agent may store per hour (each instance window, digest
    /// row, lock wait, command count, long statement, agent window,
    /// untraced server and gap is one, a plan two); a batch beyond is
    /// answered RESOURCE_EXHAUSTED and counted on the cost page. 0: no
    /// limit.
    #[arg(long, env = "SQLBEE_COLLECTOR_AGENT_QUOTA_ROWS", default_value_t = 5_000_000)]
    pub agent_quota_rows: u64,
    /// MiB one agent may store per hour (a batch's decoded size, or 1 KiB
    /// per row if more), as --agent-quota-rows; 0: no limit.
    #[arg(long, env = "SQLBEE_COLLECTOR_AGENT_QUOTA_MIB", default_value_t = 2048,
        value_parser = clap::value_parser!(u64).range(0..=1 << 30))]
    pub agent_quota_mib: u64,
    /// Queries answered at once, each on a blocking thread of its own so
    /// that ingest always finds one.
    #[arg(long, env = "SQLBEE_COLLECTOR_MAX_QUERIES", default_value_t = server::QUERIES_IN_FLIGHT,
        value_parser = TypedValueParser::map(clap::value_parser!(u32).range(1..=256), |n| n as usize))]
    pub max_queries_in_flight: usize,
    /// How often to look for regressions, new digests and plan changes in
    /// every instance and record them as events (`sqlbee events`); `off`
    /// (or 0): never. Collectors sharing a store may all run it.
    #[arg(long, env = "SQLBEE_COLLECTOR_DETECT_EVERY", default_value = "5m", value_parser = off_or_duration)]
    pub detect_every: Duration,
    /// The recent range each detection round judges, ending at the round.
    #[arg(long, env = "SQLBEE_COLLECTOR_DETECT_WINDOW", default_value = "15m", value_parser = duration::parse)]
    pub detect_window: Duration,
    /// The baseline just before the recent range, used when the store holds
    /// no statement of the instance a day earlier (otherwise the same range
    /// a day earlier is the baseline).
    #[arg(long, env = "SQLBEE_COLLECTOR_DETECT_BASELINE", default_value = "1h", value_parser = duration::parse)]
    pub detect_baseline: Duration,
    /// Smallest change of mean latency that opens a regression, in percent
    /// (as `sqlbee diff --min-change`).
    #[arg(long, env = "SQLBEE_COLLECTOR_DETECT_MIN_CHANGE", default_value_t = 20.0)]
    pub detect_min_change: f64,
    /// Smallest change of mean latency per statement that opens a
    /// regression, in microseconds.
    #[arg(long, env = "SQLBEE_COLLECTOR_DETECT_MIN_DELTA_US", default_value_t = 100)]
    pub detect_min_delta_us: u64,
    /// Fewest statements on each side to judge a digest, and in the recent
    /// range to call a digest new.
    #[arg(long, env = "SQLBEE_COLLECTOR_DETECT_MIN_STATEMENTS", default_value_t = 30,
        value_parser = clap::value_parser!(u64).range(1..))]
    pub detect_min_statements: u64,
    /// Address of the collector's Prometheus page (`/metrics`: open events
    /// by kind and instance, for alert rules): IP:PORT, a port alone for
    /// loopback, or `none`.
    #[arg(long, env = "SQLBEE_COLLECTOR_METRICS_LISTEN", default_value = "none")]
    pub metrics_listen: String,
    /// Post each event as JSON to this URL when it opens and when it
    /// closes (retried a few times, never holding up ingest).
    #[arg(long, env = "SQLBEE_COLLECTOR_WEBHOOK", value_name = "URL")]
    pub webhook: Option<String>,
    /// Export each instance's statements (as OTLP metrics) and its events
    /// and long statements (as OTLP log records), per step, to this
    /// receiver (for http/protobuf, a base URL that `/v1/metrics` and
    /// `/v1/logs` are added to). Without it, `OTEL_EXPORTER_OTLP_ENDPOINT`
    /// or a signal's own `OTEL_EXPORTER_OTLP_METRICS_ENDPOINT` or
    /// `OTEL_EXPORTER_OTLP_LOGS_ENDPOINT` turns the export on; the other
    /// `OTEL_EXPORTER_OTLP_*` variables (protocol, headers, timeout,
    /// certificate) are honoured where no flag says otherwise.
    #[arg(long, env = "SQLBEE_COLLECTOR_OTLP_ENDPOINT", value_name = "URL")]
    pub otlp_endpoint: Option<String>,
    /// `http/protobuf` (the default) or `grpc`.
    #[arg(long, env = "SQLBEE_COLLECTOR_OTLP_PROTOCOL")]
    pub otlp_protocol: Option<String>,
    /// A header sent with every export request (`KEY=VALUE`; repeat for
    /// more). A secret is better given in `OTEL_EXPORTER_OTLP_HEADERS`,
    /// which other users cannot read from the process list.
    #[arg(long = "otlp-header", value_name = "KEY=VALUE")]
    pub otlp_headers: Vec<String>,
    /// CA (PEM) that signed the receiver's certificate (for https).
    #[arg(long, env = "SQLBEE_COLLECTOR_OTLP_CA")]
    pub otlp_ca: Option<PathBuf>,
    /// One export request's deadline (default 10s).
    #[arg(long, env = "SQLBEE_COLLECTOR_OTLP_TIMEOUT", value_parser = duration::parse)]
    pub otlp_timeout: Option<Duration>,
    /// The interval each exported point covers (at least 1s).
    #[arg(long, env = "SQLBEE_COLLECTOR_OTLP_STEP", default_value = "1m", value_parser = duration::parse)]
    pub otlp_step: Duration,
    /// How long after a step ends it is exported, so that agents' windows,
    /// changes and long statements of it have arrived. What arrives later
    /// is in the store and the query tools, not in the export.
    #[arg(long, env = "SQLBEE_COLLECTOR_OTLP_DELAY", default_value = "1m", value_parser = duration::parse)]
    pub otlp_delay: Duration,
    /// How far the export may fall behind (a receiver that is down) before
    /// it skips the oldest steps, counting them as dropped.
    #[arg(long, env = "SQLBEE_COLLECTOR_OTLP_MAX_BEHIND", default_value = "6h", value_parser = duration::parse)]
    pub otlp_max_behind: Duration,
    /// Digests per instance and step that get points of their own (the
    /// busiest by total time); the rest are one point, digest `other`.
    #[arg(long, env = "SQLBEE_COLLECTOR_OTLP_MAX_DIGESTS", default_value_t = 100,
        value_parser = TypedValueParser::map(clap::value_parser!(u32).range(1..=10_000), |n| n as usize))]
    pub otlp_max_digests: usize,
    /// Also send each digest's redacted text (`db.query.text`), on points
    /// and log records.
    #[arg(long, env = "SQLBEE_COLLECTOR_OTLP_QUERY_TEXT")]
    pub otlp_query_text: bool,
}

/// The export's settings and a transport per signal, or None without an
/// endpoint.
fn otlp_settings(args: &CollectorArgs) -> Result<Option<(otlp::Settings, Vec<otlp::send::Transport>)>, CollectorError> {
    let flags = otlp::config::Flags {
        endpoint: args.otlp_endpoint.clone(),
        protocol: args.otlp_protocol.clone(),
        headers: args.otlp_headers.clone(),
        ca: args.otlp_ca.clone(),
        timeout: args.otlp_timeout,
    };
    let mut targets = Vec::new();
    for signal in otlp::config::Signal::ALL {
        targets.extend(otlp::config::resolve(&flags, signal, &|name| std::env::var(name).ok())?);
    }
    if targets.is_empty() {
        return Ok(None);
    }
    if args.otlp_step < Duration::from_secs(1) {
        return Err(CollectorError::Zero { field: "--otlp-step (at least 1s)" });
    }
    let transports = targets.iter().cloned().map(otlp::send::Transport::new).collect::<Result<Vec<_>, _>>()?;
    let settings = otlp::Settings {
        targets,
        step: args.otlp_step,
        delay: args.otlp_delay,
        max_behind: args.otlp_max_behind.max(args.otlp_step),
        max_digests: args.otlp_max_digests,
        query_text: args.otlp_query_text,
    };
    Ok(Some((settings, transports)))
}

/// `off` or `0` for never, else a duration.
fn off_or_duration(text: &str) -> Result<Duration, duration::DurationError> {
    match text.trim() {
        "off" | "0" => Ok(Duration::ZERO),
        other => duration::parse(other),
    }
}

#[derive(Debug, thiserror::Error)]
pub enum CollectorError {
    #[error("cannot start the async runtime: {source}")]
    Runtime {
        #[source]
        source: std::io::Error,
    },
    #[error("cannot install the SIGINT/SIGTERM handlers: {source}")]
    Signals {
        #[source]
        source: std::io::Error,
    },
    #[error("{field} must be longer than zero")]
    Zero { field: &'static str },
    #[error(transparent)]
    Auth(#[from] AuthError),
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("cannot read {path}: {source}")]
    ReadFile {
        path: String,
        #[source]
        source: std::io::Error,
    },
    // tonic's transport errors say only "transport error" at the top: the
    // message carries the whole chain.
    #[error("invalid TLS certificate or key (expected PEM files): {}", error_chain(cause))]
    Tls { cause: tonic::transport::Error },
    #[error("cannot listen on {addr}: {source} (is another collector running? choose another --listen)")]
    Bind {
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot write the ready file {path}: {source}")]
    ReadyFile {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("the gRPC server failed: {}", error_chain(cause))]
    Serve { cause: tonic::transport::Error },
    #[error("the store could not be opened: {reason}")]
    StoreTask { reason: String },
    #[error(transparent)]
    Http(#[from] http::HttpError),
    #[error(transparent)]
    Metrics(#[from] sqlbee_prometheus::MetricsError),
    #[error("--detect-min-change: {value} is not a percentage >= 0")]
    MinChange { value: f64 },
    #[error(transparent)]
    Webhook(#[from] detect::webhook::WebhookError),
    #[error(transparent)]
    OtlpConfig(#[from] otlp::config::ConfigError),
    #[error(transparent)]
    OtlpTransport(#[from] otlp::send::TransportError),
}

pub fn main(args: CollectorArgs) -> Result<(), CollectorError> {
    // Two workers: the collector's work is I/O and SQLite calls, which run
    // on the blocking pool. Every admitted push and query can hold a
    // blocking thread at once, with room to spare for pruning, so queries
    // never take the last thread from ingest.
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .max_blocking_threads(
            (args.max_pushes_in_flight + args.max_queries_in_flight + http::UI_QUERIES_IN_FLIGHT + 4).min(512),
        )
        .thread_name("sqlbee-collector")
        .enable_all()
        .build()
        .map_err(|source| CollectorError::Runtime { source })?;
    let result = runtime.block_on(run(args));
    // Let a prune chunk in progress finish rather than cut it off.
    runtime.shutdown_timeout(Duration::from_secs(10));
    result
}

async fn run(args: CollectorArgs) -> Result<(), CollectorError> {
    for (field, value) in [
        ("--retention", args.retention),
        ("--retention-minute", args.retention_minute),
        ("--retention-hour", args.retention_hour),
    ] {
        if value.is_zero() {
            return Err(CollectorError::Zero { field });
        }
    }
    if args.prune_interval.is_zero() {
        return Err(CollectorError::Zero { field: "--prune-interval" });
    }
    for (field, value) in [("--detect-window", args.detect_window), ("--detect-baseline", args.detect_baseline)] {
        if value.is_zero() {
            return Err(CollectorError::Zero { field });
        }
    }
    if !(args.detect_min_change.is_finite() && args.detect_min_change >= 0.0) {
        return Err(CollectorError::MinChange { value: args.detect_min_change });
    }
    let otlp = otlp_settings(&args)?;
    let metrics = match args.metrics_listen.trim() {
        none if none.eq_ignore_ascii_case("none") => None,
        addr => Some(sqlbee_prometheus::MetricsServer::bind(addr)?),
    };
    let auth = match &args.tokens {
        Some(path) => Auth::from_file(path)?,
        None => Auth::open(),
    };
    let http = http::HttpServer::bind(&http::HttpSettings {
        listen: args.http_listen.clone(),
        hosts: args.http_host.clone(),
        tls: args.tls_cert.clone().zip(args.tls_key.clone()),
        client_ca: args.tls_client_ca.clone(),
    })?;
    let tls = match (args.tls_cert, args.tls_key) {
        (Some(cert), Some(key)) => Some(Tls { cert, key, client_ca: args.tls_client_ca }),
        _ => None,
    };
    let settings = Settings {
        listen: args.listen,
        tls,
        auth,
        retention: store::Retention { raw: args.retention, minute: args.retention_minute, hour: args.retention_hour },
        prune_interval: args.prune_interval,
        ready_file: args.ready_file,
        http,
        http_ready_file: args.http_ready_file,
        pushes_in_flight: args.max_pushes_in_flight,
        pushes_per_address: args.max_pushes_per_address,
        pushes_per_token: args.max_pushes_per_token,
        queries_in_flight: args.max_queries_in_flight,
        instance_handover: args.instance_handover,
        require_instance_pins: args.require_instance_pins,
        agent_quota_rows: args.agent_quota_rows,
        agent_quota_bytes: args.agent_quota_mib << 20,
        detection: detect::Settings {
            every: args.detect_every,
            window: args.detect_window,
            baseline: args.detect_baseline,
            thresholds: query_api::diff::Thresholds {
                min_change: args.detect_min_change / 100.0,
                min_delta_ns: args.detect_min_delta_us.saturating_mul(1_000),
                min_statements: args.detect_min_statements,
            },
        },
        metrics,
        webhook: args.webhook.as_deref().map(detect::webhook::Webhook::start).transpose()?,
        otlp,
    };
    let location = args.store.clone();
    let store: Arc<dyn store::Store> = tokio::task::spawn_blocking(move || store::open(&location))
        .await
        .map_err(|e| CollectorError::StoreTask { reason: e.to_string() })??
        .into();
    let mut term = signal(SignalKind::terminate()).map_err(|source| CollectorError::Signals { source })?;
    let mut int = signal(SignalKind::interrupt()).map_err(|source| CollectorError::Signals { source })?;
    let mut hup = signal(SignalKind::hangup()).map_err(|source| CollectorError::Signals { source })?;
    let reloading = settings.auth.clone();
    tokio::spawn(async move {
        while hup.recv().await.is_some() {
            match reloading.reload() {
                Ok(tokens) => tracing::info!(tokens, "SIGHUP: tokens reloaded"),
                Err(error) => tracing::warn!(%error, "SIGHUP: tokens file not reloaded; the tokens in force stay"),
            }
        }
    });
    let stop = async move {
        tokio::select! {
            _ = term.recv() => tracing::info!("SIGTERM"),
            _ = int.recv() => tracing::info!("SIGINT"),
        }
    };
    server::serve(settings, store, stop).await?;
    tracing::info!("collector stopped");
    Ok(())
}
