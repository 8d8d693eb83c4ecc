//! The kernel ABI: types and limits shared by the kernel programs and the
//! agent, and nothing else (the collector and the wire never see it).
//!
//! Everything here is `#[repr(C)]` and `Copy`: the kernel writes these bytes
//! and userspace reads them back, so both sides must agree on the layout
//! without any other channel. It imports the figure list and, behind the
//! `user` feature (the agent's side of the maps), aya.
#![no_std]

mod figure_sums;
pub mod text_hash;
mod thd_fields;

pub use figure_sums::FigureSums;
/// The histogram scheme the kernel counts into.
pub use sqlbee_figures::{histogram, needs};
pub use thd_fields::{AloneCopy, Identity, MAX_ALONE, alone_copy, decode, stats_field, thd_field};

/// Largest statement text the kernel can copy. The configured limit
/// (default 4 KiB) must not exceed it.
pub const MAX_TEXT: usize = 16 * 1024;
/// Default number of text bytes copied per statement.
pub const DEFAULT_TEXT_LIMIT: u32 = 4096;

/// Slots of the per-command counter array; `enum_server_command` is a u8
/// on the wire, larger values land in the last slot.
pub const COMMAND_SLOTS: u32 = 256;
/// Slots of the in-flight array: a thread uses slot `tid % INFLIGHT_SLOTS`
/// and writes its tid into it, so two threads whose ids collide are told
/// apart (the statement then counts as unmatched) instead of mixed up. A
/// power of two.
pub const INFLIGHT_SLOTS: u32 = 64 * 1024;

/// Wait classes, from the server's `thd_wait_type` (MariaDB
/// `include/mysql/service_thd_wait.h`).
pub mod wait_class {
    pub const ROW_LOCK: usize = 0;
    pub const METADATA_LOCK: usize = 1;
    pub const TABLE_LOCK: usize = 2;
    pub const DISK_IO: usize = 3;
    pub const NETWORK: usize = 4;
    pub const COMMIT: usize = 5;
    pub const SLEEP: usize = 6;
    pub const OTHER: usize = 7;
    pub const COUNT: usize = 8;
    pub const NAMES: [&str; COUNT] =
        ["row_lock", "metadata_lock", "table_lock", "disk_io", "network", "commit", "sleep", "other"];

    /// Class of a `thd_wait_type` value.
    #[inline(always)]
    pub fn of(wait_type: u64) -> usize {
        match wait_type {
            1 => SLEEP,
            2 => DISK_IO,
            3 => ROW_LOCK,
            5 => METADATA_LOCK,
            4 | 6 => TABLE_LOCK,
            8..=10 => COMMIT,
            11 => NETWORK,
            _ => OTHER,
        }
    }
}

/// Longest error message kept per error sample.
pub const MAX_ERROR_MESSAGE: usize = 256;

/// An error the server sent to a client, with its message; written to the
/// `ERRORS` ring buffer only when an error happens.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ErrorSample {
    pub tid: u32,
    pub code: u32,
    pub thd: u64,
    /// CLOCK_MONOTONIC ns when the error was raised; the statement it
    /// belongs to carries the same value in `error_ns`, so `(tid,
    /// raised_ns)` names the statement record.
    pub raised_ns: u64,
    pub message: [u8; MAX_ERROR_MESSAGE],
}

/// Flag bits of [`StatementEvent::flags`].
pub mod flags {
    /// The text was cut at the configured limit; `text_len` is the original.
    pub const TRUNCATED: u32 = 1;
    /// The server had no statement text to offer (for example a prepared
    /// statement whose text could not be read).
    pub const NO_TEXT: u32 = 2;
    /// The statement ended in an error sent to the client.
    pub const ERROR: u32 = 4;
    /// Already counted in the kernel digest of its text hash: sent
    /// only for a fresh sample text (and to check the hash's grouping), not
    /// to be counted again.
    pub const SAMPLE: u32 = 8;
    /// The text was left out on purpose: the agent is shedding load.
    pub const SHED: u32 = 16;
    /// `FigureSums::cpu_ns` was measured (the thread had ended a
    /// statement before, since the probes attached).
    pub const CPU: u32 = 32;
    /// A statement a stored program ran (procedure, function, trigger,
    /// event), timed from its own start; `program_hash`, `program_kind` and
    /// `parent_start_ns` say which program and which client statement.
    pub const NESTED: u32 = 64;
}

/// Where a statement came from (`StatementEvent::source`).
pub mod source {
    /// A client's statement, or one a client's statement ran.
    pub const CLIENT: u32 = 0;
    /// The replica's applier (`system_thread` SLAVE_SQL).
    pub const REPLICA: u32 = 1;
    /// The event scheduler (`system_thread` EVENT_WORKER).
    pub const EVENT: u32 = 2;
    /// `THD::system_thread` values (MariaDB `enum_thread_type`).
    pub const SYSTEM_THREAD_SLAVE_SQL: u32 = 4;
    pub const SYSTEM_THREAD_EVENT_WORKER: u32 = 16;
}

