//! Statement capture at one trap per statement.
//!
//! `log_slow_statement(THD*)` runs once per finished statement (each of a
//! multi-statement query too) while the THD still holds everything a
//! statement record needs: the text (for prepared statements the text with
//! `?` placeholders, even when prepared before we attached), the command,
//! and `start_utime`, the server's own CLOCK_MONOTONIC start of the
//! statement. So one uprobe there times and names every statement; no
//! probe at the start is needed. The optional `dispatch_command` probe
//! only adds exact counts of commands that are not statements (PREPARE,
//! CLOSE, PING, QUIT, ...) at the price of a second trap. Placement lives
//! here only; the agent names the symbols.
use aya_ebpf::{
    bindings::BPF_RB_NO_WAKEUP,
    helpers::{bpf_get_current_pid_tgid, bpf_ktime_get_ns, bpf_probe_read_user, bpf_probe_read_user_buf},
    programs::ProbeContext,
};
use sqlbee_kernel_abi::{
    EVENT_HEADER_LEN, EventBuffer, Inflight, MAX_TEXT, STATS_WINDOW, ServerLayout, StatementStats, UNKNOWN, command,
    flags, kernel_digests::with_schema, record_pending, source, stat, statement_flag, wait_class,
};

use crate::{
    kernel_digests,
    layout::layout,
    maps::{COMMANDS, EVENTS, SCRATCH, bump, gate_closed, inflight_slot, stats},
    names, query_stats,
};

/// In the `known-texts-only` shedding step, one unregistered statement in
/// this many (per CPU) still carries its text, so a new text gets
/// registered and from then on costs a slot update instead of a record.
const SHED_TEXT_EVERY: u64 = 64;

/// A start time further back than this is not believed (a layout that
/// does not match the binary reads garbage): an hour, in microseconds.
const MAX_STATEMENT_US: u64 = 3600 * 1_000_000;

uprobe_pair! {
    command_start, command_start_perf => on_command_start;
    statement_end, statement_end_perf => on_statement_end;
}

#[inline(always)]
fn on_command_start(ctx: ProbeContext) -> u32 {
    let _ = try_command_start(&ctx);
    0
}

fn try_command_start(ctx: &ProbeContext) -> Result<(), i64> {
    if gate_closed() {
        return Ok(());
    }
    let layout = layout();
    let args = args(ctx);
    let command = arg_at(&args, layout.command_arg).ok_or(0i64)?;
    let thd = arg_at(&args, layout.thd_arg).ok_or(0i64)?;
    let command = command as u32 & 0xff;
    bump(&COMMANDS, command);

    let mut stmt_id = 0;
    // Its packet starts with the 4-byte statement id.
    if command == command::STMT_EXECUTE && layout.packet_arg != u32::MAX {
        let packet = arg_at(&args, layout.packet_arg).ok_or(0i64)?;
        stmt_id = unsafe { bpf_probe_read_user(packet as *const u32) }.unwrap_or(0);
    }
    let tid = bpf_get_current_pid_tgid() as u32;
    let inflight = owned_slot(tid).ok_or(0i64)?;
    inflight.thd = thd;
    inflight.command = command;
    inflight.stmt_id = stmt_id;
    inflight.command_ns = unsafe { bpf_ktime_get_ns() };
    Ok(())
}

/// This thread's in-flight slot, taken over (reset) when another thread
/// used it last.
#[inline(always)]
pub fn owned_slot(tid: u32) -> Option<&'static mut Inflight> {
    let slot = inflight_slot(tid)?;
    // SAFETY: the pointer is into the array map's value for this index;
    // only this thread writes a slot it owns.
    let inflight = unsafe { &mut *slot };
    if inflight.tid != tid {
        *inflight = Inflight { tid, ..Inflight::default() };
    }
    Some(inflight)
}

/// The first four arguments as register values. The verifier only allows
/// constant offsets into the context, so every register is read and the
/// layout picks among the values, never among pointers.
#[inline(always)]
fn args(ctx: &ProbeContext) -> [u64; 4] {
    [ctx.arg(0).unwrap_or(0), ctx.arg(1).unwrap_or(0), ctx.arg(2).unwrap_or(0), ctx.arg(3).unwrap_or(0)]
}

