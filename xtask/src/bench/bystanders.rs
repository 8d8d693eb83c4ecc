//! `cargo xtask bench-bystanders`: what a tracer of one server costs every
//! other process on the host, per syscall. A uprobe traps only in the
//! traced binary; a syscall tracepoint sends every syscall of every process
//! through the kernel's tracing path, and a program on the raw `sys_enter`
//! runs at each of them. Measured from outside: this process makes the same
//! syscalls over and over (`getppid`, which no arm's program cares about,
//! and a one-byte `write` to `/dev/null`, which the send hook's program
//! runs for and turns away), timed in its own thread's CPU clock, with
//! every arm in every round in a rotating order, and each arm's round
//! paired with the control's.
use std::{fmt::Write as _, fs, os::fd::AsRawFd, path::PathBuf};

use anyhow::{Context as _, bail};

use super::{
    rate::{
        order,
        stats::{Estimate, bootstrap, paired},
    },
    release_agent,
    treatment::{AgentBinary, Tracer, treatment},
};
use crate::{mariadb::PrivateServer, paths::workspace_root};

#[derive(clap::Parser, Debug, Clone)]
#[command(name = "bench-bystanders")]
pub struct BystanderArgs {
    /// `control` (nothing attached) and the treatments to compare with it.
    #[arg(long, value_delimiter = ',', default_value = "control,sqlbee,sqlbee-send,sqlbee-send-raw")]
    pub arms: Vec<String>,
    #[arg(long, default_value_t = 12)]
    pub rounds: u32,
    /// Syscalls of each kind per measurement.
    #[arg(long, default_value_t = 400_000)]
    pub calls: u32,
    /// The sqlbee binary to measure (default: a release build of this tree).
    #[arg(long)]
    pub agent_bin: Option<PathBuf>,
    /// Results are <date>-<name>.md and .csv.
    #[arg(long, default_value = "bystanders")]
    pub name: String,
    #[arg(long)]
    pub out_dir: Option<PathBuf>,
}

/// The syscalls timed, in the report's order.
const KINDS: [&str; 2] = ["getppid", "write"];

/// One measurement: an arm in a round, nanoseconds per call of each kind.
struct Measured {
    arm: usize,
    round: u32,
    ns_per_call: [f64; 2],
}

pub fn run(args: &BystanderArgs) -> anyhow::Result<PathBuf> {
    if args.rounds < 2 || args.calls == 0 {
        bail!("--rounds must be at least 2 and --calls above 0");
    }
    let arms: Vec<Option<&'static super::Treatment>> = args
        .arms
        .iter()
        .map(|name| if name == "control" { Ok(None) } else { treatment(name).map(Some) })
        .collect::<anyhow::Result<_>>()?;
    if !arms.iter().any(Option::is_none) {
        bail!("--arms: control must be one of them, as every difference is taken against it");
    }
    let sqlbee = match &args.agent_bin {
        Some(path) => AgentBinary::new(path.clone())?,
        None => AgentBinary::new(release_agent()?)?,
    };
    // An idle server: the tracers attach to it, and only bystanders run.
    let server = PrivateServer::start("bench-bystanders", &[])?;
    let null = fs::OpenOptions::new().write(true).open("/dev/null").context("opening /dev/null")?;
    let mut measured = Vec::new();
    for round in 0..args.rounds {
        for arm in order(arms.len(), round) {
            let name = &args.arms[arm];
            eprintln!("==> round {}/{}: {name}", round + 1, args.rounds);
            let tracer = match arms[arm] {
                Some(t) => Tracer::start(t, &sqlbee, &server, &format!("bystanders-{name}"))?,
                None => None,
            };
            // Warm the path once, then time it.
            syscalls(args.calls / 10, null.as_raw_fd());
            let ns_per_call = syscalls(args.calls, null.as_raw_fd());
            if let Some(tracer) = tracer {
                tracer.stop()?;
            }
            measured.push(Measured { arm, round, ns_per_call });
        }
    }
    write_results(args, &sqlbee, &measured)
}

