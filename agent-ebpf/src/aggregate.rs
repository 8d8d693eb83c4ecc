//! In-kernel aggregation by text hash (see `agent_common::aggregate`): a
//! statement whose hash the agent registered costs a map lookup and a few
//! adds instead of a ring-buffer record and the agent's work on it.
use agent_common::{
    CONTROL_EPOCH, CONTROL_OPAQUE_ONES, CONTROL_SLOTS, MAX_TEXT, SlotStats,
    aggregate::{BUCKETS, LOW_POWER, POWERS},
    text_hash::{HashState, step},
};
use aya_ebpf::{
    helpers::generated::bpf_loop,
    macros::map,
    maps::{Array, HashMap, PerCpuArray},
};

use crate::maps::SCRATCH;

/// Text hash -> slot, written only by the agent. Sized at load time.
#[map]
pub static KNOWN: HashMap<u64, u32> = HashMap::with_max_entries(1, 0);

/// Two epochs of slots, `epoch * slots + slot`. Sized at load time.
#[map]
pub static AGGREGATES: PerCpuArray<SlotStats> = PerCpuArray::with_max_entries(2, 0);

/// `CONTROL_EPOCH`: the epoch written now, flipped by the agent; and
/// `CONTROL_OPAQUE_ONES`.
#[map]
pub static CONTROL: Array<u32> = Array::with_max_entries(CONTROL_SLOTS, 0);

/// Bytes hashed per `bpf_loop` step: fewer calls, a small unrolled body.
const CHUNK: usize = 1;

#[repr(C)]
struct HashJob {
    state: HashState,
    len: u64,
    /// `CONTROL_OPAQUE_ONES`.
    ones: u32,
}

/// One `bpf_loop` step: the text in `SCRATCH`, bytes `index * CHUNK..`.
extern "C" fn hash_chunk(index: u64, ctx: *mut core::ffi::c_void) -> i64 {
    // SAFETY: `ctx` is the `HashJob` on the caller's stack, alive for the
    // whole loop.
    let job = unsafe { &mut *(ctx as *mut HashJob) };
    let Some(buffer) = SCRATCH.get_ptr(0) else { return 1 };
    let base = index as usize * CHUNK;
    for k in 0..CHUNK {
        let i = base + k;
        if i as u64 >= job.len {
            return 1;
        }
        // SAFETY: a valid map value; the mask keeps the index in bounds.
        let byte = unsafe { (*buffer).text[i & (MAX_TEXT - 1)] };
        step(&mut job.state, byte);
        // A no-op the verifier cannot see through (see CONTROL_OPAQUE_ONES).
        job.state.mode &= job.ones;
        job.state.prev &= job.ones;
    }
    0
}

/// Hash of the first `len` text bytes in `SCRATCH`.
#[inline(always)]
pub fn text_hash(len: u64) -> u64 {
    let ones = CONTROL.get(CONTROL_OPAQUE_ONES).copied().unwrap_or(0);
    let mut job = HashJob { state: HashState::new(), len, ones };
    let steps = len.div_ceil(CHUNK as u64) as u32;
    // SAFETY: the callback is a static function; the context outlives it.
    let callback = hash_chunk as extern "C" fn(u64, *mut core::ffi::c_void) -> i64;
    unsafe { bpf_loop(steps, callback as *mut core::ffi::c_void, &mut job as *mut HashJob as *mut _, 0) };
    job.state.finish()
}

/// Highest set bit of a non-zero value, without a count-leading-zeros
/// instruction (BPF has none).
#[inline(always)]
fn top_bit(mut v: u64) -> u32 {
    let mut top = 0;
    for shift in [32u32, 16, 8, 4, 2, 1] {
        if v >> shift != 0 {
            v >>= shift;
            top += shift;
        }
    }
    top
}

/// Counts a statement into its hash's slot. `None`: not registered, or a
/// duration outside the kernel histogram (the caller sends an event);
/// `Some(true)`: the slot's first statement this epoch (send a sample).
#[inline(always)]
pub fn record(hash: u64, duration_ns: u64, slots: u32) -> Option<bool> {
    let slot = *unsafe { KNOWN.get(&hash) }?;
    if slot >= slots || duration_ns == 0 {
        return None;
    }
    let top = top_bit(duration_ns);
    if top < LOW_POWER || top >= LOW_POWER + POWERS {
        return None;
    }
    let sub = ((duration_ns >> (top - 3)) & 7) as usize;
    let bucket = ((top - LOW_POWER) as usize * 8 + sub) & (BUCKETS - 1);
    let epoch = CONTROL.get(CONTROL_EPOCH).copied().unwrap_or(0) & 1;
    let stats = AGGREGATES.get_ptr_mut(epoch * slots + slot)?;
    // SAFETY: this CPU's copy of the value; no other writer while we run.
    let stats = unsafe { &mut *stats };
    let first = stats.count == 0;
    if first || duration_ns < stats.min_ns {
        stats.min_ns = duration_ns;
    }
    if duration_ns > stats.max_ns {
        stats.max_ns = duration_ns;
    }
    stats.count += 1;
    stats.sum_ns += duration_ns;
    stats.buckets[bucket] += 1;
    Some(first)
}