/// The kind of stored program a nested statement ran in
/// (`StatementEvent::program_kind`).
pub mod program_kind {
    pub const UNKNOWN: u32 = 0;
    pub const PROCEDURE: u32 = 1;
    pub const FUNCTION: u32 = 2;
    pub const TRIGGER: u32 = 3;
    pub const EVENT: u32 = 4;
    /// A `BEGIN NOT ATOMIC ... END` block a client sent: no name.
    pub const ANONYMOUS: u32 = 5;
    /// `sp_head::m_flags` bit the event scheduler sets on an event's body.
    pub const EVENT_BODY_FLAG: u32 = 0x100;
}

/// Indices of the per-CPU health counters: one `STATS` value per CPU
/// holds them all, so a statement touches one block of memory for its
/// counts, not one per counter. The ones bumped per statement come first.
pub mod stat {
    /// Statement ends seen (emitted or not): the exact statement total.
    pub const STATEMENTS: u32 = 0;
    /// Statements counted into a kernel digest slot instead of sent.
    pub const KERNEL_COUNTED: u32 = 1;
    /// Statement events written to the ring buffer.
    pub const EVENTS: u32 = 2;
    /// Statements of `COM_QUERY` and of `COM_STMT_EXECUTE`, the commands of
    /// nearly every statement. Without the command probe these are their
    /// `COMMANDS` counts, kept here so the hot path writes one block.
    pub const QUERY_STATEMENTS: u32 = 3;
    pub const EXECUTE_STATEMENTS: u32 = 4;
    /// Statement events lost because the ring buffer was full.
    pub const DROPPED: u32 = 5;
    /// Statement ends whose start could not be established (the THD's
    /// start time unreadable or implausible): counted, not timed.
    pub const UNMATCHED: u32 = 6;
    /// Reads of server memory that failed (text or THD fields).
    pub const READ_FAILED: u32 = 7;
    /// Errors attributed to a statement in flight.
    pub const ERRORS: u32 = 8;
    /// Hits of the calibration program (the agent's own trap timing).
    pub const CALIBRATION_HITS: u32 = 9;
    /// Name records (schemas, accounts) lost because their ring was full.
    pub const NAMES_DROPPED: u32 = 10;
    /// Statements stored programs ran, each ended (and sent) on its own.
    pub const NESTED: u32 = 11;
    /// Nested statement ends whose start was not seen (they began before
    /// the probes attached): counted, not timed.
    pub const NESTED_UNMATCHED: u32 = 12;
    /// Statement-end hits inside a stored program (the slow-log path of a
    /// nested statement, already counted as nested): not counted again.
    pub const NESTED_LOG_HITS: u32 = 13;
    /// Statements the replica's applier ran: apart from client statements.
    pub const REPLICA: u32 = 14;
    /// Second statement-end hits of one statement (`EXECUTE IMMEDIATE`
    /// reaches the end twice with one query id): not counted again.
    pub const DUPLICATE_HITS: u32 = 15;
    /// Events a replica applied that the agent could not time: their ring
    /// was full, or two applier threads shared one slot of `APPLYING`.
    pub const APPLIED_LOST: u32 = 16;
    pub const SLOTS: u32 = 17;
}

/// One CPU's health counters, indexed by [`stat`].
pub type StatBlock = [u64; stat::SLOTS as usize];

/// `enum_server_command` values the kernel side treats specially.
pub mod command {
    pub const QUERY: u32 = 3;
    pub const STMT_EXECUTE: u32 = 23;
    /// MariaDB's array binding (Connector/J's batches).
    pub const STMT_BULK_EXECUTE: u32 = 250;
}

