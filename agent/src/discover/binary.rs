//! What a server binary is and where sqlbee reads it.
//!
//! Symbols come from `.dynsym` (Debian's mariadbd is stripped of `.symtab`
//! but exports its C++ functions) or `.symtab`. Field offsets inside `THD`
//! differ per build, so they are decoded from tiny exported accessor
//! functions of this very binary instead of being hard-coded:
//! - `thd_query_string(THD*)` is `lea OFF(%rdi),%rax; ret`: the statement
//!   text `{char*, size_t}` lives at THD+OFF;
//! - `thd_get_thread_id(THD*)` is `mov OFF(%rdi),%rax; ret`: the connection
//!   id lives at THD+OFF;
//! - `thd_current_command(THD*)` is `mov OFF(%rdi),%eax; ret`: the command
//!   being served;
//! - `thd_storage_lock_wait(THD*, long long)` is `add %rsi,OFF(%rdi); ret`:
//!   `utime_after_lock`. The server declares `start_utime` right before it
//!   (`ulonglong start_utime, utime_after_lock`, unchanged since 5.1), so
//!   the statement's start lives at OFF-8; the kernel side still refuses a
//!   start that is not a plausible recent CLOCK_MONOTONIC time.
//!
//! A pattern that does not match is refused, never guessed.
//!
//! The exported `global_query_id` counter (one increment per query the
//! server starts) is located too: reading it from the server's memory
//! costs the server nothing, so budget mode learns from it how many
//! statements ran while its probes were off.
use std::{fs::File, path::Path};

use object::{Object, ObjectSection, ObjectSymbol};
use sqlbee_kernel_abi::ServerLayout;

use super::{
    DiscoverError,
    elf::{find_symbol, function_bytes},
    thd_fields::{self, THD_IS_CONNECTED},
    x86::{decode_add_rsi_to_rdi, decode_lea_rdi, decode_mov_rdi, decode_mov32_rdi, find_disp, strip_endbr},
};

const MARIADB_DISPATCH: &str = "_Z16dispatch_command19enum_server_commandP3THDPcjb";
const MYSQL_DISPATCH: &str = "_Z16dispatch_commandP3THDPK8COM_DATA19enum_server_command";
const LOG_SLOW_STATEMENT: &str = "_Z18log_slow_statementP3THD";
const MY_MESSAGE_SQL: &str = "my_message_sql";
const THD_QUERY_STRING: &str = "thd_query_string";
const THD_GET_THREAD_ID: &str = "thd_get_thread_id";
const THD_CURRENT_COMMAND: &str = "thd_current_command";
const THD_STORAGE_LOCK_WAIT: &str = "thd_storage_lock_wait";
const THD_WAIT_BEGIN: &str = "thd_wait_begin";
const THD_WAIT_END: &str = "thd_wait_end";
const GLOBAL_QUERY_ID: &str = "global_query_id";
const THD_CURRENT_DB: &str = "thd_current_db";
const THD_USER_NAME: &str = "thd_user_name";
const SECURITY_CONTEXT_SKIP_GRANTS: &str = "_ZN16Security_context11skip_grantsEv";
const ACL_AUTHENTICATE: &str = "_Z16acl_authenticateP3THDj";
const THD_SET_DB: &str = "_ZN3THD6set_dbEPK25st_mysql_const_lex_string";
const SP_INSTR_STMT_EXECUTE: &str = "_ZN13sp_instr_stmt7executeEP3THDPj";
const ADD_SLOW_QUERY_STATE: &str = "_ZN3THD20add_slow_query_stateEP19Sub_statement_state";
const SELECT_SEND_ABORT: &str = "_ZN11select_send16abort_result_setEv";
const QUERY_LOG_WRITE: &str = "_ZN15MYSQL_QUERY_LOG5writeEP3THDlPKcmyybS3_m";
const SP_HEAD_INIT_PSI_SHARE: &str = "_ZN7sp_head14init_psi_shareEv";
const SP_HEAD_IS_INVOKED: &str = "_ZNK7sp_head10is_invokedEv";
const SP_HANDLER_PROCEDURE: &str = "sp_handler_procedure";
const SP_HANDLER_FUNCTION: &str = "sp_handler_function";
const SP_HANDLER_TRIGGER: &str = "sp_handler_trigger";

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Flavor {
    MariaDb,
}

/// Where one kernel program attaches: a symbol and a byte offset into it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ProbePoint {
    pub symbol: &'static str,
    /// 0, or past instructions the kernel would have to single-step: those
    /// leave the arguments in place (see `emulated_offset`).
    pub offset: u64,
}

