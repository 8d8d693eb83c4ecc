//! Errors sent to clients. `my_message_sql(uint code, const char*, myf)` is
//! the one funnel for every error the server reports; it runs only when
//! something failed, so it costs nothing on the statement path.
use aya_ebpf::{
    bindings::BPF_RB_NO_WAKEUP,
    helpers::{bpf_get_current_pid_tgid, bpf_ktime_get_ns, bpf_probe_read_user, bpf_probe_read_user_str_bytes},
    programs::ProbeContext,
};
use sqlbee_kernel_abi::{ErrorSample, MAX_ERROR_MESSAGE};

use crate::{
    layout::layout,
    maps::{ERRORS, bump_stat},
    statements::owned_slot,
};

/// `ME_ERROR_LOG_ONLY`, `ME_NOTE` and `ME_WARNING` (MariaDB `my_sys.h`): these
/// never reach the client as the statement's error.
const NOT_AN_ERROR: u64 = 128 | 1024 | 2048;

uprobe_pair! {
    error_raised, error_raised_perf => on_error_raised;
}

#[inline(always)]
fn on_error_raised(ctx: ProbeContext) -> u32 {
    let code: u32 = ctx.arg(0).unwrap_or(0);
    let my_flags: u64 = ctx.arg(2).unwrap_or(0);
    if code == 0 || my_flags & NOT_AN_ERROR != 0 {
        return 0;
    }
    let now = unsafe { bpf_ktime_get_ns() };
    let tid = bpf_get_current_pid_tgid() as u32;
    let Some(inflight) = owned_slot(tid) else { return 0 };
    // Keep the first error of a statement: later ones are usually its
    // consequences. An error from before this statement began (a command
    // that failed before any statement ended) is stale and replaced.
    if inflight.error_code != 0 && inflight.thd != 0 {
        let layout = layout();
        let start_us = unsafe { bpf_probe_read_user((inflight.thd + layout.start_utime_offset as u64) as *const u64) }
            .unwrap_or(0);
        if inflight.error_ns >= start_us * 1000 {
            return 0;
        }
    }
    inflight.error_code = code;
    inflight.error_ns = now;
    bump_stat(sqlbee_kernel_abi::stat::ERRORS);
    sample(&ctx, tid, code, inflight.thd, now);
    0
}

/// Copies the message into the ERRORS ring (dropped silently when full:
/// the count above stays exact, only the sample text is lost).
fn sample(ctx: &ProbeContext, tid: u32, code: u32, thd: u64, raised_ns: u64) {
    let message: u64 = ctx.arg(1).unwrap_or(0);
    if let Some(mut entry) = ERRORS.reserve::<ErrorSample>(0) {
        let sample = entry.as_mut_ptr();
        // SAFETY: the reservation is sized for one ErrorSample.
        unsafe {
            (*sample).tid = tid;
            (*sample).code = code;
            (*sample).thd = thd;
            (*sample).raised_ns = raised_ns;
            (*sample).message[0] = 0;
            if message != 0 {
                let dest: &mut [u8; MAX_ERROR_MESSAGE] = &mut (*sample).message;
                let _ = bpf_probe_read_user_str_bytes(message as *const u8, dest);
            }
        }
        entry.submit(BPF_RB_NO_WAKEUP as u64);
    }
}
