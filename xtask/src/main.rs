//! `cargo xtask <command>`: set-up, demo, tests and benchmarks of sqlbee.
mod collector_only;
mod demo;
mod docs;
mod setup;

use anyhow::{Context as _, bail};
use clap::{Parser, Subcommand};
use xtask::{bench, cargo};

#[derive(Parser)]
#[command(name = "xtask")]
struct Cli {
    #[command(subcommand)]
    command: Task,
}

#[derive(Subcommand)]
enum Task {
    /// Install what is missing: pinned nightly, bpf-linker, MariaDB, sysbench.
    Setup,
    /// Set up, start a private MariaDB, trace it under a short mixed
    /// workload, ship to an embedded collector, print the top digests and
    /// serve the web UI until Ctrl-C.
    Demo {
        /// Seconds of sysbench per protocol (prepared, then text).
        #[arg(long, default_value_t = 10)]
        seconds: u32,
        /// End once the table is printed instead of serving the web UI.
        #[arg(long)]
        no_serve: bool,
    },
    /// Overhead of sqlbee and its alternatives on sysbench, in alternating
    /// control/treatment pairs over a thread sweep, plus criterion
    /// micro-benchmarks; report, CSV and plots in benches/results/.
    Bench(bench::BenchArgs),
    /// The agent's own CPU and memory at fixed statement rates (10k, 20k,
    /// the maximum) in each shedding step; report in benches/results/.
    BenchCost(bench::cost::CostArgs),
    /// What a tracer of one server costs every other process on the host,
    /// per syscall (getppid, and a write), arms interleaved over rounds
    /// beside control; report and CSV in benches/results/.
    BenchBystanders(bench::bystanders::BystanderArgs),
    /// mysqld CPU per statement at a fixed sysbench rate, arms interleaved
    /// over many short rounds, on MariaDB 10.11 (host) and 11.8
    /// (container): medians, bootstrap intervals and paired differences to
    /// control, the one-trap floor and a baseline binary; report and CSV in
    /// benches/results/.
    BenchRate(bench::rate::RateArgs),
    /// The experiment this project started from: sysbench oltp_read_write
    /// at 12 threads, nothing attached, sqlbee and performance_schema with
    /// its statement consumers on, in alternating rounds at saturation
    /// (throughput and latency lost) and at a fixed rate (mysqld CPU per
    /// statement); two reports in benches/results/.
    BenchSeeds(bench::rate::SeedsArgs),
    /// Fuzz every decoder of outside bytes (batches through decode,
    /// validate and a SQLite store; spool records; store blobs; the
    /// normalizer and redactor; kernel records) for N seconds each, with a
    /// random seed; prints executions and findings.
    Fuzz {
        #[arg(long, default_value_t = 60)]
        seconds: u32,
        /// Seed of the mutations (default: random); a finding names it.
        #[arg(long)]
        seed: Option<u64>,
        /// Run each target this many executions instead of for a time.
        #[arg(long)]
        executions: Option<u64>,
    },
    /// Write the option reference from the binary's clap definitions and
    /// build the manual (docs/) into target/book, checking every internal
    /// link.
    Docs {
        /// Only check: fail when the committed option reference differs
        /// from what the binary says (what `./x test` runs).
        #[arg(long)]
        check: bool,
        /// Also copy the web UI test's screenshots (target/ui-screenshots)
        /// into docs/src/images.
        #[arg(long)]
        screenshots: bool,
    },
    /// Build the sqlbee image and the test MariaDB image with podman
    /// (localhost/sqlbee:latest, localhost/sqlbee-test-mariadb:latest).
    Image,
    /// Set up and run every test, the privileged eBPF ones included.
    Test {
        /// Extra arguments for `cargo test` (after `--`).
        #[arg(trailing_var_arg = true)]
        args: Vec<String>,
    },
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    match cli.command {
        Task::Setup => setup::run(),
        Task::Demo { seconds, no_serve } => {
            setup::run()?;
            demo::run(seconds, !no_serve)
        }
        Task::Bench(args) => {
            setup::run()?;
            let outcome = bench::run(&args)?;
            println!("{}", outcome.markdown);
            Ok(())
        }
        Task::BenchCost(args) => {
            setup::run()?;
            let outcome = bench::cost::run(&args)?;
            println!("{}", std::fs::read_to_string(outcome.report)?);
            Ok(())
        }
        Task::BenchBystanders(args) => {
            setup::run()?;
            let report = bench::bystanders::run(&args)?;
            println!("{}", std::fs::read_to_string(report)?);
            Ok(())
        }
        Task::BenchRate(args) => {
            setup::run()?;
            let outcome = bench::rate::run(&args)?;
            println!("{}", std::fs::read_to_string(outcome.report)?);
            Ok(())
        }
        Task::BenchSeeds(args) => {
            setup::run()?;
            for outcome in bench::rate::seeds(&args)? {
                println!("{}", std::fs::read_to_string(outcome.report)?);
            }
            Ok(())
        }
        Task::Fuzz { seconds, seed, executions } => fuzz(seconds, seed, executions),
        Task::Docs { check, screenshots } => {
            setup::run()?;
            docs::run(if check { docs::Mode::Check } else { docs::Mode::Write }, screenshots)
        }
        Task::Image => {
            setup::run()?;
            xtask::image::build()
        }
        Task::Test { args } => {
            setup::run()?;
            test(&args)
        }
    }
}