/// Where the kernel programs attach.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProbePoints {
    pub command_start: ProbePoint,
    pub statement_end: ProbePoint,
    pub error_raised: ProbePoint,
    /// `thd_wait_begin`/`thd_wait_end`, when the binary exports both.
    pub waits: Option<(ProbePoint, ProbePoint)>,
    /// `acl_authenticate`: a login or a change of user, after which the
    /// connection's account is read again.
    pub account_change: Option<ProbePoint>,
    /// `THD::set_db`: the one place the server overwrites a schema name in
    /// place, after which the name is read again.
    pub schema_change: Option<ProbePoint>,
    /// A stored program's statement: the entry of `sp_instr_stmt::execute`
    /// (its start) and its call of `THD::add_slow_query_state` (its end).
    pub nested: Option<(ProbePoint, ProbePoint)>,
    /// Where the server decodes a prepared statement's values, one
    /// function per wire type; empty when the build has none of them.
    pub values: Vec<ValueDecoder>,
    /// `Log_event::apply_event`: each event a replica applies (entry and
    /// return).
    pub apply: Option<ProbePoint>,
}

/// The wire type a value decoder reads (MariaDB's
/// `Item_param::set_param_*`, and `set_null` for a NULL).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ValueType {
    Tiny,
    Short,
    Int32,
    Int64,
    Float,
    Double,
    Decimal,
    Str,
    Date,
    Time,
    DateTime,
    Null,
}

/// One value decoder and the link-time address of its probe: the address
/// the value probe reports, less the load bias, names the type.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ValueDecoder {
    pub value_type: ValueType,
    pub symbol: &'static str,
    /// Where in the function the probe goes (see `value_probe_offset`).
    pub offset: u64,
    pub probe: StaticVariable,
}

const VALUE_DECODERS: [(ValueType, &str); 12] = [
    (ValueType::Tiny, "_ZN10Item_param14set_param_tinyEPPhm"),
    (ValueType::Short, "_ZN10Item_param15set_param_shortEPPhm"),
    (ValueType::Int32, "_ZN10Item_param15set_param_int32EPPhm"),
    (ValueType::Int64, "_ZN10Item_param15set_param_int64EPPhm"),
    (ValueType::Float, "_ZN10Item_param15set_param_floatEPPhm"),
    (ValueType::Double, "_ZN10Item_param16set_param_doubleEPPhm"),
    (ValueType::Decimal, "_ZN10Item_param17set_param_decimalEPPhm"),
    (ValueType::Str, "_ZN10Item_param13set_param_strEPPhm"),
    (ValueType::Date, "_ZN10Item_param14set_param_dateEPPhm"),
    (ValueType::Time, "_ZN10Item_param14set_param_timeEPPhm"),
    (ValueType::DateTime, "_ZN10Item_param18set_param_datetimeEPPhm"),
    (ValueType::Null, "_ZN10Item_param8set_nullERK11DTCollation"),
];

/// The value decoders this build exports, each at its entry. A value whose
/// decoder is missing is not recognised, and its statement is not bound.
fn value_decoders(elf: &object::File<'_>) -> Vec<ValueDecoder> {
    use object::ObjectSegment;
    let Some(first) = elf.segments().find(|s| s.file_range().0 == 0) else { return Vec::new() };
    VALUE_DECODERS
        .iter()
        .filter_map(|&(value_type, symbol)| {
            let found = find_symbol(elf, symbol).filter(|s| s.kind() == object::SymbolKind::Text)?;
            let offset = value_probe_offset(&function_bytes(elf, symbol, 16).unwrap_or_default());
            let probe = StaticVariable { address: found.address() + offset, first_segment: first.address() & !0xfff };
            Some(ValueDecoder { value_type, symbol, offset, probe })
        })
        .collect()
}

/// Where the running stored program is named: `THD::spcont` ->
/// `sp_rcontext::m_sp` -> `sp_head`'s schema, name, handler and flags, and
/// the handlers (`sp_handler_procedure`, `_function`, `_trigger`) whose
/// addresses say the program's kind.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ProgramLayout {
    pub spcont: u32,
    pub rcontext_sp: u32,
    pub sp_db: u32,
    pub sp_name: u32,
    pub sp_handler: u32,
    pub sp_flags: u32,
    pub procedure: StaticVariable,
    pub function: StaticVariable,
    pub trigger: StaticVariable,
}

/// What names a build to an operator: its GNU build id and the version
/// string compiled into it. Read for every server, traced or not.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct BinaryIdentity {
    pub build_id: Option<String>,
    /// `10.11.19-MariaDB`, `8.0.36`: the first version-like string in the
    /// binary's read-only data that names the server.
    pub version: Option<String>,
}

#[derive(Clone, Debug)]
pub struct BinaryInfo {
    pub flavor: Flavor,
    pub build_id: Option<String>,
    pub version: Option<String>,
    /// `layout.text_limit` is left at 0; the probe stage sets it.
    pub layout: ServerLayout,
    pub points: ProbePoints,
    /// Probe points whose first instruction the kernel cannot emulate and
    /// must single-step (about 15x the cost of a trap on this kind of VM).
    pub single_stepped: Vec<&'static str>,
    /// Where `global_query_id` lives, when the binary exports it.
    pub query_counter: Option<StaticVariable>,
    /// Per-statement figures this build does not let sqlbee read, each with
    /// why: they are left out of every record, never guessed.
    pub missing_fields: Vec<(&'static str, String)>,
    /// How to name the stored program a nested statement runs in.
    pub programs: Option<ProgramLayout>,
    /// Where the connections are, for activity; or why the agent cannot
    /// read them in this build.
    pub activity: Result<super::ActivityLayout, String>,
    /// How a replica's applied events are read; or why they cannot be.
    pub apply: Result<super::ApplyLayout, String>,
    /// Where the send hook finds a thread's THD and its answer's status;
    /// or why this build leaves statements on the uprobe.
    pub send: Result<super::SendLayout, String>,
}

/// An 8-byte variable of the binary, by link-time address.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StaticVariable {
    pub address: u64,
    /// Link-time address of the segment mapped from file offset 0: the
    /// load bias is where that mapping starts minus this.
    pub first_segment: u64,
}

