//! Turns arm-runs into the report: per server a table of each arm's
//! mysqld CPU per statement with its interval, the paired differences to
//! the control, to the one-trap floor and to the baseline binary, a few
//! sentences that read the table, and the CSV of every raw run. Pure: it
//! formats text and never measures or writes files.
use std::{collections::BTreeMap, fmt::Write as _};

use super::{
    Arm, ArmRun, Plan, ServerInfo,
    stats::{Estimate, bootstrap, median, paired},
};

/// The arm whose single counting uprobe is the floor a one-trap agent
/// cannot go under.
const FLOOR: &str = "bpftrace-count";
const CONTROL: &str = "control";

/// Extra ns per statement to extra mysqld cores per 10k statements/s.
const CORES_PER_10K: f64 = 10_000.0 / 1e9;

/// The per-round figures of one server's arms.
struct Rounds<'a> {
    runs: Vec<&'a ArmRun>,
}

impl<'a> Rounds<'a> {
    fn of(runs: &'a [ArmRun], server: &str) -> Rounds<'a> {
        Rounds { runs: runs.iter().filter(|r| r.server == server && r.round.is_some()).collect() }
    }

    fn ok(&self, arm: &str) -> impl Iterator<Item = &&'a ArmRun> {
        self.runs.iter().filter(move |r| r.arm == arm && r.ok())
    }

    /// `value` of every successful run of `arm`, by round.
    fn by_round(&self, arm: &str, value: impl Fn(&ArmRun) -> f64) -> Vec<(u32, f64)> {
        self.ok(arm).map(|r| (r.round.unwrap_or(0), value(r))).collect()
    }

    fn ns(&self, arm: &str) -> Vec<(u32, f64)> {
        self.by_round(arm, ArmRun::ns_per_statement)
    }

    fn bpf_ns(&self, arm: &str) -> Vec<(u32, f64)> {
        self.by_round(arm, ArmRun::bpf_ns_per_statement)
    }

    fn has(&self, arm: &str) -> bool {
        self.runs.iter().any(|r| r.arm == arm)
    }

    /// The paired difference of `arm` to `other`, per statement.
    fn versus(&self, arm: &str, other: &str) -> Option<Estimate> {
        if !self.has(other) || arm == other {
            return None;
        }
        bootstrap(&paired(&self.ns(arm), &self.ns(other)))
    }

    /// The paired difference of `arm`'s program time to `other`'s, per
    /// statement.
    fn bpf_versus(&self, arm: &str, other: &str) -> Option<Estimate> {
        if !self.has(other) || arm == other {
            return None;
        }
        bootstrap(&paired(&self.bpf_ns(arm), &self.bpf_ns(other)))
    }

    /// Side by side (`--together`) the program that runs second finds the
    /// server's lines the other one just read, and which runs second flips
    /// every round: each pair of rounds (2k, 2k+1) gives one difference,
    /// the mean of its two rounds', in which that advantage cancels.
    fn bpf_versus_side_by_side(&self, arm: &str, other: &str) -> Option<Estimate> {
        let theirs = self.bpf_ns(other);
        let mut by_pair: BTreeMap<u32, Vec<f64>> = BTreeMap::new();
        for (round, ns) in self.bpf_ns(arm) {
            if let Some((_, other_ns)) = theirs.iter().find(|(r, _)| *r == round) {
                by_pair.entry(round / 2).or_default().push(ns - other_ns);
            }
        }
        let means: Vec<f64> = by_pair.values().filter(|d| d.len() == 2).map(|d| (d[0] + d[1]) / 2.0).collect();
        bootstrap(&means)
    }

    /// Side by side: per round, the program time of the one attached
    /// second less the one attached first's, over every pair.
    fn attach_order_effect(&self) -> Option<Estimate> {
        let mut by_round: BTreeMap<u32, [Option<f64>; 2]> = BTreeMap::new();
        for run in self.runs.iter().filter(|r| r.ok()) {
            if let (Some(round), Some(order @ 0..=1)) = (run.round, run.attach_order) {
                by_round.entry(round).or_default()[order as usize] = Some(run.bpf_ns_per_statement());
            }
        }
        let differences: Vec<f64> = by_round
            .values()
            .filter_map(|pair| match pair {
                [Some(first), Some(second)] => Some(second - first),
                _ => None,
            })
            .collect();
        bootstrap(&differences)
    }

    fn median_of(&self, arm: &str, value: impl Fn(&ArmRun) -> f64) -> Option<f64> {
        median(&self.by_round(arm, value).into_iter().map(|(_, v)| v).collect::<Vec<_>>())
    }

    fn estimate_of(&self, arm: &str, value: impl Fn(&ArmRun) -> f64) -> Option<Estimate> {
        bootstrap(&self.by_round(arm, value).into_iter().map(|(_, v)| v).collect::<Vec<_>>())
    }

    /// `arm`'s `value` put together with the same round's control's by
    /// `combine`, by round (rounds either lacks, or `combine` refuses, are
    /// left out).
    fn against_control(
        &self,
        arm: &str,
        value: impl Fn(&ArmRun) -> f64,
        combine: impl Fn(f64, f64) -> Option<f64>,
    ) -> Vec<(u32, f64)> {
        let control = self.by_round(CONTROL, &value);
        self.by_round(arm, &value)
            .into_iter()
            .filter_map(|(round, v)| {
                let c = control.iter().find(|&&(r, _)| r == round)?.1;
                Some((round, combine(v, c)?))
            })
            .collect()
    }

