//! `cargo xtask bench`: control vs sqlbee on sysbench, in alternating pairs
//! (A B A B ...) so drift cancels, plus the criterion micro-benchmarks.
//! Writes `benches/results/<date>-<name>.md` and a CSV of every raw run.
//! Numbers are reported, never asserted.
use std::{
    fmt::Write as _,
    fs,
    path::Path,
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::{Context as _, bail};
use xtask::{mariadb::PrivateServer, paths::workspace_root, sysbench::Sysbench};

use crate::{cargo, demo::build_agent};

#[derive(clap::Args, Debug)]
pub struct BenchArgs {
    /// Fewer rows, shorter runs, fewer pairs: a smoke run in about 2 minutes.
    #[arg(long)]
    pub quick: bool,
    /// sysbench scripts to run.
    #[arg(long, value_delimiter = ',', default_value = "oltp_point_select,oltp_read_only")]
    pub scripts: Vec<String>,
    #[arg(long, default_value_t = 16)]
    pub threads: u32,
    /// Seconds per run (default 20, quick 5).
    #[arg(long)]
    pub seconds: Option<u32>,
    /// Control/agent pairs per script (default 3, quick 2).
    #[arg(long)]
    pub pairs: Option<u32>,
    /// Name in the result file.
    #[arg(long, default_value = "overhead")]
    pub name: String,
    /// Skip the criterion micro-benchmarks.
    #[arg(long)]
    pub no_micro: bool,
    /// Treatments run against a fresh control in each pair: `sqlbee`
    /// (default probes), `sqlbee-no-waits` (without the wait probes), and
    /// what a DBA would turn on instead: `slow-log` (long_query_time=0)
    /// and `general-log`, both to files.
    #[arg(long, value_delimiter = ',', default_value = "sqlbee")]
    pub treatments: Vec<String>,
}

/// What a treatment turns on.
enum Treatment {
    Control,
    /// sqlbee with these extra agent flags.
    Agent(&'static [&'static str]),
    /// Server settings: SQL to turn it on, SQL to turn it off.
    Server(&'static str, &'static str),
}

fn treatment_of(name: &str) -> anyhow::Result<Treatment> {
    Ok(match name {
        "control" => Treatment::Control,
        "sqlbee" => Treatment::Agent(&[]),
        "sqlbee-no-waits" => Treatment::Agent(&["--no-wait-probes"]),
        "slow-log" => Treatment::Server(
            "SET GLOBAL log_output = 'FILE', long_query_time = 0, slow_query_log = 1",
            "SET GLOBAL slow_query_log = 0, long_query_time = 10",
        ),
        "general-log" => {
            Treatment::Server("SET GLOBAL log_output = 'FILE', general_log = 1", "SET GLOBAL general_log = 0")
        }
        other => bail!("unknown treatment {other:?}: use sqlbee, sqlbee-no-waits, slow-log or general-log"),
    })
}

/// BPF programs' run count and run time, from `bpftool prog show --json`
/// (needs kernel.bpf_stats_enabled=1 while the run lasts).
fn bpf_program_stats() -> std::collections::BTreeMap<String, (u64, u64)> {
    let mut stats = std::collections::BTreeMap::new();
    let Ok(out) = Command::new("bpftool").args(["prog", "show", "--json"]).output() else { return stats };
    let text = String::from_utf8_lossy(&out.stdout);
    // One object per program; pick "name", "run_time_ns" and "run_cnt"
    // without a JSON dependency in xtask.
    for object in text.split("},{") {
        let field = |key: &str| -> Option<String> {
            let i = object.find(&format!("\"{key}\":"))? + key.len() + 3;
            let rest = object[i..].trim_start_matches('"');
            Some(rest.split(|c: char| c == '"' || c == ',' || c == '}').next()?.to_string())
        };
        if let (Some(name), Some(time), Some(count)) = (field("name"), field("run_time_ns"), field("run_cnt")) {
            let entry = stats.entry(name).or_insert((0, 0));
            entry.0 += count.parse::<u64>().unwrap_or(0);
            entry.1 += time.parse::<u64>().unwrap_or(0);
        }
    }
    stats
}

const OUR_PROGRAMS: [&str; 5] = ["command_start", "statement_end", "error_raised", "wait_begin", "wait_end"];

#[derive(Clone, Debug)]
struct Run {
    script: String,
    treatment: String,
    pair: u32,
    seconds: f64,
    queries: u64,
    qps: f64,
    tps: f64,
    avg_ms: f64,
    p95_ms: f64,
    mysqld_cpu_s: f64,
    agent_cpu_s: f64,
    agent_peak_rss_kib: u64,
    agent_statements: u64,
    /// Probe hits and BPF run time during the run, over all our programs.
    bpf_hits: u64,
    bpf_ns: u64,
}