pub fn inspect_binary(exe: &Path) -> Result<BinaryInfo, DiscoverError> {
    let shown = shown_path(exe);
    let path = shown.as_path();
    let file = File::open(exe).map_err(|source| DiscoverError::Binary { path: path.into(), source })?;
    // SAFETY: read-only private mapping; a binary replaced underneath us at
    // worst yields garbage that the ELF parser rejects.
    let map =
        unsafe { memmap2::Mmap::map(&file) }.map_err(|source| DiscoverError::Binary { path: path.into(), source })?;
    let elf =
        object::File::parse(&*map).map_err(|e| DiscoverError::NotElf { path: path.into(), reason: e.to_string() })?;
    if elf.architecture() != object::Architecture::X86_64 {
        return Err(DiscoverError::Unsupported {
            path: path.into(),
            flavor: "a non-x86-64 build",
            detail: format!("architecture {:?}; offsets are decoded from x86-64 code", elf.architecture()),
        });
    }
    let lookup = |name: &str| find_symbol(&elf, name);

    if lookup(MARIADB_DISPATCH).is_none() {
        if lookup(MYSQL_DISPATCH).is_some() {
            return Err(DiscoverError::Unsupported {
                path: path.into(),
                flavor: "MySQL 5.7/8.x",
                detail: "dispatch_command(THD*, const COM_DATA*, enum_server_command) found \
                         (command is argument 3, THD argument 1), but MySQL has no \
                         thd_query_string accessor to learn the statement text offset from"
                    .into(),
            });
        }
        return Err(missing(path, MARIADB_DISPATCH, "dispatch_command, start of every client command"));
    }
    let required = [
        (LOG_SLOW_STATEMENT, "log_slow_statement, end of every statement"),
        (MY_MESSAGE_SQL, "my_message_sql, every error sent to a client"),
        (THD_QUERY_STRING, "thd_query_string, locates the statement text"),
        (THD_GET_THREAD_ID, "thd_get_thread_id, locates the connection id"),
        (THD_CURRENT_COMMAND, "thd_current_command, locates the command"),
        (THD_STORAGE_LOCK_WAIT, "thd_storage_lock_wait, locates the statement start time"),
    ];
    for (symbol, what) in required {
        if lookup(symbol).is_none() {
            return Err(missing(path, symbol, what));
        }
    }

    let code = |symbol: &'static str| function_bytes(&elf, symbol, 16).unwrap_or_default();
    let query_offset = decode_lea_rdi(&code(THD_QUERY_STRING)).ok_or_else(|| DiscoverError::UnknownLayout {
        path: path.into(),
        field: "the statement text offset",
        symbol: THD_QUERY_STRING,
        bytes: hex(&code(THD_QUERY_STRING)),
    })?;
    let connection_id_offset =
        decode_mov_rdi(&code(THD_GET_THREAD_ID)).ok_or_else(|| DiscoverError::UnknownLayout {
            path: path.into(),
            field: "the connection id offset",
            symbol: THD_GET_THREAD_ID,
            bytes: hex(&code(THD_GET_THREAD_ID)),
        })?;
    let command_offset = decode_mov32_rdi(&code(THD_CURRENT_COMMAND)).ok_or_else(|| DiscoverError::UnknownLayout {
        path: path.into(),
        field: "the command offset",
        symbol: THD_CURRENT_COMMAND,
        bytes: hex(&code(THD_CURRENT_COMMAND)),
    })?;
    let lock_utime_offset =
        decode_add_rsi_to_rdi(&code(THD_STORAGE_LOCK_WAIT)).filter(|off| *off >= 8).ok_or_else(|| {
            DiscoverError::UnknownLayout {
                path: path.into(),
                field: "the statement start time offset",
                symbol: THD_STORAGE_LOCK_WAIT,
                bytes: hex(&code(THD_STORAGE_LOCK_WAIT)),
            }
        })?;

    let mut single_stepped = Vec::new();
    let mut point = |symbol: &'static str| {
        let offset = emulated_offset(&code(symbol)).unwrap_or_else(|| {
            single_stepped.push(symbol);
            0
        });
        ProbePoint { symbol, offset }
    };
    let points = ProbePoints {
        command_start: point(MARIADB_DISPATCH),
        statement_end: point(LOG_SLOW_STATEMENT),
        error_raised: point(MY_MESSAGE_SQL),
        waits: (lookup(THD_WAIT_BEGIN).is_some() && lookup(THD_WAIT_END).is_some())
            .then(|| (point(THD_WAIT_BEGIN), point(THD_WAIT_END))),
        account_change: lookup(ACL_AUTHENTICATE).is_some().then(|| point(ACL_AUTHENTICATE)),
        schema_change: lookup(THD_SET_DB).is_some().then(|| point(THD_SET_DB)),
        nested: None,
        values: value_decoders(&elf),
        apply: lookup(super::apply_layout::APPLY_EVENT).is_some().then(|| point(super::apply_layout::APPLY_EVENT)),
    };
    let mut points = points;
    let mut missing_nested = None;
    match nested_points(&elf) {
        Ok((start, end)) => {
            let start = ProbePoint { symbol: SP_INSTR_STMT_EXECUTE, offset: start };
            points.nested = Some((start, ProbePoint { symbol: SP_INSTR_STMT_EXECUTE, offset: end }));
        }
        Err(why) => missing_nested = Some(why),
    }
    let long_code = |symbol: &'static str| function_bytes(&elf, symbol, 64).unwrap_or_default();
    let mut fields = statement_fields(&long_code, connection_id_offset);
    if let Some(why) = missing_nested {
        fields.missing.push(("statements inside stored programs (they are not counted apart)", why));
    }
    let programs = program_layout(&elf);
    if programs.is_none() && points.nested.is_some() {
        fields
            .missing
            .push(("stored program names", "the code that locates them does not match a known pattern".into()));
    }
    let build_id = elf.build_id().ok().flatten().map(hex_plain);
    let query_counter = static_u64(&elf, GLOBAL_QUERY_ID);
    Ok(BinaryInfo {
        flavor: Flavor::MariaDb,
        build_id,
        version: version_in(&elf),
        layout: ServerLayout {
            command_arg: 0,
            thd_arg: 1,
            packet_arg: 2,
            query_offset,
            connection_id_offset,
            text_limit: 0,
            long_wait_us: 0,
            command_offset,
            start_utime_offset: lock_utime_offset - 8,
            lock_utime_offset,
            command_probe: 0,
            wait_probes: 0,
            digest_slots: 0,
            known_sets: 1,
            ..fields.layout
        },
        points,
        single_stepped,
        query_counter,
        missing_fields: fields.missing,
        programs,
        activity: super::activity_layout::activity_layout(&elf),
        apply: super::apply_layout::apply_layout(&elf),
        send: super::send_layout::send_layout(&|symbol| function_bytes(&elf, symbol, 32).unwrap_or_default()),
    })
}

