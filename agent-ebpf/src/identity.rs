//! The statement's connection id and source where the counters' window is
//! not read (`ServerLayout::identity_apart`, the lean tier). In MariaDB
//! 10.11 both sit at the end of that window, on a page of the THD no other
//! read of the statement path touches, and they do not change while a THD
//! lives. So a thread keeps them with the THD, the thread's start and the
//! server's login count they were read under, and reads them again when
//! one of those changes: a new connection can get a freed THD's address,
//! but logs in first (on any thread, hence a count for the whole server),
//! and a thread id can come back for a new thread.
use aya_ebpf::helpers::bpf_probe_read_user;
use sqlbee_kernel_abi::{CONTROL_LOGINS, EventBuffer, Inflight, ServerLayout, UNKNOWN, identity::IN_WINDOW, source};

use crate::{kernel_digests::CONTROL, query_stats::task_u64, statements::read_thd_u64};

/// The connection id and source into the record's header, from the
/// thread's cache or read apart. Nothing to do where the window has them.
#[inline(always)]
pub fn read(thd: u64, layout: &ServerLayout, inflight: &mut Inflight, buffer: &mut EventBuffer) {
    if layout.identity_apart == IN_WINDOW {
        return;
    }
    let cached = layout.task_start_offset != 0;
    // Read before the THD: a login after this read makes the next
    // statement read again.
    let logins = if cached { logins() } else { 0 };
    let task_start = if cached { task_u64(layout, layout.task_start_offset) } else { 0 };
    if task_start != 0
        && inflight.identity_thd == thd
        && inflight.identity_task_start == task_start
        && inflight.identity_logins == logins
    {
        buffer.header.connection_id = inflight.identity_connection;
        buffer.header.source = inflight.identity_source;
        return;
    }
    let connection = read_thd_u64(thd, layout.connection_id_offset);
    let system_thread = if layout.system_thread_offset == UNKNOWN {
        0
    } else {
        unsafe { bpf_probe_read_user((thd + layout.system_thread_offset as u64) as *const u32) }.unwrap_or(0)
    };
    let source = source::of_system_thread(system_thread);
    buffer.header.connection_id = connection;
    buffer.header.source = source;
    // A failed read (connection 0) is not kept: the next statement tries again.
    if task_start != 0 && connection != 0 {
        inflight.identity_thd = thd;
        inflight.identity_task_start = task_start;
        inflight.identity_logins = logins;
        inflight.identity_connection = connection;
        inflight.identity_source = source;
    }
}

#[inline(always)]
fn logins() -> u32 {
    CONTROL.get(CONTROL_LOGINS).copied().unwrap_or(0)
}

/// A login on any thread: every thread reads its identity again.
#[inline(always)]
pub fn count_login() {
    if let Some(count) = CONTROL.get_ptr_mut(CONTROL_LOGINS) {
        // SAFETY: a valid map value; atomic, as logins on two CPUs may
        // count at once (any change is enough, but a lost one could undo
        // another's).
        unsafe { core::intrinsics::atomic_xadd::<u32, u32, { core::intrinsics::AtomicOrdering::Relaxed }>(count, 1) };
    }
}
