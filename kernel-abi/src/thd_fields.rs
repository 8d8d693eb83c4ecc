//! The THD fields the statement program reads at a statement's end, in one
//! table: the server's per-statement counters (the figures), the
//! connection id, where the statement came from and the query id.
//!
//! A field's index ([`thd_field`]) names its layout slots
//! (`ServerLayout::field_at`, `field_rel`) and its bit (`1 << index`, the
//! [`stats_field`] bits; for a figure's counter that bit is the figure's
//! `needs`, so one bit set says what is readable). How the agent finds each
//! field in a build is the agent's table (`discover::binary`); how the
//! program copies ([`alone_copy`]) and reads ([`decode`]) them is here, one
//! copy of the code that the kernel runs and the agent's unit tests check.
use crate::{STATS_WINDOW, ServerLayout, StatementStats, plan, server_status, source, statement_flag as bit};

/// The fields, by index.
pub mod thd_field {
    pub const ROWS_SENT: usize = 0;
    pub const ROWS_EXAMINED: usize = 1;
    pub const ROWS_AFFECTED: usize = 2;
    /// `query_plan_flags` (u64), then `query_plan_fsort_passes`,
    /// `tmp_tables_used` and `tmp_tables_disk_used` in the next three words.
    pub const PLAN: usize = 3;
    /// `server_status` (u32).
    pub const SERVER_STATUS: usize = 4;
    /// The connection id (it names the connection whose account is cached).
    pub const CONNECTION_ID: usize = 5;
    /// `system_thread` (u32): the replica's applier, the event scheduler.
    pub const SYSTEM_THREAD: usize = 6;
    /// `query_id` (u64): tells a second end of one statement.
    pub const QUERY_ID: usize = 7;
    pub const COUNT: usize = 8;

    /// Bytes each one spans, by index.
    pub const WIDTH: [u32; COUNT] = [8, 8, 8, 32, 4, 8, 4, 8];

    /// Bytes each one's offset is a multiple of, by index.
    pub const ALIGN: [u32; COUNT] = [8, 8, 8, 8, 4, 8, 4, 8];
}

/// Bits of [`ServerLayout::stats_fields`] and `stats_alone`: `1 << index`
/// of each [`thd_field`].
pub mod stats_field {
    use super::thd_field as field;

    pub const ROWS_SENT: u32 = 1 << field::ROWS_SENT;
    pub const ROWS_EXAMINED: u32 = 1 << field::ROWS_EXAMINED;
    pub const ROWS_AFFECTED: u32 = 1 << field::ROWS_AFFECTED;
    pub const PLAN: u32 = 1 << field::PLAN;
    pub const SERVER_STATUS: u32 = 1 << field::SERVER_STATUS;
    pub const CONNECTION_ID: u32 = 1 << field::CONNECTION_ID;
    pub const SYSTEM_THREAD: u32 = 1 << field::SYSTEM_THREAD;
    pub const QUERY_ID: u32 = 1 << field::QUERY_ID;

    // A figure's counter and the figure's `needs` are one bit.
    const _: () = {
        use sqlbee_figures::needs;
        assert!(ROWS_SENT == needs::ROWS_SENT && ROWS_EXAMINED == needs::ROWS_EXAMINED);
        assert!(ROWS_AFFECTED == needs::ROWS_AFFECTED && PLAN == needs::PLAN);
        assert!(SERVER_STATUS == needs::SERVER_STATUS);
        assert!(needs::CPU >> field::COUNT != 0, "CPU time is no THD field");
    };
}

const WORDS: usize = STATS_WINDOW / 8;

/// One field copied on its own: `len` bytes from THD+`from` into the
/// window at byte `to`, both whole words.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AloneCopy {
    pub from: u32,
    pub to: u32,
    pub len: u32,
}

/// Bytes one field's copy on its own takes at most: the widest field (the
/// plan's 32) from a word boundary.
pub const MAX_ALONE: u32 = 32;