/// The start and end probe offsets of a stored program's statement in
/// `sp_instr_stmt::execute`: its entry (past an `endbr64`), and its one
/// `call THD::add_slow_query_state` (a `call rel32`, which the kernel
/// emulates). The end is where the statement's own counters are complete.
fn nested_points(elf: &object::File<'_>) -> Result<(u64, u64), String> {
    let execute = find_symbol(elf, SP_INSTR_STMT_EXECUTE).ok_or_else(|| format!("no `{SP_INSTR_STMT_EXECUTE}`"))?;
    let target =
        find_symbol(elf, ADD_SLOW_QUERY_STATE).ok_or_else(|| format!("no `{ADD_SLOW_QUERY_STATE}`"))?.address();
    let code = function_bytes(elf, SP_INSTR_STMT_EXECUTE, execute.size())
        .ok_or_else(|| format!("`{SP_INSTR_STMT_EXECUTE}` has no code to read"))?;
    let start = emulated_offset(&code[..code.len().min(16)])
        .ok_or_else(|| format!("`{SP_INSTR_STMT_EXECUTE}` starts with an instruction the kernel would single-step"))?;
    let calls: Vec<u64> = (0..code.len().saturating_sub(4))
        .filter(|&at| code[at] == 0xe8)
        .filter(|&at| {
            let rel = i32::from_le_bytes([code[at + 1], code[at + 2], code[at + 3], code[at + 4]]);
            (execute.address() + at as u64 + 5).wrapping_add(rel as i64 as u64) == target
        })
        .map(|at| at as u64)
        .collect();
    match calls[..] {
        [end] => Ok((start, end)),
        _ => Err(format!("`{SP_INSTR_STMT_EXECUTE}` calls `{ADD_SLOW_QUERY_STATE}` {} times, not once", calls.len())),
    }
}

