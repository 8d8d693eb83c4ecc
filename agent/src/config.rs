//! The one typed configuration of a role, merged from (lowest first)
//! built-in defaults, a TOML file (`--config`), `SQLBEE_*` environment
//! variables and command-line flags, then validated once at start.
use std::{path::PathBuf, time::Duration};

use clap::{Args, ValueEnum};
use serde::Deserialize;

use agent_common::{DEFAULT_TEXT_LIMIT, MAX_TEXT};

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read config file {path}: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("config file {path} is not valid: {source}")]
    Parse {
        path: PathBuf,
        #[source]
        source: toml::de::Error,
    },
    #[error("`{field}` = {value:?} is not a duration; write it like 500ms, 10s or 2m")]
    Duration { field: &'static str, value: String },
    #[error("--collector {url:?} must start with http:// or https://")]
    Collector { url: String },
    #[error("collector connection settings: {0}")]
    Client(#[from] crate::client::ClientError),
    #[error("`{field}` = {value} is out of range: {expected}")]
    Range { field: &'static str, value: u64, expected: String },
    #[error("{field} = {value:?}: expected a share such as 1% or 0.01, above 0 and at most 100%")]
    Fraction { field: &'static str, value: String },
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum OutputFormat {
    /// One JSON object per digest per window, plus one summary per instance.
    Jsonl,
    /// A readable top list per window.
    Table,
}

/// Flags of `sqlbee agent`; every one can also come from the environment or
/// the config file.
#[derive(Args, Debug, Default, Clone)]
pub struct AgentArgs {
    /// TOML file with the same keys as these flags (snake_case).
    #[arg(long, env = "SQLBEE_CONFIG")]
    pub config: Option<PathBuf>,
    /// Trace only these server pids (repeatable); default: every
    /// mariadbd/mysqld on the host. A traced server that restarts is
    /// followed to its new pid.
    #[arg(long = "pid", env = "SQLBEE_PID", value_delimiter = ',')]
    pub pids: Vec<u32>,
    /// Stdout format; default jsonl, or none when --collector is given.
    #[arg(long, value_enum, env = "SQLBEE_OUTPUT")]
    pub output: Option<OutputFormat>,
    /// Ship windows to this collector (http://host:port or https://...).
    #[arg(long, env = "SQLBEE_COLLECTOR")]
    pub collector: Option<String>,
    /// Where the agent keeps its id, batch counter and spool.
    #[arg(long, env = "SQLBEE_STATE_DIR")]
    pub state_dir: Option<PathBuf>,
    /// Spool size limit in bytes (default 512 MiB); when full the oldest
    /// batches are dropped and reported as a gap.
    #[arg(long, env = "SQLBEE_SPOOL_LIMIT")]
    pub spool_limit: Option<u64>,
    /// File holding the bearer token for the collector.
    #[arg(long, env = "SQLBEE_TOKEN_FILE")]
    pub token_file: Option<PathBuf>,
    /// CA certificate (PEM) to verify the collector.
    #[arg(long, env = "SQLBEE_CA_CERT")]
    pub ca_cert: Option<PathBuf>,
    /// Client certificate and key (PEM) for mutual TLS.
    #[arg(long, env = "SQLBEE_CLIENT_CERT")]
    pub client_cert: Option<PathBuf>,
    #[arg(long, env = "SQLBEE_CLIENT_KEY")]
    pub client_key: Option<PathBuf>,
    /// Batches per second when replaying a backlog (default 20).
    #[arg(long, env = "SQLBEE_REPLAY_RATE")]
    pub replay_rate: Option<u32>,
    /// Length of an aggregation window, e.g. 10s.
    #[arg(long, env = "SQLBEE_WINDOW")]
    pub window: Option<String>,
    /// Statement text bytes captured per statement (max 16384).
    #[arg(long, env = "SQLBEE_TEXT_LIMIT")]
    pub text_limit: Option<u32>,
    /// Digests kept per instance per window; the rest are counted in an
    /// overflow row.
    #[arg(long, env = "SQLBEE_MAX_DIGESTS")]
    pub max_digests: Option<usize>,
    /// Kernel ring buffer per server, bytes (power of two).
    #[arg(long, env = "SQLBEE_RING_BYTES")]
    pub ring_bytes: Option<u32>,
    /// How often the ring buffers are drained, e.g. 100ms.
    #[arg(long, env = "SQLBEE_DRAIN_INTERVAL")]
    pub drain_interval: Option<String>,
    /// Stop after this long (default: run until SIGINT/SIGTERM).
    #[arg(long, env = "SQLBEE_DURATION")]
    pub duration: Option<String>,
    /// Write this file once the initial servers are attached.
    #[arg(long, env = "SQLBEE_READY_FILE")]
    pub ready_file: Option<PathBuf>,
    /// Rows per window in `--output table`.
    #[arg(long, env = "SQLBEE_TABLE_ROWS")]
    pub table_rows: Option<usize>,
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
    /// CPU the agent allows itself, in cores (default 1), enforced by its
    /// own cgroup.
    #[arg(long, env = "SQLBEE_CPU_LIMIT")]
    pub cpu_limit: Option<f64>,
    /// Memory the agent allows itself, MiB (default 1024).
    #[arg(long, env = "SQLBEE_MEMORY_LIMIT_MIB")]
    pub memory_limit_mib: Option<u64>,
    /// Do not move the agent into its own cgroup (limits not enforced).
    #[arg(long, env = "SQLBEE_NO_CGROUP")]
    pub no_cgroup: bool,
    /// Serve Prometheus metrics on this address, e.g. 127.0.0.1:9187.
    #[arg(long, env = "SQLBEE_METRICS_LISTEN")]
    pub metrics_listen: Option<String>,
    /// Text hashes counted in the kernel (slots per server): their
    /// statements are aggregated there instead of sent one by one. 0 sends
    /// every statement. Default: as many as 32 MiB of per-CPU maps hold,
    /// at most 4096. Off with `--wait-probes`, whose lock-wait records need
    /// every statement of every connection.
    #[arg(long, env = "SQLBEE_KERNEL_DIGESTS")]
    pub kernel_digests: Option<u32>,
    /// Budget mode: keep the probes' CPU in mysqld under this share of
    /// mysqld's own CPU (e.g. `1%`) by attaching them part of the time.
    /// Counts then sample the attached time; the agent marks them as
    /// estimates and reports the attached fraction.
    #[arg(long, env = "SQLBEE_MYSQLD_OVERHEAD_BUDGET")]
    pub mysqld_overhead_budget: Option<String>,
    /// Budget mode: one attach-and-detach cycle (default 10s). Every
    /// switch costs mysqld CPU of its own (about 30 ms a cycle measured
    /// here at 8k QPS), so a 1 s cycle alone spent 5x a 1% budget; shorter
    /// cycles sample time more evenly.
    #[arg(long, env = "SQLBEE_DUTY_PERIOD")]
    pub duty_period: Option<String>,
    /// The agent never sheds less than this step (see README, Shedding):
    /// `no-samples` or `known-texts-only` keep it there even when calm.
    #[arg(long, env = "SQLBEE_SHEDDING_FLOOR", value_enum)]
    pub shedding_floor: Option<crate::budget::Step>,
    /// Every optional probe: `--wait-probes --command-probe`.
    #[arg(long, env = "SQLBEE_ALL_PROBES")]
    pub all_probes: bool,
    /// Report each wait at least this long as a lock-wait record with
    /// candidate blockers (default 50ms; 0 turns it off).
    #[arg(long, env = "SQLBEE_LOCK_WAIT_THRESHOLD")]
    pub lock_wait_threshold: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct AgentFile {
    pids: Option<Vec<u32>>,
    output: Option<OutputFormat>,
    collector: Option<String>,
    state_dir: Option<PathBuf>,
    spool_limit: Option<u64>,
    token_file: Option<PathBuf>,
    ca_cert: Option<PathBuf>,
    client_cert: Option<PathBuf>,
    client_key: Option<PathBuf>,
    replay_rate: Option<u32>,
    window: Option<String>,
    text_limit: Option<u32>,
    max_digests: Option<usize>,
    ring_bytes: Option<u32>,
    drain_interval: Option<String>,
    duration: Option<String>,
    ready_file: Option<PathBuf>,
    table_rows: Option<usize>,
    wait_probes: Option<bool>,
    command_probe: Option<bool>,
    lock_wait_threshold: Option<String>,
    cpu_limit: Option<f64>,
    memory_limit_mib: Option<u64>,
    cgroup: Option<bool>,
    metrics_listen: Option<String>,
    kernel_digests: Option<u32>,
    mysqld_overhead_budget: Option<String>,
    duty_period: Option<String>,
    shedding_floor: Option<crate::budget::Step>,
}

/// Validated agent configuration.
#[derive(Clone, Debug)]
pub struct AgentConfig {
    pub pids: Vec<u32>,
    /// None: nothing on stdout (shipping only).
    pub output: Option<OutputFormat>,
    pub ship: Option<crate::ship::ShipConfig>,
    pub window: Duration,
    pub text_limit: u32,
    pub max_digests: usize,
    pub ring_bytes: u32,
    pub drain_interval: Duration,
    pub duration: Option<Duration>,
    pub ready_file: Option<PathBuf>,
    pub table_rows: usize,
    pub wait_probes: bool,
    pub command_probe: bool,
    /// Slots of the in-kernel digest per server; 0: off.
    pub kernel_digests: u32,
    /// Budget mode: the probes' share of mysqld's CPU (0.01 for 1%).
    pub mysqld_overhead_budget: Option<f64>,
    /// Budget mode: one attach-and-detach cycle.
    pub duty_period: Duration,
    /// None: `--no-cgroup`.
    pub budget: Option<crate::budget::BudgetConfig>,
    /// The least the agent sheds.
    pub shedding_floor: crate::budget::Step,
    pub metrics_listen: Option<String>,
    /// Waits at least this long become lock-wait records (0: off).
    pub long_wait_us: u32,
    /// How often /proc is rescanned for started, restarted or gone servers.
    pub rescan_interval: Duration,
    pub normalize_cache: usize,
}

impl AgentArgs {
    pub fn resolve(self) -> Result<AgentConfig, ConfigError> {
        let file = match &self.config {
            Some(path) => {
                let text = std::fs::read_to_string(path)
                    .map_err(|source| ConfigError::Read { path: path.clone(), source })?;
                toml::from_str(&text).map_err(|source| ConfigError::Parse { path: path.clone(), source })?
            }
            None => AgentFile::default(),
        };
        let pids = if self.pids.is_empty() { file.pids.unwrap_or_default() } else { self.pids };
        let window = duration("window", self.window.or(file.window).as_deref().unwrap_or("10s"))?;
        let drain_interval =
            duration("drain_interval", self.drain_interval.or(file.drain_interval).as_deref().unwrap_or("100ms"))?;
        let run_for = self.duration.or(file.duration).map(|d| duration("duration", &d)).transpose()?;
        let text_limit = self.text_limit.or(file.text_limit).unwrap_or(DEFAULT_TEXT_LIMIT);
        let ring_bytes = self.ring_bytes.or(file.ring_bytes).unwrap_or(8 * 1024 * 1024);
        let max_digests = self.max_digests.or(file.max_digests).unwrap_or(5000);
        let collector = self.collector.or(file.collector);
        let output = match (self.output.or(file.output), &collector) {
            (Some(format), _) => Some(format),
            (None, Some(_)) => None,
            (None, None) => Some(OutputFormat::Jsonl),
        };
        let ship = match collector {
            None => None,
            Some(url) => {
                if !(url.starts_with("http://") || url.starts_with("https://")) {
                    return Err(ConfigError::Collector { url });
                }
                let rate = self.replay_rate.or(file.replay_rate).unwrap_or(20).max(1);
                let token =
                    self.token_file.or(file.token_file).as_deref().map(crate::client::read_token_file).transpose()?;
                let target = crate::client::ClientOptions {
                    url,
                    token,
                    ca_cert: self.ca_cert.or(file.ca_cert),
                    client_cert: self.client_cert.or(file.client_cert),
                    client_key: self.client_key.or(file.client_key),
                    request_timeout: Some(Duration::from_secs(10)),
                    ..Default::default()
                };
                // Checked now so a bad URL or TLS file stops the agent at start.
                crate::client::endpoint(&target)?;
                Some(crate::ship::ShipConfig {
                    target,
                    state_dir: self.state_dir.or(file.state_dir).unwrap_or_else(|| PathBuf::from("/var/lib/sqlbee")),
                    spool_limit_bytes: self.spool_limit.or(file.spool_limit).unwrap_or(512 << 20),
                    max_batch_bytes: 4 << 20,
                    replay_interval: Duration::from_secs(1) / rate,
                    shutdown_grace: Duration::from_secs(5),
                    host: crate::procfs::hostname(),
                })
            }
        };
        let config = AgentConfig {
            pids,
            output,
            ship,
            window,
            text_limit,
            max_digests,
            ring_bytes,
            drain_interval,
            duration: run_for,
            ready_file: self.ready_file.or(file.ready_file),
            table_rows: self.table_rows.or(file.table_rows).unwrap_or(20),
            wait_probes: self.all_probes || self.wait_probes || file.wait_probes.unwrap_or(false),
            command_probe: self.all_probes || self.command_probe || file.command_probe.unwrap_or(false),
            kernel_digests: match self.kernel_digests.or(file.kernel_digests) {
                _ if self.all_probes || self.wait_probes || file.wait_probes.unwrap_or(false) => 0,
                Some(slots) => slots,
                None => default_kernel_digests(),
            },
            mysqld_overhead_budget: self
                .mysqld_overhead_budget
                .or(file.mysqld_overhead_budget)
                .map(|v| fraction("mysqld_overhead_budget", &v))
                .transpose()?,
            duty_period: duration("duty_period", self.duty_period.or(file.duty_period).as_deref().unwrap_or("10s"))?,
            budget: (!self.no_cgroup && file.cgroup.unwrap_or(true)).then(|| crate::budget::BudgetConfig {
                cpu_cores: self.cpu_limit.or(file.cpu_limit).unwrap_or(1.0),
                memory_bytes: self.memory_limit_mib.or(file.memory_limit_mib).unwrap_or(1024) << 20,
            }),
            shedding_floor: self.shedding_floor.or(file.shedding_floor).unwrap_or_default(),
            metrics_listen: self.metrics_listen.or(file.metrics_listen),
            long_wait_us: {
                let value = self.lock_wait_threshold.or(file.lock_wait_threshold).unwrap_or_else(|| "50ms".into());
                let threshold = if value.trim() == "0" { Duration::ZERO } else { duration("lock_wait_threshold", &value)? };
                threshold.as_micros().min(u32::MAX as u128) as u32
            },
            rescan_interval: Duration::from_millis(500),
            normalize_cache: 20_000,
        };
        config.validate()?;
        Ok(config)
    }
}

const MAX_KERNEL_DIGESTS: u32 = agent_common::kernel_digests::MAX_SLOTS;

/// `1%`, `0.5 %` or `0.01`: a fraction in (0, 1].
fn fraction(field: &'static str, value: &str) -> Result<f64, ConfigError> {
    let value = value.trim();
    let parsed = match value.strip_suffix('%') {
        Some(percent) => percent.trim().parse::<f64>().map(|p| p / 100.0),
        None => value.parse::<f64>(),
    };
    match parsed {
        Ok(f) if f > 0.0 && f <= 1.0 => Ok(f),
        _ => Err(ConfigError::Fraction { field, value: value.to_string() }),
    }
}

/// Slots that fit 32 MiB of kernel digests (two epochs, one copy per
/// CPU), between 64 and 4096.
fn default_kernel_digests() -> u32 {
    let cpus = aya::util::nr_cpus().map(|n| n.get()).unwrap_or(1) as usize;
    let per_slot = 2 * cpus * std::mem::size_of::<agent_common::SlotStats>();
    ((32usize << 20) / per_slot).clamp(64, 4096) as u32
}

impl AgentConfig {
    fn validate(&self) -> Result<(), ConfigError> {
        let range = |field, value: u64, ok: bool, expected: &str| {
            if ok { Ok(()) } else { Err(ConfigError::Range { field, value, expected: expected.to_string() }) }
        };
        range("text_limit", self.text_limit as u64, self.text_limit as usize <= MAX_TEXT, &format!("0..={MAX_TEXT}"))?;
        range(
            "ring_bytes",
            self.ring_bytes as u64,
            self.ring_bytes.is_power_of_two() && self.ring_bytes >= 4096 && self.ring_bytes <= 1 << 30,
            "a power of two between 4096 and 1073741824",
        )?;
        range("max_digests", self.max_digests as u64, (1..=1_000_000).contains(&self.max_digests), "1..=1000000")?;
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
        let ms = self.window.as_millis() as u64;
        range("window", ms, (100..=3_600_000).contains(&ms), "100ms..=1h")?;
        let ms = self.duty_period.as_millis() as u64;
        range("duty_period", ms, (100..=600_000).contains(&ms), "100ms..=10min")?;
        let ms = self.drain_interval.as_millis() as u64;
        range("drain_interval", ms, (1..=10_000).contains(&ms) && self.drain_interval <= self.window, "1ms..=10s and at most the window")?;
        Ok(())
    }
}

/// A duration flag or key, with the field named in the error.
pub fn duration(field: &'static str, value: &str) -> Result<Duration, ConfigError> {
    sqlbee_common::duration::parse(value).map_err(|_| ConfigError::Duration { field, value: value.to_string() })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        assert_eq!(duration("w", "250ms").unwrap(), Duration::from_millis(250));
        assert_eq!(duration("w", "10s").unwrap(), Duration::from_secs(10));
        assert_eq!(duration("w", "2m").unwrap(), Duration::from_secs(120));
        assert_eq!(duration("w", "7d").unwrap(), Duration::from_secs(7 * 86_400));
        assert!(duration("w", "soon").unwrap_err().to_string().contains("500ms"));
    }

    #[test]
    fn validation_names_the_field() {
        let args = AgentArgs { text_limit: Some(1 << 20), ..Default::default() };
        let err = args.resolve().unwrap_err().to_string();
        assert!(err.contains("text_limit"), "{err}");
        let args = AgentArgs { ring_bytes: Some(5000), ..Default::default() };
        assert!(args.resolve().unwrap_err().to_string().contains("power of two"));
    }

    #[test]
    fn file_then_flags() {
        let dir = std::env::temp_dir().join(format!("sqlbee-config-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("agent.toml");
        std::fs::write(&path, "window = \"5s\"\ntext_limit = 1024\n").unwrap();
        let args = AgentArgs { config: Some(path.clone()), text_limit: Some(2048), ..Default::default() };
        let config = args.resolve().unwrap();
        assert_eq!(config.window, Duration::from_secs(5));
        assert_eq!(config.text_limit, 2048);
        std::fs::write(&path, "windw = \"5s\"\n").unwrap();
        let args = AgentArgs { config: Some(path), ..Default::default() };
        assert!(args.resolve().unwrap_err().to_string().contains("windw"));
        std::fs::remove_dir_all(dir).ok();
    }
}
