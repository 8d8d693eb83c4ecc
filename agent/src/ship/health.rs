//! What went wrong on the ship path between two windows, for the agent's
//! next window to report: a sender task that had to be restarted, disk
//! errors the spool lived through, and how far the agent's clock is from
//! the collector's. Beside those per-window counts it keeps totals since
//! the agent started, for the Prometheus page (`ShipTotals`), which
//! nothing ever resets.
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};

#[derive(Debug, Default)]
pub struct ShipHealth {
    restarts: AtomicU64,
    io_errors: AtomicU64,
    clock_skew_ms: AtomicI64,
    skew_known: AtomicBool,
    totals: Totals,
}

#[derive(Debug, Default)]
struct Totals {
    spooled: AtomicU64,
    delivered: AtomicU64,
    push_failures: AtomicU64,
    rejected: AtomicU64,
    lost_batches: AtomicU64,
    lost_statements: AtomicU64,
    restarts: AtomicU64,
    io_errors: AtomicU64,
    backlog: AtomicU64,
}

/// What the ship path did since the agent started, and its backlog now.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ShipTotals {
    /// Batches written to the spool (fsync'd).
    pub spooled: u64,
    /// Batches a collector acknowledged (duplicates included).
    pub delivered: u64,
    /// Pushes that failed and will be retried.
    pub push_failures: u64,
    /// Batches a collector refused as invalid (kept in `rejected/`).
    pub rejected: u64,
    /// Batches dropped before shipping (full spool, free-space floor, a
    /// failed write), and the statements they held: the gaps.
    pub lost_batches: u64,
    pub lost_statements: u64,
    pub sender_restarts: u64,
    pub spool_io_errors: u64,
    /// Batches in the spool when the sender last looked.
    pub backlog: u64,
}

/// Counts since the last `take`, and the latest skew.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct HealthReport {
    pub sender_restarts: u64,
    pub spool_io_errors: u64,
    /// Agent clock minus collector clock; None until a push measured it.
    pub clock_skew_ms: Option<i64>,
}

impl ShipHealth {
    pub fn restarted(&self) {
        self.restarts.fetch_add(1, Ordering::Relaxed);
        self.totals.restarts.fetch_add(1, Ordering::Relaxed);
    }

    pub fn io_error(&self) {
        self.io_errors.fetch_add(1, Ordering::Relaxed);
        self.totals.io_errors.fetch_add(1, Ordering::Relaxed);
    }

    pub fn spooled(&self) {
        self.totals.spooled.fetch_add(1, Ordering::Relaxed);
    }

    pub fn delivered(&self) {
        self.totals.delivered.fetch_add(1, Ordering::Relaxed);
    }

    pub fn push_failed(&self) {
        self.totals.push_failures.fetch_add(1, Ordering::Relaxed);
    }

    pub fn rejected(&self) {
        self.totals.rejected.fetch_add(1, Ordering::Relaxed);
    }

    pub fn lost(&self, batches: u64, statements: u64) {
        self.totals.lost_batches.fetch_add(batches, Ordering::Relaxed);
        self.totals.lost_statements.fetch_add(statements, Ordering::Relaxed);
    }

    pub fn backlog(&self, batches: u64) {
        self.totals.backlog.store(batches, Ordering::Relaxed);
    }

    /// Totals since start; unlike `take`, reading them resets nothing.
    pub fn totals(&self) -> ShipTotals {
        let t = &self.totals;
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        ShipTotals {
            spooled: get(&t.spooled),
            delivered: get(&t.delivered),
            push_failures: get(&t.push_failures),
            rejected: get(&t.rejected),
            lost_batches: get(&t.lost_batches),
            lost_statements: get(&t.lost_statements),
            sender_restarts: get(&t.restarts),
            spool_io_errors: get(&t.io_errors),
            backlog: get(&t.backlog),
        }
    }

    pub fn clock_skew(&self, ms: i64) {
        self.clock_skew_ms.store(ms, Ordering::Relaxed);
        self.skew_known.store(true, Ordering::Relaxed);
    }

    /// Counts taken for a window that never left the agent (its batch
    /// could not be spooled): they go to the next one.
    pub fn give_back(&self, report: HealthReport) {
        self.restarts.fetch_add(report.sender_restarts, Ordering::Relaxed);
        self.io_errors.fetch_add(report.spool_io_errors, Ordering::Relaxed);
    }

    /// The counts since the previous call (they restart at zero), and the
    /// latest skew.
    pub fn take(&self) -> HealthReport {
        HealthReport {
            sender_restarts: self.restarts.swap(0, Ordering::Relaxed),
            spool_io_errors: self.io_errors.swap(0, Ordering::Relaxed),
            clock_skew_ms: self.skew_known.load(Ordering::Relaxed).then(|| self.clock_skew_ms.load(Ordering::Relaxed)),
        }
    }
}
