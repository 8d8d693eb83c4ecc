//! The `sqlbee` binary: parses the command line and starts one role.
//! A role this build leaves out (see the crate's features) still parses,
//! so that asking for it gets a clear answer instead of "unknown command".
use anyhow::Context as _;
use clap::{Parser, Subcommand};

#[cfg(feature = "collector")]
use sqlbee::{
    collector::{self, CollectorArgs},
    query::{self, HostsArgs, InstancesArgs, LocksArgs, SeriesArgs, TopArgs},
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
    #[cfg(feature = "agent")]
    Agent(sqlbee::config::AgentOptions),
    /// Trace mariadbd/mysqld processes (not in this build).
    #[cfg(not(feature = "agent"))]
    #[command(disable_help_flag = true)]
    Agent(Missing),
    /// Receive batches from agents over gRPC, store them, answer queries.
    #[cfg(feature = "collector")]
    Collector(CollectorArgs),
    /// The slowest digests across the fleet, from a collector.
    #[cfg(feature = "collector")]
    Top(TopArgs),
    /// One digest's, the instances' or the agents' cost over time, step by step.
    #[cfg(feature = "collector")]
    Series(SeriesArgs),
    /// Agents and server instances a collector knows, with lag and gaps.
    #[cfg(feature = "collector")]
    Instances(InstancesArgs),
    /// Long waits with the waiting statement and candidate blockers.
    #[cfg(feature = "collector")]
    Locks(LocksArgs),
    /// Agents' hosts and the agents' own cost, window by window.
    #[cfg(feature = "collector")]
    Hosts(HostsArgs),
    /// Receive batches from agents (not in this build).
    #[cfg(not(feature = "collector"))]
    #[command(disable_help_flag = true)]
    Collector(Missing),
}

/// Whatever follows a role this build does not have.
#[derive(clap::Args)]
#[cfg_attr(all(feature = "agent", feature = "collector"), allow(dead_code))]
struct Missing {
    #[arg(trailing_var_arg = true, allow_hyphen_values = true, hide = true)]
    _args: Vec<std::ffi::OsString>,
}

/// Exit status for a role left out of this build (as for a usage error).
#[cfg_attr(all(feature = "agent", feature = "collector"), allow(dead_code))]
const NOT_BUILT: i32 = 2;

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
        #[cfg(feature = "agent")]
        Role::Agent(args) => agent::run(args)?,
        #[cfg(not(feature = "agent"))]
        Role::Agent(_) => {
            eprintln!(
                "sqlbee: this binary was built without the agent (cargo features: collector only); \
                 `sqlbee agent` needs the default build, which includes the eBPF programs"
            );
            std::process::exit(NOT_BUILT);
        }
        #[cfg(feature = "collector")]
        Role::Collector(args) => collector::main(args).context("collector failed")?,
        #[cfg(feature = "collector")]
        Role::Top(args) => query::top(args).context("top failed")?,
        #[cfg(feature = "collector")]
        Role::Series(args) => query::series(args).context("series failed")?,
        #[cfg(feature = "collector")]
        Role::Instances(args) => query::instances(args).context("instances failed")?,
        #[cfg(feature = "collector")]
        Role::Locks(args) => query::locks(args).context("locks failed")?,
        #[cfg(feature = "collector")]
        Role::Hosts(args) => query::hosts(args).context("hosts failed")?,
        #[cfg(not(feature = "collector"))]
        Role::Collector(_) => {
            eprintln!(
                "sqlbee: this binary was built without the collector (cargo features: agent only); \
                 `sqlbee collector` and the query tools need the default build or `--features collector`"
            );
            std::process::exit(NOT_BUILT);
        }
    }
    Ok(())
}

#[cfg(feature = "agent")]
mod agent {
    use std::sync::atomic::{AtomicBool, Ordering};

    use anyhow::Context as _;
    use sqlbee::{config::AgentOptions, pipeline};

    static STOP: AtomicBool = AtomicBool::new(false);

    extern "C" fn on_signal(_: libc::c_int) {
        STOP.store(true, Ordering::Relaxed);
    }

    /// `_parsed` showed the command line is well formed; the options are
    /// resolved again from it with the config file and the environment.
    pub fn run(_parsed: AgentOptions) -> anyhow::Result<()> {
        // `sqlbee agent ARGS...`: the role is the first argument.
        let config = AgentOptions::resolve(std::env::args_os().skip(2)).context("invalid agent configuration")?;
        install_signal_handlers();
        pipeline::run_agent(config, &STOP).context("agent failed")
    }

    fn install_signal_handlers() {
        // SAFETY: the handler only stores to an atomic, which is signal-safe.
        unsafe {
            libc::signal(libc::SIGINT, on_signal as *const () as libc::sighandler_t);
            libc::signal(libc::SIGTERM, on_signal as *const () as libc::sighandler_t);
        }
    }
}
