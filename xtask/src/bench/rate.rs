//! `cargo xtask bench-rate`: what watching costs mysqld, as CPU per
//! statement at a fixed request rate well under saturation. On a 2-vCPU VM
//! saturated runs spread by 10-30%, which hides effects of a few percent;
//! mysqld's CPU per statement at a steady rate is far steadier, and many
//! short rounds with every arm in each give medians with bootstrap
//! intervals that say whether a difference is resolved.
//!
//! Every round runs every arm once. The order rotates by one every two
//! rounds, and every second round runs the previous one backwards, so each
//! arm sits in every position (given twice as many rounds as arms) and a
//! drift that is linear in time cancels within each pair of rounds. An
//! arm's cost is its paired difference to the control of the same round.
//! With `--together` a sqlbee arm and its baseline twin run attached at
//! once instead, for program time measured on the very same statements.
//!
//! Servers: MariaDB 10.11 on the host (Debian's mariadbd, a private server
//! over its socket) and MariaDB 11.8 in a container from the test image
//! (TCP on a published 127.0.0.1 port), one after the other. A failed
//! arm-run is recorded with its reason and the bench goes on; a server or
//! data set that cannot be set up stops it.
mod profile;
mod report;
mod servers;
pub(super) mod stats;

use std::{
    fs,
    path::{Path, PathBuf},
    time::Instant,
};

use anyhow::{Context as _, bail};
use servers::{Kind, Server};

use super::{
    TEXT_SUFFIX,
    measure::{CpuReading, ProgramStats, RunTimeStats, clock_ticks, cpu_ticks, parse_sysbench, programs_of},
    release_agent,
    treatment::{AgentBinary, CONTROL_ELSEWHERE, Setup, TREATMENTS, Tracer, Treatment, Watched, write_plans_login},
};
use crate::{paths::workspace_root, sysbench::Sysbench};

#[derive(clap::Parser, Debug, Clone)]
#[command(name = "bench-rate")]
pub struct RateArgs {
    /// Servers to measure, one after the other: 10.11 (the host's
    /// mariadbd, a private server) and 11.8 (a container from
    /// localhost/sqlbee-test-mariadb:11.8, which `./x image` builds).
    #[arg(long, value_delimiter = ',', default_value = "10.11,11.8")]
    pub servers: Vec<String>,
    /// Arms run in every round: `control` (nothing attached) and
    /// treatments of `cargo xtask bench` (sqlbee, sqlbee-all, sqlbee-waits,
    /// sqlbee-events, sqlbee-lean, sqlbee-send, sqlbee-plans, sqlbee-budget, slow-log, general-log, bpftrace-pair,
    /// bpftrace-count = the one-trap floor, bpftrace-sendto = the floor of
    /// a design without a trap (a syscall tracepoint), performance-schema,
    /// performance-schema-statements, performance-schema-live,
    /// control-elsewhere). Only the host's server runs the arms that need
    /// start-up flags (performance-schema, performance-schema-statements,
    /// control-elsewhere): each of their runs restarts the server with
    /// them, warms, measures, then restarts and warms again, so its rounds
    /// take longer, unless --sibling-servers.
    #[arg(long, value_delimiter = ',', default_value = "control,bpftrace-count,sqlbee,sqlbee-waits")]
    pub arms: Vec<String>,
    /// The sqlbee binary to measure (default: a release build made first).
    #[arg(long)]
    pub agent_bin: Option<PathBuf>,
    /// An older sqlbee binary: every sqlbee arm X also runs as X@baseline
    /// with it, in the same rounds, so before and after compare in one run.
    #[arg(long)]
    pub baseline_bin: Option<PathBuf>,
    /// The sysbench script; a `-text` suffix runs it over the text protocol
    /// (--db-ps-mode=disable) instead of prepared statements.
    #[arg(long, default_value = "oltp_point_select")]
    pub script: String,
    /// sysbench client threads.
    #[arg(long, default_value_t = 4)]
    pub threads: u32,
    /// sysbench --rate: events per second to hold to (one statement per
    /// event for oltp_point_select). Keep it well under saturation. 0 runs
    /// every round at saturation (no limit), and the report adds each
    /// arm's throughput and latency, and their loss against control.
    #[arg(long, default_value_t = 2000)]
    pub rate: u32,
    /// Seconds each arm runs per round.
    #[arg(long, default_value_t = 10)]
    pub round_seconds: u32,
    /// Rounds; each runs every arm once. Twice the number of arms or more
    /// puts each arm in every position.
    #[arg(long, default_value_t = 12)]
    pub rounds: u32,
    /// Seconds of sysbench at the rate that warm a (re)started server.
    #[arg(long, default_value_t = 5)]
    pub warm_seconds: u32,
    /// Seconds of sysbench at the run's pace between attaching an arm's
    /// tracer and the measured run, every arm alike (control too): for a
    /// tracer whose cost changes over its first windows, such as budget
    /// mode, which learns its duty from them. 0 measures from the attach.
    #[arg(long, default_value_t = 0)]
    pub settle_seconds: u32,
    #[arg(long, default_value_t = 4)]
    pub tables: u32,
    #[arg(long, default_value_t = 10_000)]
    pub table_size: u32,
    /// Name in the result files: <date>-<name>.md and .csv.
    #[arg(long, default_value = "rate")]
    pub name: String,
    /// Where the report and CSV go (default benches/results in the workspace).
    #[arg(long)]
    pub out_dir: Option<PathBuf>,
    /// An extra mariadbd flag for every server, on top of the bench's own
    /// (repeat it for more), e.g. `--server-flag=--log-bin=bench-bin
    /// --server-flag=--server-id=1` for a server that writes a binary log.
    #[arg(long = "server-flag", allow_hyphen_values = true)]
    pub server_flags: Vec<String>,
    /// Also sample mysqld's threads with `perf record -e cpu-clock` during
    /// each run and report each arm's CPU per statement by where it went:
    /// the BPF programs, the uprobe's kernel path, the rest of the kernel,
    /// mysqld's own code and its libraries. The sampling costs every arm
    /// alike, so compare these runs with each other, not with unprofiled
    /// ones.
    #[arg(long)]
    pub profile: bool,
    /// If above 0: after the rounds, each arm runs once more this many
    /// seconds without a rate limit, and its QPS is reported (single runs,
    /// no interval: the VM spreads them by 10-30%).
    #[arg(long, default_value_t = 0)]
    pub saturation_seconds: u32,
    /// Attach every sqlbee arm at the same time as its baseline twin
    /// (needs --baseline-bin), in one run per round: both programs time
    /// the very same statements, so their program times compare without
    /// the rounds' noise. Which of the two attaches first alternates by
    /// round. mysqld's CPU is then the pair's and tells them apart no more.
    #[arg(long)]
    pub together: bool,
    /// Run each arm that needs start-up flags on a server of its own,
    /// started once with them beside the main one (prepared and warmed
    /// alike) and idle while the other arms run, instead of restarting the
    /// main server around each of its runs. Add `control-elsewhere` to see
    /// what another server alone changes.
    #[arg(long)]
    pub sibling_servers: bool,
}