    /// `arm`'s `value` against the same round's control, in percent (+10:
    /// 10% more than control), by round.
    fn percent_of_control(&self, arm: &str, value: impl Fn(&ArmRun) -> f64) -> Vec<(u32, f64)> {
        self.against_control(arm, value, |v, c| (c > 0.0).then(|| (v / c - 1.0) * 100.0))
    }

    /// What `arm` costs in each round: the throughput it loses against the
    /// round's control in percent at saturation, its extra mysqld ns per
    /// statement at a fixed rate.
    fn cost_by_round(&self, arm: &str, saturated: bool) -> Vec<(u32, f64)> {
        if saturated {
            self.against_control(arm, |r| r.tps, |v, c| (c > 0.0).then(|| (1.0 - v / c) * 100.0))
        } else {
            self.against_control(arm, ArmRun::ns_per_statement, |v, c| Some(v - c))
        }
    }

    /// `goal.reference`'s cost less `goal.times` what `goal.arm` costs
    /// above the floor (the whole of it without one), paired by round:
    /// above 0 with its interval, the arm meets the goal.
    fn within(&self, goal: Goal<'_>, saturated: bool) -> Option<Estimate> {
        let floor = goal.floor.map(|f| self.cost_by_round(f, saturated));
        let scaled: Vec<(u32, f64)> = self
            .cost_by_round(goal.arm, saturated)
            .into_iter()
            .filter_map(|(round, cost)| {
                let under = match &floor {
                    Some(floor) => floor.iter().find(|&&(r, _)| r == round)?.1,
                    None => 0.0,
                };
                Some((round, goal.times * (cost - under)))
            })
            .collect();
        bootstrap(&paired(&self.cost_by_round(goal.reference, saturated), &scaled))
    }
}

/// A cost goal: `arm`'s cost above `floor`'s, `times` over, at most
/// `reference`'s.
#[derive(Clone, Copy)]
struct Goal<'a> {
    arm: &'a str,
    reference: &'a str,
    floor: Option<&'a str>,
    times: f64,
}

/// performance_schema arms, the reference an agent's cost is held against.
fn is_performance_schema(arm: &Arm) -> bool {
    arm.name.starts_with("performance-schema")
}

/// Everything the table and the reading say about one arm.
struct Row {
    arm: Arm,
    ns: Option<Estimate>,
    vs_control: Option<Estimate>,
    vs_floor: Option<Estimate>,
    vs_baseline: Option<Estimate>,
    qps: Option<f64>,
    agent_cores_per_10k: Option<f64>,
    bpf_runs: Option<f64>,
    bpf_ns: Option<f64>,
    /// Program time per statement, alone and paired with the floor's and
    /// the baseline binary's, round by round.
    bpf: Option<Estimate>,
    bpf_vs_floor: Option<Estimate>,
    bpf_vs_baseline: Option<Estimate>,
    ok: usize,
    total: usize,
    /// Saturated rounds: transactions per second, the loss against
    /// control in percent, mean and 95th percentile latency (ms) and the
    /// mean's change against control in percent.
    tps: Option<Estimate>,
    tps_loss: Option<Estimate>,
    latency: Option<Estimate>,
    latency_change: Option<Estimate>,
    p95: Option<Estimate>,
}

fn rows(plan: &Plan, server: &ServerInfo, rounds: &Rounds) -> Vec<Row> {
    let skipped = |a: &Arm| server.skipped_arms.iter().any(|(name, _)| *name == a.name);
    plan.arms
        .iter()
        .filter(|a| !skipped(a))
        .map(|arm| {
            let name = arm.name.as_str();
            let has_tracer = arm.treatment.is_some_and(|t| t.has_tracer());
            let per_statement = |f: fn(&ArmRun) -> f64| if has_tracer { rounds.median_of(name, f) } else { None };
            let baseline = format!("{name}{}", super::BASELINE_SUFFIX);
            let compared = arm.is_agent() && !arm.baseline;
            Row {
                arm: arm.clone(),
                ns: bootstrap(&rounds.ns(name).into_iter().map(|(_, v)| v).collect::<Vec<_>>()),
                vs_control: rounds.versus(name, CONTROL),
                vs_floor: if arm.is_agent() { rounds.versus(name, FLOOR) } else { None },
                // Side by side, the twins' mysqld figures are the same run's.
                vs_baseline: if compared && !plan.together { rounds.versus(name, &baseline) } else { None },
                qps: rounds.median_of(name, ArmRun::qps),
                agent_cores_per_10k: per_statement(|r| r.agent_cpu_s * 10_000.0 / r.questions as f64),
                bpf_runs: per_statement(|r| r.bpf_runs as f64 / r.questions as f64),
                bpf_ns: per_statement(ArmRun::bpf_ns_per_statement),
                bpf: if has_tracer {
                    bootstrap(&rounds.bpf_ns(name).into_iter().map(|(_, v)| v).collect::<Vec<_>>())
                } else {
                    None
                },
                bpf_vs_floor: if arm.is_agent() { rounds.bpf_versus(name, FLOOR) } else { None },
                bpf_vs_baseline: match (compared, plan.together) {
                    (false, _) => None,
                    (true, false) => rounds.bpf_versus(name, &baseline),
                    (true, true) => rounds.bpf_versus_side_by_side(name, &baseline),
                },
                ok: rounds.ok(name).count(),
                total: rounds.runs.iter().filter(|r| r.arm == name).count(),
                tps: rounds.estimate_of(name, |r| r.tps),
                tps_loss: if name == CONTROL {
                    None
                } else {
                    bootstrap(&rounds.cost_by_round(name, true).into_iter().map(|(_, v)| v).collect::<Vec<_>>())
                },
                latency: rounds.estimate_of(name, |r| r.latency_avg_ms),
                latency_change: if name == CONTROL {
                    None
                } else {
                    bootstrap(
                        &rounds
                            .percent_of_control(name, |r| r.latency_avg_ms)
                            .into_iter()
                            .map(|(_, v)| v)
                            .collect::<Vec<_>>(),
                    )
                },
                p95: rounds.estimate_of(name, |r| r.latency_p95_ms),
            }
        })
        .collect()
}