/// Decodes where the running program's name and kind live (see
/// `ProgramLayout`); None when any piece does not match.
fn program_layout(elf: &object::File<'_>) -> Option<ProgramLayout> {
    let code = |symbol: &str, len: u64| function_bytes(elf, symbol, len).unwrap_or_default();
    // select_send::abort_result_set: `mov 0x8(%rdi),%rax` (its THD), then
    // `mov spcont(%rax),%rax`.
    let spcont = find_disp(&code(SELECT_SEND_ABORT, 48), &[0x48, 0x8b, 0x47, 0x08, 0x48, 0x8b, 0x80])?;
    // MYSQL_QUERY_LOG::write names the routine: `mov spcont(%r13|%r14),%rax`,
    // then `mov m_sp(%rax),%rax` within a few instructions.
    let write = code(QUERY_LOG_WRITE, 4096);
    let spcont_bytes = spcont.to_le_bytes();
    let at = write
        .windows(7)
        .position(|w| w[0] == 0x49 && w[1] == 0x8b && (w[2] == 0x85 || w[2] == 0x86) && w[3..7] == spcont_bytes)?;
    let after = &write[at + 7..(at + 24).min(write.len())];
    let rcontext_sp = after.windows(4).find(|w| w[..3] == [0x48, 0x8b, 0x40]).map(|w| u32::from(w[3]))?;
    // sp_head::init_psi_share loads m_name {str, len}, m_db {str, len}
    // (disp8 from %rdi) and m_handler (disp32).
    let init = code(SP_HEAD_INIT_PSI_SHARE, 64);
    let disp8 = |prefix: &[u8]| {
        init.windows(prefix.len() + 1).find(|w| w[..prefix.len()] == *prefix).map(|w| u32::from(w[prefix.len()]))
    };
    let sp_name = disp8(&[0x4c, 0x8b, 0x77])?;
    let sp_db = disp8(&[0x4c, 0x8b, 0x67])?;
    if disp8(&[0x4c, 0x8b, 0x7f]) != Some(sp_name + 8) || disp8(&[0x44, 0x8b, 0x6f]) != Some(sp_db + 8) {
        return None;
    }
    let sp_handler = find_disp(&init, &[0x48, 0x8b, 0xbf])?;
    // sp_head::is_invoked tests a bit of m_flags.
    let sp_flags = match strip_endbr(&code(SP_HEAD_IS_INVOKED, 16)) {
        [0x8b, 0x87, a, b, c, d, ..] | [0x0f, 0xb6, 0x87, a, b, c, d, ..] => {
            u32::try_from(i32::from_le_bytes([*a, *b, *c, *d])).ok()?
        }
        _ => return None,
    };
    Some(ProgramLayout {
        spcont,
        rcontext_sp,
        sp_db,
        sp_name,
        sp_handler,
        sp_flags,
        procedure: static_u64(elf, SP_HANDLER_PROCEDURE)?,
        function: static_u64(elf, SP_HANDLER_FUNCTION)?,
        trigger: static_u64(elf, SP_HANDLER_TRIGGER)?,
    })
}

