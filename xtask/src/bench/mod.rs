//! `cargo xtask bench`: what watching MariaDB costs, measured the way the
//! seed measurements were. For every sysbench script, client thread count
//! and treatment it runs pairs of one control run and one treatment run back
//! to back (A B A B ...), with a fresh control in every pair, so slow drift
//! of a shared VM cancels in the per-pair ratios. It writes a markdown
//! report, a CSV of every raw run and SVG plots side by side, plus the
//! criterion micro-benchmarks.
//!
//! Numbers are reported, never asserted. A run that fails (a tracer that
//! will not attach, an agent that rejects a flag) is recorded with its
//! reason and the bench goes on; only a server or data set that cannot be
//! set up at all stops it.
pub mod bystanders;
pub mod cost;
mod measure;
pub mod rate;
mod report;
mod svg;
mod treatment;

use std::{
    fs,
    path::{Path, PathBuf},
    process::Stdio,
    time::Instant,
};

use anyhow::{Context as _, bail};
pub use measure::ProgramStats;
use measure::{RunTimeStats, cpu_seconds, parse_sysbench, peak_rss_kib, programs_of};
use treatment::{AgentBinary, Tracer};
pub use treatment::{Setup, TREATMENTS, Treatment, all_for_bench};

use crate::{cargo, mariadb::PrivateServer, paths::workspace_root, sysbench::Sysbench};

#[derive(clap::Parser, Debug, Clone)]
#[command(name = "bench")]
pub struct BenchArgs {
    /// A small data set, 4 threads, 5 s runs and 2 pairs: minutes, not hours.
    #[arg(long)]
    pub quick: bool,
    /// sysbench scripts; a `-text` suffix runs the script over the text
    /// protocol (--db-ps-mode=disable) instead of prepared statements.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "oltp_read_only,oltp_read_write,oltp_write_only,oltp_point_select,oltp_point_select-text"
    )]
    pub scripts: Vec<String>,
    /// Client thread counts to sweep (default 1,4,16,64; quick 4).
    #[arg(long, value_delimiter = ',')]
    pub threads: Vec<u32>,
    /// Seconds per run (default 20, quick 5).
    #[arg(long)]
    pub seconds: Option<u32>,
    /// Control/treatment pairs per script, thread count and treatment
    /// (default 3, quick 2).
    #[arg(long)]
    pub pairs: Option<u32>,
    /// sysbench tables (default 8, quick 2).
    #[arg(long)]
    pub tables: Option<u32>,
    /// Rows per table (default 100000, quick 10000).
    #[arg(long)]
    pub table_size: Option<u32>,
    /// Name in the result files.
    #[arg(long, default_value = "overhead")]
    pub name: String,
    /// Skip the criterion micro-benchmarks.
    #[arg(long)]
    pub no_micro: bool,
    /// Treatments, each against a fresh control in every pair, or `all`:
    /// sqlbee, sqlbee-all (every optional probe), sqlbee-waits (the wait
    /// probes only), sqlbee-events (every statement sent to user space),
    /// sqlbee-lean (--figures lean: none of the server's own figures),
    /// sqlbee-send (--statement-hook send: statements end at the answer),
    /// sqlbee-budget (--mysqld-overhead-budget 1%), performance-schema
    /// (server restarted, its control too), performance-schema-statements
    /// (the same with the statement consumers on), slow-log (long_query_time=0),
    /// general-log, bpftrace-pair (uprobe + uretprobe on dispatch_command
    /// with a latency histogram), bpftrace-count (one counting uprobe),
    /// bpftrace-sendto (one counting syscall tracepoint), control-elsewhere
    /// (a restart alone).
    #[arg(long, value_delimiter = ',', default_value = "sqlbee")]
    pub treatments: Vec<String>,
    /// Where the report, CSV and plots go (default benches/results in the
    /// workspace).
    #[arg(long)]
    pub out_dir: Option<PathBuf>,
    /// The sqlbee binary to measure (default: a release build made first).
    #[arg(long)]
    pub agent_bin: Option<PathBuf>,
}

/// A script run over the text protocol carries this suffix.
const TEXT_SUFFIX: &str = "-text";

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Arm {
    Control,
    Treatment,
}

impl Arm {
    pub fn as_str(self) -> &'static str {
        match self {
            Arm::Control => "control",
            Arm::Treatment => "treatment",
        }
    }
}