/// "31250 [30900, 31700]"; a difference carries its sign, and a resolved
/// one (its interval leaves 0 out) is bold.
fn show(e: Option<Estimate>, decimals: usize, difference: bool) -> String {
    let Some(e) = e else { return "-".into() };
    let text = if difference {
        format!("{:+.decimals$} [{:+.decimals$}, {:+.decimals$}]", e.median, e.lo, e.hi)
    } else {
        format!("{:.decimals$} [{:.decimals$}, {:.decimals$}]", e.median, e.lo, e.hi)
    };
    if difference && e.resolved() { format!("**{text}**") } else { text }
}

fn opt(value: Option<f64>, decimals: usize) -> String {
    value.map_or("-".into(), |v| format!("{v:.decimals$}"))
}

pub(super) fn markdown(plan: &Plan, binaries: &[(&str, String)], servers: &[ServerInfo], runs: &[ArmRun]) -> String {
    let mut md = String::new();
    let saturated = plan.rate == 0;
    let (title, pace) = if saturated {
        ("at saturation", "without a rate limit (saturation)".to_string())
    } else {
        ("at a fixed rate", format!("held to `--rate {}` events/s", plan.rate))
    };
    let _ = writeln!(md, "# sqlbee cost {title}: {}\n", plan.name);
    let _ = writeln!(
        md,
        "`cargo xtask bench-rate`: sysbench `{}` ({}), {} threads {pace}, {} rounds of {} s; every round \
         runs every arm once, in an order that rotates and reverses so each arm sits in every position and linear drift \
         cancels over each pair of rounds. {} tables x {} rows, {} s warm-up at the same pace{}. Kernel {}, {} cores.\n",
        plan.script,
        if plan.ps_mode == "disable" { "text protocol" } else { "prepared statements" },
        plan.threads,
        plan.rounds,
        plan.round_seconds,
        plan.tables,
        plan.table_size,
        plan.warm_seconds,
        match plan.settle_seconds {
            0 => String::new(),
            s => format!(
                "; each run measured after {s} s of the same load with its tracer attached (`--settle-seconds`)"
            ),
        },
        std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default().trim(),
        std::thread::available_parallelism().map(|n| n.get()).unwrap_or(0),
    );
    if plan.together {
        let _ = writeln!(
            md,
            "**Side by side** (`--together`): each sqlbee arm ran attached at the same time as its baseline twin, in \
             one run per round, so both programs timed the very same statements; which of the two attached first \
             alternates by round (CSV column `attach_order`). Their program times pair without the rounds' noise; \
             the mysqld CPU, throughput and latency of a twin are the pair's, and tell the two apart no more.\n"
        );
    }
    if !plan.server_flags.is_empty() {
        let _ = writeln!(md, "- extra mariadbd flags: `{}`", plan.server_flags.join(" "));
    }
    if !plan.arm_base_flags.is_empty() {
        let _ = writeln!(
            md,
            "- every arm's server started with `{}` (an arm turns its setting on at run time; the others run with it off)",
            plan.arm_base_flags.join(" ")
        );
    }
    for (role, binary) in binaries {
        let _ = writeln!(md, "- {role}: {binary}");
    }
    for server in servers {
        match &server.skipped {
            Some(why) => {
                let _ = writeln!(md, "- MariaDB {}: not measured: {why}", server.name);
            }
            None => {
                let _ = writeln!(md, "- MariaDB {}: `{}`, {}", server.name, server.version, server.origin);
            }
        }
        for (flags, pid) in &server.siblings {
            let _ = writeln!(
                md,
                "  - beside it, a server of the same binary started with the same flags and `{flags}` (pid {pid}), \
                 prepared and warmed alike, idle while the other arms ran and never restarted (`--sibling-servers`)"
            );
        }
    }
    let _ = writeln!(md, "\nArms:\n");
    for arm in &plan.arms {
        let flags = arm.server_flags();
        let elsewhere = if plan.siblings && !flags.is_empty() {
            format!("; here not restarted but run on the server started with `{}`", flags.join(" "))
        } else {
            String::new()
        };
        let _ = writeln!(md, "- `{}`: {}{elsewhere}", arm.name, arm.about());
    }
    let _ = writeln!(
        md,
        "\nmysqld CPU is the sum of the first field of `/proc/PID/task/*/schedstat` (ns on CPU, thread by thread) over \
         the sysbench run, divided by the server's `Questions` over the run (less the bench's own status read). \
         Medians over rounds with 95% bootstrap intervals (percentile method, {} resamples, fixed seed); a difference \
         is paired with the same round's other arm, and **bold** when its interval leaves 0 out (resolved). Extra \
         cores per 10k QPS = extra ns/stmt x 10 000 / 1e9. Agent cores per 10k QPS: the tracer's utime+stime from \
         /proc/PID/stat over the run. BPF: run count and run time of the tracer's programs (the program bodies, not \
         the trap, which mysqld pays and the CPU columns include). bpftrace 0.17 puts its uprobe in every process \
         running the binary and filters on the pid inside the program, so on the host its BPF runs also count other \
         mariadbd processes of the same binary (whose traps they pay, not the measured server).\n",
        super::stats::RESAMPLES
    );
    for server in servers.iter().filter(|s| s.skipped.is_none()) {
        server_section(&mut md, plan, server, runs);
    }
    md
}