fn fuzz(seconds: u32, seed: Option<u64>, executions: Option<u64>) -> anyhow::Result<()> {
    let seed = seed.unwrap_or_else(|| {
        let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
        (now.as_nanos() as u64) | 1
    });
    match executions {
        Some(n) => println!("==> fuzz targets, {n} executions each, seed {seed}"),
        None => println!("==> fuzz targets, {seconds} s each, seed {seed}"),
    }
    let status = cargo()
        .args(["test", "--release", "-p", "sqlbee", "--test", "fuzz", "--", "--nocapture", "--test-threads=1"])
        .env("SQLBEE_FUZZ_SECONDS", seconds.to_string())
        .envs(executions.map(|n| ("SQLBEE_FUZZ_EXECUTIONS", n.to_string())))
        .env("SQLBEE_FUZZ_SEED", seed.to_string())
        .status()
        .context("running the fuzz targets")?;
    if !status.success() {
        bail!("a fuzz target found a failing input (seed {seed}); see above");
    }
    Ok(())
}

/// The agent's spool keeps 1 GiB free (or 10% of a small disk) and the
/// tests start ClickHouse and MariaDB on temporary directories: on a disk
/// short of room, tests of outages fail for a reason that is not theirs.
/// Said up front, so such a failure is read for what it is.
fn warn_if_disk_is_short() {
    const ENOUGH: u64 = 4 << 30;
    let dir = std::env::temp_dir();
    let Ok(c_path) = std::ffi::CString::new(dir.as_os_str().as_encoded_bytes()) else { return };
    let mut stat: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: a valid NUL-terminated path and a zeroed out-parameter.
    if unsafe { libc::statvfs(c_path.as_ptr(), &mut stat) } != 0 {
        return;
    }
    let available = stat.f_bavail as u64 * stat.f_frsize as u64;
    if available < ENOUGH {
        eprintln!(
            "warning: only {:.1} GiB free on {}; the agent's spool writes nothing below 1 GiB free, and tests that need the spool may fail for that",
            available as f64 / (1u64 << 30) as f64,
            dir.display()
        );
    }
}

/// Formatting, clippy at the workspace's lints, and the manual (the option
/// reference as the binary says it, a build without warnings, no broken
/// link). Each says what failed and goes on, so one run shows them all.
fn lints() -> anyhow::Result<Vec<bool>> {
    println!("==> cargo fmt --check");
    let fmt = cargo().args(["fmt", "--all", "--check"]).status().context("running cargo fmt")?.success();
    if !fmt {
        eprintln!("FAILED: the tree is not rustfmt-formatted: run `cargo fmt --all`");
    }
    println!("==> cargo clippy (the workspace's lints, warnings are errors)");
    let clippy = cargo()
        .args(["clippy", "-q", "--workspace", "--exclude", "agent-ebpf", "--all-targets", "--", "-D", "warnings"])
        .status()
        .context("running cargo clippy")?
        .success();
    if !clippy {
        eprintln!("FAILED: clippy found warnings (above)");
    }
    println!("==> the manual (./x docs --check)");
    let book = match docs::run(docs::Mode::Check, false) {
        Ok(()) => true,
        Err(e) => {
            eprintln!("FAILED: the manual: {e:#}");
            false
        }
    };
    Ok(vec![fmt, clippy, book])
}

