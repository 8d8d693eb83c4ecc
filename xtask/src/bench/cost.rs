//! `cargo xtask bench-cost`: what the agent itself costs at fixed statement
//! rates, in each shedding step. Where `bench` asks how much slower mysqld
//! gets, this asks how much CPU and memory the agent takes at 10k, 20k and
//! the highest rate this machine reaches (a target above it makes sysbench
//! fail, which the run records), measured from /proc (the kernel's
//! accounting of the agent process) beside what the agent reports itself.
//!
//! Each rate first gets a run without an agent: it shows the rate sysbench
//! really reached, how many statements one sysbench event is, and mysqld's
//! CPU without probes. Then one run per step, each with a fresh agent.
use std::{fs, path::PathBuf, process::Command, time::Instant};

use anyhow::{Context as _, bail};

use super::{
    measure::{cpu_seconds, parse_sysbench, peak_rss_kib},
    release_agent,
    treatment::Tracer,
};
use crate::{mariadb::PrivateServer, paths::workspace_root, sysbench::Sysbench};

#[derive(clap::Parser, Debug, Clone)]
#[command(name = "bench-cost")]
pub struct CostArgs {
    /// Target statement rates (QPS); 0 runs as fast as the machine goes.
    #[arg(long, value_delimiter = ',', default_value = "10000,20000,0")]
    pub rates: Vec<u32>,
    /// Agent configurations: exact, no-samples, known-texts-only (shedding
    /// steps pinned with --shedding-floor) and events (no in-kernel
    /// digests: every statement sent to user space).
    #[arg(long, value_delimiter = ',', default_value = "exact,no-samples,known-texts-only,events")]
    pub steps: Vec<String>,
    #[arg(long, default_value = "oltp_point_select")]
    pub script: String,
    #[arg(long, default_value_t = 16)]
    pub threads: u32,
    /// Seconds per run.
    #[arg(long, default_value_t = 30)]
    pub seconds: u32,
    #[arg(long, default_value_t = 4)]
    pub tables: u32,
    #[arg(long, default_value_t = 20_000)]
    pub table_size: u32,
    /// Agent window; cost is reported per window.
    #[arg(long, default_value = "5s")]
    pub window: String,
    #[arg(long, default_value = "agent-cost")]
    pub name: String,
    /// The sqlbee binary to measure (default: a release build made first).
    #[arg(long)]
    pub agent_bin: Option<PathBuf>,
    #[arg(long)]
    pub out_dir: Option<PathBuf>,
}

fn step_flags(step: &str) -> anyhow::Result<Vec<String>> {
    Ok(match step {
        "exact" => vec![],
        "no-samples" | "known-texts-only" => vec![format!("--shedding-floor={step}")],
        "events" => vec!["--kernel-digests=0".into()],
        other => bail!("--steps: unknown step {other:?}; expected exact, no-samples, known-texts-only or events"),
    })
}

/// One measured run.
#[derive(Debug, Default, Clone)]
pub struct CostRun {
    /// 0: as fast as possible.
    pub target_qps: u32,
    /// `none` (no agent) or one of `--steps`.
    pub step: String,
    pub seconds: f64,
    pub qps: f64,
    pub mysqld_cores: f64,
    pub agent_cores: f64,
    pub agent_peak_rss_kib: u64,
    /// Median of the agent's own per-window figures.
    pub reported_cores_per_10k: Option<f64>,
    /// Most severe step the agent reported in any window.
    pub reported_step: String,
    pub error: Option<String>,
}

pub struct CostOutcome {
    pub runs: Vec<CostRun>,
    pub report: PathBuf,
    pub csv: PathBuf,
}

impl CostRun {
    pub fn cores_per_10k(&self) -> f64 {
        if self.qps > 0.0 { self.agent_cores / (self.qps / 10_000.0) } else { 0.0 }
    }
}

fn median(mut values: Vec<f64>) -> Option<f64> {
    if values.is_empty() {
        return None;
    }
    values.sort_by(f64::total_cmp);
    Some(values[values.len() / 2])
}

/// The agent's own view: median cores per 10k QPS over windows that saw
/// statements, and the most severe shedding step of any window.
fn reported(lines: &[serde_json::Value]) -> (Option<f64>, String) {
    let agents: Vec<&serde_json::Value> = lines.iter().filter(|l| l["type"] == "agent").collect();
    let per_10k = agents
        .iter()
        .filter(|a| a["statements_per_s"].as_f64().unwrap_or(0.0) > 100.0)
        .filter_map(|a| a["cores_per_10k_qps"].as_f64())
        .collect();
    // A step this harness does not know ranks as the most severe.
    let order = ["exact", "no-samples", "known-texts-only"];
    let worst = agents
        .iter()
        .filter_map(|a| a["shedding"].as_str())
        .max_by_key(|s| order.iter().position(|o| o == s).unwrap_or(order.len()))
        .unwrap_or("-")
        .to_string();
    (median(per_10k), worst)
}