fn server_section(md: &mut String, plan: &Plan, server: &ServerInfo, runs: &[ArmRun]) {
    let rounds = Rounds::of(runs, server.name);
    let rows = rows(plan, server, &rounds);
    let _ = writeln!(md, "## MariaDB {} ({})\n", server.name, server.version);
    for (arm, why) in &server.skipped_arms {
        let _ = writeln!(md, "`{arm}` is left out here: {why}.\n");
    }
    let _ = writeln!(
        md,
        "| arm | QPS | mysqld ns/stmt [CI] | extra vs control ns/stmt [CI] | extra cores/10k QPS [CI] | vs floor ns/stmt [CI] | \
         vs baseline ns/stmt [CI] | agent cores/10k QPS | BPF runs/stmt | BPF ns/stmt | runs ok |"
    );
    let _ = writeln!(md, "|---|---|---|---|---|---|---|---|---|---|---|");
    for row in &rows {
        let _ = writeln!(
            md,
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {}/{} |",
            row.arm.name,
            opt(row.qps, 0),
            show(row.ns, 0, false),
            show(row.vs_control, 0, true),
            show(row.vs_control.map(|e| e.scaled(CORES_PER_10K)), 4, true),
            show(row.vs_floor, 0, true),
            show(row.vs_baseline, 0, true),
            opt(row.agent_cores_per_10k, 4),
            opt(row.bpf_runs, 2),
            opt(row.bpf_ns, 0),
            row.ok,
            row.total,
        );
    }
    if plan.rate == 0 {
        throughput_table(md, &rows);
    }
    program_time_table(md, &rows);
    if plan.together
        && let Some(effect) = rounds.attach_order_effect()
    {
        let _ = writeln!(
            md,
            "Side by side, the program attached second less the one attached first, round by round: {} ns per \
             statement. The differences to the baseline above are means over pairs of rounds, in which each binary \
             attached first once, so this cancels in them.\n",
            show(Some(effect), 0, true)
        );
    }
    where_the_time_goes_table(md, &rows, &rounds);
    profile_table(md, &rows, &rounds);
    let ok: Vec<&&ArmRun> = rounds.runs.iter().filter(|r| r.ok()).collect();
    let check = median(&ok.iter().map(|r| r.ticks_ns_per_statement() / r.ns_per_statement()).collect::<Vec<_>>());
    let statements = median(&ok.iter().map(|r| r.questions as f64 / r.statements.max(1) as f64).collect::<Vec<_>>());
    let _ = writeln!(
        md,
        "\nChecks: mysqld CPU from /proc/PID/stat (ticks, exited threads included) / from schedstat = {} (median \
         over runs; near 1 means no thread took its time with it); Questions / sysbench's queries = {}.\n",
        opt(check, 3),
        opt(statements, 3),
    );
    let failed: Vec<String> = rounds
        .runs
        .iter()
        .filter(|r| !r.ok())
        .map(|r| {
            format!(
                "round {} `{}`: {}",
                r.round.unwrap_or(0) + 1,
                r.arm,
                r.error.as_deref().unwrap_or("no statements counted")
            )
        })
        .collect();
    if !failed.is_empty() {
        let _ = writeln!(md, "Failed runs:\n");
        for f in failed {
            let _ = writeln!(md, "- {}", f.replace('\n', " "));
        }
        md.push('\n');
    }
    let _ = writeln!(md, "Reading:\n");
    for line in reading(&rows).into_iter().chain(half_reading(plan, &rows, &rounds)) {
        let _ = writeln!(md, "- {line}");
    }
    md.push('\n');
    let saturation: Vec<&ArmRun> = runs.iter().filter(|r| r.server == server.name && r.round.is_none()).collect();
    if !saturation.is_empty() {
        let _ = writeln!(
            md,
            "Saturation, {} s each without a rate limit, after the rounds. **Single unresolved runs**: this VM spreads \
             saturated runs by 10-30%, so these say what the rate above is a fraction of, not what an arm costs.\n",
            plan.saturation_seconds
        );
        let _ = writeln!(md, "| arm | QPS | mysqld ns/stmt | error |\n|---|---|---|---|");
        for r in saturation {
            let (qps, ns) = if r.ok() {
                (format!("{:.0}", r.qps()), format!("{:.0}", r.ns_per_statement()))
            } else {
                ("-".into(), "-".into())
            };
            let _ =
                writeln!(md, "| {} | {qps} | {ns} | {} |", r.arm, r.error.as_deref().unwrap_or("").replace('|', "/"));
        }
        md.push('\n');
    }
}

