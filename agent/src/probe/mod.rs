//! Loads the kernel programs, attaches them to each server process and
//! reads what they report into owned values.
//!
//! One program set per server process (its own maps, its own ring buffer),
//! scoped to that pid so other servers on the host are never trapped.
//! Reading never blocks the kernel side: records are drained on a timer.
mod applied;
mod attach;
mod calibrate;
mod clients;
mod event;
mod figure_choice;
mod kernel_digests;
mod link_mode;
mod names;
mod programs;
mod send_hook;
mod skipped_runs;
mod statement_hook;
mod supervisor;
mod values;
#[cfg(test)]
mod verifier_budget;

pub use crate::discover::Client;
pub use applied::{Applied, RowsKind, decode_applied};
pub use attach::{AttachedServer, ProbeConfig};
pub use calibrate::hold_task_events_on;
pub use event::{ErrorMessage, Statement, decode_error, decode_statement};
pub use figure_choice::FigureChoice;
pub use kernel_digests::KernelDigest;
pub use link_mode::multi_links;
pub use names::{Account, Program, UNKNOWN_SCHEMA};
pub use programs::{LeftOut, Loaded, ProgramSet};
pub use send_hook::syscall_tracepoints_available;
pub use statement_hook::StatementHook;
pub use supervisor::Supervisor;
pub use values::BoundValues;

use sqlbee_kernel_abi::{COMMAND_SLOTS, command, stat};

use crate::{
    budget::ProbeCost,
    discover::{BinaryIdentity, DiscoverError, ServerProcess},
};

#[derive(Debug, thiserror::Error)]
pub enum ProbeError {
    #[error("loading the eBPF programs for pid {pid} failed: {source}{}", privilege_hint(source))]
    Load {
        pid: u32,
        #[source]
        source: aya::EbpfError,
    },
    #[error(
        "kernel {kernel} refused the statement program `{program}` for pid {pid}, which every traced server \
         needs: {reason} (the manual's troubleshooting page, \"The kernel refuses the statement program\", \
         says what to do; the agent's debug log has the verifier's whole answer)"
    )]
    Refused {
        pid: u32,
        program: &'static str,
        kernel: String,
        reason: String,
        #[source]
        source: Option<aya::programs::ProgramError>,
    },
    #[error(
        "--statement-hook send cannot end statements of pid {pid} at its answers: {why}; \
         run the agent with --statement-hook uprobe for this server"
    )]
    NoSendHook { pid: u32, why: String },
    #[error("eBPF program `{program}` for pid {pid}: {source}")]
    Program {
        pid: u32,
        program: &'static str,
        #[source]
        source: aya::programs::ProgramError,
    },
    #[error("attaching `{program}` to `{symbol}` in {binary} for pid {pid} failed: {source}")]
    Attach {
        pid: u32,
        program: &'static str,
        symbol: &'static str,
        binary: String,
        #[source]
        source: aya::programs::ProgramError,
    },
    #[error("eBPF map `{map}` is missing or has the wrong type: {detail}")]
    Map { map: &'static str, detail: String },
    #[error(transparent)]
    Discover(#[from] DiscoverError),
}

/// A missing privilege explains a load only when the kernel said no
/// permission; a verifier's refusal or a bad object says something else.
fn privilege_hint(source: &aya::EbpfError) -> &'static str {
    let denied = std::error::Error::source(source)
        .and_then(|e| e.downcast_ref::<std::io::Error>())
        .is_some_and(|e| e.kind() == std::io::ErrorKind::PermissionDenied);
    if denied || source.to_string().contains("Operation not permitted") {
        " (sqlbee needs root, or CAP_BPF and CAP_PERFMON)"
    } else {
        ""
    }
}