/// One sysbench run, as measured; a failed run keeps its reason and zeros.
#[derive(Clone, Debug)]
pub struct Run {
    pub script: String,
    pub threads: u32,
    pub pair: u32,
    /// The treatment this run's pair compares, also on the control run.
    pub treatment: String,
    pub arm: Arm,
    /// Wall-clock seconds of the sysbench run.
    pub seconds: f64,
    pub queries: u64,
    pub transactions: u64,
    pub qps: f64,
    pub tps: f64,
    /// sysbench's latency is per transaction (event).
    pub avg_ms: f64,
    pub p95_ms: f64,
    /// Every transaction's latency added up.
    pub latency_sum_ms: f64,
    pub mysqld_cpu_s: f64,
    /// The tracer's CPU (sqlbee or bpftrace) from attach to the end of the run.
    pub agent_cpu_s: f64,
    pub agent_peak_rss_kib: u64,
    /// Statements the tracer reported (sqlbee's summaries, bpftrace's maps).
    pub agent_statements: u64,
    /// Every BPF program the tracer held, over its lifetime.
    pub programs: Vec<ProgramStats>,
    pub error: Option<String>,
}

impl Run {
    fn new(script: &str, threads: u32, pair: u32, treatment: &str, arm: Arm) -> Run {
        Run {
            script: script.to_string(),
            threads,
            pair,
            treatment: treatment.to_string(),
            arm,
            seconds: 0.0,
            queries: 0,
            transactions: 0,
            qps: 0.0,
            tps: 0.0,
            avg_ms: 0.0,
            p95_ms: 0.0,
            latency_sum_ms: 0.0,
            mysqld_cpu_s: 0.0,
            agent_cpu_s: 0.0,
            agent_peak_rss_kib: 0,
            agent_statements: 0,
            programs: Vec::new(),
            error: None,
        }
    }

    pub fn ok(&self) -> bool {
        self.error.is_none()
    }

    /// Mean latency per transaction, from the sum when sysbench gave one
    /// (its rounded `avg` is too coarse for fast statements).
    pub fn latency_ms(&self) -> f64 {
        if self.latency_sum_ms > 0.0 && self.transactions > 0 {
            self.latency_sum_ms / self.transactions as f64
        } else {
            self.avg_ms
        }
    }

    /// Mean latency per statement (one sysbench query), in us.
    pub fn statement_latency_us(&self) -> f64 {
        let per_transaction = self.queries as f64 / self.transactions.max(1) as f64;
        self.latency_ms() * 1000.0 / per_transaction.max(1.0)
    }

    pub fn bpf_hits(&self) -> u64 {
        self.programs.iter().map(|p| p.hits).sum()
    }

    pub fn bpf_ns(&self) -> u64 {
        self.programs.iter().map(|p| p.ns).sum()
    }
}

/// What a bench produced.
pub struct Outcome {
    pub runs: Vec<Run>,
    pub markdown: String,
    pub report: PathBuf,
    pub csv: PathBuf,
    pub plots: Vec<PathBuf>,
}

/// Everything the arguments decide, with the defaults and --quick applied.
struct Plan {
    name: String,
    scripts: Vec<String>,
    threads: Vec<u32>,
    treatments: Vec<&'static Treatment>,
    seconds: u32,
    pairs: u32,
    tables: u32,
    table_size: u32,
    /// Seconds of sysbench that warm a fresh server before it is measured.
    warm_seconds: u32,
    buffer_pool: &'static str,
    out_dir: PathBuf,
}