/// Where the server keeps what the kernel side reads. Learned per binary
/// at run time (never hard-coded) and written into the programs before load.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ServerLayout {
    /// Which argument of `dispatch_command` holds the command (0-based).
    pub command_arg: u32,
    /// Which argument of `dispatch_command` holds `THD*`.
    pub thd_arg: u32,
    /// Which argument of `dispatch_command` holds the packet pointer, or
    /// `u32::MAX` when the packet is not a plain byte buffer.
    pub packet_arg: u32,
    /// Offset of the statement text `{const char*, size_t}` in THD.
    pub query_offset: u32,
    /// Offset of the connection id (`thread_id`) in THD.
    pub connection_id_offset: u32,
    /// Bytes of text to copy per statement (at most [`MAX_TEXT`]).
    pub text_limit: u32,
    /// Waits at least this long (microseconds) are also reported one by
    /// one as [`LongWait`] records; 0 turns that off.
    pub long_wait_us: u32,
    /// Offset of the current command (`enum_server_command`) in THD.
    pub command_offset: u32,
    /// Offset of `start_utime` in THD: CLOCK_MONOTONIC microseconds at
    /// which the server started the statement (reset for each statement
    /// of a multi-statement query).
    pub start_utime_offset: u32,
    /// Offset of `utime_after_lock` in THD: start plus the time spent
    /// acquiring locks, row-lock waits included.
    pub lock_utime_offset: u32,
    /// Non-zero when the `dispatch_command` probe is attached: it then
    /// counts every command, otherwise statement ends count by command.
    pub command_probe: u32,
    /// Slots of the kernel digests (see [`kernel_digests`]); 0 sends every
    /// statement to the agent.
    pub digest_slots: u32,
    /// Non-zero when the wait probes are attached: only then does a
    /// statement's end keep the per-thread wait state up to date.
    pub wait_probes: u32,
    /// Sets of the `KNOWN` table (`kernel_digests::known_sets`), a power of two.
    pub known_sets: u32,
    /// Offset of the current database `{const char*, size_t}` in THD;
    /// `UNKNOWN` leaves the schema out.
    pub db_offset: u32,
    /// The THD fields of [`thd_field`] (the per-statement counters of
    /// [`FigureSums`], the connection id, the source, the query id) are
    /// copied into [`EventBuffer::window`]: those close together with one
    /// read of `stats_len` bytes from THD+`stats_base` to its start, each
    /// other one on its own (`stats_alone`) into a slot after that.
    pub stats_base: u32,
    pub stats_len: u32,
    /// Which fields this build lets the kernel read ([`stats_field`] bits).
    pub stats_fields: u32,
    /// Of those, the ones copied on their own ([`stats_field`] bits).
    pub stats_alone: u32,
    /// Where each field of [`thd_field`] lies in the THD (bytes from its
    /// start), by its index.
    pub field_at: [u32; thd_field::COUNT],
    /// Where the program finds each field in its copy (bytes into
    /// [`EventBuffer::window`]), by its index.
    pub field_rel: [u32; thd_field::COUNT],
    /// Offset of `se.sum_exec_runtime` in the running kernel's
    /// `task_struct`, from its BTF; 0 leaves CPU time out.
    pub task_runtime_offset: u32,
    /// 1: read that field through the BTF pointer `bpf_get_current_task_btf`
    /// gives (kernel 5.11+), a plain load the verifier checks against
    /// `task_struct`; 0: through `bpf_probe_read_kernel`.
    pub task_btf: u32,
    /// Offset of `THD::security_ctx` (a pointer to the connection's
    /// `Security_context` at a top-level statement), and in that context the
    /// pointers to the user and the client host (`host_or_ip`); `UNKNOWN`
    /// leaves the account out.
    pub sctx_offset: u32,
    pub sctx_user_offset: u32,
    pub sctx_host_offset: u32,
    /// Keeps the u64 fields below aligned without a padding hole (the
    /// struct is copied as plain bytes).
    pub reserved: u32,
    /// Non-zero when the nested-statement probes are attached.
    pub nested_probes: u32,
    /// `THD::spcont` (the running program's `sp_rcontext*`), its `m_sp`
    /// (`sp_head*`), and in `sp_head` the schema and name (`{char*,
    /// size_t}`), the handler pointer and the flags; `UNKNOWN` for
    /// `spcont_offset` leaves programs unnamed.
    pub spcont_offset: u32,
    pub rcontext_sp_offset: u32,
    pub sp_db_offset: u32,
    pub sp_name_offset: u32,
    pub sp_handler_offset: u32,
    pub sp_flags_offset: u32,
    /// Run-time addresses of the server's `sp_handler_procedure`,
    /// `sp_handler_function` and `sp_handler_trigger`: `sp_head::m_handler`
    /// points to one of them, which says the program's kind.
    pub handler_procedure: u64,
    pub handler_function: u64,
    pub handler_trigger: u64,
    /// Statements at least this long (ms) always reach the agent as
    /// records, never only a kernel digest's count: each is an event of
    /// its own there. 0: no such threshold.
    pub long_statement_ms: u32,
    /// Offset of `THD::net.vio` (a `Vio*` whose first int is the
    /// connection's socket fd). Known, it also says the agent writes a
    /// client key for each connection (`CLIENT_KEYS`): a connection's
    /// statements reach it as records until its key is there, so each is
    /// counted by its client. `UNKNOWN`: clients are not named.
    pub vio_offset: u32,
    /// Non-zero when the replica-apply probes are attached (see
    /// [`AppliedEvent`]).
    pub apply_probes: u32,
    /// `Log_event::when`: the second the primary wrote the event.
    pub event_when_offset: u32,
    /// `Rows_log_event::m_type` (u32, the event's type code) and
    /// `m_table` (`TABLE*`), `TABLE::s` (`TABLE_SHARE*`), and in the share
    /// `db` (`{char*, size_t}`, `table_name` right after it).
    pub rows_type_offset: u32,
    pub rows_table_offset: u32,
    pub table_share_offset: u32,
    pub share_db_offset: u32,
    /// `Log_event::thd` (`UNKNOWN`: rows changed are not read), and in the
    /// THD the rows written, updated and deleted (`status_var.ha_*_count`,
    /// u64 each).
    pub event_thd_offset: u32,
    pub row_counter_offsets: [u32; 3],
    /// Where the rows events' classes keep their virtual tables in this
    /// process (the value of such an event's first word); 0: none.
    pub rows_vtables: [u64; ROWS_VTABLES],
    /// The GTID event's virtual table: the event that begins a
    /// transaction, where its replication channel is read; 0: none.
    pub gtid_vtable: u64,
    /// `rpl_group_info::rli` (`Relay_log_info*`), `Relay_log_info::mi`
    /// (`Master_info*`, null outside a channel) and
    /// `Master_info::connection_name` (`{char*, size_t}`). `UNKNOWN`:
    /// channels are not told apart.
    pub rgi_rli_offset: u32,
    pub rli_mi_offset: u32,
    pub mi_channel_offset: u32,
    pub reserved_channel: u32,
    /// The send hook (`--statement-hook send`): the process whose sends
    /// end statements, 0 when statements end at the uprobe. Its programs
    /// run at every syscall on the host, so this is their first test.
    pub send_tgid: u32,
    /// `task_struct.thread.fsbase` in the running kernel (from its BTF):
    /// the thread pointer, below which the server's thread-locals lie.
    pub task_fsbase_offset: u32,
    /// `THR_THD` lies this many bytes below the thread pointer (the
    /// executable's own TLS block ends there).
    pub thd_tls_offset: u32,
    /// `THD::m_stmt_da` (a `Diagnostics_area*`), and in it `m_status`: final
    /// (OK, EOF or error) only at the send that answers a statement.
    pub stmt_da_offset: u32,
    pub da_status_offset: u32,
    /// `THD::net.vio` for the send hook, whatever the clients option says: a
    /// `write` (TLS answers leave that way) ends a statement only on the
    /// client's socket. `UNKNOWN`: only `sendto` ends statements.
    pub send_vio_offset: u32,
}

