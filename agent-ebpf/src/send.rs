//! Statement ends at the server's answer, with no trap in the server
//! (`--statement-hook send`).
//!
//! A uprobe costs mysqld a breakpoint trap per statement, which on the VMs
//! of `benches/results` is about what performance_schema costs in all. A
//! tracepoint at syscall entry runs in the kernel's own path instead. One
//! answer leaves mysqld per statement (`sendto`, or `write` under TLS),
//! and the statement's diagnostics area is final (OK, EOF or error) only at
//! the send that ends it: the sends inside a large result find it empty,
//! and an answer to a statement preparation finds it disabled. The THD is
//! the thread's `THR_THD`, a thread-local read through the task's thread
//! pointer, which the thread pool's workers set as connection threads do.
//!
//! Two programs reach the same body. `sendto_or_write` sits on the
//! `syscalls` tracepoints of those two calls, where the kernel picks the
//! syscall before any program runs. `statement_send` sits on the raw
//! `sys_enter` tracepoint, which needs no tracefs but runs at every
//! syscall of every process on the host, so its first two tests (the
//! syscall, then the process) turn nearly every run away.
//!
//! One gap the raw program does not have: the kernel skips a tracepoint's
//! programs on a CPU where another BPF program, or a map read or update
//! through the `bpf` call, is in progress (`bpf_prog_active`), and a
//! statement answered there is not seen. From 6.7 the kernel counts such
//! skips in the program's `recursion_misses`.
use aya_ebpf::{
    EbpfContext,
    bindings::pt_regs,
    helpers::{
        bpf_get_current_pid_tgid, bpf_probe_read_kernel, bpf_probe_read_user,
        generated::{bpf_get_current_task_btf, bpf_task_pt_regs},
    },
    macros::{raw_tracepoint, tracepoint},
    programs::{RawTracePointContext, TracePointContext},
};
use sqlbee_kernel_abi::UNKNOWN;

use crate::{layout::layout, maps::gate_closed, query_stats::task_u64, statements::end_statement};

/// x86-64 syscall numbers: mariadbd answers a plain connection with
/// `sendto` and a TLS one with `write` (OpenSSL's socket BIO).
const SYS_WRITE: u64 = 1;
const SYS_SENDTO: u64 = 44;

/// `enum_diagnostics_status` of MariaDB: `DA_OK` through `DA_ERROR` end a
/// statement (`DA_EMPTY` 0 and `DA_DISABLED` 6 do not).
const DA_OK: u32 = 1;
const DA_ERROR: u32 = 5;

/// Where a `syscalls:sys_enter_*` record keeps the syscall's number and
/// its first argument (the tracepoints' `format` files: after the 8-byte
/// common header, `__syscall_nr`, then `args[]` from 16).
const TP_SYSCALL_NR: usize = 8;
const TP_FIRST_ARG: usize = 16;

#[tracepoint]
pub fn sendto_or_write(ctx: TracePointContext) -> u32 {
    // SAFETY: loads of the record at the fixed offsets of its format; the
    // kernel checks the program's reads against the event's record size
    // when it attaches it.
    let syscall = unsafe { *(ctx.as_ptr().add(TP_SYSCALL_NR) as *const i32) } as u64;
    let fd = || unsafe { *(ctx.as_ptr().add(TP_FIRST_ARG) as *const u64) };
    // The record holds no user registers; the task's own do.
    let user_sp = || {
        let regs = unsafe { bpf_task_pt_regs(bpf_get_current_task_btf()) } as *const pt_regs;
        unsafe { bpf_probe_read_kernel(&raw const (*regs).rsp) }.unwrap_or(0)
    };
    let _ = answer(syscall, fd, user_sp);
    // The macro's wrapper returns 0, which keeps the record out of the
    // perf event's buffer.
    0
}

#[raw_tracepoint(tracepoint = "sys_enter")]
pub fn statement_send(ctx: RawTracePointContext) -> i32 {
    // The syscall first: a load from the context, where the process test
    // is a helper call, and most syscalls of every process are neither.
    let syscall: u64 = ctx.arg(1);
    if syscall != SYS_SENDTO && (syscall != SYS_WRITE || layout().send_vio_offset == UNKNOWN) {
        return 0;
    }
    let regs: *const pt_regs = ctx.arg(0);
    // SAFETY: the user registers the syscall entered with, read through
    // the helper.
    let fd = || unsafe { bpf_probe_read_kernel(&raw const (*regs).rdi) }.unwrap_or(u64::MAX);
    let user_sp = || unsafe { bpf_probe_read_kernel(&raw const (*regs).rsp) }.unwrap_or(0);
    let _ = answer(syscall, fd, user_sp);
    0
}

/// The statement a traced server thread answers with `syscall` (on the
/// descriptor `fd`) ends here, if the answer is a statement's last.
#[inline(always)]
fn answer(syscall: u64, fd: impl Fn() -> u64, user_sp: impl Fn() -> u64) -> Result<(), i64> {
    let layout = layout();
    if (bpf_get_current_pid_tgid() >> 32) as u32 != layout.send_tgid || layout.send_tgid == 0 {
        return Ok(());
    }
    if gate_closed() {
        return Ok(());
    }
    let fsbase = task_u64(layout, layout.task_fsbase_offset);
    if fsbase == 0 {
        return Ok(());
    }
    let thd = unsafe { bpf_probe_read_user((fsbase - layout.thd_tls_offset as u64) as *const u64) }.unwrap_or(0);
    if thd == 0 {
        return Ok(());
    }
    let da = unsafe { bpf_probe_read_user((thd + layout.stmt_da_offset as u64) as *const u64) }.unwrap_or(0);
    if da == 0 {
        return Ok(());
    }
    let status = unsafe { bpf_probe_read_user((da + layout.da_status_offset as u64) as *const u32) }.unwrap_or(0);
    if !(DA_OK..=DA_ERROR).contains(&status) {
        return Ok(());
    }
    // A connection thread also writes files (the slow log after the
    // answer, the binary log before it): only its client's socket counts.
    if syscall == SYS_WRITE {
        if layout.send_vio_offset == UNKNOWN {
            return Ok(());
        }
        let vio = unsafe { bpf_probe_read_user((thd + layout.send_vio_offset as u64) as *const u64) }.unwrap_or(0);
        if vio == 0 {
            return Ok(());
        }
        let socket = unsafe { bpf_probe_read_user(vio as *const i32) }.unwrap_or(-1);
        if socket < 0 || fd() != socket as u64 {
            return Ok(());
        }
    }
    end_statement::<true>(thd, user_sp)
}
