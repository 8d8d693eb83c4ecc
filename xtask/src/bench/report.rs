//! Turns raw runs into the report: per-pair ratios and costs, their medians
//! with min-max, the rows whose spread is larger than their effect, the
//! CSV of every run and the plots. Pure: it formats text and never
//! measures or writes files.
use std::{collections::BTreeMap, fmt::Write as _, process::Command};

use super::{Arm, Plan, Run, svg, treatment::AgentBinary};

/// A median with the min-max over the pairs it came from.
struct Spread {
    median: f64,
    lo: f64,
    hi: f64,
    n: usize,
}

impl Spread {
    fn of(values: impl IntoIterator<Item = f64>) -> Spread {
        let mut v: Vec<f64> = values.into_iter().filter(|x| x.is_finite()).collect();
        v.sort_by(f64::total_cmp);
        let n = v.len();
        let median = match n {
            0 => f64::NAN,
            _ if n % 2 == 1 => v[n / 2],
            _ => (v[n / 2 - 1] + v[n / 2]) / 2.0,
        };
        Spread { median, lo: v.first().copied().unwrap_or(f64::NAN), hi: v.last().copied().unwrap_or(f64::NAN), n }
    }

    fn show(&self, decimals: usize) -> String {
        match self.n {
            0 => "-".into(),
            1 => format!("{:.decimals$}", self.median),
            _ => format!("{:.decimals$} ({:.decimals$}-{:.decimals$})", self.median, self.lo, self.hi),
        }
    }

    /// "spread 0.12 > effect 0.05" when the min-max range is wider than the
    /// distance of the median from `neutral` (1 for a ratio, 0 for a
    /// difference): the pairs disagree more than the treatment moves it.
    fn unresolved(&self, neutral: f64) -> Option<String> {
        let (spread, effect) = (self.hi - self.lo, (self.median - neutral).abs());
        (self.n >= 2 && spread > effect).then(|| format!("spread {spread:.3} > effect {effect:.3}"))
    }
}

/// The control and treatment run of each pair where both succeeded.
fn pairs<'a>(runs: &'a [Run], script: &str, threads: u32, treatment: &str) -> Vec<(&'a Run, &'a Run)> {
    let arm = |pair: u32, arm: Arm| {
        runs.iter().find(|r| {
            r.ok()
                && r.script == script
                && r.threads == threads
                && r.treatment == treatment
                && r.pair == pair
                && r.arm == arm
        })
    };
    let max_pair = runs.iter().map(|r| r.pair + 1).max().unwrap_or(0);
    (0..max_pair).filter_map(|p| Some((arm(p, Arm::Control)?, arm(p, Arm::Treatment)?))).collect()
}

fn per_statement(seconds: f64, run: &Run) -> f64 {
    seconds / run.queries.max(1) as f64 * 1e6
}

fn cell(text: &str) -> String {
    text.replace('|', "\\|").replace('\n', " ")
}

fn environment() -> String {
    let version = Command::new("mariadbd")
        .arg("--version")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_default();
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    let cores = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(0);
    format!("{version}, kernel {}, {cores} cores", kernel.trim())
}

