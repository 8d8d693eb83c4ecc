//! Schemas and accounts by hash. A statement carries the hash of its
//! current schema and of its connection's account (user and client host);
//! what a hash stands for goes to the agent once, as a `NameRecord` in the
//! `NAMES` ring, when a thread first sees it.
//!
//! The schema is read at every statement end: the server may overwrite the
//! name in place on `USE` (`THD::set_db` copies a shorter name into the old
//! buffer), so its address says nothing. The account is read once per
//! connection (its id comes with the counters' window) and again after
//! `acl_authenticate`, which a `COM_CHANGE_USER` runs on the connection's
//! own thread.
use aya_ebpf::{
    bindings::{BPF_RB_FORCE_WAKEUP, BPF_RB_NO_WAKEUP},
    helpers::{bpf_get_current_pid_tgid, bpf_probe_read_user, bpf_probe_read_user_buf, bpf_probe_read_user_str_bytes},
    macros::map,
    maps::{LruHashMap, RingBuf},
    programs::ProbeContext,
};
use sqlbee_kernel_abi::{
    CLIENT_KEY_ENTRIES, EventBuffer, Inflight, MAX_HOST, MAX_NAME, NameRecord, ServerLayout, UNKNOWN, name_kind,
    record_pending, stat, with_client,
};

use crate::{maps::bump_stat, statements::owned_slot};

/// What schema and account hashes stand for.
#[map]
pub static NAMES: RingBuf = RingBuf::with_byte_size(256 * 1024, 0);

/// Connection id -> its client's key, written by the agent once it has
/// found who is at the other end of the connection's socket (0: nobody it
/// can name). Only looked up here: once per connection and thread, and at
/// each of its statements until the agent has written it.
#[map]
pub static CLIENT_KEYS: LruHashMap<u64, u64> = LruHashMap::with_max_entries(CLIENT_KEY_ENTRIES, 0);

uprobe_pair! {
    account_change, account_change_perf => on_account_change;
    schema_change, schema_change_perf => on_schema_change;
}

/// `THD::set_db(const LEX_CSTRING*)`: `USE` and its kin, the one place the
/// server may write a new name over the old one in place. Its thread reads
/// the name again at its next statement end.
#[inline(always)]
fn on_schema_change(_ctx: ProbeContext) -> u32 {
    let tid = bpf_get_current_pid_tgid() as u32;
    if let Some(inflight) = owned_slot(tid) {
        inflight.schema_ptr = 0;
    }
    0
}

/// `acl_authenticate(THD*, uint)`: a connection logs in, or changes user.
/// Its thread names the account again at its next statement end.
#[inline(always)]
fn on_account_change(_ctx: ProbeContext) -> u32 {
    let tid = bpf_get_current_pid_tgid() as u32;
    if let Some(inflight) = owned_slot(tid) {
        inflight.named_connection = 0;
    }
    0
}

const PRIME: u64 = 0x9e37_79b9_7f4a_7c15;

/// Hash of every word of `bytes` (zero past the name: the caller clears the
/// buffer before each read) and of `full_len`, the name's whole length;
/// never 0. No branch depends on the name, so the verifier walks one path
/// instead of one per length.
#[inline(always)]
pub fn hash_bytes<const N: usize>(bytes: &[u8; N], full_len: u64, seed: u64) -> u64 {
    let mut hash = seed ^ full_len.wrapping_mul(PRIME);
    let words = bytes.as_ptr() as *const u64;
    for word in 0..N / 8 {
        // SAFETY: word `word` of an `N`-byte array; unaligned read.
        let w = unsafe { words.add(word).read_unaligned() };
        hash = (hash ^ w).wrapping_mul(PRIME).rotate_left(31);
    }
    hash | 1
}

/// Zeroes a name buffer word by word (BPF has no memset, and a zeroed
/// array built on the stack would not fit there).
#[inline(always)]
pub fn clear<const N: usize>(bytes: &mut [u8; N]) {
    let words = bytes.as_mut_ptr() as *mut u64;
    for word in 0..N / 8 {
        // SAFETY: word `word` of an `N`-byte array; unaligned write.
        unsafe { words.add(word).write_unaligned(0) };
    }
}

