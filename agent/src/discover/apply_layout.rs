//! Where a build lets the replica-apply probes read an event: the second
//! the primary wrote it (`Log_event::when`), and for a rows event its type
//! code and table (`Rows_log_event::m_type`, `m_table->s->db` and
//! `table_name`), and for a GTID event the name of the channel it came
//! through. Each offset is decoded from a small exported function that
//! touches it; the event classes are told apart by their virtual tables,
//! which the binary exports by name.
use super::{
    StaticVariable,
    elf::{find_symbol, function_bytes},
    x86::strip_endbr,
};

/// Every replicated event goes through it (sequential and parallel apply).
pub const APPLY_EVENT: &str = "_ZN9Log_event11apply_eventEP14rpl_group_info";
/// Reads the header: `when` from its first four bytes.
const LOG_EVENT_FROM_HEADER: &str = "_ZN9Log_eventC2EPKhPK28Format_description_log_event";
/// `return m_type;`
const ROWS_TYPE_CODE: &str = "_ZN14Rows_log_event13get_type_codeEv";
/// `return m_table->s->db.str;`
const ROWS_GET_DB: &str = "_ZN14Rows_log_event6get_dbEv";
/// Stores its `THD*` argument in `Log_event::thd`.
const LOG_EVENT_FOR_THD: &str = "_ZN9Log_eventC2EP3THDtb";
/// Each bumps the row's counter in its table's THD's `status_var`
/// (`ha_write_count`, `ha_update_count`, `ha_delete_count`).
const HANDLER_ROW_COUNTERS: [&str; 3] =
    ["_ZN7handler12ha_write_rowEPKh", "_ZN7handler13ha_update_rowEPKhS1_", "_ZN7handler13ha_delete_rowEPKh"];
/// The counters are neighbours in `system_status_var` (136 bytes apart at
/// most in 10.11 and 11.8): three found further apart are not them.
const ROW_COUNTERS_SPAN: u32 = 1024;
/// Begins with `this->rli = rli`.
const GROUP_REINIT: &str = "_ZN14rpl_group_info6reinitEP14Relay_log_info";
/// Sets `mi->rli.mi = mi` just before it calls `mi->rli.init(...)`.
const INIT_MASTER_INFO: &str = "_Z16init_master_infoP11Master_infoPKcS2_bi";
const RELAY_LOG_INIT: &str = "_ZN14Relay_log_info4initEPKc";
/// Returns `Master_info::cmp_connection_name` (the lowercase copy, right
/// after `connection_name`) as a hash key.
const MASTER_INFO_KEY: &str = "_Z19get_key_master_infoPKvPmc";
/// Bytes of code searched for the functions above.
const MAX_FUNCTION: u64 = 16 * 1024;

/// What an applied event is, by its class.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum EventClass {
    /// Starts a transaction (MariaDB writes one before each).
    Gtid,
    /// Commits a transaction of a transactional engine.
    Xid,
    /// A statement (statement-based changes, DDL, BEGIN and COMMIT).
    Query,
    /// Names a table for the rows events after it.
    TableMap,
    /// A rows event: writes, updates or deletes rows of one table.
    Rows,
    Other,
}

/// The classes' virtual tables, by mangled name (plain and compressed).
const CLASSES: [(&str, EventClass); 11] = [
    ("_ZTV14Gtid_log_event", EventClass::Gtid),
    ("_ZTV13Xid_log_event", EventClass::Xid),
    ("_ZTV15Query_log_event", EventClass::Query),
    ("_ZTV26Query_compressed_log_event", EventClass::Query),
    ("_ZTV19Table_map_log_event", EventClass::TableMap),
    ("_ZTV20Write_rows_log_event", EventClass::Rows),
    ("_ZTV21Update_rows_log_event", EventClass::Rows),
    ("_ZTV21Delete_rows_log_event", EventClass::Rows),
    ("_ZTV31Write_rows_compressed_log_event", EventClass::Rows),
    ("_ZTV32Update_rows_compressed_log_event", EventClass::Rows),
    ("_ZTV32Delete_rows_compressed_log_event", EventClass::Rows),
];