pub(super) fn markdown(
    plan: &Plan,
    sqlbee: &AgentBinary,
    runs: &[Run],
    plots: &[(String, String)],
    micro: &str,
) -> String {
    let mut md = String::new();
    let threads: Vec<String> = plan.threads.iter().map(u32::to_string).collect();
    let _ = writeln!(md, "# sqlbee overhead: {}\n", plan.name);
    let _ = writeln!(
        md,
        "sysbench at {} client threads, {} s per run, {} control/treatment pairs per script, thread count and \
         treatment, {} tables x {} rows in memory; private {}.\n",
        threads.join(", "),
        plan.seconds,
        plan.pairs,
        plan.tables,
        plan.table_size,
        environment()
    );
    let _ = writeln!(
        md,
        "Method: every pair is one control run then one treatment run, back to back, with a fresh control in \
         every pair, so drift of the machine cancels in the per-pair ratios. Ratios and costs are medians over \
         the pairs with the min-max in brackets. A row is flagged when the min-max spread of a ratio is larger \
         than the effect it reports: the pairs disagree more than the treatment moves the number, so that \
         number is not resolved. Scripts with `{}` use the text protocol (`--db-ps-mode=disable`), the others \
         server-side prepared statements.\n",
        super::TEXT_SUFFIX
    );
    let _ = writeln!(md, "| treatment | what it turns on | agent flags |\n|---|---|---|");
    for t in &plan.treatments {
        let flags = sqlbee.flags(t).join(" ");
        let flags = if flags.is_empty() { "-".to_string() } else { format!("`{flags}`") };
        let _ = writeln!(md, "| {} | {} | {flags} |", t.name, cell(t.about));
    }
    let _ = writeln!(md);

    for script in &plan.scripts {
        let _ = writeln!(md, "## {script}\n");
        let _ = writeln!(
            md,
            "| threads | treatment | pairs | control QPS | treatment QPS | QPS ratio | latency ratio | p95 ratio | \
             extra mysqld CPU/stmt (us) | agent CPU/stmt (us) | agent cores per 10k QPS | agent peak RSS (MiB) | \
             probe hits/stmt | BPF ns/stmt | seen/executed | flags |"
        );
        let _ = writeln!(md, "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|");
        for &threads in &plan.threads {
            for t in &plan.treatments {
                let p = pairs(runs, script, threads, t.name);
                let qps = Spread::of(p.iter().map(|(c, a)| a.qps / c.qps));
                let latency = Spread::of(p.iter().map(|(c, a)| a.latency_ms() / c.latency_ms()));
                let p95 = Spread::of(p.iter().map(|(c, a)| a.p95_ms / c.p95_ms));
                let extra = Spread::of(
                    p.iter().map(|(c, a)| per_statement(a.mysqld_cpu_s, a) - per_statement(c.mysqld_cpu_s, c)),
                );
                let mut flags: Vec<String> = Vec::new();
                if let Some(why) = qps.unresolved(1.0) {
                    flags.push(format!("QPS ratio unresolved: {why}"));
                }
                if let Some(why) = latency.unresolved(1.0) {
                    flags.push(format!("latency ratio unresolved: {why}"));
                }
                let failed = runs
                    .iter()
                    .filter(|r| !r.ok() && &r.script == script && r.threads == threads && r.treatment == t.name)
                    .count();
                if failed > 0 {
                    flags.push(format!("{failed} failed run(s), see below"));
                }
                let tracer_cols = if t.has_tracer() {
                    let agent_us = Spread::of(p.iter().map(|(_, a)| per_statement(a.agent_cpu_s, a)));
                    let cores =
                        Spread::of(p.iter().map(|(_, a)| a.agent_cpu_s / a.seconds / a.qps.max(1.0) * 10_000.0));
                    let rss = p.iter().map(|(_, a)| a.agent_peak_rss_kib).max().unwrap_or(0) as f64 / 1024.0;
                    let hits = Spread::of(p.iter().map(|(_, a)| a.bpf_hits() as f64 / a.queries.max(1) as f64));
                    let ns = Spread::of(p.iter().map(|(_, a)| a.bpf_ns() as f64 / a.queries.max(1) as f64));
                    let seen: u64 = p.iter().map(|(_, a)| a.agent_statements).sum();
                    let executed: u64 = p.iter().map(|(_, a)| a.queries).sum();
                    format!(
                        "{} | {} | {rss:.1} | {} | {} | {seen}/{executed}",
                        agent_us.show(2),
                        cores.show(4),
                        hits.show(2),
                        ns.show(0)
                    )
                } else {
                    "- | - | - | - | - | -".to_string()
                };
                let _ = writeln!(
                    md,
                    "| {threads} | {} | {} | {:.0} | {:.0} | {} | {} | {} | {} | {tracer_cols} | {} |",
                    t.name,
                    p.len(),
                    Spread::of(p.iter().map(|(c, _)| c.qps)).median,
                    Spread::of(p.iter().map(|(_, a)| a.qps)).median,
                    qps.show(3),
                    latency.show(3),
                    p95.show(3),
                    extra.show(2),
                    cell(&flags.join("; ")),
                );
            }
        }
        let _ = writeln!(md);
    }
    let _ = writeln!(
        md,
        "Extra mysqld CPU per statement is the cost as the server pays it: uprobe traps are charged to the traced \
         process as system time, and BPF run time (BPF ns/stmt) covers only the program bodies. Agent columns \
         count the tracer process (sqlbee, or bpftrace for the bpftrace treatments, whose peak RSS includes its \
         script compiler). A statement is one sysbench query (BEGIN and COMMIT included).\n"
    );

    single_request(&mut md, plan, runs);
    programs(&mut md, plan, runs);

    if !plots.is_empty() {
        let _ = writeln!(md, "## Plots\n");
        for (title, file) in plots {
            let _ = writeln!(md, "- [{title}]({file})\n\n  ![{title}]({file})\n");
        }
    }
    let failed: Vec<&Run> = runs.iter().filter(|r| !r.ok()).collect();
    if !failed.is_empty() {
        let _ = writeln!(
            md,
            "## Failed runs\n\n| script | threads | treatment | arm | pair | reason |\n|---|---|---|---|---|---|"
        );
        for r in failed {
            let _ = writeln!(
                md,
                "| {} | {} | {} | {} | {} | {} |",
                r.script,
                r.threads,
                r.treatment,
                r.arm.as_str(),
                r.pair + 1,
                cell(r.error.as_deref().unwrap_or_default())
            );
        }
        let _ = writeln!(md);
    }
    if !micro.is_empty() {
        let _ = writeln!(md, "## Micro-benchmarks (criterion, userspace hot path)\n\n```\n{micro}```");
    }
    md
}