impl ServerLayout {
    /// The figures' `needs` bits this layout lets the programs read: its
    /// fields, and CPU time when the task's runtime offset is known.
    #[inline(always)]
    pub fn known_needs(&self) -> u32 {
        let offset = self.task_runtime_offset;
        let cpu = if offset != 0 && offset != UNKNOWN { needs::CPU } else { 0 };
        self.stats_fields | cpu
    }
}

/// Classes of rows events told apart by their virtual table: write,
/// update, delete, each plain and compressed.
pub const ROWS_VTABLES: usize = 6;

/// Slots of the replica-apply probes' in-flight map, `tid % APPLY_SLOTS`:
/// a server has one applier thread, or as many as its parallel workers.
pub const APPLY_SLOTS: u32 = 1024;

/// An event the replica's applier is applying, in its thread's slot.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct Applying {
    pub tid: u32,
    pub reserved: u32,
    /// The `Log_event*`; 0 once its end was seen.
    pub event: u64,
    /// CLOCK_MONOTONIC ns.
    pub start_ns: u64,
    /// The event's first word (its class), read once at its start.
    pub vtable: u64,
    /// For a rows event, the applier's THD and its rows changed so far
    /// (`ROWS_UNKNOWN`: not read; other events never read them).
    pub thd: u64,
    pub rows_before: u64,
    /// For a GTID event, its `rpl_group_info*` (the channel is read from it
    /// at the return).
    pub rgi: u64,
}

/// Rows changed that could not be read.
pub const ROWS_UNKNOWN: u64 = u64::MAX;

/// Bytes of a schema or table name in an [`AppliedEvent`] (with its NUL).
pub const APPLIED_NAME: usize = 72;

/// One replication event the replica applied (`Log_event::apply_event`),
/// timed from its entry to its return. Row events carry no SQL text: the
/// record names their table and kind, never their values.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct AppliedEvent {
    pub tid: u32,
    /// A rows event's type code (`Log_event_type`); 0 for other events.
    pub rows_type: u32,
    /// The event's first word: its class's virtual table in this process.
    pub vtable: u64,
    /// When the primary wrote it (seconds since the epoch, its clock).
    pub when: u64,
    /// CLOCK_MONOTONIC ns.
    pub start_ns: u64,
    pub end_ns: u64,
    /// Rows the applier wrote, updated and deleted while applying it (its
    /// handler's counters, triggers included); `ROWS_UNKNOWN`: not read.
    pub rows: u64,
    /// A rows event's table, NUL-terminated; empty for other events. A
    /// GTID event's `table` is instead its channel's connection name
    /// (empty: the default channel, or channels not told apart).
    pub schema: [u8; APPLIED_NAME],
    pub table: [u8; APPLIED_NAME],
}

/// A layout offset the agent could not learn for this build.
pub const UNKNOWN: u32 = u32::MAX;

/// Bytes of the statement program's copy of the THD fields (the shared
/// window and the slots of the fields read on their own).
pub const STATS_WINDOW: usize = 1024;

/// Bits of the server's `query_plan_flags` (MariaDB `sql/log_slow.h`,
/// unchanged since 5.5; the agent checks `QPLAN_TMP_TABLE` against the
/// code it decodes the offset from).
pub mod plan {
    pub const FILESORT: u64 = 0x2;
    pub const FILESORT_DISK: u64 = 0x4;
    pub const FULL_JOIN: u64 = 0x10;
    pub const FULL_SCAN: u64 = 0x20;
    pub const TMP_TABLE: u64 = 0x200;
    pub const TMP_DISK: u64 = 0x400;
}