#[inline(always)]
fn arg_at(args: &[u64; 4], index: u32) -> Option<u64> {
    args.get(index as usize).copied()
}

#[inline(always)]
fn on_statement_end(ctx: ProbeContext) -> u32 {
    let _ = try_statement_end(&ctx);
    0
}

/// THD fields this close together are read with one copy.
const THD_WINDOW_WORDS: usize = 16;

/// The command (u32) and the statement's start and lock times (u64) from
/// the THD. Reads of server memory are the program's dearest steps here
/// (the first about 0.4 us, one on a further page 0.2 us, a further one on
/// a line already read 0.1 us), so when the three lie within
/// `THD_WINDOW_WORDS` words of each other (in MariaDB 10.11 they span 72
/// bytes) they are copied in one read, and the connection id is read only
/// for statements that are sent. The offsets are constants to the
/// verifier, so it keeps one branch. The copy lands in `scratch` (the
/// record's counters' window, filled later), not on the stack: every
/// program's call chain must fit 512 bytes on every kernel.
#[inline(always)]
pub fn read_command_and_times(thd: u64, layout: &ServerLayout, scratch: &mut [u64; STATS_WINDOW / 8]) -> [u64; 3] {
    let command = layout.command_offset as u64;
    let start = layout.start_utime_offset as u64;
    let lock = layout.lock_utime_offset as u64;
    let low = command.min(start).min(lock) & !7;
    let words = ((command + 4).max(start + 8).max(lock + 8) - low).div_ceil(8);
    let aligned = start % 8 == 0 && lock % 8 == 0 && command % 4 == 0;
    if aligned && words <= THD_WINDOW_WORDS as u64 {
        let n = (words as usize) & (THD_WINDOW_WORDS * 2 - 1);
        if n <= THD_WINDOW_WORDS {
            // SAFETY: the first `n` words of the scratch array.
            let bytes = unsafe { core::slice::from_raw_parts_mut(scratch.as_mut_ptr() as *mut u8, n * 8) };
            if unsafe { bpf_probe_read_user_buf((thd + low) as *const u8, bytes) }.is_err() {
                return [0; 3];
            }
        }
        let word = |offset: u64| scratch[((offset - low) / 8) as usize & (THD_WINDOW_WORDS - 1)];
        // Little-endian: a u32 in the upper half of its word is shifted down.
        let command = word(command) >> ((command % 8) * 8);
        return [command & 0xffff_ffff, word(start), word(lock)];
    }
    let command = unsafe { bpf_probe_read_user((thd + command) as *const u32) }.unwrap_or(0);
    [command as u64, read_thd_u64(thd, start as u32), read_thd_u64(thd, lock as u32)]
}

/// The statement text `{const char*, size_t}` and the current schema
/// `{const char*, size_t}`: one copy (into `scratch`, see
/// [`read_command_and_times`]) when they lie close together (in MariaDB
/// 10.11 and 11.8 they are 56 bytes apart), two otherwise.
#[inline(always)]
pub fn read_text_and_schema(
    thd: u64,
    layout: &ServerLayout,
    scratch: &mut [u64; STATS_WINDOW / 8],
) -> ([u64; 2], [u64; 2]) {
    let query = layout.query_offset as u64;
    let db = layout.db_offset;
    if db == UNKNOWN {
        let text = unsafe { bpf_probe_read_user((thd + query) as *const [u64; 2]) }.unwrap_or([0, 0]);
        return (text, [0, 0]);
    }
    let db = db as u64;
    if db > query && db - query <= 48 && (db - query) % 8 == 0 {
        let head = &mut scratch[..8];
        // SAFETY: eight words of the scratch array.
        let bytes = unsafe { core::slice::from_raw_parts_mut(head.as_mut_ptr() as *mut u8, 64) };
        if unsafe { bpf_probe_read_user_buf((thd + query) as *const u8, bytes) }.is_err() {
            return ([0, 0], [0, 0]);
        }
        let at = ((db - query) / 8) as usize & 7;
        return ([scratch[0], scratch[1]], [scratch[at], scratch[(at + 1) & 7]]);
    }
    let text = unsafe { bpf_probe_read_user((thd + query) as *const [u64; 2]) }.unwrap_or([0, 0]);
    let schema = unsafe { bpf_probe_read_user((thd + db) as *const [u64; 2]) }.unwrap_or([0, 0]);
    (text, schema)
}

