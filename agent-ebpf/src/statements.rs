//! Statement capture: the start of a command and the end of each
//! statement it runs.
//!
//! `dispatch_command` starts every client command; `log_slow_statement`
//! runs once per finished statement (each of a multi-statement query too)
//! while the THD still holds the statement text, for prepared statements
//! the text with `?` placeholders, even when they were prepared before we
//! attached. Placement lives here only; the agent names the symbols.
use agent_common::{
    EVENT_HEADER_LEN, Inflight, MAX_TEXT, StatementEvent, flags, stat, wait_class,
};
use aya_ebpf::{
    bindings::BPF_RB_NO_WAKEUP,
    helpers::{bpf_get_current_pid_tgid, bpf_ktime_get_ns, bpf_probe_read_user, bpf_probe_read_user_buf},
    macros::uprobe,
    programs::ProbeContext,
};

use crate::{
    layout::layout,
    maps::{COMMANDS, EVENTS, SCRATCH, STATS, bump, inflight_slot},
};

/// `COM_STMT_EXECUTE`: its packet starts with the 4-byte statement id.
const COM_STMT_EXECUTE: u32 = 23;

#[uprobe]
pub fn command_start(ctx: ProbeContext) -> u32 {
    let _ = try_command_start(&ctx);
    0
}

fn try_command_start(ctx: &ProbeContext) -> Result<(), i64> {
    let layout = layout();
    let args = args(ctx);
    let command = arg_at(&args, layout.command_arg).ok_or(0i64)?;
    let thd = arg_at(&args, layout.thd_arg).ok_or(0i64)?;
    let command = command as u32 & 0xff;
    bump(&COMMANDS, command);

    let mut stmt_id = 0;
    if command == COM_STMT_EXECUTE && layout.packet_arg != u32::MAX {
        let packet = arg_at(&args, layout.packet_arg).ok_or(0i64)?;
        stmt_id = unsafe { bpf_probe_read_user(packet as *const u32) }.unwrap_or(0);
    }
    let tid = bpf_get_current_pid_tgid() as u32;
    let slot = inflight_slot(tid).ok_or(0i64)?;
    // SAFETY: the slot points into the array map's value for this index.
    unsafe {
        *slot = Inflight { start_ns: bpf_ktime_get_ns(), thd, tid, command, stmt_id, ..Inflight::default() };
    }
    Ok(())
}

/// The first four arguments as register values. The verifier only allows
/// constant offsets into the context, so every register is read and the
/// layout picks among the values, never among pointers.
#[inline(always)]
fn args(ctx: &ProbeContext) -> [u64; 4] {
    [
        ctx.arg(0).unwrap_or(0),
        ctx.arg(1).unwrap_or(0),
        ctx.arg(2).unwrap_or(0),
        ctx.arg(3).unwrap_or(0),
    ]
}

#[inline(always)]
fn arg_at(args: &[u64; 4], index: u32) -> Option<u64> {
    args.get(index as usize).copied()
}

#[uprobe]
pub fn statement_end(ctx: ProbeContext) -> u32 {
    let _ = try_statement_end(&ctx);
    0
}

fn try_statement_end(ctx: &ProbeContext) -> Result<(), i64> {
    let now = unsafe { bpf_ktime_get_ns() };
    let layout = layout();
    let thd: u64 = ctx.arg(0).ok_or(0i64)?;
    let pid_tgid = bpf_get_current_pid_tgid();
    let tid = pid_tgid as u32;
    bump(&STATS, stat::STATEMENTS);

    let Some(inflight) = inflight_slot(tid) else {
        bump(&STATS, stat::UNMATCHED);
        return Ok(());
    };
    let inflight = unsafe { &mut *inflight };
    if inflight.tid != tid || inflight.thd != thd || inflight.start_ns == 0 {
        bump(&STATS, stat::UNMATCHED);
        return Ok(());
    }
    let buffer = SCRATCH.get_ptr_mut(0).ok_or(0i64)?;
    let buffer = unsafe { &mut *buffer };

    let query = (thd + layout.query_offset as u64) as *const u64;
    let text_ptr = unsafe { bpf_probe_read_user(query) }.unwrap_or(0);
    let text_len = unsafe { bpf_probe_read_user(query.wrapping_add(1)) }.unwrap_or(0);
    let connection_id = unsafe {
        bpf_probe_read_user((thd + layout.connection_id_offset as u64) as *const u64)
    }
    .unwrap_or(0);

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
        if n > MAX_TEXT
            || unsafe { bpf_probe_read_user_buf(text_ptr as *const u8, &mut buffer.text[..n]) }
                .is_err()
        {
            bump(&STATS, stat::READ_FAILED);
            captured = 0;
            event_flags |= flags::NO_TEXT;
        }
    }
    if inflight.error_code != 0 {
        event_flags |= flags::ERROR;
    }

    buffer.header = StatementEvent {
        start_ns: inflight.start_ns,
        duration_ns: now.saturating_sub(inflight.start_ns),
        thd,
        connection_id,
        pid: (pid_tgid >> 32) as u32,
        tid,
        command: inflight.command,
        stmt_id: inflight.stmt_id,
        error_code: inflight.error_code,
        text_len: text_len.min(u32::MAX as u64) as u32,
        captured_len: captured as u32,
        flags: event_flags,
        waits: inflight.waits,
    };
    // The next statement of a multi-statement query starts now.
    inflight.start_ns = now;
    inflight.error_code = 0;
    inflight.waits = [0; wait_class::COUNT];
    inflight.statement_ended = 1;

    let total = (EVENT_HEADER_LEN + captured as usize) & (MAX_TEXT * 2 - 1);
    let bytes = unsafe {
        core::slice::from_raw_parts(buffer as *const _ as *const u8, total)
    };
    if total > EVENT_HEADER_LEN + MAX_TEXT || EVENTS.output(bytes, BPF_RB_NO_WAKEUP as u64).is_err() {
        bump(&STATS, stat::DROPPED);
    } else {
        bump(&STATS, stat::EVENTS);
    }
    Ok(())
}