/// Saturated rounds: what each arm leaves of control's throughput and
/// what it adds to latency, paired by round.
fn throughput_table(md: &mut String, rows: &[Row]) {
    let _ = writeln!(
        md,
        "\nThroughput and latency at saturation (sysbench's own figures; a loss or change is paired with the same \
         round's control, in percent).\n"
    );
    let _ = writeln!(
        md,
        "| arm | TPS [CI] | throughput loss % [CI] | mean latency ms [CI] | latency change % [CI] | p95 latency ms [CI] |\n\
         |---|---|---|---|---|---|"
    );
    for row in rows {
        let _ = writeln!(
            md,
            "| {} | {} | {} | {} | {} | {} |",
            row.arm.name,
            show(row.tps, 1, false),
            show(row.tps_loss, 2, true),
            show(row.latency, 2, false),
            show(row.latency_change, 2, true),
            show(row.p95, 2, false),
        );
    }
}

/// Program time, the steadiest figure: the same trap costs every agent arm
/// alike, so differences in what the programs do show here first.
fn program_time_table(md: &mut String, rows: &[Row]) {
    let traced: Vec<&Row> = rows.iter().filter(|r| r.bpf.is_some()).collect();
    if traced.is_empty() {
        return;
    }
    let _ = writeln!(
        md,
        "\nProgram time: BPF run time per statement, by round (the programs' share of the mysqld CPU above; the trap, \
         whose price depends only on where the probe sits, is not in it), with paired differences.\n"
    );
    let _ = writeln!(
        md,
        "| arm | BPF ns/stmt [CI] | vs floor ns/stmt [CI] | vs baseline ns/stmt [CI] |\n|---|---|---|---|"
    );
    for row in traced {
        let _ = writeln!(
            md,
            "| {} | {} | {} | {} |",
            row.arm.name,
            show(row.bpf, 0, false),
            show(row.bpf_vs_floor, 0, true),
            show(row.bpf_vs_baseline, 0, true),
        );
    }
}

/// mysqld's added CPU per statement split into its own code and the
/// kernel, and the kernel's share less the programs' run time, each
/// paired with the same round's control (and the floor's, when it ran):
/// where the time outside the programs goes.
fn where_the_time_goes_table(md: &mut String, rows: &[Row], rounds: &Rounds) {
    if !rounds.has(CONTROL) || rounds.ok(CONTROL).all(|r| r.mysqld_system_ticks == 0) {
        return;
    }
    let versus = |arm: &str, other: &str, value: fn(&ArmRun) -> f64| {
        if !rounds.has(other) || arm == other {
            return None;
        }
        bootstrap(&paired(&rounds.by_round(arm, value), &rounds.by_round(other, value)))
    };
    let _ = writeln!(
        md,
        "\nWhere mysqld's added CPU goes: its ns per statement in its own code (user) and in the kernel (system), \
         split by the share of /proc/PID/stat's utime and stime ticks, and the kernel's part less the programs' run \
         time (the trap, the uprobe's way in and out, the system calls), each paired with the same round's control \
         and floor (`{FLOOR}`). More user time is the server's own code running slower (what the probes evict from \
         the caches and TLB); more kernel time outside the programs is the trap's path.\n"
    );
    let _ = writeln!(
        md,
        "| arm | user vs control ns/stmt [CI] | kernel vs control ns/stmt [CI] | kernel outside programs vs control \
         ns/stmt [CI] | user vs floor ns/stmt [CI] | kernel outside programs vs floor ns/stmt [CI] |\n\
         |---|---|---|---|---|---|"
    );
    for row in rows.iter().filter(|r| r.arm.name != CONTROL) {
        let name = row.arm.name.as_str();
        let _ = writeln!(
            md,
            "| {name} | {} | {} | {} | {} | {} |",
            show(versus(name, CONTROL, ArmRun::user_ns_per_statement), 0, true),
            show(versus(name, CONTROL, ArmRun::kernel_ns_per_statement), 0, true),
            show(versus(name, CONTROL, ArmRun::kernel_outside_programs_ns_per_statement), 0, true),
            show(versus(name, FLOOR, ArmRun::user_ns_per_statement), 0, true),
            show(versus(name, FLOOR, ArmRun::kernel_outside_programs_ns_per_statement), 0, true),
        );
    }
}

/// With --profile: each arm's mysqld CPU per statement by where the
/// samples fell, control's whole and the other arms' paired with it.
fn profile_table(md: &mut String, rows: &[Row], rounds: &Rounds) {
    use super::profile::PLACES;
    if rounds.runs.iter().all(|r| r.profile.places.iter().all(|&n| n == 0)) {
        return;
    }
    let in_place = |place: usize| {
        move |r: &ArmRun| {
            let total: u64 = r.profile.places.iter().sum();
            if total == 0 { 0.0 } else { r.ns_per_statement() * r.profile.places[place] as f64 / total as f64 }
        }
    };
    let _ = writeln!(
        md,
        "\nWhere mysqld's CPU goes, sampled (`perf record -e cpu-clock` on its threads): ns per statement in each \
         place, the run's schedstat ns split by its samples' shares; control's own, every other arm's added to \
         the same round's control.\n"
    );
    let _ = writeln!(md, "| arm | {} |\n|---|{}", PLACES.join(" | "), "---|".repeat(PLACES.len()));
    for row in rows {
        let name = row.arm.name.as_str();
        let cells: Vec<String> = (0..PLACES.len())
            .map(|place| {
                let value = in_place(place);
                if name == CONTROL {
                    show(
                        bootstrap(&rounds.by_round(name, value).into_iter().map(|(_, v)| v).collect::<Vec<_>>()),
                        0,
                        false,
                    )
                } else {
                    show(bootstrap(&paired(&rounds.by_round(name, value), &rounds.by_round(CONTROL, value))), 0, true)
                }
            })
            .collect();
        let _ = writeln!(md, "| {name} | {} |", cells.join(" | "));
    }
    functions_table(md, rows, rounds);
}