/// The experiment this project started from, rerun here: sysbench
/// `oltp_read_write` at 12 threads, nothing attached against sqlbee against
/// performance_schema with its statement consumers on, first at
/// saturation (throughput and latency lost), then at a fixed rate (mysqld
/// CPU per statement), both in alternating rounds on the host's 10.11.
#[derive(clap::Parser, Debug, Clone)]
#[command(name = "bench-seeds")]
pub struct SeedsArgs {
    /// Rounds of each part; each runs every arm once.
    #[arg(long, default_value_t = 10)]
    pub rounds: u32,
    /// Seconds each arm runs per saturated round.
    #[arg(long, default_value_t = 15)]
    pub saturated_seconds: u32,
    /// sysbench --rate of the fixed-rate part, in transactions per second
    /// (oltp_read_write runs 20 statements in each). 0 leaves it out.
    #[arg(long, default_value_t = 100)]
    pub rate: u32,
    /// Seconds each arm runs per fixed-rate round.
    #[arg(long, default_value_t = 10)]
    pub rate_seconds: u32,
    #[arg(long, default_value_t = 12)]
    pub threads: u32,
    #[arg(long, default_value_t = 8)]
    pub tables: u32,
    #[arg(long, default_value_t = 10_000)]
    pub table_size: u32,
    /// The sqlbee binary to measure (default: a release build made first).
    #[arg(long)]
    pub agent_bin: Option<PathBuf>,
    /// Results are <date>-<name>-saturation and <date>-<name>-rate.
    #[arg(long, default_value = "seeds")]
    pub name: String,
    /// Measure performance_schema turned on and off at run time
    /// (`performance-schema-live`: every arm's server starts with it on and
    /// all of it off) instead of restarting the server for its runs.
    #[arg(long)]
    pub live_performance_schema: bool,
    /// Run performance_schema on a second server started with it, beside
    /// the one the other arms run on, instead of restarting (see
    /// `bench-rate --sibling-servers`); adds the `control-elsewhere` arm,
    /// which tells what the other server alone changes.
    #[arg(long, conflicts_with = "live_performance_schema")]
    pub sibling_servers: bool,
    /// Where the reports and CSVs go (default benches/results in the workspace).
    #[arg(long)]
    pub out_dir: Option<PathBuf>,
}

/// The arms of the seeds' experiment: the floor (one bare counting uprobe
/// where sqlbee's one trap per statement sits, `log_slow_statement`'s
/// entry) shows what sqlbee costs above what any uprobe agent must, and
/// the lean tier what the server's own figures cost.
const SEEDS_ARMS: [&str; 5] = ["control", "bpftrace-count", "sqlbee", "sqlbee-lean", "performance-schema-statements"];

/// Runs the seeds' experiment: the saturated part, then the fixed-rate one.
pub fn seeds(args: &SeedsArgs) -> anyhow::Result<Vec<RateOutcome>> {
    let mut arms: Vec<String> = SEEDS_ARMS
        .iter()
        .map(|&a| match a {
            "performance-schema-statements" if args.live_performance_schema => "performance-schema-live",
            a => a,
        })
        .map(String::from)
        .collect();
    if args.sibling_servers {
        arms.insert(1, CONTROL_ELSEWHERE.into());
    }
    let part = |suffix: &str, rate: u32, round_seconds: u32| RateArgs {
        servers: vec!["10.11".into()],
        arms: arms.clone(),
        agent_bin: args.agent_bin.clone(),
        baseline_bin: None,
        script: "oltp_read_write".into(),
        threads: args.threads,
        rate,
        round_seconds,
        rounds: args.rounds,
        warm_seconds: 5,
        settle_seconds: 0,
        tables: args.tables,
        table_size: args.table_size,
        name: format!("{}-{suffix}", args.name),
        out_dir: args.out_dir.clone(),
        saturation_seconds: 0,
        server_flags: Vec::new(),
        profile: false,
        together: false,
        sibling_servers: args.sibling_servers,
    };
    let mut parts = vec![part("saturation", 0, args.saturated_seconds)];
    if args.rate > 0 {
        parts.push(part("rate", args.rate, args.rate_seconds));
    }
    parts.iter().map(run).collect()
}

/// A baseline arm's name is its treatment's with this suffix.
const BASELINE_SUFFIX: &str = "@baseline";

/// One arm: nothing attached, or a treatment, with the binary under test
/// or the baseline one.
#[derive(Debug, Clone)]
pub struct Arm {
    pub name: String,
    pub treatment: Option<&'static Treatment>,
    pub baseline: bool,
}

impl Arm {
    fn is_agent(&self) -> bool {
        self.treatment.is_some_and(|t| matches!(t.setup, Setup::Agent { .. }))
    }

