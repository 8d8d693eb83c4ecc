//! Where a build keeps each THD field the statement program reads
//! (`sqlbee_kernel_abi::thd_field`: the figures' counters, the connection
//! id, the source, the query id), one row per field in [`SOURCES`]: the
//! exported function whose code touches it and how its offset is decoded
//! from that code. The field's width and alignment are the kernel ABI's;
//! how it is read (inside the shared window or copied on its own) is
//! decided by [`place`] from where the build keeps them all.
//!
//! A field whose code does not match is left out with its reason, and a
//! field far from the others is copied on its own: neither ever takes
//! another field, or the query id that counts each statement once, with it.
use sqlbee_kernel_abi::{MAX_ALONE, STATS_WINDOW, ServerLayout, plan, thd_field};

use super::x86::{decode_mov_rdi, find_disp, find_disp_imm8, find_disp_imm32, strip_endbr};

const SET_SENT_ROW_COUNT: &str = "_ZN3THD18set_sent_row_countEy";
/// 10.x; 11.x dropped it for `ps_report_examined_row_count`.
const SET_EXAMINED_ROW_COUNT: &str = "_ZN3THD22set_examined_row_countEy";
const PS_REPORT_EXAMINED_ROW_COUNT: &str = "_ZN3THD28ps_report_examined_row_countEv";
const STORE_SLOW_QUERY_STATE: &str = "_ZN3THD22store_slow_query_stateEP19Sub_statement_state";
const INC_TMP_TABLES: &str = "_ZN3THD29inc_status_created_tmp_tablesEv";
const INC_TMP_DISK_TABLES: &str = "_ZN3THD34inc_status_created_tmp_disk_tablesEv";
const SET_NO_INDEX_USED: &str = "_ZN3THD24set_status_no_index_usedEv";
const SET_NO_GOOD_INDEX_USED: &str = "_ZN3THD29set_status_no_good_index_usedEv";
const THD_QUERY_ID: &str = "thd_query_id";
/// Also where `binary` finds the connection's socket.
pub(super) const THD_IS_CONNECTED: &str = "thd_is_connected";

