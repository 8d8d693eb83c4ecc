//! Errors sent to clients. `my_message_sql(uint code, const char*, myf)` is
//! the one funnel for every error the server reports; it runs only when
//! something failed, so it costs nothing on the statement path.
use aya_ebpf::{helpers::bpf_get_current_pid_tgid, macros::uprobe, programs::ProbeContext};

use crate::maps::{STATS, bump, inflight_slot};

/// `ME_ERROR_LOG_ONLY`, `ME_NOTE` and `ME_WARNING` (MariaDB `my_sys.h`): these
/// never reach the client as the statement's error.
const NOT_AN_ERROR: u64 = 128 | 1024 | 2048;

#[uprobe]
pub fn error_raised(ctx: ProbeContext) -> u32 {
    let code: u32 = ctx.arg(0).unwrap_or(0);
    let my_flags: u64 = ctx.arg(2).unwrap_or(0);
    if code == 0 || my_flags & NOT_AN_ERROR != 0 {
        return 0;
    }
    let tid = bpf_get_current_pid_tgid() as u32;
    if let Some(inflight) = inflight_slot(tid) {
        // Keep the first error: later ones are usually consequences of it.
        unsafe {
            if (*inflight).tid == tid && (*inflight).error_code == 0 {
                (*inflight).error_code = code;
                bump(&STATS, agent_common::stat::ERRORS);
            }
        }
    }
    0
}
