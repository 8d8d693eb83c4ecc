//! Which kernel programs a server gets, and what a kernel that refuses
//! one of them leaves out.
//!
//! Only the statement program is required: it counts and times every
//! statement. Every other program adds something (errors, waits, schemas,
//! accounts, stored programs' statements, exact command counts, values
//! for plans), and a kernel that refuses one costs that, never the
//! agent: the program is left out, the layout the others are loaded with
//! stops relying on it, and the server is reported with what it lacks.
use std::time::Duration;

use sqlbee_kernel_abi::{ServerLayout, UNKNOWN};

/// The program every traced server needs.
pub const REQUIRED: &str = "statement_end";

/// The send hook's statement program (`--statement-hook send`) at the raw
/// syscall-entry tracepoint, in place of `REQUIRED`'s uprobe.
pub const SEND_PROGRAM: &str = "statement_send";

/// The same at the `sendto` and `write` tracepoints, where it runs only at
/// those two syscalls.
pub const SEND_TRACEPOINT_PROGRAM: &str = "sendto_or_write";

/// Whether each run of `program` is a trap in the server. The send hook's
/// programs run in the kernel's syscall path, of every process on the
/// host, and cost their run time only.
pub fn traps(program: &str) -> bool {
    program != SEND_PROGRAM && program != SEND_TRACEPOINT_PROGRAM
}

/// A program the kernel accepted, and what verifying it took.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Loaded {
    pub program: &'static str,
    /// Instructions the verifier walked (kernels from 5.16 report it).
    pub verified_insns: Option<u32>,
    /// The load call, verification included.
    pub load_time: Duration,
}

/// A program the kernel refused, why, and what the server lacks for it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LeftOut {
    pub program: &'static str,
    /// The verifier's reason (or the error, when it gave none).
    pub reason: String,
    pub lost: &'static str,
}

/// What one server got: the programs loaded and those left out.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ProgramSet {
    pub loaded: Vec<Loaded>,
    pub left_out: Vec<LeftOut>,
}

/// What a server lacks without `program`.
pub fn lost_without(program: &str) -> &'static str {
    match program {
        "error_raised" => "errors: statements that fail are counted as succeeding, without code or message",
        "command_start" => "exact counts of commands that are not statements (prepare, close, ping, quit)",
        "wait_begin" | "wait_end" => "wait times per statement (row locks, metadata locks, I/O) and lock-wait records",
        "schema_change" => "each statement's schema",
        "account_change" => "each statement's account and client",
        "nested_start" | "nested_end" => "the statements procedures, functions, triggers and events run",
        "value_set" => "plans of prepared statements with the values they ran with",
        "apply_start" | "apply_end" => "what a replica applies: its events, tables and lag",
        _ => "what this program adds",
    }
}