    fn server_flags(&self) -> &'static [&'static str] {
        self.treatment.map_or(&[], |t| t.server_flags())
    }

    pub fn about(&self) -> String {
        match (self.treatment, self.baseline) {
            (None, _) => "nothing attached".into(),
            (Some(t), false) => t.about.into(),
            (Some(t), true) => format!("{} (the baseline binary)", t.about),
        }
    }
}

/// The arms `names` describe, each sqlbee arm followed by its baseline
/// twin when there is a baseline binary.
fn arms(names: &[String], baseline: bool) -> anyhow::Result<Vec<Arm>> {
    let mut arms: Vec<Arm> = Vec::new();
    for name in names {
        if arms.iter().any(|a| &a.name == name) {
            bail!("--arms: {name} twice");
        }
        if name == "control" {
            arms.push(Arm { name: name.clone(), treatment: None, baseline: false });
            continue;
        }
        let treatment = TREATMENTS.iter().find(|t| t.name == name).with_context(|| {
            let names: Vec<&str> = TREATMENTS.iter().map(|t| t.name).collect();
            format!("--arms: unknown arm {name:?}; use control or some of {}", names.join(", "))
        })?;
        let arm = Arm { name: name.clone(), treatment: Some(treatment), baseline: false };
        let twin = (baseline && arm.is_agent()).then(|| Arm {
            name: format!("{name}{BASELINE_SUFFIX}"),
            treatment: Some(treatment),
            baseline: true,
        });
        arms.push(arm);
        arms.extend(twin);
    }
    if arms.is_empty() {
        bail!("--arms: name at least one arm");
    }
    Ok(arms)
}

/// Round `round`'s order of `n` arms (indices): rotated by one every two
/// rounds, and backwards in every odd round, so each pair of rounds is a
/// palindrome (A B C, C B A) in which linear drift cancels.
pub fn order(n: usize, round: u32) -> Vec<usize> {
    let shift = (round / 2) as usize;
    let mut order: Vec<usize> = (0..n).map(|i| (i + shift) % n.max(1)).collect();
    if round % 2 == 1 {
        order.reverse();
    }
    order
}

/// What each round runs at once, as indices into `arms`: every arm on its
/// own, or with `together` each baseline twin beside its arm.
fn units(arms: &[Arm], together: bool) -> Vec<Vec<usize>> {
    let mut units: Vec<Vec<usize>> = Vec::new();
    for (i, arm) in arms.iter().enumerate() {
        let twin_of = arm.name.strip_suffix(BASELINE_SUFFIX);
        if together
            && arm.baseline
            && let Some(unit) = units.iter_mut().find(|u| Some(arms[u[0]].name.as_str()) == twin_of)
        {
            unit.push(i);
            continue;
        }
        units.push(vec![i]);
    }
    units
}

/// What settings turned on at run time need of every server: the start-up
/// flags (each once) and the SQL that turns each setting off.
fn run_time_settings(arms: &[Arm]) -> (Vec<&'static str>, Vec<&'static str>) {
    let (mut flags, mut offs): (Vec<&'static str>, Vec<&'static str>) = (Vec::new(), Vec::new());
    for t in arms.iter().filter_map(|a| a.treatment) {
        if let Setup::ServerSql { base, off, .. } = t.setup {
            for &flag in base {
                if !flags.contains(&flag) {
                    flags.push(flag);
                }
            }
            if !offs.contains(&off) {
                offs.push(off);
            }
        }
    }
    (flags, offs)
}

/// The start-up flag sets `arms` need, each once: with --sibling-servers
/// every one gets a server of its own.
fn sibling_flag_sets(arms: &[Arm]) -> Vec<&'static [&'static str]> {
    let mut sets: Vec<&'static [&'static str]> = Vec::new();
    for flags in arms.iter().map(Arm::server_flags).filter(|f| !f.is_empty()) {
        if !sets.contains(&flags) {
            sets.push(flags);
        }
    }
    sets
}

/// The binaries under test: the agent and, if given, the baseline.
struct Agents {
    current: Option<AgentBinary>,
    baseline: Option<AgentBinary>,
}

impl Agents {
    fn of(&self, arm: &Arm) -> anyhow::Result<&AgentBinary> {
        let agent = if arm.baseline { &self.baseline } else { &self.current };
        agent.as_ref().context("no sqlbee binary for this arm")
    }
}

/// One measured arm-run. `round` None: a saturation run.
#[derive(Debug, Clone, Default)]
pub struct ArmRun {
    pub server: &'static str,
    pub round: Option<u32>,
    pub position: u32,
    /// With --together: 0 for the arm attached first, 1 for its twin.
    pub attach_order: Option<u32>,
    pub arm: String,
    pub seconds: f64,
    /// What sysbench reported.
    pub statements: u64,
    pub tps: f64,
    pub latency_avg_ms: f64,
    pub latency_p95_ms: f64,
    /// The server's Questions over the run, without the bench's own reads.
    pub questions: u64,
    pub mysqld_cpu_ns: u64,
    pub mysqld_cpu_ticks: u64,
    /// Of those, the ticks mysqld's threads spent in the kernel.
    pub mysqld_system_ticks: u64,
    pub agent_cpu_s: f64,
    pub bpf_runs: u64,
    pub bpf_ns: u64,
    /// With --profile: where mysqld's samples fell.
    pub profile: profile::Samples,
    pub error: Option<String>,
}

impl ArmRun {
    pub fn ok(&self) -> bool {
        self.error.is_none() && self.questions > 0
    }

    /// The primary figure: mysqld's ns on CPU (schedstat) per statement.
    pub fn ns_per_statement(&self) -> f64 {
        self.mysqld_cpu_ns as f64 / self.questions as f64
    }

    /// The same from /proc/PID/stat's ticks, the cross-check.
    pub fn ticks_ns_per_statement(&self) -> f64 {
        self.mysqld_cpu_ticks as f64 / clock_ticks() * 1e9 / self.questions as f64
    }

    pub fn qps(&self) -> f64 {
        self.questions as f64 / self.seconds
    }

    /// The tracer's programs' run time per statement: the part of mysqld's
    /// CPU its program bodies add on top of the trap.
    pub fn bpf_ns_per_statement(&self) -> f64 {
        self.bpf_ns as f64 / self.questions as f64
    }