/// The functions behind the places' changes: for each arm, those whose
/// ns per statement (mean over rounds) grew most over control's.
fn functions_table(md: &mut String, rows: &[Row], rounds: &Rounds) {
    const SHOWN: usize = 15;
    // Mean ns per statement of each function over an arm's runs.
    let per_function = |arm: &str| {
        let runs: Vec<&&ArmRun> = rounds.ok(arm).collect();
        let mut sums: BTreeMap<&str, f64> = BTreeMap::new();
        for r in &runs {
            let total: u64 = r.profile.places.iter().sum();
            if total == 0 {
                continue;
            }
            let ns_per_sample = r.ns_per_statement() / total as f64;
            for (function, &samples) in &r.profile.functions {
                *sums.entry(function.as_str()).or_default() += samples as f64 * ns_per_sample;
            }
        }
        sums.values_mut().for_each(|v| *v /= runs.len().max(1) as f64);
        sums
    };
    let control = per_function(CONTROL);
    for row in rows.iter().filter(|r| r.arm.name != CONTROL) {
        let arm = per_function(&row.arm.name);
        let mut grown: Vec<(&str, f64, f64)> = arm
            .iter()
            .map(|(function, &ns)| (*function, ns, ns - control.get(function).copied().unwrap_or(0.0)))
            .collect();
        grown.sort_by(|a, b| b.2.total_cmp(&a.2));
        let _ = writeln!(
            md,
            "\nThe {SHOWN} functions whose time grew most with `{}` (mean over rounds, ns per statement; `[k]`: the \
             kernel):\n\n| function | ns/stmt | vs control |\n|---|---|---|",
            row.arm.name
        );
        for (function, ns, more) in grown.into_iter().take(SHOWN) {
            let function = function.replace('|', "\\|");
            let _ = writeln!(md, "| `{function}` | {ns:.0} | {more:+.0} |");
        }
    }
}

/// The table in sentences: what each difference is and whether the rounds
/// resolve it.
fn reading(rows: &[Row]) -> Vec<String> {
    let verdict = |e: &Estimate| {
        if e.resolved() {
            "resolved".to_string()
        } else if e.n < 2 {
            "one round: not resolved".to_string()
        } else {
            format!("not resolved: the rounds cannot tell it from 0; the interval's upper end is {:+.0} ns", e.hi)
        }
    };
    let mut lines = Vec::new();
    for row in rows {
        let name = &row.arm.name;
        if let Some(e) = row.vs_control {
            lines.push(format!(
                "`{name}` vs control: {:+.0} ns of mysqld CPU per statement [{:+.0}, {:+.0}], {} \
                 ({:+.4} cores per 10k QPS).",
                e.median,
                e.lo,
                e.hi,
                verdict(&e),
                e.median * CORES_PER_10K
            ));
        }
        if let Some(e) = row.vs_floor {
            lines.push(format!(
                "`{name}` vs the one-trap floor (`{FLOOR}`): {:+.0} ns per statement [{:+.0}, {:+.0}], {}.",
                e.median,
                e.lo,
                e.hi,
                verdict(&e)
            ));
        }
        if let Some(e) = row.vs_baseline {
            lines.push(format!(
                "`{name}` vs the same arm with the baseline binary: {:+.0} ns per statement [{:+.0}, {:+.0}], {}.",
                e.median,
                e.lo,
                e.hi,
                verdict(&e)
            ));
        }
        if let Some(e) = row.bpf_vs_baseline {
            lines.push(format!(
                "`{name}` vs the baseline binary in program time: {:+.0} ns per statement [{:+.0}, {:+.0}], {}.",
                e.median,
                e.lo,
                e.hi,
                verdict(&e)
            ));
        }
        if row.ok < row.total {
            lines.push(format!("`{name}`: {} of {} runs failed (listed above).", row.total - row.ok, row.total));
        }
    }
    if lines.is_empty() {
        lines.push("No difference to read: add `control` (and a floor or baseline arm) to --arms.".into());
    }
    lines
}

