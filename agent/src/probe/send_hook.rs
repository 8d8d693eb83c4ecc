//! The send hook (`--statement-hook send`): which kernel program ends a
//! server's statements at its answer, how it attaches, and why a server
//! cannot have it.
//!
//! Two programs share one body (`agent-ebpf/src/send.rs`). The one on the
//! `syscalls` tracepoints of `sendto` and `write` runs only at those two
//! calls: the kernel tests the syscall's number before any program runs.
//! The one on the raw `sys_enter` tracepoint needs no tracefs and runs at
//! every syscall of every process on the host (about 150 ns each on the VMs
//! of `benches/results`), so it is the fallback.
use std::path::Path;

use aya::{
    Ebpf,
    programs::{
        ProgramError, RawTracePoint, TracePoint, raw_trace_point::RawTracePointLinkId, trace_point::TracePointLinkId,
    },
};
use sqlbee_kernel_abi::{ServerLayout, UNKNOWN};
use tracing::{info, warn};

use super::{
    ProbeConfig, ProbeError, StatementHook,
    programs::{Loaded, SEND_PROGRAM, SEND_TRACEPOINT_PROGRAM, kernel_release},
};
use crate::discover::BinaryInfo;

/// Where the fallback program attaches.
const SYSCALL_ENTRY: &str = "sys_enter";
/// The tracefs category and events of the tracepoint program: `sendto`
/// always, `write` when the client's socket can be told from files.
const SYSCALLS: &str = "syscalls";
const SENDTO: &str = "sys_enter_sendto";
const WRITE: &str = "sys_enter_write";

/// The loaded send program of one server, and its links while attached.
pub(super) struct SendHook {
    program: &'static str,
    /// Also at `write` (TLS answers), with the tracepoint program.
    write: bool,
    links: Vec<SendLink>,
}

enum SendLink {
    Raw(RawTracePointLinkId),
    Tracepoint(TracePointLinkId),
}

impl SendHook {
    /// Loads the program `hook` asks for: with `send`, the tracepoint
    /// program when tracefs has the syscall events and the kernel takes it,
    /// else the raw one, with a warning that says what that costs.
    pub(super) fn load(
        ebpf: &mut Ebpf,
        pid: u32,
        hook: StatementHook,
        layout: &ServerLayout,
    ) -> Result<(Self, Loaded), ProbeError> {
        let write = layout.send_vio_offset != UNKNOWN;
        if hook == StatementHook::Send {
            match syscall_events() {
                Some(tracefs) => match load_one(ebpf, pid, SEND_TRACEPOINT_PROGRAM)? {
                    Ok(loaded) => {
                        info!(pid, tracefs = %tracefs.display(), write, "send hook at the sendto and write tracepoints");
                        return Ok((Self { program: SEND_TRACEPOINT_PROGRAM, write, links: Vec::new() }, loaded));
                    }
                    Err(refusal) => warn!(pid, kernel = kernel_release(), error = %refusal,
                        "the kernel refused the send hook's tracepoint program; falling back to the raw sys_enter \
                         tracepoint, which runs at every syscall on the host"),
                },
                None => warn!(
                    pid,
                    "tracefs has no syscall events here (not mounted, or a kernel without \
                    CONFIG_FTRACE_SYSCALLS): the send hook falls back to the raw sys_enter tracepoint, which runs \
                    at every syscall on the host"
                ),
            }
        }
        let loaded = load_one(ebpf, pid, SEND_PROGRAM)?.map_err(|source| ProbeError::Refused {
            pid,
            program: SEND_PROGRAM,
            kernel: kernel_release(),
            reason: super::attach::refusal_reason(&source),
            source: Some(source),
        })?;
        Ok((Self { program: SEND_PROGRAM, write, links: Vec::new() }, loaded))
    }

    /// The loaded program's name.
    pub(super) fn program(&self) -> &'static str {
        self.program
    }

    pub(super) fn attached(&self) -> bool {
        !self.links.is_empty()
    }

    /// Attaches unless attached.
    pub(super) fn attach(&mut self, ebpf: &mut Ebpf, pid: u32) -> Result<(), ProbeError> {
        if self.attached() {
            return Ok(());
        }
        let program = self.program;
        let failed = |symbol: &'static str| {
            move |source| ProbeError::Attach { pid, program, symbol, binary: "the kernel".into(), source }
        };
        if program == SEND_PROGRAM {
            let link = raw(ebpf, pid)?.attach(SYSCALL_ENTRY).map_err(failed(SYSCALL_ENTRY))?;
            self.links.push(SendLink::Raw(link));
            return Ok(());
        }
        let events = [SENDTO, WRITE];
        for event in events.into_iter().take(if self.write { 2 } else { 1 }) {
            match tracepoint(ebpf, pid)?.attach(SYSCALLS, event).map_err(failed(event)) {
                Ok(link) => self.links.push(SendLink::Tracepoint(link)),
                Err(e) => {
                    // Both or neither: half would count plain answers only.
                    self.detach(ebpf, pid)?;
                    return Err(e);
                }
            }
        }
        Ok(())
    }

    /// Detaches, waiting for the kernel to let go.
    pub(super) fn detach(&mut self, ebpf: &mut Ebpf, pid: u32) -> Result<(), ProbeError> {
        let program = self.program;
        let failed = |source| ProbeError::Program { pid, program, source };
        for link in self.links.drain(..) {
            match link {
                SendLink::Raw(link) => raw(ebpf, pid)?.detach(link).map_err(failed)?,
                SendLink::Tracepoint(link) => tracepoint(ebpf, pid)?.detach(link).map_err(failed)?,
            }
        }
        Ok(())
    }

    /// The links, to be closed elsewhere (see `AttachedServer::detach_in_background`).
    pub(super) fn take_links(&mut self, ebpf: &mut Ebpf, pid: u32) -> Result<Vec<Box<dyn Send>>, ProbeError> {
        let program = self.program;
        let failed = |source| ProbeError::Program { pid, program, source };
        let mut taken: Vec<Box<dyn Send>> = Vec::new();
        for link in self.links.drain(..) {
            match link {
                SendLink::Raw(link) => taken.push(Box::new(raw(ebpf, pid)?.take_link(link).map_err(failed)?)),
                SendLink::Tracepoint(link) => {
                    taken.push(Box::new(tracepoint(ebpf, pid)?.take_link(link).map_err(failed)?))
                }
            }
        }
        Ok(taken)
    }
}

