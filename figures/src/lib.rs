//! The figures every digest carries, and what they mean: the latency
//! histogram's scheme ([`histogram`]) and the one list of what the server
//! counted for a digest's statements, as its slow log does ([`figures!`]).
//! The kernel programs, the agent, the wire, the collector and the manual
//! all take them from here; this crate depends on nothing, so the wire and
//! the collector learn the figures without the kernel's types.
//!
//! Every place a figure goes takes it from [`figures!`]: the sums in the
//! kernel and the agent (`sqlbee_kernel_abi::FigureSums`), the agent's jsonl
//! and wire mappings, the collector's merge, validation and JSON answers,
//! the digest page, and the manual's table. Adding a figure is one entry
//! below, its `sqlbee.v1.QueryStats` field (same name, next number), and
//! the kernel read that fills it.
#![no_std]

pub mod histogram;

/// Which capability of a server's build (and of the kernel) lets the agent
/// read a figure. The kernel ABI's `stats_field` bits are these very bits
/// for the counters read from the server, so one bit set says what is
/// readable. A figure whose capability is missing is unknown (null on
/// every output), never 0.
pub mod needs {
    /// Read from every build.
    pub const ALWAYS: u32 = 0;
    pub const ROWS_SENT: u32 = 1;
    pub const ROWS_EXAMINED: u32 = 2;
    pub const ROWS_AFFECTED: u32 = 4;
    /// The plan flags word and the three counters after it.
    pub const PLAN: u32 = 8;
    pub const SERVER_STATUS: u32 = 16;
    /// The task's run time (a kernel with its offset known).
    pub const CPU: u32 = 1 << 16;

    /// When a figure with these needs is known, for the manual.
    pub fn described(needs: u32) -> &'static str {
        match needs {
            ALWAYS => "always",
            CPU => "when the kernel has BTF (the agent reads each thread's run time)",
            PLAN => "when the agent can read the server's query plan flags on this build",
            SERVER_STATUS => "when the agent can read the server's status flags on this build",
            ROWS_SENT | ROWS_EXAMINED | ROWS_AFFECTED => {
                "when the agent can read the server's row counter on this build"
            }
            _ => "when the agent can read what it takes on this build",
        }
    }
}

/// What a figure counts, which says how it is shown and checked.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Unit {
    /// Rows (sent, examined, affected).
    Rows,
    /// Nanoseconds.
    Ns,
    /// Statements flagged: never more than the digest's count.
    Statements,
    /// Things the statements made (temporary tables, merge passes).
    Count,
}

impl Unit {
    /// What one is, for the manual.
    pub fn described(self) -> &'static str {
        match self {
            Unit::Rows => "rows",
            Unit::Ns => "nanoseconds",
            Unit::Statements => "statements (at most the row's count)",
            Unit::Count => "a count",
        }
    }
}

/// How two values of a figure combine. Every figure today is a sum; a
/// maximum or minimum would be added here and in [`figures!`]'s users.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Merge {
    Sum,
}

/// One figure, for code that lists them at run time (the manual's table,
/// the digest page's labels, the tests that check every place has them).
#[derive(Clone, Copy, Debug)]
pub struct Figure {
    pub name: &'static str,
    pub needs: u32,
    pub unit: Unit,
    pub merge: Merge,
    /// As the digest page names it.
    pub label: &'static str,
    /// One line for the manual.
    pub about: &'static str,
    /// When the top list can be ranked by it: a column of its own in each
    /// store, an order key and a column on the top page and the query
    /// tools' table.
    pub rank: Option<Rank>,
}

/// How a figure the top list ranks by is named there.
#[derive(Clone, Copy, Debug)]
pub struct Rank {
    /// The wire's `order_by` key (the query tools' `--order-by`, the top
    /// page's `order`).
    pub key: &'static str,
    /// The top page's column.
    pub label: &'static str,
}

