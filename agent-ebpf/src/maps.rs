//! Every map of the kernel side, in one place, each bounded.
use agent_common::{COMMAND_SLOTS, EventBuffer, Inflight, MAX_INFLIGHT, stat};
use aya_ebpf::{
    macros::map,
    maps::{LruHashMap, PerCpuArray, RingBuf},
};

/// Statement records for the agent. Its size is set at load time.
#[map]
pub static EVENTS: RingBuf = RingBuf::with_byte_size(8 * 1024 * 1024, 0);

/// Command started on a thread, keyed by thread id. LRU so that threads
/// that never reach a statement end cannot fill it.
#[map]
pub static INFLIGHT: LruHashMap<u32, Inflight> = LruHashMap::with_max_entries(MAX_INFLIGHT, 0);

/// Exact count of each `enum_server_command` dispatched, whatever happens
/// to the ring buffer.
#[map]
pub static COMMANDS: PerCpuArray<u64> = PerCpuArray::with_max_entries(COMMAND_SLOTS, 0);

/// Health counters, indexed by `agent_common::stat`.
#[map]
pub static STATS: PerCpuArray<u64> = PerCpuArray::with_max_entries(stat::SLOTS, 0);

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
