//! What a replica applies. `Log_event::apply_event(rpl_group_info*)` is
//! the one door every replicated event goes through, on the replica's
//! applier thread or its parallel workers: a client's statement never
//! passes here, so these probes cost a primary's clients nothing. Entry
//! and return time each event; the event itself says when the primary
//! wrote it and, for a rows event, which table it changes.
use aya_ebpf::{
    bindings::BPF_RB_NO_WAKEUP,
    helpers::{bpf_get_current_pid_tgid, bpf_ktime_get_ns, bpf_probe_read_user, bpf_probe_read_user_str_bytes},
    programs::{ProbeContext, RetProbeContext},
};
use sqlbee_kernel_abi::{APPLY_SLOTS, AppliedEvent, ROWS_UNKNOWN, ROWS_VTABLES, ServerLayout, UNKNOWN, stat};

use crate::{
    layout::layout,
    maps::{APPLIED, APPLYING, bump_stat, gate_closed},
};

uprobe_pair! {
    apply_start, apply_start_perf => on_apply_start;
}

#[aya_ebpf::macros::uretprobe(multi)]
pub fn apply_end(_ctx: RetProbeContext) -> u32 {
    on_apply_end()
}

#[aya_ebpf::macros::uretprobe]
pub fn apply_end_perf(_ctx: RetProbeContext) -> u32 {
    on_apply_end()
}

#[inline(always)]
fn on_apply_start(ctx: ProbeContext) -> u32 {
    if gate_closed() {
        return 0;
    }
    let event: u64 = ctx.arg(0).unwrap_or(0);
    let rgi: u64 = ctx.arg(1).unwrap_or(0);
    let tid = bpf_get_current_pid_tgid() as u32;
    if let Some(slot) = APPLYING.get_ptr_mut(tid & (APPLY_SLOTS - 1)) {
        // SAFETY: this thread's slot of the array map.
        let slot = unsafe { &mut *slot };
        // Another applier's event still in this slot: its end will find
        // the slot taken, so it is counted lost here, once.
        if slot.event != 0 && slot.tid != tid {
            bump_stat(stat::APPLIED_LOST);
        }
        let layout = layout();
        // The class decides what else is read: only a rows event's table
        // and rows, so the events around it cost one read at each end.
        let vtable = unsafe { bpf_probe_read_user(event as *const u64) }.unwrap_or(0);
        let thd = if is_rows(vtable, layout) { event_thd(event, layout) } else { 0 };
        slot.tid = tid;
        slot.event = event;
        slot.vtable = vtable;
        slot.thd = thd;
        slot.rows_before = rows_changed(thd, layout);
        slot.rgi = if vtable != 0 && vtable == layout.gtid_vtable { rgi } else { 0 };
        slot.start_ns = unsafe { bpf_ktime_get_ns() };
    }
    0
}

