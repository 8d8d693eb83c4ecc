//! The send hook (`--statement-hook send`): which kernel program ends a
//! server's statements at its answer, how it attaches, and why a server
//! cannot have it.
//!
//! Two programs share one body (`agent-ebpf/src/send.rs`). The one on the
//! `syscalls` tracepoints of `sendto` and `write` runs only at those two
//! calls: the kernel tests the syscall's number before any program runs,
//! and an unrelated syscall on the host pays only the tracing path (81 ns
//! on the 6.18 of `benches/results/2026-12-05-bystanders.md`). The one on
//! the raw `sys_enter` tracepoint needs neither tracefs nor a perf event,
//! and runs at every syscall of every process on the host (228 ns each
//! there), so it is the fallback.
use std::path::Path;

use aya::{
    Ebpf,
    programs::{Program, ProgramError, RawTracePoint, TracePoint},
};
use sqlbee_kernel_abi::{ServerLayout, UNKNOWN};
use tracing::{info, warn};

use super::{
    ProbeConfig, ProbeError, StatementHook,
    programs::{
        Loaded, Refusal, SEND_PROGRAM, SEND_TRACEPOINT_PROGRAM, kernel_release, refusal_reason, refused_on_purpose,
    },
};
use crate::discover::BinaryInfo;

/// Where the fallback program attaches.
const SYSCALL_ENTRY: &str = "sys_enter";
/// The tracefs category and events of the tracepoint program: `sendto`
/// always, `write` when the client's socket can be told from files.
const SYSCALLS: &str = "syscalls";
const SENDTO: &str = "sys_enter_sendto";
const WRITE: &str = "sys_enter_write";

/// Which of the two programs a server got.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Via {
    Tracepoints,
    Raw,
}

impl Via {
    fn program(self) -> &'static str {
        match self {
            Via::Tracepoints => SEND_TRACEPOINT_PROGRAM,
            Via::Raw => SEND_PROGRAM,
        }
    }
}

/// The loaded send program of one server, and its links while attached.
pub(super) struct SendHook {
    via: Via,
    /// Also at `write` (TLS answers), with the tracepoint program.
    write: bool,
    links: Vec<SendLink>,
}

enum SendLink {
    Raw(aya::programs::raw_trace_point::RawTracePointLinkId),
    Tracepoint(aya::programs::trace_point::TracePointLinkId),
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
                Some(tracefs) => match load_one(ebpf, pid, Via::Tracepoints)? {
                    Ok(loaded) => {
                        info!(pid, tracefs = %tracefs.display(), write, "send hook at the sendto and write tracepoints");
                        return Ok((Self { via: Via::Tracepoints, write, links: Vec::new() }, loaded));
                    }
                    Err(refusal) => warn!(
                        pid,
                        kernel = kernel_release(),
                        reason = refusal.reason,
                        "the kernel refused the send hook's tracepoint program (it needs bpf_task_pt_regs, from \
                         5.15); falling back to the raw sys_enter tracepoint, which runs at every syscall on the host"
                    ),
                },
                None => warn!(
                    pid,
                    "no tracefs with syscall events here (not mounted, not readable, or a kernel \
                    without CONFIG_FTRACE_SYSCALLS): the send hook falls back to the raw sys_enter tracepoint, \
                    which runs at every syscall on the host"
                ),
            }
        }
        Ok((Self { via: Via::Raw, write, links: Vec::new() }, load_raw(ebpf, pid)?))
    }

    /// The loaded program's name.
    pub(super) fn program(&self) -> &'static str {
        self.via.program()
    }

    pub(super) fn attached(&self) -> bool {
        !self.links.is_empty()
    }

    /// Attaches unless attached. A tracepoint the kernel will not attach
    /// (a perf event it opens only for CAP_SYS_ADMIN, which the agent was
    /// not given) falls back to the raw program, loaded now: its record is
    /// returned, to replace the tracepoint program's among the loaded.
    pub(super) fn attach(&mut self, ebpf: &mut Ebpf, pid: u32) -> Result<Option<Loaded>, ProbeError> {
        if self.attached() {
            return Ok(None);
        }
        if self.via == Via::Tracepoints {
            match self.attach_tracepoints(ebpf, pid) {
                Ok(()) => return Ok(None),
                Err(e) => {
                    warn!(pid, error = %e, "the send hook's tracepoints did not attach; falling back to the raw \
                        sys_enter tracepoint, which runs at every syscall on the host");
                    let loaded = load_raw(ebpf, pid)?;
                    self.via = Via::Raw;
                    self.attach_raw(ebpf, pid)?;
                    return Ok(Some(loaded));
                }
            }
        }
        self.attach_raw(ebpf, pid)?;
        Ok(None)
    }

    fn attach_raw(&mut self, ebpf: &mut Ebpf, pid: u32) -> Result<(), ProbeError> {
        let link = program_as::<RawTracePoint>(ebpf, pid, SEND_PROGRAM)?.attach(SYSCALL_ENTRY).map_err(|source| {
            ProbeError::Attach {
                pid,
                program: SEND_PROGRAM,
                symbol: SYSCALL_ENTRY,
                binary: "the kernel".into(),
                source,
            }
        })?;
        self.links.push(SendLink::Raw(link));
        Ok(())
    }

    /// Both events or neither: `sendto` alone would count plain answers
    /// only.
    fn attach_tracepoints(&mut self, ebpf: &mut Ebpf, pid: u32) -> Result<(), ProbeError> {
        let program = SEND_TRACEPOINT_PROGRAM;
        for event in [SENDTO, WRITE].into_iter().take(if self.write { 2 } else { 1 }) {
            let attached = program_as::<TracePoint>(ebpf, pid, program)?.attach(SYSCALLS, event);
            match attached {
                Ok(link) => self.links.push(SendLink::Tracepoint(link)),
                Err(source) => {
                    if let Err(e) = self.detach(ebpf, pid) {
                        warn!(pid, error = %e, "detaching the send hook's first tracepoint failed");
                    }
                    return Err(ProbeError::Attach {
                        pid,
                        program,
                        symbol: event,
                        binary: "the kernel".into(),
                        source,
                    });
                }
            }
        }
        Ok(())
    }

    /// Detaches, waiting for the kernel to let go: each link taken is
    /// closed here, as a detach closes it. Every link is tried; the first
    /// error is returned.
    pub(super) fn detach(&mut self, ebpf: &mut Ebpf, pid: u32) -> Result<(), ProbeError> {
        let (taken, error) = self.take_links(ebpf, pid);
        drop(taken);
        error.map_or(Ok(()), Err)
    }

    /// The links, to be closed elsewhere (see
    /// `AttachedServer::detach_in_background`). Every link is tried; the
    /// first error is returned with what was taken.
    pub(super) fn take_links(&mut self, ebpf: &mut Ebpf, pid: u32) -> (Vec<Box<dyn Send>>, Option<ProbeError>) {
        let program = self.program();
        let mut taken: Vec<Box<dyn Send>> = Vec::new();
        let mut first_error = None;
        for link in std::mem::take(&mut self.links) {
            let link: Result<Box<dyn Send>, ProbeError> = match link {
                SendLink::Raw(link) => program_as::<RawTracePoint>(ebpf, pid, program).and_then(|p| {
                    p.take_link(link).map(|l| Box::new(l) as Box<dyn Send>).map_err(|source| ProbeError::Program {
                        pid,
                        program,
                        source,
                    })
                }),
                SendLink::Tracepoint(link) => program_as::<TracePoint>(ebpf, pid, program).and_then(|p| {
                    p.take_link(link).map(|l| Box::new(l) as Box<dyn Send>).map_err(|source| ProbeError::Program {
                        pid,
                        program,
                        source,
                    })
                }),
            };
            match link {
                Ok(link) => taken.push(link),
                Err(e) => {
                    first_error.get_or_insert(e);
                }
            }
        }
        (taken, first_error)
    }
}