/// Bits of the server's `server_status` (the protocol's `SERVER_QUERY_*`).
pub mod server_status {
    pub const NO_GOOD_INDEX_USED: u32 = 0x10;
    pub const NO_INDEX_USED: u32 = 0x20;
}

/// One statement's figures as its record carries them: the sums' fields in
/// a compact form (flags as bits), since every byte of a record is copied
/// to the ring buffer and limits how many records it holds.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StatementStats {
    pub rows_sent: u64,
    pub rows_examined: u64,
    pub rows_affected: u64,
    pub lock_ns: u64,
    pub cpu_ns: u64,
    pub tmp_tables: u32,
    pub tmp_disk_tables: u32,
    pub sort_merge_passes: u32,
    /// [`statement_flag`] bits.
    pub flags: u32,
}

/// Bits of [`StatementStats::flags`].
pub mod statement_flag {
    pub const CPU_MEASURED: u32 = 1;
    pub const NO_INDEX_USED: u32 = 2;
    pub const NO_GOOD_INDEX_USED: u32 = 4;
    pub const SELECT_FULL_JOIN: u32 = 8;
    pub const SELECT_SCAN: u32 = 16;
    pub const FILESORT: u32 = 32;
    pub const FILESORT_ON_DISK: u32 = 64;
}

/// Accounts (user and client host) a kernel digest slot tells apart per
/// CPU; statements of further accounts are counted without one.
pub const SLOT_ACCOUNTS: usize = 4;

/// Longest schema name, user and client host the kernel copies (bytes);
/// longer ones are hashed and named by this prefix and their length.
pub const MAX_NAME: usize = 64;
pub const MAX_HOST: usize = 128;

/// Kinds of [`NameRecord`].
pub mod name_kind {
    pub const SCHEMA: u32 = 1;
    pub const ACCOUNT: u32 = 2;
    /// A stored program: `name` its schema, `host` its name.
    pub const PROGRAM: u32 = 3;
}

/// Connections whose client key the kernel can look up at once
/// (`CLIENT_KEYS`, least recently used out first).
pub const CLIENT_KEY_ENTRIES: u32 = 65_536;

/// An account hash with a connection's client key mixed in (0: no client
/// known, the account's own hash). Kernel digests count statements by this
/// hash, so the agent, which wrote the key, tells clients apart in them.
#[inline(always)]
pub fn with_client(account_hash: u64, client_key: u64) -> u64 {
    if client_key == 0 || account_hash == 0 {
        return account_hash;
    }
    (account_hash ^ client_key.rotate_left(23)).wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1
}

/// Nested statements tracked at once per thread (a program calling a
/// program ...); deeper ones are counted, not timed.
pub const MAX_FRAMES: usize = 8;
/// Slots of the frame stacks (`FRAMES`): a thread uses `tid % FRAME_SLOTS`.
pub const FRAME_SLOTS: u32 = 8192;

/// A nested statement in progress: the stack pointer at its start (which
/// names its frame), when it started, and its thread's CPU time then.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct Frame {
    pub entry_sp: u64,
    pub start_ns: u64,
    pub cpu_ns: u64,
}

/// How many nested statements are in progress on one thread; the frames
/// themselves are in `FRAME_ENTRIES` at `slot * MAX_FRAMES + level`
/// (outermost first), where a map lookup checks the index at run time.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct FrameStack {
    pub tid: u32,
    pub depth: u32,
}

/// What a schema or account hash stands for. Sent once per connection and
/// change (ring `NAMES`), so statements carry only the hash.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct NameRecord {
    pub kind: u32,
    /// Bytes of `name` and `host` used (`host` for accounts only).
    pub name_len: u32,
    pub host_len: u32,
    /// An account's connection socket fd in the server (-1: unknown).
    pub socket_fd: i32,
    pub hash: u64,
    /// A schema's name, or an account's user.
    pub name: [u8; MAX_NAME],
    pub host: [u8; MAX_HOST],
    /// An account's connection id (0 for other kinds).
    pub connection: u64,
    /// 1: the kernel found no client key for the connection (see
    /// `ServerLayout::vio_offset`).
    pub client_pending: u32,
    pub _pad: u32,
}

impl Default for NameRecord {
    fn default() -> Self {
        Self {
            kind: 0,
            name_len: 0,
            host_len: 0,
            socket_fd: -1,
            hash: 0,
            connection: 0,
            name: [0; MAX_NAME],
            host: [0; MAX_HOST],
            client_pending: 0,
            _pad: 0,
        }
    }
}

/// Kernel digests: a statement whose text hash the agent has
/// registered (map `KNOWN`: hash -> slot, see `KNOWN_WAYS`) is counted into that slot of the
/// current epoch (map `DIGEST_SLOTS`, per CPU, index `epoch * slots + slot`)
/// instead of being sent. The agent flips the epoch at each window end and
/// reads and clears the other one, so a steady workload sends nothing per
/// statement to user space.
pub mod kernel_digests {
    use crate::histogram;