/// Nanoseconds of this thread's CPU per `getppid` and per one-byte `write`
/// to `fd`, `calls` of each.
fn syscalls(calls: u32, fd: i32) -> [f64; 2] {
    let byte = [0u8; 1];
    let getppid = timed(calls, || unsafe {
        libc::syscall(libc::SYS_getppid);
    });
    let write = timed(calls, || unsafe {
        libc::write(fd, byte.as_ptr().cast(), 1);
    });
    [getppid, write]
}

fn timed(calls: u32, mut call: impl FnMut()) -> f64 {
    let start = thread_cpu_ns();
    for _ in 0..calls {
        call();
    }
    (thread_cpu_ns() - start) as f64 / f64::from(calls)
}

fn thread_cpu_ns() -> u64 {
    let mut now = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: a clock read into a local.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut now) };
    now.tv_sec as u64 * 1_000_000_000 + now.tv_nsec as u64
}

fn write_results(args: &BystanderArgs, sqlbee: &AgentBinary, measured: &[Measured]) -> anyhow::Result<PathBuf> {
    let dir = args.out_dir.clone().unwrap_or_else(|| workspace_root().join("benches/results"));
    fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let date = std::process::Command::new("date").arg("+%Y-%m-%d").output().context("running date")?;
    let stem = format!("{}-{}", String::from_utf8_lossy(&date.stdout).trim(), args.name);
    let control = args.arms.iter().position(|a| a == "control").expect("checked at start");
    let series = |arm: usize, kind: usize| -> Vec<(u32, f64)> {
        measured.iter().filter(|m| m.arm == arm).map(|m| (m.round, m.ns_per_call[kind])).collect()
    };
    let cell = |e: Option<Estimate>, sign: bool| match e {
        Some(e) if sign => format!("{:+.1} [{:+.1}, {:+.1}]", e.median, e.lo, e.hi),
        Some(e) => format!("{:.1} [{:.1}, {:.1}]", e.median, e.lo, e.hi),
        None => "-".into(),
    };
    let mut md = String::new();
    writeln!(md, "# What a tracer costs the host's other processes, per syscall\n")?;
    writeln!(
        md,
        "`cargo xtask bench-bystanders --arms {} --rounds {} --calls {}`: an idle private MariaDB, each arm \
         attached to it in turn (every arm in every round, the order rotating), while this process makes \
         {} `getppid` and {} one-byte `write`s to `/dev/null`, timed in its thread's CPU clock. Medians over \
         rounds with 95% bootstrap intervals; \"added\" is paired with the control's measurement of the same \
         round.\n",
        args.arms.join(","),
        args.rounds,
        args.calls,
        args.calls,
        args.calls
    )?;
    writeln!(md, "sqlbee: {}, kernel {}\n", sqlbee.path.display(), kernel_release())?;
    writeln!(md, "| arm | getppid, ns per call | added | write, ns per call | added |")?;
    writeln!(md, "|---|---|---|---|---|")?;
    for (arm, name) in args.arms.iter().enumerate() {
        let mut row = format!("| {name} |");
        for kind in 0..KINDS.len() {
            let own = series(arm, kind);
            let values: Vec<f64> = own.iter().map(|&(_, v)| v).collect();
            let added = (arm != control).then(|| bootstrap(&paired(&own, &series(control, kind)))).flatten();
            write!(row, " {} | {} |", cell(bootstrap(&values), false), cell(added, true))?;
        }
        writeln!(md, "{row}")?;
    }
    let md_path = dir.join(format!("{stem}.md"));
    fs::write(&md_path, md)?;
    let mut csv = String::from("round,arm,getppid_ns,write_ns\n");
    for m in measured {
        writeln!(csv, "{},{},{:.2},{:.2}", m.round, args.arms[m.arm], m.ns_per_call[0], m.ns_per_call[1])?;
    }
    fs::write(dir.join(format!("{stem}.csv")), csv)?;
    eprintln!("==> wrote {} and .csv", md_path.display());
    Ok(md_path)
}

fn kernel_release() -> String {
    fs::read_to_string("/proc/sys/kernel/osrelease").map(|s| s.trim().to_owned()).unwrap_or_default()
}