/// Whether each agent arm meets the cost goals against each
/// performance_schema arm, in the bench's own figure of cost: at most
/// what it costs, at most half of it, and (with the floor arm) at most
/// half of it above the floor.
fn half_reading(plan: &Plan, rows: &[Row], rounds: &Rounds) -> Vec<String> {
    let saturated = plan.rate == 0;
    let (figure, unit, decimals) = if saturated {
        ("throughput loss", "percentage points", 2)
    } else {
        ("extra mysqld CPU per statement", "ns", 0)
    };
    let floor = rows.iter().any(|r| r.arm.name == FLOOR).then_some(FLOOR);
    let mut lines = Vec::new();
    for reference in rows.iter().filter(|r| is_performance_schema(&r.arm)) {
        for agent in rows.iter().filter(|r| r.arm.is_agent()) {
            let (arm, p) = (agent.arm.name.as_str(), reference.arm.name.as_str());
            let mut goals = vec![
                (
                    "Under performance_schema",
                    format!("`{p}`'s {figure} less `{arm}`'s"),
                    Goal { arm, reference: p, floor: None, times: 1.0 },
                ),
                (
                    "Half of performance_schema",
                    format!("`{p}`'s {figure} less twice `{arm}`'s"),
                    Goal { arm, reference: p, floor: None, times: 2.0 },
                ),
            ];
            if let Some(floor) = floor {
                goals.push((
                    "Half of performance_schema above the floor",
                    format!("`{p}`'s {figure} less twice what `{arm}` costs above `{floor}`"),
                    Goal { arm, reference: p, floor: Some(floor), times: 2.0 },
                ));
            }
            for (title, what, goal) in goals {
                let Some(e) = rounds.within(goal, saturated) else { continue };
                let verdict = if e.resolved() && e.lo > 0.0 {
                    "resolved: met"
                } else if e.resolved() {
                    "resolved: not met"
                } else {
                    "not resolved: this VM's rounds cannot say"
                };
                lines.push(format!(
                    "{title}: {what}, round by round: {:+.decimals$} {unit} [{:+.decimals$}, {:+.decimals$}], \
                     {verdict}.",
                    e.median, e.lo, e.hi
                ));
            }
        }
    }
    lines
}