pub fn run(args: &CostArgs) -> anyhow::Result<CostOutcome> {
    for step in &args.steps {
        step_flags(step)?;
    }
    if args.seconds == 0 || args.threads == 0 {
        bail!("--seconds and --threads must be at least 1");
    }
    let bin = match &args.agent_bin {
        Some(path) => path.clone(),
        None => release_agent()?,
    };
    eprintln!("==> private MariaDB for the cost benchmark");
    let server = PrivateServer::start(
        "bench-cost",
        &["--innodb-buffer-pool-size=512M", "--max-prepared-stmt-count=100000", "--performance-schema=OFF"],
    )?;
    let mut bench = Sysbench {
        script: args.script.clone(),
        tables: args.tables,
        table_size: args.table_size,
        threads: args.threads,
        seconds: args.seconds,
        ps_mode: "auto",
        rate: 0,
    };
    eprintln!("==> sysbench prepare ({} tables x {} rows)", args.tables, args.table_size);
    bench.prepare(&server)?;
    // The warm-up also tells how many statements one sysbench event is,
    // which turns a target QPS into sysbench's --rate (events/s).
    let warm = Sysbench { seconds: 5, ..bench.clone() };
    let warmed = parse_sysbench(&warm.run(&server).context("warm-up run")?);
    if warmed.transactions == 0 {
        bail!("the warm-up run reported no events");
    }
    let per_event = warmed.queries as f64 / warmed.transactions as f64;

    let mut runs = Vec::new();
    let total = args.rates.len() * (args.steps.len() + 1);
    let started = Instant::now();
    for &target in &args.rates {
        for step in std::iter::once("none").chain(args.steps.iter().map(String::as_str)) {
            let done = runs.len();
            let eta =
                if done > 0 { started.elapsed().as_secs_f64() / done as f64 * (total - done) as f64 } else { 0.0 };
            let rate_name = if target == 0 { "max".to_string() } else { target.to_string() };
            eprintln!("[run {}/{total}] {rate_name} QPS, agent {step} — ETA {:.0} min", done + 1, eta / 60.0);
            // At least 1: sysbench reads --rate=0 as "unlimited".
            bench.rate = if target == 0 { 0 } else { (target as f64 / per_event).round().max(1.0) as u32 };
            let mut run = CostRun { target_qps: target, step: step.to_string(), ..Default::default() };
            if let Err(e) = one_run(&bin, &server, &bench, args, step, &mut run) {
                eprintln!("    failed: {e:#}");
                run.error = Some(format!("{e:#}"));
            }
            runs.push(run);
        }
    }
    drop(server);
    let (report, csv) = write(args, &bin, &runs)?;
    Ok(CostOutcome { runs, report, csv })
}

fn one_run(
    bin: &std::path::Path,
    server: &PrivateServer,
    bench: &Sysbench,
    args: &CostArgs,
    step: &str,
    run: &mut CostRun,
) -> anyhow::Result<()> {
    let agent = match step {
        "none" => None,
        step => {
            let flags = step_flags(step)?;
            let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
            let tag = format!("cost-{}-{step}", run.target_qps);
            Some(Tracer::agent(bin, &flags, &args.window, server, &tag)?)
        }
    };
    let agent_cpu0 = agent.as_ref().map(|a| cpu_seconds(a.pid())).unwrap_or(0.0);
    let mysqld_cpu0 = cpu_seconds(server.pid());
    let started = Instant::now();
    let report = bench.run(server);
    run.seconds = started.elapsed().as_secs_f64();
    run.mysqld_cores = (cpu_seconds(server.pid()) - mysqld_cpu0) / run.seconds;
    if let Some(mut agent) = agent {
        // A dead agent's /proc entry is gone: its CPU would read as 0.
        if let Some(status) = agent.exited()? {
            bail!("the agent exited during the run ({status})");
        }
        run.agent_cores = (cpu_seconds(agent.pid()) - agent_cpu0) / run.seconds;
        run.agent_peak_rss_kib = peak_rss_kib(agent.pid());
        let text = agent.stop_output()?;
        let lines: Vec<serde_json::Value> = text.lines().filter_map(|l| serde_json::from_str(l).ok()).collect();
        (run.reported_cores_per_10k, run.reported_step) = reported(&lines);
    }
    let sysbench = parse_sysbench(&report?);
    run.qps = sysbench.qps;
    if sysbench.queries == 0 {
        bail!("sysbench reported no queries");
    }
    Ok(())
}

