//! The `sqlbee` binary: parses the command line and starts one role.
use std::sync::{
    Arc,
    atomic::{AtomicBool, Ordering},
};

use anyhow::Context as _;
use clap::{Parser, Subcommand};

use sqlbee::{
    collector::{self, CollectorArgs},
    config::AgentArgs,
    pipeline,
    query::{self, HostsArgs, InstancesArgs, LocksArgs, TopArgs},
};

#[derive(Parser)]
#[command(name = "sqlbee", version, about = "eBPF statement observability for MySQL and MariaDB")]
struct Cli {
    #[command(subcommand)]
    role: Role,
}

#[derive(Subcommand)]
enum Role {
    /// Trace mariadbd/mysqld processes on this host and report per-digest
    /// statistics per window.
    Agent(AgentArgs),
    /// Receive batches from agents over gRPC, store them, answer queries.
    Collector(CollectorArgs),
    /// The slowest digests across the fleet, from a collector.
    Top(TopArgs),
    /// Agents and server instances a collector knows, with lag and gaps.
    Instances(InstancesArgs),
    /// Long waits with the waiting statement and candidate blockers.
    Locks(LocksArgs),
    /// Agents' hosts and the agents' own cost, window by window.
    Hosts(HostsArgs),
}

static STOP: AtomicBool = AtomicBool::new(false);

extern "C" fn on_signal(_: libc::c_int) {
    STOP.store(true, Ordering::Relaxed);
}

fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("SQLBEE_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .init();
    let cli = Cli::parse();
    match cli.role {
        Role::Agent(args) => {
            let config = args.resolve().context("invalid agent configuration")?;
            let stop = Arc::new(AtomicBool::new(false));
            install_signal_handlers();
            let watcher_stop = stop.clone();
            std::thread::spawn(move || {
                while !STOP.load(Ordering::Relaxed) {
                    std::thread::sleep(std::time::Duration::from_millis(50));
                }
                watcher_stop.store(true, Ordering::Relaxed);
            });
            pipeline::run_agent(config, stop).context("agent failed")?;
        }
        Role::Collector(args) => collector::main(args).context("collector failed")?,
        Role::Top(args) => query::top(args).context("top failed")?,
        Role::Instances(args) => query::instances(args).context("instances failed")?,
        Role::Locks(args) => query::locks(args).context("locks failed")?,
        Role::Hosts(args) => query::hosts(args).context("hosts failed")?,
    }
    Ok(())
}

fn install_signal_handlers() {
    // SAFETY: the handler only stores to an atomic, which is signal-safe.
    unsafe {
        libc::signal(libc::SIGINT, on_signal as *const () as libc::sighandler_t);
        libc::signal(libc::SIGTERM, on_signal as *const () as libc::sighandler_t);
    }
}
