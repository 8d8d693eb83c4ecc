//! The values prepared statements are executed with, for plans only.
//!
//! A prepared statement's text has `?` where its values go, and EXPLAIN
//! needs the values. The server decodes each value of a `COM_STMT_EXECUTE`
//! packet in one of `Item_param::set_param_*` (one per wire type, called
//! with the packet position and the bytes left) or sets a NULL with
//! `Item_param::set_null`, in the order of the placeholders. This one
//! program sits at the entry of all of them, through one multi link the
//! agent makes only while it wants values (a second or two now and then),
//! and copies the value's wire bytes; where it fired says which decoder,
//! so which type. It marks the thread's slot, so that statement's end goes
//! out as a record the agent pairs the values with, instead of into a
//! kernel digest. No classic-uprobe copy: without multi links there are
//! no values, and prepared statements say so instead of a plan.
use aya_ebpf::{
    bindings::BPF_RB_NO_WAKEUP,
    helpers::{bpf_get_current_pid_tgid, bpf_ktime_get_ns, bpf_probe_read_user, bpf_probe_read_user_buf},
    macros::{map, uprobe},
    maps::{PerCpuArray, RingBuf},
    programs::ProbeContext,
};
use sqlbee_kernel_abi::{VALUE_BYTES, ValueEvent, record_pending};

use crate::{maps::gate_closed, statements::owned_slot};

/// Values for the agent; only written while the value probes are attached.
#[map]
pub static VALUES: RingBuf = RingBuf::with_byte_size(1024 * 1024, 0);

/// Values this CPU may still copy in this capture; the agent sets it when
/// it attaches the probes. Past it the program does nothing, so a capture
/// costs a bounded number of records however many statements run before
/// the agent detaches it.
#[map]
pub static VALUES_LEFT: PerCpuArray<u64> = PerCpuArray::with_max_entries(1, 0);

#[uprobe(multi)]
pub fn value_set(ctx: ProbeContext) -> u32 {
    let _ = try_value_set(&ctx);
    0
}

fn try_value_set(ctx: &ProbeContext) -> Result<(), i64> {
    if gate_closed() {
        return Ok(());
    }
    let left = VALUES_LEFT.get_ptr_mut(0).ok_or(0i64)?;
    // SAFETY: this CPU's slot; no other writer while the program runs.
    unsafe {
        if *left == 0 {
            return Ok(());
        }
        *left -= 1;
    }
    let tid = bpf_get_current_pid_tgid() as u32;
    // SAFETY: a read of the probe context at a fixed offset. At a uprobe
    // the instruction pointer is the probed address.
    let ip = unsafe { (*ctx.regs).rip };
    // `(this, uchar **pos, ulong len)`; for `set_null` the second argument
    // is the collation and the agent ignores the bytes.
    let position: u64 = ctx.arg(1).ok_or(0i64)?;
    let available: u64 = ctx.arg(2).ok_or(0i64)?;
    let mut entry = VALUES.reserve::<ValueEvent>(0).ok_or(0i64)?;
    let event = entry.as_mut_ptr();
    // SAFETY: the reserved record, written field by field (the whole of it
    // would not fit on the BPF stack) and submitted below.
    unsafe {
        (*event).tid = tid;
        (*event).ip = ip;
        (*event).at_ns = bpf_ktime_get_ns();
        (*event).available = available;
        (*event).captured = 0;
        let at = bpf_probe_read_user(position as *const u64).unwrap_or(0);
        let n = crate::bounds::within::<VALUE_BYTES>(available);
        let bytes = &mut (*event).bytes;
        if at != 0 && n > 0 && n <= VALUE_BYTES && bpf_probe_read_user_buf(at as *const u8, &mut bytes[..n]).is_ok() {
            (*event).captured = n as u32;
        }
    }
    entry.submit(BPF_RB_NO_WAKEUP as u64);
    if let Some(inflight) = owned_slot(tid)
        && inflight.record_pending & record_pending::VALUES == 0
    {
        inflight.record_pending |= record_pending::VALUES;
    }
    Ok(())
}