#[inline(always)]
fn on_apply_end() -> u32 {
    let end_ns = unsafe { bpf_ktime_get_ns() };
    let tid = bpf_get_current_pid_tgid() as u32;
    let Some(slot) = APPLYING.get_ptr_mut(tid & (APPLY_SLOTS - 1)) else { return 0 };
    // SAFETY: this thread's slot of the array map.
    let slot = unsafe { &mut *slot };
    // Another thread's slot, or an entry the gate kept out: no start.
    if slot.tid != tid || slot.event == 0 {
        return 0;
    }
    let event = slot.event;
    let rgi = slot.rgi;
    slot.event = 0;
    let layout = layout();
    let Some(mut entry) = APPLIED.reserve::<AppliedEvent>(0) else {
        bump_stat(stat::APPLIED_LOST);
        return 0;
    };
    let record = entry.as_mut_ptr();
    // SAFETY: the reservation is sized for one AppliedEvent; every field
    // is written before it is submitted.
    unsafe {
        (*record).tid = tid;
        (*record).start_ns = slot.start_ns;
        (*record).end_ns = end_ns;
        let after = rows_changed(slot.thd, layout);
        (*record).rows = if slot.rows_before == ROWS_UNKNOWN || after == ROWS_UNKNOWN || after < slot.rows_before {
            ROWS_UNKNOWN
        } else {
            after - slot.rows_before
        };
        (*record).rows_type = 0;
        (*record).schema[0] = 0;
        (*record).table[0] = 0;
        let vtable = slot.vtable;
        (*record).vtable = vtable;
        (*record).when = bpf_probe_read_user((event + layout.event_when_offset as u64) as *const u64).unwrap_or(0);
        if rgi != 0 {
            read_channel(rgi, layout, &mut (*record).table);
        }
        if is_rows(vtable, layout) {
            (*record).rows_type =
                bpf_probe_read_user((event + layout.rows_type_offset as u64) as *const u32).unwrap_or(0);
            let table = bpf_probe_read_user((event + layout.rows_table_offset as u64) as *const u64).unwrap_or(0);
            let share = if table == 0 {
                0
            } else {
                bpf_probe_read_user((table + layout.table_share_offset as u64) as *const u64).unwrap_or(0)
            };
            if share != 0 {
                // `db {str, length}` then `table_name {str, length}`.
                let names =
                    bpf_probe_read_user((share + layout.share_db_offset as u64) as *const [u64; 3]).unwrap_or([0; 3]);
                if names[0] != 0 && names[2] != 0 {
                    let _ = bpf_probe_read_user_str_bytes(names[0] as *const u8, &mut (*record).schema);
                    let _ = bpf_probe_read_user_str_bytes(names[2] as *const u8, &mut (*record).table);
                }
            }
        }
    }
    entry.submit(BPF_RB_NO_WAKEUP as u64);
    0
}

/// The connection name of the channel a GTID event's transaction came
/// through (`rgi->rli->mi->connection_name`): once per transaction, so the
/// events between cost nothing more. Left empty when unknown, when the
/// event is not a channel's (`BINLOG` statements, Galera: `mi` null or
/// not a channel), and for the default channel, whose name is empty.
#[inline(always)]
fn read_channel(rgi: u64, layout: &ServerLayout, out: &mut [u8; sqlbee_kernel_abi::APPLIED_NAME]) {
    if layout.rgi_rli_offset == UNKNOWN || layout.rli_mi_offset == UNKNOWN || layout.mi_channel_offset == UNKNOWN {
        return;
    }
    // SAFETY: reads of the server's memory; a failed one leaves it empty.
    unsafe {
        let rli = bpf_probe_read_user((rgi + layout.rgi_rli_offset as u64) as *const u64).unwrap_or(0);
        if rli == 0 {
            return;
        }
        let mi = bpf_probe_read_user((rli + layout.rli_mi_offset as u64) as *const u64).unwrap_or(0);
        if mi == 0 {
            return;
        }
        let name = bpf_probe_read_user((mi + layout.mi_channel_offset as u64) as *const [u64; 2]).unwrap_or([0; 2]);
        if name[0] != 0 && name[1] != 0 {
            let _ = bpf_probe_read_user_str_bytes(name[0] as *const u8, out);
        }
    }
}

/// Whether the event's class is one of the rows events'.
#[inline(always)]
fn is_rows(vtable: u64, layout: &ServerLayout) -> bool {
    let mut rows = false;
    for known in layout.rows_vtables.iter().take(ROWS_VTABLES) {
        rows |= *known != 0 && *known == vtable;
    }
    rows
}

/// The THD applying the event (0: not known).
#[inline(always)]
fn event_thd(event: u64, layout: &ServerLayout) -> u64 {
    if layout.event_thd_offset == UNKNOWN {
        return 0;
    }
    // SAFETY: a read of the server's memory; a failed one says unknown.
    unsafe { bpf_probe_read_user((event + layout.event_thd_offset as u64) as *const u64) }.unwrap_or(0)
}

/// The applier's rows written, updated and deleted so far: three reads
/// of its THD (the counters may lie further apart than one copy on the
/// stack could span), paid only for rows events.
#[inline(always)]
fn rows_changed(thd: u64, layout: &ServerLayout) -> u64 {
    if thd == 0 {
        return ROWS_UNKNOWN;
    }
    let mut sum = 0u64;
    for offset in layout.row_counter_offsets {
        match unsafe { bpf_probe_read_user((thd + offset as u64) as *const u64) } {
            Ok(count) => sum = sum.wrapping_add(count),
            Err(_) => return ROWS_UNKNOWN,
        }
    }
    sum
}