impl Plan {
    fn new(args: &BenchArgs) -> anyhow::Result<Plan> {
        let quick = args.quick;
        // This bench's pairs share one server with performance_schema off:
        // a treatment that needs other start-up flags on every arm's server
        // runs under bench-rate, which starts its servers with them.
        let treatments: Vec<&'static Treatment> = if args.treatments.iter().any(|t| t == "all") {
            all_for_bench().collect()
        } else {
            args.treatments.iter().map(|t| treatment::treatment(t)).collect::<anyhow::Result<Vec<_>>>()?
        };
        if let Some(t) = treatments.iter().find(|t| !t.base_flags().is_empty()) {
            bail!(
                "--treatments: {} needs every arm's server started with {}; run it with `cargo xtask bench-rate`",
                t.name,
                t.base_flags().join(" ")
            );
        }
        let threads = if !args.threads.is_empty() {
            args.threads.clone()
        } else if quick {
            vec![4]
        } else {
            vec![1, 4, 16, 64]
        };
        if threads.contains(&0) {
            bail!("--threads: every thread count must be at least 1 (got {threads:?})");
        }
        for script in &args.scripts {
            let lua = script.strip_suffix(TEXT_SUFFIX).unwrap_or(script);
            if !Path::new("/usr/share/sysbench").join(format!("{lua}.lua")).exists() {
                bail!(
                    "--scripts: no sysbench script {lua}.lua in /usr/share/sysbench (e.g. oltp_read_only, oltp_point_select-text)"
                );
            }
        }
        let plan = Plan {
            name: args.name.clone(),
            scripts: args.scripts.clone(),
            threads,
            treatments,
            seconds: args.seconds.unwrap_or(if quick { 5 } else { 20 }),
            pairs: args.pairs.unwrap_or(if quick { 2 } else { 3 }),
            tables: args.tables.unwrap_or(if quick { 2 } else { 8 }),
            table_size: args.table_size.unwrap_or(if quick { 10_000 } else { 100_000 }),
            warm_seconds: if quick { 1 } else { 5 },
            buffer_pool: if quick { "--innodb-buffer-pool-size=256M" } else { "--innodb-buffer-pool-size=1G" },
            out_dir: args.out_dir.clone().unwrap_or_else(|| workspace_root().join("benches/results")),
        };
        if plan.seconds == 0 || plan.pairs == 0 || plan.tables == 0 || plan.table_size == 0 {
            bail!("--seconds, --pairs, --tables and --table-size must be at least 1");
        }
        Ok(plan)
    }

    fn total_runs(&self) -> usize {
        self.scripts.len() * self.threads.len() * self.treatments.len() * self.pairs as usize * 2
    }

    fn sysbench(&self, script: &str, threads: u32, seconds: u32) -> Sysbench {
        let (lua, ps_mode) = match script.strip_suffix(TEXT_SUFFIX) {
            Some(lua) => (lua, "disable"),
            None => (script, "auto"),
        };
        Sysbench {
            script: lua.to_string(),
            tables: self.tables,
            table_size: self.table_size,
            threads,
            seconds,
            ps_mode,
            rate: 0,
        }
    }
}

/// The benchmark's server and the start-up flags it runs with now.
struct BenchServer {
    server: PrivateServer,
    base: Vec<&'static str>,
    flags: &'static [&'static str],
    tables: u32,
}

impl BenchServer {
    /// Makes sure the server runs with `flags` on top of the base ones. It
    /// restarts when the flags differ, when `fresh` asks for a restart
    /// anyway, or when the server stopped answering, and warms a restarted
    /// server before anything is measured on it. True when it restarted.
    fn ensure(&mut self, flags: &'static [&'static str], fresh: bool, warm: &Sysbench) -> anyhow::Result<bool> {
        let alive = self.server.sql("SELECT 1").is_ok();
        if alive && !fresh && self.flags == flags {
            return Ok(false);
        }
        let args: Vec<&str> = self.base.iter().chain(flags).copied().collect();
        self.server.restart_with_args(&args).context("restarting mariadbd")?;
        self.flags = flags;
        self.warm(warm)?;
        Ok(true)
    }

    /// Reads every row once so the buffer pool holds the whole data set,
    /// then a short run of the next workload for the server's caches.
    fn warm(&self, bench: &Sysbench) -> anyhow::Result<()> {
        for t in 1..=self.tables {
            self.server.sql(&format!("SELECT COUNT(*), SUM(k), SUM(LENGTH(c)) FROM sbtest.sbtest{t}"))?;
        }
        bench.run(&self.server).context("warm-up run")?;
        Ok(())
    }
}

/// "[run 7/48] ... — ETA 23 min" on stderr, from the mean time per run so far.
struct Progress {
    total: usize,
    done: usize,
    started: Instant,
    /// Seconds per run assumed before the first one finishes.
    guess: f64,
}

