//! Query tools against a collector: `sqlbee top`, `sqlbee series`,
//! `sqlbee instances`, `sqlbee locks` and `sqlbee hosts`. They reach the
//! collector only through the wire crate (the Query service's client
//! `sqlbee_proto::query_client`, its answers as JSON and the wire types);
//! this crate does not depend on the collector's. `render` prints; this
//! module parses flags and makes one call; `mcp` offers the same calls as
//! tools to an assistant.
mod cells;
pub mod mcp;
pub mod render;
pub mod render_by;
pub mod render_cost;
pub mod render_diff;
pub mod render_events;
pub mod render_series;

use std::{io::Write, path::PathBuf, time::Duration};

use clap::builder::PossibleValuesParser;
use sqlbee_proto::v1::{
    ActivityRequest, AnnotateRequest, AnnotationsRequest, DiffRequest, EventsRequest, HostsRequest, InstancesRequest,
    LocksRequest, LongStatementsRequest, PlansRequest, ReplicationRequest, SeriesRequest, TablesRequest, TopRequest,
};
use tonic::{Code, Status};

use sqlbee_proto::{
    json,
    query_client::{self as api, Client, ClientError, ClientOptions},
};
use sqlbee_vocabulary::{clock::now_unix_ms, duration};

/// How to reach a collector; shared by every query command.
#[derive(clap::Args, Debug, Clone)]
pub struct ConnectArgs {
    /// Collector URL: http://HOST:PORT, or https://HOST:PORT for TLS.
    #[arg(long, env = "SQLBEE_COLLECTOR", default_value = "http://127.0.0.1:7878")]
    pub collector: String,
    /// File holding the bearer token (first non-comment line).
    #[arg(long, env = "SQLBEE_TOKEN_FILE")]
    pub token_file: Option<PathBuf>,
    /// CA certificate (PEM) that signed the collector's certificate.
    #[arg(long, env = "SQLBEE_CA_CERT")]
    pub ca_cert: Option<PathBuf>,
    /// Client certificate (PEM) for a collector that requires mTLS.
    #[arg(long, env = "SQLBEE_CLIENT_CERT", requires = "client_key")]
    pub client_cert: Option<PathBuf>,
    /// Client private key (PEM).
    #[arg(long, env = "SQLBEE_CLIENT_KEY", requires = "client_cert")]
    pub client_key: Option<PathBuf>,
}

#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    Table,
    Json,
}

#[derive(clap::Args, Debug, Clone)]
pub struct TopArgs {
    #[command(flatten)]
    pub connect: ConnectArgs,
    /// Only this server instance (host:port); default every instance.
    #[arg(long)]
    pub instance: Option<String>,
    /// Windows that ended within this long ago (10s, 5m, 2h, 7d), `all`,
    /// or a time in milliseconds since the epoch.
    #[arg(long, default_value = "1h")]
    pub since: String,
    /// Windows that ended before this long ago (10s, 5m, 2h, 7d), `now`,
    /// or a time in milliseconds since the epoch.
    #[arg(long, default_value = "now")]
    pub until: String,
    /// Only statements that ran in this schema (current database).
    #[arg(long)]
    pub schema: Option<String>,
    /// Only this digest (16 hex digits, as `top` prints it): its rows per
    /// schema and lineage, nested ones included.
    #[arg(long)]
    pub digest: Option<String>,
    /// Also the statements stored programs ran (procedures, functions,
    /// triggers, events), each under the client statement that ran it.
    #[arg(long)]
    pub nested: bool,
    /// Only the statements of this stored program (`schema.name`).
    #[arg(long)]
    pub program: Option<String>,
    /// Rank by total time, average, p99, count, errors, time waited, rows
    /// examined, CPU time or temporary tables on disk.
    #[arg(long, default_value = "total", value_parser = PossibleValuesParser::new(api::ORDER_KEYS))]
    pub order_by: String,
    /// Digests to show (1..=10000).
    #[arg(long, default_value_t = 20, value_parser = clap::value_parser!(u32).range(1..=10_000))]
    pub limit: u32,
    /// Group the top digests' statements by a query tag's values
    /// (`tag:controller`), or by who sent them: `client`, `program` (the
    /// name it gave at connect), `process`, `address`, `container` or
    /// `pod`. Per value: its statements and digests. `table` ranks tables
    /// instead: the time of the statements that touch each and of the rows
    /// events replicas applied to it (`--schema`: that schema's tables).
    #[arg(long, value_name = "tag:KEY|client|program|process|address|container|pod|table", value_parser = render_by::By::parse)]
    pub by: Option<render_by::By>,
    /// Only digests this client sent statements of: a program, a process
    /// name, an address, a container, or a client as `--by client` prints it. Each
    /// row's `matched` says how many of its statements it sent. Looks
    /// through the 10,000 top digests.
    #[arg(long, conflicts_with_all = ["pod", "tag"])]
    pub client: Option<String>,
    /// Only digests a client in this Kubernetes pod (`POD` or
    /// `NAMESPACE/POD`) sent statements of, as --client.
    #[arg(long, conflicts_with = "tag")]
    pub pod: Option<String>,
    /// Only digests with statements tagged KEY=VALUE, as --client.
    #[arg(long, value_name = "KEY=VALUE", value_parser = render_by::Filter::parse_tag)]
    pub tag: Option<render_by::Filter>,
    #[arg(long, value_enum, default_value_t = Format::Table)]
    pub format: Format,
}