/// Calls `$then!` with every figure, in wire order, as
/// `name, needs::CAPABILITY, Unit, from_record(...), "Label", "About"`,
/// then `rank("key", "Column")` for a figure the top list ranks by.
/// `from_record` says how one statement's record (`StatementStats`) gives
/// it: `value(field)` (a u64 field), `widen(field)` (a u32 field) or
/// `flag(BIT)` (1 when the `statement_flag` bit is set).
#[macro_export]
macro_rules! figures {
    ($then:ident) => {
        $then! {
            (rows_sent, ROWS_SENT, Rows, value(rows_sent), "Rows sent",
                "rows the statements sent to the client"),
            (rows_examined, ROWS_EXAMINED, Rows, value(rows_examined), "Rows examined",
                "rows the statements read in the storage engines", rank("rows_examined", "Rows examined")),
            (rows_affected, ROWS_AFFECTED, Rows, value(rows_affected), "Rows affected",
                "rows the statements changed"),
            (lock_ns, ALWAYS, Ns, value(lock_ns), "Lock time",
                "time spent acquiring locks, row-lock waits included (the server's Lock_time)"),
            (cpu_ns, CPU, Ns, value(cpu_ns), "CPU time",
                "on-CPU time of the statements' threads, each from its previous statement's end", rank("cpu", "CPU")),
            (cpu_statements, CPU, Statements, flag(CPU_MEASURED), "Statements with CPU time",
                "statements whose CPU time was measured"),
            (no_index_used, SERVER_STATUS, Statements, flag(NO_INDEX_USED), "No index used",
                "statements the server flagged as using no index"),
            (no_good_index_used, SERVER_STATUS, Statements, flag(NO_GOOD_INDEX_USED), "No good index used",
                "statements the server flagged as using no good index"),
            (tmp_tables, PLAN, Count, widen(tmp_tables), "Temporary tables",
                "temporary tables the statements created"),
            (tmp_disk_tables, PLAN, Count, widen(tmp_disk_tables), "Temporary tables on disk",
                "of those, the ones on disk", rank("tmp_disk", "Tmp disk")),
            (sort_merge_passes, PLAN, Count, widen(sort_merge_passes), "Sort merge passes",
                "merge passes the statements' sorts made"),
            (select_full_join, PLAN, Statements, flag(SELECT_FULL_JOIN), "Full joins",
                "statements with a join that scanned a table after the first"),
            (select_scan, PLAN, Statements, flag(SELECT_SCAN), "Full scans",
                "statements with a full scan of the first table"),
            (filesort, PLAN, Statements, flag(FILESORT), "Sorts",
                "statements that sorted"),
            (filesort_on_disk, PLAN, Statements, flag(FILESORT_ON_DISK), "Sorts on disk",
                "statements that sorted on disk")
        }
    };
}

macro_rules! list {
    ($(($name:ident, $needs:ident, $unit:ident, $from:ident($source:ident), $label:literal, $about:literal
        $(, rank($key:literal, $column:literal))?)),* $(,)?) => {
        /// Every figure, in wire order.
        pub const FIGURES: &[Figure] = &[
            $(Figure {
                name: stringify!($name),
                needs: needs::$needs,
                unit: Unit::$unit,
                merge: Merge::Sum,
                label: $label,
                about: $about,
                rank: rank!($($key, $column)?),
            },)*
        ];
    };
}

macro_rules! rank {
    () => {
        None
    };
    ($key:literal, $column:literal) => {
        Some(Rank { key: $key, label: $column })
    };
}

figures!(list);

/// How many figures there are.
pub const COUNT: usize = FIGURES.len();

/// How many figures the top list ranks by.
pub const RANKED: usize = {
    let mut n = 0;
    let mut i = 0;
    while i < COUNT {
        if FIGURES[i].rank.is_some() {
            n += 1;
        }
        i += 1;
    }
    n
};

/// The places in [`FIGURES`] of the figures the top list ranks by, in
/// list order (the order of their columns).
pub const RANK_FIGURES: [usize; RANKED] = {
    let mut places = [0; RANKED];
    let (mut i, mut n) = (0, 0);
    while i < COUNT {
        if FIGURES[i].rank.is_some() {
            places[n] = i;
            n += 1;
        }
        i += 1;
    }
    places
};

/// Their order keys, in the same order.
pub const RANK_KEYS: [&str; RANKED] = {
    let mut keys = [""; RANKED];
    let mut n = 0;
    while n < RANKED {
        if let Some(rank) = FIGURES[RANK_FIGURES[n]].rank {
            keys[n] = rank.key;
        }
        n += 1;
    }
    keys
};