/// How the replica-apply probes read an event in this build.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ApplyLayout {
    pub when: u32,
    pub rows_type: u32,
    pub rows_table: u32,
    pub table_share: u32,
    pub share_db: u32,
    /// Each class's virtual table: where an object of it points (the
    /// table's symbol plus the two words before its first slot).
    pub classes: Vec<(StaticVariable, EventClass)>,
    /// `Log_event::thd` and the THD's rows written, updated and deleted
    /// (`status_var.ha_*_count`): the rows an event changed are their
    /// growth while it applies. None: this build's code did not match.
    pub rows_changed: Option<(u32, [u32; 3])>,
    /// Where a GTID event's `rpl_group_info` leads to its channel's name.
    /// None: channels are not told apart in this build.
    pub channel: Option<ChannelPath>,
}

/// `rpl_group_info::rli`, `Relay_log_info::mi` and
/// `Master_info::connection_name`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ChannelPath {
    pub rgi_rli: u32,
    pub rli_mi: u32,
    pub mi_name: u32,
}

/// The layout, or why this build has none.
pub fn apply_layout(elf: &object::File<'_>) -> Result<ApplyLayout, String> {
    if find_symbol(elf, APPLY_EVENT).is_none() {
        return Err(format!("no `{APPLY_EVENT}`"));
    }
    let code = |symbol: &str, len: u64| function_bytes(elf, symbol, len).unwrap_or_default();
    let when = header_store(&code(LOG_EVENT_FROM_HEADER, 128), 0)
        .ok_or_else(|| format!("`{LOG_EVENT_FROM_HEADER}` does not store the header's time where expected"))?;
    let rows_type = load_then_return(&code(ROWS_TYPE_CODE, 16))
        .ok_or_else(|| format!("`{ROWS_TYPE_CODE}` does not match a known pattern"))?;
    let (rows_table, table_share, share_db) = match pointer_chain(&code(ROWS_GET_DB, 32))[..] {
        [a, b, c] => (a, b, c),
        _ => return Err(format!("`{ROWS_GET_DB}` does not read `m_table->s->db` as expected")),
    };
    let first = {
        use object::{Object, ObjectSegment};
        elf.segments().find(|s| s.file_range().0 == 0).map(|s| s.address() & !0xfff)
    }
    .ok_or("the binary has no segment mapped from its start")?;
    let classes: Vec<_> = CLASSES
        .iter()
        .filter_map(|(name, class)| {
            let symbol = find_symbol(elf, name)?;
            use object::ObjectSymbol;
            Some((StaticVariable { address: symbol.address() + 16, first_segment: first }, *class))
        })
        .collect();
    if !classes.iter().any(|(_, class)| *class == EventClass::Rows) {
        return Err("no rows event class is exported".into());
    }
    let rows_changed = event_thd(&code(LOG_EVENT_FOR_THD, 128)).zip(row_counters(&|s| code(s, 256)));
    let channel = channel_path(elf);
    Ok(ApplyLayout { when, rows_type, rows_table, table_share, share_db, classes, rows_changed, channel })
}

/// The channel's path, each step from the one function that shows it.
fn channel_path(elf: &object::File<'_>) -> Option<ChannelPath> {
    use object::ObjectSymbol;
    let whole = |name: &str| {
        let symbol = find_symbol(elf, name)?;
        let code = function_bytes(elf, name, symbol.size().clamp(1, MAX_FUNCTION))?;
        Some((symbol.address(), code))
    };
    let rgi_rli = first_store_of_second_argument(&whole(GROUP_REINIT)?.1)?;
    let (at, code) = whole(INIT_MASTER_INFO)?;
    let init = find_symbol(elf, RELAY_LOG_INIT)?.address();
    let rli_mi = back_pointer(&code, at, init)?;
    let mi_name = key_field(&whole(MASTER_INFO_KEY)?.1)?.checked_sub(16)?;
    Some(ChannelPath { rgi_rli, rli_mi, mi_name })
}

