//! The server's own per-statement figures (rows, temporary tables, sort
//! passes, index use: what its slow log writes) and the thread's CPU time,
//! read at the statement end the program already traps.
//!
//! The THD keeps the counters within a few hundred bytes of each other, so
//! they come with one copy of `ServerLayout::stats_len` bytes. CPU time is
//! the kernel's own per-task runtime (`se.sum_exec_runtime`, at an offset
//! the agent took from the kernel's BTF): a connection thread idles between
//! statements, so the runtime it gained since its previous statement end
//! is this statement's. Nothing here is a second trap.
use aya_ebpf::helpers::{
    bpf_get_current_task, bpf_probe_read_kernel, bpf_probe_read_user_buf, generated::bpf_get_current_task_btf,
};
use sqlbee_kernel_abi::{
    EventBuffer, Inflight, STATS_WINDOW, ServerLayout, StatementStats, UNKNOWN, plan, server_status, source, stat,
    statement_flag as bit, stats_field,
};

use crate::maps::bump_stat;

const WORDS: usize = STATS_WINDOW / 8;

/// Copies the window and reads this build's counters out of it into the
/// record's `stats`, and the connection id and the source (the replica's
/// applier, the event scheduler) into its header and the query id into
/// the buffer when the window holds them (0 otherwise). A failed copy
/// leaves them 0 and is counted.
#[inline(always)]
pub fn read(thd: u64, layout: &ServerLayout, buffer: &mut EventBuffer) {
    buffer.header.connection_id = 0;
    buffer.header.source = source::CLIENT;
    buffer.query_id = 0;
    let fields = layout.stats_fields;
    if fields == 0 {
        return;
    }
    let n = layout.stats_len as usize & (STATS_WINDOW * 2 - 1);
    // SAFETY: the first `n` bytes of the window array (`n <= STATS_WINDOW`).
    let copied = n <= STATS_WINDOW && {
        let bytes = unsafe { core::slice::from_raw_parts_mut(buffer.window.as_mut_ptr() as *mut u8, n) };
        unsafe { bpf_probe_read_user_buf((thd + layout.stats_base as u64) as *const u8, bytes) }.is_ok()
    };
    if !copied {
        bump_stat(stat::READ_FAILED);
        return;
    }
    let window = &buffer.window;
    let stats = &mut buffer.header.stats;
    // The agent checked every offset against the window; the masks restate
    // that for the verifier.
    let word = |rel: u32| window[(rel as usize / 8) & (WORDS - 1)];
    if fields & stats_field::ROWS_SENT != 0 {
        stats.rows_sent = word(layout.rows_sent_rel);
    }
    if fields & stats_field::ROWS_EXAMINED != 0 {
        stats.rows_examined = word(layout.rows_examined_rel);
    }
    if fields & stats_field::ROWS_AFFECTED != 0 {
        stats.rows_affected = word(layout.rows_affected_rel);
    }
    // Counters a statement cannot push past u32 are kept as u32.
    if fields & stats_field::PLAN != 0 {
        let flags = word(layout.plan_flags_rel);
        stats.sort_merge_passes = word(layout.plan_flags_rel + 8) as u32;
        stats.tmp_tables = word(layout.plan_flags_rel + 16) as u32;
        stats.tmp_disk_tables = word(layout.plan_flags_rel + 24) as u32;
        for (plan_bit, flag) in [
            (plan::FULL_JOIN, bit::SELECT_FULL_JOIN),
            (plan::FULL_SCAN, bit::SELECT_SCAN),
            (plan::FILESORT, bit::FILESORT),
            (plan::FILESORT_DISK, bit::FILESORT_ON_DISK),
        ] {
            if flags & plan_bit != 0 {
                stats.flags |= flag;
            }
        }
    }
    if fields & stats_field::SERVER_STATUS != 0 {
        let rel = layout.server_status_rel;
        // A u32, in the low or the high half of its word (little-endian).
        let status = (word(rel) >> ((rel % 8) * 8)) as u32;
        if status & server_status::NO_INDEX_USED != 0 {
            stats.flags |= bit::NO_INDEX_USED;
        }
        if status & server_status::NO_GOOD_INDEX_USED != 0 {
            stats.flags |= bit::NO_GOOD_INDEX_USED;
        }
    }
    let connection = if fields & stats_field::CONNECTION_ID != 0 { word(layout.connection_id_rel) } else { 0 };
    let system_thread = if fields & stats_field::SYSTEM_THREAD != 0 {
        let rel = layout.system_thread_rel;
        (word(rel) >> ((rel % 8) * 8)) as u32
    } else {
        0
    };
    let query_id = if fields & stats_field::QUERY_ID != 0 { word(layout.query_id_rel) } else { 0 };
    buffer.header.connection_id = connection;
    buffer.header.source = match system_thread {
        source::SYSTEM_THREAD_SLAVE_SQL => source::REPLICA,
        source::SYSTEM_THREAD_EVENT_WORKER => source::EVENT,
        _ => source::CLIENT,
    };
    buffer.query_id = query_id;
}

/// The current thread's on-CPU time so far (ns), 0 when unknown. Through
/// the task's BTF pointer it is one load; through `bpf_probe_read_kernel`
/// (kernels before 5.11) a helper call, about 0.1 us dearer per statement
/// on the VM of `benches/results`.
#[inline(always)]
pub fn runtime(layout: &ServerLayout) -> u64 {
    let offset = layout.task_runtime_offset;
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
