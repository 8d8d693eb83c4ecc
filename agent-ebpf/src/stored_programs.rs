//! Statements stored programs run: procedure, function, trigger and event
//! bodies. Each SQL statement of a program runs through
//! `sp_instr_stmt::execute`, whatever `log_slow_disabled_statements` says,
//! so its entry is the nested statement's start and its call of
//! `THD::add_slow_query_state` (which folds the statement's counters into
//! the enclosing one's) its end: at that call the THD still holds the
//! statement's own text and counters. Neither is reached by a statement
//! that runs no program, which therefore pays nothing.
//!
//! A start is matched to its end by the stack pointer at the start: the
//! end sees the same frame (`%rbp + 8`). Starts whose end never came (a
//! query-cache hit, an allocation failure) are dropped when a shallower
//! start or end comes.
use sqlbee_kernel_abi::{
    EventBuffer, FRAME_SLOTS, Frame, FrameStack, MAX_FRAMES, ServerLayout, StatementStats, UNKNOWN, flags, name_kind,
    program_kind, source, stat,
};

use aya_ebpf::{
    helpers::{bpf_get_current_pid_tgid, bpf_ktime_get_ns, bpf_probe_read_user, bpf_probe_read_user_buf},
    macros::map,
    maps::Array,
    programs::ProbeContext,
};

use crate::{
    bounds,
    layout::layout,
    maps::{SCRATCH, gate_closed, stats},
    names, query_stats,
    statements::{capture_text, owned_slot, read_command_and_times, read_text_and_schema, send},
};

/// Per thread (`tid % FRAME_SLOTS`, owned like the in-flight slots): how
/// many nested statements are in progress.
#[map]
pub static FRAMES: Array<FrameStack> = Array::with_max_entries(FRAME_SLOTS, 0);

/// Their frames, `MAX_FRAMES` per slot.
#[map]
pub static FRAME_ENTRIES: Array<Frame> = Array::with_max_entries(FRAME_SLOTS * MAX_FRAMES as u32, 0);

/// Frame `level` (0: outermost) of thread `tid`'s slot.
#[inline(always)]
fn frame(tid: u32, level: u32) -> Option<&'static mut Frame> {
    let index = (tid & (FRAME_SLOTS - 1)) * MAX_FRAMES as u32 + level;
    // SAFETY: a value of the array map (the lookup checks the index).
    FRAME_ENTRIES.get_ptr_mut(index).map(|f| unsafe { &mut *f })
}

uprobe_pair! {
    nested_start, nested_start_perf => on_nested_start;
    nested_end, nested_end_perf => on_nested_end;
}

#[inline(always)]
fn frame_stack(tid: u32) -> Option<&'static mut FrameStack> {
    let slot = FRAMES.get_ptr_mut(tid & (FRAME_SLOTS - 1))?;
    // SAFETY: a value of the array map; only this thread writes a slot it owns.
    let stack = unsafe { &mut *slot };
    if stack.tid != tid {
        stack.tid = tid;
        stack.depth = 0;
    }
    Some(stack)
}

/// Drops frames at or below `sp`: a frame deeper than the current stack
/// position can only be one whose end never came.
#[inline(always)]
fn prune(stack: &mut FrameStack, tid: u32, sp: u64) {
    for _ in 0..MAX_FRAMES {
        let depth = stack.depth;
        if depth == 0 || depth as usize > MAX_FRAMES {
            break;
        }
        match frame(tid, depth - 1) {
            Some(f) if f.entry_sp <= sp => stack.depth -= 1,
            _ => break,
        }
    }
}