/// The current schema's hash into the record (0: no schema, or this
/// build's is unknown), with its name sent when this thread has not sent
/// it since it changed. The name is read only when its THD, address or
/// length changed, or `THD::set_db` ran on this thread since: reading it
/// touches another line of the server's heap at every statement. (A
/// thread pool that moves a THD to another thread, where it changes schema
/// in place, and back could leave its first thread's copy stale; one
/// thread per connection, the default, cannot.)
#[inline(always)]
pub fn schema(thd: u64, db: [u64; 2], layout: &ServerLayout, buffer: &mut EventBuffer, inflight: &mut Inflight) {
    let [pointer, length] = db;
    if pointer != 0 && pointer == inflight.schema_ptr && length == inflight.schema_len && thd == inflight.schema_thd {
        buffer.header.schema_hash = inflight.schema_hash;
        return;
    }
    buffer.header.schema_hash = schema_hash(db, layout, buffer, inflight);
    inflight.schema_thd = thd;
    inflight.schema_ptr = pointer;
    inflight.schema_len = length;
}

#[inline(always)]
fn schema_hash(db: [u64; 2], layout: &ServerLayout, buffer: &mut EventBuffer, inflight: &mut Inflight) -> u64 {
    let [pointer, length] = db;
    if layout.db_offset == UNKNOWN || pointer == 0 || length == 0 {
        return 0;
    }
    let n = crate::bounds::within::<MAX_NAME>(length);
    let record = &mut buffer.name;
    clear(&mut record.name);
    if n > MAX_NAME || unsafe { bpf_probe_read_user_buf(pointer as *const u8, &mut record.name[..n]) }.is_err() {
        return 0;
    }
    let hash = hash_bytes(&record.name, length, 0x5c4e_3a00);
    if hash != inflight.schema_hash {
        inflight.schema_hash = hash;
        record.kind = name_kind::SCHEMA;
        record.name_len = n as u32;
        record.host_len = 0;
        record.hash = hash;
        send(record);
    }
    hash
}

/// The connection's account hash into the record (0: unknown), read and
/// named when the thread serves another connection than the one it named
/// last (the record's connection id, from the counters' window).
#[inline(always)]
pub fn account<const WAKE: bool>(thd: u64, layout: &ServerLayout, buffer: &mut EventBuffer, inflight: &mut Inflight) {
    let connection = buffer.header.connection_id;
    buffer.header.account_hash = account_hash::<WAKE>(thd, connection, layout, buffer, inflight);
}