/// The cost one lone client sees: at 1 thread nothing queues, so the
/// latency a treatment adds is its own per-statement cost.
fn single_request(md: &mut String, plan: &Plan, runs: &[Run]) {
    let _ = writeln!(md, "## Single request (1 client thread)\n");
    if !plan.threads.contains(&1) {
        let _ = writeln!(md, "Not measured: the thread sweep has no 1-thread runs.\n");
        return;
    }
    let _ = writeln!(
        md,
        "Added latency per statement = treatment mean minus control mean, per pair (sysbench's summed \
         latency divided by the statements run). At one thread nothing queues, so this is the treatment's \
         own cost on a lone request.\n"
    );
    let _ = writeln!(
        md,
        "| script | treatment | control latency/stmt (us) | added latency/stmt (us) | flags |\n|---|---|---|---|---|"
    );
    for script in &plan.scripts {
        for t in &plan.treatments {
            let p = pairs(runs, script, 1, t.name);
            let added = Spread::of(p.iter().map(|(c, a)| a.statement_latency_us() - c.statement_latency_us()));
            let control = Spread::of(p.iter().map(|(c, _)| c.statement_latency_us()));
            let flag = added.unresolved(0.0).map(|why| format!("unresolved: {why}")).unwrap_or_default();
            let _ = writeln!(md, "| {script} | {} | {} | {} | {flag} |", t.name, control.show(1), added.show(2));
        }
    }
    let _ = writeln!(md);
}

/// Probe hits and BPF time per program, over every successful treatment run.
fn programs(md: &mut String, plan: &Plan, runs: &[Run]) {
    let mut rows = String::new();
    for t in plan.treatments.iter().filter(|t| t.has_tracer()) {
        let treated: Vec<&Run> =
            runs.iter().filter(|r| r.ok() && r.treatment == t.name && r.arm == Arm::Treatment).collect();
        let statements: u64 = treated.iter().map(|r| r.queries).sum();
        let mut by_name: BTreeMap<&str, (u64, u64)> = BTreeMap::new();
        for p in treated.iter().flat_map(|r| &r.programs) {
            let entry = by_name.entry(&p.name).or_default();
            entry.0 += p.hits;
            entry.1 += p.ns;
        }
        for (name, (hits, ns)) in by_name {
            let _ = writeln!(
                rows,
                "| {} | {name} | {:.3} | {:.0} |",
                t.name,
                hits as f64 / statements.max(1) as f64,
                ns as f64 / hits.max(1) as f64
            );
        }
    }
    if !rows.is_empty() {
        let _ = writeln!(md, "## BPF programs (all scripts and thread counts)\n");
        let _ = writeln!(md, "| treatment | program | hits/stmt | ns/hit |\n|---|---|---|---|\n{rows}");
    }
}

/// A CSV field, quoted when it must be.
fn field(text: &str) -> String {
    if text.contains([',', '"', '\n', '\r']) { format!("\"{}\"", text.replace('"', "\"\"")) } else { text.to_string() }
}

