//! Every map of the kernel side, in one place, each bounded.
use aya_ebpf::{
    macros::map,
    maps::{Array, PerCpuArray, RingBuf},
};
use sqlbee_kernel_abi::{APPLY_SLOTS, Applying, COMMAND_SLOTS, EventBuffer, INFLIGHT_SLOTS, Inflight, StatBlock, stat};

/// Statement records for the agent. Its size is set at load time.
#[map]
pub static EVENTS: RingBuf = RingBuf::with_byte_size(8 * 1024 * 1024, 0);

/// Command started on a thread, in slot `tid % INFLIGHT_SLOTS`. An array,
/// not a hash map: a lookup is an index, with no lock and no allocation
/// (an LRU hash insert cost about 1 us per statement here), and a fixed
/// size that threads which never finish a statement cannot grow.
#[map]
pub static INFLIGHT: Array<Inflight> = Array::with_max_entries(INFLIGHT_SLOTS, 0);

/// This thread's in-flight slot.
#[inline(always)]
pub fn inflight_slot(tid: u32) -> Option<*mut Inflight> {
    INFLIGHT.get_ptr_mut(tid & (INFLIGHT_SLOTS - 1))
}

/// Error samples (code and message), written only when the server sends
/// an error, so rare; the agent attaches each to its statement.
#[map]
pub static ERRORS: RingBuf = RingBuf::with_byte_size(256 * 1024, 0);

/// Waits longer than the configured threshold, one record each.
#[map]
pub static LONG_WAITS: RingBuf = RingBuf::with_byte_size(256 * 1024, 0);

/// 1 while budget mode has the probes off: they may still fire until the
/// kernel has removed their breakpoints (tenths of a second under load),
/// but count nothing, so counts cover exactly the attached phases the
/// agent measured. 0 (counting) unless the agent says otherwise.
#[map]
pub static GATE: Array<u32> = Array::with_max_entries(1, 0);

/// Whether budget mode has the probes off (see `GATE`).
#[inline(always)]
pub fn gate_closed() -> bool {
    GATE.get(0).is_some_and(|v| *v != 0)
}

/// Exact count of each `enum_server_command` dispatched, whatever happens
/// to the ring buffer.
#[map]
pub static COMMANDS: PerCpuArray<u64> = PerCpuArray::with_max_entries(COMMAND_SLOTS, 0);

/// Health counters, one block per CPU indexed by `sqlbee_kernel_abi::stat`.
#[map]
pub static STATS: PerCpuArray<StatBlock> = PerCpuArray::with_max_entries(1, 0);

/// This CPU's health counters. Per CPU: no other writer while a program
/// runs.
#[inline(always)]
pub fn stats() -> Option<&'static mut StatBlock> {
    // SAFETY: a valid map value for this CPU.
    STATS.get_ptr_mut(0).map(|block| unsafe { &mut *block })
}

#[inline(always)]
pub fn bump_stat(index: u32) {
    if let Some(block) = stats() {
        block[(index % stat::SLOTS) as usize] += 1;
    }
}

/// Where a record is assembled before it is copied to the ring buffer:
/// too large for the 512-byte BPF stack.
#[map]
pub static SCRATCH: PerCpuArray<EventBuffer> = PerCpuArray::with_max_entries(1, 0);

#[inline(always)]
pub fn bump(map: &PerCpuArray<u64>, index: u32) {
    if let Some(slot) = map.get_ptr_mut(index) {
        // Per-CPU slot: no other writer while this program runs.
        unsafe { *slot += 1 };
    }
}

/// The event each applier thread is applying, in slot `tid % APPLY_SLOTS`.
#[map]
pub static APPLYING: Array<Applying> = Array::with_max_entries(APPLY_SLOTS, 0);

/// Events the replica applied, one record each (200 bytes). Only the
/// applier's threads write here, a few records per transaction: 2 MiB
/// holds about 10,000, what 100,000 events a second leave between two
/// drains (a row-based applier catching up here applied 35,000).
#[map]
pub static APPLIED: RingBuf = RingBuf::with_byte_size(2 * 1024 * 1024, 0);