/// Whether the send hook can use the syscall tracepoints here (tracefs
/// with their events, readable), so that it will open perf events.
pub fn syscall_tracepoints_available() -> bool {
    syscall_events().is_some()
}

/// The tracefs that has the syscall events, if one is mounted where the
/// loader looks.
fn syscall_events() -> Option<&'static Path> {
    [Path::new("/sys/kernel/tracing"), Path::new("/sys/kernel/debug/tracing")]
        .into_iter()
        .find(|tracefs| std::fs::read_to_string(tracefs.join("events").join(SYSCALLS).join(SENDTO).join("id")).is_ok())
}

/// Loads `via`'s program, timing the verifier; the inner error is the
/// kernel's refusal.
fn load_one(ebpf: &mut Ebpf, pid: u32, via: Via) -> Result<Result<Loaded, Refusal>, ProbeError> {
    let program = via.program();
    // The tracepoint program has a fallback, so the tests can refuse it.
    if via == Via::Tracepoints && refused_on_purpose(program) {
        return Ok(Err(Refusal { reason: "refused on purpose (SQLBEE_TEST_REFUSE_PROGRAMS)".into(), source: None }));
    }
    let started = std::time::Instant::now();
    let outcome = match via {
        Via::Raw => program_as::<RawTracePoint>(ebpf, pid, program)?.load(),
        Via::Tracepoints => program_as::<TracePoint>(ebpf, pid, program)?.load(),
    };
    match outcome {
        Ok(()) => {
            let info = ebpf.program(program).and_then(|p| p.info().ok());
            Ok(Ok(Loaded {
                program,
                verified_insns: info.and_then(|info| info.verified_instruction_count()),
                load_time: started.elapsed(),
            }))
        }
        Err(source) => Ok(Err(Refusal { reason: refusal_reason(&source), source: Some(source) })),
    }
}

/// Loads the raw program, which the server then needs as it needs the
/// uprobe's otherwise: a refusal is the error.
fn load_raw(ebpf: &mut Ebpf, pid: u32) -> Result<Loaded, ProbeError> {
    load_one(ebpf, pid, Via::Raw)?.map_err(|refusal| ProbeError::Refused {
        pid,
        program: SEND_PROGRAM,
        kernel: kernel_release(),
        reason: refusal.reason,
        source: refusal.source,
    })
}

/// The object's program `name` as its type `T`.
fn program_as<'a, T>(ebpf: &'a mut Ebpf, pid: u32, name: &'static str) -> Result<&'a mut T, ProbeError>
where
    &'a mut T: TryFrom<&'a mut Program, Error = ProgramError>,
{
    ebpf.program_mut(name)
        .ok_or_else(|| ProbeError::Map { map: name, detail: "program not in object".into() })?
        .try_into()
        .map_err(|source| ProbeError::Program { pid, program: name, source })
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