    /// Histogram buckets kept in the kernel: the scheme's
    /// (`crate::histogram`) buckets from 2^LOW_POWER ns (1 us) to
    /// 2^(LOW_POWER + POWERS) ns (73 min), so kernel bucket `k` is scheme
    /// bucket `FIRST_AGENT_BUCKET + k`; a duration outside the range is
    /// sent as an event instead, so nothing is clamped.
    pub const LOW_POWER: u32 = 10;
    pub const POWERS: u32 = 32;
    pub const BUCKETS: usize = POWERS as usize * histogram::SUB as usize;
    /// The scheme's bucket of the kernel's bucket 0.
    pub const FIRST_AGENT_BUCKET: usize = histogram::bucket_of(1 << LOW_POWER);

    /// Kernel bucket of a duration whose highest set bit is `top`, with
    /// `LOW_POWER <= top < LOW_POWER + POWERS`.
    #[inline(always)]
    pub const fn bucket_at(duration_ns: u64, top: u32) -> usize {
        histogram::bucket_at(duration_ns, top) - FIRST_AGENT_BUCKET
    }
    /// Hash of a text with no bytes hashed yet (FNV-1a offset basis).
    pub const HASH_SEED: u64 = 0xcbf2_9ce4_8422_2325;

    /// `KNOWN` is a set-associative table in an array map, not a hash
    /// map: a lookup is one index and a compare of four words on one cache
    /// line, with no hashing of the key and no bucket walk. A hash may sit
    /// in any way of its set.
    pub const KNOWN_WAYS: usize = 4;
    pub type KnownSet = [u64; KNOWN_WAYS];
    /// An entry: the hash's bits 24-63, a check byte, and the slot plus one
    /// in the low 16 bits (0: an empty way). The agent changes a way only
    /// from empty to an entry or back, by rewriting the whole set, and the
    /// kernel copies a map value byte by byte as far as anyone promises.
    /// So a program may read a way half written: some bytes old, some new,
    /// the rest zero. The check byte, a function of the slot that is never
    /// 0, makes such a read name no slot rather than a wrong one. Two hashes
    /// share an entry only when they agree in those 40 bits and in the set.
    pub const SLOT_BITS: u32 = 16;
    const SLOT_MASK: u64 = (1 << SLOT_BITS) - 1;
    const CHECK_SHIFT: u32 = SLOT_BITS;
    const TAG_MASK: u64 = !((1 << (SLOT_BITS + 8)) - 1);
    /// The most slots an entry can name.
    pub const MAX_SLOTS: u32 = (1 << SLOT_BITS) - 2;

    /// Check byte of a slot field (slot plus one): which of its two bytes
    /// are non-zero. It is never 0, and it differs from the check byte of
    /// the field with a non-zero byte zeroed.
    #[inline(always)]
    const fn check_byte(field: u64) -> u64 {
        1 | (((field & 0xff != 0) as u64) << 1) | (((field & 0xff00 != 0) as u64) << 2)
    }

    /// Sets for `slots`: twice as many ways as slots, so a set is rarely
    /// full (a hash that finds its set full is sent as records instead).
    pub const fn known_sets(slots: u32) -> u32 {
        let ways = 2 * slots as u64 / KNOWN_WAYS as u64;
        let mut sets = 1u32;
        while (sets as u64) < ways {
            sets <<= 1;
        }
        sets
    }

    /// A text hash with the schema it ran in mixed in, so one text in two
    /// schemas counts in two slots. Keeps the top bit (prepared or query
    /// text) and never gives 0 ("no hash"). Schema 0 (none) leaves it as is.
    #[inline(always)]
    pub const fn with_schema(text_hash: u64, schema_hash: u64) -> u64 {
        if text_hash == 0 || schema_hash == 0 {
            return text_hash;
        }
        let top = text_hash & (1 << 63);
        let mixed = (text_hash ^ schema_hash.rotate_left(23)).wrapping_mul(0x9e37_79b9_7f4a_7c15).rotate_left(29);
        let mixed = (mixed & !(1 << 63)) | top;
        if mixed == 0 { 1 } else { mixed }
    }

    /// Set of `hash` among `sets` (a power of two).
    #[inline(always)]
    pub const fn known_set(hash: u64, sets: u32) -> u32 {
        (hash ^ (hash >> 32)) as u32 & (sets - 1)
    }

    /// The entry that maps `hash` to `slot`.
    pub const fn known_entry(hash: u64, slot: u32) -> u64 {
        let field = slot as u64 + 1;
        (hash & TAG_MASK) | (check_byte(field) << CHECK_SHIFT) | field
    }

    /// The slot `entry` gives `hash`, if it is `hash`'s entry, whole.
    #[inline(always)]
    pub const fn entry_slot(entry: u64, hash: u64) -> Option<u32> {
        let field = entry & SLOT_MASK;
        if field == 0 || (entry ^ hash) & TAG_MASK != 0 || (entry >> CHECK_SHIFT) & 0xff != check_byte(field) {
            return None;
        }
        Some(field as u32 - 1)
    }
}

