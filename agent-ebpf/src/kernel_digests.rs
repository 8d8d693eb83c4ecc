//! Kernel digests: statements counted by text hash (see
//! `sqlbee_kernel_abi::kernel_digests`). A statement whose hash the agent
//! registered costs a map lookup and a few adds instead of a ring-buffer
//! record and the agent's work on it.
use aya_ebpf::{
    helpers::generated::bpf_loop,
    macros::map,
    maps::{Array, PerCpuArray},
};
use sqlbee_kernel_abi::{
    CONTROL_EPOCH, CONTROL_OPAQUE_ONES, CONTROL_SHEDDING, CONTROL_SLOTS, MAX_TEXT, SLOT_ACCOUNTS, SlotStats,
    StatementStats,
    kernel_digests::{BUCKETS, KnownSet, LOW_POWER, POWERS, bucket_at, entry_slot, known_set},
    text_hash::{HashState, run, step},
};

use crate::maps::SCRATCH;

/// Text hash -> slot, set-associative (`sqlbee_kernel_abi::kernel_digests::KNOWN_WAYS`),
/// written only by the agent. Sized at load time.
#[map]
pub static KNOWN: Array<KnownSet> = Array::with_max_entries(1, 0);

/// Two epochs of slots, `epoch * slots + slot`. Sized at load time.
#[map]
pub static DIGEST_SLOTS: PerCpuArray<SlotStats> = PerCpuArray::with_max_entries(2, 0);

/// `CONTROL_EPOCH`: the epoch written now, flipped by the agent; and
/// `CONTROL_OPAQUE_ONES`.
#[map]
pub static CONTROL: Array<u32> = Array::with_max_entries(CONTROL_SLOTS, 0);

/// The loop's state, on the stack of [`sqlbee_text_hash`] (`bpf_loop`
/// takes no other memory). Kept at 32 bytes, the frame the strictest
/// kernels round up to: the text's length and the opaque ones wait in
/// `SCRATCH` (`hash_len`, `hash_ones`) instead.
#[repr(C)]
struct HashJob {
    state: HashState,
    /// The next byte to feed.
    at: u64,
}

/// One `bpf_loop` step: the text in `SCRATCH` from byte `at`, eight bytes
/// of plain code at once ([`run`]), else one byte through the lexer.
/// Stepping the lexer over more bytes per call multiplies verification
/// (four bytes took 2 s of kernel CPU at attach instead of 0.3 s, and a
/// restarted server must be traced again within 2 s); a run is one path
/// of plain arithmetic.
extern "C" fn hash_chunk(_index: u64, ctx: *mut core::ffi::c_void) -> i64 {
    // SAFETY: `ctx` is the `HashJob` on the caller's stack, alive for the
    // whole loop.
    let job = unsafe { &mut *(ctx as *mut HashJob) };
    let Some(buffer) = SCRATCH.get_ptr(0) else { return 1 };
    // SAFETY: a valid map value, read only.
    let buffer = unsafe { &*buffer };
    let (len, ones) = (buffer.hash_len as u64, buffer.hash_ones);
    let at = job.at;
    if at >= len {
        return 1;
    }
    let i = at as usize & (MAX_TEXT - 1);
    // The mask and the compare keep the bytes in bounds.
    let text = &buffer.text;
    let fed = if i + 8 <= MAX_TEXT { run(&mut job.state, word_at(text, i), len - at) } else { 0 };
    if fed == 0 {
        step(&mut job.state, text[i]);
    }
    // No-ops the verifier cannot see through (see CONTROL_OPAQUE_ONES). The
    // position is XORed with zero, not ANDed with ones: its upper bound
    // must not grow from one call to the next, or the verifier never meets
    // a call it has seen before (it gave up, too complex, when it did).
    job.at = (at + fed.max(1)) ^ !ones as u64;
    job.state.mode &= ones;
    job.state.prev &= ones;
    0
}

/// Hash of the first `len` bytes of the text in `SCRATCH`; 0 when there
/// is none. A prepared statement's text has placeholders, not values, so
/// it is hashed whole, a word at a time (several times cheaper); it then
/// hashes apart from the same text sent as a query, which only costs a
/// second slot.
///
/// A global function, never inlined: the verifier checks a global
/// function once, on its own, for any argument, where it checks an inlined
/// or static one again in every state its caller reaches it in. The
/// statement program reached the lexer's `bpf_loop` in about 300 states,
/// each walking the callback again: 90% of the 530,519 instructions one
/// 6.18 build verified for it. Its arguments are plain numbers (every
/// kernel since 5.6 takes those), and it reads the text from `SCRATCH`
/// itself.
#[unsafe(no_mangle)]
#[inline(never)]
pub extern "C" fn sqlbee_text_hash(len: u64, prepared: u64) -> u64 {
    // Not a bound the callers need (they pass at most `MAX_TEXT`); the
    // verifier knows nothing of `len` here.
    let len = len.min(MAX_TEXT as u64);
    let Some(buffer) = SCRATCH.get_ptr_mut(0) else { return 0 };
    // SAFETY: a valid map value; this CPU's, and no other program runs on
    // it while this one does.
    let buffer = unsafe { &mut *buffer };
    if prepared != 0 {
        return word_hash(&buffer.text, len);
    }
    let ones = CONTROL.get(CONTROL_OPAQUE_ONES).copied().unwrap_or(0);
    // The agent writes it before it attaches; unwritten, the position
    // below would leave the text after its first run, so no hash (the
    // statement goes as a record). Testing one bit leaves the rest opaque.
    if ones & (1 << 31) == 0 {
        return 0;
    }
    buffer.hash_len = len as u32;
    buffer.hash_ones = ones;
    let mut job = HashJob { state: HashState::new(), at: 0 };
    // Every field starts opaque, XORed with a zero the verifier cannot see.
    // It walks the callback again until the state it starts from holds
    // every state a step leaves; from known first values (the seed, byte
    // 0, mode code) each step widened them a little, and it walked the
    // callback 261 times (179,000 instructions on one 6.18 build).
    let zero32 = !ones;
    let zero = u64::from(zero32) | (u64::from(zero32) << 32);
    job.state.hash ^= zero;
    job.state.number ^= zero;
    job.state.mode ^= zero32;
    job.state.prev ^= zero32;
    job.at ^= u64::from(zero32);
    // At most one call per byte; runs end the loop sooner.
    let steps = len as u32;
    // SAFETY: the callback is a static function; the context outlives it.
    let callback = hash_chunk as extern "C" fn(u64, *mut core::ffi::c_void) -> i64;
    unsafe { bpf_loop(steps, callback as *mut core::ffi::c_void, &mut job as *mut HashJob as *mut _, 0) };
    (job.state.finish() & !(1 << 63)).max(1)
}