fn clock_ticks() -> f64 {
    // SAFETY: sysconf has no preconditions.
    (unsafe { libc::sysconf(libc::_SC_CLK_TCK) }) as f64
}

/// utime + stime of a process, in seconds.
fn cpu_seconds(pid: u32) -> f64 {
    let Ok(stat) = fs::read_to_string(format!("/proc/{pid}/stat")) else { return 0.0 };
    let Some(rest) = stat.rfind(')').map(|i| &stat[i + 1..]) else { return 0.0 };
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks: u64 = fields.get(11).and_then(|v| v.parse().ok()).unwrap_or(0)
        + fields.get(12).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
    ticks as f64 / clock_ticks()
}

fn peak_rss_kib(pid: u32) -> u64 {
    fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| s.lines().find(|l| l.starts_with("VmHWM:")).map(|l| l.to_string()))
        .and_then(|l| l.split_whitespace().nth(1).and_then(|v| v.parse().ok()))
        .unwrap_or(0)
}

fn parse_sysbench(report: &str) -> (u64, f64, f64, f64, f64) {
    let number_after = |key: &str, nth: usize| -> f64 {
        report
            .lines()
            .find(|l| l.trim_start().starts_with(key))
            .and_then(|l| {
                l.split(|c: char| c.is_whitespace() || c == '(')
                    .filter_map(|w| w.parse::<f64>().ok())
                    .nth(nth)
            })
            .unwrap_or(0.0)
    };
    (
        number_after("queries:", 0) as u64,
        number_after("queries:", 1),
        number_after("transactions:", 1),
        number_after("avg:", 0),
        number_after("95th percentile:", 0),
    )
}

pub fn run(args: BenchArgs) -> anyhow::Result<()> {
    let seconds = args.seconds.unwrap_or(if args.quick { 5 } else { 20 });
    let pairs = args.pairs.unwrap_or(if args.quick { 2 } else { 3 });
    let (tables, table_size) = if args.quick { (2, 10_000) } else { (8, 100_000) };
    let sqlbee = build_agent()?;
    println!("==> private MariaDB for benchmarks (buffer pool 1 GiB, data in memory)");
    let server = PrivateServer::start("bench", &["--innodb-buffer-pool-size=1G", "--max-prepared-stmt-count=100000"])?;
    let mut base = Sysbench {
        script: "oltp_read_only".into(),
        tables,
        table_size,
        threads: args.threads,
        seconds,
        ps_mode: "auto",
    };
    println!("==> sysbench prepare ({tables} tables x {table_size} rows)");
    base.prepare(&server)?;
    // Warm the buffer pool so the first control run is not penalised.
    base.seconds = 3;
    base.run(&server)?;
    base.seconds = seconds;

    for t in &args.treatments {
        treatment_of(t)?;
    }
    let total_runs = args.scripts.len() as u32 * pairs * (1 + args.treatments.len() as u32);
    let started = Instant::now();
    let mut runs = Vec::new();
    let mut done = 0u32;
    for script in &args.scripts {
        for pair in 0..pairs {
            let arms = std::iter::once("control".to_string()).chain(args.treatments.iter().cloned());
            for treatment in arms {
                let elapsed = started.elapsed().as_secs_f64();
                let eta = if done > 0 { elapsed / done as f64 * (total_runs - done) as f64 } else { (total_runs * (seconds + 2)) as f64 };
                println!("==> [{}/{total_runs}] {script} {treatment} pair {} (ETA {:.0} s)", done + 1, pair + 1, eta);
                let bench = Sysbench { script: script.clone(), ..base.clone() };
                runs.push(one_run(&server, &sqlbee, &bench, &treatment, pair)?);
                done += 1;
            }
        }
    }
    let micro = if args.no_micro { String::new() } else { micro_benchmarks(args.quick)? };
    let report = render(&args, seconds, pairs, tables, table_size, &runs, &micro);
    write_results(&args.name, &report, &runs)?;
    println!("{report}");
    Ok(())
}