/// One kernel digest slot: statements of one text hash in one epoch on one CPU.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct SlotStats {
    pub count: u64,
    pub sum_ns: u64,
    /// Meaningful only when `count > 0`.
    pub min_ns: u64,
    pub max_ns: u64,
    pub stats: FigureSums,
    /// The first accounts seen on this CPU this epoch (0: free) and their
    /// statements; the rest of `count` had another account.
    pub accounts: [u64; SLOT_ACCOUNTS],
    pub account_counts: [u64; SLOT_ACCOUNTS],
    pub buckets: [u32; kernel_digests::BUCKETS],
}

impl Default for SlotStats {
    fn default() -> Self {
        Self {
            count: 0,
            sum_ns: 0,
            min_ns: 0,
            max_ns: 0,
            stats: FigureSums::default(),
            accounts: [0; SLOT_ACCOUNTS],
            account_counts: [0; SLOT_ACCOUNTS],
            buckets: [0; kernel_digests::BUCKETS],
        }
    }
}

/// Which epoch of `DIGEST_SLOTS` the programs write now (map `CONTROL`).
pub const CONTROL_EPOCH: u32 = 0;
/// `u32::MAX`, written by the agent: the text hash ANDs its lexer state
/// with it, so the verifier sees an unknown value instead of one constant
/// per lexer state and does not explore every sequence of states.
pub const CONTROL_OPAQUE_ONES: u32 = 1;
/// The agent's shedding step: 1 and up sends no per-window samples, 2 and
/// up sends statements it has not registered without their text.
pub const CONTROL_SHEDDING: u32 = 2;
pub const CONTROL_SLOTS: u32 = 3;

/// One wait longer than `ServerLayout::long_wait_us`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct LongWait {
    pub tid: u32,
    /// `wait_class` index.
    pub class: u32,
    pub thd: u64,
    pub connection_id: u64,
    /// CLOCK_MONOTONIC ns.
    pub wait_start_ns: u64,
    pub duration_ns: u64,
    /// `start_ns` of the waiting statement: with `tid`, names its record.
    pub statement_start_ns: u64,
}

/// Why a thread's statements must go out as records rather than into a
/// kernel digest (`Inflight::record_pending` bits).
pub mod record_pending {
    /// The connection's client key is not in `CLIENT_KEYS` yet: each
    /// statement looks it up again.
    pub const CLIENT: u64 = 1;
    /// The value probes copied a prepared statement's values on this
    /// thread since its last record: the next one carries the statement
    /// the agent pairs them with (see `ValueEvent`).
    pub const VALUES: u64 = 2;
}

/// Bytes of a parameter value copied, with its length prefix: a longer
/// string or decimal is marked cut, and its statement is not bound.
pub const VALUE_BYTES: usize = 256;

/// One parameter value of a prepared statement, as the server is about to
/// decode it from the client's `COM_STMT_EXECUTE` packet: the value probes
/// (attached only while the agent asks for values, for plans) fire at the
/// entry of each `Item_param::set_param_*` decoder and of
/// `Item_param::set_null`, in the order of the statement's placeholders.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct ValueEvent {
    pub tid: u32,
    /// Bytes copied into `bytes`.
    pub captured: u32,
    /// Where the probe fired: which decoder, so which type the value has.
    pub ip: u64,
    /// CLOCK_MONOTONIC ns: with `tid`, names the statement it belongs to.
    pub at_ns: u64,
    /// Bytes of the packet left from the value on (the decoder's length
    /// argument).
    pub available: u64,
    /// The value as the wire has it (integers little-endian, strings and
    /// decimals with their length prefix, dates and times with theirs).
    pub bytes: [u8; VALUE_BYTES],
}