#[inline(always)]
pub fn read_thd_u64(thd: u64, offset: u32) -> u64 {
    unsafe { bpf_probe_read_user((thd + offset as u64) as *const u64) }.unwrap_or(0)
}

fn try_statement_end(ctx: &ProbeContext) -> Result<(), i64> {
    if gate_closed() {
        return Ok(());
    }
    let thd: u64 = ctx.arg(0).ok_or(0i64)?;
    // SAFETY: a read of the probe context at a fixed offset.
    end_statement::<false>(thd, || unsafe { (*ctx.regs).rsp })
}

/// Counts, times and records the statement `thd` has just finished.
/// `user_sp` gives the server thread's stack pointer, asked only inside a
/// stored program. `AT_SEND`: called at a send (`crate::send`), where only
/// the answers to `COM_QUERY`, `COM_STMT_EXECUTE` and
/// `COM_STMT_BULK_EXECUTE` are statements; the uprobe also counts the
/// other commands that reach it.
#[inline(always)]
pub fn end_statement<const AT_SEND: bool>(thd: u64, user_sp: impl Fn() -> u64) -> Result<(), i64> {
    let now = unsafe { bpf_ktime_get_ns() };
    let layout = layout();
    let pid_tgid = bpf_get_current_pid_tgid();
    let tid = pid_tgid as u32;
    // Every count below goes into this one block: each further map value
    // touched is another cache line to fetch at every statement.
    let stats = stats().ok_or(0i64)?;
    let inflight = owned_slot(tid).ok_or(0i64)?;
    // Inside a stored program (the statement-end path of a statement a
    // procedure, function, trigger or event ran, or a result set it sent):
    // the nested probes count it on its own; here it is not a client's
    // statement. Its end is deeper in the stack than the start of the
    // nested statement running.
    let nested = |stats: &mut sqlbee_kernel_abi::StatBlock, inflight: &mut Inflight| {
        if inflight.nested_sp != 0 {
            if inflight.nested_sp > user_sp() {
                stats[stat::NESTED_LOG_HITS as usize] += 1;
                return true;
            }
            // That nested statement is over (its end was not seen).
            inflight.nested_sp = 0;
        }
        false
    };
    if !AT_SEND && nested(stats, inflight) {
        return Ok(());
    }

    let buffer = SCRATCH.get_ptr_mut(0).ok_or(0i64)?;
    let buffer = unsafe { &mut *buffer };
    let [command, start_us, lock_utime] = read_command_and_times(thd, layout, &mut buffer.window);
    let command = command as u32 & 0xff;
    // At a send, only an answer to a statement is one (the others answer
    // logins, pings, preparations); the command is tested first, as it is
    // cheaper than the stack.
    if AT_SEND {
        let statement =
            command == command::QUERY || command == command::STMT_EXECUTE || command == command::STMT_BULK_EXECUTE;
        if !statement || nested(stats, inflight) {
            return Ok(());
        }
    }
    let ([text_ptr, text_len], db) = read_text_and_schema(thd, layout, &mut buffer.window);
    // Built in place: the BPF stack (512 bytes) has no room for copies.
    // These steps leave what they learn in the record, not in registers:
    // the verifier does not tell map memory apart by value, so the paths
    // through them merge again instead of multiplying the paths after.
    buffer.header.stats = StatementStats::default();
    query_stats::read(thd, layout, buffer);
    // One statement reaching its end twice (EXECUTE IMMEDIATE) keeps its
    // query id: counted once.
    if buffer.query_id != 0 {
        if inflight.last_query_id == buffer.query_id && inflight.thd == thd {
            stats[stat::DUPLICATE_HITS as usize] += 1;
            return Ok(());
        }
        inflight.last_query_id = buffer.query_id;
        // With its connection: a thread-pool worker takes others' too, and
        // the id alone would not hold across a return below.
        if inflight.thd != thd {
            inflight.thd = thd;
        }
    }
    // The replica's applier is counted apart from what clients sent.
    if buffer.header.source == source::REPLICA {
        stats[stat::REPLICA as usize] += 1;
    } else {
        stats[stat::STATEMENTS as usize] += 1;
        if layout.command_probe == 0 {
            match command {
                command::QUERY => stats[stat::QUERY_STATEMENTS as usize] += 1,
                command::STMT_EXECUTE => stats[stat::EXECUTE_STATEMENTS as usize] += 1,
                _ => bump(&COMMANDS, command),
            }
        }
    }
    let now_us = now / 1000;
    if start_us == 0 || start_us > now_us || now_us - start_us > MAX_STATEMENT_US {
        stats[stat::UNMATCHED as usize] += 1;
        return Ok(());
    }
    let start_ns = start_us * 1000;
    let lock_us = lock_utime.saturating_sub(start_us);
    buffer.header.stats.lock_ns = lock_us * 1000;
    query_stats::cpu(layout, inflight, &mut buffer.header.stats);
    names::schema(thd, db, layout, buffer, inflight);
    names::account::<true>(thd, layout, buffer, inflight);
    buffer.header.program_hash = 0;
    buffer.header.parent_start_ns = 0;
    buffer.header.program_kind = 0;
    // Statements its programs ran end before it and name it as their
    // parent: its record must go out, not into a kernel digest.
    let ran_programs = inflight.nested_parent_us == start_us;

    let mut event_flags = if buffer.header.stats.flags & statement_flag::CPU_MEASURED != 0 { flags::CPU } else { 0 };
    let (mut captured, text_flags) = capture_text(text_ptr, text_len, layout, buffer, stats);
    event_flags |= text_flags;
    // What the optional probes recorded counts only when it happened
    // after this statement began.
    let (error_code, error_ns) = if inflight.error_code != 0 && inflight.error_ns >= start_ns {
        (inflight.error_code, inflight.error_ns)
    } else {
        (0, 0)
    };
    if error_code != 0 {
        event_flags |= flags::ERROR;
    }
    let waits_probed = layout.wait_probes != 0;
    let waits =
        if waits_probed && inflight.waits_epoch_us == start_us { inflight.waits } else { [0; wait_class::COUNT] };
    // Every command resets it, so it is this command's when set at all.
    let stmt_id = if inflight.command_ns != 0 { inflight.stmt_id } else { 0 };

    // The slot is written only where it changes: a line other CPUs read
    // stays shared instead of moving to this one at every statement.
    if inflight.thd != thd {
        inflight.thd = thd;
    }
    if inflight.error_code != 0 {
        inflight.error_code = 0;
    }
    if waits_probed {
        inflight.waits_epoch_us = 0;
        inflight.ended_epoch_us = start_us;
        inflight.waits = [0; wait_class::COUNT];
    }

    let duration_ns = now.saturating_sub(start_ns);
    let digest_slots = layout.digest_slots;
    let text_hash = if digest_slots != 0 && event_flags & (flags::TRUNCATED | flags::NO_TEXT) == 0 {
        with_schema(
            kernel_digests::sqlbee_text_hash(captured, (command == command::STMT_EXECUTE) as u64),
            buffer.header.schema_hash,
        )
    } else {
        0
    };
    let waited = waits.iter().any(|w| *w != 0);
    // Only a statement that is sent needs its record assembled.
    // Field by field: `stats` is in place already, and a whole header
    // would not fit on the stack.
    let write_header = |buffer: &mut EventBuffer, record_flags: u32| {
        let header = &mut buffer.header;
        header.start_ns = start_ns;
        header.duration_ns = duration_ns;
        header.thd = thd;
        header.pid = (pid_tgid >> 32) as u32;
        header.tid = tid;
        header.command = command;
        header.stmt_id = stmt_id;
        header.error_code = error_code;
        header.text_len = text_len.min(u32::MAX as u64) as u32;
        header.captured_len = captured as u32;
        header.flags = record_flags;
        header.error_ns = error_ns;
        header.waits = waits;
        header.text_hash = text_hash;
    };

    // Errors and waits travel with the statement record, so only plain
    // statements are counted into kernel digests.
    if text_hash != 0
        && error_code == 0
        && (layout.long_statement_ms == 0 || duration_ns < layout.long_statement_ms as u64 * 1_000_000)
        && !waited
        && !ran_programs
        // Its record names the connection, whose client is not known yet,
        // or carries the statement whose values the agent pairs.
        && inflight.record_pending == 0
        && buffer.header.source == source::CLIENT
        && let Some(first) = kernel_digests::record(
            text_hash,
            duration_ns,
            digest_slots,
            layout.known_sets,
            &buffer.header.stats,
            layout.known_needs(),
            buffer.header.account_hash,
        )
    {
        stats[stat::KERNEL_COUNTED as usize] += 1;
        if first && kernel_digests::shedding_step() == 0 {
            // Counted already: the record only refreshes the sample text,
            // and losing it loses nothing.
            write_header(buffer, event_flags | flags::SAMPLE);
            let _ = send(buffer, captured);
        }
        return Ok(());
    }

    write_header(buffer, event_flags);
    // This record is the one the copied values belong to.
    if inflight.record_pending & record_pending::VALUES != 0 {
        inflight.record_pending &= !record_pending::VALUES;
    }
    // Read with the counters when the build keeps it among them.
    if buffer.header.connection_id == 0 {
        buffer.header.connection_id = read_thd_u64(thd, layout.connection_id_offset);
    }
    // While shedding, one record in SHED_TEXT_EVERY (per CPU) keeps its text.
    let text_sample_due = stats[stat::EVENTS as usize] % SHED_TEXT_EVERY == 0;
    if digest_slots != 0 && kernel_digests::shedding_step() >= 2 && !text_sample_due {
        captured = 0;
        buffer.header.captured_len = 0;
        buffer.header.flags |= flags::SHED | flags::NO_TEXT;
        // Not registered from a record without its text.
        buffer.header.text_hash = 0;
    }
    if send(buffer, captured) {
        stats[stat::EVENTS as usize] += 1;
    } else {
        stats[stat::DROPPED as usize] += 1;
    }
    Ok(())
}

