//! Statement ends at the server's answer, with no trap in the server
//! (`--statement-hook send`).
//!
//! A uprobe costs mysqld a breakpoint trap per statement, which on the VMs
//! of `benches/results` is about what performance_schema costs in all. The
//! raw tracepoint at syscall entry runs in the kernel's own path instead.
//! One answer leaves mysqld per statement (`sendto`, or `write` under TLS),
//! and the statement's diagnostics area is final (OK, EOF or error) only at
//! the send that ends it: the sends inside a large result find it empty,
//! and an answer to a statement preparation finds it disabled. The THD is
//! the thread's `THR_THD`, a thread-local read through the task's thread
//! pointer, which the thread pool's workers set as connection threads do.
//! The program runs at every syscall of every process on the host, so its
//! first two tests (the syscall, then the process) turn nearly every run
//! away at the price of a load and one helper call.
use aya_ebpf::{
    bindings::pt_regs,
    helpers::{bpf_get_current_pid_tgid, bpf_probe_read_kernel, bpf_probe_read_user},
    macros::raw_tracepoint,
    programs::RawTracePointContext,
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

#[raw_tracepoint(tracepoint = "sys_enter")]
pub fn statement_send(ctx: RawTracePointContext) -> i32 {
    let _ = try_statement_send(&ctx);
    0
}

fn try_statement_send(ctx: &RawTracePointContext) -> Result<(), i64> {
    let layout = layout();
    // The syscall first: a load from the context, where the process test
    // is a helper call, and most syscalls of every process are neither.
    let syscall: u64 = ctx.arg(1);
    if syscall != SYS_SENDTO && (syscall != SYS_WRITE || layout.send_vio_offset == UNKNOWN) {
        return Ok(());
    }
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
    let regs: *const pt_regs = ctx.arg(0);
    // A connection thread also writes files (the slow log after the
    // answer, the binary log before it): only its client's socket counts.
    if syscall == SYS_WRITE {
        let fd = unsafe { bpf_probe_read_kernel(&raw const (*regs).rdi) }.unwrap_or(u64::MAX);
        let vio = unsafe { bpf_probe_read_user((thd + layout.send_vio_offset as u64) as *const u64) }.unwrap_or(0);
        if vio == 0 {
            return Ok(());
        }
        let socket = unsafe { bpf_probe_read_user(vio as *const i32) }.unwrap_or(-1);
        if socket < 0 || fd != socket as u64 {
            return Ok(());
        }
    }
    // SAFETY: the user registers the syscall entered with, read through
    // the helper.
    end_statement::<true>(thd, || unsafe { bpf_probe_read_kernel(&raw const (*regs).rsp) }.unwrap_or(0))
}