/// The tracefs that has the syscall events, if one is mounted where the
/// loader looks.
fn syscall_events() -> Option<&'static Path> {
    [Path::new("/sys/kernel/tracing"), Path::new("/sys/kernel/debug/tracing")]
        .into_iter()
        .find(|tracefs| tracefs.join("events").join(SYSCALLS).join(SENDTO).join("id").is_file())
}

/// Loads `program`, timing the verifier; the inner error is the kernel's
/// refusal.
fn load_one(ebpf: &mut Ebpf, pid: u32, program: &'static str) -> Result<Result<Loaded, ProgramError>, ProbeError> {
    let started = std::time::Instant::now();
    let outcome = if program == SEND_PROGRAM { raw(ebpf, pid)?.load() } else { tracepoint(ebpf, pid)?.load() };
    if let Err(source) = outcome {
        return Ok(Err(source));
    }
    let info = ebpf.program(program).and_then(|p| p.info().ok());
    Ok(Ok(Loaded {
        program,
        verified_insns: info.and_then(|info| info.verified_instruction_count()),
        load_time: started.elapsed(),
    }))
}

fn raw(ebpf: &mut Ebpf, pid: u32) -> Result<&mut RawTracePoint, ProbeError> {
    ebpf.program_mut(SEND_PROGRAM)
        .ok_or_else(|| ProbeError::Map { map: SEND_PROGRAM, detail: "program not in object".into() })?
        .try_into()
        .map_err(|source| ProbeError::Program { pid, program: SEND_PROGRAM, source })
}

fn tracepoint(ebpf: &mut Ebpf, pid: u32) -> Result<&mut TracePoint, ProbeError> {
    ebpf.program_mut(SEND_TRACEPOINT_PROGRAM)
        .ok_or_else(|| ProbeError::Map { map: SEND_TRACEPOINT_PROGRAM, detail: "program not in object".into() })?
        .try_into()
        .map_err(|source| ProbeError::Program { pid, program: SEND_TRACEPOINT_PROGRAM, source })
}

/// The layout with what the send hook reads, or why this server cannot
/// have it.
pub(super) fn with_send_hook(
    pid: u32,
    layout: ServerLayout,
    binary: &BinaryInfo,
    config: &ProbeConfig,
) -> Result<ServerLayout, ProbeError> {
    let refuse = |why: String| ProbeError::NoSendHook { pid, why };
    let send = binary.send.as_ref().map_err(|why| refuse(why.clone()))?;
    if config.task_fsbase_offset == 0 {
        return Err(refuse("the kernel's BTF gave no place for a task's thread pointer".into()));
    }
    // The program compares the kernel's own process id, which is the
    // agent's only in the host's pid namespace.
    if !in_host_pid_namespace() {
        return Err(refuse(
            "the agent runs in a pid namespace of its own (a container without the host's pids)".into(),
        ));
    }
    // A statement may reach more than one send with its answer final: its
    // query id is what counts it once.
    if layout.stats_fields & sqlbee_kernel_abi::stats_field::QUERY_ID == 0 {
        return Err(refuse("this build's query id cannot be read, and it is what counts each answer once".into()));
    }
    // A procedure's result sets are sent while it runs; only the nested
    // probes tell them from a client's statement.
    if binary.points.nested.is_none() {
        return Err(refuse("this build's stored-program statements cannot be told apart from a client's".into()));
    }
    if binary.layout.vio_offset == UNKNOWN {
        warn!(pid, "the client's socket cannot be found in this build: answers over TLS (by write) are not counted");
    }
    Ok(ServerLayout {
        send_tgid: pid,
        task_fsbase_offset: config.task_fsbase_offset,
        thd_tls_offset: send.thd_tls_offset,
        stmt_da_offset: send.stmt_da_offset,
        da_status_offset: send.da_status_offset,
        send_vio_offset: binary.layout.vio_offset,
        ..layout
    })
}

/// Whether this process is in the host's (the initial) pid namespace,
/// whose inode number the kernel fixes (`PROC_PID_INIT_INO`). A container's
/// own `/proc` shows one id in `NSpid` too, so that line cannot tell.
fn in_host_pid_namespace() -> bool {
    const PROC_PID_INIT_INO: u64 = 0xEFFF_FFFC;
    std::fs::read_link("/proc/self/ns/pid")
        .is_ok_and(|target| target.to_string_lossy() == format!("pid:[{PROC_PID_INIT_INO}]"))
}