/// `mov %rsi,disp(%rdi)` as the first instruction.
fn first_store_of_second_argument(code: &[u8]) -> Option<u32> {
    match strip_endbr(code) {
        [0x48, 0x89, 0x77, d, ..] => Some(u32::from(*d)),
        [0x48, 0x89, 0xb7, a, b, c, d, ..] => u32::try_from(i32::from_le_bytes([*a, *b, *c, *d])).ok(),
        _ => None,
    }
}

/// In `init_master_info`, `mi->rli.mi = mi; mi->rli.init(...)`: a register
/// stored into itself at `back` (`mov %R,back(%R)`), then `lea
/// embedded(%R),%rdi` and the call of `Relay_log_info::init` at `init`
/// (`code` starts at `at`). `Relay_log_info::mi` is `back - embedded`.
fn back_pointer(code: &[u8], at: u64, init: u64) -> Option<u32> {
    let disp = |d: &[u8]| -> Option<u32> { u32::try_from(i32::from_le_bytes(<[u8; 4]>::try_from(d).ok()?)).ok() };
    let call = (0..code.len().saturating_sub(4)).find(|&i| {
        let Ok(rel) = <[u8; 4]>::try_from(&code[i + 1..i + 5]) else { return false };
        code[i] == 0xe8 && (at + i as u64 + 5).wrapping_add_signed(i64::from(i32::from_le_bytes(rel))) == init
    })?;
    // `lea disp32(%R),%rdi` within the 24 bytes before the call.
    let (lea, base, embedded) = (call.saturating_sub(24)..call.saturating_sub(6)).rev().find_map(|i| {
        let &[rex @ (0x48 | 0x49), 0x8d, modrm, ..] = &code[i..] else { return None };
        let base = (modrm & 7) | if rex == 0x49 { 8 } else { 0 };
        (modrm & 0xf8 == 0xb8 && modrm & 7 != 4).then(|| (i, base, disp(&code[i + 3..i + 7])))
    })?;
    let embedded = embedded?;
    // The last `mov %R,disp32(%R)` before it.
    let rex = if base >= 8 { 0x4d } else { 0x48 };
    let modrm = 0x80 | ((base & 7) << 3) | (base & 7);
    let back = (0..lea.saturating_sub(6))
        .rev()
        .find(|&i| code[i] == rex && code[i + 1] == 0x89 && code[i + 2] == modrm)
        .and_then(|i| disp(&code[i + 3..i + 7]))?;
    back.checked_sub(embedded).filter(|mi| mi % 8 == 0)
}

/// `mov L(%rdi),%rax; mov %rax,(%rsi); mov S(%rdi),%rax; ret`: a hash key
/// function returning the `{str, length}` at S.
fn key_field(code: &[u8]) -> Option<u32> {
    match strip_endbr(code) {
        [0x48, 0x8b, 0x87, _, _, _, _, 0x48, 0x89, 0x06, 0x48, 0x8b, 0x87, a, b, c, d, 0xc3, ..] => {
            u32::try_from(i32::from_le_bytes([*a, *b, *c, *d])).ok().filter(|s| s % 8 == 0)
        }
        _ => None,
    }
}

/// `mov %rsi,disp(%rdi)` or, through a copy of `this` in `%rax`,
/// `mov %rsi,disp(%rax)`: where the constructor keeps its THD.
fn event_thd(code: &[u8]) -> Option<u32> {
    let body = strip_endbr(code);
    body.windows(4).find_map(|w| match w {
        [0x48, 0x89, 0x77 | 0x70, d] => Some(u32::from(*d)),
        _ => None,
    })
}