    /// mysqld's ns per statement in the kernel: the schedstat figure
    /// split by the ticks' share (the programs run there too).
    pub fn kernel_ns_per_statement(&self) -> f64 {
        if self.mysqld_cpu_ticks == 0 {
            return 0.0;
        }
        self.ns_per_statement() * self.mysqld_system_ticks as f64 / self.mysqld_cpu_ticks as f64
    }

    /// mysqld's ns per statement in its own code.
    pub fn user_ns_per_statement(&self) -> f64 {
        self.ns_per_statement() - self.kernel_ns_per_statement()
    }

    /// The kernel's share less the programs' run time: the trap, the
    /// uprobe's way in and out and the system calls.
    pub fn kernel_outside_programs_ns_per_statement(&self) -> f64 {
        self.kernel_ns_per_statement() - self.bpf_ns_per_statement()
    }
}

/// What was known about one server, for the report.
#[derive(Debug, Clone)]
pub struct ServerInfo {
    pub name: &'static str,
    pub version: String,
    pub origin: String,
    /// Questions one status read adds (subtracted from every run).
    pub status_cost: u64,
    /// Arms this server does not run, with why.
    pub skipped_arms: Vec<(String, String)>,
    /// With --sibling-servers: each sibling's start-up flags and pid.
    pub siblings: Vec<(String, u32)>,
    /// The server was not measured at all, and why.
    pub skipped: Option<String>,
}

/// Everything the arguments decide.
pub struct Plan {
    pub name: String,
    pub servers: Vec<Kind>,
    pub arms: Vec<Arm>,
    pub script: String,
    pub ps_mode: &'static str,
    pub threads: u32,
    pub rate: u32,
    pub round_seconds: u32,
    pub rounds: u32,
    pub warm_seconds: u32,
    pub settle_seconds: u32,
    pub tables: u32,
    pub table_size: u32,
    pub saturation_seconds: u32,
    pub server_flags: Vec<String>,
    pub out_dir: PathBuf,
    pub profile: bool,
    pub together: bool,
    /// Start-up flags the arms need on every server (see `base_flags`).
    pub arm_base_flags: Vec<&'static str>,
    /// SQL that turns each run-time setting off, applied after each start.
    pub settings_off: Vec<&'static str>,
    /// Arms that need start-up flags run on servers of their own.
    pub siblings: bool,
}

impl Plan {
    fn new(args: &RateArgs) -> anyhow::Result<Plan> {
        let mut servers = Vec::new();
        for name in &args.servers {
            let kind = Kind::parse(name)?;
            if servers.contains(&kind) {
                bail!("--servers: {name} twice");
            }
            servers.push(kind);
        }
        if servers.is_empty() {
            bail!("--servers: name at least one of 10.11, 11.8");
        }
        let (lua, ps_mode) = match args.script.strip_suffix(TEXT_SUFFIX) {
            Some(lua) => (lua, "disable"),
            None => (args.script.as_str(), "auto"),
        };
        if !Path::new("/usr/share/sysbench").join(format!("{lua}.lua")).exists() {
            bail!(
                "--script: no sysbench script {lua}.lua in /usr/share/sysbench (e.g. oltp_point_select, oltp_read_only-text)"
            );
        }
        if args.together && args.baseline_bin.is_none() {
            bail!("--together attaches each sqlbee arm beside its baseline twin: give --baseline-bin");
        }
        if args.threads == 0 || args.round_seconds == 0 || args.rounds == 0 || args.tables == 0 || args.table_size == 0
        {
            bail!("--threads, --round-seconds, --rounds, --tables and --table-size must be at least 1");
        }
        let arms = arms(&args.arms, args.baseline_bin.is_some())?;
        let (arm_base_flags, settings_off) = run_time_settings(&arms);
        Ok(Plan {
            name: args.name.clone(),
            servers,
            arms,
            script: lua.to_string(),
            ps_mode,
            threads: args.threads,
            rate: args.rate,
            round_seconds: args.round_seconds,
            rounds: args.rounds,
            warm_seconds: args.warm_seconds,
            settle_seconds: args.settle_seconds,
            tables: args.tables,
            table_size: args.table_size,
            saturation_seconds: args.saturation_seconds,
            server_flags: args.server_flags.clone(),
            out_dir: args.out_dir.clone().unwrap_or_else(|| workspace_root().join("benches/results")),
            profile: args.profile,
            together: args.together,
            arm_base_flags,
            settings_off,
            siblings: args.sibling_servers,
        })
    }

    fn sysbench(&self, seconds: u32, rate: u32) -> Sysbench {
        Sysbench {
            script: self.script.clone(),
            tables: self.tables,
            table_size: self.table_size,
            threads: self.threads,
            seconds,
            ps_mode: self.ps_mode,
            rate,
        }
    }

    /// The arms `kind` runs: a server that cannot restart with other flags
    /// leaves out the arms that need it.
    fn arms_on(&self, kind: Kind) -> (Vec<Arm>, Vec<(String, String)>) {
        let (run, skip): (Vec<Arm>, Vec<Arm>) =
            self.arms.iter().cloned().partition(|a| kind.restartable() || a.server_flags().is_empty());
        let why =
            |a: Arm| (a.name, "needs a server restart with other flags; only the host's server does that".to_string());
        (run, skip.into_iter().map(why).collect())
    }
}

/// What a bench-rate run produced.
pub struct RateOutcome {
    pub runs: Vec<ArmRun>,
    pub servers: Vec<ServerInfo>,
    pub report: PathBuf,
    pub csv: PathBuf,
}

/// "[run 7/48] 10.11 round 2/12 sqlbee — ETA 23 min" on stderr.
struct Progress {
    total: usize,
    done: usize,
    started: Instant,
    guess: f64,
}

