//! The server's own per-statement figures (rows, temporary tables, sort
//! passes, index use: what its slow log writes) and the thread's CPU time,
//! read at the statement end the program already traps.
//!
//! The THD keeps the counters within a few hundred bytes of each other, so
//! they come with one copy of `ServerLayout::stats_len` bytes; a field a
//! build keeps farther away is copied on its own (see
//! `sqlbee_kernel_abi::thd_field`, which also decodes them). CPU time is
//! the kernel's own per-task runtime (`se.sum_exec_runtime`, at an offset
//! the agent took from the kernel's BTF): a connection thread idles between
//! statements, so the runtime it gained since its previous statement end
//! is this statement's. Nothing here is a second trap.
use aya_ebpf::helpers::{
    bpf_get_current_task, bpf_probe_read_kernel, bpf_probe_read_user_buf, generated::bpf_get_current_task_btf,
};
use sqlbee_kernel_abi::{
    EventBuffer, Inflight, MAX_ALONE, STATS_WINDOW, ServerLayout, StatementStats, UNKNOWN, alone_copy, decode, source,
    stat, statement_flag as bit, thd_field,
};

use crate::maps::bump_stat;

/// Copies the fields this build lets the program read (the shared window
/// in one read, each other one on its own) and reads this build's
/// counters out of them into the record's `stats`, and the connection id
/// and the source (the replica's applier, the event scheduler) into its
/// header and the query id into the buffer (0 when unknown). A failed
/// copy leaves what it held unknown and is counted; it never takes the
/// other fields with it.
#[inline(always)]
pub fn read(thd: u64, layout: &ServerLayout, buffer: &mut EventBuffer) {
    buffer.header.connection_id = 0;
    buffer.header.source = source::CLIENT;
    buffer.query_id = 0;
    let mut fields = layout.stats_fields;
    if fields == 0 {
        return;
    }
    let shared = fields & !layout.stats_alone;
    if shared != 0 {
        let n = layout.stats_len as usize & (STATS_WINDOW * 2 - 1);
        // SAFETY: the first `n` bytes of the window array (`n <= STATS_WINDOW`).
        let copied = n <= STATS_WINDOW && {
            let bytes = unsafe { core::slice::from_raw_parts_mut(buffer.window.as_mut_ptr() as *mut u8, n) };
            unsafe { bpf_probe_read_user_buf((thd + layout.stats_base as u64) as *const u8, bytes) }.is_ok()
        };
        if !copied {
            bump_stat(stat::READ_FAILED);
            fields &= !shared;
        }
    }
    // The layout is a constant to the verifier: on a build whose fields
    // all fit the shared window, none of these copies is even loaded.
    fields = copy_alone(thd, layout, buffer, fields, thd_field::ROWS_SENT);
    fields = copy_alone(thd, layout, buffer, fields, thd_field::ROWS_EXAMINED);
    fields = copy_alone(thd, layout, buffer, fields, thd_field::ROWS_AFFECTED);
    fields = copy_alone(thd, layout, buffer, fields, thd_field::PLAN);
    fields = copy_alone(thd, layout, buffer, fields, thd_field::SERVER_STATUS);
    fields = copy_alone(thd, layout, buffer, fields, thd_field::CONNECTION_ID);
    fields = copy_alone(thd, layout, buffer, fields, thd_field::SYSTEM_THREAD);
    fields = copy_alone(thd, layout, buffer, fields, thd_field::QUERY_ID);
    let identity = decode(&buffer.window, layout, fields, &mut buffer.header.stats);
    buffer.header.connection_id = identity.connection_id;
    buffer.header.source = identity.source;
    buffer.query_id = identity.query_id;
}

/// Copies `field` on its own when the layout says so, into its slot after
/// the shared window; returns `fields` without its bit when that failed.
#[inline(always)]
fn copy_alone(thd: u64, layout: &ServerLayout, buffer: &mut EventBuffer, fields: u32, field: usize) -> u32 {
    let Some(copy) = alone_copy(layout, field) else { return fields };
    if fields & (1 << field) == 0 {
        return fields;
    }
    let (to, len) = (copy.to as usize, copy.len as usize);
    // SAFETY: `len` bytes of the window array from `to`, both checked
    // against its end here (the agent placed them so).
    let copied = to % 8 == 0 && len <= MAX_ALONE as usize && to <= STATS_WINDOW - MAX_ALONE as usize && {
        let bytes = unsafe {
            core::slice::from_raw_parts_mut((buffer.window.as_mut_ptr() as *mut u8).add(to & (STATS_WINDOW - 1)), len)
        };
        unsafe { bpf_probe_read_user_buf((thd + copy.from as u64) as *const u8, bytes) }.is_ok()
    };
    if copied {
        fields
    } else {
        bump_stat(stat::READ_FAILED);
        fields & !(1 << field)
    }
}

/// The current thread's on-CPU time so far (ns), 0 when unknown. Through
/// the task's BTF pointer it is one load; through `bpf_probe_read_kernel`
/// (kernels before 5.11) a helper call, about 0.1 us dearer per statement
/// on the VM of `benches/results`.
#[inline(always)]
pub fn runtime(layout: &ServerLayout) -> u64 {
    task_u64(layout, layout.task_runtime_offset)
}

/// A u64 field of the current task at `offset` (from the kernel's BTF); 0
/// when the offset is not known or the read fails.
#[inline(always)]
pub fn task_u64(layout: &ServerLayout, offset: u32) -> u64 {
    if offset == 0 || offset == UNKNOWN {
        return 0;
    }
    if layout.task_btf != 0 {
        // SAFETY: a trusted pointer to the current task; the verifier checks
        // the load (the offset is a constant to it) against the kernel's BTF
        // of `task_struct`, and a fault reads 0 instead of faulting.
        let task = unsafe { bpf_get_current_task_btf() } as *const u8;
        return unsafe { core::ptr::read_volatile(task.add(offset as usize) as *const u64) };
    }
    let task = unsafe { bpf_get_current_task() };
    if task == 0 {
        return 0;
    }
    // SAFETY: a read of kernel memory through the helper, which fails
    // cleanly on a bad address.
    unsafe { bpf_probe_read_kernel((task + offset as u64) as *const u64) }.unwrap_or(0)
}

/// The thread's CPU time since its previous statement end, into `stats`
/// (flagged `CPU_MEASURED` when measured), and the mark for the next one. The
/// first statement a thread ends after the probes attach has no mark yet.
#[inline(always)]
pub fn cpu(layout: &ServerLayout, inflight: &mut Inflight, stats: &mut StatementStats) {
    let runtime = runtime(layout);
    if runtime == 0 {
        return;
    }
    let mark = inflight.cpu_mark_ns;
    inflight.cpu_mark_ns = runtime;
    if mark != 0 && runtime >= mark {
        stats.cpu_ns = runtime - mark;
        stats.flags |= bit::CPU_MEASURED;
    }
}