pub(super) fn csv(runs: &[ArmRun]) -> String {
    let mut csv = String::from(
        "server,round,position,attach_order,arm,seconds,statements,questions,mysqld_cpu_ns_schedstat,mysqld_cpu_ticks,mysqld_system_ticks,agent_cpu_s,bpf_runs,bpf_ns,tps,latency_avg_ms,latency_p95_ms,perf_programs,perf_uprobe_path,perf_other_kernel,perf_mysqld,perf_libraries,error\n",
    );
    for r in runs {
        let _ = writeln!(
            csv,
            "{},{},{},{},{},{:.3},{},{},{},{},{},{:.3},{},{},{:.2},{:.3},{:.3},{},{}",
            r.server,
            r.round.map_or("saturation".into(), |n| n.to_string()),
            r.position,
            r.attach_order.map_or(String::new(), |n| n.to_string()),
            r.arm,
            r.seconds,
            r.statements,
            r.questions,
            r.mysqld_cpu_ns,
            r.mysqld_cpu_ticks,
            r.mysqld_system_ticks,
            r.agent_cpu_s,
            r.bpf_runs,
            r.bpf_ns,
            r.tps,
            r.latency_avg_ms,
            r.latency_p95_ms,
            r.profile.places.map(|n| n.to_string()).join(","),
            r.error.as_deref().unwrap_or("").replace([',', '\n'], ";"),
        );
    }
    csv
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(round: u32, arm: &str, cpu_ns: u64) -> ArmRun {
        ArmRun {
            server: "10.11",
            round: Some(round),
            arm: arm.into(),
            seconds: 10.0,
            statements: 1000,
            questions: 1000,
            mysqld_cpu_ns: cpu_ns,
            ..Default::default()
        }
    }

    #[test]
    fn differences_pair_rounds_and_skip_failed_runs() {
        let mut runs = Vec::new();
        for round in 0..6 {
            // A drift of 1 us per statement per round, shared by both arms.
            runs.push(run(round, "control", 20_000_000 + round as u64 * 1_000_000));
            runs.push(run(round, "sqlbee", 20_500_000 + round as u64 * 1_000_000));
        }
        runs[3].error = Some("sysbench failed".into());
        let rounds = Rounds::of(&runs, "10.11");
        let d = rounds.versus("sqlbee", "control").unwrap();
        assert_eq!((d.median, d.lo, d.hi, d.n), (500.0, 500.0, 500.0, 5));
        assert!(d.resolved());
        assert!(rounds.versus("sqlbee", "bpftrace-count").is_none(), "no floor arm, no column");
        assert_eq!(Rounds::of(&runs, "11.8").ns("control"), vec![]);
    }

    #[test]
    fn program_time_pairs_rounds_with_the_baseline() {
        let mut runs = Vec::new();
        for round in 0..6u64 {
            // Program time drifts by 50 ns per statement per round; the new
            // binary's programs run 300 ns longer in every round.
            runs.push(ArmRun { bpf_ns: 2_000_000 + round * 50_000, ..run(round as u32, "sqlbee@baseline", 1) });
            runs.push(ArmRun { bpf_ns: 2_300_000 + round * 50_000, ..run(round as u32, "sqlbee", 1) });
        }
        let rounds = Rounds::of(&runs, "10.11");
        let d = rounds.bpf_versus("sqlbee", "sqlbee@baseline").unwrap();
        assert_eq!((d.median, d.lo, d.hi, d.n), (300.0, 300.0, 300.0, 6));
        assert!(rounds.bpf_versus("sqlbee", "bpftrace-count").is_none());
    }

    #[test]
    fn side_by_side_pairs_of_rounds_cancel_what_attaching_second_costs() {
        let mut runs = Vec::new();
        for round in 0..8u32 {
            // The program attached second pays 500 ns more; the new binary's
            // programs run 100 ns longer; a drift of 20 ns per round.
            let drift = u64::from(round) * 20_000;
            let (new_order, old_order) = if round % 2 == 0 { (0, 1) } else { (1, 0) };
            let ns = |order: u32| 2_000_000 + drift + u64::from(order) * 500_000;
            runs.push(ArmRun {
                bpf_ns: ns(old_order),
                attach_order: Some(old_order),
                ..run(round, "sqlbee@baseline", 1)
            });
            runs.push(ArmRun {
                bpf_ns: ns(new_order) + 100_000,
                attach_order: Some(new_order),
                ..run(round, "sqlbee", 1)
            });
        }
        let rounds = Rounds::of(&runs, "10.11");
        let d = rounds.bpf_versus_side_by_side("sqlbee", "sqlbee@baseline").unwrap();
        assert_eq!((d.median, d.lo, d.hi, d.n), (100.0, 100.0, 100.0, 4));
        // Round by round the order's effect swamps it.
        let plain = rounds.bpf_versus("sqlbee", "sqlbee@baseline").unwrap();
        assert!(plain.lo < 0.0 && plain.hi > 200.0, "{plain:?}");
        let order = rounds.attach_order_effect().unwrap();
        assert_eq!((order.lo, order.hi), (400.0, 600.0));
    }

    #[test]
    fn saturated_losses_pair_rounds_and_hold_an_agent_against_half_of_performance_schema() {
        let mut runs = Vec::new();
        for round in 0..6u32 {
            // Throughput drifts by 10 tps a round; the agent loses 2%, the
            // performance_schema arm 10%.
            let control = 500.0 + 10.0 * round as f64;
            for (arm, tps, latency) in
                [("control", control, 20.0), ("sqlbee", control * 0.98, 20.4), ("ps", control * 0.9, 22.0)]
            {
                runs.push(ArmRun { tps, latency_avg_ms: latency, ..run(round, arm, 1) });
            }
        }
        let rounds = Rounds::of(&runs, "10.11");
        let loss = bootstrap(&rounds.cost_by_round("sqlbee", true).into_iter().map(|(_, v)| v).collect::<Vec<_>>());
        let loss = loss.unwrap();
        assert!((loss.median - 2.0).abs() < 1e-9 && loss.resolved(), "{loss:?}");
        let latency = rounds.percent_of_control("ps", |r| r.latency_avg_ms);
        assert!(latency.iter().all(|&(_, p)| (p - 10.0).abs() < 1e-9), "{latency:?}");
        // 10 - 2 x 2 = 6 points to spare: under half, resolved.
        let half = rounds.within(Goal { arm: "sqlbee", reference: "ps", floor: None, times: 2.0 }, true).unwrap();
        assert!((half.median - 6.0).abs() < 1e-9 && half.lo > 0.0, "{half:?}");
        // An arm that costs more than half comes out below 0.
        let over = rounds.within(Goal { arm: "ps", reference: "sqlbee", floor: None, times: 2.0 }, true).unwrap();
        assert!(over.hi < 0.0, "{over:?}");
    }

    #[test]
    fn fixed_rate_cost_is_extra_cpu_per_statement() {
        let mut runs = Vec::new();
        for round in 0..4u32 {
            runs.push(run(round, "control", 20_000_000));
            runs.push(run(round, "sqlbee", 21_000_000));
            runs.push(run(round, "ps", 25_000_000));
        }
        let rounds = Rounds::of(&runs, "10.11");
        assert_eq!(rounds.cost_by_round("sqlbee", false), vec![(0, 1000.0), (1, 1000.0), (2, 1000.0), (3, 1000.0)]);
        let half = rounds.within(Goal { arm: "sqlbee", reference: "ps", floor: None, times: 2.0 }, false).unwrap();
        assert_eq!((half.median, half.n), (3000.0, 4));
    }

    #[test]
    fn the_goal_above_the_floor_takes_the_floors_cost_away_round_by_round() {
        let mut runs = Vec::new();
        for round in 0..5u32 {
            // The floor costs 600 ns one round and 400 the next; the agent
            // 500 more than the floor each round; performance_schema 1200.
            let floor = if round % 2 == 0 { 600 } else { 400 };
            runs.push(run(round, "control", 20_000_000));
            runs.push(run(round, "bpftrace-count", 20_000_000 + floor * 1000));
            runs.push(run(round, "sqlbee", 20_000_000 + (floor + 500) * 1000));
            runs.push(run(round, "ps", 21_200_000));
        }
        let rounds = Rounds::of(&runs, "10.11");
        let above = rounds
            .within(Goal { arm: "sqlbee", reference: "ps", floor: Some("bpftrace-count"), times: 2.0 }, false)
            .unwrap();
        // 1200 - 2 x 500, every round.
        assert_eq!((above.median, above.lo, above.hi, above.n), (200.0, 200.0, 200.0, 5));
        let under = rounds.within(Goal { arm: "sqlbee", reference: "ps", floor: None, times: 1.0 }, false).unwrap();
        // 1200 - 1100 or 1200 - 900: the floor is not taken away.
        assert_eq!(under.median, 100.0);
    }

    #[test]
    fn csv_has_one_line_per_run_and_no_stray_commas() {
        let mut r = run(0, "sqlbee@baseline", 5);
        r.error = Some("a, b\nc".into());
        let text = csv(&[r, ArmRun { round: None, ..run(0, "control", 7) }]);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 3);
        assert!(lines.iter().all(|l| l.split(',').count() == 23), "{text}");
        assert!(lines[2].starts_with("10.11,saturation,"));
    }
}