/// Per-thread state between statement ends: what the optional probes
/// (command start, errors, waits) learned about the statement in flight.
/// Each piece carries the time it belongs to, so the statement end takes
/// only what happened after the statement's own start; nothing stale from
/// a command that never reached a statement end leaks into the next one.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct Inflight {
    /// Owner of the slot.
    pub tid: u32,
    /// Command seen by the command probe, 0 when it is not attached.
    pub command: u32,
    /// First four packet bytes of COM_STMT_EXECUTE: the statement id.
    pub stmt_id: u32,
    /// First error code raised in the statement, 0 when none.
    pub error_code: u32,
    /// When `error_code` was raised (CLOCK_MONOTONIC ns).
    pub error_ns: u64,
    /// When the command probe saw the command start (ns), for `stmt_id`.
    pub command_ns: u64,
    /// Last THD seen on this thread.
    pub thd: u64,
    /// Nesting depth of the wait in progress (0: not waiting).
    pub wait_depth: u32,
    pub wait_class: u32,
    pub wait_start_ns: u64,
    /// `start_utime` of the statement the waits below belong to.
    pub waits_epoch_us: u64,
    /// `start_utime` of the last statement that ended on this thread: a
    /// network wait still showing it is the connection idling between
    /// commands, not a statement's wait.
    pub ended_epoch_us: u64,
    /// Time waited so far in that statement, per wait class.
    pub waits: [u64; wait_class::COUNT],
    /// The thread's `se.sum_exec_runtime` at its last statement end (0:
    /// none seen yet).
    pub cpu_mark_ns: u64,
    /// The connection (id) whose account and schema were last named on
    /// this thread, and their hashes; 0: name them at the next statement.
    pub named_connection: u64,
    pub account_hash: u64,
    /// The account's own hash, before its client key was mixed in.
    pub login_hash: u64,
    /// `record_pending` bits: while any is set, this thread's statements go
    /// out as records. One word, so the statement end tests both with the
    /// one comparison it made before the value probes existed.
    pub record_pending: u64,
    pub schema_hash: u64,
    /// The THD and `{pointer, length}` of the schema name `schema_hash` was
    /// read from: while they stay, the name is not read again. The server
    /// overwrites a name in place only in `THD::set_db`, whose probe clears
    /// `schema_ptr`.
    pub schema_thd: u64,
    pub schema_ptr: u64,
    pub schema_len: u64,
    /// Stack pointer at the start of the innermost nested statement in
    /// progress (0: none): a statement end deeper in the stack is inside a
    /// stored program.
    pub nested_sp: u64,
    /// `start_utime` of the client statement whose programs ran nested
    /// statements: its end goes out as a record, so they find their parent.
    pub nested_parent_us: u64,
    /// The last statement's query id and the last program named here.
    pub last_query_id: u64,
    pub program_hash: u64,
}

/// Fixed head of every ring-buffer record; `captured_len` text bytes follow.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct StatementEvent {
    /// CLOCK_MONOTONIC nanoseconds when the statement started.
    pub start_ns: u64,
    pub duration_ns: u64,
    pub thd: u64,
    pub connection_id: u64,
    pub pid: u32,
    pub tid: u32,
    pub command: u32,
    pub stmt_id: u32,
    pub error_code: u32,
    /// Length of the statement text as the server had it.
    pub text_len: u32,
    /// Bytes of text that follow this header.
    pub captured_len: u32,
    pub flags: u32,
    /// The server's figures for this statement (lock time included).
    pub stats: StatementStats,
    /// Hashes of the current schema and of the connection's account (0:
    /// none or unknown), named by [`NameRecord`]s.
    pub schema_hash: u64,
    pub account_hash: u64,
    /// A nested statement's program (hash, named by a [`NameRecord`]) and
    /// the start of the client statement that ran it; 0 otherwise.
    pub program_hash: u64,
    pub parent_start_ns: u64,
    /// [`source`] and, for a nested statement, [`program_kind`].
    pub source: u32,
    pub program_kind: u32,
    /// When `error_code` was raised: matches the error sample.
    pub error_ns: u64,
    /// Time this statement waited, per wait class (ns).
    pub waits: [u64; wait_class::COUNT],
    /// Hash of the text with its literal values left out, and of the
    /// schema, when in-kernel digests are on and the text can be counted
    /// there (complete, not truncated); 0 otherwise. Equal hashes have
    /// equal digests in equal schemas.
    pub text_hash: u64,
}

pub const EVENT_HEADER_LEN: usize = core::mem::size_of::<StatementEvent>();

/// Scratch record the kernel builds before copying it to the ring buffer.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct EventBuffer {
    pub header: StatementEvent,
    pub text: [u8; MAX_TEXT],
    /// The THD fields, copied (never sent as such; see
    /// [`ServerLayout::stats_base`]).
    pub window: [u64; STATS_WINDOW / 8],
    /// A name record being assembled.
    pub name: NameRecord,
    /// The statement's query id, from the counters' window (not sent).
    pub query_id: u64,
    /// The text hash's length and `CONTROL_OPAQUE_ONES`, for its
    /// `bpf_loop` steps: their context lives on the stack, where every
    /// byte counts against the 512 every kernel allows (not sent).
    pub hash_len: u32,
    pub hash_ones: u32,
}

#[cfg(feature = "user")]
mod pod {
    // SAFETY: plain `#[repr(C)]` integers without padding holes that could
    // leak uninitialised bytes.
    unsafe impl aya::Pod for super::ServerLayout {}
    unsafe impl aya::Pod for super::Inflight {}
    unsafe impl aya::Pod for super::StatementEvent {}
    unsafe impl aya::Pod for super::ErrorSample {}
    unsafe impl aya::Pod for super::LongWait {}
    unsafe impl aya::Pod for super::ValueEvent {}
    unsafe impl aya::Pod for super::SlotStats {}
    unsafe impl aya::Pod for super::NameRecord {}
    unsafe impl aya::Pod for super::FrameStack {}
    unsafe impl aya::Pod for super::Frame {}
    unsafe impl aya::Pod for super::Applying {}
    unsafe impl aya::Pod for super::AppliedEvent {}
}
