//! The one typed configuration of the agent. Every option is written once,
//! as a field of [`AgentOptions`]: its flag, environment variable, default
//! and help text are the field's clap attributes, and its TOML key is the
//! field's name. Values are merged (lowest first) from the defaults, a TOML
//! file (`--config`), `SQLBEE_*` environment variables and flags, then
//! checked once at start; a bad value is reported by name.
//!
//! The file is applied through the same parser as the flags: each key
//! becomes the flag of the same name, unless the environment or the
//! command line already set that option. So a file value is checked and
//! typed exactly like a flag, and an unknown key is an error that names it.
use std::{ffi::OsString, path::PathBuf, time::Duration};

use clap::{CommandFactory, FromArgMatches, Parser, ValueEnum, parser::ValueSource};
use serde::Deserialize;

use sqlbee_kernel_abi::{DEFAULT_TEXT_LIMIT, MAX_TEXT};

use crate::{budget::Step, normalize::Samples};

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read config file {path}: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("config file {path} is not valid TOML: {source}")]
    Parse {
        path: PathBuf,
        #[source]
        source: toml::de::Error,
    },
    #[error("config file {path}: unknown key `{key}`; the keys are the flags' names in snake_case: {known}")]
    UnknownKey { path: PathBuf, key: String, known: String },
    #[error("config file {path}: `{key}`: {detail}")]
    FileValue { path: PathBuf, key: String, detail: String },
    #[error("{0}")]
    Args(String),
    #[error("collector connection settings: {0}")]
    Client(#[from] sqlbee_proto::client::ClientError),
    #[error("`{field}` = {value} is out of range: {expected}")]
    Range { field: &'static str, value: u64, expected: String },
    #[error(transparent)]
    Login(#[from] crate::server_login::LoginError),
    #[error("`explain_rate` = {0} is out of range: 0.01..=100 per second")]
    ExplainRate(f64),
    #[error("`query_tags`: {0}")]
    QueryTags(String),
    #[error("`figures`: {0}")]
    Figures(String),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum OutputFormat {
    /// One JSON object per digest per window, plus one summary per instance.
    Jsonl,
    /// A readable top list per window.
    Table,
}

/// Every option of `sqlbee agent`, each written once. Flags win over
/// `SQLBEE_*` variables, which win over the `--config` file, which wins
/// over the defaults shown here.
#[derive(Parser, Debug, Clone)]
pub struct AgentOptions {
    /// TOML file with the keys below (the flags' names in snake_case).
    #[arg(long, env = "SQLBEE_CONFIG")]
    pub config: Option<PathBuf>,
    /// Trace only these server pids (repeatable); default: every
    /// mariadbd/mysqld on the host. A traced server that restarts is
    /// followed to its new pid. TOML key: `pids`.
    #[arg(long = "pid", id = "pids", value_name = "PID", env = "SQLBEE_PID", value_delimiter = ',')]
    pub pids: Vec<u32>,
    /// Stdout format; default jsonl, or none when --collector is given.
    #[arg(long, value_enum, env = "SQLBEE_OUTPUT")]
    pub output: Option<OutputFormat>,
    /// Ship windows to this collector (http://host:port or https://...),
    /// or to the first of a comma-separated list that answers: the agent
    /// fails over to the next when one is down, and stays where it
    /// succeeds.
    #[arg(long, env = "SQLBEE_COLLECTOR", value_parser = collector_url)]
    pub collector: Option<String>,
    /// Where the agent keeps its id, batch counter and spool.
    #[arg(long, env = "SQLBEE_STATE_DIR", default_value = "/var/lib/sqlbee")]
    pub state_dir: PathBuf,
    /// Spool size limit in bytes; when full the oldest batches are dropped
    /// and reported as a gap.
    #[arg(long, env = "SQLBEE_SPOOL_LIMIT", default_value_t = 512 << 20)]
    pub spool_limit: u64,
    /// Share of the spool's filesystem (percent) always left free; with
    /// --spool-min-free-bytes, whichever is less. The database often
    /// shares that disk.
    #[arg(long, env = "SQLBEE_SPOOL_MIN_FREE_PERCENT", default_value_t = 10, value_parser = clap::value_parser!(u8).range(0..=100))]
    pub spool_min_free_percent: u8,
    /// Bytes of the spool's filesystem always left free (see
    /// --spool-min-free-percent).
    #[arg(long, env = "SQLBEE_SPOOL_MIN_FREE_BYTES", default_value_t = 1 << 30)]
    pub spool_min_free_bytes: u64,
    /// File holding the bearer token for the collector.
    #[arg(long, env = "SQLBEE_TOKEN_FILE")]
    pub token_file: Option<PathBuf>,
    /// CA certificate (PEM) to verify the collector.
    #[arg(long, env = "SQLBEE_CA_CERT")]
    pub ca_cert: Option<PathBuf>,
    /// Client certificate (PEM) for mutual TLS.
    #[arg(long, env = "SQLBEE_CLIENT_CERT")]
    pub client_cert: Option<PathBuf>,
    /// Client private key (PEM) for mutual TLS.
    #[arg(long, env = "SQLBEE_CLIENT_KEY")]
    pub client_key: Option<PathBuf>,
    /// Batches per second when replaying a backlog.
    #[arg(long, env = "SQLBEE_REPLAY_RATE", default_value_t = 20, value_parser = clap::value_parser!(u32).range(1..))]
    pub replay_rate: u32,
    /// Length of an aggregation window (100ms..=1h).
    #[arg(long, env = "SQLBEE_WINDOW", default_value = "10s", value_parser = duration)]
    pub window: Duration,
    /// Statement text bytes captured per statement (at most 16384).
    #[arg(long, env = "SQLBEE_TEXT_LIMIT", default_value_t = DEFAULT_TEXT_LIMIT)]
    pub text_limit: u32,
    /// Digests kept per instance per window (at most 50000, what a
    /// collector accepts); the rest are counted in an overflow row.
    #[arg(long, env = "SQLBEE_MAX_DIGESTS", default_value_t = 5000)]
    pub max_digests: usize,
    /// Kernel ring buffer per server, bytes (a power of two).
    #[arg(long, env = "SQLBEE_RING_BYTES", default_value_t = 8 << 20)]
    pub ring_bytes: u32,
    /// How often the ring buffers are drained.
    #[arg(long, env = "SQLBEE_DRAIN_INTERVAL", default_value = "100ms", value_parser = duration)]
    pub drain_interval: Duration,
    /// Stop after this long (default: run until SIGINT/SIGTERM).
    #[arg(long, env = "SQLBEE_DURATION", value_parser = duration)]
    pub duration: Option<Duration>,
    /// Write this file once the initial servers are attached.
    #[arg(long, env = "SQLBEE_READY_FILE")]
    pub ready_file: Option<PathBuf>,
    /// Rows per window in `--output table`.
    #[arg(long, env = "SQLBEE_TABLE_ROWS", default_value_t = 20)]
    pub table_rows: usize,
    /// Also attach the wait-class probes (`waits` per digest and one
    /// lock-wait record per long wait). They trap whenever a thread waits,
    /// including each connection's idle network read: about one more trap
    /// per statement on a busy server.
    #[arg(long, env = "SQLBEE_WAIT_PROBES")]
    pub wait_probes: bool,
    /// Also attach the command-start probe: exact counts of commands that
    /// are not statements (PREPARE, CLOSE, PING, QUIT, ...), at one more
    /// trap per command. Without it per-command counts count statements.
    #[arg(long, env = "SQLBEE_COMMAND_PROBE")]
    pub command_probe: bool,
    /// Every optional probe: `--wait-probes --command-probe`.
    #[arg(long, env = "SQLBEE_ALL_PROBES")]
    pub all_probes: bool,
    /// CPU the agent allows itself, in cores (0.01..=64), enforced by its
    /// own cgroup.
    #[arg(long, env = "SQLBEE_CPU_LIMIT", default_value_t = 1.0)]
    pub cpu_limit: f64,
    /// Memory the agent allows itself, MiB (64..=1048576).
    #[arg(long, env = "SQLBEE_MEMORY_LIMIT_MIB", default_value_t = 1024)]
    pub memory_limit_mib: u64,
    /// Do not move the agent into its own cgroup (limits not enforced).
    #[arg(long, env = "SQLBEE_NO_CGROUP")]
    pub no_cgroup: bool,
    /// Keep every capability the agent was started with. By default it
    /// keeps only CAP_BPF, CAP_PERFMON and CAP_SYS_PTRACE after start, and
    /// sets no_new_privs.
    #[arg(long, env = "SQLBEE_KEEP_PRIVILEGES")]
    pub keep_privileges: bool,
    /// Serve Prometheus metrics on this address, e.g. 127.0.0.1:9187; a
    /// port alone (`9187`) binds to loopback.
    #[arg(long, env = "SQLBEE_METRICS_LISTEN")]
    pub metrics_listen: Option<String>,
    /// Text hashes counted in the kernel (slots per server): their
    /// statements are counted there instead of sent one by one. 0 sends
    /// every statement. Default: as many as 32 MiB of per-CPU maps hold,
    /// at most 4096. Off with `--wait-probes`, whose lock-wait records need
    /// every statement of every connection.
    #[arg(long, env = "SQLBEE_KERNEL_DIGESTS")]
    pub kernel_digests: Option<u32>,
    /// Budget mode: keep the probes' CPU in mysqld under this share of
    /// mysqld's own CPU (e.g. `1%` or `0.01`) by attaching them part of
    /// the time. Counts then sample the attached time; the agent marks
    /// them as estimates and reports the attached fraction.
    #[arg(long, env = "SQLBEE_MYSQLD_OVERHEAD_BUDGET", value_parser = fraction)]
    pub mysqld_overhead_budget: Option<f64>,
    /// Budget mode: one attach-and-detach cycle (100ms..=10min). Every
    /// switch costs mysqld CPU of its own (about 30 ms a cycle measured
    /// here at 8k QPS), so a 1 s cycle alone spent 5x a 1% budget; shorter
    /// cycles sample time more evenly.
    #[arg(long, env = "SQLBEE_DUTY_PERIOD", default_value = "10s", value_parser = duration)]
    pub duty_period: Duration,
    /// The agent never sheds less than this step (see the manual, budget mode):
    /// `no-samples` or `known-texts-only` keep it there even when calm.
    #[arg(long, env = "SQLBEE_SHEDDING_FLOOR", value_enum, default_value_t = Step::Exact)]
    pub shedding_floor: Step,
    /// Statement samples (one per digest per window, and the waiting
    /// statement of a lock wait): `redacted` replaces every literal with
    /// `?`, `raw` keeps them (statements that carry a password or key are
    /// redacted all the same), `off` sends none. Error messages quote no
    /// value unless `raw`.
    #[arg(long, env = "SQLBEE_SAMPLES", value_enum, default_value_t = Samples::Redacted)]
    pub samples: Samples,
    /// Report each wait at least this long as a lock-wait record with
    /// candidate blockers (0 turns it off).
    #[arg(long, env = "SQLBEE_LOCK_WAIT_THRESHOLD", default_value = "50ms", value_parser = duration)]
    pub lock_wait_threshold: Duration,
    /// Log in to each traced server to collect plans (EXPLAIN FORMAT=JSON):
    /// a TOML file with `user` and `password` or `password_file`, mode
    /// 0600 or 0400, owned by the agent's user. The agent finds the
    /// server's socket itself. Without it, no plans; counting never needs it.
    #[arg(long, env = "SQLBEE_SERVER_LOGIN")]
    pub server_login: Option<PathBuf>,
    /// EXPLAINs per second per server, at most (0.01..=100).
    #[arg(long, env = "SQLBEE_EXPLAIN_RATE", default_value_t = 1.0)]
    pub explain_rate: f64,
    /// How often the plans of the costliest digests are asked again.
    #[arg(long, env = "SQLBEE_PLAN_REFRESH", default_value = "1h", value_parser = duration)]
    pub plan_refresh: Duration,
    /// The shortest gap between two EXPLAINs of one digest whose latency
    /// or rows examined per statement changed twofold.
    #[arg(long, env = "SQLBEE_PLAN_RECHECK", default_value = "1m", value_parser = duration)]
    pub plan_recheck: Duration,
    /// How often each traced server's connections are read from its memory
    /// and sent to the collector as live activity (0 turns it off). The
    /// reads cost the server no trap; with --server-login they add the
    /// blockers the server names.
    #[arg(long, env = "SQLBEE_ACTIVITY_INTERVAL", default_value = "1s", value_parser = duration)]
    pub activity_interval: Duration,
    /// A statement that runs at least this long is also reported as an
    /// event of its own (with its text, duration, waits and blocker), as
    /// is every statement that was killed or whose client went away (0
    /// reports only those).
    #[arg(long, env = "SQLBEE_LONG_STATEMENT", default_value = "10s", value_parser = duration)]
    pub long_statement: Duration,
    /// Query tags to count per digest, from the comments frameworks put in
    /// statements (sqlcommenter's `key='value'`, marginalia's `key:value`):
    /// comma-separated keys, or `none`. Values that look like literals are
    /// replaced unless --samples raw. A `traceparent` is never a tag: the
    /// slowest traced statement of each digest and window is kept as an
    /// exemplar (unless `none`).
    #[arg(long, env = "SQLBEE_QUERY_TAGS", value_delimiter = ',', default_value = crate::normalize::tags::DEFAULT_KEYS)]
    pub query_tags: Vec<String>,
    /// Do not name each connection's client (its address, and for a client
    /// on this node its process, container and pod). Naming costs a few
    /// reads of /proc once per connection, none per statement.
    #[arg(long, env = "SQLBEE_NO_CLIENTS")]
    pub no_clients: bool,
    /// Do not time what a replica applies. Its probes fire only on the
    /// replica's applier, twice per replicated event: catching up on a
    /// row-based stream they added about a fifth to the apply time here
    /// (see the manual's Replicas page).
    #[arg(long, env = "SQLBEE_NO_REPLICA_PROBES")]
    pub no_replica_probes: bool,
    /// Which of the server's own figures to read per statement: `all`,
    /// `lean` (none: every statement is still counted and timed, with its
    /// digest, lock time, errors, schema and account), or `lean` plus
    /// figure names (`lean,rows_examined,cpu_ns`). A figure not read costs
    /// mysqld nothing and is absent from every output, never 0.
    #[arg(long, env = "SQLBEE_FIGURES", value_delimiter = ',', default_value = "all")]
    pub figures: Vec<String>,
    /// Where a statement's end is seen: `uprobe` (one trap per statement in
    /// the server, every statement) or, experimental, `send` (the answer's
    /// syscall, no trap: only clients' statements over a socket, at the
    /// `sendto` and `write` tracepoints, which put every syscall on the host
    /// through the kernel's tracing path; without tracefs, or where the
    /// kernel refuses them, it falls back to `send-raw`, a program at every
    /// syscall; see the manual's Probes page).
    #[arg(long, env = "SQLBEE_STATEMENT_HOOK", value_enum, default_value_t = crate::probe::StatementHook::Uprobe)]
    pub statement_hook: crate::probe::StatementHook,
}

/// Validated agent configuration: the options as given, and what the
/// stages need worked out from them.
#[derive(Clone, Debug)]
pub struct AgentConfig {
    pub options: AgentOptions,
    /// None: nothing on stdout (shipping only).
    pub output: Option<OutputFormat>,
    pub ship: Option<crate::ship::ShipConfig>,
    pub wait_probes: bool,
    pub command_probe: bool,
    /// Slots of the kernel digests per server; 0: off.
    pub kernel_digests: u32,
    /// None: `--no-cgroup`.
    pub budget: Option<crate::budget::BudgetConfig>,
    /// Waits at least this long become lock-wait records (0: off).
    pub long_wait_us: u32,
    /// How often /proc is rescanned for started, restarted or gone servers.
    pub rescan_interval: Duration,
    pub normalize_cache: usize,
    /// None: no `--server-login`, no plans.
    pub plans: Option<crate::plans::PlanConfig>,
    /// None: `--activity-interval 0`, or nothing to send it to.
    pub activity: Option<crate::activity::ActivityConfig>,
    /// The server's figures the programs read (`--figures`).
    pub figures: crate::probe::FigureChoice,
}

impl AgentConfig {
    /// What reads each statement's query tags; None for `--query-tags none`.
    pub fn tag_reader(&self) -> Option<crate::normalize::TagReader> {
        let keys = &self.options.query_tags;
        let none = keys.iter().all(|k| k.trim().is_empty() || k.trim().eq_ignore_ascii_case("none"));
        (!none).then(|| crate::normalize::TagReader::new(keys, self.options.samples))
    }
}

const MAX_KERNEL_DIGESTS: u32 = sqlbee_kernel_abi::kernel_digests::MAX_SLOTS;

/// `250ms`, `10s`, `5m`, `2h`, `7d`; `0` is zero.
fn duration(value: &str) -> Result<Duration, String> {
    if value.trim() == "0" {
        return Ok(Duration::ZERO);
    }
    sqlbee_vocabulary::duration::parse(value).map_err(|e| e.to_string())
}

/// `1%`, `0.5 %` or `0.01`: a fraction in (0, 1].
fn fraction(value: &str) -> Result<f64, String> {
    let value = value.trim();
    let parsed = match value.strip_suffix('%') {
        Some(percent) => percent.trim().parse::<f64>().map(|p| p / 100.0),
        None => value.parse::<f64>(),
    };
    match parsed {
        Ok(f) if f > 0.0 && f <= 1.0 => Ok(f),
        _ => Err(format!("{value:?}: expected a share such as 1% or 0.01, above 0 and at most 100%")),
    }
}

fn collector_url(urls: &str) -> Result<String, String> {
    for url in urls.split(',') {
        if url.is_empty() {
            return Err(format!("{urls:?} has an empty URL; separate collectors with single commas"));
        }
        if !(url.starts_with("http://") || url.starts_with("https://")) {
            return Err(format!("{url:?} must start with http:// or https://"));
        }
    }
    Ok(urls.to_string())
}

/// Slots that fit 32 MiB of kernel digests (two epochs, one copy per CPU),
/// between 64 and 4096.
fn default_kernel_digests() -> u32 {
    let cpus = aya::util::nr_cpus().map(|n| n.get()).unwrap_or(1) as usize;
    let per_slot = 2 * cpus * std::mem::size_of::<sqlbee_kernel_abi::SlotStats>();
    ((32usize << 20) / per_slot).clamp(64, 4096) as u32
}

impl AgentOptions {
    /// Options from `args` (what follows `sqlbee agent`), the process's
    /// environment and the file `--config` names, merged and checked.
    pub fn resolve<I, T>(args: I) -> Result<AgentConfig, ConfigError>
    where
        I: IntoIterator<Item = T>,
        T: Into<OsString> + Clone,
    {
        let args: Vec<OsString> = args.into_iter().map(Into::into).collect();
        let parse = |args: &[OsString]| {
            command()
                .try_get_matches_from(args)
                .map_err(|e| ConfigError::Args(e.render().to_string().trim_end().to_string()))
        };
        let matches = parse(&args)?;
        let given = AgentOptions::from_arg_matches(&matches).map_err(|e| ConfigError::Args(e.to_string()))?;
        let options = match &given.config {
            None => given,
            Some(path) => {
                let mut merged = args.clone();
                merged.extend(file_args(path, &matches)?);
                let matches = parse(&merged)?;
                AgentOptions::from_arg_matches(&matches).map_err(|e| ConfigError::Args(e.to_string()))?
            }
        };
        options.into_config()
    }

    fn into_config(self) -> Result<AgentConfig, ConfigError> {
        let wait_probes = self.all_probes || self.wait_probes;
        let output = match (self.output, &self.collector) {
            (Some(format), _) => Some(format),
            (None, Some(_)) => None,
            (None, None) => Some(OutputFormat::Jsonl),
        };
        let ship = match &self.collector {
            None => None,
            Some(urls) => {
                let token = self.token_file.as_deref().map(sqlbee_proto::client::read_token_file).transpose()?;
                let mut targets = Vec::new();
                for url in urls.split(',') {
                    let target = sqlbee_proto::client::ClientOptions {
                        url: url.to_string(),
                        token: token.clone(),
                        ca_cert: self.ca_cert.clone(),
                        client_cert: self.client_cert.clone(),
                        client_key: self.client_key.clone(),
                        request_timeout: Some(Duration::from_secs(10)),
                        ..Default::default()
                    };
                    // Checked now so a bad URL or TLS file stops the agent at start.
                    sqlbee_proto::client::endpoint(&target)?;
                    if target.token.is_some() && url.starts_with("http://") {
                        tracing::warn!(collector = %url, "the bearer token travels in clear text: use https:// with --ca-cert");
                    }
                    targets.push(target);
                }
                Some(crate::ship::ShipConfig {
                    targets,
                    state_dir: self.state_dir.clone(),
                    spool_limit_bytes: self.spool_limit,
                    disk_floor: crate::ship::DiskFloor {
                        percent: self.spool_min_free_percent,
                        bytes: self.spool_min_free_bytes,
                    },
                    max_batch_bytes: 4 << 20,
                    replay_interval: Duration::from_secs(1) / self.replay_rate.max(1),
                    shutdown_grace: Duration::from_secs(5),
                    host: crate::procfs::hostname(),
                })
            }
        };
        let mut config = AgentConfig {
            output,
            ship,
            wait_probes,
            command_probe: self.all_probes || self.command_probe,
            kernel_digests: match self.kernel_digests {
                _ if wait_probes => 0,
                Some(slots) => slots,
                None => default_kernel_digests(),
            },
            budget: (!self.no_cgroup).then_some(crate::budget::BudgetConfig {
                cpu_cores: self.cpu_limit,
                memory_bytes: self.memory_limit_mib << 20,
            }),
            long_wait_us: self.lock_wait_threshold.as_micros().min(u32::MAX as u128) as u32,
            rescan_interval: Duration::from_millis(500),
            normalize_cache: 20_000,
            plans: match &self.server_login {
                None => None,
                Some(path) => Some(crate::plans::PlanConfig {
                    login: crate::server_login::ServerLogin::load(path)?,
                    explain_rate: self.explain_rate,
                    refresh: self.plan_refresh,
                    recheck: self.plan_recheck,
                    samples: self.samples,
                }),
            },
            activity: None,
            figures: crate::probe::FigureChoice::parse(&self.figures).map_err(ConfigError::Figures)?,
            options: self,
        };
        if !config.options.activity_interval.is_zero() && config.ship.is_some() {
            config.activity = Some(crate::activity::ActivityConfig {
                interval: config.options.activity_interval.max(Duration::from_millis(100)),
                samples: config.options.samples,
                login: config.plans.as_ref().map(|p| p.login.clone()),
            });
        }
        config.validate()?;
        Ok(config)
    }
}

/// The options as a command of their own: what follows `sqlbee agent`.
fn command() -> clap::Command {
    AgentOptions::command().no_binary_name(true).name("sqlbee agent")
}

/// The file's keys as flags, for the options neither the command line nor
/// the environment set. Each value is checked here, alone, so an error
/// names its key and the file.
fn file_args(path: &std::path::Path, matches: &clap::ArgMatches) -> Result<Vec<OsString>, ConfigError> {
    let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read { path: path.into(), source })?;
    let table: toml::Table =
        toml::from_str(&text).map_err(|source| ConfigError::Parse { path: path.into(), source })?;
    let command = command();
    let known = || {
        command.get_arguments().filter(|a| a.get_id() != "config").map(|a| a.get_id().to_string()).collect::<Vec<_>>()
    };
    let mut out = Vec::new();
    for (key, value) in table {
        // The one key older files spelled otherwise.
        let (key, value) = match (key.as_str(), value) {
            ("cgroup", toml::Value::Boolean(on)) => ("no_cgroup".to_string(), toml::Value::Boolean(!on)),
            (_, value) => (key, value),
        };
        let bad = |detail: String| ConfigError::FileValue { path: path.into(), key: key.clone(), detail };
        let arg = command.get_arguments().find(|a| a.get_id() == key.as_str() && key != "config").ok_or_else(|| {
            ConfigError::UnknownKey { path: path.into(), key: key.clone(), known: known().join(", ") }
        })?;
        if matches!(matches.value_source(&key), Some(ValueSource::CommandLine | ValueSource::EnvVariable)) {
            continue;
        }
        let flag = format!("--{}", arg.get_long().unwrap_or(&key));
        let takes_value = arg.get_action().takes_values();
        let values = match value {
            toml::Value::Array(items) => items,
            one => vec![one],
        };
        let mut args = Vec::new();
        for value in values {
            match (value, takes_value) {
                (toml::Value::Boolean(true), false) => args.push(OsString::from(&flag)),
                (toml::Value::Boolean(false), false) => {}
                (_, false) => return Err(bad("expected true or false".into())),
                (toml::Value::String(s), true) => args.push(format!("{flag}={s}").into()),
                (toml::Value::Integer(n), true) => args.push(format!("{flag}={n}").into()),
                (toml::Value::Float(x), true) => args.push(format!("{flag}={x}").into()),
                (toml::Value::Boolean(b), true) => args.push(format!("{flag}={b}").into()),
                (other, true) => return Err(bad(format!("{other} is not a value this option takes"))),
            }
        }
        // Checked alone, so the message is about this key.
        if let Err(e) = command.clone().try_get_matches_from(&args) {
            let detail = e.render().to_string();
            return Err(bad(detail
                .lines()
                .next()
                .unwrap_or("invalid value")
                .trim_start_matches("error: ")
                .to_string()));
        }
        out.extend(args);
    }
    Ok(out)
}

impl AgentConfig {
    fn validate(&self) -> Result<(), ConfigError> {
        let o = &self.options;
        let range = |field, value: u64, ok: bool, expected: &str| {
            if ok { Ok(()) } else { Err(ConfigError::Range { field, value, expected: expected.to_string() }) }
        };
        range("text_limit", o.text_limit as u64, o.text_limit as usize <= MAX_TEXT, &format!("0..={MAX_TEXT}"))?;
        range(
            "ring_bytes",
            o.ring_bytes as u64,
            o.ring_bytes.is_power_of_two() && o.ring_bytes >= 4096 && o.ring_bytes <= 1 << 30,
            "a power of two between 4096 and 1073741824",
        )?;
        range("max_digests", o.max_digests as u64, (1..=50_000).contains(&o.max_digests), "1..=50000")?;
        let digests_ok = self.kernel_digests <= MAX_KERNEL_DIGESTS;
        range("kernel_digests", self.kernel_digests as u64, digests_ok, &format!("0..={MAX_KERNEL_DIGESTS}"))?;
        if let Some(budget) = &self.budget {
            let ok = (0.01..=64.0).contains(&budget.cpu_cores);
            if !ok {
                return Err(ConfigError::Range {
                    field: "cpu_limit",
                    value: budget.cpu_cores as u64,
                    expected: "0.01..=64 cores".into(),
                });
            }
            let mib = budget.memory_bytes >> 20;
            range("memory_limit_mib", mib, (64..=1 << 20).contains(&mib), "64..=1048576")?;
        }
        let ms = o.window.as_millis() as u64;
        range("window", ms, (100..=3_600_000).contains(&ms), "100ms..=1h")?;
        let ms = o.duty_period.as_millis() as u64;
        range("duty_period", ms, (100..=600_000).contains(&ms), "100ms..=10min")?;
        if !(0.01..=100.0).contains(&o.explain_rate) {
            return Err(ConfigError::ExplainRate(o.explain_rate));
        }
        crate::normalize::tags::check_keys(&o.query_tags).map_err(ConfigError::QueryTags)?;
        let ms = o.drain_interval.as_millis() as u64;
        range(
            "drain_interval",
            ms,
            (1..=10_000).contains(&ms) && o.drain_interval <= o.window,
            "1ms..=10s and at most the window",
        )?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Tests that set `SQLBEE_*` variables hold this, and every test that
    /// resolves options too, so none sees another's environment.
    static ENV: std::sync::Mutex<()> = std::sync::Mutex::new(());

    fn resolve(args: &[&str]) -> Result<AgentConfig, ConfigError> {
        AgentOptions::resolve(args.iter().map(|a| a.to_string()))
    }

    fn temp_file(name: &str, text: &str) -> (PathBuf, PathBuf) {
        let dir = std::env::temp_dir().join(format!("sqlbee-config-{name}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("agent.toml");
        std::fs::write(&path, text).unwrap();
        (dir, path)
    }

    #[test]
    fn durations() {
        assert_eq!(duration("250ms").unwrap(), Duration::from_millis(250));
        assert_eq!(duration("10s").unwrap(), Duration::from_secs(10));
        assert_eq!(duration("2m").unwrap(), Duration::from_secs(120));
        assert_eq!(duration("7d").unwrap(), Duration::from_secs(7 * 86_400));
        assert_eq!(duration("0").unwrap(), Duration::ZERO);
        assert!(duration("soon").unwrap_err().contains("10s"));
    }

    #[test]
    fn validation_names_the_field() {
        let _env = ENV.lock().unwrap_or_else(|e| e.into_inner());
        let err = resolve(&["--text-limit", "1048576"]).unwrap_err().to_string();
        assert!(err.contains("text_limit"), "{err}");
        assert!(resolve(&["--ring-bytes", "5000"]).unwrap_err().to_string().contains("power of two"));
        let err = resolve(&["--window", "soon"]).unwrap_err().to_string();
        assert!(err.contains("--window") && err.contains("soon"), "{err}");
        let err = resolve(&["--collector", "collector:7878"]).unwrap_err().to_string();
        assert!(err.contains("http://"), "{err}");
        let err = resolve(&["--mysqld-overhead-budget", "200%"]).unwrap_err().to_string();
        assert!(err.contains("1%"), "{err}");
        let err = resolve(&["--figures", "lean,rows_scanned"]).unwrap_err().to_string();
        assert!(err.contains("figures") && err.contains("rows_scanned") && err.contains("rows_examined"), "{err}");
    }

    /// `--figures` from a flag and from the file's list.
    #[test]
    fn figures_are_chosen_by_flag_or_file() {
        use crate::probe::FigureChoice;
        use sqlbee_figures::needs;
        let _env = ENV.lock().unwrap_or_else(|e| e.into_inner());
        assert_eq!(resolve(&[]).unwrap().figures, FigureChoice::ALL);
        assert_eq!(resolve(&["--figures", "lean"]).unwrap().figures, FigureChoice::LEAN);
        let (dir, path) = temp_file("figures", "figures = [\"lean\", \"cpu_ns\"]\n");
        let chosen = resolve(&["--config", path.to_str().unwrap()]).unwrap().figures;
        assert!(chosen.wants(needs::CPU) && !chosen.wants(needs::ROWS_EXAMINED), "{chosen:?}");
        std::fs::remove_dir_all(dir).unwrap();
    }

    /// defaults < file < environment < flags, each option on its own.
    #[test]
    fn precedence_is_defaults_file_environment_flags() {
        let _env = ENV.lock().unwrap_or_else(|e| e.into_inner());
        let (dir, path) = temp_file(
            "precedence",
            "window = \"5s\"\ntext_limit = 1024\nmax_digests = 7\nwait_probes = true\npids = [11, 12]\n\
             shedding_floor = \"no-samples\"\nmysqld_overhead_budget = \"2%\"\n",
        );
        let config = resolve(&["--config", path.to_str().unwrap()]).unwrap();
        let o = &config.options;
        assert_eq!(o.window, Duration::from_secs(5), "file over default");
        assert_eq!((o.text_limit, o.max_digests, o.pids.as_slice()), (1024, 7, &[11, 12][..]));
        assert!(config.wait_probes && o.shedding_floor == Step::NoSamples);
        assert_eq!(o.mysqld_overhead_budget, Some(0.02));
        assert_eq!(o.ring_bytes, 8 << 20, "default where nobody said anything");

        // SAFETY: ENV serialises every test of this module that reads or
        // writes the environment.
        unsafe {
            std::env::set_var("SQLBEE_TEXT_LIMIT", "2000");
            std::env::set_var("SQLBEE_MAX_DIGESTS", "9");
        }
        let config = resolve(&["--config", path.to_str().unwrap(), "--max-digests", "11"]);
        // SAFETY: as above.
        unsafe {
            std::env::remove_var("SQLBEE_TEXT_LIMIT");
            std::env::remove_var("SQLBEE_MAX_DIGESTS");
        }
        let config = config.unwrap();
        let o = &config.options;
        assert_eq!(o.window, Duration::from_secs(5), "file");
        assert_eq!(o.text_limit, 2000, "environment over file");
        assert_eq!(o.max_digests, 11, "flag over environment and file");
        std::fs::remove_dir_all(dir).ok();
    }

    #[test]
    fn older_cgroup_key_still_reads() {
        let _env = ENV.lock().unwrap_or_else(|e| e.into_inner());
        let (dir, path) = temp_file("legacy", "cgroup = false\n");
        assert!(resolve(&["--config", path.to_str().unwrap()]).unwrap().budget.is_none());
        assert!(resolve(&[]).unwrap().budget.is_some());
        std::fs::remove_dir_all(dir).ok();
    }

    #[test]
    fn file_errors_name_the_key() {
        let _env = ENV.lock().unwrap_or_else(|e| e.into_inner());
        for (name, text, expected) in [
            ("unknown", "windw = \"5s\"\n", "unknown key `windw`"),
            ("value", "text_limit = \"lots\"\n", "`text_limit`"),
            ("duration", "window = \"soon\"\n", "`window`"),
            ("flag", "wait_probes = \"yes\"\n", "`wait_probes`: expected true or false"),
            ("config", "config = \"/other.toml\"\n", "unknown key `config`"),
        ] {
            let (dir, path) = temp_file(name, text);
            let err = resolve(&["--config", path.to_str().unwrap()]).unwrap_err().to_string();
            assert!(err.contains(expected) && err.contains("agent.toml"), "{name}: {err}");
            std::fs::remove_dir_all(dir).ok();
        }
    }
}