#[inline(always)]
fn account_hash<const WAKE: bool>(
    thd: u64,
    connection: u64,
    layout: &ServerLayout,
    buffer: &mut EventBuffer,
    inflight: &mut Inflight,
) -> u64 {
    if layout.sctx_offset == UNKNOWN || connection == 0 {
        return 0;
    }
    if inflight.named_connection == connection {
        if inflight.record_pending & record_pending::CLIENT != 0 {
            client_key(connection, inflight);
        }
        return inflight.account_hash;
    }
    // THD::security_ctx: the login's context at a top-level statement end.
    let sctx = unsafe { bpf_probe_read_user((thd + layout.sctx_offset as u64) as *const u64) }.unwrap_or(0);
    if sctx == 0 {
        return 0;
    }
    let user = unsafe { bpf_probe_read_user((sctx + layout.sctx_user_offset as u64) as *const u64) }.unwrap_or(0);
    let host = unsafe { bpf_probe_read_user((sctx + layout.sctx_host_offset as u64) as *const u64) }.unwrap_or(0);
    let record = &mut buffer.name;
    clear(&mut record.name);
    clear(&mut record.host);
    let user_len = read_str(user, &mut record.name);
    let host_len = read_str(host, &mut record.host);
    // Not logged in yet (no user): named at a later statement.
    if user_len == 0 && host_len == 0 {
        return 0;
    }
    let hash = hash_bytes(&record.name, user_len as u64, 0xacc0_0000)
        ^ hash_bytes(&record.host, host_len as u64, 0x4057_0000).rotate_left(17);
    let hash = hash | 1;
    record.kind = name_kind::ACCOUNT;
    record.name_len = user_len as u32;
    record.host_len = host_len as u32;
    record.hash = hash;
    record.connection = connection;
    record.socket_fd = socket_fd(thd, layout.vio_offset);
    inflight.named_connection = connection;
    inflight.login_hash = hash;
    inflight.account_hash = hash;
    inflight.record_pending &= !record_pending::CLIENT;
    if layout.vio_offset != UNKNOWN {
        client_key(connection, inflight);
    }
    record.client_pending = (inflight.record_pending & record_pending::CLIENT) as u32;
    // Woken, the agent names the connection's client while it is open;
    // one it named already (a thread pool names a connection on each
    // thread it moves to) wakes nobody. Only a client statement's end wakes
    // it: in the nested-statement program the choice would push the stack
    // past BPF's 512 bytes, and a connection whose first statement ran a
    // program wakes it at that statement's end anyway.
    let wake = WAKE && inflight.record_pending & record_pending::CLIENT != 0;
    send_flags(record, if wake { BPF_RB_FORCE_WAKEUP as u64 } else { BPF_RB_NO_WAKEUP as u64 });
    inflight.account_hash
}

/// Mixes the connection's client key into its account hash once the agent
/// has written it; until then the connection stays pending.
#[inline(always)]
fn client_key(connection: u64, inflight: &mut Inflight) {
    let key = lookup_client_key(connection);
    if key == NO_KEY {
        inflight.record_pending |= record_pending::CLIENT;
    } else {
        inflight.account_hash = with_client(inflight.login_hash, key);
        inflight.record_pending &= !record_pending::CLIENT;
    }
}

/// What `lookup_client_key` returns while the agent has written no key.
const NO_KEY: u64 = u64::MAX;

// Not inlined, nor is `socket_fd`: they run once per connection, and
// inlined into the statement programs their stack pushes the largest past
// BPF's 512 bytes.
#[inline(never)]
fn lookup_client_key(connection: u64) -> u64 {
    // SAFETY: a plain u64 value of a map only the agent writes.
    match unsafe { CLIENT_KEYS.get(&connection) } {
        Some(key) => *key,
        None => NO_KEY,
    }
}

/// The connection's socket fd: `THD::net.vio`, whose first int it is; -1
/// when this build's offset is unknown or a read fails.
#[inline(never)]
fn socket_fd(thd: u64, vio_offset: u32) -> i32 {
    if vio_offset == UNKNOWN {
        return -1;
    }
    let vio = unsafe { bpf_probe_read_user((thd + vio_offset as u64) as *const u64) }.unwrap_or(0);
    if vio == 0 {
        return -1;
    }
    unsafe { bpf_probe_read_user(vio as *const i32) }.unwrap_or(-1)
}

/// A C string into `dest`, cut at its size; its length, 0 when unreadable.
#[inline(always)]
fn read_str<const N: usize>(pointer: u64, dest: &mut [u8; N]) -> usize {
    if pointer == 0 {
        return 0;
    }
    match unsafe { bpf_probe_read_user_str_bytes(pointer as *const u8, dest) } {
        Ok(read) => read.len() & (N * 2 - 1),
        Err(_) => 0,
    }
}

#[inline(always)]
pub fn send(record: &NameRecord) {
    send_flags(record, BPF_RB_NO_WAKEUP as u64);
}

#[inline(always)]
fn send_flags(record: &NameRecord, flags: u64) {
    if NAMES.output(record, flags).is_err() {
        bump_stat(stat::NAMES_DROPPED);
    }
}

// Names are cut at these sizes; a longer one is told apart by its length.
const _: () = assert!(MAX_NAME % 8 == 0 && MAX_HOST % 8 == 0);