#[derive(clap::Args, Debug, Clone)]
pub struct DiffArgs {
    #[command(flatten)]
    pub connect: ConnectArgs,
    /// The first range, `FROM..TO`, each end as `top --since` and
    /// `--until` take it (`25h..24h`, `1764300000000..now`). Default: the
    /// same hour a day before `--after`'s.
    #[arg(long, value_name = "FROM..TO")]
    pub before: Option<String>,
    /// The second range. Default: the last hour (`1h..now`).
    #[arg(long, value_name = "FROM..TO", default_value = "1h..now")]
    pub after: String,
    /// Compare the `--span` before a marker with the `--span` after it
    /// (or up to now): the marker's id as `sqlbee annotate` printed it, or
    /// a word of its text (the newest marker in the last 30 days that has
    /// it). Replaces --before and --after.
    #[arg(long, value_name = "MARKER", conflicts_with = "before")]
    pub around: Option<String>,
    /// With --around: the length of each side.
    #[arg(long, default_value = "1h", value_parser = duration::parse)]
    pub span: Duration,
    /// Only this server instance (host:port).
    #[arg(long)]
    pub instance: Option<String>,
    /// Only statements that ran in this schema.
    #[arg(long)]
    pub schema: Option<String>,
    /// Smallest change of mean latency that counts as a regression or an
    /// improvement, in percent.
    #[arg(long, default_value_t = 20.0)]
    pub min_change: f64,
    /// Smallest change of mean latency per statement that counts, in
    /// microseconds.
    #[arg(long, default_value_t = 100)]
    pub min_delta_us: u64,
    /// Fewest statements on each side to judge a digest at all.
    #[arg(long, default_value_t = 30)]
    pub min_statements: u64,
    /// Digests to list, largest change in total time first (1..=10000).
    #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(u32).range(1..=10_000))]
    pub limit: u32,
    #[arg(long, value_enum, default_value_t = Format::Table)]
    pub format: Format,
}

#[derive(clap::Args, Debug, Clone)]
pub struct EventsArgs {
    #[command(flatten)]
    pub connect: ConnectArgs,
    /// Only this server instance (host:port).
    #[arg(long)]
    pub instance: Option<String>,
    /// Events open at any time since this (10s, 5m, 2h, 7d, `all`, or ms
    /// since the epoch).
    #[arg(long, default_value = "24h")]
    pub since: String,
    /// ... and opened before this (`now`, a duration ago or ms).
    #[arg(long, default_value = "now")]
    pub until: String,
    /// Only events still open.
    #[arg(long)]
    pub open: bool,
    /// Only this kind of event.
    #[arg(long, value_parser = PossibleValuesParser::new(api::EVENT_KINDS))]
    pub kind: Option<String>,
    /// Events to list, newest first (1..=10000).
    #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(u32).range(1..=10_000))]
    pub limit: u32,
    #[arg(long, value_enum, default_value_t = Format::Table)]
    pub format: Format,
}

#[derive(clap::Args, Debug, Clone)]
pub struct AnnotateArgs {
    #[command(flatten)]
    pub connect: ConnectArgs,
    /// What happened, one line: `"deploy v2.3"`.
    pub text: String,
    /// An instance it concerns (host:port); repeat for more. Default: the
    /// whole fleet.
    #[arg(long)]
    pub instance: Vec<String>,
    /// When it happened: `now`, a duration ago (10m) or ms since the epoch.
    #[arg(long, default_value = "now")]
    pub at: String,
    #[arg(long, value_enum, default_value_t = Format::Table)]
    pub format: Format,
}

#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum SeriesOf {
    /// One digest (needs --digest).
    Digest,
    /// Every client statement: the instances' rate and latency.
    Statements,
    /// The agents' own cost and the probes' cost to the servers.
    Cost,
}