impl ProbeError {
    /// A short, stable name of what went wrong: a metric label and a
    /// column an operator can group by, where the message is prose.
    pub fn kind(&self) -> &'static str {
        match self {
            ProbeError::Load { .. } | ProbeError::Program { .. } | ProbeError::Map { .. } => "load_failed",
            ProbeError::Refused { .. } => "kernel_refused",
            ProbeError::NoSendHook { .. } => "unsupported_build",
            ProbeError::Attach { .. } => "attach_failed",
            ProbeError::Discover(e) => match e {
                DiscoverError::NoSuchProcess { .. } => "gone",
                DiscoverError::Proc { .. } => "unreadable_process",
                DiscoverError::Binary { .. } | DiscoverError::NotElf { .. } => "unreadable_binary",
                DiscoverError::MissingSymbol { .. } => "missing_symbol",
                DiscoverError::Unsupported { .. } => "unsupported_build",
                DiscoverError::UnknownLayout { .. } => "unknown_layout",
            },
        }
    }
}

/// A server the agent found but does not trace, and why. The agent tries
/// again on a back-off (a new build, a file that appears), and says so in
/// every window until it succeeds or the server goes away.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UntracedServer {
    pub server: ServerProcess,
    /// The error, as the log says it.
    pub reason: String,
    /// `ProbeError::kind`.
    pub kind: &'static str,
    pub binary: BinaryIdentity,
    /// When the agent first failed to trace this process.
    pub since: std::time::SystemTime,
    pub attempts: u32,
}

/// Cumulative kernel counters of one attached server since attach.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Counters {
    pub commands: Vec<u64>,
    pub statements: u64,
    pub events: u64,
    pub dropped: u64,
    pub unmatched: u64,
    pub read_failed: u64,
    pub errors: u64,
    /// Statements counted into kernel digests instead of sent.
    pub counted_in_kernel: u64,
    /// Statements stored programs ran, those whose start was not seen,
    /// statements the replica applier ran, and second ends of one
    /// statement (not counted again).
    pub nested: u64,
    pub nested_unmatched: u64,
    pub replica: u64,
    pub duplicate_hits: u64,
    /// Events the replica applied that could not be timed (`stat::APPLIED_LOST`).
    pub applied_lost: u64,
    /// Runs of the programs the kernel skipped (`skipped_runs`): a
    /// statement whose end fell in one is not counted. None when the
    /// kernel does not count them.
    pub skipped_runs: Option<u64>,
}

impl Default for Counters {
    fn default() -> Self {
        Self {
            commands: vec![0; COMMAND_SLOTS as usize],
            statements: 0,
            events: 0,
            dropped: 0,
            unmatched: 0,
            read_failed: 0,
            errors: 0,
            counted_in_kernel: 0,
            nested: 0,
            nested_unmatched: 0,
            replica: 0,
            duplicate_hits: 0,
            applied_lost: 0,
            skipped_runs: None,
        }
    }
}

impl Counters {
    /// `commands` from the `COMMANDS` map, `stats` the `STATS` block summed
    /// over CPUs; statements of the two main commands are counted in the
    /// block (zero there when the command probe counts them in the map).
    pub(crate) fn from_stats(mut commands: Vec<u64>, stats: &[u64]) -> Self {
        let at = |i: u32| stats.get(i as usize).copied().unwrap_or(0);
        for (command, slot) in
            [(command::QUERY, stat::QUERY_STATEMENTS), (command::STMT_EXECUTE, stat::EXECUTE_STATEMENTS)]
        {
            if let Some(count) = commands.get_mut(command as usize) {
                *count += at(slot);
            }
        }
        Self {
            commands,
            statements: at(stat::STATEMENTS),
            events: at(stat::EVENTS),
            dropped: at(stat::DROPPED),
            unmatched: at(stat::UNMATCHED),
            read_failed: at(stat::READ_FAILED),
            errors: at(stat::ERRORS),
            counted_in_kernel: at(stat::KERNEL_COUNTED),
            nested: at(stat::NESTED),
            nested_unmatched: at(stat::NESTED_UNMATCHED),
            replica: at(stat::REPLICA),
            duplicate_hits: at(stat::DUPLICATE_HITS),
            applied_lost: at(stat::APPLIED_LOST),
            skipped_runs: None,
        }
    }