impl Progress {
    fn announce(&self, script: &str, threads: u32, treatment: &str, arm: Arm, pair: u32) {
        let per_run = if self.done > 0 { self.started.elapsed().as_secs_f64() / self.done as f64 } else { self.guess };
        let minutes = (per_run * (self.total - self.done) as f64 / 60.0).round() as u64;
        let eta = match minutes {
            0 => "under 1 min".to_string(),
            m if m < 90 => format!("{m} min"),
            m => format!("{} h {:02} min", m / 60, m % 60),
        };
        let what = match arm {
            Arm::Control => format!("control for {treatment}"),
            Arm::Treatment => treatment.to_string(),
        };
        eprintln!("[run {}/{}] {script} {threads} thr {what} pair {} — ETA {eta}", self.done + 1, self.total, pair + 1);
    }
}

/// Runs the whole bench described by `args` and writes its results.
pub fn run(args: &BenchArgs) -> anyhow::Result<Outcome> {
    let plan = Plan::new(args)?;
    let sqlbee = match &args.agent_bin {
        Some(path) => path.clone(),
        None => release_agent()?,
    };
    if !sqlbee.exists() {
        bail!("--agent-bin {}: no such file; build sqlbee first or leave the flag out", sqlbee.display());
    }
    let sqlbee = AgentBinary::new(sqlbee)?;
    // Held until the end: program run counts and times for every run.
    let _stats = RunTimeStats::enable();

    eprintln!("==> private MariaDB for benchmarks (data in memory, performance_schema off)");
    let base = vec![
        plan.buffer_pool,
        "--max-prepared-stmt-count=100000",
        "--performance-schema=OFF",
        // The warm-up decides what is in the buffer pool, not a reload
        // racing the first measured run.
        "--innodb-buffer-pool-dump-at-shutdown=OFF",
        "--innodb-buffer-pool-load-at-startup=OFF",
    ];
    let server = PrivateServer::start("bench", &base)?;
    let mut server = BenchServer { server, base, flags: &[], tables: plan.tables };
    eprintln!("==> sysbench prepare ({} tables x {} rows)", plan.tables, plan.table_size);
    plan.sysbench("oltp_read_only", plan.tables.min(4), 1).prepare(&server.server)?;
    treatment::write_plans_login(server.server.dir(), |sql| server.server.sql(sql))
        .context("creating the plans arm's login")?;

    let mut progress =
        Progress { total: plan.total_runs(), done: 0, started: Instant::now(), guess: plan.seconds as f64 + 3.0 };
    let mut runs = Vec::with_capacity(progress.total);
    for script in &plan.scripts {
        for &threads in &plan.threads {
            let bench = plan.sysbench(script, threads, plan.seconds);
            let warm = plan.sysbench(script, threads, plan.warm_seconds);
            // Every workload starts on a warm base server.
            let warmed = server.ensure(&[], false, &warm);
            if let Err(e) = warmed.and_then(|restarted| if restarted { Ok(()) } else { server.warm(&warm) }) {
                eprintln!("    warm-up failed: {e:#}");
            }
            for pair in 0..plan.pairs {
                for treatment in &plan.treatments {
                    for arm in [Arm::Control, Arm::Treatment] {
                        progress.announce(script, threads, treatment.name, arm, pair);
                        let mut run = Run::new(script, threads, pair, treatment.name, arm);
                        if let Err(e) = one_run(&mut server, &sqlbee, &bench, &warm, treatment, &mut run) {
                            eprintln!("    failed: {e:#}");
                            run.error = Some(format!("{e:#}"));
                        }
                        runs.push(run);
                        progress.done += 1;
                    }
                }
            }
        }
    }
    drop(server);
    let micro = if args.no_micro { String::new() } else { micro_benchmarks(args.quick)? };
    write_results(&plan, &sqlbee, runs, &micro)
}