fn one_run(server: &PrivateServer, sqlbee: &Path, bench: &Sysbench, treatment_name: &str, pair: u32) -> anyhow::Result<Run> {
    let treatment = treatment_name;
    let mut agent = None;
    let out_path = server.dir().join(format!("bench-{}-{pair}-{treatment}.jsonl", bench.script));
    let kind = treatment_of(treatment_name)?;
    if let Treatment::Server(on, _) = kind {
        server.sql(on)?;
    }
    if let Treatment::Agent(extra) = kind {
        let _ = Command::new("sysctl").args(["-q", "kernel.bpf_stats_enabled=1"]).status();
        let ready = server.dir().join("bench.ready");
        let _ = fs::remove_file(&ready);
        let child = Command::new(sqlbee)
            .args(["agent", "--output", "jsonl", "--window", "1h"])
            .args(extra)
            .arg(format!("--pid={}", server.pid()))
            .arg("--ready-file")
            .arg(&ready)
            .stdout(fs::File::create(&out_path)?)
            .stderr(Stdio::null())
            .spawn()
            .context("starting sqlbee")?;
        let t = Instant::now();
        while !ready.exists() {
            if t.elapsed() > Duration::from_secs(30) {
                bail!("sqlbee did not attach");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        agent = Some(child);
    }
    let agent_cpu0 = agent.as_ref().map(|a| cpu_seconds(a.id())).unwrap_or(0.0);
    let mysqld_cpu0 = cpu_seconds(server.pid());
    let t0 = Instant::now();
    let report = bench.run(server);
    if let Treatment::Server(_, off) = kind {
        server.sql(off)?;
    }
    let report = report?;
    let wall = t0.elapsed().as_secs_f64();
    let mysqld_cpu = cpu_seconds(server.pid()) - mysqld_cpu0;
    let (mut agent_cpu, mut rss, mut statements, mut bpf_hits, mut bpf_ns) = (0.0, 0, 0, 0, 0);
    if let Some(mut child) = agent {
        agent_cpu = cpu_seconds(child.id()) - agent_cpu0;
        rss = peak_rss_kib(child.id());
        for (name, (count, ns)) in bpf_program_stats() {
            if OUR_PROGRAMS.contains(&name.as_str()) {
                bpf_hits += count;
                bpf_ns += ns;
            }
        }
        let _ = Command::new("sysctl").args(["-q", "kernel.bpf_stats_enabled=0"]).status();
        // SAFETY: kill(2) on our own child.
        unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
        child.wait()?;
        let text = fs::read_to_string(&out_path).unwrap_or_default();
        statements = text
            .lines()
            .filter(|l| l.contains("\"type\":\"summary\""))
            .filter_map(|l| {
                let i = l.find("\"statements\":")? + "\"statements\":".len();
                l[i..].split(|c: char| !c.is_ascii_digit()).next()?.parse::<u64>().ok()
            })
            .sum();
    }
    let (queries, qps, tps, avg_ms, p95_ms) = parse_sysbench(&report);
    Ok(Run {
        script: bench.script.clone(),
        treatment: treatment.to_string(),
        pair,
        seconds: wall,
        queries,
        qps,
        tps,
        avg_ms,
        p95_ms,
        mysqld_cpu_s: mysqld_cpu,
        agent_cpu_s: agent_cpu,
        agent_peak_rss_kib: rss,
        agent_statements: statements,
        bpf_hits,
        bpf_ns,
    })
}

fn median(mut v: Vec<f64>) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(|a, b| a.total_cmp(b));
    let n = v.len();
    if n % 2 == 1 { v[n / 2] } else { (v[n / 2 - 1] + v[n / 2]) / 2.0 }
}

fn min_max(v: &[f64]) -> (f64, f64) {
    v.iter().fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), x| (lo.min(*x), hi.max(*x)))
}