impl Progress {
    fn announce(&self, what: &str) {
        let per_run = if self.done > 0 { self.started.elapsed().as_secs_f64() / self.done as f64 } else { self.guess };
        let minutes = (per_run * (self.total - self.done) as f64 / 60.0).round() as u64;
        let eta = match minutes {
            0 => "under 1 min".to_string(),
            m if m < 90 => format!("{m} min"),
            m => format!("{} h {:02} min", m / 60, m % 60),
        };
        eprintln!("[run {}/{}] {what} — ETA {eta}", self.done + 1, self.total);
    }
}

/// Runs the whole bench described by `args` and writes its results.
pub fn run(args: &RateArgs) -> anyhow::Result<RateOutcome> {
    let plan = Plan::new(args)?;
    let needs_agent = plan.arms.iter().any(Arm::is_agent);
    let current = match (&args.agent_bin, needs_agent) {
        (_, false) => None,
        (Some(path), true) => Some(agent_binary(path, "--agent-bin")?),
        (None, true) => Some(AgentBinary::new(release_agent()?)?),
    };
    let baseline = match &args.baseline_bin {
        Some(path) if needs_agent => Some(agent_binary(path, "--baseline-bin")?),
        _ => None,
    };
    let agents = Agents { current, baseline };
    // Held until the end: program run counts and times for every run.
    let _stats = RunTimeStats::enable();

    // Arm-runs per server: the arms it runs in every round, plus one
    // saturation run each.
    let per_server = |kind: Kind| {
        let arms = plan.arms_on(kind).0.len();
        arms * plan.rounds as usize + if plan.saturation_seconds > 0 { arms } else { 0 }
    };
    let mut progress = Progress {
        total: plan.servers.iter().map(|&k| per_server(k)).sum(),
        done: 0,
        started: Instant::now(),
        guess: plan.round_seconds as f64 + 3.0,
    };
    let mut runs = Vec::new();
    let mut infos = Vec::new();
    for &kind in &plan.servers {
        let info = one_server(&plan, kind, &agents, &mut progress, &mut runs)
            .with_context(|| format!("setting up MariaDB {}", kind.name()))?;
        // A server left out still counts in the ETA's total: drop its share.
        if info.skipped.is_some() {
            progress.total -= per_server(kind);
        }
        infos.push(info);
    }
    let (report, csv) = write_results(&plan, &agents, &infos, &runs)?;
    Ok(RateOutcome { runs, servers: infos, report, csv })
}

fn agent_binary(path: &Path, flag: &str) -> anyhow::Result<AgentBinary> {
    if !path.exists() {
        bail!("{flag} {}: no such file; build sqlbee first or leave the flag out", path.display());
    }
    AgentBinary::new(path.to_path_buf())
}

/// mariadbd flags of every server: the data set in memory and nothing
/// optional on, as in `cargo xtask bench`.
const BASE_FLAGS: &[&str] = &[
    "--innodb-buffer-pool-size=256M",
    "--max-prepared-stmt-count=100000",
    "--performance-schema=OFF",
    // The warm-up decides what is in the buffer pool, not a reload racing
    // the first measured run.
    "--innodb-buffer-pool-dump-at-shutdown=OFF",
    "--innodb-buffer-pool-load-at-startup=OFF",
];

/// A server ready for the rounds: its run-time settings off, the data
/// set prepared and warm, and how many Questions one status read adds.
struct Ready {
    server: Server,
    status_cost: u64,
}

/// Starts a server of `kind` with the bench's flags and `extra` on top,
/// and readies it. Ok(None): the container image is missing.
fn ready_server(plan: &Plan, kind: Kind, extra: &[&str]) -> anyhow::Result<Option<Ready>> {
    let flags: Vec<&str> = BASE_FLAGS
        .iter()
        .copied()
        .chain(plan.arm_base_flags.iter().copied())
        .chain(plan.server_flags.iter().map(String::as_str))
        .chain(extra.iter().copied())
        .collect();
    let Some(server) = Server::start(kind, &flags)? else { return Ok(None) };
    let with = if extra.is_empty() { String::new() } else { format!(" (beside it, with `{}`)", extra.join(" ")) };
    eprintln!("    pid {}{with}: sysbench prepare ({} tables x {} rows)", server.pid(), plan.tables, plan.table_size);
    settings_off(&server, plan)?;
    plan.sysbench(1, 0).prepare(server.target())?;
    write_plans_login(server.dir(), |sql| server.sql(sql)).context("creating the plans arm's login")?;
    warm(&server, plan).context("warming the server")?;
    let status_cost = status_cost(&server)?;
    Ok(Some(Ready { server, status_cost }))
}