#[derive(clap::Args, Debug, Clone)]
pub struct SeriesArgs {
    #[command(flatten)]
    pub connect: ConnectArgs,
    /// The digest (16 hex digits, as `top` prints it); implies --of digest.
    #[arg(long)]
    pub digest: Option<String>,
    /// What to follow; default `digest` with --digest, else `statements`.
    #[arg(long, value_enum)]
    pub of: Option<SeriesOf>,
    /// Only this server instance; default every instance.
    #[arg(long)]
    pub instance: Option<String>,
    /// Only statements that ran in this schema.
    #[arg(long)]
    pub schema: Option<String>,
    /// Start: this long ago (10s, 5m, 2h, 7d) or milliseconds since the epoch.
    #[arg(long, default_value = "1h")]
    pub since: String,
    /// End: this long ago, `now`, or milliseconds since the epoch.
    #[arg(long, default_value = "now")]
    pub until: String,
    /// Length of one point (10s, 1m, 1h); default about 60 points.
    #[arg(long)]
    pub step: Option<String>,
    #[arg(long, value_enum, default_value_t = Format::Table)]
    pub format: Format,
}

#[derive(clap::Args, Debug, Clone)]
pub struct LocksArgs {
    #[command(flatten)]
    pub connect: ConnectArgs,
    /// Only this server instance (host:port); default every instance.
    #[arg(long)]
    pub instance: Option<String>,
    /// Waits that started within this long ago (10s, 5m, 2h, 7d), or `all`.
    #[arg(long, default_value = "1h")]
    pub since: String,
    /// Waits to show, newest first (1..=10000).
    #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(u32).range(1..=10_000))]
    pub limit: u32,
    #[arg(long, value_enum, default_value_t = Format::Table)]
    pub format: Format,
}

#[derive(clap::Args, Debug, Clone)]
pub struct PlansArgs {
    #[command(flatten)]
    pub connect: ConnectArgs,
    /// The digest (16 hex digits, as `top` prints it); without it, the plan
    /// changes of every digest.
    pub digest: Option<String>,
    /// Only this schema; default every schema.
    #[arg(long)]
    pub schema: Option<String>,
    /// Only this server instance (host:port); default every instance.
    #[arg(long)]
    pub instance: Option<String>,
    /// Plan changes within this long ago (10s, 5m, 2h, 7d), or `all`.
    #[arg(long, default_value = "7d")]
    pub since: String,
    /// Plans (newest first) and plan changes (newest first) to show, each (1..=10000).
    #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(u32).range(1..=10_000))]
    pub limit: u32,
    #[arg(long, value_enum, default_value_t = Format::Table)]
    pub format: Format,
}

#[derive(clap::Args, Debug, Clone)]
pub struct ActivityArgs {
    #[command(flatten)]
    pub connect: ConnectArgs,
    /// Only this server instance (host:port); default every instance.
    #[arg(long)]
    pub instance: Option<String>,
    /// Only statements running at least this long (250ms, 1s, 5m); idle
    /// connections are left out unless 0.
    #[arg(long, default_value = "0")]
    pub min_duration: String,
    #[arg(long, value_enum, default_value_t = Format::Table)]
    pub format: Format,
}

#[derive(clap::Args, Debug, Clone)]
pub struct LongArgs {
    #[command(flatten)]
    pub connect: ConnectArgs,
    /// Only this server instance (host:port); default every instance.
    #[arg(long)]
    pub instance: Option<String>,
    /// Statements that started within this long ago (10s, 5m, 2h, 7d), or `all`.
    #[arg(long, default_value = "1h")]
    pub since: String,
    /// Statements to show, newest first (1..=10000).
    #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(u32).range(1..=10_000))]
    pub limit: u32,
    #[arg(long, value_enum, default_value_t = Format::Table)]
    pub format: Format,
}

#[derive(clap::Args, Debug, Clone)]
pub struct ReplicationArgs {
    #[command(flatten)]
    pub connect: ConnectArgs,
    /// Only this replica (host:port); default every instance that applied
    /// events as a replica.
    #[arg(long)]
    pub instance: Option<String>,
    /// Windows that ended within this long ago (10s, 5m, 2h, 7d), or `all`.
    #[arg(long, default_value = "1h")]
    pub since: String,
    #[arg(long, value_enum, default_value_t = Format::Table)]
    pub format: Format,
}

#[derive(clap::Args, Debug, Clone)]
pub struct TablesArgs {
    #[command(flatten)]
    pub connect: ConnectArgs,
    /// Only this server instance (host:port); default every instance.
    #[arg(long)]
    pub instance: Option<String>,
    /// Windows that ended within this long ago (10s, 5m, 2h, 7d), or `all`.
    #[arg(long, default_value = "1h")]
    pub since: String,
    /// Tables to show, by total time (1..=10000).
    #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(u32).range(1..=10_000))]
    pub limit: u32,
    #[arg(long, value_enum, default_value_t = Format::Table)]
    pub format: Format,
}