/// The programs that stand or fall together: a pair's two halves.
pub fn partners(program: &'static str) -> &'static [&'static str] {
    match program {
        "wait_begin" | "wait_end" => &["wait_begin", "wait_end"],
        "nested_start" | "nested_end" => &["nested_start", "nested_end"],
        "apply_start" | "apply_end" => &["apply_start", "apply_end"],
        _ => &[],
    }
}

/// `layout` for a program set without `left_out`: what the remaining
/// programs would otherwise read on the strength of a probe that is not
/// there (the statement program counts commands itself without the command
/// probe; a schema or account read without its change probe could go
/// stale, so it is left out with it).
pub fn without(layout: ServerLayout, left_out: &[LeftOut]) -> ServerLayout {
    let mut layout = layout;
    for gone in left_out {
        match gone.program {
            "command_start" => layout.command_probe = 0,
            "wait_begin" | "wait_end" => layout.wait_probes = 0,
            "schema_change" => layout.db_offset = UNKNOWN,
            "account_change" => {
                layout.sctx_offset = UNKNOWN;
                layout.vio_offset = UNKNOWN;
            }
            "nested_start" | "nested_end" => layout.nested_probes = 0,
            "apply_start" | "apply_end" => layout.apply_probes = 0,
            _ => {}
        }
    }
    layout
}

/// The verifier's reason in a refusal's log: its last line that is not an
/// instruction, a register state or a statistic. The whole log can be
/// thousands of lines; this is the line a person acts on.
pub fn verifier_reason(log: &str) -> Option<String> {
    let is_noise = |line: &str| {
        let line = line.trim();
        line.is_empty()
            || line.starts_with(';')
            || line.starts_with("verification time")
            || line.starts_with("stack depth")
            || line.starts_with("processed ")
            || line.starts_with("frame")
            || line.starts_with("caller:")
            || line.starts_with("callee:")
            || line.starts_with("func#")
            || line.starts_with("from ")
            || line.starts_with("R0")
            || line.starts_with("R1")
            || line.starts_with("last_idx")
            || line.starts_with("regs=")
            || line.starts_with("parent ")
            || line.starts_with("mark_precise")
            || line.starts_with("reg type unsupported for arg#")
            || line
                .split_once(':')
                .is_some_and(|(head, _)| !head.is_empty() && head.bytes().all(|b| b.is_ascii_digit()))
    };
    log.lines().rev().find(|l| !is_noise(l)).map(|l| l.trim().to_owned())
}

/// Why a kernel refused a program.
pub struct Refusal {
    pub reason: String,
    pub source: Option<aya::programs::ProgramError>,
}

/// The verifier's reason for refusing a program, or the load's error.
pub fn refusal_reason(source: &aya::programs::ProgramError) -> String {
    match source {
        aya::programs::ProgramError::LoadError { io_error, verifier_log } => {
            verifier_reason(&verifier_log.to_string()).unwrap_or_else(|| io_error.to_string())
        }
        other => other.to_string(),
    }
}

/// Programs a test build refuses as a kernel would, named in
/// `SQLBEE_TEST_REFUSE_PROGRAMS` (comma-separated): how the tests make
/// each optional program fail to load. Release builds never read it.
pub fn refused_on_purpose(program: &str) -> bool {
    #[cfg(debug_assertions)]
    {
        std::env::var("SQLBEE_TEST_REFUSE_PROGRAMS").is_ok_and(|list| {
            list.split(',').any(|p| p.trim() == program || p.trim() == "all-optional" && program != REQUIRED)
        })
    }
    #[cfg(not(debug_assertions))]
    {
        let _ = program;
        false
    }
}

/// The running kernel's release (`uname -r`).
pub fn kernel_release() -> String {
    std::fs::read_to_string("/proc/sys/kernel/osrelease").map_or_else(|_| "unknown".into(), |s| s.trim().to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_reason_is_the_line_that_says_what_is_wrong() {
        let stack = "combined stack size of 3 calls is 544. Too large\nverification time 13442492 usec\n\
                     stack depth 0+480+0+8+48+8+16\nprocessed 414914 insns (limit 1000000) max_states_per_insn 20\n";
        assert_eq!(verifier_reason(stack).as_deref(), Some("combined stack size of 3 calls is 544. Too large"));
        let bounds = "reg type unsupported for arg#0 function nested_end#26\n0: R1=ctx(off=0,imm=0) R10=fp0\n\
                      ; let _ = try_nested_end(&ctx);\n0: (85) call pc+2\n\
                      1460: (85) call bpf_probe_read_user#112\n\
                      R2 min value is negative, either use unsigned or 'var &= const'\n\
                      verification time 128742 usec\nstack depth 0+160+0+0+0\nprocessed 6489 insns (limit 1000000)\n";
        assert_eq!(
            verifier_reason(bounds).as_deref(),
            Some("R2 min value is negative, either use unsigned or 'var &= const'")
        );
        assert_eq!(verifier_reason("\n\n"), None);
    }

    #[test]
    fn a_layout_without_a_probe_stops_relying_on_it() {
        let full = ServerLayout {
            command_probe: 1,
            wait_probes: 1,
            db_offset: 8,
            sctx_offset: 16,
            vio_offset: 24,
            nested_probes: 1,
            ..ServerLayout::default()
        };
        let gone = |program| LeftOut { program, reason: String::new(), lost: lost_without(program) };
        let layout = without(full, &[gone("command_start"), gone("wait_end"), gone("schema_change")]);
        assert_eq!((layout.command_probe, layout.wait_probes, layout.db_offset), (0, 0, UNKNOWN));
        assert_eq!((layout.sctx_offset, layout.vio_offset, layout.nested_probes), (16, 24, 1));
        let layout = without(full, &[gone("account_change"), gone("nested_start")]);
        assert_eq!((layout.sctx_offset, layout.vio_offset, layout.nested_probes), (UNKNOWN, UNKNOWN, 0));
        assert_eq!(without(full, &[gone("error_raised")]), full);
    }
}