struct WordJob {
    hash: u64,
    len: u64,
}

/// One `bpf_loop` step of [`word_hash`]: text bytes `index * 8..`.
extern "C" fn hash_word(index: u64, ctx: *mut core::ffi::c_void) -> i64 {
    // SAFETY: `ctx` is the `WordJob` on the caller's stack.
    let job = unsafe { &mut *(ctx as *mut WordJob) };
    let Some(buffer) = SCRATCH.get_ptr(0) else { return 1 };
    let at = (index as usize * 8) & (MAX_TEXT - 8);
    // SAFETY: a valid map value; `at + 8 <= MAX_TEXT`.
    let word = word_at(unsafe { &(*buffer).text }, at);
    job.hash = mix_word(job.hash, masked(word, job.len, index));
    0
}

const WORD_PRIME: u64 = 0x9e37_79b9_7f4a_7c15;

/// Texts up to this many words are hashed in line: `bpf_loop` costs a call
/// per step, more than the step itself.
const INLINE_WORDS: usize = 8;

#[inline(always)]
fn mix_word(hash: u64, word: u64) -> u64 {
    (hash ^ word).wrapping_mul(WORD_PRIME).rotate_left(29)
}

/// The whole text, eight bytes per step, and its length. The `bpf_loop`
/// steps read the same text from `SCRATCH`.
#[inline(always)]
fn word_hash(text: &[u8; MAX_TEXT], len: u64) -> u64 {
    let seed = sqlbee_kernel_abi::kernel_digests::HASH_SEED ^ len.wrapping_mul(WORD_PRIME);
    let steps = len.div_ceil(8);
    let hash = if steps <= INLINE_WORDS as u64 {
        let mut hash = seed;
        for index in 0..INLINE_WORDS {
            if index as u64 >= steps {
                break;
            }
            hash = mix_word(hash, masked(word_at(text, index * 8), len, index as u64));
        }
        hash
    } else {
        let mut job = WordJob { hash: seed, len };
        let callback = hash_word as extern "C" fn(u64, *mut core::ffi::c_void) -> i64;
        // SAFETY: the callback is a static function; the context outlives it.
        unsafe { bpf_loop(steps as u32, callback as *mut core::ffi::c_void, &mut job as *mut WordJob as *mut _, 0) };
        job.hash
    };
    // 0 means "no hash"; the top bit keeps prepared and query hashes apart.
    hash | (1 << 63)
}

/// Text bytes `at..at + 8`, little-endian.
#[inline(always)]
fn word_at(text: &[u8; MAX_TEXT], at: usize) -> u64 {
    let b = &text[at..at + 8];
    u64::from_le_bytes([b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7]])
}

/// Word `index` of a `len`-byte text, bytes past the end (left over from
/// an earlier statement) masked off.
#[inline(always)]
fn masked(word: u64, len: u64, index: u64) -> u64 {
    let left = len.saturating_sub(index * 8);
    if left < 8 { word & ((1u64 << (left * 8)) - 1) } else { word }
}

/// The agent's shedding step (`CONTROL_SHEDDING`).
#[inline(always)]
pub fn shedding_step() -> u32 {
    CONTROL.get(CONTROL_SHEDDING).copied().unwrap_or(0)
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
pub fn record(
    hash: u64,
    duration_ns: u64,
    slots: u32,
    sets: u32,
    query: &StatementStats,
    known: u32,
    account: u64,
) -> Option<bool> {
    let set = KNOWN.get(known_set(hash, sets))?;
    let mut slot = u32::MAX;
    for entry in set {
        if let Some(found) = entry_slot(*entry, hash) {
            slot = found;
        }
    }
    if slot >= slots || duration_ns == 0 {
        return None;
    }
    let top = top_bit(duration_ns);
    if top < LOW_POWER || top >= LOW_POWER + POWERS {
        return None;
    }
    let bucket = bucket_at(duration_ns, top) & (BUCKETS - 1);
    let epoch = CONTROL.get(CONTROL_EPOCH).copied().unwrap_or(0) & 1;
    let stats = DIGEST_SLOTS.get_ptr_mut(epoch * slots + slot)?;
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
    stats.stats.add_known(query, known);
    // The agent zeroes a slot when it reads it: the ways start free.
    if account != 0 {
        for way in 0..SLOT_ACCOUNTS {
            if stats.accounts[way] == account {
                stats.account_counts[way] += 1;
                break;
            }
            if stats.accounts[way] == 0 {
                stats.accounts[way] = account;
                stats.account_counts[way] = 1;
                break;
            }
        }
    }
    Some(first)
}