#[derive(clap::Args, Debug, Clone)]
pub struct HostsArgs {
    #[command(flatten)]
    pub connect: ConnectArgs,
    /// Only this host (as the agent names it); default every host.
    #[arg(long)]
    pub host: Option<String>,
    /// Agent windows that ended within this long ago (10s, 5m, 2h, 7d), or `all`.
    #[arg(long, default_value = "1h")]
    pub since: String,
    /// Windows to show, newest first (1..=10000).
    #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(u32).range(1..=10_000))]
    pub limit: u32,
    #[arg(long, value_enum, default_value_t = Format::Table)]
    pub format: Format,
}

#[derive(clap::Args, Debug, Clone)]
pub struct InstancesArgs {
    #[command(flatten)]
    pub connect: ConnectArgs,
    #[arg(long, value_enum, default_value_t = Format::Table)]
    pub format: Format,
}

#[derive(Debug, thiserror::Error)]
pub enum QueryError {
    #[error(transparent)]
    Client(#[from] ClientError),
    #[error("--since, --until or --step: {0}")]
    Since(#[from] duration::DurationError),
    #[error("--by table ranks tables, not digests: {flag} does not apply to it")]
    ByTable { flag: &'static str },
    #[error("--digest: {0:?} is not a digest id (16 hex digits, as `sqlbee top` prints it)")]
    Digest(String),
    #[error("{what} {value:?}: expected FROM..TO, as `--after 1h..now` or `--before 25h..24h`")]
    Range { what: &'static str, value: String },
    #[error("--of digest needs --digest")]
    NoDigest,
    #[error("--around {marker:?}: no marker has that id, and none of the last 30 days has that text")]
    NoMarker { marker: String },
    #[error("--min-duration {value}: {source}")]
    MinDuration {
        value: String,
        #[source]
        source: duration::DurationError,
    },
    #[error("the collector answered {what} with {:?}: {}{}", .status.code(), .status.message(), hint(.status.code()))]
    Rpc { what: &'static str, status: Status },
    #[error("cannot start the async runtime: {source}")]
    Runtime {
        #[source]
        source: std::io::Error,
    },
    #[error("cannot read the input: {source}")]
    Input {
        #[source]
        source: std::io::Error,
    },
    #[error("cannot write the answer: {source}")]
    Output {
        #[source]
        source: std::io::Error,
    },
}

/// What to do about the statuses a user can cause.
fn hint(code: Code) -> &'static str {
    match code {
        Code::Unauthenticated => " (pass a token the collector accepts with --token-file)",
        Code::Unavailable => " (is the collector running and reachable?)",
        _ => "",
    }
}

impl ConnectArgs {
    pub fn options(&self) -> Result<ClientOptions, ClientError> {
        let token = self.token_file.as_deref().map(api::read_token_file).transpose()?;
        Ok(ClientOptions {
            url: self.collector.clone(),
            token,
            ca_cert: self.ca_cert.clone(),
            client_cert: self.client_cert.clone(),
            client_key: self.client_key.clone(),
            request_timeout: Some(Duration::from_secs(60)),
            ..Default::default()
        })
    }
}

/// Connects and makes one call; a failed call becomes `QueryError::Rpc`
/// naming `what`.
fn call<T, Fut>(connect: &ConnectArgs, what: &'static str, rpc: impl FnOnce(Client) -> Fut) -> Result<T, QueryError>
where
    Fut: std::future::Future<Output = Result<tonic::Response<T>, Status>>,
{
    runtime()?.block_on(async {
        let client = api::connect(&connect.options()?).await?;
        rpc(client).await.map(tonic::Response::into_inner).map_err(|status| QueryError::Rpc { what, status })
    })
}

fn runtime() -> Result<tokio::runtime::Runtime, QueryError> {
    tokio::runtime::Builder::new_current_thread().enable_all().build().map_err(|source| QueryError::Runtime { source })
}

/// A point in time as the flags take it: a duration back from now, or
/// milliseconds since the epoch (all digits, as the UI's links carry it).
fn time_unix_ms(text: &str, now: i64) -> Result<i64, QueryError> {
    Ok(duration::unix_ms_ago(text, now)?)
}

fn since_unix_ms(since: &str) -> Result<i64, QueryError> {
    if since == "all" {
        return Ok(0);
    }
    time_unix_ms(since, now_unix_ms())
}

/// The wire's `until_unix_ms`: 0 for now (no end).
fn until_unix_ms(until: &str) -> Result<i64, QueryError> {
    if until == "now" {
        return Ok(0);
    }
    time_unix_ms(until, now_unix_ms())
}

/// Digests an answer holds at most (`--limit`'s bound).
const MAX_TOP_LIMIT: u32 = 10_000;

fn digest_id(text: Option<&str>) -> Result<Option<u64>, QueryError> {
    text.map(|d| u64::from_str_radix(d.trim_start_matches("0x"), 16).map_err(|_| QueryError::Digest(d.to_string())))
        .transpose()
}

pub fn top(args: TopArgs) -> Result<(), QueryError> {
    top_to(args, &mut std::io::stdout().lock())
}

/// `top`, its answer written to `out`.
pub fn top_to(args: TopArgs, mut out: &mut dyn Write) -> Result<(), QueryError> {
    if args.by == Some(render_by::By::Table) {
        return top_tables(&args, out);
    }
    let digest = digest_id(args.digest.as_deref())?;
    let request = TopRequest {
        instance: args.instance.clone().unwrap_or_default(),
        schema: args.schema.clone().unwrap_or_default(),
        digest: digest.unwrap_or(0),
        nested: args.nested || digest.is_some(),
        program: args.program.clone().unwrap_or_default(),
        since_unix_ms: since_unix_ms(&args.since)?,
        until_unix_ms: until_unix_ms(&args.until)?,
        order_by: args.order_by.clone(),
        limit: args.limit,
    };
    let filter = match (&args.client, &args.pod, &args.tag) {
        (Some(client), _, _) => Some(render_by::Filter::Client(client.clone())),
        (_, Some(pod), _) => Some(render_by::Filter::Pod(pod.clone())),
        (_, _, tag) => tag.clone(),
    };
    // A filter looks through as many digests as an answer holds.
    let request = match filter {
        Some(_) => TopRequest { limit: MAX_TOP_LIMIT, ..request },
        None => request,
    };
    let mut answer = call(&args.connect, "Top", |mut client| async move { client.top(request).await })?;
    if answer.left_out > 0 {
        eprintln!("{}", json::left_out_note(answer.left_out, "digests"));
    }
    let mut matched = Vec::new();
    if let Some(filter) = &filter {
        answer.digests.retain(|d| filter.matched(d) > 0);
        answer.digests.truncate(args.limit as usize);
        matched = answer.digests.iter().map(|d| filter.matched(d)).collect();
    }
    if let Some(by) = &args.by {
        return match args.format {
            Format::Json => render::write_json(&mut out, &render_by::json(&answer.digests, by)),
            Format::Table => render_by::write_table(&mut out, &answer.digests, by),
        }
        .map_err(|source| QueryError::Output { source });
    }
    match args.format {
        Format::Json => {
            let mut whole = json::top_answer_json(&answer);
            if filter.is_some()
                && let Some(rows) = whole["digests"].as_array_mut()
            {
                for (row, n) in rows.iter_mut().zip(&matched) {
                    row["matched"] = (*n).into();
                }
            }
            render::write_json(&mut out, &whole)
        }
        Format::Table => render::write_top_table(&mut out, &answer.digests)
            .and_then(|()| match &filter {
                Some(_) => render_by::write_matched(&mut out, &answer.digests, &matched),
                None => Ok(()),
            })
            .and_then(|()| render_cost::write_costs(&mut out, &answer.costs))
            .and_then(|()| render_cost::write_quotas(&mut out, &answer.quotas)),
    }
    .map_err(|source| QueryError::Output { source })
}

/// `top --by table`: the collector's tables, which count a replica's
/// rows events beside the statements, ranked by both.
fn top_tables(args: &TopArgs, mut out: &mut dyn Write) -> Result<(), QueryError> {
    let digest_only = [
        ("--digest", args.digest.is_some()),
        ("--program", args.program.is_some()),
        ("--client", args.client.is_some()),
        ("--pod", args.pod.is_some()),
        ("--tag", args.tag.is_some()),
    ];
    if let Some((flag, _)) = digest_only.iter().find(|(_, given)| *given) {
        return Err(QueryError::ByTable { flag });
    }
    let request = TablesRequest {
        instance: args.instance.clone().unwrap_or_default(),
        since_unix_ms: since_unix_ms(&args.since)?,
        until_unix_ms: until_unix_ms(&args.until)?,
        // A schema's tables are picked from all of them.
        limit: if args.schema.is_some() { MAX_TOP_LIMIT } else { args.limit },
    };
    let mut answer = call(&args.connect, "Tables", |mut client| async move { client.tables(request).await })?;
    if let Some(schema) = &args.schema {
        answer.tables.retain(|t| &t.schema == schema);
        answer.tables.truncate(args.limit as usize);
    }
    match args.format {
        Format::Json => {
            let mut whole = json::tables_json(&answer);
            for (row, t) in whole["tables"].as_array_mut().into_iter().flatten().zip(&answer.tables) {
                row["total_ns"] = t.sum_ns.saturating_add(t.apply_ns).into();
            }
            whole["by"] = "table".into();
            render::write_json(&mut out, &whole)
        }
        Format::Table => render::write_top_tables(&mut out, &answer),
    }
    .map_err(|source| QueryError::Output { source })
}

/// `FROM..TO` as the wire's (since, until); `what` names the flag.
fn range_unix_ms(range: &str, what: &'static str) -> Result<(i64, i64), QueryError> {
    let (from, to) = range.split_once("..").ok_or_else(|| QueryError::Range { what, value: range.to_string() })?;
    Ok((since_unix_ms(from)?, until_unix_ms(to)?))
}

/// The time of the marker `--around` names: by id, else the newest of
/// the last 30 days whose text has it.
fn marker_time(connect: &ConnectArgs, marker: &str) -> Result<i64, QueryError> {
    let by_id = u64::from_str_radix(marker.trim_start_matches("0x"), 16).ok().filter(|_| marker.len() == 16);
    let request = AnnotationsRequest {
        id: by_id.unwrap_or(0),
        since_unix_ms: now_unix_ms() - 30 * 86_400_000,
        limit: 10_000,
        ..Default::default()
    };
    let found = call(connect, "Annotations", |mut client| async move { client.annotations(request).await })?;
    let word = marker.to_lowercase();
    found
        .annotations
        .iter()
        .rev()
        .find(|a| by_id == Some(a.id) || a.text.to_lowercase().contains(&word))
        .map(|a| a.at_unix_ms)
        .ok_or_else(|| QueryError::NoMarker { marker: marker.to_string() })
}

pub fn diff(args: DiffArgs) -> Result<(), QueryError> {
    diff_to(args, &mut std::io::stdout().lock())
}

/// `diff`, its answer written to `out`.
pub fn diff_to(args: DiffArgs, mut out: &mut dyn Write) -> Result<(), QueryError> {
    let span = i64::try_from(args.span.as_millis()).unwrap_or(i64::MAX).max(1);
    let around = args.around.as_deref().map(|m| marker_time(&args.connect, m)).transpose()?;
    let (after_since, after_until) = match around {
        Some(at) => (at, if at + span >= now_unix_ms() { 0 } else { at + span }),
        None => range_unix_ms(&args.after, "--after")?,
    };
    let (before_since, before_until) = match (&args.before, around) {
        (_, Some(at)) => ((at - span).max(0), at),
        (Some(range), None) => range_unix_ms(range, "--before")?,
        (None, None) => {
            const DAY_MS: i64 = 86_400_000;
            let end = if after_until == 0 { now_unix_ms() } else { after_until };
            (after_since - DAY_MS, end - DAY_MS)
        }
    };
    let request = DiffRequest {
        instance: args.instance.clone().unwrap_or_default(),
        schema: args.schema.clone().unwrap_or_default(),
        before_since_unix_ms: before_since,
        before_until_unix_ms: before_until,
        after_since_unix_ms: after_since,
        after_until_unix_ms: after_until,
        limit: args.limit,
        min_change: args.min_change / 100.0,
        min_delta_ns: args.min_delta_us.saturating_mul(1000).max(1),
        min_statements: args.min_statements.max(1),
    };
    let answer = call(&args.connect, "Diff", |mut client| async move { client.diff(request).await })?;
    match args.format {
        Format::Json => render::write_json(&mut out, &json::diff_json(&answer.digests)),
        Format::Table => render_diff::write_table(&mut out, &answer.digests),
    }
    .map_err(|source| QueryError::Output { source })
}

pub fn events(args: EventsArgs) -> Result<(), QueryError> {
    events_to(args, &mut std::io::stdout().lock())
}

/// `events`, its answer written to `out`.
pub fn events_to(args: EventsArgs, mut out: &mut dyn Write) -> Result<(), QueryError> {
    let request = EventsRequest {
        instance: args.instance.clone().unwrap_or_default(),
        since_unix_ms: since_unix_ms(&args.since)?,
        until_unix_ms: until_unix_ms(&args.until)?,
        open_only: args.open,
        limit: args.limit,
        kind: args.kind.clone().unwrap_or_default(),
    };
    let answer = call(&args.connect, "Events", |mut client| async move { client.events(request).await })?;
    match args.format {
        Format::Json => render::write_json(&mut out, &json::events_json(&answer.events)),
        Format::Table => render_events::write_table(&mut out, &answer.events),
    }
    .map_err(|source| QueryError::Output { source })
}

pub fn annotate(args: AnnotateArgs) -> Result<(), QueryError> {
    let request = AnnotateRequest {
        text: args.text.clone(),
        instances: args.instance.clone(),
        at_unix_ms: if args.at == "now" { 0 } else { time_unix_ms(&args.at, now_unix_ms())? },
    };
    let marker = runtime()?.block_on(async {
        let mut client = api::connect_annotate(&args.connect.options()?).await?;
        client
            .annotate(request)
            .await
            .map(tonic::Response::into_inner)
            .map_err(|status| QueryError::Rpc { what: "Annotate", status })
    })?;
    let mut out = std::io::stdout().lock();
    match args.format {
        Format::Json => render::write_json(&mut out, &json::annotations_json(std::slice::from_ref(&marker))),
        Format::Table => render_events::write_marker(&mut out, &marker),
    }
    .map_err(|source| QueryError::Output { source })
}

pub fn series(args: SeriesArgs) -> Result<(), QueryError> {
    series_to(args, &mut std::io::stdout().lock())
}

/// `series`, its answer written to `out`.
pub fn series_to(args: SeriesArgs, mut out: &mut dyn Write) -> Result<(), QueryError> {
    let digest = digest_id(args.digest.as_deref())?;
    let of = match (args.of, digest) {
        (Some(SeriesOf::Digest) | None, Some(_)) => "digest",
        (Some(SeriesOf::Digest), None) => return Err(QueryError::NoDigest),
        (Some(SeriesOf::Statements) | None, _) => "statements",
        (Some(SeriesOf::Cost), _) => "cost",
    };
    let step_ms = args.step.as_deref().map(duration::parse).transpose()?.map_or(0, |d| d.as_millis() as i64);
    let request = SeriesRequest {
        of: of.to_string(),
        digest: digest.unwrap_or(0),
        instance: args.instance.clone().unwrap_or_default(),
        schema: args.schema.clone().unwrap_or_default(),
        since_unix_ms: since_unix_ms(&args.since)?,
        until_unix_ms: until_unix_ms(&args.until)?,
        step_ms,
        by_instance: false,
        by_digests: Vec::new(),
    };
    let answer = call(&args.connect, "Series", |mut client| async move { client.series(request).await })?;
    let cost = of == "cost";
    match args.format {
        Format::Json => render::write_json(&mut out, &json::series_json(&answer, cost)),
        Format::Table => render_series::write_series_table(&mut out, &answer, cost),
    }
    .map_err(|source| QueryError::Output { source })
}

pub fn instances(args: InstancesArgs) -> Result<(), QueryError> {
    instances_to(args, &mut std::io::stdout().lock())
}

/// `instances`, its answer written to `out`.
pub fn instances_to(args: InstancesArgs, mut out: &mut dyn Write) -> Result<(), QueryError> {
    let instances =
        call(&args.connect, "Instances", |mut client| async move { client.instances(InstancesRequest {}).await })?
            .instances;
    let now = now_unix_ms();
    match args.format {
        Format::Json => render::write_json(&mut out, &json::instances_json(&instances, now)),
        Format::Table => render::write_instances_table(&mut out, &instances, now),
    }
    .map_err(|source| QueryError::Output { source })
}

pub fn locks(args: LocksArgs) -> Result<(), QueryError> {
    locks_to(args, &mut std::io::stdout().lock())
}

/// `locks`, its answer written to `out`.
pub fn locks_to(args: LocksArgs, mut out: &mut dyn Write) -> Result<(), QueryError> {
    let request = LocksRequest {
        instance: args.instance.clone().unwrap_or_default(),
        since_unix_ms: since_unix_ms(&args.since)?,
        limit: args.limit,
    };
    let answer = call(&args.connect, "Locks", |mut client| async move { client.locks(request).await })?;
    if answer.left_out > 0 {
        eprintln!("{}", json::left_out_note(answer.left_out, "lock waits"));
    }
    let waits = answer.waits;
    match args.format {
        Format::Json => render::write_json(&mut out, &json::locks_json(&waits)),
        Format::Table => render::write_locks_table(&mut out, &waits),
    }
    .map_err(|source| QueryError::Output { source })
}

pub fn plans(args: PlansArgs) -> Result<(), QueryError> {
    plans_to(args, &mut std::io::stdout().lock())
}

/// `plans`, its answer written to `out`.
pub fn plans_to(args: PlansArgs, mut out: &mut dyn Write) -> Result<(), QueryError> {
    let request = PlansRequest {
        digest: digest_id(args.digest.as_deref())?.unwrap_or(0),
        schema: args.schema.clone().unwrap_or_default(),
        instance: args.instance.clone().unwrap_or_default(),
        since_unix_ms: since_unix_ms(&args.since)?,
        until_unix_ms: 0,
        limit: args.limit,
    };
    let answer = call(&args.connect, "Plans", |mut client| async move { client.plans(request).await })?;
    match args.format {
        Format::Json => render::write_json(&mut out, &json::plans_json(&answer)),
        Format::Table => render::write_plans_table(&mut out, &answer),
    }
    .map_err(|source| QueryError::Output { source })
}

pub fn activity(args: ActivityArgs) -> Result<(), QueryError> {
    activity_to(args, &mut std::io::stdout().lock())
}

/// `activity`, its answer written to `out`.
pub fn activity_to(args: ActivityArgs, mut out: &mut dyn Write) -> Result<(), QueryError> {
    let min_running_ms = if args.min_duration.trim() == "0" {
        0
    } else {
        duration::parse(&args.min_duration)
            .map_err(|source| QueryError::MinDuration { value: args.min_duration.clone(), source })?
            .as_millis() as u64
    };
    let request = ActivityRequest { instance: args.instance.clone().unwrap_or_default(), min_running_ms };
    let answer = call(&args.connect, "Activity", |mut client| async move { client.activity(request).await })?;
    if answer.left_out > 0 {
        eprintln!("{}", json::left_out_note(answer.left_out, "instances"));
    }
    let now = sqlbee_vocabulary::clock::now_unix_ms();
    match args.format {
        Format::Json => render::write_json(&mut out, &json::activity_json(&answer, now)),
        Format::Table => render::write_activity_table(&mut out, &answer, now),
    }
    .map_err(|source| QueryError::Output { source })
}

pub fn long(args: LongArgs) -> Result<(), QueryError> {
    long_to(args, &mut std::io::stdout().lock())
}

/// `long`, its answer written to `out`.
pub fn long_to(args: LongArgs, mut out: &mut dyn Write) -> Result<(), QueryError> {
    let request = LongStatementsRequest {
        instance: args.instance.clone().unwrap_or_default(),
        since_unix_ms: since_unix_ms(&args.since)?,
        limit: args.limit,
    };
    let answer =
        call(&args.connect, "LongStatements", |mut client| async move { client.long_statements(request).await })?;
    if answer.left_out > 0 {
        eprintln!("{}", json::left_out_note(answer.left_out, "statements"));
    }
    match args.format {
        Format::Json => render::write_json(&mut out, &json::long_statements_json(&answer.statements)),
        Format::Table => render::write_long_table(&mut out, &answer.statements),
    }
    .map_err(|source| QueryError::Output { source })
}

pub fn replication(args: ReplicationArgs) -> Result<(), QueryError> {
    replication_to(args, &mut std::io::stdout().lock())
}

/// `replication`, its answer written to `out`.
pub fn replication_to(args: ReplicationArgs, mut out: &mut dyn Write) -> Result<(), QueryError> {
    let request = ReplicationRequest {
        instance: args.instance.clone().unwrap_or_default(),
        since_unix_ms: since_unix_ms(&args.since)?,
        until_unix_ms: 0,
    };
    let answer = call(&args.connect, "Replication", |mut client| async move { client.replication(request).await })?;
    match args.format {
        Format::Json => render::write_json(&mut out, &json::replication_json(&answer)),
        Format::Table => render::write_replication_table(&mut out, &answer),
    }
    .map_err(|source| QueryError::Output { source })
}

pub fn tables(args: TablesArgs) -> Result<(), QueryError> {
    tables_to(args, &mut std::io::stdout().lock())
}

/// `tables`, its answer written to `out`.
pub fn tables_to(args: TablesArgs, mut out: &mut dyn Write) -> Result<(), QueryError> {
    let request = TablesRequest {
        instance: args.instance.clone().unwrap_or_default(),
        since_unix_ms: since_unix_ms(&args.since)?,
        until_unix_ms: 0,
        limit: args.limit,
    };
    let answer = call(&args.connect, "Tables", |mut client| async move { client.tables(request).await })?;
    match args.format {
        Format::Json => render::write_json(&mut out, &json::tables_json(&answer)),
        Format::Table => render::write_tables_table(&mut out, &answer),
    }
    .map_err(|source| QueryError::Output { source })
}

pub fn hosts(args: HostsArgs) -> Result<(), QueryError> {
    hosts_to(args, &mut std::io::stdout().lock())
}

/// `hosts`, its answer written to `out`.
pub fn hosts_to(args: HostsArgs, mut out: &mut dyn Write) -> Result<(), QueryError> {
    let request = HostsRequest {
        host: args.host.clone().unwrap_or_default(),
        since_unix_ms: since_unix_ms(&args.since)?,
        limit: args.limit,
    };
    let windows = call(&args.connect, "Hosts", |mut client| async move { client.hosts(request).await })?.windows;
    match args.format {
        Format::Json => render::write_json(&mut out, &json::hosts_json(&windows)),
        Format::Table => render_cost::write_hosts_table(&mut out, &windows),
    }
    .map_err(|source| QueryError::Output { source })
}
