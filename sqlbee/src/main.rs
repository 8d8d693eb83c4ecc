//! The `sqlbee` binary: parses the command line and starts one role.
//! A role this build leaves out (see the crate's features) still parses,
//! so that asking for it gets a clear answer instead of "unknown command".
mod cli;

use anyhow::Context as _;
use clap::Parser as _;
#[cfg(feature = "collector")]
use sqlbee_collector as collector;
#[cfg(feature = "collector")]
use sqlbee_query_tools as query;

use crate::cli::{Cli, Role};

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
            std::process::exit(crate::cli::NOT_BUILT);
        }
        #[cfg(feature = "collector")]
        Role::Collector(args) => collector::main(args).context("collector failed")?,
        #[cfg(feature = "collector")]
        Role::Top(args) => query::top(args).context("top failed")?,
        #[cfg(feature = "collector")]
        Role::Diff(args) => query::diff(args).context("diff failed")?,
        #[cfg(feature = "collector")]
        Role::Events(args) => query::events(args).context("events failed")?,
        #[cfg(feature = "collector")]
        Role::Annotate(args) => query::annotate(args).context("annotate failed")?,
        #[cfg(feature = "collector")]
        Role::Series(args) => query::series(args).context("series failed")?,
        #[cfg(feature = "collector")]
        Role::Instances(args) => query::instances(args).context("instances failed")?,
        #[cfg(feature = "collector")]
        Role::Locks(args) => query::locks(args).context("locks failed")?,
        #[cfg(feature = "collector")]
        Role::Plans(args) => query::plans(args).context("plans failed")?,
        #[cfg(feature = "collector")]
        Role::Tables(args) => query::tables(args).context("tables failed")?,
        #[cfg(feature = "collector")]
        Role::Activity(args) => query::activity(args).context("activity failed")?,
        #[cfg(feature = "collector")]
        Role::Long(args) => query::long(args).context("long failed")?,
        Role::Replication(args) => query::replication(args).context("replication failed")?,
        #[cfg(feature = "collector")]
        Role::Hosts(args) => query::hosts(args).context("hosts failed")?,
        #[cfg(feature = "collector")]
        Role::Mcp(args) => query::mcp::serve(args).context("mcp failed")?,
        Role::Reference { dir } => {
            let pages = crate::cli::reference::write_pages(&dir).context("writing the option reference")?;
            println!("wrote {pages} pages into {}", dir.display());
        }
        #[cfg(not(feature = "collector"))]
        Role::Collector(_) => {
            eprintln!(
                "sqlbee: this binary was built without the collector (cargo features: agent only); \
                 `sqlbee collector` and the query tools need the default build or `--features collector`"
            );
            std::process::exit(crate::cli::NOT_BUILT);
        }
    }
    Ok(())
}

#[cfg(feature = "agent")]
mod agent {
    use std::sync::atomic::{AtomicBool, Ordering};

    use anyhow::Context as _;
    use sqlbee_agent::{config::AgentOptions, pipeline};

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