fn write(args: &CostArgs, bin: &std::path::Path, runs: &[CostRun]) -> anyhow::Result<(PathBuf, PathBuf)> {
    let dir = args.out_dir.clone().unwrap_or_else(|| workspace_root().join("benches/results"));
    fs::create_dir_all(&dir)?;
    let date = Command::new("date").arg("+%Y-%m-%d").output().context("running date")?;
    let stem = format!("{}-{}", String::from_utf8_lossy(&date.stdout).trim(), args.name);
    let mut md = format!(
        "# Agent cost by statement rate and shedding step\n\n\
         `cargo xtask bench-cost --rates {} --steps {} --script {} --threads {} --seconds {} --tables {} --table-size {} --window {}`\n\n\
         Agent: `{}`. One run per row, {} s each, sysbench `{}` at {} threads (prepared statements),\n\
         rate-limited with `--rate` where a target is given (`max`: unlimited). `agent cores` is the\n\
         agent process's CPU from /proc/PID/stat over the run; `per 10k QPS` divides it by the rate\n\
         sysbench reached; `reported` is the median of the agent's own per-window `cores_per_10k_qps`\n\
         (windows with statements), and `step` the most severe shedding step it reported: agents run\n\
         with their defaults otherwise (own cgroup, 1 core), so a step beyond the one pinned means the\n\
         agent shed by itself.\n\
         `mysqld cores` is the server's CPU over the run (the `none` row has no agent).\n\n\
         | target QPS | agent | QPS | agent cores | agent cores per 10k QPS | reported per 10k | peak RSS MiB | step | mysqld cores |\n\
         |---|---|---|---|---|---|---|---|---|\n",
        args.rates.iter().map(u32::to_string).collect::<Vec<_>>().join(","),
        args.steps.join(","),
        args.script,
        args.threads,
        args.seconds,
        args.tables,
        args.table_size,
        args.window,
        bin.display(),
        args.seconds,
        args.script,
        args.threads,
    );
    let mut csv = String::from(
        "target_qps,agent,seconds,qps,agent_cores,agent_cores_per_10k_qps,reported_cores_per_10k_qps,agent_peak_rss_kib,reported_step,mysqld_cores,error\n",
    );
    for r in runs {
        let target = if r.target_qps == 0 { "max".to_string() } else { r.target_qps.to_string() };
        let agent = r.step != "none";
        let or_dash = |show: bool, text: String| if show { text } else { "-".into() };
        md.push_str(&match &r.error {
            Some(e) => format!("| {target} | {} | failed: {} | | | | | | |\n", r.step, e.replace('|', "/")),
            None => format!(
                "| {target} | {} | {:.0} | {} | {} | {} | {} | {} | {:.2} |\n",
                r.step,
                r.qps,
                or_dash(agent, format!("{:.4}", r.agent_cores)),
                or_dash(agent, format!("{:.4}", r.cores_per_10k())),
                or_dash(agent, r.reported_cores_per_10k.map_or("-".into(), |v| format!("{v:.4}"))),
                or_dash(agent, format!("{:.1}", r.agent_peak_rss_kib as f64 / 1024.0)),
                or_dash(agent, r.reported_step.clone()),
                r.mysqld_cores,
            ),
        });
        csv.push_str(&format!(
            "{},{},{:.3},{:.1},{:.5},{:.5},{},{},{},{:.4},{}\n",
            r.target_qps,
            r.step,
            r.seconds,
            r.qps,
            r.agent_cores,
            r.cores_per_10k(),
            r.reported_cores_per_10k.map_or(String::new(), |v| format!("{v:.5}")),
            r.agent_peak_rss_kib,
            r.reported_step,
            r.mysqld_cores,
            r.error.as_deref().unwrap_or("").replace(',', ";"),
        ));
    }
    let (md_path, csv_path) = (dir.join(format!("{stem}.md")), dir.join(format!("{stem}.csv")));
    fs::write(&md_path, &md)?;
    fs::write(&csv_path, csv)?;
    eprintln!("==> wrote {}", md_path.display());
    Ok((md_path, csv_path))
}