/// Where a unit of arms with start-up `flags` runs: on its sibling server
/// as it is, or on the main one restarted with the flags (none: as it is).
fn server_for<'a>(
    main: &'a mut Ready,
    siblings: &'a mut [(&'static [&'static str], Ready)],
    flags: &'static [&'static str],
) -> (&'a mut Ready, &'static [&'static str]) {
    match siblings.iter_mut().find(|(f, _)| *f == flags) {
        Some((_, sibling)) => (sibling, &[]),
        None => (main, flags),
    }
}

/// Starts one server (and with --sibling-servers one beside it for each
/// set of start-up flags the arms need), prepares and warms it, runs every
/// round and its saturation runs, then stops them (also on error: the
/// servers' Drop).
fn one_server(
    plan: &Plan,
    kind: Kind,
    agents: &Agents,
    progress: &mut Progress,
    runs: &mut Vec<ArmRun>,
) -> anyhow::Result<ServerInfo> {
    eprintln!("==> MariaDB {} ({})", kind.name(), if kind == Kind::Host { "the host's mariadbd" } else { "container" });
    let (arms, skipped_arms) = plan.arms_on(kind);
    for (arm, why) in &skipped_arms {
        eprintln!("    {arm} left out on {}: {why}", kind.name());
    }
    let Some(mut main) = ready_server(plan, kind, &[])? else {
        return Ok(ServerInfo {
            name: kind.name(),
            version: "-".into(),
            origin: "-".into(),
            status_cost: 0,
            skipped_arms,
            siblings: Vec::new(),
            skipped: Some(format!("the image {} is missing; `./x image` builds it", crate::image::MARIADB_11_8_IMAGE)),
        });
    };
    let mut siblings: Vec<(&'static [&'static str], Ready)> = Vec::new();
    if plan.siblings {
        for flags in sibling_flag_sets(&arms) {
            let sibling = ready_server(plan, kind, flags)
                .with_context(|| format!("starting a server beside it with {}", flags.join(" ")))?
                .context("the sibling server did not start")?;
            siblings.push((flags, sibling));
        }
    }
    let version = main.server.sql("SELECT VERSION()")?.trim().to_string();
    eprintln!("    {version}");
    let info = ServerInfo {
        name: kind.name(),
        version,
        origin: main.server.origin(),
        status_cost: main.status_cost,
        skipped_arms,
        siblings: siblings.iter().map(|(flags, s)| (flags.join(" "), s.server.pid())).collect(),
        skipped: None,
    };

    let bench = plan.sysbench(plan.round_seconds, plan.rate);
    let units = units(&arms, plan.together);
    for round in 0..plan.rounds {
        for (position, &u) in order(units.len(), round).iter().enumerate() {
            let mut unit: Vec<&Arm> = units[u].iter().map(|&i| &arms[i]).collect();
            // Side by side, each binary attaches first in every second round.
            if round % 2 == 1 {
                unit.reverse();
            }
            let names: Vec<&str> = unit.iter().map(|a| a.name.as_str()).collect();
            progress.announce(&format!("{} round {}/{} {}", kind.name(), round + 1, plan.rounds, names.join(" + ")));
            let mut unit_runs: Vec<ArmRun> = unit
                .iter()
                .enumerate()
                .map(|(k, arm)| ArmRun {
                    server: kind.name(),
                    round: Some(round),
                    position: position as u32,
                    attach_order: (unit.len() > 1).then_some(k as u32),
                    arm: arm.name.clone(),
                    ..Default::default()
                })
                .collect();
            // Twins side by side share their treatment, so its server too.
            let (at, restart) = server_for(&mut main, &mut siblings, unit[0].server_flags());
            one_arm_run(plan, at, restart, agents, &unit, &bench, &mut unit_runs)?;
            progress.done += unit_runs.len();
            runs.extend(unit_runs);
        }
    }
    if plan.saturation_seconds > 0 {
        let flat_out = plan.sysbench(plan.saturation_seconds, 0);
        for (position, arm) in arms.iter().enumerate() {
            progress.announce(&format!("{} saturation {}", kind.name(), arm.name));
            let mut run = ArmRun {
                server: kind.name(),
                round: None,
                position: position as u32,
                arm: arm.name.clone(),
                ..Default::default()
            };
            let (at, restart) = server_for(&mut main, &mut siblings, arm.server_flags());
            one_arm_run(plan, at, restart, agents, &[arm], &flat_out, std::slice::from_mut(&mut run))?;
            runs.push(run);
            progress.done += 1;
        }
    }
    Ok(info)
}

/// One arm-run (or, with --together, one run of an arm and its twin side
/// by side) around its server settings: `restart` are the start-up flags
/// the server restarts with for it. A failure of the run itself is
/// recorded in `runs`; only a server that cannot be put back is an error.
fn one_arm_run(
    plan: &Plan,
    at: &mut Ready,
    restart: &[&str],
    agents: &Agents,
    arms: &[&Arm],
    bench: &Sysbench,
    runs: &mut [ArmRun],
) -> anyhow::Result<()> {
    let Some(&first) = arms.first() else { return Ok(()) };
    let server = &mut at.server;
    let mut result = Ok(());
    if !restart.is_empty() {
        result = server.restart_with(restart).and_then(|()| warm(server, plan));
    }
    if result.is_ok() {
        result = measured(server, agents, arms, bench, plan, at.status_cost, runs);
    }
    if let Err(e) = result {
        eprintln!("    failed: {e:#}");
        for run in runs.iter_mut() {
            run.error = Some(format!("{e:#}"));
        }
    }
    // Put the server back as the other arms expect it.
    if !restart.is_empty() {
        back_to_base(server, plan).context("restarting the server without the arm's flags")?;
    }
    if let Some(Setup::ServerSql { off, .. }) = first.treatment.map(|t| &t.setup)
        && let Err(e) = server.sql(off)
    {
        // Global variables do not survive a restart: the sure way to keep
        // the setting out of the next arms, where the server allows it.
        back_to_base(server, plan).with_context(|| format!("turning {} off failed ({e:#})", first.name))?;
    }
    Ok(())
}