fn render(args: &BenchArgs, seconds: u32, pairs: u32, tables: u32, size: u32, runs: &[Run], micro: &str) -> String {
    let mut md = String::new();
    let _ = writeln!(md, "# sqlbee overhead: {}\n", args.name);
    let _ = writeln!(
        md,
        "sysbench {threads} threads, {seconds} s per run, {pairs} control/sqlbee pairs per script run alternately, \
         {tables} tables x {size} rows in memory, private MariaDB {version}, {cores} cores.\n",
        threads = args.threads,
        version = Command::new("mariadbd").arg("--version").output().map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string()).unwrap_or_default(),
        cores = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(0),
    );
    let _ = writeln!(md, "| script | treatment | QPS ratio (median, min-max) | control QPS | treatment QPS | latency ratio | mysqld CPU/query control (us) | extra mysqld CPU/query (us) | probe hits/query | BPF ns/query | agent CPU/query (us) | agent cores per 10k QPS | agent peak RSS (MiB) | agent/sysbench count |");
    let _ = writeln!(md, "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|");
    for script in &args.scripts {
        for treatment in &args.treatments {
            let pairs_of = |t: &str| runs.iter().filter(|r| &r.script == script && r.treatment == t).cloned().collect::<Vec<_>>();
            let (control, agent) = (pairs_of("control"), pairs_of(treatment));
            let ratios: Vec<f64> = control.iter().zip(&agent).map(|(c, a)| a.qps / c.qps).collect();
            let lat: Vec<f64> = control.iter().zip(&agent).map(|(c, a)| a.avg_ms / c.avg_ms).collect();
            let per_query = |r: &Run| r.mysqld_cpu_s / r.queries.max(1) as f64 * 1e6;
            let extra: Vec<f64> = control.iter().zip(&agent).map(|(c, a)| per_query(a) - per_query(c)).collect();
            let hits: Vec<f64> = agent.iter().map(|a| a.bpf_hits as f64 / a.queries.max(1) as f64).collect();
            let bpf_ns: Vec<f64> = agent.iter().map(|a| a.bpf_ns as f64 / a.queries.max(1) as f64).collect();
            let agent_us: Vec<f64> = agent.iter().map(|a| a.agent_cpu_s / a.queries.max(1) as f64 * 1e6).collect();
            let cores_10k: Vec<f64> = agent.iter().map(|a| a.agent_cpu_s / a.seconds / a.qps.max(1.0) * 10_000.0).collect();
            let rss = agent.iter().map(|a| a.agent_peak_rss_kib).max().unwrap_or(0) as f64 / 1024.0;
            let counts: Vec<String> = agent.iter().map(|a| format!("{}/{}", a.agent_statements, a.queries)).collect();
            let (lo, hi) = min_max(&ratios);
            let _ = writeln!(
                md,
                "| {script} | {treatment} | {:.3} ({lo:.3}-{hi:.3}) | {:.0} | {:.0} | {:.3} | {:.1} | {:.2} | {:.2} | {:.0} | {:.2} | {:.4} | {rss:.1} | {} |",
                median(ratios.clone()),
                median(control.iter().map(|r| r.qps).collect()),
                median(agent.iter().map(|r| r.qps).collect()),
                median(lat),
                median(control.iter().map(per_query).collect()),
                median(extra.clone()),
                median(hits),
                median(bpf_ns),
                median(agent_us),
                median(cores_10k),
                counts.join(", "),
            );
            let effect = 1.0 - median(ratios.clone());
            if hi - lo > effect.abs() {
                let _ = writeln!(md, "\nNote: for {script} / {treatment} the min-max spread of the QPS ratio ({:.3}) is larger than the effect ({effect:.3}); more or longer pairs are needed to resolve it.\n", hi - lo);
            }
        }
    }
    let _ = writeln!(
        md,
        "\nExtra mysqld CPU per query is the probes' cost as the server pays it (uprobe traps are charged to the traced \
         process as system time). Each statement hits two probes (command start, statement end), so the cost per probe \
         hit is about half of that column.\n"
    );
    if !micro.is_empty() {
        let _ = writeln!(md, "## Micro-benchmarks (criterion, userspace hot path)\n\n```\n{micro}```");
    }
    md
}

fn write_results(name: &str, report: &str, runs: &[Run]) -> anyhow::Result<()> {
    let dir = workspace_root().join("benches/results");
    fs::create_dir_all(&dir)?;
    let date = Command::new("date").arg("+%Y-%m-%d").output()?;
    let date = String::from_utf8_lossy(&date.stdout).trim().to_string();
    fs::write(dir.join(format!("{date}-{name}.md")), report)?;
    let mut csv = String::from("script,treatment,pair,seconds,queries,qps,tps,avg_ms,p95_ms,mysqld_cpu_s,agent_cpu_s,agent_peak_rss_kib,agent_statements,bpf_hits,bpf_ns\n");
    for r in runs {
        let _ = writeln!(
            csv,
            "{},{},{},{:.3},{},{:.2},{:.2},{:.3},{:.3},{:.3},{:.3},{},{},{},{}",
            r.script, r.treatment, r.pair, r.seconds, r.queries, r.qps, r.tps, r.avg_ms, r.p95_ms, r.mysqld_cpu_s, r.agent_cpu_s, r.agent_peak_rss_kib, r.agent_statements, r.bpf_hits, r.bpf_ns
        );
    }
    fs::write(dir.join(format!("{date}-{name}.csv")), csv)?;
    println!("==> wrote benches/results/{date}-{name}.md and .csv");
    Ok(())
}

fn micro_benchmarks(quick: bool) -> anyhow::Result<String> {
    println!("==> criterion micro-benchmarks");
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
        .filter(|l| l.contains("time:") || (!l.starts_with(' ') && !l.is_empty() && !l.starts_with("Benchmarking") && !l.starts_with("Found") && !l.contains("outlier")))
        .map(|l| format!("{l}\n"))
        .collect())
}