/// Each handler function's first `addq $1, disp32(%reg)`: the counter it
/// bumps. Accepted only when the three lie within `ROW_COUNTERS_SPAN`
/// bytes and are 8-byte aligned, as neighbours in one struct are.
fn row_counters(code: &dyn Fn(&'static str) -> Vec<u8>) -> Option<[u32; 3]> {
    let mut found = [0u32; 3];
    for (slot, symbol) in found.iter_mut().zip(HANDLER_ROW_COUNTERS) {
        let body = code(symbol);
        *slot = body.windows(9).find_map(|w| match w {
            // REX.W(+B) 83 /0 with a disp32 (and a SIB byte for %r12/%rsp).
            [0x48 | 0x49, 0x83, 0x84, 0x24, a, b, c, d, 0x01] => {
                u32::try_from(i32::from_le_bytes([*a, *b, *c, *d])).ok()
            }
            [0x48 | 0x49, 0x83, m, a, b, c, d, 0x01, _] if m & 0xf8 == 0x80 && m & 7 != 4 => {
                u32::try_from(i32::from_le_bytes([*a, *b, *c, *d])).ok()
            }
            _ => None,
        })?;
    }
    let (low, high) = (*found.iter().min()?, *found.iter().max()?);
    (found.iter().all(|f| f % 8 == 0) && high + 8 - low <= ROW_COUNTERS_SPAN).then_some(found)
}

/// Where the constructor stores the 32-bit header field at `field`: a
/// `mov field(%rsi),%r32` followed, in the next instructions, by a 64-bit
/// store of that register to `disp(%rdi)`.
fn header_store(code: &[u8], field: u8) -> Option<u32> {
    let body = strip_endbr(code);
    for at in 0..body.len().saturating_sub(8) {
        // Optional REX.R for r8d-r15d.
        let (rex_r, at_op) = match body[at] {
            0x44 => (8, at + 1),
            _ => (0, at),
        };
        if body.get(at_op) != Some(&0x8b) {
            continue;
        }
        let modrm = *body.get(at_op + 1)?;
        let reg = ((modrm >> 3) & 7) + rex_r;
        let loaded = match (modrm & 0xc7, field) {
            (0x06, 0) => at_op + 2,
            (0x46, f) if body.get(at_op + 2) == Some(&f) => at_op + 3,
            _ => continue,
        };
        // The store of that register, 64 bits wide, within 96 bytes (the
        // constructor interleaves the header's other fields).
        let rex = if reg >= 8 { 0x4c } else { 0x48 };
        let window = &body[loaded..(loaded + 96).min(body.len())];
        for (i, w) in window.windows(3).enumerate() {
            if w[0] != rex || w[1] != 0x89 || (w[2] >> 3) & 7 != reg & 7 || w[2] & 7 != 7 {
                continue;
            }
            return match w[2] >> 6 {
                1 => window.get(i + 3).map(|d| u32::from(*d)).filter(|d| d % 8 == 0),
                2 => window.get(i + 3..i + 7).and_then(|d| u32::try_from(i32::from_le_bytes(d.try_into().ok()?)).ok()),
                _ => None,
            };
        }
        return None;
    }
    None
}

/// `mov disp(%rdi),%eax; ret`: the field's offset.
fn load_then_return(code: &[u8]) -> Option<u32> {
    match strip_endbr(code) {
        [0x8b, 0x47, d, 0xc3, ..] => Some(u32::from(*d)),
        [0x8b, 0x87, a, b, c, d, 0xc3, ..] => u32::try_from(i32::from_le_bytes([*a, *b, *c, *d])).ok(),
        _ => None,
    }
}

/// The displacements of a chain of loads into `%rax` (`mov d(%rdi),%rax`,
/// then `mov d(%rax),%rax` ...) up to the `ret`.
fn pointer_chain(code: &[u8]) -> Vec<u32> {
    let mut body = strip_endbr(code);
    let mut chain = Vec::new();
    loop {
        let (disp, rest) = match body {
            [0xc3, ..] => return chain,
            [0x48, 0x8b, 0x00, rest @ ..] if !chain.is_empty() => (0, rest),
            [0x48, 0x8b, 0x47 | 0x40, d, rest @ ..] => (u32::from(*d), rest),
            [0x48, 0x8b, 0x87 | 0x80, a, b, c, d, rest @ ..] => {
                (u32::try_from(i32::from_le_bytes([*a, *b, *c, *d])).ok().unwrap_or(u32::MAX), rest)
            }
            _ => return Vec::new(),
        };
        // The first load is from `%rdi`, the rest from `%rax`.
        let from_rdi = matches!(body[2], 0x47 | 0x87);
        if from_rdi != chain.is_empty() || disp == u32::MAX || chain.len() == 3 {
            return Vec::new();
        }
        chain.push(disp);
        body = rest;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_header_time_is_where_the_constructor_stores_it() {
        // MariaDB 10.11.19: `mov (%rsi),%ecx` ... `mov %rcx,0x20(%rdi)`.
        let code = [
            0x48, 0x89, 0xd0, 0x48, 0x8d, 0x15, 1, 2, 3, 4, 0x8b, 0x0e, 0x48, 0xc7, 0x47, 0x10, 0, 0, 0, 0, 0x0f, 0xb7,
            0x40, 0x78, 0x48, 0x89, 0x4f, 0x20, 0xc3,
        ];
        assert_eq!(header_store(&code, 0), Some(0x20));
        // A store of another register is not it.
        let other = [0x8b, 0x0e, 0x48, 0x89, 0x57, 0x20, 0xc3];
        assert_eq!(header_store(&other, 0), None);
        // With endbr64 and a disp32 store.
        let far = [0xf3, 0x0f, 0x1e, 0xfa, 0x8b, 0x06, 0x48, 0x89, 0x87, 0x28, 0x01, 0, 0, 0xc3];
        assert_eq!(header_store(&far, 0), Some(0x128));
    }

    #[test]
    fn the_row_counters_are_where_the_handler_bumps_them() {
        // MariaDB 10.11.19: `addq $0x1,0x12c8(%r12)` in ha_write_row, 0x12c0
        // in ha_update_row, 0x1250 in ha_delete_row.
        let bump = |disp: u32| {
            let mut code = vec![0x48, 0x8b, 0x43, 0x10, 0x4c, 0x8b, 0x60, 0x40, 0x49, 0x83, 0x84, 0x24];
            code.extend(disp.to_le_bytes());
            code.extend([0x01, 0xc3]);
            code
        };
        let code = |symbol: &'static str| match symbol {
            "_ZN7handler12ha_write_rowEPKh" => bump(0x12c8),
            "_ZN7handler13ha_update_rowEPKhS1_" => bump(0x12c0),
            _ => bump(0x1250),
        };
        assert_eq!(row_counters(&code), Some([0x12c8, 0x12c0, 0x1250]));
        // MariaDB 11.8.9: 0x1370, 0x1368 and 0x12f0.
        let wide = |symbol: &'static str| match symbol {
            "_ZN7handler12ha_write_rowEPKh" => bump(0x1370),
            "_ZN7handler13ha_update_rowEPKhS1_" => bump(0x1368),
            _ => bump(0x12f0),
        };
        assert_eq!(row_counters(&wide), Some([0x1370, 0x1368, 0x12f0]));
        // Far apart: not neighbours in one struct.
        let apart = |symbol: &'static str| if symbol.contains("write") { bump(0x4000) } else { bump(0x1250) };
        assert_eq!(row_counters(&apart), None);
        // `mov %rdi,%rax ... mov %rsi,0x60(%rax)`
        assert_eq!(event_thd(&[0x48, 0x89, 0xf8, 0x89, 0xd7, 0x48, 0x89, 0x70, 0x60, 0xc3]), Some(0x60));
    }

    #[test]
    fn accessors_give_their_fields() {
        assert_eq!(load_then_return(&[0x8b, 0x87, 0x1c, 0x01, 0, 0, 0xc3]), Some(0x11c));
        assert_eq!(load_then_return(&[0xf3, 0x0f, 0x1e, 0xfa, 0x8b, 0x47, 0x30, 0xc3]), Some(0x30));
        assert_eq!(load_then_return(&[0xb8, 0x13, 0, 0, 0, 0xc3]), None);
        // `mov 0x70(%rdi),%rax; mov (%rax),%rax; mov 0x260(%rax),%rax; ret`
        let get_db = [0x48, 0x8b, 0x47, 0x70, 0x48, 0x8b, 0x00, 0x48, 0x8b, 0x80, 0x60, 0x02, 0, 0, 0xc3];
        assert_eq!(pointer_chain(&get_db), vec![0x70, 0, 0x260]);
        // Starting from `%rax` is not it.
        assert_eq!(pointer_chain(&[0x48, 0x8b, 0x40, 0x70, 0xc3]), Vec::<u32>::new());
    }

    #[test]
    fn the_channel_path_is_where_the_server_code_follows_it() {
        // MariaDB 10.11.19 and 11.8.9: `mov %rsi,0x8(%rdi)` first.
        assert_eq!(first_store_of_second_argument(&[0x48, 0x89, 0x77, 0x08, 0xc3]), Some(8));
        assert_eq!(first_store_of_second_argument(&[0xf3, 0x0f, 0x1e, 0xfa, 0x48, 0x89, 0x77, 0x08]), Some(8));
        assert_eq!(first_store_of_second_argument(&[0x48, 0x89, 0x7e, 0x08]), None);
        // `mov %rbx,0x37e0(%rbx); mov -0x440(%rbp),%rsi; lea 0x1cc0(%rbx),%rdi;
        // call Relay_log_info::init` (10.11.19): mi at 0x1b20.
        let mut code = vec![0x90; 16];
        code.extend([0x48, 0x89, 0x9b, 0xe0, 0x37, 0, 0]);
        code.extend([0x48, 0x8b, 0xb5, 0xc0, 0xfb, 0xff, 0xff]);
        code.extend([0x48, 0x8d, 0xbb, 0xc0, 0x1c, 0, 0]);
        let call_at = code.len() as u64;
        code.push(0xe8);
        code.extend(0x100i32.to_le_bytes());
        let at = 0x40_0000;
        assert_eq!(back_pointer(&code, at, at + call_at + 5 + 0x100), Some(0x1b20));
        // A call of something else is not it.
        assert_eq!(back_pointer(&code, at, at + 0x9999), None);
        // `mov 0xb98(%rdi),%rax; mov %rax,(%rsi); mov 0xb90(%rdi),%rax; ret`
        let key = [0x48, 0x8b, 0x87, 0x98, 0x0b, 0, 0, 0x48, 0x89, 0x06, 0x48, 0x8b, 0x87, 0x90, 0x0b, 0, 0, 0xc3];
        assert_eq!(key_field(&key), Some(0xb90));
    }

    /// The build on this machine (Debian's MariaDB 10.11), when it is there.
    #[test]
    fn the_installed_build_has_a_layout() {
        let Ok(data) = std::fs::read("/usr/sbin/mariadbd") else {
            eprintln!("skipped: no /usr/sbin/mariadbd here");
            return;
        };
        let elf = object::File::parse(&*data).unwrap();
        let layout = apply_layout(&elf).unwrap();
        assert!(layout.when % 8 == 0 && layout.rows_table % 8 == 0 && layout.share_db % 8 == 0, "{layout:?}");
        assert!(layout.classes.iter().filter(|(_, c)| *c == EventClass::Rows).count() >= 3, "{layout:?}");
        assert!(layout.rows_changed.is_some(), "{layout:?}");
        let channel = layout.channel.expect("the channel's path");
        assert!(channel.rgi_rli % 8 == 0 && channel.rli_mi % 8 == 0 && channel.mi_name % 8 == 0, "{channel:?}");
    }
}
