//! Where statements wait. MariaDB (and MySQL) call `thd_wait_begin(THD*,
//! int wait_type)` and `thd_wait_end(THD*)` around row-lock, metadata-lock
//! and table-lock waits, disk I/O, commit and more; these probes run only
//! when a thread actually waits, so a statement that never waits pays
//! nothing for them.
use agent_common::wait_class;
use aya_ebpf::{
    helpers::{bpf_get_current_pid_tgid, bpf_ktime_get_ns},
    macros::uprobe,
    programs::ProbeContext,
};

use crate::maps::inflight_slot;

/// Waits nest (a disk read inside a lock wait); only the outermost is timed,
/// so no time is counted twice. Deeper nesting than this is ignored.
const MAX_DEPTH: u32 = 8;

#[uprobe]
pub fn wait_begin(ctx: ProbeContext) -> u32 {
    let wait_type: u64 = ctx.arg(1).unwrap_or(0);
    let tid = bpf_get_current_pid_tgid() as u32;
    let Some(slot) = inflight_slot(tid) else { return 0 };
    // SAFETY: the slot points into the array map's value for this index.
    let inflight = unsafe { &mut *slot };
    if inflight.tid != tid || inflight.start_ns == 0 || inflight.wait_depth >= MAX_DEPTH {
        return 0;
    }
    if inflight.wait_depth == 0 {
        inflight.wait_start_ns = unsafe { bpf_ktime_get_ns() };
        inflight.wait_class = wait_class::of(wait_type) as u64;
    }
    inflight.wait_depth += 1;
    0
}

#[uprobe]
pub fn wait_end(_ctx: ProbeContext) -> u32 {
    let tid = bpf_get_current_pid_tgid() as u32;
    let Some(slot) = inflight_slot(tid) else { return 0 };
    // SAFETY: as above.
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
    }
    0
}