/// `sp_instr_stmt::execute` entry: a stored program starts a statement.
#[inline(always)]
fn on_nested_start(ctx: ProbeContext) -> u32 {
    if gate_closed() {
        return 0;
    }
    let tid = bpf_get_current_pid_tgid() as u32;
    // SAFETY: a read of the probe context at a fixed offset.
    let sp = unsafe { (*ctx.regs).rsp };
    let Some(stack) = frame_stack(tid) else { return 0 };
    // A frame at this stack position or deeper has ended.
    prune(stack, tid, sp);
    let depth = stack.depth;
    if depth as usize >= MAX_FRAMES {
        return 0;
    }
    let Some(slot) = frame(tid, depth) else { return 0 };
    let layout = layout();
    *slot = Frame { entry_sp: sp, start_ns: unsafe { bpf_ktime_get_ns() }, cpu_ns: query_stats::runtime(layout) };
    stack.depth += 1;
    if let Some(inflight) = owned_slot(tid) {
        inflight.nested_sp = sp;
    }
    0
}

/// The `call THD::add_slow_query_state` in `sp_instr_stmt::execute`: the
/// statement is over, its counters not yet folded into its parent's.
#[inline(always)]
fn on_nested_end(ctx: ProbeContext) -> u32 {
    let _ = try_nested_end(&ctx);
    0
}

fn try_nested_end(ctx: &ProbeContext) -> Result<(), i64> {
    if gate_closed() {
        return Ok(());
    }
    let now = unsafe { bpf_ktime_get_ns() };
    let layout = layout();
    let pid_tgid = bpf_get_current_pid_tgid();
    let tid = pid_tgid as u32;
    let thd: u64 = ctx.arg(0).ok_or(0i64)?;
    let stats = stats().ok_or(0i64)?;
    stats[stat::NESTED as usize] += 1;
    // `execute` keeps %rbp at its entry stack pointer minus 8.
    // SAFETY: a read of the probe context at a fixed offset.
    let frame_sp = unsafe { (*ctx.regs).rbp } + 8;
    let stack = frame_stack(tid).ok_or(0i64)?;
    // Deeper frames still open ended without their end: drop them.
    prune(stack, tid, frame_sp - 1);
    let depth = stack.depth;
    let matched = if depth == 0 || depth as usize > MAX_FRAMES { None } else { frame(tid, depth - 1) };
    let frame_start = match matched {
        Some(f) if f.entry_sp == frame_sp => *f,
        _ => {
            stats[stat::NESTED_UNMATCHED as usize] += 1;
            return Ok(());
        }
    };
    stack.depth -= 1;
    let outer_sp = if depth >= 2 { frame(tid, depth - 2).map_or(0, |f| f.entry_sp) } else { 0 };
    let frame = frame_start;
    let inflight = owned_slot(tid).ok_or(0i64)?;
    inflight.nested_sp = outer_sp;

    let buffer = SCRATCH.get_ptr_mut(0).ok_or(0i64)?;
    let buffer = unsafe { &mut *buffer };
    // The client statement the program runs for began at start_utime,
    // which the server does not reset for a program's statements.
    let [command, parent_start_us, _] = read_command_and_times(thd, layout, &mut buffer.window);
    let ([text_ptr, text_len], db) = read_text_and_schema(thd, layout, &mut buffer.window);
    buffer.header.stats = StatementStats::default();
    query_stats::read(thd, layout, buffer);
    let runtime = query_stats::runtime(layout);
    if frame.cpu_ns != 0 && runtime >= frame.cpu_ns {
        buffer.header.stats.cpu_ns = runtime - frame.cpu_ns;
        buffer.header.stats.flags |= sqlbee_kernel_abi::statement_flag::CPU_MEASURED;
    }
    names::schema(thd, db, layout, buffer, inflight);
    names::account::<false>(thd, layout, buffer, inflight);
    program(thd, layout, buffer, inflight);
    inflight.nested_parent_us = parent_start_us;
    let (captured, text_flags) = capture_text(text_ptr, text_len, layout, buffer, stats);
    let mut record_flags = flags::NESTED | text_flags;
    if buffer.header.stats.flags & sqlbee_kernel_abi::statement_flag::CPU_MEASURED != 0 {
        record_flags |= flags::CPU;
    }
    let (error_code, error_ns) = if inflight.error_code != 0 && inflight.error_ns >= frame.start_ns {
        (inflight.error_code, inflight.error_ns)
    } else {
        (0, 0)
    };
    if error_code != 0 {
        record_flags |= flags::ERROR;
    }
    let header = &mut buffer.header;
    header.start_ns = frame.start_ns;
    header.duration_ns = now.saturating_sub(frame.start_ns);
    header.thd = thd;
    header.pid = (pid_tgid >> 32) as u32;
    header.tid = tid;
    header.command = command as u32 & 0xff;
    header.stmt_id = 0;
    header.error_code = error_code;
    header.error_ns = error_ns;
    header.text_len = text_len.min(u32::MAX as u64) as u32;
    header.captured_len = captured as u32;
    header.flags = record_flags;
    header.parent_start_ns = if header.source == source::EVENT { 0 } else { parent_start_us * 1000 };
    header.waits = [0; sqlbee_kernel_abi::wait_class::COUNT];
    header.text_hash = 0;
    if send(buffer, captured) {
        stats[stat::EVENTS as usize] += 1;
    } else {
        stats[stat::DROPPED as usize] += 1;
    }
    Ok(())
}