fn test(args: &[String]) -> anyhow::Result<()> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        bail!("the test suite attaches eBPF programs and needs root; run it as root (sudo ./x test)");
    }
    warn_if_disk_is_short();
    let lints = lints()?;
    let collector_only = collector_only::build()?;
    // The container tests run the images as users get them.
    xtask::image::build()?;
    let mut totals = [0u64; 3];
    // The collector's crate first, with the eBPF tools off PATH: it builds
    // and tests without them (its ClickHouse servers are still required).
    println!("==> cargo test -p {} (no bpf-linker on PATH)", collector_only::CRATE);
    let mut collector = cargo();
    collector
        .args(["test", "--no-fail-fast", "-p", collector_only::CRATE, "--"])
        .args(args)
        .env("PATH", collector_only::without_ebpf_tools()?)
        .env("SQLBEE_REQUIRE_PRIVILEGED", "1");
    let mut status = counted(&mut collector, &mut totals)?;
    println!("==> cargo test (privileged tests required)");
    let mut all = cargo();
    all.args(["test", "--no-fail-fast", "--workspace", "--exclude", "agent-ebpf", "--exclude", collector_only::CRATE])
        .arg("--")
        .args(args)
        .env("SQLBEE_REQUIRE_PRIVILEGED", "1")
        .env("SQLBEE_COLLECTOR_ONLY_BIN", &collector_only);
    let outcome = counted(&mut all, &mut totals)?;
    if !outcome.success() {
        status = outcome;
    }
    // The collector suite once more against ClickHouse, with the same
    // assertions (a fresh database per collector): on a private server, and
    // on a cluster of two shards of two replicas and a ZooKeeper
    // (xtask::clickhouse_cluster). The OTLP export's too on the server:
    // it reads what ClickHouse keeps of retried batches as top does.
    for (store, suites) in [("clickhouse", &["collector", "otlp"][..]), ("clickhouse-cluster", &["collector"][..])] {
        println!("==> cargo test --test {} with SQLBEE_TEST_STORE={store}", suites.join(" --test "));
        let mut suite = cargo();
        suite.args(["test", "--no-fail-fast", "-p", "sqlbee"]);
        for name in suites {
            suite.args(["--test", name]);
        }
        suite.arg("--").args(args).env("SQLBEE_REQUIRE_PRIVILEGED", "1").env("SQLBEE_TEST_STORE", store);
        let outcome = counted(&mut suite, &mut totals)?;
        if !outcome.success() {
            status = outcome;
        }
    }
    // The formatting, lint and manual checks, counted as tests.
    for ok in &lints {
        totals[if *ok { 0 } else { 1 }] += 1;
    }
    let [passed, failed, ignored] = totals;
    // The micro-benchmarks once each (criterion's test mode), so they keep
    // compiling and working between benchmark runs.
    println!("==> cargo test --bench hot_path --bench collector_ingest (each micro-benchmark once)");
    let mut benches = cargo()
        .args(["test", "-p", "sqlbee", "--bench", "hot_path", "--bench", "collector_ingest"])
        .status()
        .context("running cargo test")?;
    // The other benchmarks take minutes to run; compiling them keeps them
    // from falling behind the types they use.
    if benches.success() {
        println!("==> cargo test --benches --no-run (every benchmark still builds)");
        benches =
            cargo().args(["test", "-p", "sqlbee", "--benches", "--no-run"]).status().context("running cargo test")?;
    }
    println!("tests: {passed} passed, {failed} failed, {ignored} skipped");
    if !status.success() || failed > 0 {
        bail!("tests failed");
    }
    if !benches.success() {
        bail!("the micro-benchmarks failed in test mode, or a benchmark no longer builds");
    }
    Ok(())
}

/// Runs `cargo test`, passing its output through and adding up every test
/// binary's result line into `totals` (passed, failed, ignored), so the run
/// ends with one total instead of the last binary's count.
fn counted(cmd: &mut std::process::Command, totals: &mut [u64; 3]) -> anyhow::Result<std::process::ExitStatus> {
    let mut child = cmd.stdout(std::process::Stdio::piped()).spawn().context("running cargo test")?;
    let stdout = child.stdout.take().context("cargo test stdout")?;
    for line in std::io::BufRead::lines(std::io::BufReader::new(stdout)) {
        let line = line?;
        println!("{line}");
        if let Some(rest) = line.strip_prefix("test result: ") {
            let count = |word: &str| -> u64 {
                rest.split(';')
                    .find_map(|part| part.trim().strip_suffix(word)?.trim().rsplit(' ').next()?.parse().ok())
                    .unwrap_or(0)
            };
            for (slot, word) in totals.iter_mut().zip(["passed", "failed", "ignored"]) {
                *slot += count(word);
            }
        }
    }
    Ok(child.wait()?)
}