/// Attach (each of `arms`, in order), settle (the plan's seconds of the
/// same load), read, run `bench`, read again, detach. The server's figures
/// are the run's, in every one of `runs`; each tracer's own CPU and program
/// time are its own.
fn measured(
    server: &Server,
    agents: &Agents,
    arms: &[&Arm],
    bench: &Sysbench,
    plan: &Plan,
    status_cost: u64,
    runs: &mut [ArmRun],
) -> anyhow::Result<()> {
    let Some(first) = runs.first() else { return Ok(()) };
    let round = first.round.map_or("sat".into(), |r| r.to_string());
    let watched = Watched { pid: server.pid(), dir: server.dir() };
    let mut tracers = Vec::new();
    for arm in arms {
        let tag = format!("rate-{round}-{}", arm.name.replace('@', "-"));
        let tracer = match arm.treatment.map(|t| &t.setup) {
            Some(Setup::Agent { .. }) => {
                let agent = agents.of(arm)?;
                Some(Tracer::agent(&agent.path, &agent.flags(arm.treatment.unwrap()), "1h", watched, &tag)?)
            }
            Some(Setup::Bpftrace { symbols, program }) => Some(Tracer::bpftrace(symbols, program, watched, &tag)?),
            _ => None,
        };
        if let Some(Setup::ServerSql { on, .. }) = arm.treatment.map(|t| &t.setup) {
            server.sql(on)?;
        }
        tracers.push(tracer);
    }
    if plan.settle_seconds > 0 {
        Sysbench { seconds: plan.settle_seconds, ..bench.clone() }.run(server.target()).context("the settling run")?;
    }
    let questions0 = questions(server)?;
    let tracers0: Vec<_> =
        tracers.iter().map(|t| t.as_ref().map(|t| (cpu_ticks(t.pid()), programs_of(t.pid())))).collect();
    let cpu0 = CpuReading::of(server.pid());
    let recording = if plan.profile {
        let tag =
            format!("rate-{round}-{}", arms.iter().map(|a| a.name.replace('@', "-")).collect::<Vec<_>>().join("+"));
        Some(profile::start(server.pid(), &server.dir().join(format!("{tag}.perf.data")))?)
    } else {
        None
    };
    let started = Instant::now();
    let report = bench.run(server.target());
    let seconds = started.elapsed().as_secs_f64();
    let cpu1 = CpuReading::of(server.pid());
    let profile = match recording {
        Some(recording) => recording.finish()?,
        None => Default::default(),
    };
    for ((tracer, before), run) in tracers.iter().zip(&tracers0).zip(runs.iter_mut()) {
        if let (Some(tracer), Some((ticks0, programs0))) = (tracer, before) {
            run.agent_cpu_s = cpu_ticks(tracer.pid()).saturating_sub(*ticks0) as f64 / clock_ticks();
            (run.bpf_runs, run.bpf_ns) = bpf_since(&programs_of(tracer.pid()), programs0);
        }
    }
    let questions1 = questions(server)?;
    for tracer in tracers.into_iter().flatten() {
        tracer.stop()?;
    }
    let report = parse_sysbench(&report?);
    let questions = questions1.saturating_sub(questions0).saturating_sub(status_cost);
    for run in runs.iter_mut() {
        run.seconds = seconds;
        run.profile = profile.clone();
        run.mysqld_cpu_ns = cpu1.ns_since(&cpu0);
        run.mysqld_cpu_ticks = cpu1.ticks.saturating_sub(cpu0.ticks);
        run.mysqld_system_ticks = cpu1.system_ticks.saturating_sub(cpu0.system_ticks);
        run.questions = questions;
        run.statements = report.queries;
        run.tps = report.tps;
        run.latency_avg_ms = report.avg_ms;
        run.latency_p95_ms = report.p95_ms;
    }
    if questions == 0 {
        bail!("the server counted no statements");
    }
    Ok(())
}

/// BPF runs and ns of `now` less those of `before`, over every program.
fn bpf_since(now: &[ProgramStats], before: &[ProgramStats]) -> (u64, u64) {
    let total = |p: &[ProgramStats]| p.iter().fold((0u64, 0u64), |(h, ns), p| (h + p.hits, ns + p.ns));
    let ((h1, ns1), (h0, ns0)) = (total(now), total(before));
    (h1.saturating_sub(h0), ns1.saturating_sub(ns0))
}

fn questions(server: &Server) -> anyhow::Result<u64> {
    let text = server.sql("SHOW GLOBAL STATUS LIKE 'Questions'")?;
    text.split_whitespace()
        .nth(1)
        .and_then(|v| v.parse().ok())
        .with_context(|| format!("Questions unreadable in {text:?}"))
}

/// How many Questions one status read adds, read on the idle server: the
/// bench subtracts it from every run (the second read of each run counts
/// itself; the first one's count is already in its own value).
fn status_cost(server: &Server) -> anyhow::Result<u64> {
    let a = questions(server)?;
    let b = questions(server)?;
    Ok(b.saturating_sub(a))
}

/// Restarts the server with its base flags only, its run-time settings
/// off, and warms it.
fn back_to_base(server: &mut Server, plan: &Plan) -> anyhow::Result<()> {
    server.restart_with(&[])?;
    settings_off(server, plan)?;
    warm(server, plan)
}

/// Turns every arm's run-time setting off: after a start, what the arms
/// that do not turn it on expect.
fn settings_off(server: &Server, plan: &Plan) -> anyhow::Result<()> {
    for off in &plan.settings_off {
        server.sql(off).context("turning the arms' run-time settings off")?;
    }
    Ok(())
}

/// Reads every row once so the buffer pool holds the whole data set, then
/// sysbench at the rate for the server's caches and connection threads.
fn warm(server: &Server, plan: &Plan) -> anyhow::Result<()> {
    for t in 1..=plan.tables {
        server.sql(&format!("SELECT COUNT(*), SUM(k), SUM(LENGTH(c)) FROM sbtest.sbtest{t}"))?;
    }
    if plan.warm_seconds > 0 {
        plan.sysbench(plan.warm_seconds, plan.rate).run(server.target()).context("warm-up run")?;
    }
    Ok(())
}

fn write_results(
    plan: &Plan,
    agents: &Agents,
    servers: &[ServerInfo],
    runs: &[ArmRun],
) -> anyhow::Result<(PathBuf, PathBuf)> {
    let dir = &plan.out_dir;
    fs::create_dir_all(dir).with_context(|| format!("creating the result directory {}", dir.display()))?;
    let date = std::process::Command::new("date").arg("+%Y-%m-%d").output().context("running date")?;
    let stem = format!("{}-{}", String::from_utf8_lossy(&date.stdout).trim(), plan.name);
    let binaries: Vec<(&str, String)> = [("agent", &agents.current), ("baseline", &agents.baseline)]
        .into_iter()
        .filter_map(|(role, agent)| Some((role, describe_binary(&agent.as_ref()?.path))))
        .collect();
    let markdown = report::markdown(plan, &binaries, servers, runs);
    let (md_path, csv_path) = (dir.join(format!("{stem}.md")), dir.join(format!("{stem}.csv")));
    fs::write(&md_path, &markdown)?;
    fs::write(&csv_path, report::csv(runs))?;
    eprintln!("==> wrote {} and .csv", md_path.display());
    Ok((md_path, csv_path))
}