/// The running program (`thd->spcont->m_sp`): its kind, and its name's
/// hash, with the name sent when this thread has not sent it last.
#[inline(always)]
fn program(thd: u64, layout: &ServerLayout, buffer: &mut EventBuffer, inflight: &mut sqlbee_kernel_abi::Inflight) {
    buffer.header.program_hash = 0;
    buffer.header.program_kind = program_kind::UNKNOWN;
    if layout.spcont_offset == UNKNOWN {
        return;
    }
    let read = |at: u64| unsafe { bpf_probe_read_user(at as *const u64) }.unwrap_or(0);
    let spcont = read(thd + layout.spcont_offset as u64);
    if spcont == 0 {
        return;
    }
    let sp = read(spcont + layout.rcontext_sp_offset as u64);
    if sp == 0 {
        return;
    }
    let handler = read(sp + layout.sp_handler_offset as u64);
    let sp_flags = read(sp + layout.sp_flags_offset as u64) as u32;
    let [db, db_len] =
        unsafe { bpf_probe_read_user((sp + layout.sp_db_offset as u64) as *const [u64; 2]) }.unwrap_or([0, 0]);
    let [name, name_len] =
        unsafe { bpf_probe_read_user((sp + layout.sp_name_offset as u64) as *const [u64; 2]) }.unwrap_or([0, 0]);
    buffer.header.program_kind = if handler == layout.handler_trigger {
        program_kind::TRIGGER
    } else if handler == layout.handler_function {
        program_kind::FUNCTION
    } else if handler == layout.handler_procedure {
        if name == 0 {
            program_kind::ANONYMOUS
        } else if sp_flags & program_kind::EVENT_BODY_FLAG != 0 {
            program_kind::EVENT
        } else {
            program_kind::PROCEDURE
        }
    } else {
        program_kind::UNKNOWN
    };
    if name == 0 {
        return;
    }
    let record = &mut buffer.name;
    names::clear(&mut record.name);
    names::clear(&mut record.host);
    let db_n = bounds::within::<{ sqlbee_kernel_abi::MAX_NAME }>(db_len);
    let name_n = bounds::within::<{ sqlbee_kernel_abi::MAX_HOST }>(name_len);
    if db != 0 && db_n <= sqlbee_kernel_abi::MAX_NAME {
        let _ = unsafe { bpf_probe_read_user_buf(db as *const u8, &mut record.name[..db_n]) };
    }
    if name_n <= sqlbee_kernel_abi::MAX_HOST {
        let _ = unsafe { bpf_probe_read_user_buf(name as *const u8, &mut record.host[..name_n]) };
    }
    let hash = names::hash_bytes(&record.name, db_len, 0x9009_0000)
        ^ names::hash_bytes(&record.host, name_len, 0x7a3e_0000).rotate_left(11);
    let hash = hash | 1;
    buffer.header.program_hash = hash;
    if inflight.program_hash != hash {
        inflight.program_hash = hash;
        record.kind = name_kind::PROGRAM;
        record.name_len = db_n as u32;
        record.host_len = name_n as u32;
        record.hash = hash;
        names::send(record);
    }
}
