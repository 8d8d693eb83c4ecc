//! Where statements wait. MariaDB (and MySQL) call `thd_wait_begin(THD*,
//! int wait_type)` and `thd_wait_end(THD*)` around row-lock, metadata-lock
//! and table-lock waits, disk I/O, commit and more; these probes run only
//! when a thread actually waits, so a statement that never waits pays
//! nothing for them.
use aya_ebpf::{
    bindings::BPF_RB_NO_WAKEUP,
    helpers::{bpf_get_current_pid_tgid, bpf_ktime_get_ns, bpf_probe_read_user},
    programs::ProbeContext,
};
use sqlbee_kernel_abi::{LongWait, wait_class};

use crate::{
    layout::layout,
    maps::{LONG_WAITS, inflight_slot},
    statements::owned_slot,
};

/// Waits nest (a disk read inside a lock wait); only the outermost is timed,
/// so no time is counted twice. Deeper nesting than this is ignored.
const MAX_DEPTH: u32 = 8;

uprobe_pair! {
    wait_begin, wait_begin_perf => on_wait_begin;
    wait_end, wait_end_perf => on_wait_end;
}

#[inline(always)]
fn on_wait_begin(ctx: ProbeContext) -> u32 {
    let thd: u64 = ctx.arg(0).unwrap_or(0);
    let wait_type: u64 = ctx.arg(1).unwrap_or(0);
    let tid = bpf_get_current_pid_tgid() as u32;
    let Some(inflight) = owned_slot(tid) else { return 0 };
    if inflight.wait_depth >= MAX_DEPTH {
        return 0;
    }
    if inflight.wait_depth == 0 {
        // The server passes NULL for "the current THD".
        let thd = if thd != 0 { thd } else { inflight.thd };
        if thd == 0 {
            return 0;
        }
        inflight.thd = thd;
        // Waits belong to the statement that began at `start_utime`; a
        // connection idling for its next command still shows the previous
        // statement's start, so its wait never reaches the next statement.
        let epoch =
            unsafe { bpf_probe_read_user((thd + layout().start_utime_offset as u64) as *const u64) }.unwrap_or(0);
        let class = wait_class::of(wait_type);
        if class == wait_class::NETWORK && epoch == inflight.ended_epoch_us {
            return 0;
        }
        if epoch != inflight.waits_epoch_us {
            inflight.waits = [0; wait_class::COUNT];
            inflight.waits_epoch_us = epoch;
        }
        inflight.wait_start_ns = unsafe { bpf_ktime_get_ns() };
        inflight.wait_class = class as u32;
    }
    inflight.wait_depth += 1;
    0
}

#[inline(always)]
fn on_wait_end(_ctx: ProbeContext) -> u32 {
    let tid = bpf_get_current_pid_tgid() as u32;
    let Some(slot) = inflight_slot(tid) else { return 0 };
    // SAFETY: the slot points into the array map's value for this index.
    let inflight = unsafe { &mut *slot };
    if inflight.tid != tid || inflight.wait_depth == 0 {
        return 0;
    }
    inflight.wait_depth -= 1;
    if inflight.wait_depth == 0 {
        let waited = unsafe { bpf_ktime_get_ns() }.saturating_sub(inflight.wait_start_ns);
        let class = inflight.wait_class as usize;
        if class < wait_class::COUNT {
            inflight.waits[class] += waited;
        }
        let layout = layout();
        if layout.long_wait_us != 0 && waited >= layout.long_wait_us as u64 * 1000 {
            report_long_wait(inflight, tid, waited, layout.connection_id_offset);
        }
    }
    0
}

/// Writes one record for a long wait; a full ring loses the record only
/// (the per-class totals above stay exact).
fn report_long_wait(inflight: &sqlbee_kernel_abi::Inflight, tid: u32, waited: u64, connection_id_offset: u32) {
    let connection_id =
        unsafe { bpf_probe_read_user((inflight.thd + connection_id_offset as u64) as *const u64) }.unwrap_or(0);
    if let Some(mut entry) = LONG_WAITS.reserve::<LongWait>(0) {
        entry.write(LongWait {
            tid,
            class: inflight.wait_class,
            thd: inflight.thd,
            connection_id,
            wait_start_ns: inflight.wait_start_ns,
            duration_ns: waited,
            statement_start_ns: inflight.waits_epoch_us * 1000,
        });
        entry.submit(BPF_RB_NO_WAKEUP as u64);
    }
}