/// How `field` is copied when the layout reads it on its own, or None.
#[inline(always)]
pub fn alone_copy(layout: &ServerLayout, field: usize) -> Option<AloneCopy> {
    if field >= thd_field::COUNT || layout.stats_alone & (1 << field) == 0 {
        return None;
    }
    let at = layout.field_at[field];
    // Fields are aligned to their width, so a field never straddles more
    // words than its width rounds up to.
    let misaligned = at % 8;
    let len = (misaligned + thd_field::WIDTH[field]).div_ceil(8) * 8;
    Some(AloneCopy { from: at - misaligned, to: layout.field_rel[field].wrapping_sub(misaligned), len })
}

/// Where a statement came from and which one it is, read with its figures.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Identity {
    /// 0 when unknown.
    pub connection_id: u64,
    /// A [`source`] value.
    pub source: u32,
    /// 0 when unknown.
    pub query_id: u64,
}

/// Reads the fields whose [`stats_field`] bits are in `fields` (those
/// copied for this statement) out of the window into `stats` and the
/// statement's identity. A field not in `fields` is left as it is (0).
#[inline(always)]
pub fn decode(window: &[u64; WORDS], layout: &ServerLayout, fields: u32, stats: &mut StatementStats) -> Identity {
    // The agent checked every slot against the window; the masks restate
    // that for the verifier.
    let word = |field: usize| window[(layout.field_rel[field] as usize / 8) & (WORDS - 1)];
    // A u32 sits in the low or the high half of its word (little-endian).
    let half = |field: usize| (word(field) >> ((layout.field_rel[field] % 8) * 8)) as u32;
    let has = |field: usize| fields & (1 << field) != 0;
    if has(thd_field::ROWS_SENT) {
        stats.rows_sent = word(thd_field::ROWS_SENT);
    }
    if has(thd_field::ROWS_EXAMINED) {
        stats.rows_examined = word(thd_field::ROWS_EXAMINED);
    }
    if has(thd_field::ROWS_AFFECTED) {
        stats.rows_affected = word(thd_field::ROWS_AFFECTED);
    }
    // Counters a statement cannot push past u32 are kept as u32.
    if has(thd_field::PLAN) {
        let at = layout.field_rel[thd_field::PLAN] as usize / 8;
        let flags = window[at & (WORDS - 1)];
        stats.sort_merge_passes = window[(at + 1) & (WORDS - 1)] as u32;
        stats.tmp_tables = window[(at + 2) & (WORDS - 1)] as u32;
        stats.tmp_disk_tables = window[(at + 3) & (WORDS - 1)] as u32;
        for (plan_bit, flag) in [
            (plan::FULL_JOIN, bit::SELECT_FULL_JOIN),
            (plan::FULL_SCAN, bit::SELECT_SCAN),
            (plan::FILESORT, bit::FILESORT),
            (plan::FILESORT_DISK, bit::FILESORT_ON_DISK),
        ] {
            if flags & plan_bit != 0 {
                stats.flags |= flag;
            }
        }
    }
    if has(thd_field::SERVER_STATUS) {
        let status = half(thd_field::SERVER_STATUS);
        if status & server_status::NO_INDEX_USED != 0 {
            stats.flags |= bit::NO_INDEX_USED;
        }
        if status & server_status::NO_GOOD_INDEX_USED != 0 {
            stats.flags |= bit::NO_GOOD_INDEX_USED;
        }
    }
    let system_thread = if has(thd_field::SYSTEM_THREAD) { half(thd_field::SYSTEM_THREAD) } else { 0 };
    Identity {
        connection_id: if has(thd_field::CONNECTION_ID) { word(thd_field::CONNECTION_ID) } else { 0 },
        source: match system_thread {
            source::SYSTEM_THREAD_SLAVE_SQL => source::REPLICA,
            source::SYSTEM_THREAD_EVENT_WORKER => source::EVENT,
            _ => source::CLIENT,
        },
        query_id: if has(thd_field::QUERY_ID) { word(thd_field::QUERY_ID) } else { 0 },
    }
}
