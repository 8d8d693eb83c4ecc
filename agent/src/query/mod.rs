//! Query tools against a collector: `sqlbee top`, `sqlbee instances`,
//! `sqlbee locks` and `sqlbee hosts`. They reach the collector only
//! through the query API's client (`collector::query_api::client`) and the
//! wire types; `render` prints. This module parses flags and makes one call.
mod cells;
pub mod render;
pub mod render_cost;

use std::{path::PathBuf, time::Duration};

use clap::builder::PossibleValuesParser;
use sqlbee_proto::v1::{HostsRequest, InstancesRequest, LocksRequest, TopRequest};
use tonic::{Code, Status};

use sqlbee_common::{clock::now_unix_ms, duration};

use crate::collector::query_api::client::{self as api, Client, ClientError, ClientOptions};

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
    /// Windows that ended within this long ago (10s, 5m, 2h, 7d), or `all`.
    #[arg(long, default_value = "1h")]
    pub since: String,
    /// Only statements that ran in this schema (current database).
    #[arg(long)]
    pub schema: Option<String>,
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
    #[error("--since: {0}")]
    Since(#[from] duration::DurationError),
    #[error("the collector answered {what} with {:?}: {}{}", .status.code(), .status.message(), hint(.status.code()))]
    Rpc { what: &'static str, status: Status },
    #[error("cannot start the async runtime: {source}")]
    Runtime {
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

fn since_unix_ms(since: &str) -> Result<i64, QueryError> {
    if since == "all" {
        return Ok(0);
    }
    let back = duration::parse(since)?;
    Ok(now_unix_ms().saturating_sub(back.as_millis() as i64).max(0))
}

pub fn top(args: TopArgs) -> Result<(), QueryError> {
    let request = TopRequest {
        instance: args.instance.clone().unwrap_or_default(),
        schema: args.schema.clone().unwrap_or_default(),
        nested: args.nested,
        program: args.program.clone().unwrap_or_default(),
        since_unix_ms: since_unix_ms(&args.since)?,
        order_by: args.order_by.clone(),
        limit: args.limit,
    };
    let answer = call(&args.connect, "Top", |mut client| async move { client.top(request).await })?;
    let mut out = std::io::stdout().lock();
    match args.format {
        Format::Json => render::write_json(
            &mut out,
            &serde_json::json!({
                "digests": render::top_json(&answer.digests),
                "costs": render_cost::costs_json(&answer.costs),
            }),
        ),
        Format::Table => render::write_top_table(&mut out, &answer.digests)
            .and_then(|()| render_cost::write_costs(&mut out, &answer.costs)),
    }
    .map_err(|source| QueryError::Output { source })
}

pub fn instances(args: InstancesArgs) -> Result<(), QueryError> {
    let instances =
        call(&args.connect, "Instances", |mut client| async move { client.instances(InstancesRequest {}).await })?
            .instances;
    let now = now_unix_ms();
    let mut out = std::io::stdout().lock();
    match args.format {
        Format::Json => render::write_json(&mut out, &render::instances_json(&instances, now)),
        Format::Table => render::write_instances_table(&mut out, &instances, now),
    }
    .map_err(|source| QueryError::Output { source })
}

pub fn locks(args: LocksArgs) -> Result<(), QueryError> {
    let request = LocksRequest {
        instance: args.instance.clone().unwrap_or_default(),
        since_unix_ms: since_unix_ms(&args.since)?,
        limit: args.limit,
    };
    let waits = call(&args.connect, "Locks", |mut client| async move { client.locks(request).await })?.waits;
    let mut out = std::io::stdout().lock();
    match args.format {
        Format::Json => render::write_json(&mut out, &render::locks_json(&waits)),
        Format::Table => render::write_locks_table(&mut out, &waits),
    }
    .map_err(|source| QueryError::Output { source })
}

pub fn hosts(args: HostsArgs) -> Result<(), QueryError> {
    let request = HostsRequest {
        host: args.host.clone().unwrap_or_default(),
        since_unix_ms: since_unix_ms(&args.since)?,
        limit: args.limit,
    };
    let windows = call(&args.connect, "Hosts", |mut client| async move { client.hosts(request).await })?.windows;
    let mut out = std::io::stdout().lock();
    match args.format {
        Format::Json => render::write_json(&mut out, &render_cost::hosts_json(&windows)),
        Format::Table => render_cost::write_hosts_table(&mut out, &windows),
    }
    .map_err(|source| QueryError::Output { source })
}