fn one_run(
    server: &mut BenchServer,
    sqlbee: &AgentBinary,
    bench: &Sysbench,
    warm: &Sysbench,
    treatment: &Treatment,
    run: &mut Run,
) -> anyhow::Result<()> {
    // A treatment that needs a restart gets one for its control run as well,
    // so both arms start from the same state.
    let restart = treatment.server_flags();
    match run.arm {
        Arm::Control => server.ensure(&[], !restart.is_empty(), warm)?,
        Arm::Treatment => server.ensure(restart, !restart.is_empty(), warm)?,
    };
    let treated = run.arm == Arm::Treatment;
    let tag = format!("{}-{}-{}-{}", run.script, run.threads, run.pair, treatment.name);
    let tracer = if treated { Tracer::start(treatment, sqlbee, &server.server, &tag)? } else { None };
    let sql_off = match (&treatment.setup, treated) {
        (Setup::ServerSql { on, off, .. }, true) => {
            server.server.sql(on)?;
            Some(*off)
        }
        _ => None,
    };

    let tracer_cpu0 = tracer.as_ref().map(|t| cpu_seconds(t.pid())).unwrap_or(0.0);
    let mysqld_cpu0 = cpu_seconds(server.server.pid());
    let started = Instant::now();
    let report = bench.run(&server.server);
    run.seconds = started.elapsed().as_secs_f64();
    run.mysqld_cpu_s = cpu_seconds(server.server.pid()) - mysqld_cpu0;
    if let Some(tracer) = &tracer {
        run.agent_cpu_s = cpu_seconds(tracer.pid()) - tracer_cpu0;
        run.agent_peak_rss_kib = peak_rss_kib(tracer.pid());
        run.programs = programs_of(tracer.pid());
    }
    if let Some(off) = sql_off
        && let Err(e) = server.server.sql(off)
    {
        // Global variables do not survive a restart: a restart is the sure
        // way to keep the setting out of the next runs.
        let base = server.base.clone();
        server.server.restart_with_args(&base)?;
        server.flags = &[];
        return Err(e.context("turning the setting off again (server restarted)"));
    }
    if let Some(tracer) = tracer {
        run.agent_statements = tracer.stop()?;
    }
    let sysbench = parse_sysbench(&report?);
    run.queries = sysbench.queries;
    run.transactions = sysbench.transactions;
    run.qps = sysbench.qps;
    run.tps = sysbench.tps;
    run.avg_ms = sysbench.avg_ms;
    run.p95_ms = sysbench.p95_ms;
    run.latency_sum_ms = sysbench.latency_sum_ms;
    if run.queries == 0 {
        bail!("sysbench reported no queries");
    }
    Ok(())
}

fn release_agent() -> anyhow::Result<PathBuf> {
    eprintln!("==> building sqlbee (release)");
    let status = cargo().args(["build", "--release", "-p", "sqlbee"]).status().context("running cargo build")?;
    if !status.success() {
        bail!("building sqlbee failed");
    }
    Ok(workspace_root().join("target/release/sqlbee"))
}

fn write_results(plan: &Plan, sqlbee: &AgentBinary, runs: Vec<Run>, micro: &str) -> anyhow::Result<Outcome> {
    let dir = &plan.out_dir;
    fs::create_dir_all(dir).with_context(|| format!("creating the result directory {}", dir.display()))?;
    let date = std::process::Command::new("date").arg("+%Y-%m-%d").output().context("running date")?;
    let stem = format!("{}-{}", String::from_utf8_lossy(&date.stdout).trim(), plan.name);
    let mut plots = Vec::new();
    let mut links = Vec::new();
    for (suffix, title, svg) in report::plots(plan, &runs) {
        let file = format!("{stem}-{suffix}.svg");
        fs::write(dir.join(&file), svg)?;
        plots.push(dir.join(&file));
        links.push((title, file));
    }
    let markdown = report::markdown(plan, sqlbee, &runs, &links, micro);
    let (md_path, csv_path) = (dir.join(format!("{stem}.md")), dir.join(format!("{stem}.csv")));
    fs::write(&md_path, &markdown)?;
    fs::write(&csv_path, report::csv(&runs))?;
    eprintln!("==> wrote {}, .csv and {} plots", md_path.display(), plots.len());
    Ok(Outcome { runs, markdown, report: md_path, csv: csv_path, plots })
}

fn micro_benchmarks(quick: bool) -> anyhow::Result<String> {
    eprintln!("==> criterion micro-benchmarks");
    let mut cmd = cargo();
    cmd.args(["bench", "-p", "sqlbee", "--bench", "hot_path", "--"]);
    if quick {
        cmd.args(["--warm-up-time", "1", "--measurement-time", "2"]);
    }
    let out = cmd.stderr(Stdio::inherit()).output().context("running cargo bench")?;
    if !out.status.success() {
        bail!("cargo bench failed");
    }
    let text = String::from_utf8_lossy(&out.stdout);
    Ok(text
        .lines()
        .filter(|l| {
            l.contains("time:")
                || (!l.starts_with(' ')
                    && !l.is_empty()
                    && !l.starts_with("Benchmarking")
                    && !l.starts_with("Found")
                    && !l.contains("outlier"))
        })
        .map(|l| format!("{l}\n"))
        .collect())
}