/// The layout fields of the per-statement figures, and the ones missing.
struct StatementFields {
    layout: ServerLayout,
    missing: Vec<(&'static str, String)>,
}

/// Decodes where this build keeps each per-statement figure from small
/// exported functions that touch it (the slow log reads the same fields).
/// A figure whose code does not match is left out with its reason.
fn statement_fields(code: &dyn Fn(&'static str) -> Vec<u8>, connection_id_offset: u32) -> StatementFields {
    use sqlbee_kernel_abi::{UNKNOWN, stats_field, thd_field};
    let mut missing = Vec::new();
    let body = |symbol| code(symbol);
    let mut found = Vec::new();
    let connection_id = (thd_field::CONNECTION_ID, Some(connection_id_offset), "connection id", THD_GET_THREAD_ID);
    let sourced = thd_fields::SOURCES.iter().map(|s| (s.field, (s.find)(code), s.what, s.symbol));
    for (field, at, what, symbol) in std::iter::once(connection_id).chain(sourced) {
        match at {
            Some(at) if at % thd_field::ALIGN[field] == 0 => found.push((field, at)),
            Some(at) => missing.push((what, format!("`{symbol}` puts it at {at}, not a multiple of its width"))),
            None => missing.push((what, format!("`{symbol}` is missing or does not match a known pattern"))),
        }
    }
    let mut layout = ServerLayout {
        db_offset: UNKNOWN,
        sctx_offset: UNKNOWN,
        spcont_offset: UNKNOWN,
        vio_offset: UNKNOWN,
        ..ServerLayout::default()
    };
    thd_fields::place(&found, &mut layout, thd_fields::shared_copies());
    match decode_lea_rdi(&body(THD_CURRENT_DB)) {
        Some(at) => layout.db_offset = at,
        None => missing.push(("schema", format!("`{THD_CURRENT_DB}` is missing or does not match a known pattern"))),
    }
    match (decode_user_name(&body(THD_USER_NAME)), find_disp(&body(SECURITY_CONTEXT_SKIP_GRANTS), &[0x48, 0x89, 0x87])) {
        (Some((sctx, user)), Some(host)) if layout.stats_fields & stats_field::CONNECTION_ID != 0 => {
            layout.sctx_offset = sctx;
            layout.sctx_user_offset = user;
            layout.sctx_host_offset = host;
        }
        _ => missing.push((
            "user, client host",
            format!("`{THD_USER_NAME}` or `{SECURITY_CONTEXT_SKIP_GRANTS}` does not match a known pattern, or the connection id lies outside the counters"),
        )),
    }
    match decode_vio(&body(THD_IS_CONNECTED)) {
        Some(at) => layout.vio_offset = at,
        None => missing.push((
            "client process and address",
            format!("`{THD_IS_CONNECTED}` does not match a known pattern (it locates the connection's socket)"),
        )),
    }
    StatementFields { layout, missing }
}

/// `THD::net.vio` from `thd_is_connected`, which loads it and calls one of
/// its methods: `mov disp32(%rdi),%rdx` and, within a few instructions,
/// `call *disp32(%rdx)`. Both 10.11 and 11.8 read it at 0x2c0.
fn decode_vio(code: &[u8]) -> Option<u32> {
    let load = code.windows(7).position(|w| w[..3] == [0x48, 0x8b, 0x97])?;
    let disp = i32::from_le_bytes(code[load + 3..load + 7].try_into().ok()?);
    let after = &code[load + 7..code.len().min(load + 32)];
    after.windows(2).any(|w| w == [0xff, 0x92]).then_some(())?;
    u32::try_from(disp).ok()
}

/// `thd_user_name(THD*)`: `mov disp32(%rdi),%rax; test %rax,%rax; je;
/// mov disp8(%rax),%rax; ret` -> (the security context pointer's offset
/// in THD, the user pointer's offset in it).
fn decode_user_name(code: &[u8]) -> Option<(u32, u32)> {
    match strip_endbr(code) {
        [0x48, 0x8b, 0x87, a, b, c, d, 0x48, 0x85, 0xc0, 0x74, _, 0x48, 0x8b, 0x40, user, 0xc3, ..] => {
            Some((u32::try_from(i32::from_le_bytes([*a, *b, *c, *d])).ok()?, u32::from(*user)))
        }
        _ => None,
    }
}

/// The build id and version of a binary, for reporting a server that
/// cannot be traced: nothing here needs the probe symbols.
pub fn identify_binary(exe: &Path) -> BinaryIdentity {
    let Ok(file) = File::open(exe) else { return BinaryIdentity::default() };
    // SAFETY: read-only private mapping, as in `inspect_binary`.
    let Ok(map) = (unsafe { memmap2::Mmap::map(&file) }) else { return BinaryIdentity::default() };
    let Ok(elf) = object::File::parse(&*map) else { return BinaryIdentity::default() };
    BinaryIdentity { build_id: elf.build_id().ok().flatten().map(hex_plain), version: version_in(&elf) }
}

fn version_in(elf: &object::File<'_>) -> Option<String> {
    let rodata = elf.section_by_name(".rodata")?.data().ok()?;
    server_version(rodata)
}

/// The first NUL-terminated string of the form `N.N.N-MariaDB...` (or a
/// bare `N.N.N` right before `-MariaDB`), as MariaDB compiles
/// `MYSQL_SERVER_VERSION` in.
pub(crate) fn server_version(data: &[u8]) -> Option<String> {
    const MARK: &[u8] = b"-MariaDB";
    let mut from = 0;
    while let Some(at) = data[from..].windows(MARK.len()).position(|w| w == MARK).map(|i| i + from) {
        from = at + MARK.len();
        let start = data[..at].iter().rposition(|b| !(b.is_ascii_digit() || *b == b'.')).map_or(0, |p| p + 1);
        let numbers = &data[start..at];
        let parts = numbers.split(|b| *b == b'.').filter(|p| !p.is_empty()).count();
        // A string of its own: a NUL (or the start) right before the digits.
        if parts != 3 || (start > 0 && data[start - 1] != 0) {
            continue;
        }
        let end = data[at..].iter().position(|b| *b == 0 || !b.is_ascii_graphic()).map_or(data.len(), |p| p + at);
        return Some(String::from_utf8_lossy(&data[start..end.min(start + 64)]).into_owned());
    }
    None
}

/// A defined 8-byte data symbol and the segment that locates it at run time.
fn static_u64(elf: &object::File<'_>, name: &str) -> Option<StaticVariable> {
    use object::ObjectSegment;
    let symbol = find_symbol(elf, name).filter(|s| s.kind() == object::SymbolKind::Data && s.size() == 8)?;
    let first = elf.segments().find(|s| s.file_range().0 == 0)?;
    Some(StaticVariable { address: symbol.address(), first_segment: first.address() & !0xfff })
}

/// How errors name the binary: `/proc/PID/exe` is the path that opens the
/// running file, but an operator knows the file by the name it links to.
fn shown_path(exe: &Path) -> std::path::PathBuf {
    match std::fs::read_link(exe) {
        Ok(target) if exe.starts_with("/proc") => format!("{} ({})", exe.display(), target.display()).into(),
        _ => exe.into(),
    }
}

fn missing(path: &Path, symbol: &'static str, what: &'static str) -> DiscoverError {
    DiscoverError::MissingSymbol { path: path.into(), symbol, what }
}

/// Offset of the first instruction the kernel's uprobe emulates instead of
/// single-stepping (a single-stepped hit costs 12-17 us here, an emulated
/// one about 1 us):
/// - `push %rbp` / `push %r12..15` at the entry: 0;
/// - `test %rdi,%rdi` followed by a conditional jump, as in
///   `thd_wait_begin`: the jump, 3 bytes in. `test` only sets flags, so
///   every argument register still holds its value there.
///
/// A build with control-flow protection (`-fcf-protection`, as Debian 13's
/// MariaDB 11.8 and most current distributions' builds are) starts every
/// function with `endbr64`, which the kernel single-steps (measured here:
/// 15 us per hit on it, against 1 us on the `push` after it). `endbr64`
/// changes no register, so the probe goes on the instruction after it.
fn emulated_offset(code: &[u8]) -> Option<u64> {
    let body = strip_endbr(code);
    let skipped = (code.len() - body.len()) as u64;
    match body {
        [0x55, ..] | [0x41, 0x54..=0x57, ..] => Some(skipped),
        [0x48, 0x85, 0xff, 0x74, ..] | [0x48, 0x85, 0xff, 0x0f, 0x84, ..] => Some(skipped + 3),
        _ => None,
    }
}

/// Where a value decoder's probe goes: past a first check of the length
/// argument (`test %rdx,%rdx` or `cmp $n,%rdx`) that the kernel would
/// single-step (about 9 us here, against 0.6 us for an emulated
/// instruction), onto the conditional jump after it, which it emulates.
/// The check writes no register, so the arguments are still in place.
fn value_probe_offset(code: &[u8]) -> u64 {
    if let Some(offset) = emulated_offset(code) {
        return offset;
    }
    let body = strip_endbr(code);
    let skipped = (code.len() - body.len()) as u64;
    let jump_at = |at: usize| matches!(body.get(at..at + 2), Some([0x70..=0x7f, _] | [0x0f, 0x80..=0x8f]));
    match body {
        [0x48, 0x85, 0xd2, ..] if jump_at(3) => skipped + 3,
        [0x48, 0x83, 0xfa, _, ..] if jump_at(4) => skipped + 4,
        _ => skipped,
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect::<Vec<_>>().join(" ")
}

fn hex_plain(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_value_probe_goes_past_a_length_check_onto_its_jump() {
        // 10.11's set_param_int64: `cmp $0x7,%rdx; ja`; set_param_tiny:
        // `test %rdx,%rdx; je`; set_param_str: `push %rbp`; set_null:
        // `xor %eax,%eax; movdqu` (single-stepped, where it starts).
        assert_eq!(value_probe_offset(&[0x48, 0x83, 0xfa, 0x07, 0x77, 0x0a, 0xc3]), 4);
        assert_eq!(value_probe_offset(&[0x48, 0x85, 0xd2, 0x74, 0x3b]), 3);
        assert_eq!(value_probe_offset(&[0x55, 0x48, 0x89, 0xe5]), 0);
        assert_eq!(value_probe_offset(&[0x31, 0xc0, 0xf3, 0x0f, 0x6f, 0x06]), 0);
        // A check not followed by a jump is not skipped.
        assert_eq!(value_probe_offset(&[0x48, 0x83, 0xfa, 0x07, 0x48, 0x89, 0xe5]), 0);
    }

    #[test]
    fn decodes_where_a_connection_keeps_its_socket() {
        // 10.11's `thd_is_connected`: load system_thread, test, load
        // net.vio at 0x2c0, test, push, and call its is_connected method.
        let code = [
            0x8b, 0x97, 0x3c, 0x3f, 0x00, 0x00, 0xb8, 0x01, 0x00, 0x00, 0x00, 0x85, 0xd2, 0x74, 0x01, 0xc3, 0x48, 0x8b,
            0x97, 0xc0, 0x02, 0x00, 0x00, 0x31, 0xc0, 0x48, 0x85, 0xd2, 0x74, 0xf1, 0x55, 0x48, 0x89, 0xd7, 0x48, 0x89,
            0xe5, 0xff, 0x92, 0xb8, 0x01, 0x00, 0x00,
        ];
        assert_eq!(decode_vio(&code), Some(0x2c0));
        // A load with no method call after it is not the socket.
        assert_eq!(decode_vio(&code[..30]), None);
        assert_eq!(decode_vio(&[]), None);
    }

    #[test]
    fn decodes_accessors() {
        assert_eq!(decode_lea_rdi(&[0x48, 0x8d, 0x47, 0x68, 0xc3]), Some(0x68));
        assert_eq!(decode_mov_rdi(&[0x48, 0x8b, 0x87, 0x18, 0x3f, 0, 0, 0xc3]), Some(0x3f18));
        assert_eq!(decode_mov_rdi(&[0xf3, 0x0f, 0x1e, 0xfa, 0x48, 0x8b, 0x47, 0x10, 0xc3]), Some(0x10));
        // A function that does more than load a field is refused.
        assert_eq!(decode_lea_rdi(&[0x55, 0x48, 0x89, 0xe5]), None);
        assert_eq!(decode_mov_rdi(&[0x48, 0x8d, 0x47, 0x68, 0xc3]), None);
        // Debian's 10.11: thd_current_command and thd_storage_lock_wait.
        assert_eq!(decode_mov32_rdi(&[0x8b, 0x87, 0xd8, 0x27, 0, 0, 0xc3]), Some(0x27d8));
        assert_eq!(decode_add_rsi_to_rdi(&[0x48, 0x01, 0xb7, 0x18, 0x28, 0, 0, 0xc3]), Some(0x2818));
        assert_eq!(decode_add_rsi_to_rdi(&[0x48, 0x01, 0x77, 0x10, 0xc3]), Some(0x10));
        // A 64-bit load is not the 32-bit command field.
        assert_eq!(decode_mov32_rdi(&[0x48, 0x8b, 0x87, 0x18, 0x3f, 0, 0, 0xc3]), None);
        assert_eq!(decode_add_rsi_to_rdi(&[0x48, 0x29, 0xb7, 0x18, 0x28, 0, 0, 0xc3]), None);
    }

    #[test]
    fn finds_the_compiled_in_version() {
        assert_eq!(server_version(b"abc\x0010.11.19-MariaDB\x00x").as_deref(), Some("10.11.19-MariaDB"));
        assert_eq!(server_version(b"\x0011.8.9-MariaDB-deb13-log\x00").as_deref(), Some("11.8.9-MariaDB-deb13-log"));
        // Inside other text, or not three numbers: not the version.
        assert_eq!(server_version(b"see 10.11.19-MariaDB\0"), None);
        assert_eq!(server_version(b"\x0010.11-MariaDB\x00\x001.2.3-MariaDB\x00").as_deref(), Some("1.2.3-MariaDB"));
        let ours = identify_binary(std::path::Path::new("/proc/self/exe"));
        assert!(ours.build_id.is_some() || ours.version.is_none());
    }

    #[test]
    fn probes_land_on_emulated_instructions() {
        assert_eq!(emulated_offset(&[0x55, 0x48, 0x89, 0xe5]), Some(0));
        // After the endbr64 of a CET build (MariaDB 11.8 in Debian 13).
        assert_eq!(emulated_offset(&[0xf3, 0x0f, 0x1e, 0xfa, 0x41, 0x57]), Some(4));
        assert_eq!(emulated_offset(&[0xf3, 0x0f, 0x1e, 0xfa, 0x55, 0x48, 0x89, 0xe5]), Some(4));
        // thd_wait_begin in Debian's 10.11: test %rdi,%rdi; je ...
        assert_eq!(emulated_offset(&[0x48, 0x85, 0xff, 0x74, 0x23, 0x48]), Some(3));
        // ... and in 11.8: endbr64; test %rdi,%rdi; je ...
        assert_eq!(emulated_offset(&[0xf3, 0x0f, 0x1e, 0xfa, 0x48, 0x85, 0xff, 0x74, 0x1f]), Some(7));
        // endbr64 followed by an instruction the kernel single-steps.
        assert_eq!(emulated_offset(&[0xf3, 0x0f, 0x1e, 0xfa, 0x48, 0x8d, 0x44, 0x7f, 0x01]), None);
        assert_eq!(emulated_offset(&[0x48, 0x8b, 0x87, 0x80, 0x05, 0, 0]), None);
    }

    #[test]
    fn non_elf_is_refused() {
        let exe = std::env::temp_dir().join(format!("sqlbee-not-elf-{}", std::process::id()));
        std::fs::write(&exe, b"#!/bin/sh\necho hi\n").unwrap();
        let err = inspect_binary(&exe).unwrap_err();
        std::fs::remove_file(&exe).ok();
        assert!(matches!(err, DiscoverError::NotElf { .. }), "{err}");
    }

    #[test]
    fn binary_without_symbol_names_it() {
        // The test binary itself is an ELF without dispatch_command.
        let me = std::env::current_exe().unwrap();
        let err = inspect_binary(&me).unwrap_err();
        let text = err.to_string();
        assert!(text.contains("dispatch_command") && text.contains(&me.display().to_string()), "{text}");
    }

    /// Debian's own server (`./x setup` installs it): every field the
    /// statement program reads is found, and all of them share one copy,
    /// so this build pays no copy of a field on its own.
    #[test]
    fn the_installed_server_keeps_every_field_in_one_window() {
        let exe = Path::new("/usr/sbin/mariadbd");
        if !exe.exists() {
            assert!(
                std::env::var_os("SQLBEE_REQUIRE_PRIVILEGED").is_none(),
                "no {} (./x setup installs it)",
                exe.display()
            );
            return eprintln!("skipping: no {} (./x setup installs it)", exe.display());
        }
        let info = inspect_binary(exe).unwrap();
        let layout = info.layout;
        let all = (1u32 << sqlbee_kernel_abi::thd_field::COUNT) - 1;
        assert_eq!(layout.stats_fields, all, "fields left out: {:?}", info.missing_fields);
        assert_eq!(layout.stats_alone, 0, "{layout:?}");
        assert!(layout.stats_len as usize <= sqlbee_kernel_abi::STATS_WINDOW);
    }
}
