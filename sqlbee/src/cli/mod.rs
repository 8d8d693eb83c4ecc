//! The command line of the `sqlbee` binary: one subcommand per role, each
//! role's options from its own crate. The option reference of the manual
//! is rendered from these very definitions (`reference`), which is what
//! `--help` prints too. A role this build leaves out still parses, so that
//! asking for it gets a clear answer instead of "unknown command".
pub mod reference;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(name = "sqlbee", version, about = "eBPF statement observability for MySQL and MariaDB")]
pub struct Cli {
    #[command(subcommand)]
    pub role: Role,
}

#[derive(Subcommand)]
pub enum Role {
    /// Trace mariadbd/mysqld processes on this host and report per-digest
    /// statistics per window.
    #[cfg(feature = "agent")]
    Agent(sqlbee_agent::config::AgentOptions),
    /// Trace mariadbd/mysqld processes (not in this build).
    #[cfg(not(feature = "agent"))]
    #[command(disable_help_flag = true)]
    Agent(Missing),
    /// Receive batches from agents over gRPC, store them, answer queries.
    #[cfg(feature = "collector")]
    Collector(sqlbee_collector::CollectorArgs),
    /// The slowest digests across the fleet, from a collector.
    #[cfg(feature = "collector")]
    Top(sqlbee_query_tools::TopArgs),
    /// Two time ranges side by side: which digests regressed, improved,
    /// appeared or went, judged from the exact latency histograms.
    #[cfg(feature = "collector")]
    Diff(sqlbee_query_tools::DiffArgs),
    /// What the collector's detection found: regressions, new digests and
    /// plan changes, each open until it ends.
    #[cfg(feature = "collector")]
    Events(sqlbee_query_tools::EventsArgs),
    /// Marks a deploy or a change on every plot (takes a token of the
    /// `annotate` role).
    #[cfg(feature = "collector")]
    Annotate(sqlbee_query_tools::AnnotateArgs),
    /// One digest's, the instances' or the agents' cost over time, step by step.
    #[cfg(feature = "collector")]
    Series(sqlbee_query_tools::SeriesArgs),
    /// Agents and server instances a collector knows, with lag and gaps.
    #[cfg(feature = "collector")]
    Instances(sqlbee_query_tools::InstancesArgs),
    /// Long waits with the waiting statement and candidate blockers.
    #[cfg(feature = "collector")]
    Locks(sqlbee_query_tools::LocksArgs),
    /// Agents' hosts and the agents' own cost, window by window.
    #[cfg(feature = "collector")]
    Hosts(sqlbee_query_tools::HostsArgs),
    /// A digest's plans (EXPLAIN, from agents with --server-login) and
    /// plan changes.
    #[cfg(feature = "collector")]
    Plans(sqlbee_query_tools::PlansArgs),
    /// Per-table totals: statements, time and rows examined of the digests
    /// that read or write each table.
    #[cfg(feature = "collector")]
    Tables(sqlbee_query_tools::TablesArgs),
    /// What runs now on each server: every connection, its statement, how
    /// long it has run, what it waits on and who blocks it.
    #[cfg(feature = "collector")]
    Activity(sqlbee_query_tools::ActivityArgs),
    /// Statements that ran longer than the agents' --long-statement, were
    /// killed, or lost their client: each with its duration, waits and blocker.
    #[cfg(feature = "collector")]
    Long(sqlbee_query_tools::LongArgs),
    /// What replicas applied: transactions, lag at commit, and the tables
    /// and event classes that took the apply time.
    #[cfg(feature = "collector")]
    Replication(sqlbee_query_tools::ReplicationArgs),
    /// Serves the collector's read side (top, diff, plans, findings,
    /// activity, events, ...) as Model Context Protocol tools on stdin and
    /// stdout, for an assistant; no tool writes or runs SQL.
    #[cfg(feature = "collector")]
    Mcp(sqlbee_query_tools::mcp::McpArgs),
    /// Receive batches from agents (not in this build).
    #[cfg(not(feature = "collector"))]
    #[command(disable_help_flag = true)]
    Collector(Missing),
    /// Writes the manual's option reference (one Markdown page per
    /// subcommand) into DIR; `./x docs` runs it.
    #[command(hide = true)]
    Reference {
        /// The folder to write into (docs/src/reference): cli/*.md, limits.md
        /// and figures.md.
        dir: std::path::PathBuf,
    },
}

/// Whatever follows a role this build does not have.
#[derive(clap::Args)]
#[cfg_attr(all(feature = "agent", feature = "collector"), allow(dead_code))]
pub struct Missing {
    #[arg(trailing_var_arg = true, allow_hyphen_values = true, hide = true)]
    _args: Vec<std::ffi::OsString>,
}

/// Exit status for a role left out of this build (as for a usage error).
#[cfg_attr(all(feature = "agent", feature = "collector"), allow(dead_code))]
pub const NOT_BUILT: i32 = 2;