/// The machine code of an exported function, by symbol (empty when it is
/// not there).
pub type Code<'a> = &'a dyn Fn(&'static str) -> Vec<u8>;

/// How one field's offset is found in a build.
pub struct Source {
    /// Its `thd_field` index.
    pub field: usize,
    /// What it gives, for the list of what a build leaves out.
    pub what: &'static str,
    /// The function whose code says where it is.
    pub symbol: &'static str,
    pub find: fn(Code<'_>) -> Option<u32>,
}

/// Every field the program reads but the connection id (which the
/// statement probe needs anyway, and finds first).
pub const SOURCES: [Source; 7] = [
    Source { field: thd_field::ROWS_SENT, what: "rows_sent", symbol: SET_SENT_ROW_COUNT, find: rows_sent },
    Source {
        field: thd_field::ROWS_EXAMINED,
        what: "rows_examined",
        symbol: SET_EXAMINED_ROW_COUNT,
        find: rows_examined,
    },
    Source {
        field: thd_field::ROWS_AFFECTED,
        what: "rows_affected",
        symbol: STORE_SLOW_QUERY_STATE,
        find: rows_affected,
    },
    Source {
        field: thd_field::PLAN,
        what: "tmp_tables, tmp_disk_tables, sort_merge_passes, select_scan, select_full_join",
        symbol: INC_TMP_TABLES,
        find: plan_flags,
    },
    Source {
        field: thd_field::SERVER_STATUS,
        what: "no_index_used, no_good_index_used",
        symbol: SET_NO_INDEX_USED,
        find: server_status,
    },
    Source {
        field: thd_field::SYSTEM_THREAD,
        what: "source (replica applier, event scheduler)",
        symbol: THD_IS_CONNECTED,
        find: system_thread,
    },
    Source {
        field: thd_field::QUERY_ID,
        what: "query id (second ends of one statement)",
        symbol: THD_QUERY_ID,
        find: query_id,
    },
];

/// `mov %rsi,disp32(%rdi)` in `THD::set_sent_row_count`.
fn rows_sent(code: Code<'_>) -> Option<u32> {
    find_disp(&code(SET_SENT_ROW_COUNT), &[0x48, 0x89, 0xb7])
}

/// The same store in `THD::set_examined_row_count`, or the load in
/// `ps_report_examined_row_count` on builds that inline the former.
fn rows_examined(code: Code<'_>) -> Option<u32> {
    find_disp(&code(SET_EXAMINED_ROW_COUNT), &[0x48, 0x89, 0xb7])
        .or_else(|| find_disp(&code(PS_REPORT_EXAMINED_ROW_COUNT), &[0x48, 0x8b, 0xb7]))
}

/// `store_slow_query_state` saves `affected_rows` first.
fn rows_affected(code: Code<'_>) -> Option<u32> {
    match strip_endbr(&code(STORE_SLOW_QUERY_STATE)) {
        [0x48, 0x8b, 0x87 | 0x97, a, b, c, d, ..] => u32::try_from(i32::from_le_bytes([*a, *b, *c, *d])).ok(),
        _ => None,
    }
}

/// `query_plan_flags |= QPLAN_TMP_TABLE; tmp_tables_used++` and the disk
/// variant: the flags word, then `query_plan_fsort_passes`,
/// `tmp_tables_used` and `tmp_tables_disk_used`, as the server declares
/// them. Both functions must agree on all of it.
fn plan_flags(code: Code<'_>) -> Option<u32> {
    let tmp = code(INC_TMP_TABLES);
    let disk = code(INC_TMP_DISK_TABLES);
    find_disp_imm32(&tmp, &[0x48, 0x81, 0x8f], plan::TMP_TABLE as u32).filter(|at| {
        find_disp_imm32(&disk, &[0x48, 0x81, 0x8f], plan::TMP_DISK as u32) == Some(*at)
            && find_disp_imm8(&tmp, &[0x48, 0x83, 0x87], 1) == Some(at + 16)
            && find_disp_imm8(&disk, &[0x48, 0x83, 0x87], 1) == Some(at + 24)
    })
}

/// `orl $0x20` and `orl $0x10` into `server_status`, in the two setters.
fn server_status(code: Code<'_>) -> Option<u32> {
    find_disp_imm8(&code(SET_NO_INDEX_USED), &[0x83, 0x8f], 0x20)
        .filter(|at| find_disp_imm8(&code(SET_NO_GOOD_INDEX_USED), &[0x83, 0x8f], 0x10) == Some(*at))
}

/// `thd_is_connected` starts by loading `system_thread` (a u32).
fn system_thread(code: Code<'_>) -> Option<u32> {
    match strip_endbr(&code(THD_IS_CONNECTED)) {
        [0x8b, 0x97, a, b, c, d, ..] => u32::try_from(i32::from_le_bytes([*a, *b, *c, *d])).ok(),
        _ => None,
    }
}

/// `thd_query_id` is `mov disp(%rdi),%rax; ret`.
fn query_id(code: Code<'_>) -> Option<u32> {
    decode_mov_rdi(&code(THD_QUERY_ID))
}

/// Bytes the copy of `field` at `at` takes on its own: whole words.
fn alone_len(field: usize, at: u32) -> u32 {
    (at % 8 + thd_field::WIDTH[field]).div_ceil(8) * 8
}

/// Places the fields found (`(thd_field index, offset in THD)`, each at an
/// offset its alignment allows) for the program: sets `stats_base`,
/// `stats_len`, `stats_fields`, `stats_alone`, `field_at` and
/// `field_rel`. The fields that lie close together share one copy; each
/// other one is copied on its own into a slot after it. Of the ways to
/// cut them, the one with the fewest copies on their own wins (each is a
/// read of the server's memory), then the one that copies fewest bytes.
/// `shared: false` copies every field on its own, as a build whose fields
/// lie far apart would (see [`shared_copies`]).
pub fn place(found: &[(usize, u32)], layout: &mut ServerLayout, shared: bool) {
    let mut sorted: Vec<(usize, u32)> = found.to_vec();
    sorted.sort_by_key(|&(field, at)| (at, field));
    // Every window from one field's word to another's end, and none at all.
    let mut windows: Vec<Option<(u32, u32)>> = vec![None];
    for (i, &(_, low)) in sorted.iter().enumerate().filter(|_| shared) {
        for &(field, at) in &sorted[i..] {
            windows.push(Some((low & !7, (at + thd_field::WIDTH[field]).div_ceil(8) * 8)));
        }
    }
    let inside = |window: Option<(u32, u32)>, field: usize, at: u32| {
        window.is_some_and(|(low, high)| at >= low && at + thd_field::WIDTH[field] <= high)
    };
    let cost = |window: Option<(u32, u32)>| -> Option<(usize, u32)> {
        let shared = window.map_or(0, |(low, high)| high - low);
        let mut next = shared;
        let mut alone = 0;
        for &(field, at) in sorted.iter().filter(|&&(field, at)| !inside(window, field, at)) {
            if next > STATS_WINDOW as u32 - MAX_ALONE {
                return None;
            }
            next += alone_len(field, at);
            alone += 1;
        }
        (shared <= STATS_WINDOW as u32).then_some((alone, next))
    };
    let Some(best) = windows.into_iter().filter_map(|w| Some((cost(w)?, w))).min_by_key(|&(cost, _)| cost) else {
        return;
    };
    let window = best.1;
    let (low, high) = window.unwrap_or((0, 0));
    layout.stats_base = low;
    layout.stats_len = high - low;
    let mut next = high - low;
    for &(field, at) in &sorted {
        layout.stats_fields |= 1 << field;
        layout.field_at[field] = at;
        if inside(window, field, at) {
            layout.field_rel[field] = at - low;
        } else {
            layout.stats_alone |= 1 << field;
            layout.field_rel[field] = next + at % 8;
            next += alone_len(field, at);
        }
    }
}

/// Whether fields close together share one copy. A test hook, not an
/// option: the tests that run the real programs set
/// `SQLBEE_TEST_FIELDS_ALONE=1` to have the kernels they run on verify and
/// run the path a build with fields far apart takes.
pub fn shared_copies() -> bool {
    std::env::var_os("SQLBEE_TEST_FIELDS_ALONE").is_none_or(|v| v != "1")
}

/// Narrows a layout's fields (`stats_fields`, at `field_at`) to those in
/// `keep` (`stats_field` bits) and places them again: a field left out is
/// never copied, and a window that only the left-out fields needed is not
/// read at all.
pub fn keep_only(layout: &mut ServerLayout, keep: u32) {
    let kept = layout.stats_fields & keep;
    let found: Vec<(usize, u32)> =
        (0..thd_field::COUNT).filter(|field| kept & (1 << field) != 0).map(|f| (f, layout.field_at[f])).collect();
    layout.stats_base = 0;
    layout.stats_len = 0;
    layout.stats_fields = 0;
    layout.stats_alone = 0;
    layout.field_at = [0; thd_field::COUNT];
    layout.field_rel = [0; thd_field::COUNT];
    place(&found, layout, shared_copies());
}

#[cfg(test)]
mod tests {
    use sqlbee_kernel_abi::{
        STATS_WINDOW, StatementStats, UNKNOWN, alone_copy, decode, plan, server_status, source, statement_flag,
        stats_field,
    };

    use super::*;

    /// A THD of `len` bytes holding a known value in every field at the
    /// offsets given.
    fn thd_with(at: &[(usize, u32)], len: usize) -> Vec<u8> {
        let mut thd = vec![0xee; len];
        let mut put = |offset: u32, bytes: &[u8]| {
            thd[offset as usize..offset as usize + bytes.len()].copy_from_slice(bytes);
        };
        for &(field, offset) in at {
            match field {
                thd_field::ROWS_SENT => put(offset, &11u64.to_le_bytes()),
                thd_field::ROWS_EXAMINED => put(offset, &22u64.to_le_bytes()),
                thd_field::ROWS_AFFECTED => put(offset, &33u64.to_le_bytes()),
                thd_field::PLAN => {
                    put(offset, &(plan::FILESORT | plan::TMP_TABLE | plan::FULL_SCAN).to_le_bytes());
                    put(offset + 8, &4u64.to_le_bytes());
                    put(offset + 16, &5u64.to_le_bytes());
                    put(offset + 24, &6u64.to_le_bytes());
                }
                thd_field::SERVER_STATUS => put(offset, &server_status::NO_INDEX_USED.to_le_bytes()),
                thd_field::CONNECTION_ID => put(offset, &77u64.to_le_bytes()),
                thd_field::SYSTEM_THREAD => put(offset, &source::SYSTEM_THREAD_SLAVE_SQL.to_le_bytes()),
                thd_field::QUERY_ID => put(offset, &99u64.to_le_bytes()),
                _ => unreachable!(),
            }
        }
        thd
    }

    /// What the statement program does with `layout` on `thd`: the shared
    /// copy, each copy on its own (the kernel ABI's `alone_copy`, the one
    /// the program runs), then the kernel ABI's `decode`.
    fn kernel_read(thd: &[u8], layout: &ServerLayout) -> (StatementStats, sqlbee_kernel_abi::Identity) {
        let mut bytes = [0x55u8; STATS_WINDOW];
        let shared = layout.stats_len as usize;
        assert!(shared <= STATS_WINDOW);
        let base = layout.stats_base as usize;
        bytes[..shared].copy_from_slice(&thd[base..base + shared]);
        for field in 0..thd_field::COUNT {
            if let Some(copy) = alone_copy(layout, field) {
                let (from, to, len) = (copy.from as usize, copy.to as usize, copy.len as usize);
                // The program's own checks before it copies.
                assert!(to % 8 == 0 && len <= MAX_ALONE as usize && to <= STATS_WINDOW - MAX_ALONE as usize);
                bytes[to..to + len].copy_from_slice(&thd[from..from + len]);
            }
        }
        let mut window = [0u64; STATS_WINDOW / 8];
        for (word, chunk) in window.iter_mut().zip(bytes.as_chunks::<8>().0) {
            *word = u64::from_le_bytes(*chunk);
        }
        let mut stats = StatementStats::default();
        let identity = decode(&window, layout, layout.stats_fields, &mut stats);
        (stats, identity)
    }

    fn every_field_at(offsets: [u32; thd_field::COUNT]) -> Vec<(usize, u32)> {
        offsets.into_iter().enumerate().collect()
    }

    fn placed(found: &[(usize, u32)]) -> ServerLayout {
        let mut layout = ServerLayout { db_offset: UNKNOWN, ..ServerLayout::default() };
        place(found, &mut layout, true);
        layout
    }

    /// Every field the table places reads back what the THD holds.
    fn reads_back(found: &[(usize, u32)], layout: &ServerLayout) {
        let thd = thd_with(found, 64 * 1024);
        let (stats, identity) = kernel_read(&thd, layout);
        let has = |field: usize| found.iter().any(|&(f, _)| f == field);
        let expect = |field: usize, value: u64| if has(field) { value } else { 0 };
        assert_eq!(stats.rows_sent, expect(thd_field::ROWS_SENT, 11), "{layout:?}");
        assert_eq!(stats.rows_examined, expect(thd_field::ROWS_EXAMINED, 22));
        assert_eq!(stats.rows_affected, expect(thd_field::ROWS_AFFECTED, 33));
        assert_eq!(
            (stats.sort_merge_passes, stats.tmp_tables, stats.tmp_disk_tables),
            if has(thd_field::PLAN) { (4, 5, 6) } else { (0, 0, 0) }
        );
        let plan_flags = statement_flag::FILESORT | statement_flag::SELECT_SCAN;
        let status_flags = statement_flag::NO_INDEX_USED;
        assert_eq!(
            stats.flags,
            if has(thd_field::PLAN) { plan_flags } else { 0 }
                | if has(thd_field::SERVER_STATUS) { status_flags } else { 0 }
        );
        assert_eq!(identity.connection_id, expect(thd_field::CONNECTION_ID, 77));
        assert_eq!(identity.query_id, expect(thd_field::QUERY_ID, 99));
        let replica = if has(thd_field::SYSTEM_THREAD) { source::REPLICA } else { source::CLIENT };
        assert_eq!(identity.source, replica);
    }

    /// Fields within a few hundred bytes of each other, as MariaDB keeps
    /// them (10.11's span 936 bytes).
    const CLOSE_TOGETHER: [u32; thd_field::COUNT] = [0x3a8, 0x3b0, 0x3e0, 0x3f8, 0x3d4, 0x380, 0x3d0, 0x690];

    #[test]
    fn fields_that_fit_one_window_share_one_copy() {
        let found = every_field_at(CLOSE_TOGETHER);
        let layout = placed(&found);
        assert_eq!(layout.stats_alone, 0, "{layout:?}");
        assert_eq!(layout.stats_fields, (1 << thd_field::COUNT) - 1);
        assert!(layout.stats_len as usize <= STATS_WINDOW);
        reads_back(&found, &layout);
    }

    #[test]
    fn a_field_past_the_window_is_copied_on_its_own_and_takes_no_other_with_it() {
        // The query id far past the others (a build that moved it): it
        // is read on its own, and the figures stay in the shared window.
        let mut offsets = CLOSE_TOGETHER;
        offsets[thd_field::QUERY_ID] = 0x3000;
        let found = every_field_at(offsets);
        let layout = placed(&found);
        assert_eq!(layout.stats_alone, stats_field::QUERY_ID, "{layout:?}");
        reads_back(&found, &layout);

        // Fields spread over 4 KiB: some share, the rest go alone; all read.
        let spread = every_field_at([0x100, 0x500, 0x900, 0xd00, 0x1104, 0x1500, 0x1904, 0x1d00]);
        let layout = placed(&spread);
        assert!(layout.stats_alone.count_ones() >= 5, "{layout:?}");
        assert_eq!(layout.stats_fields, (1 << thd_field::COUNT) - 1);
        reads_back(&spread, &layout);

        // The plan word alone, misaligned u32s alone: every copy in bounds.
        let odd = every_field_at([0x2000, 0x10, 0x18, 0x4000, 0x6004, 0x20, 0x8004, 0x28]);
        let layout = placed(&odd);
        reads_back(&odd, &layout);

        // Every field on its own (what the kernel tests ask for).
        let found = every_field_at(CLOSE_TOGETHER);
        let mut layout = ServerLayout::default();
        place(&found, &mut layout, false);
        assert_eq!((layout.stats_alone, layout.stats_len), ((1 << thd_field::COUNT) - 1, 0));
        reads_back(&found, &layout);
    }

    #[test]
    fn a_field_the_build_does_not_show_leaves_only_itself_out() {
        for missing in 0..thd_field::COUNT {
            let found: Vec<(usize, u32)> =
                every_field_at(CLOSE_TOGETHER).into_iter().filter(|&(f, _)| f != missing).collect();
            let layout = placed(&found);
            assert_eq!(layout.stats_fields, ((1 << thd_field::COUNT) - 1) & !(1 << missing));
            reads_back(&found, &layout);
        }
    }

    #[test]
    fn every_field_but_the_connection_id_has_a_source() {
        let mut fields: Vec<usize> = SOURCES.iter().map(|s| s.field).collect();
        fields.push(thd_field::CONNECTION_ID);
        fields.sort();
        assert_eq!(fields, (0..thd_field::COUNT).collect::<Vec<_>>());
    }

    /// The statement program copies each field on its own when the layout
    /// says so: one `copy_alone` per field of the table, none forgotten
    /// (a field it skipped would read as whatever the window last held).
    #[test]
    fn the_program_copies_every_field_of_the_table() {
        let program = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../agent-ebpf/src/query_stats.rs");
        let source = std::fs::read_to_string(&program).unwrap();
        let mut copied: Vec<&str> = source
            .lines()
            .filter_map(|line| line.trim().strip_prefix("fields = copy_alone(thd, layout, buffer, fields, thd_field::"))
            .filter_map(|rest| rest.strip_suffix(");"))
            .collect();
        copied.sort();
        copied.dedup();
        assert_eq!(copied.len(), thd_field::COUNT, "{} copies {copied:?}", program.display());
    }
}