/// Copies the statement text (at most the configured limit) into the
/// record; the bytes copied and the flags that say what became of it.
#[inline(always)]
pub fn capture_text(
    text_ptr: u64,
    text_len: u64,
    layout: &ServerLayout,
    buffer: &mut EventBuffer,
    stats: &mut sqlbee_kernel_abi::StatBlock,
) -> (u64, u32) {
    let mut event_flags = 0;
    let mut captured = text_len;
    let limit = layout.text_limit as u64;
    if captured > limit {
        captured = limit;
        event_flags |= flags::TRUNCATED;
    }
    if captured > MAX_TEXT as u64 {
        captured = MAX_TEXT as u64;
        event_flags |= flags::TRUNCATED;
    }
    if text_ptr == 0 || text_len == 0 {
        captured = 0;
        event_flags |= flags::NO_TEXT;
    } else {
        // The mask restates the bound in a form the verifier tracks.
        let n = (captured as usize) & (MAX_TEXT * 2 - 1);
        if n > MAX_TEXT || unsafe { bpf_probe_read_user_buf(text_ptr as *const u8, &mut buffer.text[..n]) }.is_err() {
            stats[stat::READ_FAILED as usize] += 1;
            captured = 0;
            event_flags |= flags::NO_TEXT;
        }
    }
    (captured, event_flags)
}

/// Copies the record (header and `captured` text bytes) to the ring
/// buffer; false when it is full.
#[inline(always)]
pub fn send(buffer: &EventBuffer, captured: u64) -> bool {
    let total = (EVENT_HEADER_LEN + captured as usize) & (MAX_TEXT * 2 - 1);
    // SAFETY: `total` is at most the size of the buffer, checked below.
    let bytes = unsafe { core::slice::from_raw_parts(buffer as *const _ as *const u8, total) };
    total <= EVENT_HEADER_LEN + MAX_TEXT && EVENTS.output(bytes, BPF_RB_NO_WAKEUP as u64).is_ok()
}