/// Path, version and modification time of a sqlbee binary.
fn describe_binary(path: &Path) -> String {
    let version = std::process::Command::new(path)
        .arg("--version")
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_else(|| "version unknown".into());
    let modified = fs::metadata(path)
        .and_then(|m| m.modified())
        .ok()
        .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
        .map(|d| civil_date(d.as_secs()))
        .unwrap_or_default();
    format!("`{}` ({version}, built {modified})", path.display())
}

/// A Unix time as `YYYY-MM-DD HH:MM` UTC (days to civil date, Howard
/// Hinnant's algorithm), so xtask needs no date crate.
fn civil_date(secs: u64) -> String {
    let days = (secs / 86_400) as i64;
    let (h, m) = ((secs % 86_400) / 3600, (secs % 3600) / 60);
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let mo = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(mo <= 2);
    format!("{y:04}-{mo:02}-{d:02} {h:02}:{m:02} UTC")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_arm_sits_in_every_position_and_pairs_of_rounds_balance() {
        for n in 1..=6usize {
            let mut seen = vec![vec![false; n]; n];
            for round in 0..2 * n as u32 {
                let o = order(n, round);
                let mut sorted = o.clone();
                sorted.sort();
                assert_eq!(sorted, (0..n).collect::<Vec<_>>(), "each arm once per round");
                for (position, &arm) in o.iter().enumerate() {
                    seen[arm][position] = true;
                }
                if round % 2 == 1 {
                    // Positions summed over the pair are the same for every
                    // arm: a linear drift adds the same to each.
                    let prev = order(n, round - 1);
                    for arm in 0..n {
                        let at = |o: &[usize]| o.iter().position(|&a| a == arm).unwrap();
                        assert_eq!(at(&prev) + at(&o), n - 1);
                    }
                }
            }
            assert!(seen.iter().flatten().all(|&s| s), "n {n}: {seen:?}");
        }
    }

    #[test]
    fn arms_are_parsed_with_their_baseline_twins() {
        let names: Vec<String> = ["control", "bpftrace-count", "sqlbee", "sqlbee-waits"].map(String::from).to_vec();
        let plain: Vec<String> = arms(&names, false).unwrap().into_iter().map(|a| a.name).collect();
        assert_eq!(plain, names);
        let with: Vec<String> = arms(&names, true).unwrap().into_iter().map(|a| a.name).collect();
        assert_eq!(
            with,
            ["control", "bpftrace-count", "sqlbee", "sqlbee@baseline", "sqlbee-waits", "sqlbee-waits@baseline"]
        );
        assert!(arms(&["nope".to_string()], false).is_err());
        assert!(arms(&["sqlbee".to_string(), "sqlbee".to_string()], false).is_err());
    }

    #[test]
    fn side_by_side_twins_share_a_unit_and_the_rest_stay_alone() {
        let names: Vec<String> = ["control", "sqlbee", "sqlbee-waits"].map(String::from).to_vec();
        let with = arms(&names, true).unwrap();
        assert_eq!(units(&with, true), vec![vec![0], vec![1, 2], vec![3, 4]]);
        assert_eq!(units(&with, false), vec![vec![0], vec![1], vec![2], vec![3], vec![4]]);
    }

    #[test]
    fn run_time_settings_start_every_server_with_their_flags_and_turned_off() {
        let names: Vec<String> =
            ["control", "sqlbee", "performance-schema-live", "slow-log", "performance-schema-statements"]
                .map(String::from)
                .to_vec();
        let (flags, offs) = run_time_settings(&arms(&names, false).unwrap());
        assert_eq!(flags, ["--performance-schema=ON"]);
        assert_eq!(offs.len(), 2, "{offs:?}");
        assert!(offs[0].contains("performance_schema.setup_consumers SET ENABLED = 'NO'"));
        assert!(offs[1].contains("slow_query_log = 0"));
        let (flags, offs) = run_time_settings(&arms(&["control".into(), "sqlbee".into()], false).unwrap());
        assert!(flags.is_empty() && offs.is_empty());
    }

    #[test]
    fn sibling_servers_are_one_per_set_of_start_up_flags() {
        let names: Vec<String> = [
            "control",
            "control-elsewhere",
            "sqlbee",
            "performance-schema-statements",
            "performance-schema-live",
            "performance-schema",
        ]
        .map(String::from)
        .to_vec();
        let with = arms(&names, true).unwrap();
        let sets = sibling_flag_sets(&with);
        assert_eq!(sets.len(), 3, "{sets:?}");
        assert_eq!(sets[0], ["--performance-schema=OFF"]);
        assert_eq!(sets[1].len(), 5);
        assert_eq!(sets[2], ["--performance-schema=ON"]);
        // Arms turned on at run time, tracers and control stay on the main one.
        assert!(
            sibling_flag_sets(&arms(&["control".into(), "performance-schema-live".into()], false).unwrap()).is_empty()
        );
    }

    #[test]
    fn mysqld_time_splits_by_its_ticks_and_the_programs_come_out_of_the_kernel_share() {
        // 10 000 ns per statement, a quarter of the ticks in the kernel,
        // 1000 ns of it the programs'.
        let run = ArmRun {
            questions: 1000,
            mysqld_cpu_ns: 10_000_000,
            mysqld_cpu_ticks: 400,
            mysqld_system_ticks: 100,
            bpf_ns: 1_000_000,
            ..Default::default()
        };
        assert_eq!(run.kernel_ns_per_statement(), 2500.0);
        assert_eq!(run.user_ns_per_statement(), 7500.0);
        assert_eq!(run.kernel_outside_programs_ns_per_statement(), 1500.0);
        assert_eq!(ArmRun { mysqld_cpu_ticks: 0, ..run }.kernel_ns_per_statement(), 0.0);
    }

    #[test]
    fn dates_are_civil() {
        assert_eq!(civil_date(0), "1970-01-01 00:00 UTC");
        assert_eq!(civil_date(1_700_000_000), "2023-11-14 22:13 UTC");
        assert_eq!(civil_date(951_782_400), "2000-02-29 00:00 UTC");
    }
}