    /// What happened between `earlier` and `self`.
    pub fn delta(&self, earlier: &Counters) -> Counters {
        let commands = self
            .commands
            .iter()
            .enumerate()
            .map(|(i, n)| n.saturating_sub(earlier.commands.get(i).copied().unwrap_or(0)))
            .collect();
        Counters {
            commands,
            statements: self.statements.saturating_sub(earlier.statements),
            events: self.events.saturating_sub(earlier.events),
            dropped: self.dropped.saturating_sub(earlier.dropped),
            unmatched: self.unmatched.saturating_sub(earlier.unmatched),
            read_failed: self.read_failed.saturating_sub(earlier.read_failed),
            errors: self.errors.saturating_sub(earlier.errors),
            counted_in_kernel: self.counted_in_kernel.saturating_sub(earlier.counted_in_kernel),
            nested: self.nested.saturating_sub(earlier.nested),
            nested_unmatched: self.nested_unmatched.saturating_sub(earlier.nested_unmatched),
            replica: self.replica.saturating_sub(earlier.replica),
            duplicate_hits: self.duplicate_hits.saturating_sub(earlier.duplicate_hits),
            applied_lost: self.applied_lost.saturating_sub(earlier.applied_lost),
            // A first reading counts from 0, as the kernel's own counters do.
            skipped_runs: self.skipped_runs.map(|now| now.saturating_sub(earlier.skipped_runs.unwrap_or(0))),
        }
    }
}

/// Which per-statement figures a server's records carry: the layout's
/// `stats_fields` bits, plus CPU time, schema and account. A figure this
/// build or kernel does not let the kernel side read is left out of every
/// record (null), never reported as 0.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Readable(pub u32);

impl Readable {
    pub const CPU: u32 = sqlbee_figures::needs::CPU;
    pub const SCHEMA: u32 = 1 << 17;
    pub const ACCOUNT: u32 = 1 << 18;

    pub fn of(layout: &sqlbee_kernel_abi::ServerLayout) -> Readable {
        let mut bits = layout.known_needs();
        if layout.db_offset != sqlbee_kernel_abi::UNKNOWN {
            bits |= Self::SCHEMA;
        }
        if layout.sctx_offset != sqlbee_kernel_abi::UNKNOWN {
            bits |= Self::ACCOUNT;
        }
        Readable(bits)
    }

    pub fn has(self, bit: u32) -> bool {
        self.0 & bit != 0
    }

    /// Whether a figure that needs `needs` (`sqlbee_figures::needs`)
    /// can be read: `ALWAYS` (0) always can.
    pub fn knows(self, needs: u32) -> bool {
        self.0 & needs == needs
    }
}

/// What the probe stage hands downstream for one server.
#[derive(Debug)]
pub struct ProbeBatch {
    pub server: ServerProcess,
    /// The server's build and version.
    pub binary: BinaryIdentity,
    /// Which figures its records carry.
    pub readable: Readable,
    /// The programs loaded for it, and those its kernel refused.
    pub programs: std::sync::Arc<ProgramSet>,
    pub statements: Vec<Statement>,
    /// Waits longer than the threshold, in the order they ended.
    pub long_waits: Vec<sqlbee_kernel_abi::LongWait>,
    /// Events a replica applied, in the order they ended.
    pub applied: Vec<Applied>,
    /// Cumulative counters, read at window ends and at detach.
    pub counters: Option<Counters>,
    /// Statements counted in the kernel, read at window ends and at detach.
    pub kernel: Vec<KernelDigest>,
    /// Text hashes whose kernel digests are over: no more will come.
    pub forgotten: Vec<u64>,
    /// What the probes cost the server, at window ends and at detach.
    pub cost: Option<ProbeCost>,
    /// The server went away; this is its last batch.
    pub detached: bool,
    /// The server's process exited (a detach at the agent's own shutdown
    /// leaves this unset).
    pub stopped: Option<Stopped>,
}

/// When a traced server's process was found gone: it exited after
/// `last_seen` (the rescan before, or its attach) and before `noticed`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Stopped {
    pub last_seen: std::time::SystemTime,
    pub noticed: std::time::SystemTime,
}