pub(super) fn csv(runs: &[Run]) -> String {
    let mut csv = String::from(
        "script,threads,pair,treatment,arm,seconds,queries,transactions,qps,tps,avg_ms,p95_ms,latency_sum_ms,\
         mysqld_cpu_s,agent_cpu_s,agent_peak_rss_kib,agent_statements,bpf_hits,bpf_ns,bpf_programs,error\n",
    );
    for r in runs {
        // name:hits:ns per program, `;` between programs.
        let programs: Vec<String> = r.programs.iter().map(|p| format!("{}:{}:{}", p.name, p.hits, p.ns)).collect();
        let _ = writeln!(
            csv,
            "{},{},{},{},{},{:.3},{},{},{:.2},{:.2},{:.3},{:.3},{:.3},{:.3},{:.3},{},{},{},{},{},{}",
            field(&r.script),
            r.threads,
            r.pair,
            field(&r.treatment),
            r.arm.as_str(),
            r.seconds,
            r.queries,
            r.transactions,
            r.qps,
            r.tps,
            r.avg_ms,
            r.p95_ms,
            r.latency_sum_ms,
            r.mysqld_cpu_s,
            r.agent_cpu_s,
            r.agent_peak_rss_kib,
            r.agent_statements,
            r.bpf_hits(),
            r.bpf_ns(),
            field(&programs.join(";")),
            field(r.error.as_deref().unwrap_or_default()),
        );
    }
    csv
}

/// (file suffix, title, SVG): QPS by thread count per script, and the
/// tracers' CPU against QPS over every run.
pub(super) fn plots(plan: &Plan, runs: &[Run]) -> Vec<(String, String, String)> {
    let mut out = Vec::new();
    for script in &plan.scripts {
        let median_qps = |arm: Arm, treatment: Option<&str>, threads: u32| {
            Spread::of(
                runs.iter()
                    .filter(|r| r.ok() && &r.script == script && r.threads == threads && r.arm == arm)
                    .filter(|r| treatment.is_none_or(|t| r.treatment == t))
                    .map(|r| r.qps),
            )
            .median
        };
        let mut series = vec![svg::Series {
            name: "control".into(),
            points: plan.threads.iter().map(|&n| (n as f64, median_qps(Arm::Control, None, n))).collect(),
            color: 0,
        }];
        for (i, t) in plan.treatments.iter().enumerate() {
            series.push(svg::Series {
                name: t.name.into(),
                points: plan.threads.iter().map(|&n| (n as f64, median_qps(Arm::Treatment, Some(t.name), n))).collect(),
                color: i + 1,
            });
        }
        let title = format!("{script}: QPS by client threads (median of runs)");
        let chart = svg::Chart {
            title: title.clone(),
            x_label: "client threads".into(),
            y_label: "queries per second".into(),
            x_log2: true,
            lines: true,
            series,
        };
        out.push((format!("qps-{script}"), title, chart.render()));
    }
    let series: Vec<svg::Series> = plan
        .treatments
        .iter()
        .enumerate()
        .filter(|(_, t)| t.has_tracer())
        .map(|(i, t)| svg::Series {
            name: t.name.into(),
            points: runs
                .iter()
                .filter(|r| r.ok() && r.treatment == t.name && r.arm == Arm::Treatment)
                .map(|r| (r.qps, r.agent_cpu_s / r.seconds.max(1e-9)))
                .collect(),
            color: i + 1,
        })
        .collect();
    if !series.is_empty() {
        let title = "Tracer CPU against QPS (every treatment run)".to_string();
        let chart = svg::Chart {
            title: title.clone(),
            x_label: "queries per second".into(),
            y_label: "tracer CPU (cores)".into(),
            x_log2: false,
            lines: false,
            series,
        };
        out.push(("agent-cpu".into(), title, chart.render()));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spread_flags_a_range_wider_than_its_effect() {
        let wide = Spread::of([0.95, 0.80, 1.02]);
        assert_eq!(wide.median, 0.95);
        assert!(wide.unresolved(1.0).is_some());
        let clear = Spread::of([0.80, 0.82, 0.85]);
        assert!(clear.unresolved(1.0).is_none());
        assert!(Spread::of([0.5]).unresolved(1.0).is_none(), "one pair has no spread to judge");
        assert_eq!(Spread::of([]).show(2), "-");
    }

    #[test]
    fn csv_fields_with_commas_are_quoted() {
        assert_eq!(field("a,b \"c\""), "\"a,b \"\"c\"\"\"");
        assert_eq!(field("plain"), "plain");
    }
}
